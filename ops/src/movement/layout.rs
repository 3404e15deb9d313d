//! Layout ops. Canonical attributes:
//! - Transpose `perm`; Concat `axis`; Split `axis` and `split` (every size explicit);
//! - Slice `starts`, `ends`, `steps`, one per axis of the input, with negative values
//!   resolved and clamped as ONNX specifies (for a negative step an end of -1 means "past
//!   index 0");
//! - Pad `pads` (begins then ends, every axis), `mode`, `value` (a scalar of the input's type);
//!   CenterCropPad the same, a constant Pad whose negative pads crop;
//! - Tile `repeats`; Expand `shape` (the broadcast output shape);
//! - DepthToSpace and SpaceToDepth `blocksize`, `mode`;
//! - Trilu `upper`, `k`; CumSum and CumProd `axis`, `exclusive`, `reverse`.

use super::{arg, attr_or_input, axis_attr, const_scalar, ints, keep_inputs, scalar, usizes};
use crate::Node;
use crate::TensorDesc;
use crate::lower::{LowerCx, OpResult, broadcast_shapes, checked_sum, normalize_axis, op_err};
use ingot_schema::{AttrValue, DType};

// ---- Transpose ----

pub(super) fn lower_transpose(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let rank = cx.input(0)?.shape.len();
    let perm = match node.attrs.ints_opt("perm")? {
        Some(p) => p.to_vec(),
        None => (0..rank as i64).rev().collect(),
    };
    let mut sorted = perm.clone();
    sorted.sort_unstable();
    if sorted != (0..rank as i64).collect::<Vec<_>>() {
        return Err(op_err!("perm {perm:?} is not a permutation of {rank} axes"));
    }
    node.attrs.set("perm", AttrValue::Ints(perm));
    Ok(())
}

pub(super) fn infer_transpose(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = arg(inputs, 0)?;
    let shape = usizes(node, "perm")?
        .iter()
        .map(|&p| x.shape.get(p).copied())
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| op_err!("perm does not fit {:?}", x.shape))?;
    Ok(vec![TensorDesc::new(x.dtype, shape)])
}

// ---- Concat and Split ----

pub(super) fn lower_concat(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let rank = cx.input(0)?.shape.len();
    if rank == 0 {
        return Err(op_err!("Concat needs inputs of rank 1 or more, got a scalar"));
    }
    let axis = normalize_axis(node.attrs.int("axis")?, rank)?;
    node.attrs.set("axis", AttrValue::Int(axis as i64));
    Ok(())
}

pub(super) fn infer_concat(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let first = arg(inputs, 0)?;
    if first.shape.is_empty() {
        return Err(op_err!("Concat needs inputs of rank 1 or more, got a scalar"));
    }
    let axis = axis_attr(node, first.shape.len())?;
    let mut shape = first.shape.clone();
    shape[axis] = 0;
    for x in inputs {
        let fits = x.dtype == first.dtype
            && x.shape.len() == shape.len()
            && (0..shape.len()).all(|d| d == axis || x.shape[d] == shape[d]);
        if !fits {
            return Err(op_err!("cannot concatenate {x:?} with {first:?} on axis {axis}"));
        }
        shape[axis] = shape[axis]
            .checked_add(x.shape[axis])
            .ok_or_else(|| op_err!("the concatenation is too large"))?;
    }
    Ok(vec![TensorDesc::new(first.dtype, shape)])
}

