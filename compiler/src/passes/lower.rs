//! Lowering, shape inference and constant folding, in one walk in execution order:
//! each node is made canonical for the model's opset (`ops::*::lower`), its output types are
//! inferred (`ops::*::infer`), and if every input is constant it is evaluated with the
//! runtime's CPU kernels and replaced by its constant outputs. Shape and Size are answered
//! from static types. This is what turns dynamic-shape plumbing into a static graph.
//! An `If`, `Loop` or `Scan` is expanded in place when the walk reaches it (`control.rs`), its condition
//! folded by then if it can be, and the nodes that replace it are walked next. A node of
//! opset 6 whose meaning opset 7 changed is restated first (`legacy.rs`), and so is a Slice
//! whose window starts at a run-time value (`dynamic_slices.rs`), and so is a contrib op of
//! ONNX Runtime's that standard ops say (`contrib.rs`). Sequence ops become the
//! tensor nodes they amount to (`sequences.rs`), and a graph output that is a sequence or
//! optional the tensors it holds.

use super::{PassError, bounded, contrib, control, dynamic_slices, legacy, sequences};
use crate::ir::{Const, Graph, Node};
use crate::onnx::checked_bytes;
use ingot_ops::lower::{LowerCx, OpError};
use ingot_ops::{Tensor, TensorDesc, cpu};

