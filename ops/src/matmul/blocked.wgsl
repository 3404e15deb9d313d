// Register-blocked matrix product (CPU-type devices such as lavapipe, and skinny problems on
// GPUs): Y[b, i, j] = post_op(alpha * sum_k A[b, i, k] B[b, k, j] (+ beta * C[i, j])).
//
// Each invocation holds an RM x 4CG block of one batch's Y in registers (vec4 accumulators,
// four columns each) and reads A and B straight from memory, as 16-byte vectors wherever the
// layout allows (A_MODE, B_MODE); no workgroup memory, which is slow on CPU-type devices.
//
// The block is written out for its largest size (16 rows of 4 column groups, 4 k steps per
// iteration), each row, group and step guarded by the overrides RM, CG and KU: accumulators,
// row and column starts are named per row (indexed only by constants). Loops over the block with
// arrays indexed by the loop counter ran about 10x slower on lavapipe (LLVM kept the arrays in
// memory), so do not fold this back into loops.

// Element types of A, B and Y: vec4<f32> when read or written in vectors, else f32.
alias AE = vec4<f32>;
alias BE = vec4<f32>;
alias YE = vec4<f32>;

@group(0) @binding(0) var<storage, read> a: array<AE>;
@group(0) @binding(1) var<storage, read> b: array<BE>;
@group(0) @binding(2) var<storage, read_write> y: array<YE>;
// Gemm's C, read only by a replaced add_c.
@group(0) @binding(3) var<storage, read> c: array<f32>;
// Post-op operands, read only by a replaced post_op.
@group(0) @binding(4) var<storage, read> r0: array<f32>;
@group(0) @binding(5) var<storage, read> r1: array<f32>;

struct Params {
    // Where each binding's tensor starts, in its elements.
    a: u32,
    b: u32,
    y: u32,
    c: u32,
    r0: u32,
    r1: u32,
    // The product: M x K by K x N, for `batch` matrices of Y.
    m: u32,
    n: u32,
    k: u32,
    batch: u32,
    // Batch index = q0 * d1 + q1; A's and B's offsets for q0 and q1 (0 where broadcast).
    d1: u32,
    a_s0: u32,
    a_s1: u32,
    b_s0: u32,
    b_s1: u32,
    // Strides in floats: A's of i and k, B's of k and j.
    a_rs: u32,
    a_cs: u32,
    b_rs: u32,
    b_cs: u32,
    // Y[b, i, j] is element y0 + (b * m + i) * ldy + j of Y (and of the post-op operands).
    ldy: u32,
    y0: u32,
    // C[i, j] is element c0 + i * c_rs + j * c_cs of C.
    c0: u32,
    c_rs: u32,
    c_cs: u32,
    alpha: f32,
    beta: f32,
    // 1: add to the sums Y already holds (a later piece of K); 2: store the sums (an earlier
    // piece), with neither alpha, C nor the post-ops.
    flags: u32,
}
var<immediate> p: Params;

// Rows of the block (1..16).
override RM: u32 = 4u;
// Groups of four columns of the block (1..4).
override CG: u32 = 1u;
// K steps per iteration: 4 when K is a multiple of 4, else 1.
override KU: u32 = 4u;
// How A is read: 0 floats; 1 vec4s along k (rows contiguous); 2 vec4s across four rows
// (columns contiguous, RM a multiple of 4).
override A_MODE: u32 = 1u;
// How B is read: 0 floats; 1 vec4s along k (columns contiguous); 2 vec4s across four columns
// (rows contiguous); 3 rows contiguous but not 16-byte aligned: the aligned vec4s that cover
// the block's columns, shifted (B_SHIFT = b_rs % 4).
override B_MODE: u32 = 2u;
override B_SHIFT: u32 = 0u;
override WG: u32 = 8u;

// Gemm's beta * C, added to the scaled sum of element (i, j).
fn add_c(v: f32, i: u32, j: u32) -> f32 {
    return v;
}

fn post_op(v: f32, i: u32) -> f32 {
    return v;
}

// Stores the block's columns j..j+4 of one row, of which `count` exist, from element `i` of Y
// (vec4s: i and count are multiples of 4).
fn store_y(i: u32, v: vec4<f32>, count: u32) {
    if (count == 4u) {
        y[p.y + i / 4u] = v;
    }
}

// Reads the block's columns j..j+4 of one row back (a later piece of K), the same way.
fn load_y(i: u32) -> vec4<f32> {
    return vec4<f32>(y[p.y + i / 4u]);
}

// Four floats from the pair of vec4s lo, hi, starting `s` floats into lo.
fn window(lo: vec4<f32>, hi: vec4<f32>, s: u32) -> vec4<f32> {
    switch s {
        case 1u: {
            return vec4<f32>(lo.yzw, hi.x);
        }
        case 2u: {
            return vec4<f32>(lo.zw, hi.xy);
        }
        case 3u: {
            return vec4<f32>(lo.w, hi.xyz);
        }
        default: {
            return lo;
        }
    }
}

// Where row r of the block starts in A, in the binding's elements (rows past the matrix are
// clamped to its last: the tail block recomputes them and does not store them).
fn a_row(r: u32, i0: u32, ab: u32) -> u32 {
    let i = min(i0 + r, p.m - 1u);
    switch A_MODE {
        case 1u: {
            return p.a + (ab + i * p.a_rs) / 4u;
        }
        case 2u: {
            return p.a + (ab + i0) / 4u;
        }
        default: {
            return p.a + ab + i * p.a_rs;
        }
    }
}

