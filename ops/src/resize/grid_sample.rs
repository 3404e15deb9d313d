//! GridSample (opsets 16 to 22), following the ONNX reference implementation: each output
//! point reads X at the location its grid entry names, normalized to [-1, 1] per spatial dim
//! (the entry's last coordinate is X's first spatial dim's, as in PyTorch), interpolated
//! nearest, linear or cubic (Keys, a = -0.75), separably over any number of spatial dims.
//!
//! Canonical attributes: `mode` (`nearest`, `linear`, `cubic`: opset 16's `bilinear` and
//! `bicubic` renamed), `padding_mode` (`zeros`, `border`, `reflection`), `align_corners`.
//! f32 X and grid, computed in f32 (a reflection in f64), as the reference does.
//!
//! AffineGrid makes such a grid: each output point's normalized coordinates (x, y[, z]),
//! spaced evenly in [-1, 1] (pixel centres, or corners with `align_corners`), times theta.
//! Canonical attributes: `size` (N, C, spatial dims), `align_corners`.

use crate::cpu::{Kernel, KernelError, OpCx};
use crate::invalid;
use crate::tensor::{TensorMut, TensorRef};
use ingot_schema::DType;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Padding {
    Zeros,
    Border,
    Reflection,
}

struct GridSample {
    mode: Mode,
    padding: Padding,
    align_corners: bool,
    /// X's `[N, C, d1..dr]`.
    x: Vec<usize>,
    /// Output points per image: the product of the grid's middle dims.
    points: usize,
}

pub(super) fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(2..=2, 1)?;
    let (x, grid, y) = (&cx.inputs[0], &cx.inputs[1], &cx.outputs[0]);
    if let Some(d) = [x.dtype, grid.dtype, y.dtype].into_iter().find(|&d| d != DType::F32) {
        return Err(cx.dtype_error(d));
    }
    let r = x.shape.len().saturating_sub(2);
    let (g, s) = (&grid.shape, &y.shape);
    if r == 0
        || g.len() != r + 2
        || s.len() != r + 2
        || g[r + 1] != r
        || g[0] != x.shape[0]
        || s[..2] != x.shape[..2]
        || s[2..] != g[1..=r]
    {
        return Err(invalid!("GridSample of X {:?} and grid {g:?} to {s:?}", x.shape));
    }
    let mode = match cx.attrs.text("mode")? {
        "nearest" => Mode::Nearest,
        "linear" => Mode::Linear,
        "cubic" => Mode::Cubic,
        other => return Err(invalid!("GridSample mode {other}")),
    };
    let padding = match cx.attrs.text("padding_mode")? {
        "zeros" => Padding::Zeros,
        "border" => Padding::Border,
        "reflection" => Padding::Reflection,
        other => return Err(invalid!("GridSample padding_mode {other}")),
    };
    Ok(Box::new(GridSample {
        mode,
        padding,
        align_corners: cx.attrs.int("align_corners")? != 0,
        x: x.shape.clone(),
        points: g[1..=r].iter().product(),
    }))
}

/// One spatial dim's taps: source indices (`None`: a zero of the padding) and weights.
#[derive(Default)]
struct Taps {
    index: [Option<usize>; 4],
    weight: [f32; 4],
    len: usize,
}

impl GridSample {
    /// The coordinate range inside which no padding applies, in source pixels.
    fn borders(&self, d: usize) -> (f64, f64) {
        match self.align_corners {
            true => (0.0, d as f64 - 1.0),
            false => (-0.5, d as f64 - 0.5),
        }
    }

    /// The taps of normalized coordinate `g` along a dim of `d` pixels.
    fn taps(&self, g: f32, d: usize) -> Taps {
        let mut x = match self.align_corners {
            true => (g + 1.0) / 2.0 * (d as f32 - 1.0),
            false => ((g + 1.0) * d as f32 - 1.0) / 2.0,
        };
        if self.mode == Mode::Nearest {
            x = x.round_ties_even();
        }
        let (lo, hi) = self.borders(d);
        if f64::from(x) < lo || f64::from(x) > hi {
            x = match self.padding {
                Padding::Border => x.clamp(0.0, d as f32 - 1.0),
                Padding::Reflection => reflect(f64::from(x), lo, hi) as f32,
                Padding::Zeros => x,
            };
        }
        let mut taps = Taps::default();
        let mut push = |i: i64, w: f32| {
            taps.index[taps.len] = self.pixel(i, d);
            taps.weight[taps.len] = w;
            taps.len += 1;
        };
        let x0 = x.floor();
        let t = x - x0;
        let x0 = x0 as i64;
        match self.mode {
            Mode::Nearest => push(x as i64, 1.0),
            Mode::Linear => {
                push(x0, 1.0 - t);
                push(x0 + 1, t);
            }
            Mode::Cubic => {
                for (k, w) in cubic_coefficients(t).into_iter().enumerate() {
                    push(x0 - 1 + k as i64, w);
                }
            }
        }
        taps
    }

