//! Vulkan kernels of the reduce family (ops: ops/src/reduce/cpu.rs): `Reduce*`,
//! `ArgMax`/`ArgMin`, `Softmax`/`LogSoftmax`/`Hardmax` and `LpNormalization`. The pool family's global pools are
//! reductions too ([`Reduction`]).
//!
//! Each output element (for Softmax, each row) folds a set of input elements: the kept
//! dimensions give the set's first element, the reduced ones the offsets inside it ([`Space`],
//! passed as push-constant params, so one module serves every shape). The set is folded in one
//! or two stages ([`Stage`]: Softmax folds the maximum, then the sum of exponentials) and the
//! result written ([`Out`]). The kernels are WGSL files beside this one:
//! - `fold.wgsl`: one invocation per output, walking its whole set in 8 interleaved
//!   accumulators merged pairwise (vec4 loads when the set is contiguous and aligned): sets
//!   that are small next to the number of outputs, and on CPU-type devices, where workgroup
//!   memory and barriers are slow, every set short enough for one invocation;
//! - `tree.wgsl`: one workgroup per output: each invocation folds every `workgroup`-th element,
//!   then a tree in workgroup memory folds the partial results. On GPUs for large sets,
//!   everywhere for sets longer than one invocation may loop over ([`MAX_TRIPS`]);
//! - `arg.wgsl`: ArgMax/ArgMin and Hardmax, an index search per output in 8 lanes;
//! - `empty.wgsl`: reductions of empty sets (nothing to read);
//! - `any_all.wgsl`: ReduceMax/ReduceMin of bools, 4 outputs to a u32 word.
//!
//! What a fold computes is spliced in as hook functions ([`Fold`]'s `init`, `term` and
//! `combine`, the result's `finish` or `each`): scalar expressions, no shapes. The overrides
//! are code shapes only: the workgroup size, the stage count, whether every element is
//! written, how many kept and reduced dimensions there are (one reduced dimension is a plain
//! stride; more cost a division per element, which only unusual shapes pay).
//!
//! Summing in lanes is not only faster: next to one running sum it shortens the chains of
//! roundings about as a vectorised CPU reduction does, which brings LayerNorm means (and so
//! PP-OCR rec's output) about 10 times closer to ONNX Runtime's.
//!
//! int64 outputs (ArgMax/ArgMin) are written as two u32 words per element, low word first.

use crate::no_kernel;
use crate::vulkan::{
    Binding, DeviceClass, Dispatch, Grid, KernelCx, NoKernel, Spec, Wgsl, f32_lit,
};
use crate::wgsl;
use ingot_schema::DType;

static FOLD: Wgsl = wgsl!("reduce/fold.wgsl");
static TREE: Wgsl = wgsl!("reduce/tree.wgsl");
static ARG: Wgsl = wgsl!("reduce/arg.wgsl");
static EMPTY: Wgsl = wgsl!("reduce/empty.wgsl");
static ANY_ALL: Wgsl = wgsl!("reduce/any_all.wgsl");

/// The family's kernel files.
#[cfg(test)]
pub(crate) static FILES: [&Wgsl; 5] = [&FOLD, &TREE, &ARG, &EMPTY, &ANY_ALL];

pub fn lower(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    if cx.inputs.len() != 1 || cx.outputs.len() != 1 {
        return Err(no_kernel!(
            "{} with {} inputs and {} outputs",
            cx.op,
            cx.inputs.len(),
            cx.outputs.len()
        ));
    }
    // None of these ops runs in place on the CPU, so the plan never asks for it.
    if cx.in_place().is_some() {
        return Err(no_kernel!("{} in place", cx.op));
    }
    let shape = &cx.inputs[0].desc.shape;
    let rank = shape.len();
    let int = |name: &str| cx.attrs.int(name).map_err(|e| no_kernel!("{e}"));
    let axis = || {
        let a = int("axis")?;
        usize::try_from(a)
            .ok()
            .filter(|&a| a < rank)
            .ok_or_else(|| no_kernel!("{}: axis {a} out of range", cx.op))
    };
    let x_dtype = cx.inputs[0].desc.dtype;
    let y_dtype = cx.outputs[0].desc.dtype;
    let r = match cx.op {
        "ArgMax" | "ArgMin" => {
            if !matches!(x_dtype, DType::F32 | DType::I32) || y_dtype != DType::I64 {
                return Err(cx.dtype(if y_dtype != DType::I64 { y_dtype } else { x_dtype }));
            }
            let axis = axis()?;
            if shape[axis] == 0 {
                return Err(no_kernel!("{} over an empty axis", cx.op));
            }
            Reduction {
                space: Space::new(shape, &[axis]),
                ty: if x_dtype == DType::F32 { "f32" } else { "i32" },
                stages: vec![Stage::Arg {
                    min: cx.op == "ArgMin",
                    last: int("select_last_index")? != 0,
                }],
                out: Out::Index,
            }
        }
        "Softmax" | "LogSoftmax" | "Hardmax" => {
            cx.require_f32()?;
            let axis = axis()?;
            let end = if int("coerce_2d")? != 0 { rank } else { axis + 1 };
            let axes: Vec<usize> = (axis..end).collect();
            let max = Fold {
                init: f32_lit(f32::NEG_INFINITY),
                term: "$v".into(),
                combine: "select($a, $b, $b > $a)".into(),
            };
            let sum_exp = Fold::sum("f32", "exp($v - s0)");
            let (stages, out) = match cx.op {
                "Softmax" => (
                    vec![max.into(), sum_exp.into()],
                    Out::Each("exp($v - s0) * (1.0 / s1)".into()),
                ),
                "LogSoftmax" => {
                    (vec![max.into(), sum_exp.into()], Out::Each("$v - (s0 + log(s1))".into()))
                }
                _ => (vec![Stage::Arg { min: false, last: false }], Out::OneHot),
            };
            Reduction { space: Space::new(shape, &axes), ty: "f32", stages, out }
        }
        "LpNormalization" => {
            cx.require_f32()?;
            let (term, norm) = match int("p")? {
                1 => ("abs($v)", "s0"),
                2 => ("$v * $v", "sqrt(s0)"),
                p => return Err(no_kernel!("LpNormalization with p = {p}")),
            };
            let stages = vec![Fold::sum("f32", term).into()];
            // A zero vector stays zero, as on the CPU.
            let out = Out::Each(format!("select($v / {norm}, 0.0, s0 == 0.0)"));
            Reduction { space: Space::new(shape, &[axis()?]), ty: "f32", stages, out }
        }
        _ if x_dtype == DType::Bool => return any_all(cx),
        _ => reduce(cx)?,
    };
    r.lower(cx, &cx.op.to_lowercase())
}

