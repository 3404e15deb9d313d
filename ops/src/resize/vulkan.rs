//! Vulkan kernels of the resize family (ops: ops/src/resize/cpu.rs): Resize in nearest
//! mode (any 4-byte dtype, and 2-byte ones two to a word), linear and cubic modes (float32),
//! with antialiasing.
//!
//! `resize.wgsl`: one invocation per output element, or per 4 neighbouring ones along the last
//! axis (one vec4 store) where that axis is a multiple of 4 and aligned; each axis's map and
//! filter width are params, the mode and its options overrides. Along each resized axis, the
//! source coordinate of output index j is affine in j; the kernel evaluates it in exact integer
//! arithmetic, as `t = p * j + r` over `q`: the nearest source index is `floor(t / q)` clamped
//! to the input, and interpolation weights come from the remainder. (p, q, r) are not worked
//! out from the coordinate-transformation formulas a second time: they are fitted to what the
//! CPU kernel, the reference, does along that axis (run at compile time on a probe tensor) and
//! checked at every output index — nearest indices exactly, interpolated source coordinates
//! within [`TOLERANCE`] of a pixel. An axis without such a fit gets no kernel.
//! tf_crop_and_resize's extrapolated positions are a range of output indices per axis, also
//! read off the probe.

use crate::vulkan::{
    Binding, DeviceClass, Dispatch, Grid, KernelCx, NoKernel, Spec, Wgsl, f32_lit,
};
use crate::{Tensor, TensorDesc, cpu, no_kernel, wgsl};
use ingot_schema::{AttrValue, Attrs, DType};

static RESIZE: Wgsl = wgsl!("resize/resize.wgsl");
static GRID_SAMPLE: Wgsl = wgsl!("resize/grid_sample.wgsl");
static AFFINE_GRID: Wgsl = wgsl!("resize/affine_grid.wgsl");

/// How far (in input pixels) a fitted interpolation coordinate may be from the CPU's.
const TOLERANCE: f64 = 1e-5;
/// The most taps a linear or cubic output element reads.
const MAX_TAPS: usize = 64;
/// Probes are at most this many elements (a linear probe is n_in x n_out).
const PROBE_LIMIT: usize = 1 << 24;

pub fn lower(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    match cx.op {
        "GridSample" => return grid_sample(cx),
        "AffineGrid" => return affine_grid(cx),
        _ => {}
    }
    if cx.inputs.len() != 1 || cx.outputs.len() != 1 {
        return Err(no_kernel!("Resize with {} inputs", cx.inputs.len()));
    }
    if cx.in_place().is_some() {
        return Err(no_kernel!("Resize in place"));
    }
    let (x, y) = (&cx.inputs[0].desc, &cx.outputs[0].desc);
    let rank = x.shape.len();
    if y.shape.len() != rank || y.dtype != x.dtype {
        return Err(no_kernel!("Resize from {x:?} to {y:?}"));
    }
    if y.elements() == 0 {
        return Ok(Vec::new());
    }
    if x.elements() as u64 >= u64::from(u32::MAX) / 2 || y.elements() as u64 >= 1 << 31 {
        return Err(no_kernel!("Resize: tensors too large for u32 indices"));
    }
    let a = cx.attrs;
    let text = |name| a.text(name).map_err(|e| no_kernel!("{e}"));
    let mode = text("mode")?;
    let int = |name| a.int(name).map_err(|e| no_kernel!("{e}"));
    let filter = match mode {
        "nearest" => None,
        "linear" | "cubic" => Some(Filter {
            cubic: match mode {
                "cubic" => Some(a.float("cubic_coeff_a").map_err(|e| no_kernel!("{e}"))?),
                _ => None,
            },
            antialias: int("antialias")? != 0,
            exclude_outside: int("exclude_outside")? != 0,
        }),
        m => return Err(no_kernel!("Resize mode {m}")),
    };
    // Nearest moves 2-byte elements (float16) two to a word, which must be whole.
    let halves = filter.is_none() && x.dtype.size() == 2;
    if filter.is_some() {
        cx.require_f32()?;
    } else if x.dtype.size() != 4 && !halves {
        return Err(cx.dtype(x.dtype));
    }
    if let Some(o) =
        (cx.inputs.iter().chain(cx.outputs)).find(|o| halves && !o.byte_offset.is_multiple_of(4))
    {
        return Err(no_kernel!(
            "Resize of {} at byte {}, not word-aligned",
            x.dtype,
            o.byte_offset
        ));
    }
    let scales = a.floats("scales").map_err(|e| no_kernel!("{e}"))?;
    if scales.len() != rank {
        return Err(no_kernel!("Resize scales {scales:?} for rank {rank}"));
    }
    let mut axes = Vec::new();
    let mut stride = 1u64;
    for d in (0..rank).rev() {
        let (n_in, n_out) = (x.shape[d], y.shape[d]);
        let map = if n_in == n_out && n_in <= 1 {
            Map::Identity
        } else if filter.is_some() {
            interpolated(cx, d)?
        } else {
            nearest(cx, d)?
        };
        axes.push(Axis { n_in: n_in as u64, n_out: n_out as u64, stride, scale: scales[d], map });
        stride *= n_in as u64;
    }
    axes.reverse();
    // Neighbouring identity axes are one.
    let mut merged: Vec<Axis> = Vec::new();
    for axis in axes {
        match merged.last_mut() {
            Some(last) if last.map == Map::Identity && axis.map == Map::Identity => {
                last.n_in *= axis.n_in;
                last.n_out *= axis.n_out;
                last.stride = axis.stride;
            }
            _ => merged.push(axis),
        }
    }
    let extrapolation = a.float("extrapolation_value").map_err(|e| no_kernel!("{e}"))?;
    let crops = merged.iter().any(|a| a.inside().is_some());
    if crops && x.dtype != DType::F32 {
        return Err(no_kernel!("Resize extrapolating {}", x.dtype));
    }
    kernel(cx, &merged, filter, extrapolation, y.elements() as u64, halves)
}

