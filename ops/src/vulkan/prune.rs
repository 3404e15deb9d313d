//! Drops the code that a module's override values make dead, after
//! `naga::back::pipeline_constants::process_overrides` has substituted them.
//!
//! naga folds the overrides into constants but keeps every branch: `if (RM > 4u) { .. }` with
//! RM = 1 is still written to SPIR-V, with all the functions only such branches call. This
//! pass replaces an `If` whose condition is a known bool by the statements of the branch
//! taken, and a `Switch` whose selector is a known integer by the case taken (when that case
//! does not `break` out of the switch), then compacts the module so that functions, globals,
//! types, constants and expressions nothing reaches any more are dropped.
//!
//! Conditions are evaluated here over literals and constants with bool/u32/i32 comparisons,
//! `&&`, `||` (one known side may decide them), `!`, unary minus and integer arithmetic, so
//! the pass does not depend on how far naga's constant evaluator folded them. naga lowers
//! `a && b` and `a || b` to an `If` that stores into a local and a load of that local, so the
//! pass also follows the known values stored into locals along straight-line code (forgetting
//! a local wherever a branch, loop or call may write it). Loops are left as they are, and
//! nothing is inlined: a condition over a function's argument stays even when every call
//! passes a literal.
//!
//! The statements of a dropped branch take their named expressions (`let`s) with them: the
//! names are removed before compaction, which otherwise keeps every named expression (and a
//! call's result without its call is invalid IR). `compile` validates the pruned module again.

use std::collections::HashSet;

use naga::{
    BinaryOperator, Block, Expression, Function, Handle, Literal, Module, Statement, SwitchValue,
    UnaryOperator,
};

/// A value the pass can compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Value {
    Bool(bool),
    U32(u32),
    I32(i32),
}

impl Value {
    fn of(literal: &Literal) -> Option<Value> {
        match *literal {
            Literal::Bool(b) => Some(Value::Bool(b)),
            Literal::U32(v) => Some(Value::U32(v)),
            Literal::I32(v) => Some(Value::I32(v)),
            _ => None,
        }
    }
}

/// Prunes every function and entry point of `module` (a module `process_overrides` returned:
/// valid, overrides resolved) and compacts it. Returns whether any branch was dropped.
pub(crate) fn prune(module: &mut Module) -> bool {
    let mut changed = false;
    let mut functions = std::mem::take(&mut module.functions);
    for (_, f) in functions.iter_mut() {
        changed |= prune_function(module, f);
    }
    module.functions = functions;
    let mut entry_points = std::mem::take(&mut module.entry_points);
    for ep in entry_points.iter_mut() {
        changed |= prune_function(module, &mut ep.function);
    }
    module.entry_points = entry_points;
    if changed {
        naga::compact::compact(module, naga::compact::KeepUnused::No);
    }
    changed
}

fn prune_function(module: &Module, f: &mut Function) -> bool {
    let mut eval = Evaluator {
        module,
        expressions: &f.expressions,
        cache: vec![None; f.expressions.len()],
        dropped: HashSet::new(),
    };
    let mut locals = vec![None; f.local_variables.len()];
    let changed = prune_block(&mut f.body, &mut eval, &mut locals);
    // A name keeps its expression alive through compaction: drop the names of what only the
    // dropped statements computed (a call's result without its call is invalid).
    let dropped = eval.dropped;
    f.named_expressions.retain(|h, _| !dropped.contains(h));
    changed
}