pub fn run(g: &mut Graph) -> Result<(), PassError> {
    let mut folded = Vec::with_capacity(g.nodes.len());
    let mut selects = control::Selects::default();
    let mut i = 0;
    // The walk, then again over the `Identity`s that make container outputs tensors.
    while i < g.nodes.len() || sequences::expose_outputs(g)? {
        control::settle(g, i)?;
        contrib::settle(g, i)?;
        if legacy::settle(g, i)? {
            continue; // a Reshape it inserted at i, walked first
        }
        dynamic_slices::settle(g, i)?;
        if control::is_control_flow(&g.nodes[i]) {
            // Its place now holds what computes its outputs, walked next.
            control::expand(g, i, &mut selects)?;
            continue;
        }
        if sequences::expands(g, &g.nodes[i]) {
            sequences::expand(g, i)?;
            continue;
        }
        selects.check_containers(g, &g.nodes[i])?;
        sequences::check_reader(g, &g.nodes[i])?;
        // An op that may fill a data-dependent number of rows writes the count as an extra
        // output (`ingot_ops::bounded`), which the model's node does not list.
        let counted = ingot_ops::lookup(&g.nodes[i].op).is_some_and(|d| d.def.bounded.is_some())
            && !g.nodes[i].outputs.is_empty();
        if counted {
            let name = format!("{}:count", g.values[g.nodes[i].outputs[0]].name);
            let count = g.add_value(name, None);
            g.nodes[i].outputs.push(count);
        }
        let node = &mut g.nodes[i];
        let at = |e: OpError, node: &Node| PassError::Node {
            node: node.label(),
            message: selects.explain(node, e.0),
        };
        let def = ingot_ops::lookup(&node.op)
            .ok_or_else(|| at(OpError(format!("op {} is not supported", node.op)), node))?;
        let values = &g.values;
        for (k, input) in node.inputs.iter().enumerate() {
            if let Some(v) = input
                && values[*v].ty.is_none()
            {
                return Err(at(
                    OpError(format!("the type of input {k} '{}' is unknown", values[*v].name)),
                    node,
                ));
            }
        }
        let cx = LowerCx {
            opset: g.opset,
            inputs: node.inputs.iter().map(|v| v.and_then(|v| values[v].ty.as_ref())).collect(),
            consts: node
                .inputs
                .iter()
                .map(|v| {
                    v.and_then(|v| values[v].constant.as_ref())
                        .map(|c| c as &dyn ingot_ops::Constant)
                })
                .collect(),
        };
        (def.def.lower)(node, &cx).map_err(|e| at(e, node))?;
        // Lowered exact (a TopK of constant K): no count; the value it had stays unread.
        if counted && def.def.bounded.is_some_and(|dim| dim(&node.attrs).is_none()) {
            node.outputs.pop();
        }
        let inputs: Vec<usize> = node
            .inputs
            .iter()
            .map(|v| v.ok_or_else(|| OpError("lowering left an omitted input".into())))
            .collect::<Result<_, _>>()
            .map_err(|e| at(e, node))?;
        let in_types: Vec<&TensorDesc> = inputs
            .iter()
            .map(|&v| values[v].ty.as_ref())
            .collect::<Option<_>>()
            .ok_or_else(|| at(OpError("an input's type is unknown".into()), node))?;
        selects.check(node, &in_types)?;
        let out_types = (def.def.infer)(node, &in_types).map_err(|e| at(e, node))?;
        if out_types.len() != node.outputs.len() {
            return Err(at(
                OpError(format!(
                    "produces {} outputs, the model lists {}",
                    out_types.len(),
                    node.outputs.len()
                )),
                node,
            ));
        }
        // Every later stage computes sizes and strides from inferred types unchecked.
        let too_large = |t: &&TensorDesc| checked_bytes(t.dtype, &t.shape).is_none();
        if let Some(t) = out_types.iter().find(too_large) {
            return Err(at(
                OpError(format!(
                    "its output {} {:?} is too large for any memory",
                    t.dtype, t.shape
                )),
                node,
            ));
        }
        let node = &g.nodes[i];
        let bounds = bounded::propagate(g, node, &in_types, &out_types).map_err(|e| at(e, node))?;
        let constants = if matches!(node.op.as_str(), "Shape" | "Size") {
            Some(vec![shape_constant(node, in_types[0]).map_err(|e| at(e, node))?])
        } else if inputs.iter().all(|&v| values[v].constant.is_some())
            && bounds.is_empty()
            && !held(g, node)
            && !ingot_ops::keeps_constant_narrow(&node.op, &in_types, &out_types)
        {
            // `Tensor::zeros` aborts the process when the allocator refuses (and a kernel may
            // build tables as long as its output's dims), so the outputs are tried first.
            if let Some(t) = out_types
                .iter()
                .find(|t| Vec::<u64>::new().try_reserve_exact(t.bytes().div_ceil(8)).is_err())
            {
                return Err(at(
                    OpError(format!(
                        "constant folding needs {} bytes for an output, more than can be \
                         allocated",
                        t.bytes()
                    )),
                    node,
                ));
            }
            let tensors: Vec<_> = inputs
                .iter()
                .filter_map(|&v| values[v].constant.as_ref().map(Const::tensor))
                .collect();
            let refs: Vec<&Tensor> = tensors.iter().map(|t| t.as_ref()).collect();
            let outs = cpu::eval(&node.op, &node.attrs, &refs, &out_types)
                .map_err(|e| at(OpError(format!("constant folding failed: {e}")), node))?;
            Some(outs)
        } else {
            None
        };
        let outputs = node.outputs.clone();
        g.bounded.extend(bounds);
        for (&o, ty) in outputs.iter().zip(out_types) {
            g.values[o].ty = Some(ty);
        }
        folded.push(constants.is_some());
        if let Some(constants) = constants {
            for (&o, t) in outputs.iter().zip(constants) {
                g.values[o].constant = Some(Const::owned(t));
            }
        }
        i += 1;
    }
    g.containers.clear(); // the graph's outputs are tensors now
    let mut f = folded.iter();
    g.nodes.retain(|_| !*f.next().unwrap_or(&false));
    g.bodies.clear(); // every one was expanded
    control::check_repeats(g)?;
    control::forward_copies(g);
    Ok(())
}

/// Whether `node` writes a value a run-time loop holds: the runtime changes it between
/// iterations, so a copy of a constant into it is no constant.
fn held(g: &Graph, node: &Node) -> bool {
    g.repeats.iter().flat_map(|r| r.held()).any(|v| node.outputs.contains(&v))
}

/// The value of a canonical Shape (attributes `start`, `end`) or Size node.
fn shape_constant(node: &Node, input: &TensorDesc) -> Result<Tensor, OpError> {
    let dims: Vec<i64> = input.shape.iter().map(|&d| d as i64).collect();
    let t = if node.op == "Size" {
        Tensor::from_vec(Vec::<usize>::new(), &[dims.iter().product::<i64>()])
    } else {
        let rank = dims.len() as i64;
        let clamp = |v: i64| (if v < 0 { v + rank } else { v }).clamp(0, rank) as usize;
        let start = clamp(node.attrs.int_or("start", 0)?);
        let end = clamp(node.attrs.int_or("end", rank)?).max(start);
        Tensor::from_vec(vec![end - start], &dims[start..end])
    };
    t.map_err(|e| OpError(e.to_string()))
}
