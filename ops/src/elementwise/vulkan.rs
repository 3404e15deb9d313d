//! Elementwise kernels: unary maps, Clip, broadcasting binary and variadic ops, Where (ops and
//! canonical attributes: ops/src/elementwise/cpu.rs, the numeric reference).
//!
//! Three kernel files serve every step, one module per op, types and variant whatever the
//! shapes: the op is the hook `op` of one scalar per input (at most [`MAX_INPUTS`]), and each
//! input is read at the output's coordinates times its strides (0 along broadcast dims), which
//! come with the output's dims in the push constants. Dims are collapsed first (dims of 1
//! dropped, neighbours every operand steps over as one merged), to at most [`MAX_DIMS`]:
//! - `map.wgsl`: an element per invocation, over a grid whose x runs along the innermost dim
//!   and whose y and z are the outer ones, so that no invocation divides (but for 4 dims, once
//!   per workgroup);
//! - `map4.wgsl`: 4 elements per invocation with vec4 loads and stores, when the innermost
//!   collapsed dim is a multiple of 4 long and every input either runs along it (aligned) or
//!   is broadcast over it;
//! - `pack.wgsl`: outputs packed several to a u32 word (bool, f16, 8- and 16-bit integers)
//!   outside `map4.wgsl`: a word per invocation, keeping the bytes past the tensor's end in its
//!   last word; words may straddle rows, so an invocation divides once to find its first
//!   element.
//!
//! Rust writes the hooks: `op` (the op's expression, attributes read from the push-constant
//! words `k0`, `k1` so that every value shares the module) and, per type, `load*`, `store` and
//! `pack`; the library files (`float.wgsl`, `wide.wgsl`, `f16.wgsl`, `bytes.wgsl`) hold the
//! helpers they call (naga drops the ones a module does not call). A step too large for one
//! dispatch (more than 65535 workgroups along a grid dimension) takes several, each starting at
//! its own coordinates.
//!
//! Types: f32 for everything; i32 and u32 for the integer ops (wrapping, division by 0 gives
//! 0, as on the CPU); bool (one byte per element) in and out: comparisons, logic, IsNaN/IsInf,
//! Where, Cast between all of these; int64 and uint64 (two words, `vec2<u32>`) for everything
//! but Pow; f16, 8- and 16-bit integers packed in u32 words, computed as f32, i32 or u32 and
//! rounded or wrapped once per op, as on the CPU. Cast also takes the minifloats and the 2- and
//! 4-bit integers, one per byte (`byte_cast`). f64 has no kernel.

use crate::minifloat::{Format, cast_mode};
use crate::vulkan::{
    Binding, Dispatch, KernelCx, MAX_GROUPS, NoKernel, Operand, Spec, Wgsl, f32_lit,
};
use crate::{no_kernel, wgsl};
use ingot_schema::{AttrValue, DType};

/// The kernel files.
static MAP: Wgsl = wgsl!("elementwise/map.wgsl");
static MAP4: Wgsl = wgsl!("elementwise/map4.wgsl");
static PACK: Wgsl = wgsl!("elementwise/pack.wgsl");
/// The libraries.
pub(crate) static FLOAT: Wgsl = wgsl!("elementwise/float.wgsl");
static WIDE: Wgsl = wgsl!("elementwise/wide.wgsl");
pub(crate) static F16: Wgsl = wgsl!("elementwise/f16.wgsl");
static BYTES: Wgsl = wgsl!("elementwise/bytes.wgsl");

/// The most inputs an op may have (the kernels' slots `x0`, `x1`, `x2`).
pub const MAX_INPUTS: usize = 3;
/// The most dims a step may have once collapsed (the kernels' strides per input).
pub const MAX_DIMS: usize = 4;
/// Invocations per workgroup (the files' `WG`).
const WG: u32 = 64;

/// The WGSL expression of unary float op `op` (one without attributes) applied to `x`, an f32
/// variable or primary expression: it may appear several times.
pub fn unary_expr(op: &str, x: &str) -> Option<String> {
    let call = |f: &str| format!("{f}({x})");
    Some(match op {
        "Abs" | "Ceil" | "Floor" | "Sqrt" | "Exp" | "Log" | "Sin" | "Cos" | "Tan" | "Asin"
        | "Acos" | "Atan" | "Cosh" | "Asinh" | "Acosh" | "Atanh" => call(&op.to_lowercase()),
        // WGSL's round is half to even, as ONNX's.
        "Round" => call("round"),
        "Neg" => format!("-{x}"),
        "Reciprocal" => format!("1.0 / {x}"),
        // Zeros and NaN map to themselves, as on the CPU.
        "Sign" => format!("select(select({x}, -1.0, {x} < 0.0), 1.0, {x} > 0.0)"),
        // Not max(x, 0): NaN propagates.
        "Relu" => format!("select({x}, 0.0, {x} < 0.0)"),
        "Sinh" => sinh(x),
        "Tanh" => tanh(x),
        "Sigmoid" => format!("1.0 / (1.0 + exp(-{x}))"),
        "Erf" => erf(x),
        "HardSwish" => format!("{x} * min(max({x} * {} + 0.5, 0.0), 1.0)", f32_lit(1.0 / 6.0)),
        "Softplus" => softplus(x),
        "Softsign" => format!("{x} / (1.0 + abs({x}))"),
        "Mish" => format!("{x} * {}", tanh(&format!("({})", softplus(x)))),
        _ => return None,
    })
}

/// x · sigmoid(αx) as one division, as on the CPU (x / inf is 0 where exp overflows).
/// GELU of `x` (an f32 variable or primary expression), exact or its tanh approximation.
pub fn gelu(x: &str, tanh_form: bool) -> String {
    if !tanh_form {
        let scaled = format!("({x} * {})", f32_lit(std::f32::consts::FRAC_1_SQRT_2));
        return format!("0.5 * {x} * (1.0 + {})", erf(&scaled));
    }
    let k = f32_lit((2.0 / std::f64::consts::PI).sqrt() as f32);
    let inner = format!("({k} * ({x} + 0.044715 * {x} * {x} * {x}))");
    format!("0.5 * {x} * (1.0 + {})", tanh(&inner))
}

pub fn swish(x: &str, alpha: &str) -> String {
    format!("{x} / (1.0 + exp(-({alpha} * {x})))")
}

/// A polynomial in `z` by Horner's rule, coefficients from the constant term up.
fn horner(z: &str, coefficients: &[f64]) -> String {
    let Some((&last, rest)) = coefficients.split_last() else {
        return "0.0".into();
    };
    rest.iter()
        .rev()
        .fold(f32_lit(last as f32), |s, &c| format!("{} + {z} * ({s})", f32_lit(c as f32)))
}

/// Selects the Taylor polynomial `x * p(x²)` near 0, where `far` loses relative precision.
fn near_zero(x: &str, far: &str, below: f32, coefficients: &[f64]) -> String {
    let p = horner(&format!("({x} * {x})"), coefficients);
    format!("select({far}, {x} * ({p}), abs({x}) < {})", f32_lit(below))
}

/// tanh: Mesa computes (e^x - e^-x) / (e^x + e^-x), which cancels near 0 and overflows past
/// ±89 on drivers that do not clamp; tanh(±10) is ±1 in f32.
fn tanh(x: &str) -> String {
    let far = format!("tanh(clamp({x}, -10.0, 10.0))");
    // x - x³/3 + 2x⁵/15 - 17x⁷/315: below 0.1 the next term is under 3e-11 relative.
    near_zero(x, &far, 0.1, &[1.0, -1.0 / 3.0, 2.0 / 15.0, -17.0 / 315.0])
}

/// sinh, accurate near 0 like [`tanh`].
fn sinh(x: &str) -> String {
    let far = format!("sinh({x})");
    near_zero(x, &far, 0.1, &[1.0, 1.0 / 6.0, 1.0 / 120.0, 1.0 / 5040.0])
}

/// erf: the Taylor series below |x| = 0.5 (error < 2e-8 relative), Abramowitz & Stegun 7.1.26
/// above (error < 1.5e-7 absolute, where erf > 0.52).
fn erf(x: &str) -> String {
    let t = format!("(1.0 / (1.0 + 0.3275911 * abs({x})))");
    let a = [0.0, 0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429];
    let poly = horner(&t, &a);
    let far = format!("sign({x}) * (1.0 - ({poly}) * exp(-{x} * {x}))");
    // 2/√π Σ (-1)ⁿ x²ⁿ / (n! (2n + 1)), n = 0..5.
    let k = std::f64::consts::FRAC_2_SQRT_PI;
    let taylor =
        [1.0, -1.0 / 3.0, 1.0 / 10.0, -1.0 / 42.0, 1.0 / 216.0, -1.0 / 1320.0].map(|c| c * k);
    near_zero(x, &far, 0.5, &taylor)
}

/// ln(1 + e^x) without overflow, and accurate where e^-|x| is tiny.
fn softplus(x: &str) -> String {
    let e = format!("exp(-abs({x}))");
    // ln(1 + e) = e - e²/2 + e³/3 - ... below 0.1 (7 terms: error < 2e-8 relative), where
    // 1 + e would round e off.
    let log1p = format!(
        "select(log(1.0 + {e}), {e} * ({}), {e} < 0.1)",
        horner(&e, &[1.0, -1.0 / 2.0, 1.0 / 3.0, -1.0 / 4.0, 1.0 / 5.0, -1.0 / 6.0, 1.0 / 7.0])
    );
    format!("(max({x}, 0.0) + {log1p})")
}

/// An element type as kernels see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ty {
    F32,
    I32,
    U32,
    /// Two u32 words per element, `vec2<u32>` in WGSL.
    I64,
    U64,
    /// Packed, several to a u32 word, computed as f32, i32, u32 or bool.
    F16,
    I16,
    U16,
    I8,
    U8,
    Bool,
}

