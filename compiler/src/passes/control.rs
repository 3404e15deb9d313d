//! Control flow, expanded into the graph. The lowering walk calls [`expand`] when it reaches
//! an `If`, a `Loop` or a `Scan`, so what decides it (a condition, a trip count) has been
//! folded if it can be, and the nodes put in its place are lowered next in the same walk.
//!
//! - `If` with a condition known at compile time (a flag, a test on shapes: what PyTorch's
//!   exports branch on) inlines the branch it picks; the other is dropped. A condition known
//!   only at run time compiles both branches, their nodes guarded by it ([`Graph::guards`]):
//!   the partition cuts each branch into submodels of their own, and the runtime runs only
//!   those of the branch taken. Each output is then picked with `Where(cond, then, else)`,
//!   which reads the untaken branch's stale bytes but keeps none of them; it needs the
//!   branches to give each output the same type ([`Selects`] checks it once they are
//!   inferred).
//! - `Scan` is unrolled: one copy of the body per step, fed `Gather`ed slices, its per-step
//!   outputs stacked with `Unsqueeze` + `Concat`. An opset-8 `Scan` (a batch axis first, the
//!   body run per batch element) becomes one `Scan` of the later form per batch element,
//!   stacked back; its `sequence_lens` must be constant and span the whole scanned axis.
//! - `Loop` is unrolled one iteration at a time: the walk expands an iteration and puts a
//!   `Loop` for the rest after it, which it reaches once the iteration's condition has
//!   folded; the trip count and every condition must be known at compile time.
//! - Unrolling stops at [`MAX_UNROLLED`] steps with an error naming the node: Ingot does not
//!   yet run a body as a repeated submodel.

use super::PassError;
use crate::ir::{Body, Condition, Const, Graph, Node, ValueId};
use ingot_ops::Constant as _;
use ingot_ops::{Tensor, TensorDesc};
use ingot_schema::{AttrValue, Attrs, DType};
use std::collections::BTreeMap;

/// What run-time `If`s left in the graph: the `Where` outputs that stand for their outputs,
/// with the `If` as messages name it and the output's index (their branches must agree on
/// the output's type), and the outputs of their branches' nodes, with the `If`.
#[derive(Default)]
pub struct Selects {
    outputs: BTreeMap<ValueId, (String, usize)>,
    in_branch: BTreeMap<ValueId, String>,
}

impl Selects {
    /// `message` about `node`, saying so where the node is in a branch of a run-time `If`:
    /// such a branch is compiled whether or not it is taken, so an error in one that a
    /// folded condition would have dropped is not the model's fault.
    pub fn explain(&self, node: &Node, message: String) -> String {
        match node.outputs.first().and_then(|o| self.in_branch.get(o)) {
            Some(owner) => format!(
                "{message} (in a branch of {owner}, whose condition is known only at run time, \
                 so both branches are compiled; make the condition constant: fix the input \
                 shapes it tests, or bind the input with --constant-input)"
            ),
            None => message,
        }
    }

    /// Checks a node that selects an `If`'s output, once its inputs are inferred: `then` and
    /// `else` have one type, which the one-element condition does not broadcast to more dims.
    pub fn check(&self, node: &Node, inputs: &[&TensorDesc]) -> Result<(), PassError> {
        let Some((owner, k)) = node.outputs.first().and_then(|o| self.outputs.get(o)) else {
            return Ok(());
        };
        let (cond, then, other) = (inputs[0], inputs[1], inputs[2]);
        let message = if then != other {
            format!(
                "its condition is known only at run time, so both branches are compiled and \
                 each output picked from them, which needs both to give it one type; output \
                 {k} is {} {:?} in then_branch and {} {:?} in else_branch",
                then.dtype, then.shape, other.dtype, other.shape
            )
        } else if cond.shape.len() > then.shape.len() {
            format!(
                "its condition is known only at run time, and its shape {:?} has more dims than \
                 output {k} {:?}",
                cond.shape, then.shape
            )
        } else {
            return Ok(());
        };
        Err(PassError::Node {
            node: owner.clone(),
            message: format!(
                "{message} (make the condition constant: fix the input shapes it tests, or \
                 bind the input with --constant-input)"
            ),
        })
    }
}

