// Trilu (movement/vulkan.rs): the elements of each matrix on and above (UPPER) or on and below
// diagonal k, zeros elsewhere. Invocation g moves word g; an element is UNITS words (2 for
// 8-byte types).

override WG: u32 = 64u;
override UNITS: u32 = 1u;
override UPPER: bool = true;

@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read_write> y: array<u32>;

struct Params {
    x: u32,
    y: u32,
    count: u32,
    rows: u32,
    cols: u32,
    k: i32,
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
    let rc = divmod(g / UNITS, p.cols);
    let diagonal = i32(rc.y) - i32(divmod(rc.x, p.rows).y);
    let keep = select(diagonal <= p.k, diagonal >= p.k, UPPER);
    y[p.y + g] = select(0u, x[p.x + g], keep);
}
