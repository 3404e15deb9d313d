//! The bundle's kernels: every Vulkan step's dispatches (from its op family,
//! `ingot_ops::vulkan`) compiled once per unique module into the KERNELS section.

use ingot_ops::no_kernel;
use ingot_ops::vulkan::{
    Compiled, DeviceClass, Dispatch, KernelCx, NoKernel, Operand, Slot, compile, lower,
};
use ingot_schema::{Attrs, proto};
use std::collections::BTreeMap;

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("kernel '{label}' of step '{step}' ({op}) does not compile: {message}\n{wgsl}")]
    Compile {
        step: String,
        op: String,
        label: String,
        message: String,
        wgsl: String,
    },
}

/// What makes two dispatches' modules one: the WGSL source and the override values (as bits).
type ModuleKey = (String, Vec<(&'static str, u64)>);

/// The kernels of a bundle: unique SPIR-V modules, in first-use order.
#[derive(Default)]
pub struct KernelSet {
    /// Module index by WGSL source and override values.
    by_source: BTreeMap<ModuleKey, u32>,
    pub kernels: Vec<proto::Kernel>,
    pub section: Vec<u8>,
}

/// SPIR-V modules start at multiples of this in the KERNELS section.
const KERNEL_ALIGN: usize = 16;

impl KernelSet {
    /// Fills `vulkan` of every step of `variant` that has kernels (one entry for all devices,
    /// or one per device class when the family makes different kernels); steps without stay
    /// empty, and why is returned per step index.
    pub fn add_variant(
        &mut self,
        variant: &mut proto::Variant,
    ) -> Result<Vec<(usize, NoKernel)>, KernelError> {
        let mut missing = Vec::new();
        // Steps of a submodel that needs the CPU (one of its steps has no kernel) get none.
        let mut on_cpu = vec![false; variant.steps.len()];
        for sub in &variant.submodels {
            let steps = sub.first_step as usize..(sub.first_step + sub.step_count) as usize;
            let Some(steps) = variant.steps.get(steps.clone()).map(|_| steps) else {
                continue;
            };
            if variant.steps[steps.clone()]
                .iter()
                .any(|s| !s.no_vulkan_kernel.is_empty())
            {
                on_cpu[steps].fill(true);
            }
        }
        let mut per_step = Vec::with_capacity(variant.steps.len());
        for (index, step) in variant.steps.iter().enumerate() {
            if on_cpu[index] {
                per_step.push(Vec::new());
                continue;
            }
            let (gpu, cpu) = match lower_step(variant, step) {
                Ok(both) => both,
                Err(why) => {
                    missing.push((index, why));
                    per_step.push(Vec::new());
                    continue;
                }
            };
            let same = gpu.len() == cpu.len()
                && gpu
                    .iter()
                    .zip(&cpu)
                    .all(|(a, b)| a.wgsl == b.wgsl && a.overrides == b.overrides);
            let classes = if same {
                vec![(DeviceClass::Any, gpu)]
            } else {
                vec![(DeviceClass::Gpu, gpu), (DeviceClass::Cpu, cpu)]
            };
            let mut entries = Vec::with_capacity(classes.len());
            for (class, dispatches) in classes {
                let mut out = Vec::with_capacity(dispatches.len());
                for d in dispatches {
                    let kernel = self.intern(&d, step)?;
                    out.push(proto::Dispatch {
                        kernel,
                        params: d.params.clone(),
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
                    });
                }
                entries.push(proto::Dispatches {
                    dispatches: out,
                    device_class: class as i32,
                });
            }
            per_step.push(entries);
        }
        for (step, vulkan) in variant.steps.iter_mut().zip(per_step) {
            step.vulkan = vulkan;
        }
        for (index, why) in &missing {
            variant.steps[*index].no_vulkan_kernel = why.0.clone();
        }
        missing.extend(
            variant
                .steps
                .iter()
                .enumerate()
                .filter(|(i, s)| on_cpu[*i] && !s.no_vulkan_kernel.is_empty())
                .map(|(i, s)| (i, NoKernel(s.no_vulkan_kernel.clone()))),
        );
        missing.sort_by_key(|&(i, _)| i);
        Ok(missing)
    }

    /// The index of `d`'s module, compiling it the first time its source and override
    /// values are seen; checks that `d` fits it (bound slots, push-constant words).
    fn intern(&mut self, d: &Dispatch, step: &proto::Step) -> Result<u32, KernelError> {
        let failed = |message: String| KernelError::Compile {
            step: step.name.clone(),
            op: step.op.clone(),
            label: d.label.clone(),
            message,
            wgsl: d.wgsl.clone(),
        };
        let overrides = d.overrides.iter().map(|&(n, v)| (n, v.to_bits())).collect();
        let key = (d.wgsl.clone(), overrides);
        let k = match self.by_source.get(&key) {
            Some(&k) => k,
            None => {
                let Compiled {
                    spirv,
                    workgroup_size,
                    slots,
                    push_words,
                } = compile(&d.wgsl, &d.overrides).map_err(failed)?;
                let offset = self.section.len().next_multiple_of(KERNEL_ALIGN);
                self.section.resize(offset, 0);
                self.section
                    .extend(spirv.iter().flat_map(|w| w.to_le_bytes()));
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

/// The dispatches of one step of `variant` for GPUs and for CPU-type devices, or why it has
/// none (a step runs on Vulkan only if both classes have kernels).
pub fn lower_step(
    variant: &proto::Variant,
    step: &proto::Step,
) -> Result<(Vec<Dispatch>, Vec<Dispatch>), NoKernel> {
    let attrs = Attrs::from_proto(&step.attributes).map_err(|e| no_kernel!("{e}"))?;
    let inputs: Vec<Operand> = step.inputs.iter().map(|&t| operand(variant, t)).collect();
    let outputs: Vec<Operand> = step.outputs.iter().map(|&t| operand(variant, t)).collect();
    let cx = |class| KernelCx {
        class,
        op: &step.op,
        name: &step.name,
        attrs: &attrs,
        inputs: &inputs,
        outputs: &outputs,
    };
    Ok((lower(&cx(DeviceClass::Gpu))?, lower(&cx(DeviceClass::Cpu))?))
}

fn operand(variant: &proto::Variant, t: u32) -> Operand {
    use proto::storage::Kind;
    let tensor = &variant.tensors[t as usize];
    let desc = ingot_ops::TensorDesc::of(tensor);
    let kind = |t: &proto::Tensor| t.storage.as_ref().and_then(|s| s.kind);
    let (root, view_offset) = match kind(tensor) {
        Some(Kind::View(v)) => (v.of, v.byte_offset),
        _ => (t, 0),
    };
    let (place, base) = match kind(&variant.tensors[root as usize]) {
        Some(Kind::Arena(offset)) => ((0, 0), offset),
        Some(Kind::Weight(w)) => ((1, u64::from(w)), 0),
        Some(Kind::Input(i)) => ((2, u64::from(i)), 0),
        Some(Kind::Output(o)) => ((3, u64::from(o)), 0),
        // Inside a device, submodel inputs and outputs sit at 16-byte multiples of its IO
        // buffer, as the boundary buffer's offsets are.
        Some(Kind::Boundary(offset)) => ((5, 0), offset),
        Some(Kind::View(_)) | None => ((4, u64::from(root)), 0),
    };
    Operand::new(tensor.name.clone(), desc, place, base + view_offset)
}
