// MaxPool, AveragePool and LpPool over 1 to 3 spatial dimensions (`RANK`), one invocation per
// output element, looping over its window. The params describe 3 dimensions, outermost first;
// a pool over fewer has leading dimensions of size 1 (window 1, stride 1, no padding).
//
// A tap outside the input is skipped (checked only when some window leaves the input, `CLIP`),
// so padding is never read. AveragePool divides by the window's size (`COUNT` 0), by the taps
// inside the input (1), or with `count_include_pad` by the taps inside the input or its padding
// (2): in ceil mode a window may run past the end padding, and those taps count for nothing,
// as on the CPU. MaxPool's Indices (`INDEXED`, written by `store_index` into the optional slot
// `ind`) are the flat input index of the first tap inside the input, then of strictly greater
// ones, row-major or with `COLUMN_MAJOR` column-major within the plane.
//
// GPUs read the geometry from the params, one module for every window. CPU-type devices get it
// as literals (the hook `geometry`, pool/vulkan.rs): their compiler then unrolls the taps and
// folds every index and bounds check, which measured twice as fast on lavapipe.

override WG: u32 = 64u;
override RANK: u32 = 2u;
override CLIP: bool = true;
override COUNT: u32 = 0u;
override INDEXED: bool = false;
override COLUMN_MAJOR: bool = false;

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<storage, read_write> ind: array<u32>;

struct Params {
    x: u32,
    y: u32,
    ind: u32,
    outputs: u32,
    // Input elements per (n, c) plane.
    plane: u32,
    // Per dimension, outermost first: see `Geometry`.
    in0: u32,
    in1: u32,
    in2: u32,
    out0: u32,
    out1: u32,
    out2: u32,
    k0: u32,
    k1: u32,
    k2: u32,
    stride0: u32,
    stride1: u32,
    stride2: u32,
    dilation0: u32,
    dilation1: u32,
    dilation2: u32,
    pad0: i32,
    pad1: i32,
    pad2: i32,
    room0: i32,
    room1: i32,
    room2: i32,
}
var<immediate> p: Params;

// Per dimension, outermost first: input and output sizes, window, stride, dilation, the padding
// before it, and the padded size (padding before + input + padding after).
struct Geometry {
    input: vec3<u32>,
    output: vec3<u32>,
    window: vec3<u32>,
    stride: vec3<u32>,
    dilation: vec3<u32>,
    pad: vec3<i32>,
    room: vec3<i32>,
}

fn geometry() -> Geometry {
    return Geometry(
        vec3<u32>(p.in0, p.in1, p.in2),
        vec3<u32>(p.out0, p.out1, p.out2),
        vec3<u32>(p.k0, p.k1, p.k2),
        vec3<u32>(p.stride0, p.stride1, p.stride2),
        vec3<u32>(p.dilation0, p.dilation1, p.dilation2),
        vec3<i32>(p.pad0, p.pad1, p.pad2),
        vec3<i32>(p.room0, p.room1, p.room2),
    );
}

// The fold over the taps: `acc = combine0(acc, term0(v))` from `init0()`.
fn init0() -> f32 {
    return 0.0;
}

fn term0(v: f32) -> f32 {
    return v;
}

fn combine0(a: f32, b: f32) -> f32 {
    return a + b;
}

// The output from the fold over `count` taps.
fn finish(acc: f32, count: f32) -> f32 {
    return acc;
}

// With `INDEXED`, writes output o's index (`found`: some tap lay inside the input).
fn store_index(o: u32, index: u32, found: bool) {
}

// (n / d, n % d); pool/vulkan.rs puts vulkan/divmod.wgsl's in its place.
fn divmod(n: u32, d: u32) -> vec2<u32> {
    return vec2<u32>(n / d, n % d);
}

// Per dimension, the taps of the window of output `o` that lie inside the input or its padding.
fn inside(o: vec3<u32>, g: Geometry) -> vec3<i32> {
    let d = vec3<i32>(g.dilation);
    let n = (g.room - vec3<i32>(o * g.stride) + d - 1i) / d;
    return clamp(n, vec3<i32>(0i), vec3<i32>(g.window));
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let o = gid.x + gid.y * groups.x * WG;
    if (o >= p.outputs) {
        return;
    }
    let g = geometry();
    // Output coordinates, innermost first, then the plane (N * C).
    var qr = divmod(o, g.output.z);
    let o2 = qr.y;
    var o1 = 0u;
    var o0 = 0u;
    if (RANK > 1u) {
        qr = divmod(qr.x, g.output.y);
        o1 = qr.y;
    }
    if (RANK > 2u) {
        qr = divmod(qr.x, g.output.x);
        o0 = qr.y;
    }
    let plane = qr.x;
    let start = p.x + plane * p.plane;
    var acc = init0();
    var arg = -1i;
    var taps = 0u;
    for (var t0 = 0u; t0 < g.window.x; t0++) {
        let i0 = i32(o0 * g.stride.x + t0 * g.dilation.x) - g.pad.x;
        if (CLIP && (i0 < 0i || i0 >= i32(g.input.x))) {
            continue;
        }
        for (var t1 = 0u; t1 < g.window.y; t1++) {
            let i1 = i32(o1 * g.stride.y + t1 * g.dilation.y) - g.pad.y;
            if (CLIP && (i1 < 0i || i1 >= i32(g.input.y))) {
                continue;
            }
            for (var t2 = 0u; t2 < g.window.z; t2++) {
                let i2 = i32(o2 * g.stride.z + t2 * g.dilation.z) - g.pad.z;
                if (CLIP && (i2 < 0i || i2 >= i32(g.input.z))) {
                    continue;
                }
                let at = (u32(i0) * g.input.y + u32(i1)) * g.input.z + u32(i2);
                let v = x[start + at];
                if (INDEXED) {
                    if (arg < 0i || v > acc) {
                        acc = v;
                        let col = u32(i0) + g.input.x * (u32(i1) + g.input.y * u32(i2));
                        arg = i32(select(at, col, COLUMN_MAJOR));
                    }
                } else {
                    acc = combine0(acc, term0(v));
                }
                taps += 1u;
            }
        }
    }
    var count = f32(g.window.x * g.window.y * g.window.z);
    if (COUNT == 1u) {
        count = f32(taps);
    } else if (COUNT == 2u) {
        let n = inside(vec3<u32>(o0, o1, o2), g);
        count = f32(n.x * n.y * n.z);
    }
    y[p.y + o] = finish(acc, count);
    if (INDEXED) {
        store_index(o, plane * p.plane + u32(arg), arg >= 0i);
    }
}
