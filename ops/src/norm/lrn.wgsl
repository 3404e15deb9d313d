// LRN: y = x / (bias + alpha / size * sum x^2)^beta, the sum over the channels
// c - before ..= c + after that exist. The grid is (elements of a channel's plane, channels,
// batch): an invocation knows its channel without dividing.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;

struct Params {
    x: u32,
    y: u32,
    // Elements per channel plane, channels, batch.
    inner: u32,
    c: u32,
    n: u32,
    // The window: channels before and after.
    before: u32,
    after: u32,
    bias: f32,
    // alpha / size.
    alpha: f32,
    beta: f32,
}
var<immediate> p: Params;

override WG: u32 = 64u;
// The grid covers (plane, channels, batch) in one invocation each: no dimension loops (loops
// whose trip count only the run knows cost CPU-type devices twice the time).
override FITS: bool = false;

// The element at (batch bn, channel ch, e within the plane).
fn element(bn: u32, ch: u32, e: u32) {
    let lo = max(ch, p.before) - p.before;
    let hi = min(ch + p.after + 1u, p.c);
    let batch = bn * p.c * p.inner;
    let base = p.x + batch + e;
    var sum = 0.0;
    for (var k = lo; k < hi; k++) {
        let v = x[base + k * p.inner];
        sum += v * v;
    }
    let d = pow(p.bias + p.alpha * sum, p.beta);
    let i = batch + ch * p.inner + e;
    y[p.y + i] = x[p.x + i] / d;
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