impl Ty {
    fn of(dtype: DType) -> Option<Ty> {
        Some(match dtype {
            DType::F32 => Ty::F32,
            DType::I32 => Ty::I32,
            DType::U32 => Ty::U32,
            DType::I64 => Ty::I64,
            DType::U64 => Ty::U64,
            DType::F16 => Ty::F16,
            DType::I16 => Ty::I16,
            DType::U16 => Ty::U16,
            DType::I8 => Ty::I8,
            DType::U8 => Ty::U8,
            DType::Bool => Ty::Bool,
            // No kernel computes in float64, minifloats or 2- and 4-bit integers (Cast reads
            // and writes the last two as bytes: `byte_cast`).
            DType::F64 | DType::I4 | DType::U4 | DType::I2 | DType::U2 => return None,
            DType::F8E4M3FN
            | DType::F8E4M3FNUZ
            | DType::F8E5M2
            | DType::F8E5M2FNUZ
            | DType::F8E8M0
            | DType::F4E2M1 => return None,
        })
    }

    /// The type its values are computed in.
    fn compute(self) -> Ty {
        match self {
            Ty::F16 => Ty::F32,
            Ty::I8 | Ty::I16 => Ty::I32,
            Ty::U8 | Ty::U16 => Ty::U32,
            t => t,
        }
    }

    /// Bits per element of a packed type.
    fn bits(self) -> Option<u32> {
        match self {
            Ty::F16 | Ty::I16 | Ty::U16 => Some(16),
            Ty::I8 | Ty::U8 | Ty::Bool => Some(8),
            _ => None,
        }
    }

    /// The WGSL type of one value.
    fn scalar(self) -> &'static str {
        match self.compute() {
            Ty::F32 => "f32",
            Ty::I32 => "i32",
            Ty::U32 => "u32",
            Ty::Bool => "bool",
            _ => "vec2<u32>",
        }
    }

    fn wide(self) -> bool {
        matches!(self, Ty::I64 | Ty::U64)
    }

    /// The array element of a binding read one value at a time (packed: the word holding it).
    fn storage(self) -> &'static str {
        match self {
            Ty::F32 | Ty::I32 => self.scalar(),
            _ => "u32",
        }
    }

    /// The array element of a binding read four values at a time (f32, i32, u32, bool).
    fn storage4(self) -> &'static str {
        match self {
            Ty::F32 => "vec4<f32>",
            Ty::I32 => "vec4<i32>",
            _ => "vec4<u32>",
        }
    }

    /// WGSL turning the raw bits `raw` (u32, high bits clear) of a packed element into its
    /// value.
    fn unpack(self, raw: &str) -> String {
        match self {
            Ty::Bool => format!("{raw} != 0u"),
            Ty::I8 => format!("bitcast<i32>({raw} << 24u) >> 24u"),
            Ty::I16 => format!("bitcast<i32>({raw} << 16u) >> 16u"),
            Ty::F16 => format!("h2f({raw})"),
            _ => raw.into(),
        }
    }

    /// WGSL turning value `v` into the bits of a packed element (integers wrap).
    fn pack(self, v: &str) -> String {
        match self {
            Ty::Bool => format!("select(0u, 1u, {v})"),
            Ty::I8 => format!("(bitcast<u32>({v}) & 0xffu)"),
            Ty::I16 => format!("(bitcast<u32>({v}) & 0xffffu)"),
            Ty::U8 => format!("({v} & 0xffu)"),
            Ty::U16 => format!("({v} & 0xffffu)"),
            Ty::F16 => format!("f2h({v})"),
            _ => v.into(),
        }
    }

    /// WGSL bringing computed value `v` back to the values of this type: f16 rounds, 8- and
    /// 16-bit integers wrap.
    fn narrow(self, v: &str) -> String {
        match self {
            Ty::F16 => format!("h2f(f2h({v}))"),
            Ty::I8 => format!("((({v}) << 24u) >> 24u)"),
            Ty::I16 => format!("((({v}) << 16u) >> 16u)"),
            Ty::U8 => format!("(({v}) & 0xffu)"),
            Ty::U16 => format!("(({v}) & 0xffffu)"),
            _ => v.into(),
        }
    }

    /// The word of a value of this type (not a 64-bit one) as Rust's `as` makes it (the
    /// CPU's bounds): integers wrap, floats saturate and round (f16: to an f16 value, as f32).
    fn word(self, v: f64, int: Option<i64>) -> u32 {
        let int_as = |wrap: fn(i64) -> i64, sat: fn(f64) -> i64| int.map_or(sat(v), wrap);
        match self {
            Ty::F32 => (int.map_or(v, |i| i as f64) as f32).to_bits(),
            Ty::F16 => half::f16::from_f64(int.map_or(v, |i| i as f64)).to_f32().to_bits(),
            Ty::I8 => int_as(|i| i64::from(i as i8), |v| i64::from(v as i8)) as u32,
            Ty::I16 => int_as(|i| i64::from(i as i16), |v| i64::from(v as i16)) as u32,
            Ty::I32 => int_as(|i| i64::from(i as i32), |v| i64::from(v as i32)) as u32,
            Ty::U8 => int_as(|i| i64::from(i as u8), |v| i64::from(v as u8)) as u32,
            Ty::U16 => int_as(|i| i64::from(i as u16), |v| i64::from(v as u16)) as u32,
            Ty::U32 => int_as(|i| i64::from(i as u32), |v| i64::from(v as u32)) as u32,
            Ty::Bool => u32::from(int.map_or(v, |i| i as f64) != 0.0),
            Ty::I64 | Ty::U64 => self.wide_bits(v, int) as u32,
        }
    }

    fn wide_bits(self, v: f64, int: Option<i64>) -> u64 {
        match (int, self) {
            (Some(i), _) => i as u64,
            (None, Ty::I64) => v as i64 as u64,
            (None, _) => v as u64,
        }
    }

    /// A WGSL literal of this type, as [`word`](Ty::word) makes it.
    fn lit(self, v: f64, int: Option<i64>) -> String {
        let w = self.word(v, int);
        match self.compute() {
            Ty::F32 => f32_lit(f32::from_bits(w)),
            Ty::I32 => format!("bitcast<i32>({w}u)"),
            Ty::U32 => format!("{w}u"),
            Ty::Bool => (w != 0).to_string(),
            _ => {
                let bits = self.wide_bits(v, int);
                format!("vec2<u32>({}u, {}u)", bits as u32, (bits >> 32) as u32)
            }
        }
    }

    /// The WGSL expression of the op's constant `k` (push-constant word `p.k<k>`), a value of
    /// this type (not a 64-bit one or bool) made by [`word`](Ty::word).
    fn constant(self, k: usize) -> String {
        match self.compute() {
            Ty::F32 => format!("bitcast<f32>(p.k{k})"),
            Ty::I32 => format!("bitcast<i32>(p.k{k})"),
            _ => format!("p.k{k}"),
        }
    }

    fn zero(self) -> &'static str {
        match self.compute() {
            Ty::F32 => "0.0",
            Ty::I32 => "0i",
            Ty::U32 => "0u",
            Ty::Bool => "false",
            _ => "vec2<u32>(0u)",
        }
    }
}

/// The op's expression over `a0`, `a1`, `a2` (the hook `op`), and what it needs.
struct Body {
    expr: String,
    /// How `a0` is computed from `r0`, the first input as read, where it is not that.
    read: Option<String>,
    /// Whether it calls the helpers of `float.wgsl`.
    float: bool,
    /// The words of the constants `p.k0`, `p.k1` it reads.
    consts: Vec<u32>,
}

impl Body {
    fn of(expr: impl Into<String>) -> Body {
        Body { expr: expr.into(), read: None, float: false, consts: Vec::new() }
    }

    /// An expression that calls `float.wgsl`.
    fn float(expr: impl Into<String>) -> Body {
        Body { float: true, ..Body::of(expr) }
    }
}

const COMPARE: &[(&str, &str)] = &[
    ("Equal", "=="),
    ("Greater", ">"),
    ("GreaterOrEqual", ">="),
    ("Less", "<"),
    ("LessOrEqual", "<="),
];

pub fn lower(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    let [out] = cx.outputs else {
        return Err(no_kernel!("{} with {} outputs", cx.op, cx.outputs.len()));
    };
    if cx.inputs.is_empty() || cx.inputs.len() > MAX_INPUTS {
        return Err(no_kernel!(
            "{} of {} inputs (the kernels take 1 to {MAX_INPUTS})",
            cx.op,
            cx.inputs.len()
        ));
    }
    if cx.op == "Cast" && cx.attrs.int_or("bfloat16", 0).unwrap_or(1) == 0 {
        let (from, to) = (cx.inputs[0].desc.dtype, out.desc.dtype);
        if let Some((a, y, body)) = byte_cast(from, to, cx)? {
            return broadcast(cx, &[a], y, &body);
        }
    }
    let ty = |o: &Operand| Ty::of(o.desc.dtype).ok_or_else(|| cx.dtype(o.desc.dtype));
    let args = cx.inputs.iter().map(ty).collect::<Result<Vec<_>, _>>()?;
    let out_ty = ty(out)?;
    let body = body(cx, &args, out_ty)?;
    broadcast(cx, &args, out_ty, &body)
}

