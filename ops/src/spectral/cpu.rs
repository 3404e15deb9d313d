//! DFT and STFT on the CPU, as ONNX's reference (numpy's `fft`, `ifft`, `irfft`): a direct
//! transform over a table of twiddle factors, in f64, for f32 and f64 tensors. O(n·length)
//! per signal, which suits the frame sizes of audio front ends (an FFT would pay past a few
//! thousand points).

use crate::cpu::{Kernel, KernelError, OpCx, read_f64s, write_f64s};
use crate::invalid;
use crate::tensor::{TensorMut, TensorRef};
use ingot_schema::DType;
use std::f64::consts::TAU;

pub fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    if super::windows::OPS.contains(&cx.op) {
        return super::windows::prepare(cx);
    }
    let x = cx.inputs.first().ok_or_else(|| invalid!("{} without an input", cx.op))?;
    if !matches!(x.dtype, DType::F32 | DType::F64) {
        return Err(cx.dtype_error(x.dtype));
    }
    if let Some(t) = cx.inputs.iter().chain(cx.outputs).find(|t| t.dtype != x.dtype) {
        return Err(invalid!("{} of {} with a {} operand", cx.op, x.dtype, t.dtype));
    }
    let a = cx.attrs;
    match cx.op {
        "DFT" => {
            cx.expect_arity(1..=1, 1)?;
            let axis = a.int("axis")? as usize;
            let rank = x.shape.len();
            if axis + 1 >= rank {
                return Err(invalid!("DFT axis {axis} of {:?}", x.shape));
            }
            let length = a.int("length")? as usize;
            let (inverse, onesided) = (a.int("inverse")? != 0, a.int("onesided")? != 0);
            let transform = Transform {
                outer: x.shape[..axis].iter().product(),
                n: x.shape[axis],
                inner: x.shape[axis + 1..rank - 1].iter().product(),
                parts: x.shape[rank - 1],
                length,
                inverse,
                onesided,
            };
            let y = &cx.outputs[0];
            let bins = if onesided && !inverse { length / 2 + 1 } else { length };
            let y_parts = if onesided && inverse { 1 } else { 2 };
            if y.elements() != transform.outer * bins * transform.inner * y_parts {
                return Err(invalid!("DFT output {:?} does not fit its input {:?}", y, x));
            }
            Ok(Box::new(Dft { transform, bins, y_parts }))
        }
        "STFT" => {
            cx.expect_arity(1..=2, 1)?;
            let (step, length) = (a.int("frame_step")? as usize, a.int("frame_length")? as usize);
            let onesided = a.int("onesided")? != 0;
            let &[batch, len, parts] = &x.shape[..] else {
                return Err(invalid!("STFT of a signal {:?}", x.shape));
            };
            if step == 0 || length == 0 || length > len {
                return Err(invalid!("STFT frames of {length} every {step} of {len}"));
            }
            if cx.inputs.get(1).is_some_and(|w| w.shape != [length]) {
                return Err(invalid!("STFT window {:?} for frames of {length}", cx.inputs[1]));
            }
            let frames = 1 + (len - length) / step;
            let bins = if onesided { length / 2 + 1 } else { length };
            if cx.outputs[0].shape != [batch, frames, bins, 2] {
                return Err(invalid!("STFT output {:?}", cx.outputs[0]));
            }
            Ok(Box::new(Stft { batch, len, parts, step, frames, length, bins }))
        }
        op => Err(KernelError::UnknownOp(op.to_string())),
    }
}

/// cos and sin of 2πj/length for j < length: the factor of bin k at sample t is entry
/// (k·t) mod length.
fn twiddles(length: usize) -> Vec<(f64, f64)> {
    (0..length).map(|j| (TAU * j as f64 / length as f64).sin_cos()).map(|(s, c)| (c, s)).collect()
}

