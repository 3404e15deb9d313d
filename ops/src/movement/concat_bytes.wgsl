// Concat of 1- or 2-byte elements whose slabs do not fill whole output words (movement/
// vulkan.rs; slabs that do are copies, copy.wgsl). Invocation g assembles output word g from
// its PACK elements, each read from the part whose slab holds it; the last word keeps the
// bytes past the tensor's end. An output row of `row` elements is the parts' slabs in order:
// part i's ends at element end[i] of the row. PARTS parts (1 to 8), bound in slots 1 to PARTS.

override WG: u32 = 64u;
override PACK: u32 = 4u;
override PARTS: u32 = 8u;

@group(0) @binding(0) var<storage, read_write> y: array<u32>;
@group(0) @binding(1) var<storage, read> x0: array<u32>;
@group(0) @binding(2) var<storage, read> x1: array<u32>;
@group(0) @binding(3) var<storage, read> x2: array<u32>;
@group(0) @binding(4) var<storage, read> x3: array<u32>;
@group(0) @binding(5) var<storage, read> x4: array<u32>;
@group(0) @binding(6) var<storage, read> x5: array<u32>;
@group(0) @binding(7) var<storage, read> x6: array<u32>;
@group(0) @binding(8) var<storage, read> x7: array<u32>;

struct Params {
    y: u32,
    x0: u32,
    x1: u32,
    x2: u32,
    x3: u32,
    x4: u32,
    x5: u32,
    x6: u32,
    x7: u32,
    // Elements of the output.
    count: u32,
    row: u32,
    end: array<u32, 8>,
}
var<immediate> p: Params;

// Word w of part i. Each part past PARTS is left out, so that only bound slots are read.
fn word(i: u32, w: u32) -> u32 {
    if (PARTS > 7u && i == 7u) {
        return x7[p.x7 + w];
    }
    if (PARTS > 6u && i == 6u) {
        return x6[p.x6 + w];
    }
    if (PARTS > 5u && i == 5u) {
        return x5[p.x5 + w];
    }
    if (PARTS > 4u && i == 4u) {
        return x4[p.x4 + w];
    }
    if (PARTS > 3u && i == 3u) {
        return x3[p.x3 + w];
    }
    if (PARTS > 2u && i == 2u) {
        return x2[p.x2 + w];
    }
    if (PARTS > 1u && i == 1u) {
        return x1[p.x1 + w];
    }
    return x0[p.x0 + w];
}

// Element e of the output, in its low bits.
fn element(e: u32, bits: u32) -> u32 {
    let o = e / p.row;
    let j = e % p.row;
    var start = 0u;
    for (var i = 0u; i < PARTS; i++) {
        let end = p.end[i];
        if (j < end) {
            let s = o * (end - start) + j - start;
            return (word(i, s / PACK) >> ((s % PACK) * bits)) & (0xffffffffu >> (32u - bits));
        }
        start = end;
    }
    return 0u;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let g = gid.x + gid.y * groups.x * WG;
    let first = g * PACK;
    if (first >= p.count) {
        return;
    }
    let bits = 32u / PACK;
    var w = 0u;
    for (var l = 0u; l < PACK; l++) {
        if (first + l == p.count) {
            w |= y[p.y + g] & (0xffffffffu << (l * bits));
            break;
        }
        w |= element(first + l, bits) << (l * bits);
    }
    y[p.y + g] = w;
}
