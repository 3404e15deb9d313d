//! Opening a bundle: map (or copy) the file, check the container, decode the manifest, and
//! validate every index, offset and length in it before anything else uses them.
//!
//! After [`Bundle::open`] succeeds, the rest of the runtime may index the manifest without
//! checks: a truncated, corrupt or hostile bundle is an error here, never a panic later.

use crate::tensor::TensorDesc;
use ingot_schema::container::{Container, ContainerError, SectionKind};
use ingot_schema::proto::{self, storage::Kind};
use ingot_schema::{Attrs, DType};
use prost::Message;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

pub use ingot_schema::container::WEIGHT_ALIGN;

/// The most push-constant words a kernel may have: Vulkan guarantees 128 bytes on every device.
pub const MAX_PUSH_WORDS: u32 = 32;

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("cannot read bundle {path}: {cause}")]
    Io { path: PathBuf, cause: std::io::Error },
    #[error("{0} is a directory, not a bundle file")]
    Directory(PathBuf),
    #[error(transparent)]
    Container(#[from] ContainerError),
    #[error("bundle manifest does not decode: {0}")]
    Manifest(prost::DecodeError),
    #[error("bundle manifest is invalid: {0}")]
    Invalid(String),
    #[error("cannot read bundle: {0}")]
    Read(std::io::Error),
    #[error("the bundle's range {offset}..{end} lies past the end of the {file_len}-byte file")]
    Range { offset: u64, end: u64, file_len: u64 },
    #[error(
        "bundle bytes at {address:#x} are not aligned to {align} bytes (weights are read in \
         place); copy them (Bundle::from_bytes) or align the buffer"
    )]
    Misaligned { address: usize, align: u64 },
    #[error(
        "bundle weight {index} (bytes {start}..{end} of the weights section) is corrupt: checksum mismatch"
    )]
    CorruptWeight { index: usize, start: u64, end: u64 },
    #[error("bundle has no variant '{name}'; it has: {known}")]
    UnknownVariant { name: String, known: String },
}

/// Whether the file at `path` starts with a bundle's magic bytes: how tools that take a model
/// or a bundle tell them apart. A directory is an error, not "no".
pub fn is_bundle_file(path: &Path) -> Result<bool, BundleError> {
    use std::io::Read;
    if path.is_dir() {
        return Err(BundleError::Directory(path.to_path_buf()));
    }
    let mut file = std::fs::File::open(path)
        .map_err(|cause| BundleError::Io { path: path.to_path_buf(), cause })?;
    let mut magic = [0u8; 8];
    Ok(file.read_exact(&mut magic).is_ok() && magic == ingot_schema::container::MAGIC)
}

fn invalid(msg: impl Into<String>) -> BundleError {
    BundleError::Invalid(msg.into())
}

enum Bytes {
    Mapped(memmap2::Mmap),
    Borrowed(&'static [u8]),
    // u64 words keep the copy 8-aligned, like a mapping.
    Owned { words: Vec<u64>, len: usize },
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Borrowed(b) => b,
            Bytes::Owned { words, len } => &bytemuck::cast_slice(words)[..*len],
        }
    }
}

/// An opened, validated bundle.
pub struct Bundle {
    bytes: Bytes,
    container: Container,
    manifest: proto::Manifest,
    weights: Range<usize>,
    kernels: Range<usize>,
    /// Per weight, whether its bytes matched its CRC: checked at first use (format 2.1 on),
    /// so that opening reads no weight page. Older bundles have the whole weights section
    /// checked at open, and start all true.
    checked: Vec<AtomicBool>,
}

impl std::fmt::Debug for Bundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bundle")
            .field("format", &(self.container.major, self.container.minor))
            .field("variants", &self.manifest.variants.len())
            .field("weights", &self.manifest.weights.len())
            .finish()
    }
}

impl Bundle {
    /// Maps the file at `path` and validates it.
    pub fn open(path: impl AsRef<Path>) -> Result<Bundle, BundleError> {
        let path = path.as_ref();
        let io = |cause| BundleError::Io { path: path.to_path_buf(), cause };
        if path.is_dir() {
            // Mapping a directory fails with ENODEV ("No such device"), which misleads.
            return Err(BundleError::Directory(path.to_path_buf()));
        }
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the mapping is read-only and private to this process. A bundle file must not
        // be truncated or rewritten while it is open (the same contract as every mmap-based
        // model loader); everything read from it is validated first.
        #[allow(unsafe_code)]
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::from_storage(Bytes::Mapped(map))
    }

    /// Validates a bundle held in memory (e.g. `include_bytes!`); the bytes are copied once
    /// into aligned storage.
    pub fn from_bytes(bytes: &[u8]) -> Result<Bundle, BundleError> {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        Self::from_storage(Bytes::Owned { words, len: bytes.len() })
    }

    /// Validates a bundle in memory that lives as long as the process (an `include_bytes!`
    /// in an aligned wrapper, a buffer the app keeps) and uses it in place, without a copy.
    /// The bytes must start at a multiple of [`WEIGHT_ALIGN`]: weights are read where they lie.
    pub fn from_static(bytes: &'static [u8]) -> Result<Bundle, BundleError> {
        let address = bytes.as_ptr() as usize;
        if !address.is_multiple_of(WEIGHT_ALIGN as usize) {
            return Err(BundleError::Misaligned { address, align: WEIGHT_ALIGN });
        }
        Self::from_storage(Bytes::Borrowed(bytes))
    }

