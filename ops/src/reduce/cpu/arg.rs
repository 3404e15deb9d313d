//! ArgMax and ArgMin: the index of the best element along `axis`, as int64.

use super::{Lanes, axis_attr, check_lens, check_output};
use crate::cpu::{Kernel, KernelError, OpCx};
use crate::invalid;
use crate::tensor::{Element, TensorMut, TensorRef};
use ingot_schema::DType;

struct Arg {
    lanes: Lanes,
    max: bool,
    last: bool,
}

pub(super) fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(1..=1, 1)?;
    let x = &cx.inputs[0];
    if !matches!(x.dtype, DType::F32 | DType::I32 | DType::I64) {
        return Err(cx.dtype_error(x.dtype));
    }
    let axis = axis_attr(cx, x.shape.len())?;
    if x.shape[axis] == 0 {
        return Err(invalid!("{}: axis {axis} is empty", cx.op));
    }
    let mut out = x.shape.clone();
    if cx.attrs.int("keepdims")? != 0 {
        out[axis] = 1;
    } else {
        out.remove(axis);
    }
    check_output(cx, DType::I64, &out)?;
    Ok(Box::new(Arg {
        lanes: Lanes::new(&x.shape, axis, axis + 1),
        max: cx.op == "ArgMax",
        last: cx.attrs.int("select_last_index")? != 0,
    }))
}

impl Kernel for Arg {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let y = outputs[0].as_slice_mut::<i64>()?;
        match inputs[0].dtype {
            DType::F32 => self.run_typed(inputs[0].as_slice::<f32>()?, y),
            DType::I32 => self.run_typed(inputs[0].as_slice::<i32>()?, y),
            DType::I64 => self.run_typed(inputs[0].as_slice::<i64>()?, y),
            dt => Err(invalid!("ArgMax/ArgMin on {dt}")),
        }
    }
}

impl Arg {
    fn run_typed<T: Element + PartialOrd>(
        &self,
        x: &[T],
        y: &mut [i64],
    ) -> Result<(), KernelError> {
        let l = self.lanes;
        check_lens("ArgMax/ArgMin", x.len(), l.len(), y.len(), l.outer * l.inner)?;
        if y.is_empty() {
            return Ok(());
        }
        let (max, last) = (self.max, self.last);
        // Ties go to the first index, or to the last with `select_last_index`.
        let better = |v: T, b: T| match (max, last) {
            (true, false) => v > b,
            (true, true) => v >= b,
            (false, false) => v < b,
            (false, true) => v <= b,
        };
        let mut best = Vec::with_capacity(l.inner);
        for (block, idx) in x.chunks_exact(l.n * l.inner).zip(y.chunks_exact_mut(l.inner)) {
            best_along(block, l.inner, better, &mut best, idx);
        }
        Ok(())
    }
}

/// For a block of rows of `inner` elements, the best element of each column and its row:
/// `better(v, b)` says whether `v` replaces the best so far `b`. The block has at least one
/// row; `best` is scratch space.
pub(super) fn best_along<T: Copy>(
    block: &[T],
    inner: usize,
    better: impl Fn(T, T) -> bool,
    best: &mut Vec<T>,
    idx: &mut [i64],
) {
    let mut rows = block.chunks_exact(inner);
    best.clear();
    best.extend_from_slice(rows.next().unwrap_or_default());
    idx.fill(0);
    for (r, row) in rows.enumerate() {
        for ((b, i), &v) in best.iter_mut().zip(idx.iter_mut()).zip(row) {
            if better(v, *b) {
                *b = v;
                *i = r as i64 + 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::cpu::eval;
    use crate::tensor::{Tensor, TensorDesc};
    use ingot_schema::{AttrValue, Attrs, DType};

    fn arg(op: &str, x: &Tensor, axis: i64, keep: i64, last: i64, out: &[usize]) -> Vec<i64> {
        let attrs = Attrs::new()
            .with("axis", AttrValue::Int(axis))
            .with("keepdims", AttrValue::Int(keep))
            .with("select_last_index", AttrValue::Int(last));
        let r = eval(op, &attrs, &[x], &[TensorDesc::new(DType::I64, out.to_vec())]).unwrap();
        r[0].to_vec().unwrap()
    }

    #[test]
    fn ties_and_axes() {
        // x = [[2, 5, 5], [7, 1, 7]]
        // np.argmax(x, 1) = [1, 0]; last index of the max: [2, 2]; np.argmin(x, 0) = [0, 1, 0]
        let x = Tensor::from_vec(vec![2, 3], &[2f32, 5., 5., 7., 1., 7.]).unwrap();
        assert_eq!(arg("ArgMax", &x, 1, 0, 0, &[2]), [1, 0]);
        assert_eq!(arg("ArgMax", &x, 1, 1, 1, &[2, 1]), [2, 2]);
        assert_eq!(arg("ArgMin", &x, 0, 0, 0, &[3]), [0, 1, 0]);
        let xi = Tensor::from_vec(vec![2, 3], &[2i64, 5, 5, 7, 1, 7]).unwrap();
        assert_eq!(arg("ArgMin", &xi, 1, 1, 0, &[2, 1]), [0, 1]);
        let empty = Tensor::from_vec(vec![2, 0], &[] as &[f32]).unwrap();
        assert_eq!(arg("ArgMax", &empty, 0, 0, 0, &[0]), [] as [i64; 0]);
    }
}