    /// Source index `i` of a dim of `d` pixels, padded.
    fn pixel(&self, i: i64, d: usize) -> Option<usize> {
        let last = d as i64 - 1;
        match self.padding {
            Padding::Zeros => (0..=last).contains(&i).then_some(i as usize),
            Padding::Border => Some(i.clamp(0, last) as usize),
            Padding::Reflection => {
                let (lo, hi) = self.borders(d);
                Some((reflect(i as f64, lo, hi) as i64).clamp(0, last) as usize)
            }
        }
    }
}

/// `x` reflected by the nearer border until it lies in `[lo, hi]`.
fn reflect(x: f64, lo: f64, hi: f64) -> f64 {
    let range = hi - lo;
    if range <= 0.0 {
        return lo;
    }
    let (dx, from_low) = match () {
        _ if x < lo => (lo - x, true),
        _ if x > hi => (x - hi, false),
        _ => return x,
    };
    let n = (dx / range).trunc();
    let r = dx - n * range;
    match (n % 2.0 == 0.0, from_low) {
        (true, true) | (false, false) => lo + r,
        _ => hi - r,
    }
}

/// Keys' cubic convolution weights (a = -0.75) of the taps at -1, 0, 1, 2 for offset `t`.
fn cubic_coefficients(t: f32) -> [f32; 4] {
    let a = -0.75f32;
    let outer = |x: f32| ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
    let inner = |x: f32| ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    [outer(t + 1.0), inner(t), inner(1.0 - t), outer(2.0 - t)]
}

impl Kernel for GridSample {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let (x, grid) = (inputs[0].as_slice::<f32>()?, inputs[1].as_slice::<f32>()?);
        let y = outputs[0].as_slice_mut::<f32>()?;
        let (n, c, dims) = (self.x[0], self.x[1], &self.x[2..]);
        let r = dims.len();
        let image: usize = dims.iter().product();
        if x.len() != n * c * image || grid.len() != n * self.points * r {
            return Err(invalid!("GridSample run with tensors of other sizes than prepared"));
        }
        if y.len() != n * c * self.points {
            return Err(invalid!("GridSample output of {} elements", y.len()));
        }
        // Row-major strides of X's spatial dims.
        let mut strides = vec![1; r];
        for i in (0..r.saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * dims[i + 1];
        }
        let mut taps: Vec<Taps> = Vec::with_capacity(r);
        let mut at = vec![0usize; r];
        for b in 0..n {
            for p in 0..self.points {
                let g = &grid[(b * self.points + p) * r..][..r];
                taps.clear();
                // The grid's last coordinate is the first spatial dim's.
                taps.extend((0..r).map(|i| self.taps(g[r - 1 - i], dims[i])));
                for ch in 0..c {
                    let plane = &x[(b * c + ch) * image..][..image];
                    // Every combination of one tap per dim (an odometer over `at`).
                    let mut sum = 0f32;
                    at.fill(0);
                    'combos: loop {
                        let mut w = 1f32;
                        let mut offset = Some(0usize);
                        for (i, t) in taps.iter().enumerate() {
                            w *= t.weight[at[i]];
                            offset = offset.zip(t.index[at[i]]).map(|(o, k)| o + k * strides[i]);
                        }
                        if let Some(o) = offset {
                            sum += w * plane[o];
                        }
                        for i in (0..r).rev() {
                            at[i] += 1;
                            if at[i] < taps[i].len {
                                continue 'combos;
                            }
                            at[i] = 0;
                        }
                        break;
                    }
                    y[(b * c + ch) * self.points + p] = sum;
                }
            }
        }
        Ok(())
    }
}

struct AffineGrid {
    /// The spatial dims, and theta's batch.
    dims: Vec<usize>,
    batch: usize,
    align_corners: bool,
}

pub(super) fn prepare_affine_grid(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(1..=1, 1)?;
    let (theta, y) = (&cx.inputs[0], &cx.outputs[0]);
    if let Some(d) = [theta.dtype, y.dtype].into_iter().find(|&d| d != DType::F32) {
        return Err(cx.dtype_error(d));
    }
    let size: Vec<usize> = cx.attrs.ints("size")?.iter().map(|&d| d as usize).collect();
    let r = size.len().saturating_sub(2);
    let fits = |size: &[usize]| {
        theta.shape == [size[0], r, r + 1] && y.shape == [&size[..1], &size[2..], &[r]].concat()
    };
    if !matches!(r, 2 | 3) || !fits(&size) {
        return Err(invalid!("AffineGrid of theta {:?} to {:?}", theta.shape, y.shape));
    }
    Ok(Box::new(AffineGrid {
        dims: size[2..].to_vec(),
        batch: size[0],
        align_corners: cx.attrs.int("align_corners")? != 0,
    }))
}

impl AffineGrid {
    /// The normalized coordinate of index `i` along a dim of `d` points.
    fn coordinate(&self, i: usize, d: usize) -> f64 {
        match (self.align_corners, d) {
            (true, 1) => -1.0,
            (true, _) => -1.0 + i as f64 * (2.0 / (d - 1) as f64),
            (false, _) => -1.0 + 1.0 / d as f64 + i as f64 * (2.0 / d as f64),
        }
    }
}

