//! Attention, float32 or float16 (attn_mask of Q's type or bool, nonpad_kv_seqlen int64), as ONNX's
//! reference computes it: per (batch, query head), scores = (Q·√scale)(K·√scale)ᵀ over the
//! caches' and this step's keys, soft-capped, plus the additive bias (mask, causal and window
//! frontiers, key padding), a softmax (in f64 where softmax_precision asks), a row whose bias
//! is all -inf set to zeros, then the probabilities times V. Both products are the CPU GEMM.
//! Float16 operands are computed in f32 and rounded once at the end (the reference rounds
//! at every step; the two agree within the tests' tolerance).

use super::geometry::Geometry;
use crate::cpu::gemm::{Layout, gemm};
use crate::cpu::parallel::try_for_each_chunk_pair;
use crate::cpu::{Kernel, KernelError, OpCx, input_f32, tensor_mut};
use crate::elementwise::cpu::tanh_f32;
use crate::invalid;
use crate::tensor::{TensorMut, TensorRef};
use half::f16;
use ingot_schema::DType;
use std::borrow::Cow;

pub fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    if cx.op != "Attention" {
        return Err(KernelError::UnknownOp(cx.op.to_string()));
    }
    if cx.inputs.len() < 3 || !(1..=4).contains(&cx.outputs.len()) {
        return Err(invalid!(
            "Attention takes 3 to 7 inputs and 1 to 4 outputs, got {} and {}",
            cx.inputs.len(),
            cx.outputs.len()
        ));
    }
    let shapes: Vec<&[usize]> = cx.inputs.iter().map(|d| d.shape.as_slice()).collect();
    let g = Geometry::new(cx.attrs, &shapes).map_err(|e| invalid!("Attention: {e}"))?;
    let int = |name| cx.attrs.int(name);
    let has_past = int("has_past_kv")? != 0;
    // Which input each optional operand is, and the element types each may have.
    let mask_at = g.mask.map(|_| 3);
    let past_at = has_past.then_some(3 + usize::from(g.mask.is_some()));
    let mut floats: Vec<usize> = vec![0, 1, 2];
    floats.extend(past_at.iter().flat_map(|&p| [p, p + 1]));
    let t = cx.inputs[0].dtype;
    let half = match t {
        DType::F32 => false,
        DType::F16 => true,
        t => return Err(cx.dtype_error(t)),
    };
    if let Some(d) = floats.iter().map(|&i| &cx.inputs[i]).chain(cx.outputs).find(|d| d.dtype != t)
    {
        return Err(invalid!("Attention's Q is {t} but an operand or output is {}", d.dtype));
    }
    let bool_mask = match mask_at.map(|i| cx.inputs[i].dtype) {
        Some(DType::Bool) => true,
        Some(m) if m == t => false,
        None => false,
        Some(m) => return Err(invalid!("Attention attn_mask must be bool or {t}, got {m}")),
    };
    if let Some(n) = g.nonpad.then(|| cx.inputs.last()).flatten().filter(|d| d.dtype != DType::I64)
    {
        return Err(invalid!("Attention nonpad_kv_seqlen must be int64, got {}", n.dtype));
    }
    let expected = [g.y_shape(), g.present_key_shape(), g.present_value_shape(), g.qk_shape()];
    for (d, want) in cx.outputs.iter().zip(&expected) {
        if d.shape != *want {
            return Err(invalid!("Attention declares an output {:?}, expected {want:?}", d.shape));
        }
    }
    let softcap = cx.attrs.float("softcap")?;
    let mode = int("qk_matmul_output_mode")?;
    // The reference scales Q and K by √scale each, rounded to the element type.
    let scale = (cx.attrs.float("scale")? as f64).sqrt() as f32;
    let scale = if half { f16::from_f32(scale).to_f32() } else { scale };
    Ok(Box::new(Attention {
        g,
        half,
        bool_mask,
        past_at,
        causal: int("is_causal")? != 0,
        scale,
        softcap: (softcap > 0.0).then_some(softcap),
        mode,
        wide_softmax: int("softmax_precision")? == 11,
        window: (int("left_window_size")?, int("right_window_size")?),
    }))
}