/// Steps a `Loop` or `Scan` may unroll to.
pub const MAX_UNROLLED: usize = 256;

/// Whether `node` is one [`expand`] handles.
pub fn is_control_flow(node: &Node) -> bool {
    node.domain.is_empty() && matches!(node.op.as_str(), "If" | "Loop" | "Scan")
}

/// Replaces the control-flow node at `g.nodes[at]` by the nodes that compute its outputs.
pub fn expand(g: &mut Graph, at: usize, selects: &mut Selects) -> Result<(), PassError> {
    let node = g.nodes[at].clone();
    let outer = g.guard(&node).to_vec();
    let expanded = match node.op.as_str() {
        "If" => expand_if(g, &node, &outer, selects),
        "Scan" => expand_scan(g, &node),
        _ => expand_loop(g, &node),
    }
    .map_err(|message| PassError::Node {
        node: node.label(),
        message: selects.explain(&node, message),
    })?;
    // What replaces a node in a run-time branch is in that branch too (a run-time `If`'s
    // own branches have already been given a guard one condition deeper).
    if !outer.is_empty() {
        for o in expanded.iter().flat_map(|n| &n.outputs) {
            g.guards.entry(*o).or_insert_with(|| outer.clone());
        }
    }
    if let Some(owner) = node.outputs.first().and_then(|o| selects.in_branch.get(o)).cloned() {
        for n in &expanded {
            selects.in_branch.extend(n.outputs.iter().map(|&o| (o, owner.clone())));
        }
    }
    g.nodes.splice(at..=at, expanded);
    Ok(())
}

/// The nodes that compute an `If`'s outputs; `outer` is the guard the `If` runs under.
fn expand_if(
    g: &mut Graph,
    node: &Node,
    outer: &[Condition],
    selects: &mut Selects,
) -> Result<Vec<Node>, String> {
    let then = body_of(g, node, "then_branch")?;
    let other = body_of(g, node, "else_branch")?;
    let cond = own_input(node, 0).ok_or("has no condition (input 0)")?;
    let cond_ty = g.ty(cond).ok_or("the condition's type is unknown")?;
    if cond_ty.dtype != DType::Bool || cond_ty.elements() != 1 {
        return Err(format!(
            "the condition must be one bool, it is {} {:?}",
            cond_ty.dtype, cond_ty.shape
        ));
    }
    for (b, name) in [(then, "then_branch"), (other, "else_branch")] {
        let given = g.bodies[b].outputs.len();
        if given != node.outputs.len() {
            return Err(format!(
                "has {} outputs, but its {name} gives {given}",
                node.outputs.len()
            ));
        }
    }

    let name = label(node);
    let mut expanded = Vec::new();
    match g.constant(cond) {
        Some(value) => {
            let taken = if value.bytes()[0] != 0 { then } else { other };
            let body = std::mem::take(&mut g.bodies[taken]);
            expanded.extend(body.nodes);
            for (k, (&from, &to)) in body.outputs.iter().zip(&node.outputs).enumerate() {
                expanded.push(step(format!("{name}:{k}"), "Identity", &[from], to, Attrs::new()));
            }
        }
        None => {
            let a = std::mem::take(&mut g.bodies[then]);
            let b = std::mem::take(&mut g.bodies[other]);
            for n in a.nodes.iter().chain(&b.nodes) {
                selects.in_branch.extend(n.outputs.iter().map(|&o| (o, node.label())));
            }
            for (nodes, holds) in [(&a.nodes, true), (&b.nodes, false)] {
                let mut guard = outer.to_vec();
                guard.push(Condition { value: cond, holds });
                for o in nodes.iter().flat_map(|n| &n.outputs) {
                    g.guards.insert(*o, guard.clone());
                }
            }
            expanded.extend(a.nodes);
            expanded.extend(b.nodes);
            let pairs = a.outputs.iter().zip(&b.outputs).zip(&node.outputs);
            for (k, ((&x, &y), &to)) in pairs.enumerate() {
                expanded.push(step(
                    format!("{name}:{k}"),
                    "Where",
                    &[cond, x, y],
                    to,
                    Attrs::new(),
                ));
                selects.outputs.insert(to, (node.label(), k));
            }
        }
    }
    Ok(expanded)
}

