// DFT and STFT (spectral/vulkan.rs, on the CPU's terms: spectral/cpu.rs): one invocation per
// output value pair (or real value), a direct transform of one signal in float32, each twiddle
// factor that of 2π·((k·t) mod length)/length (`twiddle`: exact at the quarter turns).
//
// The signals: signal s of `signals` starts at x[image(s) + frame(s)] (image = s / frames,
// frame = s % frames, their strides params), its samples `t_stride` apart, with `inner`
// signals side by side `parts` apart (DFT: the dims after the axis; STFT: one). With WINDOW
// (STFT) sample t is weighed by window[t]. MODE 0: forward; 1: inverse; 2: one-sided inverse
// (numpy's irfft: bins past length / 2 are the conjugates of the first, the output real).
// PARTS: 1 real input samples, 2 complex.

override WG: u32 = 64u;
override MODE: u32 = 0u;
override PARTS: u32 = 1u;
override WINDOW: bool = false;

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
// Bound and read only with WINDOW.
@group(0) @binding(2) var<storage, read> window: array<f32>;

struct Params {
    x: u32,
    y: u32,
    window: u32,
    // Output values (pairs, or reals for MODE 2).
    count: u32,
    // Samples per signal read (at most `length`), the transform's length, bins written.
    n: u32,
    length: u32,
    bins: u32,
    inner: u32,
    frames: u32,
    image_stride: u32,
    frame_stride: u32,
    t_stride: u32,
}
var<immediate> p: Params;

// Sample t of the signal starting at `base` (inner index i), weighed by the window.
fn sample(base: u32, t: u32) -> vec2<f32> {
    let at = p.x + base + t * p.t_stride;
    var v = vec2<f32>(x[at], 0.0);
    if (PARTS == 2u) {
        v.y = x[at + 1u];
    }
    if (WINDOW) {
        v = v * window[p.window + t];
    }
    return v;
}

// cos and sin of 2π·j/length: a quarter turn q and an angle of at most an eighth of one, so
// that the quarter turns are exact (the zeros of a real signal's spectrum stay zeros) and the
// rest as accurate as f32 cos and sin near 0. j < length < 2^30.
fn twiddle(j: u32, length: u32) -> vec2<f32> {
    var q = (4u * j) / length;
    var rem = i32((4u * j) % length);
    if (2u * u32(rem) > length) {
        q += 1u;
        rem -= i32(length);
    }
    let theta = 1.5707963267948966 * f32(rem) / f32(length);
    let c = cos(theta);
    let s = sin(theta);
    switch (q % 4u) {
        case 0u: {
            return vec2<f32>(c, s);
        }
        case 1u: {
            return vec2<f32>(-s, c);
        }
        case 2u: {
            return vec2<f32>(-c, -s);
        }
        default: {
            return vec2<f32>(s, -c);
        }
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let o = gid.x + gid.y * groups.x * WG;
    if (o >= p.count) {
        return;
    }
    // o = (signal row * bins + k) * inner + i.
    let i = o % p.inner;
    let k = (o / p.inner) % p.bins;
    let row = o / (p.inner * p.bins);
    let base = (row / p.frames) * p.image_stride + (row % p.frames) * p.frame_stride + i * PARTS;
    let sign = select(-1.0, 1.0, MODE != 0u);
    var acc = vec2<f32>(0.0);
    if (MODE == 2u) {
        // Bin j of the full spectrum from one-sided bin m (conjugated past the middle).
        for (var j = 0u; j < p.length; j++) {
            let mirrored = j > p.length / 2u;
            let m = select(j, p.length - j, mirrored);
            if (m < p.n) {
                var v = sample(base, m);
                v.y = select(v.y, -v.y, mirrored);
                let w = twiddle((k * j) % p.length, p.length);
                acc.x += v.x * w.x - v.y * w.y;
            }
        }
        y[p.y + o] = acc.x / f32(p.length);
        return;
    }
    for (var t = 0u; t < p.n; t++) {
        let v = sample(base, t);
        let w = twiddle((k * t) % p.length, p.length);
        let s = sign * w.y;
        acc += vec2<f32>(v.x * w.x - v.y * s, v.x * s + v.y * w.x);
    }
    if (MODE == 1u) {
        acc = acc / f32(p.length);
    }
    y[p.y + 2u * o] = acc.x;
    y[p.y + 2u * o + 1u] = acc.y;
}
