//! Vulkan kernels of DequantizeLinear and QuantizeLinear (ops: quantize/cpu.rs): one module,
//! `linear.wgsl`, for every step of one direction, pair of types and scale layout; sizes are
//! params. An invocation writes one output word, every element packed in it. The 2- and 4-bit
//! levels are bytes saturated to their range (`LEVEL_BITS`); minifloat levels are bytes that
//! hooks decode and encode with `elementwise/float.wgsl` (written by `minifloat::Format`),
//! whose zero point is added to the f32 ratio where the CPU adds it in f64.
//!
//! Not covered (such steps run on the CPU): int32 x with a zero point (ONNX allows only 0
//! there), QuantizeLinear of int32 x or in float64 precision (WGSL has no f64), round trips
//! through a minifloat, and
//! operands of 8 or 16 bits that do not start on a 4-byte word (views at odd offsets).
//! QuantizeLinear divides in f32 on the device, whose division may be 2.5 ulp off where the
//! CPU's is exact: a quotient within that of a half between two levels may round the other
//! way on a GPU (lavapipe divides exactly).

use super::scales::Per;
use super::scales_of;
use crate::minifloat::{Format, Rounding};
use crate::no_kernel;
use crate::vulkan::{Binding, Dispatch, Grid, KernelCx, NoKernel, Operand, Spec, Wgsl};
use crate::wgsl;
use ingot_schema::DType;

static LINEAR: Wgsl = wgsl!("quantize/linear.wgsl");
static DYNAMIC_RANGE: Wgsl = wgsl!("quantize/dynamic_range.wgsl");

/// The kernel files, for tests that validate each alone.
#[cfg(test)]
pub(crate) static FILES: [&Wgsl; 2] = [&LINEAR, &DYNAMIC_RANGE];

/// Invocations per workgroup.
const WG: u32 = 64;

/// Bits per element, and the sign, of the quantized types the kernel packs (the 2- and 4-bit
/// integers are stored as bytes, sign-extended: they dequantize as int8 and uint8 do; the
/// minifloats are bytes that hooks decode and encode).
fn int_bits(dtype: DType) -> Option<(u32, bool)> {
    Some(match dtype {
        DType::I8 | DType::I4 | DType::I2 => (8, true),
        DType::U8 | DType::U4 | DType::U2 => (8, false),
        d if d.is_minifloat() => (8, false),
        DType::I16 => (16, true),
        DType::U16 => (16, false),
        DType::I32 => (32, true),
        _ => return None,
    })
}

fn float_bits(dtype: DType) -> Option<u32> {
    match dtype {
        DType::F32 => Some(32),
        DType::F16 => Some(16),
        _ => None,
    }
}