/// Marks a `Scan` that [`expand_batched_scan`] made for one batch element of an opset-8 one:
/// of the later form though the model's opset is 8 (the importer refuses `ingot.` attributes).
const UNBATCHED: &str = "ingot.unbatched";

/// How many of a `Scan` body's `body_inputs` inputs are scanned (`num_scan_inputs`).
fn scanned_inputs(node: &Node, body_inputs: usize) -> Result<usize, String> {
    usize::try_from(node.attrs.int("num_scan_inputs").map_err(|e| e.to_string())?)
        .ok()
        .filter(|&m| (1..=body_inputs).contains(&m))
        .ok_or_else(|| "num_scan_inputs must be at least 1 and at most the body's inputs".into())
}

/// The nodes that compute a `Scan`'s outputs: its body once per step.
fn expand_scan(g: &mut Graph, node: &Node) -> Result<Vec<Node>, String> {
    if g.opset < 9 && node.attrs.get(UNBATCHED).is_none() {
        return expand_batched_scan(g, node);
    }
    let b = body_of(g, node, "body")?;
    let (body_inputs, body_outputs) = (g.bodies[b].inputs.len(), g.bodies[b].outputs.len());
    let scanned = scanned_inputs(node, body_inputs)?;
    let states = body_inputs - scanned;
    if body_outputs < states || node.outputs.len() != body_outputs {
        return Err(format!(
            "its body takes {body_inputs} inputs ({states} states) and gives {body_outputs} \
             outputs; the node has {} outputs",
            node.outputs.len()
        ));
    }
    let scan_outputs = body_outputs - states;
    let per_input = |attr: &str, n: usize| -> Result<Vec<i64>, String> {
        match node.attrs.ints_opt(attr).map_err(|e| e.to_string())? {
            None => Ok(vec![0; n]),
            Some(v) if v.len() == n => Ok(v.to_vec()),
            Some(v) => Err(format!("{attr} has {} entries, not {n}", v.len())),
        }
    };
    let in_axes = per_input("scan_input_axes", scanned)?;
    let in_reversed = per_input("scan_input_directions", scanned)?;
    let out_axes = per_input("scan_output_axes", scan_outputs)?;
    let out_reversed = per_input("scan_output_directions", scan_outputs)?;

    let inputs: Vec<ValueId> = (0..body_inputs)
        .map(|k| own_input(node, k).ok_or_else(|| format!("input {k} is missing")))
        .collect::<Result<_, _>>()?;
    let mut steps = None;
    for (j, &x) in inputs[states..].iter().enumerate() {
        let ty = g.ty(x).ok_or("a scanned input's type is unknown")?;
        let axis = normalize(in_axes[j], ty.shape.len()).ok_or_else(|| {
            format!("scan_input_axes {} is out of range for rank {}", in_axes[j], ty.shape.len())
        })?;
        let n = ty.shape[axis];
        if *steps.get_or_insert(n) != n {
            return Err(format!("its scanned inputs have {} and {n} steps", steps.unwrap_or(n)));
        }
    }
    let steps = steps.unwrap_or(0);
    if steps == 0 || steps > MAX_UNROLLED {
        return Err(format!(
            "scans {steps} steps; Ingot unrolls a Scan of 1 to {MAX_UNROLLED} steps"
        ));
    }

    let name = label(node);
    let mut expanded = Vec::new();
    let mut state: Vec<ValueId> = inputs[..states].to_vec();
    let mut per_step: Vec<Vec<ValueId>> = vec![Vec::with_capacity(steps); scan_outputs];
    for t in 0..steps {
        let tag = format!("{name}@{t}");
        let mut bound = state.clone();
        for (j, &x) in inputs[states..].iter().enumerate() {
            let at = if in_reversed[j] != 0 { steps - 1 - t } else { t };
            let index = scalar_i64(g, format!("{tag}.index{j}"), at as i64);
            let slice = g.add_value(format!("{tag}.slice{j}"), None);
            let axis = attrs(&[("axis", AttrValue::Int(in_axes[j]))]);
            expanded.push(step(format!("{tag}.slice{j}"), "Gather", &[x, index], slice, axis));
            bound.push(slice);
        }
        let (nodes, outputs) = instantiate(g, b, &bound, &tag);
        expanded.extend(nodes);
        state = outputs[..states].to_vec();
        for (k, &y) in outputs[states..].iter().enumerate() {
            per_step[k].push(y);
        }
    }
    for (k, (&from, &to)) in state.iter().zip(&node.outputs).enumerate() {
        expanded.push(step(format!("{name}:{k}"), "Identity", &[from], to, Attrs::new()));
    }
    for (k, mut ys) in per_step.into_iter().enumerate() {
        if out_reversed[k] != 0 {
            ys.reverse();
        }
        let to = node.outputs[states + k];
        expanded.extend(stack(g, &format!("{name}:{}", states + k), &ys, out_axes[k], to));
    }
    Ok(expanded)
}

