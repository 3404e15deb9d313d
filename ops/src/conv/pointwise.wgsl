// Conv 1x1 with stride 1, no padding and one group, on CPU-type devices: per image the GEMM
// Y[m, q] = B[m] + Σ_c W[m, c] X[c, q] over the image's pixels q.
//
// Each invocation holds a block of ROWS output channels x 4 VECS consecutive pixels in
// registers and walks the input channels, reading X and W as 16-byte vectors where their rows
// are whole aligned vectors (X_VEC, W_VEC). CPU-type devices (lavapipe) run every load lane by
// lane: the larger the block, the more arithmetic per load. Channels and pixels past the output
// are computed from clamped (valid) addresses and not stored.
//
// Specialised per dispatch (conv/vulkan.rs): the overrides; XT, WT and YT (f32 unless
// X_VEC, W_VEC, Y_VEC); the register-block aliases, retyped to their exact lengths (Mesa
// unrolls a loop over an array of exactly its trip count, and the block must be unrolled to
// stay in registers); the hooks `bias`, `post_op` and, with Y_VEC, `y_vector`; for 8-bit
// weights WT u32 and `weight`, `weights4`; with SCALED, `x_scale`.

alias XT = vec4<f32>;
alias WT = vec4<f32>;
alias YT = f32;
// [ROWS] output channels' weight offsets, [ROWS] four input channels' weights,
// [ROWS][VECS] accumulators, [VECS] vectors of one input channel, [4 VECS] columns.
alias Rows = array<u32, 8>;
alias RowScales = array<vec2<f32>, 8>;
alias RowWeights = array<vec4<f32>, 8>;
alias Block = array<array<vec4<f32>, 4>, 8>;
alias Vectors = array<vec4<f32>, 4>;
alias Columns = array<u32, 16>;

override X_VEC: bool = true;
override W_VEC: bool = true;
override Y_VEC: bool = false;
override ROWS: u32 = 8u;
override VECS: u32 = 4u;
override WG: u32 = 64u;
// Images of one pixel (the 1x1 convs of squeeze-excitation blocks and classifier heads): every
// column is that pixel, read once.
override ONE_PIXEL: bool = false;
// X's channels are scaled by S [N, C] (a squeeze-excitation's product, fused), bound in the
// slot r0; the post-ops' operand then takes r1.
override SCALED: bool = false;

@group(0) @binding(0) var<storage, read> x: array<XT>;
@group(0) @binding(1) var<storage, read> w: array<WT>;
@group(0) @binding(2) var<storage, read_write> y: array<YT>;
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
    // Output channels, input channels, pixels per image.
    m: u32,
    k: u32,
    pixels: u32,
    // Pixel blocks per image, channel blocks, invocations (pixel blocks x channel blocks x
    // images).
    blocks: u32,
    row_blocks: u32,
    count: u32,
}
var<immediate> p: Params;

// The bias of output channel `m`.
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

// Four outputs as an element of Y (the hook returns the vector itself where YT is one).
fn y_vector(o: vec4<f32>) -> YT {
    return YT(o.x);
}

// (n / d, n % d); conv/vulkan.rs puts vulkan/divmod.wgsl's in its place (CPU-type devices
// divide integers by a run-time value lane by lane).
fn divmod(n: u32, d: u32) -> vec2<u32> {
    return vec2<u32>(n / d, n % d);
}

// Element i of X as a scalar (XT is f32 whenever this is read) and vector i (XT is a vector).
fn x1(i: u32) -> f32 {
    return vec4<f32>(x[i]).x;
}

// Columns l..l+4 of the channel at xc, one element each.
fn columns(xc: u32, q: ptr<function, Columns>, l: u32) -> vec4<f32> {
    if (ONE_PIXEL) {
        return vec4<f32>(x1(xc));
    }
    return vec4<f32>(x1(xc + (*q)[l]), x1(xc + (*q)[l + 1u]), x1(xc + (*q)[l + 2u]), x1(xc + (*q)[l + 3u]));
}

// How output channel m's weights are dequantized, (scale, zero point), which `weight` takes;
// float weights have none. conv/vulkan.rs replaces both hooks for 8-bit weights (WT u32, four
// to a word; B's binding then holds W's table), so a row's pair is loaded once.
fn weight_row(m: u32) -> vec2<f32> {
    return vec2<f32>(1.0, 0.0);
}

// Element e of W (counted from W's start), of a channel dequantized by `row`.
fn weight(e: u32, row: vec2<f32>) -> f32 {
    return vec4<f32>(w[p.w + e]).x;
}

// Vector i of W (with W_VEC: elements 4i..4i+4 from W's start), of a channel dequantized by
// `row`.
fn weights4(i: u32, row: vec2<f32>) -> vec4<f32> {
    return vec4<f32>(w[p.w + i]);
}