/// The canonical `axes` of a `Reduce*` step.
fn axes(cx: &KernelCx) -> Result<Vec<usize>, NoKernel> {
    let rank = cx.inputs[0].desc.shape.len();
    cx.attrs
        .ints("axes")
        .map_err(|e| no_kernel!("{e}"))?
        .iter()
        .map(|&a| usize::try_from(a).ok().filter(|&a| a < rank))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| no_kernel!("{}: axes out of range", cx.op))
}

/// ReduceMax and ReduceMin of bools (any and all), one byte per element: one invocation per 4
/// outputs, written as one u32 word (the last word keeps the bytes past the tensor's end).
fn any_all(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    let (x, y) = (&cx.inputs[0], &cx.outputs[0]);
    let all = match cx.op {
        "ReduceMax" => false,
        "ReduceMin" => true,
        _ => return Err(cx.dtype(DType::Bool)),
    };
    if y.desc.dtype != DType::Bool {
        return Err(cx.dtype(y.desc.dtype));
    }
    if x.byte_offset % 4 != 0 || y.byte_offset % 4 != 0 {
        return Err(no_kernel!("{} on bytes that do not start a word", cx.op));
    }
    if x.desc.elements() as u64 >= 1 << 31 {
        return Err(no_kernel!("{}: tensors too large for u32 indices", cx.op));
    }
    let space = Space::new(&x.desc.shape, &axes(cx)?);
    let (n_out, count) = (space.outputs(), space.count());
    if n_out == 0 {
        return Ok(Vec::new());
    }
    if 4 * count > MAX_TRIPS {
        return Err(no_kernel!("{}: sets of {count} bytes", cx.op));
    }
    let grid = Grid::new(n_out.div_ceil(4), 64)?;
    // The output is slot 0: an empty set reads nothing, and an empty tensor cannot be bound.
    let mut bindings = vec![Binding::output("y", 0, "u32")];
    let mut spec = space.shape(Spec::new(&ANY_ALL))?;
    if count > 0 {
        bindings.push(Binding::input("x", 0, "u32"));
    } else {
        spec = spec.hook("byte", "fn byte(e: u32) -> u32 {\n    return 0u;\n}");
    }
    spec.set("WG", grid.workgroup)
        .set("ALL", all)
        .dispatch(
            format!("{}_bool", cx.op.to_lowercase()),
            grid.groups,
            bindings,
            space.params(n_out)?,
        )
        .map(|d| vec![d])
}

/// `Reduce*`: f32, and i32 for the kinds that need no division, root or logarithm.
fn reduce(cx: &KernelCx) -> Result<Reduction, NoKernel> {
    let x = &cx.inputs[0].desc;
    let ty = match x.dtype {
        DType::F32 => "f32",
        DType::I32 => "i32",
        dt => return Err(cx.dtype(dt)),
    };
    if cx.outputs[0].desc.dtype != x.dtype {
        return Err(cx.dtype(cx.outputs[0].desc.dtype));
    }
    let space = Space::new(&x.shape, &axes(cx)?);
    let float = ty == "f32";
    let (one, lowest, highest) = if float {
        ("1.0".to_string(), f32_lit(f32::NEG_INFINITY), f32_lit(f32::INFINITY))
    } else {
        ("1i".into(), "bitcast<i32>(0x80000000u)".into(), "2147483647i".into())
    };
    // NaN wins, as in numpy and the CPU kernel.
    let extreme = |init: String, cmp: &str| Fold {
        init,
        term: "$v".into(),
        combine: if float {
            format!("select($a, $b, $b {cmp} $a || {})", is_nan("$b"))
        } else {
            format!("select($a, $b, $b {cmp} $a)")
        },
    };
    let sum = |term: &str| Fold::sum(ty, term);
    let (stages, result) = match cx.op {
        "ReduceSum" => (vec![sum("$v")], "s0"),
        "ReduceMax" => (vec![extreme(lowest, ">")], "s0"),
        "ReduceMin" => (vec![extreme(highest, "<")], "s0"),
        "ReduceProd" => {
            (vec![Fold { init: one, term: "$v".into(), combine: "$a * $b".into() }], "s0")
        }
        "ReduceL1" => (vec![sum("abs($v)")], "s0"),
        "ReduceSumSquare" => (vec![sum("$v * $v")], "s0"),
        _ if !float => return Err(cx.dtype(x.dtype)),
        "ReduceMean" => (vec![sum("$v")], "s0 / f32(n)"),
        "ReduceL2" => (vec![sum("$v * $v")], "sqrt(s0)"),
        "ReduceLogSum" => (vec![sum("$v")], "log(s0)"),
        "ReduceLogSumExp" => (
            vec![extreme(lowest, ">"), sum("exp($v - s0)")],
            // An infinite maximum (or an empty set: -inf) is the answer itself.
            "select(s0, s0 + log(s1), (bitcast<u32>(s0) & 0x7fffffffu) < 0x7f800000u)",
        ),
        op => return Err(no_kernel!("no Vulkan kernel for {op}")),
    };
    Ok(Reduction {
        space,
        ty,
        stages: stages.into_iter().map(Stage::from).collect(),
        out: Out::Value(result.into()),
    })
}

