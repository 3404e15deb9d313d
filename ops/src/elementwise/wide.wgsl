// 64-bit integers as `vec2<u32>` (low word first): wrapping arithmetic, order, conversions as
// the CPU's (int to float rounds, float to int truncates and saturates, NaN to 0). A library.

fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
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

fn neg64(a: vec2<u32>) -> bool {
    return bitcast<i32>(a.y) < 0i;
}

fn lt_i64(a: vec2<u32>, b: vec2<u32>) -> bool {
    let ah = bitcast<i32>(a.y);
    let bh = bitcast<i32>(b.y);
    return ah < bh || (ah == bh && a.x < b.x);
}

fn lt_u64(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.y < b.y || (a.y == b.y && a.x < b.x);
}

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

fn abs64(a: vec2<u32>) -> vec2<u32> {
    return select(a, sub64(vec2<u32>(0u), a), neg64(a));
}

// Truncating, as C: the remainder has the dividend's sign; i64::MIN / -1 wraps.
fn sdiv64(a: vec2<u32>, b: vec2<u32>) -> array<vec2<u32>, 2> {
    let d = udiv64(abs64(a), abs64(b));
    let q = select(d[0], sub64(vec2<u32>(0u), d[0]), neg64(a) != neg64(b));
    let r = select(d[1], sub64(vec2<u32>(0u), d[1]), neg64(a));
    return array<vec2<u32>, 2>(q, r);
}

fn i2l(a: i32) -> vec2<u32> {
    return vec2<u32>(bitcast<u32>(a), select(0u, 0xffffffffu, a < 0i));
}

fn l2f(a: vec2<u32>) -> f32 {
    if (a.y == select(0u, 0xffffffffu, bitcast<i32>(a.x) < 0i)) { return f32(bitcast<i32>(a.x)); }
    return f32(bitcast<i32>(a.y)) * 4294967296.0 + f32(a.x);
}

fn ul2f(a: vec2<u32>) -> f32 {
    if (a.y == 0u) { return f32(a.x); }
    return f32(a.y) * 4294967296.0 + f32(a.x);
}

fn f2l(v: f32) -> vec2<u32> {
    if ((bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u) { return vec2<u32>(0u); }
    if (v >= 9223372036854775808.0) { return vec2<u32>(0xffffffffu, 0x7fffffffu); }
    if (v <= -9223372036854775808.0) { return vec2<u32>(0u, 0x80000000u); }
    let t = trunc(v);
    if (abs(t) < 2147483648.0) { return i2l(i32(t)); }
    // Above 2^31 t is a multiple of 2^8: both halves are exact.
    let hi = floor(t * 2.3283064365386963e-10);
    return vec2<u32>(u32(t - hi * 4294967296.0), bitcast<u32>(i32(hi)));
}

fn f2ul(v: f32) -> vec2<u32> {
    if ((bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u || v <= 0.0) { return vec2<u32>(0u); }
    if (v >= 18446744073709551616.0) { return vec2<u32>(0xffffffffu); }
    let t = trunc(v);
    let hi = floor(t * 2.3283064365386963e-10);
    return vec2<u32>(u32(t - hi * 4294967296.0), u32(hi));
}
