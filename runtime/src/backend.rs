//! What the session, the failsafe and the backends share, at the bottom of the runtime's
//! imports (session -> failsafe -> {cpu, vulkan} -> backend): the devices a session may name
//! and their options, the [`Executable`] a backend prepares, the [`Stage`] a device failed at,
//! injected [`Faults`], and the one error type.

use crate::bundle::BundleError;
use crate::ledger::MemoryKind;
use crate::tensor::{TensorMut, TensorRef};
use ingot_ops::cpu::KernelError;
use std::fmt;
#[cfg(feature = "fault-injection")]
use std::sync::{Arc, Mutex};

/// Which of a step's Vulkan kernels a device runs: the bundle carries kernels for GPUs (tiles in
/// workgroup memory) and for CPU-type devices such as lavapipe (register blocking, no workgroup
/// memory) where they differ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelClass {
    /// The device's own class.
    #[default]
    Auto,
    /// The CPU-type kernels on any device.
    Cpu,
    /// The GPU kernels on any device (how CI runs them on lavapipe).
    Gpu,
}

impl KernelClass {
    /// `auto`, `cpu` or `gpu`.
    pub fn parse(name: &str) -> Result<KernelClass, SessionError> {
        match name {
            "auto" => Ok(KernelClass::Auto),
            "cpu" => Ok(KernelClass::Cpu),
            "gpu" => Ok(KernelClass::Gpu),
            _ => Err(SessionError::UnknownKernelClass(name.into())),
        }
    }
}

/// Which physical device to use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DeviceChoice {
    /// `vulkan`: the most capable usable hardware device, discrete > integrated > virtual
    /// GPU. Never a CPU-type device (lavapipe, SwiftShader): Ingot's CPU backend runs models
    /// several times faster in a fraction of the memory, so where the loader reports only
    /// CPU-type devices this choice fails, saying so, and a device list goes on to its next
    /// device (`cpu` in the default `vulkan,cpu`). Such a device is used only where named:
    /// [`CpuType`](DeviceChoice::CpuType) or [`Index`](DeviceChoice::Index).
    #[default]
    Best,
    /// `vulkan:N`: the device at this index of the loader's list (`vulkan::devices`),
    /// whatever its type.
    Index(usize),
    /// `vulkan:cpu`: the first usable device of type CPU (lavapipe, SwiftShader).
    CpuType,
}

#[derive(Clone, Debug, Default)]
pub struct VulkanOptions {
    pub device: DeviceChoice,
    /// Upload weights through a staging buffer even where device memory is host-visible (to
    /// test the path discrete GPUs take).
    pub force_staging: bool,
    /// Round every buffer's memory up to a multiple of this many bytes beyond what the device
    /// asks (0 or 1: as it asks): a device of coarser granularity on the one at hand, to test
    /// that the planned device peak follows a driver's rounding.
    pub allocation_granularity: u64,
    /// Which kernels run (a session sets it from [`SessionOptions::kernel_class`]).
    ///
    /// [`SessionOptions::kernel_class`]: crate::SessionOptions::kernel_class
    pub kernel_class: KernelClass,
    /// A file that keeps the device's compiled pipelines between runs of the app
    /// ([`SessionOptions::pipeline_cache`]).
    ///
    /// [`SessionOptions::pipeline_cache`]: crate::SessionOptions::pipeline_cache
    pub pipeline_cache: Option<std::path::PathBuf>,
}

/// Where a session runs.
#[derive(Clone, Debug, Default)]
pub enum Device {
    #[default]
    Cpu,
    #[cfg(feature = "vulkan")]
    Vulkan(VulkanOptions),
    /// A device this build cannot drive (a Vulkan name in a build without the Vulkan
    /// backend): listed so that one device list serves every build, and always skipped.
    Unavailable(String),
}

impl Device {
    /// The device names [`Device::parse`] knows.
    pub const NAMES: &'static str = "cpu, vulkan, vulkan:N, vulkan:cpu";

