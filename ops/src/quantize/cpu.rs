//! The quantize family's CPU kernels, computed as ONNX's reference does (numpy's types and
//! rounding), so that their bytes match it.
//!
//! - `DequantizeLinear`: `(x - zero_point) * scale` in float32 for 8- and 16-bit x (exact
//!   before the one rounding of the product), in float64 from x's float32 value for int32 x
//!   (numpy's promotion), then to the output type.
//! - `QuantizeLinear`: `x / scale` in the canonical `precision`, rounded half to even, plus
//!   the zero point, saturated.
//! - `DynamicQuantizeLinear`: the range of x widened to hold 0, a scale of range / 255, the
//!   zero point that maps 0 exactly, then as `QuantizeLinear`.
//! - `MatMulInteger` and `QLinearMatMul`: the exact int32 product through the float32 GEMM.
//!   Operands minus their zero points lie in [-255, 255], so each product is an integer below
//!   2^16 and a sum of 256 of them stays below 2^24, where float32 holds every integer: the
//!   contraction runs in pieces of [`EXACT_K`], each exact, added in int32 (wrapping, as
//!   numpy's int32 matmul does).
//! - `MatMulIntegerToFloat`: that product rounded once to float32, then its post-ops. With one
//!   piece and B read as its levels, the GEMM writes it straight into the output.

use super::{Scales, Step, scales_of};
use crate::cpu::parallel::{for_each_chunk, with_scratch};
use crate::cpu::post::PostOps;
use crate::cpu::{Kernel, KernelError, OpCx, input, output_mut};
use crate::invalid;
use crate::matmul::cpu::matmul_axes;
use crate::matmul::cpu::product::{Axis, Levels, Plan, Quantized};
use crate::minifloat::Format;
use crate::tensor::{Element, TensorMut, TensorRef};
use bytemuck::Pod;
use half::f16;
use ingot_schema::DType;

/// Elements per parallel task.
const TASK: usize = 1 << 15;

/// The longest contraction float32 sums exactly for 8-bit operands (see the module docs).
pub(crate) const EXACT_K: usize = 256;

pub fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    match cx.op {
        "DequantizeLinear" => Ok(Box::new(Dequantize::new(cx)?)),
        "QuantizeLinear" => Ok(Box::new(Quantize::new(cx)?)),
        "QuantizeDequantize" => Ok(Box::new(RoundTrip::new(cx)?)),
        "DynamicQuantizeLinear" => dynamic(cx),
        "MatMulInteger" => Ok(Box::new(MatMulInteger::new(cx)?)),
        "MatMulIntegerToFloat" => Ok(Box::new(IntegerToFloat::new(cx)?)),
        "QLinearMatMul" => Ok(Box::new(QLinearMatMul::new(cx)?)),
        op => Err(KernelError::UnknownOp(op.to_string())),
    }
}

/// The integer types of quantized values.
trait Level: Element + Copy + Default {
    const MIN: f64;
    const MAX: f64;
    fn int(self) -> i32;
    /// `(self - zero_point) * scale` as ONNX's reference computes it.
    fn real(self, zero_point: i32, scale: f32) -> f32;
    /// From a value already rounded and saturated to the type's range.
    fn from_saturated(v: f64) -> Self;
    /// The same from a float32.
    fn from_saturated_f32(v: f32) -> Self;
}

macro_rules! narrow_level {
    ($($t:ty),*) => {$(
        impl Level for $t {
            const MIN: f64 = <$t>::MIN as f64;
            const MAX: f64 = <$t>::MAX as f64;
            fn int(self) -> i32 {
                i32::from(self)
            }
            fn real(self, zero_point: i32, scale: f32) -> f32 {
                // Differences of 16-bit values are exact in float32.
                (i32::from(self) - zero_point) as f32 * scale
            }
            fn from_saturated(v: f64) -> Self {
                v as $t
            }
            fn from_saturated_f32(v: f32) -> Self {
                // A whole number within 16 bits plus 1.5·2^23 lies where float32's step is 1:
                // its low mantissa bits are the number's two's complement. Unlike `as`, a
                // saturating conversion that LLVM leaves scalar, this vectorises.
                (v + 12_582_912.0).to_bits() as $t
            }
        }
    )*};
}
narrow_level!(i8, u8, i16, u16);

impl Level for i32 {
    const MIN: f64 = i32::MIN as f64;
    const MAX: f64 = i32::MAX as f64;
    fn int(self) -> i32 {
        self
    }
    fn real(self, zero_point: i32, scale: f32) -> f32 {
        // numpy: float32(x) - int32 zero point is float64.
        ((self as f32 as f64 - f64::from(zero_point)) * f64::from(scale)) as f32
    }
    fn from_saturated(v: f64) -> Self {
        v as i32
    }
    fn from_saturated_f32(v: f32) -> Self {
        v as i32
    }
}

/// The float types of dequantized values.
trait Real: Element + Copy {
    fn from_f32(v: f32) -> Self;
}

