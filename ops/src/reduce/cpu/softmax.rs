//! Softmax, LogSoftmax and Hardmax along one axis (or, with `coerce_2d`, over all axes from
//! `axis` on, as before opset 13), and LpNormalization along one axis: x / ||x||, its L1 or L2
//! norm (a zero vector stays zero, as in ONNX's tests).

use super::{Lanes, axis_attr, check_lens, check_output};
use crate::cpu::parallel::{column_blocks, for_each_chunk};
use crate::cpu::{Kernel, KernelError, OpCx};
use crate::elementwise::cpu::exp_f32;
use crate::invalid;
use crate::tensor::{TensorMut, TensorRef};
use ingot_schema::DType;
use ndarray::ArrayViewMut2;
use std::ops::Range;

/// Floats a Softmax task takes on (whole blocks): enough to be worth another thread.
const TASK_FLOATS: usize = 1 << 14;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Softmax,
    LogSoftmax,
    Hardmax,
    L1Norm,
    L2Norm,
}

struct Softmax {
    kind: Kind,
    lanes: Lanes,
}

pub(super) fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(1..=1, 1)?;
    let x = &cx.inputs[0];
    let wide = x.dtype == DType::F64 && matches!(cx.op, "Softmax" | "LogSoftmax");
    if x.dtype != DType::F32 && !wide {
        return Err(cx.dtype_error(x.dtype));
    }
    let rank = x.shape.len();
    let axis = axis_attr(cx, rank)?;
    let coerce_2d = cx.op != "LpNormalization" && cx.attrs.int("coerce_2d")? != 0;
    let end = if coerce_2d { rank } else { axis + 1 };
    check_output(cx, x.dtype, &x.shape)?;
    if wide {
        let log = cx.op == "LogSoftmax";
        return Ok(Box::new(SoftmaxF64 { log, lanes: Lanes::new(&x.shape, axis, end) }));
    }
    let kind = match cx.op {
        "Softmax" => Kind::Softmax,
        "LogSoftmax" => Kind::LogSoftmax,
        "Hardmax" => Kind::Hardmax,
        _ => match cx.attrs.int("p")? {
            1 => Kind::L1Norm,
            2 => Kind::L2Norm,
            p => return Err(invalid!("LpNormalization with p = {p}")),
        },
    };
    Ok(Box::new(Softmax { kind, lanes: Lanes::new(&x.shape, axis, end) }))
}

/// Softmax and LogSoftmax of float64 (attention computed in double precision, as ONNX's
/// reference writes some of its tests): one lane at a time, in f64 throughout; no deployed
/// model is this precise, so it is plain rather than fast.
struct SoftmaxF64 {
    log: bool,
    lanes: Lanes,
}

impl Kernel for SoftmaxF64 {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let x = inputs[0].as_slice::<f64>()?;
        let y = outputs[0].as_slice_mut::<f64>()?;
        let Lanes { n, inner, .. } = self.lanes;
        check_lens("Softmax", x.len(), self.lanes.len(), y.len(), self.lanes.len())?;
        for (xb, yb) in
            x.chunks_exact((n * inner).max(1)).zip(y.chunks_exact_mut((n * inner).max(1)))
        {
            for lane in 0..inner {
                let at = |r: usize| r * inner + lane;
                let max = (0..n).map(|r| xb[at(r)]).fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = (0..n).map(|r| (xb[at(r)] - max).exp()).sum();
                for r in 0..n {
                    let d = xb[at(r)] - max;
                    yb[at(r)] = if self.log { d - sum.ln() } else { d.exp() / sum };
                }
            }
        }
        Ok(())
    }
}

