// MaxUnpool (pool/vulkan.rs; the rules are pool/unpool.rs's), two dispatches of this file:
// with SCATTER false one invocation per output element writes a zero, then with SCATTER true
// one per element of X puts it where its index says, its coordinates in the unpooled shape
// `inner` placed in the output's leading corner (shapes of up to 5 dims, leading dims of one).
// An index outside `inner` writes nothing (the CPU refuses it). Indices are int64, read as
// word pairs.

override WG: u32 = 64u;
override SCATTER: bool = false;

@group(0) @binding(0) var<storage, read_write> y: array<f32>;
// Bound only with SCATTER.
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> ix: array<u32>;

struct Params {
    y: u32,
    x: u32,
    ix: u32,
    count: u32,
    // The unpooled shape's elements.
    total: u32,
    inner: array<u32, 5>,
    out: array<u32, 5>,
}
var<immediate> p: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let g = gid.x + gid.y * groups.x * WG;
    if (g >= p.count) {
        return;
    }
    if (!SCATTER) {
        y[p.y + g] = 0.0;
        return;
    }
    var at = ix[p.ix + 2u * g];
    if (ix[p.ix + 2u * g + 1u] != 0u || at >= p.total) {
        return;
    }
    var coords: array<u32, 5>;
    for (var d = 4i; d >= 0i; d--) {
        coords[d] = at % p.inner[d];
        at = at / p.inner[d];
    }
    var dest = 0u;
    for (var d = 0u; d < 5u; d++) {
        dest = dest * p.out[d] + coords[d];
    }
    y[p.y + dest] = x[p.x + g];
}
