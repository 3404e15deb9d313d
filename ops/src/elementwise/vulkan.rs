//! Elementwise kernels: unary maps, Clip, broadcasting binary and variadic ops, Where (ops and
//! canonical attributes: ops/src/elementwise/cpu.rs, the numeric reference).
//!
//! One generator makes every kernel: the op is a WGSL function `fx` of one scalar per input,
//! and an invocation computes one output element from its inputs, each read at the output's
//! coordinates times the input's literal strides (0 along broadcast dims). Dims are collapsed
//! first, so an input of the output's shape is read at the output's own index. When the
//! innermost collapsed dim is a multiple of 4 long and every input either runs along it or is
//! broadcast over it, an invocation computes 4 elements with vec4 loads and stores.
//!
//! Types: f32 for everything; i32 and u32 for the integer ops (wrapping, division by 0 gives
//! 0, as on the CPU); bool (one byte per element) in and out: comparisons, logic, IsNaN/IsInf,
//! Where, Cast between all of these; int64 and uint64 (two words, `vec2<u32>`) for everything
//! but Pow; f16, 8- and 16-bit integers packed in u32 words, computed as f32,
//! i32 or u32 and rounded or wrapped once per op, as on the CPU. A kernel with a packed output
//! (bool, 8- and 16-bit types) writes whole words, 4 or 2 elements per invocation, keeping the
//! bytes past the tensor's end in its last word. f64 has no kernel.

use crate::no_kernel;
use crate::vulkan::{Binding, Dispatch, Grid, KernelCx, NoKernel, Operand, f32_lit, header};
use ingot_schema::{AttrValue, DType};
use std::fmt::Write;

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
        "HardSwish" => format!(
            "{x} * min(max({x} * {} + 0.5, 0.0), 1.0)",
            f32_lit(1.0 / 6.0)
        ),
        "Softplus" => softplus(x),
        "Softsign" => format!("{x} / (1.0 + abs({x}))"),
        "Mish" => format!("{x} * {}", tanh(&format!("({})", softplus(x)))),
        _ => return None,
    })
}

/// A polynomial in `z` by Horner's rule, coefficients from the constant term up.
fn horner(z: &str, coefficients: &[f64]) -> String {
    let Some((&last, rest)) = coefficients.split_last() else {
        return "0.0".into();
    };
    rest.iter().rev().fold(f32_lit(last as f32), |s, &c| {
        format!("{} + {z} * ({s})", f32_lit(c as f32))
    })
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
    let a = [
        0.0,
        0.254829592,
        -0.284496736,
        1.421413741,
        -1.453152027,
        1.061405429,
    ];
    let poly = horner(&t, &a);
    let far = format!("sign({x}) * (1.0 - ({poly}) * exp(-{x} * {x}))");
    // 2/√π Σ (-1)ⁿ x²ⁿ / (n! (2n + 1)), n = 0..5.
    let k = std::f64::consts::FRAC_2_SQRT_PI;
    let taylor = [
        1.0,
        -1.0 / 3.0,
        1.0 / 10.0,
        -1.0 / 42.0,
        1.0 / 216.0,
        -1.0 / 1320.0,
    ]
    .map(|c| c * k);
    near_zero(x, &far, 0.5, &taylor)
}

/// ln(1 + e^x) without overflow, and accurate where e^-|x| is tiny.
fn softplus(x: &str) -> String {
    let e = format!("exp(-abs({x}))");
    // ln(1 + e) = e - e²/2 + e³/3 - ... below 0.1 (7 terms: error < 2e-8 relative), where
    // 1 + e would round e off.
    let log1p = format!(
        "select(log(1.0 + {e}), {e} * ({}), {e} < 0.1)",
        horner(
            &e,
            &[
                1.0,
                -1.0 / 2.0,
                1.0 / 3.0,
                -1.0 / 4.0,
                1.0 / 5.0,
                -1.0 / 6.0,
                1.0 / 7.0
            ]
        )
    );
    format!("(max({x}, 0.0) + {log1p})")
}

/// WGSL helpers some op bodies call, defined when used.
const IS_NAN: &str =
    "fn is_nan(v: f32) -> bool { return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u; }\n";
const IS_INF: &str =
    "fn is_inf(v: f32) -> bool { return (bitcast<u32>(v) & 0x7fffffffu) == 0x7f800000u; }\n";
/// Max and Min as on the CPU: a NaN operand gives NaN.
const MAX_MIN: &str =
    "fn max_nan(a: f32, b: f32) -> f32 { return select(b, a, a > b || is_nan(a)); }
