//! The CPU backend: a submodel's steps run in order out of the activation arena the plan
//! sized, reading weights straight from the bundle. The kernels are the op families' own
//! (`ingot_ops::cpu`); this file resolves operands, allocates and calls them.
//!
//! Every step's operands are resolved once, at creation, to a place (arena, weight, the
//! submodel's input or output) and a byte range; `run` only calls kernels.

use crate::backend::{Executable, SessionError, StepTime};
use crate::backend::{Failure, Faults, Stage};
use crate::bundle::{Bundle, tensor_desc};
use crate::carve::Carved;
use crate::ledger::{Entry, Ledger, MemoryKind};
use crate::tensor::{TensorDesc, TensorMut, TensorRef};
use ingot_ops::cpu::parallel::{Awake, OwnScratch, alone, with_threads_awake};
use ingot_ops::cpu::{Kernel, KernelError, OpCx};
use ingot_schema::Attrs;
use ingot_schema::proto::storage::Kind;
use std::ops::Range;
use std::sync::{Arc, Mutex, TryLockError};

/// Where an operand's bytes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Arena,
    Weight(usize),
    /// The submodel's input or output (the caller's, or the boundary buffer's).
    Input(usize),
    Output(usize),
}

#[derive(Clone, Debug)]
struct Operand {
    place: Place,
    bytes: Range<usize>,
    desc: TensorDesc,
}

struct Step {
    /// Its index in the variant, for errors.
    index: usize,
    name: String,
    op: String,
    kernel: Box<dyn Kernel>,
    inputs: Vec<Operand>,
    outputs: Vec<Operand>,
    /// The input whose bytes output 0 overwrites, when the plan runs this step in place.
    in_place: Option<usize>,
}

/// The CPU backend's threads: a session's, shared by its CPU submodels (they run one at a
/// time). One thread is the caller's own: no pool, no hand-over per run ([`alone`]).
pub struct CpuThreads {
    /// `None` for one thread.
    pool: Option<rayon::ThreadPool>,
    /// The kernels' scratch memory without a pool thread to keep it.
    scratch: Mutex<OwnScratch>,
    /// Idle threads spin a while for work during a run ([`with_threads_awake`]).
    spin: bool,
}

impl CpuThreads {
    pub fn start(threads: usize, spin: bool) -> Result<CpuThreads, SessionError> {
        let pool = (threads > 1)
            .then(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("ingot-cpu-{i}"))
                    .build()
                    .map_err(|e| SessionError::Threads { threads, reason: e.to_string() })
            })
            .transpose()?;
        Ok(CpuThreads { pool, scratch: Mutex::default(), spin })
    }

    fn run<R: Send>(&self, f: impl FnOnce(Option<&Awake>) -> R + Send) -> R {
        match &self.pool {
            Some(pool) => pool.install(|| with_threads_awake(self.spin, f)),
            None => match self.scratch.try_lock() {
                Ok(mut scratch) => alone(&mut scratch, || f(None)),
                Err(TryLockError::Poisoned(p)) => alone(&mut p.into_inner(), || f(None)),
                // A run within a run (none today) takes scratch of its own.
                Err(TryLockError::WouldBlock) => alone(&mut OwnScratch::default(), || f(None)),
            },
        }
    }

    /// Runs `f` on one of the pool's threads (in place when called from one), so that the
    /// CPU submodels it runs enter the pool without a hand-over; here without a pool.
    pub fn enter<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(pool) => pool.install(f),
            None => f(),
        }
    }
}

/// The CPU backend's default thread count: the machine's physical cores, or the CPUs this
/// process may use where they are fewer (affinity, a container's quota). A second hardware
/// thread on a core shares its vector units, so compute-bound kernels gain little from it,
/// and a pool larger than the free cores stalls on descheduled workers.
pub fn default_threads() -> usize {
    let allowed = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    physical_cores().map_or(allowed, |cores| cores.clamp(1, allowed))
}

