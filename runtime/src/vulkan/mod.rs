//! The Vulkan backend (ash): device choice, memory in plan order, pipelines from the bundle's
//! SPIR-V, one recorded command buffer per variant, replayed per run.
//!
//! - [`context`]: the loader, the instance (with the validation layer when
//!   `INGOT_VULKAN_VALIDATION=1`, plus synchronization validation when it is `sync`), the
//!   device and its queue, shared process-wide per [`DeviceChoice`] and freed with the last
//!   executable that uses it.
//! - [`memory`]: buffers and their memory, every allocation and free recorded in the
//!   [`Ledger`](crate::ledger::Ledger).
//! - [`executable`]: a variant made ready to run: pipelines, weights uploaded and arena and IO
//!   buffer allocated in the plan's order, descriptor sets, and the command buffer.
//! - [`pipeline_cache`]: a pipeline cache kept in a file between runs
//!   ([`VulkanOptions::pipeline_cache`]).
//! - [`layout`]: the arithmetic (IO layout, descriptor ranges, barriers), unit-tested.
//!
//! The libvulkan loader is opened at run time: without it, or without a usable device, every
//! entry point returns a [`VulkanError`] and the caller falls back to another backend.
#![allow(unsafe_code)]

mod context;
mod executable;
mod layout;
mod memory;
mod pipeline_cache;

pub use executable::VulkanExecutable;

use crate::backend::SessionError;
pub use crate::backend::{DeviceChoice, KernelClass, VulkanOptions};
use crate::ledger::MemoryKind;
pub use ash::vk::Result as VkResult;

/// A physical device as [`devices`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Its index in the instance's enumeration order ([`DeviceChoice::Index`]).
    pub index: usize,
    pub name: String,
    /// "discrete", "integrated", "virtual", "cpu" or "other".
    pub kind: &'static str,
    /// The Vulkan version the device supports, e.g. "1.3.230".
    pub api_version: String,
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "device {} '{}' ({})", self.index, self.name, self.kind)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum VulkanError {
    /// No libvulkan, or one without its entry points.
    #[error("Vulkan loader: {0}")]
    Loader(String),
    /// The instance could not be created (no driver, no validation layer when asked for).
    #[error("Vulkan instance: {0}")]
    Instance(String),
    /// No device, no such device, no compute queue, or the logical device failed.
    #[error("Vulkan device: {0}")]
    Device(String),
    #[error("Vulkan pipeline for kernel {kernel} '{name}' on {device}: {reason}")]
    Pipeline { device: String, kernel: usize, name: String, reason: String },
    #[error("Vulkan allocation of {bytes} bytes of {kind} memory ({label}) on {device}: {reason}")]
    Allocation { device: String, kind: MemoryKind, bytes: u64, label: String, reason: String },
    #[error("Vulkan {device}: {what} needs {limit} >= {need}, the device has {value}")]
    Limits { device: String, limit: &'static str, value: u64, need: u64, what: String },
    #[error("step {index} '{name}' ({op}) has no Vulkan kernel for {class} devices: {reason}")]
    Unsupported { index: usize, name: String, op: String, class: &'static str, reason: String },
    /// The bundle is valid but not what this backend can follow (e.g. its allocation schedule
    /// misses a buffer a dispatch binds).
    #[error("bundle cannot run on Vulkan: {0}")]
    Bundle(String),
    #[error("Vulkan {stage} failed on {device}: {result}")]
    Submit { device: String, stage: &'static str, result: VkResult },
    #[error("Vulkan {device} was lost ({stage})")]
    DeviceLost { device: String, stage: &'static str },
    /// `run` was given the wrong number or size of inputs or outputs.
    #[error("{0}")]
    Arguments(String),
}

impl From<VulkanError> for SessionError {
    fn from(e: VulkanError) -> SessionError {
        SessionError::Vulkan(Box::new(e))
    }
}

/// The physical devices the loader reports, in enumeration order (the indices of
/// [`DeviceChoice::Index`]). Creates and drops an instance of its own.
pub fn devices() -> Result<Vec<DeviceInfo>, VulkanError> {
    let instance = context::Instance::new(context::validation_requested())?;
    Ok(instance.physical_devices()?.into_iter().map(|p| p.info).collect())
}

/// Every warning and error the validation layer reported in this process, oldest first
/// (empty unless `INGOT_VULKAN_VALIDATION` is `1` or `sync`).
pub fn validation_messages() -> Vec<String> {
    context::validation_messages(false)
}

/// The [`validation_messages`] reported on this thread: those of its own Vulkan calls (the
/// layer calls back on the calling thread), apart from those of other threads running at the
/// same time.
pub fn validation_messages_of_this_thread() -> Vec<String> {
    context::validation_messages(true)
}
