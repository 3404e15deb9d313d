// ConvTranspose: output position o gathers input position i through tap k when
// o = i * stride + k * dilation - pad along every dimension. Each invocation holds a block of
// ROWS output channels of one group x YS output rows x 4 VECS consecutive outputs along the
// rows, the first a multiple of the stride SW: which taps reach each of them along the row, and
// from which element of the loaded input span, is then fixed by the overrides. Depth and rows
// are checked at run time.
//
// Geometries are lifted to 3-D (depth, height, width). Channels, rows and columns past the
// output are computed from clamped (valid) addresses and not stored.
//
// X and W are read as 16-byte vectors where their rows allow (X_VEC: rows of whole vectors and
// blocks whose span starts on a vector; W_VEC: windows of whole vectors).
//
// Specialised per dispatch (conv/vulkan.rs): the overrides; XT, WT and YT (f32 unless
// X_VEC, W_VEC, Y_VEC); the register-block aliases, retyped to their exact lengths (Mesa
// unrolls a loop over an array of exactly its trip count, and the block must be unrolled to
// stay in registers); the hooks `bias`, `post_op` and, with Y_VEC, `y_vector`.

alias XT = vec4<f32>;
alias WT = vec4<f32>;
alias YT = f32;
// [ROWS][YS][VECS] accumulators, [ROWS][KH][KW] the taps of one input channel, [ROWS] output
// channels, [SPAN] a row's span and its columns, [NV] the span as vectors, [NT] a window's
// taps as vectors.
alias Block = array<array<array<vec4<f32>, 4>, 2>, 8>;
alias Taps = array<array<array<f32, 2>, 2>, 8>;
alias Rows = array<u32, 8>;
alias Span = array<f32, 8>;
alias SpanColumns = array<vec2<u32>, 8>;
alias SpanVectors = array<vec4<f32>, 2>;
alias VectorColumns = array<vec2<u32>, 2>;
alias TapVectors = array<vec4<f32>, 1>;

override ROWS: u32 = 8u;
override YS: u32 = 2u;
override VECS: u32 = 4u;
override KH: u32 = 2u;
override KW: u32 = 2u;
override SH: u32 = 2u;
override SW: u32 = 2u;
override DH: u32 = 1u;
override DW: u32 = 1u;
// The padding at the start of a row, and the span of input columns a block reads: from
// LO + ox0 / SW on, SPAN of them.
override PW: i32 = 0;
override LO: i32 = 0;
override SPAN: u32 = 8u;
override X_VEC: bool = true;
override W_VEC: bool = true;
override Y_VEC: bool = false;
// With X_VEC, where the span starts in its first vector: LO mod 4.
override LEAD: u32 = 0u;
// A 2-D conv (one depth tap, no depth padding, one input and output plane): the depth loop
// runs once, known when the kernel is made (a run-time loop around the block costs CPU-type
// devices a third of the step).
override PLANAR: bool = false;
override WG: u32 = 64u;
// Vectors that hold a row's span; vectors that hold a window.
override NV: u32 = (LEAD + SPAN + 3u) / 4u;
override NT: u32 = (KH * KW + 3u) / 4u;

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
    // The window along depth: taps, stride, dilation; padding at the start of depth and rows.
    kd: u32,
    sd: u32,
    dd: u32,
    pd: i32,
    ph: i32,
    // Blocks along a row, along a column and over a group's output channels; invocations.
    x_blocks: u32,
    y_blocks: u32,
    row_blocks: u32,
    count: u32,
}
var<immediate> p: Params;

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

// Element i of X and of W as scalars (XT, WT are f32 whenever these are read).
fn x1(i: u32) -> f32 {
    return vec4<f32>(x[i]).x;
}

fn w1(i: u32) -> f32 {
    return vec4<f32>(w[i]).x;
}

