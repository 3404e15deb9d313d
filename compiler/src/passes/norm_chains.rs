//! Normalizations written out. Exporters that predate LayerNormalization (TorchScript below
//! opset 17, tf2onnx) and models that write their own RMSNorm (LLaMA, T5, Gemma) spell a
//! normalization over the last axes as
//!
//! ```text
//! d = x - ReduceMean(x)                       RMS: d = x
//! y = d / Sqrt(ReduceMean(d²) + ε)            or d * Reciprocal(Sqrt(..)), d * (1 / Sqrt(..))
//! z = y * γ + β                               γ and β optional, operands in either order
//! ```
//!
//! with d² as `Pow(d, 2)` or `d * d` and both means over the same trailing axes, dims kept.
//! Each chain becomes one LayerNormalization (RMSNormalization: γ only) node over those axes,
//! γ and β folded in when they are constants that broadcast over the normalized dims (γ of
//! ones when there is none): one pass over each row instead of up to nine steps and their
//! intermediate tensors. Only f32 chains whose inner values nothing else reads are rewritten;
//! the inner nodes are left unread for dce.

use super::PassError;
use super::patterns::{Patterns, scalar};
use crate::ir::{Const, Graph, Node, ValueId};
use ingot_ops::{Tensor, TensorDesc};
use ingot_schema::{AttrValue, Attrs, DType};

pub fn run(g: &mut Graph) -> Result<(), PassError> {
    let found: Vec<(usize, Norm)> = {
        let p = Patterns::new(g);
        let readers = readers(g);
        let mut taken = vec![false; g.nodes.len()];
        let mut found = Vec::new();
        for (i, n) in g.nodes.iter().enumerate() {
            if taken[i] {
                continue;
            }
            if let Some((root, norm)) =
                p.normalization(n).map(|core| p.with_affine(i, core, &readers))
            {
                // The affine map's nodes come later: they are this chain's, not another's.
                taken[root] = true;
                found.push((root, norm));
            }
        }
        found
    };
    for (root, norm) in found {
        rewrite(g, root, norm)?;
    }
    super::dce::run(g)
}

/// A normalization found in pieces.
struct Norm {
    /// The centred form (LayerNormalization), or RMSNormalization.
    centred: bool,
    x: ValueId,
    axis: usize,
    epsilon: f64,
    /// γ and β, constants broadcasting over the normalized dims.
    scale: Option<ValueId>,
    bias: Option<ValueId>,
}

/// For each value, the nodes that read it.
fn readers(g: &Graph) -> Vec<Vec<usize>> {
    let mut r = vec![Vec::new(); g.values.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        for v in n.present_inputs() {
            r[v].push(i);
        }
    }
    r
}