/// The nodes that compute an opset-8 `Scan`'s outputs. Its inputs after `sequence_lens` and
/// its outputs have a batch axis first, and the body scans each batch element's slices along
/// their next axis: each element becomes a `Scan` of the later form over its slices (expanded
/// in turn), whose outputs are stacked back along axis 0.
fn expand_batched_scan(g: &mut Graph, node: &Node) -> Result<Vec<Node>, String> {
    let b = body_of(g, node, "body")?;
    let (body_inputs, body_outputs) = (g.bodies[b].inputs.len(), g.bodies[b].outputs.len());
    let scanned = scanned_inputs(node, body_inputs)?;
    if node.outputs.len() != body_outputs {
        return Err(format!(
            "its body gives {body_outputs} outputs; the node has {}",
            node.outputs.len()
        ));
    }
    let inputs: Vec<ValueId> = (1..=body_inputs)
        .map(|k| own_input(node, k).ok_or_else(|| format!("input {k} is missing")))
        .collect::<Result<_, _>>()?;
    let captured = &node.inputs[1 + body_inputs..];
    // Every input has the batch axis; scanned ones the sequence axis after it.
    let mut batch = None;
    let mut steps = None;
    for (k, &x) in inputs.iter().enumerate() {
        let shape = &g.ty(x).ok_or("an input's type is unknown")?.shape;
        let scanned_input = k >= body_inputs - scanned;
        if shape.len() < 1 + usize::from(scanned_input) {
            return Err(format!("input {} of rank {} has no batch axis", k + 1, shape.len()));
        }
        if *batch.get_or_insert(shape[0]) != shape[0] {
            return Err(format!(
                "its inputs have batch sizes {} and {}",
                batch.unwrap_or(0),
                shape[0]
            ));
        }
        if scanned_input && *steps.get_or_insert(shape[1]) != shape[1] {
            return Err(format!(
                "its scanned inputs have {} and {} steps",
                steps.unwrap_or(0),
                shape[1]
            ));
        }
    }
    let (batch, steps) = (batch.unwrap_or(0), steps.unwrap_or(0));
    if let Some(lens) = own_input(node, 0) {
        let all_full = (g.constant(lens).and_then(|c| c.to_f64s()))
            .is_some_and(|lens| lens.iter().all(|&n| n == steps as f64));
        if !all_full {
            return Err(format!(
                "its sequence_lens is not the constant {steps} for every batch element; Ingot \
                 unrolls an opset-8 Scan whose sequences all span the scanned axis"
            ));
        }
    }
    if batch == 0 || batch * steps > MAX_UNROLLED {
        return Err(format!(
            "scans {batch} batch elements of {steps} steps; Ingot unrolls a Scan of 1 to \
             {MAX_UNROLLED} steps in all"
        ));
    }

    let name = label(node);
    let mut expanded = Vec::new();
    let mut per_output: Vec<Vec<ValueId>> = vec![Vec::with_capacity(batch); body_outputs];
    let mut element_attrs = attrs(&[
        ("body", AttrValue::Int(b as i64)),
        ("num_scan_inputs", AttrValue::Int(scanned as i64)),
        (UNBATCHED, AttrValue::Int(1)),
    ]);
    if let Some(directions) = node.attrs.ints_opt("directions").map_err(|e| e.to_string())? {
        element_attrs.set("scan_input_directions", AttrValue::Ints(directions.to_vec()));
    }
    for e in 0..batch {
        let tag = format!("{name}#{e}");
        let index = scalar_i64(g, format!("{tag}.index"), e as i64);
        let axis = attrs(&[("axis", AttrValue::Int(0))]);
        let mut element_inputs = Vec::with_capacity(body_inputs + captured.len());
        for (k, &x) in inputs.iter().enumerate() {
            let slice = g.add_value(format!("{tag}.in{k}"), None);
            expanded.push(step(format!("{tag}.in{k}"), "Gather", &[x, index], slice, axis.clone()));
            element_inputs.push(Some(slice));
        }
        element_inputs.extend(captured.iter().copied());
        let outputs: Vec<ValueId> =
            (0..body_outputs).map(|k| g.add_value(format!("{tag}.out{k}"), None)).collect();
        for (k, &y) in outputs.iter().enumerate() {
            per_output[k].push(y);
        }
        expanded.push(Node {
            name: tag,
            op: "Scan".into(),
            domain: String::new(),
            inputs: element_inputs,
            outputs,
            attrs: element_attrs.clone(),
        });
    }
    for (k, ys) in per_output.iter().enumerate() {
        expanded.extend(stack(g, &format!("{name}:{k}"), ys, 0, node.outputs[k]));
    }
    Ok(expanded)
}

