// Col2Im (conv/vulkan.rs; the rules are conv/col2im.rs's): one invocation per output pixel
// [plane, d0, d1, d2] (an image of fewer dims leads with dims of one), summing over the
// block's offsets in order the value of the block position that puts each offset on it, as
// the CPU sums.

override WG: u32 = 64u;

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;

struct Params {
    x: u32,
    y: u32,
    count: u32,
    // The block's elements (K) and positions (L).
    k: u32,
    l: u32,
    image: array<u32, 3>,
    block: array<u32, 3>,
    strides: array<u32, 3>,
    dilations: array<u32, 3>,
    // The pads before each dim.
    pads: array<u32, 3>,
    // The block's positions along each dim.
    along: array<u32, 3>,
}
var<immediate> p: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let g = gid.x + gid.y * groups.x * WG;
    if (g >= p.count) {
        return;
    }
    let pixels = p.image[0] * p.image[1] * p.image[2];
    let plane = g / pixels;
    var rest = g % pixels;
    var at: array<u32, 3>;
    for (var d = 2i; d >= 0i; d--) {
        at[d] = rest % p.image[d];
        rest = rest / p.image[d];
    }
    var sum = 0.0;
    for (var o = 0u; o < p.k; o++) {
        var offset = o;
        var tap: array<u32, 3>;
        for (var d = 2i; d >= 0i; d--) {
            tap[d] = offset % p.block[d] * p.dilations[d];
            offset = offset / p.block[d];
        }
        var position = 0u;
        var hit = true;
        for (var d = 0u; d < 3u; d++) {
            let shifted = at[d] + p.pads[d];
            if (shifted < tap[d] || (shifted - tap[d]) % p.strides[d] != 0u) {
                hit = false;
                break;
            }
            let b = (shifted - tap[d]) / p.strides[d];
            if (b >= p.along[d]) {
                hit = false;
                break;
            }
            position = position * p.along[d] + b;
        }
        if (hit) {
            sum += x[p.x + (plane * p.k + o) * p.l + position];
        }
    }
    y[p.y + g] = sum;
}
