// ArgMax/ArgMin and Hardmax, one invocation per output: the index `bi` of the first (or, with
// `LAST`, the last) element v of the set with no w in it such that `w > v` (`w < v` with
// `MIN`). Written as an int64, two u32 words, low first; with `HARDMAX` the set is written
// instead, 1.0 at `bi` and 0.0 elsewhere (as f32 bits), at its input offsets.
//
// 8 lanes, lane i over the elements i, i + 8, ..., each taking a better element (or, but for
// lane 0, any element over a NaN, so that a NaN first in its lane does not hide the rest), then
// the lanes merged in order, ties going to the smaller (with `LAST` the larger) index. As on the
// CPU, which scans from element 0 and takes a better element, NaN is never taken unless it is
// element 0. The set's layout is that of fold.wgsl.

alias T = f32;

override WG: u32 = 64u;
override MIN: bool = false;
override LAST: bool = false;
override HARDMAX: bool = false;
override KEPT: u32 = 1u;
override REDUCED: u32 = 1u;

@group(0) @binding(0) var<storage, read> x: array<T>;
@group(0) @binding(1) var<storage, read_write> y: array<u32>;

struct Params {
    x: u32,
    y: u32,
    outputs: u32,
    // Elements per set.
    count: u32,
    // Kept dimensions, innermost first: size, input stride.
    k0: u32,
    k0_stride: u32,
    k1: u32,
    k1_stride: u32,
    k2: u32,
    k2_stride: u32,
    k3: u32,
    k3_stride: u32,
    // Reduced dimensions, innermost first: size, input stride.
    r0: u32,
    r0_stride: u32,
    r1: u32,
    r1_stride: u32,
    r2: u32,
    r2_stride: u32,
    r3: u32,
    r3_stride: u32,
}
var<immediate> p: Params;

// Whether `v` is a NaN (from its bits: compilers may take `v != v` to be false); integer
// element types replace it by `false`.
fn is_nan(v: T) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

// The input offset of output o's first element.
fn first(o: u32) -> u32 {
    if (KEPT == 0u) {
        return 0u;
    }
    var a = 0u;
    var i = o;
    if (KEPT == 1u) {
        return i * p.k0_stride;
    }
    a += (i % p.k0) * p.k0_stride;
    i /= p.k0;
    if (KEPT == 2u) {
        return a + i * p.k1_stride;
    }
    a += (i % p.k1) * p.k1_stride;
    i /= p.k1;
    if (KEPT == 3u) {
        return a + i * p.k2_stride;
    }
    a += (i % p.k2) * p.k2_stride;
    i /= p.k2;
    return a + i * p.k3_stride;
}

// The input offset of element r of the set that starts at `base`.
fn at(base: u32, r: u32) -> u32 {
    if (REDUCED == 1u) {
        return base + r * p.r0_stride;
    }
    var a = base;
    var i = r;
    a += (i % p.r0) * p.r0_stride;
    i /= p.r0;
    if (REDUCED == 2u) {
        return a + i * p.r1_stride;
    }
    a += (i % p.r1) * p.r1_stride;
    i /= p.r1;
    if (REDUCED == 3u) {
        return a + i * p.r2_stride;
    }
    a += (i % p.r2) * p.r2_stride;
    i /= p.r2;
    return a + i * p.r3_stride;
}

// Whether `v` beats `b`, the best so far.
fn beats(v: T, b: T) -> bool {
    if (MIN) {
        return v < b || (LAST && v == b);
    }
    return v > b || (LAST && v == b);
}

// A lane's best value and its index.
struct Best {
    v: T,
    i: u32,
}

// Lane `lane` (0 or not) takes element r of the set at `base` if it is better.
fn take(b: Best, lane0: bool, base: u32, r: u32) -> Best {
    let v = x[p.x + at(base, r)];
    if (beats(v, b.v) || (!lane0 && is_nan(b.v))) {
        return Best(v, r);
    }
    return b;
}

// Lane `l` merged into `b`, in lane order.
fn merge(b: Best, l: Best) -> Best {
    let tie = select((l.i < b.i), (l.i > b.i), LAST);
    var better = l.v > b.v;
    if (MIN) {
        better = l.v < b.v;
    }
    if (better || (l.v == b.v && tie)) {
        return l;
    }
    return b;
}

fn first_element(base: u32, r: u32) -> Best {
    return Best(x[p.x + at(base, r)], r);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let o = gid.x + gid.y * groups.x * WG;
    if (o >= p.outputs) {
        return;
    }
    let base = first(o);
    let n = p.count;
    // Sets shorter than 8 hold one element per lane, the lanes past the set a copy of its last
    // element (which changes nothing when merged); longer ones run a loop, then a tail.
    let last = n - 1u;
    var b0 = first_element(base, 0u);
    var b1 = first_element(base, min(1u, last));
    var b2 = first_element(base, min(2u, last));
    var b3 = first_element(base, min(3u, last));
    var b4 = first_element(base, min(4u, last));
    var b5 = first_element(base, min(5u, last));
    var b6 = first_element(base, min(6u, last));
    var b7 = first_element(base, min(7u, last));
    let bulk = select(n / 8u * 8u, n, n < 8u);
    for (var r = 8u; r < bulk; r += 8u) {
        b0 = take(b0, true, base, r);
        b1 = take(b1, false, base, r + 1u);
        b2 = take(b2, false, base, r + 2u);
        b3 = take(b3, false, base, r + 3u);
        b4 = take(b4, false, base, r + 4u);
        b5 = take(b5, false, base, r + 5u);
        b6 = take(b6, false, base, r + 6u);
        b7 = take(b7, false, base, r + 7u);
    }
    // The tail, fewer than 8 elements: element bulk + i goes to lane i.
    if (bulk < n) {
        b0 = take(b0, true, base, bulk);
    }
    if (bulk + 1u < n) {
        b1 = take(b1, false, base, bulk + 1u);
    }
    if (bulk + 2u < n) {
        b2 = take(b2, false, base, bulk + 2u);
    }
    if (bulk + 3u < n) {
        b3 = take(b3, false, base, bulk + 3u);
    }
    if (bulk + 4u < n) {
        b4 = take(b4, false, base, bulk + 4u);
    }
    if (bulk + 5u < n) {
        b5 = take(b5, false, base, bulk + 5u);
    }
    if (bulk + 6u < n) {
        b6 = take(b6, false, base, bulk + 6u);
    }
    b0 = merge(b0, b1);
    b0 = merge(b0, b2);
    b0 = merge(b0, b3);
    b0 = merge(b0, b4);
    b0 = merge(b0, b5);
    b0 = merge(b0, b6);
    b0 = merge(b0, b7);
    let bi = b0.i;
    if (!HARDMAX) {
        y[p.y + 2u * o] = bi;
        y[p.y + 2u * o + 1u] = 0u;
        return;
    }
    for (var r = 0u; r < n; r++) {
        y[p.y + at(base, r)] = bitcast<u32>(select(0.0, 1.0, r == bi));
    }
}
