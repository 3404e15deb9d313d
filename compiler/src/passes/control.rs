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
//!   stacked back; its `sequence_lens` must be constant and span the whole scanned axis. A
//!   `Scan` of more than [`MAX_UNROLLED`] steps becomes the `Loop` that does the same.
//! - `Loop` is unrolled one iteration at a time: the walk expands an iteration and puts a
//!   `Loop` for the rest after it, which it reaches once the iteration's condition has
//!   folded. Where the trip count or a condition is known only at run time, or the loop runs
//!   more than [`MAX_UNROLLED`] iterations, the rest runs at run time instead: its body once
//!   in the graph, repeated by the runtime ([`Repeat`], see [`Repeating`]).

use super::PassError;
use crate::ir::{Body, Bound, Condition, Const, Graph, Node, Repeat, ValueId};
use ingot_ops::Constant as _;
use ingot_ops::{Tensor, TensorDesc};
use ingot_schema::{AttrValue, Attrs, DType};
use std::collections::{BTreeMap, BTreeSet};

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

    /// An error naming the `If` if `node` would select its output `k` between two sequences
    /// or optionals: which tensors they hold must be known at compile time.
    pub fn check_containers(&self, g: &Graph, node: &Node) -> Result<(), PassError> {
        let Some((owner, k)) = node.outputs.first().and_then(|o| self.outputs.get(o)) else {
            return Ok(());
        };
        if !node.inputs.iter().flatten().any(|v| g.containers.contains_key(v)) {
            return Ok(());
        }
        Err(PassError::Node {
            node: owner.clone(),
            message: format!(
                "its condition is known only at run time, and output {k} is a sequence or \
                 optional, whose elements a static graph must know (make the condition \
                 constant: fix the input shapes it tests, or bind the input with \
                 --constant-input)"
            ),
        })
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
    // And what replaces a node in a run-time loop's body is in that body.
    if let Some(r) = g.repeat_of(&node) {
        for o in expanded.iter().flat_map(|n| &n.outputs) {
            g.in_repeat.insert(*o, r);
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
    if steps == 0 {
        return Err("scans 0 steps".into());
    }
    if steps > MAX_UNROLLED {
        let scan =
            ScanAsLoop { body: b, steps, inputs, in_axes, in_reversed, out_axes, out_reversed };
        return scan.expand(g, node);
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

/// A `Scan` too long to unroll, as the `Loop` that does the same (which the walk then runs
/// at run time): the loop's iteration picks each scanned input's slice with a `Gather`, its
/// states are the scan's, and its stacked scan outputs are reversed or moved to their axis
/// after it where the scan says so.
struct ScanAsLoop {
    body: usize,
    steps: usize,
    /// The scan's own inputs: states, then scanned.
    inputs: Vec<ValueId>,
    in_axes: Vec<i64>,
    in_reversed: Vec<i64>,
    out_axes: Vec<i64>,
    out_reversed: Vec<i64>,
}

impl ScanAsLoop {
    fn expand(self, g: &mut Graph, node: &Node) -> Result<Vec<Node>, String> {
        let name = label(node);
        let tag = format!("{name}@loop");
        let scanned = self.in_axes.len();
        let states = self.inputs.len() - scanned;
        let old = g.bodies[self.body].clone();
        let iteration =
            g.add_value(format!("{tag}.i"), Some(TensorDesc::new(DType::I64, Vec::<usize>::new())));
        let cond = g.add_value(
            format!("{tag}.cond"),
            Some(TensorDesc::new(DType::Bool, Vec::<usize>::new())),
        );
        // Each scanned input's slice, where the old body reads it.
        let mut nodes = Vec::with_capacity(old.nodes.len() + 2 * scanned);
        for (j, &x) in self.inputs[states..].iter().enumerate() {
            let index = if self.in_reversed[j] != 0 {
                let last = scalar_i64(g, format!("{tag}.last{j}"), self.steps as i64 - 1);
                let index = g.add_value(format!("{tag}.index{j}"), None);
                nodes.push(step(
                    format!("{tag}.index{j}"),
                    "Sub",
                    &[last, iteration],
                    index,
                    Attrs::new(),
                ));
                index
            } else {
                iteration
            };
            let axis = attrs(&[("axis", AttrValue::Int(self.in_axes[j]))]);
            let slice = old.inputs[states + j];
            nodes.push(step(format!("{tag}.slice{j}"), "Gather", &[x, index], slice, axis));
        }
        nodes.extend(old.nodes);
        let body = Body {
            inputs: [iteration, cond]
                .into_iter()
                .chain(old.inputs[..states].iter().copied())
                .collect(),
            nodes,
            outputs: std::iter::once(cond).chain(old.outputs.iter().copied()).collect(),
        };
        g.bodies.push(body);
        let loop_body = g.bodies.len() - 1;

        // The loop's scan outputs, stacked along axis 0 first to last, then as the scan has them.
        let mut after = Vec::new();
        let mut outputs = node.outputs[..states].to_vec();
        for (k, &to) in node.outputs[states..].iter().enumerate() {
            let (axis, reversed) = (self.out_axes[k], self.out_reversed[k] != 0);
            if axis == 0 && !reversed {
                outputs.push(to);
                continue;
            }
            let mut y = g.add_value(format!("{tag}.stacked{k}"), None);
            outputs.push(y);
            if reversed {
                let rows: Vec<i64> = (0..self.steps as i64).rev().collect();
                let t = Tensor::from_vec(vec![self.steps], &rows).map_err(|e| e.to_string())?;
                let rows = g.add_constant(format!("{tag}.reversed{k}"), Const::owned(t));
                let out =
                    if axis == 0 { to } else { g.add_value(format!("{tag}.reversed{k}"), None) };
                let axis0 = attrs(&[("axis", AttrValue::Int(0))]);
                after.push(step(format!("{name}:reversed{k}"), "Gather", &[y, rows], out, axis0));
                y = out;
            }
            if axis != 0 {
                // Which perm moves the rows there is known once the walk has inferred the
                // body: [`settle`] writes it.
                let perm = attrs(&[(ROWS_TO, AttrValue::Int(axis))]);
                after.push(step(format!("{name}:moved{k}"), "Transpose", &[y], to, perm));
            }
        }
        let trip = scalar_i64(g, format!("{tag}.trip_count"), self.steps as i64);
        let captured = node.inputs[self.inputs.len()..].iter().copied();
        let looped = Node {
            name: name.clone(),
            op: "Loop".into(),
            domain: String::new(),
            inputs: [Some(trip), None]
                .into_iter()
                .chain(self.inputs[..states].iter().map(|&v| Some(v)))
                .chain(captured)
                .chain(self.inputs[states..].iter().map(|&v| Some(v)))
                .collect(),
            outputs,
            attrs: attrs(&[("body", AttrValue::Int(loop_body as i64))]),
        };
        Ok(std::iter::once(looped).chain(after).collect())
    }
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

    let name = label(node);
    let carried_now: Vec<ValueId> = (0..carried)
        .map(|k| own_input(node, 2 + k).ok_or_else(|| format!("carried value {k} is missing")))
        .collect::<Result<_, _>>()?;
    let at_run_time = |why: &str| Repeating {
        body: b,
        done,
        carried: &carried_now,
        scan_outputs,
        why: why.into(),
    };
    let trip_count = match own_input(node, 0) {
        None => None,
        Some(m) => match g.constant(m) {
            None => {
                return at_run_time("its trip count (input 0) is computed at run time")
                    .expand(g, node);
            }
            Some(value) => {
                let count = value.tensor().to_i64s().and_then(|v| v.first().copied());
                Some(count.ok_or("its trip count (input 0) must be one integer")?)
            }
        },
    };
    let cond = match own_input(node, 1) {
        None => true,
        Some(c) => match g.constant(c) {
            None if done == 0 => {
                return at_run_time("its condition (input 1) is computed at run time")
                    .expand(g, node);
            }
            None => {
                return at_run_time("the condition its body computes is known only at run time")
                    .expand(g, node);
            }
            Some(value) => value.bytes().first().is_some_and(|&b| b != 0),
        },
    };

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
    if done >= MAX_UNROLLED || (done == 0 && trip_count.is_some_and(|m| m > MAX_UNROLLED as i64)) {
        return at_run_time(&format!("it runs more than {MAX_UNROLLED} iterations"))
            .expand(g, node);
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

/// A `Loop` that the walk runs at run time rather than unrolls, from iteration `done` on (the
/// ones before were unrolled), and `why`.
struct Repeating<'a> {
    body: usize,
    done: usize,
    /// The carried values as iteration `done` reads them.
    carried: &'a [ValueId],
    scan_outputs: usize,
    why: String,
}

impl Repeating<'_> {
    /// The nodes that run the loop: copies into the values the runtime holds (the prologue),
    /// one instance of the body that reads them and copies what it gives the next iteration
    /// into values of its own, and copies of the final carried values into the loop's
    /// outputs (the epilogue). The [`Repeat`] records which is which.
    fn expand(self, g: &mut Graph, node: &Node) -> Result<Vec<Node>, String> {
        let refuse = |what: &str| Err(format!("{}; {what}", self.why));
        // Scan outputs are stacked in storage as long as the trip count where it is a
        // constant, or else as the most iterations the caller allows; the runtime stops with
        // an error rather than run past them.
        let constant_trips = own_input(node, 0)
            .and_then(|m| g.constant(m))
            .map(|m| m.tensor().to_i64s().and_then(|v| v.first().copied()).unwrap_or(0));
        let (rows, rows_bounded) = match (constant_trips, g.max_loop_iterations) {
            _ if self.scan_outputs == 0 => (0, false),
            _ if self.done > 0 => {
                return refuse(&format!(
                    "Ingot unrolled its first {} iterations and would run the rest at run \
                     time, but does not stack scan outputs across the two",
                    self.done
                ));
            }
            (Some(m), _) => match usize::try_from(m) {
                Ok(rows) if rows <= MAX_STACKED => (rows, false),
                _ => {
                    return refuse(&format!(
                        "its trip count {m} is more rows than Ingot stacks scan outputs into \
                         (at most {MAX_STACKED})"
                    ));
                }
            },
            (None, Some(most)) if most <= MAX_STACKED => (most, true),
            (None, Some(most)) => {
                return refuse(&format!(
                    "--max-loop-iterations {most} is more rows than Ingot stacks scan outputs \
                     into (at most {MAX_STACKED})"
                ));
            }
            (None, None) => {
                return refuse(
                    "Ingot runs such a Loop as a repeated submodel, whose scan outputs are \
                     stacked in storage planned ahead: give the most iterations it may run \
                     (`ingot compile --max-loop-iterations N`, \
                     `CompileOptions::max_loop_iterations`)",
                );
            }
        };
        if g.repeat_of(node).is_some() {
            return refuse("Ingot runs such a Loop at run time, but not inside another one");
        }
        let name = label(node);
        let tag = format!("{name}@loop");
        let r = g.repeats.len();
        let body_inputs = g.bodies[self.body].inputs.clone();
        let mut prologue = Vec::new();
        // A value the runtime holds, first written by a copy of `from`.
        let mut held = |g: &mut Graph, what: &str, from: ValueId, ty: TensorDesc| {
            copy_into_new(g, &mut prologue, format!("{tag}.{what}"), from, Some(ty))
        };
        let one_i64 = |g: &Graph, v: ValueId| {
            g.ty(v).filter(|t| t.dtype == DType::I64 && t.elements() == 1).cloned()
        };
        let first = scalar_i64(g, format!("{tag}.first"), self.done as i64);
        let iteration_ty = body_inputs
            .first()
            .and_then(|&v| one_i64(g, v))
            .unwrap_or_else(|| TensorDesc::new(DType::I64, Vec::<usize>::new()));
        let iteration = held(g, "iteration", first, iteration_ty);
        let trip_count = match own_input(node, 0) {
            Some(m) => {
                let ty = one_i64(g, m).ok_or("its trip count (input 0) must be one int64")?;
                Some(held(g, "trip_count", m, ty))
            }
            None => None,
        };
        // The states the body reads: the condition (where the loop has one), then each
        // carried value that an iteration changes; one it passes through unchanged is read
        // where it is.
        let mut states = Vec::new();
        // A condition that starts true and that the body passes through stays true: the
        // loop has none (as PyTorch exports a `for` loop).
        let always = own_input(node, 1)
            .and_then(|c| g.constant(c))
            .is_some_and(|c| c.bytes().first().is_some_and(|&b| b != 0))
            && passes_through(&g.bodies[self.body], 0, 1);
        let condition = match own_input(node, 1) {
            Some(_) if always => None,
            Some(c) => {
                let ty = g.ty(c).cloned().ok_or("the condition's type is unknown")?;
                if ty.dtype != DType::Bool || ty.elements() != 1 {
                    return Err(format!(
                        "the condition must be one bool, it is {} {:?}",
                        ty.dtype, ty.shape
                    ));
                }
                let state = held(g, "condition", c, ty);
                states.push((0, state));
                Some(state)
            }
            None => None,
        };
        let condition_in = match condition {
            Some(state) => state,
            None => {
                let t =
                    Tensor::from_bools(Vec::<usize>::new(), &[true]).map_err(|e| e.to_string())?;
                g.add_constant(format!("{tag}.always"), Const::owned(t))
            }
        };
        let mut bound = vec![iteration, condition_in];
        for (k, &init) in self.carried.iter().enumerate() {
            if passes_through(&g.bodies[self.body], 1 + k, 2 + k) {
                bound.push(init);
                continue;
            }
            let ty = g
                .ty(init)
                .cloned()
                .ok_or_else(|| format!("carried value {k}'s type is unknown"))?;
            let state = held(g, &format!("state{k}"), init, ty);
            states.push((1 + k, state));
            bound.push(state);
        }
        let (mut nodes, outputs) = instantiate(g, self.body, &bound, &tag);
        let mut carried = Vec::with_capacity(states.len());
        for &(k, state) in &states {
            let next = copy_into_new(g, &mut nodes, format!("{tag}.next{k}"), outputs[k], None);
            carried.push((state, next));
        }
        let mut scans = Vec::with_capacity(self.scan_outputs);
        let mut stacks = Vec::with_capacity(self.scan_outputs);
        let carried_count = self.carried.len();
        for j in 0..self.scan_outputs {
            let k = 1 + carried_count + j;
            let slice = copy_into_new(g, &mut nodes, format!("{tag}.slice{j}"), outputs[k], None);
            // Its type is the slice's with `rows` first, known once the walk has inferred
            // the body: [`settle`] makes this node what writes it first (zeros).
            let stacked = g.add_value(format!("{tag}.stacked{j}"), None);
            let mut attrs = Attrs::new();
            attrs.set(STACK_ROWS, AttrValue::Int(rows as i64));
            stacks.push(step(format!("{tag}.stacked{j}"), "Identity", &[slice], stacked, attrs));
            // Without a condition a constant trip count fills every row.
            if condition.is_some() || rows_bounded {
                g.bounded.insert(stacked, Bound { axis: 0, count: iteration });
            }
            scans.push((slice, stacked));
        }
        for o in nodes.iter().flat_map(|n| &n.outputs) {
            g.in_repeat.insert(*o, r);
        }
        // After the last iteration the runtime has copied the carried values into the
        // states; the loop's outputs are those (or the values passed through).
        let mut epilogue = Vec::with_capacity(node.outputs.len());
        for (k, &to) in node.outputs.iter().enumerate() {
            let from = match states.iter().find(|&&(j, _)| j == 1 + k) {
                Some(&(_, state)) => state,
                None if k < carried_count => self.carried[k],
                None => scans[k - carried_count].1,
            };
            epilogue.push(step(format!("{name}:{k}"), "Identity", &[from], to, Attrs::new()));
        }
        let label = node.label();
        let guard = g.guard(node).to_vec();
        let repeat =
            Repeat { name, label, iteration, trip_count, condition, carried, guard, scans };
        g.outputs.extend(repeat.held());
        g.repeats.push(repeat);
        // The stacks' first writers come after the body in the walk (which types them
        // from it), and before it when run: the partition makes the body wait for them.
        Ok(prologue.into_iter().chain(nodes).chain(stacks).chain(epilogue).collect())
    }
}

/// A new value `name` (of type `ty`, where known) and the Identity, pushed onto `nodes`,
/// that copies `from` into it.
fn copy_into_new(
    g: &mut Graph,
    nodes: &mut Vec<Node>,
    name: String,
    from: ValueId,
    ty: Option<TensorDesc>,
) -> ValueId {
    let v = g.add_value(name.clone(), ty);
    nodes.push(step(name, "Identity", &[from], v, Attrs::new()));
    v
}

/// Whether `body` gives its input `input` unchanged as its output `output`: the same value,
/// or an Identity of it (skl2onnx's pairwise-distance Scan carries its data that way).
fn passes_through(body: &Body, output: usize, input: usize) -> bool {
    let (out, inp) = (body.outputs[output], body.inputs[input]);
    out == inp
        || body.nodes.iter().any(|n| {
            n.op == "Identity" && n.outputs == [out] && n.inputs.first() == Some(&Some(inp))
        })
}

/// The most rows a run-time loop stacks a scan output into.
const MAX_STACKED: usize = 1 << 20;

/// Marks the node that first writes a run-time loop's stacked scan output, with its rows.
const STACK_ROWS: &str = "ingot.stack_rows";

/// Marks the Transpose that moves a long Scan's stacked rows to `scan_output_axes`.
const ROWS_TO: &str = "ingot.rows_to";

/// Completes the node at `g.nodes[at]` where it was made before the types it needs were
/// inferred (the walk reaches it after the body that gives them):
/// - what first writes a stacked scan output (an Identity of the slice marked
///   [`STACK_ROWS`]) becomes the zeros it starts as: a zero of the slice's dtype expanded to
///   its shape with the rows first;
/// - the Transpose that moves a long Scan's rows to their axis (marked [`ROWS_TO`]) gets
///   its perm.
pub fn settle(g: &mut Graph, at: usize) -> Result<(), PassError> {
    let node = &g.nodes[at];
    if let Some(AttrValue::Int(axis)) = node.attrs.get(ROWS_TO).cloned() {
        let rank =
            node.inputs.first().copied().flatten().and_then(|v| g.ty(v)).map(|t| t.shape.len());
        let a = rank.and_then(|rank| normalize(axis, rank)).ok_or_else(|| PassError::Node {
            node: node.label(),
            message: format!("scan_output_axes {axis} is out of range for its output"),
        })?;
        let rank = rank.unwrap_or(0) as i64;
        let perm: Vec<i64> = (1..=a as i64).chain([0]).chain(a as i64 + 1..rank).collect();
        g.nodes[at].attrs = attrs(&[("perm", AttrValue::Ints(perm))]);
        return Ok(());
    }
    let Some(AttrValue::Int(rows)) = node.attrs.get(STACK_ROWS).cloned() else {
        return Ok(());
    };
    let Some(slice) = node.inputs.first().copied().flatten() else { return Ok(()) };
    let Some(ty) = g.ty(slice).cloned() else {
        return Err(PassError::Node {
            node: node.label(),
            message: "its scan output's type is unknown".into(),
        });
    };
    let shape: Vec<i64> = std::iter::once(rows).chain(ty.shape.iter().map(|&d| d as i64)).collect();
    let name = format!("{}.shape", node.name);
    let dims =
        Tensor::from_vec(vec![shape.len()], &shape).map_err(|e| PassError::Graph(e.to_string()))?;
    let dims = g.add_constant(name, Const::owned(dims));
    let zero = Tensor::zeros(TensorDesc::new(ty.dtype, Vec::<usize>::new()));
    let zero = g.add_constant(format!("{}.zero", g.nodes[at].name), Const::owned(zero));
    let node = &mut g.nodes[at];
    node.op = "Expand".into();
    node.inputs = vec![Some(zero), Some(dims)];
    node.attrs = Attrs::new();
    Ok(())
}

/// Checks, once the walk has inferred every body, that each run-time loop's carried values
/// keep one type from iteration to iteration: their storage is planned once.
pub fn check_repeats(g: &Graph) -> Result<(), PassError> {
    for r in &g.repeats {
        for &(state, next) in &r.carried {
            let (before, after) = (g.ty(state), g.ty(next));
            let message = if before != after {
                let show = |t: Option<&TensorDesc>| {
                    t.map_or("of unknown type".into(), |t| format!("{} {:?}", t.dtype, t.shape))
                };
                format!(
                    "it runs at run time, so its carried values must keep their type from one \
                     iteration to the next, but '{}' is {} before an iteration and {} after it",
                    g.values[state].name,
                    show(before),
                    show(after)
                )
            } else if g.bounded.contains_key(&next) {
                format!(
                    "it runs at run time, and carries '{}', whose length depends on the data",
                    g.values[state].name
                )
            } else {
                continue;
            };
            return Err(PassError::Node { node: r.label.clone(), message });
        }
    }
    Ok(())
}

/// Drops the copies at the end of run-time loops' bodies where it can, once the walk has
/// folded what it could: a value the runtime reads after an iteration (a next value, a scan
/// slice) that an Identity copies from a value a node of the body still writes, which
/// nothing else holds or returns, is written by that node itself. A step fewer an iteration.
pub fn forward_copies(g: &mut Graph) {
    let held: BTreeSet<ValueId> = g.repeats.iter().flat_map(|r| r.held()).collect();
    let targets: Vec<ValueId> = (g.repeats.iter())
        .flat_map(|r| r.carried.iter().map(|&(_, next)| next).chain(r.scans.iter().map(|s| s.0)))
        .collect();
    for to in targets {
        let producers = g.producers();
        let Some(c) = producers[to] else { continue };
        let copy = &g.nodes[c];
        let Some(&Some(from)) = copy.inputs.first() else { continue };
        let Some(p) = producers[from] else { continue };
        let producer = &g.nodes[p];
        let forwardable = copy.op == "Identity"
            && copy.inputs.len() == 1
            && !held.contains(&from)
            && !g.outputs.contains(&from)
            && !g.bounded.contains_key(&from)
            && g.repeat_of(producer) == g.repeat_of(copy)
            && g.guard(producer) == g.guard(copy);
        if !forwardable {
            continue;
        }
        for o in &mut g.nodes[p].outputs {
            if *o == from {
                *o = to;
            }
        }
        for input in g.nodes.iter_mut().flat_map(|n| n.inputs.iter_mut().flatten()) {
            if *input == from {
                *input = to;
            }
        }
        if let Some(guard) = g.guards.remove(&from) {
            g.guards.insert(to, guard);
        }
        g.nodes.remove(c);
    }
}

/// The graph attributes that hold body indices, by op.
fn body_attrs(node: &Node) -> &'static [&'static str] {
    match (node.domain.as_str(), node.op.as_str()) {
        ("", "If") => &["then_branch", "else_branch"],
        ("", "Loop" | "Scan" | "SequenceMap") => &["body"],
        _ => &[],
    }
}

pub(super) fn body_of(g: &Graph, node: &Node, attr: &str) -> Result<usize, String> {
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
pub(super) fn instantiate(
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
