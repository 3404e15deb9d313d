//! Ops that move bytes, and shape plumbing: attribute defaults, constant operands read into
//! attributes, and shape rules. The kernels are in `ops/src/movement/cpu.rs`.
//!
//! Canonical forms (every axis non-negative, every operand that shapes the output an
//! attribute, so the node has only its data inputs):
//! - Reshape `shape` (0 and -1 resolved to real dims), Flatten `axis`, Squeeze/Unsqueeze
//!   `axes` (sorted), Identity and Dropout nothing (Dropout keeps only its data input);
//!   BitCast `to` (ONNX code of a type of the input's width): the same bytes, read as `to`;
//! - Shape `start`/`end` (clamped), Size nothing: the fold pass answers both from types;
//! - ConstantOfShape `shape`, `value`, `dtype` (ONNX code); Range `start`, `limit`, `delta`,
//!   `dtype`; EyeLike `shape` (its input's), `dtype`, `k`. Scalars are `Int` for integer and
//!   bool dtypes, `Float` for float ones;
//! - layout ops ([`layout`]) and index ops ([`index`]) list theirs beside their code.

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

mod index;
mod layout;
#[cfg(test)]
mod tests;

use crate::TensorDesc;
use crate::lower::{LowerCx, OpResult, checked_product, normalize_axis, op_err};
use crate::registry::{Family, OpDef, never};
use crate::{Constant, Node};
use ingot_schema::{AttrValue, Attrs, DType};

pub const OPS: &[OpDef] = &[
    OpDef::new("Reshape", lower_reshape, infer_reshape).view(),
    OpDef::new("Flatten", lower_flatten, infer_flatten).view(),
    OpDef::new("Squeeze", lower_squeeze, infer_squeeze).view(),
    OpDef::new("Unsqueeze", lower_unsqueeze, infer_unsqueeze).view(),
    OpDef::new("Identity", lower_nothing, infer_same).view(),
    OpDef::new("BitCast", lower_bitcast, infer_bitcast).view(),
    OpDef::new("Dropout", lower_dropout, infer_dropout).view(),
    OpDef::new("Shape", lower_shape, infer_shape).folded(),
    OpDef::new("Size", lower_nothing, infer_size).folded(),
    OpDef::new("ConstantOfShape", lower_constant_of_shape, infer_constant_of_shape),
    OpDef::new("Range", lower_range, infer_range)
        .cpu_only("its output size depends on its values, so it is always folded at compile time"),
    OpDef::new("EyeLike", lower_eye_like, infer_constant_of_shape)
        .cpu_only("its output depends on its input's shape alone: folded at compile time"),
    OpDef::new("Transpose", layout::lower_transpose, layout::infer_transpose),
    OpDef::new("Concat", layout::lower_concat, layout::infer_concat),
    OpDef::new("Split", layout::lower_split, layout::infer_split),
    OpDef::new("Slice", layout::lower_slice, layout::infer_slice),
    OpDef::new("DynamicSlice", layout::lower_dynamic_slice, layout::infer_dynamic_slice),
    OpDef::new("Pad", layout::lower_pad, layout::infer_pad),
    // Canonically a constant Pad: Pad's inference and kernels.
    OpDef::new("CenterCropPad", layout::lower_center_crop_pad, layout::infer_pad),
    OpDef::new("Tile", layout::lower_tile, layout::infer_tile),
    OpDef::new("Expand", layout::lower_expand, layout::infer_expand),
    OpDef::new("DepthToSpace", layout::lower_depth_to_space, layout::infer_depth_to_space),
    OpDef::new("SpaceToDepth", layout::lower_depth_to_space, layout::infer_space_to_depth),
    OpDef::new("Trilu", layout::lower_trilu, infer_same),
    OpDef::new("CumSum", layout::lower_cumulative, infer_same),
    OpDef::new("CumProd", layout::lower_cumulative, infer_same),
    OpDef::new("Gather", index::lower_gather, index::infer_gather),
    OpDef::new("GatherElements", index::lower_gather_elements, index::infer_gather_elements),
    OpDef::new("GatherND", index::lower_gather_nd, index::infer_gather_nd),
    OpDef::new("ScatterND", index::lower_scatter_nd, index::infer_scatter),
    OpDef::new("ScatterElements", index::lower_scatter_elements, index::infer_scatter),
    OpDef::new("Scatter", index::lower_scatter, index::infer_scatter)
        .cpu_only("lowering turns Scatter into ScatterElements"),
    OpDef::new("TensorScatter", index::lower_tensor_scatter, index::infer_tensor_scatter),
    OpDef::new("OneHot", index::lower_one_hot, index::infer_one_hot),
    OpDef::new("ReverseSequence", index::lower_reverse_sequence, infer_same)
        .cpu_only("no Vulkan kernel yet: its steps run on the CPU, as a submodel of their own"),
];