/// A cast from or to a type Ingot holds one value per byte and no kernel computes in
/// (minifloats, 2- and 4-bit integers), as the CPU's: the byte is read as an 8-bit integer and
/// decoded, or the value encoded and stored as one. `None` for other types.
fn byte_cast(from: DType, to: DType, cx: &KernelCx) -> Result<Option<(Ty, Ty, Body)>, NoKernel> {
    let small_int = |d: DType| d.packed_bits().filter(|_| !d.is_float());
    let (src, dst) = (Format::of(from), Format::of(to));
    if src.is_none() && dst.is_none() && small_int(from).is_none() && small_int(to).is_none() {
        return Ok(None);
    }
    let kernel_ty = |d: DType| Ty::of(d).ok_or_else(|| cx.dtype(d));
    // Whether the expression calls `float.wgsl`.
    let mut float = src.is_some() || dst.is_some();
    // The source as a kernel type, and how its value (`r0` as read) becomes `a0`.
    let (a, read, a_value) = match (src, small_int(from)) {
        (Some(f), _) => (Ty::U8, Some(f.wgsl_decode("r0")), Ty::F32),
        // A small integer's byte is the 8-bit integer of the same value.
        (None, Some(_)) if from == DType::I4 || from == DType::I2 => (Ty::I8, None, Ty::I8),
        (None, Some(_)) => (Ty::U8, None, Ty::U8),
        (None, None) => (kernel_ty(from)?, None, kernel_ty(from)?),
    };
    let (y, expr) = match (dst, small_int(to)) {
        (Some(f), _) => {
            let (saturate, rounding) = cast_mode(cx.attrs).map_err(|e| no_kernel!("Cast: {e}"))?;
            let value = cast(a_value, Ty::F32)?;
            float |= value.float;
            (Ty::U8, f.wgsl_encode(&format!("({})", value.expr), saturate, rounding))
        }
        (None, Some(bits)) => {
            let signed = to == DType::I4 || to == DType::I2;
            let y = if signed { Ty::I8 } else { Ty::U8 };
            let t = y.compute().scalar();
            let expr = if a_value.compute() == Ty::F32 {
                // Truncated; out of range (or NaN) is 0, as ONNX's reference.
                let levels = (1u32 << bits) as f32;
                let (lo, hi) =
                    if signed { (-levels / 2.0, levels / 2.0 - 1.0) } else { (0.0, levels - 1.0) };
                format!(
                    "select({}, {t}(trunc(a0)), trunc(a0) >= {} && trunc(a0) <= {})",
                    y.zero(),
                    f32_lit(lo),
                    f32_lit(hi)
                )
            } else {
                // Integers wrap: the low bits, sign-extended for a signed type.
                let low = cast(a_value, y.compute())?;
                float |= low.float;
                match signed {
                    true => format!("(({}) << {1}u) >> {1}u", low.expr, 32 - bits),
                    false => format!("({}) & {}u", low.expr, (1u32 << bits) - 1),
                }
            };
            (y, expr)
        }
        (None, None) => {
            let body = cast(a_value, kernel_ty(to)?)?;
            float |= body.float;
            (kernel_ty(to)?, body.expr)
        }
    };
    Ok(Some((a, y, Body { read, float, ..Body::of(expr) })))
}

/// The expression of `op` over inputs of types `args`, giving `out`, or why there is none.
fn body(cx: &KernelCx, args: &[Ty], out: Ty) -> Result<Body, NoKernel> {
    let op = cx.op;
    let refuse = || no_kernel!("{op} of {args:?} to {out:?}");
    let arity = |n: usize| {
        if args.len() == n { Ok(()) } else { Err(no_kernel!("{op} with {} inputs", args.len())) }
    };
    // `a` the first input's type, `c` the type it computes in.
    let a = args[0];
    let c = a.compute();
    let same = args.iter().all(|&t| t == a);
    let numeric = same && a != Ty::Bool && out == a;
    if let Some((_, cmp)) = COMPARE.iter().find(|(name, _)| *name == op) {
        arity(2)?;
        if !same || out != Ty::Bool {
            return Err(refuse());
        }
        let lt = if a == Ty::I64 { "lt_i64" } else { "lt_u64" };
        return Ok(Body::of(match (c, op) {
            (Ty::Bool, _) => format!("u32(a0) {cmp} u32(a1)"),
            (Ty::I64 | Ty::U64, "Equal") => "all(a0 == a1)".into(),
            (Ty::I64 | Ty::U64, "Less") => format!("{lt}(a0, a1)"),
            (Ty::I64 | Ty::U64, "Greater") => format!("{lt}(a1, a0)"),
            (Ty::I64 | Ty::U64, "LessOrEqual") => format!("!{lt}(a1, a0)"),
            (Ty::I64 | Ty::U64, _) => format!("!{lt}(a0, a1)"),
            _ => format!("a0 {cmp} a1"),
        }));
    }
    match op {
        "Where" => {
            arity(3)?;
            if a != Ty::Bool || args[1] != out || args[2] != out {
                return Err(refuse());
            }
            Ok(Body::of("select(a2, a1, a0)"))
        }
        "Cast" => {
            arity(1)?;
            if cx.attrs.int_or("bfloat16", 0).unwrap_or(1) != 0 {
                return match (a, out) {
                    (Ty::F32, Ty::F32) => Ok(Body::float("round_bf16(a0)")),
                    _ => Err(refuse()),
                };
            }
            cast(a, out)
        }
        "Not" | "And" | "Or" | "Xor" => {
            arity(if op == "Not" { 1 } else { 2 })?;
            if !same || a != Ty::Bool || out != Ty::Bool {
                return Err(refuse());
            }
            Ok(Body::of(match op {
                "Not" => "!a0",
                "And" => "a0 && a1",
                "Or" => "a0 || a1",
                _ => "a0 != a1",
            }))
        }
        "IsNaN" | "IsInf" => {
            arity(1)?;
            if c != Ty::F32 || out != Ty::Bool {
                return Err(refuse());
            }
            if op == "IsNaN" {
                return Ok(Body::float("is_nan(a0)"));
            }
            let flag = |name| cx.attrs.int(name).map_err(|e| no_kernel!("{op}: {e}"));
            let expr = match (flag("detect_negative")? != 0, flag("detect_positive")? != 0) {
                (true, true) => "is_inf(a0)",
                (true, false) => "is_inf(a0) && a0 < 0.0",
                (false, true) => "is_inf(a0) && a0 > 0.0",
                (false, false) => "false",
            };
            Ok(Body::float(expr))
        }
        "BitShift" => {
            arity(2)?;
            if !numeric || c == Ty::F32 {
                return Err(refuse());
            }
            let width = a.bits().unwrap_or(32);
            let left = match cx.attrs.text("direction") {
                Ok("LEFT") => true,
                Ok("RIGHT") => false,
                other => return Err(no_kernel!("BitShift direction {other:?}")),
            };
            // As the CPU: an amount that is negative or of the width or more shifts everything
            // out, leaving 0, or -1 for a negative value shifted right. (WGSL would take the
            // amount modulo 32.)
            Ok(Body::of(match (c, left) {
                (Ty::U32, true) => format!("select(a0 << a1, 0u, a1 >= {width}u)"),
                (Ty::U32, false) => format!("select(a0 >> a1, 0u, a1 >= {width}u)"),
                (Ty::I32, true) => {
                    format!("select(a0 << u32(a1), 0i, a1 < 0i || a1 >= {width}i)")
                }
                (Ty::I32, false) => {
                    format!("select(a0 >> u32(a1), min(sign(a0), 0i), a1 < 0i || a1 >= {width}i)")
                }
                // A high word set: a negative or huge amount.
                (_, true) => "shl64(a0, select(a1.x, 64u, a1.y != 0u))".into(),
                (_, false) => format!("shr64(a0, select(a1.x, 64u, a1.y != 0u), {})", c == Ty::I64),
            }))
        }
        "BitwiseAnd" | "BitwiseOr" | "BitwiseXor" | "BitwiseNot" => {
            arity(if op == "BitwiseNot" { 1 } else { 2 })?;
            if !numeric || c == Ty::F32 {
                return Err(refuse());
            }
            // On the computed type: sign-extended 8- and 16-bit values stay sign-extended, and
            // vec2<u32> takes the operators word by word.
            Ok(Body::of(match op {
                "BitwiseAnd" => "a0 & a1",
                "BitwiseOr" => "a0 | a1",
                "BitwiseXor" => "a0 ^ a1",
                _ => "~a0",
            }))
        }
        "Pow" => {
            arity(2)?;
            if !matches!(a, Ty::F32 | Ty::F16 | Ty::I32) || out != a || args[1] == Ty::Bool {
                return Err(refuse());
            }
            let e = match args[1].compute() {
                Ty::F32 => "a1",
                Ty::I64 => "l2f(a1)",
                Ty::U64 => "ul2f(a1)",
                _ => "f32(a1)",
            };
            Ok(if a == Ty::I32 {
                Body::float(format!("ipow(a0, {e})"))
            } else {
                Body::float(format!("pow_f(a0, {e})"))
            })
        }
        "Add" | "Sub" | "Mul" | "Div" | "Mod" | "PRelu" | "SwiGLU" => {
            arity(2)?;
            if !numeric {
                return Err(refuse());
            }
            binary(cx, c)
        }
        "Max" | "Min" | "Sum" | "Mean" => {
            if !numeric {
                return Err(refuse());
            }
            variadic(op, a, args.len())
        }
        _ => {
            arity(1)?;
            if !numeric {
                return Err(refuse());
            }
            unary(cx, a)
        }
    }
}

/// ONNX Cast between the kernel types, as the CPU's.
fn cast(from: Ty, to: Ty) -> Result<Body, NoKernel> {
    let narrow = match to {
        Ty::I8 => Some((-128.0, 127.0)),
        Ty::I16 => Some((-32768.0, 32767.0)),
        Ty::U8 => Some((0.0, 255.0)),
        Ty::U16 => Some((0.0, 65535.0)),
        _ => None,
    };
    if let (Ty::F32, Some((lo, hi))) = (from.compute(), narrow) {
        // Float to a narrow integer saturates to its range (NaN to 0), as Rust's `as`.
        let t = to.scalar();
        return Ok(Body::float(format!(
            "select({t}(clamp(a0, {}, {})), {}, is_nan(a0))",
            f32_lit(lo),
            f32_lit(hi),
            to.zero()
        )));
    }
    let (from, to) = (from.compute(), to.compute());
    Ok(match (from, to) {
        (f, t) if f == t => Body::of("a0"),
        (Ty::Bool, t) => Body::of(format!("select({}, {}, a0)", t.zero(), t.lit(1.0, Some(1)))),
        (Ty::F32, Ty::Bool) => Body::of("!(a0 == 0.0)"), // NaN is true
        (Ty::I64 | Ty::U64, Ty::Bool) => Body::of("any(a0 != vec2<u32>(0u))"),
        (f, Ty::Bool) => Body::of(format!("a0 != {}", f.zero())),
        // Between i64 and u64, and to 32 bits, the low bits stay.
        (Ty::I64 | Ty::U64, Ty::I64 | Ty::U64) => Body::of("a0"),
        (Ty::I64, Ty::F32) => Body::of("l2f(a0)"),
        (Ty::U64, Ty::F32) => Body::of("ul2f(a0)"),
        (Ty::I64 | Ty::U64, t) => Body::of(format!("bitcast<{}>(a0.x)", t.scalar())),
        (Ty::F32, Ty::I64) => Body::of("f2l(a0)"),
        (Ty::F32, Ty::U64) => Body::of("f2ul(a0)"),
        (Ty::I32, Ty::I64 | Ty::U64) => Body::of("i2l(a0)"),
        (Ty::U32, Ty::I64 | Ty::U64) => Body::of("vec2<u32>(a0, 0u)"),
        (Ty::F32, Ty::I32) => Body::float("f2i(a0)"),
        (Ty::F32, Ty::U32) => Body::float("f2u(a0)"),
        (_, Ty::F32) => Body::of("f32(a0)"),
        // Between i32 and u32 the bits stay.
        (_, t) => Body::of(format!("bitcast<{}>(a0)", t.scalar())),
    })
}