/// Adds the expressions that `block`'s statements compute (emit, or produce as results) to
/// `out`.
fn defined(block: &Block, out: &mut HashSet<Handle<Expression>>) {
    for s in block.iter() {
        match s {
            Statement::Emit(range) => out.extend(range.clone()),
            Statement::Call { result, .. } | Statement::Atomic { result, .. } => {
                out.extend(*result)
            }
            Statement::WorkGroupUniformLoad { result, .. }
            | Statement::SubgroupBallot { result, .. }
            | Statement::SubgroupGather { result, .. }
            | Statement::SubgroupCollectiveOperation { result, .. } => {
                out.insert(*result);
            }
            Statement::Block(b) => defined(b, out),
            Statement::If { accept, reject, .. } => {
                defined(accept, out);
                defined(reject, out);
            }
            Statement::Switch { cases, .. } => {
                for case in cases {
                    defined(&case.body, out);
                }
            }
            Statement::Loop { body, continuing, .. } => {
                defined(body, out);
                defined(continuing, out);
            }
            _ => {}
        }
    }
}

/// What the pass knows of each local variable at a point of the function: its value, where a
/// store of a known value reached it on every path (naga lowers `a && b` and `a || b` to an
/// `If` that stores into a local, then a load of it).
type Locals = Vec<Option<Value>>;

/// Rewrites `block` (recursively) with its decided branches spliced in; whether it changed.
/// `locals` is what is known at its start, and becomes what is known at its end.
fn prune_block(block: &mut Block, eval: &mut Evaluator, locals: &mut Locals) -> bool {
    let mut changed = false;
    let old = std::mem::take(block);
    for (stmt, span) in old.span_into_iter() {
        match stmt {
            Statement::Emit(ref range) => {
                // A load of a local takes its value where it is emitted.
                for h in range.clone() {
                    if let Expression::Load { pointer } = eval.expressions[h]
                        && let Expression::LocalVariable(lv) = eval.expressions[pointer]
                    {
                        eval.cache[h.index()] = Some(locals[lv.index()]);
                    }
                }
                block.push(stmt, span);
            }
            Statement::Store { pointer, value } => {
                if let Some(lv) = eval.local_root(pointer) {
                    locals[lv.index()] = match eval.expressions[pointer] {
                        Expression::LocalVariable(_) => eval.eval(value),
                        _ => None,
                    };
                }
                block.push(stmt, span);
            }
            Statement::Call { ref arguments, .. } => {
                for &a in arguments {
                    if let Some(lv) = eval.local_root(a) {
                        locals[lv.index()] = None;
                    }
                }
                block.push(stmt, span);
            }
            Statement::If { condition, mut accept, mut reject } => match eval.eval(condition) {
                Some(Value::Bool(taken)) => {
                    changed = true;
                    let (mut body, other) = if taken { (accept, reject) } else { (reject, accept) };
                    defined(&other, &mut eval.dropped);
                    prune_block(&mut body, eval, locals);
                    block.extend_block(body);
                }
                _ => {
                    forget_stored(&accept, eval, locals);
                    forget_stored(&reject, eval, locals);
                    changed |= prune_block(&mut accept, eval, &mut locals.clone());
                    changed |= prune_block(&mut reject, eval, &mut locals.clone());
                    block.push(Statement::If { condition, accept, reject }, span);
                }
            },
            Statement::Switch { selector, mut cases } => {
                match eval.eval(selector).and_then(|v| taken_case(&cases, v)) {
                    Some((mut body, taken)) => {
                        changed = true;
                        for (k, case) in cases.iter().enumerate() {
                            if !taken.contains(&k) {
                                defined(&case.body, &mut eval.dropped);
                            }
                        }
                        prune_block(&mut body, eval, locals);
                        block.extend_block(body);
                    }
                    None => {
                        for case in &cases {
                            forget_stored(&case.body, eval, locals);
                        }
                        for case in cases.iter_mut() {
                            changed |= prune_block(&mut case.body, eval, &mut locals.clone());
                        }
                        block.push(Statement::Switch { selector, cases }, span);
                    }
                }
            }
            Statement::Block(mut inner) => {
                changed |= prune_block(&mut inner, eval, locals);
                block.push(Statement::Block(inner), span);
            }
            Statement::Loop { mut body, mut continuing, break_if } => {
                forget_stored(&body, eval, locals);
                forget_stored(&continuing, eval, locals);
                changed |= prune_block(&mut body, eval, &mut locals.clone());
                changed |= prune_block(&mut continuing, eval, &mut locals.clone());
                block.push(Statement::Loop { body, continuing, break_if }, span);
            }
            stmt => block.push(stmt, span),
        }
    }
    // What follows an unconditional jump never runs (a spliced branch that returns).
    if let Some(end) = block.iter().position(|s| {
        matches!(
            s,
            Statement::Return { .. } | Statement::Kill | Statement::Break | Statement::Continue
        )
    }) && end + 1 < block.len()
    {
        let rest = Block::from_vec(block[end + 1..].to_vec());
        defined(&rest, &mut eval.dropped);
        block.cull(end + 1..);
        changed = true;
    }
    changed
}

