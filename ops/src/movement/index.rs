//! Index ops. Canonical attributes: Gather, GatherElements and ScatterElements `axis`;
//! GatherND `batch_dims`; ScatterND and ScatterElements `reduction`;
//! OneHot `axis` (against the output rank) and `depth`, its inputs reduced to
//! `[indices, values]`; ReverseSequence `time_axis`, `batch_axis` (0 and 1); TensorScatter
//! `axis` (at least 1: axis 0 is the batch) and `mode` (`linear` or `circular`), its
//! `write_indices` present or omitted (every batch writes at 0).

use super::{arg, axis_attr, keep_inputs};
use crate::Node;
use crate::TensorDesc;
use crate::lower::{LowerCx, OpResult, normalize_axis, op_err};
use ingot_schema::{AttrValue, DType};

/// Normalises `axis` (default `default`) against the rank of input 0 plus `extra`.
fn lower_axis(node: &mut Node, cx: &LowerCx, default: i64, extra: usize) -> OpResult<()> {
    let rank = cx.input(0)?.shape.len() + extra;
    let axis = normalize_axis(node.attrs.int_or("axis", default)?, rank)?;
    node.attrs.set("axis", AttrValue::Int(axis as i64));
    Ok(())
}

fn lower_reduction(node: &mut Node) -> OpResult<()> {
    let r = node.attrs.text_or("reduction", "none")?.to_string();
    if !matches!(r.as_str(), "none" | "add" | "mul" | "max" | "min") {
        return Err(op_err!("reduction {r} is unknown"));
    }
    node.attrs.set("reduction", AttrValue::Text(r));
    Ok(())
}

fn indices_arg<'a>(inputs: &[&'a TensorDesc], i: usize) -> OpResult<&'a TensorDesc> {
    let t = arg(inputs, i)?;
    match t.dtype {
        DType::I32 | DType::I64 => Ok(t),
        dt => Err(op_err!("indices must be i32 or i64, not {dt}")),
    }
}

pub(super) fn lower_gather(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    lower_axis(node, cx, 0, 0)
}

pub(super) fn infer_gather(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let (data, idx) = (arg(inputs, 0)?, indices_arg(inputs, 1)?);
    let axis = axis_attr(node, data.shape.len())?;
    let shape = [&data.shape[..axis], &idx.shape, &data.shape[axis + 1..]].concat();
    Ok(vec![TensorDesc::new(data.dtype, shape)])
}

pub(super) fn lower_gather_elements(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    lower_axis(node, cx, 0, 0)
}

pub(super) fn infer_gather_elements(
    node: &Node,
    inputs: &[&TensorDesc],
) -> OpResult<Vec<TensorDesc>> {
    let (data, idx) = (arg(inputs, 0)?, indices_arg(inputs, 1)?);
    axis_attr(node, data.shape.len())?;
    if idx.shape.len() != data.shape.len() {
        return Err(op_err!("indices {:?} and data {:?} differ in rank", idx.shape, data.shape));
    }
    Ok(vec![TensorDesc::new(data.dtype, idx.shape.clone())])
}

pub(super) fn lower_gather_nd(node: &mut Node, _: &LowerCx) -> OpResult<()> {
    let b = node.attrs.int_or("batch_dims", 0)?;
    node.attrs.set("batch_dims", AttrValue::Int(b));
    Ok(())
}

pub(super) fn infer_gather_nd(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let (data, idx) = (arg(inputs, 0)?, indices_arg(inputs, 1)?);
    let b = usize::try_from(node.attrs.int("batch_dims")?)
        .map_err(|_| op_err!("batch_dims must not be negative"))?;
    let (r, q) = (data.shape.len(), idx.shape.len());
    let k = idx.shape.last().copied().unwrap_or(0);
    if q == 0 || b >= r.min(q) || k > r - b || data.shape[..b] != idx.shape[..b] {
        return Err(op_err!(
            "cannot index {:?} with {:?} and {b} batch dims",
            data.shape,
            idx.shape
        ));
    }
    let shape = [&idx.shape[..q - 1], &data.shape[b + k..]].concat();
    Ok(vec![TensorDesc::new(data.dtype, shape)])
}

pub(super) fn lower_scatter_nd(node: &mut Node, _: &LowerCx) -> OpResult<()> {
    lower_reduction(node)
}

pub(super) fn lower_scatter_elements(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    lower_reduction(node)?;
    lower_axis(node, cx, 0, 0)
}

/// Scatter (opsets 9 and 10), which opset 11 renamed ScatterElements: the same op.
pub(super) fn lower_scatter(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    node.op = "ScatterElements".into();
    lower_scatter_elements(node, cx)
}