pub fn lower(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    match cx.op {
        "DynamicQuantizeLinear" => return dynamic(cx),
        "MatMulIntegerToFloat" => return crate::matmul::vulkan::integer_to_float(cx),
        _ => {}
    }
    let (quantize, round_trip) = match cx.op {
        "DequantizeLinear" => (false, false),
        "QuantizeLinear" => (true, false),
        "QuantizeDequantize" => (true, true),
        op => return Err(no_kernel!("no Vulkan kernel for {op}")),
    };
    let ([x, scale, rest @ ..], [y]) = (cx.inputs, cx.outputs) else {
        return Err(no_kernel!("{} with {} inputs", cx.op, cx.inputs.len()));
    };
    let zero = rest.first();
    let (q, f) = if quantize { (y, x) } else { (x, y) };
    // A round trip's levels are its `to`, the quantized type of neither operand.
    let q_dtype = match round_trip {
        true => i32::try_from(cx.attrs.int("to").map_err(|e| no_kernel!("{e}"))?)
            .ok()
            .and_then(DType::from_onnx_code)
            .ok_or_else(|| no_kernel!("{} to an unknown type", cx.op))?,
        false => q.desc.dtype,
    };
    let (q_bits, q_signed) = int_bits(q_dtype).ok_or_else(|| cx.dtype(q_dtype))?;
    let minifloat = Format::of(q_dtype);
    if round_trip
        && (x.desc.dtype != DType::F32
            || y.desc.dtype != DType::F32
            || q_bits == 32
            || minifloat.is_some())
    {
        return Err(no_kernel!("{} of {} through {q_dtype}", cx.op, x.desc.dtype));
    }
    let f_bits = float_bits(f.desc.dtype).ok_or_else(|| cx.dtype(f.desc.dtype))?;
    let scale_bits = float_bits(scale.desc.dtype).ok_or_else(|| cx.dtype(scale.desc.dtype))?;
    if q_bits == 32 && (quantize || zero.is_some()) {
        return Err(no_kernel!("{} of int32 with a zero point or into int32", cx.op));
    }
    let half_ratio = if quantize {
        match i32::try_from(cx.attrs.int("precision").map_err(|e| no_kernel!("{e}"))?)
            .ok()
            .and_then(DType::from_onnx_code)
        {
            Some(DType::F32) => false,
            Some(DType::F16) => true,
            p => return Err(no_kernel!("QuantizeLinear in precision {p:?}")),
        }
    } else {
        false
    };
    let descs: Vec<_> = cx.inputs.iter().map(|o| &o.desc).collect();
    let scales = scales_of(cx.attrs, &descs, q_dtype).map_err(|e| no_kernel!("{}: {e}", cx.op))?;
    // Packed operands are read and written a word at a time.
    let whole_words = |o: &Operand, bits: u32| bits == 32 || o.byte_offset.is_multiple_of(4);
    let packed = [
        (x, if quantize { f_bits } else { q_bits }),
        (scale, scale_bits),
        (y, if quantize && !round_trip { q_bits } else { f_bits }),
    ];
    if packed.iter().any(|(o, bits)| !whole_words(o, *bits))
        || zero.is_some_and(|z| !whole_words(z, q_bits))
    {
        return Err(no_kernel!("{} of operands that do not start on a 4-byte word", cx.op));
    }
    let count = x.desc.elements();
    if count == 0 {
        return Ok(Vec::new());
    }
    if count >= 1 << 31 {
        return Err(no_kernel!("{} too large for 32-bit indices", cx.op));
    }
    let (per, block, blocks) = match scales.per {
        Per::Tensor => (0, 1, 1),
        Per::Axis => (1, 1, 1),
        Per::Block(b) => (2, b, scales.dim.div_ceil(b)),
    };
    let mut bindings = vec![
        Binding::input("x", 0, "u32"),
        Binding::input("scale", 1, "u32"),
        Binding::output("y", 0, "u32"),
    ];
    if zero.is_some() {
        bindings.push(Binding::input("zero", 2, "u32"));
    }
    let params: Vec<u32> =
        [count, scales.inner, scales.dim, block, blocks].iter().map(|&v| v as u32).collect();
    let mut spec = Spec::new(&LINEAR)
        .set("WG", WG)
        .set("QUANTIZE", quantize)
        .set("Q_BITS", q_bits)
        .set("Q_SIGNED", q_signed)
        .set("F_BITS", f_bits)
        .set("PER", per)
        .set("ZERO", zero.is_some());
    // Set only where they differ from the defaults: the other steps' modules stay as they were.
    if round_trip {
        spec = spec.set("ROUND_TRIP", true);
    }
    if let Some(bits) = q_dtype.packed_bits().filter(|_| minifloat.is_none()) {
        spec = spec.set("LEVEL_BITS", bits);
    }
    if let Some(format) = minifloat {
        let saturate = cx.attrs.int_or("saturate", 1).map_err(|e| no_kernel!("{e}"))? != 0;
        let decode = format.wgsl_decode("raw");
        let encode = format.wgsl_encode("(r + z)", saturate, Rounding::Nearest);
        spec = spec
            .hook(
                "level_value",
                format!("fn level_value(raw: u32) -> f32 {{\n    return {decode};\n}}"),
            )
            .hook(
                "quantized",
                format!("fn quantized(r: f32, z: f32) -> u32 {{\n    return {encode};\n}}"),
            )
            .library(&crate::elementwise::vulkan::FLOAT);
    }
    // float16 through elementwise/f16.wgsl's exact conversions.
    let half =
        |e: &str, array: &str| format!("h2f(field({array}[p.{array} + {e} / 2u], {e}, 16u))");
    if f_bits == 16 && quantize {
        spec = spec.hook(
            "real_at",
            format!("fn real_at(e: u32) -> f32 {{\n    return {};\n}}", half("e", "x")),
        );
    }
    if f_bits == 16 && !quantize {
        spec = spec.hook("real_bits", "fn real_bits(v: f32) -> u32 {\n    return f2h(v);\n}");
    }
    if scale_bits == 16 {
        spec = spec.hook(
            "scale_at",
            format!("fn scale_at(s: u32) -> f32 {{\n    return {};\n}}", half("s", "scale")),
        );
    }
    if half_ratio {
        spec =
            spec.hook("ratio", "fn ratio(v: f32, s: f32) -> f32 {\n    return h2f(f2h(v / s));\n}");
    }
    if f_bits == 16 || scale_bits == 16 || half_ratio {
        spec = spec.library(&crate::elementwise::vulkan::F16);
    }
    if [scales.inner, scales.dim, block].iter().all(|&d| d < 1 << 24) {
        spec = spec.divmod();
    }
    let bits_per_word = if quantize && !round_trip { q_bits } else { f_bits };
    let words = (count as u64).div_ceil(u64::from(32 / bits_per_word));
    let label = format!(
        "{}_{}_{}_{}{}",
        cx.op.to_lowercase(),
        x.desc.dtype,
        y.desc.dtype,
        ["tensor", "axis", "block"][per as usize],
        if zero.is_some() { "_zero" } else { "" }
    );
    let grid = Grid::new(words, WG)?;
    Ok(vec![spec.dispatch(label, grid.groups, bindings, params)?])
}