    /// Opens the bundle in the `len` bytes at `offset` of `file`: a bundle packed inside a
    /// larger file, such as an Android asset (`AAsset_openFileDescriptor` gives the file, the
    /// offset and the length). The range is mapped where `offset` is a multiple of
    /// [`WEIGHT_ALIGN`] (weights are then used in place, as [`Bundle::open`] does); elsewhere
    /// it is read into memory once, since weights must lie aligned. `file` may be closed
    /// afterwards; its position is left alone.
    pub fn open_range(file: &std::fs::File, offset: u64, len: u64) -> Result<Bundle, BundleError> {
        let file_len = file.metadata().map_err(BundleError::Read)?.len();
        if offset.checked_add(len).is_none_or(|end| end > file_len) {
            return Err(BundleError::Range { offset, end: offset.saturating_add(len), file_len });
        }
        let len = usize::try_from(len).map_err(|_| {
            BundleError::Read(std::io::Error::other("the bundle exceeds the address space"))
        })?;
        if len > 0 && offset.is_multiple_of(WEIGHT_ALIGN) {
            // SAFETY: as in `open`: a read-only private mapping of a range checked to lie
            // inside the file, which must not change while the bundle is open.
            #[allow(unsafe_code)]
            let map = unsafe { memmap2::MmapOptions::new().offset(offset).len(len).map(file) }
                .map_err(BundleError::Read)?;
            return Self::from_storage(Bytes::Mapped(map));
        }
        if len > 0 {
            log::info!(
                "the bundle at offset {offset} is not {WEIGHT_ALIGN}-byte aligned: reading its \
                 {len} bytes into memory instead of mapping them"
            );
        }
        let mut words = vec![0u64; len.div_ceil(8)];
        read_at(file, &mut bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..len], offset)
            .map_err(BundleError::Read)?;
        Self::from_storage(Bytes::Owned { words, len })
    }

    fn from_storage(bytes: Bytes) -> Result<Bundle, BundleError> {
        let file = bytes.as_slice();
        let container = Container::parse_checking(file, |kind| kind != SectionKind::Weights)?;
        let manifest_range = container.require(SectionKind::Manifest)?.range.clone();
        let manifest =
            proto::Manifest::decode(&file[manifest_range]).map_err(BundleError::Manifest)?;
        let section = |kind| container.section(kind).map_or(0..0, |s| s.range.clone());
        let (weights, kernels) = (section(SectionKind::Weights), section(SectionKind::Kernels));
        validate(&manifest, weights.len() as u64, &file[kernels.clone()])?;
        let per_weight = (container.major, container.minor) >= (2, 1);
        if !per_weight {
            container.verify(file, SectionKind::Weights)?;
        }
        let checked = manifest.weights.iter().map(|_| AtomicBool::new(!per_weight)).collect();
        Ok(Bundle { bytes, container, manifest, weights, kernels, checked })
    }

    pub fn manifest(&self) -> &proto::Manifest {
        &self.manifest
    }

    /// (major, minor) format version of the file.
    pub fn format_version(&self) -> (u16, u16) {
        (self.container.major, self.container.minor)
    }

    /// The sections: kind name and byte range in the file.
    pub fn sections(&self) -> impl Iterator<Item = (&'static str, Range<usize>)> + '_ {
        self.container.sections.iter().map(|s| (s.kind.name(), s.range.clone()))
    }

    /// The total size of the bundle file in bytes.
    pub fn file_len(&self) -> usize {
        self.bytes.as_slice().len()
    }

    /// The index of the variant called `name`.
    pub fn variant_index(&self, name: &str) -> Result<usize, BundleError> {
        self.manifest.variants.iter().position(|v| v.name == name).ok_or_else(|| {
            BundleError::UnknownVariant {
                name: name.to_string(),
                known: self
                    .manifest
                    .variants
                    .iter()
                    .map(|v| v.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            }
        })
    }

    /// Lets the OS drop the resident pages of weight `index` of a mapped bundle (a device that
    /// uploaded it no longer reads them); the next read faults them in from the file again.
    /// Nothing to do for a bundle in memory.
    pub fn release_weight_pages(&self, index: usize) {
        let Bytes::Mapped(map) = &self.bytes else {
            return;
        };
        let w = &self.manifest.weights[index];
        let start = self.weights.start + w.offset as usize;
        #[allow(unsafe_code)]
        // SAFETY: a read-only mapping (see `open`); MADV_DONTNEED discards only clean pages of
        // this process's view, and later reads see the file's bytes again, so no reference
        // into the map observes a change.
        let _ = unsafe {
            map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, w.length as usize)
        };
    }

    /// The bytes of weight bank entry `index`, checked against its CRC the first time: a
    /// corrupt weight is refused before anything uses it. The executables call this while
    /// they prepare, then read through [`Bundle::weight_bytes`].
    pub fn weight(&self, index: usize) -> Result<&[u8], BundleError> {
        let bytes = self.weight_bytes(index);
        if !self.checked[index].load(Ordering::Acquire) {
            let w = &self.manifest.weights[index];
            if crc32fast::hash(bytes) != w.crc32 {
                let (start, end) = (w.offset, w.offset + w.length);
                return Err(BundleError::CorruptWeight { index, start, end });
            }
            self.checked[index].store(true, Ordering::Release);
        }
        Ok(bytes)
    }

    /// The bytes of weight `index` without the check: for a weight [`Bundle::weight`] passed.
    pub(crate) fn weight_bytes(&self, index: usize) -> &[u8] {
        let w = &self.manifest.weights[index];
        let start = self.weights.start + w.offset as usize;
        &self.bytes.as_slice()[start..start + w.length as usize]
    }

    /// The SPIR-V bytes of kernel `index` (validated at open: a non-empty whole number of
    /// little-endian words starting with the SPIR-V magic).
    pub fn kernel_code(&self, index: usize) -> &[u8] {
        let k = &self.manifest.kernels[index];
        let start = self.kernels.start + k.offset as usize;
        &self.bytes.as_slice()[start..start + k.length as usize]
    }
}

/// Fills `buf` from `file` at `offset` without moving the file's position (which a caller's
/// duplicate of the descriptor shares).
fn read_at(file: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    return std::os::unix::fs::FileExt::read_exact_at(file, buf, offset);
    #[cfg(windows)]
    {
        let mut done = 0;
        while done < buf.len() {
            let at = offset + done as u64;
            match std::os::windows::fs::FileExt::seek_read(file, &mut buf[done..], at)? {
                0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                n => done += n,
            }
        }
        Ok(())
    }
}

/// The first word of every SPIR-V module.
pub const SPIRV_MAGIC: u32 = 0x0723_0203;

