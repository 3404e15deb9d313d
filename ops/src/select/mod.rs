//! Ops whose output length depends on the data: NonMaxSuppression (`nms.rs`), NonZero and
//! Compress. Each output is planned at its upper bound along one dim, rows past what the run
//! fills are zero, and the op writes how many it filled as an extra int64 scalar output, which
//! the compiler appends to the model's node (see `crate::bounded`). The CPU kernels are in
//! `cpu.rs` (and `cpu/`); none has a Vulkan kernel: each is a sequential pass that decides
//! where every element goes, and runs as a CPU submodel of its own in a Vulkan session.
//!
//! Canonical forms (what `cpu.rs` reads):
//! - NonZero: input X (rank 1 or more); output [rank, bound] int64, the coordinates of X's
//!   non-zero elements in row-major order (a NaN is non-zero, -0.0 is zero), bound = X's
//!   element count; then the count.
//! - Compress: inputs X and a 1-D bool condition no longer than what it selects from;
//!   attributes `axis` (nonnegative) and `flatten` (1 when the model gave no axis: X is read
//!   flattened and `axis` is 0); output X's shape (flattened: one dim) with the axis' dim the
//!   bound, min(condition's length, that dim), the slices where the condition holds in order;
//!   then the count.

mod cpu;
pub(crate) mod nms;

pub(crate) const FAMILY: Family = Family {
    ops: OPS,
    cpu: cpu::prepare,
    in_place: never,
    #[cfg(feature = "wgsl")]
    vulkan: no_vulkan,
};

use crate::Node;
use crate::TensorDesc;
use crate::lower::{LowerCx, OpResult, normalize_axis, op_err};
#[cfg(feature = "wgsl")]
use crate::registry::no_vulkan;
use crate::registry::{Family, OpDef, never};
use ingot_schema::{AttrValue, Attrs, DType};

pub const OPS: &[OpDef] = &[
    OpDef::new("NonMaxSuppression", nms::lower, nms::infer).bounded(|_| Some(0)).cpu_only(
        "NonMaxSuppression has no Vulkan kernel: its greedy, data-dependent loop runs on the \
         CPU, as a submodel of its own",
    ),
    OpDef::new("NonZero", lower_non_zero, infer_non_zero).bounded(|_| Some(1)).cpu_only(
        "NonZero has no Vulkan kernel: where each index goes depends on every element before \
         it; its steps run on the CPU, as a submodel of their own",
    ),
    OpDef::new("Compress", lower_compress, infer_compress)
        .bounded(|a| Some(a.int("axis").map_or(0, |v| v as usize)))
        .cpu_only(
            "Compress has no Vulkan kernel: where each slice goes depends on the condition \
             before it; its steps run on the CPU, as a submodel of their own",
        ),
];

fn lower_non_zero(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    if cx.input(0)?.shape.is_empty() {
        return Err(op_err!("NonZero of a scalar is not supported"));
    }
    node.attrs = Attrs::new();
    Ok(())
}

fn infer_non_zero(_: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let [x] = inputs else {
        return Err(op_err!("NonZero takes one input, got {}", inputs.len()));
    };
    let n = x.elements();
    Ok(vec![TensorDesc::new(DType::I64, [x.shape.len(), n]), TensorDesc::new(DType::I64, [])])
}

fn lower_compress(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let rank = cx.input(0)?.shape.len();
    let (axis, flatten) = match node.attrs.get("axis") {
        Some(_) => (normalize_axis(node.attrs.int("axis")?, rank)?, 0),
        None => (0, 1),
    };
    node.attrs = Attrs::new()
        .with("axis", AttrValue::Int(axis as i64))
        .with("flatten", AttrValue::Int(flatten));
    Ok(())
}

/// What Compress selects from: X's shape, flattened or not, and the axis in it.
fn compress_view(attrs: &Attrs, x: &TensorDesc) -> OpResult<(Vec<usize>, usize)> {
    let axis = usize::try_from(attrs.int("axis")?).unwrap_or(usize::MAX);
    let shape = if attrs.int("flatten")? == 1 { vec![x.elements()] } else { x.shape.clone() };
    if axis >= shape.len() {
        return Err(op_err!("axis {axis} is out of range for {:?}", shape));
    }
    Ok((shape, axis))
}

fn infer_compress(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let [x, condition] = inputs else {
        return Err(op_err!("Compress takes X and a condition, got {} inputs", inputs.len()));
    };
    if condition.dtype != DType::Bool || condition.shape.len() != 1 {
        return Err(op_err!(
            "the condition must be a 1-D bool tensor, got {} {:?}",
            condition.dtype,
            condition.shape
        ));
    }
    let (mut shape, axis) = compress_view(&node.attrs, x)?;
    if condition.shape[0] > shape[axis] {
        return Err(op_err!(
            "the condition holds {} values, more than the {} it selects from",
            condition.shape[0],
            shape[axis]
        ));
    }
    shape[axis] = condition.shape[0];
    Ok(vec![TensorDesc::new(x.dtype, shape), TensorDesc::new(DType::I64, [])])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(op: &str, attrs: Attrs) -> Node {
        Node {
            name: "n".into(),
            op: op.into(),
            domain: String::new(),
            inputs: vec![Some(0), Some(1)],
            outputs: vec![2, 3],
            attrs,
        }
    }

    #[test]
    fn compress_is_planned_at_the_conditions_length_along_its_axis() {
        let x = TensorDesc::new(DType::F32, [3, 4]);
        let c = TensorDesc::new(DType::Bool, [2]);
        let lowered = |attrs: Attrs| {
            let mut n = node("Compress", attrs);
            let cx = LowerCx { opset: 11, inputs: vec![Some(&x), Some(&c)], consts: vec![] };
            lower_compress(&mut n, &cx).map(|()| n)
        };
        let n = lowered(Attrs::new().with("axis", AttrValue::Int(-1))).unwrap();
        let out = infer_compress(&n, &[&x, &c]).unwrap();
        assert_eq!(out[0].shape, [3, 2]);
        let flat = lowered(Attrs::new()).unwrap();
        assert_eq!(infer_compress(&flat, &[&x, &c]).unwrap()[0].shape, [2]);
        let long = TensorDesc::new(DType::Bool, [5]);
        let n = lowered(Attrs::new().with("axis", AttrValue::Int(0))).unwrap();
        let err = infer_compress(&n, &[&x, &long]).unwrap_err();
        assert!(err.0.contains("5 values, more than the 3"), "{err}");
    }

    #[test]
    fn non_zero_is_planned_for_every_element() {
        let x = TensorDesc::new(DType::F32, [2, 3]);
        let out = infer_non_zero(&node("NonZero", Attrs::new()), &[&x]).unwrap();
        assert_eq!(out[0], TensorDesc::new(DType::I64, [2, 6]));
    }
}
