//! Quantization: `DequantizeLinear`, `QuantizeLinear` and `DynamicQuantizeLinear` between
//! floats and 4-, 8- or 16-bit integers (per tensor, per axis or per block), and the integer
//! products `MatMulInteger` and `QLinearMatMul`. Attribute defaults and shape rules; which
//! scale each element takes is in `scales.rs`, the kernels in `cpu.rs` and `vulkan.rs`.
//!
//! Canonical form (what the kernels read):
//! - `DequantizeLinear`: inputs x, x_scale and, where the model gives it, x_zero_point (x's
//!   type, the scale's shape); attributes `axis` (non-negative; 0 for a scalar x),
//!   `block_size` (0: one scale per tensor or per index of the axis, as the scale's shape
//!   says) and `to` (the output's ONNX type code: the scale's type, or `output_dtype`).
//!   `y = (x - zero_point) * scale`.
//! - `QuantizeLinear`: inputs x, y_scale and, where given, y_zero_point; attributes `axis`,
//!   `block_size`, `to` (y's type: the zero point's, else `output_dtype`, else uint8) and
//!   `precision` (the type `x / scale` is computed in: `precision` where the model sets it,
//!   else numpy's: float16 when x and the scale both are, float64 for an int32 x, else
//!   float32). `y = saturate(round_half_even(x / scale) + zero_point)`.
//! - `QuantizeDequantize` (Ingot's own, made by the compiler's `round_trips` pass from a
//!   QuantizeLinear whose DequantizeLinear takes the same scale and zero point back: what a
//!   QDQ model writes around every activation): QuantizeLinear's inputs and attributes, a
//!   float32 x, scale and precision; `y = (saturate(round_half_even(x / scale) +
//!   zero_point) - zero_point) * scale`, float32, the bits of the two steps it replaces.
//! - `DynamicQuantizeLinear`: no attributes; float32 x to uint8 y, its scale and zero point.
//! - `MatMulInteger`: inputs A, B (int8 or uint8) and the zero points the model gives, in
//!   order; attributes `a_zero_point` and `b_zero_point` (1 where given). A's zero point is
//!   one value; B's one value or one per column. The int32 product of numpy's matmul.
//! - `QLinearMatMul`: its eight inputs (a, a_scale, a_zero_point, b, b_scale, b_zero_point,
//!   y_scale, y_zero_point); B's scale and zero point one value or one per column.
//! - `MatMulIntegerToFloat` (Ingot's own, made by the compiler's `integer_products` pass from
//!   a MatMulInteger whose one reader is a Cast to float32; ONNX Runtime's contrib op of that
//!   name does the same): inputs A, B, A's zero point, B's zero point (all four: a zero where
//!   the model gives none) and post-op operands; attributes `post_ops` and `post_params` (see
//!   `cpu/post.rs`: the scale and bias that follow become post-ops). `y` is MatMulInteger's
//!   product as float32, then its post-ops: the bits of the Cast and the steps it absorbed.
//!   On Vulkan it runs the matmul family's `dequantized.wgsl` (`matmul::vulkan`), A's bytes
//!   read as B's are.
//!
//! Constant folding leaves a `DequantizeLinear` of a large constant to run (the compiler's
//! `lower` pass asks [`keeps_constant_narrow`]): folded, an int8 weight would be stored as
//! four times its bytes.

pub(crate) mod cpu;
mod scales;
#[cfg(feature = "wgsl")]
pub(crate) mod vulkan;

pub(crate) const FAMILY: Family = Family {
    ops: OPS,
    cpu: cpu::prepare,
    // Inputs and outputs differ in width, or every output reads a whole row; but
    // MatMulIntegerToFloat's output may be written over the residual of a leading `Add`.
    in_place: crate::cpu::post::in_place_after_add,
    #[cfg(feature = "wgsl")]
    vulkan: vulkan::lower,
};

use crate::Node;
use crate::TensorDesc;
use crate::conv::{check_post_operands, post_operands};
use crate::lower::{LowerCx, OpResult, normalize_axis, op_err};
use crate::matmul::matmul_shape;
use crate::registry::{Family, OpDef};
use ingot_schema::{AttrValue, Attrs, DType};
pub(crate) use scales::{Scales, Step};