    /// A device by name: `cpu`; `vulkan` (the best Vulkan GPU: discrete, integrated, then
    /// virtual; never a CPU-type device), `vulkan:N` (by index, any type), `vulkan:cpu` (a
    /// CPU-type device such as lavapipe, used only where named).
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
                return Ok(Device::Vulkan(VulkanOptions { device, ..VulkanOptions::default() }));
            }
        }
        let vulkan_name = name == "vulkan"
            || name
                .strip_prefix("vulkan:")
                .is_some_and(|n| n == "cpu" || n.parse::<usize>().is_ok());
        match name {
            "cpu" => Ok(Device::Cpu),
            _ if vulkan_name => Ok(Device::Unavailable(name.into())),
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

    /// An ordered list of device names, comma-separated: `vulkan,cpu`.
    pub fn parse_list(names: &str) -> Result<Vec<Device>, SessionError> {
        names.split(',').map(str::trim).filter(|n| !n.is_empty()).map(Device::parse).collect()
    }

    /// The list a session tries when told nothing: a Vulkan GPU, then the CPU (the CPU alone
    /// in a build without the Vulkan backend, or on a machine whose only Vulkan devices are
    /// CPU-type).
    pub fn default_list() -> Vec<Device> {
        vec![
            #[cfg(feature = "vulkan")]
            Device::Vulkan(Default::default()),
            Device::Cpu,
        ]
    }

    /// The name [`Device::parse`] reads back.
    pub fn name(&self) -> String {
        match self {
            Device::Cpu => "cpu".into(),
            #[cfg(feature = "vulkan")]
            Device::Vulkan(o) => match o.device {
                DeviceChoice::Best => "vulkan".into(),
                DeviceChoice::CpuType => "vulkan:cpu".into(),
                DeviceChoice::Index(i) => format!("vulkan:{i}"),
            },
            Device::Unavailable(name) => name.clone(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error("unknown device '{name}'; known devices: {known}")]
    UnknownDevice { name: String, known: &'static str },
    #[error("unknown kernel class '{0}': use auto, cpu or gpu")]
    UnknownKernelClass(String),
    #[error("bundle has no variants")]
    NoVariant,
    #[error("cannot prepare step {index} '{name}' ({op}): {cause}")]
    Prepare { index: usize, name: String, op: String, cause: KernelError },
    #[error("step {index} '{name}' ({op}) failed: {cause}")]
    Step { index: usize, name: String, op: String, cause: KernelError },
    #[error("invalid input data: step {index} '{name}' ({op}): {cause}")]
    Data { index: usize, name: String, op: String, cause: KernelError },
    /// `side` is "input" or "output".
    #[error("expected {expected} {side}s ({names}), got {got}")]
    IoCount { side: &'static str, expected: usize, got: usize, names: String },
    #[error("{side} '{name}' should be {expected_dtype} {expected:?}, got {got_dtype} {got:?}")]
    IoMismatch {
        side: &'static str,
        name: String,
        expected_dtype: ingot_schema::DType,
        expected: Vec<usize>,
        got_dtype: ingot_schema::DType,
        got: Vec<usize>,
    },
    #[error(
        "{side} '{name}' is not aligned to {align} bytes, the size of its elements: \
         run_into reads and writes the caller's buffers in place"
    )]
    Misaligned { side: &'static str, name: String, align: usize },
    #[error("{side} '{name}' ({dtype} {shape:?}) needs {expected} bytes, got {got}")]
    IoBytes {
        side: &'static str,
        name: String,
        dtype: ingot_schema::DType,
        shape: Vec<usize>,
        expected: usize,
        got: usize,
    },
    #[error("cannot allocate the {bytes}-byte activation arena")]
    ArenaAllocation { bytes: u64 },
    #[error("cannot allocate the {bytes}-byte boundary buffer")]
    BoundaryAllocation { bytes: u64 },
    #[error("no device in the list can run submodel {submodel}:{tried}")]
    NoDevice { submodel: usize, tried: String },
    #[error("the device list is empty")]
    NoDevices,
    #[error("cannot start {threads} CPU threads: {reason}")]
    Threads { threads: usize, reason: String },
    #[error("this build of ingot-runtime has no backend for '{0}' (the `vulkan` feature is off)")]
    Unavailable(String),
    #[error("{0}")]
    NoKernel(String),
    #[error("injected fault: {device} at {stage}")]
    Injected { device: String, stage: Stage },
    #[error("the plan makes submodel {submodel} read bytes it writes")]
    BoundaryAliasing { submodel: usize },
    #[error("cannot allocate {bytes} bytes for output '{name}'")]
    OutputAllocation { name: String, bytes: usize },
    /// A Vulkan failure (`ingot_runtime::vulkan::VulkanError`, boxed: the Vulkan backend sits
    /// above this module).
    #[error(transparent)]
    Vulkan(Box<dyn std::error::Error + Send + Sync>),
    #[error("the plan makes step {index} '{name}' ({op}) read bytes it writes")]
    Aliasing { index: usize, name: String, op: String },
    #[error(
        "Loop '{name}' would run more than the {rows} iterations its scan outputs were planned \
         for (compile it with a larger --max-loop-iterations)"
    )]
    LoopRows { name: String, rows: usize },
}

/// A submodel prepared for one device (or for the first device of a list that works).
pub trait Executable: Send {
    /// Runs the submodel: `inputs` and `outputs` in the order of its lists, with the dtypes
    /// and shapes it expects (the session checked them; outputs are written whole).
    fn run(&mut self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), SessionError>;

    /// Runs as [`Executable::run`] does and times every step, in order. A device that would
    /// overlap steps runs them one after another here, so the run may take a little longer
    /// than an unprofiled one.
    fn run_profiled(
        &mut self,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
    ) -> Result<Vec<StepTime>, SessionError>;

    /// The bytes this device allocates, as its ledger records them, for a buffer of `bytes`
    /// of `kind` (a Vulkan driver rounds a buffer's memory up to its own granularity; the CPU
    /// allocates what it is asked).
    fn allocated_bytes(&self, kind: MemoryKind, bytes: u64) -> u64 {
        let _ = kind;
        bytes
    }

    /// Whether weight uploads pass through staging buffers (a device whose memory the host
    /// cannot write).
    fn stages_uploads(&self) -> bool {
        false
    }
}

/// How long one step of a profiled run took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepTime {
    /// The step's index in the variant.
    pub step: usize,
    /// Nanoseconds; `None` where the device cannot time its steps (a Vulkan queue without
    /// timestamps).
    pub nanos: Option<u64>,
    /// Vulkan dispatches the step recorded (`None` on the CPU).
    pub dispatches: Option<u32>,
}

