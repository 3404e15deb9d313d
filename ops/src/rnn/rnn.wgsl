// LSTM, GRU and RNN layers in float32 (formulas as rnn/cpu.rs): direction, layout, clip, the
// activations, sequence lengths of int32 or int64, initial states, peepholes, input_forget,
// linear_before_reset, and any of the outputs Y, Y_h, Y_c.
//
// Every step needs all of the previous hidden state and the ABI has no scratch memory, so one
// workgroup runs one (batch entry, direction) through the time steps, the hidden state in
// workgroup memory. Invocation `lid` owns the UNITS hidden units lid, lid + WG, ...: per step it
// computes all the gates of its units (x·Wᵀ and h·Rᵀ in one pass each, every load of x and h
// shared by the gates, four floats per loop turn), then a barrier, then it stores the new state
// over the old one (and into Y), then a barrier. An LSTM's cell state never leaves the
// invocation of its unit. GRU without linear_before_reset needs r ⊙ h of every unit before its
// candidate, so its second phase takes that product.
//
// One dispatch runs p.steps steps (lavapipe silently stops an invocation after about 65535 loop
// turns; rnn/vulkan.rs counts them). A longer sequence takes several dispatches of this module,
// the state carried in the outputs: h in Y_h, or else in Y at the last step run; c in Y_c, or
// else in Y at the next step to run (which that step overwrites). The chunk's number rides on
// the dispatch size: chunk k runs batch * dirs + k workgroups, and the k extra ones return at
// once.
//
// Specialised per dispatch (rnn/vulkan.rs): the overrides; XT, WT and RT (f32 unless X_VEC,
// W_VEC, R_VEC: the rows of X, W and R are whole aligned vectors); Units retyped to UNITS
// floats; the activation hooks act_f, act_g and act_h.

alias XT = vec4<f32>;
alias WT = vec4<f32>;
alias RT = vec4<f32>;
// One float per unit of the invocation.
alias Units = array<f32, 1>;

const LSTM = 0u;
const GRU = 1u;
const RNN = 2u;

override CELL: u32 = 0u;
// Gate blocks of W and R: 4 (LSTM: i, o, f, c), 3 (GRU: z, r, h) or 1.
override GATES: u32 = 4u;
override INPUT_FORGET: bool = false;
override LINEAR_BEFORE_RESET: bool = false;
// GRU without linear_before_reset.
override RESET_FIRST: bool = CELL == GRU && !LINEAR_BEFORE_RESET;
override X_VEC: bool = true;
override W_VEC: bool = true;
override R_VEC: bool = true;
override WG: u32 = 64u;
override UNITS: u32 = 1u;
// Floats of hidden state in workgroup memory (hidden, rounded up to a multiple of 4), and of
// GRU's r ⊙ h (4 where unused). Floats, not vectors: each invocation stores its own units, and
// no two should store into components of one vector.
override STATE: u32 = 64u;
override RESET_STATE: u32 = 4u;
override HAS_BIAS: bool = false;
override HAS_LENS: bool = false;
override LENS_I64: bool = false;
override HAS_H0: bool = false;
override HAS_C0: bool = false;
override HAS_PEEP: bool = false;
// How many of Y, Y_h, Y_c the layer has.
override OUTPUTS: u32 = 1u;
// layout = 1: X, Y and the states are batch-major.
override BATCH_MAJOR: bool = false;
// direction = reverse (with two directions, the second is reversed).
override REVERSE: bool = false;
override CLIP: bool = false;

@group(0) @binding(0) var<storage, read> x: array<XT>;
@group(0) @binding(1) var<storage, read> w: array<WT>;
@group(0) @binding(2) var<storage, read> r: array<RT>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
// The optional inputs and outputs; a slot the layer lacks is bound to another operand and never
// read.
@group(0) @binding(4) var<storage, read> bias: array<f32>;
// int32, or int64 as pairs of words.
@group(0) @binding(5) var<storage, read> lens: array<u32>;
@group(0) @binding(6) var<storage, read> h0: array<f32>;
@group(0) @binding(7) var<storage, read> c0: array<f32>;
@group(0) @binding(8) var<storage, read> peep: array<f32>;
@group(0) @binding(9) var<storage, read_write> yh: array<f32>;
@group(0) @binding(10) var<storage, read_write> yc: array<f32>;