pub(super) fn lower_split(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let x = cx.input(0)?;
    if x.shape.is_empty() {
        return Err(op_err!("Split needs an input of rank 1 or more, got a scalar"));
    }
    let axis = normalize_axis(node.attrs.int_or("axis", 0)?, x.shape.len())?;
    let dim = x.shape[axis];
    let n = node.outputs.len();
    let split = match attr_or_input(node, cx, "split", 1, 13)? {
        Some(s) => s
            .iter()
            .map(|&v| usize::try_from(v).map_err(|_| op_err!("split {s:?} has {v}")))
            .collect::<OpResult<Vec<_>>>()?,
        None => {
            // Opset 18's num_outputs allows a smaller last part; otherwise parts are equal.
            let parts = match node.attrs.int_or("num_outputs", n as i64)? {
                p if p == n as i64 && p > 0 => n,
                p => return Err(op_err!("num_outputs is {p}, but the node has {n} outputs")),
            };
            let size = if node.attrs.contains("num_outputs") {
                dim.div_ceil(parts)
            } else if dim % parts == 0 {
                dim / parts
            } else {
                return Err(op_err!("{dim} does not split into {parts} equal parts"));
            };
            (0..parts).map(|i| size.min(dim.saturating_sub(i.saturating_mul(size)))).collect()
        }
    };
    if split.len() != n || checked_sum(&split) != Some(dim) {
        return Err(op_err!("split {split:?} does not cut {dim} into {n} outputs"));
    }
    node.attrs.remove("num_outputs");
    node.attrs.set("axis", AttrValue::Int(axis as i64));
    node.attrs.set("split", ints(split));
    keep_inputs(node, 1);
    Ok(())
}

pub(super) fn infer_split(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = arg(inputs, 0)?;
    let axis = axis_attr(node, x.shape.len())?;
    let split = usizes(node, "split")?;
    if checked_sum(&split) != x.shape.get(axis).copied() {
        return Err(op_err!("split {split:?} does not cut {:?}", x.shape));
    }
    Ok(split
        .iter()
        .map(|&s| {
            let mut shape = x.shape.clone();
            shape[axis] = s;
            TensorDesc::new(x.dtype, shape)
        })
        .collect())
}

// ---- Slice ----

pub(super) fn lower_slice(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let shape = &cx.input(0)?.shape;
    let rank = shape.len();
    let need = |v: Option<Vec<i64>>, what: &str| v.ok_or_else(|| op_err!("{what} are required"));
    let (starts, ends, axes, steps) = if cx.opset < 10 {
        let a = &node.attrs;
        let get = |n: &str| a.ints_opt(n).map(|v| v.map(<[i64]>::to_vec));
        (need(get("starts")?, "starts")?, need(get("ends")?, "ends")?, get("axes")?, None)
    } else {
        (
            need(cx.const_ints(1, "starts")?, "starts")?,
            need(cx.const_ints(2, "ends")?, "ends")?,
            cx.const_ints(3, "axes")?,
            cx.const_ints(4, "steps")?,
        )
    };
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(op_err!("starts, ends, axes and steps differ in length"));
    }
    let mut out_starts = vec![0; rank];
    let mut out_ends: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let mut out_steps = vec![1; rank];
    let mut seen = vec![false; rank];
    for (i, &a) in axes.iter().enumerate() {
        let d = normalize_axis(a, rank)?;
        if std::mem::replace(&mut seen[d], true) {
            return Err(op_err!("axes {axes:?} repeat an axis"));
        }
        let (n, k) = (shape[d] as i64, steps[i]);
        let fix = |v: i64| if v < 0 { v.saturating_add(n) } else { v };
        let (s, e) = (fix(starts[i]), fix(ends[i]));
        (out_starts[d], out_ends[d]) = match k {
            0 => return Err(op_err!("steps must not be 0")),
            k if k > 0 => (s.clamp(0, n), e.clamp(0, n)),
            _ => (s.max(0).min(n - 1), e.max(-1).min(n - 1)),
        };
        out_steps[d] = k;
    }
    node.attrs.remove("axes");
    node.attrs.set("starts", AttrValue::Ints(out_starts));
    node.attrs.set("ends", AttrValue::Ints(out_ends));
    node.attrs.set("steps", AttrValue::Ints(out_steps));
    keep_inputs(node, 1);
    Ok(())
}

