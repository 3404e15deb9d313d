//! Fusion: fewer steps, each doing more of the work while its data is in cache.
//!
//! 1. **Decomposed activations**: exporters write HardSwish as `x * Clip(x + 3, 0, 6) / 6`
//!    (also with `* 1/6`, or as `x * (Clip(x + 3, 0, 6) / 6)`) and `x * HardSigmoid(x)` with
//!    alpha 1/6, beta 1/2, each of which becomes one HardSwish node; and SiLU (YOLOv5/v8,
//!    EfficientNet, LLaMA's MLP) as `x * Sigmoid(x)`, which becomes one Swish node (alpha 1);
//!    and exact GELU (BERT-family encoders) as `x * 0.5 * (1 + Erf(x / √2))` in the orders
//!    PyTorch's `F.gelu` and Hugging Face's `gelu` export, and its tanh approximation (GPT-2's
//!    `gelu_new`, `F.gelu(approximate="tanh")`) as `x * 0.5 * (1 + Tanh(√(2/π) * (x +
//!    0.044715 * x³)))`, each of which becomes one Gelu node.
//! 2. **Affine folding**: a per-channel affine map after a Conv, ConvTranspose or Gemm with
//!    constant weights (BatchNormalization, or Mul, Add, Sub or Div by a constant holding one
//!    value per output channel, or one value) is folded into the weights and bias
//!    ([`folded_weights`]), in f64 and rounded once to f32. A Conv that reads 8-bit W takes
//!    the map into W's table instead: its scales and bias ([`folded_table`]).
//! 3. **Post-ops** (canonical form in `ops/src/cpu/post.rs`): after a Conv, ConvTranspose,
//!    Gemm or MatMul, an activation (Relu, LeakyRelu, Clip, Sigmoid, HardSigmoid, HardSwish,
//!    Tanh, Swish, Gelu) or an Add, Sub or Mul whose other operand has the output's shape (a
//!    residual), holds one value, or (MatMul, Gemm) is a block of the output's trailing dims
//!    (a bias, an attention mask), or a Div by a one-element constant (a Mul by its
//!    reciprocal), is appended to the op's post-ops, chains included: a transformer's MatMul,
//!    bias and GELU become one step, and so do its scores, their scale and their mask.
//!
//! A node absorbs its consumer only if it is the only reader of its output, which is not a
//! graph output (a use count of one says both). The fused node takes the consumer's place in
//! the order and its output value: everything it reads is computed by then. Everything works
//! on f32 outputs only, and post-ops on the f16 outputs of ops that compute in f32 (`widen_f16`
//! then widens the fused step whole: the post-ops run in f32 before the one rounding).

use super::PassError;
use super::patterns::{Patterns, near, scalar};
use crate::ir::{Const, Graph, Node, ValueId};
use ingot_ops::Constant as _;
use ingot_ops::cpu::post::{HOSTS, broadcasts, takes_column_blocks};
use ingot_ops::{Tensor, TensorDesc};
use ingot_schema::{AttrValue, Attrs, DType};
use std::sync::Arc;

pub fn run(g: &mut Graph) -> Result<(), PassError> {
    whole_activations(g);
    // The rewritten patterns leave their inner nodes unread: drop them so that use counts
    // are exact for what follows.
    super::dce::run(g)?;
    Fuser::new(g).run();
    Ok(())
}

/// The parameters an activation passes to `post_params`, from its canonical attributes, in the
/// order `ops/src/cpu/post.rs` reads them.
const ACTIVATION_ATTRS: &[(&str, &[&str])] = &[
    ("Relu", &[]),
    ("LeakyRelu", &["alpha"]),
    ("Clip", &["min", "max"]),
    ("Sigmoid", &[]),
    ("HardSigmoid", &["alpha", "beta"]),
    ("HardSwish", &[]),
    ("Tanh", &[]),
    ("Swish", &["alpha"]),
    // Its form as a number: 0 exact, 1 the tanh approximation.
    ("Gelu", &["approximate"]),
];

/// The post-op parameters of activation node `n` (one of [`ACTIVATION_ATTRS`]).
fn activation_params(n: &Node, attrs: &[&str]) -> Option<Vec<f64>> {
    if n.op == "Gelu" {
        return Some(vec![f64::from(u8::from(n.attrs.text("approximate").ok()? == "tanh"))]);
    }
    attrs.iter().map(|a| n.attrs.float(a).ok().map(f64::from)).collect()
}

