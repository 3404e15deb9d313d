// Attention (attention/vulkan.rs), float32: invocation r computes row r of Y, one query token
// of one (batch, query head), over the T = past + kv_new keys, as attention/cpu.rs does:
//
//   score_j = softcap((q * √scale) · (key_j * √scale)), bias_j = mask, causal, window and
//   padding frontiers; x_j = score_j + bias_j; p = softmax(x) (zeros where every bias_j is
//   -inf); y = Σ p_j value_j.
//
// Three passes over the keys (the row's maxima, the softmax's sum, then the weighted values)
// recompute each score rather than keep a row of T of them: the kernel serves any T. Y is
// accumulated where it lives. Keys j < past come from the caches, the rest from this step's
// K and V. With QK > 0 the row of qk_matmul_output [T] is written too: the soft-capped scores
// (1), with the bias added (2), or the probabilities (3).
//
// NaN is tested by its bits (a driver may fold `x != x`): a NaN in the scores or the bias
// spreads through the row's maximum as numpy's max spreads it in ONNX's reference.

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
// The optional operands: each read only where its override says (the dispatch binds another
// operand in the slot otherwise). attn_mask is f32 bits (MASK 1) or bool bytes (MASK 2);
// nonpad_kv_seqlen int64 as (low, high) words.
@group(0) @binding(4) var<storage, read> mask: array<u32>;
@group(0) @binding(5) var<storage, read> past_key: array<f32>;
@group(0) @binding(6) var<storage, read> past_value: array<f32>;
@group(0) @binding(7) var<storage, read> nonpad: array<u32>;
@group(0) @binding(8) var<storage, read_write> qk: array<f32>;

struct Params {
    q: u32,
    k: u32,
    v: u32,
    y: u32,
    mask: u32,
    past_key: u32,
    past_value: u32,
    nonpad: u32,
    qk: u32,
    // batch * q_heads * q_seq.
    rows: u32,
    q_seq: u32,
    q_heads: u32,
    // Query heads per key/value head.
    group: u32,
    total: u32,
    past: u32,
    head: u32,
    v_head: u32,
    // attn_mask's shape right-aligned to [batch, heads, queries, columns].
    mask_batch: u32,
    mask_heads: u32,
    mask_queries: u32,
    mask_columns: u32,
    // √scale, applied to Q and K each as the reference does.
    scale: f32,
    softcap: f32,
    // -1: that side of the window is unbounded.
    left: i32,
    right: i32,
}
var<immediate> p: Params;

override WG: u32 = 64u;
// Q, K, V and Y are [batch, seq, heads * head] rather than [batch, heads, seq, head].
override SEQ_MAJOR: bool = false;
override CAUSAL: bool = false;
// 0: no attn_mask; 1: float; 2: bool.
override MASK: u32 = 0u;
override PAST: bool = false;
override NONPAD: bool = false;
override SOFTCAP: bool = false;
override WINDOW: bool = false;
// 0: no qk_matmul_output; else what it holds (above).
override QK: u32 = 0u;

// -inf (WGSL has no such literal, and naga no constant bitcast).
fn neg_inf() -> f32 {
    return bitcast<f32>(0xff800000u);
}

fn divmod(n: u32, d: u32) -> vec2<u32> {
    return vec2<u32>(n / d, n % d);
}

fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

// numpy's max: NaN if either is.
fn max_nan(a: f32, b: f32) -> f32 {
    if (is_nan(a) || is_nan(b)) {
        return bitcast<f32>(0x7fc00000u);
    }
    return max(a, b);
}

fn cut(allowed: bool) -> f32 {
    return select(neg_inf(), 0.0, allowed);
}

// Where row `t` of head `h` starts in a Q, K, V or Y of `heads` heads of `size` over `seq`.
fn row_at(b: u32, h: u32, heads: u32, t: u32, seq: u32, size: u32) -> u32 {
    if (SEQ_MAJOR) {
        return ((b * seq + t) * heads + h) * size;
    }
    return ((b * heads + h) * seq + t) * size;
}

// The row's coordinates: batch entry, query head, query token, key/value head of the batch
// entry, and the query's frontier (the keys before it).
struct Row {
    b: u32,
    h: u32,
    i: u32,
    kv: u32,
    offset: i32,
}

