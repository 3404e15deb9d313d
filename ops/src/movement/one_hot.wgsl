// OneHot (movement/vulkan.rs): output [outer, depth, inner] is v[1] where the index at
// [outer, inner] (negative ones counted from `depth`) is the middle coordinate, v[0] elsewhere.
// Values move as words: an element is UNITS of them (2 for 8-byte types). INDEX is the index
// tensor's type: 0 int32, 1 int64 (an index only where its high word is its low word's sign),
// 2 f32 (truncated toward zero as the CPU's `as i64`, NaN as 0; none beyond i32).

override WG: u32 = 64u;
override UNITS: u32 = 1u;
override INDEX: u32 = 0u;

@group(0) @binding(0) var<storage, read> ix: array<u32>;
@group(0) @binding(1) var<storage, read> v: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<u32>;

struct Params {
    ix: u32,
    v: u32,
    y: u32,
    count: u32,
    depth: u32,
    inner: u32,
}
var<immediate> p: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let g = gid.x + gid.y * groups.x * WG;
    if (g >= p.count) {
        return;
    }
    let e = g / UNITS;
    let j = i32((e / p.inner) % p.depth);
    let at = (e / (p.depth * p.inner)) * p.inner + e % p.inner;
    var r = 0i;
    var valid = true;
    if (INDEX == 0u) {
        r = bitcast<i32>(ix[p.ix + at]);
    } else if (INDEX == 1u) {
        r = bitcast<i32>(ix[p.ix + 2u * at]);
        valid = ix[p.ix + 2u * at + 1u] == select(0u, 0xffffffffu, r < 0i);
    } else {
        let w = ix[p.ix + at];
        let nan = (w & 0x7fffffffu) > 0x7f800000u;
        let f = bitcast<f32>(w);
        r = select(i32(trunc(clamp(f, -2147483648.0, 2147483520.0))), 0i, nan);
        valid = nan || abs(f) < 2147483648.0;
    }
    let hot = valid && select(r, r + i32(p.depth), r < 0i) == j;
    y[p.y + g] = v[p.v + g % UNITS + select(0u, UNITS, hot)];
}