struct Attention {
    g: Geometry,
    /// Float16 operands and outputs, computed in f32 (rounded once, at the end).
    half: bool,
    bool_mask: bool,
    past_at: Option<usize>,
    causal: bool,
    scale: f32,
    softcap: Option<f32>,
    mode: i64,
    /// Softmax in f64 (softmax_precision = double).
    wide_softmax: bool,
    /// (left, right); -1 leaves a side unbounded.
    window: (i64, i64),
}

/// The mask's values, one element per position of its (broadcast) shape.
enum Mask<'a> {
    Float(Cow<'a, [f32]>),
    Bool(&'a [u8]),
}

impl Kernel for Attention {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let g = &self.g;
        let numel = |s: Vec<usize>| s.iter().product::<usize>();
        let float = |i: usize, len: usize| -> Result<Cow<[f32]>, KernelError> {
            if !self.half {
                return input_f32(inputs, i, len).map(Cow::Borrowed);
            }
            let t = inputs.get(i).ok_or_else(|| invalid!("input {i} is missing"))?;
            let s = t.as_slice::<f16>()?;
            if s.len() != len {
                return Err(invalid!("input {i} has {} elements, expected {len}", s.len()));
            }
            Ok(Cow::Owned(s.iter().map(|x| x.to_f32()).collect()))
        };
        let q = float(0, numel(g.q_shape()))?;
        let k = float(1, numel(g.k_shape()))?;
        let v = float(2, numel(g.v_shape()))?;
        let mask = match g.mask {
            None => None,
            Some(m) => {
                let n = m.iter().product();
                Some(if self.bool_mask {
                    let t = inputs.get(3).ok_or_else(|| invalid!("attn_mask is missing"))?;
                    let s = t.as_slice::<u8>()?;
                    if s.len() != n {
                        return Err(invalid!("attn_mask has {} elements, expected {n}", s.len()));
                    }
                    Mask::Bool(s)
                } else {
                    Mask::Float(float(3, n)?)
                })
            }
        };
        let (t, per_kv) = (g.total(), g.batch * g.kv_heads);
        let past = match self.past_at {
            Some(p) => Some((
                float(p, per_kv * g.past * g.head)?,
                float(p + 1, per_kv * g.past * g.v_head)?,
            )),
            None => None,
        };
        let nonpad = match g.nonpad {
            true => {
                let n = inputs.last().ok_or_else(|| invalid!("nonpad_kv_seqlen is missing"))?;
                let n = n.as_slice::<i64>()?;
                if n.len() != g.batch {
                    return Err(invalid!("nonpad_kv_seqlen has {} elements", n.len()));
                }
                Some(n)
            }
            false => None,
        };
        // The caches with this step's keys and values appended, [batch, kv_heads, T, head].
        let present = |cache: Option<&[f32]>, new: &[f32], head: usize| {
            let mut out = vec![0f32; per_kv * t * head];
            if out.is_empty() {
                return out;
            }
            for (bh, rows) in out.chunks_exact_mut(t * head).enumerate() {
                let (b, h) = (bh / g.kv_heads, bh % g.kv_heads);
                let old = g.past * head;
                if let Some(c) = cache {
                    rows[..old].copy_from_slice(&c[bh * old..(bh + 1) * old]);
                }
                let (at, stride) = g.row(g.kv_heads, g.kv_new, head, b, h);
                for (l, row) in rows[old..].chunks_exact_mut(head).enumerate() {
                    row.copy_from_slice(&new[at + l * stride..][..head]);
                }
            }
            out
        };
        let pk = present(past.as_ref().map(|p| &*p.0), &k, g.head);
        let pv = present(past.as_ref().map(|p| &*p.1), &v, g.v_head);

        // One task per (batch, query head): its rows of Y, and of qk_matmul_output where
        // that is asked for.
        let heads = g.batch * g.q_heads;
        let rows_len = g.q_seq * g.v_head;
        let qk_len = if outputs.len() == 4 { g.q_seq * g.total() } else { 0 };
        let (mut rows, mut qk) = (vec![0f32; heads * rows_len], vec![0f32; heads * qk_len]);
        try_for_each_chunk_pair((&mut rows, &mut qk), (rows_len, qk_len), &|bh, y, qk| {
            self.block(bh, (&q, &pk, &pv), mask.as_ref(), nonpad, (y, qk))
        })?;

        let mut y = vec![0f32; numel(g.y_shape())];
        for (bh, rows) in rows.chunks_exact(rows_len.max(1)).enumerate() {
            let (at, stride) = g.row(g.q_heads, g.q_seq, g.v_head, bh / g.q_heads, bh % g.q_heads);
            for (i, row) in rows.chunks_exact(g.v_head.max(1)).enumerate() {
                y[at + i * stride..][..g.v_head].copy_from_slice(row);
            }
        }
        for (o, values) in outputs.iter_mut().zip([&y, &pk, &pv, &qk]) {
            if self.half {
                let out = tensor_mut::<f16>(o, values.len())?;
                out.iter_mut().zip(values.iter()).for_each(|(o, &x)| *o = f16::from_f32(x));
            } else {
                tensor_mut::<f32>(o, values.len())?.copy_from_slice(values);
            }
        }
        Ok(())
    }
}

