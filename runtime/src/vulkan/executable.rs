//! One submodel made ready to run on one device: its pipelines, its buffers (allocated in the
//! plan's order), one descriptor set per dispatch and one command buffer recorded once.

use super::context::{Context, lock};
use super::layout::{Hazards, Region, descriptor_range, io_layout};
use super::memory::{Buffer, Placement};
use super::pipeline_cache::FileCache;
use super::{DeviceInfo, KernelClass, VulkanError, VulkanOptions};
use crate::backend::{Failure, Faults, Stage, StepTime};
use crate::bundle::{Bundle, tensor_desc};
use crate::ledger::{Ledger, MemoryKind};
use crate::tensor::{TensorMut, TensorRef};
use ash::vk;
use ingot_schema::proto::{self, DeviceClass, storage::Kind};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A buffer of the allocation schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Slot {
    /// Weight bank entry.
    Weight(u32),
    Arena,
    /// The submodel's inputs then outputs.
    Io,
}

impl std::fmt::Display for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Slot::Weight(w) => write!(f, "weight {w}"),
            Slot::Arena => f.write_str("the arena"),
            Slot::Io => f.write_str("the IO buffer"),
        }
    }
}

/// Where every tensor of a submodel lives: the buffers in schedule order, and the IO layout.
struct Places<'a> {
    variant: &'a proto::Variant,
    submodel: &'a proto::Submodel,
    /// The plan's allocations: which buffer and its bytes, in order.
    schedule: Vec<(Slot, u64)>,
    /// Where each buffer is in `schedule`.
    index: BTreeMap<Slot, usize>,
    /// Byte ranges of the submodel's inputs, then its outputs, in the IO buffer.
    io: Vec<Range<u64>>,
}

impl<'a> Places<'a> {
    /// Reads the allocation schedule and checks it against the manifest: every buffer once,
    /// each with the bytes it must hold.
    fn new(
        m: &proto::Manifest,
        v: &'a proto::Variant,
        sub: &'a proto::Submodel,
    ) -> Result<Places<'a>, VulkanError> {
        let bundle = |msg: String| VulkanError::Bundle(format!("variant '{}': {msg}", v.name));
        let plan = v.plan.as_ref().ok_or_else(|| bundle("has no plan".into()))?;
        let io_bytes = sub
            .inputs
            .iter()
            .chain(&sub.outputs)
            .map(|&t| tensor_desc(&v.tensors[t as usize]).bytes() as u64);
        let (io, io_total) =
            io_layout(io_bytes).ok_or_else(|| bundle("the IO buffer's size overflows".into()))?;
        let first = sub.first_allocation as usize;
        let allocations = &plan.allocations[first..first + sub.allocation_count as usize];
        let mut schedule: Vec<(Slot, u64)> = Vec::with_capacity(allocations.len());
        let mut index = BTreeMap::new();
        for (k, a) in allocations.iter().enumerate() {
            let (slot, expected) = match proto::AllocationKind::try_from(a.kind) {
                Ok(proto::AllocationKind::Weight) => (
                    Slot::Weight(a.weight),
                    m.weights.get(a.weight as usize).map_or(0, |w| w.length),
                ),
                Ok(proto::AllocationKind::Arena) => (Slot::Arena, sub.arena_bytes),
                Ok(proto::AllocationKind::Io) => (Slot::Io, io_total),
                _ => return Err(bundle(format!("allocation {k} has an unknown kind"))),
            };
            // Buffers are whole words (see `Buffer`): a plan may predict that, or the bytes.
            if expected == 0 || (a.bytes != expected && a.bytes != expected.next_multiple_of(4)) {
                return Err(bundle(format!(
                    "allocation {k} ({slot}) is {} bytes; it must be {expected} (not 0)",
                    a.bytes
                )));
            }
            if index.insert(slot, schedule.len()).is_some() {
                return Err(bundle(format!("allocation {k} allocates {slot} again")));
            }
            schedule.push((slot, a.bytes));
        }
        for (slot, bytes) in [(Slot::Arena, sub.arena_bytes), (Slot::Io, io_total)] {
            if bytes > 0 && !index.contains_key(&slot) {
                return Err(bundle(format!("the plan's allocations miss {slot} ({bytes} bytes)")));
            }
        }
        Ok(Places { variant: v, submodel: sub, schedule, index, io })
    }

    /// The buffer (index into the schedule) and byte offset where tensor `t` starts.
    fn locate(&self, t: u32) -> Result<(usize, u64), VulkanError> {
        let v = self.variant;
        let kind = |t: u32| {
            v.tensors.get(t as usize).and_then(|t| t.storage.as_ref()).and_then(|s| s.kind.as_ref())
        };
        let (root, view_offset) = match kind(t) {
            Some(Kind::View(view)) => (view.of, view.byte_offset),
            _ => (t, 0),
        };
        // Roots outside the arena and the weights are the submodel's inputs or outputs.
        let sub = self.submodel;
        let io = sub
            .inputs
            .iter()
            .chain(&sub.outputs)
            .position(|&x| x == root)
            .and_then(|i| self.io.get(i))
            .map(|r| r.start);
        let (slot, base) = match kind(root) {
            Some(Kind::Weight(w)) => (Slot::Weight(*w), Some(0)),
            Some(Kind::Arena(offset)) => (Slot::Arena, Some(*offset)),
            _ => (Slot::Io, io),
        };
        let name = v.tensors.get(t as usize).map_or("", |t| t.name.as_str());
        let bundle = |msg: String| {
            VulkanError::Bundle(format!("variant '{}': tensor {t} '{name}' {msg}", v.name))
        };
        let base = base.ok_or_else(|| bundle("has no storage a kernel can bind".into()))?;
        let buffer = self
            .index
            .get(&slot)
            .ok_or_else(|| bundle(format!("lives in {slot}, which the plan never allocates")))?;
        Ok((*buffer, base + view_offset))
    }
}