/// DynamicQuantizeLinear in two dispatches: `dynamic_range.wgsl` writes the scale and zero
/// point (one workgroup: a reduction over the whole tensor), then `linear.wgsl` quantizes x by
/// them, reading the two outputs the first wrote.
fn dynamic(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    let ([x], [y, scale, zero]) = (cx.inputs, cx.outputs) else {
        return Err(no_kernel!("DynamicQuantizeLinear with {} inputs", cx.inputs.len()));
    };
    let types = [x, y, scale, zero].map(|o| o.desc.dtype);
    if types != [DType::F32, DType::U8, DType::F32, DType::U8] {
        return Err(no_kernel!("DynamicQuantizeLinear of {types:?}"));
    }
    // The levels and the zero point are written a word at a time.
    if ![y, zero].iter().all(|o| o.byte_offset.is_multiple_of(4)) {
        return Err(no_kernel!("DynamicQuantizeLinear of outputs that do not start on a word"));
    }
    let count = x.desc.elements();
    if count == 0 {
        return Ok(Vec::new());
    }
    if count >= 1 << 31 {
        return Err(no_kernel!("DynamicQuantizeLinear too large for 32-bit indices"));
    }
    let range = Spec::new(&DYNAMIC_RANGE).dispatch(
        "dynamicquantizelinear_range",
        [1, 1, 1],
        vec![
            Binding::input("x", 0, "u32"),
            Binding::output("scale", 1, "u32"),
            Binding::output("zero", 2, "u32"),
        ],
        vec![count as u32],
    )?;
    let words = (count as u64).div_ceil(4);
    let mut spec = Spec::new(&LINEAR)
        .set("WG", WG)
        .set("QUANTIZE", true)
        .set("Q_BITS", 8u32)
        .set("Q_SIGNED", false)
        .set("F_BITS", 32u32)
        .set("PER", 0u32)
        .set("ZERO", true);
    if count < 1 << 24 {
        spec = spec.divmod();
    }
    let bindings = vec![
        Binding::input("x", 0, "u32"),
        Binding::output("scale", 1, "u32"),
        Binding::output("y", 0, "u32"),
        Binding::output("zero", 2, "u32"),
    ];
    let params = vec![count as u32, 1, count as u32, 1, 1];
    let grid = Grid::new(words, WG)?;
    let levels = spec.dispatch("dynamicquantizelinear_f32_u8", grid.groups, bindings, params)?;
    Ok(vec![range, levels])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TensorDesc;
    use crate::matmul::vulkan::tests::specialised;
    use crate::vulkan::{DeviceClass, compile, valid};
    use ingot_schema::{AttrValue, Attrs};

    fn attrs(axis: i64, block: i64, to: DType, precision: DType) -> Attrs {
        Attrs::new()
            .with("axis", AttrValue::Int(axis))
            .with("block_size", AttrValue::Int(block))
            .with("to", AttrValue::Int(i64::from(to.onnx_code())))
            .with("precision", AttrValue::Int(i64::from(precision.onnx_code())))
    }

    /// Lowers for both classes with operands one after the other in the arena.
    fn lower_all(
        op: &str,
        a: &Attrs,
        inputs: &[(DType, &[usize])],
        y: (DType, &[usize]),
    ) -> Vec<Dispatch> {
        let mut at = 0;
        let mut place = |(dtype, shape): (DType, &[usize])| {
            let o = Operand::arena(TensorDesc::new(dtype, shape.to_vec()), at);
            at += (o.desc.bytes() as u64).next_multiple_of(16) + 16;
            o
        };
        let ins: Vec<Operand> = inputs.iter().map(|&i| place(i)).collect();
        let outs = [place(y)];
        let mut all = Vec::new();
        for class in [DeviceClass::Cpu, DeviceClass::Gpu] {
            let cx = KernelCx { class, op, name: "n", attrs: a, inputs: &ins, outputs: &outs };
            let d = lower(&cx).unwrap();
            valid(&d);
            all.extend(d);
        }
        all
    }

    #[test]
    fn every_kernel_file_compiles_alone() {
        crate::vulkan::assert_all_files_listed("quantize", &FILES);
        for file in FILES {
            if let Err(e) = compile(file.source, &[]) {
                panic!("{}:\n{e}", file.path);
            }
        }
    }

    #[test]
    fn each_direction_and_layout_is_one_module() {
        // Per axis, int8 weights with zero points: 4 elements per word read, one written.
        let a = attrs(0, 0, DType::F32, DType::F32);
        let d = lower_all(
            "DequantizeLinear",
            &a,
            &[(DType::I8, &[64, 3]), (DType::F32, &[64]), (DType::I8, &[64])],
            (DType::F32, &[64, 3]),
        );
        assert_eq!(d[0].label, "dequantizelinear_i8_f32_axis_zero");
        assert_eq!(d[0].params, [192, 3, 64, 1, 1]);
        assert_eq!(d[0].groups, [3, 1, 1], "192 words of one f32 each");
        assert_eq!(d[0].bindings.len(), 4);
        insta::assert_snapshot!("dequantize_axis_zero", specialised(&d[0], &LINEAR));
        // Blocked float16 scales into float16, no zero point: the f16 library comes in.
        let a = attrs(1, 4, DType::F16, DType::F32);
        let d = lower_all(
            "DequantizeLinear",
            &a,
            &[(DType::U8, &[2, 10]), (DType::F16, &[2, 3])],
            (DType::F16, &[2, 10]),
        );
        assert_eq!(d[0].label, "dequantizelinear_u8_f16_block");
        assert_eq!(d[0].params, [20, 1, 10, 4, 3]);
        assert_eq!(d[0].groups, [1, 1, 1], "10 words of two f16");
        assert!(d[0].wgsl.contains("fn h2f("), "{}", d[0].wgsl);
        // QuantizeLinear to uint16 per tensor: two levels a word.
        let a = attrs(1, 0, DType::U16, DType::F32);
        let d = lower_all(
            "QuantizeLinear",
            &a,
            &[(DType::F32, &[3, 5]), (DType::F32, &[]), (DType::U16, &[])],
            (DType::U16, &[3, 5]),
        );
        assert_eq!(d[0].label, "quantizelinear_f32_u16_tensor_zero");
        assert_eq!(d[0].params, [15, 1, 15, 1, 1]);
        insta::assert_snapshot!("quantize_tensor_u16", specialised(&d[0], &LINEAR));
        // A round trip through int8 per tensor: float32 in and out, one element a word.
        let a = attrs(1, 0, DType::I8, DType::F32);
        let d = lower_all(
            "QuantizeDequantize",
            &a,
            &[(DType::F32, &[3, 5]), (DType::F32, &[]), (DType::I8, &[])],
            (DType::F32, &[3, 5]),
        );
        assert_eq!(d[0].label, "quantizedequantize_f32_f32_tensor_zero");
        assert_eq!(d[0].groups, [1, 1, 1], "15 words of one f32 each");
        insta::assert_snapshot!("round_trip_tensor_i8", specialised(&d[0], &LINEAR));
    }

    #[test]
    fn dynamic_quantization_finds_its_range_then_quantizes() {
        let f = |dtype, s: &[usize], at| Operand::arena(TensorDesc::new(dtype, s.to_vec()), at);
        let (ins, outs) = (
            [f(DType::F32, &[3, 7], 0)],
            [f(DType::U8, &[3, 7], 128), f(DType::F32, &[], 160), f(DType::U8, &[], 176)],
        );
        for class in [DeviceClass::Cpu, DeviceClass::Gpu] {
            let a = Attrs::new();
            let cx = KernelCx {
                class,
                op: "DynamicQuantizeLinear",
                name: "n",
                attrs: &a,
                inputs: &ins,
                outputs: &outs,
            };
            let d = lower(&cx).unwrap();
            valid(&d);
            let labels: Vec<&str> = d.iter().map(|d| d.label.as_str()).collect();
            assert_eq!(labels, ["dynamicquantizelinear_range", "dynamicquantizelinear_f32_u8"]);
            assert_eq!((d[0].groups, &d[0].params[..]), ([1, 1, 1], &[21][..]));
            assert_eq!((d[1].groups, &d[1].params[..]), ([1, 1, 1], &[21, 1, 21, 1, 1][..]));
        }
    }

    #[test]
    fn steps_outside_the_kernel_have_none() {
        let f = |dtype, s: &[usize], at| Operand::arena(TensorDesc::new(dtype, s.to_vec()), at);
        let a = attrs(0, 0, DType::F32, DType::F32);
        let no = |op: &str, a: &Attrs, ins: &[Operand], y: Operand| {
            let cx = KernelCx {
                class: DeviceClass::Gpu,
                op,
                name: "n",
                attrs: a,
                inputs: ins,
                outputs: &[y],
            };
            lower(&cx).unwrap_err()
        };
        // An int8 view two bytes into a word.
        let e = no(
            "DequantizeLinear",
            &a,
            &[f(DType::I8, &[8], 2), f(DType::F32, &[], 64)],
            f(DType::F32, &[8], 128),
        );
        assert!(e.0.contains("4-byte word"), "{e}");
        // int32 with a zero point.
        let e = no(
            "DequantizeLinear",
            &a,
            &[f(DType::I32, &[8], 0), f(DType::F32, &[], 64), f(DType::I32, &[], 80)],
            f(DType::F32, &[8], 128),
        );
        assert!(e.0.contains("int32"), "{e}");
        // Float64 precision.
        let a = attrs(0, 0, DType::U8, DType::F64);
        let e = no(
            "QuantizeLinear",
            &a,
            &[f(DType::I32, &[8], 0), f(DType::F32, &[], 64)],
            f(DType::U8, &[8], 128),
        );
        assert!(e.0.contains("QuantizeLinear"), "{e}");
    }
}
