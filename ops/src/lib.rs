//! What Ingot's ops mean, in one place for the compiler and the runtime.
//!
//! One folder per op family (`conv/`, `elementwise/`, ...): how an ONNX node of the family
//! becomes canonical and what it produces (`mod.rs`), and its CPU kernels (`cpu.rs`), which are
//! both the CPU backend and what constant folding evaluates. [`registry`] finds an op by name
//! and says what it has; [`lower`] is the canonical form lowering produces; [`tensor`] the
//! tensor types every stage shares.

#[cfg(feature = "lower")]
pub mod bounded;
pub mod cpu;
pub mod lower;
pub mod minifloat;
mod node;
pub mod registry;
pub mod tensor;
#[cfg(feature = "wgsl")]
pub mod vulkan;

mod attention;
mod conv;
mod elementwise;
mod loss;
mod matmul;
mod movement;
mod norm;
mod pool;
mod quantize;
mod reduce;
mod resize;
mod rnn;
mod rotary;
mod select;
mod spectral;
mod topk;

pub use conv::{can_scale_x, dequantizes_w, scales_x, weight_table_shape};
pub use ingot_schema::DType;
pub use matmul::{dequantization_shape, dequantizes_b};
pub use node::{Constant, Node, ValueId};
#[cfg(feature = "lower")]
pub use quantize::keeps_constant_narrow;
pub use registry::{Op, OpDef, can_run_in_place, is_view, lookup, supported_ops};
pub use tensor::{Element, Tensor, TensorDesc, TensorError, TensorMut, TensorRef};

/// Whether input `slot` of a float32 step of `op` may be float16, which the kernels of every
/// backend widen exactly as they load it: a Conv's W, or a MatMul's or Gemm's B, unless the
/// step dequantizes 8-bit weights there. The compiler's `widen_f16` leaves a constant f16
/// weight so: half the bytes in the bundle and in memory, and no step that widens it each run.
pub fn takes_f16_weights(op: &str, attrs: &ingot_schema::Attrs, slot: usize) -> bool {
    slot == 1
        && match op {
            "Conv" => !dequantizes_w(attrs),
            "MatMul" | "Gemm" => !dequantizes_b(attrs),
            _ => false,
        }
}
