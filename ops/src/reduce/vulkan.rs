//! Vulkan kernels of the reduce family (ops: ops/src/reduce/cpu.rs): `Reduce*`,
//! `ArgMax`/`ArgMin` and `Softmax`/`LogSoftmax`/`Hardmax`. The pool family's global pools are
//! made by the same generator, [`Reduction`].
//!
//! Each output element (for Softmax, each row) folds a set of input elements: the kept
//! dimensions give the set's first element, the reduced ones the offsets inside it, all with
//! literal strides ([`Space`]). The set is folded in one or more stages ([`Stage`]: Softmax
//! folds the maximum, then the sum of exponentials) and the result written ([`Out`]). Two
//! shapes of kernel:
//! - one invocation per output, walking its whole set in 8 interleaved accumulators merged
//!   pairwise (vec4 loads when the set is contiguous and aligned): sets that are small next to
//!   the number of outputs, and on CPU-type devices, where workgroup memory and barriers are
//!   slow, every set short enough for one invocation;
//! - one workgroup per output: each invocation folds every `workgroup`-th element, then a tree
//!   in workgroup memory folds the partial results. On GPUs for large sets, everywhere for
//!   sets longer than one invocation may loop over ([`MAX_TRIPS`]).
//!
//! Summing in lanes is not only faster: next to one running sum it shortens the chains of
//! roundings about as a vectorised CPU reduction does, which brings LayerNorm means (and so
//! PP-OCR rec's output) about 10 times closer to ONNX Runtime's.
//!
//! int64 outputs (ArgMax/ArgMin) are written as two u32 words per element, low word first.

