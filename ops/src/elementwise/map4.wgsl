// Elementwise, four elements per invocation: map.wgsl with 4-vectors along dim 0, for steps
// whose innermost collapsed dim is a multiple of 4 long and whose inputs either run along it
// (read as 4-vectors, 16-byte aligned; bool as the four bytes of a word) or are broadcast over
// it (one element, splat). n0 counts 4-vectors; strides are in elements.
//
// Specialised like map.wgsl: `load*` (the 4 elements at vector c0 of a row starting at element
// r), `op` (applied lane by lane) and `store` (vector c of the output; bool packs 4 bytes).

alias A0 = f32;
alias A1 = f32;
alias A2 = f32;
alias Y = f32;
alias S0 = vec4<f32>;
alias S1 = vec4<f32>;
alias S2 = vec4<f32>;
alias SY = vec4<f32>;

// Invocations per workgroup, along the grid's x.
override WG: u32 = 64u;
// The collapsed dims the step has (1 to 4): the coordinates past them are 0, and with DIMS
// known the code computing them is pruned, which CPU-type devices feel (they run every
// invocation's uniform arithmetic lane by lane).
override DIMS: u32 = 4u;

@group(0) @binding(0) var<storage, read_write> y: array<SY>;
@group(0) @binding(1) var<storage, read> x0: array<S0>;
@group(0) @binding(2) var<storage, read> x1: array<S1>;
@group(0) @binding(3) var<storage, read> x2: array<S2>;

struct Params {
    y: u32,
    x0: u32,
    x1: u32,
    x2: u32,
    // Output dims 0..2, dim 0 in 4-vectors (dim 3 is what the grid's z leaves).
    n0: u32,
    n1: u32,
    n2: u32,
    // Input k's strides along dims 1..3, in elements (multiples of 4 where it runs along
    // dim 0).
    s01: u32,
    s02: u32,
    s03: u32,
    s11: u32,
    s12: u32,
    s13: u32,
    s21: u32,
    s22: u32,
    s23: u32,
    // The dispatch's first coordinates along x, y and z.
    b0: u32,
    b1: u32,
    b2: u32,
    // The op's constants (attributes: f32 bits or integers).
    k0: u32,
    k1: u32,
}
var<immediate> p: Params;

fn load0(c0: u32, r: u32) -> vec4<A0> {
    return x0[p.x0 + c0 + r / 4u];
}

fn load1(c0: u32, r: u32) -> vec4<A1> {
    return vec4<A1>();
}

fn load2(c0: u32, r: u32) -> vec4<A2> {
    return vec4<A2>();
}

fn op(a0: A0, a1: A1, a2: A2) -> Y {
    return a0;
}

fn store(c: u32, v: vec4<Y>) {
    y[p.y + c] = v;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wg: vec3<u32>) {
    let c0 = gid.x + p.b0;
    if (c0 >= p.n0) {
        return;
    }
    var c1 = 0u;
    var c2 = 0u;
    var c3 = 0u;
    if (DIMS > 1u) {
        c1 = wg.y + p.b1;
    }
    if (DIMS == 3u) {
        c2 = wg.z + p.b2;
    }
    if (DIMS > 3u) {
        let z = wg.z + p.b2;
        c2 = z % p.n2;
        c3 = z / p.n2;
    }
    let a0 = load0(c0, c1 * p.s01 + c2 * p.s02 + c3 * p.s03);
    let a1 = load1(c0, c1 * p.s11 + c2 * p.s12 + c3 * p.s13);
    let a2 = load2(c0, c1 * p.s21 + c2 * p.s22 + c3 * p.s23);
    let v = vec4<Y>(
        op(a0.x, a1.x, a2.x),
        op(a0.y, a1.y, a2.y),
        op(a0.z, a1.z, a2.z),
        op(a0.w, a1.w, a2.w),
    );
    store(c0 + p.n0 * (c1 + p.n1 * (c2 + p.n2 * c3)), v);
}