fn is_f32(g: &Graph, v: ValueId) -> bool {
    g.ty(v).is_some_and(|t| t.dtype == DType::F32)
}

// ---- 1. Decomposed activations ----

impl Patterns<'_> {
    /// `v / 6` or `v * (1/6)` as node `n`: returns v.
    fn sixth(&self, n: &Node) -> Option<ValueId> {
        let pairs = Self::pairs(n)?;
        match n.op.as_str() {
            "Div" => (scalar(self.g, pairs[0].1)? == 6.0).then_some(pairs[0].0),
            "Mul" => pairs
                .into_iter()
                .find(|&(_, k)| scalar(self.g, k).is_some_and(|k| near(k, 1.0 / 6.0)))
                .map(|(v, _)| v),
            _ => None,
        }
    }

    /// The x of `r = Clip(x + 3, 0, 6)`, with r and x + 3 read once.
    fn relu6_of_plus_3(&self, r: ValueId) -> Option<ValueId> {
        let clip = self.only_use(r, "Clip")?;
        let bounds = (clip.attrs.float("min").ok()?, clip.attrs.float("max").ok()?);
        let &[Some(sum)] = &clip.inputs[..] else {
            return None;
        };
        let add = self.only_use(sum, "Add")?;
        let x = Self::pairs(add)?.into_iter().find(|&(_, k)| scalar(self.g, k) == Some(3.0))?.0;
        (bounds == (0.0, 6.0)).then_some(x)
    }

    /// The x of `h = HardSigmoid(x)` with alpha 1/6 and beta 1/2, or of
    /// `h = Clip(x + 3, 0, 6) / 6`, with h read once.
    fn hard_sigmoid_of(&self, h: ValueId) -> Option<ValueId> {
        if let Some(n) = self.only_use(h, "HardSigmoid") {
            let (alpha, beta) = (n.attrs.float("alpha").ok()?, n.attrs.float("beta").ok()?);
            let x = n.inputs.first().copied().flatten()?;
            return (near(alpha.into(), 1.0 / 6.0) && beta == 0.5).then_some(x);
        }
        let n = self.only_use(h, "Div").or_else(|| self.only_use(h, "Mul"))?;
        self.relu6_of_plus_3(self.sixth(n)?)
    }

    /// The x if node `n` computes HardSwish(x) in pieces, its output of x's type.
    fn hard_swish_input(&self, n: &Node) -> Option<ValueId> {
        let [out] = n.outputs[..] else { return None };
        // (x * Clip(x + 3, 0, 6)) / 6
        let product = self.sixth(n).and_then(|m| self.only_use(m, "Mul"));
        let x = product
            .and_then(Self::pairs)
            .and_then(|pairs| pairs.into_iter().find(|&(x, r)| self.relu6_of_plus_3(r) == Some(x)))
            // x * HardSigmoid(x)
            .or_else(|| {
                (n.op == "Mul").then_some(())?;
                Self::pairs(n)?.into_iter().find(|&(x, h)| self.hard_sigmoid_of(h) == Some(x))
            })?
            .0;
        self.same_float(x, out)
    }

    /// The x if node `n` is `x * Sigmoid(x)` (SiLU), the sigmoid read once.
    fn silu_input(&self, n: &Node) -> Option<ValueId> {
        let [out] = n.outputs[..] else { return None };
        (n.op == "Mul").then_some(())?;
        let is_sigmoid_of = |s: ValueId, x: ValueId| {
            let sigmoid = self.only_use(s, "Sigmoid")?;
            (sigmoid.inputs[..] == [Some(x)]).then_some(())
        };
        let (x, _) = Self::pairs(n)?.into_iter().find(|&(x, s)| is_sigmoid_of(s, x).is_some())?;
        self.same_float(x, out)
    }

    /// `v` if node `n` is `v * 0.5`.
    fn half_of(&self, n: &Node) -> Option<ValueId> {
        (n.op == "Mul").then_some(())?;
        Self::pairs(n)?.into_iter().find(|&(_, k)| scalar(self.g, k) == Some(0.5)).map(|(v, _)| v)
    }

    /// The x of GELU's `e` and its form: `1 + Erf(x / √2)` (or `x * (1/√2)` inside), exact
    /// GELU, or `1 + Tanh(√(2/π) * (x + 0.044715 * x³))`, its tanh approximation; e and its
    /// inner values read once.
    fn gelu_term_of(&self, e: ValueId) -> Option<(ValueId, &'static str)> {
        let add = self.only_use(e, "Add")?;
        let (inner, _) =
            Self::pairs(add)?.into_iter().find(|&(_, k)| scalar(self.g, k) == Some(1.0))?;
        let by = |k: f64| {
            move |&(_, c): &(ValueId, ValueId)| scalar(self.g, c).is_some_and(|c| near(c, k))
        };
        if let Some(erf) = self.only_use(inner, "Erf") {
            let &[Some(scaled)] = &erf.inputs[..] else {
                return None;
            };
            let n = self.only_use(scaled, "Div").or_else(|| self.only_use(scaled, "Mul"))?;
            let pairs = Self::pairs(n)?;
            let x = match n.op.as_str() {
                "Div" => Some(pairs[0]).filter(by(std::f64::consts::SQRT_2)),
                _ => pairs.into_iter().find(by(std::f64::consts::FRAC_1_SQRT_2)),
            }?;
            return Some((x.0, "none"));
        }
        let &[Some(t)] = &self.only_use(inner, "Tanh")?.inputs[..] else {
            return None;
        };
        let scaled = self.only_use(t, "Mul")?;
        let (u, _) =
            Self::pairs(scaled)?.into_iter().find(by((2.0 / std::f64::consts::PI).sqrt()))?;
        Self::pairs(self.only_use(u, "Add")?)?.into_iter().find_map(|(x, m)| {
            let (cube, _) =
                Self::pairs(self.only_use(m, "Mul")?)?.into_iter().find(by(0.044715))?;
            (self.cube_of(cube)? == x).then_some((x, "tanh"))
        })
    }

    /// The x of `c = x³` written `Pow(x, 3)`, `x * (x * x)` or `(x * x) * x`, read once.
    fn cube_of(&self, c: ValueId) -> Option<ValueId> {
        if let Some(pow) = self.only_use(c, "Pow") {
            let [Some(x), Some(k)] = pow.inputs[..] else {
                return None;
            };
            return (scalar(self.g, k) == Some(3.0)).then_some(x);
        }
        Self::pairs(self.only_use(c, "Mul")?)?.into_iter().find_map(|(x, square)| {
            (self.only_use(square, "Mul")?.inputs[..] == [Some(x), Some(x)]).then_some(x)
        })
    }

    /// The x and form if node `n` computes GELU in pieces: `(x * e) * 0.5`, `(x * 0.5) * e`
    /// or `x * (e * 0.5)` with e as [`Self::gelu_term_of`] finds it, each inner value read
    /// once.
    fn gelu_input(&self, n: &Node) -> Option<(ValueId, &'static str)> {
        let [out] = n.outputs[..] else { return None };
        (n.op == "Mul").then_some(())?;
        let term_of = |x: ValueId, e: ValueId| self.gelu_term_of(e).filter(|&(of, _)| of == x);
        let halved = |v: ValueId| self.only_use(v, "Mul").and_then(|m| self.half_of(m));
        let (x, form) =
            (self.half_of(n).and_then(|p| self.only_use(p, "Mul")).and_then(Self::pairs))
                .and_then(|pairs| pairs.into_iter().find_map(|(x, e)| term_of(x, e)))
                .or_else(|| {
                    Self::pairs(n)?.into_iter().find_map(|(a, b)| {
                        halved(a).and_then(|x| term_of(x, b)).or_else(|| term_of(a, halved(b)?))
                    })
                })?;
        Some((self.same_float(x, out)?, form))
    }
}

