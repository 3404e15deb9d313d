// Elementwise into a packed output (bool, f16, 8- and 16-bit integers): one u32 word of
// 32 / BITS elements per invocation, so that no two invocations write one word. Words may
// straddle rows, so an invocation finds its first element's coordinates by division (once per
// word) and steps through the rest; the last word keeps the bytes past the tensor's end.
// Dims and strides as in map.wgsl (at most 4 collapsed dims, innermost first).
//
// Specialised per op and types like map.wgsl, with `pack` (an output value's bits) instead of
// `store`.

alias A0 = f32;
alias A1 = f32;
alias A2 = f32;
alias Y = bool;
alias S0 = f32;
alias S1 = f32;
alias S2 = f32;

// Bits per output element: 8 or 16.
override BITS: u32 = 8u;
// Invocations per workgroup.
override WG: u32 = 64u;

@group(0) @binding(0) var<storage, read_write> y: array<u32>;
@group(0) @binding(1) var<storage, read> x0: array<S0>;
@group(0) @binding(2) var<storage, read> x1: array<S1>;
@group(0) @binding(3) var<storage, read> x2: array<S2>;

struct Params {
    y: u32,
    x0: u32,
    x1: u32,
    x2: u32,
    // Output dims 0..2 and its element count.
    n0: u32,
    n1: u32,
    n2: u32,
    count: u32,
    // Input k's strides along dims 0..3, in elements.
    s00: u32,
    s01: u32,
    s02: u32,
    s03: u32,
    s10: u32,
    s11: u32,
    s12: u32,
    s13: u32,
    s20: u32,
    s21: u32,
    s22: u32,
    s23: u32,
    // The dispatch's first word.
    b0: u32,
    // The op's constants (attributes: f32 bits or integers).
    k0: u32,
    k1: u32,
}
var<immediate> p: Params;

fn load0(e: u32) -> A0 {
    return x0[p.x0 + e];
}

fn load1(e: u32) -> A1 {
    return A1();
}

fn load2(e: u32) -> A2 {
    return A2();
}

fn op(a0: A0, a1: A1, a2: A2) -> Y {
    return a0 != 0.0;
}

fn pack(v: Y) -> u32 {
    return select(0u, 1u, v);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let w = gid.x + p.b0;
    let per = 32u / BITS;
    let first = w * per;
    if (first >= p.count) {
        return;
    }
    var c0 = first % p.n0;
    var c1 = (first / p.n0) % p.n1;
    let plane = first / p.n0 / p.n1;
    var c2 = plane % p.n2;
    var c3 = plane / p.n2;
    var word = 0u;
    for (var l = 0u; l < per; l = l + 1u) {
        if (first + l < p.count) {
            let a0 = load0(c0 * p.s00 + c1 * p.s01 + c2 * p.s02 + c3 * p.s03);
            let a1 = load1(c0 * p.s10 + c1 * p.s11 + c2 * p.s12 + c3 * p.s13);
            let a2 = load2(c0 * p.s20 + c1 * p.s21 + c2 * p.s22 + c3 * p.s23);
            word = word | (pack(op(a0, a1, a2)) << (l * BITS));
        }
        c0 = c0 + 1u;
        if (c0 == p.n0) {
            c0 = 0u;
            c1 = c1 + 1u;
            if (c1 == p.n1) {
                c1 = 0u;
                c2 = c2 + 1u;
                if (c2 == p.n2) {
                    c2 = 0u;
                    c3 = c3 + 1u;
                }
            }
        }
    }
    if (first + per > p.count) {
        word = word | (y[p.y + w] & (0xffffffffu << ((p.count - first) * BITS)));
    }
    y[p.y + w] = word;
}
