//! Reductions and ops along one axis: `Reduce*`, `ArgMax`/`ArgMin`, `Softmax`/`LogSoftmax`/
//! `Hardmax`, `LpNormalization`. The canonical attributes are documented in `ops/src/reduce/cpu.rs`:
//! - `Reduce*`: `axes` (sorted, distinct, non-negative; ONNX's "empty means all" is spelled
//!   out, so an empty list only remains for `noop_with_empty_axes=1`) and `keepdims`; the
//!   axes operand (an input from opset 13 for ReduceSum, 18 for the others) is dropped.
//! - `ArgMax`/`ArgMin`: `axis` (non-negative), `keepdims`, `select_last_index`.
//! - `Softmax`/`LogSoftmax`/`Hardmax`: `axis` (non-negative) and `coerce_2d`, 1 only when the
//!   opset < 13 meaning (over all axes from `axis` on) differs from the one-axis meaning.
//! - `LpNormalization`: `axis` (non-negative) and `p` (1 or 2).

pub(crate) mod cpu;
#[cfg(feature = "wgsl")]
pub(crate) mod vulkan;

pub(crate) const FAMILY: Family = Family {
    ops: OPS,
    cpu: cpu::prepare,
    in_place: never,
    #[cfg(feature = "wgsl")]
    vulkan: vulkan::lower,
};

use crate::Node;
use crate::TensorDesc;
use crate::lower::{LowerCx, OpResult, normalize_axis, op_err};
use crate::registry::{Family, OpDef, never};
use ingot_schema::{AttrValue, Attrs, DType};

const fn reduce(name: &'static str) -> OpDef {
    OpDef::new(name, lower_reduce, infer_reduce)
}

const fn arg(name: &'static str) -> OpDef {
    OpDef::new(name, lower_arg, infer_arg)
}

const fn softmax(name: &'static str) -> OpDef {
    OpDef::new(name, lower_softmax, infer_softmax)
}

pub const OPS: &[OpDef] = &[
    reduce("ReduceSum"),
    reduce("ReduceMean"),
    reduce("ReduceMax"),
    reduce("ReduceMin"),
    reduce("ReduceProd"),
    reduce("ReduceL1"),
    reduce("ReduceL2"),
    reduce("ReduceLogSum"),
    reduce("ReduceLogSumExp"),
    reduce("ReduceSumSquare"),
    arg("ArgMax"),
    arg("ArgMin"),
    softmax("Softmax"),
    softmax("LogSoftmax"),
    softmax("Hardmax"),
    OpDef::new("LpNormalization", lower_lp_norm, infer_lp_norm),
];

fn flag(v: i64) -> AttrValue {
    AttrValue::Int((v != 0) as i64)
}

/// The single input's type; canonical nodes of this family have one input.
fn only_input<'a>(inputs: &[&'a TensorDesc]) -> OpResult<&'a TensorDesc> {
    match inputs {
        [x] => Ok(x),
        _ => Err(op_err!("expects one input, got {}", inputs.len())),
    }
}

fn lower_reduce(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let rank = cx.input(0)?.shape.len();
    // Axes moved from an attribute to an optional input in opset 13 (ReduceSum) or 18.
    let axes = match cx.const_ints(1, "axes")? {
        Some(axes) => axes,
        None => node.attrs.ints_opt("axes")?.unwrap_or_default().to_vec(),
    };
    let noop = node.attrs.int_or("noop_with_empty_axes", 0)? != 0;
    let mut axes = axes
        .iter()
        .map(|&a| normalize_axis(a, rank).map(|a| a as i64))
        .collect::<OpResult<Vec<_>>>()?;
    axes.sort_unstable();
    if axes.windows(2).any(|w| w[0] == w[1]) {
        return Err(op_err!("axes {axes:?} repeat an axis"));
    }
    if axes.iter().any(|&a| a as usize >= rank) {
        return Err(op_err!("axes {axes:?} are out of range for rank {rank}"));
    }
    if axes.is_empty() && !noop {
        axes = (0..rank as i64).collect();
    }
    let keepdims = node.attrs.int_or("keepdims", 1)?;
    node.attrs = Attrs::new().with("axes", AttrValue::Ints(axes)).with("keepdims", flag(keepdims));
    node.inputs.truncate(1);
    Ok(())
}

