//! A session runs one variant of a bundle: its submodels in order, each through an
//! [`Executable`] that the failsafe prepared on the first device of the list that works. It
//! checks what the caller passes, owns the outputs and the boundary buffer that carries
//! tensors from one submodel to the next, and does not know what a device is.

use crate::backend::{Device, Executable, Faults, KernelClass, SessionError, StepTime};
use crate::bundle::{Bundle, tensor_desc};
use crate::carve::Carved;
use crate::failsafe::{Devices, Fallback, Placement};
use crate::ledger::{Entry, Ledger, MemoryKind, peak_of, planned_events_sized};
use crate::tensor::{Tensor, TensorDesc, TensorMut, TensorRef};
use ingot_schema::DType;
use ingot_schema::proto::{self, Storage, storage::Kind};
use std::collections::BTreeSet;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

/// `devices` with the session's Vulkan options on every Vulkan device: `class`'s kernels
/// (`Auto` leaves each device's own class) and the pipeline cache file, where set.
fn with_vulkan_options(
    devices: Vec<Device>,
    class: KernelClass,
    pipeline_cache: Option<PathBuf>,
) -> Vec<Device> {
    #[cfg(feature = "vulkan")]
    let devices = devices
        .into_iter()
        .map(|d| match d {
            Device::Vulkan(mut v) => {
                if class != KernelClass::Auto {
                    v.kernel_class = class;
                }
                if pipeline_cache.is_some() {
                    v.pipeline_cache.clone_from(&pipeline_cache);
                }
                Device::Vulkan(v)
            }
            d => d,
        })
        .collect();
    #[cfg(not(feature = "vulkan"))]
    let _ = (class, pipeline_cache);
    devices
}

#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// The variant to run; `None` means the bundle's first variant.
    pub variant: Option<String>,
    /// The devices to try for each submodel, in order ([`Device::default_list`]: Vulkan,
    /// then the CPU).
    pub devices: Vec<Device>,
    /// When running a submodel fails, prepare it on the next device of the list and run it
    /// again (on by default); off, the error is returned.
    pub failover: bool,
    /// Where device memory is recorded; a fresh ledger when `None`.
    pub ledger: Option<Ledger>,
    /// Threads the CPU backend may use; `None` means one per physical core, or fewer where
    /// this process may use fewer CPUs ([`crate::cpu::default_threads`]).
    pub threads: Option<usize>,
    /// While a CPU submodel runs, its idle threads spin a while for work before they park
    /// (on by default, as ONNX Runtime's do: waking a sleeping thread costs tens of µs a
    /// step). Off, they park at once: for an app whose other threads need the cores more, or
    /// a machine busy with other work (where it is also the faster setting).
    pub spin: bool,
    /// Failures to inject, for tests (inert without the `fault-injection` feature).
    pub faults: Faults,
    /// Which Vulkan kernels run, on every Vulkan device of the list (default: each device's
    /// own class).
    pub kernel_class: KernelClass,
    /// A file that keeps compiled Vulkan pipelines between runs of the app (an app's cache
    /// directory), so that a later start skips compiling kernels for the device: read before
    /// a submodel's pipelines are made, written after where it changed. Best effort: a
    /// missing, unreadable or foreign file (another device or driver) is ignored and
    /// replaced, with a log record. One file per device; none by default.
    pub pipeline_cache: Option<PathBuf>,
}

impl Default for SessionOptions {
    fn default() -> SessionOptions {
        SessionOptions {
            variant: None,
            devices: Device::default_list(),
            failover: true,
            ledger: None,
            threads: None,
            spin: true,
            faults: Faults::default(),
            kernel_class: KernelClass::Auto,
            pipeline_cache: None,
        }
    }
}

impl SessionOptions {
    /// The default options on the devices named by `names` (`vulkan,cpu`).
    pub fn on(names: &str) -> Result<SessionOptions, SessionError> {
        Ok(SessionOptions { devices: Device::parse_list(names)?, ..SessionOptions::default() })
    }
}

/// A graph input or output as the caller sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoInfo {
    pub name: String,
    /// Its type; for a bounded output, the shape holds the upper bound along `bounded`.
    pub desc: TensorDesc,
    /// For an output whose length along one dim depends on the data (NonMaxSuppression's
    /// boxes and what is computed from them): that dim. [`Session::run`] returns it cut to the
    /// length the run filled; [`Session::run_into`] writes those entries densely at the start
    /// of the caller's buffer (sized for the bound), and [`Session::output_shape`] gives their
    /// shape.
    pub bounded: Option<usize>,
}