/// The affine map `t = p * j + r`, read over `q`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Affine {
    p: i64,
    q: i64,
    r: i64,
}

#[derive(Clone, Debug, PartialEq)]
enum Map {
    /// Output index j reads input index j.
    Identity,
    /// Every output index reads the first input index (an input of extent 1).
    First,
    /// The output indices in `inside` (others take the extrapolation value) read source
    /// coordinate `affine`.
    Affine { affine: Affine, inside: (u64, u64) },
}

/// One axis of the resize.
#[derive(Clone, Debug)]
struct Axis {
    n_in: u64,
    n_out: u64,
    /// Input stride.
    stride: u64,
    /// The `scales` entry: an antialiasing filter widens by its inverse.
    scale: f64,
    map: Map,
}

/// Linear or cubic interpolation, as the CPU's `Filter`: an output reads the `taps` input
/// indices nearest its source coordinate c, from `ceil(c) - taps / 2` on, each weighted by the
/// kernel (triangle or cubic convolution) at `s * (index - c)`; `s` is 1, or with antialiasing
/// the scale when it shrinks, which widens the kernel. Antialiasing normalises the weights to
/// sum 1, and `exclude_outside` drops the indices outside the input and renormalises.
#[derive(Clone, Copy, Debug)]
struct Filter {
    /// `Some(a)` for cubic with coefficient a.
    cubic: Option<f32>,
    antialias: bool,
    exclude_outside: bool,
}

impl Filter {
    /// `s`, the kernel's argument per input pixel.
    fn s(&self, scale: f64) -> f64 {
        if self.antialias { scale.min(1.0) } else { 1.0 }
    }

    /// Taps per output along an axis of `scale`: the kernel's support, 2 or 4 pixels, over s.
    fn taps(&self, scale: f64) -> usize {
        let half = if self.cubic.is_some() { 2.0 } else { 1.0 };
        (-2.0 * (-half / self.s(scale)).floor()) as usize
    }
}

impl Axis {
    /// The range of output indices that do not extrapolate, unless all of them.
    fn inside(&self) -> Option<(u64, u64)> {
        match self.map {
            Map::Affine { inside, .. } if inside != (0, self.n_out) => Some(inside),
            _ => None,
        }
    }
}

/// The CPU's Resize of `x` with this step's attributes along axis `d` only, in `mode`: `x`'s
/// axis 0 stands for axis `d`, its other axis (if any) is left alone. Extrapolated positions
/// come out NaN.
fn cpu_resize(cx: &KernelCx, d: usize, mode: &str, x: &Tensor) -> Result<Tensor, NoKernel> {
    let err = |e: &dyn std::fmt::Display| no_kernel!("Resize probe along axis {d}: {e}");
    let a = cx.attrs;
    let rank = cx.inputs[0].desc.shape.len();
    let (scales, roi) =
        (a.floats("scales").map_err(|e| err(&e))?, a.floats("roi").map_err(|e| err(&e))?);
    if scales.len() != rank || roi.len() != 2 * rank {
        return Err(err(&"scales or roi do not match the rank"));
    }
    let n_out = cx.outputs[0].desc.shape[d];
    let rest = &x.shape()[1..];
    let ones = |v: f64| vec![v; rest.len()];
    let sizes: Vec<usize> = [&[n_out][..], rest].concat();
    let attrs: Attrs = a
        .clone()
        .with("mode", AttrValue::Text(mode.into()))
        .with("antialias", AttrValue::Int(0))
        .with("exclude_outside", AttrValue::Int(0))
        .with("extrapolation_value", AttrValue::Float(f64::NAN))
        .with("scales", AttrValue::Floats([vec![scales[d]], ones(1.0)].concat()))
        .with("sizes", AttrValue::Ints(sizes.iter().map(|&s| s as i64).collect()))
        .with(
            "roi",
            AttrValue::Floats([vec![roi[d]], ones(0.0), vec![roi[d + rank]], ones(1.0)].concat()),
        );
    let out = cpu::eval("Resize", &attrs, &[x], &[TensorDesc::new(DType::F32, sizes)])
        .map_err(|e| err(&e))?;
    out.into_iter().next().ok_or_else(|| err(&"no output"))
}

/// Bounds on the source coordinate `c` of one output index `j`: `lo <= c <= hi`, or `c < hi`
/// when `open`; infinite where unbounded.
#[derive(Clone, Copy, Debug)]
struct Bound {
    j: u64,
    lo: f64,
    hi: f64,
    open: bool,
}

/// The output indices that do not extrapolate (`outside[j]`), as one range.
fn inside_range(outside: &[bool], d: usize) -> Result<(u64, u64), NoKernel> {
    let first = outside.iter().position(|&o| !o).unwrap_or(0);
    let end = outside.iter().rposition(|&o| !o).map_or(0, |l| l + 1);
    if outside[first..end].iter().any(|&o| o) {
        return Err(no_kernel!(
            "Resize: the extrapolated outputs along axis {d} are not at the ends"
        ));
    }
    Ok((first as u64, end as u64))
}