/// One transform along the middle axis of `[outer, n, inner, parts]`.
struct Transform {
    outer: usize,
    n: usize,
    inner: usize,
    parts: usize,
    length: usize,
    inverse: bool,
    onesided: bool,
}

impl Transform {
    /// The signal at (o, i): `n` complex values.
    fn signal(&self, x: &[f64], o: usize, i: usize, s: &mut Vec<(f64, f64)>) {
        s.clear();
        s.extend((0..self.n).map(|t| {
            let at = ((o * self.n + t) * self.inner + i) * self.parts;
            (x[at], if self.parts == 2 { x[at + 1] } else { 0.0 })
        }));
    }
}

/// `bins` values of Σ_t s[t]·e^(∓2πi·k·t/length) (the sign − forward, + inverse).
fn transform(
    s: &[(f64, f64)],
    tw: &[(f64, f64)],
    bins: usize,
    inverse: bool,
    out: &mut [(f64, f64)],
) {
    let length = tw.len();
    let sign = if inverse { 1.0 } else { -1.0 };
    for (k, y) in out.iter_mut().enumerate().take(bins) {
        let (mut re, mut im) = (0.0, 0.0);
        for (t, &(a, b)) in s.iter().enumerate().take(length) {
            let (c, sn) = tw[(k * t) % length];
            let sn = sign * sn;
            re += a * c - b * sn;
            im += a * sn + b * c;
        }
        *y = (re, im);
    }
}

struct Dft {
    transform: Transform,
    bins: usize,
    y_parts: usize,
}

impl Kernel for Dft {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let t = &self.transform;
        let x = read_f64s(&inputs[0])?;
        if x.len() != t.outer * t.n * t.inner * t.parts {
            return Err(invalid!("DFT input of {} values", x.len()));
        }
        let length = t.length;
        let tw = twiddles(length);
        let mut y = vec![0.0; t.outer * self.bins * t.inner * self.y_parts];
        let (mut s, mut full, mut out) = (Vec::new(), Vec::new(), vec![(0.0, 0.0); length]);
        for o in 0..t.outer {
            for i in 0..t.inner {
                t.signal(&x, o, i, &mut s);
                if t.inverse && t.onesided {
                    // numpy's irfft: the bins past length/2 are the conjugates of the first.
                    full.clear();
                    full.extend((0..length).map(|k| {
                        let (m, conj) = if k <= length / 2 { (k, 1.0) } else { (length - k, -1.0) };
                        s.get(m).map_or((0.0, 0.0), |&(a, b)| (a, conj * b))
                    }));
                    transform(&full, &tw, length, true, &mut out);
                } else {
                    transform(&s, &tw, self.bins, t.inverse, &mut out);
                }
                let scale = if t.inverse { 1.0 / length as f64 } else { 1.0 };
                for (k, &(re, im)) in out.iter().enumerate().take(self.bins) {
                    let at = ((o * self.bins + k) * t.inner + i) * self.y_parts;
                    y[at] = re * scale;
                    if self.y_parts == 2 {
                        y[at + 1] = im * scale;
                    }
                }
            }
        }
        write_f64s(&mut outputs[0], &y)
    }
}

struct Stft {
    batch: usize,
    len: usize,
    parts: usize,
    step: usize,
    frames: usize,
    length: usize,
    bins: usize,
}

impl Kernel for Stft {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let x = read_f64s(&inputs[0])?;
        if x.len() != self.batch * self.len * self.parts {
            return Err(invalid!("STFT signal of {} values", x.len()));
        }
        let window = match inputs.get(1) {
            Some(w) => read_f64s(w)?,
            None => vec![1.0; self.length],
        };
        let tw = twiddles(self.length);
        let mut y = Vec::with_capacity(self.batch * self.frames * self.bins * 2);
        let (mut s, mut out) = (Vec::with_capacity(self.length), vec![(0.0, 0.0); self.bins]);
        for b in 0..self.batch {
            for f in 0..self.frames {
                s.clear();
                s.extend(window.iter().enumerate().map(|(t, &w)| {
                    let at = (b * self.len + f * self.step + t) * self.parts;
                    (w * x[at], if self.parts == 2 { w * x[at + 1] } else { 0.0 })
                }));
                transform(&s, &tw, self.bins, false, &mut out);
                y.extend(out.iter().flat_map(|&(re, im)| [re, im]));
            }
        }
        write_f64s(&mut outputs[0], &y)
    }
}