/// One dispatch with everything resolved: what to bind, the push constants, what it touches.
struct Bound {
    /// Its step's index in the variant.
    step: usize,
    kernel: usize,
    /// The kernel's binding slots (the first `descriptors.len()` are bound).
    slots: u32,
    groups: [u32; 3],
    /// (buffer index, offset, range) per binding.
    descriptors: Vec<(usize, u64, u64)>,
    /// Push-constant words: where each tensor starts in its bound range, in elements.
    words: Vec<u32>,
    reads: Vec<Region>,
    writes: Vec<Region>,
}

/// The dispatches of the device class's entry (else the ANY entry) of every step of `steps`,
/// in order.
fn choose_dispatches(
    v: &proto::Variant,
    steps: Range<usize>,
    class: DeviceClass,
) -> Result<Vec<(usize, &proto::Dispatch)>, VulkanError> {
    let mut out = Vec::new();
    for (index, step) in
        v.steps[steps.clone()].iter().enumerate().map(|(k, s)| (steps.start + k, s))
    {
        let entry = |c: DeviceClass| step.vulkan.iter().find(|e| e.device_class == c as i32);
        let Some(entry) = entry(class).or_else(|| entry(DeviceClass::Any)) else {
            return Err(VulkanError::Unsupported {
                index,
                name: step.name.clone(),
                op: step.op.clone(),
                class: if class == DeviceClass::Cpu { "CPU-type" } else { "GPU" },
                reason: match (step.vulkan.is_empty(), step.no_vulkan_kernel.as_str()) {
                    (false, _) => "its kernels are for other device classes".into(),
                    (true, "") => "the compiler gave it none".into(),
                    (true, why) => why.into(),
                },
            });
        };
        out.extend(entry.dispatches.iter().map(|d| (index, d)));
    }
    Ok(out)
}

/// Resolves the bindings of `dispatch` (of step `step`) and checks it against the limits.
fn bind(
    cx: &Context,
    cx_kernels: &[proto::Kernel],
    places: &Places,
    step: usize,
    dispatch: &proto::Dispatch,
) -> Result<Bound, VulkanError> {
    let v = places.variant;
    let s = &v.steps[step];
    let what = || format!("dispatch of step {step} '{}' ({})", s.name, s.op);
    let limit = |limit: &'static str, value: u64, need: u64, what: String| {
        if need > value {
            Err(VulkanError::Limits { device: cx.info.to_string(), limit, value, need, what })
        } else {
            Ok(())
        }
    };
    let l = &cx.limits;
    let groups = [0, 1, 2].map(|i| dispatch.groups.get(i).copied().unwrap_or(1));
    for (i, axis) in ["x", "y", "z"].iter().enumerate() {
        limit(
            "maxComputeWorkGroupCount",
            l.max_compute_work_group_count[i].into(),
            groups[i].into(),
            format!("{} ({axis})", what()),
        )?;
    }
    // The bundle's validation checked the counts against the kernel's.
    let kernel = &cx_kernels[dispatch.kernel as usize];
    let slots = u64::from(kernel.bindings);
    limit(
        "maxPushConstantsSize",
        l.max_push_constants_size.into(),
        4 * (slots + u64::from(kernel.params)),
        what(),
    )?;
    limit(
        "maxPerStageDescriptorStorageBuffers",
        l.max_per_stage_descriptor_storage_buffers.into(),
        slots,
        what(),
    )?;
    let mut bound = Bound {
        step,
        kernel: dispatch.kernel as usize,
        slots: kernel.bindings,
        groups,
        descriptors: Vec::with_capacity(dispatch.bindings.len()),
        words: Vec::with_capacity(dispatch.bindings.len()),
        reads: Vec::new(),
        writes: Vec::new(),
    };
    for b in &dispatch.bindings {
        let t = b.tensor;
        let tensor = &v.tensors[t as usize];
        let (buffer, start) = places.locate(t)?;
        // A chunk binding is bound as if its bytes were the tensor (validated inside it).
        let (start, bytes) = match b.byte_length {
            0 => (start, tensor_desc(tensor).bytes() as u64),
            len => (start + b.byte_offset, len),
        };
        let (offset, range) =
            descriptor_range(start, bytes, l.min_storage_buffer_offset_alignment.max(1));
        let binding = || format!("tensor {t} '{}' in the {}", tensor.name, what());
        limit("maxStorageBufferRange", l.max_storage_buffer_range.into(), range, binding())?;
        let buffer_size = places.schedule[buffer].1.next_multiple_of(4);
        let eb = u64::from(b.element_bytes.max(1));
        let word = u32::try_from((start - offset) / eb).ok();
        match word {
            Some(word) if (start - offset) % eb == 0 && offset + range <= buffer_size => {
                bound.words.push(word)
            }
            _ => {
                return Err(VulkanError::Bundle(format!(
                    "{} cannot be bound: {bytes} bytes at {start} of a {buffer_size}-byte \
                     buffer, {eb}-byte elements",
                    binding()
                )));
            }
        }
        bound.descriptors.push((buffer, offset, range));
        let region = Region::words(buffer, start..start + bytes);
        if b.write {
            bound.writes.push(region);
        } else {
            bound.reads.push(region);
        }
    }
    // Unbound slots (optional ones the module leaves unread) get offset 0, then the params.
    bound.words.resize(kernel.bindings as usize, 0);
    bound.words.extend(&dispatch.params);
    Ok(bound)
}

/// Checks that tensors of byte lengths `lens` fit `ranges` of the IO buffer one for one.
fn check_sizes(
    what: &str,
    lens: impl ExactSizeIterator<Item = usize>,
    ranges: &[Range<u64>],
) -> Result<(), VulkanError> {
    if lens.len() != ranges.len() {
        return Err(VulkanError::Arguments(format!(
            "{} {what}s given, the variant has {}",
            lens.len(),
            ranges.len()
        )));
    }
    for (i, (len, r)) in lens.zip(ranges).enumerate() {
        if len as u64 != r.end - r.start {
            return Err(VulkanError::Arguments(format!(
                "{what} {i} has {len} bytes, the variant's has {}",
                r.end - r.start
            )));
        }
    }
    Ok(())
}

