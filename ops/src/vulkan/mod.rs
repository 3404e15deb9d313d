//! Vulkan kernels (feature `wgsl`, which the compiler enables and the runtime never does): how
//! a step becomes compute dispatches, and the WGSL they run, which [`compile`] turns into
//! validated SPIR-V for the bundle.
//!
//! Each family's kernels live in its folder (`conv/vulkan.rs`, ...) and are found through the
//! registry: `fn(&KernelCx) -> Result<Vec<Dispatch>, NoKernel>`, the dispatches that run the
//! step on a GPU, or why it has none (the step then needs another device).
//!
//! # The kernel ABI (what the runtime relies on)
//! - Entry point `main`, a compute shader.
//! - Storage buffers `@group(0) @binding(k)`, k = 0..B (the module's binding slots); a dispatch
//!   binds slots 0..n, one per [`Binding`] in its order (n <= B: a module may declare optional
//!   slots last, which only code it leaves out reads). `var<storage, read>` for inputs,
//!   `var<storage, read_write>` for outputs. Every binding is a runtime-sized `array<T>`; T is
//!   `f32`, `u32`, `i32` (4 bytes) or a 4-vector of them (16 bytes), recorded as the binding's
//!   `element_bytes`.
//! - A push-constant block (WGSL `var<immediate>`) of 4-byte words: word k < B is where slot
//!   k's tensor starts inside the range the runtime bound, in elements of the binding's array
//!   (0 for an unbound slot); the words after them are the dispatch's [`Dispatch::params`]
//!   (shapes, strides, counts: what lets one module serve many steps). The runtime binds the
//!   smallest range that starts at a multiple of the device's `minStorageBufferOffsetAlignment`
//!   and covers the tensor, so kernels index `x[offsets.x + i]` and stay inside
//!   `maxStorageBufferRange` whatever the arena's size. [`header`] writes the bindings and an
//!   offsets-only block from a binding list.
//! - `override` constants take the dispatch's [`Dispatch::overrides`] when the module is
//!   compiled (naga substitutes them: each set of values is a module of its own); the
//!   workgroup size may depend on them, and the bundle records the size the module ends with.
//! - A binding may cover a chunk of its tensor (bytes `start..end`, [`Binding::chunk`]): the
//!   runtime then binds that chunk as if it were the tensor, and word k is where the chunk
//!   starts. Every device can bind 2^27 bytes; a tensor larger than [`MAX_BINDING_BYTES`] is
//!   read through several chunks ([`InputBinding`]), and a step that would bind one whole has
//!   no kernel ([`lower`] refuses it).
//! - Shapes, strides and parameters are literals in a generated module (it serves exactly the
//!   shapes it was made for, and equal shapes share one kernel) or push-constant params.
//! - Workgroup counts stay within 65535 per dimension (the least every device must take);
//!   [`Grid`] spreads a long 1-D range over x and y.
//! - A dispatch sees everything earlier dispatches wrote: the runtime puts a barrier between
//!   dispatches whose byte ranges conflict.
//! - An output may be the same bytes as an input (the plan runs the step in place,
//!   [`KernelCx::in_place`]): a kernel must then read each element of that input only from the
//!   invocation that writes the same element, before writing it.

pub(crate) mod post;
mod prune;
mod template;

pub use template::{Spec, Wgsl};

use crate::TensorDesc;
use ingot_schema::{Attrs, DType};
use std::fmt::Write;
use std::ops::Range;

/// One operand of a step as a kernel sees it.
#[derive(Clone, Debug)]
pub struct Operand {
    /// The tensor's name in the model, for messages (empty in family tests).
    pub name: String,
    pub desc: TensorDesc,
    /// Where its bytes start in the memory it lives in (arena offset, view offset, 0 for
    /// weights and graph inputs/outputs); kernels use it only to pick vector widths.
    pub byte_offset: u64,
    /// Where it lives and which bytes, to tell aliasing operands apart.
    location: (u8, u64, u64),
}

impl Operand {
    /// An operand of a planned step: `place` names the memory it lives in (two operands alias
    /// when place and `byte_offset` are equal), `byte_offset` where it starts there.
    pub fn new(name: String, desc: TensorDesc, place: (u8, u64), byte_offset: u64) -> Operand {
        Operand { name, desc, byte_offset, location: (place.0, place.1, byte_offset) }
    }