fn min_nan(a: f32, b: f32) -> f32 { return select(b, a, a < b || is_nan(a)); }
";
/// Pow as the CPU's f64 `powf`: negative bases take integer exponents, x^0 = 1, x^2 = x·x.
const POW: &str = "fn pow_f(a: f32, b: f32) -> f32 {
    if (b == 0.0) { return 1.0; }
    if (b == 2.0) { return a * a; }
    if (a == 0.0) { return select(0.0, bitcast<f32>(0x7f800000u), b < 0.0); }
    let m = exp2(b * log2(abs(a)));
    if (a > 0.0 || is_nan(a)) { return m; }
    if (trunc(b) != b) { return bitcast<f32>(0x7fc00000u); }
    return select(m, -m, trunc(b * 0.5) != b * 0.5);
}
";
/// Pow of an i32 base, as the CPU's f64 `powf` then `as i32`: integer exponents exactly
/// (saturating where the power is out of range), others through f32.
const IPOW: &str = "fn ipow(a: i32, e: f32) -> i32 {
    if (trunc(e) != e || abs(e) >= 2147483648.0) { return f2i(pow_f(f32(a), e)); }
    let est = pow_f(f32(a), e);
    if (est >= 2147483648.0) { return 2147483647i; }
    if (est < -2147483648.0) { return bitcast<i32>(0x80000000u); }
    var n = i32(e);
    if (n < 0) {
        if (a == 0i) { return 2147483647i; }
        if (a == -1i) { return select(1i, -1i, (n & 1i) != 0i); }
        return select(0i, 1i, a == 1i);
    }
    var r = 1i;
    var b = a;
    for (; n > 0; n = n >> 1u) {
        if ((n & 1i) != 0i) { r = r * b; }
        b = b * b;
    }
    return r;
}
";
/// C's fmod: the remainder has the dividend's sign; a finite dividend is its own remainder
/// by an infinite divisor.
const FMOD: &str = "fn fmod_f(a: f32, b: f32) -> f32 {
    if (is_inf(b) && !is_inf(a) && !is_nan(a)) { return a; }
    return a - b * trunc(a / b);
}
";
/// Float to integer as Rust's `as` (the CPU's Cast): toward zero, saturating, NaN to 0.
const F2I: &str = "fn f2i(v: f32) -> i32 {
    if (is_nan(v)) { return 0i; }
    if (v >= 2147483648.0) { return 2147483647i; }
    return i32(max(v, -2147483648.0));
}
fn f2u(v: f32) -> u32 {
    if (is_nan(v)) { return 0u; }
    if (v >= 4294967296.0) { return 4294967295u; }
    return u32(max(v, 0.0));
}
";
/// 64-bit integers as `vec2<u32>` (low word first): wrapping arithmetic, order, conversions
/// as the CPU's (int to float rounds, float to int truncates and saturates, NaN to 0).
const WIDE: &str = "fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}
fn sub64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}
fn mul32(a: u32, b: u32) -> vec2<u32> {
    let p00 = (a & 0xffffu) * (b & 0xffffu);
    let p01 = (a & 0xffffu) * (b >> 16u);
    let p10 = (a >> 16u) * (b & 0xffffu);
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    let hi = (a >> 16u) * (b >> 16u) + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u);
    return vec2<u32>((p00 & 0xffffu) | (mid << 16u), hi);
}
fn mul64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let p = mul32(a.x, b.x);
    return vec2<u32>(p.x, p.y + a.x * b.y + a.y * b.x);
}
fn neg64(a: vec2<u32>) -> bool { return bitcast<i32>(a.y) < 0i; }
fn lt_i64(a: vec2<u32>, b: vec2<u32>) -> bool {
    let ah = bitcast<i32>(a.y);
    let bh = bitcast<i32>(b.y);
    return ah < bh || (ah == bh && a.x < b.x);
}
fn lt_u64(a: vec2<u32>, b: vec2<u32>) -> bool { return a.y < b.y || (a.y == b.y && a.x < b.x); }
fn shl64(a: vec2<u32>, n: u32) -> vec2<u32> {
    if (n >= 64u) { return vec2<u32>(0u); }
    if (n >= 32u) { return vec2<u32>(0u, a.x << (n - 32u)); }
    if (n == 0u) { return a; }
    return vec2<u32>(a.x << n, (a.y << n) | (a.x >> (32u - n)));
}
fn shr64(a: vec2<u32>, n: u32, arith: bool) -> vec2<u32> {
    let fill = select(0u, 0xffffffffu, arith && bitcast<i32>(a.y) < 0i);
    let hi = select(a.y >> min(n, 31u), bitcast<u32>(bitcast<i32>(a.y) >> min(n, 31u)), arith);
    if (n >= 64u) { return vec2<u32>(fill); }
    if (n >= 32u) {
        let s = select(a.y >> (n - 32u), bitcast<u32>(bitcast<i32>(a.y) >> (n - 32u)), arith);
        return vec2<u32>(s, fill);
    }
    if (n == 0u) { return a; }
    return vec2<u32>((a.x >> n) | (a.y << (32u - n)), hi);
}
// Quotient and remainder by shift and subtract; by 0 both are 0, as on the CPU.
fn udiv64(a: vec2<u32>, b: vec2<u32>) -> array<vec2<u32>, 2> {
    var q = vec2<u32>(0u);
    var r = vec2<u32>(0u);
    if (all(b == vec2<u32>(0u))) { return array<vec2<u32>, 2>(q, r); }
    for (var i = 63i; i >= 0i; i = i - 1i) {
        r = shl64(r, 1u);
        r.x = r.x | (select(a.x, a.y, i >= 32i) >> (u32(i) % 32u)) & 1u;
        if (!lt_u64(r, b)) {
            r = sub64(r, b);
            q = q | select(vec2<u32>(1u << (u32(i) % 32u), 0u), vec2<u32>(0u, 1u << (u32(i) % 32u)), i >= 32i);
        }
    }
    return array<vec2<u32>, 2>(q, r);
}
fn abs64(a: vec2<u32>) -> vec2<u32> { return select(a, sub64(vec2<u32>(0u), a), neg64(a)); }
// Truncating, as C: the remainder has the dividend's sign; i64::MIN / -1 wraps.
fn sdiv64(a: vec2<u32>, b: vec2<u32>) -> array<vec2<u32>, 2> {
    let d = udiv64(abs64(a), abs64(b));
    let q = select(d[0], sub64(vec2<u32>(0u), d[0]), neg64(a) != neg64(b));
    let r = select(d[1], sub64(vec2<u32>(0u), d[1]), neg64(a));
    return array<vec2<u32>, 2>(q, r);
}
fn i2l(a: i32) -> vec2<u32> { return vec2<u32>(bitcast<u32>(a), select(0u, 0xffffffffu, a < 0i)); }
fn l2f(a: vec2<u32>) -> f32 {
    if (a.y == select(0u, 0xffffffffu, bitcast<i32>(a.x) < 0i)) { return f32(bitcast<i32>(a.x)); }
    return f32(bitcast<i32>(a.y)) * 4294967296.0 + f32(a.x);
}
fn ul2f(a: vec2<u32>) -> f32 {
    if (a.y == 0u) { return f32(a.x); }
    return f32(a.y) * 4294967296.0 + f32(a.x);
}
fn f2l(v: f32) -> vec2<u32> {
    if (is_nan(v)) { return vec2<u32>(0u); }
    if (v >= 9223372036854775808.0) { return vec2<u32>(0xffffffffu, 0x7fffffffu); }
    if (v <= -9223372036854775808.0) { return vec2<u32>(0u, 0x80000000u); }
    let t = trunc(v);
    if (abs(t) < 2147483648.0) { return i2l(i32(t)); }
    // Above 2^31 t is a multiple of 2^8: both halves are exact.
    let hi = floor(t * 2.3283064365386963e-10);
    return vec2<u32>(u32(t - hi * 4294967296.0), bitcast<u32>(i32(hi)));
}
fn f2ul(v: f32) -> vec2<u32> {
    if (is_nan(v) || v <= 0.0) { return vec2<u32>(0u); }
    if (v >= 18446744073709551616.0) { return vec2<u32>(0xffffffffu); }
    let t = trunc(v);
    let hi = floor(t * 2.3283064365386963e-10);
    return vec2<u32>(u32(t - hi * 4294967296.0), u32(hi));
}
";
/// f16 bits to f32 (exact), and f32 to f16 bits rounding to nearest even (as the `half`
/// crate); WGSL's pack2x16float needs a capability not every device has.
const F16: &str = "fn h2f(h: u32) -> f32 {
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    let s = (h & 0x8000u) << 16u;
    if (e == 0u) {
        let v = f32(m) * 5.9604645e-8;
        return select(v, -v, s != 0u);
    }
    if (e == 31u) { return bitcast<f32>(s | 0x7f800000u | (m << 13u)); }
    return bitcast<f32>(s | ((e + 112u) << 23u) | (m << 13u));
}
fn f2h(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    let s = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if (a > 0x7f800000u) { return s | 0x7e00u; }
    if (a >= 0x477ff000u) { return s | 0x7c00u; }
    if (a >= 0x38800000u) {
        let r = a - 0x38000000u;
        return s | ((r + 0xfffu + ((r >> 13u) & 1u)) >> 13u);
    }
    return s | u32(round(bitcast<f32>(a) * 16777216.0));
}
";
/// Four bool bytes of a word, and back.
const BYTES: &str = "fn bytes4(w: u32) -> vec4<bool> {
    return vec4<bool>((w & 0xffu) != 0u, (w & 0xff00u) != 0u, (w & 0xff0000u) != 0u, (w & 0xff000000u) != 0u);
}
fn pack4(b: vec4<bool>) -> u32 {
    let v = select(vec4<u32>(0u), vec4<u32>(1u), b);
    return v.x | (v.y << 8u) | (v.z << 16u) | (v.w << 24u);
}
";

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
            DType::F64 => return None,
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

    fn vec4(self) -> &'static str {
        match self {
            Ty::Bool => "vec4<bool>",
            t => t.storage4(),
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

    /// A WGSL literal of this type, as Rust's `as` makes one (the CPU's bounds): integers
    /// wrap, floats saturate and round.
    fn lit(self, v: f64, int: Option<i64>) -> String {
        let int_as = |wrap: fn(i64) -> i64, sat: fn(f64) -> i64| int.map_or(sat(v), wrap);
        match self {
            Ty::F32 => f32_lit(int.map_or(v, |i| i as f64) as f32),
            Ty::F16 => f32_lit(half::f16::from_f64(int.map_or(v, |i| i as f64)).to_f32()),
            Ty::I32 | Ty::I16 | Ty::I8 => {
                let v = match self {
                    Ty::I8 => int_as(|i| i64::from(i as i8), |v| i64::from(v as i8)),
                    Ty::I16 => int_as(|i| i64::from(i as i16), |v| i64::from(v as i16)),
                    _ => int_as(|i| i64::from(i as i32), |v| i64::from(v as i32)),
                };
                format!("bitcast<i32>({}u)", v as i32 as u32)
            }
            Ty::U32 | Ty::U16 | Ty::U8 => {
                let v = match self {
                    Ty::U8 => int_as(|i| i64::from(i as u8), |v| i64::from(v as u8)),
                    Ty::U16 => int_as(|i| i64::from(i as u16), |v| i64::from(v as u16)),
                    _ => int_as(|i| i64::from(i as u32), |v| i64::from(v as u32)),
                };
                format!("{v}u")
            }
            Ty::Bool => (int.map_or(v, |i| i as f64) != 0.0).to_string(),
            Ty::I64 | Ty::U64 => {
                let bits = match (int, self) {
                    (Some(i), _) => i as u64,
                    (None, Ty::I64) => v as i64 as u64,
                    (None, _) => v as u64,
                };
                format!("vec2<u32>({}u, {}u)", bits as u32, (bits >> 32) as u32)
            }
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

/// The body of `fx` over parameters `a0`, `a1`... and the helpers it calls.
struct Body {
    expr: String,
    helpers: String,
}

impl Body {
    fn of(expr: impl Into<String>) -> Body {
        Body {
            expr: expr.into(),
            helpers: String::new(),
        }
    }

    fn with(expr: impl Into<String>, helpers: &[&str]) -> Body {
        Body {
            expr: expr.into(),
            helpers: helpers.concat(),
        }
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
    if cx.inputs.is_empty() {
        return Err(no_kernel!("{} without inputs", cx.op));
    }
    let ty = |o: &Operand| Ty::of(o.desc.dtype).ok_or_else(|| cx.dtype(o.desc.dtype));
    let args = cx.inputs.iter().map(ty).collect::<Result<Vec<_>, _>>()?;
    let out_ty = ty(out)?;
    let body = body(cx, &args, out_ty)?;
    broadcast(cx, &args, out_ty, &body)
}

/// `fx` of `op` over inputs of types `args`, giving `out`, or why there is none.
fn body(cx: &KernelCx, args: &[Ty], out: Ty) -> Result<Body, NoKernel> {
    let op = cx.op;
    let refuse = || no_kernel!("{op} of {args:?} to {out:?}");
    let arity = |n: usize| {
        if args.len() == n {
            Ok(())
        } else {
            Err(no_kernel!("{op} with {} inputs", args.len()))
        }
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
                return Ok(Body::with("is_nan(a0)", &[IS_NAN]));
            }
            let flag = |name| cx.attrs.int(name).map_err(|e| no_kernel!("{op}: {e}"));
            let expr = match (flag("detect_negative")? != 0, flag("detect_positive")? != 0) {
                (true, true) => "is_inf(a0)",
                (true, false) => "is_inf(a0) && a0 < 0.0",
                (false, true) => "is_inf(a0) && a0 > 0.0",
                (false, false) => "false",
            };
            Ok(Body::with(expr, &[IS_INF]))
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
                Body::with(format!("ipow(a0, {e})"), &[IS_NAN, POW, F2I, IPOW])
            } else {
                Body::with(format!("pow_f(a0, {e})"), &[IS_NAN, POW])
            })
        }
        "Add" | "Sub" | "Mul" | "Div" | "Mod" | "PRelu" => {
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
        return Ok(Body::with(
            format!(
                "select({t}(clamp(a0, {}, {})), {}, is_nan(a0))",
                f32_lit(lo),
                f32_lit(hi),
                to.zero()
            ),
            &[IS_NAN],
        ));
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
        (Ty::F32, Ty::I32) => Body::with("f2i(a0)", &[IS_NAN, F2I]),
        (Ty::F32, Ty::U32) => Body::with("f2u(a0)", &[IS_NAN, F2I]),
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
            ("Clip", _) => clip(cx, real)?,
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
            ("Clip", _) => clip(cx, real)?,
            _ => return Err(no_kernel!("{op} on {t:?}")),
        }));
    }
    let attr = |name: &str| {
        cx.attrs
            .float(name)
            .map(f32_lit)
            .map_err(|e| no_kernel!("{op}: {e}"))
    };
    let expr = match op {
        "Clip" => clip(cx, real)?,
        "LeakyRelu" => format!("select({x}, {} * {x}, {x} < 0.0)", attr("alpha")?),
        "ThresholdedRelu" => format!("select(0.0, {x}, {x} > {})", attr("alpha")?),
        "Elu" => format!(
            "select({x}, {} * (exp({x}) - 1.0), {x} < 0.0)",
            attr("alpha")?
        ),
        "Selu" => format!(
            "{} * select({} * (exp({x}) - 1.0), {x}, {x} > 0.0)",
            attr("gamma")?,
            attr("alpha")?
        ),
        "Celu" => {
            let a = attr("alpha")?;
            format!("max({x}, 0.0) + min({a} * (exp({x} / {a}) - 1.0), 0.0)")
        }
        "HardSigmoid" => format!(
            "min(max({} * {x} + {}, 0.0), 1.0)",
            attr("alpha")?,
            attr("beta")?
        ),
        "Gelu" => match cx.attrs.text("approximate") {
            Ok("none") => format!(
                "0.5 * {x} * (1.0 + {})",
                erf(&format!(
                    "({x} * {})",
                    f32_lit(std::f32::consts::FRAC_1_SQRT_2)
                ))
            ),
            Ok("tanh") => {
                let k = f32_lit((2.0 / std::f64::consts::PI).sqrt() as f32);
                let inner = format!("({k} * ({x} + 0.044715 * {x} * {x} * {x}))");
                format!("0.5 * {x} * (1.0 + {})", tanh(&inner))
            }
            other => return Err(no_kernel!("Gelu approximate {other:?}")),
        },
        op => unary_expr(op, x).ok_or_else(|| no_kernel!("no Vulkan kernel for {op}"))?,
    };
    Ok(Body::of(expr))
}