impl Kernel for AffineGrid {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let theta = inputs[0].as_slice::<f32>()?;
        let y = outputs[0].as_slice_mut::<f32>()?;
        let r = self.dims.len();
        let points: usize = self.dims.iter().product();
        if theta.len() != self.batch * r * (r + 1) || y.len() != self.batch * points * r {
            return Err(invalid!("AffineGrid run with tensors of other sizes than prepared"));
        }
        // A point's homogeneous coordinates: the last spatial dim's first (x, y, z, 1).
        let mut homogeneous = vec![1.0; r + 1];
        for (b, out) in y.chunks_exact_mut(points * r).enumerate() {
            let t = &theta[b * r * (r + 1)..][..r * (r + 1)];
            for (p, point) in out.chunks_exact_mut(r).enumerate() {
                let mut rest = p;
                for i in (0..r).rev() {
                    let d = self.dims[i];
                    homogeneous[r - 1 - i] = self.coordinate(rest % d, d);
                    rest /= d;
                }
                for (row, v) in point.iter_mut().enumerate() {
                    let m = &t[row * (r + 1)..][..r + 1];
                    *v = m.iter().zip(&homogeneous).map(|(&a, &c)| f64::from(a) * c).sum::<f64>()
                        as f32;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_that_do_not_fit_are_errors() {
        let desc = |shape: &[usize]| crate::TensorDesc::new(DType::F32, shape);
        let x = crate::Tensor::zeros(desc(&[1, 1, 2, 2]));
        let grid = crate::Tensor::zeros(desc(&[1, 2, 2, 2]));
        let attrs = ingot_schema::Attrs::new()
            .with("mode", ingot_schema::AttrValue::Text("linear".into()))
            .with("padding_mode", ingot_schema::AttrValue::Text("zeros".into()))
            .with("align_corners", ingot_schema::AttrValue::Int(0));
        for out in [&[1][..], &[1, 1, 2], &[1, 1, 3, 2]] {
            assert!(crate::cpu::eval("GridSample", &attrs, &[&x, &grid], &[desc(out)]).is_err());
        }
        let theta = crate::Tensor::zeros(desc(&[1, 2, 3]));
        for size in [vec![], vec![1], vec![1, 1, 2, 2, 2, 2]] {
            let attrs = ingot_schema::Attrs::new()
                .with("size", ingot_schema::AttrValue::Ints(size))
                .with("align_corners", ingot_schema::AttrValue::Int(0));
            let out = desc(&[1, 2, 2, 2]);
            assert!(crate::cpu::eval("AffineGrid", &attrs, &[&theta], &[out]).is_err());
        }
    }

    #[test]
    fn an_identity_theta_gives_the_base_grid() {
        let theta = crate::Tensor::from_vec(vec![1, 2, 3], &[1f32, 0., 0., 0., 1., 0.]).unwrap();
        let grid = |align: i64| {
            let attrs = ingot_schema::Attrs::new()
                .with("size", ingot_schema::AttrValue::Ints(vec![1, 1, 2, 3]))
                .with("align_corners", ingot_schema::AttrValue::Int(align));
            let out = crate::TensorDesc::new(DType::F32, [1, 2, 3, 2]);
            crate::cpu::eval("AffineGrid", &attrs, &[&theta], &[out]).unwrap()[0]
                .to_vec::<f32>()
                .unwrap()
        };
        // (x, y) per point, x along the 3 columns, y along the 2 rows.
        assert_eq!(grid(1), [-1., -1., 0., -1., 1., -1., -1., 1., 0., 1., 1., 1.]);
        // Pixel centres: x at -2/3, 0, 2/3 and y at -1/2, 1/2 (computed in f64, then rounded).
        let g = grid(0);
        assert_eq!(g[..2], [(-1.0f64 + 1.0 / 3.0) as f32, -0.5]);
        assert_eq!(g[10..], [(1.0f64 - 1.0 / 3.0) as f32, 0.5]);
    }

    #[test]
    fn reflection_folds_back_and_forth() {
        assert_eq!(reflect(-1.0, 0.0, 3.0), 1.0);
        assert_eq!(reflect(4.0, 0.0, 3.0), 2.0);
        assert_eq!(reflect(7.5, 0.0, 3.0), 1.5, "past the far border, then the near one");
        assert_eq!(reflect(-0.75, -0.5, 1.5), -0.25);
        assert_eq!(reflect(2.0, 1.0, 1.0), 1.0, "a single pixel");
    }

    #[test]
    fn cubic_weights_sum_to_one_and_interpolate() {
        for t in [0.0f32, 0.25, 0.5, 0.9] {
            let w = cubic_coefficients(t);
            assert!((w.iter().sum::<f32>() - 1.0).abs() < 1e-6, "{t}: {w:?}");
        }
        assert_eq!(cubic_coefficients(0.0), [0.0, 1.0, 0.0, 0.0]);
    }
}
