//! The Vulkan backend (ash): device choice, memory in plan order, pipelines from the bundle's
//! SPIR-V, one recorded command buffer per variant, replayed per run.
#![allow(unsafe_code)]
