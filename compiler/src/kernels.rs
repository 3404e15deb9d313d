//! The kernel stages of the compile pipeline (graph -> partition -> plan -> **lowered steps ->
//! kernels** -> bundle): [`capability`] answers, before planning, which nodes have Vulkan
//! kernels at all; [`lower`] turns every step of a Vulkan submodel into its dispatches for
//! both device classes, from the graph and the plan (where each operand lives); [`KernelSet`]
//! compiles each unique module once, before the bundle writer serialises the modules and the
//! steps' dispatch entries.

use crate::bundle::CompiledVariant;
use crate::ir::{Graph, Node, ValueId};
use crate::partition::Kind;
use crate::plan::{Plan, Storage};
use ingot_ops::TensorDesc;
use ingot_ops::vulkan::{Compiled, DeviceClass, Dispatch, KernelCx, NoKernel, Operand, Slot};
use ingot_schema::proto;
use std::collections::BTreeMap;

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("kernel '{label}' of step '{step}' ({op}) does not compile: {message}\n{wgsl}")]
    Compile { step: String, op: String, label: String, message: String, wgsl: String },
}

/// Per node: why it has no Vulkan kernel whatever the plan (`None`: its family has one for its
/// types, attributes and shapes). Asked with every operand in memory of its own at an aligned
/// offset; what a plan adds (an output written over an input, a view at an odd offset) is
/// settled by [`lower`].
pub fn capability(g: &Graph) -> Vec<Option<String>> {
    g.nodes
        .iter()
        .map(|node| {
            if ingot_ops::is_view(&node.op) {
                return None;
            }
            let mut at = 0;
            let mut place = |v: ValueId| {
                let desc = desc(g, v);
                let operand = Operand::new(g.values[v].name.clone(), desc, (4, v as u64), at);
                at += (operand.desc.bytes() as u64).next_multiple_of(16);
                operand
            };
            let inputs: Vec<Operand> = node.present_inputs().map(&mut place).collect();
            let outputs: Vec<Operand> = node.outputs.iter().map(|&v| place(v)).collect();
            both_classes(node, &inputs, &outputs).err().map(|why| why.0)
        })
        .collect()
}

/// One step's dispatches (or what stands for them) on GPUs and on CPU-type devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Classes<T = Dispatch> {
    pub gpu: Vec<T>,
    pub cpu: Vec<T>,
}

/// Every step of a plan lowered to Vulkan dispatches.
#[derive(Clone, Debug)]
pub struct Lowered {
    /// Per node: its dispatches when it is a step of a Vulkan submodel (else `None`).
    pub steps: Vec<Option<Classes>>,
    /// Steps of Vulkan submodels that turned out to have no kernel in this plan, and why.
    pub missing: Vec<(usize, NoKernel)>,
}

/// Lowers every step of `plan`'s Vulkan submodels, its operands where the plan put them.
pub fn lower(g: &Graph, plan: &Plan) -> Lowered {
    let mut lowered = Lowered { steps: vec![None; g.nodes.len()], missing: Vec::new() };
    for (s, sub) in plan.submodels.iter().enumerate() {
        if sub.kind != Kind::Vulkan {
            continue;
        }
        for n in plan.submodel_steps(s) {
            let node = &g.nodes[n];
            let operand = |v: ValueId| planned_operand(g, plan, v);
            let inputs: Vec<Operand> = node.present_inputs().map(operand).collect();
            let outputs: Vec<Operand> = node.outputs.iter().map(|&v| operand(v)).collect();
            match both_classes(node, &inputs, &outputs) {
                Ok(classes) => lowered.steps[n] = Some(classes),
                Err(why) => lowered.missing.push((n, why)),
            }
        }
    }
    lowered
}

/// A step runs on Vulkan only if both device classes have its kernels.
fn both_classes(node: &Node, inputs: &[Operand], outputs: &[Operand]) -> Result<Classes, NoKernel> {
    let cx = |class| KernelCx {
        class,
        op: &node.op,
        name: &node.name,
        attrs: &node.attrs,
        inputs,
        outputs,
    };
    Ok(Classes {
        gpu: ingot_ops::vulkan::lower(&cx(DeviceClass::Gpu))?,
        cpu: ingot_ops::vulkan::lower(&cx(DeviceClass::Cpu))?,
    })
}

fn desc(g: &Graph, v: ValueId) -> TensorDesc {
    g.values[v].ty.clone().unwrap_or_else(|| TensorDesc::new(ingot_schema::DType::U8, vec![0]))
}

/// Value `v` as a kernel sees it: the memory its root lives in (two operands alias when that
/// and the byte offset are equal) and where it starts there.
fn planned_operand(g: &Graph, plan: &Plan, v: ValueId) -> Operand {
    let (root, view_offset) = match plan.storage[v] {
        Some(Storage::View { of, byte_offset }) => (of, byte_offset),
        _ => (v, 0),
    };
    let (place, base) = match plan.storage[root] {
        Some(Storage::Arena { offset }) => ((0, 0), offset),
        Some(Storage::Weight(w)) => ((1, w as u64), 0),
        Some(Storage::Input(i)) => ((2, i as u64), 0),
        Some(Storage::Output(o)) => ((3, o as u64), 0),
        // Inside a device, submodel inputs and outputs sit at 16-byte multiples of its IO
        // buffer, as the boundary buffer's offsets are.
        Some(Storage::Boundary { offset }) => ((5, 0), offset),
        Some(Storage::View { .. }) | None => ((4, root as u64), 0),
    };
    Operand::new(g.values[v].name.clone(), desc(g, v), place, base + view_offset)
}