struct Params {
    x: u32,
    w: u32,
    r: u32,
    y: u32,
    bias: u32,
    lens: u32,
    h0: u32,
    c0: u32,
    peep: u32,
    yh: u32,
    yc: u32,
    seq: u32,
    batch: u32,
    input: u32,
    hidden: u32,
    dirs: u32,
    // Steps per dispatch.
    steps: u32,
    clip: f32,
}
var<immediate> p: Params;

var<workgroup> hw: array<f32, STATE>;
var<workgroup> rh: array<f32, RESET_STATE>;

// The activations f, g, h of direction d (rnn/vulkan.rs writes the layer's own).
fn act_f(d: u32, v: f32) -> f32 {
    return 1.0 / (1.0 + exp(-v));
}

fn act_g(d: u32, v: f32) -> f32 {
    return tanh(v);
}

fn act_h(d: u32, v: f32) -> f32 {
    return tanh(v);
}

fn clip(v: f32) -> f32 {
    if (CLIP) {
        return clamp(v, -p.clip, p.clip);
    }
    return v;
}

// Float i of X, W, R (absolute; their type is f32 whenever these are read), and the four floats
// from float i of the tensor (a multiple of 4 where the type is a vector).
fn x1(i: u32) -> f32 {
    return vec4<f32>(x[i]).x;
}

fn w1(i: u32) -> f32 {
    return vec4<f32>(w[i]).x;
}

fn r1(i: u32) -> f32 {
    return vec4<f32>(r[i]).x;
}

fn x4(i: u32) -> vec4<f32> {
    if (X_VEC) {
        return vec4<f32>(x[p.x + i / 4u]);
    }
    let a = p.x + i;
    return vec4<f32>(x1(a), x1(a + 1u), x1(a + 2u), x1(a + 3u));
}

fn w4(i: u32) -> vec4<f32> {
    if (W_VEC) {
        return vec4<f32>(w[p.w + i / 4u]);
    }
    let a = p.w + i;
    return vec4<f32>(w1(a), w1(a + 1u), w1(a + 2u), w1(a + 3u));
}

fn r4(i: u32) -> vec4<f32> {
    if (R_VEC) {
        return vec4<f32>(r[p.r + i / 4u]);
    }
    let a = p.r + i;
    return vec4<f32>(r1(a), r1(a + 1u), r1(a + 2u), r1(a + 3u));
}

// Units j..j + 4 of the state and of GRU's r ⊙ h.
fn h4(j: u32) -> vec4<f32> {
    return vec4<f32>(hw[j], hw[j + 1u], hw[j + 2u], hw[j + 3u]);
}

fn rh4(j: u32) -> vec4<f32> {
    return vec4<f32>(rh[j], rh[j + 1u], rh[j + 2u], rh[j + 3u]);
}

// X's row t of batch entry b, Y's (t, d, b) and the states' (d, b), as float offsets.
fn x_row(t: u32, b: u32) -> u32 {
    if (BATCH_MAJOR) {
        return (b * p.seq + t) * p.input;
    }
    return (t * p.batch + b) * p.input;
}

fn y_at(t: u32, d: u32, b: u32) -> u32 {
    if (BATCH_MAJOR) {
        return ((b * p.seq + t) * p.dirs + d) * p.hidden;
    }
    return ((t * p.dirs + d) * p.batch + b) * p.hidden;
}

fn state_at(d: u32, b: u32) -> u32 {
    if (BATCH_MAJOR) {
        return (b * p.dirs + d) * p.hidden;
    }
    return (d * p.batch + b) * p.hidden;
}

// The sequence length of batch entry b, within 0..=seq.
fn sequence_length(b: u32) -> u32 {
    if (!HAS_LENS) {
        return p.seq;
    }
    if (LENS_I64) {
        let high = bitcast<i32>(lens[p.lens + 2u * b + 1u]);
        let low = lens[p.lens + 2u * b];
        return select(select(min(low, p.seq), p.seq, high > 0), 0u, high < 0);
    }
    return u32(clamp(bitcast<i32>(lens[p.lens + b]), 0, i32(p.seq)));
}