/// Where one of a submodel's inputs or outputs lives in the session.
#[derive(Clone, Debug)]
enum Home {
    /// The caller's input.
    Input(usize),
    /// The session's output.
    Output(usize),
    /// Bytes of the boundary buffer.
    Boundary(Range<usize>),
}

/// A step of the variant as a profile names it.
#[derive(Clone, Debug)]
struct StepInfo {
    name: String,
    op: String,
    output: Vec<usize>,
    submodel: usize,
}

/// One step of a profiled run ([`Session::profile`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepProfile {
    /// The step's index in the variant (as `ingot plan` numbers it).
    pub index: usize,
    pub name: String,
    /// The op, with its fused post-ops (`Conv+Relu`).
    pub op: String,
    /// The shape of its first output.
    pub output: Vec<usize>,
    pub submodel: usize,
    /// The device its submodel ran on.
    pub device: String,
    /// The Vulkan dispatches it recorded; `None` on the CPU.
    pub dispatches: Option<u32>,
    /// How long it took; `None` where the device cannot time steps.
    pub nanos: Option<u64>,
}

/// A condition a submodel runs under: byte `at` of a root the host holds is `holds`.
#[derive(Clone, Debug)]
struct Condition {
    home: Home,
    at: usize,
    holds: bool,
}

impl Condition {
    /// Whether it holds now. Validation made every byte a condition reads exist.
    fn holds(&self, inputs: &[TensorRef], outputs: &[TensorMut], boundary: &[u8]) -> bool {
        let byte = match &self.home {
            Home::Input(i) => inputs.get(*i).and_then(|t| t.bytes.get(self.at)),
            Home::Output(j) => outputs.get(*j).and_then(|t| t.bytes.get(self.at)),
            Home::Boundary(r) => boundary.get(r.start + self.at),
        };
        byte.is_some_and(|&b| (b != 0) == self.holds)
    }
}

/// A Loop decided at run time ([`proto::Loop`]): its parts run once an iteration while its
/// trip count and condition allow. Its numbers and carried values are outputs the session
/// holds, named by their index in the variant's outputs.
#[derive(Clone, Debug)]
struct Repeat {
    /// The `Loop`, for messages.
    name: String,
    /// The conditions it runs under (a run-time `If` branch), tested before it starts.
    guard: Vec<Condition>,
    parts: Range<usize>,
    iteration: usize,
    trip_count: Option<usize>,
    condition: Option<usize>,
    /// `(state, next)`: after each iteration, `next` is copied over `state`.
    carried: Vec<(usize, usize)>,
    /// `(slice, stacked)`: after each iteration, `slice` is copied into row `iteration` of
    /// `stacked`.
    stacked: Vec<(usize, usize)>,
}

struct Part {
    /// The conditions it runs under (a branch of a run-time `If`); none: always.
    guard: Vec<Condition>,
    executable: Fallback,
    inputs: Vec<(Home, TensorDesc)>,
    outputs: Vec<(Home, TensorDesc)>,
}

pub struct Session {
    inputs: Vec<IoInfo>,
    outputs: Vec<IoInfo>,
    /// The variant's outputs after the caller's, which the session holds: the run-time
    /// lengths of bounded outputs (for each caller output, `count_of` has the index of its
    /// count) and what run-time loops carry from one iteration to the next.
    held: Vec<Tensor>,
    count_of: Vec<Option<usize>>,
    repeats: Vec<Repeat>,
    /// Each caller output's shape in the last run (its type's before any run).
    shapes: Vec<Vec<usize>>,
    parts: Vec<Part>,
    steps: Vec<StepInfo>,
    // u64 words keep boundary offsets (multiples of the plan's alignment) aligned.
    boundary: Vec<u64>,
    boundary_bytes: usize,
    boundary_entry: Option<Entry>,
    arena_bytes: usize,
    threads: usize,
    spin: bool,
    ledger: Ledger,
    /// The devices the parts share: a run enters the CPU backend's threads once for all.
    devices: Arc<Devices>,
    bundle: Arc<Bundle>,
    /// The variant's index in the bundle.
    variant: usize,
}

