//! TopK on every numeric element type. The order is a total one, so that every backend and
//! thread count gives the same answer: NaN above every number, equal values by index (the
//! lower first, as ONNX says). Output is always sorted, which `sorted = 0` allows.

use crate::cpu::parallel::try_for_each_chunk_pair;
use crate::cpu::{Kernel, KernelError, OpCx, input, output_mut, tensor_mut};
use crate::invalid;
use crate::lower::checked_product;
use crate::movement::cpu::by_numeric;
use crate::tensor::{Element, TensorMut, TensorRef};
use bytemuck::Zeroable;
use ingot_schema::DType;

pub fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    if cx.op != "TopK" {
        return Err(KernelError::UnknownOp(cx.op.to_string()));
    }
    // A run-time K is input 1, and its count output 2.
    let runtime_k = !cx.attrs.contains("k");
    let n = 1 + runtime_k as usize;
    cx.expect_arity(n..=n, n + 1)?;
    let x = &cx.inputs[0];
    if x.dtype == DType::Bool {
        return Err(cx.dtype_error(x.dtype));
    }
    let shape = super::output_shape(cx.attrs, &x.shape).map_err(|e| invalid!("TopK: {e}"))?;
    let (values, indices) = (&cx.outputs[0], &cx.outputs[1]);
    if values.dtype != x.dtype || indices.dtype != DType::I64 {
        return Err(invalid!(
            "TopK of {} gives {} values and int64 indices, got {} and {}",
            x.dtype,
            x.dtype,
            values.dtype,
            indices.dtype
        ));
    }
    let count_ok = cx.outputs.get(2).is_none_or(|c| c.dtype == DType::I64 && c.elements() == 1);
    let k_ok = cx.inputs.get(1).is_none_or(|k| k.dtype == DType::I64 && k.elements() == 1);
    if !count_ok || !k_ok {
        return Err(invalid!("TopK's run-time K and its count must be one int64 each"));
    }
    if values.shape != shape || indices.shape != shape {
        return Err(invalid!(
            "TopK declares outputs {:?} and {:?}, expected {shape:?}",
            values.shape,
            indices.shape
        ));
    }
    // `output_shape` checked the axis against the rank.
    let axis = cx.attrs.int("axis")? as usize;
    let dims = |d: &[usize]| checked_product(d).ok_or_else(|| invalid!("TopK: {d:?} overflows"));
    Ok(Box::new(TopK {
        n: x.shape[axis],
        inner: dims(&x.shape[axis + 1..])?,
        k: shape[axis],
        len: dims(&x.shape)?,
        out_len: dims(&shape)?,
        largest: cx.attrs.int("largest")? != 0,
        dtype: x.dtype,
        runtime_k,
    }))
}

/// X seen as [outer, n, inner], the lanes of n elements being what TopK selects from.
struct TopK {
    n: usize,
    inner: usize,
    k: usize,
    /// X's and each output's element counts.
    len: usize,
    out_len: usize,
    largest: bool,
    dtype: DType,
    /// K comes from input 1 at run time; `k` is then the whole dim, the bound of the
    /// outputs, of which the first K entries along the axis are written and the rest zeroed.
    runtime_k: bool,
}

impl Kernel for TopK {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let x = inputs.first().ok_or_else(|| invalid!("TopK's input is missing"))?;
        let k = match self.runtime_k {
            false => self.k,
            true => {
                let k = input::<i64>(inputs, 1, 1)?[0];
                let n = self.n;
                let k = usize::try_from(k).ok().filter(|&k| k <= n).ok_or_else(|| {
                    invalid!("K must be 0 to {n} (the input's dim along the axis), got {k}")
                })?;
                output_mut::<i64>(outputs, 2, 1)?[0] = k as i64;
                k
            }
        };
        let [values, indices, ..] = outputs else {
            return Err(invalid!("TopK writes 2 outputs, got {}", outputs.len()));
        };
        if x.dtype != self.dtype {
            return Err(invalid!("TopK was prepared for {}, got {}", self.dtype, x.dtype));
        }
        let (len, out_len) = (self.len, self.out_len);
        let indices = tensor_mut::<i64>(indices, out_len)?;
        by_numeric!(self.dtype, T => {
            let x = x.as_slice::<T>()?;
            if x.len() != len {
                return Err(invalid!("TopK's input has {} elements, expected {len}", x.len()));
            }
            let values = tensor_mut::<T>(values, out_len)?;
            if k < self.k {
                values.fill(T::zeroed());
                indices.fill(0);
            }
            self.select(x, k, values, indices)
        })
    }
}

