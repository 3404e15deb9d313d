// Reductions over empty sets: every output is the stages' initial values, finished (the fold
// hooks of fold.wgsl). Nothing is read: an empty input cannot be bound.

alias T = f32;

override WG: u32 = 64u;

@group(0) @binding(0) var<storage, read_write> y: array<T>;

struct Params {
    y: u32,
    outputs: u32,
}
var<immediate> p: Params;

fn init0() -> T {
    return T(0);
}

fn init1() -> T {
    return T(0);
}

fn finish(s0: T, s1: T, n: u32) -> T {
    return s0;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let o = gid.x + gid.y * groups.x * WG;
    if (o < p.outputs) {
        y[p.y + o] = finish(init0(), init1(), 0u);
    }
}