// An app may make a session on one thread and run it on another (one call at a time): the C
// API promises it.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<Session>();
};

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("device", &self.device())
            .field("arena_bytes", &self.arena_bytes)
            .finish()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Submodels first (their device memory), then the boundary buffer.
        self.parts.clear();
        if let Some(entry) = self.boundary_entry.take() {
            self.ledger.free(entry);
        }
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
        if options.devices.is_empty() {
            return Err(SessionError::NoDevices);
        }
        let variant = &manifest.variants[index];
        let io = |list: &[u32]| -> Vec<IoInfo> {
            list.iter()
                .map(|&t| {
                    let tensor = &variant.tensors[t as usize];
                    IoInfo {
                        name: tensor.name.clone(),
                        desc: tensor_desc(tensor),
                        bounded: tensor.bound.as_ref().map(|b| b.axis as usize),
                    }
                })
                .collect()
        };
        // Validation made the counts of bounded outputs the last outputs.
        let callers = crate::bundle::caller_outputs(variant);
        let (inputs, outputs) = (io(&variant.inputs), io(&variant.outputs[..callers]));
        let count_of: Vec<Option<usize>> = variant.outputs[..callers]
            .iter()
            .map(|&t| {
                let count = variant.tensors[t as usize].bound.as_ref()?.count;
                variant.outputs.iter().position(|&o| o == count)
            })
            .collect();
        let held = variant.outputs[callers..]
            .iter()
            .map(|&t| Tensor::zeros(tensor_desc(&variant.tensors[t as usize])))
            .collect();
        let shapes = outputs.iter().map(|o| o.desc.shape.clone()).collect();
        // Memory first: kernels may build tables as long as their outputs' dims, so outputs
        // that could never be allocated are refused before any kernel is prepared.
        for o in &outputs {
            probe_output(o)?;
        }
        let plan = variant.plan.as_ref();
        let arena_bytes = plan.map_or(0, |p| p.arena_bytes as usize);
        let boundary_bytes = plan.map_or(0, |p| p.boundary_bytes);
        let ledger = options.ledger.unwrap_or_default();
        let threads = options.threads.unwrap_or_else(crate::cpu::default_threads);
        let devices = Arc::new(Devices::new(
            with_vulkan_options(options.devices, options.kernel_class, options.pipeline_cache),
            options.failover,
            (threads, options.spin),
            options.faults,
            ledger.clone(),
        ));
        let home = |t: u32| -> (Home, TensorDesc) {
            let tensor = &variant.tensors[t as usize];
            let desc = tensor_desc(tensor);
            let home = match tensor.storage.as_ref().and_then(|s| s.kind.as_ref()) {
                Some(Kind::Input(i)) => Home::Input(*i as usize),
                Some(Kind::Output(o)) => Home::Output(*o as usize),
                // Validation allows only these three kinds in a submodel's lists.
                Some(Kind::Boundary(offset)) => {
                    Home::Boundary(*offset as usize..*offset as usize + desc.bytes())
                }
                _ => Home::Boundary(0..0),
            };
            (home, desc)
        };
        // A condition reads a root, or a view's bytes of one.
        let condition = |c: &proto::Condition| {
            let (root, at) = match variant.tensors[c.tensor as usize].storage.as_ref() {
                Some(Storage { kind: Some(Kind::View(view)) }) => (view.of, view.byte_offset),
                _ => (c.tensor, 0),
            };
            Condition { home: home(root).0, at: at as usize, holds: c.holds }
        };
        // Validation made every tensor a loop names one of those outputs.
        let output = |t: u32| variant.outputs.iter().position(|&o| o == t).unwrap_or(usize::MAX);
        let repeats = variant
            .loops
            .iter()
            .map(|l| Repeat {
                name: l.name.clone(),
                guard: l.guard.iter().map(condition).collect(),
                parts: l.first_submodel as usize..(l.first_submodel + l.submodel_count) as usize,
                iteration: output(l.iteration),
                trip_count: l.trip_count.map(output),
                condition: l.condition.map(output),
                carried: l.carried.iter().map(|c| (output(c.state), output(c.next))).collect(),
                stacked: l.stacked.iter().map(|s| (output(s.slice), output(s.stacked))).collect(),
            })
            .collect();
        let mut parts = Vec::with_capacity(variant.submodels.len());
        for (k, sub) in variant.submodels.iter().enumerate() {
            parts.push(Part {
                guard: sub.guard.iter().map(condition).collect(),
                inputs: sub.inputs.iter().map(|&t| home(t)).collect(),
                outputs: sub.outputs.iter().map(|&t| home(t)).collect(),
                executable: Fallback::new(Arc::clone(&bundle), index, k, Arc::clone(&devices))?,
            });
        }
        let mut steps: Vec<StepInfo> = variant
            .steps
            .iter()
            .map(|s| StepInfo {
                name: s.name.clone(),
                op: s.op_label(),
                output: s
                    .outputs
                    .first()
                    .and_then(|&t| variant.tensors.get(t as usize))
                    .map_or_else(Vec::new, |t| tensor_desc(t).shape),
                submodel: 0,
            })
            .collect();
        for (k, sub) in variant.submodels.iter().enumerate() {
            let first = sub.first_step as usize;
            for step in steps.iter_mut().skip(first).take(sub.step_count as usize) {
                step.submodel = k;
            }
        }
        // After every submodel's device memory: the buffer between them, on the host.
        let mut boundary = Vec::new();
        boundary
            .try_reserve_exact(boundary_bytes.div_ceil(8) as usize)
            .map_err(|_| SessionError::BoundaryAllocation { bytes: boundary_bytes })?;
        boundary.resize(boundary_bytes.div_ceil(8) as usize, 0);
        let boundary_entry = (boundary_bytes > 0)
            .then(|| ledger.allocate(MemoryKind::Boundary, boundary_bytes, "boundary"));
        let session = Session {
            inputs,
            outputs,
            held,
            count_of,
            repeats,
            shapes,
            parts,
            steps,
            boundary,
            boundary_bytes: boundary_bytes as usize,
            boundary_entry,
            arena_bytes,
            threads,
            spin: options.spin,
            ledger,
            devices,
            bundle,
            variant: index,
        };
        // Where each submodel runs and every device skipped, one record a line: the app's
        // logger decides where it goes (the CLI's `-v`, the C API's callback).
        for line in session.placement().to_string().lines() {
            log::info!("{line}");
        }
        Ok(session)
    }

    pub fn inputs(&self) -> &[IoInfo] {
        &self.inputs
    }

    pub fn outputs(&self) -> &[IoInfo] {
        &self.outputs
    }

    /// Bytes of the activation arenas of the variant's submodels.
    pub fn arena_bytes(&self) -> usize {
        self.arena_bytes
    }

    /// The CPU backend's thread count (the option, or one per physical core).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Whether the CPU backend's idle threads spin a while for work during a run.
    pub fn spin(&self) -> bool {
        self.spin
    }

    /// Where each submodel runs, and every device skipped with the stage and the reason.
    pub fn placement(&self) -> Placement {
        Placement(self.parts.iter().map(|p| p.executable.placement().clone()).collect())
    }

    /// The devices the submodels run on, e.g. `cpu` or `vulkan:0 (llvmpipe ...)`, joined
    /// with ` + ` when they differ.
    pub fn device(&self) -> String {
        let mut names: Vec<&str> = Vec::new();
        for p in &self.parts {
            let name = p.executable.placement().device.as_str();
            if !names.contains(&name) {
                names.push(name);
            }
        }
        names.join(" + ")
    }

    /// The device memory peak the plan predicts for this session where it runs: each
    /// allocation at the bytes its device allocates for it (a Vulkan driver rounds buffers up
    /// to its own granularity), uploads staged where the device stages them, each weight
    /// uploaded once. Its ledger peaks at exactly this when the session has the ledger and
    /// the bundle's weights on the device to itself.
    pub fn planned_device_peak(&self) -> u64 {
        let variant = &self.bundle.manifest().variants[self.variant];
        let placement = self.placement();
        let on_vulkan: Vec<bool> =
            placement.0.iter().map(|p| p.device.starts_with("vulkan")).collect();
        let staged = self.parts.iter().any(|p| p.executable.stages_uploads());
        let sizes = |k: usize, kind, bytes| {
            self.parts.get(k).map_or(bytes, |p| p.executable.allocated_bytes(kind, bytes))
        };
        let events =
            planned_events_sized(variant, &on_vulkan, staged, &mut BTreeSet::new(), &sizes);
        peak_of(events)
    }

    /// The record of the device memory this session allocated and freed.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The shape output `j` had in the last run: its type's, except along a bounded dim
    /// ([`IoInfo::bounded`]), where it is the length the run filled.
    pub fn output_shape(&self, j: usize) -> Option<&[usize]> {
        self.shapes.get(j).map(Vec::as_slice)
    }

    /// Runs the variant on `inputs` (in the order of [`Session::inputs`]) and returns its
    /// outputs (in the order of [`Session::outputs`]), bounded ones cut to their length.
    pub fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, SessionError> {
        self.run_timed(inputs, None)
    }

    /// Runs as [`Session::run`] does and also returns how long each step took, in the
    /// variant's order. A Vulkan device times its steps with timestamps and runs them one
    /// after another (so the run may be a little slower than an unprofiled one); the CPU
    /// times each step's wall time. Steps of a branch not taken (a run-time `If`) are absent;
    /// a step of a run-time loop's body appears once, with the time and dispatches of all
    /// its iterations.
    pub fn profile(
        &mut self,
        inputs: &[Tensor],
    ) -> Result<(Vec<Tensor>, Vec<StepProfile>), SessionError> {
        let mut times = Vec::with_capacity(self.steps.len());
        let outputs = self.run_timed(inputs, Some(&mut times))?;
        let profile = once_per_step(times)
            .into_iter()
            .filter_map(|t| {
                let info = self.steps.get(t.step)?;
                let device = self.parts.get(info.submodel)?.executable.placement().device.clone();
                Some(StepProfile {
                    index: t.step,
                    name: info.name.clone(),
                    op: info.op.clone(),
                    output: info.output.clone(),
                    submodel: info.submodel,
                    device,
                    dispatches: t.dispatches,
                    nanos: t.nanos,
                })
            })
            .collect();
        Ok((outputs, profile))
    }

    /// Runs the variant on `inputs` and writes its outputs into `outputs`, the caller's
    /// buffers, in place: no tensor is allocated or copied on the host (an app's per-frame
    /// call). Each buffer must match its tensor's dtype, shape and byte length and be aligned
    /// to its element size. A bounded output ([`IoInfo::bounded`]) holds the entries the run
    /// filled at the start of its buffer, densely, with the dims [`Session::output_shape`]
    /// gives. When the run fails, `outputs` may hold part of a result.
    pub fn run_into(
        &mut self,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
    ) -> Result<(), SessionError> {
        check_views("input", &self.inputs, inputs.iter().map(|t| (t.dtype, t.shape, t.bytes)))?;
        let views = outputs.iter().map(|t| (t.dtype, t.shape, &*t.bytes));
        check_views("output", &self.outputs, views)?;
        for (side, list, pointers) in [
            ("input", &self.inputs, inputs.iter().map(|t| t.bytes.as_ptr()).collect::<Vec<_>>()),
            ("output", &self.outputs, outputs.iter().map(|t| t.bytes.as_ptr()).collect()),
        ] {
            for (info, pointer) in list.iter().zip(pointers) {
                let align = info.desc.dtype.size();
                if !(pointer as usize).is_multiple_of(align) {
                    return Err(SessionError::Misaligned { side, name: info.name.clone(), align });
                }
            }
        }
        self.run_views(inputs, outputs, None)?;
        for (j, t) in outputs.iter_mut().enumerate() {
            if let Some(axis) = self.outputs[j].bounded {
                let size = t.dtype.size();
                compact(t.bytes, &self.outputs[j].desc.shape, size, axis, self.shapes[j][axis]);
            }
        }
        Ok(())
    }

    fn run_timed(
        &mut self,
        inputs: &[Tensor],
        times: Option<&mut Vec<StepTime>>,
    ) -> Result<Vec<Tensor>, SessionError> {
        check_views(
            "input",
            &self.inputs,
            inputs.iter().map(|t| (t.dtype(), t.shape(), t.bytes())),
        )?;
        let mut outputs = self.outputs.iter().map(zeroed_output).collect::<Result<Vec<_>, _>>()?;
        let ins: Vec<TensorRef> = inputs.iter().map(Tensor::view).collect();
        let mut outs: Vec<TensorMut> = outputs.iter_mut().map(Tensor::view_mut).collect();
        self.run_views(&ins, &mut outs, times)?;
        for (j, t) in outputs.iter_mut().enumerate() {
            if let Some(axis) = self.outputs[j].bounded {
                *t = cut(t, axis, self.shapes[j][axis]);
            }
        }
        Ok(outputs)
    }

    /// Runs every submodel on checked inputs and the caller's outputs, then reads the
    /// lengths of bounded outputs.
    fn run_views(
        &mut self,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
        times: Option<&mut Vec<StepTime>>,
    ) -> Result<(), SessionError> {
        let mut held = std::mem::take(&mut self.held);
        let result = if held.is_empty() {
            self.run_parts(inputs, outputs, times)
        } else {
            let mut all: Vec<TensorMut> = outputs.iter_mut().map(TensorMut::reborrow).collect();
            all.extend(held.iter_mut().map(Tensor::view_mut));
            self.run_parts(inputs, &mut all, times)
        };
        for (j, count) in self.count_of.iter().enumerate() {
            let (Some(c), Some(axis)) = (count, self.outputs[j].bounded) else { continue };
            let bound = self.outputs[j].desc.shape[axis];
            let filled = held[c - self.outputs.len()]
                .as_slice::<i64>()
                .ok()
                .and_then(|v| v.first().copied());
            // A count outside [0, bound] would be a kernel's bug; the caller still gets a
            // shape that fits the buffer.
            self.shapes[j][axis] = filled.map_or(0, |n| n.clamp(0, bound as i64) as usize);
        }
        self.held = held;
        result
    }

    /// Runs every submodel, those of a run-time loop once an iteration: `outputs` are the
    /// variant's, the ones the session holds last.
    fn run_parts(
        &mut self,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
        mut times: Option<&mut Vec<StepTime>>,
    ) -> Result<(), SessionError> {
        let boundary =
            &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.boundary)[..self.boundary_bytes];
        let parts = &mut self.parts;
        let repeats = &self.repeats;
        // On the CPU backend's threads once for the whole run, where it has any: each CPU
        // part would enter them again, handing the run to a pool thread and back (a wake-up
        // each way: 60 µs a part on a 2-vCPU VM, 1.7 of the 2.2 ms of a decoder cut into 27
        // parts by its CPU-only ops); already on one, it runs in place.
        self.devices.on_cpu_threads(move || {
            let mut k = 0;
            while k < parts.len() {
                let Some(r) = repeats.iter().find(|r| r.parts.start == k) else {
                    run_guarded(k, parts, inputs, outputs, boundary, times.as_deref_mut())?;
                    k += 1;
                    continue;
                };
                // Where its branch is not taken, what the loop reads was not written.
                let taken = r.guard.iter().all(|c| c.holds(inputs, outputs, boundary));
                while taken && r.next_iteration(outputs)? {
                    for j in r.parts.clone() {
                        run_guarded(j, parts, inputs, outputs, boundary, times.as_deref_mut())?;
                    }
                    r.carry(outputs);
                }
                k = r.parts.end;
            }
            Ok(())
        })
    }
}

