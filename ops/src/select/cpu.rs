//! The family's CPU kernels: NonZero and Compress here, NonMaxSuppression in `cpu/nms.rs`.
//! Each writes what it selects first along its bounded dim, zeroes the rest up to the bound,
//! and writes the count.

mod nms;

use super::compress_view;
use crate::cpu::{Kernel, KernelError, OpCx, output_mut};
use crate::invalid;
use crate::movement::cpu::by_size;
use crate::tensor::{TensorDesc, TensorMut, TensorRef};
use ingot_schema::DType;

pub fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    match cx.op {
        "NonMaxSuppression" => nms::prepare(cx),
        "NonZero" => {
            cx.expect_arity(1..=1, 2)?;
            let x = &cx.inputs[0];
            let want = [x.shape.len(), x.elements()];
            check_outputs(cx, &TensorDesc::new(DType::I64, want))?;
            Ok(Box::new(NonZero { shape: x.shape.clone(), dtype: x.dtype }))
        }
        "Compress" => {
            cx.expect_arity(2..=2, 2)?;
            let (x, condition) = (&cx.inputs[0], &cx.inputs[1]);
            let (shape, axis) = compress_view(cx.attrs, x).map_err(|e| invalid!("{e}"))?;
            let bound = condition.elements();
            if condition.dtype != DType::Bool || bound > shape[axis] {
                return Err(invalid!("Compress's condition must be at most {} bools", shape[axis]));
            }
            let mut out = shape.clone();
            out[axis] = bound;
            check_outputs(cx, &TensorDesc::new(x.dtype, out))?;
            Ok(Box::new(Compress {
                outer: shape[..axis].iter().product(),
                dim: shape[axis],
                bound,
                inner: shape[axis + 1..].iter().product(),
                size: x.dtype.size(),
            }))
        }
        op => Err(KernelError::UnknownOp(op.to_string())),
    }
}

/// Output 0 is `want`, output 1 one int64.
fn check_outputs(cx: &OpCx, want: &TensorDesc) -> Result<(), KernelError> {
    let (out, count) = (&cx.outputs[0], &cx.outputs[1]);
    if out != want || count.dtype != DType::I64 || count.elements() != 1 {
        return Err(invalid!(
            "{} declares outputs {} {:?} and {} {:?}, expected {} {:?} and one int64",
            cx.op,
            out.dtype,
            out.shape,
            count.dtype,
            count.shape,
            want.dtype,
            want.shape
        ));
    }
    Ok(())
}

struct NonZero {
    shape: Vec<usize>,
    dtype: DType,
}

impl Kernel for NonZero {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let x = inputs.first().ok_or_else(|| invalid!("NonZero's input is missing"))?;
        let n = x.elements();
        let size = self.dtype.size();
        if x.bytes.len() != n * size || x.shape != self.shape {
            return Err(invalid!("NonZero was prepared for {:?}, got {:?}", self.shape, x.shape));
        }
        // Floats by value (-0.0 is zero, NaN is not), every other type by its bits.
        let nonzero: Vec<bool> = match self.dtype {
            DType::F32 => x.as_slice::<f32>()?.iter().map(|&v| v != 0.0).collect(),
            DType::F64 => x.as_slice::<f64>()?.iter().map(|&v| v != 0.0).collect(),
            DType::F16 => x.as_slice::<half::f16>()?.iter().map(|&v| f32::from(v) != 0.0).collect(),
            _ => by_size!(size, T => Ok::<_, KernelError>(
                bytemuck::try_cast_slice::<u8, T>(x.bytes)
                    .map_err(|_| invalid!("NonZero's input is misaligned"))?
                    .iter()
                    .map(|&v| v != 0)
                    .collect()
            ))?,
        };
        let rank = self.shape.len();
        let out = output_mut::<i64>(outputs, 0, rank * n)?;
        out.fill(0);
        let mut count = 0;
        let mut at = vec![0usize; rank];
        for &hit in &nonzero {
            if hit {
                for (d, &c) in at.iter().enumerate() {
                    out[d * n + count] = c as i64;
                }
                count += 1;
            }
            // The next coordinate in row-major order.
            for d in (0..rank).rev() {
                at[d] += 1;
                if at[d] < self.shape[d] {
                    break;
                }
                at[d] = 0;
            }
        }
        output_mut::<i64>(outputs, 1, 1)?[0] = count as i64;
        Ok(())
    }
}