// ---- helpers shared by the family ----

/// Input `i` of a canonical node.
fn arg<'a>(inputs: &[&'a TensorDesc], i: usize) -> OpResult<&'a TensorDesc> {
    inputs.get(i).copied().ok_or_else(|| op_err!("input {i} is required"))
}

/// Keeps only the first `n` inputs (the constant operands now live in attributes).
fn keep_inputs(node: &mut Node, n: usize) {
    node.inputs.truncate(n);
}

/// An operand that is an attribute before opset `since` and an input from then on.
fn attr_or_input(
    node: &Node,
    cx: &LowerCx,
    name: &str,
    input: usize,
    since: i64,
) -> OpResult<Option<Vec<i64>>> {
    if cx.opset < since {
        Ok(node.attrs.ints_opt(name)?.map(<[i64]>::to_vec))
    } else {
        cx.const_ints(input, name)
    }
}

/// Axes normalised against `rank`, sorted; repeats are an error.
fn sorted_axes(axes: &[i64], rank: usize) -> OpResult<Vec<usize>> {
    let mut out = axes.iter().map(|&a| normalize_axis(a, rank)).collect::<OpResult<Vec<_>>>()?;
    out.sort_unstable();
    if out.windows(2).any(|w| w[0] == w[1]) {
        return Err(op_err!("axes {axes:?} repeat an axis"));
    }
    Ok(out)
}

fn ints(v: impl IntoIterator<Item = usize>) -> AttrValue {
    AttrValue::Ints(v.into_iter().map(|d| d as i64).collect())
}

/// A non-negative integer list attribute.
fn usizes(node: &Node, name: &str) -> OpResult<Vec<usize>> {
    node.attrs
        .ints(name)?
        .iter()
        .map(|&v| usize::try_from(v).map_err(|_| op_err!("{name} holds {v}")))
        .collect()
}

fn axis_attr(node: &Node, rank: usize) -> OpResult<usize> {
    normalize_axis(node.attrs.int("axis")?, rank)
}

/// A scalar attribute of `dtype`: `Int` for integer and bool types (exact), `Float` else.
fn scalar(dtype: DType, ints: Option<i64>, floats: Option<f64>) -> OpResult<AttrValue> {
    let v = if dtype.is_float() { floats.map(AttrValue::Float) } else { ints.map(AttrValue::Int) };
    v.ok_or_else(|| op_err!("a scalar of type {dtype} is not a number"))
}

/// The first element of a constant as a scalar attribute of its own dtype.
fn const_scalar(c: &dyn Constant) -> OpResult<AttrValue> {
    let i = c.to_i64s().and_then(|v| v.first().copied());
    let f = c.to_f64s().and_then(|v| v.first().copied());
    scalar(c.desc().dtype, i, f)
}

/// A scalar operand: input `i`, a constant with one element.
fn scalar_input(cx: &LowerCx, i: usize, what: &str) -> OpResult<AttrValue> {
    let c = cx
        .consts
        .get(i)
        .copied()
        .flatten()
        .ok_or_else(|| op_err!("{what} (input {i}) must be a constant"))?;
    if c.desc().elements() != 1 {
        return Err(op_err!("{what} must hold one value, not {:?}", c.desc().shape));
    }
    const_scalar(c)
}

fn lower_nothing(_: &mut Node, _: &LowerCx) -> OpResult<()> {
    Ok(())
}

fn infer_same(_: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    Ok(vec![arg(inputs, 0)?.clone()])
}

// ---- BitCast ----

