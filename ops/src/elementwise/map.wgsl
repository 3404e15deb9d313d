// Elementwise, one element per invocation: y = op(x0, x1, x2) with numpy broadcasting.
//
// The step's dims are collapsed (dims of 1 dropped, neighbours that every operand steps over
// as one merged) to at most 4, innermost first: dim 0 is the grid's x, dim 1 its y, and dims 2
// and 3 share its z (z = c2 + n2 * c3). An input is read at the output's coordinates times its
// own strides (0 along the dims it is broadcast over), so no invocation divides but for a
// 4-dim step, once per workgroup. A step too large for one dispatch takes several, each
// starting at its coordinates b0, b1, b2.
//
// Specialised per op and types: the aliases (A* what the op takes, Y what it gives, S* and SY
// the arrays' elements), the hooks `load*` (an input's element e, unpacked), `op` and `store`.
// A unary op leaves `load1` and `load2` as they are, which read nothing: only the slots a
// dispatch binds are read.

alias A0 = f32;
alias A1 = f32;
alias A2 = f32;
alias Y = f32;
alias S0 = f32;
alias S1 = f32;
alias S2 = f32;
alias SY = f32;

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
    // Output dims 0..2 (dim 3 is what the grid's z leaves).
    n0: u32,
    n1: u32,
    n2: u32,
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
    // The dispatch's first coordinates along x, y and z.
    b0: u32,
    b1: u32,
    b2: u32,
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
    return a0;
}

fn store(e: u32, v: Y) {
    y[p.y + e] = v;
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
    let a0 = load0(c0 * p.s00 + c1 * p.s01 + c2 * p.s02 + c3 * p.s03);
    let a1 = load1(c0 * p.s10 + c1 * p.s11 + c2 * p.s12 + c3 * p.s13);
    let a2 = load2(c0 * p.s20 + c1 * p.s21 + c2 * p.s22 + c3 * p.s23);
    store(c0 + p.n0 * (c1 + p.n1 * (c2 + p.n2 * c3)), op(a0, a1, a2));
}
