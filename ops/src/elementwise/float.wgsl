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
