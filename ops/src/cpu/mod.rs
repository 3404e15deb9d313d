//! The CPU kernels' shared machinery: every op Ingot accepts runs on the CPU, in float32 (plus
//! the integer and bool types that models use for ids, shapes and masks). They are also the
//! numeric reference: the compiler's constant folding evaluates with these same kernels, so an
//! op has one implementation.
//!
//! Each family's kernels live in its own folder (`conv/cpu.rs`, ...) and are found through the
//! registry. A family builds a kernel for one step in `prepare`, where attributes are read and
//! shapes are checked once; `run` then only computes. Attributes arrive in canonical form (see
//! [`crate::lower`]): every attribute is explicit, no defaults are guessed here.

use crate::tensor::{Tensor, TensorDesc, TensorError, TensorMut, TensorRef};
use ingot_schema::{AttrError, Attrs, DType};

pub(crate) mod gemm;
pub mod parallel;
pub mod post;
mod widen;

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("op {0} has no CPU kernel")]
    UnknownOp(String),
    #[error(transparent)]
    Attr(#[from] AttrError),
    #[error(transparent)]
    Tensor(#[from] TensorError),
    #[error("{0}")]
    Invalid(String),
    /// The input data is outside what the op defines (an index out of range): no other
    /// device would do better, so the error goes to the caller, not to the failover.
    #[error("{0}")]
    Data(String),
    #[error("element type {dtype} is not supported by {op} on the CPU")]
    DType { op: String, dtype: DType },
}

/// Shorthand for an `Invalid` error with a formatted message.
#[macro_export]
macro_rules! invalid {
    ($($arg:tt)*) => { $crate::cpu::KernelError::Invalid(format!($($arg)*)) };
}

/// A kernel prepared for one step: shapes and attributes are fixed.
pub trait Kernel: Send + Sync {
    fn run(
        &self,
        inputs: &[TensorRef<'_>],
        outputs: &mut [TensorMut<'_>],
    ) -> Result<(), KernelError>;

    /// Runs with `outputs[0]` occupying the same bytes as `inputs[aliased]`: the kernel reads
    /// that operand from `outputs[0]` (`inputs[aliased].bytes` is empty). The planner only
    /// asks this where [`crate::can_run_in_place`] allows it.
    fn run_in_place(
        &self,
        aliased: usize,
        inputs: &[TensorRef<'_>],
        outputs: &mut [TensorMut<'_>],
    ) -> Result<(), KernelError> {
        let _ = (aliased, inputs, outputs);
        Err(KernelError::Invalid("this kernel cannot run in place".into()))
    }
}

/// Everything `prepare` may look at for one step.
#[derive(Clone, Copy, Debug)]
pub struct OpCx<'a> {
    pub op: &'a str,
    pub attrs: &'a Attrs,
    pub inputs: &'a [TensorDesc],
    pub outputs: &'a [TensorDesc],
}

impl OpCx<'_> {
    /// Errors unless there are exactly `n_in` inputs and `n_out` outputs.
    pub fn expect_arity(
        &self,
        n_in: std::ops::RangeInclusive<usize>,
        n_out: usize,
    ) -> Result<(), KernelError> {
        if !n_in.contains(&self.inputs.len()) || self.outputs.len() != n_out {
            return Err(invalid!(
                "{} takes {:?} inputs and {} outputs, got {} and {}",
                self.op,
                n_in,
                n_out,
                self.inputs.len(),
                self.outputs.len()
            ));
        }
        Ok(())
    }

    pub fn dtype_error(&self, dtype: DType) -> KernelError {
        KernelError::DType { op: self.op.to_string(), dtype }
    }
}

/// Input `i` as `len` elements of `T`; an error, not a panic, when it is missing or differs
/// from what `prepare` checked.
pub(crate) fn input<'a, T: crate::tensor::Element>(
    inputs: &[TensorRef<'a>],
    i: usize,
    len: usize,
) -> Result<&'a [T], KernelError> {
    let t = inputs.get(i).ok_or_else(|| invalid!("input {i} is missing"))?;
    let s = t.as_slice::<T>()?;
    if s.len() != len {
        return Err(invalid!("input {i} has {} elements, expected {len}", s.len()));
    }
    Ok(s)
}

/// Input `i` as `len` f32 elements.
pub(crate) fn input_f32<'a>(
    inputs: &[TensorRef<'a>],
    i: usize,
    len: usize,
) -> Result<&'a [f32], KernelError> {
    input(inputs, i, len)
}

/// A float32 or float64 tensor's values as f64 (the kernels that compute in f64 whatever
/// their float type).
pub(crate) fn read_f64s(t: &TensorRef) -> Result<Vec<f64>, KernelError> {
    Ok(match t.dtype {
        DType::F64 => t.as_slice::<f64>()?.to_vec(),
        _ => t.as_slice::<f32>()?.iter().map(|&v| f64::from(v)).collect(),
    })
}

/// Writes f64 `values` into a float32 or float64 tensor of as many elements.
pub(crate) fn write_f64s(t: &mut TensorMut, values: &[f64]) -> Result<(), KernelError> {
    match t.dtype {
        DType::F64 => tensor_mut::<f64>(t, values.len())?.copy_from_slice(values),
        _ => {
            let out = tensor_mut::<f32>(t, values.len())?;
            out.iter_mut().zip(values).for_each(|(o, &v)| *o = v as f32);
        }
    }
    Ok(())
}

/// Output `i` as `len` writable elements of type `T`.
pub(crate) fn output_mut<'a, T: crate::tensor::Element>(
    outputs: &'a mut [TensorMut<'_>],
    i: usize,
    len: usize,
) -> Result<&'a mut [T], KernelError> {
    let t = outputs.get_mut(i).ok_or_else(|| invalid!("output {i} is missing"))?;
    tensor_mut(t, len)
}

