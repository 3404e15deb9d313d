// CumSum and CumProd (movement/vulkan.rs): each element sums (PRODUCT: multiplies) its prefix
// along the axis (n elements, `inner` apart), in the CPU's order so that floats round the
// same; EXCLUSIVE leaves the element itself out, REVERSE runs from the end. T is f32, i32 or
// u32 (both wrap); with WIDE (sums only), T is u32 and an element is two words, a 64-bit
// integer added with its carry.

alias T = f32;

override WG: u32 = 64u;
override EXCLUSIVE: bool = false;
override REVERSE: bool = false;
override WIDE: bool = false;
override PRODUCT: bool = false;

@group(0) @binding(0) var<storage, read> x: array<T>;
@group(0) @binding(1) var<storage, read_write> y: array<T>;

struct Params {
    x: u32,
    y: u32,
    count: u32,
    n: u32,
    inner: u32,
}
var<immediate> p: Params;

// Element e as a 64-bit integer (low word first).
fn wide(e: u32) -> vec2<u32> {
    return vec2<u32>(bitcast<u32>(x[p.x + 2u * e]), bitcast<u32>(x[p.x + 2u * e + 1u]));
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let g = gid.x + gid.y * groups.x * WG;
    if (g >= p.count) {
        return;
    }
    let j = (g / p.inner) % p.n;
    let base = g - j * p.inner;
    var acc = select(T(0), T(1), PRODUCT);
    var acc64 = vec2<u32>();
    for (var t = 0u; t < p.n; t++) {
        let at = select(t, p.n - 1u - t, REVERSE);
        if (EXCLUSIVE && at == j) {
            break;
        }
        let e = base + at * p.inner;
        if (WIDE) {
            let v = wide(e);
            let low = acc64.x + v.x;
            acc64 = vec2<u32>(low, acc64.y + v.y + select(0u, 1u, low < acc64.x));
        } else if (PRODUCT) {
            acc *= x[p.x + e];
        } else {
            acc += x[p.x + e];
        }
        if (at == j) {
            break;
        }
    }
    if (WIDE) {
        y[p.y + 2u * g] = bitcast<T>(acc64.x);
        y[p.y + 2u * g + 1u] = bitcast<T>(acc64.y);
    } else {
        y[p.y + g] = acc;
    }
}
