// ReduceMax and ReduceMin of bools (any and all), one byte per element: one invocation per 4
// outputs, written as one u32 word (the last word keeps the bytes past the tensor's end). The
// output is slot 0 and the input slot 1, so that empty sets bind the output alone (`byte` then
// reads nothing). The set's layout is that of fold.wgsl.

override WG: u32 = 64u;
// ReduceMin (all); ReduceMax (any) otherwise.
override ALL: bool = false;
override KEPT: u32 = 1u;
override REDUCED: u32 = 1u;

@group(0) @binding(0) var<storage, read_write> y: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<u32>;

struct Params {
    y: u32,
    x: u32,
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

// Byte e of the input.
fn byte(e: u32) -> u32 {
    return (x[p.x + e / 4u] >> (8u * (e % 4u))) & 0xffu;
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

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let w = gid.x + gid.y * groups.x * WG;
    let words = (p.outputs + 3u) / 4u;
    if (w >= words) {
        return;
    }
    var word = 0u;
    for (var c = 0u; c < 4u; c++) {
        let o = 4u * w + c;
        var acc = select(0u, 1u, ALL);
        if (o < p.outputs) {
            let base = first(o);
            for (var r = 0u; r < p.count; r++) {
                let bit = select(0u, 1u, byte(at(base, r)) != 0u);
                if (ALL) {
                    acc = min(acc, bit);
                } else {
                    acc = max(acc, bit);
                }
            }
        }
        word |= acc << (8u * c);
    }
    let tail = p.outputs % 4u;
    if (w == words - 1u && tail != 0u) {
        let keep = 0xffffffffu << (8u * tail);
        word = (word & ~keep) | (y[p.y + w] & keep);
    }
    y[p.y + w] = word;
}