/// One output tensor as `len` writable elements of type `T`.
pub(crate) fn tensor_mut<'a, T: crate::tensor::Element>(
    t: &'a mut TensorMut<'_>,
    len: usize,
) -> Result<&'a mut [T], KernelError> {
    let s = t.as_slice_mut::<T>()?;
    if s.len() != len {
        return Err(invalid!("an output has {} elements, expected {len}", s.len()));
    }
    Ok(s)
}

/// Builds the kernel for one step.
pub fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    let def = crate::lookup(cx.op).ok_or_else(|| KernelError::UnknownOp(cx.op.to_string()))?;
    let prepare = def.cpu().ok_or_else(|| KernelError::UnknownOp(cx.op.to_string()))?;
    match prepare(cx) {
        Err(e @ KernelError::DType { dtype: DType::F16, .. }) => {
            widen::prepare(cx, prepare).ok_or(e)
        }
        result => result,
    }
}

/// Whether the CPU kernel for `cx` takes its float16 operands only widened to f32
/// (`widen.rs`): the compiler then widens them in the graph instead, with casts every backend
/// runs, so that such a step runs on Vulkan's f32 kernels too.
pub fn widens_f16(cx: &OpCx) -> bool {
    let prepare = crate::lookup(cx.op).and_then(|def| def.cpu());
    prepare.is_some_and(|prepare| {
        matches!(prepare(cx), Err(KernelError::DType { dtype: DType::F16, .. }))
    })
}

/// Runs one op on owned tensors: what constant folding and unit tests use.
pub fn eval(
    op: &str,
    attrs: &Attrs,
    inputs: &[&Tensor],
    outputs: &[TensorDesc],
) -> Result<Vec<Tensor>, KernelError> {
    let in_descs: Vec<TensorDesc> = inputs.iter().map(|t| t.desc().clone()).collect();
    let kernel = prepare(&OpCx { op, attrs, inputs: &in_descs, outputs })?;
    let mut outs: Vec<Tensor> = outputs.iter().cloned().map(Tensor::zeros).collect();
    let views: Vec<TensorRef> = inputs.iter().map(|t| t.view()).collect();
    let mut out_views: Vec<TensorMut> = outs.iter_mut().map(Tensor::view_mut).collect();
    kernel.run(&views, &mut out_views)?;
    Ok(outs)
}
