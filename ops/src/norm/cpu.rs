//! Normalizations, float32: BatchNormalization (inference), InstanceNormalization,
//! GroupNormalization, LayerNormalization, RMSNormalization, LRN and
//! MeanVarianceNormalization.
//!
//! Canonical attributes: `epsilon` (all but LRN and MVN); Layer and RMSNormalization `axis`
//! (non-negative); GroupNormalization `num_groups`; LRN `size`, `alpha`, `beta`, `bias`;
//! MeanVarianceNormalization `axes` (non-negative). Inputs are all present: BatchNormalization
//! has 5, Instance/GroupNormalization 3, LayerNormalization 2 or 3 (no bias),
//! RMSNormalization 2.
//!
//! Instance, Group, Layer and RMS normalization share one kernel: the input is a sequence of
//! contiguous rows (one per instance, group or leading index), each normalized on its own,
//! followed by an affine map per channel or per element. RMSNormalization is the row kernel
//! uncentred: the mean taken as 0, so the variance is the mean square. Means and variances
//! accumulate in f64, which keeps long rows accurate at no measurable cost next to the memory
//! traffic.

use crate::cpu::{Kernel, KernelError, OpCx, input_f32, tensor_mut};
use crate::invalid;
use crate::tensor::{TensorDesc, TensorMut, TensorRef};
use ingot_schema::DType;
use std::borrow::Cow;

pub fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    let (n_in, n_out) = match cx.op {
        "BatchNormalization" => (5..=5, 1),
        "InstanceNormalization" | "GroupNormalization" => (3..=3, 1),
        "LayerNormalization" => (2..=3, cx.outputs.len().clamp(1, 3)),
        "RMSNormalization" => (2..=2, 1),
        _ => (1..=1, 1),
    };
    cx.expect_arity(n_in, n_out)?;
    if let Some(d) = cx.inputs.iter().chain(cx.outputs).find(|d| d.dtype != DType::F32) {
        return Err(cx.dtype_error(d.dtype));
    }
    let x = &cx.inputs[0].shape;
    if cx.outputs[0].shape != *x {
        return Err(invalid!("{} of {x:?} declares output {:?}", cx.op, cx.outputs[0].shape));
    }
    let kernel: Box<dyn Kernel> = match cx.op {
        "BatchNormalization" => {
            let (_, c, inner) = channels(cx)?;
            for p in &cx.inputs[1..] {
                expect_len(p, c, "a per-channel parameter")?;
            }
            Box::new(BatchNorm { c, inner, epsilon: cx.attrs.float("epsilon")? })
        }
        "InstanceNormalization" | "GroupNormalization" => {
            let (n, c, spatial) = channels(cx)?;
            let groups = match cx.op {
                "GroupNormalization" => usize::try_from(cx.attrs.int("num_groups")?)
                    .ok()
                    .filter(|&g| g > 0 && c % g == 0)
                    .ok_or_else(|| invalid!("num_groups must divide the {c} channels"))?,
                _ => c,
            };
            // Scale and bias per channel, or per group (GroupNormalization before opset 21).
            let per_group = cx.inputs[1].elements() != c;
            for p in &cx.inputs[1..] {
                expect_len(p, if per_group { groups } else { c }, "scale and bias")?;
            }
            Box::new(RowNorm {
                rows: n * groups,
                len: c.checked_div(groups).unwrap_or(0) * spatial,
                epsilon: cx.attrs.float("epsilon")?,
                centered: true,
                affine: Affine::PerChannel {
                    groups,
                    spatial,
                    per_group,
                    params: if per_group { groups } else { c },
                },
            })
        }
        "LayerNormalization" | "RMSNormalization" => layer_norm(cx)?,
        "LRN" => {
            let (_, c, spatial) = channels(cx)?;
            let size = usize::try_from(cx.attrs.int("size")?)
                .ok()
                .filter(|&s| s > 0)
                .ok_or_else(|| invalid!("LRN size must be positive"))?;
            Box::new(Lrn {
                c,
                spatial,
                size,
                alpha: cx.attrs.float("alpha")?,
                beta: cx.attrs.float("beta")?,
                bias: cx.attrs.float("bias")?,
            })
        }
        "MeanVarianceNormalization" => {
            let mut stats_shape = x.clone();
            for &a in cx.attrs.ints("axes")? {
                let d = usize::try_from(a)
                    .ok()
                    .and_then(|a| stats_shape.get_mut(a))
                    .ok_or_else(|| invalid!("axis {a} is out of range for rank {}", x.len()))?;
                *d = 1;
            }
            Box::new(Mvn {
                stats: broadcast_strides(&stats_shape, x)
                    .ok_or_else(|| invalid!("bad axes for shape {x:?}"))?,
                stats_len: stats_shape.iter().product(),
                shape: x.clone(),
            })
        }
        op => return Err(KernelError::UnknownOp(op.to_string())),
    };
    Ok(kernel)
}