    /// A tensor at `byte_offset` in the arena (two such operands at one offset alias).
    pub fn arena(desc: TensorDesc, byte_offset: u64) -> Operand {
        Operand { name: String::new(), desc, byte_offset, location: (0, 0, byte_offset) }
    }

    /// Weight bank entry `index`.
    pub fn weight(desc: TensorDesc, index: u64) -> Operand {
        Operand { name: String::new(), desc, byte_offset: 0, location: (1, index, 0) }
    }

    /// Whether 16-byte vector loads can address it (`array<vec4<f32>>`).
    pub fn aligned16(&self) -> bool {
        self.byte_offset.is_multiple_of(16)
    }
}

/// Everything a family needs to make the kernels of one step.
pub struct KernelCx<'a> {
    /// The devices the kernels are for: families with one kernel for all ignore it.
    pub class: DeviceClass,
    pub op: &'a str,
    pub name: &'a str,
    pub attrs: &'a Attrs,
    pub inputs: &'a [Operand],
    pub outputs: &'a [Operand],
}

impl KernelCx<'_> {
    /// The input whose bytes output 0 is written over (the plan runs the step in place).
    pub fn in_place(&self) -> Option<usize> {
        let out = self.outputs.first()?;
        if out.desc.bytes() == 0 {
            return None;
        }
        self.inputs.iter().position(|i| i.location == out.location)
    }

    /// The error for an input or output dtype the family's kernels do not take.
    pub fn dtype(&self, dtype: DType) -> NoKernel {
        NoKernel(format!("{} on {dtype}", self.op))
    }

    /// Fails unless every input and output is f32.
    pub fn require_f32(&self) -> Result<(), NoKernel> {
        match self.inputs.iter().chain(self.outputs).find(|o| o.desc.dtype != DType::F32) {
            Some(o) => Err(self.dtype(o.desc.dtype)),
            None => Ok(()),
        }
    }
}

pub use ingot_schema::proto::DeviceClass;

/// Why a step has no Vulkan kernel (an op, dtype or attribute combination no kernel covers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoKernel(pub String);

impl std::fmt::Display for NoKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Builds a [`NoKernel`] with a formatted reason.
#[macro_export]
macro_rules! no_kernel {
    ($($arg:tt)*) => { $crate::vulkan::NoKernel(format!($($arg)*)) };
}

/// Which operand of the step a binding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    Input(usize),
    Output(usize),
}

/// One storage buffer of a dispatch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    /// The WGSL name of the array (and of its offset in the push constants).
    pub name: String,
    pub slot: Slot,
    /// WGSL element type: `f32`, `u32`, `i32`, `vec4<f32>`...
    pub ty: &'static str,
    /// The bytes of the tensor it covers, when not all of them (a chunk).
    pub chunk: Option<Range<u64>>,
}

impl Binding {
    pub fn input(name: &str, index: usize, ty: &'static str) -> Binding {
        Binding { name: name.into(), slot: Slot::Input(index), ty, chunk: None }
    }

    pub fn output(name: &str, index: usize, ty: &'static str) -> Binding {
        Binding { name: name.into(), slot: Slot::Output(index), ty, chunk: None }
    }

    /// A binding of bytes `bytes` of the operand: they start and end on whole elements of
    /// `ty` (or the end is the tensor's), and are at most [`MAX_BINDING_BYTES`].
    pub fn chunk(name: &str, slot: Slot, ty: &'static str, bytes: Range<u64>) -> Binding {
        Binding { name: name.into(), slot, ty, chunk: Some(bytes) }
    }

    /// Bytes of one element of its array (4, or 16 for 4-vectors).
    pub fn element_bytes(&self) -> u32 {
        element_bytes(self.ty)
    }
}

/// Bytes of one element of the WGSL array type `ty` (the ABI's 4- and 16-byte types).
fn element_bytes(ty: &str) -> u32 {
    if ty.starts_with("vec4") { 16 } else { 4 }
}

/// The most bytes one binding may cover on any device: the spec guarantees
/// `maxStorageBufferRange` >= 2^27, and the runtime binds from the largest multiple of
/// `minStorageBufferOffsetAlignment` (at most 256) at or below the tensor's 4-aligned start.
pub const MAX_BINDING_BYTES: u64 = (1 << 27) - 256;

