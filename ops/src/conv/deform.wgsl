// DeformConv (conv/vulkan.rs; the rules are conv/deform.rs's): one invocation per output
// element [image, channel, row, column], summing over its group's input channels and the
// taps the bilinear samples of X at each tap's moved place (zero outside X), times W and the
// mask (MASK), from the bias (BIAS).

override WG: u32 = 64u;
override BIAS: bool = false;
override MASK: bool = false;

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read> offset: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
// The optional operands, bound in order where present: the bias, then the mask (so the mask
// is `extra0` without a bias).
@group(0) @binding(4) var<storage, read> extra0: array<f32>;
@group(0) @binding(5) var<storage, read> extra1: array<f32>;

struct Params {
    x: u32,
    w: u32,
    offset: u32,
    y: u32,
    extra0: u32,
    extra1: u32,
    count: u32,
    c: u32,
    h: u32,
    width: u32,
    m: u32,
    kh: u32,
    kw: u32,
    oh: u32,
    ow: u32,
    stride_h: u32,
    stride_w: u32,
    dilation_h: u32,
    dilation_w: u32,
    pad_h: u32,
    pad_w: u32,
    group: u32,
    offset_group: u32,
}
var<immediate> p: Params;

fn mask_at(i: u32) -> f32 {
    if (BIAS) {
        return extra1[p.extra1 + i];
    }
    return extra0[p.extra0 + i];
}

fn pixel(plane: u32, r: f32, c: f32) -> f32 {
    if (r < 0.0 || c < 0.0 || r >= f32(p.h) || c >= f32(p.width)) {
        return 0.0;
    }
    return x[plane + u32(r) * p.width + u32(c)];
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let g = gid.x + gid.y * groups.x * WG;
    if (g >= p.count) {
        return;
    }
    let positions = p.oh * p.ow;
    let pos = g % positions;
    let m = (g / positions) % p.m;
    let image = g / (positions * p.m);
    let i = pos / p.ow;
    let j = pos % p.ow;
    let taps = p.kh * p.kw;
    let cg = p.c / p.group;
    let group = m / (p.m / p.group);
    let per_offset_group = p.c / p.offset_group;
    var acc = 0.0;
    if (BIAS) {
        acc = extra0[p.extra0 + m];
    }
    // Over the weights in order, as the CPU adds them.
    for (var k = 0u; k < cg * taps; k++) {
        let c = group * cg + k / taps;
        let t = k % taps;
        let field = (image * p.offset_group + c / per_offset_group) * taps + t;
        let dy = offset[p.offset + 2u * field * positions + pos];
        let dx = offset[p.offset + (2u * field + 1u) * positions + pos];
        let sy = f32(i * p.stride_h + (t / p.kw) * p.dilation_h) - f32(p.pad_h) + dy;
        let sx = f32(j * p.stride_w + (t % p.kw) * p.dilation_w) - f32(p.pad_w) + dx;
        let y0 = floor(sy);
        let x0 = floor(sx);
        let ly = sy - y0;
        let lx = sx - x0;
        let plane = p.x + (image * p.c + c) * p.h * p.width;
        var v = (1.0 - ly) * (1.0 - lx) * pixel(plane, y0, x0)
            + (1.0 - ly) * lx * pixel(plane, y0, x0 + 1.0)
            + ly * (1.0 - lx) * pixel(plane, y0 + 1.0, x0)
            + ly * lx * pixel(plane, y0 + 1.0, x0 + 1.0);
        if (MASK) {
            v = v * mask_at(field * positions + pos);
        }
        acc = acc + w[p.w + m * cg * taps + k] * v;
    }
    y[p.y + g] = acc;
}