impl Real for f32 {
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl Real for f16 {
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}

/// The elements of a float32 or float16 tensor as float32: the tensor itself, or a copy in
/// this thread's scratch.
fn with_floats<R>(
    t: &TensorRef,
    len: usize,
    f: impl FnOnce(&[f32]) -> Result<R, KernelError>,
) -> Result<R, KernelError> {
    if t.elements() != len {
        return Err(invalid!("a scale has {} elements, expected {len}", t.elements()));
    }
    match t.dtype {
        DType::F32 => f(t.as_slice::<f32>()?),
        DType::F16 => {
            let h = t.as_slice::<f16>()?;
            with_scratch::<f32, _>(len, |s| {
                for (s, &h) in s.iter_mut().zip(h) {
                    *s = h.to_f32();
                }
                f(s)
            })
        }
        d => Err(invalid!("a scale of {d}")),
    }
}

/// The zero points of a scale layout: input 2 where given.
fn zero_points<'a, T: Element>(
    inputs: &[TensorRef<'a>],
    given: bool,
    len: usize,
) -> Result<Option<&'a [T]>, KernelError> {
    given.then(|| input::<T>(inputs, 2, len)).transpose()
}

/// Runs `$body` with `$T` the Rust type of quantized type `$dt`.
macro_rules! by_level {
    ($dt:expr, $T:ident => $body:expr) => {
        match $dt {
            // The 2- and 4-bit integers are stored as the bytes of their 8-bit types.
            DType::I8 | DType::I4 | DType::I2 => {
                type $T = i8;
                $body
            }
            DType::U8 | DType::U4 | DType::U2 => {
                type $T = u8;
                $body
            }
            DType::I16 => {
                type $T = i16;
                $body
            }
            DType::U16 => {
                type $T = u16;
                $body
            }
            DType::I32 => {
                type $T = i32;
                $body
            }
            d => Err(invalid!("no quantized values of {d}")),
        }
    };
}

/// The shapes and types a DequantizeLinear or QuantizeLinear step was prepared for.
struct Linear {
    scales: Scales,
    len: usize,
    zero_point: bool,
    x: DType,
    y: DType,
}

impl Linear {
    fn new(cx: &OpCx, zero_type: DType) -> Result<Linear, KernelError> {
        cx.expect_arity(2..=3, 1)?;
        let descs: Vec<&_> = cx.inputs.iter().collect();
        let scales =
            scales_of(cx.attrs, &descs, zero_type).map_err(|e| invalid!("{}: {e}", cx.op))?;
        let (x, y) = (&cx.inputs[0], &cx.outputs[0]);
        if y.shape != x.shape {
            return Err(invalid!("{} of {:?} declares output {:?}", cx.op, x.shape, y.shape));
        }
        Ok(Linear {
            scales,
            len: x.elements(),
            zero_point: cx.inputs.len() == 3,
            x: x.dtype,
            y: y.dtype,
        })
    }
}

struct Dequantize(Linear);

impl Dequantize {
    fn new(cx: &OpCx) -> Result<Dequantize, KernelError> {
        let x = cx.inputs.first().map(|d| d.dtype).ok_or_else(|| invalid!("x is missing"))?;
        let l = Linear::new(cx, x)?;
        let x_types = [
            DType::I2,
            DType::U2,
            DType::I4,
            DType::U4,
            DType::I8,
            DType::U8,
            DType::I16,
            DType::U16,
            DType::I32,
        ];
        if !x_types.contains(&l.x) && !l.x.is_minifloat() {
            return Err(cx.dtype_error(l.x));
        }
        let to = i32::try_from(cx.attrs.int("to")?).ok().and_then(DType::from_onnx_code);
        if to != Some(l.y) || !matches!(l.y, DType::F32 | DType::F16) {
            return Err(invalid!("DequantizeLinear to {:?} declares a {} output", to, l.y));
        }
        Ok(Dequantize(l))
    }
}

impl Kernel for Dequantize {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let l = &self.0;
        let scale = inputs.get(1).ok_or_else(|| invalid!("the scale is missing"))?;
        with_floats(scale, l.scales.len(), |s| {
            if let Some(format) = Format::of(l.x) {
                return dequantize_minifloat(format, inputs, l, s, outputs);
            }
            by_level!(l.x, T => {
                let x = input::<T>(inputs, 0, l.len)?;
                let zp = zero_points::<T>(inputs, l.zero_point, l.scales.len())?;
                match l.y {
                    DType::F32 => dequantize(x, zp, s, &l.scales, output_mut::<f32>(outputs, 0, l.len)?),
                    _ => dequantize(x, zp, s, &l.scales, output_mut::<f16>(outputs, 0, l.len)?),
                }
                Ok(())
            })
        })
    }
}

/// DequantizeLinear of float8: `(x - zero_point) * scale` in float32, as ONNX's reference.
fn dequantize_minifloat(
    format: Format,
    inputs: &[TensorRef],
    l: &Linear,
    s: &[f32],
    outputs: &mut [TensorMut],
) -> Result<(), KernelError> {
    let x = input::<u8>(inputs, 0, l.len)?;
    let zp = zero_points::<u8>(inputs, l.zero_point, l.scales.len())?;
    let zp_at = |i: usize| zp.map_or(0.0, |z| format.decode(z[i]));
    let real = |x: u8, s: f32, z: f32| (format.decode(x) - z) * s;
    match l.y {
        DType::F32 => {
            map_scaled_by(x, output_mut::<f32>(outputs, 0, l.len)?, &l.scales, s, zp_at, real)
        }
        _ => map_scaled_by(
            x,
            output_mut::<f16>(outputs, 0, l.len)?,
            &l.scales,
            s,
            zp_at,
            |x, s, z| f16::from_f32(real(x, s, z)),
        ),
    }
    Ok(())
}

