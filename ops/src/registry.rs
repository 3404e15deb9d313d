//! The one registry: every op Ingot accepts, found by its ONNX name, with everything each stage
//! needs from it (lowering and inference for the compiler, the CPU kernel for constant folding
//! and the CPU backend, the memory-sharing rules for the planner).

use crate::cpu::{Kernel, KernelError, OpCx};
use crate::lower::{LowerCx, OpResult};
use crate::{Node, TensorDesc};
use ingot_schema::Attrs;

/// Builds the CPU kernel of one step.
pub type Prepare = fn(&OpCx) -> Result<Box<dyn Kernel>, KernelError>;

/// An op Ingot accepts.
#[derive(Clone, Copy)]
pub struct OpDef {
    pub name: &'static str,
    /// Makes the node canonical for `cx.opset`: explicit attributes, constant operands moved
    /// into attributes, no omitted inputs left.
    #[cfg(feature = "lower")]
    pub lower: fn(&mut Node, &LowerCx) -> OpResult<()>,
    /// Output types of a canonical node from its input types.
    #[cfg(feature = "lower")]
    pub infer: fn(&Node, &[&TensorDesc]) -> OpResult<Vec<TensorDesc>>,
    /// Whether the op is always answered at compile time from static types (Shape, Size):
    /// it never runs, so it has no kernel.
    pub folded: bool,
    /// Whether the output is the first input's bytes, unchanged: no kernel writes it (the
    /// planner gives it a view of the input's storage).
    pub view: bool,
    /// Why the op has no Vulkan kernel at all (its steps run on the CPU); `None` when its
    /// family's Vulkan kernels take it (for some dtypes and attributes at least).
    pub cpu_only: Option<&'static str>,
    /// For an op whose outputs may have a dim that is only an upper bound (how many entries
    /// the op fills along it depends on the data): that dim, from a canonical node's
    /// attributes (`None` for a node whose outputs are exact, a TopK of constant K). Such a
    /// node writes the count as an extra int64 scalar output, which the compiler appends to
    /// the model's node once it is lowered (see `crate::bounded`).
    pub bounded: Option<fn(&Attrs) -> Option<usize>>,
}

impl std::fmt::Debug for OpDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpDef").field("name", &self.name).finish_non_exhaustive()
    }
}

impl OpDef {
    /// Without the `lower` feature (the runtime's build) the compile-time half is left out:
    /// the registry's tables then hold no pointer to it, so an app does not link it.
    pub const fn new(
        name: &'static str,
        lower: fn(&mut Node, &LowerCx) -> OpResult<()>,
        infer: fn(&Node, &[&TensorDesc]) -> OpResult<Vec<TensorDesc>>,
    ) -> OpDef {
        #[cfg(not(feature = "lower"))]
        let _ = (lower, infer);
        OpDef {
            name,
            #[cfg(feature = "lower")]
            lower,
            #[cfg(feature = "lower")]
            infer,
            folded: false,
            view: false,
            cpu_only: None,
            bounded: None,
        }
    }

    /// Marks an op that is always folded at compile time.
    pub const fn folded(self) -> OpDef {
        OpDef { folded: true, ..self }
    }

    /// Marks an op that never runs on Vulkan, and why.
    pub const fn cpu_only(self, why: &'static str) -> OpDef {
        OpDef { cpu_only: Some(why), ..self }
    }

    /// Marks an op whose outputs have a data-dependent length along the dim `dim` gives (where
    /// it gives one), counted in an extra output.
    pub const fn bounded(self, dim: fn(&Attrs) -> Option<usize>) -> OpDef {
        OpDef { bounded: Some(dim), ..self }
    }

    /// Marks an op whose output is a view of its first input.
    pub const fn view(self) -> OpDef {
        OpDef { view: true, ..self }
    }
}

/// One op family: its ops, and what the family provides for all of them.
pub(crate) struct Family {
    pub ops: &'static [OpDef],
    /// The family's CPU kernels (one entry point that dispatches on the op).
    pub cpu: Prepare,
    /// Whether the planner may make the output of `op` (with canonical `attrs`) share the bytes
    /// of input `k` once that input dies at the step (and has the output's type).
    pub in_place: fn(op: &str, attrs: &Attrs, k: usize) -> bool,
    /// The family's Vulkan kernels (one entry point that dispatches on the op).
    #[cfg(feature = "wgsl")]
    pub vulkan: crate::vulkan::Lower,
}

/// Never in place.
pub(crate) fn never(_: &str, _: &Attrs, _: usize) -> bool {
    false
}

/// The Vulkan entry of a family whose ops are all `cpu_only`: the registry never asks it.
#[cfg(feature = "wgsl")]
pub(crate) fn no_vulkan(
    cx: &crate::vulkan::KernelCx,
) -> Result<Vec<crate::vulkan::Dispatch>, crate::vulkan::NoKernel> {
    Err(crate::vulkan::NoKernel(format!("{} has no Vulkan kernel", cx.op)))
}

const FAMILIES: &[Family] = &[
    crate::attention::FAMILY,
    crate::elementwise::FAMILY,
    crate::conv::FAMILY,
    crate::pool::FAMILY,
    crate::matmul::FAMILY,
    crate::norm::FAMILY,
    crate::movement::FAMILY,
    crate::reduce::FAMILY,
    crate::resize::FAMILY,
    crate::rnn::FAMILY,
    crate::rotary::FAMILY,
    crate::quantize::FAMILY,
    crate::topk::FAMILY,
    crate::select::FAMILY,
    crate::spectral::FAMILY,
    crate::loss::FAMILY,
];