/// Where preparing or running a submodel on a device failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// The device cannot run the submodel at all: a step has no kernel for it.
    Kernels,
    /// Loading the Vulkan loader library.
    Loader,
    Instance,
    Device,
    Pipelines,
    Weights,
    Arena,
    /// The device's buffer for the submodel's inputs and outputs.
    Io,
    /// Running: a dispatch, a lost device, memory running out.
    Run,
}

impl Stage {
    pub const ALL: [Stage; 9] = [
        Stage::Kernels,
        Stage::Loader,
        Stage::Instance,
        Stage::Device,
        Stage::Pipelines,
        Stage::Weights,
        Stage::Arena,
        Stage::Io,
        Stage::Run,
    ];

    /// The short name fault specifications use (`vulkan@weights`).
    pub fn name(self) -> &'static str {
        match self {
            Stage::Kernels => "kernels",
            Stage::Loader => "loader",
            Stage::Instance => "instance",
            Stage::Device => "device",
            Stage::Pipelines => "pipelines",
            Stage::Weights => "weights",
            Stage::Arena => "arena",
            Stage::Io => "io",
            Stage::Run => "dispatch",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Stage::Kernels => "kernel check",
            Stage::Loader => "loading the Vulkan loader",
            Stage::Instance => "instance creation",
            Stage::Device => "device creation",
            Stage::Pipelines => "pipeline creation",
            Stage::Weights => "weight upload",
            Stage::Arena => "arena allocation",
            Stage::Io => "IO buffer allocation",
            Stage::Run => "dispatch",
        }
    }

    /// Whether failing here means the device is unusable for every submodel.
    pub(crate) fn device_wide(self) -> bool {
        matches!(self, Stage::Loader | Stage::Instance | Stage::Device)
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// Preparing an executable failed at `stage`.
#[derive(Debug)]
pub struct Failure {
    pub stage: Stage,
    pub error: SessionError,
}

impl Failure {
    pub fn at(stage: Stage) -> impl FnOnce(SessionError) -> Failure {
        move |error| Failure { stage, error }
    }
}

/// A failure to inject: `device` (`vulkan` or `cpu`, the device's kind) fails at `stage`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub device: String,
    pub stage: Stage,
}

/// Failures injected for tests (cargo feature `fault-injection`; without it nothing can be
/// injected and every check passes). A fault at [`Stage::Run`] fires once, like a transient
/// device loss; one at a preparation stage fires every time the stage is reached.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    #[cfg(feature = "fault-injection")]
    armed: Arc<Mutex<Vec<Fault>>>,
}

impl Faults {
    /// Fails if a fault is armed for a device of kind `device` at `stage`.
    #[cfg_attr(not(feature = "fault-injection"), inline(always))]
    pub fn check(&self, device: &str, stage: Stage) -> Result<(), SessionError> {
        #[cfg(feature = "fault-injection")]
        {
            let mut armed = self.armed.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = armed.iter().position(|f| f.device == device && f.stage == stage) {
                if stage == Stage::Run {
                    armed.remove(i);
                }
                return Err(SessionError::Injected { device: device.into(), stage });
            }
        }
        let _ = (device, stage);
        Ok(())
    }

    /// Arms a fault.
    #[cfg(feature = "fault-injection")]
    pub fn inject(&self, device: &str, stage: Stage) {
        let mut armed = self.armed.lock().unwrap_or_else(|e| e.into_inner());
        armed.push(Fault { device: device.into(), stage });
    }

    /// Faults from a list such as `vulkan@weights,cpu@arena` (what `INGOT_INJECT_FAULTS`
    /// holds for the CLI).
    #[cfg(feature = "fault-injection")]
    pub fn parse(spec: &str) -> Result<Faults, String> {
        let faults = Faults::default();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (device, stage) = item
                .split_once('@')
                .ok_or_else(|| format!("fault '{item}' is not DEVICE@STAGE"))?;
            let stage = Stage::ALL.into_iter().find(|s| s.name() == stage).ok_or_else(|| {
                let names: Vec<_> = Stage::ALL.iter().map(|s| s.name()).collect();
                format!("unknown stage '{stage}'; stages: {}", names.join(", "))
            })?;
            if device != "vulkan" && device != "cpu" {
                return Err(format!("fault device '{device}' is not vulkan or cpu"));
            }
            faults.inject(device, stage);
        }
        Ok(faults)
    }
}