/// What makes two dispatches' modules one: the WGSL source and the override values (as bits).
type ModuleKey = (String, Vec<(&'static str, u64)>);

/// The kernel stage: every unique SPIR-V module of a bundle, compiled once, in first-use order
/// (variants in order, each variant's steps in execution order), and which module each
/// lowered dispatch runs.
#[derive(Default)]
pub struct KernelSet {
    by_source: BTreeMap<ModuleKey, u32>,
    pub kernels: Vec<proto::Kernel>,
    /// The KERNELS section: the modules' SPIR-V words, little-endian, each 16-byte aligned.
    pub section: Vec<u8>,
    /// Per variant, per node: the module of each dispatch, GPU class and CPU class.
    modules: Vec<Vec<Option<Classes<u32>>>>,
}

/// SPIR-V modules start at multiples of this in the KERNELS section.
const KERNEL_ALIGN: usize = 16;

impl KernelSet {
    /// Compiles the modules of every lowered dispatch of `variants`, each unique one once, and
    /// checks that each dispatch fits its module (bound slots, push-constant words).
    pub fn compile(variants: &[CompiledVariant]) -> Result<KernelSet, KernelError> {
        let mut set = KernelSet::default();
        for v in variants {
            let mut modules = vec![None; v.graph.nodes.len()];
            for n in v.plan.steps() {
                let Some(Classes { gpu, cpu }) = &v.lowered.steps[n] else {
                    continue;
                };
                let node = &v.graph.nodes[n];
                let mut intern = |ds: &[Dispatch]| -> Result<Vec<u32>, KernelError> {
                    ds.iter().map(|d| set.intern(d, node)).collect()
                };
                modules[n] = Some(Classes { gpu: intern(gpu)?, cpu: intern(cpu)? });
            }
            set.modules.push(modules);
        }
        Ok(set)
    }

    /// The `vulkan` entries of `step`, node `n` of variant `variant` (its index in the list
    /// [`KernelSet::compile`] was given): one entry for all devices where both classes run the
    /// same modules, else one per class; empty for a step without kernels.
    pub fn entries(
        &self,
        variant: usize,
        n: usize,
        lowered: &Lowered,
        step: &proto::Step,
    ) -> Vec<proto::Dispatches> {
        let (Some(Classes { gpu, cpu }), Some(Some(modules))) =
            (&lowered.steps[n], self.modules[variant].get(n))
        else {
            return Vec::new();
        };
        // A module is its source and override values: equal module lists are equal kernels.
        let classes = match modules.gpu == modules.cpu {
            true => vec![(DeviceClass::Any, gpu, &modules.gpu)],
            false => {
                vec![(DeviceClass::Gpu, gpu, &modules.gpu), (DeviceClass::Cpu, cpu, &modules.cpu)]
            }
        };
        classes
            .into_iter()
            .map(|(class, dispatches, kernels)| proto::Dispatches {
                dispatches: dispatches
                    .iter()
                    .zip(kernels)
                    .map(|(d, &kernel)| dispatch(d, kernel, step))
                    .collect(),
                device_class: class as i32,
            })
            .collect()
    }

    /// The index of `d`'s module, compiling it the first time its source and override
    /// values are seen; checks that `d` fits it (bound slots, push-constant words).
    fn intern(&mut self, d: &Dispatch, node: &Node) -> Result<u32, KernelError> {
        let failed = |message: String| KernelError::Compile {
            step: node.name.clone(),
            op: node.op.clone(),
            label: d.label.clone(),
            message,
            wgsl: d.wgsl.clone(),
        };
        let overrides = d.overrides.iter().map(|&(n, v)| (n, v.to_bits())).collect();
        let key = (d.wgsl.clone(), overrides);
        let k = match self.by_source.get(&key) {
            Some(&k) => k,
            None => {
                let Compiled { spirv, workgroup_size, slots, push_words } =
                    ingot_ops::vulkan::compile(&d.wgsl, &d.overrides).map_err(failed)?;
                let offset = self.section.len().next_multiple_of(KERNEL_ALIGN);
                self.section.resize(offset, 0);
                self.section.extend(spirv.iter().flat_map(|w| w.to_le_bytes()));
                let k = self.kernels.len() as u32;
                self.kernels.push(proto::Kernel {
                    name: d.label.clone(),
                    offset: offset as u64,
                    length: (spirv.len() * 4) as u64,
                    bindings: slots,
                    workgroup_size: workgroup_size.to_vec(),
                    params: push_words - slots,
                });
                self.by_source.insert(key, k);
                k
            }
        };
        let kernel = &self.kernels[k as usize];
        if d.bindings.len() > kernel.bindings as usize || d.params.len() != kernel.params as usize {
            return Err(failed(format!(
                "the dispatch binds {} slots and pushes {} params; the module has {} slots and \
                 {} params",
                d.bindings.len(),
                d.params.len(),
                kernel.bindings,
                kernel.params
            )));
        }
        Ok(k)
    }
}

/// One dispatch as the manifest has it: its module, workgroup counts, the step's tensors it
/// binds and its params.
fn dispatch(d: &Dispatch, kernel: u32, step: &proto::Step) -> proto::Dispatch {
    proto::Dispatch {
        kernel,
        groups: d.groups.to_vec(),
        bindings: d
            .bindings
            .iter()
            .map(|b| proto::Binding {
                tensor: match b.slot {
                    Slot::Input(i) => step.inputs[i],
                    Slot::Output(o) => step.outputs[o],
                },
                write: matches!(b.slot, Slot::Output(_)),
                element_bytes: b.element_bytes(),
                byte_offset: b.chunk.as_ref().map_or(0, |r| r.start),
                byte_length: b.chunk.as_ref().map_or(0, |r| r.end - r.start),
            })
            .collect(),
        params: d.params.clone(),
    }
}