/// Forgets the value of every local that `block` may write (a store, or a pointer passed to a
/// function), at any depth.
fn forget_stored(block: &Block, eval: &Evaluator, locals: &mut Locals) {
    for s in block.iter() {
        match s {
            Statement::Store { pointer, .. } => {
                if let Some(lv) = eval.local_root(*pointer) {
                    locals[lv.index()] = None;
                }
            }
            Statement::Call { arguments, .. } => {
                for &a in arguments {
                    if let Some(lv) = eval.local_root(a) {
                        locals[lv.index()] = None;
                    }
                }
            }
            Statement::Block(b) => forget_stored(b, eval, locals),
            Statement::If { accept, reject, .. } => {
                forget_stored(accept, eval, locals);
                forget_stored(reject, eval, locals);
            }
            Statement::Switch { cases, .. } => {
                for case in cases {
                    forget_stored(&case.body, eval, locals);
                }
            }
            Statement::Loop { body, continuing, .. } => {
                forget_stored(body, eval, locals);
                forget_stored(continuing, eval, locals);
            }
            _ => {}
        }
    }
}

/// The statements a switch on `value` runs, following fall-through; `None` when no case
/// matches or the statements may `break` out of the switch (splicing would retarget it).
/// Also returns which cases that is.
fn taken_case(cases: &[naga::SwitchCase], value: Value) -> Option<(Block, std::ops::Range<usize>)> {
    let matches = |v: &SwitchValue| match (*v, value) {
        (SwitchValue::U32(a), Value::U32(b)) => a == b,
        (SwitchValue::I32(a), Value::I32(b)) => a == b,
        _ => false,
    };
    let start = cases
        .iter()
        .position(|c| matches(&c.value))
        .or_else(|| cases.iter().position(|c| c.value == SwitchValue::Default))?;
    let mut body = Block::new();
    let mut end = start;
    for case in &cases[start..] {
        if breaks(&case.body) {
            return None;
        }
        body.extend_block(case.body.clone());
        end += 1;
        if !case.fall_through {
            break;
        }
    }
    Some((body, start..end))
}

/// Whether `block` has a `Break` that leaves the statement it is in (not one inside a nested
/// loop or switch, which leaves that).
fn breaks(block: &Block) -> bool {
    block.iter().any(|s| match s {
        Statement::Break => true,
        Statement::Block(b) => breaks(b),
        Statement::If { accept, reject, .. } => breaks(accept) || breaks(reject),
        _ => false,
    })
}

/// Evaluates a function's expressions where they are constant.
struct Evaluator<'a> {
    module: &'a Module,
    expressions: &'a naga::Arena<Expression>,
    cache: Vec<Option<Option<Value>>>,
    /// What the statements the pass dropped computed.
    dropped: HashSet<Handle<Expression>>,
}

