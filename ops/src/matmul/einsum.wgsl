// Einsum of one or two operands: one invocation per output element, which sums the product of
// the operands over the labels the output leaves out.
//
// Labels are merged where they can be: the output has up to four dimensions (o0..o3, o3
// innermost) and the summed labels up to three (u0..u2); each operand has a stride for each
// (the sum of the strides of its axes that carry the label, 0 where it lacks it or broadcasts).

@group(0) @binding(0) var<storage, read> x0: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
// The second operand, read only by a replaced operand1.
@group(0) @binding(2) var<storage, read> x1: array<f32>;

struct Params {
    x0: u32,
    y: u32,
    x1: u32,
    // Output elements, and the sizes of the output's three inner dimensions.
    count: u32,
    o1: u32,
    o2: u32,
    o3: u32,
    // Sizes of the summed dimensions.
    u0: u32,
    u1: u32,
    u2: u32,
    // x0's strides of o0..o3, then of u0..u2; then x1's.
    x0_o0: u32,
    x0_o1: u32,
    x0_o2: u32,
    x0_o3: u32,
    x0_u0: u32,
    x0_u1: u32,
    x0_u2: u32,
    x1_o0: u32,
    x1_o1: u32,
    x1_o2: u32,
    x1_o3: u32,
    x1_u0: u32,
    x1_u1: u32,
    x1_u2: u32,
}
var<immediate> p: Params;

override WG: u32 = 64u;

// The second operand's factor at offset `o` (1 for one operand).
fn operand1(o: u32) -> f32 {
    return 1.0;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= p.count) {
        return;
    }
    let i3 = i % p.o3;
    let i2 = (i / p.o3) % p.o2;
    let i1 = (i / (p.o3 * p.o2)) % p.o1;
    let i0 = i / (p.o3 * p.o2 * p.o1);
    let b0 = p.x0 + i0 * p.x0_o0 + i1 * p.x0_o1 + i2 * p.x0_o2 + i3 * p.x0_o3;
    let b1 = i0 * p.x1_o0 + i1 * p.x1_o1 + i2 * p.x1_o2 + i3 * p.x1_o3;
    var acc = 0.0;
    for (var u0 = 0u; u0 < p.u0; u0++) {
        for (var u1 = 0u; u1 < p.u1; u1++) {
            let s0 = b0 + u0 * p.x0_u0 + u1 * p.x0_u1;
            let s1 = b1 + u0 * p.x1_u0 + u1 * p.x1_u1;
            for (var u2 = 0u; u2 < p.u2; u2++) {
                acc += x0[s0 + u2 * p.x0_u2] * operand1(s1 + u2 * p.x1_u2);
            }
        }
    }
    y[p.y + i] = acc;
}