use crate::no_kernel;
use crate::vulkan::{Binding, DeviceClass, Dispatch, Grid, KernelCx, NoKernel, f32_lit, header};
use ingot_schema::DType;
use std::fmt::Write;

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
                return Err(cx.dtype(if y_dtype != DType::I64 {
                    y_dtype
                } else {
                    x_dtype
                }));
            }
            let axis = axis()?;
            if shape[axis] == 0 {
                return Err(no_kernel!("{} over an empty axis", cx.op));
            }
            Reduction {
                space: Space::new(shape, &[axis]),
                ty: if x_dtype == DType::F32 { "f32" } else { "i32" },
                stages: vec![Stage::Arg {
                    cmp: if cx.op == "ArgMax" { ">" } else { "<" },
                    last: int("select_last_index")? != 0,
                }],
                out: Out::Index,
            }
        }
        "Softmax" | "LogSoftmax" | "Hardmax" => {
            cx.require_f32()?;
            let axis = axis()?;
            let end = if int("coerce_2d")? != 0 {
                rank
            } else {
                axis + 1
            };
            let axes: Vec<usize> = (axis..end).collect();
            let max = Fold {
                init: f32_lit(f32::NEG_INFINITY),
                term: "$v".into(),
                combine: "select($a, $b, $b > $a)".into(),
            };
            let sum_exp = Fold::sum("f32", "exp($v - s0)");
            let (stages, each) = match cx.op {
                "Softmax" => (
                    vec![max.into(), sum_exp.into()],
                    "exp($v - s0) * (1.0 / s1)",
                ),
                "LogSoftmax" => (vec![max.into(), sum_exp.into()], "$v - (s0 + log(s1))"),
                _ => (
                    vec![Stage::Arg {
                        cmp: ">",
                        last: false,
                    }],
                    "select(0.0, 1.0, $r == bi)",
                ),
            };
            Reduction {
                space: Space::new(shape, &axes),
                ty: "f32",
                stages,
                out: Out::Each(each.into()),
            }
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
    let fold = match cx.op {
        "ReduceMax" => "max",
        "ReduceMin" => "min",
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
    let words = n_out.div_ceil(4);
    let grid = Grid::new(words, 64)?;
    let mut bindings = vec![Binding::output("y", 0, "u32")];
    if count > 0 {
        bindings.insert(0, Binding::input("x", 0, "u32"));
    }
    let mut s = header(&bindings);
    let _ = writeln!(
        s,
        "\n{} {{\n    let w = {};\n    if (w >= {words}u) {{ return; }}\n    var word = 0u;",
        grid.entry(),
        grid.index()
    );
    let init = if fold == "max" { 0 } else { 1 };
    for c in 0..4 {
        let _ = writeln!(
            s,
            "    {{\n    let o = 4u * w + {c}u;\n    var acc = {init}u;"
        );
        if count > 0 {
            let _ = writeln!(
                s,
                "    if (o < {n_out}u) {{\n    let base = {};\n    for (var r = 0u; r < {count}u; r++) {{\n        let e = base + {};\n        let byte = (x[offsets.x + e / 4u] >> (8u * (e % 4u))) & 0xffu;\n        acc = {fold}(acc, select(0u, 1u, byte != 0u));\n    }}\n    }}",
                space.base("o"),
                space.offset("r")
            );
        }
        let _ = writeln!(s, "    word |= acc << {}u;\n    }}", 8 * c);
    }
    if n_out % 4 != 0 {
        let keep = u32::MAX << (8 * (n_out % 4));
        let _ = writeln!(
            s,
            "    if (w == {}u) {{\n        word = (word & {}u) | (y[offsets.y + w] & {keep}u);\n    }}",
            words - 1,
            !keep
        );
    }
    s += "    y[offsets.y + w] = word;\n}\n";
    Ok(vec![Dispatch {
        label: format!("{}_bool_{n_out}x{count}", cx.op.to_lowercase()),
        wgsl: s,
        groups: grid.groups,
        bindings,
        ..Default::default()
    }])
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
        (
            "1.0".to_string(),
            f32_lit(f32::NEG_INFINITY),
            f32_lit(f32::INFINITY),
        )
    } else {
        (
            "1i".into(),
            "bitcast<i32>(0x80000000u)".into(),
            "2147483647i".into(),
        )
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
        "ReduceSum" => (vec![sum("$v")], "s0".to_string()),
        "ReduceMax" => (vec![extreme(lowest, ">")], "s0".into()),
        "ReduceMin" => (vec![extreme(highest, "<")], "s0".into()),
        "ReduceProd" => (
            vec![Fold {
                init: one,
                term: "$v".into(),
                combine: "$a * $b".into(),
            }],
            "s0".into(),
        ),
        "ReduceL1" => (vec![sum("abs($v)")], "s0".into()),
        "ReduceSumSquare" => (vec![sum("$v * $v")], "s0".into()),
        _ if !float => return Err(cx.dtype(x.dtype)),
        "ReduceMean" => (
            vec![sum("$v")],
            format!("s0 / {}", f32_lit(space.count() as f32)),
        ),
        "ReduceL2" => (vec![sum("$v * $v")], "sqrt(s0)".into()),
        "ReduceLogSum" => (vec![sum("$v")], "log(s0)".into()),
        "ReduceLogSumExp" => (
            vec![extreme(lowest, ">"), sum("exp($v - s0)")],
            // An infinite maximum (or an empty set: -inf) is the answer itself.
            "select(s0, s0 + log(s1), (bitcast<u32>(s0) & 0x7fffffffu) < 0x7f800000u)".into(),
        ),
        op => return Err(no_kernel!("no Vulkan kernel for {op}")),
    };
    Ok(Reduction {
        space,
        ty,
        stages: stages.into_iter().map(Stage::from).collect(),
        out: Out::Value(result),
    })
}

/// WGSL of whether the f32 `v` is NaN, from its bits: compilers may take `v != v` to be false.
fn is_nan(v: &str) -> String {
    format!("(bitcast<u32>({v}) & 0x7fffffffu) > 0x7f800000u")
}

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
        let mut space = Space {
            kept: Vec::new(),
            reduced: Vec::new(),
        };
        let mut stride = shape.iter().map(|&d| d as u64).product::<u64>();
        let mut last = None;
        for (d, &n) in shape.iter().enumerate() {
            let n = n as u64;
            stride = stride.checked_div(n).unwrap_or(0);
            if n == 1 {
                continue;
            }
            let r = axes.contains(&d);
            let dims = if r {
                &mut space.reduced
            } else {
                &mut space.kept
            };
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

    /// The WGSL u32 input offset of the first element of output `o`'s set.
    fn base(&self, o: &str) -> String {
        digits(&self.kept, o)
    }

    /// The WGSL u32 offset of element `r` of a set from its first element.
    fn offset(&self, r: &str) -> String {
        digits(&self.reduced, r)
    }
}