/// (N, C, elements per channel) of an input laid out N x C x D1 x ...
fn channels(cx: &OpCx) -> Result<(usize, usize, usize), KernelError> {
    match cx.inputs[0].shape.as_slice() {
        [n, c, rest @ ..] => Ok((*n, *c, rest.iter().product())),
        s => Err(invalid!("{} needs an input of rank 2 or more, got {s:?}", cx.op)),
    }
}

fn expect_len(d: &TensorDesc, len: usize, what: &str) -> Result<(), KernelError> {
    if d.elements() == len {
        Ok(())
    } else {
        Err(invalid!("{what} should have {len} elements, got shape {:?}", d.shape))
    }
}

/// Mean and (biased) variance; uncentred (RMSNormalization), 0 and the mean square.
fn moments(x: &[f32], centered: bool) -> (f32, f32) {
    let n = x.len().max(1) as f64;
    let mean = match centered {
        true => x.iter().map(|&v| f64::from(v)).sum::<f64>() / n,
        false => 0.0,
    };
    let var = x.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n;
    (mean as f32, var as f32)
}

/// Strides that read a tensor of shape `from` as if broadcast to `to` (numpy rules, `from`
/// unidirectionally broadcastable), or `None` if it does not broadcast.
fn broadcast_strides(from: &[usize], to: &[usize]) -> Option<Vec<usize>> {
    let pad = to.len().checked_sub(from.len())?;
    let mut strides = vec![0; to.len()];
    let mut s = 1;
    for (i, &d) in from.iter().enumerate().rev() {
        match d {
            1 => {}
            d if d == to[pad + i] => strides[pad + i] = s,
            _ => return None,
        }
        s *= d;
    }
    Some(strides)
}

/// Calls `f(i, offset)` for every index of `shape` in row-major order, `offset` being the
/// index's offset under `strides`.
fn for_each_offset(shape: &[usize], strides: &[usize], mut f: impl FnMut(usize, usize)) {
    let total: usize = shape.iter().product();
    let mut idx = vec![0usize; shape.len()];
    let mut off = 0;
    for i in 0..total {
        f(i, off);
        for ((d, &n), &s) in idx.iter_mut().zip(shape).zip(strides).rev() {
            *d += 1;
            off += s;
            if *d < n {
                break;
            }
            *d = 0;
            off -= s * n;
        }
    }
}

/// Inference batch normalization: `y = (x - mean) / sqrt(var + epsilon) * scale + B` per
/// channel, folded into one multiply-add per element.
struct BatchNorm {
    c: usize,
    inner: usize,
    epsilon: f32,
}

impl Kernel for BatchNorm {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let len = inputs.first().map_or(0, TensorRef::elements);
        let x = input_f32(inputs, 0, len)?;
        let [scale, bias, mean, var] = [1, 2, 3, 4].map(|i| input_f32(inputs, i, self.c));
        let (scale, bias, mean, var) = (scale?, bias?, mean?, var?);
        let y =
            tensor_mut::<f32>(outputs.first_mut().ok_or_else(|| invalid!("missing output"))?, len)?;
        let mul: Vec<f32> =
            scale.iter().zip(var).map(|(s, v)| s / (v + self.epsilon).sqrt()).collect();
        let add: Vec<f32> = bias.iter().zip(mean).zip(&mul).map(|((b, m), a)| b - m * a).collect();
        let blocks = x.chunks_exact(self.inner.max(1)).zip(y.chunks_exact_mut(self.inner.max(1)));
        for (i, (xs, ys)) in blocks.enumerate() {
            let (a, b) = (mul[i % self.c], add[i % self.c]);
            for (y, &x) in ys.iter_mut().zip(xs) {
                *y = x * a + b;
            }
        }
        Ok(())
    }
}