/// Splits `bytes` into the fewest chunks of at most [`MAX_BINDING_BYTES`] that start on
/// multiples of `unit` (a whole element, or a row when a kernel needs whole rows), as equal as
/// the units allow; the last one ends at `bytes`.
pub fn chunk_ranges(bytes: u64, unit: u64) -> Result<Vec<Range<u64>>, NoKernel> {
    let per_chunk = MAX_BINDING_BYTES / unit.max(1);
    if per_chunk == 0 {
        return Err(no_kernel!(
            "{unit}-byte units do not fit one binding of {MAX_BINDING_BYTES} bytes"
        ));
    }
    let units = bytes.div_ceil(unit);
    let per_chunk = units.div_ceil(units.div_ceil(per_chunk).max(1)).max(1);
    Ok((0..units.div_ceil(per_chunk))
        .map(|k| k * per_chunk * unit..((k + 1) * per_chunk * unit).min(bytes))
        .collect())
}

/// How a kernel reads one input: through one binding `x` (`x[offsets.x + i]`), or, when the
/// tensor is larger than [`MAX_BINDING_BYTES`], through chunk bindings `x_0`, `x_1`... and the
/// accessor `fn load_x(i: u32) -> T` it writes, which picks the chunk that holds element `i`.
/// Kernels write `at(&format!("{} + i", base()))` and read either way.
#[derive(Clone, Debug)]
pub struct InputBinding {
    name: String,
    pub bindings: Vec<Binding>,
    /// Module-scope WGSL to add to the kernel (the accessor; empty for one binding).
    pub accessor: String,
}

impl InputBinding {
    /// Input `index` (`operand`) as an array of `ty`, cut where needed into chunks that start
    /// on multiples of `unit` bytes (a multiple of `ty`'s size).
    pub fn new(
        name: &str,
        index: usize,
        ty: &'static str,
        operand: &Operand,
        unit: u64,
    ) -> Result<InputBinding, NoKernel> {
        let bytes = operand.desc.bytes() as u64;
        let eb = u64::from(element_bytes(ty));
        if bytes <= MAX_BINDING_BYTES {
            return Ok(InputBinding {
                name: name.into(),
                bindings: vec![Binding::input(name, index, ty)],
                accessor: String::new(),
            });
        }
        if !unit.is_multiple_of(eb) || !operand.byte_offset.is_multiple_of(eb) {
            return Err(no_kernel!("chunks of {unit} bytes of an array of {ty}"));
        }
        let ranges = chunk_ranges(bytes, unit)?;
        let mut accessor = format!("fn load_{name}(i: u32) -> {ty} {{\n");
        let mut bindings = Vec::with_capacity(ranges.len());
        for (k, r) in ranges.iter().enumerate() {
            let (chunk, start) = (format!("{name}_{k}"), r.start / eb);
            let at = match start {
                0 => format!("{chunk}[offsets.{chunk} + i]"),
                s => format!("{chunk}[offsets.{chunk} + (i - {s}u)]"),
            };
            if k + 1 < ranges.len() {
                let end = r.end / eb;
                let _ = writeln!(accessor, "    if (i < {end}u) {{ return {at}; }}");
            } else {
                let _ = writeln!(accessor, "    return {at};");
            }
            bindings.push(Binding::chunk(&chunk, Slot::Input(index), ty, r.clone()));
        }
        accessor.push_str("}\n");
        Ok(InputBinding { name: name.into(), bindings, accessor })
    }

    /// Whether the input is read through chunks.
    pub fn chunked(&self) -> bool {
        !self.accessor.is_empty()
    }

    /// The WGSL index of the tensor's first element: add it to element indices for [`at`].
    ///
    /// [`at`]: InputBinding::at
    pub fn base(&self) -> String {
        match self.chunked() {
            true => "0u".into(),
            false => format!("offsets.{}", self.name),
        }
    }

    /// The WGSL expression of the element at index `i` (an expression that includes
    /// [`base`](InputBinding::base)).
    pub fn at(&self, i: &str) -> String {
        match self.chunked() {
            true => format!("load_{}({i})", self.name),
            false => format!("{}[{i}]", self.name),
        }
    }
}