/// `Σ digit_k * stride_k` for the row-major digits of the WGSL u32 `i` over `dims`.
fn digits(dims: &[(u64, u64)], i: &str) -> String {
    let mut terms = Vec::new();
    let mut place = 1;
    for (k, &(size, stride)) in dims.iter().enumerate().rev() {
        let mut digit = if place == 1 {
            i.to_string()
        } else {
            format!("({i} / {place}u)")
        };
        if k > 0 {
            digit = format!("({digit} % {size}u)");
        }
        terms.push(if stride == 1 {
            digit
        } else {
            format!("{digit} * {stride}u")
        });
        place *= size;
    }
    if terms.is_empty() {
        return "0u".into();
    }
    terms.reverse();
    terms.join(" + ")
}

/// A fold of a set into one value: `acc = combine(acc, term(v))` from `init`. The WGSL
/// templates name the input value `$v` and the two accumulators `$a` and `$b`; terms may use
/// the results of earlier stages, `s0`, `s1`...
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

    /// `acc` combined with the term of `v`, as WGSL.
    pub(crate) fn step(&self, acc: &str, v: &str) -> String {
        self.merge(acc, &self.term.replace("$v", v))
    }

    fn merge(&self, a: &str, b: &str) -> String {
        self.combine.replace("$a", a).replace("$b", b)
    }
}

pub(crate) enum Stage {
    /// Its result is `s{k}` for stage k.
    Fold(Fold),
    /// The index `bi` of the first (or `last`) element `v` with no `w` in the set such that
    /// `w cmp v`: `>` finds the maximum. As on the CPU, which scans from element 0 and takes a
    /// better element, NaN is never taken, unless it is element 0.
    Arg { cmp: &'static str, last: bool },
}

impl From<Fold> for Stage {
    fn from(f: Fold) -> Stage {
        Stage::Fold(f)
    }
}

/// What a reduction writes.
pub(crate) enum Out {
    /// One element per output: the WGSL of the result from the stages' results.
    Value(String),
    /// ArgMax/ArgMin: `bi` as an int64, two u32 words.
    Index,
    /// Every element of the set, at its input offsets in an output of the input's shape: the
    /// WGSL of each value from `$v` (the input element), `$r` (its index in the set) and the
    /// stages' results.
    Each(String),
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

/// `for (var {var} = start; {var} < end; {var} += step) {body}`.
fn counted_loop(var: &str, start: &str, end: u64, step: u64, body: &str) -> String {
    format!("    for (var {var} = {start}; {var} < {end}u; {var} += {step}u) {{\n{body}    }}\n")
}

/// Accumulators of a fold in one invocation (a power of two, a multiple of 4).
const LANES: u64 = 8;

/// On GPUs, sets of at least this many elements get one workgroup per output...
const TREE_MIN: u64 = 1024;
/// ...and so do sets of at least `.0` elements when there are fewer than `.1` outputs.
const TREE_FEW: (u64, u64) = (128, 4096);

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
            Out::Each(_) => n_out * count,
            _ => n_out,
        };
        if written == 0 {
            return Ok(Vec::new());
        }
        // Index stages read element by element.
        let folds = self.stages.iter().all(|s| matches!(s, Stage::Fold(_)));
        let vec4 = folds
            && self.space.contiguous()
            && count.is_multiple_of(4)
            && count > 0
            && cx.inputs[0].aligned16();
        let large = count >= TREE_MIN || (count >= TREE_FEW.0 && n_out < TREE_FEW.1);
        let tree = if !folds || count == 0 {
            None
        } else if cx.class != DeviceClass::Cpu && large {
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
        let x_ty = if vec4 {
            match self.ty {
                "i32" => "vec4<i32>",
                _ => "vec4<f32>",
            }
        } else {
            self.ty
        };
        let y_ty = match self.out {
            Out::Index => "u32",
            Out::Each(_) => "f32",
            Out::Value(_) => self.ty,
        };
        // An empty set reads nothing, and an empty tensor cannot be bound.
        let mut bindings = vec![Binding::output("y", 0, y_ty)];
        if count > 0 {
            bindings.insert(0, Binding::input("x", 0, x_ty));
        }
        let (wgsl, groups, how) = if let Some(wg) = tree {
            let (wgsl, groups) = self.tree(&bindings, vec4, wg)?;
            (wgsl, groups, format!("wg{wg}"))
        } else {
            let wg = match cx.class {
                // lavapipe runs a workgroup on one thread: few outputs with long sets go in
                // small groups to use every core.
                DeviceClass::Cpu if n_out < 1024 && count >= 1024 => 8,
                _ => 64,
            };
            let (wgsl, groups) = self.threads(&bindings, vec4, wg)?;
            (wgsl, groups, "thread".into())
        };
        Ok(vec![Dispatch {
            label: format!(
                "{label}_{n_out}x{count}_{how}{}",
                if vec4 { "_v4" } else { "" }
            ),
            wgsl,
            groups,
            bindings,
            ..Default::default()
        }])
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
        let write = match self.out {
            Out::Each(_) => walk,
            _ => 0,
        };
        stages + write
    }