/// How a normalized row is scaled and shifted.
enum Affine {
    /// Row `r` is group `r % groups`, holding consecutive channels of `spatial` elements each;
    /// scale and bias hold `params` values: one per channel or, if `per_group`, per group.
    PerChannel { groups: usize, spatial: usize, per_group: bool, params: usize },
    /// Scale and bias per element of the row, each broadcast from its own shape to the row's
    /// (LayerNormalization); `bias` is absent when the node has none.
    PerElement { row_shape: Vec<usize>, scale: Vec<usize>, bias: Option<Vec<usize>> },
}

/// Scale and bias, borrowed from the inputs or expanded from them.
type ScaleBias<'a> = (Cow<'a, [f32]>, Cow<'a, [f32]>);

/// Normalizes `rows` contiguous rows of `len` elements each, then applies `affine`.
struct RowNorm {
    rows: usize,
    len: usize,
    epsilon: f32,
    /// Whether the mean is subtracted (all but RMSNormalization).
    centered: bool,
    affine: Affine,
}

impl RowNorm {
    /// Scale and bias as one value per element of a row (PerElement) or per channel
    /// (PerChannel), whatever their stored shape.
    fn params<'a>(&self, inputs: &[TensorRef<'a>]) -> Result<ScaleBias<'a>, KernelError> {
        match &self.affine {
            Affine::PerChannel { params, .. } => Ok((
                Cow::Borrowed(input_f32(inputs, 1, *params)?),
                Cow::Borrowed(input_f32(inputs, 2, *params)?),
            )),
            Affine::PerElement { row_shape, scale, bias } => {
                // A shape that broadcasts to the row with as many elements has its layout.
                let expand = |i: usize, shape: &[usize]| -> Result<Cow<'a, [f32]>, KernelError> {
                    let data = input_f32(inputs, i, shape.iter().product())?;
                    if data.len() == self.len {
                        return Ok(Cow::Borrowed(data));
                    }
                    let strides = broadcast_strides(shape, row_shape)
                        .ok_or_else(|| invalid!("input {i} does not broadcast to {row_shape:?}"))?;
                    let mut out = vec![0.0; self.len];
                    for_each_offset(row_shape, &strides, |j, off| out[j] = data[off]);
                    Ok(Cow::Owned(out))
                };
                let b = match bias {
                    Some(shape) => expand(2, shape)?,
                    None => Cow::Owned(vec![0.0; self.len]),
                };
                Ok((expand(1, scale)?, b))
            }
        }
    }
}