/// Distinct (package, core) pairs among the online CPUs, where the OS says (Linux, Android).
fn physical_cores() -> Option<usize> {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
    let mut cores = std::collections::BTreeSet::new();
    for range in online.trim().split(',') {
        let (first, last) = range.split_once('-').unwrap_or((range, range));
        for cpu in first.parse::<usize>().ok()?..=last.parse::<usize>().ok()? {
            let topology = format!("/sys/devices/system/cpu/cpu{cpu}/topology");
            let read = |file: &str| std::fs::read_to_string(format!("{topology}/{file}")).ok();
            cores.insert((read("physical_package_id")?, read("core_id")?));
        }
    }
    Some(cores.len())
}

/// A submodel prepared for the CPU.
pub struct CpuExecutable {
    bundle: Arc<Bundle>,
    faults: Faults,
    /// The threads kernels split their work over: the session's, shared by its CPU
    /// submodels.
    threads: Arc<CpuThreads>,
    steps: Vec<Step>,
    // u64 words keep arena offsets (multiples of the plan's alignment) aligned for every type.
    arena: Vec<u64>,
    arena_bytes: usize,
    // The arena's entry in the ledger, freed on drop. Weights are read from the mapped bundle:
    // the CPU allocates nothing for them.
    ledger: Ledger,
    arena_entry: Option<Entry>,
}

impl Drop for CpuExecutable {
    fn drop(&mut self) {
        if let Some(entry) = self.arena_entry.take() {
            self.ledger.free(entry);
        }
    }
}

impl CpuExecutable {
    /// Prepares every step's kernel and allocates the arena of submodel `submodel` of variant
    /// `variant`, to run on `threads`.
    pub fn new(
        bundle: Arc<Bundle>,
        variant: usize,
        submodel: usize,
        ledger: &Ledger,
        faults: &Faults,
        threads: Arc<CpuThreads>,
    ) -> Result<CpuExecutable, Failure> {
        let v = &bundle.manifest().variants[variant];
        let sub = &v.submodels[submodel];
        let operand = |t: u32| -> Operand {
            let tensor = &v.tensors[t as usize];
            let desc = tensor_desc(tensor);
            let len = desc.bytes();
            let (root, offset) = match tensor.storage.as_ref().and_then(|s| s.kind.as_ref()) {
                Some(Kind::View(view)) => (view.of, view.byte_offset as usize),
                _ => (t, 0),
            };
            let root_kind = v.tensors[root as usize].storage.as_ref().and_then(|s| s.kind.as_ref());
            let position = |list: &[u32]| list.iter().position(|&x| x == root);
            let (place, base) = match root_kind {
                Some(Kind::Arena(off)) => (Place::Arena, *off as usize),
                Some(Kind::Weight(w)) => (Place::Weight(*w as usize), 0),
                // Validation guarantees the submodel lists every other root its steps touch.
                _ => match (position(&sub.outputs), position(&sub.inputs)) {
                    (Some(o), _) => (Place::Output(o), 0),
                    (None, Some(i)) => (Place::Input(i), 0),
                    (None, None) => (Place::Arena, usize::MAX / 2),
                },
            };
            Operand { place, bytes: base + offset..base + offset + len, desc }
        };

        let first = sub.first_step as usize;
        let mut steps = Vec::with_capacity(sub.step_count as usize);
        for (index, s) in v.steps[first..first + sub.step_count as usize]
            .iter()
            .enumerate()
            .map(|(k, s)| (first + k, s))
        {
            let prepare_error = |cause| Failure {
                stage: Stage::Pipelines,
                error: SessionError::Prepare {
                    index,
                    name: s.name.clone(),
                    op: s.op.clone(),
                    cause,
                },
            };
            let attrs = Attrs::from_proto(&s.attributes).map_err(|e| prepare_error(e.into()))?;
            let inputs: Vec<Operand> = s.inputs.iter().map(|&t| operand(t)).collect();
            // Each weight checked against its CRC before its first use (the CPU reads
            // weights where they lie in the bundle).
            for input in &inputs {
                if let Place::Weight(w) = input.place {
                    bundle.weight(w).map_err(|e| Failure::at(Stage::Weights)(e.into()))?;
                }
            }
            let outputs: Vec<Operand> = s.outputs.iter().map(|&t| operand(t)).collect();
            let in_descs: Vec<TensorDesc> = inputs.iter().map(|o| o.desc.clone()).collect();
            let out_descs: Vec<TensorDesc> = outputs.iter().map(|o| o.desc.clone()).collect();
            let kernel = ingot_ops::cpu::prepare(&OpCx {
                op: &s.op,
                attrs: &attrs,
                inputs: &in_descs,
                outputs: &out_descs,
            })
            .map_err(prepare_error)?;
            // Empty tensors share every place without aliasing anything.
            let in_place = outputs.first().filter(|o| !o.bytes.is_empty()).and_then(|out| {
                inputs.iter().position(|i| i.place == out.place && i.bytes == out.bytes)
            });
            if in_place.is_some_and(|k| !ingot_ops::can_run_in_place(&s.op, &attrs, k)) {
                return Err(prepare_error(KernelError::Invalid(
                    "the plan writes its output over an input, which this op cannot do".into(),
                )));
            }
            steps.push(Step {
                index,
                name: s.name.clone(),
                op: s.op.clone(),
                kernel,
                inputs,
                outputs,
                in_place,
            });
        }
        faults.check("cpu", Stage::Pipelines).map_err(Failure::at(Stage::Pipelines))?;

        let arena_bytes = sub.arena_bytes;
        let words = arena_bytes.div_ceil(8) as usize;
        let mut arena = Vec::new();
        arena
            .try_reserve_exact(words)
            .map_err(|_| SessionError::ArenaAllocation { bytes: arena_bytes })
            .map_err(Failure::at(Stage::Arena))?;
        arena.resize(words, 0);
        let exe = CpuExecutable {
            ledger: ledger.clone(),
            arena_entry: Some(ledger.allocate(MemoryKind::Arena, arena_bytes, "cpu arena")),
            steps,
            arena,
            arena_bytes: arena_bytes as usize,
            bundle,
            faults: faults.clone(),
            threads,
        };
        // After the allocation, so that a test sees it freed.
        faults.check("cpu", Stage::Arena).map_err(Failure::at(Stage::Arena))?;
        Ok(exe)
    }
}