    /// A loop over the elements `start`, `start + step`... of the set starting at `base`,
    /// with the WGSL statements `body(v, r, at)` for each: `v` its value, `r` its index in the
    /// set, `at` its offset in the input. With `vec4` the set is read 4 elements at a time.
    fn walk(
        &self,
        vec4: bool,
        start: &str,
        step: u32,
        body: &dyn Fn(&str, &str, &str) -> String,
    ) -> String {
        let count = self.space.count();
        let step = u64::from(step);
        if vec4 {
            let mut b = String::from("        let v4 = x[offsets.x + base / 4u + q];\n");
            for (c, lane) in ["x", "y", "z", "w"].iter().enumerate() {
                b += &body(
                    &format!("v4.{lane}"),
                    &format!("(4u * q + {c}u)"),
                    &format!("base + 4u * q + {c}u"),
                );
            }
            counted_loop("q", start, count / 4, step, &b)
        } else {
            let off = self.space.offset("r");
            let b = format!(
                "        let v = x[offsets.x + base + {off}];\n{}",
                body("v", "r", &format!("base + {off}"))
            );
            counted_loop("r", start, count, step, &b)
        }
    }

    /// The statements that write the result of output `o`.
    fn write(&self, vec4: bool, start: &str, step: u32) -> String {
        match &self.out {
            Out::Value(e) => format!("    y[offsets.y + o] = {e};\n"),
            Out::Index => {
                "    y[offsets.y + 2u * o] = bi;\n    y[offsets.y + 2u * o + 1u] = 0u;\n".into()
            }
            Out::Each(e) => self.walk(vec4, start, step, &|v, r, at| {
                format!(
                    "        y[offsets.y + {at}] = {};\n",
                    e.replace("$v", v).replace("$r", r)
                )
            }),
        }
    }