#[cfg(test)]
mod tests {
    use crate::cpu::eval;
    use crate::tensor::{Tensor, TensorDesc};
    use ingot_schema::{AttrValue, Attrs, DType};

    fn dft(x: &Tensor, length: i64, inverse: i64, onesided: i64, out: &[usize]) -> Vec<f32> {
        let attrs = Attrs::new()
            .with("axis", AttrValue::Int(0))
            .with("length", AttrValue::Int(length))
            .with("inverse", AttrValue::Int(inverse))
            .with("onesided", AttrValue::Int(onesided));
        let y = eval("DFT", &attrs, &[x], &[TensorDesc::new(DType::F32, out)]).unwrap();
        y[0].to_vec().unwrap()
    }

    fn close(got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-5, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn forward_inverse_and_one_sided_transforms() {
        // np.fft.fft([1, 2, 3, 4]) = [10, -2+2j, -2, -2-2j]
        let x = Tensor::from_vec(vec![4, 1], &[1f32, 2., 3., 4.]).unwrap();
        close(&dft(&x, 4, 0, 0, &[4, 2]), &[10., 0., -2., 2., -2., 0., -2., -2.]);
        // One-sided: the first 4 / 2 + 1 bins; zero-padded to 6: np.fft.rfft(x, 6).
        close(&dft(&x, 4, 0, 1, &[3, 2]), &[10., 0., -2., 2., -2., 0.]);
        let padded = dft(&x, 6, 0, 1, &[4, 2]);
        close(&padded[..2], &[10., 0.]);
        close(&padded[6..], &[-2., 0.]); // the Nyquist bin: 1 - 2 + 3 - 4
        // The inverse of the full spectrum gives the signal back, imaginary parts 0.
        let spectrum =
            Tensor::from_vec(vec![4, 2], &[10f32, 0., -2., 2., -2., 0., -2., -2.]).unwrap();
        close(&dft(&spectrum, 4, 1, 0, &[4, 2]), &[1., 0., 2., 0., 3., 0., 4., 0.]);
        // irfft of the one-sided half: real, length 2 * (3 - 1).
        let half = Tensor::from_vec(vec![3, 2], &[10f32, 0., -2., 2., -2., 0.]).unwrap();
        close(&dft(&half, 4, 1, 1, &[4, 1]), &[1., 2., 3., 4.]);
    }

    #[test]
    fn stft_frames_windows_and_transforms() {
        // Frames [1, 2], [3, 4] (step 2) of [1, 2, 3, 4, 5], window [1, 0.5]: one-sided DFTs of
        // [1, 1] and [3, 2]: [2, 0], [0, 0] and [5, 0], [1, 0].
        let x = Tensor::from_vec(vec![1, 5, 1], &[1f32, 2., 3., 4., 5.]).unwrap();
        let w = Tensor::from_vec(vec![2], &[1f32, 0.5]).unwrap();
        let attrs = Attrs::new()
            .with("frame_step", AttrValue::Int(2))
            .with("frame_length", AttrValue::Int(2))
            .with("onesided", AttrValue::Int(1));
        let out = TensorDesc::new(DType::F32, [1, 2, 2, 2]);
        let y = eval("STFT", &attrs, &[&x, &w], &[out]).unwrap();
        close(&y[0].to_vec::<f32>().unwrap(), &[2., 0., 0., 0., 5., 0., 1., 0.]);
    }
}