const INTEGER_PRODUCT: &str = "these integer products have no Vulkan kernel: their steps run \
                               on the CPU (a MatMulInteger cast to float, as dynamic \
                               quantization writes it, becomes MatMulIntegerToFloat, which \
                               Vulkan runs)";

pub const OPS: &[OpDef] = &[
    OpDef::new("DequantizeLinear", lower_dequantize, infer_dequantize),
    OpDef::new("QuantizeLinear", lower_quantize, infer_quantize),
    OpDef::new("QuantizeDequantize", made_by_the_compiler, infer_round_trip),
    OpDef::new("DynamicQuantizeLinear", lower_dynamic, infer_dynamic),
    OpDef::new("MatMulInteger", lower_matmul_integer, infer_matmul_integer)
        .cpu_only(INTEGER_PRODUCT),
    OpDef::new("QLinearMatMul", lower_qlinear_matmul, infer_qlinear_matmul)
        .cpu_only(INTEGER_PRODUCT),
    OpDef::new("MatMulIntegerToFloat", made_by_the_compiler, infer_integer_to_float),
];

/// Constants this large are weights: folding a widening op over one would store it wider.
#[cfg(feature = "lower")]
const WEIGHT_ELEMENTS: usize = 1024;

/// Whether constant folding should leave this step to run although every input is constant:
/// a `DequantizeLinear` (or a `Cast` from an 8- or 16-bit integer to a float) of a weight,
/// which folded would be stored as two to four times its bytes. The step dequantizes it
/// where it is used instead.
#[cfg(feature = "lower")]
pub fn keeps_constant_narrow(op: &str, inputs: &[&TensorDesc], outputs: &[TensorDesc]) -> bool {
    let (Some(x), Some(y)) = (inputs.first(), outputs.first()) else {
        return false;
    };
    let narrow = quantized(x.dtype) || x.dtype.is_minifloat();
    matches!(op, "DequantizeLinear" | "Cast")
        && narrow
        && y.dtype.is_float()
        && x.elements() >= WEIGHT_ELEMENTS
}

/// The integer types x and the zero points may have.
fn quantized(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::I2
            | DType::U2
            | DType::I4
            | DType::U4
            | DType::I8
            | DType::U8
            | DType::I16
            | DType::U16
    )
}

/// The types QuantizeLinear writes.
const LEVELS: [DType; 13] = [
    DType::U8,
    DType::I8,
    DType::U16,
    DType::I16,
    DType::U4,
    DType::I4,
    DType::U2,
    DType::I2,
    DType::F8E4M3FN,
    DType::F8E4M3FNUZ,
    DType::F8E5M2,
    DType::F8E5M2FNUZ,
    DType::F4E2M1,
];

/// The ONNX type code `code` as a type, if it is one of `allowed`.
fn type_code(code: i64, allowed: &[DType], what: &str) -> OpResult<DType> {
    i32::try_from(code)
        .ok()
        .and_then(DType::from_onnx_code)
        .filter(|d| allowed.contains(d))
        .ok_or_else(|| op_err!("{what} {code} is not one of {allowed:?}"))
}

/// `axis` and `block_size` for the model's opset, canonical.
fn axis_and_block(node: &Node, cx: &LowerCx) -> OpResult<(i64, i64)> {
    let a = &node.attrs;
    let rank = cx.input(0)?.shape.len();
    if cx.opset < 13 && a.contains("axis") {
        return Err(op_err!("{} has no axis attribute before opset 13", node.op));
    }
    if cx.opset < 21 && a.contains("block_size") {
        return Err(op_err!("{} has no block_size attribute before opset 21", node.op));
    }
    let block = a.int_or("block_size", 0)?;
    if block < 0 {
        return Err(op_err!("block_size must be 0 or positive, got {block}"));
    }
    // One scale for the whole tensor reads no axis (a 1-D x keeps the default axis 1).
    let per_tensor = block == 0 && cx.input(1)?.elements() == 1;
    let axis = if rank == 0 || per_tensor {
        0
    } else {
        normalize_axis(a.int_or("axis", 1)?, rank)? as i64
    };
    Ok((axis, block))
}

/// Drops a trailing omitted zero point; the first two inputs must be given.
fn scale_inputs(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    if !(cx.has_input(0) && cx.has_input(1)) || node.inputs.len() > 3 {
        return Err(op_err!("{} takes x, a scale and an optional zero point", node.op));
    }
    if node.inputs.get(2).is_some_and(Option::is_none) {
        node.inputs.truncate(2);
    }
    Ok(())
}