/// The nodes of a `Loop`'s next iteration followed by a `Loop` for the rest, or, once the
/// trip count is reached or the condition is false, the nodes that give its outputs. The
/// iterations done so far are attribute `ingot.iteration`; their scan outputs, `ingot.partials`
/// values, are inputs after the captured ones.
fn expand_loop(g: &mut Graph, node: &Node) -> Result<Vec<Node>, String> {
    let b = body_of(g, node, "body")?;
    let (body_inputs, body_outputs) = (g.bodies[b].inputs.len(), g.bodies[b].outputs.len());
    if body_inputs < 2 || body_outputs < body_inputs - 1 {
        return Err(format!(
            "its body takes {body_inputs} inputs and gives {body_outputs} outputs; a Loop body \
             takes the iteration, the condition and the carried values, and gives the \
             condition, the carried values and the scan outputs"
        ));
    }
    let carried = body_inputs - 2;
    let scan_outputs = body_outputs - 1 - carried;
    if node.outputs.len() != carried + scan_outputs {
        return Err(format!(
            "has {} outputs; its body carries {carried} values and scans {scan_outputs}",
            node.outputs.len()
        ));
    }
    let int_attr = |attr: &str| node.attrs.int_or(attr, 0).map_err(|e| e.to_string());
    let done = usize::try_from(int_attr("ingot.iteration")?).map_err(|e| e.to_string())?;
    let partials = usize::try_from(int_attr("ingot.partials")?).map_err(|e| e.to_string())?;
    let own = 2 + carried;
    let captured_end = node
        .inputs
        .len()
        .checked_sub(partials)
        .filter(|&end| end >= own)
        .ok_or("has fewer inputs than its iterations so far left")?;
    let partial: Vec<ValueId> = node.inputs[captured_end..].iter().flatten().copied().collect();

    let trip_count = match own_input(node, 0) {
        None => None,
        Some(m) => {
            let value = g.constant(m).ok_or(
                "its trip count (input 0) is computed at run time; Ingot unrolls a Loop whose \
                 trip count and condition are known at compile time",
            )?;
            let count = value.tensor().to_i64s().and_then(|v| v.first().copied());
            Some(count.ok_or("its trip count (input 0) must be one integer")?)
        }
    };
    let cond = match own_input(node, 1) {
        None => true,
        Some(c) => {
            let value = g.constant(c).ok_or(if done == 0 {
                "its condition (input 1) is computed at run time; Ingot unrolls a Loop whose \
                 trip count and condition are known at compile time"
            } else {
                "the condition its body computes is known only at run time; Ingot unrolls a \
                 Loop whose trip count and condition are known at compile time"
            })?;
            value.bytes().first().is_some_and(|&b| b != 0)
        }
    };
    let name = label(node);
    let carried_now: Vec<ValueId> = (0..carried)
        .map(|k| own_input(node, 2 + k).ok_or_else(|| format!("carried value {k} is missing")))
        .collect::<Result<_, _>>()?;

    if !cond || trip_count.is_some_and(|m| done as i64 >= m) {
        let mut expanded = Vec::new();
        for (k, (&from, &to)) in carried_now.iter().zip(&node.outputs).enumerate() {
            expanded.push(step(format!("{name}:{k}"), "Identity", &[from], to, Attrs::new()));
        }
        for k in 0..scan_outputs {
            if done == 0 {
                return Err("runs no iteration, so its scan outputs would be empty tensors of \
                            unknown shape"
                    .into());
            }
            let ys: Vec<ValueId> = partial.iter().skip(k).step_by(scan_outputs).copied().collect();
            let to = node.outputs[carried + k];
            expanded.extend(stack(g, &format!("{name}:{}", carried + k), &ys, 0, to));
        }
        return Ok(expanded);
    }
    if done >= MAX_UNROLLED {
        return Err(format!(
            "runs more than {MAX_UNROLLED} iterations; Ingot unrolls a Loop of at most \
             {MAX_UNROLLED}"
        ));
    }

    let tag = format!("{name}@{done}");
    let iteration = scalar_i64(g, format!("{tag}.iteration"), done as i64);
    let cond_in = match own_input(node, 1) {
        Some(c) => c,
        None => {
            let t = Tensor::from_bools(Vec::<usize>::new(), &[true]).map_err(|e| e.to_string())?;
            g.add_constant(format!("{tag}.cond"), Const::owned(t))
        }
    };
    let bound: Vec<ValueId> =
        [iteration, cond_in].into_iter().chain(carried_now.iter().copied()).collect();
    let (mut expanded, outputs) = instantiate(g, b, &bound, &tag);

    let captured = &node.inputs[own..captured_end];
    let mut rest = node.clone();
    rest.inputs = [own_input(node, 0), Some(outputs[0])]
        .into_iter()
        .chain(outputs[1..=carried].iter().map(|&v| Some(v)))
        .chain(captured.iter().copied())
        .chain(partial.iter().chain(&outputs[1 + carried..]).map(|&v| Some(v)))
        .collect();
    rest.attrs.set("ingot.iteration", AttrValue::Int(done as i64 + 1));
    rest.attrs.set("ingot.partials", AttrValue::Int((partials + scan_outputs) as i64));
    expanded.push(rest);
    Ok(expanded)
}

