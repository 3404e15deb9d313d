// A strided copy, which most movement ops are (movement/vulkan.rs): Reshape's and Identity's,
// Transpose, Slice, Expand, Tile, DepthToSpace, Split and Concat, Gather, GatherElements.
// Values move as u32 words whatever their type: invocation g moves unit g of the iteration
// space, one word or, with W = vec4<u32>, four. With PACK 2 or 4 the elements are 2 or 1 bytes
// that do not group into whole words: invocation g then assembles destination word g from its
// PACK elements, and the last word keeps the bytes past the tensor's end.
//
// The iteration space has DIMS dims (1 to 8), innermost first: dim k has n[k] coordinates, and
// coordinate c moves the source by c * s[k] units and the destination by c * d[k]. A negative
// stride is written in two's complement: the u32 sums wrap and come back inside the tensor.
// With CONTIGUOUS the destination is the iteration index itself.
//
// Gathers (GATHER > 0) read the source coordinate of dim `axis` from the index tensor `ix`:
// Gather (1) at that dim's own coordinate, GatherElements (2) at the iteration's element
// (g / UNITS). The index is wrapped into [0, axis_n) as on the CPU, and clamped where it lies
// outside (the CPU's error): nothing is read outside the source. DynamicSlice (3) reads one
// index, where its window of n[axis] coordinates starts, clamped so that the window stays
// inside the dim (the CPU's error where it would not).

alias W = u32;

override WG: u32 = 64u;
override DIMS: u32 = 1u;
override CONTIGUOUS: bool = true;
override PACK: u32 = 1u;
override GATHER: u32 = 0u;
// Units per element (2: 8-byte elements as words), and u32 words per index (2: int64, whose
// low word is the index).
override UNITS: u32 = 1u;
override INDEX_WORDS: u32 = 1u;

@group(0) @binding(0) var<storage, read> x: array<W>;
@group(0) @binding(1) var<storage, read_write> y: array<W>;
@group(0) @binding(2) var<storage, read> ix: array<u32>;

struct Params {
    x: u32,
    y: u32,
    ix: u32,
    // Units to move; elements when packed.
    count: u32,
    // Where unit 0 is read and written.
    src: u32,
    dst: u32,
    axis: u32,
    axis_n: u32,
    n: array<u32, 8>,
    s: array<u32, 8>,
    d: array<u32, 8>,
}
var<immediate> p: Params;

fn divmod(n: u32, d: u32) -> vec2<u32> {
    return vec2<u32>(n / d, n % d);
}

// Index value r of a dim of n, wrapped and clamped into [0, n).
fn wrap(r: u32, n: u32) -> u32 {
    let i = bitcast<i32>(r);
    return u32(clamp(select(i, i + i32(n), i < 0i), 0i, i32(n) - 1i));
}

// Where unit g is read (x) and written (y).
fn at(g: u32) -> vec2<u32> {
    var rest = g;
    var at = vec2<u32>(p.src, p.dst);
    for (var k = 0u; k < DIMS; k++) {
        var c = rest;
        if (k + 1u < DIMS) {
            let qr = divmod(rest, p.n[k]);
            c = qr.y;
            rest = qr.x;
        }
        var source = c;
        if (GATHER == 1u && k == p.axis) {
            source = wrap(ix[p.ix + c * INDEX_WORDS], p.axis_n);
        } else if (GATHER == 2u && k == p.axis) {
            source = wrap(ix[p.ix + (g / UNITS) * INDEX_WORDS], p.axis_n);
        } else if (GATHER == 3u && k == p.axis) {
            source = window_start(ix[p.ix], p.axis_n, p.n[k]) + c;
        }
        at += vec2<u32>(source * p.s[k], c * p.d[k]);
    }
    if (CONTIGUOUS) {
        at.y = g;
    }
    return at;
}

// Where a window of len coordinates starts in a dim of n: index value r, from the end where
// negative, clamped so that the window fits.
fn window_start(r: u32, n: u32, len: u32) -> u32 {
    let i = bitcast<i32>(r);
    return u32(clamp(select(i, i + i32(n), i < 0i), 0i, i32(n) - i32(len)));
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let g = gid.x + gid.y * groups.x * WG;
    if (PACK == 1u) {
        if (g < p.count) {
            let a = at(g);
            y[p.y + a.y] = x[p.x + a.x];
        }
        return;
    }
    // Packed: W is u32 (written with W so that the module is valid whatever W is).
    let first = g * PACK;
    if (first >= p.count) {
        return;
    }
    let bits = 32u / PACK;
    let mask = W(0xffffffffu >> (32u - bits));
    var w = W(0u);
    for (var l = 0u; l < PACK; l++) {
        if (first + l == p.count) {
            w |= y[p.y + g] & W(0xffffffffu << (l * bits));
            break;
        }
        let s = at(first + l).x;
        let e = (x[p.x + s / PACK] >> W((s % PACK) * bits)) & mask;
        w |= e << W(l * bits);
    }
    y[p.y + g] = w;
}
