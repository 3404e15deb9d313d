// Convolution as an implicit GEMM, for GPUs (and, on CPU-type devices, the shapes the
// register-blocked kernels do not fit): per image and group, Y[m, q] = Σ_k W[m, k] col[k, q]
// with k = (input channel, tap) and col the im2col matrix, read from X on the fly and never
// stored. A workgroup of 16x16 invocations computes a 64x64 tile of Y, each invocation 4x4 of
// it, staging 64x16 tiles of W and of col in workgroup memory.
//
// Geometries are lifted to 3-D (depth, height, width); the window is an override (so a tap's
// coordinates take divisions by constants), everything else is a push-constant param.
// Specialised per dispatch (conv/vulkan.rs): the overrides and the hooks `bias` and `post_op`;
// for 8-bit weights WT and `weight`; with SCALED, `x_scale`.

override KD: u32 = 1u;
override KH: u32 = 3u;
override KW: u32 = 3u;
// X's channels are scaled by S [N, C] (one group), bound in the slot r0; the post-ops' operand
// then takes r1.
override SCALED: bool = false;

alias WT = f32;

const TM: u32 = 64u;
const TN: u32 = 64u;
const TK: u32 = 16u;

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<WT>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read> r0: array<f32>;
@group(0) @binding(5) var<storage, read> r1: array<f32>;

struct Params {
    x: u32,
    w: u32,
    y: u32,
    b: u32,
    r0: u32,
    r1: u32,
    // Input and output channels per group, groups.
    cin: u32,
    cout: u32,
    groups: u32,
    // Input and output extents.
    id: u32,
    ih: u32,
    iw: u32,
    od: u32,
    oh: u32,
    ow: u32,
    // Strides, dilations, padding at the start.
    sd: u32,
    sh: u32,
    sw: u32,
    dd: u32,
    dh: u32,
    dw: u32,
    pd: i32,
    ph: i32,
    pw: i32,
}
var<immediate> p: Params;

var<workgroup> ta: array<f32, 1024>;
var<workgroup> tb: array<f32, 1024>;

// How output channel m's weights are dequantized, (scale, zero point), which `weight` takes;
// float weights have none. conv/vulkan.rs replaces both hooks for 8-bit weights (WT u32, four
// to a word; B's binding then holds W's table), so a row's pair is loaded once.
fn weight_row(m: u32) -> vec2<f32> {
    return vec2<f32>(1.0, 0.0);
}

// Element e of W (counted from W's start), of a channel dequantized by `row`.
fn weight(e: u32, row: vec2<f32>) -> f32 {
    return w[p.w + e];
}

// The bias of output channel `m` (counted over all groups).
fn bias(m: u32) -> f32 {
    return 0.0;
}

fn post_op(v: f32, i: u32) -> f32 {
    return v;
}

// The factor of input channel c of image n (with SCALED).
fn x_scale(n: u32, c: u32) -> f32 {
    return 1.0;
}

@compute @workgroup_size(16, 16)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_id) li: vec3<u32>,
    @builtin(local_invocation_index) lx: u32,
) {
    let n = wg.z / p.groups;
    let g = wg.z % p.groups;
    let m0 = wg.y * TM;
    let p0 = wg.x * TN;
    let taps = KD * KH * KW;
    let k = p.cin * taps;
    let positions = p.od * p.oh * p.ow;
    let in_plane = p.id * p.ih * p.iw;
    // The column of col this invocation stages (the same for every element it stages), and
    // where its window starts in the input.
    let q = p0 + lx % TN;
    let oz = q / (p.oh * p.ow);
    let oy = q / p.ow % p.oh;
    let ox = q % p.ow;
    let iz0 = i32(oz * p.sd) - p.pd;
    let iy0 = i32(oy * p.sh) - p.ph;
    let ix0 = i32(ox * p.sw) - p.pw;
    let xg = p.x + (n * p.groups + g) * p.cin * in_plane;
    let wg0 = g * p.cout * k;
    var a: array<vec4<f32>, 4>;
    for (var k0 = 0u; k0 < k; k0 += TK) {
        // 256 invocations stage the 1024 elements of each tile, 4 each.
        for (var s = 0u; s < 4u; s++) {
            let e = lx + 256u * s;
            let am = m0 + e / TK;
            let ak = k0 + e % TK;
            let wm = min(am, p.cout - 1u);
            let wv = weight(wg0 + wm * k + min(ak, k - 1u), weight_row(g * p.cout + wm));
            ta[(e % TK) * TM + e / TK] = select(0.0, wv, am < p.cout && ak < k);
            // Element (kk, q) of col: input channel ci, tap t.
            let kk = k0 + e / TN;
            let ci = kk / taps;
            let t = kk % taps;
            let iz = iz0 + i32(t / (KH * KW) * p.dd);
            let iy = iy0 + i32(t / KW % KH * p.dh);
            let ix = ix0 + i32(t % KW * p.dw);
            let inside = kk < k && q < positions && iz >= 0 && iz < i32(p.id) && iy >= 0
                && iy < i32(p.ih) && ix >= 0 && ix < i32(p.iw);
            let at = min(ci, p.cin - 1u) * in_plane
                + (u32(clamp(iz, 0, i32(p.id) - 1)) * p.ih + u32(clamp(iy, 0, i32(p.ih) - 1))) * p.iw
                + u32(clamp(ix, 0, i32(p.iw) - 1));
            var xv = x[xg + at];
            if (SCALED) {
                xv *= x_scale(n, min(ci, p.cin - 1u));
            }
            tb[e] = select(0.0, xv, inside);
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
            let wa = vec4<f32>(ta[kk * TM + li.y], ta[kk * TM + li.y + 16u], ta[kk * TM + li.y + 32u], ta[kk * TM + li.y + 48u]);
            let xb = vec4<f32>(tb[kk * TN + li.x], tb[kk * TN + li.x + 16u], tb[kk * TN + li.x + 32u], tb[kk * TN + li.x + 48u]);
            for (var r = 0u; r < 4u; r++) {
                a[r] = fma(vec4<f32>(wa[r]), xb, a[r]);
            }
        }
        workgroupBarrier();
    }
    // Invocation (x, y) holds rows y + 16 r and columns x + 16 c: neighbours store neighbours.
    for (var r = 0u; r < 4u; r++) {
        let m = m0 + li.y + 16u * r;
        if (m < p.cout) {
            let row = g * p.cout + m;
            let start = bias(row);
            for (var c = 0u; c < 4u; c++) {
                let pos = p0 + li.x + 16u * c;
                if (pos < positions) {
                    let e = (n * p.cout * p.groups + row) * positions + pos;
                    y[p.y + e] = post_op(a[r][c] + start, e);
                }
            }
        }
    }
}