/// WGSL of whether the f32 `v` is NaN, from its bits: compilers may take `v != v` to be false.
fn is_nan(v: &str) -> String {
    format!("(bitcast<u32>({v}) & 0x7fffffffu) > 0x7f800000u")
}

/// The most dimensions of each kind (kept, reduced) the kernels take, after merging.
const MAX_DIMS: usize = 4;

/// How the output elements map to sets of input elements: the input's dimensions without the
/// size-1 ones, neighbours of the same kind (kept or reduced) merged, each with its input
/// stride.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Space {
    /// Kept dimensions (size, input stride), outermost first: the output index's digits.
    kept: Vec<(u64, u64)>,
    /// Reduced dimensions (size, input stride), outermost first: a set index's digits.
    reduced: Vec<(u64, u64)>,
}

impl Space {
    /// Reducing `axes` of a row-major tensor of `shape`.
    pub(crate) fn new(shape: &[usize], axes: &[usize]) -> Space {
        let mut space = Space { kept: Vec::new(), reduced: Vec::new() };
        let mut stride = shape.iter().map(|&d| d as u64).product::<u64>();
        let mut last = None;
        for (d, &n) in shape.iter().enumerate() {
            let n = n as u64;
            stride = stride.checked_div(n).unwrap_or(0);
            if n == 1 {
                continue;
            }
            let r = axes.contains(&d);
            let dims = if r { &mut space.reduced } else { &mut space.kept };
            match dims.last_mut() {
                Some(dim) if last == Some(r) => *dim = (dim.0 * n, stride),
                _ => dims.push((n, stride)),
            }
            last = Some(r);
        }
        // A zero-size dimension makes every stride 0 after it; the sets or outputs are empty.
        space
    }

    pub(crate) fn outputs(&self) -> u64 {
        self.kept.iter().map(|d| d.0).product()
    }

    /// Elements per set.
    pub(crate) fn count(&self) -> u64 {
        self.reduced.iter().map(|d| d.0).product()
    }

    /// Whether each set is one run of contiguous elements.
    fn contiguous(&self) -> bool {
        self.reduced.len() <= 1 && self.reduced.iter().all(|d| d.1 == 1)
    }

    /// `spec` with the overrides of the dimension counts, `KEPT` and `REDUCED` (no reduced
    /// dimension is one of size 1).
    fn shape(&self, spec: Spec) -> Result<Spec, NoKernel> {
        if self.kept.len() > MAX_DIMS || self.reduced.len() > MAX_DIMS {
            return Err(no_kernel!(
                "{} kept and {} reduced runs of dimensions (at most {MAX_DIMS} each)",
                self.kept.len(),
                self.reduced.len()
            ));
        }
        Ok(spec
            .set("KEPT", self.kept.len() as u32)
            .set("REDUCED", self.reduced.len().max(1) as u32))
    }

    /// The params of the kernels: the outputs, the set's length, then the kept and the
    /// reduced dimensions, innermost first, [`MAX_DIMS`] of each, padded with (1, 0).
    fn params(&self, outputs: u64) -> Result<Vec<u32>, NoKernel> {
        let mut words = vec![outputs, self.count()];
        for dims in [&self.kept, &self.reduced] {
            let pad = std::iter::repeat_n((1, 0), MAX_DIMS.saturating_sub(dims.len()));
            for (size, stride) in dims.iter().rev().copied().chain(pad) {
                words.extend([size, stride]);
            }
        }
        words
            .into_iter()
            .map(|w| u32::try_from(w).map_err(|_| no_kernel!("{w} does not fit a u32 param")))
            .collect()
    }
}

/// A fold of a set into one value: `acc = combine(acc, term(v))` from `init`. The WGSL
/// templates name the input value `$v` and the two accumulators `$a` and `$b`; terms may use
/// the result of the stage before, `s0`.
#[derive(Clone, Debug)]
pub(crate) struct Fold {
    pub init: String,
    pub term: String,
    pub combine: String,
}

impl Fold {
    /// The sum of `term` over the set, in `ty` ("f32" or "i32").
    pub(crate) fn sum(ty: &str, term: &str) -> Fold {
        Fold {
            init: if ty == "f32" { "0.0" } else { "0i" }.into(),
            term: term.into(),
            combine: "$a + $b".into(),
        }
    }