/// Input elements a TopK task ranks (whole blocks): enough to be worth another thread.
const TASK_ELEMENTS: usize = 1 << 14;

impl TopK {
    /// Writes each lane's first k elements in the order, and their indices, one block of
    /// `outer` at a time.
    fn select<T: Rank>(
        &self,
        x: &[T],
        k: usize,
        values: &mut [T],
        indices: &mut [i64],
    ) -> Result<(), KernelError> {
        // Blocks of the outputs are `self.k` entries long along the axis, of which k written.
        let (n, inner) = (self.n, self.inner);
        // Also k = 0: nothing to select (and no k - 1 below).
        if values.is_empty() || k == 0 {
            return Ok(());
        }
        // Whole blocks per task, enough of them to be worth another thread.
        let per_task = (TASK_ELEMENTS / (n * inner).max(1)).max(1);
        let out = self.k * inner;
        let chunks = (per_task * out, per_task * out);
        try_for_each_chunk_pair((values, indices), chunks, &|t, values, indices| {
            let mut order: Vec<(u64, usize)> = Vec::with_capacity(n);
            let blocks = values.chunks_exact_mut(out).zip(indices.chunks_exact_mut(out));
            for (j, (values, indices)) in blocks.enumerate() {
                let x = &x[(t * per_task + j) * n * inner..][..n * inner];
                for i in 0..inner {
                    // Ascending (key, index): the largest first by the inverted key; ties go
                    // to the lower index either way.
                    let flip = if self.largest { u64::MAX } else { 0 };
                    order.clear();
                    order.extend(x[i..].iter().step_by(inner).map(|v| v.key() ^ flip).zip(0..n));
                    if k < n {
                        order.select_nth_unstable(k - 1);
                    }
                    order[..k].sort_unstable();
                    for (j, &(_, at)) in order[..k].iter().enumerate() {
                        values[j * inner + i] = x[at * inner + i];
                        indices[j * inner + i] = at as i64;
                    }
                }
            }
            Ok(())
        })
    }
}

/// The order TopK ranks by as a key whose unsigned order is it: numbers as usual, NaN above
/// every number (and equal to NaN), -0 equal to 0. Lanes sort as (key, index) pairs, one
/// sort for every element type.
trait Rank: Element {
    fn key(self) -> u64;
}

macro_rules! rank_signed {
    ($($t:ty),*) => {$(
        impl Rank for $t {
            fn key(self) -> u64 {
                (self as i64 as u64) ^ (1 << 63)
            }
        }
    )*};
}
rank_signed!(i8, i16, i32, i64);

macro_rules! rank_unsigned {
    ($($t:ty),*) => {$(
        impl Rank for $t {
            fn key(self) -> u64 {
                self as u64
            }
        }
    )*};
}
rank_unsigned!(u8, u16, u32, u64);

/// A float's key through f64 (exact from f16 and f32): the sign bit flips the order of the
/// magnitudes below it.
fn float_key(x: f64) -> u64 {
    if x.is_nan() {
        return u64::MAX;
    }
    let bits = (x + 0.0).to_bits(); // -0 + 0 is +0
    if bits >> 63 == 1 { !bits } else { bits | 1 << 63 }
}