/// `times` with the entries of one step (a loop body's, once an iteration) added up, in the
/// order of their first.
fn once_per_step(times: Vec<StepTime>) -> Vec<StepTime> {
    let mut at = std::collections::BTreeMap::new();
    let mut merged: Vec<StepTime> = Vec::with_capacity(times.len());
    for t in times {
        match at.get(&t.step) {
            Some(&i) => {
                let m: &mut StepTime = &mut merged[i];
                m.nanos = m.nanos.zip(t.nanos).map(|(a, b)| a + b);
                m.dispatches = m.dispatches.zip(t.dispatches).map(|(a, b)| a + b);
            }
            None => {
                at.insert(t.step, merged.len());
                merged.push(t);
            }
        }
    }
    merged
}

/// Runs part `k` unless it is in a branch not taken: the `Where` after such a branch keeps
/// nothing it would have written.
fn run_guarded(
    k: usize,
    parts: &mut [Part],
    inputs: &[TensorRef],
    outputs: &mut [TensorMut],
    boundary: &mut [u8],
    times: Option<&mut Vec<StepTime>>,
) -> Result<(), SessionError> {
    let part = &mut parts[k];
    if part.guard.iter().all(|c| c.holds(inputs, outputs, boundary)) {
        run_part(k, part, inputs, outputs, boundary, times)?;
    }
    Ok(())
}