fn dequantize<T: Level, O: Real>(x: &[T], zp: Option<&[T]>, s: &[f32], g: &Scales, y: &mut [O]) {
    map_scaled(x, y, g, s, zp, |x, s, z| O::from_f32(x.real(z, s)));
}

/// `y[i] = f(x[i], scale, zero point)` with element i's scale and zero point (0 without
/// one), in parallel tasks; over a run of elements that share one, the loop reads them
/// once, so it vectorises.
fn map_scaled<X: Copy + Sync, Q: Level, Y: Pod + Send>(
    x: &[X],
    y: &mut [Y],
    g: &Scales,
    s: &[f32],
    zp: Option<&[Q]>,
    f: impl Fn(X, f32, i32) -> Y + Sync,
) {
    map_scaled_by(x, y, g, s, |i| zp.map_or(0, |z| z[i].int()), f);
}

/// [`map_scaled`] with zero point `i` given by `zp_at` (float8's are floats).
fn map_scaled_by<X: Copy + Sync, Z: Copy, Y: Pod + Send>(
    x: &[X],
    y: &mut [Y],
    g: &Scales,
    s: &[f32],
    zp_at: impl Fn(usize) -> Z + Sync,
    f: impl Fn(X, f32, Z) -> Y + Sync,
) {
    for_each_chunk(y, TASK, &|t, ys| {
        let lo = t * TASK;
        g.pieces(lo..lo + ys.len(), |piece, first, step| {
            let xs = &x[piece.clone()];
            let ys = &mut ys[piece.start - lo..piece.end - lo];
            match step {
                Step::Same => map_one_scale(xs, ys, s[first], zp_at(first), &f),
                Step::Each => {
                    for (j, (y, &x)) in ys.iter_mut().zip(xs).enumerate() {
                        *y = f(x, s[first + j], zp_at(first + j));
                    }
                }
            }
        });
    });
}

/// `y[i] = f(x[i], s, z)`: the loop of a per-tensor scale, compiled for the wider vector
/// units too (a QDQ model's round trips divide every activation by its scale: the baseline's
/// SSE2 takes twice as long as AVX2).
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512vl+avx2+fma+avx",
    "x86_64+avx2+fma+avx",
    "aarch64+neon"
))]
fn map_one_scale<X: Copy, Z: Copy, Y, F: Fn(X, f32, Z) -> Y>(
    x: &[X],
    y: &mut [Y],
    s: f32,
    z: Z,
    f: &F,
) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = f(x, s, z);
    }
}

/// What `x / scale` is computed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Precision {
    F32,
    /// float32 division rounded to float16, as numpy's float16 arithmetic.
    F16,
    F64,
}

impl Precision {
    #[inline(always)]
    fn ratio(self, x: f64, s: f32) -> f64 {
        match self {
            Precision::F32 => f64::from(x as f32 / s),
            Precision::F16 => f64::from(f16::from_f32(x as f32 / s)),
            Precision::F64 => x / f64::from(s),
        }
    }
}

/// `saturate(round_half_even(ratio) + zero_point)`.
#[inline(always)]
fn level<Q: Level>(ratio: f64, zero_point: i32) -> Q {
    Q::from_saturated((ratio.round_ties_even() + f64::from(zero_point)).clamp(Q::MIN, Q::MAX))
}

/// [`level`] of `x / s` in float32 precision, computed in float32 throughout so that loops of
/// it vectorise (`round_ties_even` is a libm call on the SSE2 baseline, 13 ns an element).
#[inline(always)]
fn level_f32<Q: Level>(x: f32, s: f32, zero_point: f32) -> Q {
    Q::from_saturated_f32(level_value::<Q>(x, s, zero_point))
}

/// The level of `x / s` as a float32: the division as the reference divides; halves rounded
/// to even by adding and subtracting 1.5·2^23, exact for |r| ≤ 2^22 (r is clamped to that
/// first: past it every 8- and 16-bit level saturates anyway); the zero point added and the
/// sum saturated, exactly (integers below 2^23); NaN's level 0, as the float64 path's
/// conversion makes it. The same levels as that path, infinities included.
#[inline(always)]
fn level_value<Q: Level>(x: f32, s: f32, zero_point: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0;
    const BOUND: f32 = 4_194_304.0;
    let r = (x / s).clamp(-BOUND, BOUND);
    let r = (r + ROUND) - ROUND;
    let v = (r + zero_point).clamp(Q::MIN as f32, Q::MAX as f32);
    if v.is_nan() { 0.0 } else { v }
}

struct Quantize {
    linear: Linear,
    precision: Precision,
    /// Float8 levels past the format's range saturate (else they become inf or NaN).
    saturate: bool,
}