/// An op of the default ONNX domain as the registry knows it.
#[derive(Clone, Copy)]
pub struct Op {
    pub def: &'static OpDef,
    family: &'static Family,
}

impl std::fmt::Debug for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Op").field(&self.def.name).finish()
    }
}

impl Op {
    /// The CPU kernel's builder; `None` for ops that are always folded.
    pub fn cpu(&self) -> Option<Prepare> {
        (!self.def.folded).then_some(self.family.cpu)
    }

    /// The Vulkan kernels' builder, or why the op has none.
    #[cfg(feature = "wgsl")]
    pub fn vulkan(&self) -> Result<crate::vulkan::Lower, crate::vulkan::NoKernel> {
        match (self.def.folded, self.def.cpu_only) {
            (true, _) => Err(crate::vulkan::NoKernel(format!(
                "{} is always folded at compile time",
                self.def.name
            ))),
            (false, Some(why)) => Err(crate::vulkan::NoKernel(why.into())),
            (false, None) => Ok(self.family.vulkan),
        }
    }

    /// Whether the output may be written over input `k` (see [`can_run_in_place`]).
    pub fn in_place(&self, attrs: &Attrs, k: usize) -> bool {
        (self.family.in_place)(self.def.name, attrs, k)
    }
}

/// The op named `op` in the default ONNX domain, if Ingot supports it.
pub fn lookup(op: &str) -> Option<Op> {
    FAMILIES.iter().find_map(|family| {
        let def = family.ops.iter().find(|d| d.name == op)?;
        Some(Op { def, family })
    })
}

/// Every op Ingot accepts, sorted.
pub fn supported_ops() -> Vec<&'static str> {
    let mut ops: Vec<_> = FAMILIES.iter().flat_map(|f| f.ops).map(|d| d.name).collect();
    ops.sort_unstable();
    ops
}

/// Whether `op`'s output is a view of its first input (no kernel runs).
pub fn is_view(op: &str) -> bool {
    lookup(op).is_some_and(|o| o.def.view)
}

/// Whether the planner may make `op` (with canonical `attrs`) write its output over input
/// `k`, once that input is dead after the step and has the output's type: any input of an
/// elementwise op built on the map and binary kernels, whose output element `i` depends only
/// on element `i` of each operand; the residual R of a Conv, ConvTranspose, Gemm or MatMul
/// whose post-ops start with `Add`, which the kernel accumulates onto (see [`crate::cpu::post`]).
pub fn can_run_in_place(op: &str, attrs: &Attrs, k: usize) -> bool {
    lookup(op).is_some_and(|o| o.in_place(attrs, k))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_belongs_to_one_family_and_runs_or_folds() {
        let ops = supported_ops();
        let mut dedup = ops.clone();
        dedup.dedup();
        assert_eq!(ops, dedup, "an op is claimed by two families");
        // Shape and Size depend only on static types: lowering replaces them by constants, so
        // they never run. Every other op has a CPU kernel, at least to fold constants; the
        // family's kernel must know it (not answer "unknown op").
        let folded: Vec<&str> =
            ops.iter().copied().filter(|op| lookup(op).unwrap().cpu().is_none()).collect();
        assert_eq!(folded, ["Shape", "Size"]);
        for op in ops.iter().filter(|op| !folded.contains(op)) {
            let prepare = lookup(op).unwrap().cpu().unwrap();
            // No operands: every kernel refuses the step, but as an op it knows.
            let attrs = Attrs::new();
            let cx = OpCx { op, attrs: &attrs, inputs: &[], outputs: &[] };
            match prepare(&cx) {
                Err(KernelError::UnknownOp(_)) => {
                    panic!("{op}: its family has no CPU kernel for it")
                }
                Err(_) => {}
                Ok(_) => panic!("{op}: a kernel without operands was accepted"),
            }
        }
    }

    #[test]
    fn the_committed_op_set_is_supported() {
        // The ops Ingot commits to: the PP-OCR models' and the common CNN, transformer, classic
        // and sequence-model ops (Constant is read by the importer, not an op).
        let committed = "Abs Add And ArgMax AveragePool BatchNormalization Cast Ceil Clip Concat \
            ConstantOfShape Conv ConvTranspose Div Dropout Einsum Elu Equal Erf Exp Expand Flatten \
            Floor Gather Gelu Gemm GlobalAveragePool GlobalMaxPool Greater GreaterOrEqual \
            HardSigmoid HardSwish Identity InstanceNormalization LayerNormalization LeakyRelu Less \
            LessOrEqual Log LogSoftmax MatMul Max MaxPool Min Mul Neg Not Or Pad Pow PRelu Range \
            Reciprocal ReduceL2 ReduceMax ReduceMean ReduceMin ReduceSum Relu Reshape Resize Shape \
            Sigmoid Sign Sin Cos Slice Softmax Softplus Split Sqrt Squeeze Sub Sum Tanh Tile \
            Transpose Unsqueeze Where LRN LSTM GRU DepthToSpace SpaceToDepth ArgMin ReduceProd \
            CumSum GatherElements GatherND IsNaN IsInf Trilu Mod Selu Mish NonMaxSuppression \
            NonZero Compress TopK";
        let supported = supported_ops();
        let missing: Vec<&str> =
            committed.split_whitespace().filter(|op| !supported.contains(op)).collect();
        assert!(missing.is_empty(), "committed ops without support: {missing:?}");
    }

    #[test]
    fn views_are_the_reshape_family_and_bitcast() {
        let views: Vec<&str> = supported_ops().into_iter().filter(|op| is_view(op)).collect();
        let want = ["BitCast", "Dropout", "Flatten", "Identity", "Reshape", "Squeeze", "Unsqueeze"];
        assert_eq!(views, want);
    }
}