/// Unary ops on one numeric type.
fn unary(cx: &KernelCx, real: Ty) -> Result<Body, NoKernel> {
    let op = cx.op;
    let t = real.compute();
    let x = "a0";
    if op == "Clip" {
        return clip(cx, real);
    }
    if t.wide() {
        let neg = "neg64(a0)";
        return Ok(Body::of(match (op, t) {
            ("Abs", Ty::I64) => format!("select(a0, sub64(vec2<u32>(0u), a0), {neg})"),
            ("Neg", _) => "sub64(vec2<u32>(0u), a0)".into(),
            ("Sign", Ty::I64) => format!(
                "select(select(vec2<u32>(0u), vec2<u32>(1u, 0u), any(a0 != vec2<u32>(0u))), vec2<u32>(0xffffffffu), {neg})"
            ),
            ("Relu", Ty::I64) => format!("select(a0, vec2<u32>(0u), {neg})"),
            ("Abs" | "Relu", _) => "a0".into(),
            ("Sign", _) => {
                "select(vec2<u32>(0u), vec2<u32>(1u, 0u), any(a0 != vec2<u32>(0u)))".into()
            }
            _ => return Err(no_kernel!("{op} on {t:?}")),
        }));
    }
    if t != Ty::F32 {
        return Ok(Body::of(match (op, t) {
            ("Abs", Ty::I32) => "abs(a0)".to_string(), // abs(i32::MIN) stays, as wrapping_abs
            ("Neg", Ty::I32) => "-a0".into(),
            ("Sign", Ty::I32) => "sign(a0)".into(),
            ("Relu", Ty::I32) => "max(a0, 0i)".into(),
            ("Abs" | "Relu", Ty::U32) => "a0".into(),
            ("Neg", Ty::U32) => "0u - a0".into(),
            ("Sign", Ty::U32) => "min(a0, 1u)".into(),
            _ => return Err(no_kernel!("{op} on {t:?}")),
        }));
    }
    // Attributes are the constants k0, k1 of the push constants: one module serves every value.
    let mut consts = Vec::new();
    let mut attr = |name: &str| -> Result<String, NoKernel> {
        let v = cx.attrs.float(name).map_err(|e| no_kernel!("{op}: {e}"))?;
        consts.push(v.to_bits());
        Ok(Ty::F32.constant(consts.len() - 1))
    };
    let expr = match op {
        "LeakyRelu" => {
            let alpha = attr("alpha")?;
            format!("select({x}, {alpha} * {x}, {x} < 0.0)")
        }
        "ThresholdedRelu" => {
            let alpha = attr("alpha")?;
            format!("select(0.0, {x}, {x} > {alpha})")
        }
        "Shrink" => {
            let (bias, lambd) = (attr("bias")?, attr("lambd")?);
            format!(
                "select(select(0.0, {x} - {bias}, {x} > {lambd}), {x} + {bias}, {x} < -{lambd})"
            )
        }
        "Elu" => {
            let alpha = attr("alpha")?;
            format!("select({x}, {alpha} * (exp({x}) - 1.0), {x} < 0.0)")
        }
        "Selu" => {
            let (alpha, gamma) = (attr("alpha")?, attr("gamma")?);
            format!("{gamma} * select({alpha} * (exp({x}) - 1.0), {x}, {x} > 0.0)")
        }
        "Celu" => {
            let a = attr("alpha")?;
            format!("max({x}, 0.0) + min({a} * (exp({x} / {a}) - 1.0), 0.0)")
        }
        "HardSigmoid" => {
            let (alpha, beta) = (attr("alpha")?, attr("beta")?);
            format!("min(max({alpha} * {x} + {beta}, 0.0), 1.0)")
        }
        "Swish" => swish(x, &attr("alpha")?),
        "Gelu" => match cx.attrs.text("approximate") {
            Ok("none") => gelu(x, false),
            Ok("tanh") => gelu(x, true),
            other => return Err(no_kernel!("Gelu approximate {other:?}")),
        },
        op => unary_expr(op, x).ok_or_else(|| no_kernel!("no Vulkan kernel for {op}"))?,
    };
    Ok(Body { consts, ..Body::of(expr) })
}

/// Clip to the `min` and `max` attributes (ints or floats, converted as the CPU does): the
/// constants k0 and k1, or literals for 64-bit types (two words each).
fn clip(cx: &KernelCx, t: Ty) -> Result<Body, NoKernel> {
    if cx.inputs.len() > 1 {
        return Err(no_kernel!("Clip with a bound computed at run time (the CPU runs it)"));
    }
    let bound = |name: &str| match cx.attrs.get(name) {
        Some(&AttrValue::Int(v)) => Ok((v as f64, Some(v))),
        Some(&AttrValue::Float(v)) => Ok((v, None)),
        _ => Err(no_kernel!("Clip {name} is not a number")),
    };
    let ((lo, lo_int), (hi, hi_int)) = (bound("min")?, bound("max")?);
    if t.wide() {
        let (lo, hi) = (t.lit(lo, lo_int), t.lit(hi, hi_int));
        let lt = if t == Ty::I64 { "lt_i64" } else { "lt_u64" };
        return Ok(Body::of(format!(
            "select(select(a0, {lo}, {lt}(a0, {lo})), {hi}, {lt}({hi}, a0) || {lt}({hi}, {lo}))"
        )));
    }
    let (k0, k1) = (t.constant(0), t.constant(1));
    // NaN passes; with min > max everything becomes max, as ONNX says.
    Ok(Body {
        consts: vec![t.word(lo, lo_int), t.word(hi, hi_int)],
        ..Body::of(format!("select(select(a0, {k0}, a0 < {k0}), {k1}, a0 > {k1} || {k0} > {k1})"))
    })
}

fn binary(cx: &KernelCx, t: Ty) -> Result<Body, NoKernel> {
    let fmod = || match cx.attrs.int("fmod") {
        Ok(v @ (0 | 1)) => Ok(v == 1),
        other => Err(no_kernel!("Mod fmod {other:?}")),
    };
    Ok(match (cx.op, t) {
        ("Add", Ty::I64 | Ty::U64) => Body::of("add64(a0, a1)"),
        ("Sub", Ty::I64 | Ty::U64) => Body::of("sub64(a0, a1)"),
        ("Mul", Ty::I64 | Ty::U64) => Body::of("mul64(a0, a1)"),
        ("PRelu", Ty::I64) => Body::of("select(a0, mul64(a0, a1), neg64(a0))"),
        ("PRelu", Ty::U64) => Body::of("a0"),
        ("Div", Ty::I64) => Body::of("sdiv64(a0, a1)[0]"),
        ("Div", Ty::U64) => Body::of("udiv64(a0, a1)[0]"),
        ("Mod", Ty::U64) => {
            fmod()?;
            Body::of("udiv64(a0, a1)[1]")
        }
        ("Mod", Ty::I64) => {
            let r = "sdiv64(a0, a1)[1]";
            if fmod()? {
                Body::of(r)
            } else {
                // Python's %: a remainder of the other sign than the divisor moves by it.
                Body::of(format!(
                    "select({r}, add64({r}, a1), any({r} != vec2<u32>(0u)) && neg64({r}) != neg64(a1))"
                ))
            }
        }
        ("Add", _) => Body::of("a0 + a1"),
        ("Sub", _) => Body::of("a0 - a1"),
        ("Mul", _) => Body::of("a0 * a1"),
        ("Div", Ty::F32) => Body::of("a0 / a1"),
        // By 0 the CPU gives 0, and i32::MIN / -1 wraps; neither may reach the hardware.
        ("Div", Ty::I32) => Body::of(
            "select(select(a0 / select(a1, 1i, a1 == 0i || a1 == -1i), -a0, a1 == -1i), 0i, a1 == 0i)",
        ),
        ("Div", _) => Body::of("select(a0 / select(a1, 1u, a1 == 0u), 0u, a1 == 0u)"),
        ("PRelu", Ty::F32) => Body::of("select(a0, a0 * a1, a0 < 0.0)"),
        // Swish(a0) · a1, alpha the push constant k0 (as the unary ops' attributes).
        ("SwiGLU", Ty::F32) => {
            let alpha = cx.attrs.float("alpha").map_err(|e| no_kernel!("SwiGLU: {e}"))?;
            let gate = swish("a0", &Ty::F32.constant(0));
            Body { consts: vec![alpha.to_bits()], ..Body::float(format!("{gate} * a1")) }
        }
        ("SwiGLU", _) => return Err(no_kernel!("SwiGLU on {t:?}")),
        ("PRelu", Ty::I32) => Body::of("select(a0, a0 * a1, a0 < 0i)"),
        ("PRelu", _) => Body::of("a0"),
        ("Mod", Ty::F32) => {
            if fmod()? {
                Body::float("fmod_f(a0, a1)")
            } else {
                // Python's %: the remainder takes the divisor's sign.
                let r = "fmod_f(a0, a1)";
                Body::float(format!(
                    "select({r}, {r} + a1, {r} != 0.0 && ({r} < 0.0) != (a1 < 0.0))"
                ))
            }
        }
        ("Mod", Ty::I32) => {
            // x % -1 is 0 (and i32::MIN % -1 must not reach the hardware); by 0 the CPU gives 0.
            let r = "select(a0 % select(a1, 1i, a1 == 0i || a1 == -1i), 0i, a1 == 0i)";
            if fmod()? {
                Body::of(r)
            } else {
                Body::of(format!("select({r}, {r} + a1, {r} != 0i && ({r} < 0i) != (a1 < 0i))"))
            }
        }
        ("Mod", _) => {
            fmod()?;
            Body::of("select(a0 % select(a1, 1u, a1 == 0u), 0u, a1 == 0u)")
        }
        (op, _) => return Err(no_kernel!("no Vulkan kernel for {op}")),
    })
}