impl Quantize {
    fn new(cx: &OpCx) -> Result<Quantize, KernelError> {
        let y = cx.outputs.first().map(|d| d.dtype).ok_or_else(|| invalid!("y is missing"))?;
        let linear = Linear::new(cx, y)?;
        if !matches!(linear.x, DType::F32 | DType::F16 | DType::I32) {
            return Err(cx.dtype_error(linear.x));
        }
        let y_types = [
            DType::I2,
            DType::U2,
            DType::I4,
            DType::U4,
            DType::I8,
            DType::U8,
            DType::I16,
            DType::U16,
        ];
        if !y_types.contains(&linear.y) && !linear.y.is_minifloat() {
            return Err(cx.dtype_error(linear.y));
        }
        let precision =
            match i32::try_from(cx.attrs.int("precision")?).ok().and_then(DType::from_onnx_code) {
                Some(DType::F32) => Precision::F32,
                Some(DType::F16) => Precision::F16,
                Some(DType::F64) => Precision::F64,
                p => return Err(invalid!("QuantizeLinear in precision {p:?}")),
            };
        let saturate = cx.attrs.int_or("saturate", 1)? != 0;
        Ok(Quantize { linear, precision, saturate })
    }
}

impl Kernel for Quantize {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let l = &self.linear;
        let scale = inputs.get(1).ok_or_else(|| invalid!("the scale is missing"))?;
        with_floats(scale, l.scales.len(), |s| {
            if let Some(format) = Format::of(l.y) {
                return self.quantize_minifloat(format, inputs, s, outputs);
            }
            by_level!(l.y, Q => {
                let zp = zero_points::<Q>(inputs, l.zero_point, l.scales.len())?;
                let y = output_mut::<Q>(outputs, 0, l.len)?;
                let p = self.precision;
                match l.x {
                    DType::F32 if p == Precision::F32 => {
                        quantize_f32(input::<f32>(inputs, 0, l.len)?, s, zp, &l.scales, y)
                    }
                    DType::F32 => quantize(input::<f32>(inputs, 0, l.len)?, s, zp, &l.scales, p, y),
                    DType::F16 => quantize(input::<f16>(inputs, 0, l.len)?, s, zp, &l.scales, p, y),
                    DType::I32 => quantize(input::<i32>(inputs, 0, l.len)?, s, zp, &l.scales, p, y),
                    d => return Err(invalid!("QuantizeLinear of {d}")),
                }
                saturate_to_sub_byte(l.y, bytemuck::cast_slice_mut(y));
                Ok(())
            })
        })
    }
}

impl Quantize {
    /// QuantizeLinear to float8 or float4: `x / scale + zero_point` (the ratio in the step's
    /// precision) rounded to the format, saturated unless the model says not to.
    fn quantize_minifloat(
        &self,
        format: Format,
        inputs: &[TensorRef],
        s: &[f32],
        outputs: &mut [TensorMut],
    ) -> Result<(), KernelError> {
        let l = &self.linear;
        let zp = zero_points::<u8>(inputs, l.zero_point, l.scales.len())?;
        let zp_at = |i: usize| zp.map_or(0.0, |z| f64::from(format.decode(z[i])));
        let y = output_mut::<u8>(outputs, 0, l.len)?;
        let (p, saturate) = (self.precision, self.saturate);
        let level = |v: f64, s: f32, z: f64| format.encode(p.ratio(v, s) + z, saturate);
        match l.x {
            DType::F32 => {
                let x = input::<f32>(inputs, 0, l.len)?;
                map_scaled_by(x, y, &l.scales, s, zp_at, |x, s, z| level(f64::from(x), s, z));
            }
            DType::F16 => {
                let x = input::<f16>(inputs, 0, l.len)?;
                map_scaled_by(x, y, &l.scales, s, zp_at, |x, s, z| level(f64::from(x), s, z));
            }
            d => return Err(invalid!("QuantizeLinear of {d} to {}", l.y)),
        }
        Ok(())
    }
}

/// A 2- or 4-bit type's levels, from the 8-bit type's they were computed in: saturating to
/// -128..=127 and then to -8..=7 is saturating to -8..=7 (the zero point is in both ranges).
fn saturate_to_sub_byte(levels: DType, y: &mut [u8]) {
    match levels {
        DType::I4 => y.iter_mut().for_each(|b| *b = (*b as i8).clamp(-8, 7) as u8),
        DType::U4 => y.iter_mut().for_each(|b| *b = (*b).min(15)),
        DType::I2 => y.iter_mut().for_each(|b| *b = (*b as i8).clamp(-2, 1) as u8),
        DType::U2 => y.iter_mut().for_each(|b| *b = (*b).min(3)),
        _ => {}
    }
}

/// Values QuantizeLinear takes, as float64 (every one exactly).
trait Source: Element + Copy {
    fn to_f64(self) -> f64;
}
impl Source for f32 {
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
}
impl Source for f16 {
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
}
impl Source for i32 {
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
}

fn quantize<X: Source, Q: Level>(
    x: &[X],
    s: &[f32],
    zp: Option<&[Q]>,
    g: &Scales,
    p: Precision,
    y: &mut [Q],
) {
    map_scaled(x, y, g, s, zp, |x, s, z| level(p.ratio(x.to_f64(), s), z));
}

/// [`quantize`] of float32 in float32 precision, by [`level_f32`].
fn quantize_f32<Q: Level>(x: &[f32], s: &[f32], zp: Option<&[Q]>, g: &Scales, y: &mut [Q]) {
    map_scaled(x, y, g, s, zp, |x, s, z| level_f32(x, s, z as f32));
}

/// `QuantizeDequantize`: the levels of QuantizeLinear in float32 ([`level_f32`]) and their
/// values as DequantizeLinear computes them.
struct RoundTrip {
    linear: Linear,
    levels: DType,
}

