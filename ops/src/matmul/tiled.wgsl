// Matrix product in workgroup-memory tiles (GPUs): Y[b, i, j] = post_op(alpha * sum_k
// A[b, i, k] B[b, k, j] (+ beta * C[i, j])).
//
// A workgroup of BN/4 x BM/4 invocations computes a BM x BN tile of one batch's Y (batch =
// workgroup z), staging BK steps of A and B at a time in workgroup memory; invocation (tx, ty)
// owns rows ty + r BM/4 and columns tx + c BN/4, r and c in 0..4, so neighbouring invocations
// read neighbouring words of the tiles and of Y. Tiles are loaded with consecutive invocations
// on consecutive addresses: along the operand's contiguous dimension (A_K, B_K).

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
// Gemm's C, read only by a replaced add_c.
@group(0) @binding(3) var<storage, read> c: array<f32>;
// Post-op operands, read only by a replaced post_op.
@group(0) @binding(4) var<storage, read> r0: array<f32>;
@group(0) @binding(5) var<storage, read> r1: array<f32>;

// The same block as blocked.wgsl's.
struct Params {
    a: u32,
    b: u32,
    y: u32,
    c: u32,
    r0: u32,
    r1: u32,
    m: u32,
    n: u32,
    k: u32,
    batch: u32,
    d1: u32,
    a_s0: u32,
    a_s1: u32,
    b_s0: u32,
    b_s1: u32,
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

// The tile of Y (32 or 64 each).
override BM: u32 = 64u;
override BN: u32 = 64u;
// Whether A's k stride is 1 (tiles loaded along k), and B's.
override A_K: bool = true;
override B_K: bool = false;
const BK: u32 = 16u;

var<workgroup> ta: array<f32, BK * BM>;
var<workgroup> tb: array<f32, BK * BN>;

fn add_c(v: f32, i: u32, j: u32) -> f32 {
    return v;
}

fn post_op(v: f32, i: u32) -> f32 {
    return v;
}

@compute @workgroup_size(BN / 4u, BM / 4u)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let tx = BN / 4u;
    let ty = BM / 4u;
    let threads = tx * ty;
    let tid = lid.y * tx + lid.x;
    let bi = wg.z;
    let m0 = wg.y * BM;
    let n0 = wg.x * BN;
    let q0 = bi / p.d1;
    let q1 = bi % p.d1;
    let ab = p.a + q0 * p.a_s0 + q1 * p.a_s1;
    let bb = p.b + q0 * p.b_s0 + q1 * p.b_s1;
    let yb = p.y0 + bi * p.m * p.ldy;
    var acc: array<vec4<f32>, 4>;
    if ((p.flags & 1u) != 0u) {
        for (var r = 0u; r < 4u; r++) {
            let i = min(m0 + lid.y + r * ty, p.m - 1u);
            for (var c = 0u; c < 4u; c++) {
                let j = min(n0 + lid.x + c * tx, p.n - 1u);
                acc[r][c] = y[p.y + yb + i * p.ldy + j];
            }
        }
    }
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        for (var q = 0u; q < BM * BK / threads; q++) {
            let l = tid + q * threads;
            var o: u32;
            var kq: u32;
            if (A_K) {
                o = l / BK;
                kq = l % BK;
            } else {
                o = l % BM;
                kq = l / BM;
            }
            let go = m0 + o;
            let gk = k0 + kq;
            let at = ab + min(go, p.m - 1u) * p.a_rs + min(gk, p.k - 1u) * p.a_cs;
            ta[kq * BM + o] = select(0.0, a[at], go < p.m && gk < p.k);
        }
        for (var q = 0u; q < BN * BK / threads; q++) {
            let l = tid + q * threads;
            var o: u32;
            var kq: u32;
            if (B_K) {
                o = l / BK;
                kq = l % BK;
            } else {
                o = l % BN;
                kq = l / BN;
            }
            let go = n0 + o;
            let gk = k0 + kq;
            let at = bb + min(go, p.n - 1u) * p.b_cs + min(gk, p.k - 1u) * p.b_rs;
            tb[kq * BN + o] = select(0.0, b[at], go < p.n && gk < p.k);
        }
        workgroupBarrier();
        for (var kq = 0u; kq < BK; kq++) {
            let av = vec4<f32>(
                ta[kq * BM + lid.y],
                ta[kq * BM + lid.y + ty],
                ta[kq * BM + lid.y + 2u * ty],
                ta[kq * BM + lid.y + 3u * ty]
            );
            let bv = vec4<f32>(
                tb[kq * BN + lid.x],
                tb[kq * BN + lid.x + tx],
                tb[kq * BN + lid.x + 2u * tx],
                tb[kq * BN + lid.x + 3u * tx]
            );
            acc[0] += av.x * bv;
            acc[1] += av.y * bv;
            acc[2] += av.z * bv;
            acc[3] += av.w * bv;
        }
        workgroupBarrier();
    }
    for (var r = 0u; r < 4u; r++) {
        let i = m0 + lid.y + r * ty;
        for (var c = 0u; c < 4u; c++) {
            let j = n0 + lid.x + c * tx;
            if (i < p.m && j < p.n) {
                let idx = yb + i * p.ldy + j;
                var v = acc[r][c];
                if ((p.flags & 2u) == 0u) {
                    v = post_op(add_c(v * p.alpha, i, j), idx);
                }
                y[p.y + idx] = v;
            }
        }
    }
}