impl Rank for f32 {
    fn key(self) -> u64 {
        float_key(self.into())
    }
}

impl Rank for f64 {
    fn key(self) -> u64 {
        float_key(self)
    }
}

impl Rank for half::f16 {
    fn key(self) -> u64 {
        float_key(self.to_f64())
    }
}

#[cfg(test)]
mod tests {
    use crate::cpu::eval;
    use crate::tensor::{Element, Tensor, TensorDesc};
    use ingot_schema::{AttrValue, Attrs, DType};

    #[test]
    fn a_run_time_k_fills_that_many_entries_of_the_whole_dim() {
        let mut a = attrs(0, 1, true);
        a.remove("k");
        let x = Tensor::from_vec(vec![2, 3], &[1.0f32, 3.0, 2.0, 6.0, 5.0, 4.0]).unwrap();
        let outs = [
            TensorDesc::new(DType::F32, [2, 3]),
            TensorDesc::new(DType::I64, [2, 3]),
            TensorDesc::new(DType::I64, []),
        ];
        let k = |v: i64| Tensor::from_vec(vec![1], &[v]).unwrap();
        let got = eval("TopK", &a, &[&x, &k(2)], &outs).unwrap();
        // Each row's two largest, then zeros up to the bound of 3.
        assert_eq!(got[0].to_vec::<f32>().unwrap(), [3.0, 2.0, 0.0, 6.0, 5.0, 0.0]);
        assert_eq!(got[1].to_vec::<i64>().unwrap(), [1, 2, 0, 0, 1, 0]);
        assert_eq!(got[2].to_vec::<i64>().unwrap(), [2]);
        let err = eval("TopK", &a, &[&x, &k(4)], &outs).unwrap_err().to_string();
        assert!(err.contains("K must be 0 to 3"), "{err}");
    }

    fn attrs(k: i64, axis: i64, largest: bool) -> Attrs {
        Attrs::new()
            .with("k", AttrValue::Int(k))
            .with("axis", AttrValue::Int(axis))
            .with("largest", AttrValue::Int(largest.into()))
            .with("sorted", AttrValue::Int(1))
    }

    /// Values and indices of TopK over `x` of `shape`, canonical attributes.
    fn top<T: Element>(x: &[T], shape: &[usize], a: &Attrs) -> (Vec<T>, Vec<i64>) {
        let mut out = shape.to_vec();
        let axis = a.int("axis").unwrap() as usize;
        out[axis] = a.int("k").unwrap() as usize;
        let outs = [TensorDesc::new(T::DTYPE, out.clone()), TensorDesc::new(DType::I64, out)];
        let x = Tensor::from_vec(shape.to_vec(), x).unwrap();
        let got = eval("TopK", a, &[&x], &outs).unwrap();
        (got[0].to_vec().unwrap(), got[1].to_vec().unwrap())
    }

    #[test]
    fn ties_go_to_the_lower_index() {
        let x = [1i32, 3, 2, 3, 1, 3];
        assert_eq!(top(&x, &[6], &attrs(4, 0, true)), (vec![3, 3, 3, 2], vec![1, 3, 5, 2]));
        assert_eq!(top(&x, &[6], &attrs(3, 0, false)), (vec![1, 1, 2], vec![0, 4, 2]));
        // -0 and +0 are equal: by index.
        let z = [0.0f32, -0.0, 0.0];
        assert_eq!(top(&z, &[3], &attrs(3, 0, true)).1, [0, 1, 2]);
    }