// Where column q of the block (B_MODE 2: column group q) starts in B.
fn b_col(q: u32, j0: u32, bb: u32) -> u32 {
    let j = min(j0 + q, p.n - 1u);
    switch B_MODE {
        case 1u: {
            return p.b + (bb + j * p.b_cs) / 4u;
        }
        case 2u: {
            return p.b + (bb + min(j0 + 4u * q, p.n - 4u)) / 4u;
        }
        case 3u: {
            return p.b + (bb + j0) / 4u;
        }
        default: {
            return p.b + bb + j * p.b_cs;
        }
    }
}

// A_MODE 1: row r's four values at k = 4 kk..
fn a_quad(ar: u32, kk: u32, r: u32) -> vec4<f32> {
    if (A_MODE == 1u && r < RM) {
        return vec4<f32>(a[ar + kk]);
    }
    return vec4<f32>();
}

// B_MODE 1: column q's four values at k = 4 kk..
fn b_quad(bc: u32, kk: u32, q: u32) -> vec4<f32> {
    if (B_MODE == 1u && q < 4u * CG) {
        return vec4<f32>(b[bc + kk]);
    }
    return vec4<f32>();
}

// A_MODE 2: rows 4g..4g+4 at k.
fn a_across(ar: u32, k: u32, g: u32) -> vec4<f32> {
    if (A_MODE == 2u && g < RM / 4u) {
        return vec4<f32>(a[ar + k * (p.a_cs / 4u) + g]);
    }
    return vec4<f32>();
}

// A's value of a row at k = kq + s: from its quad (mode 1), its group of four rows (mode 2), or
// read alone.
fn a_value(quad: f32, across: f32, ar: u32, k: u32) -> f32 {
    switch A_MODE {
        case 1u: {
            return quad;
        }
        case 2u: {
            return across;
        }
        default: {
            return vec4<f32>(a[ar + k * p.a_cs]).x;
        }
    }
}

// One row of the block: acc += a * B's row, group by group.
fn fma_row(acc: ptr<function, array<vec4<f32>, 4>>, a: f32, brow: array<vec4<f32>, 4>) {
    (*acc)[0] += a * brow[0];
    if (CG > 1u) {
        (*acc)[1] += a * brow[1];
    }
    if (CG > 2u) {
        (*acc)[2] += a * brow[2];
    }
    if (CG > 3u) {
        (*acc)[3] += a * brow[3];
    }
}

// Alpha, C and the post-ops on the sums v of row i, columns j.., then the store (from element
// yr + j of Y).
fn store_group(v: vec4<f32>, i: u32, j: u32, yr: u32) {
    if (j >= p.n) {
        return;
    }
    var w = v;
    if ((p.flags & 2u) == 0u) {
        w.x = post_op(add_c(w.x * p.alpha, i, j), yr + j);
        w.y = post_op(add_c(w.y * p.alpha, i, j + 1u), yr + j + 1u);
        w.z = post_op(add_c(w.z * p.alpha, i, j + 2u), yr + j + 2u);
        w.w = post_op(add_c(w.w * p.alpha, i, j + 3u), yr + j + 3u);
    }
    store_y(yr + j, w, min(p.n - j, 4u));
}

fn store_row(acc: array<vec4<f32>, 4>, i: u32, j0: u32, yb: u32) {
    if (i >= p.m) {
        return;
    }
    let yr = yb + i * p.ldy;
    store_group(acc[0], i, j0, yr);
    if (CG > 1u) {
        store_group(acc[1], i, j0 + 4u, yr);
    }
    if (CG > 2u) {
        store_group(acc[2], i, j0 + 8u, yr);
    }
    if (CG > 3u) {
        store_group(acc[3], i, j0 + 12u, yr);
    }
}