/// `DynamicSlice` (Ingot's own: the compiler makes it from a Slice whose starts are computed
/// at run time and whose ends are those starts plus constants, as a loop body's `x[i : i + 1]`):
/// inputs x and starts (int32 or int64, one per axis); attributes `axes` (non-negative, no
/// repeats) and `sizes`, each at most its axis's dim. It takes what Slice with steps of 1
/// takes from `starts` to `starts + sizes`, which must be `sizes` elements: a run where Slice
/// would take fewer (a start past the end, or a negative start whose end is 0) is an error on
/// the CPU; Vulkan's copy clamps the window into the axis, as its gathers clamp indices.
pub(super) fn lower_dynamic_slice(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let shape = &cx.input(0)?.shape;
    let starts = cx.input(1)?;
    let (axes, sizes) = (node.attrs.ints("axes")?, node.attrs.ints("sizes")?);
    if axes.len() != sizes.len() || starts.elements() != axes.len() || starts.shape.len() != 1 {
        return Err(op_err!(
            "{} takes one start per axis: {} axes, {} sizes, starts {:?}",
            node.op,
            axes.len(),
            sizes.len(),
            starts.shape
        ));
    }
    if !matches!(starts.dtype, DType::I32 | DType::I64) {
        return Err(op_err!("starts must be int32 or int64, got {}", starts.dtype));
    }
    let mut seen = vec![false; shape.len()];
    for (&a, &n) in axes.iter().zip(sizes) {
        let d = usize::try_from(a).ok().filter(|&d| d < shape.len());
        let d = d.ok_or_else(|| op_err!("axis {a} is not an axis of rank {}", shape.len()))?;
        if std::mem::replace(&mut seen[d], true) {
            return Err(op_err!("axes {axes:?} repeat an axis"));
        }
        if usize::try_from(n).map_or(true, |n| n > shape[d]) {
            return Err(op_err!("a window of {n} on axis {d} of {} elements", shape[d]));
        }
    }
    keep_inputs(node, 2);
    Ok(())
}

pub(super) fn infer_dynamic_slice(
    node: &Node,
    inputs: &[&TensorDesc],
) -> OpResult<Vec<TensorDesc>> {
    let x = arg(inputs, 0)?;
    let mut shape = x.shape.clone();
    for (&a, &n) in node.attrs.ints("axes")?.iter().zip(node.attrs.ints("sizes")?) {
        let d = usize::try_from(a).ok().filter(|&d| d < shape.len());
        let d = d.ok_or_else(|| op_err!("axis {a} is not an axis of rank {}", shape.len()))?;
        shape[d] = usize::try_from(n).map_err(|_| op_err!("a window of {n} elements"))?;
    }
    Ok(vec![TensorDesc::new(x.dtype, shape)])
}

pub(super) fn infer_slice(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = arg(inputs, 0)?;
    let a = &node.attrs;
    let (starts, ends, steps) = (a.ints("starts")?, a.ints("ends")?, a.ints("steps")?);
    let rank = x.shape.len();
    if starts.len() != rank || ends.len() != rank || steps.len() != rank {
        return Err(op_err!("starts, ends and steps need one entry per axis"));
    }
    let shape = (0..rank)
        .map(|d| {
            // In i128, so that no attribute values overflow.
            let (s, e, k) = (starts[d], ends[d], i128::from(steps[d]));
            let span = if k > 0 { e as i128 - s as i128 } else { s as i128 - e as i128 };
            let n = span.max(0).unsigned_abs().div_ceil(k.unsigned_abs().max(1));
            usize::try_from(n).map_err(|_| op_err!("a slice of {n} is too large"))
        })
        .collect::<OpResult<Vec<_>>>()?;
    Ok(vec![TensorDesc::new(x.dtype, shape)])
}

// ---- Pad ----

/// CenterCropPad: a constant Pad (negative pads crop) that centres the input in `shape` along
/// `axes`, the extra pixel of an odd difference at the end, as ONNX's reference.
pub(super) fn lower_center_crop_pad(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let x = cx.input(0)?;
    let rank = x.shape.len();
    let shape = cx.const_ints(1, "shape")?.ok_or_else(|| op_err!("shape (input 1) is required"))?;
    let axes = match node.attrs.ints_opt("axes")? {
        Some(a) => a.iter().map(|&a| normalize_axis(a, rank)).collect::<OpResult<Vec<_>>>()?,
        None => (0..rank).collect(),
    };
    if shape.len() != axes.len() {
        return Err(op_err!("shape {shape:?} for {} axes", axes.len()));
    }
    let mut pads = vec![0i64; 2 * rank];
    for (&a, &target) in axes.iter().zip(&shape) {
        if target < 0 {
            return Err(op_err!("shape {shape:?} has {target}"));
        }
        // Positive: pad by d; negative: crop by -d. The first half (rounded down) goes before.
        let d = target - x.shape[a] as i64;
        let before = d.signum() * (d.abs() / 2);
        pads[a] = before;
        pads[a + rank] = d - before;
    }
    node.attrs = ingot_schema::Attrs::new()
        .with("pads", AttrValue::Ints(pads))
        .with("mode", AttrValue::Text("constant".into()))
        .with("value", scalar(x.dtype, Some(0), Some(0.0))?);
    keep_inputs(node, 1);
    Ok(())
}