fn infer_reduce(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = only_input(inputs)?;
    let axes = node.attrs.ints("axes")?;
    let keepdims = node.attrs.int("keepdims")? != 0;
    if let Some(a) = axes.iter().find(|&&a| usize::try_from(a).map_or(true, |a| a >= x.shape.len()))
    {
        return Err(op_err!("axis {a} is out of range for rank {}", x.shape.len()));
    }
    let shape = x
        .shape
        .iter()
        .enumerate()
        .filter_map(|(d, &n)| match (axes.contains(&(d as i64)), keepdims) {
            (false, _) => Some(n),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect::<Vec<_>>();
    Ok(vec![TensorDesc::new(x.dtype, shape)])
}

fn lower_arg(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let rank = cx.input(0)?.shape.len();
    let a = &node.attrs;
    let axis = normalize_axis(a.int_or("axis", 0)?, rank)?;
    node.attrs = Attrs::new()
        .with("axis", AttrValue::Int(axis as i64))
        .with("keepdims", flag(a.int_or("keepdims", 1)?))
        .with("select_last_index", flag(a.int_or("select_last_index", 0)?));
    Ok(())
}

/// `axis` as a valid index of `shape`.
fn axis_of(node: &Node, shape: &[usize]) -> OpResult<usize> {
    let axis = node.attrs.int("axis")?;
    usize::try_from(axis)
        .ok()
        .filter(|&a| a < shape.len())
        .ok_or_else(|| op_err!("axis {axis} is out of range for shape {shape:?}"))
}

fn infer_arg(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = only_input(inputs)?;
    let axis = axis_of(node, &x.shape)?;
    let mut shape = x.shape.clone();
    if node.attrs.int("keepdims")? != 0 {
        shape[axis] = 1;
    } else {
        shape.remove(axis);
    }
    Ok(vec![TensorDesc::new(DType::I64, shape)])
}

fn lower_softmax(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let shape = &cx.input(0)?.shape;
    // Before opset 13 these ops flatten the input to 2-D at `axis` (default 1); from 13 they
    // work along `axis` alone (default -1).
    let old = cx.opset < 13;
    let axis = node.attrs.int_or("axis", if old { 1 } else { -1 })?;
    let axis = normalize_axis(axis, shape.len())?;
    if axis >= shape.len() {
        return Err(op_err!("axis is out of range for shape {shape:?}"));
    }
    // Flattening the axes after `axis` into it only matters if one of them is not 1.
    let coerce = old && shape[axis + 1..].iter().product::<usize>() != 1;
    node.attrs = Attrs::new()
        .with("axis", AttrValue::Int(axis as i64))
        .with("coerce_2d", flag(coerce as i64));
    Ok(())
}

/// LpNormalization: `axis` (default -1) made non-negative, `p` (default 2) checked.
fn lower_lp_norm(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let shape = &cx.input(0)?.shape;
    let axis = normalize_axis(node.attrs.int_or("axis", -1)?, shape.len())?;
    if axis >= shape.len() {
        return Err(op_err!("axis is out of range for shape {shape:?}"));
    }
    let p = node.attrs.int_or("p", 2)?;
    if !matches!(p, 1 | 2) {
        return Err(op_err!("p = {p}: ONNX defines only the L1 and L2 norms"));
    }
    node.attrs =
        Attrs::new().with("axis", AttrValue::Int(axis as i64)).with("p", AttrValue::Int(p));
    Ok(())
}

fn infer_lp_norm(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = only_input(inputs)?;
    axis_of(node, &x.shape)?;
    node.attrs.int("p")?;
    Ok(vec![x.clone()])
}

fn infer_softmax(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = only_input(inputs)?;
    axis_of(node, &x.shape)?;
    node.attrs.int("coerce_2d")?;
    Ok(vec![x.clone()])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Constant;
    use crate::Tensor;
    use std::sync::Arc;

    fn node(op: &str, n_inputs: usize, attrs: Attrs) -> Node {
        Node {
            name: "n".into(),
            op: op.into(),
            domain: String::new(),
            inputs: (0..n_inputs).map(Some).collect(),
            outputs: vec![n_inputs],
            attrs,
        }
    }

    /// Lowers `n` for `opset` with input 0 of `shape` and, if given, constant axes as input 1.
    fn lower(n: &mut Node, opset: i64, shape: &[usize], axes: Option<&[i64]>) -> OpResult<()> {
        let x = TensorDesc::new(DType::F32, shape.to_vec());
        let c = axes.map(|a| Arc::new(Tensor::from_vec(vec![a.len()], a).unwrap()));
        let mut cx = LowerCx { opset, inputs: vec![Some(&x)], consts: vec![None] };
        if let Some(c) = &c {
            cx.inputs.push(Some(c.desc()));
            cx.consts.push(Some(c as &dyn Constant));
        }
        let def = OPS.iter().find(|d| d.name == n.op).unwrap();
        (def.lower)(n, &cx)
    }

    fn infer(n: &Node, shape: &[usize]) -> TensorDesc {
        let x = TensorDesc::new(DType::F32, shape.to_vec());
        let def = OPS.iter().find(|d| d.name == n.op).unwrap();
        (def.infer)(n, &[&x]).unwrap().remove(0)
    }

    #[test]
    fn reduce_axes_from_attribute_or_input() {
        // Opset 11: axes are an attribute; negative axes are normalised and sorted.
        let mut n = node("ReduceMean", 1, Attrs::new().with("axes", AttrValue::Ints(vec![-1, 0])));
        lower(&mut n, 11, &[2, 3, 4], None).unwrap();
        assert_eq!(n.attrs.ints("axes").unwrap(), [0, 2]);
        assert_eq!(n.attrs.int("keepdims").unwrap(), 1);
        assert_eq!(infer(&n, &[2, 3, 4]).shape, [1, 3, 1]);

        // Opset 13 ReduceSum: axes are an input, which lowering drops.
        let mut n = node("ReduceSum", 2, Attrs::new().with("keepdims", AttrValue::Int(0)));
        lower(&mut n, 13, &[2, 3, 4], Some(&[1])).unwrap();
        assert_eq!(n.inputs.len(), 1);
        assert_eq!(n.attrs.ints("axes").unwrap(), [1]);
        assert_eq!(infer(&n, &[2, 3, 4]).shape, [2, 4]);
    }

    #[test]
    fn empty_axes_mean_all_unless_noop() {
        let mut all = node("ReduceMax", 1, Attrs::new());
        lower(&mut all, 18, &[2, 3], None).unwrap();
        assert_eq!(all.attrs.ints("axes").unwrap(), [0, 1]);
        assert_eq!(infer(&all, &[2, 3]).shape, [1, 1]);

        let mut noop =
            node("ReduceMax", 2, Attrs::new().with("noop_with_empty_axes", AttrValue::Int(1)));
        lower(&mut noop, 18, &[2, 3], Some(&[])).unwrap();
        assert_eq!(noop.attrs.ints("axes").unwrap(), [] as [i64; 0]);
        assert!(!noop.attrs.contains("noop_with_empty_axes"));
        assert_eq!(infer(&noop, &[2, 3]).shape, [2, 3]);

        let mut dup = node("ReduceSum", 2, Attrs::new());
        assert!(lower(&mut dup, 13, &[2, 3], Some(&[1, -1])).is_err());
    }

    #[test]
    fn argmax_defaults() {
        let mut n = node("ArgMax", 1, Attrs::new());
        lower(&mut n, 11, &[2, 3], None).unwrap();
        assert_eq!(n.attrs.int("axis").unwrap(), 0);
        assert_eq!(n.attrs.int("select_last_index").unwrap(), 0);
        assert_eq!(infer(&n, &[2, 3]), TensorDesc::new(DType::I64, vec![1, 3]));
    }

    #[test]
    fn softmax_opset_semantics() {
        let axis_and_coerce = |opset, attrs: Attrs, shape: &[usize]| {
            let mut n = node("Softmax", 1, attrs);
            lower(&mut n, opset, shape, None).unwrap();
            (n.attrs.int("axis").unwrap(), n.attrs.int("coerce_2d").unwrap())
        };
        // Opset 11: default axis 1, over the flattened trailing axes.
        assert_eq!(axis_and_coerce(11, Attrs::new(), &[2, 3, 4]), (1, 1));
        // ...which is the one-axis form when the trailing axes are all 1.
        assert_eq!(axis_and_coerce(11, Attrs::new(), &[2, 3, 1, 1]), (1, 0));
        // Opset 13: default axis -1.
        assert_eq!(axis_and_coerce(13, Attrs::new(), &[2, 3, 4]), (2, 0));
        let axis0 = Attrs::new().with("axis", AttrValue::Int(-3));
        assert_eq!(axis_and_coerce(13, axis0, &[2, 3, 4]), (0, 0));
    }
}