fn lower_dequantize(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    scale_inputs(node, cx)?;
    let (axis, block) = axis_and_block(node, cx)?;
    let scale = cx.input(1)?.dtype;
    let to = match node.attrs.int_or("output_dtype", 0)? {
        0 => scale,
        code if cx.opset >= 23 => type_code(code, &[DType::F32, DType::F16], "output_dtype")?,
        _ => return Err(op_err!("DequantizeLinear has no output_dtype before opset 23")),
    };
    node.attrs = Attrs::new()
        .with("axis", AttrValue::Int(axis))
        .with("block_size", AttrValue::Int(block))
        .with("to", AttrValue::Int(i64::from(to.onnx_code())));
    Ok(())
}

/// The scales' layout of a canonical DequantizeLinear or QuantizeLinear, after checking the
/// scale's and zero point's types: float scales, a zero point of `zero_type` and the scale's
/// shape.
pub(crate) fn scales_of(
    attrs: &Attrs,
    inputs: &[&TensorDesc],
    zero_type: DType,
) -> OpResult<Scales> {
    let (x, scale) = match inputs {
        [x, scale] | [x, scale, _] => (*x, *scale),
        _ => return Err(op_err!("takes 2 or 3 inputs, got {}", inputs.len())),
    };
    if !matches!(scale.dtype, DType::F32 | DType::F16) {
        return Err(op_err!("the scale must be float32 or float16, got {}", scale.dtype));
    }
    let (axis, block) = (attrs.int("axis")?, attrs.int("block_size")?);
    let (Ok(axis), Ok(block)) = (usize::try_from(axis), usize::try_from(block)) else {
        return Err(op_err!("axis {axis} and block_size {block} must not be negative"));
    };
    if axis >= x.shape.len().max(1) {
        return Err(op_err!("axis {axis} is out of range for x of shape {:?}", x.shape));
    }
    let scales = Scales::new(&x.shape, &scale.shape, axis, block).map_err(|e| op_err!("{e}"))?;
    if let Some(zp) = inputs.get(2) {
        if zp.dtype != zero_type {
            return Err(op_err!("the zero point is {}, expected {zero_type}", zp.dtype));
        }
        // Shapes [] and [1] both mean one value, as in ONNX's reference.
        if zp.shape != scale.shape && !(zp.elements() == 1 && scale.elements() == 1) {
            return Err(op_err!(
                "the zero point's shape {:?} differs from the scale's {:?}",
                zp.shape,
                scale.shape
            ));
        }
    }
    Ok(scales)
}

fn infer_dequantize(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = inputs.first().ok_or_else(|| op_err!("DequantizeLinear needs x"))?;
    if !(quantized(x.dtype) || x.dtype == DType::I32 || x.dtype.is_minifloat()) {
        return Err(op_err!(
            "DequantizeLinear of {} (it takes 2- to 32-bit integers, float8 and float4)",
            x.dtype
        ));
    }
    scales_of(&node.attrs, inputs, x.dtype)?;
    let to = type_code(node.attrs.int("to")?, &[DType::F32, DType::F16], "to")?;
    Ok(vec![TensorDesc::new(to, x.shape.clone())])
}

