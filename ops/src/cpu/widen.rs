//! Float16 steps of ops whose CPU kernel computes in float32 only (Conv, MatMul, the
//! reductions, ...): the f16 operands are widened to f32 as they are read, the f32 kernel
//! runs, and its f16 outputs are rounded once at the end. This is what ONNX Runtime's CPU
//! provider does for such nodes (it inserts the casts), and it is more exact than f16
//! arithmetic; a float16 model then runs on the CPU (and on Vulkan, where its steps without
//! an f16 kernel fall back to the CPU) instead of failing to load.

use super::{Kernel, KernelError, OpCx};
use crate::tensor::{TensorDesc, TensorMut, TensorRef};
use half::f16;
use ingot_schema::DType;

/// The f32 kernel for `cx` with its f16 operands widened, or `None` where `cx` has none or
/// the op's kernel refuses the widened step too.
pub(crate) fn prepare(
    cx: &OpCx,
    prepare: fn(&OpCx) -> Result<Box<dyn Kernel>, KernelError>,
) -> Option<Box<dyn Kernel>> {
    let wide = |descs: &[TensorDesc]| -> Vec<TensorDesc> {
        descs
            .iter()
            .map(|d| match d.dtype {
                DType::F16 => TensorDesc::new(DType::F32, d.shape.clone()),
                _ => d.clone(),
            })
            .collect()
    };
    let is_f16 = |descs: &[TensorDesc]| descs.iter().map(|d| d.dtype == DType::F16).collect();
    let (inputs, outputs): (Vec<bool>, Vec<bool>) = (is_f16(cx.inputs), is_f16(cx.outputs));
    if !inputs.iter().chain(&outputs).any(|&w| w) {
        return None;
    }
    let (wide_inputs, wide_outputs) = (wide(cx.inputs), wide(cx.outputs));
    let inner = prepare(&OpCx { inputs: &wide_inputs, outputs: &wide_outputs, ..*cx }).ok()?;
    Some(Box::new(Widened { inner, inputs, outputs, wide_outputs }))
}

struct Widened {
    inner: Box<dyn Kernel>,
    /// Per input and output: whether it is f16 (widened).
    inputs: Vec<bool>,
    outputs: Vec<bool>,
    wide_outputs: Vec<TensorDesc>,
}

fn widened(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect()
}

