//! The CPU executable: a variant's steps run in order out of the activation arena the plan
//! sized, reading weights straight from the bundle.
//!
//! Every step's operands are resolved once, at creation, to a place (arena, weight, caller
//! input, output) and a byte range; `run` only calls kernels.

use super::{Kernel, KernelError, OpCx};
use crate::bundle::{Bundle, tensor_desc};
use crate::ledger::{Entry, Ledger, MemoryKind};
use crate::session::{Executable, SessionError};
use crate::tensor::{Tensor, TensorDesc, TensorMut, TensorRef};
use ingot_schema::Attrs;
use ingot_schema::proto::storage::Kind;
use std::ops::Range;
use std::sync::Arc;

/// Where an operand's bytes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Arena,
    Weight(usize),
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
    name: String,
    op: String,
    kernel: Box<dyn Kernel>,
    inputs: Vec<Operand>,
    outputs: Vec<Operand>,
    /// The input whose bytes output 0 overwrites, when the plan runs this step in place.
    in_place: Option<usize>,
}

/// A variant prepared for the CPU.
pub struct CpuExecutable {
    bundle: Arc<Bundle>,
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
    /// Prepares every step's kernel and allocates the arena of variant `index`.
    pub fn new(
        bundle: Arc<Bundle>,
        index: usize,
        ledger: &Ledger,
    ) -> Result<CpuExecutable, SessionError> {
        let variant = &bundle.manifest().variants[index];
        let plan = variant
            .plan
            .as_ref()
            .ok_or(crate::BundleError::Invalid("no plan".into()))?;
        let operand = |t: u32| -> Operand {
            let tensor = &variant.tensors[t as usize];
            let desc = tensor_desc(tensor);
            let len = desc.bytes();
            let (root, offset) = match tensor.storage.as_ref().and_then(|s| s.kind.as_ref()) {
                Some(Kind::View(v)) => (&variant.tensors[v.of as usize], v.byte_offset as usize),
                _ => (tensor, 0),
            };
            let (place, base) = match root.storage.as_ref().and_then(|s| s.kind.as_ref()) {
                Some(Kind::Arena(off)) => (Place::Arena, *off as usize),
                Some(Kind::Weight(w)) => (Place::Weight(*w as usize), 0),
                Some(Kind::Input(i)) => (Place::Input(*i as usize), 0),
                Some(Kind::Output(o)) => (Place::Output(*o as usize), 0),
                // Validation guarantees a root has one of the kinds above.
                Some(Kind::View(_)) | None => (Place::Arena, 0),
            };
            Operand {
                place,
                bytes: base + offset..base + offset + len,
                desc,
            }
        };

        let arena_bytes = plan.arena_bytes;
        let words = arena_bytes.div_ceil(8) as usize;
        let mut arena = Vec::new();
        arena
            .try_reserve_exact(words)
            .map_err(|_| SessionError::ArenaAllocation { bytes: arena_bytes })?;
        arena.resize(words, 0);

        let mut steps = Vec::with_capacity(variant.steps.len());
        for (index, s) in variant.steps.iter().enumerate() {
            let prepare_error = |source| SessionError::Prepare {
                index,
                name: s.name.clone(),
                op: s.op.clone(),
                source,
            };
            let attrs = Attrs::from_proto(&s.attributes).map_err(|e| prepare_error(e.into()))?;
            let inputs: Vec<Operand> = s.inputs.iter().map(|&t| operand(t)).collect();
            let outputs: Vec<Operand> = s.outputs.iter().map(|&t| operand(t)).collect();
            let in_descs: Vec<TensorDesc> = inputs.iter().map(|o| o.desc.clone()).collect();
            let out_descs: Vec<TensorDesc> = outputs.iter().map(|o| o.desc.clone()).collect();
            let kernel = super::prepare(&OpCx {
                op: &s.op,
                attrs: &attrs,
                inputs: &in_descs,
                outputs: &out_descs,
            })
            .map_err(prepare_error)?;
            // Empty tensors share every place without aliasing anything.
            let in_place = outputs
                .first()
                .filter(|o| !o.bytes.is_empty())
                .and_then(|out| {
                    inputs
                        .iter()
                        .position(|i| i.place == out.place && i.bytes == out.bytes)
                });
            if in_place.is_some_and(|k| !super::can_run_in_place(&s.op, &attrs, k)) {
                return Err(prepare_error(KernelError::Invalid(
                    "the plan writes its output over an input, which this op cannot do".into(),
                )));
            }
            steps.push(Step {
                name: s.name.clone(),
                op: s.op.clone(),
                kernel,
                inputs,
                outputs,
                in_place,
            });
        }

        let arena_entry = Some(ledger.allocate(MemoryKind::Arena, arena_bytes, "cpu arena"));
        Ok(CpuExecutable {
            ledger: ledger.clone(),
            arena_entry,
            steps,
            arena,
            arena_bytes: arena_bytes as usize,
            bundle,
        })
    }
}

