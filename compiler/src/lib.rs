//! Ingot's ahead-of-time compiler: ONNX in, memory-planned bundle out.

pub mod ir;
pub mod ops;