/// A weight uploaded to one device, shared by every executable of its bundle there (sessions
/// of all variants, all submodels) through the context's residency table: uploaded by the
/// first, freed with the last, both recorded in the ledger of the one that uploaded it.
pub struct Resident {
    buffer: Option<Buffer>,
    cx: Arc<Context>,
    ledger: Ledger,
    // Keeps the bundle's address, the residency key, from being reused while this lives.
    _bundle: Arc<Bundle>,
}

/// The residency key of a weight: (the bundle's address, its bank entry). Only executables of
/// one `Arc<Bundle>` share: see ARCHITECTURE.md for why not equal content across bundles.
pub type WeightKey = (usize, u32);

impl Drop for Resident {
    fn drop(&mut self) {
        // The executables that used it waited for the device before letting it go.
        if let Some(buffer) = self.buffer.take() {
            buffer.free(&self.cx, &self.ledger);
        }
    }
}

/// A buffer of an executable: its own, or a resident weight it shares.
enum Held {
    Own(Buffer),
    Shared(Arc<Resident>),
}

impl Held {
    fn buffer(&self) -> vk::Buffer {
        match self {
            Held::Own(b) => b.buffer,
            Held::Shared(r) => r.buffer.as_ref().map_or(vk::Buffer::null(), |b| b.buffer),
        }
    }
}

/// A variant ready to run on one Vulkan device.
pub struct VulkanExecutable {
    cx: Arc<Context>,
    ledger: Ledger,
    /// In allocation order (the plan's); freed in reverse.
    buffers: Vec<Held>,
    /// Which of `buffers` holds the submodel's inputs and outputs.
    io: Option<usize>,
    /// Byte ranges of the inputs, then the outputs, in the IO buffer.
    io_ranges: Vec<Range<u64>>,
    faults: Faults,
    /// [`VulkanOptions::allocation_granularity`].
    granularity: u64,
    /// Whether an upload went through a staging buffer.
    staged: bool,
    inputs: usize,
    pipelines: Vec<vk::Pipeline>,
    descriptor_pool: vk::DescriptorPool,
    command_pool: vk::CommandPool,
    /// The submodel's steps in the variant.
    steps: Range<usize>,
    /// In order, as the command buffers record them.
    dispatches: Vec<Recorded>,
    commands: vk::CommandBuffer,
    /// The command buffer of profiled runs and its timestamp pool, once one was asked for.
    profiled: Option<(vk::CommandBuffer, vk::QueryPool)>,
    fence: vk::Fence,
}

// Sessions may move executables between threads.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<VulkanExecutable>();
};

impl std::fmt::Debug for VulkanExecutable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanExecutable")
            .field("device", &self.cx.info)
            .field("buffers", &self.buffers.len())
            .field("pipelines", &self.pipelines.len())
            .finish()
    }
}