/// Scatters write into a copy of the data.
pub(super) fn infer_scatter(_: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let (data, _, updates) = (arg(inputs, 0)?, indices_arg(inputs, 1)?, arg(inputs, 2)?);
    if updates.dtype != data.dtype {
        return Err(op_err!("updates are {}, data {}", updates.dtype, data.dtype));
    }
    Ok(vec![data.clone()])
}

pub(super) fn lower_tensor_scatter(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    lower_axis(node, cx, -2, 0)?;
    if node.attrs.int("axis")? == 0 {
        return Err(op_err!("axis 0 is the batch axis; the sequence axis must come after it"));
    }
    let mode = node.attrs.text_or("mode", "linear")?.to_string();
    if !matches!(mode.as_str(), "linear" | "circular") {
        return Err(op_err!("mode {mode} is unknown (linear or circular)"));
    }
    node.attrs.set("mode", AttrValue::Text(mode));
    if node.inputs.len() == 3 && node.inputs[2].is_none() {
        node.inputs.pop();
    }
    Ok(())
}

/// The cache `[batch, .., max, ..]` with `update` `[batch, .., seq, ..]` written along the
/// axis at each batch's write index.
pub(super) fn infer_tensor_scatter(
    node: &Node,
    inputs: &[&TensorDesc],
) -> OpResult<Vec<TensorDesc>> {
    let (cache, update) = (arg(inputs, 0)?, arg(inputs, 1)?);
    let axis = axis_attr(node, cache.shape.len())?;
    let fits = update.shape.len() == cache.shape.len()
        && (update.shape.iter().zip(&cache.shape).enumerate())
            .all(|(i, (&u, &c))| if i == axis { u <= c } else { u == c });
    if update.dtype != cache.dtype || !fits {
        return Err(op_err!(
            "the update {} {:?} does not fit the cache {} {:?} along axis {axis}",
            update.dtype,
            update.shape,
            cache.dtype,
            cache.shape
        ));
    }
    if let Some(w) = inputs.get(2)
        && (w.dtype != DType::I64 || w.shape != [cache.shape[0]])
    {
        return Err(op_err!(
            "write_indices must be int64 [{}], one per batch, not {} {:?}",
            cache.shape[0],
            w.dtype,
            w.shape
        ));
    }
    Ok(vec![cache.clone()])
}

pub(super) fn lower_one_hot(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    lower_axis(node, cx, -1, 1)?;
    // Any numeric type may hold the depth; ONNX takes its integer part.
    let depth = cx
        .const_floats(1, "depth")?
        .and_then(|d| d.first().copied())
        .ok_or_else(|| op_err!("depth (input 1) is required"))?;
    if depth < 1.0 {
        return Err(op_err!("depth {depth} must be positive"));
    }
    node.attrs.set("depth", AttrValue::Int(depth as i64));
    node.inputs.remove(1);
    keep_inputs(node, 2);
    Ok(())
}

pub(super) fn infer_one_hot(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let (idx, values) = (arg(inputs, 0)?, arg(inputs, 1)?);
    let axis = axis_attr(node, idx.shape.len() + 1)?;
    let depth = usize::try_from(node.attrs.int("depth")?)
        .map_err(|_| op_err!("depth must not be negative"))?;
    if values.elements() != 2 {
        return Err(op_err!("values must be [off, on], not {:?}", values.shape));
    }
    let shape = [&idx.shape[..axis], &[depth], &idx.shape[axis..]].concat();
    Ok(vec![TensorDesc::new(values.dtype, shape)])
}

/// ReverseSequence: the time and batch axes (defaults 0 and 1), which must be 0 and 1.
pub(super) fn lower_reverse_sequence(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let rank = cx.input(0)?.shape.len();
    let time = node.attrs.int_or("time_axis", 0)?;
    let batch = node.attrs.int_or("batch_axis", 1)?;
    if rank < 2 || !matches!((time, batch), (0, 1) | (1, 0)) {
        return Err(op_err!("time_axis {time} and batch_axis {batch} must be 0 and 1"));
    }
    let lens = cx.input(1)?;
    if lens.dtype != DType::I64 || lens.shape != [cx.input(0)?.shape[batch as usize]] {
        return Err(op_err!(
            "sequence_lens must be int64 [batch], not {} {:?}",
            lens.dtype,
            lens.shape
        ));
    }
    node.attrs = ingot_schema::Attrs::new()
        .with("time_axis", AttrValue::Int(time))
        .with("batch_axis", AttrValue::Int(batch));
    Ok(())
}