/// Rewrites each decomposed HardSwish, SiLU and GELU into one node, leaving its inner nodes
/// unread.
fn whole_activations(g: &mut Graph) {
    let found: Vec<(usize, &str, Attrs, ValueId)> = {
        let g: &Graph = g;
        let p = Patterns::new(g);
        let silu = || Attrs::new().with("alpha", AttrValue::Float(1.0));
        let gelu = |form: &str| Attrs::new().with("approximate", AttrValue::Text(form.into()));
        (g.nodes.iter().enumerate())
            .filter_map(|(i, n)| {
                let (op, attrs, x) = if let Some(x) = p.hard_swish_input(n) {
                    ("HardSwish", Attrs::new(), x)
                } else if let Some(x) = p.silu_input(n) {
                    ("Swish", silu(), x)
                } else {
                    let (x, form) = p.gelu_input(n)?;
                    ("Gelu", gelu(form), x)
                };
                Some((i, op, attrs, x))
            })
            .collect()
    };
    for (i, op, attrs, x) in found {
        let n = &mut g.nodes[i];
        n.op = op.into();
        n.inputs = vec![Some(x)];
        n.attrs = attrs;
    }
}

// ---- 2. and 3. ----

struct Fuser<'g> {
    g: &'g mut Graph,
    uses: Vec<usize>,
    producers: Vec<Option<usize>>,
    /// Nodes absorbed by a later one, removed at the end.
    dead: Vec<bool>,
}