impl VulkanExecutable {
    /// Prepares submodel `submodel` of variant `variant` of `bundle` on the device `options`
    /// choose: pipelines first, then the plan's allocations in order (each weight shared if
    /// an executable of `bundle` already holds it on the device, else uploaded right after it
    /// is allocated), then the command buffer. Every allocation is recorded in `ledger`,
    /// marked with the device; on failure everything allocated so far is released (a shared
    /// weight is freed with its last user), and the error says at which stage it failed.
    pub fn new(
        bundle: Arc<Bundle>,
        variant: usize,
        submodel: usize,
        options: &VulkanOptions,
        ledger: &Ledger,
        faults: &Faults,
    ) -> Result<VulkanExecutable, Failure> {
        let m = bundle.manifest();
        let fail = |stage| move |e: VulkanError| Failure::at(stage)(e.into());
        let missing =
            || VulkanError::Bundle(format!("no submodel {submodel} of variant {variant}"));
        let v = m.variants.get(variant).ok_or_else(missing).map_err(fail(Stage::Kernels))?;
        let sub = v.submodels.get(submodel).ok_or_else(missing).map_err(fail(Stage::Kernels))?;
        let places = Places::new(m, v, sub).map_err(fail(Stage::Kernels))?;
        faults.check("vulkan", Stage::Instance).map_err(Failure::at(Stage::Instance))?;
        faults.check("vulkan", Stage::Device).map_err(Failure::at(Stage::Device))?;
        let cx = Context::shared(&options.device).map_err(|e| {
            let stage = match e {
                VulkanError::Loader(_) => Stage::Loader,
                VulkanError::Instance(_) => Stage::Instance,
                _ => Stage::Device,
            };
            Failure::at(stage)(e.into())
        })?;
        // One allocation per buffer of the plan, and one staging buffer at a time.
        let allocations = places.schedule.len() as u64 + 1;
        if allocations > u64::from(cx.limits.max_memory_allocation_count) {
            return Err(fail(Stage::Weights)(VulkanError::Limits {
                device: cx.info.to_string(),
                limit: "maxMemoryAllocationCount",
                value: cx.limits.max_memory_allocation_count.into(),
                need: allocations,
                what: format!("variant '{}' (one allocation per weight)", v.name),
            }));
        }
        let steps = sub.first_step as usize..(sub.first_step + sub.step_count) as usize;
        let class = match options.kernel_class {
            KernelClass::Auto => cx.class,
            KernelClass::Cpu => DeviceClass::Cpu,
            KernelClass::Gpu => DeviceClass::Gpu,
        };
        let bound = choose_dispatches(v, steps.clone(), class)
            .and_then(|dispatches| {
                dispatches
                    .into_iter()
                    .map(|(step, d)| bind(&cx, &bundle.manifest().kernels, &places, step, d))
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(fail(Stage::Kernels))?;
        let device = format!("vulkan:{}", cx.info.index);
        let mut exe = VulkanExecutable {
            cx,
            ledger: ledger.on(&device),
            buffers: Vec::with_capacity(places.schedule.len()),
            io: places.index.get(&Slot::Io).copied(),
            io_ranges: places.io.clone(),
            inputs: sub.inputs.len(),
            faults: faults.clone(),
            granularity: options.allocation_granularity,
            staged: false,
            pipelines: Vec::new(),
            descriptor_pool: vk::DescriptorPool::null(),
            command_pool: vk::CommandPool::null(),
            steps: steps.clone(),
            dispatches: Vec::new(),
            commands: vk::CommandBuffer::null(),
            profiled: None,
            fence: vk::Fence::null(),
        };
        // From here on, dropping `exe` on an error frees whatever was made.
        exe.create_sync().map_err(fail(Stage::Device))?;
        // With a cache file, pipelines come from (and go back to) it; else from the device's
        // in-memory cache, which every executable on it shares.
        let file_cache =
            options.pipeline_cache.as_deref().and_then(|p| FileCache::open(&exe.cx, p));
        let cache = file_cache.as_ref().map_or(exe.cx.pipeline_cache, |f| f.cache);
        let pipelines = exe.create_pipelines(&bundle, &bound, cache);
        if let (Some(file), Ok(_)) = (&file_cache, &pipelines) {
            file.save();
        }
        drop(file_cache);
        let pipelines = pipelines.map_err(fail(Stage::Pipelines))?;
        faults.check("vulkan", Stage::Pipelines).map_err(Failure::at(Stage::Pipelines))?;
        exe.allocate(&bundle, &places.schedule, options.force_staging)?;
        exe.record(&bound, &pipelines).map_err(fail(Stage::Pipelines))?;
        Ok(exe)
    }

    pub fn device(&self) -> &DeviceInfo {
        &self.cx.info
    }

    /// Runs the variant: `inputs` and `outputs` in the variant's order, with the right dtypes
    /// and shapes (the caller checked them; byte lengths are checked again here).
    pub fn run(
        &mut self,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
    ) -> Result<(), VulkanError> {
        self.run_commands(self.commands, inputs, outputs)
    }

    /// Writes the inputs, runs `commands` and waits, reads the outputs.
    fn run_commands(
        &mut self,
        commands: vk::CommandBuffer,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
    ) -> Result<(), VulkanError> {
        if self.faults.check("vulkan", Stage::Run).is_err() {
            return Err(VulkanError::DeviceLost {
                device: self.cx.info.to_string(),
                stage: "run (injected fault)",
            });
        }
        let (in_ranges, out_ranges) = self.io_ranges.split_at(self.inputs);
        check_sizes("input", inputs.iter().map(|t| t.bytes.len()), in_ranges)?;
        check_sizes("output", outputs.iter().map(|t| t.bytes.len()), out_ranges)?;
        let span = |r: &Range<u64>| r.start as usize..r.end as usize;
        // The IO buffer is always this executable's own.
        if let Some(Held::Own(io)) = self.io.and_then(|io| self.buffers.get_mut(io)) {
            let mapped = io.bytes_mut();
            for (t, r) in inputs.iter().zip(in_ranges) {
                mapped[span(r)].copy_from_slice(t.bytes);
            }
        }
        self.submit_and_wait(commands, "run")?;
        if let Some(Held::Own(io)) = self.io.and_then(|io| self.buffers.get_mut(io)) {
            let mapped = io.bytes_mut();
            for (t, r) in outputs.iter_mut().zip(out_ranges) {
                t.bytes.copy_from_slice(&mapped[span(r)]);
            }
        }
        Ok(())
    }

    /// The command pool and the fence of the runs (and uploads).
    fn create_sync(&mut self) -> Result<(), VulkanError> {
        let device = &self.cx.device;
        let pool = vk::CommandPoolCreateInfo::default().queue_family_index(self.cx.queue_family);
        let fail = |what: &str, r: vk::Result| {
            VulkanError::Device(format!("{}: {what}: {r}", self.cx.info))
        };
        // SAFETY: plain creates on the live device; the handles are destroyed in `drop`.
        unsafe {
            self.command_pool = device
                .create_command_pool(&pool, None)
                .map_err(|r| fail("vkCreateCommandPool", r))?;
            self.fence = device
                .create_fence(&vk::FenceCreateInfo::default(), None)
                .map_err(|r| fail("vkCreateFence", r))?;
        }
        Ok(())
    }

    /// One compute pipeline per kernel the dispatches use, by kernel index, made through
    /// `cache`. Most GPU drivers compile a kernel when its pipeline is made, so the kernels
    /// are spread over one thread per core (Vulkan lets threads share a device and a cache).
    fn create_pipelines(
        &mut self,
        bundle: &Bundle,
        bound: &[Bound],
        cache: vk::PipelineCache,
    ) -> Result<BTreeMap<usize, (vk::Pipeline, vk::PipelineLayout)>, VulkanError> {
        let kernels = &bundle.manifest().kernels;
        let fail = |kernel: usize, reason: String| VulkanError::Pipeline {
            device: self.cx.info.to_string(),
            kernel,
            name: kernels[kernel].name.clone(),
            reason,
        };
        // Each kernel once, in the order of first use, with its layout (from the device's
        // shared table) and workgroup checked here, before any thread starts.
        let mut layouts = BTreeMap::new();
        let mut jobs = Vec::new();
        for b in bound {
            if layouts.contains_key(&b.kernel) {
                continue;
            }
            let kernel = &kernels[b.kernel];
            let size = [0, 1, 2].map(|i| kernel.workgroup_size.get(i).copied().unwrap_or(1));
            self.check_workgroup(b.kernel, &kernel.name, size)?;
            let layout = self
                .cx
                .layout(kernel.bindings, b.words.len() as u32)
                .map_err(|r| fail(b.kernel, format!("creating its layout: {r}")))?;
            layouts.insert(b.kernel, layout.pipeline);
            jobs.push((b.kernel, layout.pipeline));
        }
        let next = AtomicUsize::new(0);
        let made: Mutex<Vec<(usize, Result<vk::Pipeline, String>)>> = Mutex::default();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(jobs.len());
        let work = || {
            while let Some(&(kernel, layout)) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) {
                let pipeline =
                    create_pipeline(&self.cx.device, bundle.kernel_code(kernel), layout, cache);
                lock(&made).push((kernel, pipeline));
            }
        };
        std::thread::scope(|s| {
            // A thread the system refuses leaves its share to the others.
            for _ in 1..threads {
                let _ = std::thread::Builder::new().spawn_scoped(s, work);
            }
            work();
        });
        let mut made = made.into_inner().unwrap_or_else(|e| e.into_inner());
        // Reported as if made one after another: the first kernel in order that failed.
        made.sort_by_key(|&(kernel, _)| jobs.iter().position(|&(k, _)| k == kernel));
        let mut out = BTreeMap::new();
        let mut failed = None;
        for (kernel, pipeline) in made {
            match pipeline {
                Ok(pipeline) => {
                    self.pipelines.push(pipeline);
                    out.insert(kernel, (pipeline, layouts[&kernel]));
                }
                Err(reason) => failed = failed.or(Some(fail(kernel, reason))),
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Fails if the device cannot run workgroups of `size` invocations.
    fn check_workgroup(
        &self,
        kernel: usize,
        name: &str,
        size: [u32; 3],
    ) -> Result<(), VulkanError> {
        let l = &self.cx.limits;
        let what = || format!("kernel {kernel} '{name}' (workgroup {size:?})");
        let invocations = size.iter().map(|&s| u64::from(s)).product::<u64>();
        let checks = [
            ("maxComputeWorkGroupSize", l.max_compute_work_group_size[0], size[0].into()),
            ("maxComputeWorkGroupSize", l.max_compute_work_group_size[1], size[1].into()),
            ("maxComputeWorkGroupSize", l.max_compute_work_group_size[2], size[2].into()),
            ("maxComputeWorkGroupInvocations", l.max_compute_work_group_invocations, invocations),
        ];
        match checks.into_iter().find(|&(_, value, need)| need > u64::from(value)) {
            Some((limit, value, need)) => Err(VulkanError::Limits {
                device: self.cx.info.to_string(),
                limit,
                value: value.into(),
                need,
                what: what(),
            }),
            None => Ok(()),
        }
    }

    /// The plan's allocations in order. A weight already resident on the device (uploaded by
    /// another executable of the bundle) is shared; else it is allocated and uploaded at once.
    /// An injected fault fires when its stage's allocations are done (even if there are none),
    /// so a test sees what was allocated freed.
    fn allocate(
        &mut self,
        bundle: &Arc<Bundle>,
        schedule: &[(Slot, u64)],
        force_staging: bool,
    ) -> Result<(), Failure> {
        const STAGES: [Stage; 3] = [Stage::Weights, Stage::Arena, Stage::Io];
        let faults = self.faults.clone();
        let mut done = 0;
        let mut finish = |upto: usize| -> Result<(), Failure> {
            while done < upto {
                let stage = STAGES[done];
                faults.check("vulkan", stage).map_err(Failure::at(stage))?;
                done += 1;
            }
            Ok(())
        };
        for &(slot, bytes) in schedule {
            let stage = match slot {
                Slot::Weight(_) => 0,
                Slot::Arena => 1,
                Slot::Io => 2,
            };
            finish(stage)?;
            let fail = |e: VulkanError| Failure::at(STAGES[stage])(e.into());
            let own = |kind, label: &str, placement| {
                let request = (kind, bytes, label.to_string());
                Buffer::allocate(&self.cx, &self.ledger, request, placement, self.granularity)
                    .map(Held::Own)
            };
            let held = match slot {
                Slot::Weight(w) => {
                    // Checked against its CRC just before its upload, not at open.
                    bundle.weight(w as usize).map_err(|e| Failure::at(Stage::Weights)(e.into()))?;
                    let key = (Arc::as_ptr(bundle) as usize, w);
                    let mut staged = false;
                    let upload = || self.upload(bundle, (w, bytes), force_staging, &mut staged);
                    let held = self.cx.resident.get_or_make(key, upload).map(Held::Shared);
                    self.staged |= staged;
                    held
                }
                Slot::Arena => own(MemoryKind::Arena, "arena", Placement::Device),
                Slot::Io => own(MemoryKind::Io, "io", Placement::Host),
            };
            self.buffers.push(held.map_err(fail)?);
        }
        finish(STAGES.len())
    }

    /// Allocates a buffer of `bytes` for weight `w` and writes the weight into it (through a
    /// staging buffer, freed at once, where the host cannot write it directly); the mapped
    /// bundle's pages of it are released after. On failure nothing is left allocated.
    fn upload(
        &self,
        bundle: &Arc<Bundle>,
        (w, bytes): (u32, u64),
        force_staging: bool,
        staged: &mut bool,
    ) -> Result<Resident, VulkanError> {
        let (cx, ledger) = (&self.cx, &self.ledger);
        let label = format!("weight {w}");
        let data = bundle.weight_bytes(w as usize);
        let fail = |reason: String| VulkanError::Allocation {
            device: cx.info.to_string(),
            kind: MemoryKind::Weight,
            bytes: data.len() as u64,
            label: label.clone(),
            reason,
        };
        let request = (MemoryKind::Weight, bytes, label.clone());
        let mut target =
            Buffer::allocate(cx, ledger, request, Placement::Device, self.granularity)?;
        let stage = || {
            let request = (MemoryKind::Staging, data.len() as u64, format!("staging for {label}"));
            let mut staging =
                Buffer::allocate(cx, ledger, request, Placement::Staging, self.granularity)?;
            let copied = staging
                .write(cx, data)
                .map_err(fail)
                .and_then(|()| self.copy(staging.buffer, target.buffer, data.len() as u64));
            staging.free(cx, ledger);
            copied
        };
        let written = if target.host_coherent() && !force_staging {
            target.write(cx, data).map_err(fail)
        } else {
            *staged = true;
            stage()
        };
        if let Err(e) = written {
            // Nothing uses it: a failed copy waited for the device to be idle.
            target.free(cx, ledger);
            return Err(e);
        }
        bundle.release_weight_pages(w as usize);
        Ok(Resident {
            buffer: Some(target),
            cx: Arc::clone(cx),
            ledger: ledger.clone(),
            _bundle: Arc::clone(bundle),
        })
    }

    /// Submits `commands`, signalling this executable's fence, and waits for it.
    fn submit_and_wait(
        &self,
        commands: vk::CommandBuffer,
        stage: &'static str,
    ) -> Result<(), VulkanError> {
        let cx = &self.cx;
        let fences = [self.fence];
        // SAFETY: the fence is this executable's and not in use: its last submission was
        // waited for (or failed, and a lost device ignores the reset).
        unsafe { cx.device.reset_fences(&fences) }.map_err(|r| cx.submit_error(stage, r))?;
        cx.submit(commands, self.fence).map_err(|r| cx.submit_error(stage, r))?;
        // SAFETY: waits on this executable's own fence.
        unsafe { cx.device.wait_for_fences(&fences, true, u64::MAX) }
            .map_err(|r| cx.submit_error(stage, r))
    }

    /// Copies `bytes` from `src` to `dst` on the device and waits; makes them visible to
    /// compute shaders.
    fn copy(&self, src: vk::Buffer, dst: vk::Buffer, bytes: u64) -> Result<(), VulkanError> {
        let cx = &self.cx;
        let device = &cx.device;
        let info = vk::CommandBufferAllocateInfo::default()
            .command_pool(self.command_pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the pool is this executable's, used from one thread at a time: copies happen
        // only while it is prepared (`allocate` holds `&mut self`).
        let commands = unsafe { device.allocate_command_buffers(&info) }
            .map_err(|r| cx.submit_error("upload", r))?;
        let Some(&cmd) = commands.first() else {
            return Ok(());
        };
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        let barrier = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(vk::AccessFlags::SHADER_READ)];
        // SAFETY: `cmd` is new; both buffers are live and hold at least `bytes`.
        let recorded = unsafe {
            device.begin_command_buffer(cmd, &begin).and_then(|()| {
                device.cmd_copy_buffer(cmd, src, dst, &[vk::BufferCopy::default().size(bytes)]);
                device.cmd_pipeline_barrier(
                    cmd,
                    vk::PipelineStageFlags::TRANSFER,
                    vk::PipelineStageFlags::COMPUTE_SHADER,
                    vk::DependencyFlags::empty(),
                    &barrier,
                    &[],
                    &[],
                );
                device.end_command_buffer(cmd)
            })
        };
        let result = recorded
            .map_err(|r| cx.submit_error("upload", r))
            .and_then(|()| self.submit_and_wait(cmd, "upload"));
        if result.is_err() {
            // The command buffer may still be pending: nothing may be freed before it ends.
            let _ = cx.wait_idle();
        }
        // SAFETY: the device is done with `cmd` (waited for, or idle).
        unsafe { device.free_command_buffers(self.command_pool, &commands) };
        result
    }

    /// Writes one descriptor set per dispatch, keeps what each dispatch binds in
    /// `self.dispatches`, and records the command buffer every run replays.
    fn record(
        &mut self,
        bound: &[Bound],
        pipelines: &BTreeMap<usize, (vk::Pipeline, vk::PipelineLayout)>,
    ) -> Result<(), VulkanError> {
        let cx = Arc::clone(&self.cx);
        let device = &cx.device;
        let fail = |what: &'static str, r: vk::Result| cx.submit_error(what, r);
        let mut sets = Vec::new();
        if !bound.is_empty() {
            let descriptors: u32 = bound.iter().map(|b| b.slots).sum();
            let sizes = [vk::DescriptorPoolSize::default()
                .ty(vk::DescriptorType::STORAGE_BUFFER)
                .descriptor_count(descriptors)];
            let info = vk::DescriptorPoolCreateInfo::default()
                .max_sets(bound.len() as u32)
                .pool_sizes(&sizes);
            // SAFETY: a plain create on the live device; destroyed in `drop`.
            self.descriptor_pool = unsafe { device.create_descriptor_pool(&info, None) }
                .map_err(|r| fail("creating the descriptor pool", r))?;
            let layouts = bound
                .iter()
                .map(|b| cx.layout(b.slots, b.words.len() as u32).map(|l| l.set))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|r| fail("creating a descriptor set layout", r))?;
            let info = vk::DescriptorSetAllocateInfo::default()
                .descriptor_pool(self.descriptor_pool)
                .set_layouts(&layouts);
            // SAFETY: the pool was sized for exactly these sets.
            sets = unsafe { device.allocate_descriptor_sets(&info) }
                .map_err(|r| fail("allocating descriptor sets", r))?;
            let infos: Vec<Vec<vk::DescriptorBufferInfo>> = bound
                .iter()
                .map(|b| {
                    b.descriptors
                        .iter()
                        .map(|&(buffer, offset, range)| vk::DescriptorBufferInfo {
                            buffer: self.buffers[buffer].buffer(),
                            offset,
                            range,
                        })
                        .collect()
                })
                .collect();
            let writes: Vec<vk::WriteDescriptorSet> = sets
                .iter()
                .zip(&infos)
                .map(|(&set, infos)| {
                    // Bindings 0..n in one write: they have the same type and stages.
                    vk::WriteDescriptorSet::default()
                        .dst_set(set)
                        .dst_binding(0)
                        .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                        .buffer_info(infos)
                })
                .collect();
            // SAFETY: the sets are new and unused; every range was checked against its buffer
            // and the device's limits in `bind`.
            unsafe { device.update_descriptor_sets(&writes, &[]) };
        }
        let mut hazards = Hazards::default();
        for (b, &set) in bound.iter().zip(&sets) {
            let Some(&(pipeline, layout)) = pipelines.get(&b.kernel) else {
                continue;
            };
            self.dispatches.push(Recorded {
                step: b.step,
                pipeline,
                layout,
                set,
                words: b.words.clone(),
                groups: b.groups,
                barrier: hazards.dispatch(&b.reads, &b.writes),
            });
        }
        self.commands = self.encode(None)?;
        Ok(())
    }

    /// A command buffer of `self.dispatches`, with a barrier only before a dispatch that
    /// depends on an earlier one. With `timestamps` (a pool of one query per step and one
    /// more), every step waits for the one before, and a timestamp is written before the first
    /// step and after each.
    fn encode(&self, timestamps: Option<vk::QueryPool>) -> Result<vk::CommandBuffer, VulkanError> {
        let cx = &self.cx;
        let device = &cx.device;
        let fail = |what: &'static str, r: vk::Result| cx.submit_error(what, r);
        let info = vk::CommandBufferAllocateInfo::default()
            .command_pool(self.command_pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the pool is this executable's, used from one thread at a time (`&self` of an
        // executable that `run` borrows mutably).
        let commands = unsafe { device.allocate_command_buffers(&info) }
            .map_err(|r| fail("allocating the command buffer", r))?;
        let cmd = commands.first().copied().unwrap_or_default();
        let barrier = |src: vk::AccessFlags, dst: vk::AccessFlags, stage| {
            let barrier = [vk::MemoryBarrier::default().src_access_mask(src).dst_access_mask(dst)];
            // SAFETY: `cmd` is recording (between begin and end below).
            unsafe {
                device.cmd_pipeline_barrier(
                    cmd,
                    vk::PipelineStageFlags::COMPUTE_SHADER,
                    stage,
                    vk::DependencyFlags::empty(),
                    &barrier,
                    &[],
                    &[],
                )
            }
        };
        let compute_to_compute = || {
            barrier(
                vk::AccessFlags::SHADER_WRITE,
                vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE,
                vk::PipelineStageFlags::COMPUTE_SHADER,
            )
        };
        let steps = self.steps.clone();
        let timestamp = |query: usize| {
            if let Some(pool) = timestamps {
                // SAFETY: `cmd` is recording; the pool has a query per step and one more, and
                // was reset at the start of this buffer.
                unsafe {
                    device.cmd_write_timestamp(
                        cmd,
                        vk::PipelineStageFlags::COMPUTE_SHADER,
                        pool,
                        query as u32,
                    )
                }
            }
        };
        // SAFETY: `cmd` is new; every pipeline, layout and set is live and matches the
        // dispatch's binding count; push-constant sizes equal the layouts' ranges.
        unsafe {
            device
                .begin_command_buffer(cmd, &vk::CommandBufferBeginInfo::default())
                .map_err(|r| fail("recording the command buffer", r))?;
            if let Some(pool) = timestamps {
                device.cmd_reset_query_pool(cmd, pool, 0, steps.len() as u32 + 1);
            }
        }
        timestamp(0);
        let mut current = vk::Pipeline::null();
        let mut dispatches = self.dispatches.iter().peekable();
        for step in steps.clone() {
            while let Some(d) = dispatches.next_if(|d| d.step == step) {
                if d.barrier {
                    compute_to_compute();
                }
                // SAFETY: as above.
                unsafe {
                    if d.pipeline != current {
                        device.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, d.pipeline);
                        current = d.pipeline;
                    }
                    device.cmd_bind_descriptor_sets(
                        cmd,
                        vk::PipelineBindPoint::COMPUTE,
                        d.layout,
                        0,
                        &[d.set],
                        &[],
                    );
                    device.cmd_push_constants(
                        cmd,
                        d.layout,
                        vk::ShaderStageFlags::COMPUTE,
                        0,
                        bytemuck::cast_slice(&d.words),
                    );
                    device.cmd_dispatch(cmd, d.groups[0], d.groups[1], d.groups[2]);
                }
            }
            if timestamps.is_some() {
                timestamp(step - steps.start + 1);
                compute_to_compute();
            }
        }
        if !self.dispatches.is_empty() {
            // The host reads the outputs once the run's fence signals.
            barrier(
                vk::AccessFlags::SHADER_WRITE,
                vk::AccessFlags::HOST_READ,
                vk::PipelineStageFlags::HOST,
            );
        }
        // SAFETY: `cmd` is recording.
        unsafe { device.end_command_buffer(cmd) }
            .map_err(|r| fail("recording the command buffer", r))?;
        Ok(cmd)
    }

    /// The command buffer and timestamp pool of profiled runs, made on first use; `None` where
    /// the queue cannot write timestamps.
    fn profiled(&mut self) -> Result<Option<(vk::CommandBuffer, vk::QueryPool)>, VulkanError> {
        if self.cx.timestamp_bits == 0 {
            return Ok(None);
        }
        if self.profiled.is_none() {
            let info = vk::QueryPoolCreateInfo::default()
                .query_type(vk::QueryType::TIMESTAMP)
                .query_count(self.steps.len() as u32 + 1);
            // SAFETY: a plain create on the live device; destroyed in `drop`.
            let pool = unsafe { self.cx.device.create_query_pool(&info, None) }
                .map_err(|r| self.cx.submit_error("creating the timestamp pool", r))?;
            // Kept before encoding, so that `drop` destroys it even if encoding fails.
            self.profiled = Some((vk::CommandBuffer::null(), pool));
            let cmd = self.encode(Some(pool))?;
            self.profiled = Some((cmd, pool));
        }
        Ok(self.profiled)
    }

    /// Runs as [`VulkanExecutable::run`] does, with every step timed by the device.
    pub fn run_profiled(
        &mut self,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
    ) -> Result<Vec<StepTime>, VulkanError> {
        let dispatches = |step: usize| self.dispatches.iter().filter(|d| d.step == step).count();
        let counts: Vec<u32> = self.steps.clone().map(|s| dispatches(s) as u32).collect();
        let Some((cmd, pool)) = self.profiled()? else {
            self.run_commands(self.commands, inputs, outputs)?;
            let untimed =
                |(k, &n)| StepTime { step: self.steps.start + k, nanos: None, dispatches: Some(n) };
            return Ok(counts.iter().enumerate().map(untimed).collect());
        };
        self.run_commands(cmd, inputs, outputs)?;
        let mut ticks = vec![0u64; counts.len() + 1];
        // SAFETY: the pool has `ticks.len()` queries, all written by the run that just ended.
        unsafe {
            self.cx.device.get_query_pool_results(
                pool,
                0,
                &mut ticks,
                vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT,
            )
        }
        .map_err(|r| self.cx.submit_error("reading timestamps", r))?;
        let bits = self.cx.timestamp_bits;
        let mask = if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 };
        let period = f64::from(self.cx.limits.timestamp_period);
        Ok(counts
            .iter()
            .enumerate()
            .map(|(k, &n)| {
                let elapsed = ticks[k + 1].wrapping_sub(ticks[k]) & mask;
                StepTime {
                    step: self.steps.start + k,
                    nanos: Some((elapsed as f64 * period).round() as u64),
                    dispatches: Some(n),
                }
            })
            .collect())
    }
}

/// A dispatch as recorded: what it binds, and whether a barrier comes before it.
struct Recorded {
    /// Its step's index in the variant.
    step: usize,
    pipeline: vk::Pipeline,
    layout: vk::PipelineLayout,
    set: vk::DescriptorSet,
    words: Vec<u32>,
    groups: [u32; 3],
    barrier: bool,
}

impl Drop for VulkanExecutable {
    fn drop(&mut self) {
        let cx = Arc::clone(&self.cx);
        // Whatever happened (even a lost device), nothing may be in use past this point.
        let _ = cx.wait_idle();
        let device = &cx.device;
        // SAFETY: the device is idle; every handle was created here from this device (null
        // handles are ignored); destroying the pools frees their sets and command buffers.
        unsafe {
            for &p in &self.pipelines {
                device.destroy_pipeline(p, None);
            }
            device.destroy_descriptor_pool(self.descriptor_pool, None);
            if let Some((_, pool)) = self.profiled {
                device.destroy_query_pool(pool, None);
            }
            device.destroy_command_pool(self.command_pool, None);
            device.destroy_fence(self.fence, None);
        }
        while let Some(held) = self.buffers.pop() {
            match held {
                Held::Own(buffer) => buffer.free(&cx, &self.ledger),
                // Freed here if this was its last user (the device is idle).
                Held::Shared(resident) => drop(resident),
            }
        }
    }
}

/// A compute pipeline of a kernel's SPIR-V `code` (little-endian words), made through `cache`.
fn create_pipeline(
    device: &ash::Device,
    code: &[u8],
    layout: vk::PipelineLayout,
    cache: vk::PipelineCache,
) -> Result<vk::Pipeline, String> {
    let code: Vec<u32> =
        code.chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect();
    let module_info = vk::ShaderModuleCreateInfo::default().code(&code);
    // SAFETY: the code is a whole number of words starting with the SPIR-V magic (validated
    // at open). Vulkan requires valid SPIR-V, which the runtime cannot check without a SPIR-V
    // validator: kernels are trusted like code (the compiler validated them with naga, and
    // the bundle's checksums cover them).
    let module = unsafe { device.create_shader_module(&module_info, None) }
        .map_err(|r| format!("vkCreateShaderModule: {r}"))?;
    let stage = vk::PipelineShaderStageCreateInfo::default()
        .stage(vk::ShaderStageFlags::COMPUTE)
        .module(module)
        .name(c"main");
    let info = [vk::ComputePipelineCreateInfo::default().stage(stage).layout(layout)];
    // SAFETY: the module and layout are live; the module may be destroyed once the pipeline
    // exists. The cache is internally synchronized (made without EXTERNALLY_SYNCHRONIZED), so
    // threads may create through it at once. One create info gives at most one pipeline: on
    // failure it is null, and nothing is left to destroy.
    let created = unsafe {
        let created = device.create_compute_pipelines(cache, &info, None);
        device.destroy_shader_module(module, None);
        created
    };
    match created {
        Ok(pipelines) => Ok(pipelines.first().copied().unwrap_or_default()),
        Err((_, r)) => Err(format!("vkCreateComputePipelines: {r}")),
    }
}

impl crate::backend::Executable for VulkanExecutable {
    fn run(
        &mut self,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
    ) -> Result<(), crate::backend::SessionError> {
        Ok(VulkanExecutable::run(self, inputs, outputs)?)
    }

    fn run_profiled(
        &mut self,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
    ) -> Result<Vec<StepTime>, crate::backend::SessionError> {
        Ok(VulkanExecutable::run_profiled(self, inputs, outputs)?)
    }

    fn allocated_bytes(&self, kind: MemoryKind, bytes: u64) -> u64 {
        let placement = match kind {
            MemoryKind::Io => Placement::Host,
            MemoryKind::Staging => Placement::Staging,
            _ => Placement::Device,
        };
        Buffer::allocated_bytes(&self.cx, (kind, bytes), placement, self.granularity)
            .unwrap_or_else(|e| {
                log::warn!("cannot ask {} for a buffer's size: {e}", self.cx.info);
                bytes
            })
    }

    fn stages_uploads(&self) -> bool {
        self.staged
    }
}