/// The graph attributes that hold body indices, by op.
fn body_attrs(node: &Node) -> &'static [&'static str] {
    match (node.domain.as_str(), node.op.as_str()) {
        ("", "If") => &["then_branch", "else_branch"],
        ("", "Loop" | "Scan") => &["body"],
        _ => &[],
    }
}

fn body_of(g: &Graph, node: &Node, attr: &str) -> Result<usize, String> {
    match node.attrs.get(attr) {
        Some(AttrValue::Int(b)) => usize::try_from(*b).ok().filter(|&b| b < g.bodies.len()),
        _ => None,
    }
    .ok_or_else(|| format!("needs the graph attribute {attr}"))
}

/// Input `k` of the model's own inputs (the captured outer values come after them).
fn own_input(node: &Node, k: usize) -> Option<ValueId> {
    node.inputs.get(k).copied().flatten()
}

fn label(node: &Node) -> String {
    if node.name.is_empty() { node.op.clone() } else { node.name.clone() }
}

fn normalize(axis: i64, rank: usize) -> Option<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    usize::try_from(a).ok().filter(|&a| a < rank)
}

fn attrs(list: &[(&str, AttrValue)]) -> Attrs {
    let mut a = Attrs::new();
    for (name, value) in list {
        a.set(name, value.clone());
    }
    a
}

