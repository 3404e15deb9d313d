// One workgroup of `WG` invocations per output (sets too long for one invocation, or on GPUs
// long enough to share): each invocation folds every `WG`-th element (every `WG`-th group of 4
// with `V4`), then a tree in workgroup memory folds the partial results. One or two stages
// (`STAGES`), then one value written (`finish`) or, with `EACH`, every element of the set
// (`each`). The hooks, `load4`/`load1` and the set's layout are those of fold.wgsl.

alias T = f32;
// The input's array element: `T`, or `vec4<T>` for vector reads.
alias X = f32;

override WG: u32 = 64u;
override STAGES: u32 = 1u;
override EACH: bool = false;
override KEPT: u32 = 1u;
override REDUCED: u32 = 1u;
// Each invocation reads groups of 4 contiguous elements.
override V4: bool = false;

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

var<workgroup> part: array<T, WG>;

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

// Stage k's fold of the set that starts at `base`, shared by the workgroup.
fn fold(k: u32, base: u32, lid: u32, s0: T) -> T {
    let n = p.count;
    var a = init(k);
    if (V4) {
        for (var q = lid; q < n / 4u; q += WG) {
            let v = load4(base, 4u * q);
            a = accumulate(k, a, v.x, s0);
            a = accumulate(k, a, v.y, s0);
            a = accumulate(k, a, v.z, s0);
            a = accumulate(k, a, v.w, s0);
        }
    } else {
        for (var r = lid; r < n; r += WG) {
            a = accumulate(k, a, load1(base, r), s0);
        }
    }
    part[lid] = a;
    workgroupBarrier();
    for (var w = WG / 2u; w > 0u; w = w / 2u) {
        if (lid < w) {
            part[lid] = combine(k, part[lid], part[lid + w]);
        }
        workgroupBarrier();
    }
    let s = part[0];
    workgroupBarrier();
    return s;
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let o = wid.x + wid.y * groups.x;
    // Groups past the last output fold its set again and write nothing.
    let base = first(min(o, p.outputs - 1u));
    let s0 = fold(0u, base, lid, init0());
    var s1 = init1();
    if (STAGES > 1u) {
        s1 = fold(1u, base, lid, s0);
    }
    if (o >= p.outputs) {
        return;
    }
    if (!EACH) {
        if (lid == 0u) {
            y[p.y + o] = finish(s0, s1, p.count);
        }
        return;
    }
    let n = p.count;
    if (V4) {
        for (var q = lid; q < n / 4u; q += WG) {
            let r = 4u * q;
            let v = load4(base, r);
            y[p.y + at(base, r)] = each(v.x, r, s0, s1);
            y[p.y + at(base, r + 1u)] = each(v.y, r + 1u, s0, s1);
            y[p.y + at(base, r + 2u)] = each(v.z, r + 2u, s0, s1);
            y[p.y + at(base, r + 3u)] = each(v.w, r + 3u, s0, s1);
        }
    } else {
        for (var r = lid; r < n; r += WG) {
            y[p.y + at(base, r)] = each(load1(base, r), r, s0, s1);
        }
    }
}
