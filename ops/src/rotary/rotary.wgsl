// RotaryEmbedding (rotary/vulkan.rs): invocation i writes element i of Y. X is rows of `head`
// elements (one head of one token); element d < rot of a row belongs to pair k with the element
// `gap` away, (2k, 2k + 1) if INTERLEAVED, else (k, k + rot / 2); a pair (x1, x2) becomes
// (c x1 - s x2, s x1 + c x2) with c, s the token's cache values of column k. Elements past
// `rot` are copied. Each invocation reads its partner too, so the step never runs in place.
//
// Row r's token (the cache row, or the index of its position id) is
// (r / (heads * seq)) * seq + (r / token_stride) % seq: token_stride is 1 for a
// [batch, heads, seq, head] X and `heads` for a [batch, seq, heads * head] one.
//
// A position id outside the caches is clamped into them (the CPU reports it as an error):
// nothing is read outside the caches.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> cos_cache: array<f32>;
@group(0) @binding(2) var<storage, read> sin_cache: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
// position_ids, int64 as (low, high) words: bound and read only with POSITIONS.
@group(0) @binding(4) var<storage, read> ids: array<u32>;

struct Params {
    x: u32,
    cos_cache: u32,
    sin_cache: u32,
    y: u32,
    ids: u32,
    count: u32,
    head: u32,
    rot: u32,
    half: u32,
    seq: u32,
    // heads * seq: the rows of one batch entry.
    per_batch: u32,
    token_stride: u32,
    // The caches' rows (with POSITIONS).
    positions: u32,
}
var<immediate> p: Params;

override WG: u32 = 64u;
override INTERLEAVED: bool = false;
// position_ids pick the cache rows; without, the caches hold a row per token.
override POSITIONS: bool = false;

fn divmod(n: u32, d: u32) -> vec2<u32> {
    return vec2<u32>(n / d, n % d);
}

// The cache row of token t.
fn cache_row(t: u32) -> u32 {
    if (!POSITIONS) {
        return t;
    }
    let lo = ids[p.ids + 2u * t];
    let hi = ids[p.ids + 2u * t + 1u];
    if (hi != 0u) {
        // Negative, or 2^32 and more.
        return select(p.positions - 1u, 0u, bitcast<i32>(hi) < 0i);
    }
    return min(lo, p.positions - 1u);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + gid.y * groups.x * WG;
    if (i >= p.count) {
        return;
    }
    let rd = divmod(i, p.head);
    let d = rd.y;
    if (d >= p.rot) {
        y[p.y + i] = x[p.x + i];
        return;
    }
    let r = rd.x;
    let t = divmod(r, p.per_batch).x * p.seq + divmod(divmod(r, p.token_stride).x, p.seq).y;
    // Whether d is the pair's first element, the pair's column k, and where its first is.
    let first = select(d < p.half, (d & 1u) == 0u, INTERLEAVED);
    let k = select(select(d - p.half, d, first), d >> 1u, INTERLEAVED);
    let a = i - d + select(k, 2u * k, INTERLEAVED);
    let gap = select(p.half, 1u, INTERLEAVED);
    let at = cache_row(t) * p.half + k;
    let c = cos_cache[p.cos_cache + at];
    let s = sin_cache[p.sin_cache + at];
    let x1 = x[p.x + a];
    let x2 = x[p.x + a + gap];
    y[p.y + i] = select(s * x1 + c * x2, c * x1 - s * x2, first);
}