/// The dtype and shape of a manifest tensor (validated at open).
pub fn tensor_desc(t: &proto::Tensor) -> TensorDesc {
    TensorDesc::of(t)
}

/// How many of the variant's outputs the caller sees: those before the ones the session
/// holds (the counts of bounded outputs, and what run-time loops carry), which come last.
pub fn caller_outputs(v: &proto::Variant) -> usize {
    v.outputs.iter().take_while(|&&t| !held(v, t)).count()
}

/// Whether tensor `t` is one the session holds: a count or a loop's.
fn held(v: &proto::Variant, t: u32) -> bool {
    counts_an_output(v, &v.outputs, t) || v.loops.iter().any(|l| loop_tensors(l).any(|x| x == t))
}

/// Every tensor a loop names.
pub(crate) fn loop_tensors(l: &proto::Loop) -> impl Iterator<Item = u32> + '_ {
    std::iter::once(l.iteration)
        .chain(l.trip_count)
        .chain(l.condition)
        .chain(l.carried.iter().flat_map(|c| [c.state, c.next]))
        .chain(l.stacked.iter().flat_map(|s| [s.slice, s.stacked]))
}

/// Whether tensor `t` is the count of a bounded tensor among `outputs`.
fn counts_an_output(v: &proto::Variant, outputs: &[u32], t: u32) -> bool {
    outputs.iter().any(|&o| {
        v.tensors.get(o as usize).and_then(|o| o.bound.as_ref()).is_some_and(|b| b.count == t)
    })
}

/// Each loop covers consecutive submodels after the last loop's; every tensor it names is
/// an output the session holds, its numbers one int64 (the condition one bool), and each
/// carried pair two distinct tensors of one type.
fn check_loops(v: &proto::Variant) -> Result<(), String> {
    let callers = caller_outputs(v);
    let mut free = 0;
    for (i, l) in v.loops.iter().enumerate() {
        let at = |msg: String| format!("loop {i} '{}': {msg}", l.name);
        let end = l.first_submodel.checked_add(l.submodel_count);
        if l.first_submodel < free
            || l.submodel_count == 0
            || end.is_none_or(|e| e as usize > v.submodels.len())
        {
            return Err(at(format!(
                "submodels {}+{} overlap another loop or are not among the {}",
                l.first_submodel,
                l.submodel_count,
                v.submodels.len()
            )));
        }
        free = end.unwrap_or(u32::MAX);
        // Its guard is checked as part of each submodel's.
        let within = |s: &proto::Submodel| s.guard.starts_with(&l.guard);
        if !v.submodels[l.first_submodel as usize..free as usize].iter().all(within) {
            return Err(at("its guard is not part of each of its submodels' guards".into()));
        }
        let tensor = |t: u32| -> Result<&proto::Tensor, String> {
            if !v.outputs[callers..].contains(&t) {
                return Err(at(format!("tensor {t} is not an output the session holds")));
            }
            v.tensors.get(t as usize).ok_or_else(|| at(format!("tensor {t} does not exist")))
        };
        let one = |t: u32, dtype: proto::DataType, what: &str| -> Result<(), String> {
            let x = tensor(t)?;
            if x.dtype != dtype as i32 || x.shape.iter().product::<u64>() != 1 {
                return Err(at(format!("its {what} (tensor {t}) is not one {dtype:?}")));
            }
            Ok(())
        };
        one(l.iteration, proto::DataType::I64, "iteration")?;
        if let Some(t) = l.trip_count {
            one(t, proto::DataType::I64, "trip count")?;
        }
        if let Some(t) = l.condition {
            one(t, proto::DataType::Bool, "condition")?;
        }
        for c in &l.carried {
            let (state, next) = (tensor(c.state)?, tensor(c.next)?);
            if c.state == c.next || state.dtype != next.dtype || state.shape != next.shape {
                return Err(at(format!(
                    "carries tensor {} into tensor {}, which are not two tensors of one type",
                    c.next, c.state
                )));
            }
        }
        for s in &l.stacked {
            let (slice, stacked) = (tensor(s.slice)?, tensor(s.stacked)?);
            if slice.dtype != stacked.dtype || stacked.shape.get(1..) != Some(&slice.shape[..]) {
                return Err(at(format!(
                    "stacks tensor {} into tensor {}, which is not of its type with a dim first",
                    s.slice, s.stacked
                )));
            }
        }
    }
    Ok(())
}

/// Every bound names a dim of its tensor; a bounded output's count is a one-element int64
/// output listed after the caller's outputs, and only counts are listed there.
fn check_bounds(v: &proto::Variant) -> Result<(), String> {
    let callers = caller_outputs(v);
    for (i, t) in v.tensors.iter().enumerate() {
        let Some(b) = &t.bound else { continue };
        let at = |msg: &str| format!("tensor {i} '{}': its bound {msg}", t.name);
        if b.axis as usize >= t.shape.len() {
            return Err(at(&format!("names dim {} of a rank-{} tensor", b.axis, t.shape.len())));
        }
        let count = v.tensors.get(b.count as usize).ok_or_else(|| at("names no tensor"))?;
        let one_i64 =
            count.dtype == proto::DataType::I64 as i32 && count.shape.iter().product::<u64>() == 1;
        if !one_i64 {
            return Err(at("is counted by a tensor that is not one int64"));
        }
        let output = v.outputs[..callers].contains(&(i as u32));
        if output && !v.outputs[callers..].contains(&b.count) {
            return Err(at("is counted by a tensor that is not a count output"));
        }
    }
    for (k, &t) in v.outputs.iter().enumerate().skip(callers) {
        let loops = v.loops.iter().any(|l| loop_tensors(l).any(|x| x == t));
        if !counts_an_output(v, &v.outputs[..callers], t) && !loops {
            return Err(format!(
                "output {k} follows the outputs the caller sees but is neither the count of one \
                 nor a loop's"
            ));
        }
    }
    Ok(())
}

