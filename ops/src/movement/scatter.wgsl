// ScatterND and ScatterElements (movement/vulkan.rs), once the data is in the output: each
// update element goes where its index sends it. Without a reduction (REDUCTION 0) invocation g
// writes update word g; an element is UNITS words. With one (1 add, 2 mul, 3 max, 4 min; T is
// f32, i32 or u32) the updates that may meet run in order in one invocation, as on the CPU:
// invocation g takes `steps` of them, update ((g / inner) * steps + step) * inner + g % inner.
//
// FORM 0, ScatterND: update e is element e % slice of the slice that tuple e / slice of the
// index tensor (`k` components) picks, component j moving it by its value times s[j]. FORM 1,
// ScatterElements: update e sits at coordinates of the index tensor's shape (`k` dims, n[d]
// innermost first) and lands at the same ones in the data, s[d] apart, but along dim `axis`,
// where the index tensor's element e is the coordinate. An index is wrapped into [0, size) as
// on the CPU and clamped where it lies outside (the CPU's error).

alias T = u32;

override WG: u32 = 64u;
override FORM: u32 = 0u;
override REDUCTION: u32 = 0u;
override UNITS: u32 = 1u;
// u32 words per index (2: int64, whose low word is the index).
override INDEX_WORDS: u32 = 1u;

@group(0) @binding(0) var<storage, read> u: array<T>;
@group(0) @binding(1) var<storage, read> ix: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<T>;

struct Params {
    u: u32,
    ix: u32,
    y: u32,
    // Invocations.
    count: u32,
    steps: u32,
    inner: u32,
    slice: u32,
    k: u32,
    axis: u32,
    axis_n: u32,
    n: array<u32, 8>,
    s: array<u32, 8>,
}
var<immediate> p: Params;

// Index tensor word r as a coordinate of a dim of n.
fn coordinate(r: u32, n: u32) -> u32 {
    let i = bitcast<i32>(ix[p.ix + r * INDEX_WORDS]);
    return u32(clamp(select(i, i + i32(n), i < 0i), 0i, i32(n) - 1i));
}

// Where update element e lands, in elements of the output.
fn destination(e: u32) -> u32 {
    var at = 0u;
    if (FORM == 0u) {
        let t = e / p.slice;
        at = e % p.slice;
        for (var j = 0u; j < p.k; j++) {
            at += coordinate(t * p.k + j, p.n[j]) * p.s[j];
        }
    } else {
        var rest = e;
        for (var d = 0u; d < p.k; d++) {
            var c = rest % p.n[d];
            rest /= p.n[d];
            if (d == p.axis) {
                c = coordinate(e, p.axis_n);
            }
            at += c * p.s[d];
        }
    }
    return at;
}

fn combine(current: T, update: T) -> T {
    switch REDUCTION {
        case 1u: {
            return current + update;
        }
        case 2u: {
            return current * update;
        }
        // As the CPU: NaN updates lose.
        case 3u: {
            return select(current, update, update > current);
        }
        case 4u: {
            return select(current, update, update < current);
        }
        default: {
            return update;
        }
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let g = gid.x + gid.y * groups.x * WG;
    if (g >= p.count) {
        return;
    }
    if (REDUCTION == 0u) {
        y[p.y + destination(g / UNITS) * UNITS + g % UNITS] = u[p.u + g];
        return;
    }
    for (var step = 0u; step < p.steps; step++) {
        let e = ((g / p.inner) * p.steps + step) * p.inner + g % p.inner;
        let at = p.y + destination(e);
        y[at] = combine(y[at], u[p.u + e]);
    }
}
