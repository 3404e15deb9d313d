//! Reductions and the ops that work along one axis: `Reduce*`, `ArgMax`/`ArgMin` (in
//! `reduce/arg.rs`) and `Softmax`/`LogSoftmax`/`Hardmax` (in `reduce/softmax.rs`).
//!
//! Canonical attributes (filled in by `ops/src/reduce/mod.rs`):
//! - `Reduce*`: `axes` (sorted, distinct, non-negative; an empty list reduces over no axis,
//!   so every output element folds exactly one input element: ONNX's
//!   `noop_with_empty_axes=1`), `keepdims` (0/1). One input: the axes operand is gone.
//! - `ArgMax`/`ArgMin`: `axis` (non-negative), `keepdims`, `select_last_index`.
//! - `Softmax`/`LogSoftmax`/`Hardmax`: `axis` (non-negative) and `coerce_2d`: 1 means the
//!   opset < 13 form, which works on the input flattened to 2-D at `axis` (over all axes from
//!   `axis` on); 0 means along `axis` alone.

use crate::cpu::{Kernel, KernelError, OpCx};
use crate::invalid;
use crate::tensor::{Element, TensorMut, TensorRef};
use ingot_schema::DType;

mod arg;
mod softmax;

pub fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    match cx.op {
        "ArgMax" | "ArgMin" => arg::prepare(cx),
        "Softmax" | "LogSoftmax" | "Hardmax" | "LpNormalization" => softmax::prepare(cx),
        op if Kind::of(op).is_some() => prepare_reduce(cx),
        op => Err(KernelError::UnknownOp(op.to_string())),
    }
}

/// Checks that the (single) output is declared with `dtype` and `shape`.
fn check_output(cx: &OpCx, dtype: DType, shape: &[usize]) -> Result<(), KernelError> {
    let out = &cx.outputs[0];
    if out.dtype != dtype || out.shape != shape {
        return Err(invalid!(
            "{} produces {dtype} {shape:?}, but its output is declared {} {:?}",
            cx.op,
            out.dtype,
            out.shape
        ));
    }
    Ok(())
}

/// Reads the canonical `axis` attribute and checks it against `rank`.
fn axis_attr(cx: &OpCx, rank: usize) -> Result<usize, KernelError> {
    let axis = cx.attrs.int("axis")?;
    usize::try_from(axis)
        .ok()
        .filter(|&a| a < rank)
        .ok_or_else(|| invalid!("{}: axis {axis} is out of range for rank {rank}", cx.op))
}

/// Errors unless the run-time tensors have the element counts `prepare` saw.
fn check_lens(
    op: &str,
    x: usize,
    want_x: usize,
    y: usize,
    want_y: usize,
) -> Result<(), KernelError> {
    if x != want_x || y != want_y {
        return Err(invalid!(
            "{op} was prepared for {want_x} -> {want_y} elements, got {x} -> {y}"
        ));
    }
    Ok(())
}

/// A tensor seen as `outer` blocks of `n` rows of `inner` contiguous elements: the view of
/// every op that works along one axis (or, for `coerce_2d`, a run of trailing axes).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Lanes {
    outer: usize,
    n: usize,
    inner: usize,
}

impl Lanes {
    /// Along the axes `first..last` (exclusive) of `shape`, taken as one.
    fn new(shape: &[usize], first: usize, last: usize) -> Self {
        Lanes {
            outer: shape[..first].iter().product(),
            n: shape[first..last].iter().product(),
            inner: shape[last..].iter().product(),
        }
    }
    fn len(&self) -> usize {
        self.outer * self.n * self.inner
    }
}

// ---- Reduce* ----

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    L1,
    L2,
    LogSum,
    LogSumExp,
    SumSquare,
}

impl Kind {
    fn of(op: &str) -> Option<Kind> {
        Some(match op {
            "ReduceSum" => Kind::Sum,
            "ReduceMean" => Kind::Mean,
            "ReduceMax" => Kind::Max,
            "ReduceMin" => Kind::Min,
            "ReduceProd" => Kind::Prod,
            "ReduceL1" => Kind::L1,
            "ReduceL2" => Kind::L2,
            "ReduceLogSum" => Kind::LogSum,
            "ReduceLogSumExp" => Kind::LogSumExp,
            "ReduceSumSquare" => Kind::SumSquare,
            _ => return None,
        })
    }

