//! Graph + plan → bundle bytes (manifest, weights), through ingot-schema's container writer.

use crate::ir::Graph;
use crate::kernels::{KernelSet, Lowered};
use crate::plan::{Plan, Storage};
use crate::weights::Bank;
use ingot_schema::container::{self, SectionKind, Source};
use ingot_schema::proto;
use prost::Message;
use std::ops::Range;

/// Graph inputs and outputs start at multiples of this in a device's IO buffer: vector loads
/// need 16 bytes.
pub const IO_ALIGN: u64 = 16;

/// One compiled graph, ready to be written.
pub struct CompiledVariant<'a> {
    pub name: &'a str,
    pub graph: &'a Graph,
    pub plan: &'a Plan,
    pub lowered: &'a Lowered,
}

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("cannot write the bundle: {0}")]
    Io(std::io::Error),
}

/// Serialises the variants into one bundle, with every weight once in the bank and `kernels`
/// (the variants' modules, [`KernelSet::compile`]) dispatched by every step that has them.
/// Deterministic: the bytes depend only on the graphs, plans and lowered steps. A `cpu_only`
/// bundle says so in its manifest and has no kernels section.
pub fn write(
    variants: &[CompiledVariant],
    kernels: &KernelSet,
    cpu_only: bool,
) -> Result<Vec<u8>, WriteError> {
    let mut out = std::io::Cursor::new(Vec::new());
    write_to(variants, kernels, cpu_only, &mut out)?;
    Ok(out.into_inner())
}

/// [`write`] into `out`, streaming the weights from their sources (mapped external data is
/// read twice, to hash and to write, and its pages released after each): compiling holds
/// the manifest and the kernels in memory, never all the weights. Returns the manifest.
pub fn write_to<W: std::io::Write + std::io::Seek>(
    variants: &[CompiledVariant],
    kernels: &KernelSet,
    cpu_only: bool,
    out: &mut W,
) -> Result<proto::Manifest, WriteError> {
    let mut bank = Bank::default();
    let mut manifest = proto::Manifest {
        producer: format!("ingot-compiler {}", env!("CARGO_PKG_VERSION")),
        cpu_only,
        ..Default::default()
    };
    for (k, v) in variants.iter().enumerate() {
        let entries: Vec<u32> = v
            .plan
            .weights
            .iter()
            .map(|&value| match v.graph.values[value].constant.as_ref() {
                Some(c) => bank.add(c),
                // The planner gives weight storage to constants only.
                None => u32::MAX,
            })
            .collect();
        let mut variant = variant(v, &entries);
        for (step, n) in variant.steps.iter_mut().zip(v.plan.steps()) {
            step.vulkan = kernels.entries(k, n, v.lowered, step);
        }
        manifest.variants.push(variant);
    }
    manifest.weights = bank.entries.clone();
    manifest.kernels = kernels.kernels.clone();
    let manifest_bytes = manifest.encode_to_vec();
    let mut weights = |w: &mut dyn std::io::Write| bank.write_section(w);
    let mut sections = vec![Source::Bytes(SectionKind::Manifest, &manifest_bytes)];
    if !cpu_only {
        sections.push(Source::Bytes(SectionKind::Kernels, &kernels.section));
    }
    sections.push(Source::Stream {
        kind: SectionKind::Weights,
        len: bank.section_len(),
        write: &mut weights,
    });
    // Only a bundle that repeats submodels needs a runtime of format 3.
    let repeats = manifest.variants.iter().any(|v| !v.loops.is_empty());
    let version = if repeats {
        (container::FORMAT_MAJOR, container::FORMAT_MINOR)
    } else {
        container::COMPATIBLE
    };
    container::write_to(out, version, &mut sections).map_err(WriteError::Io)?;
    Ok(manifest)
}