/// X as [outer, dim, inner] elements of `size` bytes; the condition's `bound` values pick
/// slices of the middle dim.
struct Compress {
    outer: usize,
    dim: usize,
    bound: usize,
    inner: usize,
    size: usize,
}

impl Kernel for Compress {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let [x, condition] = inputs else {
            return Err(invalid!("Compress reads X and a condition, got {} inputs", inputs.len()));
        };
        let slice = self.inner * self.size;
        if x.bytes.len() != self.outer * self.dim * slice || condition.bytes.len() != self.bound {
            return Err(invalid!("Compress's inputs differ from what it was prepared for"));
        }
        let picked: Vec<usize> = (0..self.bound).filter(|&i| condition.bytes[i] != 0).collect();
        let out = outputs.first_mut().ok_or_else(|| invalid!("Compress's output is missing"))?;
        let out = &mut *out.bytes;
        if out.len() != self.outer * self.bound * slice {
            return Err(invalid!("Compress's output differs from what it was prepared for"));
        }
        out.fill(0);
        // Each of the `outer` blocks holds `bound` slices: the picked ones first.
        for o in 0..self.outer {
            for (j, &i) in picked.iter().enumerate() {
                let (from, to) = ((o * self.dim + i) * slice, (o * self.bound + j) * slice);
                out[to..to + slice].copy_from_slice(&x.bytes[from..from + slice]);
            }
        }
        output_mut::<i64>(outputs, 1, 1)?[0] = picked.len() as i64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::cpu::eval;
    use crate::tensor::{Tensor, TensorDesc};
    use ingot_schema::{AttrValue, Attrs, DType};

    #[test]
    fn non_zero_lists_coordinates_in_row_major_order_at_the_start() {
        let x = Tensor::from_vec(vec![2, 2], &[1.0f32, -0.0, f32::NAN, 3.0]).unwrap();
        let out = [TensorDesc::new(DType::I64, [2, 4]), TensorDesc::new(DType::I64, [])];
        let outs = eval("NonZero", &Attrs::new(), &[&x], &out).unwrap();
        assert_eq!(outs[1].to_vec::<i64>().unwrap(), [3]);
        // Rows of the bound: coordinates in the first 3 columns, zeros past them.
        assert_eq!(outs[0].to_vec::<i64>().unwrap(), [0, 1, 1, 0, 0, 0, 1, 0]);
    }

    #[test]
    fn compress_puts_the_picked_slices_first_in_each_block() {
        let x = Tensor::from_vec(vec![2, 3], &[1i32, 2, 3, 4, 5, 6]).unwrap();
        let c = Tensor::from_bools(vec![3], &[true, false, true]).unwrap();
        let attrs = |axis: i64, flatten: i64| {
            Attrs::new().with("axis", AttrValue::Int(axis)).with("flatten", AttrValue::Int(flatten))
        };
        let out = [TensorDesc::new(DType::I32, [2, 3]), TensorDesc::new(DType::I64, [])];
        let outs = eval("Compress", &attrs(1, 0), &[&x, &c], &out).unwrap();
        assert_eq!(outs[1].to_vec::<i64>().unwrap(), [2]);
        // [[1, 3], [4, 6]], each row padded to the bound of 3.
        assert_eq!(outs[0].to_vec::<i32>().unwrap(), [1, 3, 0, 4, 6, 0]);
        let out = [TensorDesc::new(DType::I32, [3]), TensorDesc::new(DType::I64, [])];
        let outs = eval("Compress", &attrs(0, 1), &[&x, &c], &out).unwrap();
        assert_eq!(outs[0].to_vec::<i32>().unwrap(), [1, 3, 0]);
    }
}