    /// Whether the reduction is defined on integers (no logarithm, root or division).
    fn integral(self) -> bool {
        matches!(self, Kind::Sum | Kind::Max | Kind::Min | Kind::Prod | Kind::L1 | Kind::SumSquare)
    }
}

/// How input elements map to output elements: the input's dimensions with size-1 dimensions
/// dropped and neighbours of the same kind (reduced or kept) merged.
#[derive(Debug)]
struct Plan {
    dims: Vec<usize>,
    reduced: Vec<bool>,
    /// Output stride of each merged dimension (0 where reduced).
    out_strides: Vec<usize>,
    /// Input elements folded into each output element.
    count: usize,
    in_len: usize,
    out_len: usize,
}

impl Plan {
    /// `axes` are sorted, distinct and in range.
    fn new(shape: &[usize], axes: &[usize]) -> Self {
        let mut dims: Vec<usize> = Vec::new();
        let mut reduced: Vec<bool> = Vec::new();
        for (d, &n) in shape.iter().enumerate() {
            let r = axes.contains(&d);
            if n == 1 {
                continue;
            }
            match (dims.last_mut(), reduced.last()) {
                (Some(last), Some(&lr)) if lr == r => *last *= n,
                _ => {
                    dims.push(n);
                    reduced.push(r);
                }
            }
        }
        if dims.is_empty() {
            dims.push(1);
            reduced.push(false);
        }
        let mut out_strides = vec![0; dims.len()];
        let mut stride = 1;
        for i in (0..dims.len()).rev() {
            if !reduced[i] {
                out_strides[i] = stride;
                stride *= dims[i];
            }
        }
        let count = axes.iter().map(|&a| shape[a]).product();
        Plan { in_len: shape.iter().product(), out_len: stride, dims, reduced, out_strides, count }
    }

    /// Folds every input element into the output element it reduces to, in input order:
    /// `out[o] = step(out[o], x, o)`. `x` and `out` have the plan's lengths.
    fn fold<T: Copy>(&self, x: &[T], out: &mut [T], step: impl Fn(T, T, usize) -> T) {
        let last = self.dims.len() - 1;
        let n = self.dims[last];
        if x.is_empty() || n == 0 {
            return;
        }
        // Odometer over the merged dimensions before the last one.
        let mut idx = vec![0usize; last];
        let mut o = 0usize;
        for chunk in x.chunks_exact(n) {
            if self.reduced[last] {
                out[o] = chunk.iter().fold(out[o], |acc, &v| step(acc, v, o));
            } else {
                for (i, (y, &v)) in out[o..o + n].iter_mut().zip(chunk).enumerate() {
                    *y = step(*y, v, o + i);
                }
            }
            for d in (0..last).rev() {
                idx[d] += 1;
                o += self.out_strides[d];
                if idx[d] < self.dims[d] {
                    break;
                }
                o -= self.out_strides[d] * self.dims[d];
                idx[d] = 0;
            }
        }
    }
}

/// The element operations reductions need, for floats and (wrapping) integers.
trait Num: Element + PartialOrd {
    const ZERO: Self;
    const ONE: Self;
    const LOWEST: Self;
    const HIGHEST: Self;
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn abs(self) -> Self;
    fn is_nan(self) -> bool;
}

/// The float-only steps: roots, logarithms, means.
trait Float: Num + std::ops::Sub<Output = Self> + std::ops::Div<Output = Self> {
    fn of_count(n: usize) -> Self;
    fn sqrt(self) -> Self;
    fn ln(self) -> Self;
    fn exp(self) -> Self;
    fn is_finite(self) -> bool;
}

macro_rules! float_num {
    ($($t:ident),*) => {$(
        impl Num for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const LOWEST: Self = $t::NEG_INFINITY;
            const HIGHEST: Self = $t::INFINITY;
            fn add(self, o: Self) -> Self { self + o }
            fn mul(self, o: Self) -> Self { self * o }
            fn abs(self) -> Self { $t::abs(self) }
            fn is_nan(self) -> bool { $t::is_nan(self) }
        }
        impl Float for $t {
            fn of_count(n: usize) -> Self { n as $t }
            fn sqrt(self) -> Self { $t::sqrt(self) }
            fn ln(self) -> Self { $t::ln(self) }
            fn exp(self) -> Self { $t::exp(self) }
            fn is_finite(self) -> bool { $t::is_finite(self) }
        }
    )*};
}
float_num!(f32, f64);