impl RoundTrip {
    fn new(cx: &OpCx) -> Result<RoundTrip, KernelError> {
        let levels = i32::try_from(cx.attrs.int("to")?).ok().and_then(DType::from_onnx_code);
        let levels = levels
            .filter(|d| matches!(d, DType::I8 | DType::U8 | DType::I16 | DType::U16))
            .ok_or_else(|| invalid!("QuantizeDequantize to levels {:?}", cx.attrs.get("to")))?;
        let linear = Linear::new(cx, levels)?;
        let precision = cx.attrs.int("precision")?;
        let scale = cx.inputs[1].dtype;
        if linear.x != DType::F32 || linear.y != DType::F32 || scale != DType::F32 || precision != 1
        {
            return Err(invalid!(
                "QuantizeDequantize of {} to {} by a {scale} scale in precision {precision}                  (float32 only)",
                linear.x,
                linear.y
            ));
        }
        Ok(RoundTrip { linear, levels })
    }
}

impl Kernel for RoundTrip {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let l = &self.linear;
        let s = input::<f32>(inputs, 1, l.scales.len())?;
        let x = input::<f32>(inputs, 0, l.len)?;
        let y = output_mut::<f32>(outputs, 0, l.len)?;
        by_level!(self.levels, Q => {
            let zp = zero_points::<Q>(inputs, l.zero_point, l.scales.len())?;
            round_trip(x, s, zp, &l.scales, y);
            Ok(())
        })
    }
}

/// `(level - zero point) * scale` as DequantizeLinear computes it (the difference of two
/// integers below 2^23 is exact in float32).
fn round_trip<Q: Level>(x: &[f32], s: &[f32], zp: Option<&[Q]>, g: &Scales, y: &mut [f32]) {
    map_scaled(x, y, g, s, zp, |x, s, z| {
        let z = z as f32;
        (level_value::<Q>(x, s, z) - z) * s
    });
}

fn dynamic(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(1..=1, 3)?;
    let x = &cx.inputs[0];
    let want = [(DType::U8, x.shape.as_slice()), (DType::F32, &[][..]), (DType::U8, &[][..])];
    let fits = cx.outputs.iter().zip(want).all(|(o, (d, s))| o.dtype == d && o.shape == s);
    if x.dtype != DType::F32 || !fits {
        return Err(invalid!(
            "DynamicQuantizeLinear takes float32 and gives uint8, a float32 scale and a uint8 \
             zero point; the step has {} to {:?}",
            x.dtype,
            cx.outputs.iter().map(|o| (o.dtype, &o.shape)).collect::<Vec<_>>()
        ));
    }
    Ok(Box::new(DynamicQuantize { len: x.elements() }))
}

struct DynamicQuantize {
    len: usize,
}

impl Kernel for DynamicQuantize {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let x = input::<f32>(inputs, 0, self.len)?;
        // The range widened to hold 0, so that 0 quantizes exactly.
        let (lo, hi) = range_with_zero(x);
        let scale = if hi == lo { 1.0 } else { hi - lo } / 255.0;
        let zero = (0.0 - lo / scale).clamp(0.0, 255.0).round_ties_even();
        let [y, y_scale, y_zero] = outputs else {
            return Err(invalid!("DynamicQuantizeLinear writes 3 outputs, got {}", outputs.len()));
        };
        crate::cpu::tensor_mut::<f32>(y_scale, 1)?[0] = scale;
        crate::cpu::tensor_mut::<u8>(y_zero, 1)?[0] = zero as u8;
        let y = crate::cpu::tensor_mut::<u8>(y, self.len)?;
        for_each_chunk(y, TASK, &|t, ys| levels_u8(&x[t * TASK..], scale, zero, ys));
        Ok(())
    }
}

/// `y = level_f32(x, scale, zero)`, compiled for the wider vector units too: the baseline's
/// SSE2 quantizes a transformer's activations in twice the time.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512vl+avx2+fma+avx",
    "x86_64+avx2+fma+avx",
    "aarch64+neon"
))]
fn levels_u8(x: &[f32], scale: f32, zero: f32, y: &mut [u8]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = level_f32::<u8>(x, scale, zero);
    }
}

/// The least and greatest of `x` and 0, NaN ignored (as `f32::min` and `max` do), in
/// independent lanes so that the loop vectorises: a fold of one running pair does not, and
/// took longer than the quantization after it.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512vl+avx2+fma+avx",
    "x86_64+avx2+fma+avx",
    "aarch64+neon"
))]
fn range_with_zero(x: &[f32]) -> (f32, f32) {
    const LANES: usize = 16;
    let (mut lo, mut hi) = ([0f32; LANES], [0f32; LANES]);
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            lo[i] = lo[i].min(c[i]);
            hi[i] = hi[i].max(c[i]);
        }
    }
    let lanes = lo.iter().zip(&hi).map(|(&l, &h)| (l, h));
    let tail = tail.iter().map(|&v| (v, v));
    lanes.chain(tail).fold((0f32, 0f32), |(lo, hi), (l, h)| (lo.min(l), hi.max(h)))
}

