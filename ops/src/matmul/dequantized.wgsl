// Matrix product of float32 A and an 8-bit B that the kernel dequantizes as it loads it (both
// device classes; the operands of `ingot_ops::dequantizes_b`), or a float16 B that it widens
// (`ingot_ops::takes_f16_weights`: hooks `quad` and `level`, no scales or zero points):
//   Y[b, i, j] = post_op(alpha * scale[j] * sum_k A[b, i, k] (B[k, j] - zero[j]) (+ beta * C[i, j]))
// B is int8 or uint8, four to a word; its dequantization is float32 [2, N]: scales, then zero
// points. B - zero is exact in f32, and the scale is applied once per sum, so B never exists as
// floats in memory.
//
// Each invocation holds RM (1..8) rows x 4 columns of one batch's Y in registers, stepping K
// four at a time (KU = 4; one at a time when K is not a multiple of 4): A's four values of a
// row as one vec4 where its rows are contiguous (A_VEC), B's 4 x 4 block four values at a time
// where four lie together on a word boundary (B_MODE), else one by one. As in blocked.wgsl, the rows'
// accumulators are named, never indexed.
//
// MatMulIntegerToFloat (an integer product read as float32) runs the same loop: A is 8-bit
// too (AE u32) and the hooks replace `a_quad` (A's levels minus its zero point, which slot c
// holds), `column_scales` (ones) and `column_zeros` (B's zero points, which slot dq holds as
// bytes, DQ u32). Every product of levels is an exact integer in f32, and so is each sum
// below 2^24.

alias AE = vec4<f32>;
alias DQ = f32;
alias CE = f32;

@group(0) @binding(0) var<storage, read> a: array<AE>;
@group(0) @binding(1) var<storage, read> b: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> dq: array<DQ>;
// Gemm's C, read only by a replaced add_c (or A's zero point, read by a replaced a_quad).
@group(0) @binding(4) var<storage, read> c: array<CE>;
// Post-op operands, read only by a replaced post_op (three here: an integer product takes its
// scale, its bias and a residual).
@group(0) @binding(5) var<storage, read> r0: array<f32>;
@group(0) @binding(6) var<storage, read> r1: array<f32>;
@group(0) @binding(7) var<storage, read> r2: array<f32>;

// blocked.wgsl's block with the offset of `dq` after Y's: the same params follow.
struct Params {
    a: u32,
    b: u32,
    y: u32,
    dq: u32,
    c: u32,
    r0: u32,
    r1: u32,
    r2: u32,
    m: u32,
    n: u32,
    k: u32,
    batch: u32,
    d1: u32,
    a_s0: u32,
    a_s1: u32,
    b_s0: u32,
    b_s1: u32,
    // Strides in elements: A's of i and k (floats), B's of k and j (bytes).
    a_rs: u32,
    a_cs: u32,
    b_rs: u32,
    b_cs: u32,
    ldy: u32,
    y0: u32,
    c0: u32,
    c_rs: u32,
    c_cs: u32,
    alpha: f32,
    beta: f32,
    flags: u32,
}
var<immediate> p: Params;

// Rows of the block (1..8).
override RM: u32 = 4u;
// K steps per iteration: 4 when K is a multiple of 4, else 1.
override KU: u32 = 4u;
// A read as vec4s along k (rows contiguous, 16-byte aligned, KU = 4); else one float at a time.
override A_VEC: bool = true;
// How B is read: 0 a value at a time; 1 four k of one column together (B stored [N, K]);
// 2 four columns of one row together (B stored [K, N], N a multiple of 4).
override B_MODE: u32 = 2u;
override B_SIGNED: bool = true;
override WG: u32 = 64u;

// Gemm's beta * C, added to the scaled sum of element (i, j).
fn add_c(v: f32, i: u32, j: u32) -> f32 {
    return v;
}

fn post_op(v: f32, i: u32) -> f32 {
    return v;
}

// The scales and zero points of columns j.
fn column_scales(j: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(dq[p.dq + j.x], dq[p.dq + j.y], dq[p.dq + j.z], dq[p.dq + j.w]);
}

fn column_zeros(j: vec4<u32>) -> vec4<f32> {
    let z = p.dq + p.n;
    return vec4<f32>(dq[z + j.x], dq[z + j.y], dq[z + j.z], dq[z + j.w]);
}

