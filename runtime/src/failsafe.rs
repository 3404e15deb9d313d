//! The device fallback list: the one place that knows a session may use several devices.
//!
//! Each submodel is prepared on the first device of the session's list that can run it and
//! succeeds: loader present, instance and device created, pipelines created, weights uploaded,
//! arena and IO allocated. Every device passed over is recorded with the stage and the error,
//! and whatever it had allocated is freed before the next is tried (dropping an executable
//! frees its memory; the ledger shows it). A device that failed before any work of the
//! submodel began (no loader, no instance, no device) is not tried again for later submodels.
//!
//! When running fails (device lost, out of memory), the submodel is prepared on the next
//! device of its list and run again from its inputs, which the plan keeps intact while it
//! runs; with failover off the error is returned and the session stays usable.
//!
//! To the session a [`Fallback`] is one more [`Executable`].

use crate::backend::{Device, Executable, Failure, Faults, SessionError, Stage, StepTime};
use crate::bundle::Bundle;
use crate::cpu::{CpuExecutable, CpuThreads};
use crate::ledger::{Ledger, MemoryKind};
use crate::tensor::{TensorMut, TensorRef};
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

/// A device passed over for a submodel, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skip {
    /// The device as the list names it (`vulkan`, `cpu`, ...).
    pub device: String,
    pub stage: Stage,
    pub reason: String,
}

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} failed: {}", self.device, self.stage, self.reason)
    }
}

/// Where one submodel runs, and what was tried before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubmodelPlacement {
    pub index: usize,
    /// Its steps in the variant.
    pub steps: Range<usize>,
    /// Its ops, most frequent first (`Conv x12, Relu x8`).
    pub ops: String,
    /// The device it runs on now, e.g. `vulkan:0 (llvmpipe ...)` or `cpu`.
    pub device: String,
    /// Devices passed over at preparation or failed over from while running, in order.
    pub skipped: Vec<Skip>,
}

/// Per submodel, the device used and every device skipped with its stage and reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement(pub Vec<SubmodelPlacement>);

impl fmt::Display for Placement {
    /// One line per submodel and per skip; a device that failed for every submodel for the
    /// same device-wide reason (no loader, no device) is one line of notice instead.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let common: Vec<&Skip> = match self.0.first() {
            Some(first) => first
                .skipped
                .iter()
                .filter(|s| s.stage.device_wide())
                .filter(|s| self.0.iter().all(|p| p.skipped.contains(s)))
                .collect(),
            None => Vec::new(),
        };
        for s in &common {
            writeln!(f, "notice: {s}")?;
        }
        for p in &self.0 {
            writeln!(
                f,
                "submodel {} (steps {}..{}: {}): {}",
                p.index, p.steps.start, p.steps.end, p.ops, p.device
            )?;
            for s in p.skipped.iter().filter(|s| !common.contains(s)) {
                writeln!(f, "  skipped {s}")?;
            }
        }
        Ok(())
    }
}

/// What every submodel of a session shares: the list, the policy, the record.
pub(crate) struct Devices {
    pub list: Vec<Device>,
    pub failover: bool,
    /// Threads for the CPU backend, and whether its idle threads spin during a run.
    pub threads: usize,
    pub spin: bool,
    /// The CPU backend's `threads` threads, started by the first CPU submodel and shared by
    /// all of them.
    cpu_threads: OnceLock<Arc<CpuThreads>>,
    pub faults: Faults,
    pub ledger: Ledger,
    /// Devices (by position in `list`) that failed for every submodel, and how.
    dead: Mutex<BTreeMap<usize, Skip>>,
}

impl Devices {
    pub fn new(
        list: Vec<Device>,
        failover: bool,
        (threads, spin): (usize, bool),
        faults: Faults,
        ledger: Ledger,
    ) -> Devices {
        Devices {
            list,
            failover,
            threads,
            spin,
            cpu_threads: OnceLock::new(),
            faults,
            ledger,
            dead: Mutex::default(),
        }
    }

    /// Runs `f` on the CPU backend's threads where a CPU submodel started them, else here.
    pub fn on_cpu_threads<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match self.cpu_threads.get() {
            Some(threads) => threads.enter(f),
            None => f(),
        }
    }

    fn cpu_threads(&self) -> Result<Arc<CpuThreads>, SessionError> {
        if let Some(threads) = self.cpu_threads.get() {
            return Ok(Arc::clone(threads));
        }
        let threads = CpuThreads::start(self.threads, self.spin)?;
        Ok(Arc::clone(self.cpu_threads.get_or_init(|| Arc::new(threads))))
    }
}

/// One submodel on the first device of the list that works.
pub(crate) struct Fallback {
    bundle: Arc<Bundle>,
    variant: usize,
    submodel: usize,
    devices: Arc<Devices>,
    /// The position in the list of the device it runs on, and its executable.
    current: Option<(usize, Box<dyn Executable>)>,
    placement: SubmodelPlacement,
}