impl<'g> Fuser<'g> {
    fn new(g: &'g mut Graph) -> Self {
        Fuser {
            uses: g.use_counts(),
            producers: g.producers(),
            dead: vec![false; g.nodes.len()],
            g,
        }
    }

    /// Visits every node in order as a consumer its producer may absorb; a fused node stays
    /// open to the next consumer, so chains fuse one link at a time.
    fn run(mut self) {
        for i in 0..self.g.nodes.len() {
            let _ = self.fold_affine(i).or_else(|| self.fuse_post_op(i));
        }
        let mut dead = self.dead.iter();
        self.g.nodes.retain(|_| !dead.next().copied().unwrap_or(false));
    }

    /// The producer of `y` if it may absorb y's one reader: an op taking post-ops, with an f32
    /// output read once (so not a graph output), and canonical post-op attributes.
    fn host(&self, y: ValueId) -> Option<usize> {
        let p = self.producers[y]?;
        let n = &self.g.nodes[p];
        let host = HOSTS.iter().any(|(op, _)| *op == n.op);
        // A float16 host whose CPU kernel computes in f32 is widened whole later
        // (`widen_f16`): its post-ops then run in f32 too, before the one rounding to f16.
        let float = is_f32(self.g, y) || super::widen_f16::widens(self.g, n);
        let ok = host && self.uses[y] == 1 && float && n.attrs.text("post_ops").is_ok();
        ok.then_some(p)
    }

    /// Moves node `p` to position `c`, in place of the consumer it absorbs, whose outputs it
    /// takes over; `edit` then changes its inputs and attributes.
    fn absorb(&mut self, p: usize, c: usize, edit: impl FnOnce(&mut Graph, &mut Node)) {
        let mut node = std::mem::replace(&mut self.g.nodes[p], tombstone());
        self.dead[p] = true;
        for &y in &node.outputs {
            self.uses[y] = 0;
            self.producers[y] = None;
        }
        node.outputs = std::mem::take(&mut self.g.nodes[c].outputs);
        edit(self.g, &mut node);
        self.g.nodes[c] = node;
        let n = self.g.values.len();
        self.uses.resize(n, 0);
        self.producers.resize(n, None);
    }

    /// Folds node `c`, a per-channel affine map of a Conv, ConvTranspose or Gemm output with
    /// no post-ops yet, into that producer's weights and bias.
    fn fold_affine(&mut self, c: usize) -> Option<()> {
        let g = &*self.g;
        let node = &g.nodes[c];
        let [out] = node.outputs[..] else { return None };
        let (y, s, t) = (node.inputs.iter().flatten().copied())
            .filter(|&y| self.host(y).is_some())
            .find_map(|y| affine(g, node, y).map(|(s, t)| (y, s, t)))?;
        // A zero divisor or variance would turn whole weights into inf or NaN.
        if !s.iter().chain(&t).all(|v| v.is_finite()) {
            return None;
        }
        let p = self.host(y)?;
        let producer = &g.nodes[p];
        if g.ty(out) != g.ty(y) || !producer.attrs.text("post_ops").ok()?.is_empty() {
            return None;
        }
        let name = g.values[out].name.clone();
        if ingot_ops::dequantizes_w(&producer.attrs) {
            let table = folded_table(g, producer, &s, &t)?;
            self.absorb(p, c, |g, n| {
                let table = g.add_constant(format!("{name}:dequantization"), Const::owned(table));
                n.inputs[2] = Some(table);
            });
            return Some(());
        }
        let (w, b, layout) = weights(g, producer, y)?;
        let (w, b) = folded_weights(&w, layout, &b, &s, &t)?;
        self.absorb(p, c, |g, n| {
            let w = g.add_constant(format!("{name}:weight"), Const::owned(w));
            let b = g.add_constant(format!("{name}:bias"), Const::owned(b));
            n.inputs.truncate(2);
            n.inputs[1] = Some(w);
            n.inputs.push(Some(b));
            if n.op == "Gemm" {
                n.attrs.set("beta", AttrValue::Float(1.0));
            }
        });
        Some(())
    }