impl Evaluator<'_> {
    /// The local variable a pointer expression points into, if any.
    fn local_root(&self, mut h: Handle<Expression>) -> Option<Handle<naga::LocalVariable>> {
        loop {
            match self.expressions[h] {
                Expression::LocalVariable(lv) => return Some(lv),
                Expression::Access { base, .. } | Expression::AccessIndex { base, .. } => h = base,
                _ => return None,
            }
        }
    }

    fn eval(&mut self, h: Handle<Expression>) -> Option<Value> {
        if let Some(v) = self.cache[h.index()] {
            return v;
        }
        let v = self.compute(&self.expressions[h]);
        self.cache[h.index()] = Some(v);
        v
    }

    fn compute(&mut self, expr: &Expression) -> Option<Value> {
        match *expr {
            Expression::Literal(ref l) => Value::of(l),
            Expression::Constant(c) => global(self.module, self.module.constants[c].init, 0),
            // Known only where it is emitted (`prune_block` fills the cache there).
            Expression::Load { .. } => None,
            Expression::Unary { op, expr } => unary(op, self.eval(expr)?),
            Expression::Binary { op, left, right } => {
                let (l, r) = (self.eval(left), self.eval(right));
                binary(op, l, r)
            }
            _ => None,
        }
    }
}

/// Evaluates a global (constant) expression.
fn global(module: &Module, h: Handle<Expression>, depth: u32) -> Option<Value> {
    if depth > 64 {
        return None;
    }
    match module.global_expressions[h] {
        Expression::Literal(ref l) => Value::of(l),
        Expression::Constant(c) => global(module, module.constants[c].init, depth + 1),
        Expression::Unary { op, expr } => unary(op, global(module, expr, depth + 1)?),
        Expression::Binary { op, left, right } => {
            binary(op, global(module, left, depth + 1), global(module, right, depth + 1))
        }
        _ => None,
    }
}

fn unary(op: UnaryOperator, v: Value) -> Option<Value> {
    match (op, v) {
        (UnaryOperator::LogicalNot, Value::Bool(b)) => Some(Value::Bool(!b)),
        (UnaryOperator::BitwiseNot, Value::U32(x)) => Some(Value::U32(!x)),
        (UnaryOperator::BitwiseNot, Value::I32(x)) => Some(Value::I32(!x)),
        (UnaryOperator::Negate, Value::I32(x)) => Some(Value::I32(x.wrapping_neg())),
        _ => None,
    }
}