// Σ_j x[xi + j] · W[wi + g·gate + j] over the input for each gate g (component g): one pass,
// each load of x shared by the gates.
fn x_gates(xi: u32, wi: u32) -> vec4<f32> {
    let n = p.input;
    let gate = p.hidden * n;
    var acc = vec4<f32>(0.0);
    for (var k = 0u; k < n / 4u; k++) {
        let j = 4u * k;
        let q = x4(xi + j);
        acc.x += dot(q, w4(wi + j));
        if (GATES > 1u) {
            acc.y += dot(q, w4(wi + gate + j));
        }
        if (GATES > 2u) {
            acc.z += dot(q, w4(wi + 2u * gate + j));
        }
        if (GATES > 3u) {
            acc.w += dot(q, w4(wi + 3u * gate + j));
        }
    }
    // Vectors mean whole rows of 4k floats.
    if (!(X_VEC || W_VEC)) {
        for (var j = n / 4u * 4u; j < n; j++) {
            let v = x1(p.x + xi + j);
            acc.x += v * w1(p.w + wi + j);
            if (GATES > 1u) {
                acc.y += v * w1(p.w + wi + gate + j);
            }
            if (GATES > 2u) {
                acc.z += v * w1(p.w + wi + 2u * gate + j);
            }
            if (GATES > 3u) {
                acc.w += v * w1(p.w + wi + 3u * gate + j);
            }
        }
    }
    return acc;
}

// Σ_j h[j] · R[ri + g·gate + j] over the state for each gate g (component g) but the
// candidate of GRU without linear_before_reset, which takes r ⊙ h instead (reset_dot).
fn h_gates(ri: u32) -> vec4<f32> {
    let n = p.hidden;
    let gate = n * n;
    var acc = vec4<f32>(0.0);
    for (var k = 0u; k < n / 4u; k++) {
        let j = 4u * k;
        let q = h4(j);
        acc.x += dot(q, r4(ri + j));
        if (GATES > 1u) {
            acc.y += dot(q, r4(ri + gate + j));
        }
        if (GATES > 2u && !RESET_FIRST) {
            acc.z += dot(q, r4(ri + 2u * gate + j));
        }
        if (GATES > 3u) {
            acc.w += dot(q, r4(ri + 3u * gate + j));
        }
    }
    if (!R_VEC) {
        for (var j = n / 4u * 4u; j < n; j++) {
            let v = hw[j];
            acc.x += v * r1(p.r + ri + j);
            if (GATES > 1u) {
                acc.y += v * r1(p.r + ri + gate + j);
            }
            if (GATES > 2u && !RESET_FIRST) {
                acc.z += v * r1(p.r + ri + 2u * gate + j);
            }
            if (GATES > 3u) {
                acc.w += v * r1(p.r + ri + 3u * gate + j);
            }
        }
    }
    return acc;
}

// Σ_j (r ⊙ h)[j] · R[ri + j].
fn reset_dot(ri: u32) -> f32 {
    let n = p.hidden;
    var acc = 0.0;
    for (var k = 0u; k < n / 4u; k++) {
        acc += dot(rh4(4u * k), r4(ri + 4u * k));
    }
    if (!R_VEC) {
        for (var j = n / 4u * 4u; j < n; j++) {
            acc += rh[j] * r1(p.r + ri + j);
        }
    }
    return acc;
}

// Unit u's input biases (Wb, k = 0) or recurrence biases (Rb, k = 1) of direction d, per gate.
fn biases(d: u32, u: u32, k: u32) -> vec4<f32> {
    if (!HAS_BIAS) {
        return vec4<f32>(0.0);
    }
    let h = p.hidden;
    let at = p.bias + (2u * d + k) * GATES * h + u;
    var b = vec4<f32>(bias[at], 0.0, 0.0, 0.0);
    if (GATES > 1u) {
        b.y = bias[at + h];
    }
    if (GATES > 2u) {
        b.z = bias[at + 2u * h];
    }
    if (GATES > 3u) {
        b.w = bias[at + 3u * h];
    }
    return b;
}

