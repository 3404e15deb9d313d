//! Vulkan kernels of the resize family (ops: runtime/src/cpu/resize.rs).

use super::{Dispatch, KernelCx, NoKernel};

pub const OPS: &[&str] = &[];

pub fn lower(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    Err(crate::no_kernel!("no Vulkan kernel for {}", cx.op))
}