/// Max, Min, Sum, Mean of `n` inputs, folded left to right as on the CPU.
fn variadic(op: &str, real: Ty, n: usize) -> Result<Body, NoKernel> {
    let t = real.compute();
    let lt = if t == Ty::I64 { "lt_i64" } else { "lt_u64" };
    let mut acc = "a0".to_string();
    for k in 1..n {
        if k > 1 {
            // The CPU rounds (f16) or wraps (8 and 16 bits) each step.
            acc = real.narrow(&acc);
        }
        acc = match (op, t) {
            ("Max", Ty::I64 | Ty::U64) => format!("select({acc}, a{k}, {lt}({acc}, a{k}))"),
            ("Min", Ty::I64 | Ty::U64) => format!("select({acc}, a{k}, {lt}(a{k}, {acc}))"),
            ("Sum" | "Mean", Ty::I64 | Ty::U64) => format!("add64({acc}, a{k})"),
            ("Max", Ty::F32) => format!("max_nan({acc}, a{k})"),
            ("Min", Ty::F32) => format!("min_nan({acc}, a{k})"),
            ("Max", _) => format!("max({acc}, a{k})"),
            ("Min", _) => format!("min({acc}, a{k})"),
            _ => format!("{acc} + a{k}"),
        };
    }
    Ok(match (op, t) {
        ("Max" | "Min", Ty::F32) => Body::float(acc),
        ("Mean", Ty::I64 | Ty::U64) => {
            let div = if t == Ty::I64 { "sdiv64" } else { "udiv64" };
            Body::of(format!("{div}({acc}, {})[0]", t.lit(n as f64, Some(n as i64))))
        }
        ("Mean", _) => Body::of(format!(
            "{} / {}",
            real.narrow(&format!("({acc})")),
            t.lit(n as f64, Some(n as i64))
        )),
        _ => Body::of(acc),
    })
}

/// Aliases and hooks of input k.
const A: [&str; MAX_INPUTS] = ["A0", "A1", "A2"];
const S: [&str; MAX_INPUTS] = ["S0", "S1", "S2"];
const LOAD: [&str; MAX_INPUTS] = ["load0", "load1", "load2"];

/// The kernel computing `y = op(x0, x1, ...)` with numpy broadcasting: inputs of types `tys`,
/// the output of type `out_ty`.
fn broadcast(
    cx: &KernelCx,
    tys: &[Ty],
    out_ty: Ty,
    body: &Body,
) -> Result<Vec<Dispatch>, NoKernel> {
    let out = &cx.outputs[0];
    let n = out.desc.elements() as u64;
    if n == 0 {
        return Ok(Vec::new());
    }
    let (len, strides) = collapse(cx)?;
    if len.len() > MAX_DIMS {
        return Err(no_kernel!(
            "{}: {} dims once collapsed (the kernels take {MAX_DIMS})",
            cx.op,
            len.len()
        ));
    }
    // The output's own strides.
    let own: Vec<u64> = len
        .iter()
        .scan(1, |p, &l| {
            let s = *p;
            *p *= l;
            Some(s)
        })
        .collect();
    if let Some(k) = cx.in_place()
        && (strides[k] != own || tys[k] != out_ty)
    {
        return Err(no_kernel!("{} in place over a broadcast or other-typed input", cx.op));
    }
    let words = cx.inputs.iter().zip(tys).chain([(out, &out_ty)]);
    if let Some((o, _)) =
        words.filter(|(_, t)| t.bits().is_some()).find(|(o, _)| o.byte_offset % 4 != 0)
    {
        return Err(no_kernel!(
            "{}: a packed tensor at byte {} is not word-aligned",
            cx.op,
            o.byte_offset
        ));
    }
    // Four elements per invocation as vectors: the innermost dim holds whole vectors, and
    // each input runs along it (aligned) or is broadcast over it.
    let unvectorised = |t: Ty| t.wide() || (t.bits().is_some() && t != Ty::Bool);
    let vector = !unvectorised(out_ty)
        && !tys.iter().any(|&t| unvectorised(t))
        && len.first().is_some_and(|l| l % 4 == 0)
        && (out_ty == Ty::Bool || out.aligned16())
        && cx.inputs.iter().zip(tys).zip(&strides).all(|((x, &t), s)| match s[0] {
            0 => true,
            1 => (t == Ty::Bool || x.aligned16()) && s[1..].iter().all(|s| s % 4 == 0),
            _ => false,
        });
    let packed = out_ty.bits().is_some() && !vector;
    let runs = |k: usize| strides[k].first() == Some(&1);

    let (file, suffix) = match (vector, packed) {
        (true, _) => (&MAP4, "_v4"),
        (false, true) => (&PACK, "_pack"),
        (false, false) => (&MAP, ""),
    };
    let mut spec = Spec::new(file).alias("Y", out_ty.scalar());
    let y_ty = match (vector, packed) {
        (true, _) if out_ty == Ty::Bool => "u32",
        (true, _) => out_ty.storage4(),
        _ => out_ty.storage(),
    };
    let mut bindings = vec![Binding::output("y", 0, y_ty)];
    for (k, &t) in tys.iter().enumerate() {
        let storage = match vector && runs(k) && t != Ty::Bool {
            true => t.storage4(),
            false => t.storage(),
        };
        let load = match vector {
            true => load4(k, t, runs(k)),
            false => load(k, t),
        };
        spec = spec.alias(A[k], t.scalar()).alias(S[k], storage).hook(LOAD[k], load);
        bindings.push(Binding::input(&format!("x{k}"), k, storage));
    }
    let op = match &body.read {
        None => format!("fn op(a0: A0, a1: A1, a2: A2) -> Y {{\n    return {};\n}}\n", body.expr),
        Some(read) => format!(
            "fn op(r0: A0, a1: A1, a2: A2) -> Y {{\n    let a0 = {read};\n    return {};\n}}\n",
            body.expr
        ),
    };
    spec = spec.hook("op", op);
    spec = match (vector, packed) {
        (true, _) => spec.alias("SY", y_ty).hook("store", store4(out_ty)),
        (false, true) => spec
            .hook(
                "pack",
                format!("fn pack(v: Y) -> u32 {{\n    return {};\n}}\n", out_ty.pack("v")),
            )
            .set("BITS", out_ty.bits().unwrap_or(8)),
        (false, false) => spec.alias("SY", y_ty).hook("store", store(out_ty)),
    };
    if !packed {
        spec = spec.set("DIMS", len.len().clamp(1, MAX_DIMS) as u32);
    }
    let all = || tys.iter().chain([&out_ty]);
    if body.float {
        spec = spec.library(&FLOAT);
    }
    if all().any(|t| t.wide()) {
        spec = spec.library(&WIDE);
    }
    if all().any(|&t| t == Ty::F16) {
        spec = spec.library(&F16);
    }
    if vector
        && (out_ty == Ty::Bool || tys.iter().enumerate().any(|(k, &t)| t == Ty::Bool && runs(k)))
    {
        spec = spec.library(&BYTES);
    }

    // Push-constant params: dims (padded with 1s to 4), strides (0s), then the dispatch's
    // first coordinates and the op's constants.
    let word = |v: u64| {
        u32::try_from(v).map_err(|_| no_kernel!("{}: {v} does not fit a kernel parameter", cx.op))
    };
    let dim = |d: usize| len.get(d).copied().unwrap_or(1);
    let stride = |k: usize, d: usize| strides.get(k).and_then(|s| s.get(d)).copied().unwrap_or(0);
    let consts = [0, 1].map(|i| body.consts.get(i).copied().unwrap_or(0));
    let label = format!("{}{suffix}", cx.op.to_lowercase());
    let mut dispatches = Vec::new();
    if packed {
        let per = u64::from(32 / out_ty.bits().unwrap_or(8));
        let groups = n.div_ceil(per).div_ceil(u64::from(WG));
        let mut head = vec![word(dim(0))?, word(dim(1))?, word(dim(2))?, word(n)?];
        for k in 0..MAX_INPUTS {
            for d in 0..MAX_DIMS {
                head.push(word(stride(k, d))?);
            }
        }
        for (first, count) in chunks(groups) {
            let mut params = head.clone();
            params.push(word(first * u64::from(WG))?);
            params.extend(consts);
            dispatches.push(spec.dispatch(&label, [count, 1, 1], bindings.clone(), params)?);
        }
        return Ok(dispatches);
    }
    let units = if vector { dim(0) / 4 } else { dim(0) };
    let mut head = vec![word(units)?, word(dim(1))?, word(dim(2))?];
    for k in 0..MAX_INPUTS {
        for d in usize::from(vector)..MAX_DIMS {
            head.push(word(stride(k, d))?);
        }
    }
    let planes = dim(2) * dim(3);
    for (x, gx) in chunks(units.div_ceil(u64::from(WG))) {
        for (y, gy) in chunks(dim(1)) {
            for (z, gz) in chunks(planes) {
                let mut params = head.clone();
                params.extend([word(x * u64::from(WG))?, word(y)?, word(z)?]);
                params.extend(consts);
                dispatches.push(spec.dispatch(&label, [gx, gy, gz], bindings.clone(), params)?);
            }
        }
    }
    Ok(dispatches)
}

/// `0..groups` cut into runs of at most [`MAX_GROUPS`]: (first, count).
fn chunks(groups: u64) -> impl Iterator<Item = (u64, u32)> {
    let max = u64::from(MAX_GROUPS);
    (0..groups.div_ceil(max)).map(move |c| (c * max, (groups - c * max).min(max) as u32))
}

