//! The family's ops that produce values rather than only move them: Trilu (zeros), CumSum,
//! ConstantOfShape and Range.

use super::{Numeric, Scalar, by_numeric, cast, cast_mut, fill, input, output, same_dtype};
use crate::cpu::{Kernel, KernelError, OpCx};
use crate::invalid;
use crate::tensor::{TensorMut, TensorRef};
use ingot_schema::DType;

// ---- Trilu ----

/// Keeps the upper (`j - i >= k`) or lower (`j - i <= k`) triangle of each trailing matrix
/// and zeroes the rest; zero is all-zero bytes in every dtype.
struct Trilu {
    rows: usize,
    cols: usize,
    upper: bool,
    k: i64,
    esize: usize,
    bytes: usize,
}

impl Kernel for Trilu {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let src = input(inputs, 0, self.bytes)?;
        let dst = output(outputs, 0, self.bytes)?;
        let row = self.cols * self.esize;
        if row == 0 {
            return Ok(());
        }
        for (r, (d, s)) in dst.chunks_exact_mut(row).zip(src.chunks_exact(row)).enumerate() {
            let i = (r % self.rows) as i64;
            let clamp = |j: i64| j.clamp(0, self.cols as i64) as usize * self.esize;
            let (lo, hi) =
                if self.upper { (clamp(i + self.k), row) } else { (0, clamp(i + self.k + 1)) };
            let lo = lo.min(hi);
            d.fill(0);
            d[lo..hi].copy_from_slice(&s[lo..hi]);
        }
        Ok(())
    }
}

pub(super) fn trilu(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(1..=1, 1)?;
    let desc = &cx.inputs[0];
    same_dtype(cx)?;
    if cx.outputs[0] != *desc {
        return Err(invalid!("Trilu output {:?} differs from its input", cx.outputs[0]));
    }
    let [rows, cols] = desc.shape[desc.shape.len().saturating_sub(2)..] else {
        return Err(invalid!("Trilu needs at least 2 dims, got {:?}", desc.shape));
    };
    // Beyond the matrix every k means the same; clamped, `i + k + 1` cannot overflow in `run`.
    let bound = rows.saturating_add(cols).min(i64::MAX as usize / 4) as i64;
    Ok(Box::new(Trilu {
        rows,
        cols,
        upper: cx.attrs.int("upper")? != 0,
        k: cx.attrs.int("k")?.clamp(-bound, bound),
        esize: desc.dtype.size(),
        bytes: desc.bytes(),
    }))
}

// ---- CumSum and CumProd ----

/// Running sums (or products) along the middle axis of `[outer, n, inner]`.
struct Cumulative {
    product: bool,
    dtype: DType,
    outer: usize,
    n: usize,
    inner: usize,
    exclusive: bool,
    reverse: bool,
}

impl Cumulative {
    fn apply<T: Numeric>(&self, src: &[u8], dst: &mut [u8]) -> Result<(), KernelError> {
        let (src, dst) = (cast::<T>(src)?, cast_mut::<T>(dst)?);
        let (n, inner) = (self.n, self.inner);
        let (identity, op) = match self.product {
            true => (T::ONE, T::mul as fn(T, T) -> T),
            false => (T::ZERO, T::add as fn(T, T) -> T),
        };
        let mut acc = vec![identity; inner];
        for o in 0..self.outer {
            acc.fill(identity);
            for step in 0..n {
                let j = if self.reverse { n - 1 - step } else { step };
                let at = (o * n + j) * inner;
                let (s, d) = (&src[at..at + inner], &mut dst[at..at + inner]);
                for ((a, &x), y) in acc.iter_mut().zip(s).zip(d) {
                    let next = op(*a, x);
                    *y = if self.exclusive { *a } else { next };
                    *a = next;
                }
            }
        }
        Ok(())
    }
}

impl Kernel for Cumulative {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let bytes = self.outer * self.n * self.inner * self.dtype.size();
        let (src, dst) = (input(inputs, 0, bytes)?, output(outputs, 0, bytes)?);
        by_numeric!(self.dtype, T => self.apply::<T>(src, dst))
    }
}