impl Repeat {
    fn iteration(&self, outputs: &[TensorMut]) -> i64 {
        let bytes = outputs[self.iteration].bytes.first_chunk::<8>();
        bytes.map_or(0, |b| i64::from_le_bytes(*b))
    }

    /// Whether another iteration runs: the trip count not reached and the condition true.
    /// Every stack must have a row left for it (a constant trip count sized them; where the
    /// compiler was given the most iterations instead, a run may want more).
    fn next_iteration(&self, outputs: &[TensorMut]) -> Result<bool, SessionError> {
        let int =
            |j: usize| outputs[j].bytes.first_chunk::<8>().map_or(0, |b| i64::from_le_bytes(*b));
        let i = self.iteration(outputs);
        let counted = self.trip_count.is_none_or(|t| i < int(t));
        let holds =
            self.condition.is_none_or(|c| outputs[c].bytes.first().is_some_and(|&b| b != 0));
        if !(counted && holds) {
            return Ok(false);
        }
        for &(_, s) in &self.stacked {
            let rows = outputs[s].shape.first().copied().unwrap_or(0);
            if usize::try_from(i).is_ok_and(|i| i >= rows) {
                return Err(SessionError::LoopRows { name: self.name.clone(), rows });
            }
        }
        Ok(true)
    }