fn step(name: String, op: &str, inputs: &[ValueId], output: ValueId, attrs: Attrs) -> Node {
    Node {
        name,
        op: op.into(),
        domain: String::new(),
        inputs: inputs.iter().map(|&v| Some(v)).collect(),
        outputs: vec![output],
        attrs,
    }
}

fn scalar_i64(g: &mut Graph, name: String, v: i64) -> ValueId {
    let t = Tensor::from_vec(Vec::<usize>::new(), &[v]).expect("one value for a scalar");
    g.add_constant(name, Const::owned(t))
}

/// Nodes that stack `ys` along a new axis `axis` into `to`: each unsqueezed, then concatenated.
fn stack(g: &mut Graph, name: &str, ys: &[ValueId], axis: i64, to: ValueId) -> Vec<Node> {
    let mut nodes = Vec::with_capacity(ys.len() + 1);
    let mut parts = Vec::with_capacity(ys.len());
    for (t, &y) in ys.iter().enumerate() {
        let part = g.add_value(format!("{name}.part{t}"), None);
        // Unsqueeze reads its axes from an attribute before opset 13, from input 1 since.
        let node = if g.opset < 13 {
            let axes = attrs(&[("axes", AttrValue::Ints(vec![axis]))]);
            step(format!("{name}.part{t}"), "Unsqueeze", &[y], part, axes)
        } else {
            let t1 = Tensor::from_vec(vec![1], &[axis]).expect("one axis");
            let axes = g.add_constant(format!("{name}.axes{t}"), Const::owned(t1));
            step(format!("{name}.part{t}"), "Unsqueeze", &[y, axes], part, Attrs::new())
        };
        nodes.push(node);
        parts.push(part);
    }
    let axis = attrs(&[("axis", AttrValue::Int(axis))]);
    nodes.push(step(name.to_string(), "Concat", &parts, to, axis));
    nodes
}

/// A copy of body `b` for one iteration, its inputs bound to `inputs`: every value its nodes
/// define (in nested bodies too) gets a fresh value named `{name}@{tag}`; constants are
/// shared. Returns the copy's nodes and outputs.
fn instantiate(
    g: &mut Graph,
    b: usize,
    inputs: &[ValueId],
    tag: &str,
) -> (Vec<Node>, Vec<ValueId>) {
    let mut map: BTreeMap<ValueId, ValueId> =
        g.bodies[b].inputs.iter().copied().zip(inputs.iter().copied()).collect();
    let copy = copy_body(g, b, &mut map, tag);
    (copy.nodes, copy.outputs)
}

fn copy_body(g: &mut Graph, b: usize, map: &mut BTreeMap<ValueId, ValueId>, tag: &str) -> Body {
    let body = g.bodies[b].clone();
    let mut nodes = Vec::with_capacity(body.nodes.len());
    for node in &body.nodes {
        let mut copy = node.clone();
        for input in copy.inputs.iter_mut().flatten() {
            if let Some(&v) = map.get(input) {
                *input = v;
            }
        }
        for attr in body_attrs(node) {
            if let Some(AttrValue::Int(inner)) = node.attrs.get(attr) {
                let inner = copy_body(g, *inner as usize, map, tag);
                g.bodies.push(inner);
                copy.attrs.set(attr, AttrValue::Int(g.bodies.len() as i64 - 1));
            }
        }
        for output in &mut copy.outputs {
            let fresh = g.add_value(format!("{}@{tag}", g.values[*output].name), None);
            map.insert(*output, fresh);
            *output = fresh;
        }
        nodes.push(copy);
    }
    let outputs = body.outputs.iter().map(|o| map.get(o).copied().unwrap_or(*o)).collect();
    Body { inputs: body.inputs, nodes, outputs }
}