impl Kernel for RowNorm {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let total = self.rows * self.len;
        let x = input_f32(inputs, 0, total)?;
        let (scale, bias) = self.params(inputs)?;
        let (y, stats) = outputs.split_first_mut().ok_or_else(|| invalid!("missing output"))?;
        let y = tensor_mut::<f32>(y, total)?;
        let mut stats = stats
            .iter_mut()
            .map(|t| tensor_mut::<f32>(t, self.rows))
            .collect::<Result<Vec<_>, _>>()?;
        let rows = x.chunks_exact(self.len.max(1)).zip(y.chunks_exact_mut(self.len.max(1)));
        for (r, (xs, ys)) in rows.enumerate() {
            let (mean, var) = moments(xs, self.centered);
            let inv_std = 1.0 / (var + self.epsilon).sqrt();
            // LayerNormalization's optional Mean and InvStdDev outputs, in that order.
            for (out, v) in stats.iter_mut().zip([mean, inv_std]) {
                out[r] = v;
            }
            match &self.affine {
                Affine::PerElement { .. } => {
                    for (((y, &x), &s), &b) in
                        ys.iter_mut().zip(xs).zip(scale.iter()).zip(bias.iter())
                    {
                        *y = (x - mean) * inv_std * s + b;
                    }
                }
                Affine::PerChannel { groups, spatial, per_group, .. } => {
                    let (g, plane) = (r % groups, (*spatial).max(1));
                    let per_row = self.len / plane;
                    let chunks = xs.chunks_exact(plane).zip(ys.chunks_exact_mut(plane));
                    for (j, (xc, yc)) in chunks.enumerate() {
                        let p = if *per_group { g } else { g * per_row + j };
                        let a = scale[p] * inv_std;
                        let b = bias[p] - mean * a;
                        for (y, &x) in yc.iter_mut().zip(xc) {
                            *y = x * a + b;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Layer and RMSNormalization: rows are the indices before `axis`; scale and bias broadcast
/// to the normalized shape; LayerNormalization's optional Mean and InvStdDev outputs have
/// one value per row.
fn layer_norm(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    let x = &cx.inputs[0].shape;
    let axis = usize::try_from(cx.attrs.int("axis")?)
        .ok()
        .filter(|&a| a < x.len())
        .ok_or_else(|| invalid!("{} axis is out of range for rank {}", cx.op, x.len()))?;
    let row_shape = x[axis..].to_vec();
    let rows: usize = x[..axis].iter().product();
    for (i, d) in cx.inputs.iter().enumerate().skip(1) {
        if broadcast_strides(&d.shape, &row_shape).is_none() {
            return Err(invalid!(
                "{} input {i} of shape {:?} does not broadcast to {row_shape:?}",
                cx.op,
                d.shape
            ));
        }
    }
    for d in &cx.outputs[1..] {
        expect_len(d, rows, "Mean and InvStdDev")?;
    }
    Ok(Box::new(RowNorm {
        rows,
        len: row_shape.iter().product(),
        epsilon: cx.attrs.float("epsilon")?,
        centered: cx.op == "LayerNormalization",
        affine: Affine::PerElement {
            scale: cx.inputs[1].shape.clone(),
            bias: cx.inputs.get(2).map(|d| d.shape.clone()),
            row_shape,
        },
    }))
}

/// Local response normalization across channels:
/// `y = x / (bias + alpha / size * Σ x²)^beta`, the sum over a window of `size` channels
/// from `c - floor((size-1)/2)` to `c + ceil((size-1)/2)`, clipped to the channels that exist.
struct Lrn {
    c: usize,
    spatial: usize,
    size: usize,
    alpha: f32,
    beta: f32,
    bias: f32,
}

impl Kernel for Lrn {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let len = inputs.first().map_or(0, TensorRef::elements);
        let x = input_f32(inputs, 0, len)?;
        let y =
            tensor_mut::<f32>(outputs.first_mut().ok_or_else(|| invalid!("missing output"))?, len)?;
        let (before, after) = ((self.size - 1) / 2, self.size / 2);
        let plane = self.spatial.max(1);
        let mut sum = vec![0.0f32; plane];
        let scale = self.alpha / self.size as f32;
        let batches = x
            .chunks_exact((self.c * plane).max(1))
            .zip(y.chunks_exact_mut((self.c * plane).max(1)));
        for (xb, yb) in batches {
            for (ch, ys) in yb.chunks_exact_mut(plane).enumerate() {
                sum.fill(0.0);
                let window = ch.saturating_sub(before)..(ch + after + 1).min(self.c);
                for xs in xb[window.start * plane..window.end * plane].chunks_exact(plane) {
                    for (s, &v) in sum.iter_mut().zip(xs) {
                        *s += v * v;
                    }
                }
                let xs = &xb[ch * plane..(ch + 1) * plane];
                for ((y, &x), &s) in ys.iter_mut().zip(xs).zip(&sum) {
                    *y = x / (self.bias + scale * s).powf(self.beta);
                }
            }
        }
        Ok(())
    }
}

/// MeanVarianceNormalization: `y = (x - mean) / (sqrt(var) + 1e-9)`, statistics over `axes`
/// (ONNX's function body: the standard deviation plus 1e-9, not the variance plus epsilon).
struct Mvn {
    shape: Vec<usize>,
    /// Each element's statistics slot: strides of the kept axes, 0 on the reduced ones.
    stats: Vec<usize>,
    stats_len: usize,
}

impl Kernel for Mvn {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let len = self.shape.iter().product();
        let x = input_f32(inputs, 0, len)?;
        let y =
            tensor_mut::<f32>(outputs.first_mut().ok_or_else(|| invalid!("missing output"))?, len)?;
        let count = (len / self.stats_len.max(1)).max(1) as f64;
        let mut mean = vec![0.0f64; self.stats_len];
        for_each_offset(&self.shape, &self.stats, |i, s| mean[s] += f64::from(x[i]));
        mean.iter_mut().for_each(|m| *m /= count);
        let mut var = vec![0.0f64; self.stats_len];
        for_each_offset(&self.shape, &self.stats, |i, s| {
            var[s] += (f64::from(x[i]) - mean[s]).powi(2)
        });
        let std: Vec<f64> = var.iter().map(|v| (v / count).sqrt() + 1e-9).collect();
        for_each_offset(&self.shape, &self.stats, |i, s| {
            y[i] = ((f64::from(x[i]) - mean[s]) / std[s]) as f32
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! Expected values from numpy, by this script (x is the same [1, 4, 3] input throughout):
    //! ```python
    //! import numpy as np, math
    //! def p(name, a): print(name, np.asarray(a, np.float32).flatten().tolist())
    //! x = np.array([0.5, -1.0, 2.0, 3.0, 1.5, -0.5, 4.0, 0.0, -2.0, 1.0, 2.5, -3.0],
    //!              dtype=np.float32).reshape(1, 4, 3)
    //! s = np.array([1, 2, -1, 0.5], np.float32); b = np.array([0, 1, 2, 3], np.float32)
    //! m = x.mean(axis=2, keepdims=True); v = x.var(axis=2, keepdims=True)
    //! p("instance", (x - m) / np.sqrt(v + 1e-5) * s.reshape(1, 4, 1) + b.reshape(1, 4, 1))
    //! xg = x.reshape(1, 2, 6); m = xg.mean(axis=2, keepdims=True); v = xg.var(axis=2, keepdims=True)
    //! n = ((xg - m) / np.sqrt(v + 1e-5)).reshape(1, 4, 3)
    //! p("group_c", n * s.reshape(1, 4, 1) + b.reshape(1, 4, 1))
    //! p("group_g", n * np.repeat([2., -1.], 2).reshape(1, 4, 1)
    //!   + np.repeat([1., 0.], 2).reshape(1, 4, 1))
    //! xl = x.reshape(2, 2, 3); sl = np.array([1, 2, 3], np.float32)
    //! bl = np.arange(6, dtype=np.float32).reshape(2, 3)
    //! r = xl.reshape(2, 6); m = r.mean(axis=1, keepdims=True); v = r.var(axis=1, keepdims=True)
    //! inv = 1 / np.sqrt(v + 1e-5)
    //! p("layer", ((r - m) * inv).reshape(2, 2, 3) * sl + bl); p("mean", m); p("inv", inv)
    //! p("rms", xl / np.sqrt((xl ** 2).mean(axis=(1, 2), keepdims=True) + 1e-5) * sl)
    //! alpha, beta, bias = 0.5, 0.75, 1.0
    //! for nsize in (3, 2):
    //!     sq = np.zeros_like(x)
    //!     for nn, c, h in np.ndindex(x.shape):
    //!         sq[nn, c, h] = sum(x[nn, max(0, c - math.floor((nsize - 1) / 2)):
    //!                              min(4, c + math.ceil((nsize - 1) / 2) + 1), h] ** 2)
    //!     p("lrn", x / ((bias + (alpha / nsize) * sq) ** beta))
    //! m = x.mean(axis=(0, 2), keepdims=True)
    //! sd = np.sqrt((x ** 2).mean(axis=(0, 2), keepdims=True) - m ** 2)
    //! p("mvn", (x - m) / (sd + 1e-9))
    //! ```
    #![allow(clippy::excessive_precision)] // values pasted as numpy printed them

    use crate::cpu::eval;
    use crate::tensor::{Tensor, TensorDesc};
    use ingot_schema::{AttrValue, Attrs, DType};

    const X: [f32; 12] = [0.5, -1.0, 2.0, 3.0, 1.5, -0.5, 4.0, 0.0, -2.0, 1.0, 2.5, -3.0];

    fn t(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_vec(shape.to_vec(), v).unwrap()
    }

    fn run(op: &str, attrs: Attrs, inputs: &[&Tensor], outs: &[&[usize]]) -> Vec<Tensor> {
        let descs: Vec<_> = outs.iter().map(|s| TensorDesc::new(DType::F32, s.to_vec())).collect();
        eval(op, &attrs, inputs, &descs).unwrap()
    }

    fn close(got: &Tensor, want: &[f32]) {
        let got = got.as_slice::<f32>().unwrap();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{got:?} vs {want:?}");
        }
    }

    fn eps(e: f64) -> Attrs {
        Attrs::new().with("epsilon", AttrValue::Float(e))
    }

    #[test]
    fn batch_norm_by_hand() {
        // Channel 0: (x - 1.5) / 0.5; channel 1: (x - 3.5) / 0.5 * 2 + 1.
        let x = t(&[1, 2, 1, 2], &[1.0, 2.0, 3.0, 4.0]);
        let p = |v: [f32; 2]| t(&[2], &v);
        let (s, b, m, v) = (p([1.0, 2.0]), p([0.0, 1.0]), p([1.5, 3.5]), p([0.25, 0.25]));
        let y = run("BatchNormalization", eps(0.0), &[&x, &s, &b, &m, &v], &[&[1, 2, 1, 2]]);
        close(&y[0], &[-1.0, 1.0, -1.0, 3.0]);
    }

    #[test]
    fn instance_and_group_norm() {
        let x = t(&[1, 4, 3], &X);
        let s = t(&[4], &[1.0, 2.0, -1.0, 0.5]);
        let b = t(&[4], &[0.0, 1.0, 2.0, 3.0]);
        let y = run("InstanceNormalization", eps(1e-5), &[&x, &s, &b], &[&[1, 4, 3]]);
        close(
            &y[0],
            &[
                0.0, -1.2247407, 1.2247407, 3.3249471, 1.2324946, -1.5574417, 0.66369498, 2.267261,
                3.0690441, 3.1794894, 3.5025702, 2.3179405,
            ],
        );
        let groups = eps(1e-5).with("num_groups", AttrValue::Int(2));
        let y = run("GroupNormalization", groups.clone(), &[&x, &s, &b], &[&[1, 4, 3]]);
        close(
            &y[0],
            &[
                -0.29827425,
                -1.3720616,
                0.775513,
                3.9827423,
                1.8351679,
                -1.028265,
                0.52075636,
                2.1720052,
                2.9976296,
                3.1204035,
                3.4300127,
                2.2947791,
            ],
        );
        // Opset 18: one scale and bias per group.
        let (sg, bg) = (t(&[2], &[2.0, -1.0]), t(&[2], &[1.0, 0.0]));
        let y = run("GroupNormalization", groups, &[&x, &sg, &bg], &[&[1, 4, 3]]);
        close(
            &y[0],
            &[
                0.4034515,
                -1.7441232,
                2.5510259,
                3.9827423,
                1.8351679,
                -1.028265,
                -1.4792436,
                0.17200507,
                0.9976295,
                -0.24080713,
                -0.86002535,
                1.4104418,
            ],
        );
    }

    #[test]
    fn layer_norm_broadcasts_scale_and_reports_statistics() {
        let x = t(&[2, 2, 3], &X);
        let s = t(&[3], &[1.0, 2.0, 3.0]);
        let b = t(&[2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let attrs = eps(1e-5).with("axis", AttrValue::Int(1));
        let y = run(
            "LayerNormalization",
            attrs.clone(),
            &[&x, &s, &b],
            &[&[2, 2, 3], &[2, 1, 1], &[2, 1, 1]],
        );
        close(
            &y[0],
            &[
                -0.29827425,
                -1.744123,
                4.326539,
                4.491371,
                4.835168,
                1.9576025,
                1.4792436,
                0.6559898,
                -0.99288845,
                3.240807,
                5.720051,
                0.76867485,
            ],
        );
        close(&y[1], &[0.9166667, 0.41666666]);
        close(&y[2], &[0.71585816, 0.4128122]);
        // Without a bias, and Y alone.
        let y = run("LayerNormalization", attrs, &[&x, &s], &[&[2, 2, 3]]);
        let first: Vec<f32> = [1.0f32, 2.0, 3.0]
            .iter()
            .zip(&X)
            .map(|(s, x)| (x - 0.9166667) * 0.71585816 * s)
            .collect();
        close(&Tensor::from_vec(vec![3], &y[0].as_slice::<f32>().unwrap()[..3]).unwrap(), &first);
    }

    #[test]
    fn rms_norm_is_uncentred() {
        let x = t(&[2, 2, 3], &X);
        let s = t(&[3], &[1.0, 2.0, 3.0]);
        let attrs = eps(1e-5).with("axis", AttrValue::Int(1));
        let y = run("RMSNormalization", attrs.clone(), &[&x, &s], &[&[2, 2, 3]]);
        close(
            &y[0],
            &[
                0.29925224, -1.197009, 3.5910268, 1.7955135, 1.7955135, -0.8977567, 1.627351, 0.0,
                -2.4410267, 0.40683776, 2.0341887, -3.6615396,
            ],
        );
        // No bias input and no statistics outputs.
        let out = [TensorDesc::new(DType::F32, vec![2, 2, 3])];
        assert!(eval("RMSNormalization", &attrs, &[&x, &s, &s], &out).is_err());
        let two = [out[0].clone(), TensorDesc::new(DType::F32, vec![2, 1, 1])];
        assert!(eval("RMSNormalization", &attrs, &[&x, &s], &two).is_err());
    }

    #[test]
    fn lrn_odd_and_even_windows() {
        let x = t(&[1, 4, 3], &X);
        let attrs = |size| {
            Attrs::new()
                .with("size", AttrValue::Int(size))
                .with("alpha", AttrValue::Float(0.5))
                .with("beta", AttrValue::Float(0.75))
                .with("bias", AttrValue::Float(1.0))
        };
        let y = run("LRN", attrs(3), &[&x], &[&[1, 4, 3]]);
        close(
            &y[0],
            &[
                0.24838826,
                -0.72278166,
                1.338445,
                0.87015605,
                1.0841725,
                -0.2613499,
                1.1397535,
                0.0,
                -0.8342965,
                0.36502075,
                1.4636977,
                -1.2637742,
            ],
        );
        let y = run("LRN", attrs(2), &[&x], &[&[1, 4, 3]]);
        close(
            &y[0],
            &[
                0.20363532,
                -0.64016438,
                1.162076,
                0.6789968,
                1.0733126,
                -0.2905190,
                1.1532953,
                0.0,
                -0.6756757,
                0.8458971,
                1.2343607,
                -1.2393922,
            ],
        );
    }

    #[test]
    fn mvn_over_chosen_axes() {
        let x = t(&[1, 4, 3], &X);
        let attrs = Attrs::new().with("axes", AttrValue::Ints(vec![0, 2]));
        let y = run("MeanVarianceNormalization", attrs, &[&x], &[&[1, 4, 3]]);
        close(
            &y[0],
            &[
                0.0,
                -1.2247448,
                1.2247448,
                1.1624764,
                0.11624762,
                -1.278724,
                1.3363062,
                -0.26726127,
                -1.069045,
                0.35897908,
                1.0051414,
                -1.3641206,
            ],
        );
    }

    #[test]
    fn empty_inputs_run() {
        let x = t(&[1, 0, 3], &[]);
        let none = t(&[0], &[]);
        let y = run("InstanceNormalization", eps(1e-5), &[&x, &none, &none], &[&[1, 0, 3]]);
        assert_eq!(y[0].shape(), &[1, 0, 3]);
        let x = t(&[0, 2, 3], &[]);
        let two = t(&[2], &[1.0, 1.0]);
        let inputs = [&x, &two, &two, &two, &two];
        let y = run("BatchNormalization", eps(1e-5), &inputs, &[&[0, 2, 3]]);
        assert_eq!(y[0].shape(), &[0, 2, 3]);
    }

    #[test]
    fn bad_shapes_fail_at_prepare() {
        let x = t(&[1, 4, 3], &X);
        let s3 = t(&[3], &[1.0; 3]);
        let out = [TensorDesc::new(DType::F32, vec![1, 4, 3])];
        let groups = eps(1e-5).with("num_groups", AttrValue::Int(3));
        assert!(eval("GroupNormalization", &groups, &[&x, &s3, &s3], &out).is_err());
        assert!(eval("InstanceNormalization", &eps(1e-5), &[&x, &s3, &s3], &out).is_err());
        let ln = eps(1e-5).with("axis", AttrValue::Int(1));
        let s4 = t(&[4], &[1.0; 4]);
        assert!(eval("LayerNormalization", &ln, &[&x, &s4], &out).is_err());
        let err = eval("RMSNormalization", &ln, &[&x, &s4], &out).unwrap_err();
        assert!(err.to_string().contains("RMSNormalization input 1 of shape [4]"), "{err}");
    }
}