impl Attention {
    /// Writes Y's rows [S, v_head] of one (batch, head) into `y`, and the scores the mode
    /// asks for [S, T] into `qk` unless it is empty.
    fn block(
        &self,
        bh: usize,
        (q, pk, pv): (&[f32], &[f32], &[f32]),
        mask: Option<&Mask>,
        nonpad: Option<&[i64]>,
        (y, qk): (&mut [f32], &mut [f32]),
    ) -> Result<(), KernelError> {
        let g = &self.g;
        let (b, h) = (bh / g.q_heads, bh % g.q_heads);
        let (s, t, d, dv) = (g.q_seq, g.total(), g.head, g.v_head);
        // Grouped heads: each key/value head serves q_heads / kv_heads query heads in turn.
        let kvh = b * g.kv_heads + h / (g.q_heads / g.kv_heads);
        let (at, stride) = g.row(g.q_heads, s, d, b, h);
        let mut qs = vec![0f32; s * d];
        for (i, row) in qs.chunks_exact_mut(d.max(1)).enumerate() {
            for (x, &e) in row.iter_mut().zip(&q[at + i * stride..][..d]) {
                *x = e * self.scale;
            }
        }
        let ks: Vec<f32> = pk[kvh * t * d..][..t * d].iter().map(|&e| e * self.scale).collect();
        let mut scores = vec![0f32; s * t];
        let k_t = Layout::new(d, t, 1, d);
        gemm(
            1.0,
            &qs,
            Layout::row_major(s, d),
            &ks,
            k_t,
            0.0,
            &mut scores,
            Layout::row_major(s, t),
        )?;
        if let Some(c) = self.softcap {
            scores.iter_mut().for_each(|x| *x = tanh_f32(*x / c) * c);
        }
        let wants_qk = !qk.is_empty();
        if wants_qk && self.mode != 3 {
            qk.copy_from_slice(&scores);
        }
        // The query block's frontier: keys before it in the cache, or per batch entry the
        // valid keys less the queries when nonpad_kv_seqlen says where the keys end.
        let offset = match nonpad {
            Some(n) if g.past == 0 => n[b] - s as i64,
            _ => g.past as i64,
        };
        let (left, right) = self.window;
        let cut = |allowed: bool| if allowed { 0.0 } else { f32::NEG_INFINITY };
        let mut bias = vec![0f32; t];
        let mut probs = vec![0f32; s * t];
        for i in 0..s {
            for (j, bj) in bias.iter_mut().enumerate() {
                *bj = match (mask, g.mask) {
                    (Some(m), Some([mb, mh, ms, cols])) if j < cols => {
                        let at = (((b % mb) * mh + h % mh) * ms + i % ms) * cols + j;
                        match m {
                            Mask::Float(m) => m[at],
                            Mask::Bool(m) => cut(m[at] != 0),
                        }
                    }
                    (Some(_), _) => f32::NEG_INFINITY,
                    (None, _) => 0.0,
                };
                let (i, j) = (i as i64, j as i64);
                // Query i's own frontier, as the spec says, even where the mask broadcasts
                // over queries (ONNX's reference then gives every row query 0's frontier; no
                // node test has the case).
                if self.causal {
                    *bj += cut(j <= i + offset);
                }
                if left >= 0 || right >= 0 {
                    let diff = i + offset - j;
                    *bj += cut((left < 0 || diff <= left) && (right < 0 || -diff <= right));
                }
                if let Some(n) = nonpad {
                    *bj += cut(j < n[b]);
                }
            }
            let row = &mut scores[i * t..(i + 1) * t];
            row.iter_mut().zip(&bias).for_each(|(x, &bj)| *x += bj);
            if wants_qk && self.mode == 2 {
                qk[i * t..(i + 1) * t].copy_from_slice(row);
            }
            let p = &mut probs[i * t..(i + 1) * t];
            // A row whose bias masks every key has no attendable key: zeros, whatever its
            // scores (a NaN in the bias does not count as masked, as numpy's max says).
            if max_nan(bias.iter().copied()) != f32::NEG_INFINITY {
                if self.wide_softmax {
                    let wide: Vec<f64> = row.iter().map(|&x| x as f64).collect();
                    softmax(&wide, |k, x: f64| p[k] = x as f32);
                } else {
                    softmax(row, |k, x: f32| p[k] = x);
                }
            }
        }
        if wants_qk && self.mode == 3 {
            qk.copy_from_slice(&probs);
        }
        let v_h = &pv[kvh * t * dv..][..t * dv];
        gemm(
            1.0,
            &probs,
            Layout::row_major(s, t),
            v_h,
            Layout::row_major(t, dv),
            0.0,
            y,
            Layout::row_major(s, dv),
        )
    }
}

