// GridSample (resize/vulkan.rs, on the CPU's terms: resize/grid_sample.rs): one invocation per
// output element (n, c, point). The point's grid entry holds DIMS normalized coordinates, the
// last for X's first spatial dim; each becomes up to 4 taps (source index, weight) along its
// dim, padded as PADDING says, and the output sums the products of the taps' weights over
// every combination of one tap per dim, times X there.
//
// MODE: 0 nearest, 1 linear, 2 cubic (Keys, a = -0.75); PADDING: 0 zeros, 1 border,
// 2 reflection; ALIGN: align_corners. float32 throughout (the CPU reflects in f64).

override WG: u32 = 64u;
override DIMS: u32 = 2u;
override MODE: u32 = 1u;
override PADDING: u32 = 0u;
override ALIGN: bool = false;

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> grid: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

struct Params {
    x: u32,
    grid: u32,
    y: u32,
    // Output elements, channels, output points per image, input elements per channel.
    count: u32,
    channels: u32,
    points: u32,
    image: u32,
    // X's spatial dims, the first first (past DIMS: 1).
    d: array<u32, 3>,
}
var<immediate> p: Params;

// One dim's taps: source indices (-1: a zero of the padding) and weights.
struct Taps {
    index: array<i32, 4>,
    weight: array<f32, 4>,
    n: u32,
}

// `v` reflected by the nearer border until it lies in [lo, hi].
fn reflect(v: f32, lo: f32, hi: f32) -> f32 {
    let range = hi - lo;
    if (range <= 0.0) {
        return lo;
    }
    if (v < lo) {
        let dx = lo - v;
        let r = dx - trunc(dx / range) * range;
        return select(hi - r, lo + r, trunc(dx / range) % 2.0 == 0.0);
    }
    if (v > hi) {
        let dx = v - hi;
        let r = dx - trunc(dx / range) * range;
        return select(lo + r, hi - r, trunc(dx / range) % 2.0 == 0.0);
    }
    return v;
}

fn low_border() -> f32 {
    return select(-0.5, 0.0, ALIGN);
}

fn high_border(d: u32) -> f32 {
    return select(f32(d) - 0.5, f32(d) - 1.0, ALIGN);
}

// Source index i of a dim of d pixels, padded.
fn pixel(i: i32, d: u32) -> i32 {
    let last = i32(d) - 1;
    if (PADDING == 0u) {
        return select(-1, i, i >= 0 && i <= last);
    }
    if (PADDING == 1u) {
        return clamp(i, 0, last);
    }
    return clamp(i32(reflect(f32(i), low_border(), high_border(d))), 0, last);
}

// Keys' weight at distance s from the sample (a = -0.75).
fn cubic(s: f32) -> f32 {
    let a = -0.75;
    let t = abs(s);
    if (t <= 1.0) {
        return ((a + 2.0) * t - (a + 3.0)) * t * t + 1.0;
    }
    return ((a * t - 5.0 * a) * t + 8.0 * a) * t - 4.0 * a;
}

fn taps(g: f32, d: u32) -> Taps {
    var v = select(((g + 1.0) * f32(d) - 1.0) / 2.0, (g + 1.0) / 2.0 * (f32(d) - 1.0), ALIGN);
    if (MODE == 0u) {
        v = round(v);
    }
    let lo = low_border();
    let hi = high_border(d);
    if ((v < lo || v > hi) && PADDING == 1u) {
        v = clamp(v, 0.0, f32(d) - 1.0);
    }
    if ((v < lo || v > hi) && PADDING == 2u) {
        v = reflect(v, lo, hi);
    }
    var t: Taps;
    if (MODE == 0u) {
        t.index[0] = pixel(i32(v), d);
        t.weight[0] = 1.0;
        t.n = 1u;
        return t;
    }
    let v0 = floor(v);
    let f = v - v0;
    if (MODE == 1u) {
        t.index[0] = pixel(i32(v0), d);
        t.index[1] = pixel(i32(v0) + 1, d);
        t.weight[0] = 1.0 - f;
        t.weight[1] = f;
        t.n = 2u;
        return t;
    }
    for (var k = 0; k < 4; k++) {
        t.index[k] = pixel(i32(v0) - 1 + k, d);
        t.weight[k] = cubic(f - f32(k - 1));
    }
    t.n = 4u;
    return t;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let o = gid.x + gid.y * groups.x * WG;
    if (o >= p.count) {
        return;
    }
    let point = o % p.points;
    let plane = o / p.points;
    let image = plane / p.channels;
    let g = p.grid + (image * p.points + point) * DIMS;
    // Taps per dim (a dim past DIMS: one tap at 0), and the dims' strides in X.
    var along: array<Taps, 3>;
    for (var i = 0u; i < 3u; i++) {
        along[i].index[0] = 0;
        along[i].weight[0] = 1.0;
        along[i].n = 1u;
        if (i < DIMS) {
            along[i] = taps(grid[g + DIMS - 1u - i], p.d[i]);
        }
    }
    let s1 = p.d[2];
    let s0 = p.d[1] * s1;
    var sum = 0.0;
    for (var a = 0u; a < along[0].n; a++) {
        for (var b = 0u; b < along[1].n; b++) {
            for (var c = 0u; c < along[2].n; c++) {
                let i0 = along[0].index[a];
                let i1 = along[1].index[b];
                let i2 = along[2].index[c];
                if (i0 >= 0 && i1 >= 0 && i2 >= 0) {
                    let w = along[0].weight[a] * along[1].weight[b] * along[2].weight[c];
                    let e = u32(i0) * s0 + u32(i1) * s1 + u32(i2);
                    sum += w * x[p.x + plane * p.image + e];
                }
            }
        }
    }
    y[p.y + o] = sum;
}