/// Nearest mode along axis `d`: the CPU's source index of every output index, fitted.
fn nearest(cx: &KernelCx, d: usize) -> Result<Map, NoKernel> {
    let n_in = cx.inputs[0].desc.shape[d];
    if n_in > PROBE_LIMIT {
        return Err(no_kernel!("Resize: axis {d} is too long to probe"));
    }
    let iota: Vec<f32> = (0..n_in).map(|i| i as f32).collect();
    let probe = Tensor::from_vec(vec![n_in], &iota).map_err(|e| no_kernel!("{e}"))?;
    let src = cpu_resize(cx, d, "nearest", &probe)?;
    let src = src.as_slice::<f32>().map_err(|e| no_kernel!("{e}"))?;
    let outside: Vec<bool> = src.iter().map(|v| v.is_nan()).collect();
    let inside = inside_range(&outside, d)?;
    if n_in == 1 {
        return Ok(affine_or_first(None, inside, src.len()));
    }
    let top = (n_in - 1) as f64;
    let bounds: Vec<Bound> = (inside.0..inside.1)
        .map(|j| {
            let i = f64::from(src[j as usize]);
            // floor(c) = i, or c < 1 and c >= n - 1 where the CPU clamps.
            let (lo, hi) = match i {
                0.0 => (f64::NEG_INFINITY, 1.0),
                i if i == top => (top, f64::INFINITY),
                i => (i, i + 1.0),
            };
            Bound { j, lo, hi, open: true }
        })
        .collect();
    if n_in == cx.outputs[0].desc.shape[d] && src.iter().enumerate().all(|(j, &i)| i == j as f32) {
        return Ok(Map::Identity);
    }
    let affine = fit(&bounds, cx, d)?;
    Ok(affine_or_first(Some(affine), inside, src.len()))
}

fn affine_or_first(affine: Option<Affine>, inside: (u64, u64), n_out: usize) -> Map {
    match affine {
        Some(affine) => Map::Affine { affine, inside },
        None if inside == (0, n_out as u64) => Map::First,
        // An input of extent 1 whose crop extrapolates: the source coordinate is 0.
        None => Map::Affine { affine: Affine { p: 0, q: 1, r: 0 }, inside },
    }
}

/// Linear and cubic modes along axis `d`: the CPU's linear taps of every output index give its
/// source coordinate (the cubic taps are placed around the same coordinate), fitted.
fn interpolated(cx: &KernelCx, d: usize) -> Result<Map, NoKernel> {
    let n_in = cx.inputs[0].desc.shape[d];
    let n_out = cx.outputs[0].desc.shape[d];
    if n_in.saturating_mul(n_out) > PROBE_LIMIT {
        return Err(no_kernel!("Resize: axis {d} is too long to probe"));
    }
    // Row j of the CPU's resize of the identity matrix holds output j's weights per input
    // index; made a block of columns at a time.
    let mut taps: Vec<Vec<(usize, f32)>> = vec![Vec::new(); n_out];
    let mut outside = vec![false; n_out];
    let block = (PROBE_LIMIT / 16 / n_out.max(1)).clamp(1, n_in.max(1));
    for c0 in (0..n_in).step_by(block) {
        let k = block.min(n_in - c0);
        let mut eye = vec![0f32; n_in * k];
        for c in 0..k {
            eye[(c0 + c) * k + c] = 1.0;
        }
        let probe = Tensor::from_vec(vec![n_in, k], &eye).map_err(|e| no_kernel!("{e}"))?;
        let w = cpu_resize(cx, d, "linear", &probe)?;
        let w = w.as_slice::<f32>().map_err(|e| no_kernel!("{e}"))?;
        for (j, row) in w.chunks_exact(k).enumerate() {
            for (c, &v) in row.iter().enumerate() {
                if v.is_nan() {
                    outside[j] = true;
                } else if v != 0.0 {
                    taps[j].push((c0 + c, v));
                }
            }
        }
    }
    let inside = inside_range(&outside, d)?;
    if n_in == 1 {
        return Ok(affine_or_first(None, inside, n_out));
    }
    if n_in == n_out && (0..n_out).all(|j| taps[j] == [(j, 1.0)]) {
        return Ok(Map::Identity);
    }
    let top = n_in - 1;
    let t = TOLERANCE;
    let bounds = (inside.0..inside.1)
        .map(|j| {
            let (lo, hi) = match taps[j as usize][..] {
                [(0, _)] => (f64::NEG_INFINITY, t),
                [(i, _)] if i == top => (top as f64 - t, f64::INFINITY),
                [(i, _)] => (i as f64 - t, i as f64 + t),
                [(i, _), (i1, w1)] if i1 == i + 1 => {
                    let c = i as f64 + f64::from(w1);
                    (c - t, c + t)
                }
                _ => {
                    return Err(no_kernel!(
                        "Resize: output {j} along axis {d} has linear taps {:?}",
                        taps[j as usize]
                    ));
                }
            };
            Ok(Bound { j, lo, hi, open: false })
        })
        .collect::<Result<Vec<_>, NoKernel>>()?;
    let affine = fit(&bounds, cx, d)?;
    Ok(affine_or_first(Some(affine), inside, n_out))
}

/// An affine map meeting every bound, with a small denominator where one does.
fn fit(bounds: &[Bound], cx: &KernelCx, d: usize) -> Result<Affine, NoKernel> {
    let n_in = cx.inputs[0].desc.shape[d] as i64;
    let n_out = cx.outputs[0].desc.shape[d] as i64;
    let scale = cx.attrs.floats("scales").ok().and_then(|s| s.get(d).copied()).unwrap_or(1.0);
    let (smin, smax) = slopes(bounds);
    let mut qs: Vec<i64> = (1..=16).collect();
    for base in [n_out, n_out - 1, n_in, n_in - 1, numerator(scale)] {
        qs.extend([base, 2 * base, 4 * base]);
    }
    // Fine denominators approximate any slope, as far as t stays inside i32.
    qs.extend((10..=28).step_by(2).map(|k| 1i64 << k));
    qs.retain(|&q| q > 0 && q <= 1 << 28);
    qs.sort_unstable();
    qs.dedup();
    let j_max = i128::from(n_out.max(1) - 1);
    for q in qs {
        let qf = q as f64;
        let (lo, hi) = ((qf * smin - 1e-6).ceil().max(-1e15), (qf * smax + 1e-6).floor().min(1e15));
        if lo > hi {
            continue;
        }
        let center = ((lo + hi) / 2.0).round() as i64;
        let (lo, hi) = (lo as i64, hi as i64);
        // The candidates nearest the middle of the slope interval, at most 64.
        let mut ps: Vec<i64> = (0..64)
            .map(|k| center + if k % 2 == 0 { k / 2 } else { -(k + 1) / 2 })
            .filter(|p| (lo..=hi).contains(p))
            .collect();
        ps.sort_by_key(|p| (p - center).abs());
        for p in ps {
            let Some(r) = offset(bounds, p, q) else {
                continue;
            };
            // t stays inside i32.
            let t_max = (p as i128).abs() * j_max + (r as i128).abs() + q as i128;
            if t_max < 1 << 31 {
                return Ok(Affine { p, q, r });
            }
        }
    }
    Err(no_kernel!("Resize: no integer source-coordinate map along axis {d} matches the CPU's"))
}