    /// `spec` with this fold as stage `k`'s hooks `init{k}`, `term{k}` and `combine{k}`, of
    /// values of type `ty` (the file's alias `T` for reductions, `f32` for pools).
    pub(crate) fn hooks(&self, spec: Spec, k: usize, ty: &str) -> Spec {
        let s0 = if k == 0 { String::new() } else { format!(", s0: {ty}") };
        spec.hook(
            ["init0", "init1"][k],
            format!("fn init{k}() -> {ty} {{\n    return {};\n}}", self.init),
        )
        .hook(
            ["term0", "term1"][k],
            format!(
                "fn term{k}(v: {ty}{s0}) -> {ty} {{\n    return {};\n}}",
                self.term.replace("$v", "v")
            ),
        )
        .hook(
            ["combine0", "combine1"][k],
            format!(
                "fn combine{k}(a: {ty}, b: {ty}) -> {ty} {{\n    return {};\n}}",
                self.combine.replace("$a", "a").replace("$b", "b")
            ),
        )
    }
}

pub(crate) enum Stage {
    /// Its result is `s{k}` for stage k.
    Fold(Fold),
    /// The index of the first (or `last`) greatest (or `min`: least) element.
    Arg { min: bool, last: bool },
}

impl From<Fold> for Stage {
    fn from(f: Fold) -> Stage {
        Stage::Fold(f)
    }
}

/// What a reduction writes.
pub(crate) enum Out {
    /// One element per output: the WGSL of the result from the stages' results `s0`, `s1` and
    /// the set's length `n` (a u32).
    Value(String),
    /// ArgMax/ArgMin: the index as an int64, two u32 words.
    Index,
    /// Every element of the set, at its input offsets in an output of the input's shape: the
    /// WGSL of each value from `$v` (the input element), `$r` (its index in the set) and the
    /// stages' results.
    Each(String),
    /// Hardmax: every element of the set, 1.0 at the index search's result and 0.0 elsewhere.
    OneHot,
}

/// A reduction kernel: the sets, the stages that fold them and what is written.
pub(crate) struct Reduction {
    pub space: Space,
    /// The input's WGSL element type: "f32" or "i32" (also the output's, but for `Index`).
    pub ty: &'static str,
    pub stages: Vec<Stage>,
    pub out: Out,
}

/// The most loop iterations one invocation may run, all its loops together: lavapipe's
/// compiler (gallivm) ends every loop of an invocation, silently, once they have run 65535
/// iterations in all.
pub(crate) const MAX_TRIPS: u64 = 49152;

/// Accumulators of a fold in one invocation (the files' 8 lanes).
const LANES: u64 = 8;

/// On GPUs, sets of at least this many elements get one workgroup per output...
const TREE_MIN: u64 = 1024;
/// ...and so do sets of at least `.0` elements when there are fewer than `.1` outputs.
const TREE_FEW: (u64, u64) = (128, 4096);

/// Vector reads of contiguous sets that start on 16 bytes (`X` is `vec4<T>`).
const VEC4_LOADS: [(&str, &str); 2] = [
    ("load4", "fn load4(base: u32, r: u32) -> vec4<T> {\n    return x[p.x + (base + r) / 4u];\n}"),
    (
        "load1",
        "fn load1(base: u32, r: u32) -> T {\n    return x[p.x + (base + r) / 4u][(base + r) % 4u];\n}",
    ),
];