impl Fallback {
    /// Prepares submodel `submodel` of variant `variant` on the first device that works.
    pub fn new(
        bundle: Arc<Bundle>,
        variant: usize,
        submodel: usize,
        devices: Arc<Devices>,
    ) -> Result<Fallback, SessionError> {
        let v = &bundle.manifest().variants[variant];
        let sub = &v.submodels[submodel];
        let steps = sub.first_step as usize..(sub.first_step + sub.step_count) as usize;
        let ops = op_summary(v.steps[steps.clone()].iter().map(|s| s.op.as_str()));
        let mut f = Fallback {
            placement: SubmodelPlacement {
                index: submodel,
                steps,
                ops,
                device: String::new(),
                skipped: Vec::new(),
            },
            bundle,
            variant,
            submodel,
            devices,
            current: None,
        };
        f.prepare_from(0)?;
        Ok(f)
    }

    pub fn placement(&self) -> &SubmodelPlacement {
        &self.placement
    }

    /// Prepares the submodel on the first device from position `start` on that works.
    fn prepare_from(&mut self, start: usize) -> Result<(), SessionError> {
        self.current = None;
        let devices = Arc::clone(&self.devices);
        for (at, device) in devices.list.iter().enumerate().skip(start) {
            let known_dead =
                devices.dead.lock().unwrap_or_else(|e| e.into_inner()).get(&at).cloned();
            if let Some(skip) = known_dead {
                self.placement.skipped.push(skip);
                continue;
            }
            match self.open(device) {
                Ok((exe, name)) => {
                    self.placement.device = name;
                    self.current = Some((at, exe));
                    return Ok(());
                }
                // A corrupt bundle is no device's fault: no other device would fare better.
                Err(Failure { error: e @ SessionError::Bundle(_), .. }) => return Err(e),
                Err(failure) => {
                    let skip = Skip {
                        device: device.name(),
                        stage: failure.stage,
                        reason: failure.error.to_string(),
                    };
                    if failure.stage.device_wide() {
                        let mut dead = devices.dead.lock().unwrap_or_else(|e| e.into_inner());
                        dead.insert(at, skip.clone());
                    }
                    self.placement.skipped.push(skip);
                }
            }
        }
        self.placement.device = "none".into();
        Err(SessionError::NoDevice {
            submodel: self.submodel,
            tried: self.placement.skipped.iter().map(|s| format!("\n  {s}")).collect(),
        })
    }

    /// The executable of this submodel on `device`, and the device's name.
    fn open(&self, device: &Device) -> Result<(Box<dyn Executable>, String), Failure> {
        let (bundle, variant, submodel) = (&self.bundle, self.variant, self.submodel);
        let faults = &self.devices.faults;
        let ledger = &self.devices.ledger;
        match device {
            Device::Unavailable(name) => Err(Failure {
                stage: Stage::Loader,
                error: SessionError::Unavailable(name.clone()),
            }),
            Device::Cpu => {
                let threads = self.devices.cpu_threads().map_err(Failure::at(Stage::Device))?;
                let exe = CpuExecutable::new(
                    Arc::clone(bundle),
                    variant,
                    submodel,
                    &ledger.on("cpu"),
                    faults,
                    threads,
                )?;
                Ok((Box::new(exe), "cpu".into()))
            }
            #[cfg(feature = "vulkan")]
            Device::Vulkan(options) => {
                if bundle.manifest().cpu_only {
                    return Err(Failure {
                        stage: Stage::Kernels,
                        error: SessionError::NoKernel(
                            "the bundle was compiled for the CPU only (ingot compile --devices \
                             cpu): it has no Vulkan kernels"
                                .into(),
                        ),
                    });
                }
                let v = &bundle.manifest().variants[variant];
                vulkan_kernels(v, &v.submodels[submodel]).map_err(|reason| Failure {
                    stage: Stage::Kernels,
                    error: SessionError::NoKernel(reason),
                })?;
                let exe = crate::vulkan::VulkanExecutable::new(
                    Arc::clone(bundle),
                    variant,
                    submodel,
                    options,
                    ledger,
                    faults,
                )?;
                let name = format!("vulkan:{} ({})", exe.device().index, exe.device().name);
                Ok((Box::new(exe), name))
            }
        }
    }
}

impl Fallback {
    /// Runs `run` on the current executable; when it fails (and failover is on), prepares
    /// the next device of the list and runs it there.
    fn with_failover<T>(
        &mut self,
        mut run: impl FnMut(&mut dyn Executable) -> Result<T, SessionError>,
    ) -> Result<T, SessionError> {
        loop {
            let Some((at, exe)) = self.current.as_mut() else {
                self.prepare_from(0)?;
                continue;
            };
            let error = match run(exe.as_mut()) {
                Ok(done) => return Ok(done),
                // Bad input data fails on every device alike: the caller hears of it.
                Err(e) if !self.devices.failover || matches!(e, SessionError::Data { .. }) => {
                    return Err(e);
                }
                Err(e) => e,
            };
            let at = *at;
            let skip = Skip {
                device: self.devices.list[at].name(),
                stage: Stage::Run,
                reason: error.to_string(),
            };
            log::warn!("submodel {}: {skip}; moving it to the next device", self.placement.index);
            self.placement.skipped.push(skip);
            // Frees what the failed device held, then prepares the next one; its inputs are
            // intact, so running it again gives the answer the failed run would have.
            self.prepare_from(at + 1)?;
            log::warn!("submodel {} now runs on {}", self.placement.index, self.placement.device);
        }
    }
}