/// The output's dims collapsed, innermost first: dims of 1 dropped, neighbours merged where
/// every input steps over them as one; each dim's length, and each input's strides along them
/// (0 where it is broadcast).
fn collapse(cx: &KernelCx) -> Result<(Vec<u64>, Vec<Vec<u64>>), NoKernel> {
    let shape = &cx.outputs[0].desc.shape;
    // Outermost first while merging.
    let mut dims: Vec<(u64, Vec<u64>)> = Vec::new();
    for (d, &len) in shape.iter().enumerate() {
        if len == 1 {
            continue;
        }
        let mut strides = Vec::with_capacity(cx.inputs.len());
        for x in cx.inputs {
            let s = &x.desc.shape;
            let misfit = || no_kernel!("{} input {s:?} does not broadcast to {shape:?}", cx.op);
            let skip = shape.len().checked_sub(s.len()).ok_or_else(misfit)?;
            let stride = match d.checked_sub(skip) {
                None => 0,
                Some(j) if s[j] == 1 => 0,
                Some(j) if s[j] == len => s[j + 1..].iter().product::<usize>() as u64,
                Some(_) => return Err(misfit()),
            };
            strides.push(stride);
        }
        let len = len as u64;
        match dims.last_mut() {
            Some((l, outer)) if outer.iter().zip(&strides).all(|(&o, &s)| o == s * len) => {
                *l *= len;
                *outer = strides;
            }
            _ => dims.push((len, strides)),
        }
    }
    dims.reverse();
    let len = dims.iter().map(|(l, _)| *l).collect();
    let strides = (0..cx.inputs.len()).map(|k| dims.iter().map(|(_, s)| s[k]).collect()).collect();
    Ok((len, strides))
}

/// Hook `load<k>` of `map.wgsl` and `pack.wgsl`: element `e` of input k, of type `t`.
fn load(k: usize, t: Ty) -> String {
    let v = match t {
        Ty::F32 | Ty::I32 | Ty::U32 => format!("x{k}[p.x{k} + e]"),
        Ty::I64 | Ty::U64 => {
            format!("vec2<u32>(x{k}[p.x{k} + 2u * e], x{k}[p.x{k} + 2u * e + 1u])")
        }
        t => unpacked(k, t, "e"),
    };
    format!("fn load{k}(e: u32) -> A{k} {{\n    return {v};\n}}\n")
}

/// Hook `load<k>` of `map4.wgsl`: input k's 4 elements at vector `c0` of a row starting at
/// element `r` when it runs along the row, else its element `r`, 4 times.
fn load4(k: usize, t: Ty, runs: bool) -> String {
    let v = match (runs, t) {
        (true, Ty::Bool) => format!("bytes4(x{k}[p.x{k} + c0 + r / 4u])"),
        (true, _) => format!("x{k}[p.x{k} + c0 + r / 4u]"),
        (false, Ty::Bool) => format!("vec4<bool>({})", unpacked(k, t, "r")),
        (false, _) => format!("vec4<A{k}>(x{k}[p.x{k} + r])"),
    };
    format!("fn load{k}(c0: u32, r: u32) -> vec4<A{k}> {{\n    return {v};\n}}\n")
}

/// Element `e` (a WGSL u32 expression) of packed input k.
fn unpacked(k: usize, t: Ty, e: &str) -> String {
    let bits = t.bits().unwrap_or(32);
    let per = 32 / bits;
    let mask = (1u64 << bits) - 1;
    t.unpack(&format!("((x{k}[p.x{k} + {e} / {per}u] >> (({e} % {per}u) * {bits}u)) & {mask:#x}u)"))
}

/// Hook `store` of `map.wgsl`.
fn store(t: Ty) -> String {
    let body = match t.wide() {
        true => "y[p.y + 2u * e] = v.x;\n    y[p.y + 2u * e + 1u] = v.y;",
        false => "y[p.y + e] = v;",
    };
    format!("fn store(e: u32, v: Y) {{\n    {body}\n}}\n")
}