    /// Appends node `c` (an activation, or a sum, difference or product with a residual or
    /// a one-element constant) to its producer's post-ops.
    fn fuse_post_op(&mut self, c: usize) -> Option<()> {
        let g = &*self.g;
        let node = &g.nodes[c];
        let [out] = node.outputs[..] else { return None };
        // A division by a constant is a product with its reciprocal (attention's scores /
        // √d): a one-element operand made here.
        let mut reciprocal = None;
        let (y, name, params, operand) = match (node.op.as_str(), &node.inputs[..]) {
            (op, &[Some(y)]) => {
                let (_, attrs) = ACTIVATION_ATTRS.iter().find(|(a, _)| *a == op)?;
                (y, op.to_string(), activation_params(node, attrs)?, None)
            }
            ("Div", &[Some(y), Some(k)]) => {
                let k = scalar(g, k).filter(|k| k.is_finite() && *k != 0.0)?;
                reciprocal = Some((1.0 / k) as f32);
                (y, "Mul".to_string(), Vec::new(), None)
            }
            (op @ ("Add" | "Sub" | "Mul"), &[Some(a), Some(b)]) => {
                // Prefer the operand computed last as the one fused into: the other is then
                // more likely to die here and be written over.
                let mut candidates = [(a, b, false), (b, a, true)];
                candidates.sort_by_key(|&(y, _, _)| std::cmp::Reverse(self.producers[y]));
                // A residual of y's shape, one value, or (MatMul, Gemm) a block of y's
                // trailing dims: a bias, an attention mask.
                let (y, r, swapped) = candidates.into_iter().find(|&(y, r, _)| {
                    let Some(p) = self.host(y) else { return false };
                    let columns = takes_column_blocks(&g.nodes[p].op);
                    let fits = |(r, y): (&TensorDesc, &TensorDesc)| {
                        r.shape == y.shape
                            || r.elements() == 1
                            || (columns && broadcasts(&r.shape, &y.shape))
                    };
                    let same_type = g.ty(r).zip(g.ty(y)).is_some_and(|(r, y)| r.dtype == y.dtype);
                    y != r && same_type && g.ty(r).zip(g.ty(y)).is_some_and(fits)
                })?;
                let name = match (op, swapped) {
                    ("Sub", true) => "RSub",
                    (op, _) => op,
                };
                (y, name.to_string(), Vec::new(), Some(r))
            }
            _ => return None,
        };
        let p = self.host(y)?;
        if g.ty(out) != g.ty(y) {
            return None;
        }
        // With post-op operands the op has all its own inputs: a missing bias or C is zero.
        let producer = &g.nodes[p];
        let own = HOSTS.iter().find(|(op, _)| *op == producer.op)?.1;
        let operands = operand.is_some() || reciprocal.is_some();
        let zero_bias = (operands && producer.inputs.len() < own).then(|| {
            let m = g.ty(y).and_then(|t| t.shape.get(1).copied()).unwrap_or(0);
            (format!("{}:bias", g.values[y].name), m)
        });
        self.absorb(p, c, |g, n| {
            if let Some((bias_name, m)) = zero_bias {
                let zeros = Tensor::zeros(TensorDesc::new(DType::F32, vec![m]));
                n.inputs.push(Some(g.add_constant(bias_name, Const::owned(zeros))));
            }
            let made = reciprocal.and_then(|k| {
                let k = Tensor::from_vec(Vec::new(), &[k]).ok()?;
                Some(g.add_constant(format!("{}:reciprocal", g.values[out].name), Const::owned(k)))
            });
            n.inputs.extend(operand.or(made).map(Some));
            let ops = match n.attrs.text("post_ops") {
                Ok("") | Err(_) => name,
                Ok(ops) => format!("{ops},{name}"),
            };
            let mut all = n.attrs.floats("post_params").map_or(Vec::new(), <[f64]>::to_vec);
            all.extend(params);
            n.attrs.set("post_ops", AttrValue::Text(ops));
            n.attrs.set("post_params", AttrValue::Floats(all));
        });
        Some(())
    }
}