// LSTM peephole k (i, o, f) of unit u times the cell state c.
fn peephole(d: u32, k: u32, u: u32, c: f32) -> f32 {
    if (!HAS_PEEP) {
        return 0.0;
    }
    return peep[p.peep + (3u * d + k) * p.hidden + u] * c;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) count: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    // Workgroups past one per (batch entry, direction) only count the chunk.
    let pairs = p.batch * p.dirs;
    if (wid.x >= pairs) {
        return;
    }
    let chunk = count.x - pairs;
    let b = wid.x / p.dirs;
    let d = wid.x % p.dirs;
    let rev = REVERSE || d == 1u;
    let len = sequence_length(b);
    let s0 = chunk * p.steps;
    let s1 = min(s0 + p.steps, p.seq);
    let st = state_at(d, b);
    // This direction's first row of W and R.
    let row = d * GATES * p.hidden;
    // Per unit: the new hidden state (GRU without linear_before_reset: its update gate z), the
    // cell state (LSTM), and the candidate's input part (GRU without linear_before_reset).
    var hn: Units;
    var cs: Units;
    var xc: Units;

    // The state at step s0: the initial one, or what the previous chunk left.
    for (var m = 0u; m < UNITS; m++) {
        let u = lid + m * WG;
        if (u < p.hidden) {
            var hv = 0.0;
            var cv = 0.0;
            if (chunk == 0u) {
                if (HAS_H0) {
                    hv = h0[p.h0 + st + u];
                }
                if (HAS_C0) {
                    cv = c0[p.c0 + st + u];
                }
            } else {
                if (OUTPUTS >= 2u) {
                    hv = yh[p.yh + st + u];
                } else if (s0 <= len) {
                    hv = y[p.y + y_at(select(s0 - 1u, len - s0, rev), d, b) + u];
                }
                if (CELL == LSTM) {
                    if (OUTPUTS >= 3u) {
                        cv = yc[p.yc + st + u];
                    } else if (s0 < len) {
                        cv = y[p.y + y_at(select(s0, len - 1u - s0, rev), d, b) + u];
                    }
                }
            }
            hw[u] = hv;
            cs[m] = cv;
        }
    }
    workgroupBarrier();

    for (var s = s0; s < s1; s++) {
        let live = s < len;
        // The time index of step s (while live).
        let t = select(s, len - 1u - s, rev);
        let xr = x_row(t, b);
        // What reads the previous state: the gates, and the new state in hn (or GRU's r ⊙ h
        // in rh).
        for (var m = 0u; m < UNITS; m++) {
            let u = lid + m * WG;
            if (live && u < p.hidden) {
                let ax = x_gates(xr, (row + u) * p.input);
                let ah = h_gates((row + u) * p.hidden);
                let wb = biases(d, u, 0u);
                let rb = biases(d, u, 1u);
                let a = ax + wb + ah + rb;
                if (CELL == LSTM) {
                    let cp = cs[m];
                    let ig = act_f(d, clip(a.x + peephole(d, 0u, u, cp)));
                    var fg = 1.0 - ig;
                    if (!INPUT_FORGET) {
                        fg = act_f(d, clip(a.z + peephole(d, 2u, u, cp)));
                    }
                    let cn = fg * cp + ig * act_g(d, clip(a.w));
                    let og = act_f(d, clip(a.y + peephole(d, 1u, u, cn)));
                    cs[m] = cn;
                    hn[m] = og * act_h(d, cn);
                } else if (CELL == GRU) {
                    let z = act_f(d, clip(a.x));
                    let rg = act_f(d, clip(a.y));
                    if (LINEAR_BEFORE_RESET) {
                        let cand = act_g(d, clip(ax.z + wb.z + rg * (ah.z + rb.z)));
                        hn[m] = (1.0 - z) * cand + z * hw[u];
                    } else {
                        hn[m] = z;
                        xc[m] = ax.z + wb.z + rb.z;
                        rh[u] = rg * hw[u];
                    }
                } else {
                    hn[m] = act_f(d, clip(a.x));
                }
            }
        }
        workgroupBarrier();
        // The new state over the old one, and into Y.
        for (var m = 0u; m < UNITS; m++) {
            let u = lid + m * WG;
            if (u < p.hidden) {
                if (live) {
                    var hv = hn[m];
                    if (RESET_FIRST) {
                        // The candidate's h part, now that every unit's r ⊙ h is in.
                        let hr = reset_dot((row + 2u * p.hidden + u) * p.hidden);
                        let cand = act_g(d, clip(xc[m] + hr));
                        hv = (1.0 - hn[m]) * cand + hn[m] * hw[u];
                    }
                    hw[u] = hv;
                    y[p.y + y_at(t, d, b) + u] = hv;
                } else {
                    y[p.y + y_at(s, d, b) + u] = 0.0;
                }
            }
        }
        workgroupBarrier();
    }

    // The final state (zero for an empty sequence), which is also the carry to the next chunk;
    // without Y_c, an LSTM's cell state waits in Y where its next step will write.
    let empty = s1 == p.seq && len == 0u;
    for (var m = 0u; m < UNITS; m++) {
        let u = lid + m * WG;
        if (u < p.hidden) {
            if (OUTPUTS >= 2u) {
                yh[p.yh + st + u] = select(hw[u], 0.0, empty);
            }
            if (OUTPUTS >= 3u) {
                yc[p.yc + st + u] = select(cs[m], 0.0, empty);
            } else if (CELL == LSTM && s1 < len) {
                y[p.y + y_at(select(s1, len - 1u - s1, rev), d, b) + u] = cs[m];
            }
        }
    }
}