/// Bytes of a tensor with this dtype and shape, or `None` for an unknown dtype or a shape whose
/// non-zero dims multiply past `isize::MAX` bytes. Zero dims are skipped in that bound so that
/// no product of dims a kernel may form (a stride, the rows before an axis) overflows, even in
/// an empty tensor.
fn checked_bytes(dtype: i32, shape: &[u64]) -> Option<u64> {
    let dt = DType::from_proto(proto::DataType::try_from(dtype).ok()?)?;
    let bound = shape
        .iter()
        .try_fold(dt.size() as u64, |acc, &d| acc.checked_mul(d.max(1)))
        .filter(|&b| b <= isize::MAX as u64)?;
    Some(if shape.contains(&0) { 0 } else { bound })
}

fn validate(m: &proto::Manifest, weights_len: u64, kernels: &[u8]) -> Result<(), BundleError> {
    for (i, w) in m.weights.iter().enumerate() {
        let bytes = checked_bytes(w.dtype, &w.shape)
            .ok_or_else(|| invalid(format!("weight {i} has an invalid type or shape")))?;
        let end = w.offset.checked_add(w.length);
        if bytes != w.length || w.offset % WEIGHT_ALIGN != 0 || end.is_none_or(|e| e > weights_len)
        {
            return Err(invalid(format!(
                "weight {i} ({} bytes at {}) does not fit the {weights_len}-byte weights section",
                w.length, w.offset
            )));
        }
    }
    let mut names = std::collections::BTreeSet::new();
    for v in &m.variants {
        if !names.insert(v.name.as_str()) {
            return Err(invalid(format!("two variants are named '{}'", v.name)));
        }
        validate_variant(m, v).map_err(|e| invalid(format!("variant '{}': {e}", v.name)))?;
    }
    // The kernels' bytes (the variants only checked their indices and binding counts).
    for (i, k) in m.kernels.iter().enumerate() {
        let code = usize::try_from(k.offset)
            .ok()
            .zip(usize::try_from(k.length).ok())
            .and_then(|(start, len)| kernels.get(start..start.checked_add(len)?));
        let Some(code) = code else {
            return Err(invalid(format!(
                "kernel {i} '{}' ({} bytes at {}) does not fit the {}-byte kernels section",
                k.name,
                k.length,
                k.offset,
                kernels.len()
            )));
        };
        let magic = code.first_chunk::<4>().map(|w| u32::from_le_bytes(*w));
        if code.len() % 4 != 0 || magic != Some(SPIRV_MAGIC) {
            return Err(invalid(format!(
                "kernel {i} '{}' is not SPIR-V (a non-empty whole number of words starting \
                 with the magic number)",
                k.name
            )));
        }
        // The kernel ABI's push-constant block has one word per binding: it cannot be empty.
        if k.bindings == 0 {
            return Err(invalid(format!("kernel {i} '{}' has no bindings", k.name)));
        }
        if k.workgroup_size.len() != 3 || k.workgroup_size.contains(&0) {
            return Err(invalid(format!(
                "kernel {i} '{}': workgroup size {:?} is not three values of at least 1",
                k.name, k.workgroup_size
            )));
        }
        if k.bindings.checked_add(k.params).is_none_or(|w| w > MAX_PUSH_WORDS) {
            return Err(invalid(format!(
                "kernel {i} '{}': {} binding offsets and {} params are more push-constant words \
                 than any device takes",
                k.name, k.bindings, k.params
            )));
        }
    }
    Ok(())
}