impl Reduction {
    pub(crate) fn lower(&self, cx: &KernelCx, label: &str) -> Result<Vec<Dispatch>, NoKernel> {
        let (n_out, count) = (self.space.outputs(), self.space.count());
        let too_big = cx
            .inputs
            .iter()
            .chain(cx.outputs)
            .any(|o| o.desc.elements() as u64 * 2 > u64::from(u32::MAX));
        if too_big {
            return Err(no_kernel!("{}: tensors too large for u32 indices", cx.op));
        }
        let written = match self.out {
            Out::Each(_) | Out::OneHot => n_out * count,
            _ => n_out,
        };
        if written == 0 {
            return Ok(Vec::new());
        }
        let folds: Vec<&Fold> = self
            .stages
            .iter()
            .filter_map(|s| match s {
                Stage::Fold(f) => Some(f),
                Stage::Arg { .. } => None,
            })
            .collect();
        let params = self.space.params(n_out)?;
        if count == 0 {
            let Out::Value(result) = &self.out else {
                return Err(no_kernel!("{}: nothing to search", cx.op));
            };
            let grid = Grid::new(n_out, 64)?;
            return self
                .finish(self.hooks(Spec::new(&EMPTY), &folds, true), result)
                .set("WG", grid.workgroup)
                .dispatch(
                    format!("{label}_empty"),
                    grid.groups,
                    vec![Binding::output("y", 0, self.ty)],
                    vec![params[0]],
                )
                .map(|d| vec![d]);
        }
        if let [Stage::Arg { min, last }] = &self.stages[..] {
            return self.arg(cx, label, *min, *last, params);
        }
        if folds.len() != self.stages.len() || !(1..=2).contains(&folds.len()) {
            return Err(no_kernel!("{}: an unsupported reduction", cx.op));
        }
        let vec4 = self.space.contiguous() && count.is_multiple_of(4) && cx.inputs[0].aligned16();
        let large = count >= TREE_MIN || (count >= TREE_FEW.0 && n_out < TREE_FEW.1);
        let tree = if cx.class != DeviceClass::Cpu && large {
            Some(if count >= 4 * TREE_MIN { 256 } else { 64 })
        } else if self.trips(vec4, None) > MAX_TRIPS {
            // Too long for one invocation: one workgroup per output on every device.
            Some(256)
        } else {
            None
        };
        let trips = self.trips(vec4, tree);
        if trips > MAX_TRIPS {
            return Err(no_kernel!(
                "{}: {trips} loop iterations per invocation over sets of {count}",
                cx.op
            ));
        }
        let x_ty = match (vec4, self.ty) {
            (false, ty) => ty,
            (true, "i32") => "vec4<i32>",
            (true, _) => "vec4<f32>",
        };
        let bindings = vec![Binding::input("x", 0, x_ty), Binding::output("y", 0, self.ty)];
        let (file, groups, wg, how) = match tree {
            Some(wg) => (&TREE, Grid::new(n_out, 1)?.groups, wg, format!("wg{wg}")),
            None => {
                let wg = match cx.class {
                    // lavapipe runs a workgroup on one thread: few outputs with long sets go
                    // in small groups to use every core.
                    DeviceClass::Cpu if n_out < 1024 && count >= 1024 => 8,
                    _ => 64,
                };
                (&FOLD, Grid::new(n_out, wg)?.groups, wg, "thread".into())
            }
        };
        let mut spec = self.hooks(self.space.shape(Spec::new(file))?, &folds, false);
        spec = match &self.out {
            Out::Value(result) => self.finish(spec, result),
            Out::Each(each) => spec.hook(
                "each",
                format!(
                    "fn each(v: T, r: u32, s0: T, s1: T) -> T {{\n    return {};\n}}",
                    each.replace("$v", "v").replace("$r", "r")
                ),
            ),
            Out::Index | Out::OneHot => {
                return Err(no_kernel!("{}: an index written by a fold", cx.op));
            }
        };
        if vec4 {
            spec = spec.alias("X", format!("vec4<{}>", self.ty));
            for (name, function) in VEC4_LOADS {
                spec = spec.hook(name, function);
            }
        }
        if tree.is_some() {
            spec = spec.set("V4", vec4);
        }
        spec.set("WG", wg)
            .set("STAGES", folds.len() as u32)
            .set("EACH", matches!(self.out, Out::Each(_)))
            .dispatch(
                format!("{label}_{how}{}", if vec4 { "_v4" } else { "" }),
                groups,
                bindings,
                params,
            )
            .map(|d| vec![d])
    }

    /// `spec` with the element type and the stages' hooks (only the `init`s with `inits`).
    fn hooks(&self, mut spec: Spec, folds: &[&Fold], inits: bool) -> Spec {
        spec = spec.alias("T", self.ty);
        for (k, f) in folds.iter().enumerate() {
            spec = match inits {
                true => spec.hook(
                    ["init0", "init1"][k],
                    format!("fn init{k}() -> T {{\n    return {};\n}}", f.init),
                ),
                false => f.hooks(spec, k, "T"),
            };
        }
        spec
    }

    /// `spec` with the hook `finish` returning `result`.
    fn finish(&self, spec: Spec, result: &str) -> Spec {
        spec.hook(
            "finish",
            format!("fn finish(s0: T, s1: T, n: u32) -> T {{\n    return {result};\n}}"),
        )
    }

    /// ArgMax/ArgMin (`Out::Index`) and Hardmax (`Out::OneHot`): arg.wgsl.
    fn arg(
        &self,
        cx: &KernelCx,
        label: &str,
        min: bool,
        last: bool,
        params: Vec<u32>,
    ) -> Result<Vec<Dispatch>, NoKernel> {
        let one_hot = match self.out {
            Out::Index => false,
            Out::OneHot => true,
            _ => return Err(no_kernel!("{}: an index search writes an index", cx.op)),
        };
        let trips = self.trips(false, None);
        if trips > MAX_TRIPS {
            return Err(no_kernel!(
                "{}: {trips} loop iterations per invocation over sets of {}",
                cx.op,
                self.space.count()
            ));
        }
        let grid = Grid::new(self.space.outputs(), 64)?;
        let mut spec = self.space.shape(Spec::new(&ARG))?.alias("T", self.ty);
        if self.ty != "f32" {
            spec = spec.hook("is_nan", "fn is_nan(v: T) -> bool {\n    return false;\n}");
        }
        spec.set("WG", grid.workgroup)
            .set("MIN", min)
            .set("LAST", last)
            .set("HARDMAX", one_hot)
            .dispatch(
                format!("{label}_thread"),
                grid.groups,
                vec![Binding::input("x", 0, self.ty), Binding::output("y", 0, "u32")],
                params,
            )
            .map(|d| vec![d])
    }

