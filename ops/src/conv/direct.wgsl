// Direct convolution, for every conv on CPU-type devices and for depthwise convs (one input
// channel per group) everywhere: each invocation holds a block of ROWS output channels of one
// group x YS output rows x 4 VECS consecutive outputs along the rows in registers. For each
// input channel and depth tap it walks the input rows those outputs reach, loads the span of
// each row once (as 16-byte vectors with X_VEC) and applies every tap that reads it.
//
// Geometries are lifted to 3-D (depth, height, width). The depth window is a run-time loop; the
// window, strides and dilations along height and width are overrides, so every tap's place in
// the loaded span is known when the kernel is made. Channels, rows and columns past the output
// are computed from clamped (valid) addresses and not stored; input outside the image reads as
// zero.
//
// Specialised per dispatch (conv/vulkan.rs): the overrides; XT and YT (f32 unless X_VEC,
// Y_VEC); the register-block aliases, retyped to their exact lengths (Mesa unrolls a loop over
// an array of exactly its trip count, and the block must be unrolled to stay in registers);
// the hooks `bias`, `post_op` and, with Y_VEC, `y_vector`; for 8-bit weights WT and `weight`.

alias XT = f32;
alias WT = f32;
alias YT = f32;
// [ROWS][YS][VECS] accumulators, [ROWS][KH][KW] the taps of one input channel, [ROWS] output
// channels and their weights' dequantization, [NJ] input rows, [SPAN] a row's span and its columns, [NV] the span as vectors.
alias Block = array<array<array<vec4<f32>, 2>, 4>, 8>;
alias Taps = array<array<array<f32, 3>, 3>, 8>;
alias Rows = array<u32, 8>;
alias RowScales = array<vec2<f32>, 8>;
alias InputRows = array<vec2<u32>, 6>;
alias Span = array<f32, 10>;
alias SpanColumns = array<vec2<u32>, 10>;
alias SpanVectors = array<vec4<f32>, 3>;
alias VectorColumns = array<vec2<u32>, 3>;

override ROWS: u32 = 8u;
override YS: u32 = 4u;
override VECS: u32 = 2u;
override KH: u32 = 3u;
override KW: u32 = 3u;
override SH: u32 = 1u;
override SW: u32 = 1u;
override DH: u32 = 1u;
override DW: u32 = 1u;
override X_VEC: bool = false;
override Y_VEC: bool = false;
// With X_VEC, where the span starts in its first vector: (-pw) mod 4.
override LEAD: u32 = 0u;
// A 2-D conv (one depth tap, no depth padding): the depth loop runs once, known when the
// kernel is made.
override PLANAR: bool = false;
override WG: u32 = 64u;
// Input rows a block reads, input columns a row's span holds, and vectors that hold them.
override NJ: u32 = (YS - 1u) * SH + (KH - 1u) * DH + 1u;
override SPAN: u32 = (4u * VECS - 1u) * SW + (KW - 1u) * DW + 1u;
override NV: u32 = (LEAD + SPAN + 3u) / 4u;

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
    // The window along depth: taps, stride, dilation.
    kd: u32,
    sd: u32,
    dd: u32,
    // Padding at the start of each dimension.
    pd: i32,
    ph: i32,
    pw: i32,
    // Blocks along a row, along a column and over a group's output channels; invocations.
    x_blocks: u32,
    y_blocks: u32,
    row_blocks: u32,
    count: u32,
}
var<immediate> p: Params;

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

// Four outputs as an element of Y (the hook returns the vector itself where YT is one).
fn y_vector(o: vec4<f32>) -> YT {
    return YT(o.x);
}