/// The interval of slopes the bounds allow, or a superset of it: for j < k, a slope is at
/// least (lo_k - hi_j) / (k - j) and at most (hi_k - lo_j) / (k - j); every bound is paired
/// with the first and last ones bounded on either side.
fn slopes(bounds: &[Bound]) -> (f64, f64) {
    let limit = f64::from(1 << 20);
    let (mut smin, mut smax) = (-limit, limit);
    let (lo, hi) = (|b: &&Bound| b.lo.is_finite(), |b: &&Bound| b.hi.is_finite());
    let anchors: Vec<&Bound> = [
        bounds.iter().find(lo),
        bounds.iter().find(hi),
        bounds.iter().rev().find(lo),
        bounds.iter().rev().find(hi),
    ]
    .into_iter()
    .flatten()
    .collect();
    for b in bounds {
        for &a in &anchors {
            let (j, k) = if a.j < b.j { (a, b) } else { (b, a) };
            if j.j == k.j {
                continue;
            }
            // Infinite bounds give -inf and +inf here, which change nothing.
            let dj = (k.j - j.j) as f64;
            smin = smin.max((k.lo - j.hi) / dj);
            smax = smax.min((k.hi - j.lo) / dj);
        }
    }
    (smin, smax)
}

/// An r with every bound met by `p * j + r` over `q`, nearest the middle of the allowed range.
fn offset(bounds: &[Bound], p: i64, q: i64) -> Option<i64> {
    let (mut lo, mut hi) = (i128::MIN, i128::MAX);
    let qf = q as f64;
    for b in bounds {
        let pj = p as i128 * b.j as i128;
        if b.lo.is_finite() {
            lo = lo.max((qf * b.lo).ceil() as i128 - pj);
        }
        if b.hi.is_finite() {
            let top =
                if b.open { (qf * b.hi).ceil() as i128 - 1 } else { (qf * b.hi).floor() as i128 };
            hi = hi.min(top - pj);
        }
    }
    let r = match (lo == i128::MIN, hi == i128::MAX) {
        _ if lo > hi => return None,
        (true, true) => 0,
        (true, false) => hi,
        (false, true) => lo,
        (false, false) => lo + (hi - lo) / 2,
    };
    i64::try_from(r).ok()
}

/// The numerator of the simplest fraction within 1e-9 (relative) of `v` whose denominator is
/// at most 2^16, or 0.
fn numerator(v: f64) -> i64 {
    // Continued-fraction convergents h/k of v.
    let (mut h, mut h_prev, mut k, mut k_prev) = (1i64, 0i64, 0i64, 1i64);
    let mut x = v;
    for _ in 0..32 {
        if !(x.is_finite() && x.abs() < 1e9) {
            break;
        }
        let a = x.floor() as i64;
        (h, h_prev) = (a.saturating_mul(h).saturating_add(h_prev), h);
        (k, k_prev) = (a.saturating_mul(k).saturating_add(k_prev), k);
        if k > 1 << 16 {
            break;
        }
        if (h as f64 / k as f64 - v).abs() <= 1e-9 * v.abs() {
            return h;
        }
        let frac = x - a as f64;
        if frac == 0.0 {
            break;
        }
        x = 1.0 / frac;
    }
    0
}

/// The most axes `resize.wgsl` takes (after merging identity axes and leaving out those of
/// one element).
const MAX_AXES: usize = 3;