/// One compute dispatch: a complete WGSL module and how to launch it.
#[derive(Clone, Debug, Default)]
pub struct Dispatch {
    /// What it computes, for humans (`ingot inspect`, profiles).
    pub label: String,
    pub wgsl: String,
    /// Values of the module's `override` constants, by name.
    pub overrides: Vec<(&'static str, f64)>,
    pub groups: [u32; 3],
    pub bindings: Vec<Binding>,
    /// The push-constant words after the binding offsets.
    pub params: Vec<u32>,
}

/// The declarations every kernel starts with: its bindings and their offsets (the ABI above).
pub fn header(bindings: &[Binding]) -> String {
    let mut s = String::new();
    for (k, b) in bindings.iter().enumerate() {
        let access = match b.slot {
            Slot::Input(_) => "read",
            Slot::Output(_) => "read_write",
        };
        let _ = writeln!(
            s,
            "@group(0) @binding({k}) var<storage, {access}> {}: array<{}>;",
            b.name, b.ty
        );
    }
    s.push_str("struct Offsets {\n");
    for b in bindings {
        let _ = writeln!(s, "    {}: u32,", b.name);
    }
    s.push_str("}\nvar<immediate> offsets: Offsets;\n");
    s
}

/// The most workgroups a dispatch may ask for in one dimension on any device.
pub const MAX_GROUPS: u32 = 65535;

/// A 1-D range of invocations laid out over x (and y when x is full).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    pub groups: [u32; 3],
    /// Invocations per workgroup (x).
    pub workgroup: u32,
}

impl Grid {
    /// Enough workgroups of `workgroup` invocations for `invocations`.
    pub fn new(invocations: u64, workgroup: u32) -> Result<Grid, NoKernel> {
        let groups = invocations.div_ceil(u64::from(workgroup)).max(1);
        let x = groups.min(u64::from(MAX_GROUPS));
        let y = groups.div_ceil(x);
        if y > u64::from(MAX_GROUPS) {
            return Err(no_kernel!("{invocations} invocations are too many for one dispatch"));
        }
        Ok(Grid { groups: [x as u32, y as u32, 1], workgroup })
    }

    /// `@compute @workgroup_size(..)` and the entry point's parameters.
    pub fn entry(&self) -> String {
        format!(
            "@compute @workgroup_size({})\nfn main(@builtin(global_invocation_id) gid: vec3<u32>)",
            self.workgroup
        )
    }

    /// The WGSL expression of the invocation's linear index.
    pub fn index(&self) -> String {
        if self.groups[1] == 1 {
            "gid.x".into()
        } else {
            format!("(gid.x + gid.y * {}u)", self.groups[0] * self.workgroup)
        }
    }
}

/// Formats an f32 as a WGSL literal that reads back to the same bits.
pub fn f32_lit(v: f32) -> String {
    if v.is_nan() {
        // WGSL has no NaN literal; bitcast keeps the payload deterministic.
        return format!("bitcast<f32>({}u)", v.to_bits());
    }
    if v.is_infinite() {
        let bits = v.to_bits();
        return format!("bitcast<f32>({bits}u)");
    }
    // `{:?}` prints the shortest representation that round-trips, always with a '.' or 'e'.
    format!("f32({v:?})")
}

/// A family's Vulkan kernels: the dispatches of one step, or why it has none.
pub type Lower = fn(&KernelCx) -> Result<Vec<Dispatch>, NoKernel>;

/// The dispatches of one step, or why it has none; also none when a dispatch would bind a
/// whole operand larger than every device can bind (families that can, read it in chunks).
pub fn lower(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    let op = crate::lookup(cx.op).ok_or_else(|| no_kernel!("{} is not an op", cx.op))?;
    let dispatches = op.vulkan()?(cx)?;
    for b in dispatches.iter().flat_map(|d| &d.bindings) {
        let (operand, what) = match b.slot {
            Slot::Input(i) => (cx.inputs.get(i), format!("input {i}")),
            Slot::Output(o) => (cx.outputs.get(o), format!("output {o}")),
        };
        let Some(o) = operand else { continue };
        let bytes = o.desc.bytes() as u64;
        if b.chunk.is_none() && bytes > MAX_BINDING_BYTES {
            let name = if o.name.is_empty() { &what } else { &o.name };
            return Err(no_kernel!(
                "operand {name} is {bytes} bytes, more than the 128 MiB every Vulkan device \
                 can bind"
            ));
        }
    }
    Ok(dispatches)
}