pub(super) fn lower_pad(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let x = cx.input(0)?;
    let rank = x.shape.len();
    let mode = node.attrs.text_or("mode", "constant")?.to_string();
    if !matches!(mode.as_str(), "constant" | "reflect" | "edge" | "wrap") {
        return Err(op_err!("mode {mode} is unknown"));
    }
    let (pads, value, axes) = if cx.opset < 11 {
        let pads = node.attrs.ints("pads")?.to_vec();
        let v = f64::from(node.attrs.float_or("value", 0.0)?);
        (pads, scalar(x.dtype, Some(v as i64), Some(v))?, None)
    } else {
        let pads =
            cx.const_ints(1, "pads")?.ok_or_else(|| op_err!("pads (input 1) are required"))?;
        let value = match cx.consts.get(2).copied().flatten() {
            _ if !cx.has_input(2) => scalar(x.dtype, Some(0), Some(0.0))?,
            Some(c) if c.desc().elements() == 0 => scalar(x.dtype, Some(0), Some(0.0))?,
            Some(c) => const_scalar(c)?,
            None => return Err(op_err!("constant_value (input 2) must be a constant")),
        };
        let axes = if cx.opset >= 18 { cx.const_ints(3, "axes")? } else { None };
        (pads, value, axes)
    };
    let axes = match axes {
        Some(a) => a.iter().map(|&a| normalize_axis(a, rank)).collect::<OpResult<Vec<_>>>()?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(op_err!("pads {pads:?} need two entries for each of {} axes", axes.len()));
    }
    let mut full = vec![0; 2 * rank];
    for (i, &d) in axes.iter().enumerate() {
        full[d] = pads[i];
        full[d + rank] = pads[i + axes.len()];
    }
    node.attrs.set("pads", AttrValue::Ints(full));
    node.attrs.set("mode", AttrValue::Text(mode));
    node.attrs.set("value", value);
    keep_inputs(node, 1);
    Ok(())
}

pub(super) fn infer_pad(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = arg(inputs, 0)?;
    let pads = node.attrs.ints("pads")?;
    let rank = x.shape.len();
    if pads.len() != 2 * rank {
        return Err(op_err!("pads {pads:?} need two entries per axis"));
    }
    let shape = (0..rank)
        .map(|d| {
            let len = x.shape[d] as i128 + i128::from(pads[d]) + i128::from(pads[d + rank]);
            usize::try_from(len)
                .map_err(|_| op_err!("pads {pads:?} crop more than {:?} holds", x.shape))
        })
        .collect::<OpResult<Vec<_>>>()?;
    Ok(vec![TensorDesc::new(x.dtype, shape)])
}

// ---- Tile and Expand ----

pub(super) fn lower_tile(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let repeats =
        cx.const_ints(1, "repeats")?.ok_or_else(|| op_err!("repeats (input 1) are required"))?;
    node.attrs.set("repeats", AttrValue::Ints(repeats));
    keep_inputs(node, 1);
    Ok(())
}

pub(super) fn infer_tile(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = arg(inputs, 0)?;
    let reps = usizes(node, "repeats")?;
    if reps.len() != x.shape.len() {
        return Err(op_err!("repeats {reps:?} need one entry per axis of {:?}", x.shape));
    }
    let shape = x
        .shape
        .iter()
        .zip(&reps)
        .map(|(d, r)| d.checked_mul(*r))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| op_err!("repeats {reps:?} make {:?} too large", x.shape))?;
    Ok(vec![TensorDesc::new(x.dtype, shape)])
}

pub(super) fn lower_expand(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let x = cx.input(0)?;
    let shape = cx
        .const_ints(1, "shape")?
        .ok_or_else(|| op_err!("shape (input 1) is required"))?
        .iter()
        .map(|&v| usize::try_from(v).map_err(|_| op_err!("shape has {v}")))
        .collect::<OpResult<Vec<_>>>()?;
    let out = broadcast_shapes(&[&x.shape, &shape])?;
    node.attrs.set("shape", ints(out));
    keep_inputs(node, 1);
    Ok(())
}

