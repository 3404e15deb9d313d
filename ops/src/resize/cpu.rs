//! Resize, following the ONNX reference implementation (opsets 11 to 21).
//!
//! Canonical attributes: `mode`, `coordinate_transformation_mode`, `nearest_mode`,
//! `cubic_coeff_a`, `exclude_outside`, `extrapolation_value`, `antialias`, and per axis
//! `scales` (the factor used to map coordinates), `sizes` (the output shape) and `roi`
//! (starts then ends, normalised).
//!
//! Nearest is a [`Remap`]: per-axis tables of source offsets, so any dtype runs and a 2x
//! upsample copies each source row once and duplicates it. Linear and cubic are separable:
//! one weighted pass per resized axis, in f32.

use crate::cpu::{Kernel, KernelError, OpCx};
use crate::invalid;
use crate::movement::cpu::{Axis, Remap, Scalar, cast, cast_mut, input, output, strides};
use crate::tensor::{TensorMut, TensorRef};
use ingot_schema::DType;

pub fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    match cx.op {
        // Lowering makes an Upsample a Resize.
        "Resize" | "Upsample" => {}
        "GridSample" => return super::grid_sample::prepare(cx),
        "AffineGrid" => return super::grid_sample::prepare_affine_grid(cx),
        op => return Err(KernelError::UnknownOp(op.to_string())),
    }
    cx.expect_arity(1..=1, 1)?;
    let (x, y) = (&cx.inputs[0], &cx.outputs[0]);
    let rank = x.shape.len();
    if y.dtype != x.dtype || y.shape.len() != rank {
        return Err(invalid!("Resize output {y:?} does not match its input {x:?}"));
    }
    let a = cx.attrs;
    let (scales, sizes, roi) = (a.floats("scales")?, a.ints("sizes")?, a.floats("roi")?);
    if scales.len() != rank || roi.len() != 2 * rank {
        return Err(invalid!("Resize scales or roi do not have one entry per axis"));
    }
    if let Some(s) = scales.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
        return Err(invalid!("Resize scale {s} is not a positive number"));
    }
    if sizes.iter().zip(&y.shape).any(|(&s, &d)| s != d as i64) || sizes.len() != rank {
        return Err(invalid!("Resize sizes {sizes:?} do not match its output {y:?}"));
    }
    let coord = Coord::parse(a.text("coordinate_transformation_mode")?)?;
    let geom = |d: usize| Geom {
        coord,
        n_in: x.shape[d],
        n_out: y.shape[d],
        scale: scales[d],
        roi: (roi[d], roi[d + rank]),
    };
    if (0..rank).any(|d| x.shape[d] == 0 && y.shape[d] > 0) {
        return Err(invalid!("Resize cannot grow an empty dimension"));
    }
    if y.elements() == 0 {
        // Nothing to compute, and per-axis tables as long as the other dims (which an empty
        // tensor does not bound) are not made.
        return Ok(Box::new(Remap::empty(x.elements(), x.dtype.size())?));
    }
    let extrapolation = a.float("extrapolation_value")?;
    match a.text("mode")? {
        "nearest" => {
            let round = Round::parse(a.text("nearest_mode")?)?;
            let st = strides(&x.shape);
            let axes = (0..rank)
                .map(|d| {
                    let g = geom(d);
                    let t = (0..g.n_out).map(|j| g.nearest(j, round).map(|i| i * st[d])).collect();
                    Axis::table(t)
                })
                .collect();
            let fill = Scalar::Float(f64::from(extrapolation)).encode(x.dtype);
            Ok(Box::new(Remap::new(axes, x.elements(), x.dtype.size(), fill)?))
        }
        mode @ ("linear" | "cubic") => {
            if !matches!(x.dtype, DType::F32 | DType::F16 | DType::F64) {
                return Err(cx.dtype_error(x.dtype));
            }
            let filter = Filter {
                cubic: (mode == "cubic").then_some(f64::from(a.float("cubic_coeff_a")?)),
                antialias: a.int("antialias")? != 0,
                exclude_outside: a.int("exclude_outside")? != 0,
            };
            // An antialiasing filter is about 4 / scale taps wide. Wider than the input (a
            // scale that only a crop far outside the input could give) it would only repeat
            // edge pixels, at a cost without bound.
            let too_wide =
                |d: usize| filter.antialias && scales[d] * (x.shape[d] as f64 + 2.0) < 1.0;
            if let Some(d) = (0..rank).find(|&d| y.shape[d] > 0 && too_wide(d)) {
                return Err(invalid!(
                    "Resize scale {} is too small for an input of {} along axis {d}",
                    scales[d],
                    x.shape[d]
                ));
            }
            // Separable passes, one per resized axis. Their order does not change the result
            // (beyond rounding) but does change the work: shrink first, grow last, and grow
            // the innermost axis (the slowest pass per element) before the others.
            let mut order: Vec<usize> = (0..rank).filter(|&d| !geom(d).is_identity()).collect();
            let growth = |d: usize| y.shape[d] as f64 / x.shape[d] as f64;
            order.sort_by(|&a, &b| growth(a).total_cmp(&growth(b)).then(b.cmp(&a)));
            let mut shape = x.shape.clone();
            let mut passes = Vec::with_capacity(order.len());
            for d in order {
                let g = geom(d);
                passes.push(Pass {
                    outer: shape[..d].iter().product(),
                    n_in: g.n_in,
                    inner: shape[d + 1..].iter().product(),
                    taps: g.taps(&filter),
                });
                shape[d] = g.n_out;
            }
            Ok(Box::new(Interp {
                dtype: x.dtype,
                n_in: x.elements(),
                n_out: y.elements(),
                passes,
                extrapolation,
            }))
        }
        m => Err(invalid!("Resize mode {m} is unknown")),
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Coord {
    HalfPixel,
    HalfPixelSymmetric,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
    TfCropAndResize,
}

impl Coord {
    fn parse(s: &str) -> Result<Coord, KernelError> {
        Ok(match s {
            "half_pixel" => Coord::HalfPixel,
            "half_pixel_symmetric" => Coord::HalfPixelSymmetric,
            "pytorch_half_pixel" => Coord::PytorchHalfPixel,
            "align_corners" => Coord::AlignCorners,
            "asymmetric" => Coord::Asymmetric,
            "tf_crop_and_resize" => Coord::TfCropAndResize,
            m => {
                return Err(invalid!("Resize coordinate_transformation_mode {m} is unknown"));
            }
        })
    }
}

#[derive(Clone, Copy, Debug)]
enum Round {
    PreferFloor,
    PreferCeil,
    Floor,
    Ceil,
}

impl Round {
    fn parse(s: &str) -> Result<Round, KernelError> {
        Ok(match s {
            "round_prefer_floor" => Round::PreferFloor,
            "round_prefer_ceil" => Round::PreferCeil,
            "floor" => Round::Floor,
            "ceil" => Round::Ceil,
            m => return Err(invalid!("Resize nearest_mode {m} is unknown")),
        })
    }
}

/// One axis of a resize.
struct Geom {
    coord: Coord,
    n_in: usize,
    n_out: usize,
    scale: f64,
    roi: (f64, f64),
}

impl Geom {
    /// The source coordinate of output index `j`, or `None` where tf_crop_and_resize
    /// extrapolates. As in the reference, the "resized length" is `scale * n_in`, not the
    /// rounded output size.
    fn source(&self, j: usize) -> Option<f64> {
        let (y, n_in, s) = (j as f64, self.n_in as f64, self.scale);
        let len = s * n_in;
        let x = match self.coord {
            Coord::HalfPixel => (y + 0.5) / s - 0.5,
            Coord::HalfPixelSymmetric => {
                let offset = n_in / 2.0 * (1.0 - self.n_out as f64 / len);
                offset + (y + 0.5) / s - 0.5
            }
            Coord::PytorchHalfPixel if len == 1.0 => -0.5,
            Coord::PytorchHalfPixel => (y + 0.5) / s - 0.5,
            Coord::AlignCorners if len == 1.0 => 0.0,
            Coord::AlignCorners => y * (n_in - 1.0) / (len - 1.0),
            Coord::Asymmetric => y / s,
            Coord::TfCropAndResize => {
                let (r0, r1) = self.roi;
                let x = if len == 1.0 {
                    (r1 - r0) * (n_in - 1.0) / 2.0
                } else {
                    y * (r1 - r0) * (n_in - 1.0) / (len - 1.0)
                } + r0 * (n_in - 1.0);
                if x < 0.0 || x > n_in - 1.0 {
                    return None;
                }
                x
            }
        };
        Some(x)
    }

    fn nearest(&self, j: usize, round: Round) -> Option<usize> {
        let x = self.source(j)?;
        let (fl, frac) = (x.floor(), x - x.floor());
        let i = match round {
            Round::PreferFloor if frac <= 0.5 => fl,
            Round::PreferCeil if frac < 0.5 => fl,
            Round::PreferFloor | Round::PreferCeil => fl + 1.0,
            Round::Floor => fl,
            Round::Ceil => x.ceil(),
        };
        Some(i.clamp(0.0, self.n_in as f64 - 1.0) as usize)
    }

    fn is_identity(&self) -> bool {
        (self.scale - 1.0).abs() < 1e-9
            && self.n_in == self.n_out
            && (self.coord != Coord::TfCropAndResize || self.roi == (0.0, 1.0))
    }

    /// The weighted source indices of every output index along this axis.
    fn taps(&self, f: &Filter) -> Taps {
        // The filter width depends on the scale only.
        let n = f.coefficients(1.0, self.scale).len();
        let mut taps = Taps {
            n,
            index: Vec::with_capacity(n * self.n_out),
            weight: Vec::with_capacity(n * self.n_out),
            outside: Vec::with_capacity(self.n_out),
        };
        for j in 0..self.n_out {
            let Some(x) = self.source(j) else {
                taps.outside.push(true);
                taps.index.extend(std::iter::repeat_n(0, n));
                taps.weight.extend(std::iter::repeat_n(0.0, n));
                continue;
            };
            taps.outside.push(false);
            // Far outside the input every tap reads the edge pixel: clamped there, x keeps
            // that result and its integer part fits any integer type.
            let margin = n as f64 + 2.0;
            let x = x.clamp(-margin, self.n_in as f64 + margin);
            // The ratio is in (0, 1]: an exact source coordinate counts as 1 past the pixel
            // on its left.
            let fl = x.floor();
            let ratio = if x == fl { 1.0 } else { x - fl };
            let mut w = f.coefficients(ratio, self.scale);
            // The n source pixels nearest to x, ties going to the smaller index.
            let pad = n.div_ceil(2) as f64;
            let xp = x + pad;
            let frac = xp - xp.floor();
            let half = (n / 2) as f64;
            let offset = if n.is_multiple_of(2) {
                if frac == 0.0 { -half } else { 1.0 - half }
            } else {
                let base = -(((n - 1) / 2) as f64);
                if frac <= 0.5 { base } else { base + 1.0 }
            };
            let first = (xp.floor() + offset - pad) as i64;
            let idx: Vec<i64> = (0..n as i64).map(|k| first + k).collect();
            if f.exclude_outside {
                for (c, &i) in w.iter_mut().zip(&idx) {
                    if i < 0 || i >= self.n_in as i64 {
                        *c = 0.0;
                    }
                }
                let sum: f64 = w.iter().sum();
                let sum = if sum == 0.0 { 1.0 } else { sum };
                w.iter_mut().for_each(|c| *c /= sum);
            }
            // Pixels past the edge repeat the edge pixel.
            let last = self.n_in as i64 - 1;
            taps.index.extend(idx.iter().map(|&i| i.clamp(0, last) as usize));
            taps.weight.extend(w.iter().map(|&c| c as f32));
        }
        taps
    }
}

/// Interpolation coefficients, as functions of the ratio and the axis scale.
struct Filter {
    /// `Some(a)` for cubic with coefficient `a`, `None` for linear.
    cubic: Option<f64>,
    antialias: bool,
    exclude_outside: bool,
}

impl Filter {
    fn coefficients(&self, r: f64, scale: f64) -> Vec<f64> {
        // Antialiasing only widens the filter when downsampling.
        let s = scale.min(1.0);
        let normalise = |c: Vec<f64>| {
            let sum: f64 = c.iter().sum();
            c.into_iter().map(|v| v / sum).collect()
        };
        match (self.cubic, self.antialias) {
            (None, false) => vec![1.0 - r, r],
            (None, true) => {
                let start = (-1.0 / s).floor() as i64 + 1;
                let footprint = 2 - 2 * start;
                normalise(
                    (start..start + footprint)
                        .map(|i| (1.0 - ((i as f64 - r) * s).abs()).clamp(0.0, 1.0))
                        .collect(),
                )
            }
            (Some(a), false) => {
                let (p, q) = (r + 1.0, 2.0 - r);
                vec![
                    ((a * p - 5.0 * a) * p + 8.0 * a) * p - 4.0 * a,
                    ((a + 2.0) * r - (a + 3.0)) * r * r + 1.0,
                    ((a + 2.0) * (1.0 - r) - (a + 3.0)) * (1.0 - r) * (1.0 - r) + 1.0,
                    ((a * q - 5.0 * a) * q + 8.0 * a) * q - 4.0 * a,
                ]
            }
            (Some(a), true) => {
                let cubic = |x: f64| {
                    let x = x.abs();
                    if x <= 1.0 {
                        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
                    } else if x < 2.0 {
                        ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
                    } else {
                        0.0
                    }
                };
                let start = (-2.0 / s).floor() as i64 + 1;
                normalise((start..2 - start).map(|i| cubic(s * (i as f64 - r))).collect())
            }
        }
    }
}

/// Per output index along an axis: `n` source indices and weights; `outside` marks the
/// indices that take the extrapolation value.
struct Taps {
    n: usize,
    index: Vec<usize>,
    weight: Vec<f32>,
    outside: Vec<bool>,
}

/// One separable pass over `[outer, n_in, inner]`, giving `[outer, n_out, inner]`.
struct Pass {
    outer: usize,
    n_in: usize,
    inner: usize,
    taps: Taps,
}

impl Pass {
    fn out_len(&self) -> usize {
        self.outer * self.taps.outside.len() * self.inner
    }

    fn apply(&self, src: &[f32], dst: &mut [f32], extrapolation: f32) {
        let (t, inner) = (&self.taps, self.inner);
        let n_out = t.outside.len();
        // Per output index: its source indices, weights, and whether it extrapolates.
        let taps = || t.index.chunks_exact(t.n).zip(t.weight.chunks_exact(t.n)).zip(&t.outside);
        let chunks = src.chunks_exact(self.n_in * inner).zip(dst.chunks_exact_mut(n_out * inner));
        for (s, d) in chunks.take(self.outer) {
            if inner == 1 {
                for (y, ((idx, w), &out)) in d.iter_mut().zip(taps()) {
                    *y = if out {
                        extrapolation
                    } else {
                        idx.iter().zip(w).map(|(&i, &w)| w * s[i]).sum()
                    };
                }
                continue;
            }
            for (row, ((idx, w), &out)) in d.chunks_exact_mut(inner).zip(taps()) {
                if out {
                    row.fill(extrapolation);
                    continue;
                }
                row.fill(0.0);
                for (&i, &w) in idx.iter().zip(w) {
                    for (y, &v) in row.iter_mut().zip(&s[i * inner..(i + 1) * inner]) {
                        *y += w * v;
                    }
                }
            }
        }
    }
}

/// Linear or cubic resize: the passes in axis order, in f32.
struct Interp {
    dtype: DType,
    n_in: usize,
    n_out: usize,
    passes: Vec<Pass>,
    extrapolation: f32,
}

impl Interp {
    fn resize(&self, x: &[f32], y: &mut [f32]) {
        let mut tmp: Vec<f32> = Vec::new();
        let Some(last) = self.passes.len().checked_sub(1) else {
            y.copy_from_slice(x);
            return;
        };
        for (i, p) in self.passes.iter().enumerate() {
            let src = if i == 0 { x } else { &tmp };
            if i == last {
                p.apply(src, y, self.extrapolation);
            } else {
                let mut next = vec![0.0; p.out_len()];
                p.apply(src, &mut next, self.extrapolation);
                tmp = next;
            }
        }
    }
}

impl Kernel for Interp {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let es = self.dtype.size();
        let src = input(inputs, 0, self.n_in * es)?;
        let dst = output(outputs, 0, self.n_out * es)?;
        if self.n_out == 0 {
            return Ok(());
        }
        // f16 and f64 go through f32.
        fn through_f32<T: bytemuck::Pod>(
            k: &Interp,
            src: &[u8],
            dst: &mut [u8],
            to: impl Fn(T) -> f32,
            from: impl Fn(f32) -> T,
        ) -> Result<(), KernelError> {
            let x: Vec<f32> = cast::<T>(src)?.iter().map(|&v| to(v)).collect();
            let mut y = vec![0.0; k.n_out];
            k.resize(&x, &mut y);
            for (d, v) in cast_mut::<T>(dst)?.iter_mut().zip(y) {
                *d = from(v);
            }
            Ok(())
        }
        match self.dtype {
            DType::F32 => {
                self.resize(cast::<f32>(src)?, cast_mut::<f32>(dst)?);
                Ok(())
            }
            DType::F64 => through_f32::<f64>(self, src, dst, |v| v as f32, f64::from),
            DType::F16 => {
                through_f32::<half::f16>(self, src, dst, half::f16::to_f32, half::f16::from_f32)
            }
            dt => Err(invalid!("Resize does not interpolate {dt}")),
        }
    }
}

#[cfg(test)]
mod tests;