    /// Stage `k`'s fold of the set of output `o` into `s{k}`, in [`LANES`] interleaved
    /// accumulators (lane i takes the elements i, i + LANES, ...) merged pairwise at the end,
    /// as a vectorised CPU reduction does: shorter chains of roundings than one running sum.
    fn lanes(&self, k: usize, f: &Fold, vec4: bool) -> String {
        let count = self.space.count();
        let main = count / LANES * LANES;
        let lane = |i: u64| format!("s{k}_{i}");
        let mut s = String::new();
        for i in 0..LANES {
            let _ = writeln!(s, "    var {} = {};", lane(i), f.init);
        }
        let step = |i: u64, v: &str| format!("{} = {};", lane(i), f.step(&lane(i), v));
        let body = |r: &str, indent: &str| {
            let mut b = String::new();
            if vec4 {
                for h in 0..LANES / 4 {
                    let _ = writeln!(
                        b,
                        "{indent}{{ let v = x[offsets.x + (base + {r}) / 4u + {h}u];"
                    );
                    for (c, comp) in ["x", "y", "z", "w"].iter().enumerate() {
                        let i = 4 * h + c as u64;
                        let _ = writeln!(b, "{indent}  {}", step(i, &format!("v.{comp}")));
                    }
                    let _ = writeln!(b, "{indent}}}");
                }
            } else {
                for i in 0..LANES {
                    let off = self.space.offset(&format!("({r} + {i}u)"));
                    let _ = writeln!(
                        b,
                        "{indent}{{ let v = x[offsets.x + base + {off}]; {} }}",
                        step(i, "v")
                    );
                }
            }
            b
        };
        if main > 0 {
            s += &counted_loop("r", "0u", main, LANES, &body("r", "        "));
        }
        // The tail: fewer than LANES elements, at literal places.
        for r in (main..count).step_by(if vec4 { 4 } else { 1 }) {
            let i = r - main;
            if vec4 {
                let _ = writeln!(s, "    {{ let v = x[offsets.x + (base + {r}u) / 4u];");
                for (c, comp) in ["x", "y", "z", "w"].iter().enumerate() {
                    let _ = writeln!(s, "      {}", step(i + c as u64, &format!("v.{comp}")));
                }
                s += "    }\n";
            } else {
                let off = self.space.offset(&format!("{r}u"));
                let _ = writeln!(
                    s,
                    "    {{ let v = x[offsets.x + base + {off}]; {} }}",
                    step(i, "v")
                );
            }
        }
        // Pairwise: ((0 1) (2 3)) ((4 5) (6 7)), into lanes 0, 2, 4, 6, then 0, 4, then 0.
        let mut width = 1;
        while width < LANES {
            for i in (0..LANES).step_by(2 * width as usize) {
                let merged = f.merge(&lane(i), &lane(i + width));
                let _ = writeln!(s, "    {} = {merged};", lane(i));
            }
            width *= 2;
        }
        let _ = writeln!(s, "    let s{k} = {};", lane(0));
        s
    }

    /// The index search of output `o`'s set into `bi`: [`LANES`] lanes, lane i over the
    /// elements i, i + LANES..., each taking a better element (or, but for lane 0, any
    /// element over a NaN, so that a NaN first in its lane does not hide the rest), then the
    /// lanes merged in order, ties going to the smaller (or with `last` the larger) index.
    fn arg(&self, cmp: &str, last: bool) -> String {
        let count = self.space.count();
        let lanes = LANES.min(count);
        let main = count / lanes * lanes;
        let tie = if last { ">" } else { "<" };
        let mut s = String::new();
        let read = |r: &str| format!("x[offsets.x + base + {}]", self.space.offset(r));
        for i in 0..lanes {
            let _ = writeln!(
                s,
                "    var b{i} = {};\n    var i{i} = {i}u;",
                read(&format!("{i}u"))
            );
        }
        let step = |i: u64, r: &str| {
            let mut better = format!("v {cmp} b{i}");
            if last {
                better += &format!(" || v == b{i}");
            }
            if i > 0 && self.ty == "f32" {
                better += &format!(" || {}", is_nan(&format!("b{i}")));
            }
            format!(
                "{{ let v = {}; if ({better}) {{ b{i} = v; i{i} = {r}; }} }}",
                read(r)
            )
        };
        if main > lanes {
            let body: String = (0..lanes)
                .map(|i| format!("        {}\n", step(i, &format!("(r + {i}u)"))))
                .collect();
            s += &counted_loop("r", &format!("{lanes}u"), main, lanes, &body);
        }
        for r in main..count {
            let _ = writeln!(s, "    {}", step(r - main, &format!("{r}u")));
        }
        for i in 1..lanes {
            let _ = writeln!(
                s,
                "    if (b{i} {cmp} b0 || (b{i} == b0 && i{i} {tie} i0)) {{ b0 = b{i}; i0 = i{i}; }}"
            );
        }
        s += "    let bi = i0;\n";
        s
    }

    /// One invocation per output.
    fn threads(
        &self,
        bindings: &[Binding],
        vec4: bool,
        wg: u32,
    ) -> Result<(String, [u32; 3]), NoKernel> {
        let n_out = self.space.outputs();
        let grid = Grid::new(n_out, wg)?;
        let empty = self.space.count() == 0;
        let mut s = header(bindings);
        let _ = writeln!(
            s,
            "\n{} {{\n    let o = {};\n    if (o >= {n_out}u) {{ return; }}",
            grid.entry(),
            grid.index(),
        );
        if !empty {
            let _ = writeln!(s, "    let base = {};", self.space.base("o"));
        }
        for (k, stage) in self.stages.iter().enumerate() {
            match stage {
                Stage::Fold(f) if empty => {
                    let _ = writeln!(s, "    let s{k} = {};", f.init);
                }
                Stage::Fold(f) => s += &self.lanes(k, f, vec4),
                Stage::Arg { cmp, last } => s += &self.arg(cmp, *last),
            }
        }
        s += &self.write(vec4, "0u", 1);
        s += "}\n";
        Ok((s, grid.groups))
    }