impl Executable for CpuExecutable {
    fn run(&mut self, inputs: &[Tensor], outputs: &mut [Tensor]) -> Result<(), SessionError> {
        let arena = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.arena)[..self.arena_bytes];
        for (index, step) in self.steps.iter().enumerate() {
            let fail = |source| SessionError::Step {
                index,
                name: step.name.clone(),
                op: step.op.clone(),
                source,
            };
            let aliasing = || SessionError::Aliasing {
                index,
                name: step.name.clone(),
                op: step.op.clone(),
            };
            let mut places = Places {
                bundle: &self.bundle,
                inputs,
                arena: Carved::new(arena, &step.outputs, Place::Arena).ok_or_else(aliasing)?,
                outputs: OutputSlots::new(outputs, &step.outputs),
            };
            let ins = step
                .inputs
                .iter()
                .enumerate()
                .map(|(k, o)| match step.in_place {
                    // Its bytes are output 0's: the kernel reads them from there.
                    Some(aliased) if aliased == k => Some(TensorRef {
                        dtype: o.desc.dtype,
                        shape: &o.desc.shape,
                        bytes: &[],
                    }),
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
        }
        Ok(())
    }
}

/// One step's view of memory: shared borrows for what it reads, exclusive borrows for what it
/// writes, carved from the same buffers without copies or unsafe code.
struct Places<'a> {
    bundle: &'a Bundle,
    inputs: &'a [Tensor],
    arena: Carved<'a>,
    outputs: OutputSlots<'a>,
}

impl<'a> Places<'a> {
    fn read(&mut self, o: &'a Operand) -> Option<TensorRef<'a>> {
        let bytes: &'a [u8] = match o.place {
            Place::Arena => self.arena.read(&o.bytes)?,
            Place::Weight(w) => self.bundle.weight_bytes(w).get(o.bytes.clone())?,
            Place::Input(i) => self.inputs.get(i)?.bytes().get(o.bytes.clone())?,
            Place::Output(i) => self.outputs.read(i)?.get(o.bytes.clone())?,
        };
        Some(TensorRef {
            dtype: o.desc.dtype,
            shape: &o.desc.shape,
            bytes,
        })
    }

    fn write(&mut self, o: &'a Operand) -> Option<TensorMut<'a>> {
        let bytes: &'a mut [u8] = match o.place {
            Place::Arena => self.arena.take(&o.bytes)?,
            Place::Output(i) => self.outputs.take(i)?.get_mut(o.bytes.clone())?,
            Place::Weight(_) | Place::Input(_) => return None,
        };
        Some(TensorMut {
            dtype: o.desc.dtype,
            shape: &o.desc.shape,
            bytes,
        })
    }
}

/// The arena cut at the ranges a step writes: those become exclusive slices, the gaps between
/// them shared ones. A read that overlaps a written range is refused (it would alias).
struct Carved<'a> {
    gaps: Vec<(usize, &'a [u8])>,
    written: Vec<(Range<usize>, Option<&'a mut [u8]>)>,
}

impl<'a> Carved<'a> {
    fn new(arena: &'a mut [u8], outputs: &[Operand], place: Place) -> Option<Carved<'a>> {
        let mut ranges: Vec<Range<usize>> = outputs
            .iter()
            .filter(|o| o.place == place && !o.bytes.is_empty())
            .map(|o| o.bytes.clone())
            .collect();
        ranges.sort_by_key(|r| r.start);
        let mut gaps = Vec::new();
        let mut written = Vec::new();
        let mut rest = arena;
        let mut at = 0;
        for r in ranges {
            if r.start < at || r.end > at + rest.len() {
                return None; // overlapping outputs or out of bounds: the verifier forbids both
            }
            let (gap, tail) = rest.split_at_mut(r.start - at);
            let (out, tail) = tail.split_at_mut(r.len());
            gaps.push((at, &*gap));
            written.push((r.clone(), Some(out)));
            at = r.end;
            rest = tail;
        }
        gaps.push((at, &*rest));
        Some(Carved { gaps, written })
    }

    fn read(&self, r: &Range<usize>) -> Option<&'a [u8]> {
        if r.is_empty() {
            // Empty, but aligned like every arena offset, so that typed views accept it.
            return Some(bytemuck::cast_slice::<u64, u8>(&[]));
        }
        self.gaps.iter().find_map(|&(start, gap)| {
            (r.start >= start && r.end <= start + gap.len())
                .then(|| &gap[r.start - start..r.end - start])
        })
    }

    fn take(&mut self, r: &Range<usize>) -> Option<&'a mut [u8]> {
        if r.is_empty() {
            return Some(bytemuck::cast_slice_mut::<u64, u8>(&mut []));
        }
        self.written
            .iter_mut()
            .find(|(w, _)| w == r)
            .and_then(|(_, slot)| slot.take())
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
    fn new(outputs: &'a mut [Tensor], written: &[Operand]) -> Self {
        let slots = outputs
            .iter_mut()
            .enumerate()
            .map(|(i, t)| {
                if written.iter().any(|o| o.place == Place::Output(i)) {
                    Slot::Write(Some(t.bytes_mut()))
                } else {
                    Slot::Read(t.bytes())
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