// A later piece of K: the sums so far, from Y.
fn load_row(i: u32, j0: u32, yb: u32) -> array<vec4<f32>, 4> {
    let yr = yb + min(i, p.m - 1u) * p.ldy;
    var acc: array<vec4<f32>, 4>;
    acc[0] = load_y(yr + min(j0, p.n - 1u));
    if (CG > 1u) {
        acc[1] = load_y(yr + min(j0 + 4u, p.n - 1u));
    }
    if (CG > 2u) {
        acc[2] = load_y(yr + min(j0 + 8u, p.n - 1u));
    }
    if (CG > 3u) {
        acc[3] = load_y(yr + min(j0 + 12u, p.n - 1u));
    }
    return acc;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * WG;
    let nb = (p.n + 4u * CG - 1u) / (4u * CG);
    let mb = (p.m + RM - 1u) / RM;
    if (t >= p.batch * mb * nb) {
        return;
    }
    let j0 = (t % nb) * 4u * CG;
    let i0 = ((t / nb) % mb) * RM;
    let bi = t / (nb * mb);
    let q0 = bi / p.d1;
    let q1 = bi % p.d1;
    let ab = q0 * p.a_s0 + q1 * p.a_s1;
    let bb = q0 * p.b_s0 + q1 * p.b_s1;
    let yb = p.y0 + bi * p.m * p.ldy;
    // Rows of A and columns of B, written out: the block's registers are named, never indexed.
    let ar0 = a_row(0u, i0, ab);
    let ar1 = a_row(1u, i0, ab);
    let ar2 = a_row(2u, i0, ab);
    let ar3 = a_row(3u, i0, ab);
    let ar4 = a_row(4u, i0, ab);
    let ar5 = a_row(5u, i0, ab);
    let ar6 = a_row(6u, i0, ab);
    let ar7 = a_row(7u, i0, ab);
    let ar8 = a_row(8u, i0, ab);
    let ar9 = a_row(9u, i0, ab);
    let ar10 = a_row(10u, i0, ab);
    let ar11 = a_row(11u, i0, ab);
    let ar12 = a_row(12u, i0, ab);
    let ar13 = a_row(13u, i0, ab);
    let ar14 = a_row(14u, i0, ab);
    let ar15 = a_row(15u, i0, ab);
    let bc0 = b_col(0u, j0, bb);
    let bc1 = b_col(1u, j0, bb);
    let bc2 = b_col(2u, j0, bb);
    let bc3 = b_col(3u, j0, bb);
    let bc4 = b_col(4u, j0, bb);
    let bc5 = b_col(5u, j0, bb);
    let bc6 = b_col(6u, j0, bb);
    let bc7 = b_col(7u, j0, bb);
    let bc8 = b_col(8u, j0, bb);
    let bc9 = b_col(9u, j0, bb);
    let bc10 = b_col(10u, j0, bb);
    let bc11 = b_col(11u, j0, bb);
    let bc12 = b_col(12u, j0, bb);
    let bc13 = b_col(13u, j0, bb);
    let bc14 = b_col(14u, j0, bb);
    let bc15 = b_col(15u, j0, bb);
    var acc0: array<vec4<f32>, 4>;
    var acc1: array<vec4<f32>, 4>;
    var acc2: array<vec4<f32>, 4>;
    var acc3: array<vec4<f32>, 4>;
    var acc4: array<vec4<f32>, 4>;
    var acc5: array<vec4<f32>, 4>;
    var acc6: array<vec4<f32>, 4>;
    var acc7: array<vec4<f32>, 4>;
    var acc8: array<vec4<f32>, 4>;
    var acc9: array<vec4<f32>, 4>;
    var acc10: array<vec4<f32>, 4>;
    var acc11: array<vec4<f32>, 4>;
    var acc12: array<vec4<f32>, 4>;
    var acc13: array<vec4<f32>, 4>;
    var acc14: array<vec4<f32>, 4>;
    var acc15: array<vec4<f32>, 4>;
    if ((p.flags & 1u) != 0u) {
        if (RM > 0u) {
            acc0 = load_row(i0 + 0u, j0, yb);
        }
        if (RM > 1u) {
            acc1 = load_row(i0 + 1u, j0, yb);
        }
        if (RM > 2u) {
            acc2 = load_row(i0 + 2u, j0, yb);
        }
        if (RM > 3u) {
            acc3 = load_row(i0 + 3u, j0, yb);
        }
        if (RM > 4u) {
            acc4 = load_row(i0 + 4u, j0, yb);
        }
        if (RM > 5u) {
            acc5 = load_row(i0 + 5u, j0, yb);
        }
        if (RM > 6u) {
            acc6 = load_row(i0 + 6u, j0, yb);
        }
        if (RM > 7u) {
            acc7 = load_row(i0 + 7u, j0, yb);
        }
        if (RM > 8u) {
            acc8 = load_row(i0 + 8u, j0, yb);
        }
        if (RM > 9u) {
            acc9 = load_row(i0 + 9u, j0, yb);
        }
        if (RM > 10u) {
            acc10 = load_row(i0 + 10u, j0, yb);
        }
        if (RM > 11u) {
            acc11 = load_row(i0 + 11u, j0, yb);
        }
        if (RM > 12u) {
            acc12 = load_row(i0 + 12u, j0, yb);
        }
        if (RM > 13u) {
            acc13 = load_row(i0 + 13u, j0, yb);
        }
        if (RM > 14u) {
            acc14 = load_row(i0 + 14u, j0, yb);
        }
        if (RM > 15u) {
            acc15 = load_row(i0 + 15u, j0, yb);
        }
    }
    let b_rs4 = p.b_rs / 4u;
    // B_MODE 3: the last block's covering vec4s may pass the end of B (their columns are not
    // stored); reads stay inside the binding.
    let blast = arrayLength(&b) - 1u;
    for (var kk = 0u; kk < p.k / KU; kk++) {
        let kq = kk * KU;
        let av0 = a_quad(ar0, kk, 0u);
        let av1 = a_quad(ar1, kk, 1u);
        let av2 = a_quad(ar2, kk, 2u);
        let av3 = a_quad(ar3, kk, 3u);
        let av4 = a_quad(ar4, kk, 4u);
        let av5 = a_quad(ar5, kk, 5u);
        let av6 = a_quad(ar6, kk, 6u);
        let av7 = a_quad(ar7, kk, 7u);
        let av8 = a_quad(ar8, kk, 8u);
        let av9 = a_quad(ar9, kk, 9u);
        let av10 = a_quad(ar10, kk, 10u);
        let av11 = a_quad(ar11, kk, 11u);
        let av12 = a_quad(ar12, kk, 12u);
        let av13 = a_quad(ar13, kk, 13u);
        let av14 = a_quad(ar14, kk, 14u);
        let av15 = a_quad(ar15, kk, 15u);
        let bv0 = b_quad(bc0, kk, 0u);
        let bv1 = b_quad(bc1, kk, 1u);
        let bv2 = b_quad(bc2, kk, 2u);
        let bv3 = b_quad(bc3, kk, 3u);
        let bv4 = b_quad(bc4, kk, 4u);
        let bv5 = b_quad(bc5, kk, 5u);
        let bv6 = b_quad(bc6, kk, 6u);
        let bv7 = b_quad(bc7, kk, 7u);
        let bv8 = b_quad(bc8, kk, 8u);
        let bv9 = b_quad(bc9, kk, 9u);
        let bv10 = b_quad(bc10, kk, 10u);
        let bv11 = b_quad(bc11, kk, 11u);
        let bv12 = b_quad(bc12, kk, 12u);
        let bv13 = b_quad(bc13, kk, 13u);
        let bv14 = b_quad(bc14, kk, 14u);
        let bv15 = b_quad(bc15, kk, 15u);
        {
            let s = 0u;
            let k = kq + s;
            // B's row k over the block's column groups.
            var brow: array<vec4<f32>, 4>;
            switch B_MODE {
                case 1u: {
                    brow[0] = vec4<f32>(bv0[s], bv1[s], bv2[s], bv3[s]);
                    if (CG > 1u) {
                        brow[1] = vec4<f32>(bv4[s], bv5[s], bv6[s], bv7[s]);
                    }
                    if (CG > 2u) {
                        brow[2] = vec4<f32>(bv8[s], bv9[s], bv10[s], bv11[s]);
                    }
                    if (CG > 3u) {
                        brow[3] = vec4<f32>(bv12[s], bv13[s], bv14[s], bv15[s]);
                    }
                }
                case 2u: {
                    brow[0] = vec4<f32>(b[bc0 + k * b_rs4]);
                    if (CG > 1u) {
                        brow[1] = vec4<f32>(b[bc1 + k * b_rs4]);
                    }
                    if (CG > 2u) {
                        brow[2] = vec4<f32>(b[bc2 + k * b_rs4]);
                    }
                    if (CG > 3u) {
                        brow[3] = vec4<f32>(b[bc3 + k * b_rs4]);
                    }
                }
                case 3u: {
                    // The vec4s that cover the row, which starts `shift` floats into the first
                    // (kq is a multiple of 4).
                    let shift = (s * B_SHIFT) % 4u;
                    let at = bc0 + kk * p.b_rs + (s * p.b_rs) / 4u;
                    let w0 = vec4<f32>(b[at]);
                    var w1 = w0;
                    var w2 = w0;
                    var w3 = w0;
                    var w4 = w0;
                    if (CG > 1u || (CG == 1u && shift != 0u)) {
                        w1 = vec4<f32>(b[min(at + 1u, blast)]);
                    }
                    if (CG > 2u || (CG == 2u && shift != 0u)) {
                        w2 = vec4<f32>(b[min(at + 2u, blast)]);
                    }
                    if (CG > 3u || (CG == 3u && shift != 0u)) {
                        w3 = vec4<f32>(b[min(at + 3u, blast)]);
                    }
                    if (CG > 4u || (CG == 4u && shift != 0u)) {
                        w4 = vec4<f32>(b[min(at + 4u, blast)]);
                    }
                    brow[0] = window(w0, w1, shift);
                    if (CG > 1u) {
                        brow[1] = window(w1, w2, shift);
                    }
                    if (CG > 2u) {
                        brow[2] = window(w2, w3, shift);
                    }
                    if (CG > 3u) {
                        brow[3] = window(w3, w4, shift);
                    }
                }
                default: {
                    let row = k * p.b_rs;
                    brow[0] = vec4<f32>(
                        vec4<f32>(b[bc0 + row]).x,
                        vec4<f32>(b[bc1 + row]).x,
                        vec4<f32>(b[bc2 + row]).x,
                        vec4<f32>(b[bc3 + row]).x
                    );
                    if (CG > 1u) {
                        brow[1] = vec4<f32>(
                            vec4<f32>(b[bc4 + row]).x,
                            vec4<f32>(b[bc5 + row]).x,
                            vec4<f32>(b[bc6 + row]).x,
                            vec4<f32>(b[bc7 + row]).x
                        );
                    }
                    if (CG > 2u) {
                        brow[2] = vec4<f32>(
                            vec4<f32>(b[bc8 + row]).x,
                            vec4<f32>(b[bc9 + row]).x,
                            vec4<f32>(b[bc10 + row]).x,
                            vec4<f32>(b[bc11 + row]).x
                        );
                    }
                    if (CG > 3u) {
                        brow[3] = vec4<f32>(
                            vec4<f32>(b[bc12 + row]).x,
                            vec4<f32>(b[bc13 + row]).x,
                            vec4<f32>(b[bc14 + row]).x,
                            vec4<f32>(b[bc15 + row]).x
                        );
                    }
                }
            }
            let ac0 = a_across(ar0, k, 0u);
            let ac1 = a_across(ar0, k, 1u);
            let ac2 = a_across(ar0, k, 2u);
            let ac3 = a_across(ar0, k, 3u);
            if (RM > 0u) {
                fma_row(&acc0, a_value(av0[s], ac0.x, ar0, k), brow);
            }
            if (RM > 1u) {
                fma_row(&acc1, a_value(av1[s], ac0.y, ar1, k), brow);
            }
            if (RM > 2u) {
                fma_row(&acc2, a_value(av2[s], ac0.z, ar2, k), brow);
            }
            if (RM > 3u) {
                fma_row(&acc3, a_value(av3[s], ac0.w, ar3, k), brow);
            }
            if (RM > 4u) {
                fma_row(&acc4, a_value(av4[s], ac1.x, ar4, k), brow);
            }
            if (RM > 5u) {
                fma_row(&acc5, a_value(av5[s], ac1.y, ar5, k), brow);
            }
            if (RM > 6u) {
                fma_row(&acc6, a_value(av6[s], ac1.z, ar6, k), brow);
            }
            if (RM > 7u) {
                fma_row(&acc7, a_value(av7[s], ac1.w, ar7, k), brow);
            }
            if (RM > 8u) {
                fma_row(&acc8, a_value(av8[s], ac2.x, ar8, k), brow);
            }
            if (RM > 9u) {
                fma_row(&acc9, a_value(av9[s], ac2.y, ar9, k), brow);
            }
            if (RM > 10u) {
                fma_row(&acc10, a_value(av10[s], ac2.z, ar10, k), brow);
            }
            if (RM > 11u) {
                fma_row(&acc11, a_value(av11[s], ac2.w, ar11, k), brow);
            }
            if (RM > 12u) {
                fma_row(&acc12, a_value(av12[s], ac3.x, ar12, k), brow);
            }
            if (RM > 13u) {
                fma_row(&acc13, a_value(av13[s], ac3.y, ar13, k), brow);
            }
            if (RM > 14u) {
                fma_row(&acc14, a_value(av14[s], ac3.z, ar14, k), brow);
            }
            if (RM > 15u) {
                fma_row(&acc15, a_value(av15[s], ac3.w, ar15, k), brow);
            }
        }
        if (KU > 1u) {
            let s = 1u;
            let k = kq + s;
            // B's row k over the block's column groups.
            var brow: array<vec4<f32>, 4>;
            switch B_MODE {
                case 1u: {
                    brow[0] = vec4<f32>(bv0[s], bv1[s], bv2[s], bv3[s]);
                    if (CG > 1u) {
                        brow[1] = vec4<f32>(bv4[s], bv5[s], bv6[s], bv7[s]);
                    }
                    if (CG > 2u) {
                        brow[2] = vec4<f32>(bv8[s], bv9[s], bv10[s], bv11[s]);
                    }
                    if (CG > 3u) {
                        brow[3] = vec4<f32>(bv12[s], bv13[s], bv14[s], bv15[s]);
                    }
                }
                case 2u: {
                    brow[0] = vec4<f32>(b[bc0 + k * b_rs4]);
                    if (CG > 1u) {
                        brow[1] = vec4<f32>(b[bc1 + k * b_rs4]);
                    }
                    if (CG > 2u) {
                        brow[2] = vec4<f32>(b[bc2 + k * b_rs4]);
                    }
                    if (CG > 3u) {
                        brow[3] = vec4<f32>(b[bc3 + k * b_rs4]);
                    }
                }
                case 3u: {
                    // The vec4s that cover the row, which starts `shift` floats into the first
                    // (kq is a multiple of 4).
                    let shift = (s * B_SHIFT) % 4u;
                    let at = bc0 + kk * p.b_rs + (s * p.b_rs) / 4u;
                    let w0 = vec4<f32>(b[at]);
                    var w1 = w0;
                    var w2 = w0;
                    var w3 = w0;
                    var w4 = w0;
                    if (CG > 1u || (CG == 1u && shift != 0u)) {
                        w1 = vec4<f32>(b[min(at + 1u, blast)]);
                    }
                    if (CG > 2u || (CG == 2u && shift != 0u)) {
                        w2 = vec4<f32>(b[min(at + 2u, blast)]);
                    }
                    if (CG > 3u || (CG == 3u && shift != 0u)) {
                        w3 = vec4<f32>(b[min(at + 3u, blast)]);
                    }
                    if (CG > 4u || (CG == 4u && shift != 0u)) {
                        w4 = vec4<f32>(b[min(at + 4u, blast)]);
                    }
                    brow[0] = window(w0, w1, shift);
                    if (CG > 1u) {
                        brow[1] = window(w1, w2, shift);
                    }
                    if (CG > 2u) {
                        brow[2] = window(w2, w3, shift);
                    }
                    if (CG > 3u) {
                        brow[3] = window(w3, w4, shift);
                    }
                }
                default: {
                    let row = k * p.b_rs;
                    brow[0] = vec4<f32>(
                        vec4<f32>(b[bc0 + row]).x,
                        vec4<f32>(b[bc1 + row]).x,
                        vec4<f32>(b[bc2 + row]).x,
                        vec4<f32>(b[bc3 + row]).x
                    );
                    if (CG > 1u) {
                        brow[1] = vec4<f32>(
                            vec4<f32>(b[bc4 + row]).x,
                            vec4<f32>(b[bc5 + row]).x,
                            vec4<f32>(b[bc6 + row]).x,
                            vec4<f32>(b[bc7 + row]).x
                        );
                    }
                    if (CG > 2u) {
                        brow[2] = vec4<f32>(
                            vec4<f32>(b[bc8 + row]).x,
                            vec4<f32>(b[bc9 + row]).x,
                            vec4<f32>(b[bc10 + row]).x,
                            vec4<f32>(b[bc11 + row]).x
                        );
                    }
                    if (CG > 3u) {
                        brow[3] = vec4<f32>(
                            vec4<f32>(b[bc12 + row]).x,
                            vec4<f32>(b[bc13 + row]).x,
                            vec4<f32>(b[bc14 + row]).x,
                            vec4<f32>(b[bc15 + row]).x
                        );
                    }
                }
            }
            let ac0 = a_across(ar0, k, 0u);
            let ac1 = a_across(ar0, k, 1u);
            let ac2 = a_across(ar0, k, 2u);
            let ac3 = a_across(ar0, k, 3u);
            if (RM > 0u) {
                fma_row(&acc0, a_value(av0[s], ac0.x, ar0, k), brow);
            }
            if (RM > 1u) {
                fma_row(&acc1, a_value(av1[s], ac0.y, ar1, k), brow);
            }
            if (RM > 2u) {
                fma_row(&acc2, a_value(av2[s], ac0.z, ar2, k), brow);
            }
            if (RM > 3u) {
                fma_row(&acc3, a_value(av3[s], ac0.w, ar3, k), brow);
            }
            if (RM > 4u) {
                fma_row(&acc4, a_value(av4[s], ac1.x, ar4, k), brow);
            }
            if (RM > 5u) {
                fma_row(&acc5, a_value(av5[s], ac1.y, ar5, k), brow);
            }
            if (RM > 6u) {
                fma_row(&acc6, a_value(av6[s], ac1.z, ar6, k), brow);
            }
            if (RM > 7u) {
                fma_row(&acc7, a_value(av7[s], ac1.w, ar7, k), brow);
            }
            if (RM > 8u) {
                fma_row(&acc8, a_value(av8[s], ac2.x, ar8, k), brow);
            }
            if (RM > 9u) {
                fma_row(&acc9, a_value(av9[s], ac2.y, ar9, k), brow);
            }
            if (RM > 10u) {
                fma_row(&acc10, a_value(av10[s], ac2.z, ar10, k), brow);
            }
            if (RM > 11u) {
                fma_row(&acc11, a_value(av11[s], ac2.w, ar11, k), brow);
            }
            if (RM > 12u) {
                fma_row(&acc12, a_value(av12[s], ac3.x, ar12, k), brow);
            }
            if (RM > 13u) {
                fma_row(&acc13, a_value(av13[s], ac3.y, ar13, k), brow);
            }
            if (RM > 14u) {
                fma_row(&acc14, a_value(av14[s], ac3.z, ar14, k), brow);
            }
            if (RM > 15u) {
                fma_row(&acc15, a_value(av15[s], ac3.w, ar15, k), brow);
            }
        }
        if (KU > 2u) {
            let s = 2u;
            let k = kq + s;
            // B's row k over the block's column groups.
            var brow: array<vec4<f32>, 4>;
            switch B_MODE {
                case 1u: {
                    brow[0] = vec4<f32>(bv0[s], bv1[s], bv2[s], bv3[s]);
                    if (CG > 1u) {
                        brow[1] = vec4<f32>(bv4[s], bv5[s], bv6[s], bv7[s]);
                    }
                    if (CG > 2u) {
                        brow[2] = vec4<f32>(bv8[s], bv9[s], bv10[s], bv11[s]);
                    }
                    if (CG > 3u) {
                        brow[3] = vec4<f32>(bv12[s], bv13[s], bv14[s], bv15[s]);
                    }
                }
                case 2u: {
                    brow[0] = vec4<f32>(b[bc0 + k * b_rs4]);
                    if (CG > 1u) {
                        brow[1] = vec4<f32>(b[bc1 + k * b_rs4]);
                    }
                    if (CG > 2u) {
                        brow[2] = vec4<f32>(b[bc2 + k * b_rs4]);
                    }
                    if (CG > 3u) {
                        brow[3] = vec4<f32>(b[bc3 + k * b_rs4]);
                    }
                }
                case 3u: {
                    // The vec4s that cover the row, which starts `shift` floats into the first
                    // (kq is a multiple of 4).
                    let shift = (s * B_SHIFT) % 4u;
                    let at = bc0 + kk * p.b_rs + (s * p.b_rs) / 4u;
                    let w0 = vec4<f32>(b[at]);
                    var w1 = w0;
                    var w2 = w0;
                    var w3 = w0;
                    var w4 = w0;
                    if (CG > 1u || (CG == 1u && shift != 0u)) {
                        w1 = vec4<f32>(b[min(at + 1u, blast)]);
                    }
                    if (CG > 2u || (CG == 2u && shift != 0u)) {
                        w2 = vec4<f32>(b[min(at + 2u, blast)]);
                    }
                    if (CG > 3u || (CG == 3u && shift != 0u)) {
                        w3 = vec4<f32>(b[min(at + 3u, blast)]);
                    }
                    if (CG > 4u || (CG == 4u && shift != 0u)) {
                        w4 = vec4<f32>(b[min(at + 4u, blast)]);
                    }
                    brow[0] = window(w0, w1, shift);
                    if (CG > 1u) {
                        brow[1] = window(w1, w2, shift);
                    }
                    if (CG > 2u) {
                        brow[2] = window(w2, w3, shift);
                    }
                    if (CG > 3u) {
                        brow[3] = window(w3, w4, shift);
                    }
                }
                default: {
                    let row = k * p.b_rs;
                    brow[0] = vec4<f32>(
                        vec4<f32>(b[bc0 + row]).x,
                        vec4<f32>(b[bc1 + row]).x,
                        vec4<f32>(b[bc2 + row]).x,
                        vec4<f32>(b[bc3 + row]).x
                    );
                    if (CG > 1u) {
                        brow[1] = vec4<f32>(
                            vec4<f32>(b[bc4 + row]).x,
                            vec4<f32>(b[bc5 + row]).x,
                            vec4<f32>(b[bc6 + row]).x,
                            vec4<f32>(b[bc7 + row]).x
                        );
                    }
                    if (CG > 2u) {
                        brow[2] = vec4<f32>(
                            vec4<f32>(b[bc8 + row]).x,
                            vec4<f32>(b[bc9 + row]).x,
                            vec4<f32>(b[bc10 + row]).x,
                            vec4<f32>(b[bc11 + row]).x
                        );
                    }
                    if (CG > 3u) {
                        brow[3] = vec4<f32>(
                            vec4<f32>(b[bc12 + row]).x,
                            vec4<f32>(b[bc13 + row]).x,
                            vec4<f32>(b[bc14 + row]).x,
                            vec4<f32>(b[bc15 + row]).x
                        );
                    }
                }
            }
            let ac0 = a_across(ar0, k, 0u);
            let ac1 = a_across(ar0, k, 1u);
            let ac2 = a_across(ar0, k, 2u);
            let ac3 = a_across(ar0, k, 3u);
            if (RM > 0u) {
                fma_row(&acc0, a_value(av0[s], ac0.x, ar0, k), brow);
            }
            if (RM > 1u) {
                fma_row(&acc1, a_value(av1[s], ac0.y, ar1, k), brow);
            }
            if (RM > 2u) {
                fma_row(&acc2, a_value(av2[s], ac0.z, ar2, k), brow);
            }
            if (RM > 3u) {
                fma_row(&acc3, a_value(av3[s], ac0.w, ar3, k), brow);
            }
            if (RM > 4u) {
                fma_row(&acc4, a_value(av4[s], ac1.x, ar4, k), brow);
            }
            if (RM > 5u) {
                fma_row(&acc5, a_value(av5[s], ac1.y, ar5, k), brow);
            }
            if (RM > 6u) {
                fma_row(&acc6, a_value(av6[s], ac1.z, ar6, k), brow);
            }
            if (RM > 7u) {
                fma_row(&acc7, a_value(av7[s], ac1.w, ar7, k), brow);
            }
            if (RM > 8u) {
                fma_row(&acc8, a_value(av8[s], ac2.x, ar8, k), brow);
            }
            if (RM > 9u) {
                fma_row(&acc9, a_value(av9[s], ac2.y, ar9, k), brow);
            }
            if (RM > 10u) {
                fma_row(&acc10, a_value(av10[s], ac2.z, ar10, k), brow);
            }
            if (RM > 11u) {
                fma_row(&acc11, a_value(av11[s], ac2.w, ar11, k), brow);
            }
            if (RM > 12u) {
                fma_row(&acc12, a_value(av12[s], ac3.x, ar12, k), brow);
            }
            if (RM > 13u) {
                fma_row(&acc13, a_value(av13[s], ac3.y, ar13, k), brow);
            }
            if (RM > 14u) {
                fma_row(&acc14, a_value(av14[s], ac3.z, ar14, k), brow);
            }
            if (RM > 15u) {
                fma_row(&acc15, a_value(av15[s], ac3.w, ar15, k), brow);
            }
        }
        if (KU > 3u) {
            let s = 3u;
            let k = kq + s;
            // B's row k over the block's column groups.
            var brow: array<vec4<f32>, 4>;
            switch B_MODE {
                case 1u: {
                    brow[0] = vec4<f32>(bv0[s], bv1[s], bv2[s], bv3[s]);
                    if (CG > 1u) {
                        brow[1] = vec4<f32>(bv4[s], bv5[s], bv6[s], bv7[s]);
                    }
                    if (CG > 2u) {
                        brow[2] = vec4<f32>(bv8[s], bv9[s], bv10[s], bv11[s]);
                    }
                    if (CG > 3u) {
                        brow[3] = vec4<f32>(bv12[s], bv13[s], bv14[s], bv15[s]);
                    }
                }
                case 2u: {
                    brow[0] = vec4<f32>(b[bc0 + k * b_rs4]);
                    if (CG > 1u) {
                        brow[1] = vec4<f32>(b[bc1 + k * b_rs4]);
                    }
                    if (CG > 2u) {
                        brow[2] = vec4<f32>(b[bc2 + k * b_rs4]);
                    }
                    if (CG > 3u) {
                        brow[3] = vec4<f32>(b[bc3 + k * b_rs4]);
                    }
                }
                case 3u: {
                    // The vec4s that cover the row, which starts `shift` floats into the first
                    // (kq is a multiple of 4).
                    let shift = (s * B_SHIFT) % 4u;
                    let at = bc0 + kk * p.b_rs + (s * p.b_rs) / 4u;
                    let w0 = vec4<f32>(b[at]);
                    var w1 = w0;
                    var w2 = w0;
                    var w3 = w0;
                    var w4 = w0;
                    if (CG > 1u || (CG == 1u && shift != 0u)) {
                        w1 = vec4<f32>(b[min(at + 1u, blast)]);
                    }
                    if (CG > 2u || (CG == 2u && shift != 0u)) {
                        w2 = vec4<f32>(b[min(at + 2u, blast)]);
                    }
                    if (CG > 3u || (CG == 3u && shift != 0u)) {
                        w3 = vec4<f32>(b[min(at + 3u, blast)]);
                    }
                    if (CG > 4u || (CG == 4u && shift != 0u)) {
                        w4 = vec4<f32>(b[min(at + 4u, blast)]);
                    }
                    brow[0] = window(w0, w1, shift);
                    if (CG > 1u) {
                        brow[1] = window(w1, w2, shift);
                    }
                    if (CG > 2u) {
                        brow[2] = window(w2, w3, shift);
                    }
                    if (CG > 3u) {
                        brow[3] = window(w3, w4, shift);
                    }
                }
                default: {
                    let row = k * p.b_rs;
                    brow[0] = vec4<f32>(
                        vec4<f32>(b[bc0 + row]).x,
                        vec4<f32>(b[bc1 + row]).x,
                        vec4<f32>(b[bc2 + row]).x,
                        vec4<f32>(b[bc3 + row]).x
                    );
                    if (CG > 1u) {
                        brow[1] = vec4<f32>(
                            vec4<f32>(b[bc4 + row]).x,
                            vec4<f32>(b[bc5 + row]).x,
                            vec4<f32>(b[bc6 + row]).x,
                            vec4<f32>(b[bc7 + row]).x
                        );
                    }
                    if (CG > 2u) {
                        brow[2] = vec4<f32>(
                            vec4<f32>(b[bc8 + row]).x,
                            vec4<f32>(b[bc9 + row]).x,
                            vec4<f32>(b[bc10 + row]).x,
                            vec4<f32>(b[bc11 + row]).x
                        );
                    }
                    if (CG > 3u) {
                        brow[3] = vec4<f32>(
                            vec4<f32>(b[bc12 + row]).x,
                            vec4<f32>(b[bc13 + row]).x,
                            vec4<f32>(b[bc14 + row]).x,
                            vec4<f32>(b[bc15 + row]).x
                        );
                    }
                }
            }
            let ac0 = a_across(ar0, k, 0u);
            let ac1 = a_across(ar0, k, 1u);
            let ac2 = a_across(ar0, k, 2u);
            let ac3 = a_across(ar0, k, 3u);
            if (RM > 0u) {
                fma_row(&acc0, a_value(av0[s], ac0.x, ar0, k), brow);
            }
            if (RM > 1u) {
                fma_row(&acc1, a_value(av1[s], ac0.y, ar1, k), brow);
            }
            if (RM > 2u) {
                fma_row(&acc2, a_value(av2[s], ac0.z, ar2, k), brow);
            }
            if (RM > 3u) {
                fma_row(&acc3, a_value(av3[s], ac0.w, ar3, k), brow);
            }
            if (RM > 4u) {
                fma_row(&acc4, a_value(av4[s], ac1.x, ar4, k), brow);
            }
            if (RM > 5u) {
                fma_row(&acc5, a_value(av5[s], ac1.y, ar5, k), brow);
            }
            if (RM > 6u) {
                fma_row(&acc6, a_value(av6[s], ac1.z, ar6, k), brow);
            }
            if (RM > 7u) {
                fma_row(&acc7, a_value(av7[s], ac1.w, ar7, k), brow);
            }
            if (RM > 8u) {
                fma_row(&acc8, a_value(av8[s], ac2.x, ar8, k), brow);
            }
            if (RM > 9u) {
                fma_row(&acc9, a_value(av9[s], ac2.y, ar9, k), brow);
            }
            if (RM > 10u) {
                fma_row(&acc10, a_value(av10[s], ac2.z, ar10, k), brow);
            }
            if (RM > 11u) {
                fma_row(&acc11, a_value(av11[s], ac2.w, ar11, k), brow);
            }
            if (RM > 12u) {
                fma_row(&acc12, a_value(av12[s], ac3.x, ar12, k), brow);
            }
            if (RM > 13u) {
                fma_row(&acc13, a_value(av13[s], ac3.y, ar13, k), brow);
            }
            if (RM > 14u) {
                fma_row(&acc14, a_value(av14[s], ac3.z, ar14, k), brow);
            }
            if (RM > 15u) {
                fma_row(&acc15, a_value(av15[s], ac3.w, ar15, k), brow);
            }
        }
    }
    // Alpha, C, the post-ops and the store, row by row.
    if (RM > 0u) {
        store_row(acc0, i0 + 0u, j0, yb);
    }
    if (RM > 1u) {
        store_row(acc1, i0 + 1u, j0, yb);
    }
    if (RM > 2u) {
        store_row(acc2, i0 + 2u, j0, yb);
    }
    if (RM > 3u) {
        store_row(acc3, i0 + 3u, j0, yb);
    }
    if (RM > 4u) {
        store_row(acc4, i0 + 4u, j0, yb);
    }
    if (RM > 5u) {
        store_row(acc5, i0 + 5u, j0, yb);
    }
    if (RM > 6u) {
        store_row(acc6, i0 + 6u, j0, yb);
    }
    if (RM > 7u) {
        store_row(acc7, i0 + 7u, j0, yb);
    }
    if (RM > 8u) {
        store_row(acc8, i0 + 8u, j0, yb);
    }
    if (RM > 9u) {
        store_row(acc9, i0 + 9u, j0, yb);
    }
    if (RM > 10u) {
        store_row(acc10, i0 + 10u, j0, yb);
    }
    if (RM > 11u) {
        store_row(acc11, i0 + 11u, j0, yb);
    }
    if (RM > 12u) {
        store_row(acc12, i0 + 12u, j0, yb);
    }
    if (RM > 13u) {
        store_row(acc13, i0 + 13u, j0, yb);
    }
    if (RM > 14u) {
        store_row(acc14, i0 + 14u, j0, yb);
    }
    if (RM > 15u) {
        store_row(acc15, i0 + 15u, j0, yb);
    }
}