    /// One workgroup of `wg` invocations per output, folds only.
    fn tree(
        &self,
        bindings: &[Binding],
        vec4: bool,
        wg: u32,
    ) -> Result<(String, [u32; 3]), NoKernel> {
        let n_out = self.space.outputs();
        let groups = Grid::new(n_out, 1)?.groups;
        let mut s = header(bindings);
        let _ = writeln!(
            s,
            "var<workgroup> part: array<{}, {wg}>;\n\n@compute @workgroup_size({wg})\nfn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{\n    let o = wid.x + wid.y * {}u;\n    // Groups past the last output fold its set again and write nothing.\n    let oc = min(o, {}u);\n    let base = {};",
            self.ty,
            groups[0],
            n_out - 1,
            self.space.base("oc")
        );
        for (k, stage) in self.stages.iter().enumerate() {
            let Stage::Fold(f) = stage else {
                return Err(no_kernel!("an index stage in a workgroup reduction"));
            };
            let _ = writeln!(
                s,
                "    var s{k}: {};\n    {{\n    var a = {};",
                self.ty, f.init
            );
            s += &self.walk(vec4, "lid", wg, &|v, _, _| {
                format!("        a = {};\n", f.step("a", v))
            });
            let _ = writeln!(
                s,
                "    part[lid] = a;\n    workgroupBarrier();\n    for (var w = {}u; w > 0u; w = w / 2u) {{\n        if (lid < w) {{ part[lid] = {}; }}\n        workgroupBarrier();\n    }}\n    s{k} = part[0];\n    workgroupBarrier();\n    }}",
                wg / 2,
                f.merge("part[lid]", "part[lid + w]")
            );
        }
        let write = match self.out {
            Out::Each(_) => self.write(vec4, "lid", wg),
            _ => format!("    if (lid == 0u) {{\n{}    }}\n", self.write(vec4, "", 1)),
        };
        let _ = write!(s, "    if (o < {n_out}u) {{\n{write}    }}\n}}\n");
        Ok((s, groups))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TensorDesc;
    use crate::vulkan::{Operand, compile};
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
        let cx = KernelCx {
            class,
            op,
            name: "s",
            attrs,
            inputs: &inputs,
            outputs: &outputs,
        };
        lower(&cx)
    }

    fn f32s(shape: &[usize]) -> TensorDesc {
        TensorDesc::new(DType::F32, shape)
    }