impl Softmax {
    /// One block: `n` rows of `inner` lanes, reduced along the rows.
    fn block(
        &self,
        xb: &[f32],
        yb: &mut [f32],
        (m, s, idx): (&mut Vec<f32>, &mut [f32], &mut [i64]),
    ) {
        let l = self.lanes;
        let rows = || xb.chunks_exact(l.inner);
        if matches!(self.kind, Kind::L1Norm | Kind::L2Norm) {
            s.fill(0.0);
            for xr in rows() {
                for (s, &x) in s.iter_mut().zip(xr) {
                    *s += if self.kind == Kind::L1Norm { x.abs() } else { x * x };
                }
            }
            if self.kind == Kind::L2Norm {
                s.iter_mut().for_each(|v| *v = v.sqrt());
            }
            for (xr, yr) in rows().zip(yb.chunks_exact_mut(l.inner)) {
                for ((y, &x), &s) in yr.iter_mut().zip(xr).zip(s.iter()) {
                    *y = if s == 0.0 { 0.0 } else { x / s };
                }
            }
            return;
        }
        if self.kind == Kind::Hardmax {
            super::arg::best_along(xb, l.inner, |v, b| v > b, m, idx);
            yb.fill(0.0);
            for (i, &r) in idx.iter().enumerate() {
                yb[r as usize * l.inner + i] = 1.0;
            }
            return;
        }
        // Subtract the maximum so that exp never overflows.
        super::arg::best_along(xb, l.inner, |v, b| v > b, m, idx);
        s.fill(0.0);
        for (xr, yr) in rows().zip(yb.chunks_exact_mut(l.inner)) {
            for (((y, &x), &m), s) in yr.iter_mut().zip(xr).zip(m.iter()).zip(s.iter_mut()) {
                *y = (x - m).exp();
                *s += *y;
            }
        }
        if self.kind == Kind::Softmax {
            s.iter_mut().for_each(|v| *v = 1.0 / *v);
            for yr in yb.chunks_exact_mut(l.inner) {
                yr.iter_mut().zip(s.iter()).for_each(|(y, s)| *y *= s);
            }
        } else {
            // log softmax = x - m - log Σ exp(x - m)
            s.iter_mut().zip(m.iter()).for_each(|(s, m)| *s = m + s.ln());
            for (xr, yr) in rows().zip(yb.chunks_exact_mut(l.inner)) {
                for ((y, &x), s) in yr.iter_mut().zip(xr).zip(s.iter()) {
                    *y = x - s;
                }
            }
        }
    }
}

impl Kernel for Softmax {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let x = inputs[0].as_slice::<f32>()?;
        let y = outputs[0].as_slice_mut::<f32>()?;
        let l = self.lanes;
        check_lens("Softmax", x.len(), l.len(), y.len(), l.len())?;
        if l.len() == 0 {
            return Ok(());
        }
        // Blocks in parallel, a few per task; per task, one running value per column of
        // `inner` lanes.
        let block = l.n * l.inner;
        let per_task = (TASK_FLOATS / block.max(1)).max(1);
        if l.inner == 1 && matches!(self.kind, Kind::Softmax | Kind::LogSoftmax) {
            let log = self.kind == Kind::LogSoftmax;
            for_each_chunk(y, block * per_task, &|t, ys| {
                let xs = &x[t * block * per_task..];
                for (xr, yr) in xs.chunks_exact(block).zip(ys.chunks_exact_mut(block)) {
                    softmax_row(xr, yr, log);
                }
            });
            return Ok(());
        }
        if matches!(self.kind, Kind::Softmax | Kind::LogSoftmax) {
            let log = self.kind == Kind::LogSoftmax;
            if block >= TASK_FLOATS {
                // Large blocks (a detector's box head: 16 x 8400) in column blocks, in
                // parallel.
                let cols = (TASK_FLOATS / l.n.max(1)).max(STRIP);
                for (xb, yb) in x.chunks_exact(block).zip(y.chunks_exact_mut(block)) {
                    let yv = ArrayViewMut2::from_shape((l.n, l.inner), yb)
                        .map_err(|e| invalid!("softmax block: {e}"))?;
                    column_blocks(yv, (cols, STRIP), &|c, yc| {
                        softmax_columns(xb, l.inner, c, yc, log);
                        Ok(())
                    })?;
                }
            } else {
                for_each_chunk(y, block * per_task, &|t, ys| {
                    let xs = &x[t * block * per_task..];
                    for (xb, yb) in xs.chunks_exact(block).zip(ys.chunks_exact_mut(block)) {
                        let yv = ArrayViewMut2::from_shape((l.n, l.inner), yb)
                            .expect("a block holds n rows of inner lanes");
                        softmax_columns(xb, l.inner, 0..l.inner, yv, log);
                    }
                });
            }
            return Ok(());
        }
        for_each_chunk(y, block * per_task, &|t, ys| {
            let xs = &x[t * block * per_task..];
            let mut m = Vec::with_capacity(l.inner);
            let mut s = vec![0f32; l.inner];
            let mut idx = vec![0i64; l.inner];
            for (xb, yb) in xs.chunks_exact(block).zip(ys.chunks_exact_mut(block)) {
                self.block(xb, yb, (&mut m, &mut s, &mut idx));
            }
        });
        Ok(())
    }
}