/// The dispatch of the resize. Where the output's last axis is a multiple of 4 and aligned, an
/// invocation writes 4 neighbouring outputs along it as one vec4.
fn kernel(
    cx: &KernelCx,
    axes: &[Axis],
    filter: Option<Filter>,
    extrapolation: f32,
    n: u64,
    halves: bool,
) -> Result<Vec<Dispatch>, NoKernel> {
    // Innermost first; an axis of one element reads index 0 whatever its map.
    let mut inner_first: Vec<&Axis> =
        axes.iter().rev().filter(|a| a.n_in > 1 || a.n_out > 1).collect();
    let one = Axis { n_in: 1, n_out: 1, stride: 1, scale: 1.0, map: Map::Identity };
    if inner_first.is_empty() {
        inner_first.push(&one);
    }
    if inner_first.len() > MAX_AXES {
        return Err(no_kernel!("Resize over {} axes", inner_first.len()));
    }
    let lanes = if halves {
        if !inner_first[0].n_out.is_multiple_of(2) {
            return Err(no_kernel!("Resize of 2-byte elements, {} to a row", inner_first[0].n_out));
        }
        2
    } else if inner_first[0].n_out.is_multiple_of(4) && cx.outputs[0].aligned16() {
        4u32
    } else {
        1
    };
    let count = n / u64::from(lanes);
    // Per axis: n_out, n_in, p, q, r, taps, s, lo, hi; unused axes are one element.
    let mut words: Vec<[u32; 9]> = Vec::new();
    for a in &inner_first {
        let (p, q, r) = match a.map {
            Map::Identity => (1, 1, 0),
            Map::First => (0, 1, 0),
            Map::Affine { affine, .. } => (affine.p, affine.q, affine.r),
        };
        let (taps, s) = match (filter, &a.map) {
            (Some(f), Map::Affine { .. }) => (f.taps(a.scale) as u32, f.s(a.scale) as f32),
            _ => (1, 1.0),
        };
        let (lo, hi) = a.inside().unwrap_or((0, a.n_out));
        let int = |v: i64| i32::try_from(v).map(|v| v as u32);
        let (p, q, r) = match (int(p), int(q), int(r)) {
            (Ok(p), Ok(q), Ok(r)) => (p, q, r),
            _ => return Err(no_kernel!("Resize: a source-coordinate map past i32")),
        };
        words.push([
            a.n_out as u32,
            a.n_in as u32,
            p,
            q,
            r,
            taps,
            s.to_bits(),
            lo as u32,
            hi as u32,
        ]);
    }
    let loads: u32 = words.iter().map(|w| w[5]).product();
    if loads as usize > MAX_TAPS {
        return Err(no_kernel!("Resize reading {loads} taps per output"));
    }
    let axes_used = words.len();
    words.resize(MAX_AXES, [1, 1, 0, 1, 0, 1, 1f32.to_bits(), 0, 1]);
    let mut params = vec![count as u32, extrapolation.to_bits()];
    for field in 0..9 {
        params.extend(words.iter().map(|w| w[field]));
    }
    let (ty, code) = match filter {
        None => ("u32", 0u32),
        Some(Filter { cubic: None, .. }) => ("f32", 1),
        Some(_) => ("f32", 2),
    };
    let y_ty = if lanes == 4 { vec4(ty) } else { ty };
    let mut spec = Spec::new(&RESIZE).alias("T", ty).alias("Y", y_ty);
    if lanes == 4 {
        spec = spec.hook("store", "fn store(o: u32, v: vec4<T>) {\n    y[p.y + o] = v;\n}");
    }
    if halves {
        spec = spec.hook(
            "store",
            "fn store(o: u32, v: vec4<T>) {\n    y[p.y + o] = v.x | (v.y << 16u);\n}",
        );
    }
    if let Some(f) = filter {
        spec = spec
            .set("CUBIC_A", f.cubic.unwrap_or(-0.75))
            .set("NORMALISE", f.antialias || f.exclude_outside)
            .set("EXCLUDE_OUTSIDE", f.exclude_outside);
    }
    let mode = ["nearest", "linear", "cubic"][code as usize];
    let suffix = match lanes {
        4 => "_v4",
        2 => "_halves",
        _ => "",
    };
    let mut label = format!("resize_{mode}_{n}{suffix}");
    if cx.class == DeviceClass::Cpu {
        // The geometry as literals: every division by it folds.
        let vector = |field: usize, ty: &str, lit: &dyn Fn(u32) -> String| {
            let v: Vec<String> = words.iter().map(|w| lit(w[field])).collect();
            format!("vec3<{ty}>({})", v.join(", "))
        };
        let (u, i) = (|w: u32| format!("{w}u"), |w: u32| format!("{}i", w as i32));
        let f = |w: u32| f32_lit(f32::from_bits(w));
        let fields = [
            vector(0, "u32", &u),
            vector(1, "u32", &u),
            vector(2, "i32", &i),
            vector(3, "i32", &i),
            vector(4, "i32", &i),
            vector(5, "u32", &u),
            vector(6, "f32", &f),
            vector(7, "u32", &u),
            vector(8, "u32", &u),
        ];
        spec = spec.hook(
            "geometry",
            format!(
                "fn geometry() -> Geometry {{\n    return Geometry({});\n}}",
                fields.join(", ")
            ),
        );
        let sizes: Vec<String> = inner_first.iter().rev().map(|a| a.n_out.to_string()).collect();
        label = format!("resize_{mode}_{}{suffix}", sizes.join("x"));
    } else {
        // The fast division takes the output's index apart and floors every t >= 0 (< 2^31,
        // as the fit keeps it).
        let dividers = [words[0][0] / lanes, words[1][0]];
        let fast = count < 1 << 31
            && dividers[..axes_used - 1].iter().all(|&d| d < 1 << 24)
            && words.iter().all(|w| w[3] < 1 << 24);
        if fast {
            spec = spec.divmod();
        }
    }
    if halves {
        spec = spec.set("HALVES", true);
    }
    let bindings = vec![Binding::input("x", 0, ty), Binding::output("y", 0, y_ty)];
    let grid = Grid::new(count, WG)?;
    spec.set("WG", WG)
        .set("AXES", axes_used as u32)
        .set("LANES", lanes)
        .set("FILTER", code)
        .set("CROP", axes.iter().any(|a| a.inside().is_some()))
        .dispatch(label, grid.groups, bindings, params)
        .map(|d| vec![d])
}