/// The largest of `xs`, NaN if any is (numpy's `max`); -inf when empty.
fn max_nan<T: num_like::Float>(xs: impl Iterator<Item = T>) -> T {
    xs.fold(T::NEG_INFINITY, |m, x| if m.is_nan() || x.is_nan() { T::NAN } else { m.max(x) })
}

/// The reference's softmax of one row, each result handed to `put`: an all -inf row gives
/// zeros rather than NaNs.
fn softmax<T: num_like::Float>(row: &[T], mut put: impl FnMut(usize, T)) {
    let max = max_nan(row.iter().copied());
    let max = if max == T::NEG_INFINITY { T::ZERO } else { max };
    let exps: Vec<T> = row.iter().map(|&x| (x - max).exp()).collect();
    let sum = exps.iter().fold(T::ZERO, |a, &e| a + e);
    let sum = if sum == T::ZERO { T::ONE } else { sum };
    exps.iter().enumerate().for_each(|(k, &e)| put(k, e / sum));
}

/// The few float operations the softmax needs, for f32 and f64.
mod num_like {
    use std::ops::{Add, Div, Sub};

    pub trait Float:
        Copy + PartialEq + Add<Output = Self> + Sub<Output = Self> + Div<Output = Self>
    {
        const NEG_INFINITY: Self;
        const NAN: Self;
        const ZERO: Self;
        const ONE: Self;
        fn is_nan(self) -> bool;
        fn max(self, other: Self) -> Self;
        fn exp(self) -> Self;
    }

    macro_rules! float {
        ($($t:ty),*) => {$(
            impl Float for $t {
                const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
                const NAN: Self = <$t>::NAN;
                const ZERO: Self = 0.0;
                const ONE: Self = 1.0;
                fn is_nan(self) -> bool {
                    <$t>::is_nan(self)
                }
                fn max(self, other: Self) -> Self {
                    <$t>::max(self, other)
                }
                fn exp(self) -> Self {
                    <$t>::exp(self)
                }
            }
        )*};
    }
    float!(f32, f64);
}

