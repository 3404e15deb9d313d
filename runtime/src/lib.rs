//! Ingot's runtime: opens a bundle the compiler wrote and runs it.
//!
//! It has no compiler code, no graph logic and no shader compiler: the bundle says which steps
//! run, where every tensor lives and how big the arena is; the runtime checks all of it and
//! follows it.

pub mod backend;
pub mod bundle;
mod carve;
pub mod cpu;
pub mod failsafe;
pub mod ledger;
pub mod session;
pub use ingot_ops::minifloat;
pub use ingot_ops::tensor;
#[cfg(feature = "vulkan")]
pub mod vulkan;

pub use backend::{Device, Executable, Faults, KernelClass, SessionError, Stage, StepTime};
pub use bundle::{Bundle, BundleError};
pub use failsafe::{Placement, Skip, SubmodelPlacement};
pub use ingot_schema::DType;
pub use ledger::{Ledger, MemoryKind};
pub use session::{IoInfo, Session, SessionOptions, StepProfile};
pub use tensor::{Element, Tensor, TensorDesc, TensorError, TensorMut, TensorRef};