/// GridSample of float32 X and grid, 1 to 3 spatial dims: `grid_sample.wgsl`, one invocation
/// per output element.
fn grid_sample(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    let ([x, grid], [y]) = (cx.inputs, cx.outputs) else {
        return Err(no_kernel!("GridSample with {} inputs", cx.inputs.len()));
    };
    cx.require_f32()?;
    if cx.in_place().is_some() {
        return Err(no_kernel!("GridSample in place"));
    }
    let shape = &x.desc.shape;
    let dims = &shape[2.min(shape.len())..];
    if dims.is_empty() || dims.len() > 3 {
        return Err(no_kernel!(
            "GridSample over {} spatial dims (the kernel takes 1 to 3)",
            dims.len()
        ));
    }
    if grid.desc.shape.last() != Some(&dims.len()) {
        return Err(no_kernel!("GridSample grid {:?} for X {shape:?}", grid.desc.shape));
    }
    let count = y.desc.elements() as u64;
    if count == 0 {
        return Ok(Vec::new());
    }
    if x.desc.elements() as u64 >= 1 << 31 || count >= 1 << 31 {
        return Err(no_kernel!("GridSample: tensors too large for u32 indices"));
    }
    let a = cx.attrs;
    let text = |name| a.text(name).map_err(|e| no_kernel!("{e}"));
    let mode = match text("mode")? {
        "nearest" => 0u32,
        "linear" => 1,
        "cubic" => 2,
        m => return Err(no_kernel!("GridSample mode {m}")),
    };
    let padding = match text("padding_mode")? {
        "zeros" => 0u32,
        "border" => 1,
        "reflection" => 2,
        m => return Err(no_kernel!("GridSample padding_mode {m}")),
    };
    let align = a.int("align_corners").map_err(|e| no_kernel!("{e}"))? != 0;
    let points = y.desc.shape[2..].iter().product::<usize>();
    let image = dims.iter().product::<usize>();
    let mut params = vec![count as u32, shape[1] as u32, points as u32, image as u32];
    params.extend((0..3).map(|i| dims.get(i).map_or(1, |&d| d as u32)));
    let bindings = vec![
        Binding::input("x", 0, "f32"),
        Binding::input("grid", 1, "f32"),
        Binding::output("y", 0, "f32"),
    ];
    let grid = Grid::new(count, WG)?;
    let modes = ["nearest", "linear", "cubic"];
    Spec::new(&GRID_SAMPLE)
        .set("WG", WG)
        .set("DIMS", dims.len() as u32)
        .set("MODE", mode)
        .set("PADDING", padding)
        .set("ALIGN", align)
        .dispatch(format!("gridsample_{}", modes[mode as usize]), grid.groups, bindings, params)
        .map(|d| vec![d])
}

/// AffineGrid of a float32 theta, 2 or 3 spatial dims: `affine_grid.wgsl`, one invocation per
/// output point.
fn affine_grid(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    let ([theta], [y]) = (cx.inputs, cx.outputs) else {
        return Err(no_kernel!("AffineGrid with {} inputs", cx.inputs.len()));
    };
    cx.require_f32()?;
    let s = &y.desc.shape;
    let r = s.len().saturating_sub(2);
    if !matches!(r, 2 | 3) || theta.desc.shape != [s[0], r, r + 1] {
        return Err(no_kernel!("AffineGrid of theta {:?} to {s:?}", theta.desc.shape));
    }
    let points = s[1..=r].iter().product::<usize>();
    let count = (s[0] * points) as u64;
    if count == 0 {
        return Ok(Vec::new());
    }
    if y.desc.elements() as u64 >= 1 << 31 {
        return Err(no_kernel!("AffineGrid: tensors too large for u32 indices"));
    }
    let align = cx.attrs.int("align_corners").map_err(|e| no_kernel!("{e}"))? != 0;
    let mut params = vec![count as u32, points as u32];
    params.extend((0..3).map(|i| if i < r { s[1 + i] as u32 } else { 1 }));
    let bindings = vec![Binding::input("theta", 0, "f32"), Binding::output("y", 0, "f32")];
    let grid = Grid::new(count, WG)?;
    Spec::new(&AFFINE_GRID)
        .set("WG", WG)
        .set("DIMS", r as u32)
        .set("ALIGN", align)
        .dispatch(format!("affinegrid_{r}d"), grid.groups, bindings, params)
        .map(|d| vec![d])
}

fn vec4(ty: &str) -> &'static str {
    if ty == "f32" { "vec4<f32>" } else { "vec4<u32>" }
}