/// `l op r`; `&&` and `||` are decided by one known side when it settles them (naga
/// expressions have no side effects, so the other side need not be evaluated).
fn binary(op: BinaryOperator, l: Option<Value>, r: Option<Value>) -> Option<Value> {
    use BinaryOperator as B;
    match (op, l, r) {
        (B::LogicalAnd, Some(Value::Bool(false)), _)
        | (B::LogicalAnd, _, Some(Value::Bool(false))) => {
            return Some(Value::Bool(false));
        }
        (B::LogicalOr, Some(Value::Bool(true)), _) | (B::LogicalOr, _, Some(Value::Bool(true))) => {
            return Some(Value::Bool(true));
        }
        _ => {}
    }
    let (l, r) = (l?, r?);
    let cmp = |o: std::cmp::Ordering| -> Option<Value> {
        use std::cmp::Ordering::*;
        let b = match op {
            B::Equal => o == Equal,
            B::NotEqual => o != Equal,
            B::Less => o == Less,
            B::LessEqual => o != Greater,
            B::Greater => o == Greater,
            B::GreaterEqual => o != Less,
            _ => return None,
        };
        Some(Value::Bool(b))
    };
    match (l, r) {
        (Value::Bool(a), Value::Bool(b)) => match op {
            B::LogicalAnd | B::And => Some(Value::Bool(a && b)),
            B::LogicalOr | B::InclusiveOr => Some(Value::Bool(a || b)),
            B::ExclusiveOr => Some(Value::Bool(a != b)),
            B::Equal => Some(Value::Bool(a == b)),
            B::NotEqual => Some(Value::Bool(a != b)),
            _ => None,
        },
        (Value::U32(a), Value::U32(b)) => match op {
            B::Add => Some(Value::U32(a.wrapping_add(b))),
            B::Subtract => Some(Value::U32(a.wrapping_sub(b))),
            B::Multiply => Some(Value::U32(a.wrapping_mul(b))),
            B::Divide => a.checked_div(b).map(Value::U32),
            B::Modulo => a.checked_rem(b).map(Value::U32),
            B::And => Some(Value::U32(a & b)),
            B::InclusiveOr => Some(Value::U32(a | b)),
            B::ExclusiveOr => Some(Value::U32(a ^ b)),
            B::ShiftLeft => (b < 32).then(|| Value::U32(a << b)),
            B::ShiftRight => (b < 32).then(|| Value::U32(a >> b)),
            _ => cmp(a.cmp(&b)),
        },
        (Value::I32(a), Value::I32(b)) => match op {
            B::Add => Some(Value::I32(a.wrapping_add(b))),
            B::Subtract => Some(Value::I32(a.wrapping_sub(b))),
            B::Multiply => Some(Value::I32(a.wrapping_mul(b))),
            B::Divide => a.checked_div(b).map(Value::I32),
            B::Modulo => a.checked_rem(b).map(Value::I32),
            B::And => Some(Value::I32(a & b)),
            B::InclusiveOr => Some(Value::I32(a | b)),
            B::ExclusiveOr => Some(Value::I32(a ^ b)),
            _ => cmp(a.cmp(&b)),
        },
        // Shifts of i32 by u32, and anything mixed: leave them to run time.
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::compile_with;
    use naga::valid::{Capabilities, ValidationFlags, Validator};

    const KERNEL: &str = "
struct Params { x: u32, y: u32, z: u32, n: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<storage, read> z: array<f32>;
var<immediate> p: Params;
override MODE: u32 = 1u;
override RM: u32 = 4u;
override WG: u32 = 64u;

fn live(v: f32) -> f32 {
    return v * 2.0;
}

fn dead_helper(v: f32) -> f32 {
    var s = v;
    for (var k = 0u; k < 16u; k++) {
        s = s * s + f32(k);
    }
    return s;
}

fn only_from_dead(v: f32) -> f32 {
    return dead_helper(v) + 1.0;
}

fn pick(v: f32, i: u32) -> f32 {
    switch MODE {
        case 1u: {
            return live(v);
        }
        case 2u: {
            return only_from_dead(v) + z[p.z + i];
        }
        default: {
            return v;
        }
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    if (i >= p.n) {
        return;
    }
    var v = x[p.x + i];
    if (MODE == 2u && i < RM) {
        let w = dead_helper(v);
        v = w;
    }
    if (RM > 4u || i == 7u) {
        v = v + 1.0;
    } else {
        v = v - 1.0;
    }
    if (!(RM + 1u > 8u)) {
        v = pick(v, i);
    }
    y[p.y + i] = v;
}
";

    /// The naga module `compile` writes, pruned or not.
    fn specialised(wgsl: &str, overrides: &[(&str, f64)], prune: bool) -> naga::Module {
        let module = naga::front::wgsl::parse_str(wgsl).unwrap();
        let info = Validator::new(ValidationFlags::all(), Capabilities::IMMEDIATES)
            .validate(&module)
            .unwrap();
        let constants = overrides.iter().map(|&(k, v)| (k.to_string(), v)).collect();
        let (module, _) =
            naga::back::pipeline_constants::process_overrides(&module, &info, None, &constants)
                .unwrap();
        let mut module = module.into_owned();
        if prune {
            super::prune(&mut module);
        }
        module
    }

    fn function_names(module: &naga::Module) -> Vec<&str> {
        module.functions.iter().filter_map(|(_, f)| f.name.as_deref()).collect()
    }

    #[test]
    fn dead_branches_and_their_functions_go() {
        let overrides = [("MODE", 1.0), ("RM", 2.0)];
        let full = specialised(KERNEL, &overrides, false);
        assert_eq!(function_names(&full), ["live", "dead_helper", "only_from_dead", "pick"]);
        let pruned = specialised(KERNEL, &overrides, true);
        assert_eq!(function_names(&pruned), ["live", "pick"]);
        // z is read only by MODE 2's case: dropped from the module, still counted.
        assert_eq!(pruned.global_variables.len(), full.global_variables.len() - 1);
        let big = compile_with(KERNEL, &overrides, false).unwrap();
        let small = compile_with(KERNEL, &overrides, true).unwrap();
        assert!(
            small.spirv.len() < big.spirv.len(),
            "{} words pruned, {} not",
            small.spirv.len(),
            big.spirv.len()
        );
        assert_eq!((small.slots, small.push_words), (3, 4));
        assert_eq!((big.slots, big.push_words), (3, 4));
        assert_eq!(small.workgroup_size, [64, 1, 1]);
        // Deterministic: the same input gives the same bytes.
        assert_eq!(compile_with(KERNEL, &overrides, true).unwrap(), small);
    }

    #[test]
    fn the_other_values_keep_the_other_code() {
        // MODE 2: dead_helper is called from main and (through only_from_dead) from pick;
        // RM 8 makes `!(RM + 1 > 8)` false, so pick goes.
        let pruned = specialised(KERNEL, &[("MODE", 2.0), ("RM", 8.0)], true);
        assert_eq!(function_names(&pruned), ["dead_helper"]);
        let pruned = specialised(KERNEL, &[("MODE", 2.0), ("RM", 2.0)], true);
        assert_eq!(function_names(&pruned), ["dead_helper", "only_from_dead", "pick"]);
        // The default case.
        let pruned = specialised(KERNEL, &[("MODE", 5.0)], true);
        assert_eq!(function_names(&pruned), ["pick"]);
        assert!(compile_with(KERNEL, &[("MODE", 5.0)], true).is_ok());
    }

    #[test]
    fn a_module_without_overrides_is_unchanged() {
        let plain = KERNEL
            .replace("override MODE: u32 = 1u;", "const MODE: u32 = 1u;")
            .replace("override RM: u32 = 4u;", "const RM: u32 = 4u;")
            .replace("override WG: u32 = 64u;", "const WG: u32 = 64u;");
        let pruned = compile_with(&plain, &[], true).unwrap();
        assert_eq!(pruned, compile_with(&plain, &[], false).unwrap());
        // Written as before pruning existed: parse, validate, write.
        let module = naga::front::wgsl::parse_str(&plain).unwrap();
        assert_eq!(function_names(&module).len(), 4);
    }

    #[test]
    fn a_switch_case_that_breaks_stays() {
        let wgsl = "
@group(0) @binding(0) var<storage, read_write> y: array<u32>;
var<immediate> p: array<u32, 1>;
override MODE: u32 = 1u;
@compute @workgroup_size(1)
fn main() {
    var v = 0u;
    switch MODE {
        case 1u: {
            if (y[p[0]] == 0u) {
                break;
            }
            v = 1u;
        }
        default: {
            v = 2u;
        }
    }
    y[p[0]] = v;
}
";
        let pruned = specialised(wgsl, &[], true);
        let has_switch = pruned.entry_points[0]
            .function
            .body
            .iter()
            .any(|s| matches!(s, naga::Statement::Switch { .. }));
        assert!(has_switch);
        let pruned = specialised(wgsl, &[("MODE", 3.0)], true);
        let has_switch = pruned.entry_points[0]
            .function
            .body
            .iter()
            .any(|s| matches!(s, naga::Statement::Switch { .. }));
        assert!(!has_switch);
        assert!(compile_with(wgsl, &[("MODE", 1.0)], true).is_ok());
        assert!(compile_with(wgsl, &[("MODE", 3.0)], true).is_ok());
    }
}