/// The manifest entry of one variant whose plan weight `w` is bank entry `bank[w]` (without a
/// bank, `(0..n)` numbers them in the plan's order).
pub fn variant(v: &CompiledVariant, bank: &[u32]) -> proto::Variant {
    let entry = |w: usize| bank.get(w).copied().unwrap_or(w as u32);
    use proto::storage::Kind;
    let g = v.graph;
    let mut index = vec![u32::MAX; g.values.len()];
    let mut tensors = Vec::new();
    for (value, storage) in v.plan.storage.iter().enumerate() {
        if storage.is_some() {
            index[value] = tensors.len() as u32;
            tensors.push(value);
        }
    }
    let tensors: Vec<proto::Tensor> = tensors
        .into_iter()
        .filter_map(|value| v.plan.storage[value].as_ref().map(|s| (value, s)))
        .map(|(value, storage)| {
            let ty = g.values[value]
                .ty
                .clone()
                .unwrap_or_else(|| ingot_ops::TensorDesc::new(ingot_schema::DType::U8, vec![0]));
            let kind = match *storage {
                Storage::Input(i) => Kind::Input(i as u32),
                Storage::Output(k) => Kind::Output(k as u32),
                Storage::Weight(w) => Kind::Weight(entry(w)),
                Storage::Arena { offset } => Kind::Arena(offset),
                Storage::Boundary { offset } => Kind::Boundary(offset),
                Storage::View { of, byte_offset } => {
                    Kind::View(proto::View { of: index[of], byte_offset })
                }
            };
            proto::Tensor {
                name: g.values[value].name.clone(),
                dtype: ty.dtype.to_proto() as i32,
                shape: ty.shape.iter().map(|&d| d as u64).collect(),
                storage: Some(proto::Storage { kind: Some(kind) }),
                bound: g
                    .bounded
                    .get(&value)
                    .map(|b| proto::Bound { axis: b.axis as u32, count: index[b.count] }),
            }
        })
        .collect();
    let steps = v
        .plan
        .steps()
        .map(|n| proto::Step {
            op: g.nodes[n].op.clone(),
            name: g.nodes[n].name.clone(),
            inputs: g.nodes[n].present_inputs().map(|i| index[i]).collect(),
            outputs: g.nodes[n].outputs.iter().map(|&o| index[o]).collect(),
            attributes: g.nodes[n].attrs.to_proto(),
            vulkan: Vec::new(),
            no_vulkan_kernel: v.plan.no_vulkan[n].clone().unwrap_or_default(),
        })
        .collect();
    let (allocations, ranges) = allocations(v, &entry);
    let mut first_step = 0;
    let submodels = v
        .plan
        .submodels
        .iter()
        .enumerate()
        .zip(ranges)
        .map(|((s, sub), allocations)| {
            let step_count = v.plan.submodel_steps(s).count() as u32;
            first_step += step_count;
            proto::Submodel {
                first_step: first_step - step_count,
                step_count,
                inputs: sub.inputs.iter().map(|&t| index[t]).collect(),
                outputs: sub.outputs.iter().map(|&t| index[t]).collect(),
                arena_bytes: sub.arena_bytes,
                lower_bound_bytes: sub.lower_bound_bytes,
                first_allocation: allocations.start as u32,
                allocation_count: allocations.len() as u32,
                strategy: sub.strategy.to_string(),
                guard: (sub.guard.iter())
                    .map(|c| proto::Condition { tensor: index[c.value], holds: c.holds })
                    .collect(),
            }
        })
        .collect();
    // Each run-time loop's submodels are consecutive (see `partition.rs`); one whose body
    // was all dead code has none and is left out.
    let mut loops: Vec<proto::Loop> = Vec::new();
    for (s, sub) in v.plan.submodels.iter().enumerate() {
        let Some(r) = sub.repeat else { continue };
        match loops.last_mut() {
            Some(l) if v.plan.submodels[s - 1].repeat == Some(r) => l.submodel_count += 1,
            _ => {
                let repeat = &g.repeats[r];
                loops.push(proto::Loop {
                    name: repeat.name.clone(),
                    first_submodel: s as u32,
                    submodel_count: 1,
                    iteration: index[repeat.iteration],
                    trip_count: repeat.trip_count.map(|t| index[t]),
                    condition: repeat.condition.map(|c| index[c]),
                    carried: (repeat.carried.iter())
                        .map(|&(state, next)| proto::Carried {
                            state: index[state],
                            next: index[next],
                        })
                        .collect(),
                    guard: (repeat.guard.iter())
                        .map(|c| proto::Condition { tensor: index[c.value], holds: c.holds })
                        .collect(),
                    stacked: (repeat.scans.iter())
                        .map(|&(slice, stacked)| proto::Stacked {
                            slice: index[slice],
                            stacked: index[stacked],
                        })
                        .collect(),
                });
            }
        }
    }
    proto::Variant {
        name: v.name.to_string(),
        tensors,
        inputs: g.inputs.iter().map(|&i| index[i]).collect(),
        outputs: g.outputs.iter().map(|&o| index[o]).collect(),
        steps,
        plan: Some(proto::Plan {
            arena_bytes: v.plan.arena_bytes,
            lower_bound_bytes: v.plan.lower_bound_bytes,
            strategy: v.plan.strategy.to_string(),
            alignment: v.plan.alignment,
            allocations,
            schedule: v.plan.schedule.to_string(),
            naive_bytes: v.plan.naive_bytes,
            boundary_bytes: v.plan.boundary_bytes,
        }),
        submodels,
        loops,
    }
}

/// The load-time allocation schedule if every submodel runs on Vulkan: per submodel, every
/// weight it reads in first-use order, then its arena, then the buffer for its inputs and
/// outputs (devices cannot read the caller's memory); the boundary buffer last. With the
/// running total, and the range of each submodel's entries. Empty tensors allocate nothing.
fn allocations(
    v: &CompiledVariant,
    entry: &dyn Fn(usize) -> u32,
) -> (Vec<proto::Allocation>, Vec<Range<usize>>) {
    use proto::AllocationKind;
    let bytes_of = |value: usize| v.graph.values[value].ty.as_ref().map_or(0, |t| t.bytes() as u64);
    let mut running = 0;
    let mut out = Vec::with_capacity(v.plan.weights.len() + 3 * v.plan.submodels.len() + 1);
    let mut push = |out: &mut Vec<proto::Allocation>, kind: AllocationKind, bytes: u64, weight| {
        if bytes > 0 {
            running += bytes;
            out.push(proto::Allocation {
                kind: kind as i32,
                bytes,
                weight,
                running_bytes: running,
            });
        }
    };
    let mut ranges = Vec::with_capacity(v.plan.submodels.len());
    for sub in &v.plan.submodels {
        let start = out.len();
        // Two plan weights of equal content are one bank entry: allocated once.
        let mut seen = std::collections::BTreeSet::new();
        for &w in sub.weights.iter().filter(|&&w| seen.insert(entry(w))) {
            // Device buffers hold whole 4-byte words: kernels read storage arrays by the word.
            let bytes = bytes_of(v.plan.weights[w]).next_multiple_of(4);
            push(&mut out, AllocationKind::Weight, bytes, entry(w));
        }
        push(&mut out, AllocationKind::Arena, sub.arena_bytes, 0);
        let io = sub.inputs.iter().chain(&sub.outputs);
        let io_bytes = io.map(|&t| bytes_of(t).next_multiple_of(IO_ALIGN)).sum();
        push(&mut out, AllocationKind::Io, io_bytes, 0);
        ranges.push(start..out.len());
    }
    push(&mut out, AllocationKind::Boundary, v.plan.boundary_bytes, 0);
    (out, ranges)
}
