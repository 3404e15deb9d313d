// TensorScatter (movement/vulkan.rs): the cache [outer, rows, inner] with the update
// [outer, seq, inner] written along the middle axis from each batch's write index on (outer
// counts the batch and the dims before the axis, `per_batch` of them to a batch). Output row j
// of batch b is the update's row s = j - start[b] (CIRCULAR: modulo rows) where s < seq, the
// cache's row j elsewhere: one gather per output word, so it may be written over the cache.
// An element is UNITS words (2 for 8-byte types). The write indices are int64, read by their
// low words; without them (INDICES false) every batch writes at 0. Where a linear write
// would pass the cache, the rows past it are dropped (the CPU refuses the index).

override WG: u32 = 64u;
override UNITS: u32 = 1u;
override CIRCULAR: bool = false;
override INDICES: bool = true;

@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read> u: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<u32>;
// Optional, so last (bound only with INDICES).
@group(0) @binding(3) var<storage, read> w: array<u32>;

struct Params {
    x: u32,
    u: u32,
    y: u32,
    w: u32,
    count: u32,
    inner: u32,
    rows: u32,
    seq: u32,
    per_batch: u32,
}
var<immediate> p: Params;

fn divmod(n: u32, d: u32) -> vec2<u32> {
    return vec2<u32>(n / d, n % d);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let g = gid.x + gid.y * groups.x * WG;
    if (g >= p.count) {
        return;
    }
    let word = g % UNITS;
    let e = divmod(g / UNITS, p.inner);
    let row = divmod(e.x, p.rows);
    let outer = row.x;
    let j = row.y;
    var start = 0u;
    if (INDICES) {
        start = w[p.w + 2u * (outer / p.per_batch)];
    }
    // Wrapping: a row before the start comes out past seq.
    var s = j - start;
    if (CIRCULAR) {
        s = (j + p.rows - start % p.rows) % p.rows;
    }
    let updated = s < p.seq;
    let at = ((outer * p.seq + select(0u, s, updated)) * p.inner + e.y) * UNITS + word;
    y[p.y + g] = select(x[p.x + g], u[p.u + at], updated);
}