    /// Ends an iteration: each carried value's next over its state, each slice into its
    /// stack's row, the iteration number one more.
    fn carry(&self, outputs: &mut [TensorMut]) {
        let row = usize::try_from(self.iteration(outputs)).unwrap_or(0);
        let pairs = self.carried.iter().map(|&(to, from)| (to, from, None));
        let rows = self.stacked.iter().map(|&(from, to)| (to, from, Some(row)));
        for (to, from, row) in pairs.chain(rows) {
            let (to, from) = if to < from {
                let (low, high) = outputs.split_at_mut(from);
                (&mut low[to], &high[0])
            } else {
                let (low, high) = outputs.split_at_mut(to);
                (&mut high[0], &low[from])
            };
            let n = from.bytes.len();
            let at = row.map_or(0, |r| r * n);
            // `next_iteration` checked that the row exists.
            if let Some(dst) = to.bytes.get_mut(at..at + n) {
                dst.copy_from_slice(from.bytes);
            }
        }
        if let Some(b) = outputs[self.iteration].bytes.first_chunk_mut::<8>() {
            *b = i64::from_le_bytes(*b).saturating_add(1).to_le_bytes();
        }
    }
}

/// Checks that the caller passes one tensor per entry of `list`, each with its dtype, shape
/// and byte length; `side` is "input" or "output".
fn check_views<'a>(
    side: &'static str,
    list: &[IoInfo],
    given: impl ExactSizeIterator<Item = (DType, &'a [usize], &'a [u8])>,
) -> Result<(), SessionError> {
    if given.len() != list.len() {
        return Err(SessionError::IoCount {
            side,
            expected: list.len(),
            got: given.len(),
            names: list.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", "),
        });
    }
    for (info, (dtype, shape, bytes)) in list.iter().zip(given) {
        if dtype != info.desc.dtype || shape != info.desc.shape {
            return Err(SessionError::IoMismatch {
                side,
                name: info.name.clone(),
                expected_dtype: info.desc.dtype,
                expected: info.desc.shape.clone(),
                got_dtype: dtype,
                got: shape.to_vec(),
            });
        }
        if bytes.len() != info.desc.bytes() {
            return Err(SessionError::IoBytes {
                side,
                name: info.name.clone(),
                dtype,
                shape: shape.to_vec(),
                expected: info.desc.bytes(),
                got: bytes.len(),
            });
        }
    }
    Ok(())
}