impl Widened {
    /// Runs the f32 kernel on `inputs`, where input `aliased` (if any) is read from
    /// `outputs[0]`'s bytes, then writes the outputs.
    fn run_reading(
        &self,
        aliased: Option<usize>,
        inputs: &[TensorRef<'_>],
        outputs: &mut [TensorMut<'_>],
    ) -> Result<(), KernelError> {
        if inputs.len() != self.inputs.len() || outputs.len() != self.outputs.len() {
            return Err(crate::invalid!("a widened f16 step got other operands than prepared"));
        }
        let aliased_bytes = aliased.map(|_| outputs[0].bytes.to_vec()).unwrap_or_default();
        let sources: Vec<&[u8]> = inputs
            .iter()
            .enumerate()
            .map(|(k, t)| if Some(k) == aliased { aliased_bytes.as_slice() } else { t.bytes })
            .collect();
        let scratch: Vec<Option<Vec<f32>>> = self
            .inputs
            .iter()
            .zip(&sources)
            .map(|(&wide, bytes)| wide.then(|| widened(bytes)))
            .collect();
        let views: Vec<TensorRef> = inputs
            .iter()
            .zip(&sources)
            .zip(&scratch)
            .map(|((t, &bytes), s)| match s {
                Some(s) => {
                    TensorRef { dtype: DType::F32, shape: t.shape, bytes: bytemuck::cast_slice(s) }
                }
                None => TensorRef { dtype: t.dtype, shape: t.shape, bytes },
            })
            .collect();
        let mut wide_out: Vec<Option<Vec<f32>>> = self
            .outputs
            .iter()
            .zip(&self.wide_outputs)
            .map(|(&wide, d)| wide.then(|| vec![0f32; d.elements()]))
            .collect();
        let mut out_views: Vec<TensorMut> = outputs
            .iter_mut()
            .zip(&mut wide_out)
            .map(|(t, s)| match s {
                Some(s) => TensorMut {
                    dtype: DType::F32,
                    shape: t.shape,
                    bytes: bytemuck::cast_slice_mut(s),
                },
                None => t.reborrow(),
            })
            .collect();
        self.inner.run(&views, &mut out_views)?;
        drop(out_views);
        for (t, s) in outputs.iter_mut().zip(&wide_out) {
            let Some(s) = s else { continue };
            if t.bytes.len() != s.len() * 2 {
                return Err(crate::invalid!("an f16 output has {} bytes", t.bytes.len()));
            }
            for (b, &v) in t.bytes.chunks_exact_mut(2).zip(s) {
                b.copy_from_slice(&f16::from_f32(v).to_le_bytes());
            }
        }
        Ok(())
    }
}

impl Kernel for Widened {
    fn run(
        &self,
        inputs: &[TensorRef<'_>],
        outputs: &mut [TensorMut<'_>],
    ) -> Result<(), KernelError> {
        self.run_reading(None, inputs, outputs)
    }

    /// The aliased operand is widened into scratch before anything is written, so the f32
    /// kernel never runs in place.
    fn run_in_place(
        &self,
        aliased: usize,
        inputs: &[TensorRef<'_>],
        outputs: &mut [TensorMut<'_>],
    ) -> Result<(), KernelError> {
        self.run_reading(Some(aliased), inputs, outputs)
    }
}

#[cfg(test)]
mod tests {
    use crate::cpu::{OpCx, eval, prepare};
    use crate::tensor::{Tensor, TensorDesc, TensorMut, TensorRef};
    use half::f16;
    use ingot_schema::{AttrValue, Attrs, DType};

    fn halves(v: &[f32]) -> Vec<f16> {
        v.iter().map(|&x| f16::from_f32(x)).collect()
    }

    #[test]
    fn an_f16_matmul_runs_in_f32_and_rounds_once() {
        let attrs = Attrs::new()
            .with("post_ops", AttrValue::Text(String::new()))
            .with("post_params", AttrValue::Floats(Vec::new()));
        // Summed in f32 and rounded once: the f16 nearest each exact sum.
        let a = [1.0, 1.0, 0.5, -3.0, 2.0, 0.25];
        let b = [1.0, 2f32.powi(-11), 2f32.powi(-11), 4.0, 1.0, 1.5];
        let (at, bt) = (
            Tensor::from_vec(vec![2, 3], &halves(&a)).unwrap(),
            Tensor::from_vec(vec![3, 2], &halves(&b)).unwrap(),
        );
        let out = TensorDesc::new(DType::F16, vec![2, 2]);
        let got = eval("MatMul", &attrs, &[&at, &bt], &[out]).unwrap().remove(0);
        let mut want = [0f32; 4];
        for (i, j) in (0..2).flat_map(|i| (0..2).map(move |j| (i, j))) {
            want[i * 2 + j] = (0..3).map(|k| a[i * 3 + k] * b[k * 2 + j]).sum();
        }
        assert_eq!(got.to_vec::<f16>().unwrap(), halves(&want));
        // An f64 step is not widened: it would lose precision.
        let d = Tensor::from_vec(vec![2, 2], &[0f64; 4]).unwrap();
        let hardmax = Attrs::new().with("axis", AttrValue::Int(1));
        let f64_out = TensorDesc::new(DType::F64, vec![2, 2]);
        let err = eval("Hardmax", &hardmax, &[&d], &[f64_out]).unwrap_err();
        assert!(err.to_string().contains("f64 is not supported by Hardmax"), "{err}");
    }

    #[test]
    fn an_f16_reduction_and_a_step_written_in_place() {
        let x = halves(&[1.5, -2.0, 7.25, 0.5]);
        let xt = Tensor::from_vec(vec![2, 2], &x).unwrap();
        let attrs =
            Attrs::new().with("axes", AttrValue::Ints(vec![1])).with("keepdims", AttrValue::Int(0));
        let out = TensorDesc::new(DType::F16, vec![2]);
        let got = eval("ReduceMax", &attrs, &[&xt], &[out]).unwrap().remove(0);
        assert_eq!(got.to_vec::<f16>().unwrap(), halves(&[1.5, 7.25]));
        // Widened by hand (Relu has an f16 kernel): the aliased input is read from the
        // output's bytes, which the kernel then overwrites.
        let desc = TensorDesc::new(DType::F16, vec![4]);
        let cx = OpCx {
            op: "Relu",
            attrs: &Attrs::new(),
            inputs: std::slice::from_ref(&desc),
            outputs: std::slice::from_ref(&desc),
        };
        let kernel = super::prepare(&cx, prepare).unwrap();
        let mut bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let shape = [4];
        let inputs = [TensorRef { dtype: DType::F16, shape: &shape, bytes: &[] }];
        let mut outputs = [TensorMut { dtype: DType::F16, shape: &shape, bytes: &mut bytes }];
        kernel.run_in_place(0, &inputs, &mut outputs).unwrap();
        let relu: Vec<f16> =
            bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]])).collect();
        assert_eq!(relu, halves(&[1.5, 0.0, 7.25, 0.5]));
    }
}