/// The exact int32 product of two 8-bit operands minus their zero points, numpy's matmul.
struct IntProduct {
    /// One plan per piece of the contraction, with the first index of its piece.
    pieces: Vec<(usize, Plan)>,
    a: (DType, usize),
    b: (DType, usize),
    c: usize,
    /// B's matrices as `k x n`: where its per-column zero points repeat.
    n: usize,
    kn: usize,
    /// Where the operands and their zero points are among the inputs.
    at: (usize, usize),
    a_zero: Option<usize>,
    b_zero: Option<usize>,
    /// B read as its 8-bit levels by the dequantizing GEMM (one matrix of bytes, one zero
    /// point or one per column), instead of widened to floats whole on every run: B is
    /// usually a weight, far larger than the activations A.
    b_levels: bool,
}

impl IntProduct {
    /// For inputs `a` and `b` of the step, their zero points at `a_zero` and `b_zero`.
    fn new(
        cx: &OpCx,
        (a, b): (usize, usize),
        zeros: (Option<usize>, Option<usize>),
    ) -> Result<IntProduct, KernelError> {
        let (ad, bd) = (&cx.inputs[a], &cx.inputs[b]);
        let (shape, axes) = matmul_axes(&ad.shape, &bd.shape)?;
        if cx.outputs[0].shape != shape {
            return Err(invalid!(
                "{} makes {shape:?}, the step declares {:?}",
                cx.op,
                cx.outputs[0].shape
            ));
        }
        for (x, zp, per_column, what) in [(ad, zeros.0, false, "A"), (bd, zeros.1, true, "B")] {
            super::check_zero_point(x, zp.map(|i| &cx.inputs[i]), per_column, what)
                .map_err(|e| invalid!("{}: {e}", cx.op))?;
        }
        // matmul_axes puts the contraction last: A's stride 1, B's stride n.
        let (k, n) = match axes.last() {
            Some(&Axis { size, b, .. }) => (size, b),
            None => return Err(invalid!("{} has no contraction", cx.op)),
        };
        let pieces: Vec<(usize, Plan)> = (0..k.max(1))
            .step_by(EXACT_K)
            .map(|k0| {
                let mut piece = axes.clone();
                if let Some(last) = piece.last_mut() {
                    last.size = (k - k0).min(EXACT_K);
                }
                (k0, Plan::new(&piece))
            })
            .collect();
        let bytes = |d: DType| {
            matches!(d, DType::I8 | DType::U8 | DType::I4 | DType::U4 | DType::I2 | DType::U2)
        };
        let b_zeros = zeros.1.map_or(1, |z| cx.inputs[z].elements());
        let b_levels = bytes(bd.dtype)
            && bd.shape.len() == 2
            && pieces.iter().all(|(_, plan)| plan.b_is_one_matrix())
            && (b_zeros == 1 || b_zeros == n);
        Ok(IntProduct {
            b_levels,
            pieces,
            a: (ad.dtype, ad.elements()),
            b: (bd.dtype, bd.elements()),
            c: cx.outputs[0].elements(),
            n,
            kn: k * n,
            at: (a, b),
            a_zero: zeros.0,
            b_zero: zeros.1,
        })
    }

    /// `out = (A - a_zero) x (B - b_zero)`, exactly.
    fn run(&self, inputs: &[TensorRef], out: &mut [i32]) -> Result<(), KernelError> {
        if out.len() != self.c {
            return Err(invalid!("the product has {} elements, expected {}", out.len(), self.c));
        }
        with_scratch::<f32, _>(self.a.1, |a| {
            self.widen(inputs, (self.at.0, false), self.a_zero, self.a, a)?;
            if self.b_levels {
                return self.run_on_levels(inputs, a, out);
            }
            with_scratch::<f32, _>(self.b.1, |b| {
                self.widen(inputs, (self.at.1, true), self.b_zero, self.b, b)?;
                with_scratch::<f32, _>(self.c, |c| {
                    out.fill(0);
                    for (k0, plan) in &self.pieces {
                        c.fill(0.0);
                        let (a, b) =
                            (a.get(*k0..).unwrap_or(&[]), b.get(k0 * self.n..).unwrap_or(&[]));
                        plan.run(1.0, a, b, c, |_, _| Ok(()))?;
                        for (o, &v) in out.iter_mut().zip(c.iter()) {
                            *o = o.wrapping_add(v as i32);
                        }
                    }
                    Ok(())
                })
            })
        })
    }

    /// [`IntProduct::run`] with A widened and B read as its levels (`b_levels`): each level
    /// minus its column's zero point, times 1, is exact in float32 as the widened B is.
    fn run_on_levels(
        &self,
        inputs: &[TensorRef],
        a: &[f32],
        out: &mut [i32],
    ) -> Result<(), KernelError> {
        with_scratch::<f32, _>(self.c, |c| {
            out.fill(0);
            self.each_piece_on_levels(inputs, a, |plan, a, b| {
                c.fill(0.0);
                plan.run_dequantized(1.0, a, b, c, |_, _| Ok(()))?;
                for (o, &v) in out.iter_mut().zip(c.iter()) {
                    *o = o.wrapping_add(v as i32);
                }
                Ok(())
            })
        })
    }