// acc[r][v] += wv[r][kk] * xv[v] for every r and v. The default loops; conv/vulkan.rs writes
// it out for the block, so that the block stays in registers whatever the driver unrolls (on
// lavapipe the loops ran the wide blocks from memory: 1.2-1.5x the time).
fn accumulate(acc: ptr<function, Block>, wv: ptr<function, RowWeights>, xv: ptr<function, Vectors>, kk: u32) {
    for (var r = 0u; r < ROWS; r++) {
        for (var v = 0u; v < VECS; v++) {
            (*acc)[r][v] = fma(vec4<f32>((*wv)[r][kk]), (*xv)[v], (*acc)[r][v]);
        }
    }
}

// One input channel's vectors times its factor.
fn scale(xv: ptr<function, Vectors>, k: f32) {
    for (var v = 0u; v < VECS; v++) {
        (*xv)[v] *= k;
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) grid: vec3<u32>) {
    let i = gid.x + gid.y * grid.x * WG;
    if (i >= p.count) {
        return;
    }
    // i = (n * row_blocks + mb) * blocks + pb
    let bq = divmod(i, p.blocks);
    let pb = bq.y;
    let mq = divmod(bq.x, p.row_blocks);
    let n = mq.x;
    let mb = mq.y;
    let p0 = pb * 4u * VECS;
    // X's elements per channel, and where the image starts.
    let plane = select(p.pixels, p.pixels / 4u, X_VEC);
    let xi = p.x + n * p.k * plane;
    // The block's output channels (past the last: the last again) start at their bias.
    var wo: Rows;
    var ms: RowScales;
    var acc: Block;
    for (var r = 0u; r < ROWS; r++) {
        let m = min(mb * ROWS + r, p.m - 1u);
        ms[r] = weight_row(m);
        wo[r] = m * select(p.k, p.k / 4u, W_VEC);
        for (var v = 0u; v < VECS; v++) {
            acc[r][v] = vec4<f32>(bias(m));
        }
    }
    // The element of a channel each column reads (each vector's, with X_VEC): past the
    // image, the last one.
    var q: Columns;
    for (var c = 0u; c < 4u * VECS; c++) {
        q[c] = select(min(p0 + c, p.pixels - 1u), min(p0 / 4u + c, plane - 1u), X_VEC);
    }
    var xv: Vectors;
    // Four input channels at a time: their weights as one vector per row.
    let k4 = p.k & ~3u;
    for (var c = 0u; c < k4; c += 4u) {
        var wv: RowWeights;
        for (var r = 0u; r < ROWS; r++) {
            if (W_VEC) {
                wv[r] = weights4(wo[r] + c / 4u, ms[r]);
            } else {
                let at = wo[r] + c;
                let m = ms[r];
                wv[r] = vec4<f32>(weight(at, m), weight(at + 1u, m), weight(at + 2u, m), weight(at + 3u, m));
            }
        }
        for (var kk = 0u; kk < 4u; kk++) {
            let xc = xi + (c + kk) * plane;
            for (var v = 0u; v < VECS; v++) {
                if (X_VEC) {
                    xv[v] = vec4<f32>(x[xc + q[v]]);
                } else {
                    xv[v] = columns(xc, &q, 4u * v);
                }
            }
            if (SCALED) {
                scale(&xv, x_scale(n, c + kk));
            }
            accumulate(&acc, &wv, &xv, kk);
        }
    }
    for (var c = k4; c < p.k; c++) {
        let xc = xi + c * plane;
        for (var v = 0u; v < VECS; v++) {
            if (X_VEC) {
                xv[v] = vec4<f32>(x[xc + q[v]]);
            } else {
                xv[v] = columns(xc, &q, 4u * v);
            }
        }
        if (SCALED) {
            scale(&xv, x_scale(n, c));
        }
        for (var r = 0u; r < ROWS; r++) {
            let wk = vec4<f32>(weight(wo[r] + c, ms[r]));
            for (var v = 0u; v < VECS; v++) {
                acc[r][v] = fma(wk, xv[v], acc[r][v]);
            }
        }
    }
    for (var r = 0u; r < ROWS; r++) {
        let m = mb * ROWS + r;
        let e0 = (n * p.m + m) * p.pixels + p0;
        for (var v = 0u; v < VECS; v++) {
            if (Y_VEC) {
                // Images of whole vectors: each vector is wholly inside or past the image.
                let e = e0 + 4u * v;
                if (m < p.m && p0 + 4u * v < p.pixels) {
                    var o = acc[r][v];
                    for (var l = 0u; l < 4u; l++) {
                        o[l] = post_op(o[l], e + l);
                    }
                    y[p.y + e / 4u] = y_vector(o);
                }
            } else {
                for (var l = 0u; l < 4u; l++) {
                    let col = 4u * v + l;
                    if (m < p.m && p0 + col < p.pixels) {
                        y[p.y + e0 + col] = YT(post_op(acc[r][v][l], e0 + col));
                    }
                }
            }
        }
    }
}