impl Patterns<'_> {
    /// The normalization node `n` ends (without γ and β), its inner values read only inside.
    fn normalization(&self, n: &Node) -> Option<Norm> {
        let [out] = n.outputs[..] else { return None };
        // y = d / s or d * r, r = 1 / s, s = Sqrt(v).
        let (d, root) = match n.op.as_str() {
            "Div" => match n.inputs[..] {
                [Some(d), Some(s)] => (d, s),
                _ => return None,
            },
            "Mul" => {
                Self::pairs(n)?.into_iter().find_map(|(d, r)| Some((d, self.reciprocal(r)?)))?
            }
            _ => return None,
        };
        let &[Some(v)] = &self.only_use(root, "Sqrt")?.inputs[..] else { return None };
        let (mean_square, eps) = Self::pairs(self.only_use(v, "Add")?)?
            .into_iter()
            .find_map(|(m, e)| Some((m, scalar(self.g, e).filter(|e| *e >= 0.0)?)))?;
        let (square, axes) = self.mean(mean_square)?;
        // d² read once; d read by it (once or twice) and by n.
        let square = &self.g.nodes[self.producers[square].filter(|_| self.uses[square] == 1)?];
        let d_reads = match (square.op.as_str(), &square.inputs[..]) {
            ("Pow", &[Some(b), Some(k)]) if b == d && scalar(self.g, k) == Some(2.0) => 2,
            ("Mul", &[Some(a), Some(b)]) if a == d && b == d => 3,
            _ => return None,
        };
        let n_reads_d = n.present_inputs().filter(|&i| i == d).count();
        if n_reads_d != 1 {
            return None;
        }
        // d = x - ReduceMean(x) over the same axes, read only here: LayerNormalization.
        let centred = (self.uses[d] == d_reads)
            .then(|| self.produced_by(d, "Sub"))
            .flatten()
            .and_then(|sub| match sub.inputs[..] {
                [Some(x), Some(m)] => {
                    let (of, mean_axes) = self.mean(m)?;
                    (of == x && mean_axes == axes).then_some(x)
                }
                _ => None,
            });
        let x = centred.unwrap_or(d);
        let desc = self.g.ty(x)?;
        let rank = desc.shape.len();
        // The axes must be the trailing ones, as the normalization ops take them.
        let axis = rank.checked_sub(axes.len()).filter(|_| !axes.is_empty())?;
        let trailing = axes.iter().enumerate().all(|(k, &a)| a == (axis + k) as i64);
        let f32_like = desc.dtype == DType::F32 && self.same_float(x, out).is_some();
        (trailing && f32_like).then_some(Norm {
            centred: centred.is_some(),
            x,
            axis,
            epsilon: eps,
            scale: None,
            bias: None,
        })
    }

    /// The s of `r = Reciprocal(s)` or `r = 1 / s`, r read once.
    fn reciprocal(&self, r: ValueId) -> Option<ValueId> {
        if let Some(n) = self.only_use(r, "Reciprocal") {
            return n.inputs.first().copied().flatten();
        }
        match self.only_use(r, "Div")?.inputs[..] {
            [Some(one), Some(s)] if scalar(self.g, one) == Some(1.0) => Some(s),
            _ => None,
        }
    }

    /// The input and axes of `m = ReduceMean(input)` with kept dims, m read once.
    fn mean(&self, m: ValueId) -> Option<(ValueId, &[i64])> {
        let n = self.only_use(m, "ReduceMean")?;
        let keeps = n.attrs.int("keepdims").ok()? == 1;
        let input = n.inputs.first().copied().flatten()?;
        keeps.then_some((input, n.attrs.ints("axes").ok()?))
    }

    /// Extends the normalization ending at node `i` by a following `* γ` and then `+ β`
    /// (centred only), each a constant of the normalized dims: the node ending the whole
    /// chain, and the normalization.
    fn with_affine(&self, i: usize, mut norm: Norm, readers: &[Vec<usize>]) -> (usize, Norm) {
        let next = |end: usize, op: &str| -> Option<(usize, ValueId)> {
            let y = *self.g.nodes[end].outputs.first()?;
            let &[c] = &readers[y][..] else { return None };
            let consumer = &self.g.nodes[c];
            let [out] = consumer.outputs[..] else { return None };
            let ok = consumer.op == op && self.uses[y] == 1 && self.g.ty(out) == self.g.ty(y);
            let (_, k) = Self::pairs(consumer)?.into_iter().find(|&(v, _)| v == y)?;
            let fits = self.g.constant(k).is_some_and(|k| self.fits(k, norm.x, norm.axis));
            (ok && fits && k != y).then_some((c, k))
        };
        let mut end = i;
        if let Some((c, k)) = next(end, "Mul") {
            (end, norm.scale) = (c, Some(k));
        }
        if norm.centred
            && let Some((c, k)) = next(end, "Add")
        {
            (end, norm.bias) = (c, Some(k));
        }
        (end, norm)
    }

    /// Whether constant `k`, its leading ones dropped, broadcasts over x's dims from `axis`.
    fn fits(&self, k: &Const, x: ValueId, axis: usize) -> bool {
        let Some(x) = self.g.ty(x) else { return false };
        let normalized = &x.shape[axis..];
        let shape = trimmed(&k.desc().shape);
        k.desc().dtype == DType::F32
            && shape.len() <= normalized.len()
            && shape.iter().rev().zip(normalized.iter().rev()).all(|(&d, &n)| d == 1 || d == n)
    }
}

/// A shape without its leading ones.
fn trimmed(shape: &[usize]) -> &[usize] {
    let ones = shape.iter().take_while(|&&d| d == 1).count();
    &shape[ones..]
}

/// Node `root` becomes the normalization `norm`, keeping its outputs.
fn rewrite(g: &mut Graph, root: usize, norm: Norm) -> Result<(), PassError> {
    let name = g.values[g.nodes[root].outputs[0]].name.clone();
    let normalized = g.ty(norm.x).map(|t| t.shape[norm.axis..].to_vec()).unwrap_or_default();
    // γ and β as the ops take them: no more dims than the normalized ones.
    let mut param = |v: Option<ValueId>, fill: f32, what: &str| {
        let t = match v.and_then(|v| g.constant(v)) {
            Some(k) if trimmed(&k.desc().shape).len() == k.desc().shape.len() => return Ok(v),
            Some(k) => {
                let desc = TensorDesc::new(DType::F32, trimmed(&k.desc().shape));
                Tensor::from_bytes(desc, k.bytes())
            }
            None => Tensor::from_vec(normalized.clone(), &vec![fill; normalized.iter().product()]),
        };
        let t = t.map_err(|e| PassError::Graph(format!("{name}: normalization {what}: {e}")))?;
        Ok(Some(g.add_constant(format!("{name}:{what}"), Const::owned(t))))
    };
    let scale = param(norm.scale, 1.0, "scale")?;
    let bias = match norm.bias {
        Some(b) => param(Some(b), 0.0, "bias")?,
        None => None,
    };
    let n = &mut g.nodes[root];
    n.op = if norm.centred { "LayerNormalization" } else { "RMSNormalization" }.into();
    n.inputs = [Some(norm.x), scale].into_iter().chain(bias.map(Some)).collect();
    n.attrs = Attrs::new()
        .with("axis", AttrValue::Int(norm.axis as i64))
        .with("epsilon", AttrValue::Float(f64::from(norm.epsilon as f32)));
    Ok(())
}

#[cfg(test)]
mod tests;