fn validate_variant(m: &proto::Manifest, v: &proto::Variant) -> Result<(), String> {
    let n = v.tensors.len();
    let plan = v.plan.as_ref().ok_or("has no plan")?;
    if plan.alignment == 0 || !plan.alignment.is_power_of_two() || plan.alignment < 8 {
        return Err(format!("arena alignment {} is invalid", plan.alignment));
    }
    let mut sizes = Vec::with_capacity(n);
    for (i, t) in v.tensors.iter().enumerate() {
        sizes.push(
            checked_bytes(t.dtype, &t.shape)
                .ok_or_else(|| format!("tensor {i} '{}' has an invalid type or shape", t.name))?,
        );
    }
    let io_list = |list: &[u32], what: &str| -> Result<(), String> {
        for (k, &t) in list.iter().enumerate() {
            let kind = v
                .tensors
                .get(t as usize)
                .and_then(|t| t.storage.as_ref())
                .and_then(|s| s.kind.as_ref());
            let ok = match (what, kind) {
                ("input", Some(Kind::Input(j))) | ("output", Some(Kind::Output(j))) => {
                    *j as usize == k
                }
                _ => false,
            };
            if !ok {
                return Err(format!("{what} {k} does not refer to a tensor stored as {what} {k}"));
            }
        }
        Ok(())
    };
    io_list(&v.inputs, "input")?;
    io_list(&v.outputs, "output")?;
    check_bounds(v)?;
    check_loops(v)?;
    // The end of the last arena (and boundary) tensor, and the bytes of all of them laid end
    // to end (aligned): the planner's arenas are never larger than either.
    let largest_arena = v.submodels.iter().map(|s| s.arena_bytes).max().unwrap_or(0);
    let (mut arena_end, mut arena_sum) = (0, 0u64);
    let (mut boundary_end, mut boundary_sum) = (0, 0u64);
    for (i, t) in v.tensors.iter().enumerate() {
        let at = |msg: String| format!("tensor {i} '{}': {msg}", t.name);
        let aligned = |bytes: u64| bytes.checked_next_multiple_of(plan.alignment);
        match t.storage.as_ref().and_then(|s| s.kind.as_ref()) {
            None => return Err(at("has no storage".into())),
            Some(Kind::Input(k)) if v.inputs.get(*k as usize) != Some(&(i as u32)) => {
                return Err(at(format!("claims input {k}")));
            }
            Some(Kind::Output(k)) if v.outputs.get(*k as usize) != Some(&(i as u32)) => {
                return Err(at(format!("claims output {k}")));
            }
            Some(Kind::Weight(w)) => {
                let w = m
                    .weights
                    .get(*w as usize)
                    .ok_or_else(|| at(format!("refers to weight {w}, which does not exist")))?;
                if w.dtype != t.dtype || w.shape != t.shape {
                    return Err(at("differs in type or shape from its weight".into()));
                }
            }
            Some(Kind::Arena(off)) => {
                // Which submodel's arena is checked where the submodel resolves its operands.
                match off.checked_add(sizes[i]) {
                    Some(end) if off % plan.alignment == 0 && end <= largest_arena => {
                        arena_end = arena_end.max(end);
                        arena_sum = arena_sum.saturating_add(aligned(sizes[i]).unwrap_or(u64::MAX));
                    }
                    _ => {
                        return Err(at(format!(
                            "{} bytes at arena offset {off} exceed every submodel's arena \
                             ({largest_arena} bytes at most) or its alignment",
                            sizes[i]
                        )));
                    }
                }
            }
            Some(Kind::Boundary(off)) => match off.checked_add(sizes[i]) {
                Some(end) if off % plan.alignment == 0 && end <= plan.boundary_bytes => {
                    boundary_end = boundary_end.max(end);
                    boundary_sum =
                        boundary_sum.saturating_add(aligned(sizes[i]).unwrap_or(u64::MAX));
                }
                _ => {
                    return Err(at(format!(
                        "{} bytes at boundary offset {off} exceed the {}-byte boundary buffer \
                         or its alignment",
                        sizes[i], plan.boundary_bytes
                    )));
                }
            },
            Some(Kind::View(view)) => {
                let root = view.of as usize;
                let root_kind = v
                    .tensors
                    .get(root)
                    .and_then(|r| r.storage.as_ref())
                    .and_then(|s| s.kind.as_ref());
                if root == i || root_kind.is_none() || matches!(root_kind, Some(Kind::View(_))) {
                    return Err(at(format!("is a view of tensor {root}, which is not a root")));
                }
                let end = view.byte_offset.checked_add(sizes[i]);
                if end.is_none_or(|e| e > sizes[root]) {
                    return Err(at(format!("view exceeds its root tensor {root}")));
                }
                // Roots are aligned for every type; a view must keep its elements aligned.
                if view.byte_offset % tensor_desc(t).dtype.size() as u64 != 0 {
                    return Err(at(format!(
                        "view at byte offset {} misaligns its elements",
                        view.byte_offset
                    )));
                }
            }
            Some(_) => {}
        }
    }
    // A larger arena or boundary buffer would only make the session allocate (and zero)
    // memory nothing uses.
    let need = |end: u64, sum: u64| {
        end.checked_next_multiple_of(plan.alignment).unwrap_or(u64::MAX).min(sum)
    };
    let arena_need = need(arena_end, arena_sum);
    if let Some(s) = v.submodels.iter().position(|s| s.arena_bytes > arena_need) {
        return Err(format!(
            "submodel {s} claims a {}-byte arena; the arena tensors need at most {arena_need}",
            v.submodels[s].arena_bytes
        ));
    }
    let total = v.submodels.iter().map(|s| s.arena_bytes).sum::<u64>();
    if plan.arena_bytes != total {
        return Err(format!(
            "the plan's arenas total {} bytes, its submodels' {total}",
            plan.arena_bytes
        ));
    }
    let boundary_need = need(boundary_end, boundary_sum);
    if plan.boundary_bytes > boundary_need {
        return Err(format!(
            "the plan claims a {}-byte boundary buffer; its tensors need at most \
             {boundary_need}",
            plan.boundary_bytes
        ));
    }
    validate_submodels(v, plan)?;
    for (k, a) in plan.allocations.iter().enumerate() {
        let kind = proto::AllocationKind::try_from(a.kind).ok();
        let weight_ok =
            kind != Some(proto::AllocationKind::Weight) || (a.weight as usize) < m.weights.len();
        if kind.is_none() || kind == Some(proto::AllocationKind::Unspecified) || !weight_ok {
            return Err(format!("allocation {k} has an invalid kind or weight index"));
        }
    }
    for (s, step) in v.steps.iter().enumerate() {
        let at = |msg: String| format!("step {s} '{}' ({}): {msg}", step.name, step.op);
        for &t in step.inputs.iter().chain(&step.outputs) {
            if t as usize >= n {
                return Err(at(format!("refers to tensor {t}, which does not exist")));
            }
        }
        for &t in &step.outputs {
            let kind = v.tensors[t as usize].storage.as_ref().and_then(|s| s.kind.as_ref());
            if matches!(kind, Some(Kind::Input(_) | Kind::Weight(_))) {
                return Err(at(format!("writes tensor {t}, a graph input or weight")));
            }
        }
        Attrs::from_proto(&step.attributes).map_err(|e| at(e.to_string()))?;
        validate_dispatches(m, v, step, &sizes).map_err(at)?;
    }
    Ok(())
}