    /// The loop iterations of one invocation: one per output, or a workgroup of `tree`.
    fn trips(&self, vec4: bool, tree: Option<u32>) -> u64 {
        let count = self.space.count();
        let (step, log) = match tree {
            Some(wg) => (u64::from(wg), u64::from(wg.ilog2())),
            None => (1, 0),
        };
        let walk = if vec4 { count / 4 } else { count }.div_ceil(step);
        let stages: u64 = self
            .stages
            .iter()
            .map(|stage| match (stage, tree) {
                (Stage::Fold(_), Some(_)) => walk + log,
                _ => count / LANES,
            })
            .sum();
        let write = match (&self.out, tree) {
            (Out::Each(_), Some(_)) => walk,
            (Out::Each(_), None) => count / 4 + count % 4,
            (Out::OneHot, _) => count,
            _ => 0,
        };
        stages + write
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::TensorDesc;
    use crate::vulkan::valid;
    use crate::vulkan::{Operand, compile, lower_f32_all_classes};
    use ingot_schema::{AttrValue, Attrs};

    fn cx_lower(
        class: DeviceClass,
        op: &str,
        attrs: &Attrs,
        x: TensorDesc,
        y: TensorDesc,
        x_offset: u64,
    ) -> Result<Vec<Dispatch>, NoKernel> {
        let y_offset = (x_offset + x.bytes() as u64 + 16).next_multiple_of(16);
        let inputs = [Operand::arena(x, x_offset)];
        let outputs = [Operand::arena(y, y_offset)];
        let cx = KernelCx { class, op, name: "s", attrs, inputs: &inputs, outputs: &outputs };
        lower(&cx)
    }

    fn f32s(shape: &[usize]) -> TensorDesc {
        TensorDesc::new(DType::F32, shape)
    }

    /// A dispatch as its module is made: label, overrides, params and the specialised source.
    pub(crate) fn specialised(d: &Dispatch) -> String {
        let overrides: Vec<String> = d.overrides.iter().map(|(n, v)| format!("{n}={v}")).collect();
        format!(
            "// {}\n// overrides: {}\n// params: {:?}\n{}",
            d.label,
            overrides.join(" "),
            d.params,
            d.wgsl
        )
    }

    #[test]
    fn every_file_is_a_valid_module() {
        for file in FILES {
            if let Err(e) = compile(file.source, &[]) {
                panic!("{}:\n{e}", file.path);
            }
        }
    }

    #[test]
    fn spaces_merge_dimensions_of_one_kind() {
        // [2, 3, 1, 4, 5] over axes 1 and 3: kept 2 (stride 60) and 5 (1); reduced 3 (20)
        // and 4 (5) merge across the size-1 axis only if neighbours: 3 and 4 are separated
        // by axis 2 of size 1, so they merge into 12 with stride 5.
        let s = Space::new(&[2, 3, 1, 4, 5], &[1, 3]);
        assert_eq!(s.kept, [(2, 60), (5, 1)]);
        assert_eq!(s.reduced, [(12, 5)]);
        // Outputs, count, then kept and reduced dimensions innermost first, padded.
        assert_eq!(
            s.params(10).unwrap(),
            [10, 12, 5, 1, 2, 60, 1, 0, 1, 0, 12, 5, 1, 0, 1, 0, 1, 0]
        );
        let s = Space::new(&[4, 6], &[0, 1]);
        assert_eq!((s.outputs(), s.count()), (1, 24));
        assert!(s.contiguous());
        let s = Space::new(&[4, 6], &[]);
        assert_eq!((s.outputs(), s.count(), s.reduced.len()), (24, 1, 0));
        // Five runs of reduced dimensions are more than the kernels take.
        let s = Space::new(&[2; 10], &[0, 2, 4, 6, 8]);
        assert!(s.shape(Spec::new(&FOLD)).is_err());
    }

    fn reduce_attrs(axes: &[i64], keep: i64) -> Attrs {
        Attrs::new()
            .with("axes", AttrValue::Ints(axes.to_vec()))
            .with("keepdims", AttrValue::Int(keep))
    }

    #[test]
    fn every_reduction_compiles_in_both_shapes() {
        for op in crate::reduce::OPS.iter().map(|d| d.name).filter(|o| o.starts_with("Reduce")) {
            // Layer norm's mean over the last axis (vec4), a middle axis, everything, and
            // two runs of reduced dimensions.
            let cases: [(&[usize], &[i64], &[usize]); 4] = [
                (&[2, 40, 120], &[2], &[2, 40, 1]),
                (&[2, 5, 7], &[1], &[2, 7]),
                (&[3, 64, 64], &[0, 1, 2], &[]),
                (&[2, 3, 4, 5], &[0, 2], &[3, 5]),
            ];
            for (shape, axes, out) in cases {
                let keep = i64::from(out.len() == shape.len());
                valid(&lower_f32_all_classes(
                    lower,
                    op,
                    &reduce_attrs(axes, keep),
                    &[shape],
                    &[out],
                    0,
                ));
            }
        }
        let d = cx_lower(
            DeviceClass::Gpu,
            "ReduceMean",
            &reduce_attrs(&[0, 1, 2], 0),
            f32s(&[3, 64, 64]),
            f32s(&[]),
            0,
        )
        .unwrap();
        assert_eq!(d[0].label, "reducemean_wg256_v4");
        assert_eq!(d[0].groups, [1, 1, 1]);
        // Misaligned: scalar loads.
        let d = cx_lower(
            DeviceClass::Cpu,
            "ReduceMean",
            &reduce_attrs(&[2], 1),
            f32s(&[2, 40, 120]),
            f32s(&[2, 40, 1]),
            4,
        )
        .unwrap();
        assert_eq!(d[0].label, "reducemean_thread");
        assert_eq!(d[0].groups, [2, 1, 1]);
        assert_eq!(d[0].bindings[0].ty, "f32");
    }

    #[test]
    fn one_module_serves_every_shape() {
        // PP-OCR det's global average pools over 7x7 and 14x14 planes and rec's LayerNorm
        // means: the same source and overrides, different params.
        let mean = |x: &[usize], y: &[usize]| {
            let mut d = cx_lower(
                DeviceClass::Cpu,
                "ReduceMean",
                &reduce_attrs(&[x.len() as i64 - 1], 1),
                f32s(x),
                f32s(y),
                0,
            )
            .unwrap();
            d.remove(0)
        };
        let a = mean(&[1, 40, 120], &[1, 40, 1]);
        let b = mean(&[1, 96, 196], &[1, 96, 1]);
        assert_eq!((&a.wgsl, &a.overrides), (&b.wgsl, &b.overrides));
        assert_ne!(a.params, b.params);
        assert_eq!(a.label, "reducemean_thread_v4");
    }

    #[test]
    fn integer_reductions_and_what_has_no_kernel() {
        let i32s = |s: &[usize]| TensorDesc::new(DType::I32, s);
        for op in ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1"] {
            for shape in [&[3, 4][..], &[3, 8]] {
                let d = cx_lower(
                    DeviceClass::Gpu,
                    op,
                    &reduce_attrs(&[1], 0),
                    i32s(shape),
                    i32s(&[3]),
                    0,
                )
                .unwrap();
                valid(&d);
            }
        }
        let mean = cx_lower(
            DeviceClass::Gpu,
            "ReduceMean",
            &reduce_attrs(&[1], 0),
            i32s(&[3, 4]),
            i32s(&[3]),
            0,
        );
        assert!(mean.is_err());
        let f64s = TensorDesc::new(DType::F64, [3, 4]);
        let sum = cx_lower(
            DeviceClass::Gpu,
            "ReduceSum",
            &reduce_attrs(&[1], 0),
            f64s.clone(),
            TensorDesc::new(DType::F64, [3]),
            0,
        );
        assert!(sum.is_err());
        // Nothing to write: no dispatch.
        let d = cx_lower(
            DeviceClass::Gpu,
            "ReduceSum",
            &reduce_attrs(&[1], 0),
            f32s(&[0, 4]),
            f32s(&[0]),
            0,
        )
        .unwrap();
        assert!(d.is_empty());
        // Folding empty sets: the output alone is bound (an empty tensor cannot be).
        for op in crate::reduce::OPS.iter().map(|d| d.name).filter(|o| o.starts_with("Reduce")) {
            let d = cx_lower(
                DeviceClass::Gpu,
                op,
                &reduce_attrs(&[1], 0),
                f32s(&[3, 0]),
                f32s(&[3]),
                0,
            )
            .unwrap();
            valid(&d);
            assert_eq!(d[0].bindings, [Binding::output("y", 0, "f32")]);
            assert_eq!(d[0].params, [3]);
        }
    }