impl Executable for CpuExecutable {
    fn run(&mut self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), SessionError> {
        self.faults.check("cpu", Stage::Run)?;
        let threads = Arc::clone(&self.threads);
        threads.run(|awake| self.run_steps(inputs, outputs, awake, None))
    }

    fn run_profiled(
        &mut self,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
    ) -> Result<Vec<StepTime>, SessionError> {
        self.faults.check("cpu", Stage::Run)?;
        let threads = Arc::clone(&self.threads);
        let mut times = Vec::with_capacity(self.steps.len());
        threads.run(|awake| self.run_steps(inputs, outputs, awake, Some(&mut times)))?;
        Ok(times)
    }
}

impl CpuExecutable {
    /// Runs every step, telling `awake` (the idle threads) as each starts; with `times`,
    /// pushes each step's wall time.
    fn run_steps(
        &mut self,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
        awake: Option<&Awake>,
        mut times: Option<&mut Vec<StepTime>>,
    ) -> Result<(), SessionError> {
        let arena = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.arena)[..self.arena_bytes];
        for step in &self.steps {
            if let Some(awake) = awake {
                awake.step();
            }
            let start = times.is_some().then(std::time::Instant::now);
            let index = step.index;
            let fail = |cause| {
                let (name, op) = (step.name.clone(), step.op.clone());
                match cause {
                    KernelError::Data(_) => SessionError::Data { index, name, op, cause },
                    cause => SessionError::Step { index, name, op, cause },
                }
            };
            let aliasing =
                || SessionError::Aliasing { index, name: step.name.clone(), op: step.op.clone() };
            let mut places = Places {
                bundle: &self.bundle,
                inputs,
                arena: Carved::new(arena, arena_writes(&step.outputs)).ok_or_else(aliasing)?,
                outputs: OutputSlots::new(outputs, &step.outputs),
            };
            let ins = step
                .inputs
                .iter()
                .enumerate()
                .map(|(k, o)| match step.in_place {
                    // Its bytes are output 0's: the kernel reads them from there.
                    Some(aliased) if aliased == k => {
                        Some(TensorRef { dtype: o.desc.dtype, shape: &o.desc.shape, bytes: &[] })
                    }
                    _ => places.read(o),
                })
                .collect::<Option<Vec<_>>>()
                .ok_or_else(aliasing)?;
            let mut outs = step
                .outputs
                .iter()
                .map(|o| places.write(o))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(aliasing)?;
            match step.in_place {
                Some(aliased) => step.kernel.run_in_place(aliased, &ins, &mut outs),
                None => step.kernel.run(&ins, &mut outs),
            }
            .map_err(fail)?;
            if let (Some(times), Some(start)) = (times.as_deref_mut(), start) {
                let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
                times.push(StepTime { step: index, nanos: Some(nanos), dispatches: None });
            }
        }
        Ok(())
    }
}