fn tombstone() -> Node {
    Node {
        name: String::new(),
        op: String::new(),
        domain: String::new(),
        inputs: Vec::new(),
        outputs: Vec::new(),
        attrs: Attrs::new(),
    }
}

/// The per-channel map `y -> y * s + t` that node `n` applies to its input `y` (channels on
/// axis 1 of y), if its other operands are constants that allow it.
fn affine(g: &Graph, n: &Node, y: ValueId) -> Option<(Vec<f64>, Vec<f64>)> {
    let shape = &g.ty(y)?.shape;
    let m = *shape.get(1)?;
    let channel = |v: Option<ValueId>| per_channel(g, v?, shape);
    let ones = vec![1.0; m];
    let zeros = vec![0.0; m];
    let ins: Vec<ValueId> = n.inputs.iter().flatten().copied().collect();
    let other = ins.iter().copied().find(|&v| v != y);
    match (n.op.as_str(), &ins[..]) {
        ("BatchNormalization", &[x, scale, bias, mean, var]) if x == y => {
            let eps = f64::from(n.attrs.float("epsilon").ok()?);
            let [scale, bias, mean, var] = [scale, bias, mean, var].map(|v| vector(g, v, m));
            let (scale, bias, mean, var) = (scale?, bias?, mean?, var?);
            let s: Vec<f64> = scale.iter().zip(&var).map(|(k, v)| k / (v + eps).sqrt()).collect();
            let t = bias.iter().zip(&mean).zip(&s).map(|((b, mu), s)| b - mu * s).collect();
            Some((s, t))
        }
        ("Mul", &[a, b]) if a != b => Some((channel(other)?, zeros)),
        ("Add", &[a, b]) if a != b => Some((ones, channel(other)?)),
        ("Sub", &[a, _]) if a == y => Some((ones, channel(other)?.iter().map(|k| -k).collect())),
        ("Div", &[a, _]) if a == y => {
            Some((channel(other)?.iter().map(|k| 1.0 / k).collect(), zeros))
        }
        _ => None,
    }
}

/// An f32 constant of `m` values.
fn vector(g: &Graph, v: ValueId, m: usize) -> Option<Vec<f64>> {
    let c = g.constant(v)?;
    let values = c.to_f64s()?;
    (c.desc().dtype == DType::F32 && values.len() == m).then_some(values)
}

/// A float constant `k` as one value per channel (axis 1) of a tensor of shape `out`, if it
/// broadcasts to `out` with no extent on other axes (one value, or [M], [M, 1, 1], ...).
fn per_channel(g: &Graph, k: ValueId, out: &[usize]) -> Option<Vec<f64>> {
    let c = g.constant(k)?;
    let shape = &c.desc().shape;
    let lead = out.len().checked_sub(shape.len())?;
    let m = *out.get(1)?;
    let fits = shape.iter().enumerate().all(|(d, &e)| e == 1 || (d + lead == 1 && e == m));
    let values = c.to_f64s()?;
    match values[..] {
        _ if !fits || c.desc().dtype != DType::F32 => None,
        [v] => Some(vec![v; m]),
        _ => (values.len() == m).then_some(values),
    }
}

/// Where output channel `o` sits in a weight tensor viewed as [outer, channels, inner]: at
/// `(a, j)` with `o = (a / per_group) * channels + j`.
#[derive(Clone, Copy, Debug)]
struct Layout {
    outer: usize,
    per_group: usize,
    channels: usize,
    inner: usize,
}