/// The submodels tile the steps in order; each lists, as inputs or outputs, every root of
/// the caller's or the boundary buffer that its steps touch, its allocations lie in the
/// plan's list, and each condition it runs under is one bool the host holds when it starts.
fn validate_submodels(v: &proto::Variant, plan: &proto::Plan) -> Result<(), String> {
    let kind = |t: u32| {
        v.tensors.get(t as usize).and_then(|t| t.storage.as_ref()).and_then(|s| s.kind.as_ref())
    };
    let mut next = 0u64;
    // The roots earlier submodels wrote.
    let mut written: Vec<u32> = Vec::new();
    for (k, sub) in v.submodels.iter().enumerate() {
        let at = |msg: String| format!("submodel {k}: {msg}");
        if u64::from(sub.first_step) != next || sub.step_count == 0 {
            return Err(at(format!(
                "steps [{}, +{}) do not start where the last submodel ended ({next}) or are empty",
                sub.first_step, sub.step_count
            )));
        }
        next += u64::from(sub.step_count);
        let allocations = u64::from(sub.first_allocation) + u64::from(sub.allocation_count);
        if allocations > plan.allocations.len() as u64 {
            return Err(at("its allocations are outside the plan's list".into()));
        }
        for (list, what) in [(&sub.inputs, "input"), (&sub.outputs, "output")] {
            for &t in list {
                let ok = match kind(t) {
                    Some(Kind::Input(_)) => what == "input",
                    Some(Kind::Output(_) | Kind::Boundary(_)) => true,
                    _ => false,
                };
                if !ok {
                    return Err(at(format!(
                        "its {what} {t} is not a graph input, graph output or boundary tensor"
                    )));
                }
            }
        }
        for c in &sub.guard {
            let Some(tensor) = v.tensors.get(c.tensor as usize) else {
                return Err(at(format!(
                    "its guard tests tensor {}, which does not exist",
                    c.tensor
                )));
            };
            let desc = tensor_desc(tensor);
            let root = match kind(c.tensor) {
                Some(Kind::View(view)) => view.of,
                _ => c.tensor,
            };
            let readable = match kind(root) {
                Some(Kind::Input(_)) => true,
                Some(Kind::Output(_) | Kind::Boundary(_)) => written.contains(&root),
                _ => false,
            };
            if desc.dtype != DType::Bool || desc.elements() != 1 || !readable {
                return Err(at(format!(
                    "its guard tests tensor {}, which is not one bool in a graph input or in a \
                     graph output or boundary tensor an earlier submodel wrote",
                    c.tensor
                )));
            }
        }
        written.extend(&sub.outputs);
        let steps = v
            .steps
            .get(sub.first_step as usize..next as usize)
            .ok_or_else(|| at(format!("its steps end past the variant's {}", v.steps.len())))?;
        for step in steps {
            let operands = step.inputs.iter().map(|t| (t, false));
            for (&t, write) in operands.chain(step.outputs.iter().map(|t| (t, true))) {
                let root = match kind(t) {
                    Some(Kind::View(view)) => view.of,
                    _ => t,
                };
                let shared = matches!(
                    kind(root),
                    Some(Kind::Input(_) | Kind::Output(_) | Kind::Boundary(_))
                );
                let listed = sub.outputs.contains(&root) || (!write && sub.inputs.contains(&root));
                if shared && !listed {
                    return Err(at(format!(
                        "step '{}' ({}) {} tensor {root}, which the submodel does not list as \
                         an {}",
                        step.name,
                        step.op,
                        if write { "writes" } else { "reads" },
                        if write { "output" } else { "input or output" }
                    )));
                }
            }
        }
    }
    if next != v.steps.len() as u64 {
        return Err(format!("the submodels cover {next} of the {} steps", v.steps.len()));
    }
    Ok(())
}

/// The Vulkan entries of one step (the kernel ABI, ops/src/vulkan/mod.rs): known device
/// classes, at most one entry per class, and dispatches whose kernels, workgroup counts and
/// bindings the Vulkan backend can use as they are. Runs after the tensors are validated.
fn validate_dispatches(
    m: &proto::Manifest,
    v: &proto::Variant,
    step: &proto::Step,
    sizes: &[u64],
) -> Result<(), String> {
    let mut classes = Vec::with_capacity(step.vulkan.len());
    for entry in &step.vulkan {
        let class = proto::DeviceClass::try_from(entry.device_class)
            .map_err(|_| format!("unknown Vulkan device class {}", entry.device_class))?;
        if classes.contains(&class) {
            return Err(format!("two Vulkan entries for device class {}", class.as_str_name()));
        }
        classes.push(class);
        for (d, dispatch) in entry.dispatches.iter().enumerate() {
            let at = |msg: String| format!("dispatch {d} ({}): {msg}", class.as_str_name());
            let kernel = m
                .kernels
                .get(dispatch.kernel as usize)
                .ok_or_else(|| at(format!("kernel {} does not exist", dispatch.kernel)))?;
            if dispatch.groups.len() != 3 || dispatch.groups.contains(&0) {
                return Err(at(format!(
                    "workgroup counts {:?} are not three values of at least 1",
                    dispatch.groups
                )));
            }
            if dispatch.bindings.is_empty() || dispatch.bindings.len() > kernel.bindings as usize {
                return Err(at(format!(
                    "has {} bindings, its kernel {} '{}' takes 1 to {}",
                    dispatch.bindings.len(),
                    dispatch.kernel,
                    kernel.name,
                    kernel.bindings
                )));
            }
            if dispatch.params.len() != kernel.params as usize {
                return Err(at(format!(
                    "has {} params, its kernel {} '{}' takes {}",
                    dispatch.params.len(),
                    dispatch.kernel,
                    kernel.name,
                    kernel.params
                )));
            }
            for (b, binding) in dispatch.bindings.iter().enumerate() {
                let at = |msg: String| at(format!("binding {b}: {msg}"));
                let t = binding.tensor as usize;
                let (root, offset) =
                    root_of(v, t).ok_or_else(|| at(format!("tensor {t} does not exist")))?;
                if sizes[t] == 0 {
                    return Err(at(format!("tensor {t} is empty")));
                }
                if binding.element_bytes != 4 && binding.element_bytes != 16 {
                    return Err(at(format!(
                        "element size {} is not 4 or 16 bytes",
                        binding.element_bytes
                    )));
                }
                // Every buffer starts at a multiple of 16 bytes, so this holds on any device.
                if offset % u64::from(binding.element_bytes) != 0 {
                    return Err(at(format!(
                        "tensor {t} starts at byte {offset} of its buffer, not a multiple of \
                         the {}-byte elements",
                        binding.element_bytes
                    )));
                }
                if binding.write && matches!(root, Kind::Input(_) | Kind::Weight(_)) {
                    return Err(at(format!("writes tensor {t}, a graph input or weight")));
                }
                // A chunk: whole elements inside the tensor (length 0: the whole tensor).
                let (start, len) = (binding.byte_offset, binding.byte_length);
                let inside = start.checked_add(len).is_some_and(|end| end <= sizes[t]);
                if (len == 0 && start != 0)
                    || !inside
                    || start % u64::from(binding.element_bytes) != 0
                {
                    return Err(at(format!(
                        "chunk of {len} bytes at {start} is not whole {}-byte elements of \
                         tensor {t}'s {} bytes",
                        binding.element_bytes, sizes[t]
                    )));
                }
            }
        }
    }
    Ok(())
}