#[cfg(test)]
mod tests {
    use crate::attention::geometry::canonical;
    use crate::cpu::eval;
    use crate::tensor::{Tensor, TensorDesc};
    use ingot_schema::{AttrValue, Attrs, DType};

    fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_vec(shape.to_vec(), v).unwrap()
    }

    fn close(got: &Tensor, want: &[f32]) {
        let got = got.as_slice::<f32>().unwrap();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!(g == w || (g - w).abs() <= 1e-5 * w.abs().max(1.0), "{got:?} vs {want:?}");
        }
    }

    fn with(a: Attrs, pairs: &[(&str, AttrValue)]) -> Attrs {
        pairs.iter().fold(a, |a, (k, v)| a.with(k, v.clone()))
    }

    /// Grouped heads over a past cache, a float mask, the causal frontier after the cache
    /// and soft-capping; qk_matmul_output with the bias (mode 2). ONNX's reference:
    /// ```python
    /// from onnx.reference.ops.op_attention import _compute_attention as att
    /// q = (np.arange(8, dtype=np.float32).reshape(1, 2, 2, 2) - 3) / 4
    /// k = (np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2) - 1) / 2
    /// v = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)
    /// pk = np.array([[[[0.5, -1.0]]]], np.float32); pv = np.array([[[[2.0, -2.0]]]], np.float32)
    /// mask = np.array([[0.0, -1.0, 0.5], [0.25, 0.0, 1.0]], np.float32)
    /// y, prk, prv, qk = att(q, k, v, mask, pk, pv, is_causal=1, softcap=2.0,
    ///                       qk_matmul_output_mode=2)
    /// ```
    #[test]
    fn gqa_with_cache_mask_causal_and_softcap() {
        let q: Vec<f32> = (0..8).map(|x| (x as f32 - 3.0) / 4.0).collect();
        let k: Vec<f32> = (0..4).map(|x| (x as f32 - 1.0) / 2.0).collect();
        let v: Vec<f32> = (0..4).map(|x| x as f32).collect();
        // The default scale of a head of 2: 1/sqrt(2).
        let a = with(
            canonical(true, true, false, (2, 1)),
            &[
                ("is_causal", AttrValue::Int(1)),
                ("softcap", AttrValue::Float(2.0)),
                ("qk_matmul_output_mode", AttrValue::Int(2)),
                ("scale", AttrValue::Float(1.0 / 2f64.sqrt())),
            ],
        );
        let inputs = [
            f32s(&[1, 2, 2, 2], &q),
            f32s(&[1, 1, 2, 2], &k),
            f32s(&[1, 1, 2, 2], &v),
            f32s(&[2, 3], &[0.0, -1.0, 0.5, 0.25, 0.0, 1.0]),
            f32s(&[1, 1, 1, 2], &[0.5, -1.0]),
            f32s(&[1, 1, 1, 2], &[2.0, -2.0]),
        ];
        let outs = [[1, 2, 2, 2], [1, 1, 3, 2], [1, 1, 3, 2], [1, 2, 2, 3]]
            .map(|s| TensorDesc::new(DType::F32, s.to_vec()));
        let got = eval("Attention", &a, &inputs.iter().collect::<Vec<_>>(), &outs).unwrap();
        let y = [1.39047, -1.085705, 1.540672, 1.3049711, 1.39047, -1.085705, 1.8148913, 2.31421];
        close(&got[0], &y);
        close(&got[1], &[0.5, -1., -0.5, 0., 0.5, 1.]);
        close(&got[2], &[2., -2., 0., 1., 2., 3.]);
        let inf = f32::NEG_INFINITY;
        let qk = [
            0.08833084,
            -0.73637784,
            inf,
            0.16166914,
            0.08833086,
            0.91166914,
            -0.2636222,
            -1.0883309,
            inf,
            -0.18488643,
            -0.2636222,
            1.9022884,
        ];
        close(&got[3], &qk);
    }

    /// 3-D inputs, a bool mask that masks all of the first query's keys: its row of Y and
    /// of the probabilities (mode 3) are zeros, not NaN.
    /// ```python
    /// q3 = (np.arange(8, dtype=np.float32).reshape(1, 2, 4) - 4) / 3
    /// k3 = (np.arange(12, dtype=np.float32).reshape(1, 3, 4) - 6) / 5
    /// v3 = np.arange(12, dtype=np.float32).reshape(1, 3, 4) / 4
    /// m = np.array([[False, False, False], [True, False, True]])
    /// y, _, _, qk = att(q3, k3, v3, m, q_num_heads=2, kv_num_heads=2,
    ///                   qk_matmul_output_mode=3, scale=0.5)
    /// ```
    #[test]
    fn a_fully_masked_row_is_zeros() {
        let q: Vec<f32> = (0..8).map(|x| (x as f32 - 4.0) / 3.0).collect();
        let k: Vec<f32> = (0..12).map(|x| (x as f32 - 6.0) / 5.0).collect();
        let v: Vec<f32> = (0..12).map(|x| x as f32 / 4.0).collect();
        let a = with(
            canonical(true, false, false, (2, 2)),
            &[("qk_matmul_output_mode", AttrValue::Int(3)), ("scale", AttrValue::Float(0.5))],
        );
        let mask = Tensor::from_bools(vec![2, 3], &[false, false, false, true, false, true]);
        let mask = mask.unwrap();
        let inputs = [f32s(&[1, 2, 4], &q), f32s(&[1, 3, 4], &k), f32s(&[1, 3, 4], &v), mask];
        let outs = [vec![1, 2, 4], vec![1, 2, 3, 2], vec![1, 2, 3, 2], vec![1, 2, 2, 3]]
            .map(|s| TensorDesc::new(DType::F32, s));
        let got = eval("Attention", &a, &inputs.iter().collect::<Vec<_>>(), &outs).unwrap();
        close(&got[0], &[0., 0., 0., 0., 1.1325488, 1.3825488, 2.082783, 2.332783]);
        let qk = [0., 0., 0., 0.43372563, 0., 0.5662744, 0., 0., 0., 0.20860855, 0., 0.7913915];
        close(&got[3], &qk);
    }

    /// nonpad_kv_seqlen under the query count puts the causal frontier before every key:
    /// all rows are masked, and come out zero.
    #[test]
    fn keys_before_the_frontier_only() {
        let a = with(canonical(false, false, true, (1, 1)), &[("is_causal", AttrValue::Int(1))]);
        let ones = f32s(&[1, 1, 2, 2], &[1.0; 4]);
        let lens = Tensor::from_vec(vec![1], &[1i64]).unwrap();
        let out = [TensorDesc::new(DType::F32, vec![1, 1, 2, 2])];
        let got = eval("Attention", &a, &[&ones, &ones, &ones, &lens], &out).unwrap();
        // Query 0 sees keys j <= 0 + (1 - 2): none; query 1 sees key 0 (which is valid).
        close(&got[0], &[0., 0., 1., 1.]);
    }

    #[test]
    fn wrong_types_and_shapes_are_refused() {
        let a = canonical(false, false, false, (1, 1));
        let x = Tensor::from_vec(vec![1, 1, 2, 2], &[1f64; 4]).unwrap();
        let out = [TensorDesc::new(DType::F64, vec![1, 1, 2, 2])];
        let err = eval("Attention", &a, &[&x, &x, &x], &out).unwrap_err();
        assert!(err.to_string().contains("f64 is not supported by Attention"), "{err}");
        let x = f32s(&[1, 1, 2, 2], &[1.0; 4]);
        let out = [TensorDesc::new(DType::F32, vec![1, 1, 2, 3])];
        let err = eval("Attention", &a, &[&x, &x, &x], &out).unwrap_err();
        assert!(err.to_string().contains("expected [1, 1, 2, 2]"), "{err}");
        let err = eval("Attention", &canonical(true, false, false, (1, 1)), &[&x, &x, &x], &out);
        assert!(err.unwrap_err().to_string().contains("expects 4 inputs"));
    }
}
