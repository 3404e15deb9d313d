// AffineGrid (resize/vulkan.rs, on the CPU's terms: resize/grid_sample.rs): one invocation per
// output point of one image: its normalized coordinates (x, y[, z], 1), the last spatial dim's
// first, evenly spaced in [-1, 1] (pixel centres, or corners with ALIGN), times the image's
// theta, a DIMS x (DIMS + 1) matrix. float32 (the CPU computes in f64).

override WG: u32 = 64u;
override DIMS: u32 = 2u;
override ALIGN: bool = false;

@group(0) @binding(0) var<storage, read> theta: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;

struct Params {
    theta: u32,
    y: u32,
    // Output points, in all images and per image.
    count: u32,
    points: u32,
    // The spatial dims, the first first (past DIMS: 1).
    d: array<u32, 3>,
}
var<immediate> p: Params;

// The coordinate of index i along a dim of d points, as one rounding of an exact quotient.
fn coordinate(i: u32, d: u32) -> f32 {
    if (ALIGN) {
        return select((2.0 * f32(i) - f32(d - 1u)) / f32(d - 1u), -1.0, d == 1u);
    }
    return (2.0 * f32(i) + 1.0 - f32(d)) / f32(d);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let o = gid.x + gid.y * groups.x * WG;
    if (o >= p.count) {
        return;
    }
    var h = array<f32, 4>(1.0, 1.0, 1.0, 1.0);
    var rest = o % p.points;
    for (var i = DIMS; i > 0u; i--) {
        let d = p.d[i - 1u];
        h[DIMS - i] = coordinate(rest % d, d);
        rest = rest / d;
    }
    let t = p.theta + (o / p.points) * DIMS * (DIMS + 1u);
    for (var row = 0u; row < DIMS; row++) {
        var v = 0.0;
        for (var k = 0u; k <= DIMS; k++) {
            v = fma(theta[t + row * (DIMS + 1u) + k], h[k], v);
        }
        y[p.y + o * DIMS + row] = v;
    }
}