fn lower_quantize(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    scale_inputs(node, cx)?;
    let (axis, block) = axis_and_block(node, cx)?;
    let a = &node.attrs;
    let targets = LEVELS;
    let to = match (cx.inputs.get(2).copied().flatten(), a.int_or("output_dtype", 0)?) {
        (_, code) if code != 0 && cx.opset < 21 => {
            return Err(op_err!("QuantizeLinear has no output_dtype before opset 21"));
        }
        (Some(zp), code) => {
            if code != 0 && type_code(code, &targets, "output_dtype")? != zp.dtype {
                return Err(op_err!("output_dtype {code} differs from the zero point's type"));
            }
            zp.dtype
        }
        (None, 0) => DType::U8,
        (None, code) => type_code(code, &targets, "output_dtype")?,
    };
    let (x, scale) = (cx.input(0)?.dtype, cx.input(1)?.dtype);
    let precision = match a.int_or("precision", 0)? {
        0 if x == DType::F16 && scale == DType::F16 => DType::F16,
        0 if x == DType::I32 => DType::F64,
        0 => DType::F32,
        code if cx.opset >= 23 => type_code(code, &[DType::F32, DType::F16], "precision")?,
        _ => return Err(op_err!("QuantizeLinear has no precision before opset 23")),
    };
    let saturate = a.int_or("saturate", 1)?;
    if saturate != 1 && !to.is_minifloat() {
        return Err(op_err!("saturate = 0 applies to float8 and float4 outputs only, not {to}"));
    }
    let mut attrs = Attrs::new()
        .with("axis", AttrValue::Int(axis))
        .with("block_size", AttrValue::Int(block))
        .with("to", AttrValue::Int(i64::from(to.onnx_code())))
        .with("precision", AttrValue::Int(i64::from(precision.onnx_code())));
    // Kept where it matters only, so that integer steps' attributes stay as they were.
    if to.is_minifloat() {
        attrs = attrs.with("saturate", AttrValue::Int(saturate));
    }
    node.attrs = attrs;
    Ok(())
}

fn infer_quantize(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = inputs.first().ok_or_else(|| op_err!("QuantizeLinear needs x"))?;
    if !matches!(x.dtype, DType::F32 | DType::F16 | DType::I32) {
        return Err(op_err!("QuantizeLinear of {} (it takes float32, float16, int32)", x.dtype));
    }
    let to = type_code(node.attrs.int("to")?, &LEVELS, "to")?;
    type_code(node.attrs.int("precision")?, &[DType::F32, DType::F16, DType::F64], "precision")?;
    scales_of(&node.attrs, inputs, to)?;
    Ok(vec![TensorDesc::new(to, x.shape.clone())])
}

/// Not an ONNX op: the `round_trips` pass makes it from canonical steps.
fn made_by_the_compiler(node: &mut Node, _cx: &LowerCx) -> OpResult<()> {
    Err(op_err!("{} is made by Ingot's compiler, not read from a model", node.op))
}

fn infer_round_trip(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let levels = infer_quantize(node, inputs)?;
    let (x, scale) = (inputs[0], inputs[1]);
    let precision = node.attrs.int("precision")?;
    if x.dtype != DType::F32 || scale.dtype != DType::F32 || precision != 1 {
        return Err(op_err!(
            "{} of {} by a {} scale in precision {precision} (float32 only)",
            node.op,
            x.dtype,
            scale.dtype
        ));
    }
    Ok(vec![TensorDesc::new(DType::F32, levels[0].shape.clone())])
}

fn lower_dynamic(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    if node.inputs.len() != 1 || !cx.has_input(0) {
        return Err(op_err!("DynamicQuantizeLinear takes one input"));
    }
    node.attrs = Attrs::new();
    Ok(())
}

fn infer_dynamic(_: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    match inputs {
        [x] if x.dtype == DType::F32 => Ok(vec![
            TensorDesc::new(DType::U8, x.shape.clone()),
            TensorDesc::new(DType::F32, []),
            TensorDesc::new(DType::U8, []),
        ]),
        [x] => Err(op_err!("DynamicQuantizeLinear takes float32, got {}", x.dtype)),
        _ => Err(op_err!("DynamicQuantizeLinear takes one input, got {}", inputs.len())),
    }
}

fn lower_matmul_integer(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    if !(cx.has_input(0) && cx.has_input(1)) || node.inputs.len() > 4 {
        return Err(op_err!("MatMulInteger takes A, B and optional zero points"));
    }
    let given = |i: usize| i64::from(cx.has_input(i));
    node.attrs = Attrs::new()
        .with("a_zero_point", AttrValue::Int(given(2)))
        .with("b_zero_point", AttrValue::Int(given(3)));
    node.inputs.retain(Option::is_some);
    Ok(())
}