/// Clip to the `min` and `max` attributes (ints or floats, converted as the CPU does).
fn clip(cx: &KernelCx, t: Ty) -> Result<String, NoKernel> {
    let bound = |name: &str| match cx.attrs.get(name) {
        Some(&AttrValue::Int(v)) => Ok(t.lit(v as f64, Some(v))),
        Some(&AttrValue::Float(v)) => Ok(t.lit(v, None)),
        _ => Err(no_kernel!("Clip {name} is not a number")),
    };
    let (lo, hi) = (bound("min")?, bound("max")?);
    if t.wide() {
        let lt = if t == Ty::I64 { "lt_i64" } else { "lt_u64" };
        return Ok(format!(
            "select(select(a0, {lo}, {lt}(a0, {lo})), {hi}, {lt}({hi}, a0) || {lt}({hi}, {lo}))"
        ));
    }
    // NaN passes; with min > max everything becomes max, as ONNX says.
    Ok(format!(
        "select(select(a0, {lo}, a0 < {lo}), {hi}, a0 > {hi} || {lo} > {hi})"
    ))
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
        ("PRelu", Ty::I32) => Body::of("select(a0, a0 * a1, a0 < 0i)"),
        ("PRelu", _) => Body::of("a0"),
        ("Mod", Ty::F32) => {
            if fmod()? {
                Body::with("fmod_f(a0, a1)", &[IS_NAN, IS_INF, FMOD])
            } else {
                // Python's %: the remainder takes the divisor's sign.
                let r = "fmod_f(a0, a1)";
                Body::with(
                    format!("select({r}, {r} + a1, {r} != 0.0 && ({r} < 0.0) != (a1 < 0.0))"),
                    &[IS_NAN, IS_INF, FMOD],
                )
            }
        }
        ("Mod", Ty::I32) => {
            // x % -1 is 0 (and i32::MIN % -1 must not reach the hardware); by 0 the CPU gives 0.
            let r = "select(a0 % select(a1, 1i, a1 == 0i || a1 == -1i), 0i, a1 == 0i)";
            if fmod()? {
                Body::of(r)
            } else {
                Body::of(format!(
                    "select({r}, {r} + a1, {r} != 0i && ({r} < 0i) != (a1 < 0i))"
                ))
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
        ("Max" | "Min", Ty::F32) => Body::with(acc, &[IS_NAN, MAX_MIN]),
        ("Mean", Ty::I64 | Ty::U64) => {
            let div = if t == Ty::I64 { "sdiv64" } else { "udiv64" };
            Body::of(format!(
                "{div}({acc}, {})[0]",
                t.lit(n as f64, Some(n as i64))
            ))
        }
        ("Mean", _) => Body::of(format!(
            "{} / {}",
            real.narrow(&format!("({acc})")),
            t.lit(n as f64, Some(n as i64))
        )),
        _ => Body::of(acc),
    })
}