/// A module compiled for the bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compiled {
    pub spirv: Vec<u32>,
    /// The entry point's workgroup size, overrides applied.
    pub workgroup_size: [u32; 3],
    /// Binding slots the module declares (0..slots in group 0).
    pub slots: u32,
    /// Words of its push-constant block.
    pub push_words: u32,
}

/// WGSL with `overrides` -> validated SPIR-V. Every writer option is spelled out: naga's
/// defaults depend on how naga itself was built, and the bundle bytes must not.
pub fn compile(wgsl: &str, overrides: &[(&str, f64)]) -> Result<Compiled, String> {
    compile_with(wgsl, overrides, true)
}

/// [`compile`], with or without pruning the code the override values make dead.
fn compile_with(wgsl: &str, overrides: &[(&str, f64)], prune: bool) -> Result<Compiled, String> {
    use naga::back::spv;
    use naga::valid::{Capabilities, ValidationFlags, Validator};
    let module = naga::front::wgsl::parse_str(wgsl).map_err(|e| e.emit_to_string(wgsl))?;
    let info = Validator::new(ValidationFlags::all(), Capabilities::IMMEDIATES)
        .validate(&module)
        .map_err(|e| e.emit_to_string(wgsl))?;
    let mut constants = naga::back::PipelineConstants::default();
    for &(name, value) in overrides {
        if !module.overrides.iter().any(|(_, o)| o.name.as_deref() == Some(name)) {
            return Err(format!("the module has no override '{name}'"));
        }
        constants.insert(name.to_string(), value);
    }
    // Slots and push words as the source declares them: overrides make naga drop what the
    // entry point leaves unread (optional slots), which must still count.
    let mut slots = 0;
    let mut push_words = 0;
    for (_, var) in module.global_variables.iter() {
        if let Some(b) = &var.binding {
            if b.group != 0 {
                return Err(format!("binding group {} (kernels use group 0)", b.group));
            }
            slots = slots.max(b.binding + 1);
        }
        if var.space == naga::AddressSpace::Immediate {
            let bytes = module.types[var.ty].inner.size(module.to_ctx());
            if bytes % 4 != 0 {
                return Err(format!("a push-constant block of {bytes} bytes (whole words only)"));
            }
            push_words = bytes / 4;
        }
    }
    if push_words < slots {
        return Err(format!(
            "{slots} binding slots but {push_words} push-constant words (one offset per slot)"
        ));
    }
    let had_overrides = !module.overrides.is_empty();
    let (mut module, mut info) =
        naga::back::pipeline_constants::process_overrides(&module, &info, None, &constants)
            .map_err(|e| e.to_string())?;
    // Drop the branches (and what only they reach) that the override values decide; a module
    // without overrides is written as it is.
    if prune && had_overrides && prune::prune(module.to_mut()) {
        info = std::borrow::Cow::Owned(
            Validator::new(ValidationFlags::all(), Capabilities::IMMEDIATES)
                .validate_resolved_overrides(&module)
                .map_err(|e| format!("after pruning: {}", e.emit_to_string(wgsl)))?,
        );
    }
    let [entry] = &module.entry_points[..] else {
        return Err("a kernel has exactly one entry point".into());
    };
    if entry.name != "main" {
        return Err(format!("the entry point is '{}', not 'main'", entry.name));
    }
    let options = spv::Options {
        lang_version: (1, 3),
        flags: spv::WriterFlags::empty(),
        fake_missing_bindings: true,
        binding_map: Default::default(),
        capabilities: None,
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            // Indexing local and workgroup arrays, vectors and matrices as written: a clamp
            // on a loop's index hides from Mesa that the loop walks an array of exactly its
            // trip count, the sign it unrolls by (register blocks, conv/vulkan.rs).
            index: naga::proc::BoundsCheckPolicy::Unchecked,
            buffer: naga::proc::BoundsCheckPolicy::Restrict,
            image_load: naga::proc::BoundsCheckPolicy::Restrict,
            binding_array: naga::proc::BoundsCheckPolicy::Restrict,
        },
        zero_initialize_workgroup_memory: spv::ZeroInitializeWorkgroupMemoryMode::None,
        force_loop_bounding: false,
        emit_int_div_checks: false,
        use_storage_input_output_16: false,
        debug_info: None,
        ray_query_initialization_tracking: false,
        trace_ray_argument_validation: false,
        task_dispatch_limits: None,
        mesh_shader_primitive_indices_clamp: false,
    };
    let pipeline = spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: entry.name.clone(),
    };
    let spirv =
        spv::write_vec(&module, &info, &options, Some(&pipeline)).map_err(|e| e.to_string())?;
    Ok(Compiled { spirv, workgroup_size: entry.workgroup_size, slots, push_words })
}

