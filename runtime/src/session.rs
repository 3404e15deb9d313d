//! A session runs one variant of a bundle on one device. It checks what the caller passes,
//! owns the outputs, and hands the work to an [`Executable`]: the variant prepared for a
//! device. It does not know what a device is.

use crate::bundle::{Bundle, BundleError, tensor_desc};
use crate::cpu::{CpuExecutable, KernelError};
use crate::ledger::Ledger;
use crate::tensor::{Tensor, TensorDesc};
use std::sync::Arc;

/// Where a session runs.
#[derive(Clone, Debug, Default)]
pub enum Device {
    #[default]
    Cpu,
    #[cfg(feature = "vulkan")]
    Vulkan(crate::vulkan::VulkanOptions),
}

impl Device {
    /// The device names [`Device::parse`] knows.
    pub const NAMES: &'static str = "cpu, vulkan, vulkan:N, vulkan:cpu";

    /// A device by name: `cpu`; `vulkan` (the best Vulkan device: discrete, integrated,
    /// virtual, then CPU-type), `vulkan:N` (by index), `vulkan:cpu` (a CPU-type device such
    /// as lavapipe).
    pub fn parse(name: &str) -> Result<Device, SessionError> {
        #[cfg(feature = "vulkan")]
        {
            use crate::vulkan::{DeviceChoice, VulkanOptions};
            let choice = match name {
                "vulkan" => Some(DeviceChoice::Best),
                "vulkan:cpu" => Some(DeviceChoice::CpuType),
                _ => name
                    .strip_prefix("vulkan:")
                    .and_then(|n| n.parse().ok())
                    .map(DeviceChoice::Index),
            };
            if let Some(device) = choice {
                return Ok(Device::Vulkan(VulkanOptions {
                    device,
                    ..VulkanOptions::default()
                }));
            }
        }
        match name {
            "cpu" => Ok(Device::Cpu),
            _ => Err(SessionError::UnknownDevice {
                name: name.into(),
                known: if cfg!(feature = "vulkan") {
                    Device::NAMES
                } else {
                    "cpu (this build has no Vulkan backend)"
                },
            }),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct SessionOptions {
    /// The variant to run; `None` means the bundle's first variant.
    pub variant: Option<String>,
    pub device: Device,
    /// Where device memory is recorded; a fresh ledger when `None`.
    pub ledger: Option<Ledger>,
}

/// A graph input or output as the caller sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoInfo {
    pub name: String,
    pub desc: TensorDesc,
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error("unknown device '{name}'; known devices: {known}")]
    UnknownDevice { name: String, known: &'static str },
    #[error("bundle has no variants")]
    NoVariant,
    #[error("cannot prepare step {index} '{name}' ({op}): {source}")]
    Prepare {
        index: usize,
        name: String,
        op: String,
        source: KernelError,
    },
    #[error("step {index} '{name}' ({op}) failed: {source}")]
    Step {
        index: usize,
        name: String,
        op: String,
        source: KernelError,
    },
    #[error("expected {expected} inputs ({names}), got {got}")]
    InputCount {
        expected: usize,
        got: usize,
        names: String,
    },
    #[error("input '{name}' should be {expected_dtype} {expected:?}, got {got_dtype} {got:?}")]
    InputMismatch {
        name: String,
        expected_dtype: ingot_schema::DType,
        expected: Vec<usize>,
        got_dtype: ingot_schema::DType,
        got: Vec<usize>,
    },
    #[error("cannot allocate the {bytes}-byte activation arena")]
    ArenaAllocation { bytes: u64 },
    #[error("cannot allocate {bytes} bytes for output '{name}'")]
    OutputAllocation { name: String, bytes: usize },
    #[cfg(feature = "vulkan")]
    #[error(transparent)]
    Vulkan(#[from] crate::vulkan::VulkanError),
    #[error("the plan makes step {index} '{name}' ({op}) read bytes it writes")]
    Aliasing {
        index: usize,
        name: String,
        op: String,
    },
}

/// A variant prepared for one device.
pub trait Executable {
    /// Runs the variant: `inputs` are checked, `outputs` allocated and zeroed, both in the
    /// variant's order.
    fn run(&mut self, inputs: &[Tensor], outputs: &mut [Tensor]) -> Result<(), SessionError>;
}

pub struct Session {
    inputs: Vec<IoInfo>,
    outputs: Vec<IoInfo>,
    executable: Box<dyn Executable>,
    device: String,
    arena_bytes: usize,
    ledger: Ledger,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("device", &self.device)
            .field("arena_bytes", &self.arena_bytes)
            .finish()
    }
}

impl Session {
    pub fn new(bundle: Arc<Bundle>, options: SessionOptions) -> Result<Session, SessionError> {
        let manifest = bundle.manifest();
        let index = match &options.variant {
            Some(name) => bundle.variant_index(name)?,
            None if manifest.variants.is_empty() => return Err(SessionError::NoVariant),
            None => 0,
        };
        let variant = &manifest.variants[index];
        let io = |list: &[u32]| -> Vec<IoInfo> {
            list.iter()
                .map(|&t| IoInfo {
                    name: variant.tensors[t as usize].name.clone(),
                    desc: tensor_desc(&variant.tensors[t as usize]),
                })
                .collect()
        };
        let (inputs, outputs) = (io(&variant.inputs), io(&variant.outputs));
        // Memory first: kernels may build tables as long as their outputs' dims, so outputs
        // that could never be allocated are refused before any kernel is prepared.
        for o in &outputs {
            probe_output(o)?;
        }
        let arena_bytes = variant.plan.as_ref().map_or(0, |p| p.arena_bytes as usize);
        let ledger = options.ledger.unwrap_or_default();
        let (executable, device): (Box<dyn Executable>, String) = match &options.device {
            Device::Cpu => (
                Box::new(CpuExecutable::new(bundle, index, &ledger)?),
                "cpu".into(),
            ),
            #[cfg(feature = "vulkan")]
            Device::Vulkan(vulkan) => {
                let e = crate::vulkan::VulkanExecutable::new(bundle, index, vulkan, &ledger)?;
                let name = format!("vulkan:{} ({})", e.device().index, e.device().name);
                (Box::new(e), name)
            }
        };
        Ok(Session {
            inputs,
            outputs,
            executable,
            device,
            arena_bytes,
            ledger,
        })
    }

    pub fn inputs(&self) -> &[IoInfo] {
        &self.inputs
    }

    pub fn outputs(&self) -> &[IoInfo] {
        &self.outputs
    }

    /// Bytes of the activation arena this session holds.
    pub fn arena_bytes(&self) -> usize {
        self.arena_bytes
    }

    /// The device the session runs on, e.g. `cpu` or `vulkan:0 (llvmpipe ...)`.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// The record of the device memory this session allocated and freed.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Runs the variant on `inputs` (in the order of [`Session::inputs`]) and returns its
    /// outputs (in the order of [`Session::outputs`]).
    pub fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, SessionError> {
        self.check_inputs(inputs)?;
        let mut outputs = self
            .outputs
            .iter()
            .map(zeroed_output)
            .collect::<Result<Vec<_>, _>>()?;
        self.executable.run(inputs, &mut outputs)?;
        Ok(outputs)
    }

    fn check_inputs(&self, inputs: &[Tensor]) -> Result<(), SessionError> {
        if inputs.len() != self.inputs.len() {
            return Err(SessionError::InputCount {
                expected: self.inputs.len(),
                got: inputs.len(),
                names: self
                    .inputs
                    .iter()
                    .map(|i| i.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        for (info, t) in self.inputs.iter().zip(inputs) {
            if t.desc() != &info.desc {
                return Err(SessionError::InputMismatch {
                    name: info.name.clone(),
                    expected_dtype: info.desc.dtype,
                    expected: info.desc.shape.clone(),
                    got_dtype: t.dtype(),
                    got: t.shape().to_vec(),
                });
            }
        }
        Ok(())
    }
}

/// Errors if memory for output `info` cannot be had. `Tensor::zeros` aborts the process when
/// the allocator refuses, so the allocation is tried fallibly (and released) first.
fn probe_output(info: &IoInfo) -> Result<(), SessionError> {
    let bytes = info.desc.bytes();
    Vec::<u64>::new()
        .try_reserve_exact(bytes.div_ceil(8))
        .map_err(|_| SessionError::OutputAllocation {
            name: info.name.clone(),
            bytes,
        })
}

/// A zeroed tensor for an output, or an error where memory for it cannot be had.
fn zeroed_output(info: &IoInfo) -> Result<Tensor, SessionError> {
    probe_output(info)?;
    Ok(Tensor::zeros(info.desc.clone()))
}

#[cfg(feature = "vulkan")]
impl Executable for crate::vulkan::VulkanExecutable {
    fn run(&mut self, inputs: &[Tensor], outputs: &mut [Tensor]) -> Result<(), SessionError> {
        let inputs: Vec<_> = inputs.iter().map(Tensor::view).collect();
        let mut outputs: Vec<_> = outputs.iter_mut().map(Tensor::view_mut).collect();
        Ok(crate::vulkan::VulkanExecutable::run(
            self,
            &inputs,
            &mut outputs,
        )?)
    }
}