pub(super) fn infer_expand(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = arg(inputs, 0)?;
    let shape = usizes(node, "shape")?;
    if broadcast_shapes(&[&x.shape, &shape])? != shape {
        return Err(op_err!("{:?} does not expand to {shape:?}", x.shape));
    }
    Ok(vec![TensorDesc::new(x.dtype, shape)])
}

// ---- DepthToSpace and SpaceToDepth ----

fn blocksize(node: &Node) -> OpResult<usize> {
    usize::try_from(node.attrs.int("blocksize")?)
        .ok()
        .filter(|&b| b > 0)
        .ok_or_else(|| op_err!("blocksize must be positive"))
}

fn nchw(x: &TensorDesc) -> OpResult<[usize; 4]> {
    x.shape.as_slice().try_into().map_err(|_| op_err!("input {:?} must be 4-d", x.shape))
}

/// DepthToSpace, and SpaceToDepth (which has `mode` from opset 25): `blocksize`, `mode`.
pub(super) fn lower_depth_to_space(node: &mut Node, _: &LowerCx) -> OpResult<()> {
    blocksize(node)?;
    let mode = node.attrs.text_or("mode", "DCR")?.to_string();
    if mode != "DCR" && mode != "CRD" {
        return Err(op_err!("mode {mode} is unknown"));
    }
    node.attrs.set("mode", AttrValue::Text(mode));
    Ok(())
}

pub(super) fn infer_depth_to_space(
    node: &Node,
    inputs: &[&TensorDesc],
) -> OpResult<Vec<TensorDesc>> {
    let x = arg(inputs, 0)?;
    let (b, [n, c, h, w]) = (blocksize(node)?, nchw(x)?);
    let shape = b
        .checked_mul(b)
        .filter(|bb| c % bb == 0)
        .and_then(|bb| Some([n, c / bb, h.checked_mul(b)?, w.checked_mul(b)?]))
        .ok_or_else(|| {
            op_err!("{c} channels do not split into {b}x{b} blocks, or {h}x{w} grow too large")
        })?;
    Ok(vec![TensorDesc::new(x.dtype, shape)])
}

pub(super) fn infer_space_to_depth(
    node: &Node,
    inputs: &[&TensorDesc],
) -> OpResult<Vec<TensorDesc>> {
    let x = arg(inputs, 0)?;
    let (b, [n, c, h, w]) = (blocksize(node)?, nchw(x)?);
    let channels = c.checked_mul(b).and_then(|cb| cb.checked_mul(b));
    match channels {
        Some(cbb) if h % b == 0 && w % b == 0 => {
            Ok(vec![TensorDesc::new(x.dtype, [n, cbb, h / b, w / b])])
        }
        _ => Err(op_err!("{h}x{w} does not split into {b}x{b} blocks")),
    }
}

// ---- Trilu and CumSum ----

pub(super) fn lower_trilu(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    if cx.input(0)?.shape.len() < 2 {
        return Err(op_err!("input must have at least 2 dims"));
    }
    let k = match cx.const_ints(1, "k")? {
        Some(k) => *k.first().ok_or_else(|| op_err!("k is empty"))?,
        None => 0,
    };
    let upper = node.attrs.int_or("upper", 1)?;
    node.attrs.set("upper", AttrValue::Int(upper));
    node.attrs.set("k", AttrValue::Int(k));
    keep_inputs(node, 1);
    Ok(())
}

pub(super) fn lower_cumulative(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let rank = cx.input(0)?.shape.len();
    let axis = cx
        .const_ints(1, "axis")?
        .and_then(|a| a.first().copied())
        .ok_or_else(|| op_err!("axis (input 1) is required"))?;
    let axis = normalize_axis(axis, rank)?;
    for name in ["exclusive", "reverse"] {
        let v = node.attrs.int_or(name, 0)?;
        node.attrs.set(name, AttrValue::Int(v));
    }
    node.attrs.set("axis", AttrValue::Int(axis as i64));
    keep_inputs(node, 1);
    Ok(())
}
