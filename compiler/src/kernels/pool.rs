//! Vulkan kernels of the pool family (ops: runtime/src/cpu/pool.rs).

use super::{Dispatch, KernelCx, NoKernel};

pub const OPS: &[&str] = &[];

pub fn lower(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    Err(crate::no_kernel!("no Vulkan kernel for {}", cx.op))
}
