//! Loss functions: `NegativeLogLikelihoodLoss` and `SoftmaxCrossEntropyLoss` (opsets 12, 13
//! and 22), which exported training and evaluation graphs end in. The kernel is in `cpu.rs`.
//!
//! Canonical form (what `cpu.rs` reads):
//! - inputs: X (the log-probabilities, or the scores SoftmaxCrossEntropyLoss takes the log
//!   softmax of along axis 1), `[N, C, d1, ..]` in float32 or float64; the target classes
//!   `[N, d1, ..]` in int32 or int64; and, where the model has one, a weight per class `[C]`
//!   in X's type.
//! - attributes: `reduction` (`none`, `sum` or `mean`), `ignore_index` (absent: none).
//! - outputs: the loss in X's type, the target's shape with `none`, else a scalar; and, for
//!   SoftmaxCrossEntropyLoss where the model asks for it, the log-probabilities (X's shape).
//!
//! Each element's loss is `-weight[t] * X[n, t, d]` for its target class `t`, 0 where `t` is
//! `ignore_index`. `mean` divides the sum by the sum of the weights the targets picked
//! (ignored ones not counted; without weights, by the count of targets not ignored), as the
//! ONNX definition says.

pub(crate) mod cpu;

pub(crate) const FAMILY: Family = Family {
    ops: OPS,
    cpu: cpu::prepare,
    // Outputs are smaller than X or read it whole per lane.
    in_place: never,
    #[cfg(feature = "wgsl")]
    vulkan: no_vulkan,
};

use crate::Node;
use crate::TensorDesc;
use crate::lower::{LowerCx, OpResult, op_err};
#[cfg(feature = "wgsl")]
use crate::registry::no_vulkan;
use crate::registry::{Family, OpDef, never};
use ingot_schema::{AttrValue, Attrs, DType};

const WHY: &str = "loss functions have no Vulkan kernel: they end training and evaluation \
                   graphs, and run on the CPU as a submodel of their own";

pub const OPS: &[OpDef] = &[
    OpDef::new("NegativeLogLikelihoodLoss", lower, infer).cpu_only(WHY),
    OpDef::new("SoftmaxCrossEntropyLoss", lower, infer).cpu_only(WHY),
];

fn lower(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let reduction = node.attrs.text_or("reduction", "mean")?.to_string();
    if !matches!(reduction.as_str(), "none" | "sum" | "mean") {
        return Err(op_err!("reduction must be none, sum or mean, got '{reduction}'"));
    }
    let mut attrs = Attrs::new().with("reduction", AttrValue::Text(reduction));
    if node.attrs.contains("ignore_index") {
        attrs.set("ignore_index", AttrValue::Int(node.attrs.int("ignore_index")?));
    }
    node.attrs = attrs;
    // An omitted weight is the last input.
    if !cx.has_input(2) {
        node.inputs.truncate(2);
    }
    Ok(())
}

/// The loss, and SoftmaxCrossEntropyLoss's log-probabilities where the model lists them.
fn infer(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let (x, target, weight) = match inputs {
        [x, t] => (x, t, None),
        [x, t, w] => (x, t, Some(w)),
        _ => return Err(op_err!("{} takes 2 or 3 inputs, got {}", node.op, inputs.len())),
    };
    let shape = check(x, target, weight.copied())?;
    let loss = match node.attrs.text("reduction")? {
        "none" => TensorDesc::new(x.dtype, shape),
        _ => TensorDesc::new(x.dtype, []),
    };
    let log_prob = node.op == "SoftmaxCrossEntropyLoss" && node.outputs.len() > 1;
    Ok([loss].into_iter().chain(log_prob.then(|| (*x).clone())).collect())
}

/// Checks X, the target and the weight against each other; the target's shape.
pub(crate) fn check(
    x: &TensorDesc,
    target: &TensorDesc,
    weight: Option<&TensorDesc>,
) -> OpResult<Vec<usize>> {
    if !matches!(x.dtype, DType::F32 | DType::F64) {
        return Err(op_err!("X must be float32 or float64, got {}", x.dtype));
    }
    let [n, c, rest @ ..] = x.shape.as_slice() else {
        return Err(op_err!("X must be [N, C, ...], got {:?}", x.shape));
    };
    let shape: Vec<usize> = std::iter::once(*n).chain(rest.iter().copied()).collect();
    if !matches!(target.dtype, DType::I32 | DType::I64) || target.shape != shape {
        return Err(op_err!(
            "the target must be int32 or int64 of shape {shape:?} for X {:?}, got {} {:?}",
            x.shape,
            target.dtype,
            target.shape
        ));
    }
    if let Some(w) = weight
        && (w.dtype != x.dtype || w.shape != [*c])
    {
        return Err(op_err!(
            "the weight must be {} [{c}], one per class, got {} {:?}",
            x.dtype,
            w.dtype,
            w.shape
        ));
    }
    Ok(shape)
}
