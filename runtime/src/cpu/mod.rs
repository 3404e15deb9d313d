//! The CPU backend: every op Ingot accepts, in float32 (plus the integer and bool types that
//! models use for ids, shapes and masks). It is also the numeric reference: the compiler's
//! constant folding evaluates with these same kernels, so an op has one implementation.
//!
//! One file per op family. Each family lists the ops it owns in `OPS` and builds a kernel for
//! one step in `prepare`, where attributes are read and shapes are checked once; `run` then
//! only computes. Attributes arrive in canonical form (see `compiler/src/ops`): every
//! attribute is explicit, no defaults are guessed here.

use crate::tensor::{Tensor, TensorDesc, TensorError, TensorMut, TensorRef};
pub use executable::CpuExecutable;
use ingot_schema::{AttrError, Attrs, DType};

mod conv;
mod elementwise;
mod executable;
mod gemm;
mod matmul;
mod movement;
mod norm;
mod parallel;
mod pool;
pub mod post;
mod reduce;
mod resize;
mod rnn;

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
    /// asks this where [`can_run_in_place`] allows it.
    fn run_in_place(
        &self,
        aliased: usize,
        inputs: &[TensorRef<'_>],
        outputs: &mut [TensorMut<'_>],
    ) -> Result<(), KernelError> {
        let _ = (aliased, inputs, outputs);
        Err(KernelError::Invalid(
            "this kernel cannot run in place".into(),
        ))
    }
}

/// Whether the planner may make `op` (with canonical `attrs`) write its output over input
/// `input`, once that input is dead after the step and has the output's type: any input of an
/// elementwise op, whose output element `i` depends only on element `i` of each operand; the
/// residual R of a Conv, ConvTranspose, Gemm or MatMul whose post-ops start with `Add`, which
/// the kernel accumulates onto (see [`post`]).
pub fn can_run_in_place(op: &str, attrs: &Attrs, input: usize) -> bool {
    elementwise::runs_in_place(op) || post::in_place_input(op, attrs) == Some(input)
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
        KernelError::DType {
            op: self.op.to_string(),
            dtype,
        }
    }
}

/// Input `i` as `len` f32 elements; an error, not a panic, when it is missing or differs
/// from what `prepare` checked.
pub(crate) fn input_f32<'a>(
    inputs: &[TensorRef<'a>],
    i: usize,
    len: usize,
) -> Result<&'a [f32], KernelError> {
    let t = inputs
        .get(i)
        .ok_or_else(|| invalid!("input {i} is missing"))?;
    let s = t.as_slice::<f32>()?;
    if s.len() != len {
        return Err(invalid!(
            "input {i} has {} elements, expected {len}",
            s.len()
        ));
    }
    Ok(s)
}

/// Output `i` as `len` writable elements of type `T`.
pub(crate) fn output_mut<'a, T: crate::tensor::Element>(
    outputs: &'a mut [TensorMut<'_>],
    i: usize,
    len: usize,
) -> Result<&'a mut [T], KernelError> {
    let t = outputs
        .get_mut(i)
        .ok_or_else(|| invalid!("output {i} is missing"))?;
    tensor_mut(t, len)
}

/// One output tensor as `len` writable elements of type `T`.
pub(crate) fn tensor_mut<'a, T: crate::tensor::Element>(
    t: &'a mut TensorMut<'_>,
    len: usize,
) -> Result<&'a mut [T], KernelError> {
    let s = t.as_slice_mut::<T>()?;
    if s.len() != len {
        return Err(invalid!(
            "an output has {} elements, expected {len}",
            s.len()
        ));
    }
    Ok(s)
}

struct Family {
    ops: &'static [&'static str],
    prepare: fn(&OpCx) -> Result<Box<dyn Kernel>, KernelError>,
}

const FAMILIES: &[Family] = &[
    Family {
        ops: elementwise::OPS,
        prepare: elementwise::prepare,
    },
    Family {
        ops: conv::OPS,
        prepare: conv::prepare,
    },
    Family {
        ops: pool::OPS,
        prepare: pool::prepare,
    },
    Family {
        ops: matmul::OPS,
        prepare: matmul::prepare,
    },
    Family {
        ops: norm::OPS,
        prepare: norm::prepare,
    },
    Family {
        ops: movement::OPS,
        prepare: movement::prepare,
    },
    Family {
        ops: reduce::OPS,
        prepare: reduce::prepare,
    },
    Family {
        ops: resize::OPS,
        prepare: resize::prepare,
    },
    Family {
        ops: rnn::OPS,
        prepare: rnn::prepare,
    },
];

/// Every op type the CPU backend runs, sorted.
pub fn supported_ops() -> Vec<&'static str> {
    let mut ops: Vec<_> = FAMILIES
        .iter()
        .flat_map(|f| f.ops.iter().copied())
        .collect();
    ops.sort_unstable();
    ops
}

/// Builds the kernel for one step.
pub fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    FAMILIES
        .iter()
        .find(|f| f.ops.contains(&cx.op))
        .ok_or_else(|| KernelError::UnknownOp(cx.op.to_string()))
        .and_then(|f| (f.prepare)(cx))
}

/// Runs one op on owned tensors: what constant folding and unit tests use.
pub fn eval(
    op: &str,
    attrs: &Attrs,
    inputs: &[&Tensor],
    outputs: &[TensorDesc],
) -> Result<Vec<Tensor>, KernelError> {
    let in_descs: Vec<TensorDesc> = inputs.iter().map(|t| t.desc().clone()).collect();
    let kernel = prepare(&OpCx {
        op,
        attrs,
        inputs: &in_descs,
        outputs,
    })?;
    let mut outs: Vec<Tensor> = outputs.iter().cloned().map(Tensor::zeros).collect();
    let views: Vec<TensorRef> = inputs.iter().map(|t| t.view()).collect();
    let mut out_views: Vec<TensorMut> = outs.iter_mut().map(Tensor::view_mut).collect();
    kernel.run(&views, &mut out_views)?;
    Ok(outs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_belongs_to_one_family() {
        let ops = supported_ops();
        let mut dedup = ops.clone();
        dedup.dedup();
        assert_eq!(ops, dedup, "an op is claimed by two families");
    }
}