    fn valid(d: &[Dispatch]) {
        for d in d {
            if let Err(e) = compile(&d.wgsl, &[]) {
                panic!("{}:\n{}\n{e}", d.label, d.wgsl);
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
        assert_eq!(s.base("o"), "(o / 5u) * 60u + (o % 5u)");
        assert_eq!(s.offset("r"), "r * 5u");
        let s = Space::new(&[4, 6], &[0, 1]);
        assert_eq!((s.outputs(), s.count(), s.base("o")), (1, 24, "0u".into()));
        assert!(s.contiguous());
        let s = Space::new(&[4, 6], &[]);
        assert_eq!(
            (s.outputs(), s.count(), s.offset("r")),
            (24, 1, "0u".into())
        );
    }

    fn reduce_attrs(axes: &[i64], keep: i64) -> Attrs {
        Attrs::new()
            .with("axes", AttrValue::Ints(axes.to_vec()))
            .with("keepdims", AttrValue::Int(keep))
    }

    #[test]
    fn every_reduction_compiles_in_both_shapes() {
        for op in crate::reduce::OPS
            .iter()
            .map(|d| d.name)
            .filter(|o| o.starts_with("Reduce"))
        {
            for class in [DeviceClass::Gpu, DeviceClass::Cpu] {
                // Layer norm's mean over the last axis (vec4), a middle axis, everything.
                let cases: [(&[usize], &[i64], &[usize]); 3] = [
                    (&[2, 40, 120], &[2], &[2, 40, 1]),
                    (&[2, 5, 7], &[1], &[2, 7]),
                    (&[3, 64, 64], &[0, 1, 2], &[]),
                ];
                for (shape, axes, out) in cases {
                    let keep = i64::from(out.len() == shape.len());
                    let d = cx_lower(
                        class,
                        op,
                        &reduce_attrs(axes, keep),
                        f32s(shape),
                        f32s(out),
                        0,
                    )
                    .unwrap();
                    valid(&d);
                }
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
        assert!(d[0].label.ends_with("wg256_v4"), "{}", d[0].label);
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
        assert_eq!(d[0].label, "reducemean_80x120_thread");
        assert_eq!(d[0].groups, [2, 1, 1]);
    }

    #[test]
    fn integer_reductions_and_what_has_no_kernel() {
        let i32s = |s: &[usize]| TensorDesc::new(DType::I32, s);
        for op in [
            "ReduceSum",
            "ReduceMax",
            "ReduceMin",
            "ReduceProd",
            "ReduceL1",
        ] {
            let d = cx_lower(
                DeviceClass::Gpu,
                op,
                &reduce_attrs(&[1], 0),
                i32s(&[3, 4]),
                i32s(&[3]),
                0,
            )
            .unwrap();
            valid(&d);
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
        for op in crate::reduce::OPS
            .iter()
            .map(|d| d.name)
            .filter(|o| o.starts_with("Reduce"))
        {
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
        }
    }

    #[test]
    fn any_and_all_of_bools_write_whole_words() {
        let bools = |s: &[usize]| TensorDesc::new(DType::Bool, s);
        for (op, x, axes, y) in [
            ("ReduceMax", &[3, 5][..], &[1][..], &[3][..]),
            ("ReduceMin", &[2, 4, 3], &[0, 2], &[4]),
            ("ReduceMax", &[3, 0], &[1], &[3]),
        ] {
            let d = cx_lower(
                DeviceClass::Cpu,
                op,
                &reduce_attrs(axes, 0),
                bools(x),
                bools(y),
                0,
            )
            .unwrap();
            valid(&d);
            assert_eq!(d[0].bindings.last().unwrap().ty, "u32");
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
            for class in [DeviceClass::Gpu, DeviceClass::Cpu] {
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
                    let d = cx_lower(class, op, &a, f32s(shape), f32s(shape), 0).unwrap();
                    valid(&d);
                }
            }
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
                let d = cx_lower(
                    DeviceClass::Gpu,
                    op,
                    &a,
                    f32s(&[3, 5, 2]),
                    TensorDesc::new(DType::I64, [3, 1, 2]),
                    0,
                )
                .unwrap();
                valid(&d);
                assert_eq!(d[0].bindings[1].ty, "u32");
            }
        }
    }

    #[test]
    fn long_sets_take_a_workgroup_per_output_on_every_device() {
        // lavapipe ends an invocation's loops after 65535 iterations in all: 600000 strided
        // elements (75000 iterations of 8) and planes of 10^6 are folded by workgroups.
        for (shape, axes, out) in [
            (&[600000, 2][..], &[0][..], &[2][..]),
            (&[3, 1000, 1000], &[1, 2], &[3]),
        ] {
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
        let d = cx_lower(
            DeviceClass::Gpu,
            "ArgMax",
            &a,
            f32s(&[2, 300000]),
            i64s(&[2]),
            0,
        );
        valid(&d.unwrap());
        let long = cx_lower(
            DeviceClass::Gpu,
            "ArgMax",
            &a,
            f32s(&[2, 400000]),
            i64s(&[2]),
            0,
        );
        assert!(long.is_err());
    }

    #[test]
    fn more_outputs_than_one_dispatch_row() {
        // 65535 * 64 + 1 outputs: the grid needs a y dimension; the workgroup reduction
        // takes one group per output.
        let n = 65535 * 64 + 1;
        for class in [DeviceClass::Gpu, DeviceClass::Cpu] {
            let d = cx_lower(
                class,
                "ReduceSum",
                &reduce_attrs(&[1], 0),
                f32s(&[n, 2]),
                f32s(&[n]),
                0,
            )
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
}