    #[test]
    fn any_and_all_of_bools_write_whole_words() {
        let bools = |s: &[usize]| TensorDesc::new(DType::Bool, s);
        for (op, x, axes, y, groups) in [
            ("ReduceMax", &[3, 5][..], &[1][..], &[3][..], 1),
            ("ReduceMin", &[2, 4, 3], &[0, 2], &[4], 1),
            ("ReduceMax", &[3, 0], &[1], &[3], 1),
            ("ReduceMin", &[1000, 3], &[1], &[1000], 4),
        ] {
            let d = cx_lower(DeviceClass::Cpu, op, &reduce_attrs(axes, 0), bools(x), bools(y), 0)
                .unwrap();
            valid(&d);
            // The output first; the input only when there is something to read.
            assert_eq!(d[0].bindings[0], Binding::output("y", 0, "u32"));
            assert_eq!(d[0].bindings.len(), if x[1] == 0 { 1 } else { 2 });
            assert_eq!(d[0].groups, [groups, 1, 1]);
        }
        // Bytes that do not start a word cannot be read as words.
        let d = cx_lower(
            DeviceClass::Cpu,
            "ReduceMax",
            &reduce_attrs(&[1], 0),
            bools(&[3, 5]),
            bools(&[3]),
            2,
        );
        assert!(d.is_err());
    }

    #[test]
    fn softmax_and_hardmax() {
        for op in ["Softmax", "LogSoftmax", "Hardmax"] {
            // PP-OCR rec: [1, 40, 6625] along the last axis; attention rows; a middle
            // axis; the opset-11 form over the two last axes.
            let cases: [(&[usize], i64, i64); 4] = [
                (&[1, 40, 6625], 2, 0),
                (&[1, 8, 40, 40], 3, 0),
                (&[2, 7, 3], 1, 0),
                (&[2, 7, 3], 1, 1),
            ];
            for (shape, axis, coerce) in cases {
                let a = Attrs::new()
                    .with("axis", AttrValue::Int(axis))
                    .with("coerce_2d", AttrValue::Int(coerce));
                valid(&lower_f32_all_classes(lower, op, &a, &[shape], &[shape], 0));
            }
        }
        // rec's final softmax: one workgroup per row on GPUs, 8-wide groups on CPUs.
        let a = Attrs::new().with("axis", AttrValue::Int(2)).with("coerce_2d", AttrValue::Int(0));
        let shape = [1, 40, 6625];
        let d = lower_f32_all_classes(lower, "Softmax", &a, &[&shape], &[&shape], 0);
        let labels: Vec<(&str, [u32; 3])> = d.iter().map(|d| (&d.label[..], d.groups)).collect();
        assert_eq!(labels, [("softmax_thread", [5, 1, 1]), ("softmax_wg256", [40, 1, 1])]);
        // LpNormalization folds one sum; p other than 1 or 2 has no kernel.
        for p in [1, 2] {
            let a = Attrs::new().with("axis", AttrValue::Int(1)).with("p", AttrValue::Int(p));
            let shape = [2, 7, 3];
            valid(&lower_f32_all_classes(lower, "LpNormalization", &a, &[&shape], &[&shape], 0));
        }
    }