// (n / d, n % d); conv/vulkan.rs puts vulkan/divmod.wgsl's in its place (CPU-type devices
// divide integers by a run-time value lane by lane).
fn divmod(n: u32, d: u32) -> vec2<u32> {
    return vec2<u32>(n / d, n % d);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) grid: vec3<u32>) {
    let i = gid.x + gid.y * grid.x * WG;
    if (i >= p.count) {
        return;
    }
    // i = (((ng * row_blocks + mb) * od + oz) * y_blocks + yb) * x_blocks + xb, where
    // ng = n * groups + g.
    let xq = divmod(i, p.x_blocks);
    let xb = xq.y;
    let yq = divmod(xq.x, p.y_blocks);
    let yb = yq.y;
    let zq = divmod(yq.x, p.od);
    let oz = zq.y;
    let mq = divmod(zq.x, p.row_blocks);
    let mb = mq.y;
    let ng = mq.x;
    let g = divmod(ng, p.groups).y;
    let ox0 = xb * 4u * VECS;
    let oy0 = yb * YS;
    // The block's output channels over all groups (past the group's last: the last again)
    // start at their bias.
    var rows: Rows;
    var scales: RowScales;
    var acc: Block;
    for (var r = 0u; r < ROWS; r++) {
        rows[r] = g * p.cout + min(mb * ROWS + r, p.cout - 1u);
        scales[r] = weight_row(rows[r]);
        let start = vec4<f32>(bias(rows[r]));
        for (var yy = 0u; yy < YS; yy++) {
            for (var v = 0u; v < VECS; v++) {
                acc[r][yy][v] = start;
            }
        }
    }
    // Input row j of the block (input row oy0 SH + j - ph): where it starts in its plane, and
    // whether it is inside the image (else it is padding, read as zero).
    var in_rows: InputRows;
    for (var j = 0u; j < NJ; j++) {
        let iy = i32(oy0 * SH + j) - p.ph;
        let inside = iy >= 0 && iy < i32(p.ih);
        in_rows[j] = vec2<u32>(u32(clamp(iy, 0, i32(p.ih) - 1)) * p.iw, select(0u, 1u, inside));
    }
    // Element t of a row's span (input column ox0 SW - pw + t), or with X_VEC vector k of the
    // span (its element t is lane LEAD + t of the vectors): where it is read, and whether it is
    // inside the row.
    let ix0 = i32(ox0 * SW) - p.pw;
    var columns: SpanColumns;
    for (var s = 0u; s < SPAN; s++) {
        let c = ix0 + i32(s);
        let inside = c >= 0 && c < i32(p.iw);
        columns[s] = vec2<u32>(u32(clamp(c, 0, i32(p.iw) - 1)), select(0u, 1u, inside));
    }
    let vw = i32(p.iw / 4u);
    let v0 = i32(ox0 * SW / 4u) - (p.pw + i32(LEAD)) / 4;
    var vector_columns: VectorColumns;
    for (var k = 0u; k < NV; k++) {
        let c = v0 + i32(k);
        let inside = c >= 0 && c < vw;
        vector_columns[k] = vec2<u32>(u32(clamp(c, 0, max(vw - 1, 0))), select(0u, 1u, inside));
    }
    let in_plane = p.id * p.ih * p.iw;
    let out_plane = p.od * p.oh * p.ow;
    let xg = ng * p.cin * in_plane;
    // One loop over (input channel, depth tap) pairs: with PLANAR the depth arithmetic folds
    // away and the block's accumulators live across a single loop (nested loops cost CPU-type
    // devices a third of the step).
    let kd = select(p.kd, 1u, PLANAR);
    for (var pair = 0u; pair < p.cin * kd; pair++) {
        let ci = pair / kd;
        let kz = pair - ci * kd;
        let xc = xg + ci * in_plane;
        let iz = select(i32(oz * p.sd + kz * p.dd) - p.pd, 0, PLANAR);
        if (!PLANAR && (iz < 0 || iz >= i32(p.id))) {
            continue;
        }
        var taps: Taps;
        for (var r = 0u; r < ROWS; r++) {
            let wo = ((rows[r] * p.cin + ci) * p.kd + kz) * KH * KW;
            for (var ky = 0u; ky < KH; ky++) {
                for (var kx = 0u; kx < KW; kx++) {
                    taps[r][ky][kx] = weight(wo + ky * KW + kx, scales[r]);
                }
            }
        }
        let xz = xc + u32(iz) * p.ih * p.iw;
        for (var j = 0u; j < NJ; j++) {
            let row = in_rows[j];
            var span: Span;
            if (X_VEC) {
                let xr = p.x + (xz + row.x) / 4u;
                var vectors: SpanVectors;
                for (var k = 0u; k < NV; k++) {
                    let at = vector_columns[k];
                    vectors[k] = select(vec4<f32>(0.0), vec4<f32>(x[xr + at.x]), (at.y & row.y) != 0u);
                }
                for (var s = 0u; s < SPAN; s++) {
                    span[s] = vectors[(LEAD + s) / 4u][(LEAD + s) % 4u];
                }
            } else {
                let xr = p.x + xz + row.x;
                for (var s = 0u; s < SPAN; s++) {
                    let at = columns[s];
                    span[s] = select(0.0, vec4<f32>(x[xr + at.x]).x, (at.y & row.y) != 0u);
                }
            }
            // The output rows yy this input row feeds, through kernel row ky:
            // j = yy SH + ky DH.
            for (var ky = 0u; ky < KH; ky++) {
                let jr = i32(j) - i32(ky * DH);
                if (jr >= 0 && jr % i32(SH) == 0 && jr / i32(SH) < i32(YS)) {
                    let yy = u32(jr) / SH;
                    for (var kx = 0u; kx < KW; kx++) {
                        for (var v = 0u; v < VECS; v++) {
                            let a = 4u * v * SW + kx * DW;
                            let xv = vec4<f32>(span[a], span[a + SW], span[a + 2u * SW], span[a + 3u * SW]);
                            for (var r = 0u; r < ROWS; r++) {
                                acc[r][yy][v] = fma(vec4<f32>(taps[r][ky][kx]), xv, acc[r][yy][v]);
                            }
                        }
                    }
                }
            }
        }
    }
    for (var r = 0u; r < ROWS; r++) {
        let m = mb * ROWS + r;
        for (var yy = 0u; yy < YS; yy++) {
            let oy = oy0 + yy;
            let e0 = (ng * p.cout + m) * out_plane + (oz * p.oh + oy) * p.ow + ox0;
            for (var v = 0u; v < VECS; v++) {
                if (Y_VEC) {
                    // Rows of whole vectors: each vector is wholly inside or past the row.
                    let e = e0 + 4u * v;
                    if (m < p.cout && oy < p.oh && ox0 + 4u * v < p.ow) {
                        var o = acc[r][yy][v];
                        for (var l = 0u; l < 4u; l++) {
                            o[l] = post_op(o[l], e + l);
                        }
                        y[p.y + e / 4u] = y_vector(o);
                    }
                } else {
                    for (var l = 0u; l < 4u; l++) {
                        let col = 4u * v + l;
                        if (m < p.cout && oy < p.oh && ox0 + col < p.ow) {
                            y[p.y + e0 + col] = YT(post_op(acc[r][yy][v][l], e0 + col));
                        }
                    }
                }
            }
        }
    }
}
