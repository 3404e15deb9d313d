//! Post-ops in WGSL: the activations and residual operands the `fuse` pass moved into Conv,
//! ConvTranspose, Gemm and MatMul (canonical form: ops/src/cpu/post.rs).
//!
//! A host kernel declares [`PostOps::bindings`] after its own, then, for each output element
//! it holds in an f32 variable, emits [`PostOps::apply`] before storing it. The operand of a
//! leading `Add` may be the output's own bytes (the plan ran the step in place): `apply` reads
//! it at the element's index right before that element is stored, which is safe.

use super::{Binding, KernelCx, NoKernel, f32_lit};
use crate::cpu::post::{broadcasts, takes_column_blocks};
use crate::elementwise::vulkan::{gelu, swish, unary_expr};
use crate::no_kernel;
use ingot_schema::DType;

#[derive(Clone, Debug, PartialEq)]
enum Step {
    /// A WGSL expression of `pv`.
    Map(String),
    /// `v op r[k]`, r of the output's size, one element, or a block of its trailing dims.
    Binary { op: &'static str, operand: usize, at: Index },
}

/// Where a binary post-op reads its operand for output element `i`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Index {
    /// `r[i]`: the output's shape.
    Element,
    /// `r[0]`: one element.
    Scalar,
    /// `r[i % n]`: a block of the output's trailing dims, repeated over the leading ones (a
    /// bias, an attention mask).
    Tile(usize),
}

/// The post-ops of one step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PostOps {
    steps: Vec<Step>,
    /// First input index of the operands.
    first: usize,
    operands: usize,
    /// The r-slots a kernel's own optional inputs take before the operands'.
    taken: usize,
}

impl PostOps {
    /// Reads the post-ops of `cx`, whose op takes `own` inputs before the operands.
    pub fn new(cx: &KernelCx, own: usize) -> Result<PostOps, NoKernel> {
        let names = cx.attrs.text("post_ops").map_err(|e| no_kernel!("{e}"))?;
        let params = cx.attrs.floats("post_params").map_err(|e| no_kernel!("{e}"))?;
        let mut values = params.iter().map(|&v| v as f32);
        let mut value = || values.next().ok_or_else(|| no_kernel!("post_params too short"));
        let out_len = cx.outputs.first().map_or(0, |o| o.desc.elements());
        let mut post = PostOps { first: own, ..PostOps::default() };
        for name in names.split(',').filter(|n| !n.is_empty()) {
            let step = match name {
                "LeakyRelu" => {
                    Step::Map(format!("select({} * pv, pv, pv >= 0.0)", f32_lit(value()?)))
                }
                "Clip" => {
                    let (lo, hi) = (f32_lit(value()?), f32_lit(value()?));
                    Step::Map(format!("min(max(pv, {lo}), {hi})"))
                }
                "HardSigmoid" => {
                    let (alpha, beta) = (f32_lit(value()?), f32_lit(value()?));
                    Step::Map(format!("clamp({alpha} * pv + {beta}, 0.0, 1.0)"))
                }
                "Swish" => Step::Map(swish("pv", &f32_lit(value()?))),
                "Gelu" => match value()? {
                    0.0 => Step::Map(gelu("pv", false)),
                    1.0 => Step::Map(gelu("pv", true)),
                    other => return Err(no_kernel!("Gelu post-op with parameter {other}")),
                },
                "Add" | "Sub" | "RSub" | "Mul" => {
                    let k = post.operands;
                    let r = cx
                        .inputs
                        .get(own + k)
                        .ok_or_else(|| no_kernel!("post-op operand {k} is missing"))?;
                    if r.desc.dtype != DType::F32 {
                        return Err(cx.dtype(r.desc.dtype));
                    }
                    post.operands += 1;
                    let n = r.desc.elements();
                    let tiles = cx.outputs.first().is_some_and(|o| {
                        takes_column_blocks(cx.op) && broadcasts(&r.desc.shape, &o.desc.shape)
                    });
                    let at = match n {
                        _ if n == out_len => Index::Element,
                        1 => Index::Scalar,
                        _ if tiles => Index::Tile(n),
                        _ => return Err(no_kernel!("a post-op operand of {n} elements")),
                    };
                    Step::Binary {
                        op: match name {
                            "Add" => "+",
                            "Sub" => "-",
                            "RSub" => "r-",
                            _ => "*",
                        },
                        operand: k,
                        at,
                    }
                }
                act => Step::Map(
                    unary_expr(act, "pv").ok_or_else(|| no_kernel!("post-op {act} on Vulkan"))?,
                ),
            };
            post.steps.push(step);
        }
        Ok(post)
    }

    /// The same post-ops with their operands in the r-slots after the first `taken`, which
    /// the kernel binds to optional inputs of its own (a conv's channel scales).
    pub fn after_slots(self, taken: usize) -> PostOps {
        PostOps { taken, ..self }
    }

    /// The operands' bindings, named `r0`, `r1`... (from `r{taken}`).
    pub fn bindings(&self) -> Vec<Binding> {
        (0..self.operands)
            .map(|k| Binding::input(&format!("r{}", self.taken + k), self.first + k, "f32"))
            .collect()
    }

    /// The hook `fn post_op(v: f32, i: u32) -> f32`, which applies every post-op to `v`, the
    /// output element at index `i`, for kernel files that call it before each store. Such a
    /// file declares the optional slots `r0` and `r1` last (read only by this hook, so a
    /// dispatch binds just the [`bindings`](PostOps::bindings) it needs) and their offsets
    /// `p.r0`, `p.r1` in its push-constant block `p`.
    pub fn hook(&self) -> Result<String, NoKernel> {
        self.hook_in(2)
    }

    /// [`hook`](PostOps::hook) for a file that declares `slots` such slots, `r0` to
    /// `r{slots - 1}`.
    pub fn hook_in(&self, slots: usize) -> Result<String, NoKernel> {
        if self.taken + self.operands > slots {
            return Err(no_kernel!("{} post-op operands after {}", self.operands, self.taken));
        }
        let mut s = String::from("fn post_op(v: f32, i: u32) -> f32 {\n    var pv = v;\n");
        for step in &self.steps {
            let expr = match step {
                Step::Map(e) => e.clone(),
                Step::Binary { op, operand, at } => {
                    let operand = self.taken + operand;
                    let at = match at {
                        Index::Element => format!("r{operand}[p.r{operand} + i]"),
                        Index::Scalar => format!("r{operand}[p.r{operand}]"),
                        Index::Tile(n) => format!("r{operand}[p.r{operand} + i % {n}u]"),
                    };
                    match *op {
                        "r-" => format!("{at} - pv"),
                        op => format!("pv {op} {at}"),
                    }
                }
            };
            s.push_str(&format!("    pv = {expr};\n"));
        }
        s.push_str("    return pv;\n}\n");
        Ok(s)
    }
}
