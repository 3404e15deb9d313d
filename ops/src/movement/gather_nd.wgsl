// GatherND (movement/vulkan.rs): tuple t of the index tensor, `k` components, picks a slice of
// `inner` units of the source, component j moving it by its value times s[j]; with batch dims,
// the tuples of batch b (`per` of them) read inside batch b, `batch` units apart. Invocation g
// moves unit g of the destination: one u32 word or, with W = vec4<u32>, four.
//
// An index is wrapped into [0, n[j]) as on the CPU and clamped where it lies outside (the
// CPU's error): nothing is read outside the source.

alias W = u32;

override WG: u32 = 64u;
// u32 words per index (2: int64, whose low word is the index).
override INDEX_WORDS: u32 = 1u;

@group(0) @binding(0) var<storage, read> x: array<W>;
@group(0) @binding(1) var<storage, read_write> y: array<W>;
@group(0) @binding(2) var<storage, read> ix: array<u32>;

struct Params {
    x: u32,
    y: u32,
    ix: u32,
    count: u32,
    inner: u32,
    k: u32,
    per: u32,
    batch: u32,
    n: array<u32, 8>,
    s: array<u32, 8>,
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
    let ti = divmod(g, p.inner);
    let t = ti.x;
    var at = (t / p.per) * p.batch + ti.y;
    for (var j = 0u; j < p.k; j++) {
        let r = bitcast<i32>(ix[p.ix + (t * p.k + j) * INDEX_WORDS]);
        let n = i32(p.n[j]);
        at += u32(clamp(select(r, r + n, r < 0i), 0i, n - 1i)) * p.s[j];
    }
    y[p.y + g] = x[p.x + at];
}