/// Softmax (or LogSoftmax) of one contiguous row: the last axis, as attention's scores and
/// classifier heads have it. Lanes of independent maxima and sums and the elementwise
/// kernels' exp keep every loop vectorised; the general path's one-row-at-a-time sweep with
/// libm's exp took 9 ns an element on a transformer's 16-long score rows. Compiled for the
/// wider vector units too.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512vl+avx2+fma+avx",
    "x86_64+avx2+fma+avx",
    "aarch64+neon"
))]
fn softmax_row(x: &[f32], y: &mut [f32], log: bool) {
    const LANES: usize = 16;
    // The maximum, which NaN never becomes (as the general path's `v > best`): a NaN in the
    // row then makes every output NaN through the sum, as there.
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = if v > *m { v } else { *m };
        }
    }
    let m = lanes.iter().chain(tail).fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    // Every value -inf (or the row empty): the general path's first element.
    let m = if m == f32::NEG_INFINITY { x.first().copied().unwrap_or(0.0) } else { m };
    let mut sums = [0f32; LANES];
    let mut chunks = y.chunks_exact_mut(LANES);
    for (yc, xc) in (&mut chunks).zip(x.chunks_exact(LANES)) {
        for ((y, &v), s) in yc.iter_mut().zip(xc).zip(&mut sums) {
            *y = exp_f32(v - m);
            *s += *y;
        }
    }
    let mut sum: f32 = sums.iter().sum();
    for (y, &v) in chunks.into_remainder().iter_mut().zip(tail) {
        *y = exp_f32(v - m);
        sum += *y;
    }
    if log {
        let shift = m + sum.ln();
        y.iter_mut().zip(x).for_each(|(y, &v)| *y = v - shift);
    } else {
        let r = 1.0 / sum;
        y.iter_mut().for_each(|y| *y *= r);
    }
}

/// Columns of a block a [`softmax_columns`] strip takes at a time: its maxima and sums stay
/// in registers.
const STRIP: usize = 64;

