//! Vulkan kernels of the movement family (ops: runtime/src/cpu/movement.rs).

use super::{Dispatch, KernelCx, NoKernel};

pub const OPS: &[&str] = &[];

pub fn lower(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    Err(crate::no_kernel!("no Vulkan kernel for {}", cx.op))
}