/// Errors if memory for output `info` cannot be had. `Tensor::zeros` aborts the process when
/// the allocator refuses, so the allocation is tried fallibly (and released) first.
fn probe_output(info: &IoInfo) -> Result<(), SessionError> {
    let bytes = info.desc.bytes();
    Vec::<u64>::new()
        .try_reserve_exact(bytes.div_ceil(8))
        .map_err(|_| SessionError::OutputAllocation { name: info.name.clone(), bytes })
}

/// Moves the first `len` entries along `axis` of a tensor of `shape` (its bound there) to
/// the start of `bytes`, densely, as a tensor of that length along `axis` lies.
fn compact(bytes: &mut [u8], shape: &[usize], size: usize, axis: usize, len: usize) {
    let (outer, bound): (usize, usize) = (shape[..axis].iter().product(), shape[axis]);
    let row = shape[axis + 1..].iter().product::<usize>() * size;
    // Block o moves from o * bound rows to o * len rows: never forward, so in order.
    for o in 1..outer {
        bytes.copy_within(o * bound * row..(o * bound + len) * row, o * len * row);
    }
}

/// The first `len` entries of `t` along `axis`.
fn cut(t: &mut Tensor, axis: usize, len: usize) -> Tensor {
    let mut desc = t.desc().clone();
    compact(t.bytes_mut(), &desc.shape, desc.dtype.size(), axis, len);
    desc.shape[axis] = len;
    let bytes = desc.bytes();
    Tensor::from_bytes(desc, &t.bytes()[..bytes]).expect("a cut is a prefix of the bytes")
}