/// How one input is read: its type and strides over the collapsed dims.
struct Arg<'a> {
    operand: &'a Operand,
    ty: Ty,
    strides: Vec<u64>,
}

/// The kernel computing `y = fx(x0, x1, ...)` with numpy broadcasting: inputs of types
/// `tys`, the output of type `out`.
fn broadcast(
    cx: &KernelCx,
    tys: &[Ty],
    out_ty: Ty,
    body: &Body,
) -> Result<Vec<Dispatch>, NoKernel> {
    let out = &cx.outputs[0];
    let shape = &out.desc.shape;
    let n = out.desc.elements() as u64;
    if n == 0 {
        return Ok(Vec::new());
    }
    // Collapsed dims: (length, stride of each input), dims of 1 dropped, neighbours merged
    // where every input steps over them as one.
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
    // The output's own strides over the collapsed dims.
    let mut own = vec![0u64; dims.len()];
    let mut p = 1;
    for (d, (len, _)) in dims.iter().enumerate().rev() {
        own[d] = p;
        p *= len;
    }
    let args: Vec<Arg> = cx
        .inputs
        .iter()
        .zip(tys)
        .enumerate()
        .map(|(k, (operand, &ty))| Arg {
            operand,
            ty,
            strides: dims.iter().map(|(_, s)| s[k]).collect(),
        })
        .collect();
    if let Some(k) = cx.in_place()
        && (args[k].strides != own || args[k].ty != out_ty)
    {
        return Err(no_kernel!(
            "{} in place over a broadcast or other-typed input",
            cx.op
        ));
    }
    let words = args
        .iter()
        .map(|a| (a.ty, a.operand))
        .chain([(out_ty, out)]);
    if let Some((_, o)) = words
        .filter(|(t, _)| t.bits().is_some())
        .find(|(_, o)| o.byte_offset % 4 != 0)
    {
        return Err(no_kernel!(
            "{}: a packed tensor at byte {} is not word-aligned",
            cx.op,
            o.byte_offset
        ));
    }
    // Four elements per invocation as vectors: the innermost dim holds whole vectors, and
    // each input runs along it (aligned) or is broadcast over it.
    let runs = |a: &Arg| a.strides.last() == Some(&1);
    let wide = out_ty.wide() || args.iter().any(|a| a.ty.wide());
    let unvectorised = |t: Ty| t.wide() || (t.bits().is_some() && t != Ty::Bool);
    let vector = !unvectorised(out_ty)
        && !args.iter().any(|a| unvectorised(a.ty))
        && dims.last().is_some_and(|(len, _)| len % 4 == 0)
        && (out_ty == Ty::Bool || out.aligned16())
        && args.iter().all(|a| match a.strides.last() {
            Some(0) => true,
            Some(1) => {
                (a.ty == Ty::Bool || a.operand.aligned16())
                    && a.strides[..a.strides.len() - 1].iter().all(|s| s % 4 == 0)
            }
            _ => false,
        });
    // Packed outputs are written a word at a time.
    let packed = out_ty.bits().is_some();
    let per = match (vector, out_ty.bits()) {
        (false, Some(bits)) => u64::from(32 / bits),
        (true, _) => 4,
        (false, None) => 1,
    };
    let count = n.div_ceil(per);
    let grid = Grid::new(count, 64)?;

    let mut bindings = Vec::with_capacity(args.len() + 1);
    for (k, a) in args.iter().enumerate() {
        let t = if vector && runs(a) && a.ty != Ty::Bool {
            a.ty.storage4()
        } else {
            a.ty.storage()
        };
        bindings.push(Binding::input(&format!("x{k}"), k, t));
    }
    let y_ty = if vector && !packed {
        out_ty.storage4()
    } else {
        out_ty.storage()
    };
    bindings.push(Binding::output("y", 0, y_ty));

    let mut s = header(&bindings);
    if vector && (packed || args.iter().any(|a| a.ty == Ty::Bool)) {
        s.push_str(BYTES);
    }
    if out_ty == Ty::F16 || args.iter().any(|a| a.ty == Ty::F16) {
        s.push_str(F16);
    }
    // Helpers once each, in a fixed order.
    let mut seen = Vec::new();
    for h in [IS_NAN, IS_INF, MAX_MIN, POW, FMOD, F2I, IPOW, WIDE] {
        let wanted = body.helpers.contains(h) || (wide && (h == IS_NAN || h == WIDE));
        if wanted && !seen.contains(&h) {
            seen.push(h);
            s.push_str(h);
        }
    }
    let params: Vec<String> = args
        .iter()
        .enumerate()
        .map(|(k, a)| format!("a{k}: {}", a.ty.scalar()))
        .collect();
    let _ = writeln!(
        s,
        "fn fx({}) -> {} {{\n    return {};\n}}",
        params.join(", "),
        out_ty.scalar(),
        body.expr
    );
    // Coordinate d of element `i`.
    let coord = |d: usize| -> String {
        let (len, _) = dims[d];
        match (d, own[d]) {
            (0, 1) => "i".into(),
            (0, p) => format!("(i / {p}u)"),
            (_, 1) => format!("(i % {len}u)"),
            (_, p) => format!("((i / {p}u) % {len}u)"),
        }
    };
    let offset = |a: &Arg| -> String {
        if a.strides == own {
            return "i".into();
        }
        let terms: Vec<String> = (0..dims.len())
            .filter(|&d| a.strides[d] != 0)
            .map(|d| match a.strides[d] {
                1 => coord(d),
                st => format!("{} * {st}u", coord(d)),
            })
            .collect();
        if terms.is_empty() {
            "0u".into()
        } else {
            terms.join(" + ")
        }
    };
    // Packed input k's value at element offset o{k}.
    let unpack = |k: usize, t: Ty| {
        let bits = t.bits().unwrap_or(32);
        let per = 32 / bits;
        let raw = format!(
            "((x{k}[offsets.x{k} + o{k} / {per}u] >> ((o{k} % {per}u) * {bits}u)) & {:#x}u)",
            (1u64 << bits) - 1
        );
        t.unpack(&raw)
    };
    let args_of = |lane: &str| -> String {
        let p: Vec<String> = (0..args.len())
            .map(|k| {
                if vector && runs(&args[k]) {
                    format!("a{k}{lane}")
                } else {
                    format!("a{k}")
                }
            })
            .collect();
        format!("fx({})", p.join(", "))
    };
    if !vector {
        // Element i, read at each input's offset.
        let _ = writeln!(s, "fn at(i: u32) -> {} {{", out_ty.scalar());
        for (k, a) in args.iter().enumerate() {
            let _ = writeln!(s, "    let o{k} = {};", offset(a));
            let load = match a.ty {
                t if t.bits().is_some() => unpack(k, t),
                Ty::I64 | Ty::U64 => format!(
                    "vec2<u32>(x{k}[offsets.x{k} + o{k} * 2u], x{k}[offsets.x{k} + o{k} * 2u + 1u])"
                ),
                _ => format!("x{k}[offsets.x{k} + o{k}]"),
            };
            let _ = writeln!(s, "    let a{k} = {load};");
        }
        let _ = writeln!(s, "    return {};\n}}", args_of(""));
    }
    let _ = writeln!(s, "{} {{", grid.entry());
    let _ = writeln!(s, "    let g = {};", grid.index());
    let _ = writeln!(s, "    if (g >= {count}u) {{ return; }}");
    if vector {
        let _ = writeln!(s, "    let i = g * 4u;");
        for (k, a) in args.iter().enumerate() {
            let _ = writeln!(s, "    let o{k} = {};", offset(a));
            let load = match (a.ty, runs(a)) {
                (Ty::Bool, true) => format!("bytes4(x{k}[offsets.x{k} + o{k} / 4u])"),
                (Ty::Bool, false) => unpack(k, Ty::Bool),
                (_, true) => format!("x{k}[offsets.x{k} + o{k} / 4u]"),
                (_, false) => format!("x{k}[offsets.x{k} + o{k}]"),
            };
            let _ = writeln!(s, "    let a{k} = {load};");
        }
        let lanes: Vec<String> = [".x", ".y", ".z", ".w"]
            .iter()
            .map(|l| args_of(l))
            .collect();
        let v = format!("{}({})", out_ty.vec4(), lanes.join(", "));
        let v = if packed { format!("pack4({v})") } else { v };
        let _ = writeln!(s, "    y[offsets.y + g] = {v};");
    } else if packed {
        let bits = 32 / per;
        let _ = writeln!(s, "    let i = g * {per}u;");
        let _ = writeln!(s, "    var w = 0u;");
        let _ = writeln!(
            s,
            "    for (var l = 0u; l < {per}u; l = l + 1u) {{\n        if (i + l < {n}u) {{ w = w | ({} << (l * {bits}u)); }}\n    }}",
            out_ty.pack("at(i + l)")
        );
        if !n.is_multiple_of(per) {
            // The last word keeps the bytes past the tensor's end.
            let _ = writeln!(
                s,
                "    if (i + {per}u > {n}u) {{ w = w | (y[offsets.y + g] & {:#x}u); }}",
                u32::MAX << ((n % per) * bits)
            );
        }
        let _ = writeln!(s, "    y[offsets.y + g] = w;");
    } else {
        if out_ty.wide() {
            let _ = writeln!(s, "    let v = at(g);");
            let _ = writeln!(s, "    y[offsets.y + g * 2u] = v.x;");
            let _ = writeln!(s, "    y[offsets.y + g * 2u + 1u] = v.y;");
        } else {
            let _ = writeln!(s, "    y[offsets.y + g] = at(g);");
        }
    }
    s.push_str("}\n");
    Ok(vec![Dispatch {
        label: format!(
            "{}_{n}{}",
            cx.op.to_lowercase(),
            if vector { "_v4" } else { "" }
        ),
        wgsl: s,
        groups: grid.groups,
        bindings,
        ..Default::default()
    }])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TensorDesc;
    use crate::vulkan::{DeviceClass, compile};
    use ingot_schema::{AttrValue, Attrs};

    fn f32s(shape: &[usize], byte_offset: u64) -> Operand {
        Operand::arena(TensorDesc::new(DType::F32, shape), byte_offset)
    }

    /// Lowers one step and checks that every kernel passes naga's validation.
    fn lower_ok(op: &str, attrs: &Attrs, inputs: &[Operand], output: Operand) -> Vec<Dispatch> {
        let outputs = [output];
        let cx = KernelCx {
            class: DeviceClass::Any,
            op,
            name: "t",
            attrs,
            inputs,
            outputs: &outputs,
        };
        let ds = lower(&cx).unwrap_or_else(|e| panic!("{op}: {e}"));
        for d in &ds {
            compile(&d.wgsl, &[]).unwrap_or_else(|e| panic!("{op}: {e}\n{}", d.wgsl));
        }
        ds
    }

    /// Input count, input type and output type of each op in the tests.
    fn signature(op: &str) -> (usize, DType, DType) {
        let (f, b) = (DType::F32, DType::Bool);
        match op {
            "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Mod" | "PRelu" => (2, f, f),
            "Max" | "Min" | "Sum" | "Mean" => (3, f, f),
            "Equal" | "Greater" | "GreaterOrEqual" | "Less" | "LessOrEqual" => (2, f, b),
            "And" | "Or" | "Xor" => (2, b, b),
            "Not" => (1, b, b),
            "IsNaN" | "IsInf" => (1, f, b),
            "BitShift" => (2, DType::U32, DType::U32),
            "Where" => (3, b, f),
            _ => (1, f, f),
        }
    }

    fn attrs_of(op: &str) -> Attrs {
        let f = |v: f64| AttrValue::Float(v);
        let int = |v: i64| AttrValue::Int(v);
        match op {
            "LeakyRelu" | "Elu" | "Celu" | "ThresholdedRelu" => Attrs::new().with("alpha", f(0.5)),
            "Selu" => Attrs::new().with("alpha", f(1.6)).with("gamma", f(1.05)),
            "HardSigmoid" => Attrs::new().with("alpha", f(0.2)).with("beta", f(0.5)),
            "Gelu" => Attrs::new().with("approximate", AttrValue::Text("none".into())),
            "Clip" => Attrs::new()
                .with("min", f(-1.0))
                .with("max", f(f64::INFINITY)),
            "Cast" => Attrs::new().with("to", int(1)),
            "Mod" => Attrs::new().with("fmod", int(0)),
            "IsInf" => Attrs::new()
                .with("detect_negative", int(0))
                .with("detect_positive", int(1)),
            "BitShift" => Attrs::new().with("direction", AttrValue::Text("RIGHT".into())),
            _ => Attrs::new(),
        }
    }

    #[test]
    fn every_op_compiles_scalar_and_vec4() {
        for op in crate::elementwise::OPS
            .iter()
            .filter(|d| d.cpu_only.is_none())
            .map(|d| d.name)
        {
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
                // Bool outputs: a word per invocation, and the last of 15 keeps its 4th byte.
                if output == DType::Bool && !vector {
                    assert!(d[0].wgsl.contains("& 0xff000000u)"), "{}", d[0].wgsl);
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
            for op in [
                "Add", "Sub", "Mul", "Div", "Mod", "PRelu", "Max", "Min", "Sum", "Mean",
            ] {
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
        let all = [
            DType::F32,
            DType::I32,
            DType::U32,
            DType::Bool,
            DType::I64,
            DType::U64,
            DType::F16,
            DType::I16,
            DType::U16,
            DType::I8,
            DType::U8,
        ];
        for from in all {
            for to in all {
                let attrs = Attrs::new().with("to", AttrValue::Int(to.onnx_code().into()));
                lower_ok("Cast", &attrs, &[t(from, &[6], 0)], t(to, &[6], 64));
            }
        }
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
        }
        // Where moves 64-bit values.
        let inputs = [
            t(DType::Bool, &[4], 0),
            t(DType::I64, &[4], 64),
            t(DType::I64, &[1], 128),
        ];
        lower_ok("Where", &Attrs::new(), &inputs, t(DType::I64, &[4], 256));
    }

    #[test]
    fn f16_computes_in_f32_packed_two_to_a_word() {
        let h = |shape: &[usize], at| Operand::arena(TensorDesc::new(DType::F16, shape), at);
        for op in crate::elementwise::OPS
            .iter()
            .filter(|d| d.cpu_only.is_none())
            .map(|d| d.name)
        {
            let (arity, input, output) = signature(op);
            if input != DType::F32 || op == "Where" {
                continue;
            }
            let out_dt = if output == DType::F32 {
                DType::F16
            } else {
                output
            };
            let inputs: Vec<Operand> = (0..arity).map(|k| h(&[5], 64 * k as u64)).collect();
            let out = Operand::arena(TensorDesc::new(out_dt, [5]), 1024);
            let d = lower_ok(op, &attrs_of(op), &inputs, out);
            if out_dt == DType::F16 {
                // 3 invocations of 2 elements; the last keeps the high half of its word.
                assert_eq!(d[0].label, format!("{}_5", op.to_lowercase()));
                assert!(d[0].wgsl.contains("& 0xffff0000u)"), "{}", d[0].wgsl);
            }
        }
        // Sum rounds each step to f16, as the CPU.
        let d = lower_ok(
            "Sum",
            &Attrs::new(),
            &[h(&[4], 0), h(&[4], 64), h(&[4], 128)],
            h(&[4], 256),
        );
        assert!(
            d[0].wgsl.contains("h2f(f2h(a0 + a1)) + a2"),
            "{}",
            d[0].wgsl
        );
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

    #[test]
    fn broadcasting_reads_each_input_at_its_strides() {
        // [2, 3, 4] + [3, 1]: b is broadcast over dims 0 and 2.
        let a = f32s(&[2, 3, 4], 0);
        let b = f32s(&[3, 1], 128);
        let d = lower_ok("Add", &Attrs::new(), &[a, b], f32s(&[2, 3, 4], 256));
        let w = &d[0].wgsl;
        // The inner dim of 4 is a vector; b repeats along it.
        assert!(d[0].label.ends_with("_v4"), "{w}");
        assert!(w.contains("let o0 = i;"), "{w}");
        assert!(w.contains("let o1 = ((i / 4u) % 3u);"), "{w}");
        assert!(w.contains("var<storage, read> x1: array<f32>"), "{w}");
        assert_eq!(d[0].groups, [1, 1, 1]);

        // Bias-like [1, 8, 16, 16] + [1, 8, 1, 1] stays vectorised; a misaligned full
        // operand does not.
        let x = f32s(&[1, 8, 16, 16], 0);
        let bias = f32s(&[1, 8, 1, 1], 8192);
        let d = lower_ok(
            "Mul",
            &Attrs::new(),
            &[x, bias.clone()],
            f32s(&[1, 8, 16, 16], 16384),
        );
        assert!(d[0].label.ends_with("_v4"));
        let d = lower_ok(
            "Mul",
            &Attrs::new(),
            &[f32s(&[1, 8, 16, 16], 4), bias],
            f32s(&[1, 8, 16, 16], 16384),
        );
        assert!(!d[0].label.ends_with("_v4"));

        // Odd shapes, a scalar operand and rank-0 output.
        lower_ok(
            "Sub",
            &Attrs::new(),
            &[f32s(&[], 0), f32s(&[5, 1, 3], 16)],
            f32s(&[5, 1, 3], 128),
        );
        lower_ok(
            "Pow",
            &Attrs::new(),
            &[f32s(&[], 0), f32s(&[], 16)],
            f32s(&[], 32),
        );
    }

    #[test]
    fn where_reads_bool_bytes_and_moves_any_4_byte_type() {
        let cond = Operand::arena(TensorDesc::new(DType::Bool, [2, 1, 8]), 0);
        let x = Operand::arena(TensorDesc::new(DType::I32, [2, 3, 8]), 64);
        let y = Operand::arena(TensorDesc::new(DType::I32, [8]), 256);
        let out = Operand::arena(TensorDesc::new(DType::I32, [2, 3, 8]), 512);
        let d = lower_ok(
            "Where",
            &Attrs::new(),
            &[cond.clone(), x.clone(), y.clone()],
            out.clone(),
        );
        assert!(d[0].label.ends_with("_v4"));
        assert!(d[0].wgsl.contains("bytes4("));
        // Odd lengths take the byte-extracting scalar path.
        let cond = Operand::arena(TensorDesc::new(DType::Bool, [3, 1]), 0);
        let x = f32s(&[3, 5], 64);
        let d = lower_ok(
            "Where",
            &Attrs::new(),
            &[cond, x, f32s(&[1], 256)],
            f32s(&[3, 5], 512),
        );
        assert!(d[0].wgsl.contains(">> ((o0 % 4u) * 8u)"), "{}", d[0].wgsl);
        // A bool not on a word boundary cannot be read.
        let odd = Operand::arena(TensorDesc::new(DType::Bool, [2, 1, 8]), 2);
        let outputs = [out];
        let inputs = [odd, f32s(&[2, 3, 8], 64), f32s(&[8], 256)];
        let attrs = Attrs::new();
        let cx = KernelCx {
            class: DeviceClass::Any,
            op: "Where",
            name: "w",
            attrs: &attrs,
            inputs: &inputs,
            outputs: &outputs,
        };
        assert!(lower(&cx).is_err());
    }

    #[test]
    fn in_place_needs_a_full_shape_operand() {
        let attrs = Attrs::new();
        let a = f32s(&[4, 4], 0);
        let b = f32s(&[4], 64);
        let d = lower_ok("Add", &attrs, &[a.clone(), b.clone()], a.clone());
        assert!(d[0].wgsl.contains("let o0 = i;"));
        // Over the broadcast operand it would read elements others overwrite.
        let outputs = [f32s(&[4, 4], 64)];
        let inputs = [a, b];
        let cx = KernelCx {
            class: DeviceClass::Any,
            op: "Add",
            name: "a",
            attrs: &attrs,
            inputs: &inputs,
            outputs: &outputs,
        };
        assert!(cx.in_place().is_some() && lower(&cx).is_err());
    }

    #[test]
    fn large_tensors_spread_over_two_grid_dimensions() {
        let n = 65535 * 64 * 4 + 12;
        let d = lower_ok("Relu", &Attrs::new(), &[f32s(&[n], 0)], f32s(&[n], 0));
        assert!(d[0].groups[1] > 1, "{:?}", d[0].groups);
        assert!(d[0].wgsl.contains("gid.y"));
        let d = lower_ok(
            "Sigmoid",
            &Attrs::new(),
            &[f32s(&[n + 1], 0)],
            f32s(&[n + 1], 0),
        );
        assert!(d[0].groups[1] > 1 && !d[0].label.ends_with("_v4"));
    }
}