/// For family tests: the binding slots a compiled module reads or writes (loads, stores and
/// access chains through them; its declarations alone do not count). A dispatch must bind every
/// one: the validation layer rejects a pipeline that statically uses an unbound descriptor.
#[cfg(test)]
pub(crate) fn slots_used(spirv: &[u32]) -> Vec<u32> {
    const OP_DECORATE: u32 = 71;
    const BINDING: u32 = 33;
    const USES: [u32; 4] = [61, 65, 66, 68]; // OpLoad, OpAccessChain, OpInBoundsAccessChain, OpArrayLength
    let mut instructions = Vec::new();
    let mut at = 5;
    while at < spirv.len() {
        let count = (spirv[at] >> 16).max(1) as usize;
        instructions.push(&spirv[at..(at + count).min(spirv.len())]);
        at += count;
    }
    let mut slots: Vec<u32> = instructions
        .iter()
        .filter(|i| i[0] & 0xffff == OP_DECORATE && i.get(2) == Some(&BINDING))
        .filter(|d| {
            instructions.iter().any(|i| USES.contains(&(i[0] & 0xffff)) && i.get(3) == Some(&d[1]))
        })
        .map(|d| d[3])
        .collect();
    slots.sort_unstable();
    slots
}

/// For family tests, where `INGOT_SPIRV_VAL` is set (tools/test.sh sets it and installs
/// spirv-tools): Khronos' `spirv-val` on a module, for Vulkan 1.1. naga's own validator checks
/// the WGSL, not the SPIR-V it writes, and lavapipe runs some invalid modules without a word.
#[cfg(test)]
fn spirv_val(spirv: &[u32]) -> Result<(), String> {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    if std::env::var_os("INGOT_SPIRV_VAL").is_none() {
        return Ok(());
    }
    let mut child = Command::new("spirv-val")
        .args(["--target-env", "vulkan1.1", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("INGOT_SPIRV_VAL is set but spirv-val does not run (apt install spirv-tools)");
    let bytes: Vec<u8> = spirv.iter().flat_map(|w| w.to_le_bytes()).collect();
    child.stdin.take().unwrap().write_all(&bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// For family tests: compiles each dispatch's module with naga and checks the dispatch
/// against it: it binds at most the slots the module declares and every slot its code
/// touches, passes as many params as the push block holds, and asks for workgroup counts
/// every device takes.
#[cfg(test)]
pub(crate) fn valid(dispatches: &[Dispatch]) {
    for d in dispatches {
        let c = match compile(&d.wgsl, &d.overrides) {
            Ok(c) => c,
            Err(e) => panic!("{}:\n{}\n{e}", d.label, d.wgsl),
        };
        if let Err(e) = spirv_val(&c.spirv) {
            panic!("{}: invalid SPIR-V:\n{e}\n{}", d.label, d.wgsl);
        }
        assert!(d.bindings.len() <= c.slots as usize, "{}: bindings", d.label);
        let unbound = slots_used(&c.spirv).into_iter().find(|&s| s as usize >= d.bindings.len());
        assert_eq!(unbound, None, "{}: reads a slot it does not bind", d.label);
        assert_eq!(d.params.len(), (c.push_words - c.slots) as usize, "{}", d.label);
        assert!(d.groups.iter().all(|&g| (1..=MAX_GROUPS).contains(&g)), "{}", d.label);
    }
}

/// For family tests: `files` are all the `.wgsl` files in `ops/src/<family>/`.
#[cfg(test)]
pub(crate) fn assert_all_files_listed(family: &str, files: &[&Wgsl]) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(family);
    let mut on_disk: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".wgsl"))
        .map(|n| format!("{family}/{n}"))
        .collect();
    on_disk.sort();
    let mut known: Vec<&str> = files.iter().map(|f| f.path).collect();
    known.sort();
    assert_eq!(on_disk, known, "the {family} family's files");
}

/// For family tests: lowers `op` for both device classes with f32 operands laid out one after
/// the other in the arena at 16-byte-aligned offsets plus `skew` bytes, compiles every kernel
/// with naga and checks its workgroup counts, bindings and params; returns the CPU class's then
/// the GPU class's dispatches.
#[cfg(test)]
pub(crate) fn lower_f32_all_classes(
    lower: Lower,
    op: &str,
    attrs: &Attrs,
    inputs: &[&[usize]],
    outputs: &[&[usize]],
    skew: u64,
) -> Vec<Dispatch> {
    let f32s = |shapes: &[&[usize]]| -> Vec<TensorDesc> {
        shapes.iter().map(|s| TensorDesc::new(DType::F32, s.to_vec())).collect()
    };
    lower_all_classes(lower, op, attrs, &f32s(inputs), &f32s(outputs), skew)
}

/// For family tests: [`lower_f32_all_classes`] with operands of any type.
#[cfg(test)]
pub(crate) fn lower_all_classes(
    lower: Lower,
    op: &str,
    attrs: &Attrs,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    skew: u64,
) -> Vec<Dispatch> {
    let mut at = 0;
    let mut place = |desc: &TensorDesc| {
        let o = Operand::arena(desc.clone(), at + skew);
        at += (o.desc.bytes() as u64).next_multiple_of(16) + 16;
        o
    };
    let inputs: Vec<Operand> = inputs.iter().map(&mut place).collect();
    let outputs: Vec<Operand> = outputs.iter().map(&mut place).collect();
    let mut all = Vec::new();
    for class in [DeviceClass::Cpu, DeviceClass::Gpu] {
        let cx = KernelCx { class, op, name: "n", attrs, inputs: &inputs, outputs: &outputs };
        for d in lower(&cx).unwrap() {
            valid(std::slice::from_ref(&d));
            all.push(d);
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relu_kernel_compiles_to_spirv() {
        let desc = TensorDesc::new(DType::F32, vec![2, 3]);
        let op = |byte_offset, location| Operand {
            name: String::new(),
            desc: desc.clone(),
            byte_offset,
            location,
        };
        let inputs = [op(0, (0, 0, 0))];
        let outputs = [op(32, (0, 0, 32))];
        let attrs = Attrs::default();
        let cx = KernelCx {
            class: DeviceClass::Any,
            op: "Relu",
            name: "r",
            attrs: &attrs,
            inputs: &inputs,
            outputs: &outputs,
        };
        let d = lower(&cx).unwrap();
        let spirv = compile(&d[0].wgsl, &[]).unwrap().spirv;
        assert_eq!(spirv[0], 0x0723_0203, "SPIR-V magic");
        assert_eq!(cx.in_place(), None);
    }

    #[test]
    fn chunks_fit_one_binding_and_start_on_whole_units() {
        const MAX: u64 = (1 << 27) - 256;
        // VGG19's fc6 weight, 4096 x 25088 floats = 411041792 bytes: 3.06 times MAX, so 4
        // chunks; rows of 100352 bytes: 4096 rows as 4 x 1024, vec4s: 4 x 102760448 bytes.
        let rows = chunk_ranges(411_041_792, 100_352).unwrap();
        assert_eq!(rows.len(), 4);
        assert_eq!(rows[1], 1024 * 100_352..2048 * 100_352);
        let vec4s = chunk_ranges(411_041_792, 16).unwrap();
        assert_eq!(vec4s[3], 3 * 102_760_448..411_041_792);
        // Contiguous cover, each within MAX and starting on a unit; the last one ends at
        // the tensor's end even mid-unit.
        for (bytes, unit) in [(MAX, 4), (MAX + 4, 4), (3 * MAX + 6, 12), (1000, 16)] {
            let chunks = chunk_ranges(bytes, unit).unwrap();
            assert_eq!(chunks.len() as u64, bytes.div_ceil(MAX));
            assert_eq!((chunks[0].start, chunks.last().unwrap().end), (0, bytes));
            for (c, next) in chunks.iter().zip(chunks.iter().skip(1)) {
                assert_eq!(c.end, next.start);
            }
            assert!(chunks.iter().all(|c| c.start % unit == 0 && c.end - c.start <= MAX));
        }
        assert!(chunk_ranges(1 << 30, 1 << 27).is_err(), "a unit over MAX");
    }

    #[test]
    fn a_chunked_input_reads_through_its_accessor() {
        let op = |n: usize, at| Operand::arena(TensorDesc::new(DType::F32, vec![n]), at);
        // 2^26 floats (256 MiB), 2^24 vec4s: just over 2 x MAX, so three chunks of
        // ceil(2^24 / 3) = 5592406 vec4s (89478496 bytes), the last one 32 bytes shorter.
        let x = op(1 << 26, 0);
        let input = InputBinding::new("x", 0, "vec4<f32>", &x, 16).unwrap();
        assert!(input.chunked());
        let names: Vec<&str> = input.bindings.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["x_0", "x_1", "x_2"]);
        assert_eq!(input.bindings[2].chunk, Some(178_956_992..268_435_456));
        assert_eq!(
            input.accessor,
            "fn load_x(i: u32) -> vec4<f32> {\n    \
             if (i < 5592406u) { return x_0[offsets.x_0 + i]; }\n    \
             if (i < 11184812u) { return x_1[offsets.x_1 + (i - 5592406u)]; }\n    \
             return x_2[offsets.x_2 + (i - 11184812u)];\n}\n"
        );
        assert_eq!(input.at(&format!("{} + 7u", input.base())), "load_x(0u + 7u)");
        let mut bindings = input.bindings.clone();
        bindings.push(Binding::output("y", 0, "vec4<f32>"));
        let wgsl = format!(
            "{}{}@compute @workgroup_size(64)\n\
             fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n    \
             y[offsets.y + gid.x] = {};\n}}\n",
            header(&bindings),
            input.accessor,
            input.at("gid.x * 4096u")
        );
        compile(&wgsl, &[]).unwrap();
        // Small inputs keep one binding and index it directly.
        let small = InputBinding::new("x", 0, "f32", &op(100, 0), 4).unwrap();
        assert_eq!(small.bindings, [Binding::input("x", 0, "f32")]);
        assert_eq!(small.at("offsets.x + 3u"), "x[offsets.x + 3u]");
        assert_eq!(small.base(), "offsets.x");
        // Chunks of vec4s need 16-byte units and a 16-byte aligned tensor.
        assert!(InputBinding::new("x", 0, "vec4<f32>", &x, 4).is_err());
        assert!(InputBinding::new("x", 0, "vec4<f32>", &op(1 << 26, 4), 16).is_err());
    }

    #[test]
    fn an_operand_over_the_guaranteed_range_needs_chunks() {
        let attrs = Attrs::default();
        // 2^25 + 1 floats: 4 bytes more than 128 MiB. Named as in a model, then not (the
        // output, the elementwise kernels' slot 0, is checked first).
        let x = Operand::arena(TensorDesc::new(DType::F32, vec![(1 << 25) + 1]), 0);
        let mut y = Operand::arena(x.desc.clone(), 1 << 28);
        y.name = "big".into();
        let cx = |inputs, outputs| KernelCx {
            class: DeviceClass::Cpu,
            op: "Relu",
            name: "r",
            attrs: &attrs,
            inputs,
            outputs,
        };
        let (x, y) = ([x], [y]);
        let why = lower(&cx(&x, &y)).unwrap_err();
        assert_eq!(
            why.0,
            "operand big is 134217732 bytes, more than the 128 MiB every Vulkan device can bind"
        );
        let why = lower(&cx(&x, &x)).unwrap_err();
        assert!(why.0.starts_with("operand output 0 is"), "{why}");
        // 256 bytes less than 128 MiB still fits one binding.
        let x = [Operand::arena(TensorDesc::new(DType::F32, vec![(1 << 25) - 64]), 0)];
        assert!(lower(&cx(&x, &x)).is_ok());
    }
}
