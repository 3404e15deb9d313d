// Float helpers for the elementwise ops (a library: appended to a kernel that calls them; naga
// drops what the kernel does not call). Each behaves as the CPU kernels (ops/src/elementwise/
// cpu.rs), whose numerics the Vulkan kernels follow.

fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

fn is_inf(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) == 0x7f800000u;
}

// A cast to bfloat16, which Ingot carries as f32: rounded to its 8 significant bits, ties to
// even, as cpu.rs's `round_to_bf16` (NaN stays NaN; past the largest bfloat16, infinity).
fn round_bf16(v: f32) -> f32 {
    let b = bitcast<u32>(v);
    return select(bitcast<f32>((b + 0x7fffu + ((b >> 16u) & 1u)) & 0xffff0000u), v, is_nan(v));
}

// Max and Min as on the CPU: a NaN operand gives NaN.
fn max_nan(a: f32, b: f32) -> f32 {
    return select(b, a, a > b || is_nan(a));
}

fn min_nan(a: f32, b: f32) -> f32 {
    return select(b, a, a < b || is_nan(a));
}

// Pow as the CPU's f64 `powf`: negative bases take integer exponents, x^0 = 1, x^2 = x·x.
fn pow_f(a: f32, b: f32) -> f32 {
    if (b == 0.0) { return 1.0; }
    if (b == 2.0) { return a * a; }
    if (a == 0.0) { return select(0.0, bitcast<f32>(0x7f800000u), b < 0.0); }
    let m = exp2(b * log2(abs(a)));
    if (a > 0.0 || is_nan(a)) { return m; }
    if (trunc(b) != b) { return bitcast<f32>(0x7fc00000u); }
    return select(m, -m, trunc(b * 0.5) != b * 0.5);
}

// C's fmod: the remainder has the dividend's sign; a finite dividend is its own remainder by
// an infinite divisor.
fn fmod_f(a: f32, b: f32) -> f32 {
    if (is_inf(b) && !is_inf(a) && !is_nan(a)) { return a; }
    return a - b * trunc(a / b);
}

// Float to integer as Rust's `as` (the CPU's Cast): toward zero, saturating, NaN to 0.
fn f2i(v: f32) -> i32 {
    if (is_nan(v)) { return 0i; }
    if (v >= 2147483648.0) { return 2147483647i; }
    return i32(max(v, -2147483648.0));
}

fn f2u(v: f32) -> u32 {
    if (is_nan(v)) { return 0u; }
    if (v >= 4294967296.0) { return 4294967295u; }
    return u32(max(v, 0.0));
}

// Pow of an i32 base, as the CPU's f64 `powf` then `as i32`: integer exponents exactly
// (saturating where the power is out of range), others through f32.
fn ipow(a: i32, e: f32) -> i32 {
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

// Minifloats (ops/src/minifloat.rs, whose `Format` writes the calls with its constants), one
// value per u32: `m` mantissa bits, exponent bias `bias`, the sign at bit `sign_bit`.

// 2^k for the normal range of f32 (-126 ≤ k ≤ 127), exactly.
fn pow2(k: i32) -> f32 {
    return bitcast<f32>(u32(k + 127) << 23u);
}

// floor(log2(a)) of a positive finite f32, from its bits (subnormals too).
fn exponent_of(a: f32) -> i32 {
    let b = bitcast<u32>(a);
    let field = i32(b >> 23u);
    return select(field - 127, i32(firstLeadingBit(b)) - 149, field == 0);
}

// The value of `bits`; `specials` says which codes are not numbers: 0 IEEE (the top exponent is
// infinity or NaN), 1 only all ones NaN, 2 NaN at the negative zero, 3 none.
fn mf_decode(raw: u32, m: u32, bias: i32, sign_bit: u32, specials: u32) -> f32 {
    let bits = raw & ((sign_bit << 1u) - 1u);
    let magnitude = bits & (sign_bit - 1u);
    let e = i32(magnitude >> m);
    let mantissa = magnitude & ((1u << m) - 1u);
    let negative = (bits & sign_bit) != 0u;
    if ((specials == 2u && bits == sign_bit) || (specials == 1u && magnitude == sign_bit - 1u)) {
        return bitcast<f32>(0x7fc00000u);
    }
    var v: f32;
    if (specials == 0u && e == i32((sign_bit - 1u) >> m)) {
        v = select(bitcast<f32>(0x7f800000u), bitcast<f32>(0x7fc00000u), mantissa != 0u);
    } else if (e == 0) {
        v = f32(mantissa) * pow2(1 - bias - i32(m));
    } else {
        v = (1.0 + f32(mantissa) * pow2(-i32(m))) * pow2(e - bias);
    }
    return select(v, -v, negative);
}

// `x` rounded to the nearest minifloat, ties to even: `top` its largest finite value; the codes
// `nan`, `over` (past `top`, or infinite) and `zero` for [positive, negative] `x`.
fn mf_encode(x: f32, m: u32, bias: i32, sign_bit: u32, top: f32, nan: vec2<u32>, over: vec2<u32>, zero: vec2<u32>) -> u32 {
    let negative = bitcast<u32>(x) >= 0x80000000u;
    let k = u32(negative);
    if (is_nan(x)) {
        return nan[k];
    }
    let a = abs(x);
    let min_e = 1 - bias;
    var e = min_e;
    if (a != 0.0 && !is_inf(a)) {
        e = max(exponent_of(a), min_e);
    }
    // A quotient by a power of two is exact, and `round` rounds ties to even.
    let step = pow2(min(e, 127) - i32(m));
    let q = round(a / step) * step;
    if (is_inf(a) || q > top) {
        return over[k];
    }
    if (q == 0.0) {
        return zero[k];
    }
    let sign = select(0u, sign_bit, negative);
    let qe = exponent_of(q);
    if (qe < min_e) {
        return sign | u32(q / pow2(min_e - i32(m)));
    }
    return sign | (u32(qe + bias) << m) | u32((q / pow2(qe) - 1.0) * pow2(i32(m)));
}

// FLOAT8E8M0, a power of two 2^(bits - 127), 0xff NaN.
fn e8m0_decode(bits: u32) -> f32 {
    if (bits == 0xffu) {
        return bitcast<f32>(0x7fc00000u);
    }
    return bitcast<f32>(select(bits << 23u, 0x00400000u, bits == 0u));
}

// The exponent of `x`, rounded up (`rounding` 0), down (1) or to nearest (2), as onnx's
// `to_float8e8m0`; the sign is dropped.
fn e8m0_encode(x: f32, saturate: bool, rounding: u32) -> u32 {
    let b = bitcast<u32>(x);
    let e = (b >> 23u) & 0xffu;
    if (e == 0xffu) {
        return 0xffu;
    }
    var up = false;
    if (rounding == 0u) {
        up = (b & 0x7fffffu) != 0u;
    } else if (rounding == 2u) {
        up = (b & 0x400000u) != 0u && ((b & 0x3fffffu) != 0u || e > 0u);
    }
    return select(e, e + 1u, up && !(saturate && e == 0xfeu));
}