pub(super) fn cumulative(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(1..=1, 1)?;
    let desc = &cx.inputs[0];
    let dtype = same_dtype(cx)?;
    if dtype == DType::Bool {
        return Err(cx.dtype_error(dtype));
    }
    if cx.outputs[0] != *desc {
        return Err(invalid!("{} output {:?} differs from its input", cx.op, cx.outputs[0]));
    }
    let shape = &desc.shape;
    let axis = usize::try_from(cx.attrs.int("axis")?)
        .ok()
        .filter(|&a| a < shape.len())
        .ok_or_else(|| invalid!("{} axis is out of range for rank {}", cx.op, shape.len()))?;
    Ok(Box::new(Cumulative {
        product: cx.op == "CumProd",
        dtype,
        outer: shape[..axis].iter().product(),
        n: shape[axis],
        inner: shape[axis + 1..].iter().product(),
        exclusive: cx.attrs.int("exclusive")? != 0,
        reverse: cx.attrs.int("reverse")? != 0,
    }))
}

// ---- ConstantOfShape and Range ----

/// The output's element type, checked against the canonical `dtype` attribute.
fn output_dtype(cx: &OpCx) -> Result<DType, KernelError> {
    cx.expect_arity(0..=0, 1)?;
    let dt = cx.outputs[0].dtype;
    if cx.attrs.int("dtype")? != i64::from(dt.onnx_code()) {
        return Err(invalid!("{} dtype attribute does not match its {dt} output", cx.op));
    }
    Ok(dt)
}

/// ConstantOfShape: the output filled with one value.
struct Constant {
    value: Vec<u8>,
    bytes: usize,
}

impl Kernel for Constant {
    fn run(&self, _: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        fill(output(outputs, 0, self.bytes)?, &self.value)
    }
}

pub(super) fn constant_of_shape(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    let dt = output_dtype(cx)?;
    Ok(Box::new(Constant {
        value: Scalar::attr(cx.attrs, "value")?.encode(dt),
        bytes: cx.outputs[0].bytes(),
    }))
}

/// EyeLike: ones on the diagonal `k` (above the main one for k > 0), zeros elsewhere.
struct Eye {
    one: Vec<u8>,
    rows: usize,
    cols: usize,
    k: i64,
}

impl Kernel for Eye {
    fn run(&self, _: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let es = self.one.len();
        let dst = output(outputs, 0, self.rows * self.cols * es)?;
        dst.fill(0);
        for r in 0..self.rows {
            let c = r as i64 + self.k;
            if (0..self.cols as i64).contains(&c) {
                let at = (r * self.cols + c as usize) * es;
                dst[at..at + es].copy_from_slice(&self.one);
            }
        }
        Ok(())
    }
}

pub(super) fn eye_like(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    let dt = output_dtype(cx)?;
    let &[rows, cols] = &cx.outputs[0].shape[..] else {
        return Err(invalid!("EyeLike output must be 2-d, not {:?}", cx.outputs[0].shape));
    };
    Ok(Box::new(Eye { one: Scalar::Int(1).encode(dt), rows, cols, k: cx.attrs.int("k")? }))
}

/// Range: `start + i * delta` for every output element (the compiler sized the output).
struct Range {
    start: Scalar,
    delta: Scalar,
    dtype: DType,
    len: usize,
}

impl Kernel for Range {
    fn run(&self, _: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let es = self.dtype.size();
        let dst = output(outputs, 0, self.len * es)?;
        for (i, d) in dst.chunks_exact_mut(es).enumerate() {
            let v = match (self.start, self.delta) {
                (Scalar::Int(s), Scalar::Int(k)) => {
                    Scalar::Int(s.wrapping_add(k.wrapping_mul(i as i64)))
                }
                (s, k) => Scalar::Float(s.as_f64() + k.as_f64() * i as f64),
            };
            d.copy_from_slice(&v.encode(self.dtype));
        }
        Ok(())
    }
}

pub(super) fn range(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    let dtype = output_dtype(cx)?;
    if cx.outputs[0].shape.len() != 1 {
        return Err(invalid!("Range output must be 1-d, not {:?}", cx.outputs[0].shape));
    }
    Ok(Box::new(Range {
        start: Scalar::attr(cx.attrs, "start")?,
        delta: Scalar::attr(cx.attrs, "delta")?,
        dtype,
        len: cx.outputs[0].elements(),
    }))
}