impl Executable for Fallback {
    fn run(&mut self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), SessionError> {
        self.with_failover(|exe| exe.run(inputs, outputs))
    }

    fn run_profiled(
        &mut self,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
    ) -> Result<Vec<StepTime>, SessionError> {
        self.with_failover(|exe| exe.run_profiled(inputs, outputs))
    }

    fn allocated_bytes(&self, kind: MemoryKind, bytes: u64) -> u64 {
        self.current.as_ref().map_or(bytes, |(_, exe)| exe.allocated_bytes(kind, bytes))
    }

    fn stages_uploads(&self) -> bool {
        self.current.as_ref().is_some_and(|(_, exe)| exe.stages_uploads())
    }
}

/// Fails with the first step of `sub` that has no Vulkan kernel.
#[cfg(feature = "vulkan")]
fn vulkan_kernels(
    v: &ingot_schema::proto::Variant,
    sub: &ingot_schema::proto::Submodel,
) -> Result<(), String> {
    let steps = &v.steps[sub.first_step as usize..(sub.first_step + sub.step_count) as usize];
    let Some(missing) = steps.iter().find(|s| s.vulkan.is_empty()) else {
        return Ok(());
    };
    // The step that sent the submodel to the CPU says why; the others have kernels to spare.
    let culprit = steps.iter().find(|s| !s.no_vulkan_kernel.is_empty()).unwrap_or(missing);
    let why = match culprit.no_vulkan_kernel.as_str() {
        "" => "the compiler gave it none",
        why => why,
    };
    Err(format!("step '{}' ({}) has no Vulkan kernel: {why}", culprit.name, culprit.op))
}

/// `Conv x12, Relu x8, Add`: op counts, most frequent first, ties by first appearance.
fn op_summary<'a>(ops: impl Iterator<Item = &'a str>) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for op in ops {
        match counts.iter_mut().find(|(o, _)| *o == op) {
            Some((_, n)) => *n += 1,
            None => counts.push((op, 1)),
        }
    }
    counts.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
    let shown: Vec<String> = counts
        .iter()
        .take(6)
        .map(|&(op, n)| if n == 1 { op.into() } else { format!("{op} x{n}") })
        .collect();
    let more = if counts.len() > 6 { ", ..." } else { "" };
    format!("{}{more}", shown.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_are_summarised_most_frequent_first() {
        let ops = ["Conv", "Relu", "Conv", "Add", "Relu", "Conv"];
        assert_eq!(op_summary(ops.into_iter()), "Conv x3, Relu x2, Add");
    }

    #[test]
    fn a_device_wide_skip_shared_by_every_submodel_is_one_notice() {
        let skip = |stage| Skip { device: "vulkan".into(), stage, reason: "no libvulkan".into() };
        let sub = |index, skipped| SubmodelPlacement {
            index,
            steps: index..index + 1,
            ops: "Relu".into(),
            device: "cpu".into(),
            skipped,
        };
        let p =
            Placement(vec![sub(0, vec![skip(Stage::Loader)]), sub(1, vec![skip(Stage::Loader)])]);
        assert_eq!(
            p.to_string(),
            "notice: vulkan: loading the Vulkan loader failed: no libvulkan\n\
             submodel 0 (steps 0..1: Relu): cpu\n\
             submodel 1 (steps 1..2: Relu): cpu\n"
        );
        let p = Placement(vec![sub(0, vec![skip(Stage::Weights)])]);
        assert_eq!(
            p.to_string(),
            "submodel 0 (steps 0..1: Relu): cpu\n  skipped vulkan: weight upload failed: no libvulkan\n"
        );
    }

    #[cfg(feature = "fault-injection")]
    #[test]
    fn faults_parse_and_a_run_fault_fires_once() {
        let f = Faults::parse("vulkan@weights, cpu@dispatch").unwrap();
        assert!(f.check("vulkan", Stage::Weights).is_err());
        assert!(f.check("vulkan", Stage::Weights).is_err(), "preparation faults persist");
        assert!(f.check("cpu", Stage::Weights).is_ok());
        assert!(f.check("cpu", Stage::Run).is_err());
        assert!(f.check("cpu", Stage::Run).is_ok(), "a run fault fires once");
        assert!(Faults::parse("vulkan@nowhere").is_err());
        assert!(Faults::parse("gpu@weights").is_err());
        assert!(Faults::parse("weights").is_err());
    }
}