/// The input's bytes read as `to`, a type of the same width. A bfloat16 value is float32 in
/// Ingot and 4-bit and 2-bit values a byte each, so their bits are not what the model would
/// reinterpret: a BitCast to or from such a type is refused.
fn lower_bitcast(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    const BFLOAT16: i64 = 16;
    let to = node.attrs.int("to")?;
    if to == BFLOAT16 {
        return Err(op_err!("BitCast to bfloat16: Ingot computes bfloat16 values as float32"));
    }
    let from = cx.input(0)?.dtype;
    let to = i32::try_from(to).ok().and_then(DType::from_onnx_code);
    let to = to.ok_or_else(|| {
        op_err!("BitCast to ONNX type {} is not supported", node.attrs.int("to").unwrap_or(0))
    })?;
    if let Some(packed) = [from, to].into_iter().find(|d| d.packed_bits().is_some()) {
        return Err(op_err!("BitCast of {packed}: Ingot holds such values a byte each"));
    }
    if from.size() != to.size() {
        return Err(op_err!(
            "BitCast needs types of one width: {from} is {} bytes, {to} {}",
            from.size(),
            to.size()
        ));
    }
    node.attrs = Attrs::new().with("to", AttrValue::Int(i64::from(to.onnx_code())));
    Ok(())
}

fn infer_bitcast(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = arg(inputs, 0)?;
    let to = i32::try_from(node.attrs.int("to")?).ok().and_then(DType::from_onnx_code);
    let to = to.filter(|t| t.size() == x.dtype.size()).ok_or_else(|| op_err!("BitCast's to"))?;
    Ok(vec![TensorDesc::new(to, x.shape.clone())])
}

// ---- Reshape, Flatten, Squeeze, Unsqueeze ----

fn lower_reshape(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let x = cx.input(0)?;
    let spec = cx.const_ints(1, "shape")?.ok_or_else(|| op_err!("shape (input 1) is required"))?;
    let allow_zero = node.attrs.int_or("allowzero", 0)? != 0;
    let mut shape = Vec::with_capacity(spec.len());
    let mut inferred = None;
    for (i, &d) in spec.iter().enumerate() {
        shape.push(match d {
            -1 if inferred.replace(i).is_none() => 1,
            -1 => return Err(op_err!("shape {spec:?} has more than one -1")),
            0 if !allow_zero => *x
                .shape
                .get(i)
                .ok_or_else(|| op_err!("shape {spec:?} copies dim {i} of {:?}", x.shape))?,
            d => usize::try_from(d).map_err(|_| op_err!("shape {spec:?} has {d}"))?,
        });
    }
    let total = x.elements();
    if let Some(i) = inferred {
        let known = checked_product(&shape).unwrap_or(0);
        if known == 0 || total % known != 0 {
            return Err(op_err!("cannot reshape {:?} to {spec:?}", x.shape));
        }
        shape[i] = total / known;
    }
    node.attrs.remove("allowzero");
    node.attrs.set("shape", ints(shape));
    keep_inputs(node, 1);
    Ok(())
}

fn infer_reshape(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = arg(inputs, 0)?;
    let shape = usizes(node, "shape")?;
    if checked_product(&shape) != Some(x.elements()) {
        return Err(op_err!("cannot reshape {:?} to {shape:?}", x.shape));
    }
    Ok(vec![TensorDesc::new(x.dtype, shape)])
}

fn lower_flatten(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let rank = cx.input(0)?.shape.len() as i64;
    let axis = node.attrs.int_or("axis", 1)?;
    // Unlike most axes, Flatten's may equal the rank.
    let a = if axis < 0 { axis + rank } else { axis };
    if !(0..=rank).contains(&a) {
        return Err(op_err!("axis {axis} is out of range for rank {rank}"));
    }
    node.attrs.set("axis", AttrValue::Int(a));
    Ok(())
}

fn infer_flatten(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = arg(inputs, 0)?;
    let a = usize::try_from(node.attrs.int("axis")?)
        .ok()
        .filter(|&a| a <= x.shape.len())
        .ok_or_else(|| op_err!("axis is out of range for {:?}", x.shape))?;
    let (outer, inner) = x.shape.split_at(a);
    let shape = [outer.iter().product(), inner.iter().product()];
    Ok(vec![TensorDesc::new(x.dtype, shape)])
}

fn lower_squeeze(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let x = cx.input(0)?;
    let axes = match attr_or_input(node, cx, "axes", 1, 13)? {
        Some(a) => sorted_axes(&a, x.shape.len())?,
        None => (0..x.shape.len()).filter(|&d| x.shape[d] == 1).collect(),
    };
    node.attrs.set("axes", ints(axes));
    keep_inputs(node, 1);
    Ok(())
}