    /// Calls `piece` with each piece's plan, A from its first index, and B's levels from its
    /// first row with their zero points (`b_levels`).
    fn each_piece_on_levels(
        &self,
        inputs: &[TensorRef],
        a: &[f32],
        mut piece: impl FnMut(&Plan, &[f32], &Quantized) -> Result<(), KernelError>,
    ) -> Result<(), KernelError> {
        let b = inputs.get(self.at.1).ok_or_else(|| invalid!("B is missing"))?;
        if b.bytes.len() != self.b.1 {
            return Err(invalid!("B has {} bytes, expected {}", b.bytes.len(), self.b.1));
        }
        let zero: Vec<f32> = match self.b_zero {
            None => vec![0.0; self.n],
            Some(i) => {
                let z = inputs.get(i).ok_or_else(|| invalid!("B's zero point is missing"))?;
                let z: Vec<f32> = by_level!(self.b.0, T => {
                    Ok::<_, KernelError>(
                        z.as_slice::<T>()?.iter().map(|v| v.int() as f32).collect(),
                    )
                })?;
                match z[..] {
                    [z] => vec![z; self.n],
                    _ if z.len() == self.n => z,
                    _ => return Err(invalid!("B's zero point has {} values", z.len())),
                }
            }
        };
        let scale = vec![1.0f32; self.n];
        for (k0, plan) in &self.pieces {
            let levels = match self.b.0 {
                DType::I8 | DType::I4 | DType::I2 => {
                    Levels::I8(b.as_slice::<i8>()?.get(k0 * self.n..).unwrap_or(&[]))
                }
                _ => Levels::U8(b.as_slice::<u8>()?.get(k0 * self.n..).unwrap_or(&[])),
            };
            let b = Quantized { levels, scale: &scale, zero: &zero };
            piece(plan, a.get(*k0..).unwrap_or(&[]), &b)?;
        }
        Ok(())
    }

    /// `out += (A - a_zero) x (B - b_zero)` as float32, each element rounded once from the
    /// exact int32 product (as a Cast of MatMulInteger's output), then `done` on each block
    /// of `out` (on all of it at 0 unless one exact GEMM computes the whole product).
    fn run_float(
        &self,
        inputs: &[TensorRef],
        out: &mut [f32],
        accumulates: bool,
        mut done: impl FnMut(&mut [f32], usize) -> Result<(), KernelError>,
    ) -> Result<(), KernelError> {
        if out.len() != self.c {
            return Err(invalid!("the product has {} elements, expected {}", out.len(), self.c));
        }
        // One exact GEMM straight into a zeroed output: its sums are the int32 product's,
        // and each block is done while in cache. Onto a residual, sums would round.
        if self.b_levels && self.pieces.len() == 1 && !accumulates {
            return with_scratch::<f32, _>(self.a.1, |a| {
                self.widen(inputs, (self.at.0, false), self.a_zero, self.a, a)?;
                self.each_piece_on_levels(inputs, a, |plan, a, b| {
                    plan.run_dequantized(1.0, a, b, out, &mut done)
                })
            });
        }
        with_scratch::<f32, _>(self.c, |words| {
            let acc: &mut [i32] = bytemuck::cast_slice_mut(words);
            self.run(inputs, acc)?;
            for (o, &v) in out.iter_mut().zip(acc.iter()) {
                *o += v as f32;
            }
            done(out, 0)
        })
    }

    /// The operand at input `at` (B where `is_b`) minus its zero point, as floats.
    fn widen(
        &self,
        inputs: &[TensorRef],
        (at, is_b): (usize, bool),
        zero: Option<usize>,
        (dtype, len): (DType, usize),
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        fn go<T: Level>(x: &[T], zp: Option<&[T]>, (n, kn): (usize, usize), out: &mut [f32]) {
            match zp {
                None => out.iter_mut().zip(x).for_each(|(o, &x)| *o = x.int() as f32),
                Some(&[z]) => {
                    out.iter_mut().zip(x).for_each(|(o, &x)| *o = (x.int() - z.int()) as f32)
                }
                // One zero point per column, per matrix or for all of them.
                Some(z) => {
                    for (r, (o, x)) in out.chunks_mut(n.max(1)).zip(x.chunks(n.max(1))).enumerate()
                    {
                        let at = if z.len() == n { 0 } else { r * n / kn.max(1) * n };
                        for ((o, &x), &z) in o.iter_mut().zip(x).zip(&z[at..at + x.len()]) {
                            *o = (x.int() - z.int()) as f32;
                        }
                    }
                }
            }
        }
        let x = inputs.get(at).ok_or_else(|| invalid!("an operand is missing"))?;
        by_level!(dtype, T => {
            let x = input::<T>(std::slice::from_ref(x), 0, len)?;
            let zp = match zero {
                Some(i) => Some(inputs.get(i).ok_or_else(|| invalid!("a zero point is missing"))?.as_slice::<T>()?),
                None => None,
            };
            if let Some(z) = zp {
                let fits = z.len() == 1
                    || (is_b && (z.len() == self.n || z.len() * self.kn == len * self.n));
                if !fits {
                    return Err(invalid!("a zero point of {} elements", z.len()));
                }
            }
            go(x, zp, (self.n, self.kn), out);
            Ok(())
        })
    }
}

struct MatMulInteger(IntProduct);

impl MatMulInteger {
    fn new(cx: &OpCx) -> Result<MatMulInteger, KernelError> {
        let (a, b) = (cx.attrs.int("a_zero_point")? != 0, cx.attrs.int("b_zero_point")? != 0);
        let n = 2 + usize::from(a) + usize::from(b);
        cx.expect_arity(n..=n, 1)?;
        if cx.outputs[0].dtype != DType::I32 {
            return Err(invalid!(
                "MatMulInteger gives int32, the step declares {}",
                cx.outputs[0].dtype
            ));
        }
        Ok(MatMulInteger(IntProduct::new(cx, (0, 1), (a.then_some(2), b.then_some(n - 1)))?))
    }
}