    #[test]
    fn keys_keep_the_order_of_values() {
        use super::Rank;
        let increasing = |keys: Vec<u64>| keys.windows(2).all(|w| w[0] < w[1]);
        assert!(increasing([i8::MIN, -1, 0, 1, i8::MAX].map(Rank::key).to_vec()));
        assert!(increasing([i64::MIN, -1, 0, 1, i64::MAX].map(Rank::key).to_vec()));
        assert!(increasing([0, 1, u64::MAX - 1, u64::MAX].map(Rank::key).to_vec()));
        let (tiny, inf) = (f32::from_bits(1), f32::INFINITY);
        assert!(increasing(
            [-inf, -1.0, -tiny, 0.0, tiny, 1.0, inf, f32::NAN].map(Rank::key).to_vec()
        ));
        assert_eq!((-0.0f32).key(), 0.0f32.key());
        assert_eq!((-f64::NAN).key(), f64::NAN.key());
    }

    #[test]
    fn nan_is_above_every_number() {
        let nan = f32::NAN;
        let x = [1.0, nan, f32::INFINITY, -2.0, nan];
        let (v, i) = top(&x, &[5], &attrs(3, 0, true));
        assert!(v[0].is_nan() && v[1].is_nan() && v[2] == f32::INFINITY, "{v:?}");
        assert_eq!(i, [1, 4, 2]);
        let (v, i) = top(&x, &[5], &attrs(5, 0, false));
        assert_eq!((&v[..3], &i[..]), (&[-2.0, 1.0, f32::INFINITY][..], &[3, 0, 2, 1, 4][..]));
        let h = [half::f16::NAN, half::f16::ONE, half::f16::ZERO];
        assert_eq!(top(&h, &[3], &attrs(2, 0, false)).1, [2, 1]);
    }

    /// Axis 0 of [3, 2] (the lowered form of axis -2): lanes are strided.
    #[test]
    fn an_outer_axis_reads_strided_lanes() {
        let x = [5.0f64, 0.0, 1.0, 7.0, 3.0, 2.0];
        let (v, i) = top(&x, &[3, 2], &attrs(2, 0, true));
        assert_eq!((v, i), (vec![5.0, 7.0, 3.0, 2.0], vec![0, 1, 2, 2]));
    }

    #[test]
    fn smallest_full_dim_and_empty() {
        let x = [u64::MAX, 4, 9, 0, 4, 1];
        assert_eq!(
            top(&x, &[2, 3], &attrs(3, 1, false)),
            (vec![4, 9, u64::MAX, 0, 1, 4], vec![1, 2, 0, 0, 2, 1])
        );
        assert_eq!(top(&x, &[2, 3], &attrs(1, 1, true)), (vec![u64::MAX, 4], vec![0, 1]));
        assert_eq!(top(&x, &[2, 3], &attrs(0, 1, true)), (vec![], vec![]));
        let i8s = [-1i8, 5, -7];
        assert_eq!(top(&i8s, &[3], &attrs(2, 0, false)), (vec![-7, -1], vec![2, 0]));
    }

    #[test]
    fn bad_steps_are_refused() {
        let x = Tensor::from_vec(vec![2, 3], &[0f32; 6]).unwrap();
        let out = |s: &[usize]| {
            [TensorDesc::new(DType::F32, s.to_vec()), TensorDesc::new(DType::I64, s.to_vec())]
        };
        let err = eval("TopK", &attrs(4, 1, true), &[&x], &out(&[2, 4])).unwrap_err();
        assert!(err.to_string().contains("K must be 0 to 3"), "{err}");
        let err = eval("TopK", &attrs(1, 2, true), &[&x], &out(&[2, 1])).unwrap_err();
        assert!(err.to_string().contains("out of range"), "{err}");
        let err = eval("TopK", &attrs(2, 1, true), &[&x], &out(&[2, 3])).unwrap_err();
        assert!(err.to_string().contains("expected [2, 2]"), "{err}");
        let b = Tensor::from_bools(vec![2], &[true, false]).unwrap();
        let bools = [TensorDesc::new(DType::Bool, [1]), TensorDesc::new(DType::I64, [1])];
        let err = eval("TopK", &attrs(1, 0, true), &[&b], &bools).unwrap_err();
        assert!(err.to_string().contains("not supported by TopK"), "{err}");
    }
}
