//! (family stub: to be filled in)

use super::{Kernel, KernelError, OpCx};

pub const OPS: &[&str] = &[];

pub fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    Err(KernelError::UnknownOp(cx.op.to_string()))
}
