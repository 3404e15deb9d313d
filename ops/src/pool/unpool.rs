//! MaxUnpool: MaxPool's values put back where its Indices say they came from, zeros elsewhere.
//! An index is flat over the unpooled tensor `[N, C, D..]` of the size the pool's geometry
//! implies (`(in - 1) · stride - pads + kernel` a dim); an `output_shape` larger than that
//! holds it in its leading corner, as ONNX's reference does.
//!
//! Canonical form: `kernel_shape`, `strides`, `pads` explicit and `output_shape` (the
//! constant third input, or the implied shape) an attribute; inputs X and Indices.

use crate::Node;
use crate::TensorDesc;
use crate::cpu::{Kernel, KernelError, OpCx, input, output_mut};
use crate::invalid;
use crate::lower::{LowerCx, OpResult, op_err};
use crate::tensor::{TensorMut, TensorRef};
use ingot_schema::{AttrValue, DType};

pub(super) fn lower(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let x = cx.input(0)?.shape.clone();
    let n = x.len().checked_sub(2).filter(|&n| n > 0).ok_or_else(|| op_err!("X {x:?}"))?;
    let kernel = node.attrs.ints("kernel_shape")?.to_vec();
    let strides = node.attrs.ints_opt("strides")?.map_or(vec![1; n], <[i64]>::to_vec);
    let pads = node.attrs.ints_opt("pads")?.map_or(vec![0; 2 * n], <[i64]>::to_vec);
    if kernel.len() != n || strides.len() != n || pads.len() != 2 * n {
        return Err(op_err!(
            "kernel_shape, strides and pads must have {n}, {n} and {} values",
            2 * n
        ));
    }
    let implied = implied(&x, &kernel, &strides, &pads)?;
    let shape = match cx.has_input(2) {
        false => implied.clone(),
        true => {
            let given = cx.const_ints(2, "output_shape")?.ok_or_else(|| {
                op_err!("output_shape (input 2) must be a constant once shapes are static")
            })?;
            let given: Vec<usize> = given.iter().map(|&d| d.max(0) as usize).collect();
            let fits =
                given.len() == implied.len() && given.iter().zip(&implied).all(|(g, i)| g >= i);
            if !fits {
                return Err(op_err!(
                    "output_shape {given:?} does not hold the unpooled {implied:?}"
                ));
            }
            given
        }
    };
    node.attrs.set("kernel_shape", AttrValue::Ints(kernel));
    node.attrs.set("strides", AttrValue::Ints(strides));
    node.attrs.set("pads", AttrValue::Ints(pads));
    node.attrs.set("output_shape", AttrValue::Ints(shape.iter().map(|&d| d as i64).collect()));
    node.inputs.truncate(2);
    Ok(())
}

/// The unpooled shape X's pool geometry implies.
fn implied(x: &[usize], kernel: &[i64], strides: &[i64], pads: &[i64]) -> OpResult<Vec<usize>> {
    let n = kernel.len();
    if n == 0 || x.len() != n + 2 || strides.len() != n || pads.len() != 2 * n {
        return Err(op_err!("X {x:?} does not fit kernel_shape {kernel:?}, strides and pads"));
    }
    let mut shape = x[..2].to_vec();
    for d in 0..n {
        let v = (x[d + 2] as i64 - 1) * strides[d] - (pads[d] + pads[n + d]) + kernel[d];
        shape.push(usize::try_from(v).map_err(|_| op_err!("the unpooled dim {d} is {v}"))?);
    }
    Ok(shape)
}

pub(super) fn infer(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let [x, indices] = inputs else {
        return Err(op_err!("takes X and Indices, not {} inputs", inputs.len()));
    };
    if indices.dtype != DType::I64 || indices.shape != x.shape || !x.dtype.is_float() {
        return Err(op_err!(
            "X {} {:?} and Indices {} {:?}",
            x.dtype,
            x.shape,
            indices.dtype,
            indices.shape
        ));
    }
    let shape = node.attrs.ints("output_shape")?.iter().map(|&d| d as usize).collect::<Vec<_>>();
    Ok(vec![TensorDesc::new(x.dtype, shape)])
}