    #[test]
    fn arg_max_writes_int64_words() {
        for op in ["ArgMax", "ArgMin"] {
            for last in [0, 1] {
                let a = Attrs::new()
                    .with("axis", AttrValue::Int(1))
                    .with("keepdims", AttrValue::Int(1))
                    .with("select_last_index", AttrValue::Int(last));
                for x in [DType::F32, DType::I32] {
                    let d = cx_lower(
                        DeviceClass::Gpu,
                        op,
                        &a,
                        TensorDesc::new(x, [3, 5, 2]),
                        TensorDesc::new(DType::I64, [3, 1, 2]),
                        0,
                    )
                    .unwrap();
                    valid(&d);
                    assert_eq!(d[0].bindings[1].ty, "u32");
                    assert_eq!(d[0].groups, [1, 1, 1]);
                }
            }
        }
    }

    #[test]
    fn long_sets_take_a_workgroup_per_output_on_every_device() {
        // lavapipe ends an invocation's loops after 65535 iterations in all: 600000 strided
        // elements (75000 iterations of 8) and planes of 10^6 are folded by workgroups.
        for (shape, axes, out) in
            [(&[600000, 2][..], &[0][..], &[2][..]), (&[3, 1000, 1000], &[1, 2], &[3])]
        {
            for class in [DeviceClass::Gpu, DeviceClass::Cpu] {
                for op in ["ReduceSum", "ReduceLogSumExp"] {
                    let d = cx_lower(class, op, &reduce_attrs(axes, 0), f32s(shape), f32s(out), 0)
                        .unwrap();
                    valid(&d);
                    assert!(d[0].label.contains("_wg256"), "{}", d[0].label);
                }
            }
        }
        // An index search runs in one invocation, 8 elements an iteration: up to 393216.
        let a = Attrs::new()
            .with("axis", AttrValue::Int(1))
            .with("keepdims", AttrValue::Int(0))
            .with("select_last_index", AttrValue::Int(0));
        let i64s = |s: &[usize]| TensorDesc::new(DType::I64, s);
        let d = cx_lower(DeviceClass::Gpu, "ArgMax", &a, f32s(&[2, 300000]), i64s(&[2]), 0);
        valid(&d.unwrap());
        let long = cx_lower(DeviceClass::Gpu, "ArgMax", &a, f32s(&[2, 400000]), i64s(&[2]), 0);
        assert!(long.is_err());
    }

    #[test]
    fn more_outputs_than_one_dispatch_row() {
        // 65535 * 64 + 1 outputs: the grid needs a y dimension; the workgroup reduction
        // takes one group per output.
        let n = 65535 * 64 + 1;
        for class in [DeviceClass::Gpu, DeviceClass::Cpu] {
            let d =
                cx_lower(class, "ReduceSum", &reduce_attrs(&[1], 0), f32s(&[n, 2]), f32s(&[n]), 0)
                    .unwrap();
            valid(&d);
            assert_eq!(d[0].groups, [65535, 2, 1]);
        }
        let d = cx_lower(
            DeviceClass::Gpu,
            "ReduceSum",
            &reduce_attrs(&[1], 0),
            f32s(&[70000, 2048]),
            f32s(&[70000]),
            0,
        )
        .unwrap();
        valid(&d);
        assert_eq!(d[0].groups, [65535, 2, 1]);
    }

    #[test]
    fn specialised_sources() {
        // ReduceLogSumExp in lanes with vector reads (two stages), rec's softmax on GPUs (a
        // workgroup tree writing every element), ArgMin of int32 over a middle axis.
        let d = cx_lower(
            DeviceClass::Cpu,
            "ReduceLogSumExp",
            &reduce_attrs(&[1], 0),
            f32s(&[3, 64]),
            f32s(&[3]),
            0,
        )
        .unwrap();
        insta::assert_snapshot!("logsumexp_cpu", specialised(&d[0]));
        let a = Attrs::new().with("axis", AttrValue::Int(2)).with("coerce_2d", AttrValue::Int(0));
        let shape = [1, 40, 6625];
        let d = cx_lower(DeviceClass::Gpu, "Softmax", &a, f32s(&shape), f32s(&shape), 0).unwrap();
        insta::assert_snapshot!("softmax_gpu", specialised(&d[0]));
        let a = Attrs::new()
            .with("axis", AttrValue::Int(1))
            .with("keepdims", AttrValue::Int(0))
            .with("select_last_index", AttrValue::Int(1));
        let d = cx_lower(
            DeviceClass::Cpu,
            "ArgMin",
            &a,
            TensorDesc::new(DType::I32, [3, 5, 2]),
            TensorDesc::new(DType::I64, [3, 2]),
            0,
        )
        .unwrap();
        insta::assert_snapshot!("argmin_i32", specialised(&d[0]));
    }
}