impl Kernel for MatMulInteger {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let out = output_mut::<i32>(outputs, 0, self.0.c)?;
        self.0.run(inputs, out)
    }
}

/// MatMulIntegerToFloat: MatMulInteger's product as float32, then its post-ops (the scale and
/// bias a dynamically quantized model multiplies and adds after the Cast).
struct IntegerToFloat {
    product: IntProduct,
    post: PostOps,
    own: usize,
}

impl IntegerToFloat {
    fn new(cx: &OpCx) -> Result<IntegerToFloat, KernelError> {
        let (post, own) = PostOps::new(cx, 4..=4)?;
        if cx.outputs[0].dtype != DType::F32 {
            return Err(invalid!(
                "{} gives float32, the step declares {}",
                cx.op,
                cx.outputs[0].dtype
            ));
        }
        let product = IntProduct::new(cx, (0, 1), (Some(2), Some(3)))?;
        Ok(IntegerToFloat { product, post, own })
    }

    fn compute(
        &self,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
        aliased: Option<usize>,
    ) -> Result<(), KernelError> {
        let out = output_mut::<f32>(outputs, 0, self.product.c)?;
        let extras = self.post.operands::<f32>(inputs, self.own, out.len(), aliased)?;
        self.post.start(out, &extras, aliased.is_some())?;
        let applies = self.post.applies();
        self.product.run_float(inputs, out, self.post.accumulates(), |block, at| match applies {
            true => self.post.apply(block, at, &extras),
            false => Ok(()),
        })
    }
}

impl Kernel for IntegerToFloat {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        self.compute(inputs, outputs, None)
    }

    fn run_in_place(
        &self,
        aliased: usize,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
    ) -> Result<(), KernelError> {
        if !self.post.accumulates() || aliased != self.own {
            return Err(invalid!("cannot run in place over input {aliased}"));
        }
        self.compute(inputs, outputs, Some(aliased))
    }
}

/// QLinearMatMul: the integer product of (a, b), requantized by `a_scale * b_scale / y_scale`
/// per column onto y's zero point, as ONNX's reference: the multiplier in the scales' type,
/// the product times it in float64.
struct QLinearMatMul {
    product: IntProduct,
    /// B's scale: one, or one per column.
    columns: usize,
    y: DType,
}

impl QLinearMatMul {
    fn new(cx: &OpCx) -> Result<QLinearMatMul, KernelError> {
        cx.expect_arity(8..=8, 1)?;
        let descs: Vec<&_> = cx.inputs.iter().collect();
        super::qlinear_matmul_output(&descs).map_err(|e| invalid!("QLinearMatMul: {e}"))?;
        let product = IntProduct::new(cx, (0, 3), (Some(2), Some(5)))?;
        let y = cx.outputs[0].dtype;
        if y != cx.inputs[7].dtype {
            return Err(invalid!(
                "QLinearMatMul's y is {}, its zero point {}",
                y,
                cx.inputs[7].dtype
            ));
        }
        let columns = cx.inputs[4].elements();
        if columns != 1 && columns != product.n {
            return Err(invalid!("b_scale holds {columns} values for {} columns", product.n));
        }
        Ok(QLinearMatMul { product, columns, y })
    }
}

impl Kernel for QLinearMatMul {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let p = &self.product;
        let scale = |i: usize, len: usize| -> Result<Vec<f32>, KernelError> {
            let t = inputs.get(i).ok_or_else(|| invalid!("input {i} is missing"))?;
            with_floats(t, len, |s| Ok(s.to_vec()))
        };
        let f16s = inputs.get(1).is_some_and(|t| t.dtype == DType::F16);
        let (a_s, b_s, y_s) = (scale(1, 1)?[0], scale(4, self.columns)?, scale(6, 1)?[0]);
        // numpy's `a_scale * b_scale / y_scale`, each operation rounded to the scales' type.
        let round = |v: f32| if f16s { f16::from_f32(v).to_f32() } else { v };
        let multiplier: Vec<f64> =
            b_s.iter().map(|&b| f64::from(round(round(a_s * b) / y_s))).collect();
        with_scratch::<f32, _>(p.c, |words| {
            let acc: &mut [i32] = bytemuck::cast_slice_mut(words);
            p.run(inputs, acc)?;
            by_level!(self.y, Q => {
                let y_zero = input::<Q>(inputs, 7, 1)?[0].int();
                let y = output_mut::<Q>(outputs, 0, p.c)?;
                let n = p.n.max(1);
                for (j, (y, &c)) in y.iter_mut().zip(acc.iter()).enumerate() {
                    let m = multiplier[if self.columns == 1 { 0 } else { j % n }];
                    // Rounded after the zero point is added, as the reference.
                    let v = (f64::from(c) * m + f64::from(y_zero)).round_ties_even();
                    *y = Q::from_saturated(v.clamp(<Q as Level>::MIN, <Q as Level>::MAX));
                }
                Ok(())
            })
        })
    }
}

#[cfg(test)]
mod tests;