// The four levels of a word, low byte first, signed or not.
fn word_levels(w: u32, signed: bool) -> vec4<f32> {
    if (signed) {
        let s = bitcast<i32>(w);
        return vec4<f32>(vec4<i32>(s << 24u, s << 16u, s << 8u, s) >> vec4<u32>(24u));
    }
    return vec4<f32>((vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(255u));
}

// The level of byte e % 4 of `word`, signed or not.
fn byte_level(word: u32, e: u32, signed: bool) -> f32 {
    let byte = (word >> (8u * (e % 4u))) & 255u;
    if (signed) {
        return f32(bitcast<i32>(byte << 24u) >> 24u);
    }
    return f32(byte);
}

// B's four values from element e (counted from B's start; a multiple of 4), and its value at
// element e. matmul/vulkan.rs replaces both for a float16 B (two to a word).
fn quad(e: u32) -> vec4<f32> {
    return word_levels(b[p.b + e / 4u], B_SIGNED);
}

fn level(e: u32) -> f32 {
    return byte_level(b[p.b + e / 4u], e, B_SIGNED);
}

// B's rows k..k+KU at the block's columns j (clamped to the matrix), minus their zero points z:
// column s of the result is row k + s.
fn b_block(k: u32, j: vec4<u32>, bb: u32, z: vec4<f32>) -> mat4x4<f32> {
    var rows: mat4x4<f32>;
    switch B_MODE {
        case 1u: {
            // Four k of each column.
            let c0 = quad(bb + j.x * p.b_cs + k) - z.x;
            let c1 = quad(bb + j.y * p.b_cs + k) - z.y;
            let c2 = quad(bb + j.z * p.b_cs + k) - z.z;
            let c3 = quad(bb + j.w * p.b_cs + k) - z.w;
            rows = transpose(mat4x4<f32>(c0, c1, c2, c3));
        }
        case 2u: {
            // The block's four columns of each row.
            let at = bb + k * p.b_rs + j.x;
            rows[0] = quad(at) - z;
            if (KU == 4u) {
                rows[1] = quad(at + p.b_rs) - z;
                rows[2] = quad(at + 2u * p.b_rs) - z;
                rows[3] = quad(at + 3u * p.b_rs) - z;
            }
        }
        default: {
            for (var s = 0u; s < KU; s++) {
                let r = bb + (k + s) * p.b_rs;
                rows[s] = vec4<f32>(
                    level(r + j.x * p.b_cs),
                    level(r + j.y * p.b_cs),
                    level(r + j.z * p.b_cs),
                    level(r + j.w * p.b_cs)
                ) - z;
            }
        }
    }
    return rows;
}

// A's values of row i at k..k+KU (zeros past KU).
fn a_quad(i: u32, k: u32, ab: u32) -> vec4<f32> {
    if (A_VEC) {
        return vec4<f32>(a[p.a + (ab + i * p.a_rs + k) / 4u]);
    }
    let at = p.a + ab + i * p.a_rs + k * p.a_cs;
    var v = vec4<f32>(vec4<f32>(a[at]).x, 0.0, 0.0, 0.0);
    if (KU == 4u) {
        v.y = vec4<f32>(a[at + p.a_cs]).x;
        v.z = vec4<f32>(a[at + 2u * p.a_cs]).x;
        v.w = vec4<f32>(a[at + 3u * p.a_cs]).x;
    }
    return v;
}

// Scales the sums of row i, applies alpha, C and the post-ops, and stores the columns that
// exist.
fn store_row(acc: vec4<f32>, scale: vec4<f32>, i: u32, j0: u32, yb: u32) {
    if (i >= p.m) {
        return;
    }
    let v = acc * scale;
    let yr = yb + i * p.ldy;
    for (var q = 0u; q < 4u; q++) {
        let j = j0 + q;
        if (j < p.n) {
            y[p.y + yr + j] = post_op(add_c(v[q] * p.alpha, i, j), yr + j);
        }
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * WG;
    let nb = (p.n + 3u) / 4u;
    let mb = (p.m + RM - 1u) / RM;
    if (t >= p.batch * mb * nb) {
        return;
    }
    let j0 = (t % nb) * 4u;
    let i0 = ((t / nb) % mb) * RM;
    let bi = t / (nb * mb);
    let q0 = bi / p.d1;
    let q1 = bi % p.d1;
    let ab = q0 * p.a_s0 + q1 * p.a_s1;
    let bb = q0 * p.b_s0 + q1 * p.b_s1;
    let yb = p.y0 + bi * p.m * p.ldy;
    // Columns past N repeat the last; rows past M the last row (neither is stored).
    let last = p.n - 1u;
    let j = min(vec4<u32>(j0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last));
    let scale = column_scales(j);
    let zero = column_zeros(j);
    let i1 = min(i0 + 1u, p.m - 1u);
    let i2 = min(i0 + 2u, p.m - 1u);
    let i3 = min(i0 + 3u, p.m - 1u);
    let i4 = min(i0 + 4u, p.m - 1u);
    let i5 = min(i0 + 5u, p.m - 1u);
    let i6 = min(i0 + 6u, p.m - 1u);
    let i7 = min(i0 + 7u, p.m - 1u);
    var acc0 = vec4<f32>();
    var acc1 = vec4<f32>();
    var acc2 = vec4<f32>();
    var acc3 = vec4<f32>();
    var acc4 = vec4<f32>();
    var acc5 = vec4<f32>();
    var acc6 = vec4<f32>();
    var acc7 = vec4<f32>();
    for (var k = 0u; k < p.k; k += KU) {
        let rows = b_block(k, j, bb, zero);
        acc0 += rows * a_quad(i0, k, ab);
        if (RM > 1u) {
            acc1 += rows * a_quad(i1, k, ab);
        }
        if (RM > 2u) {
            acc2 += rows * a_quad(i2, k, ab);
        }
        if (RM > 3u) {
            acc3 += rows * a_quad(i3, k, ab);
        }
        if (RM > 4u) {
            acc4 += rows * a_quad(i4, k, ab);
        }
        if (RM > 5u) {
            acc5 += rows * a_quad(i5, k, ab);
        }
        if (RM > 6u) {
            acc6 += rows * a_quad(i6, k, ab);
        }
        if (RM > 7u) {
            acc7 += rows * a_quad(i7, k, ab);
        }
    }
    store_row(acc0, scale, i0, j0, yb);
    if (RM > 1u) {
        store_row(acc1, scale, i0 + 1u, j0, yb);
    }
    if (RM > 2u) {
        store_row(acc2, scale, i0 + 2u, j0, yb);
    }
    if (RM > 3u) {
        store_row(acc3, scale, i0 + 3u, j0, yb);
    }
    if (RM > 4u) {
        store_row(acc4, scale, i0 + 4u, j0, yb);
    }
    if (RM > 5u) {
        store_row(acc5, scale, i0 + 5u, j0, yb);
    }
    if (RM > 6u) {
        store_row(acc6, scale, i0 + 6u, j0, yb);
    }
    if (RM > 7u) {
        store_row(acc7, scale, i0 + 7u, j0, yb);
    }
}