/// A zeroed tensor for an output, or an error where memory for it cannot be had.
fn zeroed_output(info: &IoInfo) -> Result<Tensor, SessionError> {
    probe_output(info)?;
    Ok(Tensor::zeros(info.desc.clone()))
}

/// Runs submodel `k`: its inputs borrowed from the caller's inputs, the outputs written so
/// far and the boundary buffer; its outputs carved out of the outputs and the boundary.
fn run_part(
    k: usize,
    part: &mut Part,
    inputs: &[TensorRef],
    outputs: &mut [TensorMut],
    boundary: &mut [u8],
    times: Option<&mut Vec<StepTime>>,
) -> Result<(), SessionError> {
    let aliasing = || SessionError::BoundaryAliasing { submodel: k };
    let writes_output =
        |j: usize| part.outputs.iter().any(|(h, _)| matches!(h, Home::Output(o) if *o == j));
    let (mut written, mut read): (Vec<_>, Vec<_>) = (Vec::new(), Vec::new());
    for (j, t) in outputs.iter_mut().enumerate() {
        if writes_output(j) {
            written.push((j, Some(&mut *t.bytes)));
        } else {
            read.push((j, &*t.bytes));
        }
    }
    let boundary_writes = part.outputs.iter().filter_map(|(h, _)| match h {
        Home::Boundary(r) => Some(r.clone()),
        _ => None,
    });
    let mut carved = Carved::new(boundary, boundary_writes).ok_or_else(aliasing)?;
    let ins = part
        .inputs
        .iter()
        .map(|(home, desc)| {
            let bytes = match home {
                Home::Input(i) => inputs.get(*i).map(|t| t.bytes),
                Home::Output(j) => read.iter().find(|(o, _)| o == j).map(|(_, b)| *b),
                Home::Boundary(r) => carved.read(r),
            }?;
            Some(TensorRef { dtype: desc.dtype, shape: &desc.shape, bytes })
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(aliasing)?;
    let mut outs = part
        .outputs
        .iter()
        .map(|(home, desc)| {
            let bytes = match home {
                Home::Output(j) => {
                    written.iter_mut().find(|(o, _)| o == j).and_then(|(_, b)| b.take())
                }
                Home::Boundary(r) => carved.take(r),
                Home::Input(_) => None,
            }?;
            Some(TensorMut { dtype: desc.dtype, shape: &desc.shape, bytes })
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(aliasing)?;
    match times {
        Some(times) => times.extend(part.executable.run_profiled(&ins, &mut outs)?),
        None => part.executable.run(&ins, &mut outs)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bounded_output_is_cut_to_its_length_along_any_dim() {
        // [2, 4, 1] bounded along dim 1, of which a run filled 2 entries a block.
        let mut t = Tensor::from_vec(vec![2, 4, 1], &[0i32, 1, 2, 3, 4, 5, 6, 7]).unwrap();
        let cut = cut(&mut t, 1, 2);
        assert_eq!(cut.shape(), [2, 2, 1]);
        assert_eq!(cut.to_vec::<i32>().unwrap(), [0, 1, 4, 5]);
        let mut t = Tensor::from_vec(vec![3, 2], &[1i64, 2, 3, 4, 5, 6]).unwrap();
        assert_eq!(super::cut(&mut t, 0, 1).to_vec::<i64>().unwrap(), [1, 2]);
        assert_eq!(super::cut(&mut t, 0, 0).shape(), [0, 2]);
    }
}