/// The weights, the per-channel bias (zeros when absent; Gemm's `beta * C`) and the layout of
/// the weights of producer `n` of `y`, if they are f32 constants.
fn weights(g: &Graph, n: &Node, y: ValueId) -> Option<(Arc<Tensor>, Vec<f64>, Layout)> {
    let ins: Vec<ValueId> = n.inputs.iter().flatten().copied().collect();
    let w_id = *ins.get(1)?;
    let w = g.constant(w_id)?.tensor();
    let dims = &w.desc().shape;
    let out = &g.ty(y)?.shape;
    let m = *out.get(1)?;
    let (layout, bias) = match n.op.as_str() {
        "Conv" => {
            let inner = dims.iter().skip(1).product();
            let layout = Layout { outer: 1, per_group: 1, channels: m, inner };
            (layout, ins.get(2).map(|&b| vector(g, b, m)))
        }
        "ConvTranspose" => {
            let group = usize::try_from(n.attrs.int("group").ok()?).ok()?;
            let c = *dims.first()?;
            let (per_group, channels) = (c.checked_div(group)?, m.checked_div(group)?);
            let inner = dims.iter().skip(2).product();
            let layout = Layout { outer: c, per_group, channels, inner };
            (layout, ins.get(2).map(|&b| vector(g, b, m)))
        }
        "Gemm" => {
            let (k, trans_b) = (*dims.first()?, n.attrs.int("transB").ok()? != 0);
            let layout = match trans_b {
                false => Layout { outer: k, per_group: k, channels: m, inner: 1 },
                true => Layout { outer: 1, per_group: 1, channels: m, inner: *dims.get(1)? },
            };
            let beta = f64::from(n.attrs.float("beta").ok()?);
            let c = ins.get(2).map(|&c| per_channel(g, c, out));
            (layout, c.map(|c| Some(c?.iter().map(|v| v * beta).collect())))
        }
        _ => return None,
    };
    let bias = match bias {
        None => vec![0.0; m],
        Some(b) => b?,
    };
    let fits = layout.outer * layout.channels * layout.inner == w.desc().elements()
        && layout.outer / layout.per_group.max(1) * layout.channels == m;
    (fits && w.dtype() == DType::F32).then_some((w, bias, layout))
}

/// The weights and bias of a producer followed by `y -> y * s + t` per output channel:
/// `W' = W * s` along the output channel, `B' = B * s + t`, computed in f64 and rounded once.
/// (A later weight bank makes this a lazy recipe over W, B, s and t.)
fn folded_weights(
    w: &Tensor,
    layout: Layout,
    b: &[f64],
    s: &[f64],
    t: &[f64],
) -> Option<(Tensor, Tensor)> {
    let Layout { per_group, channels, inner, .. } = layout;
    let mut folded = Tensor::zeros(w.desc().clone());
    let mut view = folded.view_mut();
    let (src, dst) = (w.as_slice::<f32>().ok()?, view.as_slice_mut::<f32>().ok()?);
    let step = inner.max(1);
    for (i, (from, to)) in src.chunks(step).zip(dst.chunks_mut(step)).enumerate() {
        let (a, j) = (i.checked_div(channels)?, i % channels);
        let k = *s.get(a.checked_div(per_group)? * channels + j)?;
        for (v, out) in from.iter().zip(to) {
            *out = (f64::from(*v) * k) as f32;
        }
    }
    let bias: Vec<f32> = (b.iter().zip(s).zip(t)).map(|((b, s), t)| (b * s + t) as f32).collect();
    Some((folded, Tensor::from_vec(vec![bias.len()], &bias).ok()?))
}

/// W's table (`ingot_ops::weight_table_shape`) of a Conv that reads 8-bit W, followed by
/// `y -> y * s + t` per output channel: each channel's scale times s, its bias times s plus t,
/// in f64 and rounded once; the zero points stay.
fn folded_table(g: &Graph, n: &Node, s: &[f64], t: &[f64]) -> Option<Tensor> {
    let table = g.constant(n.inputs.get(2).copied()??)?.to_f64s()?;
    let m = s.len();
    if table.len() != 3 * m || t.len() != m {
        return None;
    }
    let (scales, zeros, bias) = (&table[..m], &table[m..2 * m], &table[2 * m..]);
    let values: Vec<f32> = (scales.iter().zip(s).map(|(k, s)| k * s))
        .chain(zeros.iter().copied())
        .chain(bias.iter().zip(s).zip(t).map(|((b, s), t)| b * s + t))
        .map(|v| v as f32)
        .collect();
    Tensor::from_vec(ingot_ops::weight_table_shape(m).to_vec(), &values).ok()
}

#[cfg(test)]
mod tests;
