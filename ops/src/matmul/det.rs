//! Det (opset 11): the determinant of each square matrix in the last two axes, `[.., M, M]`
//! to `[..]`, by LU decomposition with partial pivoting in f64, for float32 and float64.

use crate::Node;
use crate::TensorDesc;
use crate::cpu::{Kernel, KernelError, OpCx, read_f64s, write_f64s};
use crate::invalid;
use crate::lower::{LowerCx, OpResult, op_err};
use crate::tensor::{TensorMut, TensorRef};
use ingot_schema::DType;

pub(super) fn lower(_: &mut Node, _: &LowerCx) -> OpResult<()> {
    Ok(())
}

pub(super) fn infer(_: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    Ok(vec![output(inputs.first().ok_or_else(|| op_err!("Det takes one input"))?)?])
}

/// The determinants of X's matrices.
fn output(x: &TensorDesc) -> OpResult<TensorDesc> {
    match x.shape.as_slice() {
        [batch @ .., m, n] if m == n && matches!(x.dtype, DType::F32 | DType::F64) => {
            Ok(TensorDesc::new(x.dtype, batch.to_vec()))
        }
        _ => Err(op_err!("Det takes float32 or float64 [.., M, M], got {} {:?}", x.dtype, x.shape)),
    }
}

pub(super) fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(1..=1, 1)?;
    let x = &cx.inputs[0];
    let want = output(x).map_err(|e| invalid!("{e}"))?;
    if want != cx.outputs[0] {
        return Err(invalid!("Det of {x:?} declares {:?}", cx.outputs[0]));
    }
    let m = x.shape.last().copied().unwrap_or(0);
    Ok(Box::new(Det { m, count: want.elements() }))
}

struct Det {
    m: usize,
    count: usize,
}

/// The determinant of the `m x m` matrix `a` (overwritten by its LU factors).
fn determinant(a: &mut [f64], m: usize) -> f64 {
    let mut det = 1.0;
    for k in 0..m {
        let pivot = (k..m).max_by(|&i, &j| a[i * m + k].abs().total_cmp(&a[j * m + k].abs()));
        let p = pivot.unwrap_or(k);
        if a[p * m + k] == 0.0 {
            return 0.0;
        }
        if p != k {
            for j in 0..m {
                a.swap(k * m + j, p * m + j);
            }
            det = -det;
        }
        let d = a[k * m + k];
        det *= d;
        for i in k + 1..m {
            let f = a[i * m + k] / d;
            for j in k + 1..m {
                a[i * m + j] -= f * a[k * m + j];
            }
        }
    }
    det
}

impl Kernel for Det {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let x = inputs.first().ok_or_else(|| invalid!("Det's input is missing"))?;
        let x = read_f64s(x)?;
        if x.len() != self.count * self.m * self.m {
            return Err(invalid!("Det's input has {} elements", x.len()));
        }
        // An empty matrix's determinant is 1.
        let dets: Vec<f64> = match self.m {
            0 => vec![1.0; self.count],
            m => x.chunks_exact(m * m).map(|a| determinant(&mut a.to_vec(), m)).collect(),
        };
        let out = outputs.first_mut().ok_or_else(|| invalid!("Det's output is missing"))?;
        write_f64s(out, &dets)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::cpu;
    use crate::{Tensor, TensorDesc};
    use ingot_schema::{Attrs, DType};

    #[test]
    fn determinants_of_each_matrix() {
        // [[2, 1], [1, 3]] = 5; [[0, 1], [1, 0]] = -1 (a row swap); a singular one = 0; and a
        // 3x3 that needs pivoting: [[0, 2, 1], [1, 0, 0], [3, 1, 1]] = -2 + 1 = -1.
        let x = Tensor::from_vec(
            vec![3, 2, 2],
            &[2.0f32, 1.0, 1.0, 3.0, 0.0, 1.0, 1.0, 0.0, 1.0, 2.0, 2.0, 4.0],
        )
        .unwrap();
        let out = [TensorDesc::new(DType::F32, vec![3])];
        let got = cpu::eval("Det", &Attrs::new(), &[&x], &out).unwrap();
        assert_eq!(got[0].as_slice::<f32>().unwrap(), [5.0, -1.0, 0.0]);
        let x = Tensor::from_vec(vec![3, 3], &[0.0f64, 2.0, 1.0, 1.0, 0.0, 0.0, 3.0, 1.0, 1.0])
            .unwrap();
        let got = cpu::eval("Det", &Attrs::new(), &[&x], &[TensorDesc::new(DType::F64, vec![])]);
        let d = got.unwrap()[0].as_slice::<f64>().unwrap()[0];
        assert!((d + 1.0).abs() < 1e-12, "{d}");
    }
}