/// The storage of tensor `t`'s root and `t`'s byte offset in the buffer the root lives in
/// (arena offsets included; weights, inputs and outputs start at 0). `None` if `t` does not
/// exist. Assumes validated views.
fn root_of(v: &proto::Variant, t: usize) -> Option<(&Kind, u64)> {
    fn kind(t: &proto::Tensor) -> Option<&Kind> {
        t.storage.as_ref().and_then(|s| s.kind.as_ref())
    }
    let tensor = v.tensors.get(t)?;
    let (root, view_offset) = match kind(tensor)? {
        Kind::View(view) => (kind(v.tensors.get(view.of as usize)?)?, view.byte_offset),
        k => (k, 0),
    };
    let base = match root {
        Kind::Arena(offset) => *offset,
        _ => 0,
    };
    Some((root, base.checked_add(view_offset)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::{Binding, Dispatch, Dispatches, Storage};

    fn tensor(name: &str, kind: Kind) -> proto::Tensor {
        proto::Tensor {
            name: name.into(),
            dtype: proto::DataType::F32 as i32,
            shape: vec![4],
            storage: Some(Storage { kind: Some(kind) }),
            bound: None,
        }
    }

    /// y = Relu(x) with one Vulkan dispatch of a 2-binding kernel (8 bytes of "SPIR-V"), and
    /// the kernels section it needs.
    fn relu() -> (proto::Manifest, Vec<u8>) {
        let binding =
            |tensor, write| Binding { tensor, write, element_bytes: 4, ..Default::default() };
        let step = proto::Step {
            op: "Relu".into(),
            name: "relu".into(),
            inputs: vec![0],
            outputs: vec![1],
            vulkan: vec![Dispatches {
                dispatches: vec![Dispatch {
                    kernel: 0,
                    groups: vec![1, 1, 1],
                    bindings: vec![binding(0, false), binding(1, true)],
                    params: vec![4],
                }],
                device_class: proto::DeviceClass::Any as i32,
            }],
            ..Default::default()
        };
        let variant = proto::Variant {
            name: "main".into(),
            tensors: vec![tensor("x", Kind::Input(0)), tensor("y", Kind::Output(0))],
            inputs: vec![0],
            outputs: vec![1],
            steps: vec![step],
            plan: Some(proto::Plan { alignment: 16, ..Default::default() }),
            submodels: vec![proto::Submodel {
                first_step: 0,
                step_count: 1,
                inputs: vec![0],
                outputs: vec![1],
                ..Default::default()
            }],
            loops: Vec::new(),
        };
        let manifest = proto::Manifest {
            variants: vec![variant],
            kernels: vec![proto::Kernel {
                name: "relu_4".into(),
                offset: 16,
                length: 8,
                bindings: 2,
                workgroup_size: vec![64, 1, 1],
                params: 1,
            }],
            ..Default::default()
        };
        let mut kernels = vec![0u8; 16];
        kernels.extend(SPIRV_MAGIC.to_le_bytes());
        kernels.extend([0; 4]);
        (manifest, kernels)
    }

    /// Validating `relu()` after `change` fails with a message that contains `expected`.
    fn refused(expected: &str, change: impl FnOnce(&mut proto::Manifest, &mut Vec<u8>)) {
        let (mut m, mut kernels) = relu();
        change(&mut m, &mut kernels);
        match validate(&m, 0, &kernels) {
            Err(e) => assert!(e.to_string().contains(expected), "want '{expected}': {e}"),
            Ok(()) => panic!("valid, want '{expected}'"),
        }
    }

    fn entries(m: &mut proto::Manifest) -> &mut Vec<Dispatches> {
        &mut m.variants[0].steps[0].vulkan
    }

    fn dispatch(m: &mut proto::Manifest) -> &mut Dispatch {
        &mut entries(m)[0].dispatches[0]
    }

    #[test]
    fn a_bound_names_a_dim_and_an_int64_count_output() {
        fn bound(m: &mut proto::Manifest, axis: u32, count: u32) {
            m.variants[0].tensors[1].bound = Some(proto::Bound { axis, count });
        }
        refused("its bound names dim 1 of a rank-1 tensor", |m, _| bound(m, 1, 0));
        refused("its bound names no tensor", |m, _| bound(m, 0, 9));
        refused("counted by a tensor that is not one int64", |m, _| bound(m, 0, 0));
        // One int64, but the caller's input, not an output listed after the caller's.
        refused("counted by a tensor that is not a count output", |m, _| {
            let x = &mut m.variants[0].tensors[0];
            (x.dtype, x.shape) = (proto::DataType::I64 as i32, vec![1]);
            bound(m, 0, 0);
        });
    }

    /// `relu()` with a loop over its one submodel, and three outputs after y that the session
    /// holds for it: the iteration (tensor 2, int64) and a carried state and its next (3, 4).
    fn with_loop(m: &mut proto::Manifest) -> &mut proto::Loop {
        let v = &mut m.variants[0];
        for (k, name) in ["i", "s", "n"].into_iter().enumerate() {
            let mut t = tensor(name, Kind::Output(1 + k as u32));
            if k == 0 {
                (t.dtype, t.shape) = (proto::DataType::I64 as i32, vec![1]);
            }
            v.outputs.push(v.tensors.len() as u32);
            v.tensors.push(t);
        }
        v.loops.push(proto::Loop {
            name: "loop".into(),
            first_submodel: 0,
            submodel_count: 1,
            iteration: 2,
            carried: vec![proto::Carried { state: 3, next: 4 }],
            ..Default::default()
        });
        v.loops.last_mut().expect("pushed")
    }

    #[test]
    fn a_loop_covers_submodels_and_names_outputs_the_session_holds() {
        let (mut m, kernels) = relu();
        with_loop(&mut m);
        validate(&m, 0, &kernels).expect("a valid loop");
        refused("submodels 0+2", |m, _| with_loop(m).submodel_count = 2);
        refused("submodels 1+1", |m, _| with_loop(m).first_submodel = 1);
        refused("its iteration (tensor 3) is not one I64", |m, _| with_loop(m).iteration = 3);
        refused("tensor 0 is not an output the session holds", |m, _| {
            with_loop(m).trip_count = Some(0)
        });
        refused("not two tensors of one type", |m, _| {
            with_loop(m).carried.push(proto::Carried { state: 2, next: 4 })
        });
        refused("not of its type with a dim first", |m, _| {
            with_loop(m).stacked = vec![proto::Stacked { slice: 3, stacked: 4 }]
        });
        refused("its guard is not part of each", |m, _| {
            with_loop(m).guard = vec![proto::Condition { tensor: 0, holds: true }]
        });
        // Another output after the held ones that nobody holds.
        refused("neither the count of one nor a loop's", |m, _| {
            with_loop(m);
            let v = &mut m.variants[0];
            v.outputs.push(v.tensors.len() as u32);
            v.tensors.push(tensor("extra", Kind::Output(4)));
        });
    }

    #[test]
    fn submodels_must_tile_the_steps_and_list_what_they_touch() {
        fn sub(m: &mut proto::Manifest) -> &mut proto::Submodel {
            &mut m.variants[0].submodels[0]
        }
        refused("cover 0 of the 1 steps", |m, _| m.variants[0].submodels.clear());
        refused("are empty", |m, _| sub(m).step_count = 0);
        refused("do not start where", |m, _| sub(m).first_step = 1);
        refused("end past", |m, _| sub(m).step_count = 2);
        refused("does not list as an input", |m, _| sub(m).inputs.clear());
        refused("does not list as an output", |m, _| sub(m).outputs.clear());
        refused("not a graph input, graph output or boundary", |m, _| sub(m).outputs.push(0));
        refused("allocations are outside", |m, _| sub(m).allocation_count = 1);
        refused("exceed the 0-byte boundary", |m, _| {
            let t = tensor("b", Kind::Boundary(0));
            m.variants[0].tensors.push(t)
        });
        refused("submodels' 0", |m, _| m.variants[0].plan.as_mut().unwrap().arena_bytes = 16);
        let guard = |tensor| vec![proto::Condition { tensor, holds: true }];
        refused("tensor 7, which does not exist", |m, _| sub(m).guard = guard(7));
        refused("tensor 0, which is not one bool", |m, _| sub(m).guard = guard(0));
        // One bool, but the submodel's own output: nothing has written it when it starts.
        refused("tensor 1, which is not one bool", |m, _| {
            let y = &mut m.variants[0].tensors[1];
            (y.dtype, y.shape) = (proto::DataType::Bool as i32, vec![1]);
            sub(m).guard = guard(1);
        });
    }

    #[test]
    fn kernels_and_dispatches_are_validated() {
        let (m, kernels) = relu();
        assert!(validate(&m, 0, &kernels).is_ok());
        refused("does not fit", |m, _| m.kernels[0].offset = 20);
        refused("does not fit", |m, _| m.kernels[0].offset = u64::MAX);
        refused("not SPIR-V", |m, _| m.kernels[0].length = 6);
        refused("not SPIR-V", |m, _| m.kernels[0].length = 0);
        refused("not SPIR-V", |_, k| k[16] = 0);
        refused("no bindings", |m, _| {
            m.kernels.push(proto::Kernel { offset: 16, length: 4, ..Default::default() })
        });
        refused("kernel 1 does not exist", |m, _| dispatch(m).kernel = 1);
        refused("workgroup counts", |m, _| dispatch(m).groups = vec![1, 1]);
        refused("workgroup counts", |m, _| dispatch(m).groups[2] = 0);
        refused("takes 1 to 2", |m, _| dispatch(m).bindings.clear());
        refused("takes 1 to 2", |m, _| {
            let extra = dispatch(m).bindings[0];
            dispatch(m).bindings.push(extra)
        });
        refused("has 0 params, its kernel 0 'relu_4' takes 1", |m, _| dispatch(m).params.clear());
        refused("workgroup size [64, 1]", |m, _| {
            m.kernels[0].workgroup_size.pop();
        });
        refused("workgroup size [64, 0, 1]", |m, _| m.kernels[0].workgroup_size[1] = 0);
        refused("more push-constant words", |m, _| {
            m.kernels[0].params = 31;
            dispatch(m).params = vec![0; 31];
        });
        refused("tensor 7 does not exist", |m, _| dispatch(m).bindings[0].tensor = 7);
        refused("not 4 or 16", |m, _| dispatch(m).bindings[0].element_bytes = 8);
        refused("a graph input", |m, _| dispatch(m).bindings[0].write = true);
        refused("unknown Vulkan device class", |m, _| entries(m)[0].device_class = 9);
        refused("two Vulkan entries", |m, _| {
            let twin = entries(m)[0].clone();
            entries(m).push(twin)
        });
        refused("is empty", |m, _| m.variants[0].tensors[0].shape = vec![0]);
        // A vec4 binding of a view 4 bytes into its root.
        refused("not a multiple", |m, _| {
            let view = Kind::View(proto::View { of: 0, byte_offset: 4 });
            m.variants[0].tensors.push(proto::Tensor { shape: vec![2], ..tensor("v", view) });
            dispatch(m).bindings[0] =
                Binding { tensor: 2, write: false, element_bytes: 16, ..Default::default() };
        });
        // Chunks of the 16-byte x: inside it and on whole elements.
        let chunk = |m: &mut proto::Manifest, start, len| {
            let b = &mut dispatch(m).bindings[0];
            (b.byte_offset, b.byte_length) = (start, len);
        };
        let (mut m, kernels) = relu();
        chunk(&mut m, 8, 8);
        assert!(validate(&m, 0, &kernels).is_ok());
        refused("chunk of 8 bytes at 12", |m, _| chunk(m, 12, 8));
        refused("chunk of 4 bytes at 2", |m, _| chunk(m, 2, 4));
        refused("chunk of 0 bytes at 4", |m, _| chunk(m, 4, 0));
        refused("chunk of 1 bytes", |m, _| chunk(m, u64::MAX, 1));
    }
}
