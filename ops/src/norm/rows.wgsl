// Instance, Group, Layer, RMS and MeanVariance normalization: the input is walked as rows (the
// indices the statistics are per) of elements (the indices they are over); each row's mean and
// variance are computed in two passes (the mean, then the mean square deviation from it), then
// every element is normalized and mapped. RMS skips the first pass: its mean is 0.
//
// Short rows take one invocation each; long rows (LONG) one workgroup each, whose invocations
// take every WG-th element and add their partial sums in workgroup memory.
//
// A row is `outer` runs of `inner` elements (a channel's plane, a strided axis); element (o, e)
// of row r is x[row(r) + o * x_os + e * x_is], its scale at (r % groups) * s_row + o * s_os +
// e * s_is and its bias likewise with b_os, b_is.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
// Scale and bias, read only by replaced hooks, then the optional statistics outputs.
@group(0) @binding(2) var<storage, read> scale: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> mean_out: array<f32>;
@group(0) @binding(5) var<storage, read_write> inv_out: array<f32>;

struct Params {
    x: u32,
    y: u32,
    scale: u32,
    bias: u32,
    mean_out: u32,
    inv_out: u32,
    rows: u32,
    // Row r starts at (r / r1) * r_s0 + (r % r1) * r_s1.
    r1: u32,
    r_s0: u32,
    r_s1: u32,
    outer: u32,
    x_os: u32,
    s_os: u32,
    b_os: u32,
    inner: u32,
    x_is: u32,
    s_is: u32,
    b_is: u32,
    groups: u32,
    s_row: u32,
    epsilon: f32,
}
var<immediate> p: Params;

override WG: u32 = 8u;
// A workgroup per row.
override LONG: bool = false;
// MeanVarianceNormalization's 1 / (sqrt(var) + 1e-9) instead of 1 / sqrt(var + epsilon).
override MVN: bool = false;
// RMSNormalization: uncentred, the mean taken as 0 (the variance is then the mean square).
override RMS: bool = false;

var<workgroup> red: array<f32, WG>;

// The factors of one run of a row (scale at s, bias at sb), worked out once per run:
// Instance/GroupNormalization's scale and bias are per channel.
fn run_factors(inv: f32, s: u32, sb: u32) -> vec2<f32> {
    return vec2<f32>(inv, 0.0);
}

// One element: x's value v, its run's factors f, its scale at s and bias at sb.
fn normalize(v: f32, mean: f32, f: vec2<f32>, s: u32, sb: u32) -> f32 {
    return (v - mean) * f.x;
}

// LayerNormalization's Mean and InvStdDev outputs.
fn store_stats(r: u32, mean: f32, inv: f32) {
}

// Adds the partial sums of a workgroup's invocations; every invocation gets the total.
fn workgroup_sum(lid: u32, part: f32) -> f32 {
    red[lid] = part;
    workgroupBarrier();
    for (var h = WG / 2u; h > 0u; h /= 2u) {
        if (lid < h) {
            red[lid] += red[lid + h];
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
}

@compute @workgroup_size(WG)
fn main(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    // A workgroup's invocations start at their index and step by WG; one invocation by 1.
    // Invocations past the last row compute it again and store nothing (no early return: the
    // workgroup's barriers need every invocation).
    var row: u32;
    var start = 0u;
    var step = 1u;
    if (LONG) {
        row = wg.x + wg.y * nwg.x;
        start = lid;
        step = WG;
    } else {
        row = gid.x + gid.y * nwg.x * WG;
    }
    let r = min(row, p.rows - 1u);
    // Offsets relative to the tensors' starts.
    let base = (r / p.r1) * p.r_s0 + (r % p.r1) * p.r_s1;
    let len = p.outer * p.inner;
    // Element `start` of the row as (run, element of the run). Each loop below walks the runs
    // from there, `step` elements at a time across run ends (after a run, e - inner is where
    // the next starts): the elements, and their order, of a flat walk over the row, with no
    // division in the loops.
    let o_start = start / p.inner;
    let e_start = start % p.inner;

    var part = 0.0;
    var e = e_start;
    var total: f32;
    var mean = 0.0;
    if (!RMS) {
        for (var o = o_start; o < p.outer; o++) {
            let xo = p.x + base + o * p.x_os;
            for (; e < p.inner; e += step) {
                part += x[xo + e * p.x_is];
            }
            e -= p.inner;
        }
        total = part;
        if (LONG) {
            total = workgroup_sum(lid, part);
        }
        mean = total / f32(len);
    }

    part = 0.0;
    e = e_start;
    for (var o = o_start; o < p.outer; o++) {
        let xo = p.x + base + o * p.x_os;
        for (; e < p.inner; e += step) {
            let d = x[xo + e * p.x_is] - mean;
            part += d * d;
        }
        e -= p.inner;
    }
    total = part;
    if (LONG) {
        total = workgroup_sum(lid, part);
    }
    let vr = total / f32(len);
    var inv: f32;
    if (MVN) {
        inv = 1.0 / (sqrt(vr) + f32(1e-9));
    } else {
        inv = 1.0 / sqrt(vr + p.epsilon);
    }
    if (row >= p.rows) {
        return;
    }

    let s_base = (r % p.groups) * p.s_row;
    e = e_start;
    for (var o = o_start; o < p.outer; o++) {
        let xo = base + o * p.x_os;
        let so = s_base + o * p.s_os;
        let bo = s_base + o * p.b_os;
        let fo = run_factors(inv, so, bo);
        for (; e < p.inner; e += step) {
            let at = xo + e * p.x_is;
            y[p.y + at] = normalize(x[p.x + at], mean, fo, so + e * p.s_is, bo + e * p.b_is);
        }
        e -= p.inner;
    }
    if (lid == 0u || !LONG) {
        store_stats(r, mean, inv);
    }
}