/// Softmax (or LogSoftmax) down the columns `cols` of a block (`n` rows of `inner` lanes,
/// the rows of `x` and of `y`, the block's columns `cols`), a strip of [`STRIP`] columns at a
/// time, each pass along contiguous runs of a row: the general path's libm exp and argmax
/// bookkeeping took 3.4 ns an element on YOLOv8's 16 x 8400 box distribution. Compiled for
/// the wider vector units too.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512vl+avx2+fma+avx",
    "x86_64+avx2+fma+avx",
    "aarch64+neon"
))]
fn softmax_columns(
    x: &[f32],
    inner: usize,
    cols: Range<usize>,
    mut y: ArrayViewMut2<f32>,
    log: bool,
) {
    for s0 in (0..cols.len()).step_by(STRIP) {
        let w = STRIP.min(cols.len() - s0);
        let x_rows = || x.chunks_exact(inner).map(|r| &r[cols.start + s0..][..w]);
        // The maxima, which NaN never becomes (a NaN then spreads through the sums).
        let mut m = [f32::NEG_INFINITY; STRIP];
        for xr in x_rows() {
            for (m, &v) in m.iter_mut().zip(xr) {
                *m = if v > *m { v } else { *m };
            }
        }
        let mut sums = [0f32; STRIP];
        for (xr, mut yr) in x_rows().zip(y.rows_mut()) {
            let yr = &mut yr.as_slice_mut().expect("rows of a block are contiguous")[s0..][..w];
            for (((y, &v), &m), s) in yr.iter_mut().zip(xr).zip(&m).zip(&mut sums) {
                *y = exp_f32(v - m);
                *s += *y;
            }
        }
        // Then x - (m + ln Σ) or y / Σ, as the row path finishes.
        let finish: [f32; STRIP] =
            std::array::from_fn(|j| if log { m[j] + sums[j].ln() } else { 1.0 / sums[j] });
        for (xr, mut yr) in x_rows().zip(y.rows_mut()) {
            let yr = &mut yr.as_slice_mut().expect("rows of a block are contiguous")[s0..][..w];
            if log {
                yr.iter_mut().zip(xr).zip(&finish).for_each(|((y, &v), &f)| *y = v - f);
            } else {
                yr.iter_mut().zip(&finish).for_each(|(y, &f)| *y *= f);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::cpu::eval;
    use crate::tensor::{Tensor, TensorDesc};
    use ingot_schema::{AttrValue, Attrs, DType};

    fn run(op: &str, x: &Tensor, axis: i64, coerce: i64) -> Vec<f32> {
        let attrs = Attrs::new()
            .with("axis", AttrValue::Int(axis))
            .with("coerce_2d", AttrValue::Int(coerce));
        let r = eval(op, &attrs, &[x], &[TensorDesc::new(DType::F32, x.shape().to_vec())]).unwrap();
        r[0].to_vec().unwrap()
    }

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{a:?} vs {b:?}");
        }
    }

    // x = np.array([[[0, 1], [2, 3], [4, 1000]]], np.float32)  # shape (1, 3, 2)
    fn x() -> Tensor {
        Tensor::from_vec(vec![1, 3, 2], &[0f32, 1., 2., 3., 4., 1000.]).unwrap()
    }

    #[test]
    fn softmax_along_a_middle_axis_is_stable() {
        // e = np.exp(x - x.max(1, keepdims=True)); e / e.sum(1, keepdims=True)
        close(&run("Softmax", &x(), 1, 0), &[0.015876241, 0.0, 0.11731043, 0.0, 0.86681336, 1.0]);
        // x - x.max(1, keepdims=True) - np.log(e.sum(1, keepdims=True))
        close(
            &run("LogSoftmax", &x(), 1, 0),
            &[-4.1429315, -999.0, -2.1429315, -997.0, -0.14293146, 0.0],
        );
    }

    #[test]
    fn float64_softmax_along_a_middle_axis_and_coerced() {
        // The f32 test's values in f64, the same numpy expressions in float64.
        let x = Tensor::from_vec(vec![1, 3, 2], &[0f64, 1., 2., 3., 4., 1000.]).unwrap();
        let run = |op: &str, coerce: i64| -> Vec<f64> {
            let attrs = Attrs::new()
                .with("axis", AttrValue::Int(1))
                .with("coerce_2d", AttrValue::Int(coerce));
            let desc = TensorDesc::new(DType::F64, [1, 3, 2]);
            eval(op, &attrs, &[&x], &[desc]).unwrap()[0].to_vec().unwrap()
        };
        let e = [0f64.exp(), 2f64.exp(), 4f64.exp()];
        let sum: f64 = e.iter().sum();
        let want = [e[0] / sum, 0.0, e[1] / sum, 0.0, e[2] / sum, 1.0];
        for (g, w) in run("Softmax", 0).iter().zip(want) {
            assert!((g - w).abs() <= 1e-15, "{g} vs {w}");
        }
        let log = run("LogSoftmax", 0);
        assert!((log[0] - (-sum.ln())).abs() <= 1e-15 && log[1] == -999.0, "{log:?}");
        assert_eq!(run("LogSoftmax", 1), [-1000.0, -999.0, -998.0, -997.0, -996.0, 0.0]);
        // Hardmax and LpNormalization stay float32-only: an error, not a wrong answer.
        let attrs =
            Attrs::new().with("axis", AttrValue::Int(1)).with("coerce_2d", AttrValue::Int(0));
        assert!(eval("Hardmax", &attrs, &[&x], &[TensorDesc::new(DType::F64, [1, 3, 2])]).is_err());
    }

    #[test]
    fn coerce_2d_flattens_the_trailing_axes() {
        // f = x.reshape(3, 2) viewed from axis 1 of a (1, 3, 2) input as (1, 6): softmax of
        // [0, 1, 2, 3, 4, 1000] is one-hot at 1000; log softmax is x - 1000.
        close(&run("Softmax", &x(), 1, 1), &[0.0, 0.0, 0.0, 0.0, 0.0, 1.0]);
        close(&run("LogSoftmax", &x(), 1, 1), &[-1000.0, -999.0, -998.0, -997.0, -996.0, 0.0]);
    }

    #[test]
    fn lp_normalization_divides_by_the_norm_along_the_axis() {
        let t = Tensor::from_vec(vec![2, 2], &[3f32, -4., 0., 0.]).unwrap();
        let lp = |p: i64, axis: i64| {
            let attrs =
                Attrs::new().with("axis", AttrValue::Int(axis)).with("p", AttrValue::Int(p));
            let desc = TensorDesc::new(DType::F32, [2, 2]);
            eval("LpNormalization", &attrs, &[&t], &[desc]).unwrap()[0].to_vec::<f32>().unwrap()
        };
        assert_eq!(lp(2, 1), [0.6, -0.8, 0.0, 0.0], "a zero vector stays zero");
        assert_eq!(lp(1, 1)[..2], [3.0 / 7.0, -4.0 / 7.0]);
        assert_eq!(lp(2, 0), [1.0, -1.0, 0.0, 0.0]);
    }

    #[test]
    fn rows_along_the_last_axis_match_float64() {
        // Lengths around the 16 lanes, values spread over a wide range, a -inf in the second
        // row (the whole row when it has one value: NaN, as numpy gives), and a NaN.
        for len in [1, 7, 16, 17, 40, 333] {
            let mut v: Vec<f32> =
                (0..2 * len).map(|i| ((i * 7919 % 1013) as f32 - 500.0) * 0.05).collect();
            v[len] = f32::NEG_INFINITY;
            let x = Tensor::from_vec(vec![2, len], &v).unwrap();
            for (op, log) in [("Softmax", false), ("LogSoftmax", true)] {
                let got = run(op, &x, 1, 0);
                for (row, out) in v.chunks(len).zip(got.chunks(len)) {
                    let m = row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x)));
                    let sum: f64 = row.iter().map(|&x| (f64::from(x) - m).exp()).sum();
                    for (&x, &y) in row.iter().zip(out) {
                        let want = match log {
                            false => (f64::from(x) - m).exp() / sum,
                            true => f64::from(x) - m - sum.ln(),
                        };
                        let ok = (f64::from(y) - want).abs() <= 1e-6 * (1.0 + want.abs())
                            || (want.is_nan() && y.is_nan());
                        assert!(
                            ok || (want.is_infinite() && y == want as f32),
                            "{op} {len}: {y} vs {want}"
                        );
                    }
                }
            }
        }
        let x = Tensor::from_vec(vec![1, 3], &[1f32, f32::NAN, 2.0]).unwrap();
        assert!(run("Softmax", &x, 1, 0).iter().all(|y| y.is_nan()), "NaN spreads to the row");
    }

    #[test]
    fn columns_along_a_leading_axis_match_float64() {
        // Softmax along axis 1 of [2, n, inner]: small blocks (whole blocks per task), and
        // YOLOv8's box distribution (16 x 8400: column blocks in parallel, strips of 64 and a
        // partial one), with a -inf and a NaN down two columns.
        for (n, inner) in [(3, 5), (16, 8400), (2, 70)] {
            let len = 2 * n * inner;
            let mut v: Vec<f32> =
                (0..len).map(|i| ((i * 7919 % 1013) as f32 - 500.0) * 0.05).collect();
            v[inner + 1] = f32::NEG_INFINITY;
            v[2] = f32::NAN;
            let x = Tensor::from_vec(vec![2, n, inner], &v).unwrap();
            for (op, log) in [("Softmax", false), ("LogSoftmax", true)] {
                let got = run(op, &x, 1, 0);
                for (b, j) in (0..2).flat_map(|b| (0..inner).map(move |j| (b, j))) {
                    let at = |r: usize| b * n * inner + r * inner + j;
                    let column: Vec<f64> = (0..n).map(|r| f64::from(v[at(r)])).collect();
                    let m = column.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x));
                    let sum: f64 = column.iter().map(|&x| (x - m).exp()).sum();
                    for (r, &x) in column.iter().enumerate() {
                        let want = if log { x - m - sum.ln() } else { (x - m).exp() / sum };
                        let y = f64::from(got[at(r)]);
                        let ok = (y - want).abs() <= 1e-6 * (1.0 + want.abs())
                            || (want.is_infinite() && y == want)
                            || (b == 0 && j == 2 && y.is_nan());
                        assert!(ok, "{op} [{n}, {inner}] column {j} row {r}: {y} vs {want}");
                    }
                }
            }
        }
    }

    #[test]
    fn hardmax_marks_the_first_maximum() {
        let t = Tensor::from_vec(vec![2, 3], &[3f32, 1., 3., 0., 2., 1.]).unwrap();
        assert_eq!(run("Hardmax", &t, 1, 0), [1., 0., 0., 0., 1., 0.]);
        assert_eq!(run("Hardmax", &t, 0, 0), [1., 0., 1., 0., 1., 0.]);
        assert_eq!(run("Hardmax", &t, 0, 1), [1., 0., 0., 0., 0., 0.]);
    }
}