// The span element from which tap kx reaches column c of a block, or -1 where it does not
// (c + PW - kx DW = SW (LO + element)).
fn reach(c: u32, kx: u32) -> i32 {
    let t = i32(c) + PW - i32(kx * DW);
    return select(-1, t / i32(SW) - LO, t % i32(SW) == 0);
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
    // The block's output channels within the group (past the last: the last again) start at
    // their bias.
    var rows: Rows;
    var acc: Block;
    for (var r = 0u; r < ROWS; r++) {
        rows[r] = min(mb * ROWS + r, p.cout - 1u);
        let start = vec4<f32>(bias(g * p.cout + rows[r]));
        for (var yy = 0u; yy < YS; yy++) {
            for (var v = 0u; v < VECS; v++) {
                acc[r][yy][v] = start;
            }
        }
    }
    // Element s of a row's span (input column ox0 / SW + LO + s): where it is read, and whether
    // it is inside the row.
    let ix0 = i32(ox0 / SW) + LO;
    var columns: SpanColumns;
    for (var s = 0u; s < SPAN; s++) {
        let c = ix0 + i32(s);
        let inside = c >= 0 && c < i32(p.iw);
        columns[s] = vec2<u32>(u32(clamp(c, 0, i32(p.iw) - 1)), select(0u, 1u, inside));
    }
    // With X_VEC (ox0 / SW a multiple of 4), vector k of the span (its element s is lane
    // LEAD + s of the vectors).
    let vw = i32(p.iw / 4u);
    let v0 = i32(ox0 / SW / 4u) + (LO - i32(LEAD)) / 4;
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
    // away and the block's accumulators live across a single loop.
    let kd = select(p.kd, 1u, PLANAR);
    for (var pair = 0u; pair < p.cin * kd; pair++) {
        let ci = pair / kd;
        let kz = pair - ci * kd;
        let xc = xg + ci * in_plane;
        let tz = i32(oz) + p.pd - i32(kz * p.dd);
        if (!PLANAR && tz < 0) {
            continue;
        }
        let izq = divmod(u32(tz), p.sd);
        let iz = select(izq.x, 0u, PLANAR);
        if (!PLANAR && (izq.y != 0u || iz >= p.id)) {
            continue;
        }
        // Weights: [C, M / group, kd, kh, kw], C counted over all groups.
        var taps: Taps;
        for (var r = 0u; r < ROWS; r++) {
            let wo = (((g * p.cin + ci) * p.cout + rows[r]) * p.kd + kz) * KH * KW;
            if (W_VEC) {
                var vectors: TapVectors;
                for (var t = 0u; t < NT; t++) {
                    vectors[t] = vec4<f32>(w[p.w + wo / 4u + t]);
                }
                for (var ky = 0u; ky < KH; ky++) {
                    for (var kx = 0u; kx < KW; kx++) {
                        let t = ky * KW + kx;
                        taps[r][ky][kx] = vectors[t / 4u][t % 4u];
                    }
                }
            } else {
                for (var ky = 0u; ky < KH; ky++) {
                    for (var kx = 0u; kx < KW; kx++) {
                        taps[r][ky][kx] = w1(p.w + wo + ky * KW + kx);
                    }
                }
            }
        }
        for (var yy = 0u; yy < YS; yy++) {
            for (var ky = 0u; ky < KH; ky++) {
                // Rows no tap reaches are skipped: about all but one in SH of them.
                let ty = i32(oy0 + yy) + p.ph - i32(ky * DH);
                if (ty >= 0 && ty % i32(SH) == 0 && ty / i32(SH) < i32(p.ih)) {
                    let xrow = xc + (iz * p.ih + u32(ty) / SH) * p.iw;
                    var span: Span;
                    if (X_VEC) {
                        let xr = p.x + xrow / 4u;
                        var vectors: SpanVectors;
                        for (var k = 0u; k < NV; k++) {
                            let at = vector_columns[k];
                            vectors[k] = select(vec4<f32>(0.0), vec4<f32>(x[xr + at.x]), at.y != 0u);
                        }
                        for (var s = 0u; s < SPAN; s++) {
                            span[s] = vectors[(LEAD + s) / 4u][(LEAD + s) % 4u];
                        }
                    } else {
                        let xr = p.x + xrow;
                        for (var s = 0u; s < SPAN; s++) {
                            let at = columns[s];
                            span[s] = select(0.0, x1(xr + at.x), at.y != 0u);
                        }
                    }
                    for (var kx = 0u; kx < KW; kx++) {
                        for (var v = 0u; v < VECS; v++) {
                            // Columns this tap does not reach take zero.
                            var xv = vec4<f32>(0.0);
                            var reached = false;
                            for (var l = 0u; l < 4u; l++) {
                                let s = reach(4u * v + l, kx);
                                if (s >= 0) {
                                    xv[l] = span[s];
                                    reached = true;
                                }
                            }
                            if (reached) {
                                for (var r = 0u; r < ROWS; r++) {
                                    acc[r][yy][v] = fma(vec4<f32>(taps[r][ky][kx]), xv, acc[r][yy][v]);
                                }
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