/// The arena ranges a step writes.
fn arena_writes(outputs: &[Operand]) -> impl Iterator<Item = Range<usize>> + '_ {
    outputs.iter().filter(|o| o.place == Place::Arena).map(|o| o.bytes.clone())
}

/// One step's view of memory: shared borrows for what it reads, exclusive borrows for what it
/// writes, carved from the same buffers without copies or unsafe code.
struct Places<'a> {
    bundle: &'a Bundle,
    inputs: &'a [TensorRef<'a>],
    arena: Carved<'a>,
    outputs: OutputSlots<'a>,
}

impl<'a> Places<'a> {
    fn read(&mut self, o: &'a Operand) -> Option<TensorRef<'a>> {
        let bytes: &'a [u8] = match o.place {
            Place::Arena => self.arena.read(&o.bytes)?,
            Place::Weight(w) => self.bundle.weight_bytes(w).get(o.bytes.clone())?,
            Place::Input(i) => self.inputs.get(i)?.bytes.get(o.bytes.clone())?,
            Place::Output(i) => self.outputs.read(i)?.get(o.bytes.clone())?,
        };
        Some(TensorRef { dtype: o.desc.dtype, shape: &o.desc.shape, bytes })
    }

    fn write(&mut self, o: &'a Operand) -> Option<TensorMut<'a>> {
        let bytes: &'a mut [u8] = match o.place {
            Place::Arena => self.arena.take(&o.bytes)?,
            Place::Output(i) => self.outputs.take(i)?.get_mut(o.bytes.clone())?,
            Place::Weight(_) | Place::Input(_) => return None,
        };
        Some(TensorMut { dtype: o.desc.dtype, shape: &o.desc.shape, bytes })
    }
}

/// The caller-visible outputs, split into those the step writes and those it may read.
struct OutputSlots<'a> {
    slots: Vec<Slot<'a>>,
}

enum Slot<'a> {
    Read(&'a [u8]),
    Write(Option<&'a mut [u8]>),
}

impl<'a> OutputSlots<'a> {
    fn new(outputs: &'a mut [TensorMut], written: &[Operand]) -> Self {
        let slots = outputs
            .iter_mut()
            .enumerate()
            .map(|(i, t)| {
                if written.iter().any(|o| o.place == Place::Output(i)) {
                    Slot::Write(Some(&mut *t.bytes))
                } else {
                    Slot::Read(&*t.bytes)
                }
            })
            .collect();
        OutputSlots { slots }
    }

    fn read(&self, i: usize) -> Option<&'a [u8]> {
        match self.slots.get(i)? {
            Slot::Read(bytes) => Some(bytes),
            Slot::Write(_) => None,
        }
    }

    fn take(&mut self, i: usize) -> Option<&'a mut [u8]> {
        match self.slots.get_mut(i)? {
            Slot::Write(slot) => slot.take(),
            Slot::Read(_) => None,
        }
    }
}