fn infer_squeeze(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = arg(inputs, 0)?;
    let axes = usizes(node, "axes")?;
    if let Some(&a) = axes.iter().find(|&&a| x.shape.get(a) != Some(&1)) {
        return Err(op_err!("cannot squeeze axis {a} of {:?}", x.shape));
    }
    let shape = (0..x.shape.len()).filter(|d| !axes.contains(d)).map(|d| x.shape[d]);
    Ok(vec![TensorDesc::new(x.dtype, shape.collect::<Vec<_>>())])
}

fn lower_unsqueeze(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let x = cx.input(0)?;
    let axes =
        attr_or_input(node, cx, "axes", 1, 13)?.ok_or_else(|| op_err!("axes are required"))?;
    let axes = sorted_axes(&axes, x.shape.len() + axes.len())?;
    node.attrs.set("axes", ints(axes));
    keep_inputs(node, 1);
    Ok(())
}

fn infer_unsqueeze(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = arg(inputs, 0)?;
    let axes = usizes(node, "axes")?;
    let rank = x.shape.len() + axes.len();
    let mut dims = x.shape.iter();
    let shape = (0..rank)
        .map(|d| if axes.contains(&d) { Some(1) } else { dims.next().copied() })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| op_err!("axes {axes:?} do not fit rank {rank}"))?;
    Ok(vec![TensorDesc::new(x.dtype, shape)])
}

// ---- Dropout ----

/// Inference only: the ratio and training-mode operands are dropped, and a training mode
/// that is on with a non-zero ratio (random output) is refused.
fn lower_dropout(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    // Before opset 7 an attribute chose: training unless `is_test` is set.
    let training = node.attrs.int_or("is_test", 0)? == 0;
    if cx.opset < 7 && training && node.attrs.float_or("ratio", 0.5)? != 0.0 {
        return Err(op_err!(
            "Dropout with is_test=0 (training, before opset 7) is random; only inference is \
             supported"
        ));
    }
    if cx.opset >= 12 && cx.has_input(2) {
        let training = cx.const_ints(2, "training_mode")?.unwrap_or_default();
        let ratio = match cx.has_input(1) {
            true => cx.const_floats(1, "ratio")?.unwrap_or_default(),
            false => vec![0.5],
        };
        if training.iter().any(|&t| t != 0) && ratio.iter().any(|&r| r != 0.0) {
            return Err(op_err!("Dropout in training mode is random; only inference is supported"));
        }
    }
    for a in ["ratio", "seed", "is_test"] {
        node.attrs.remove(a);
    }
    keep_inputs(node, 1);
    Ok(())
}

fn infer_dropout(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = arg(inputs, 0)?;
    let mask = TensorDesc::new(DType::Bool, x.shape.clone());
    Ok([x.clone(), mask].into_iter().take(node.outputs.len().clamp(1, 2)).collect())
}

// ---- Shape and Size: folded from types ----

fn lower_shape(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let rank = cx.input(0)?.shape.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + rank } else { v }).clamp(0, rank);
    let start = clamp(node.attrs.int_or("start", 0)?);
    let end = clamp(node.attrs.int_or("end", rank)?).max(start);
    node.attrs.set("start", AttrValue::Int(start));
    node.attrs.set("end", AttrValue::Int(end));
    Ok(())
}

fn infer_shape(node: &Node, _: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let n = node.attrs.int("end")? - node.attrs.int("start")?;
    Ok(vec![TensorDesc::new(DType::I64, [n.max(0) as usize])])
}

fn infer_size(_: &Node, _: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    Ok(vec![TensorDesc::new(DType::I64, [])])
}

// ---- ConstantOfShape and Range: no inputs left, folded ----

fn dtype_attr(node: &Node) -> OpResult<DType> {
    let code = node.attrs.int("dtype")?;
    i32::try_from(code)
        .ok()
        .and_then(DType::from_onnx_code)
        .ok_or_else(|| op_err!("element type {code} is not supported"))
}

