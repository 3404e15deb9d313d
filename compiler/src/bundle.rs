//! Graph + plan → bundle bytes (manifest, weights), through ingot-schema's container writer.

use crate::ir::Graph;
use crate::kernels::{KernelError, KernelSet};
use crate::plan::{Plan, Storage};
use ingot_schema::container::{self, SectionKind};
use ingot_schema::proto;
use prost::Message;

/// Weight offsets in the weights section are multiples of this (the runtime checks it).
const WEIGHT_ALIGN: usize = ingot_runtime::bundle::WEIGHT_ALIGN as usize;

/// Graph inputs and outputs start at multiples of this in a device's IO buffer: vector loads
/// need 16 bytes.
pub const IO_ALIGN: u64 = 16;

/// One compiled graph, ready to be written.
pub struct CompiledVariant<'a> {
    pub name: &'a str,
    pub graph: &'a Graph,
    pub plan: &'a Plan,
}

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("cannot write the bundle: {0}")]
    Io(#[from] std::io::Error),
}

/// Serialises the variants into one bundle, with the Vulkan kernels of every step that has
/// them. Deterministic: the bytes depend only on the graphs and plans.
pub fn write(variants: &[CompiledVariant]) -> Result<Vec<u8>, WriteError> {
    let mut kernels = KernelSet::default();
    let mut weights_section = Vec::new();
    let mut manifest = proto::Manifest {
        producer: format!("ingot-compiler {}", env!("CARGO_PKG_VERSION")),
        ..Default::default()
    };
    for v in variants {
        let first_weight = manifest.weights.len();
        for &value in &v.plan.weights {
            let Some(c) = v.graph.values[value].constant.as_ref() else {
                continue;
            };
            let offset = weights_section.len().next_multiple_of(WEIGHT_ALIGN);
            weights_section.resize(offset, 0);
            weights_section.extend_from_slice(c.bytes());
            manifest.weights.push(proto::Weight {
                dtype: c.desc().dtype.to_proto() as i32,
                shape: c.desc().shape.iter().map(|&d| d as u64).collect(),
                offset: offset as u64,
                length: c.bytes().len() as u64,
            });
        }
        let mut variant = variant(v, first_weight);
        kernels.add_variant(&mut variant)?;
        manifest.variants.push(variant);
    }
    manifest.kernels = kernels.kernels;
    let manifest_bytes = manifest.encode_to_vec();
    let mut out = Vec::new();
    container::write(
        &mut out,
        &[
            (SectionKind::Manifest, &manifest_bytes),
            (SectionKind::Kernels, &kernels.section),
            (SectionKind::Weights, &weights_section),
        ],
    )?;
    Ok(out)
}

/// The manifest entry of one variant whose weights start at bank index `first_weight`.
pub fn variant(v: &CompiledVariant, first_weight: usize) -> proto::Variant {
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
            let ty = g.values[value].ty.clone().unwrap_or_else(|| {
                ingot_runtime::TensorDesc::new(ingot_schema::DType::U8, vec![0])
            });
            let kind = match *storage {
                Storage::Input(i) => Kind::Input(i as u32),
                Storage::Output(k) => Kind::Output(k as u32),
                Storage::Weight(w) => Kind::Weight((first_weight + w) as u32),
                Storage::Arena { offset } => Kind::Arena(offset),
                Storage::View { of, byte_offset } => Kind::View(proto::View {
                    of: index[of],
                    byte_offset,
                }),
            };
            proto::Tensor {
                name: g.values[value].name.clone(),
                dtype: ty.dtype.to_proto() as i32,
                shape: ty.shape.iter().map(|&d| d as u64).collect(),
                storage: Some(proto::Storage { kind: Some(kind) }),
            }
        })
        .collect();
    let steps = v
        .plan
        .steps()
        .map(|n| &g.nodes[n])
        .map(|n| proto::Step {
            op: n.op.clone(),
            name: n.name.clone(),
            inputs: n.present_inputs().map(|i| index[i]).collect(),
            outputs: n.outputs.iter().map(|&o| index[o]).collect(),
            attributes: n.attrs.to_proto(),
            vulkan: Vec::new(),
            no_vulkan_kernel: String::new(),
        })
        .collect();
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
            allocations: allocations(v, first_weight),
            schedule: v.plan.schedule.to_string(),
            naive_bytes: v.plan.naive_bytes,
        }),
    }
}

/// The load-time allocation schedule: every weight the variant reads, in first-use order,
/// then the arena, then the buffer for graph inputs and outputs of devices that cannot read
/// the caller's memory, with the running total. Empty tensors allocate nothing.
fn allocations(v: &CompiledVariant, first_weight: usize) -> Vec<proto::Allocation> {
    use proto::AllocationKind;
    let bytes_of = |value: usize| {
        v.graph.values[value]
            .ty
            .as_ref()
            .map_or(0, |t| t.bytes() as u64)
    };
    let mut running = 0;
    let mut out = Vec::with_capacity(v.plan.weights.len() + 2);
    let mut push = |kind: AllocationKind, bytes: u64, weight: usize| {
        if bytes > 0 {
            running += bytes;
            out.push(proto::Allocation {
                kind: kind as i32,
                bytes,
                weight: weight as u32,
                running_bytes: running,
            });
        }
    };
    for (w, &value) in v.plan.weights.iter().enumerate() {
        // Device buffers hold whole 4-byte words: kernels read storage arrays by the word.
        let bytes = bytes_of(value).next_multiple_of(4);
        push(AllocationKind::Weight, bytes, first_weight + w);
    }
    push(AllocationKind::Arena, v.plan.arena_bytes, 0);
    let io = v.graph.inputs.iter().chain(&v.graph.outputs);
    let io_bytes = io.map(|&t| bytes_of(t).next_multiple_of(IO_ALIGN)).sum();
    push(AllocationKind::Io, io_bytes, 0);
    out
}
