// One invocation per output: folds the output's set of input elements in one or two stages
// (`STAGES`: Softmax and ReduceLogSumExp fold the maximum, then a sum of exponentials that uses
// it), then writes one value (`finish`) or, with `EACH`, every element of the set (`each`, at
// its input offsets in an output of the input's shape).
//
// A fold runs in 8 interleaved accumulators (lane i takes the elements i, i + 8, ...) merged
// pairwise at the end, as a vectorised CPU reduction does: shorter chains of roundings than one
// running sum. Sets are read 4 elements at a time (`load4`); when they are contiguous and start
// on 16 bytes, the Rust side retypes `X` to `vec4<T>` and replaces `load4`/`load1` by vector
// reads.
//
// The sets: the kept dimensions (`KEPT` of them, innermost first in the params) give a set's
// first element, the reduced ones (`REDUCED`, innermost first) the offsets inside it. One
// reduced dimension is a plain stride; more take a division per element (rare shapes only).

alias T = f32;
// The input's array element: `T`, or `vec4<T>` for vector reads.
alias X = f32;

override WG: u32 = 64u;
override STAGES: u32 = 1u;
override EACH: bool = false;
override KEPT: u32 = 1u;
override REDUCED: u32 = 1u;

@group(0) @binding(0) var<storage, read> x: array<X>;
@group(0) @binding(1) var<storage, read_write> y: array<T>;

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

// Stage 0: `acc = combine0(acc, term0(v))` from `init0()`.
fn init0() -> T {
    return T(0);
}

fn term0(v: T) -> T {
    return v;
}

fn combine0(a: T, b: T) -> T {
    return a + b;
}

// Stage 1, whose terms may use stage 0's result.
fn init1() -> T {
    return T(0);
}

fn term1(v: T, s0: T) -> T {
    return v;
}

fn combine1(a: T, b: T) -> T {
    return a + b;
}

// The value written for a set of `n` elements from the stages' results.
fn finish(s0: T, s1: T, n: u32) -> T {
    return s0;
}

// With `EACH`, the value written for element `r` of the set, `v`.
fn each(v: T, r: u32, s0: T, s1: T) -> T {
    return v;
}

// Elements r..r+3 of the set that starts at `base`.
fn load4(base: u32, r: u32) -> vec4<T> {
    return vec4<T>(
        x[p.x + at(base, r)],
        x[p.x + at(base, r + 1u)],
        x[p.x + at(base, r + 2u)],
        x[p.x + at(base, r + 3u)],
    );
}

// Element r of the set that starts at `base`.
fn load1(base: u32, r: u32) -> T {
    return x[p.x + at(base, r)];
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

// Stage k's pieces (k is a constant at every call, so each call folds to one stage's hooks).
fn init(k: u32) -> T {
    if (k == 0u) {
        return init0();
    }
    return init1();
}

fn accumulate(k: u32, acc: T, v: T, s0: T) -> T {
    if (k == 0u) {
        return combine0(acc, term0(v));
    }
    return combine1(acc, term1(v, s0));
}

fn combine(k: u32, a: T, b: T) -> T {
    if (k == 0u) {
        return combine0(a, b);
    }
    return combine1(a, b);
}

// Stage k's fold of the set that starts at `base`, in 8 lanes.
fn fold(k: u32, base: u32, s0: T) -> T {
    let n = p.count;
    let bulk = n / 8u * 8u;
    var a0 = init(k);
    var a1 = init(k);
    var a2 = init(k);
    var a3 = init(k);
    var a4 = init(k);
    var a5 = init(k);
    var a6 = init(k);
    var a7 = init(k);
    for (var r = 0u; r < bulk; r += 8u) {
        let lo = load4(base, r);
        let hi = load4(base, r + 4u);
        a0 = accumulate(k, a0, lo.x, s0);
        a1 = accumulate(k, a1, lo.y, s0);
        a2 = accumulate(k, a2, lo.z, s0);
        a3 = accumulate(k, a3, lo.w, s0);
        a4 = accumulate(k, a4, hi.x, s0);
        a5 = accumulate(k, a5, hi.y, s0);
        a6 = accumulate(k, a6, hi.z, s0);
        a7 = accumulate(k, a7, hi.w, s0);
    }
    // The tail, fewer than 8 elements: element bulk + i goes to lane i.
    if (bulk + 4u <= n) {
        let t = load4(base, bulk);
        a0 = accumulate(k, a0, t.x, s0);
        a1 = accumulate(k, a1, t.y, s0);
        a2 = accumulate(k, a2, t.z, s0);
        a3 = accumulate(k, a3, t.w, s0);
    } else {
        if (bulk < n) {
            a0 = accumulate(k, a0, load1(base, bulk), s0);
        }
        if (bulk + 1u < n) {
            a1 = accumulate(k, a1, load1(base, bulk + 1u), s0);
        }
        if (bulk + 2u < n) {
            a2 = accumulate(k, a2, load1(base, bulk + 2u), s0);
        }
    }
    if (bulk + 4u < n) {
        a4 = accumulate(k, a4, load1(base, bulk + 4u), s0);
    }
    if (bulk + 5u < n) {
        a5 = accumulate(k, a5, load1(base, bulk + 5u), s0);
    }
    if (bulk + 6u < n) {
        a6 = accumulate(k, a6, load1(base, bulk + 6u), s0);
    }
    // Pairwise: ((0 1) (2 3)) ((4 5) (6 7)).
    a0 = combine(k, a0, a1);
    a2 = combine(k, a2, a3);
    a4 = combine(k, a4, a5);
    a6 = combine(k, a6, a7);
    a0 = combine(k, a0, a2);
    a4 = combine(k, a4, a6);
    return combine(k, a0, a4);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let o = gid.x + gid.y * groups.x * WG;
    if (o >= p.outputs) {
        return;
    }
    let base = first(o);
    let s0 = fold(0u, base, init0());
    var s1 = init1();
    if (STAGES > 1u) {
        s1 = fold(1u, base, s0);
    }
    if (!EACH) {
        y[p.y + o] = finish(s0, s1, p.count);
        return;
    }
    let n = p.count;
    let whole = n / 4u * 4u;
    for (var r = 0u; r < whole; r += 4u) {
        let v = load4(base, r);
        y[p.y + at(base, r)] = each(v.x, r, s0, s1);
        y[p.y + at(base, r + 1u)] = each(v.y, r + 1u, s0, s1);
        y[p.y + at(base, r + 2u)] = each(v.z, r + 2u, s0, s1);
        y[p.y + at(base, r + 3u)] = each(v.w, r + 3u, s0, s1);
    }
    for (var r = whole; r < n; r++) {
        y[p.y + at(base, r)] = each(load1(base, r), r, s0, s1);
    }
}
