// Resize (resize/vulkan.rs): nearest (FILTER 0, any 4-byte type moved as bits; with HALVES
// a 2-byte type, two to a u32 word), linear (1) and cubic (2, coefficient CUBIC_A) over
// float32. One invocation per output element, or with LANES 4 per four neighbours along the
// innermost axis (one vec4 store); with HALVES, LANES is 2: the two halves of one output word,
// so that no two invocations write one word.
//
// The resize has AXES axes (1 to 3, innermost first; identity axes next to each other are one,
// and axes of one element are left out). Along axis a, output index j reads source coordinate
// t / q[a] with t = p[a] * j + r[a], a map fitted to the CPU kernel at compile time (identity:
// 1, 1, 0). Nearest reads input index floor(t / q) clamped into the input. Linear and cubic
// read taps[a] input indices from ceil(t / q) - taps / 2 on (clamped), weighted by the kernel
// at s[a] * (index - t / q); with NORMALISE (antialiasing,
// exclude_outside) the weights of an axis sum to 1, and EXCLUDE_OUTSIDE weighs the indices
// outside the input 0. With CROP the outputs outside [lo[a], hi[a]) along some axis take the
// fill value (tf_crop_and_resize).

alias T = f32;
alias Y = f32;

override WG: u32 = 64u;
override AXES: u32 = 3u;
override LANES: u32 = 1u;
override FILTER: u32 = 0u;
override CUBIC_A: f32 = -0.75;
override NORMALISE: bool = false;
override EXCLUDE_OUTSIDE: bool = false;
override CROP: bool = false;
override HALVES: bool = false;

@group(0) @binding(0) var<storage, read> x: array<T>;
@group(0) @binding(1) var<storage, read_write> y: array<Y>;

struct Params {
    x: u32,
    y: u32,
    // Invocations.
    count: u32,
    fill: u32,
    n_out: array<u32, 3>,
    n_in: array<u32, 3>,
    p: array<i32, 3>,
    q: array<i32, 3>,
    r: array<i32, 3>,
    taps: array<u32, 3>,
    s: array<f32, 3>,
    lo: array<u32, 3>,
    hi: array<u32, 3>,
}
var<immediate> p: Params;

// Per axis, innermost first: the params' arrays. CPU-type devices get them as literals (the
// hook `geometry`, resize/vulkan.rs): their compiler then folds every division by them, which
// measured 1.7 times as fast on lavapipe as the fast `divmod` of run-time values.
struct Geometry {
    n_out: vec3<u32>,
    n_in: vec3<u32>,
    p: vec3<i32>,
    q: vec3<i32>,
    r: vec3<i32>,
    taps: vec3<u32>,
    s: vec3<f32>,
    lo: vec3<u32>,
    hi: vec3<u32>,
}

fn geometry() -> Geometry {
    return Geometry(
        vec3<u32>(p.n_out[0], p.n_out[1], p.n_out[2]),
        vec3<u32>(p.n_in[0], p.n_in[1], p.n_in[2]),
        vec3<i32>(p.p[0], p.p[1], p.p[2]),
        vec3<i32>(p.q[0], p.q[1], p.q[2]),
        vec3<i32>(p.r[0], p.r[1], p.r[2]),
        vec3<u32>(p.taps[0], p.taps[1], p.taps[2]),
        vec3<f32>(p.s[0], p.s[1], p.s[2]),
        vec3<u32>(p.lo[0], p.lo[1], p.lo[2]),
        vec3<u32>(p.hi[0], p.hi[1], p.hi[2]),
    );
}

fn divmod(n: u32, d: u32) -> vec2<u32> {
    return vec2<u32>(n / d, n % d);
}

// The four outputs of an invocation with LANES 4 (resize/vulkan.rs stores them as one vec4);
// one is v.x.
fn store(o: u32, v: vec4<T>) {
    y[p.y + o] = v.x;
}

// The interpolation kernel at distance u >= 0.
fn kernel(u: f32) -> f32 {
    if (FILTER == 1u) {
        return max(0.0, 1.0 - u);
    }
    let a = CUBIC_A;
    if (u <= 1.0) {
        return ((a + 2.0) * u - (a + 3.0)) * u * u + 1.0;
    }
    return select(0.0, ((a * u - 5.0 * a) * u + 8.0 * a) * u - 4.0 * a, u < 2.0);
}

// What output index j of axis a reads.
struct Read {
    // Nearest: the input offset. Linear and cubic: where the taps start, input index c, and
    // e = (ceil(t / q) - t / q) * q.
    at: u32,
    c: i32,
    e: i32,
    // Taps, and what their weights are divided by.
    count: u32,
    norm: f32,
    inside: bool,
}

