// Attention's present_key or present_value (attention/vulkan.rs): the cache with this step's
// keys or values appended, [batch, kv_heads, total, size]. Invocation i writes element i:
// token t < past from the cache, the rest from K or V ([batch, heads, kv_new, size], or
// [batch, kv_new, heads * size] with SEQ_MAJOR).

@group(0) @binding(0) var<storage, read> new_rows: array<f32>;
@group(0) @binding(1) var<storage, read_write> present: array<f32>;
// Bound and read only with PAST.
@group(0) @binding(2) var<storage, read> cache: array<f32>;

struct Params {
    new_rows: u32,
    present: u32,
    cache: u32,
    count: u32,
    size: u32,
    total: u32,
    past: u32,
    kv_heads: u32,
}
var<immediate> p: Params;

override WG: u32 = 64u;
override SEQ_MAJOR: bool = false;
override PAST: bool = false;

fn divmod(n: u32, d: u32) -> vec2<u32> {
    return vec2<u32>(n / d, n % d);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + gid.y * groups.x * WG;
    if (i >= p.count) {
        return;
    }
    let te = divmod(i, p.size);
    let bt = divmod(te.x, p.total);
    let t = bt.y;
    if (PAST && t < p.past) {
        present[p.present + i] = cache[p.cache + (bt.x * p.past + t) * p.size + te.y];
        return;
    }
    let bh = divmod(bt.x, p.kv_heads);
    let l = t - p.past;
    let kv_new = p.total - p.past;
    var at = ((bt.x * kv_new) + l) * p.size;
    if (SEQ_MAJOR) {
        at = ((bh.x * kv_new + l) * p.kv_heads + bh.y) * p.size;
    }
    present[p.present + i] = new_rows[p.new_rows + at + te.y];
}