/// An operand of an integer product and its zero point, checked: 8-bit types, a zero point
/// of the operand's type holding one value or, for B (`per_column`), one per column of each
/// matrix (shape `[N]` for a 2-D B, or B's with its row dim 1).
pub(crate) fn check_zero_point(
    x: &TensorDesc,
    zp: Option<&TensorDesc>,
    per_column: bool,
    what: &str,
) -> OpResult<()> {
    if !matches!(x.dtype, DType::I8 | DType::U8) {
        return Err(op_err!("{what} must be int8 or uint8, got {}", x.dtype));
    }
    let Some(zp) = zp else {
        return Ok(());
    };
    if zp.dtype != x.dtype {
        return Err(op_err!("{what}'s zero point is {}, {what} is {}", zp.dtype, x.dtype));
    }
    if zp.elements() == 1 {
        return Ok(());
    }
    let columns = match x.shape.as_slice() {
        [.., n] if per_column => *n,
        _ => 0,
    };
    let rows_of_one = x.shape.len() >= 2
        && zp.shape.len() == x.shape.len()
        && zp
            .shape
            .iter()
            .zip(&x.shape)
            .enumerate()
            .all(|(i, (&z, &d))| if i == x.shape.len() - 2 { z == 1 } else { z == d });
    if per_column && (zp.shape == [columns] || rows_of_one) {
        return Ok(());
    }
    Err(op_err!(
        "{what}'s zero point of shape {:?} is neither one value{}",
        zp.shape,
        if per_column { " nor one per column" } else { "" }
    ))
}

fn infer_matmul_integer(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let (a_zp, b_zp) = (node.attrs.int("a_zero_point")? != 0, node.attrs.int("b_zero_point")? != 0);
    let want = 2 + usize::from(a_zp) + usize::from(b_zp);
    if inputs.len() != want {
        return Err(op_err!(
            "MatMulInteger has {} inputs, its attributes say {want}",
            inputs.len()
        ));
    }
    let (a, b) = (inputs[0], inputs[1]);
    check_zero_point(a, a_zp.then(|| inputs[2]), false, "A")?;
    check_zero_point(b, b_zp.then(|| inputs[want - 1]), true, "B")?;
    Ok(vec![TensorDesc::new(DType::I32, matmul_shape(&a.shape, &b.shape)?)])
}

/// `MatMulIntegerToFloat`: MatMulInteger's operands, both zero points given, to float32.
fn infer_integer_to_float(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let (own, operands) = post_operands(node, inputs, 4)?;
    let &[a, b, a_zp, b_zp] = own else {
        return Err(op_err!(
            "{} takes A, B and both zero points, got {} inputs",
            node.op,
            own.len()
        ));
    };
    check_zero_point(a, Some(a_zp), false, "A")?;
    check_zero_point(b, Some(b_zp), true, "B")?;
    let out = TensorDesc::new(DType::F32, matmul_shape(&a.shape, &b.shape)?);
    check_post_operands(node, operands, &out)?;
    Ok(vec![out])
}

fn lower_qlinear_matmul(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    if node.inputs.len() != 8 || !(0..8).all(|i| cx.has_input(i)) {
        return Err(op_err!("QLinearMatMul takes 8 inputs, all given"));
    }
    node.attrs = Attrs::new();
    Ok(())
}

fn infer_qlinear_matmul(_: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    Ok(vec![qlinear_matmul_output(inputs)?])
}

/// QLinearMatMul's output, after checking its eight operands.
pub(crate) fn qlinear_matmul_output(inputs: &[&TensorDesc]) -> OpResult<TensorDesc> {
    let &[a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp] = inputs else {
        return Err(op_err!("QLinearMatMul takes 8 inputs, got {}", inputs.len()));
    };
    check_zero_point(a, Some(a_zp), false, "a")?;
    check_zero_point(b, Some(b_zp), true, "b")?;
    if !matches!(y_zp.dtype, DType::I8 | DType::U8) || y_zp.elements() != 1 {
        return Err(op_err!(
            "y_zero_point must be one int8 or uint8, got {} {:?}",
            y_zp.dtype,
            y_zp.shape
        ));
    }
    for (s, zp, what) in [(a_scale, a_zp, "a"), (b_scale, b_zp, "b"), (y_scale, y_zp, "y")] {
        if !matches!(s.dtype, DType::F32 | DType::F16) || s.dtype != a_scale.dtype {
            return Err(op_err!(
                "{what}_scale is {}: the scales are all float32 or all float16",
                s.dtype
            ));
        }
        if s.elements() != zp.elements() {
            return Err(op_err!("{what}_scale and its zero point differ in size"));
        }
    }
    Ok(TensorDesc::new(y_zp.dtype, matmul_shape(&a.shape, &b.shape)?))
}