// Weight k of axis a (before normalising).
fn weight(a: u32, read: Read, k: u32) -> f32 {
    let q = geometry().q[a];
    let half = i32(geometry().taps[a] / 2u);
    let d = f32(read.e + (i32(k) - half) * q) / f32(q);
    var w = kernel(abs(geometry().s[a] * d));
    let i = read.c + i32(k);
    if (EXCLUDE_OUTSIDE && (i < 0i || i >= i32(geometry().n_in[a]))) {
        w = 0.0;
    }
    return w;
}

// The input offset of tap k of axis a.
fn tap(a: u32, read: Read, k: u32, stride: u32) -> u32 {
    return u32(clamp(read.c + i32(k), 0i, i32(geometry().n_in[a]) - 1i)) * stride;
}

fn read_along(a: u32, j: u32, stride: u32) -> Read {
    var read = Read(0u, 0i, 0i, 1u, 1.0, true);
    if (CROP) {
        read.inside = j >= geometry().lo[a] && j < geometry().hi[a];
    }
    // f = floor(t / q) and m = t - f * q: the fast division where t >= 0 (all but the first
    // few outputs, if any).
    let q = geometry().q[a];
    let t = geometry().p[a] * i32(j) + geometry().r[a];
    var f = -((q - 1i - t) / q);
    if (t >= 0i) {
        f = i32(divmod(u32(t), u32(q)).x);
    }
    if (FILTER == 0u) {
        read.at = u32(clamp(f, 0i, i32(geometry().n_in[a]) - 1i)) * stride;
        return read;
    }
    let m = t - f * q;
    read.c = f + select(0i, 1i, m > 0i) - i32(geometry().taps[a] / 2u);
    read.e = select(0i, q - m, m > 0i);
    read.count = geometry().taps[a];
    if (NORMALISE) {
        var sum = 0.0;
        for (var k = 0u; k < read.count; k++) {
            sum += weight(a, read, k);
        }
        read.norm = select(sum, 1.0, sum == 0.0);
    }
    return read;
}

// The output that reads `r0` along the innermost axis and `r1`, `r2` along the others.
fn value(r0: Read, r1: Read, r2: Read, stride: vec3<u32>) -> T {
    let inside = r0.inside && r1.inside && r2.inside;
    if (FILTER == 0u) {
        let e = r0.at + r1.at + r2.at;
        if (HALVES) {
            // Element e's 16 bits, in the low half (x's words are T = u32 then).
            return bitcast<T>((bitcast<u32>(x[p.x + e / 2u]) >> (16u * (e % 2u))) & 0xffffu);
        }
        return select(bitcast<T>(p.fill), x[p.x + e], inside);
    }
    // Σ over the outermost axis's taps of its weight times the same sum over the inner ones.
    var v = 0.0;
    for (var k2 = 0u; k2 < r2.count; k2++) {
        let at2 = p.x + tap(2u, r2, k2, stride.z);
        var v1 = 0.0;
        for (var k1 = 0u; k1 < r1.count; k1++) {
            let at1 = at2 + tap(1u, r1, k1, stride.y);
            var v0 = 0.0;
            for (var k0 = 0u; k0 < r0.count; k0++) {
                let w = weight(0u, r0, k0) / r0.norm;
                v0 += w * bitcast<f32>(x[at1 + tap(0u, r0, k0, stride.x)]);
            }
            v1 += select(1.0, weight(1u, r1, k1) / r1.norm, AXES > 1u) * v0;
        }
        v += select(1.0, weight(2u, r2, k2) / r2.norm, AXES > 2u) * v1;
    }
    return bitcast<T>(select(bitcast<f32>(p.fill), v, inside));
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let o = gid.x + gid.y * groups.x * WG;
    if (o >= p.count) {
        return;
    }
    // The output's indices, innermost first (the innermost in steps of LANES), and the
    // input's strides.
    var j = vec3<u32>(o, 0u, 0u);
    var stride = vec3<u32>(1u);
    if (AXES > 1u) {
        let qr = divmod(o, geometry().n_out[0] / LANES);
        j.x = qr.y;
        j.y = qr.x;
        stride.y = geometry().n_in[0];
    }
    if (AXES > 2u) {
        let qr = divmod(j.y, geometry().n_out[1]);
        j.y = qr.y;
        j.z = qr.x;
        stride.z = geometry().n_in[0] * geometry().n_in[1];
    }
    let none = Read(0u, 0i, 0i, 1u, 1.0, true);
    var r1 = none;
    var r2 = none;
    if (AXES > 1u) {
        r1 = read_along(1u, j.y, stride.y);
    }
    if (AXES > 2u) {
        r2 = read_along(2u, j.z, stride.z);
    }
    var v = vec4<T>();
    for (var l = 0u; l < LANES; l++) {
        v[l] = value(read_along(0u, j.x * LANES + l, 1u), r1, r2, stride);
    }
    store(o, v);
}
