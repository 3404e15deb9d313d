// BatchNormalization (inference): y = x * a + b per channel, a = scale / sqrt(var + epsilon),
// b = bias - mean * a, as the CPU kernel folds it. The grid is (elements of a channel's
// plane, channels, batch), so an invocation knows its channel without dividing; each reads
// only the element it writes, so the step may run in place.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> scale: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read> mu: array<f32>;
@group(0) @binding(4) var<storage, read> sigma2: array<f32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

struct Params {
    x: u32,
    scale: u32,
    bias: u32,
    mu: u32,
    sigma2: u32,
    y: u32,
    // Elements per channel plane, channels, batch.
    inner: u32,
    c: u32,
    n: u32,
    epsilon: f32,
}
var<immediate> p: Params;

override WG: u32 = 64u;
// The grid covers (plane, channels, batch) in one invocation each: no dimension loops (loops
// whose trip count only the run knows cost CPU-type devices twice the time).
override FITS: bool = false;

// The element at (batch bn, channel ch, e within the plane).
fn element(bn: u32, ch: u32, e: u32) {
    let a = scale[p.scale + ch] / sqrt(sigma2[p.sigma2 + ch] + p.epsilon);
    let b = bias[p.bias + ch] - mu[p.mu + ch] * a;
    let i = (bn * p.c + ch) * p.inner + e;
    y[p.y + i] = x[p.x + i] * a + b;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    if (FITS) {
        if (gid.x < p.inner && gid.y < p.c && gid.z < p.n) {
            element(gid.z, gid.y, gid.x);
        }
        return;
    }
    for (var bn = gid.z; bn < p.n; bn += nwg.z) {
        for (var ch = gid.y; ch < p.c; ch += nwg.y) {
            for (var e = gid.x; e < p.inner; e += nwg.x * WG) {
                element(bn, ch, e);
            }
        }
    }
}