/// Hook `store` of `map4.wgsl`: bools pack into a word.
fn store4(t: Ty) -> String {
    let v = if t == Ty::Bool { "pack4(v)" } else { "v" };
    format!("fn store(c: u32, v: vec4<Y>) {{\n    y[p.y + c] = {v};\n}}\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TensorDesc;
    use crate::vulkan::{DeviceClass, compile, lower_f32_all_classes};
    use ingot_schema::{AttrValue, Attrs};

    fn f32s(shape: &[usize], byte_offset: u64) -> Operand {
        Operand::arena(TensorDesc::new(DType::F32, shape), byte_offset)
    }

    /// Compiles a dispatch's module and checks that the dispatch fits it: the slots it binds,
    /// the params it pushes, its workgroup counts, and a module of at most 64 KiB.
    fn check(d: &Dispatch) {
        let c = compile(&d.wgsl, &d.overrides)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", d.label, d.wgsl));
        assert!(d.bindings.len() as u32 <= c.slots, "{}", d.label);
        assert_eq!(d.params.len() as u32, c.push_words - c.slots, "{}", d.label);
        assert!(c.push_words <= 32, "{}: {} push-constant words", d.label, c.push_words);
        assert!(
            d.groups.iter().all(|&g| (1..=MAX_GROUPS).contains(&g)),
            "{}: {:?}",
            d.label,
            d.groups
        );
        assert_eq!(c.workgroup_size, [WG, 1, 1]);
        let bytes = c.spirv.len() * 4;
        assert!(bytes <= 64 << 10, "{}: {bytes} bytes of SPIR-V", d.label);
    }

    fn cx<'a>(
        op: &'a str,
        attrs: &'a Attrs,
        inputs: &'a [Operand],
        outputs: &'a [Operand],
    ) -> KernelCx<'a> {
        KernelCx { class: DeviceClass::Any, op, name: "t", attrs, inputs, outputs }
    }

    /// Lowers one step and checks every dispatch against its compiled module.
    fn lower_ok(op: &str, attrs: &Attrs, inputs: &[Operand], output: Operand) -> Vec<Dispatch> {
        let outputs = [output];
        let ds = lower(&cx(op, attrs, inputs, &outputs)).unwrap_or_else(|e| panic!("{op}: {e}"));
        ds.iter().for_each(check);
        ds
    }

    fn refused(op: &str, attrs: &Attrs, inputs: &[Operand], output: Operand) -> String {
        let outputs = [output];
        match lower(&cx(op, attrs, inputs, &outputs)) {
            Ok(_) => panic!("{op} has a kernel"),
            Err(e) => e.0,
        }
    }

    /// Input count, input type and output type of each op in the tests.
    fn signature(op: &str) -> (usize, DType, DType) {
        let (f, b) = (DType::F32, DType::Bool);
        match op {
            "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Mod" | "PRelu" | "SwiGLU" => (2, f, f),
            "Max" | "Min" | "Sum" | "Mean" => (3, f, f),
            "Equal" | "Greater" | "GreaterOrEqual" | "Less" | "LessOrEqual" => (2, f, b),
            "And" | "Or" | "Xor" => (2, b, b),
            "Not" => (1, b, b),
            "IsNaN" | "IsInf" => (1, f, b),
            "BitShift" | "BitwiseAnd" | "BitwiseOr" | "BitwiseXor" => (2, DType::U32, DType::U32),
            "BitwiseNot" => (1, DType::I32, DType::I32),
            "Where" => (3, b, f),
            _ => (1, f, f),
        }
    }

    fn attrs_of(op: &str) -> Attrs {
        let f = |v: f64| AttrValue::Float(v);
        let int = |v: i64| AttrValue::Int(v);
        match op {
            "LeakyRelu" | "Elu" | "Celu" | "ThresholdedRelu" | "Swish" | "SwiGLU" => {
                Attrs::new().with("alpha", f(0.5))
            }
            "Selu" => Attrs::new().with("alpha", f(1.6)).with("gamma", f(1.05)),
            "HardSigmoid" => Attrs::new().with("alpha", f(0.2)).with("beta", f(0.5)),
            "Shrink" => Attrs::new().with("bias", f(0.25)).with("lambd", f(1.0)),
            "Gelu" => Attrs::new().with("approximate", AttrValue::Text("none".into())),
            "Clip" => Attrs::new().with("min", f(-1.0)).with("max", f(f64::INFINITY)),
            "Cast" => Attrs::new().with("to", int(1)),
            "Mod" => Attrs::new().with("fmod", int(0)),
            "IsInf" => Attrs::new().with("detect_negative", int(0)).with("detect_positive", int(1)),
            "BitShift" => Attrs::new().with("direction", AttrValue::Text("RIGHT".into())),
            _ => Attrs::new(),
        }
    }

    const KERNELS: [&Wgsl; 3] = [&MAP, &MAP4, &PACK];
    const LIBRARIES: [&Wgsl; 4] = [&FLOAT, &WIDE, &F16, &BYTES];

    #[test]
    fn every_wgsl_file_is_valid_alone() {
        for file in KERNELS {
            compile(file.source, &[]).unwrap_or_else(|e| panic!("{}: {e}", file.path));
        }
        // Libraries have no entry point of their own.
        for lib in LIBRARIES {
            let wgsl = format!("{}\n@compute @workgroup_size(1)\nfn main() {{}}\n", lib.source);
            compile(&wgsl, &[]).unwrap_or_else(|e| panic!("{}: {e}", lib.path));
        }
        // And those are all the family's files.
        let files: Vec<&Wgsl> = KERNELS.iter().chain(&LIBRARIES).copied().collect();
        crate::vulkan::assert_all_files_listed("elementwise", &files);
    }

    #[test]
    fn representative_steps_compile_for_both_classes() {
        let none = Attrs::new();
        type Step<'a> = (&'a str, &'a Attrs, &'a [&'a [usize]], &'a [usize]);
        let steps: [Step; 6] = [
            // PP-OCR's squeeze-excite scale (vec4 rows of 49 and rows of 49), residual adds.
            ("Mul", &none, &[&[1, 96, 14, 14], &[1, 96, 1, 1]], &[1, 96, 14, 14]),
            ("Mul", &none, &[&[1, 96, 7, 7], &[1, 96, 1, 1]], &[1, 96, 7, 7]),
            ("Add", &none, &[&[1, 24, 56, 56], &[1, 24, 56, 56]], &[1, 24, 56, 56]),
            ("Sigmoid", &none, &[&[1, 1, 224, 224]], &[1, 1, 224, 224]),
            ("Sum", &none, &[&[2, 3, 4, 5], &[2, 1, 4, 1], &[5]], &[2, 3, 4, 5]),
            ("HardSigmoid", &attrs_of("HardSigmoid"), &[&[3, 5]], &[3, 5]),
        ];
        for (op, attrs, inputs, output) in steps {
            for skew in [0, 4] {
                let ds = lower_f32_all_classes(lower, op, attrs, inputs, &[output], skew);
                ds.iter().for_each(check);
            }
        }
    }

    #[test]
    fn one_module_serves_every_shape() {
        let none = Attrs::new();
        let at = |shape: &[usize], k: u64| f32s(shape, k << 22);
        let mul = |c: usize, hw: usize| {
            let x = at(&[1, c, hw, hw], 0);
            let d = lower_ok("Mul", &none, &[x, at(&[1, c, 1, 1], 1)], at(&[1, c, hw, hw], 2));
            assert_eq!(d.len(), 1);
            d.into_iter().next().unwrap()
        };
        let (a, b) = (mul(96, 56), mul(24, 14));
        assert_eq!((&a.wgsl, &a.overrides), (&b.wgsl, &b.overrides));
        assert_ne!(a.params, b.params);
        // Attributes are constants too.
        let leaky = |alpha: f64| {
            let attrs = Attrs::new().with("alpha", AttrValue::Float(alpha));
            lower_ok("LeakyRelu", &attrs, &[at(&[7], 0)], at(&[7], 1)).remove(0)
        };
        let (a, b) = (leaky(0.1), leaky(0.2));
        assert_eq!(a.wgsl, b.wgsl);
        assert_eq!(a.params.last(), Some(&0));
        assert_eq!(a.params[a.params.len() - 2], 0.1f32.to_bits());
    }

    #[test]
    fn specialised_sources() {
        let t = |dt, shape: &[usize], at| Operand::arena(TensorDesc::new(dt, shape), at);
        let source = |op, attrs: &Attrs, inputs: &[Operand], out| {
            let d = lower_ok(op, attrs, inputs, out);
            d[0].wgsl.clone()
        };
        // Vectors with a broadcast bias; rows of 49 one element at a time.
        let bias = [f32s(&[1, 8, 16, 16], 0), f32s(&[1, 8, 1, 1], 8192)];
        insta::assert_snapshot!(
            "mul_bias_v4",
            source("Mul", &Attrs::new(), &bias, f32s(&[1, 8, 16, 16], 16384))
        );
        insta::assert_snapshot!(
            "hardsigmoid",
            source("HardSigmoid", &attrs_of("HardSigmoid"), &[f32s(&[3, 5], 0)], f32s(&[3, 5], 64))
        );
        // Packed outputs, 64-bit inputs.
        let longs = [t(DType::I64, &[5], 0), t(DType::I64, &[1], 64)];
        insta::assert_snapshot!(
            "less_i64_pack",
            source("Less", &Attrs::new(), &longs, t(DType::Bool, &[5], 128))
        );
        let to_f16 = Attrs::new().with("to", AttrValue::Int(10));
        insta::assert_snapshot!(
            "cast_f32_f16_pack",
            source("Cast", &to_f16, &[f32s(&[6], 0)], t(DType::F16, &[6], 64))
        );
        // Bool bytes as vectors.
        let inputs = [
            t(DType::Bool, &[2, 1, 8], 0),
            t(DType::I32, &[2, 3, 8], 64),
            t(DType::I32, &[8], 256),
        ];
        insta::assert_snapshot!(
            "where_i32_v4",
            source("Where", &Attrs::new(), &inputs, t(DType::I32, &[2, 3, 8], 512))
        );
    }

    #[test]
    fn every_op_compiles_scalar_and_vec4() {
        for op in crate::elementwise::OPS.iter().filter(|d| d.cpu_only.is_none()).map(|d| d.name) {
            let (arity, input, output) = signature(op);
            if op == "Where" {
                continue;
            }
            for (shape, vector) in [(&[3usize, 5][..], false), (&[2, 8][..], true)] {
                let inputs: Vec<Operand> = (0..arity)
                    .map(|k| Operand::arena(TensorDesc::new(input, shape), 256 * k as u64))
                    .collect();
                let out = Operand::arena(TensorDesc::new(output, shape), 4096);
                let d = lower_ok(op, &attrs_of(op), &inputs, out);
                assert_eq!(d.len(), 1);
                assert_eq!(d[0].label.ends_with("_v4"), vector, "{op}: {}", d[0].label);
                // Bool outputs: a word per invocation, 4 of 15 elements (the last keeps its
                // 4th byte).
                if output == DType::Bool && !vector {
                    assert!(d[0].label.ends_with("_pack"), "{}", d[0].label);
                    assert_eq!(d[0].overrides, [("BITS", 8.0)]);
                    assert_eq!(d[0].params[3], 15, "count");
                }
            }
        }
        let tanh = Attrs::new().with("approximate", AttrValue::Text("tanh".into()));
        lower_ok("Gelu", &tanh, &[f32s(&[4], 0)], f32s(&[4], 64));
    }

    #[test]
    fn integer_ops_and_casts_compile() {
        let t = |dt, shape: &[usize], at| Operand::arena(TensorDesc::new(dt, shape), at);
        for dt in [
            DType::I32,
            DType::U32,
            DType::I64,
            DType::U64,
            DType::I16,
            DType::U16,
            DType::I8,
            DType::U8,
        ] {
            for op in ["Add", "Sub", "Mul", "Div", "Mod", "PRelu", "Max", "Min", "Sum", "Mean"] {
                for fmod in [0, 1] {
                    let attrs = Attrs::new().with("fmod", AttrValue::Int(fmod));
                    let inputs = [t(dt, &[3, 4], 0), t(dt, &[4], 128)];
                    lower_ok(op, &attrs, &inputs, t(dt, &[3, 4], 256));
                }
            }
            for op in ["Abs", "Neg", "Sign", "Relu", "Clip"] {
                let attrs = Attrs::new()
                    .with("min", AttrValue::Int(-3))
                    .with("max", AttrValue::Float(f64::INFINITY));
                lower_ok(op, &attrs, &[t(dt, &[5], 0)], t(dt, &[5], 64));
            }
            for op in ["Equal", "Less", "GreaterOrEqual"] {
                let inputs = [t(dt, &[5], 0), t(dt, &[1], 64)];
                lower_ok(op, &Attrs::new(), &inputs, t(DType::Bool, &[5], 128));
            }
        }
        // Integer Clip bounds are constants, wrapped as the CPU wraps them.
        let attrs = Attrs::new().with("min", AttrValue::Int(-3)).with("max", AttrValue::Int(300));
        let d = lower_ok("Clip", &attrs, &[t(DType::I8, &[5], 0)], t(DType::I8, &[5], 64));
        assert_eq!(d[0].params[d[0].params.len() - 2..], [-3i32 as u32, 44]);
        // Every pair but float64's, minifloats and 2- and 4-bit integers too (one byte each).
        let all = DType::ALL.into_iter().filter(|&d| d != DType::F64);
        for from in all.clone() {
            for to in all.clone() {
                let attrs = Attrs::new().with("to", AttrValue::Int(to.onnx_code().into()));
                lower_ok("Cast", &attrs, &[t(from, &[6], 0)], t(to, &[6], 64));
            }
        }
        // A cast to bfloat16 (carried as f32) rounds; only from f32.
        let bf16 = Attrs::new()
            .with("to", AttrValue::Int(DType::F32.onnx_code().into()))
            .with("bfloat16", AttrValue::Int(1));
        lower_ok("Cast", &bf16, &[f32s(&[6], 0)], f32s(&[6], 64));
        refused("Cast", &bf16, &[t(DType::I32, &[6], 0)], f32s(&[6], 64));
        // Pow takes integer exponents, not integer bases.
        for e in [DType::I32, DType::I64] {
            let inputs = [f32s(&[4], 0), t(e, &[1], 64)];
            lower_ok("Pow", &Attrs::new(), &inputs, f32s(&[4], 128));
        }
        // i32 bases; shifts of every integer type.
        for e in [DType::I32, DType::F32] {
            let inputs = [t(DType::I32, &[4], 0), t(e, &[4], 64)];
            lower_ok("Pow", &Attrs::new(), &inputs, t(DType::I32, &[4], 128));
        }
        for dt in [DType::I8, DType::U16, DType::I32, DType::U64, DType::I64] {
            for dir in ["LEFT", "RIGHT"] {
                let attrs = Attrs::new().with("direction", AttrValue::Text(dir.into()));
                let inputs = [t(dt, &[4], 0), t(dt, &[4], 64)];
                lower_ok("BitShift", &attrs, &inputs, t(dt, &[4], 128));
            }
            for op in ["BitwiseAnd", "BitwiseOr", "BitwiseXor"] {
                let inputs = [t(dt, &[4], 0), t(dt, &[1], 64)];
                lower_ok(op, &Attrs::new(), &inputs, t(dt, &[4], 128));
            }
            lower_ok("BitwiseNot", &Attrs::new(), &[t(dt, &[4], 0)], t(dt, &[4], 128));
        }
        // Where moves 64-bit values.
        let inputs = [t(DType::Bool, &[4], 0), t(DType::I64, &[4], 64), t(DType::I64, &[1], 128)];
        lower_ok("Where", &Attrs::new(), &inputs, t(DType::I64, &[4], 256));
    }

    #[test]
    fn f16_computes_in_f32_packed_two_to_a_word() {
        let h = |shape: &[usize], at| Operand::arena(TensorDesc::new(DType::F16, shape), at);
        for op in crate::elementwise::OPS.iter().filter(|d| d.cpu_only.is_none()).map(|d| d.name) {
            let (arity, input, output) = signature(op);
            if input != DType::F32 || op == "Where" {
                continue;
            }
            let out_dt = if output == DType::F32 { DType::F16 } else { output };
            let inputs: Vec<Operand> = (0..arity).map(|k| h(&[5], 64 * k as u64)).collect();
            let out = Operand::arena(TensorDesc::new(out_dt, [5]), 1024);
            let d = lower_ok(op, &attrs_of(op), &inputs, out);
            if out_dt == DType::F16 {
                // 3 invocations of 2 elements; the last keeps the high half of its word.
                assert_eq!(d[0].label, format!("{}_pack", op.to_lowercase()));
                assert_eq!(d[0].overrides, [("BITS", 16.0)]);
                assert_eq!((d[0].params[3], d[0].groups), (5, [1, 1, 1]));
            }
        }
        // Sum rounds each step to f16, as the CPU.
        let d =
            lower_ok("Sum", &Attrs::new(), &[h(&[4], 0), h(&[4], 64), h(&[4], 128)], h(&[4], 256));
        insta::assert_snapshot!("sum_f16_pack", d[0].wgsl);
    }

    #[test]
    fn unary_expressions_serve_post_ops() {
        for op in ["Relu", "Sigmoid", "HardSwish", "Tanh"] {
            let e = unary_expr(op, "pv").unwrap();
            let wgsl = format!(
                "fn f(pv: f32) -> f32 {{ return {e}; }}\n@compute @workgroup_size(1) fn main() {{ let v = f(1.0); }}\n"
            );
            compile(&wgsl, &[]).unwrap_or_else(|e| panic!("{op}: {e}"));
        }
        assert_eq!(unary_expr("LeakyRelu", "pv"), None, "takes a parameter");
    }

    /// The params of a `map.wgsl` or `map4.wgsl` dispatch: dims, input k's strides (4, or
    /// 3 without dim 0 for vectors), first coordinates.
    fn grid(d: &Dispatch) -> (Vec<u32>, Vec<Vec<u32>>, Vec<u32>) {
        let per = if d.label.ends_with("_v4") { 3 } else { 4 };
        let p = &d.params;
        let strides = (0..MAX_INPUTS).map(|k| p[3 + k * per..3 + (k + 1) * per].to_vec()).collect();
        let base = 3 + MAX_INPUTS * per;
        (p[..3].to_vec(), strides, p[base..base + 3].to_vec())
    }

    #[test]
    fn broadcasting_reads_each_input_at_its_strides() {
        // [2, 3, 4] + [3, 1]: b is broadcast over dims 0 and 2.
        let a = f32s(&[2, 3, 4], 0);
        let b = f32s(&[3, 1], 128);
        let d = lower_ok("Add", &Attrs::new(), &[a, b], f32s(&[2, 3, 4], 256));
        // The inner dim of 4 is one vector; b repeats along it; a row per workgroup.
        assert!(d[0].label.ends_with("_v4"), "{}", d[0].label);
        let (dims, strides, base) = grid(&d[0]);
        assert_eq!(dims, [1, 3, 2]);
        assert_eq!(strides, [vec![4, 12, 0], vec![1, 0, 0], vec![0, 0, 0]]);
        assert_eq!(base, [0, 0, 0]);
        assert_eq!(d[0].groups, [1, 3, 2]);
        let types: Vec<&str> = d[0].bindings.iter().map(|b| b.ty).collect();
        assert_eq!(types, ["vec4<f32>", "vec4<f32>", "f32"]);

        // Bias-like [1, 8, 16, 16] + [1, 8, 1, 1] stays vectorised; a misaligned full
        // operand does not.
        let x = f32s(&[1, 8, 16, 16], 0);
        let bias = f32s(&[1, 8, 1, 1], 8192);
        let d = lower_ok("Mul", &Attrs::new(), &[x, bias.clone()], f32s(&[1, 8, 16, 16], 16384));
        assert!(d[0].label.ends_with("_v4"));
        assert_eq!((grid(&d[0]).0, d[0].groups), (vec![64, 8, 1], [1, 8, 1]));
        let d = lower_ok(
            "Mul",
            &Attrs::new(),
            &[f32s(&[1, 8, 16, 16], 4), bias],
            f32s(&[1, 8, 16, 16], 16384),
        );
        assert!(!d[0].label.ends_with("_v4"));
        let (dims, strides, _) = grid(&d[0]);
        assert_eq!(
            (dims, &strides[..2]),
            (vec![256, 8, 1], &[vec![1, 256, 0, 0], vec![0, 1, 0, 0]][..])
        );

        // Four dims, the outer two sharing the grid's z.
        let d = lower_ok(
            "Sub",
            &Attrs::new(),
            &[f32s(&[2, 3, 4, 5], 0), f32s(&[2, 1, 4, 1], 512)],
            f32s(&[2, 3, 4, 5], 1024),
        );
        let (dims, strides, _) = grid(&d[0]);
        assert_eq!(dims, [5, 4, 3]);
        assert_eq!(&strides[..2], [vec![1, 5, 20, 60], vec![0, 1, 0, 4]]);
        assert_eq!(d[0].groups, [1, 4, 6]);
        // Five are too many.
        let why = refused(
            "Add",
            &Attrs::new(),
            &[f32s(&[2, 3, 4, 5, 6], 0), f32s(&[2, 1, 4, 1, 6], 4096)],
            f32s(&[2, 3, 4, 5, 6], 8192),
        );
        assert_eq!(why, "Add: 5 dims once collapsed (the kernels take 4)");

        // Odd shapes, a scalar operand and rank-0 output.
        lower_ok(
            "Sub",
            &Attrs::new(),
            &[f32s(&[], 0), f32s(&[5, 1, 3], 16)],
            f32s(&[5, 1, 3], 128),
        );
        let d = lower_ok("Pow", &Attrs::new(), &[f32s(&[], 0), f32s(&[], 16)], f32s(&[], 32));
        assert_eq!(grid(&d[0]).0, [1, 1, 1]);
        // Variadic ops take up to 3 inputs.
        let x = f32s(&[4], 0);
        let why = refused(
            "Sum",
            &Attrs::new(),
            &[x.clone(), x.clone(), x.clone(), x.clone()],
            f32s(&[4], 64),
        );
        assert_eq!(why, "Sum of 4 inputs (the kernels take 1 to 3)");
    }

    #[test]
    fn where_reads_bool_bytes_and_moves_any_4_byte_type() {
        let cond = Operand::arena(TensorDesc::new(DType::Bool, [2, 1, 8]), 0);
        let x = Operand::arena(TensorDesc::new(DType::I32, [2, 3, 8]), 64);
        let y = Operand::arena(TensorDesc::new(DType::I32, [8]), 256);
        let out = Operand::arena(TensorDesc::new(DType::I32, [2, 3, 8]), 512);
        let d =
            lower_ok("Where", &Attrs::new(), &[cond.clone(), x.clone(), y.clone()], out.clone());
        // Its source is the snapshot where_i32_v4: the condition's bytes as 4-vectors.
        assert!(d[0].label.ends_with("_v4"));
        // Odd lengths take the byte-extracting scalar path.
        let cond = Operand::arena(TensorDesc::new(DType::Bool, [3, 1]), 0);
        let d = lower_ok(
            "Where",
            &Attrs::new(),
            &[cond, f32s(&[3, 5], 64), f32s(&[1], 256)],
            f32s(&[3, 5], 512),
        );
        assert_eq!(d[0].label, "where");
        insta::assert_snapshot!("where_f32_bytes", d[0].wgsl);
        // A bool not on a word boundary cannot be read.
        let odd = Operand::arena(TensorDesc::new(DType::Bool, [2, 1, 8]), 2);
        let why = refused("Where", &Attrs::new(), &[odd, x, y], out);
        assert_eq!(why, "Where: a packed tensor at byte 2 is not word-aligned");
    }

    #[test]
    fn in_place_needs_a_full_shape_operand() {
        let attrs = Attrs::new();
        let a = f32s(&[4, 4], 0);
        let b = f32s(&[4], 64);
        let d = lower_ok("Add", &attrs, &[a.clone(), b.clone()], a.clone());
        assert_eq!(grid(&d[0]).1[0], [4, 0, 0], "a is read at the output's own index");
        // Over the broadcast operand it would read elements others overwrite.
        let outputs = [f32s(&[4, 4], 64)];
        let inputs = [a, b];
        let cx = cx("Add", &attrs, &inputs, &outputs);
        assert!(cx.in_place().is_some() && lower(&cx).is_err());
    }

    #[test]
    fn large_steps_take_several_dispatches() {
        // 65535 workgroups of 64 vectors, and 3 vectors more.
        let n = 65535 * 64 * 4 + 12;
        let d = lower_ok("Relu", &Attrs::new(), &[f32s(&[n], 0)], f32s(&[n], 0));
        assert_eq!(d.len(), 2);
        assert_eq!((d[0].groups, d[1].groups), ([65535, 1, 1], [1, 1, 1]));
        assert_eq!((grid(&d[0]).2, grid(&d[1]).2), (vec![0, 0, 0], vec![65535 * 64, 0, 0]));
        // Elements one by one: 262141 workgroups in 5 dispatches.
        let d = lower_ok("Sigmoid", &Attrs::new(), &[f32s(&[n + 1], 0)], f32s(&[n + 1], 0));
        assert!(!d[0].label.ends_with("_v4"));
        let groups: Vec<u32> = d.iter().map(|d| d.groups[0]).collect();
        assert_eq!(groups, [65535, 65535, 65535, 65535, 1]);
        // Rows past 65535 along y.
        let d = lower_ok(
            "Add",
            &Attrs::new(),
            &[f32s(&[70000, 3], 0), f32s(&[3], 1 << 20)],
            f32s(&[70000, 3], 2 << 20),
        );
        assert_eq!((d[0].groups, d[1].groups), ([1, 65535, 1], [1, 4465, 1]));
        assert_eq!(grid(&d[1]).2, [0, 65535, 0]);
        // Packed words.
        let m = 65535 * 64 * 4 + 5;
        let out = Operand::arena(TensorDesc::new(DType::Bool, [m]), 1 << 27);
        let d = lower_ok("IsNaN", &Attrs::new(), &[f32s(&[m], 0)], out);
        assert_eq!((d.len(), d[1].groups), (2, [1, 1, 1]));
        assert_eq!(d[1].params[3 + 1 + 12], 65535 * 64, "the second starts at word 65535 * 64");
    }
}