/// The shapes both backends read: the unpooled one the indices count in, and the output's.
pub(crate) fn shapes(
    attrs: &ingot_schema::Attrs,
    x: &[usize],
) -> Result<(Vec<usize>, Vec<usize>), String> {
    let ints = |name: &str| attrs.ints(name).map(<[i64]>::to_vec).map_err(|e| e.to_string());
    let inner =
        implied(x, &ints("kernel_shape")?, &ints("strides")?, &ints("pads")?).map_err(|e| e.0)?;
    let out = ints("output_shape")?.iter().map(|&d| d as usize).collect();
    Ok((inner, out))
}

struct MaxUnpool {
    elements: usize,
    inner: Vec<usize>,
    out: Vec<usize>,
}

pub(super) fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(2..=2, 1)?;
    let x = &cx.inputs[0];
    if x.dtype != DType::F32 {
        return Err(cx.dtype_error(x.dtype));
    }
    let (inner, out) = shapes(cx.attrs, &x.shape).map_err(|e| invalid!("MaxUnpool: {e}"))?;
    if out != cx.outputs[0].shape {
        return Err(invalid!("MaxUnpool to {out:?}, its output is {:?}", cx.outputs[0].shape));
    }
    Ok(Box::new(MaxUnpool { elements: x.elements(), inner, out }))
}

impl Kernel for MaxUnpool {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let x = input::<f32>(inputs, 0, self.elements)?;
        let indices = input::<i64>(inputs, 1, self.elements)?;
        let y = output_mut::<f32>(outputs, 0, self.out.iter().product())?;
        y.fill(0.0);
        let inner: usize = self.inner.iter().product();
        for (&v, &i) in x.iter().zip(indices) {
            let at = usize::try_from(i).ok().filter(|&i| i < inner).ok_or_else(|| {
                KernelError::Data(format!(
                    "MaxUnpool index {i} is out of range for the unpooled {:?}",
                    self.inner
                ))
            })?;
            y[place(at, &self.inner, &self.out)] = v;
        }
        Ok(())
    }
}

/// Where flat index `at` of `inner` lies in `out`, which holds `inner` in its leading corner.
fn place(mut at: usize, inner: &[usize], out: &[usize]) -> usize {
    let mut coords = vec![0; inner.len()];
    for (c, &d) in coords.iter_mut().zip(inner).rev() {
        *c = at % d;
        at /= d;
    }
    coords.iter().zip(out).fold(0, |acc, (&c, &d)| acc * d + c)
}

#[cfg(test)]
mod tests {
    use crate::cpu::eval;
    use crate::tensor::{Tensor, TensorDesc};
    use ingot_schema::{AttrValue, Attrs, DType};

    #[test]
    fn values_go_back_where_the_indices_say() {
        // A 2x2 pool of a 4x4 image unpooled into 5x5: the 4x4 sits in the leading corner.
        let a = Attrs::new()
            .with("kernel_shape", AttrValue::Ints(vec![2, 2]))
            .with("strides", AttrValue::Ints(vec![2, 2]))
            .with("pads", AttrValue::Ints(vec![0; 4]))
            .with("output_shape", AttrValue::Ints(vec![1, 1, 5, 5]));
        let x = Tensor::from_vec(vec![1, 1, 2, 2], &[1.0f32, 2.0, 3.0, 4.0]).unwrap();
        let unpool = |indices: &[i64]| {
            let i = Tensor::from_vec(vec![1, 1, 2, 2], indices).unwrap();
            eval("MaxUnpool", &a, &[&x, &i], &[TensorDesc::new(DType::F32, [1, 1, 5, 5])])
        };
        // Flat 4x4 indices 5, 7, 8, 15: rows 1, 1, 2, 3 and columns 1, 3, 0, 3.
        let y = unpool(&[5, 7, 8, 15]).unwrap();
        let mut want = [0.0f32; 25];
        (want[6], want[8], want[10], want[18]) = (1.0, 2.0, 3.0, 4.0);
        assert_eq!(y[0].as_slice::<f32>().unwrap(), want);
        let e = unpool(&[5, 7, 8, 16]).unwrap_err().to_string();
        assert!(e.contains("index 16 is out of range"), "{e}");
    }
}