macro_rules! int_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const ZERO: Self = 0;
            const ONE: Self = 1;
            const LOWEST: Self = <$t>::MIN;
            const HIGHEST: Self = <$t>::MAX;
            fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            fn abs(self) -> Self { self.wrapping_abs() }
            fn is_nan(self) -> bool { false }
        }
    )*};
}
int_num!(i32, i64);

struct Reduce {
    kind: Kind,
    plan: Plan,
}

fn prepare_reduce(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(1..=1, 1)?;
    let kind = Kind::of(cx.op).ok_or_else(|| KernelError::UnknownOp(cx.op.to_string()))?;
    let x = &cx.inputs[0];
    match x.dtype {
        DType::F32 | DType::F64 => {}
        DType::I32 | DType::I64 if kind.integral() => {}
        DType::Bool if matches!(kind, Kind::Max | Kind::Min) => {}
        dt => return Err(cx.dtype_error(dt)),
    }
    let rank = x.shape.len();
    let mut axes = Vec::new();
    for &a in cx.attrs.ints("axes")? {
        let a = usize::try_from(a)
            .ok()
            .filter(|&a| a < rank && axes.last().is_none_or(|&p| p < a))
            .ok_or_else(|| {
                invalid!("{}: axes must be sorted, distinct and within rank {rank}", cx.op)
            })?;
        axes.push(a);
    }
    let keepdims = cx.attrs.int("keepdims")? != 0;
    let out_shape: Vec<usize> = (0..rank)
        .filter_map(|d| match (axes.contains(&d), keepdims) {
            (false, _) => Some(x.shape[d]),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    check_output(cx, x.dtype, &out_shape)?;
    Ok(Box::new(Reduce { kind, plan: Plan::new(&x.shape, &axes) }))
}

impl Kernel for Reduce {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let (x, y) = (&inputs[0], &mut outputs[0]);
        match x.dtype {
            DType::F32 => self.run_float::<f32>(x.as_slice()?, y.as_slice_mut()?),
            DType::F64 => self.run_float::<f64>(x.as_slice()?, y.as_slice_mut()?),
            DType::Bool => self.run_bool(x.as_slice()?, y.as_slice_mut()?),
            DType::I32 => self.run_typed::<i32>(x.as_slice()?, y.as_slice_mut()?),
            DType::I64 => self.run_typed::<i64>(x.as_slice()?, y.as_slice_mut()?),
            dt => Err(invalid!("reduction on {dt}")),
        }
    }
}

impl Reduce {
    /// The reductions that need nothing beyond `Num`; the float-only kinds are no-ops here
    /// and are finished by `run_f32`.
    fn run_typed<T: Num>(&self, x: &[T], out: &mut [T]) -> Result<(), KernelError> {
        let p = &self.plan;
        check_lens("reduction", x.len(), p.in_len, out.len(), p.out_len)?;
        let init = match self.kind {
            Kind::Prod => T::ONE,
            Kind::Max | Kind::LogSumExp => T::LOWEST,
            Kind::Min => T::HIGHEST,
            _ => T::ZERO,
        };
        out.fill(init);
        match self.kind {
            Kind::Sum | Kind::Mean | Kind::LogSum => p.fold(x, out, |a, v, _| a.add(v)),
            Kind::SumSquare | Kind::L2 => p.fold(x, out, |a, v, _| a.add(v.mul(v))),
            Kind::L1 => p.fold(x, out, |a, v, _| a.add(v.abs())),
            Kind::Prod => p.fold(x, out, |a, v, _| a.mul(v)),
            // NaN wins, as in numpy.
            Kind::Max | Kind::LogSumExp => {
                p.fold(x, out, |a, v, _| if v > a || v.is_nan() { v } else { a })
            }
            Kind::Min => p.fold(x, out, |a, v, _| if v < a || v.is_nan() { v } else { a }),
        }
        Ok(())
    }

    fn run_float<T: Float>(&self, x: &[T], out: &mut [T]) -> Result<(), KernelError> {
        self.run_typed(x, out)?;
        let n = T::of_count(self.plan.count);
        match self.kind {
            Kind::Mean => out.iter_mut().for_each(|v| *v = *v / n),
            Kind::L2 => out.iter_mut().for_each(|v| *v = v.sqrt()),
            Kind::LogSum => out.iter_mut().for_each(|v| *v = v.ln()),
            Kind::LogSumExp => {
                // `out` holds the maxima: log Σ exp(x) = m + log Σ exp(x - m).
                let m = out.to_vec();
                out.fill(T::ZERO);
                self.plan.fold(x, out, |a, v, o| a.add((v - m[o]).exp()));
                for (v, &m) in out.iter_mut().zip(&m) {
                    // An infinite maximum (or an empty set: -inf) is the answer itself.
                    *v = if m.is_finite() { m.add(v.ln()) } else { m };
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Max is "any", Min is "all"; bools are bytes of 0 or 1.
    fn run_bool(&self, x: &[u8], out: &mut [u8]) -> Result<(), KernelError> {
        let p = &self.plan;
        check_lens("reduction", x.len(), p.in_len, out.len(), p.out_len)?;
        if self.kind == Kind::Max {
            out.fill(0);
            p.fold(x, out, |a, v, _| a | (v != 0) as u8);
        } else {
            out.fill(1);
            p.fold(x, out, |a, v, _| a & (v != 0) as u8);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::cpu::eval;
    use crate::tensor::{Tensor, TensorDesc};
    use ingot_schema::{AttrValue, Attrs, DType};

    fn attrs(axes: &[i64], keepdims: i64) -> Attrs {
        Attrs::new()
            .with("axes", AttrValue::Ints(axes.to_vec()))
            .with("keepdims", AttrValue::Int(keepdims))
    }

    fn reduce_f32(
        op: &str,
        shape: &[usize],
        x: &[f32],
        axes: &[i64],
        keep: i64,
        out: &[usize],
    ) -> Vec<f32> {
        let t = Tensor::from_vec(shape.to_vec(), x).unwrap();
        let r = eval(op, &attrs(axes, keep), &[&t], &[TensorDesc::new(DType::F32, out.to_vec())])
            .unwrap();
        r[0].to_vec().unwrap()
    }

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{a:?} vs {b:?}");
        }
    }

    // x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 4 - 2
    fn x234() -> Vec<f32> {
        (0..24).map(|i| i as f32 / 4.0 - 2.0).collect()
    }

    #[test]
    fn every_kind_over_middle_and_outer_axes() {
        // import numpy as np
        // x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 4 - 2
        // a = (0, 2)
        // np.sum(x, a), np.mean(x, a), np.max(x, a), np.min(x, a), np.prod(x, a),
        // np.sum(abs(x), a), np.sqrt(np.sum(x*x, a)), np.log(np.sum(np.exp(x), a)),
        // np.sum(x*x, a); then np.log(np.sum(x + 3, a, keepdims=True))
        let x = x234();
        let cases: &[(&str, [f32; 3])] = &[
            ("ReduceSum", [-1.0, 7.0, 15.0]),
            ("ReduceMean", [-0.125, 0.875, 1.875]),
            ("ReduceMax", [1.75, 2.75, 3.75]),
            ("ReduceMin", [-2.0, -1.0, 0.0]),
            ("ReduceProd", [21.533203, 2.9003906, 0.0]),
            ("ReduceL1", [12.0, 12.0, 15.0]),
            ("ReduceL2", [4.3301272, 4.974937, 6.837397]),
            ("ReduceLogSumExp", [2.8486037, 3.8486037, 4.8486037]),
            ("ReduceSumSquare", [18.75, 24.75, 46.75]),
        ];
        for (op, want) in cases {
            close(&reduce_f32(op, &[2, 3, 4], &x, &[0, 2], 0, &[3]), want);
        }
        let shifted: Vec<f32> = x.iter().map(|v| v + 3.0).collect();
        close(
            &reduce_f32("ReduceLogSum", &[2, 3, 4], &shifted, &[0, 2], 1, &[1, 3, 1]),
            &[3.1354942, 3.4339871, 3.6635616],
        );
    }

    #[test]
    fn last_axis_all_axes_and_no_axis() {
        let x = x234();
        // np.max(x, 2) and np.sum(x) and np.square(x) (noop_with_empty_axes=1)
        close(
            &reduce_f32("ReduceMax", &[2, 3, 4], &x, &[2], 1, &[2, 3, 1]),
            &[-1.25, -0.25, 0.75, 1.75, 2.75, 3.75],
        );
        close(&reduce_f32("ReduceSum", &[2, 3, 4], &x, &[0, 1, 2], 0, &[]), &[21.0]);
        let sq = reduce_f32("ReduceSumSquare", &[2, 3, 4], &x, &[], 1, &[2, 3, 4]);
        close(&sq, &x.iter().map(|v| v * v).collect::<Vec<_>>());
    }

    #[test]
    fn empty_sets_give_the_identity() {
        // ONNX: reducing an empty set gives 0 (sum), 1 (prod), -inf (max, log-sum-exp).
        for (op, want) in [
            ("ReduceSum", 0.0),
            ("ReduceProd", 1.0),
            ("ReduceMax", f32::NEG_INFINITY),
            ("ReduceLogSumExp", f32::NEG_INFINITY),
        ] {
            assert_eq!(reduce_f32(op, &[2, 0], &[], &[1], 0, &[2]), [want, want]);
        }
    }

    #[test]
    fn integers_wrap_and_keep_their_type() {
        let t = Tensor::from_vec(vec![2, 2], &[3i64, -7, i64::MAX, 1]).unwrap();
        let out = [TensorDesc::new(DType::I64, vec![2])];
        let sum = eval("ReduceSum", &attrs(&[1], 0), &[&t], &out).unwrap();
        assert_eq!(sum[0].to_vec::<i64>().unwrap(), [-4, i64::MIN]);
        let min = eval("ReduceMin", &attrs(&[0], 0), &[&t], &out).unwrap();
        assert_eq!(min[0].to_vec::<i64>().unwrap(), [3, -7]);
        let t32 = Tensor::from_vec(vec![3], &[2i32, -3, 4]).unwrap();
        let prod =
            eval("ReduceProd", &attrs(&[0], 1), &[&t32], &[TensorDesc::new(DType::I32, vec![1])])
                .unwrap();
        assert_eq!(prod[0].to_vec::<i32>().unwrap(), [-24]);
        let mean =
            eval("ReduceMean", &attrs(&[0], 1), &[&t32], &[TensorDesc::new(DType::I32, vec![1])]);
        assert!(mean.is_err());
    }

    #[test]
    fn bools_and_doubles() {
        // Max is any, Min is all (and true over an empty set).
        let b = Tensor::from_bools(vec![2, 2], &[true, false, false, false]).unwrap();
        let out = [TensorDesc::new(DType::Bool, vec![2])];
        let any = eval("ReduceMax", &attrs(&[1], 0), &[&b], &out).unwrap();
        assert_eq!(any[0].as_slice::<u8>().unwrap(), [1, 0]);
        let all = eval("ReduceMin", &attrs(&[0], 0), &[&b], &out).unwrap();
        assert_eq!(all[0].as_slice::<u8>().unwrap(), [0, 0]);
        let empty = Tensor::from_bools(vec![2, 0], &[]).unwrap();
        let all = eval("ReduceMin", &attrs(&[1], 0), &[&empty], &out).unwrap();
        assert_eq!(all[0].as_slice::<u8>().unwrap(), [1, 1]);
        // np.mean([[1, 2], [4, 8]], 0) = [2.5, 5]
        let d = Tensor::from_vec(vec![2, 2], &[1f64, 2., 4., 8.]).unwrap();
        let out = [TensorDesc::new(DType::F64, vec![2])];
        let mean = eval("ReduceMean", &attrs(&[0], 0), &[&d], &out).unwrap();
        assert_eq!(mean[0].to_vec::<f64>().unwrap(), [2.5, 5.0]);
    }

    #[test]
    fn a_wrong_output_shape_is_refused() {
        let t = Tensor::from_vec(vec![2, 3], &[0f32; 6]).unwrap();
        let bad =
            eval("ReduceSum", &attrs(&[1], 1), &[&t], &[TensorDesc::new(DType::F32, vec![2])]);
        assert!(bad.is_err());
        let unsorted =
            eval("ReduceSum", &attrs(&[1, 0], 0), &[&t], &[TensorDesc::new(DType::F32, vec![])]);
        assert!(unsorted.is_err());
    }
}