fn key_element(r: Row, j: u32, e: u32) -> f32 {
    let kv_heads = p.q_heads / p.group;
    if (PAST && j < p.past) {
        return past_key[p.past_key + ((r.b * kv_heads + r.kv) * p.past + j) * p.head + e];
    }
    return k[p.k + row_at(r.b, r.kv, kv_heads, j - p.past, p.total - p.past, p.head) + e];
}

fn value_element(r: Row, j: u32, e: u32) -> f32 {
    let kv_heads = p.q_heads / p.group;
    if (PAST && j < p.past) {
        return past_value[p.past_value + ((r.b * kv_heads + r.kv) * p.past + j) * p.v_head + e];
    }
    return v[p.v + row_at(r.b, r.kv, kv_heads, j - p.past, p.total - p.past, p.v_head) + e];
}

// The soft-capped score of key j.
fn score(r: Row, j: u32) -> f32 {
    let qi = p.q + row_at(r.b, r.h, p.q_heads, r.i, p.q_seq, p.head);
    var s = 0.0;
    for (var e = 0u; e < p.head; e++) {
        s += (q[qi + e] * p.scale) * (key_element(r, j, e) * p.scale);
    }
    if (SOFTCAP) {
        s = tanh(s / p.softcap) * p.softcap;
    }
    return s;
}

// The valid keys of batch entry b (nonpad_kv_seqlen).
fn valid_keys(b: u32) -> i32 {
    return bitcast<i32>(nonpad[p.nonpad + 2u * b]);
}

fn bias(r: Row, j: u32) -> f32 {
    var x = 0.0;
    if (MASK != 0u) {
        if (j < p.mask_columns) {
            let at = (((r.b % p.mask_batch) * p.mask_heads + r.h % p.mask_heads) * p.mask_queries
                + r.i % p.mask_queries) * p.mask_columns + j;
            if (MASK == 1u) {
                x = bitcast<f32>(mask[p.mask + at]);
            } else {
                let byte = (mask[p.mask + at / 4u] >> (8u * (at % 4u))) & 0xffu;
                x = cut(byte != 0u);
            }
        } else {
            x = neg_inf();
        }
    }
    let diff = i32(r.i) + r.offset - i32(j);
    if (CAUSAL) {
        x += cut(diff >= 0i);
    }
    if (WINDOW) {
        x += cut((p.left < 0i || diff <= p.left) && (p.right < 0i || -diff <= p.right));
    }
    if (NONPAD) {
        x += cut(i32(j) < valid_keys(r.b));
    }
    return x;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let index = gid.x + gid.y * groups.x * WG;
    if (index >= p.rows) {
        return;
    }
    let bh = divmod(index, p.q_seq);
    let bq = divmod(bh.x, p.q_heads);
    var r = Row(bq.x, bq.y, bh.y, bq.y / p.group, i32(p.past));
    if (NONPAD && p.past == 0u) {
        r.offset = valid_keys(r.b) - i32(p.q_seq);
    }
    let yi = p.y + row_at(r.b, r.h, p.q_heads, r.i, p.q_seq, p.v_head);
    let qki = p.qk + index * p.total;
    var most_bias = neg_inf();
    var most = neg_inf();
    for (var j = 0u; j < p.total; j++) {
        let s = score(r, j);
        let b = bias(r, j);
        if (QK == 1u) {
            qk[qki + j] = s;
        }
        if (QK == 2u) {
            qk[qki + j] = s + b;
        }
        most_bias = max_nan(most_bias, b);
        most = max_nan(most, s + b);
    }
    for (var e = 0u; e < p.v_head; e++) {
        y[yi + e] = 0.0;
    }
    // No key may be attended: zeros.
    if (most_bias == neg_inf()) {
        if (QK == 3u) {
            for (var j = 0u; j < p.total; j++) {
                qk[qki + j] = 0.0;
            }
        }
        return;
    }
    let m = select(most, 0.0, most == neg_inf());
    var sum = 0.0;
    for (var j = 0u; j < p.total; j++) {
        sum += exp(score(r, j) + bias(r, j) - m);
    }
    sum = select(sum, 1.0, sum == 0.0);
    for (var j = 0u; j < p.total; j++) {
        let pj = exp(score(r, j) + bias(r, j) - m) / sum;
        if (QK == 3u) {
            qk[qki + j] = pj;
        }
        for (var e = 0u; e < p.v_head; e++) {
            y[yi + e] += pj * value_element(r, j, e);
        }
    }
}