/// The workgroup size.
const WG: u32 = 64;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reduce::vulkan::tests::specialised;
    use crate::vulkan::valid;
    use crate::vulkan::{DeviceClass, Operand};

    /// Canonical Resize attributes (as ops/src/resize/mod.rs writes them).
    fn attrs(mode: &str, coord: &str, nearest: &str, scales: &[f64], sizes: &[usize]) -> Attrs {
        let rank = sizes.len();
        Attrs::new()
            .with("mode", AttrValue::Text(mode.into()))
            .with("coordinate_transformation_mode", AttrValue::Text(coord.into()))
            .with("nearest_mode", AttrValue::Text(nearest.into()))
            .with("cubic_coeff_a", AttrValue::Float(-0.75))
            .with("exclude_outside", AttrValue::Int(0))
            .with("extrapolation_value", AttrValue::Float(0.0))
            .with("antialias", AttrValue::Int(0))
            .with("scales", AttrValue::Floats(scales.to_vec()))
            .with("sizes", AttrValue::Ints(sizes.iter().map(|&s| s as i64).collect()))
            .with("roi", AttrValue::Floats([vec![0.0; rank], vec![1.0; rank]].concat()))
    }

    /// The GPU class's dispatches; the CPU class's are checked alike (the same params, the
    /// geometry as literals).
    fn run(a: &Attrs, x: &[usize], dtype: DType) -> Result<Vec<Dispatch>, NoKernel> {
        run_for(DeviceClass::Cpu, a, x, dtype)?;
        run_for(DeviceClass::Gpu, a, x, dtype)
    }

    fn run_for(
        class: DeviceClass,
        a: &Attrs,
        x: &[usize],
        dtype: DType,
    ) -> Result<Vec<Dispatch>, NoKernel> {
        let y: Vec<usize> = a.ints("sizes").unwrap().iter().map(|&s| s as usize).collect();
        let xd = TensorDesc::new(dtype, x);
        let inputs = [Operand::arena(xd.clone(), 0)];
        let outputs = [Operand::arena(TensorDesc::new(dtype, y), xd.bytes() as u64)];
        let cx = KernelCx {
            class,
            op: "Resize",
            name: "r",
            attrs: a,
            inputs: &inputs,
            outputs: &outputs,
        };
        let d = lower(&cx)?;
        valid(&d);
        Ok(d)
    }

    /// Param field `f` of the dispatch, one word per axis, innermost first: 0 n_out, 1 n_in,
    /// 2 p, 3 q, 4 r, 5 taps, 6 s, 7 lo, 8 hi.
    fn field(d: &Dispatch, f: usize) -> &[u32] {
        &d.params[2 + 3 * f..5 + 3 * f]
    }

    fn override_of(d: &Dispatch, name: &str) -> Option<f64> {
        d.overrides.iter().find(|o| o.0 == name).map(|o| o.1)
    }

    fn slice_affine(map: &Map) -> Affine {
        match map {
            Map::Affine { affine, .. } => *affine,
            m => panic!("{m:?}"),
        }
    }

    fn fitted(a: &Attrs, x: &[usize], d: usize) -> Map {
        let y: Vec<usize> = a.ints("sizes").unwrap().iter().map(|&s| s as usize).collect();
        let inputs = [Operand::arena(TensorDesc::new(DType::F32, x), 0)];
        let outputs = [Operand::arena(TensorDesc::new(DType::F32, y), 1 << 20)];
        let cx = KernelCx {
            class: DeviceClass::Gpu,
            op: "Resize",
            name: "r",
            attrs: a,
            inputs: &inputs,
            outputs: &outputs,
        };
        match a.text("mode").unwrap() {
            "nearest" => nearest(&cx, d).unwrap(),
            _ => interpolated(&cx, d).unwrap(),
        }
    }

    #[test]
    fn every_kernel_file_compiles_alone() {
        let files = [&RESIZE, &GRID_SAMPLE, &AFFINE_GRID];
        crate::vulkan::assert_all_files_listed("resize", &files);
        for file in files {
            crate::vulkan::compile(file.source, &[]).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    #[test]
    fn affine_grid_in_two_and_three_dims() {
        use crate::vulkan::lower_f32_all_classes;
        for (theta, y) in [(&[2, 2, 3][..], &[2, 4, 5, 2][..]), (&[1, 3, 4], &[1, 2, 3, 4, 3])] {
            for align in [0, 1] {
                let a = Attrs::new().with("align_corners", AttrValue::Int(align));
                valid(&lower_f32_all_classes(lower, "AffineGrid", &a, &[theta], &[y], 0));
            }
        }
    }

    #[test]
    fn grid_sample_takes_every_mode_padding_and_rank() {
        use crate::vulkan::lower_f32_all_classes;
        for (x, g, y) in [
            (&[1, 2, 5][..], &[1, 7, 1][..], &[1, 2, 7][..]),
            (&[2, 3, 4, 5], &[2, 6, 2, 2], &[2, 3, 6, 2]),
            (&[1, 1, 3, 4, 5], &[1, 2, 2, 2, 3], &[1, 1, 2, 2, 2]),
        ] {
            for mode in ["nearest", "linear", "cubic"] {
                for padding in ["zeros", "border", "reflection"] {
                    let a = Attrs::new()
                        .with("mode", AttrValue::Text(mode.into()))
                        .with("padding_mode", AttrValue::Text(padding.into()))
                        .with("align_corners", AttrValue::Int(1));
                    let d = lower_f32_all_classes(lower, "GridSample", &a, &[x, g], &[y], 0);
                    valid(&d);
                    assert_eq!(
                        d[0].params[..4],
                        [
                            y.iter().product::<usize>() as u32,
                            x[1] as u32,
                            y[2..].iter().product::<usize>() as u32,
                            x[2..].iter().product::<usize>() as u32
                        ]
                    );
                }
            }
        }
    }

    #[test]
    fn ppocr_det_upsampling_is_an_integer_map() {
        // det's FPN: nearest, asymmetric, floor, scale 2: source index floor(j / 2).
        let a = attrs("nearest", "asymmetric", "floor", &[1.0, 1.0, 2.0, 2.0], &[1, 96, 56, 56]);
        assert_eq!(slice_affine(&fitted(&a, &[1, 96, 28, 28], 2)), Affine { p: 1, q: 2, r: 0 });
        assert_eq!(fitted(&a, &[1, 96, 28, 28], 1), Map::Identity);
        let d = run(&a, &[1, 96, 28, 28], DType::F32).unwrap();
        assert_eq!(d[0].bindings[0].ty, "u32");
        // Innermost first: the columns and rows (p / q = 1 / 2), then the 96 channels as one
        // identity axis; four columns per invocation.
        assert_eq!((field(&d[0], 0), field(&d[0], 1)), (&[56, 56, 96][..], &[28, 28, 96][..]));
        assert_eq!((field(&d[0], 2), field(&d[0], 3)), (&[1, 1, 1][..], &[2, 2, 1][..]));
        assert_eq!((d[0].params[0], override_of(&d[0], "LANES")), (96 * 56 * 14, Some(4.0)));
    }

    #[test]
    fn float16_nearest_moves_two_elements_a_word() {
        // YOLOv8's FPN in float16: two outputs to an invocation, one u32 word stored whole.
        let a = attrs("nearest", "asymmetric", "floor", &[1.0, 1.0, 2.0, 2.0], &[1, 8, 40, 40]);
        let d = run(&a, &[1, 8, 20, 20], DType::F16).unwrap();
        assert_eq!(d[0].bindings[1].ty, "u32");
        assert_eq!(d[0].params[0], 8 * 40 * 40 / 2);
        assert_eq!(
            (override_of(&d[0], "LANES"), override_of(&d[0], "HALVES")),
            (Some(2.0), Some(1.0))
        );
        // An odd row would put two invocations in one word; interpolation is float32 only.
        let odd = attrs("nearest", "asymmetric", "floor", &[1.0, 1.0, 1.0, 3.0], &[1, 8, 20, 3]);
        assert!(run(&odd, &[1, 8, 20, 1], DType::F16).is_err());
        let linear = attrs("linear", "asymmetric", "floor", &[1.0, 1.0, 2.0, 2.0], &[1, 8, 40, 40]);
        assert!(run(&linear, &[1, 8, 20, 20], DType::F16).is_err());
    }

    #[test]
    fn every_nearest_variant_fits() {
        // Up and down by integer and odd factors, by sizes, with each rounding and transform.
        let coords = [
            "half_pixel",
            "half_pixel_symmetric",
            "pytorch_half_pixel",
            "align_corners",
            "asymmetric",
        ];
        let rounds = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"];
        let cases: [(usize, usize, f64); 6] = [
            (4, 8, 2.0),
            (4, 12, 3.0),
            (8, 4, 0.5),
            (5, 7, 7.0 / 5.0),
            (7, 3, 3.0 / 7.0),
            (3, 8, f64::from(2.7f32)),
        ];
        for coord in coords {
            for round in rounds {
                for (n_in, n_out, scale) in cases {
                    let a = attrs("nearest", coord, round, &[1.0, scale], &[2, n_out]);
                    run(&a, &[2, n_in], DType::F32)
                        .unwrap_or_else(|e| panic!("{coord} {round} {n_in}->{n_out}: {e}"));
                }
            }
        }
    }

    #[test]
    fn linear_and_cubic_fit() {
        // Bilinear 2x (half_pixel): c = (2j - 1) / 4.
        let a = attrs(
            "linear",
            "half_pixel",
            "round_prefer_floor",
            &[1.0, 1.0, 2.0, 2.0],
            &[1, 3, 8, 10],
        );
        assert_eq!(slice_affine(&fitted(&a, &[1, 3, 4, 5], 2)), Affine { p: 2, q: 4, r: -1 });
        let d = run(&a, &[1, 3, 4, 5], DType::F32).unwrap();
        assert_eq!(field(&d[0], 5), [2, 2, 1], "two taps per resized axis");
        insta::assert_snapshot!("bilinear", specialised(&d[0]));
        let d = run_for(DeviceClass::Cpu, &a, &[1, 3, 4, 5], DType::F32).unwrap();
        insta::assert_snapshot!("bilinear_cpu", specialised(&d[0]));
        for coord in ["align_corners", "asymmetric", "pytorch_half_pixel"] {
            for mode in ["linear", "cubic"] {
                let a = attrs(mode, coord, "floor", &[1.0, 1.0, 0.6, 1.5], &[1, 2, 3, 6]);
                run(&a, &[1, 2, 5, 4], DType::F32).unwrap();
                let a = a.with("exclude_outside", AttrValue::Int(1));
                run(&a, &[1, 2, 5, 4], DType::F32).unwrap();
            }
        }
        // align_corners with a float scale: the slope 60 / (61 * 1.76f32 - 1) has no small
        // denominator; a power of two large enough is close enough over 107 outputs.
        let a = attrs("linear", "align_corners", "floor", &[1.0, f64::from(1.76f32)], &[1, 107]);
        assert!(slice_affine(&fitted(&a, &[1, 61], 1)).q >= 1 << 16);
        // Antialiased shrinking widens the filter: 0.6 reads 4 (linear) or 8 (cubic) taps per
        // axis, 0.25 with cubic 16 per axis, 256 in all, too many.
        for (mode, taps) in [("linear", 4), ("cubic", 8)] {
            let aa = attrs(mode, "half_pixel", "floor", &[1.0, 1.0, 0.6, 0.6], &[1, 1, 3, 3])
                .with("antialias", AttrValue::Int(1));
            let d = run(&aa, &[1, 1, 5, 5], DType::F32).unwrap();
            assert_eq!(field(&d[0], 5), [taps, taps, 1]);
            assert_eq!(field(&d[0], 6)[0], 0.6f32.to_bits(), "the kernel widened by 1 / 0.6");
            assert_eq!(override_of(&d[0], "NORMALISE"), Some(1.0));
        }
        let aa = attrs("cubic", "half_pixel", "floor", &[1.0, 1.0, 0.25, 0.25], &[1, 1, 2, 2])
            .with("antialias", AttrValue::Int(1));
        assert!(run(&aa, &[1, 1, 8, 8], DType::F32).is_err());
        assert!(run(&a, &[1, 61], DType::I32).is_err());
    }

    #[test]
    fn tf_crop_and_resize_extrapolates_outside_a_range() {
        // ONNX test_resize_tf_crop_and_resize_extrapolation_value: roi [0, 0, 0.4, 0.6,
        // 1, 1, 1.2, 1.7], sizes [1, 1, 3, 3], extrapolation 10, on a 4x4 input.
        let a = attrs(
            "linear",
            "tf_crop_and_resize",
            "round_prefer_floor",
            &[1.0, 1.0, 0.75, 0.75],
            &[1, 1, 3, 3],
        )
        .with(
            "roi",
            AttrValue::Floats(vec![
                0.0,
                0.0,
                f64::from(0.4f32),
                f64::from(0.6f32),
                1.0,
                1.0,
                f64::from(1.2f32),
                f64::from(1.7f32),
            ]),
        )
        .with("extrapolation_value", AttrValue::Float(10.0));
        // Source coordinates c = j * (r1 - r0) * 3 / 2 + 3 * r0, inside while c <= 3: rows
        // 1.2, 2.4, 3.6 and columns 1.8, 3.45, 5.1.
        for (d, want) in [(2, (0, 2)), (3, (0, 1))] {
            match fitted(&a, &[1, 1, 4, 4], d) {
                Map::Affine { inside, .. } => assert_eq!(inside, want),
                m => panic!("{m:?}"),
            }
        }
        for mode in ["linear", "nearest"] {
            let a = a.clone().with("mode", AttrValue::Text(mode.into()));
            let d = run(&a, &[1, 1, 4, 4], DType::F32).unwrap();
            assert_eq!((d[0].params[1], override_of(&d[0], "CROP")), (10f32.to_bits(), Some(1.0)));
            // Innermost first: columns inside [0, 1), rows [0, 2).
            assert_eq!((field(&d[0], 7), field(&d[0], 8)), (&[0, 0, 0][..], &[1, 2, 1][..]));
        }
    }
}