/// The importer turns the `value` tensor attribute into `value` (its element) and
/// `value.dtype` (its ONNX type code); absent, it is a float 0.
fn lower_constant_of_shape(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let shape = cx.const_ints(0, "shape")?.ok_or_else(|| op_err!("shape (input 0) is required"))?;
    if let Some(d) = shape.iter().find(|&&d| d < 0) {
        return Err(op_err!("shape {shape:?} has {d}"));
    }
    let (dtype, value) = match node.attrs.get("value") {
        None => (DType::F32, AttrValue::Float(0.0)),
        Some(v) => {
            let code = node.attrs.int("value.dtype")?;
            let dtype = i32::try_from(code)
                .ok()
                .and_then(DType::from_onnx_code)
                .ok_or_else(|| op_err!("value has unsupported element type {code}"))?;
            let (i, f) = match v {
                AttrValue::Int(i) => (Some(*i), Some(*i as f64)),
                AttrValue::Float(f) => (Some(*f as i64), Some(*f)),
                other => return Err(op_err!("value must hold one element, not {other:?}")),
            };
            (dtype, scalar(dtype, i, f)?)
        }
    };
    node.attrs.remove("value.dtype");
    node.attrs.set("value", value);
    node.attrs.set("dtype", AttrValue::Int(dtype.onnx_code().into()));
    node.attrs.set("shape", AttrValue::Ints(shape));
    keep_inputs(node, 0);
    Ok(())
}

fn infer_constant_of_shape(node: &Node, _: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    Ok(vec![TensorDesc::new(dtype_attr(node)?, usizes(node, "shape")?)])
}

/// EyeLike: its input's shape and type (or `dtype`) become attributes, and the node, left
/// with no input, is folded.
fn lower_eye_like(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let x = cx.input(0)?;
    if x.shape.len() != 2 {
        return Err(op_err!("input of shape {:?}: EyeLike takes a matrix", x.shape));
    }
    let dtype = match node.attrs.contains("dtype") {
        false => x.dtype,
        true => i32::try_from(node.attrs.int("dtype")?)
            .ok()
            .and_then(DType::from_onnx_code)
            .ok_or_else(|| op_err!("its dtype is not supported"))?,
    };
    let k = node.attrs.int_or("k", 0)?;
    let shape = x.shape.iter().map(|&d| d as i64).collect();
    node.attrs = ingot_schema::Attrs::new()
        .with("shape", AttrValue::Ints(shape))
        .with("dtype", AttrValue::Int(dtype.onnx_code().into()))
        .with("k", AttrValue::Int(k));
    keep_inputs(node, 0);
    Ok(())
}

fn lower_range(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let dtype = cx.input(0)?.dtype;
    for (i, name) in ["start", "limit", "delta"].into_iter().enumerate() {
        if cx.input(i)?.dtype != dtype {
            return Err(op_err!("start, limit and delta must have one type"));
        }
        let v = scalar_input(cx, i, name)?;
        node.attrs.set(name, v);
    }
    node.attrs.set("dtype", AttrValue::Int(dtype.onnx_code().into()));
    keep_inputs(node, 0);
    Ok(())
}

/// `max(ceil((limit - start) / delta), 0)` elements.
fn infer_range(node: &Node, _: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let dtype = dtype_attr(node)?;
    let a = &node.attrs;
    let n = if dtype.is_float() {
        let (s, l, d) = (a.get("start"), a.get("limit"), a.get("delta"));
        let (Some(AttrValue::Float(s)), Some(AttrValue::Float(l)), Some(AttrValue::Float(d))) =
            (s, l, d)
        else {
            return Err(op_err!("start, limit and delta must be floats"));
        };
        if *d == 0.0 {
            return Err(op_err!("delta is 0"));
        }
        // f32 operands subtract in f32, as ONNX Runtime does.
        let span = if dtype == DType::F64 { l - s } else { f64::from(*l as f32 - *s as f32) };
        (span / d).ceil().max(0.0) as usize
    } else {
        let (s, l, d) = (a.int("start")?, a.int("limit")?, a.int("delta")?);
        if d == 0 {
            return Err(op_err!("delta is 0"));
        }
        // In i128, so that no bounds overflow.
        let (s, l, d) = (i128::from(s), i128::from(l), i128::from(d));
        let span = if d > 0 { l - s } else { s - l };
        let n = span.max(0).unsigned_abs().div_ceil(d.unsigned_abs());
        usize::try_from(n).map_err(|_| op_err!("a range of {n} elements is too large"))?
    };
    Ok(vec![TensorDesc::new(dtype, [n])])
}
