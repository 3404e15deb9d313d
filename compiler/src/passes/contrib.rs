//! ONNX Runtime's contrib ops (domain `com.microsoft`) that exporters and ONNX Runtime's own
//! optimizer write into models that are otherwise standard, restated as the standard ops they
//! amount to (the `lower` walk calls [`settle`] on each node before lowering it; `fuse` and
//! `norm_chains` then see what they see in any model):
//! - `SkipLayerNormalization(x, skip, gamma, beta?, bias?)`: `s = x + skip (+ bias)`, then
//!   `LayerNormalization(s, gamma, beta)` over the last axis;
//! - `SkipSimplifiedLayerNormalization(x, skip, gamma, bias?)`: the same with
//!   `RMSNormalization(s, gamma)`.
//!
//! Their outputs are the normalized value, the mean and the inverse standard deviation
//! (statistics for training, which inference graphs leave unread), and the sum `s`. A model
//! that reads the statistics is refused, naming the node.

use super::PassError;
use crate::ir::{Graph, Node, ValueId};
use ingot_schema::{AttrValue, Attrs};

/// The contrib ops [`settle`] restates.
pub const OPS: &[&str] = &["SkipLayerNormalization", "SkipSimplifiedLayerNormalization"];

pub fn is_restated(domain: &str, op: &str) -> bool {
    domain == "com.microsoft" && OPS.contains(&op)
}

/// Replaces a contrib op at `g.nodes[at]` by the standard nodes it amounts to, walked next.
pub fn settle(g: &mut Graph, at: usize) -> Result<(), PassError> {
    if !is_restated(&g.nodes[at].domain, &g.nodes[at].op) {
        return Ok(());
    }
    let node = g.nodes.remove(at);
    let err = |message: String| PassError::Node { node: node.label(), message };
    let input = |k: usize| node.inputs.get(k).copied().flatten();
    let simplified = node.op == "SkipSimplifiedLayerNormalization";
    let (x, skip, gamma) = match (input(0), input(1), input(2)) {
        (Some(x), Some(skip), Some(gamma)) => (x, skip, gamma),
        _ => return Err(err("needs its input, skip and gamma (inputs 0 to 2)".into())),
    };
    let (beta, bias) = if simplified { (None, input(3)) } else { (input(3), input(4)) };
    let output = |k: usize| node.outputs.get(k).copied();
    for (k, what) in [(1, "mean"), (2, "inverse standard deviation")] {
        if output(k).is_some_and(|v| is_read(g, v)) {
            return Err(err(format!(
                "its output {k} (the {what}) is read; Ingot computes the normalized value \
                 and the sum"
            )));
        }
    }
    let y = output(0).ok_or_else(|| err("has no output".into()))?;
    let epsilon = node.attrs.get("epsilon").cloned().unwrap_or(AttrValue::Float(1e-5));
    let mut nodes = Vec::new();
    let mut step = |op: &str, inputs: Vec<ValueId>, out: Option<ValueId>, attrs: Attrs| {
        let name = format!("{}:{op}{}", node.name, nodes.len());
        let out = out.unwrap_or_else(|| g.add_value(name.clone(), None));
        nodes.push(Node {
            name,
            op: op.into(),
            domain: String::new(),
            inputs: inputs.into_iter().map(Some).collect(),
            outputs: vec![out],
            attrs,
        });
        out
    };
    // The sum is output 3 where the model names it (the next block's residual).
    let sum = output(3);
    let s = match bias {
        None => step("Add", vec![x, skip], sum, Attrs::new()),
        Some(bias) => {
            let s = step("Add", vec![x, skip], None, Attrs::new());
            step("Add", vec![s, bias], sum, Attrs::new())
        }
    };
    let attrs = Attrs::new().with("axis", AttrValue::Int(-1)).with("epsilon", epsilon);
    if simplified {
        step("RMSNormalization", vec![s, gamma], Some(y), attrs);
    } else {
        step("LayerNormalization", [s, gamma].into_iter().chain(beta).collect(), Some(y), attrs);
    }
    g.nodes.splice(at..at, nodes);
    Ok(())
}

/// Whether a node or the graph's outputs read `v`.
fn is_read(g: &Graph, v: ValueId) -> bool {
    g.outputs.contains(&v) || g.nodes.iter().any(|n| n.inputs.contains(&Some(v)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testing::{Builder, data, evaluate};
    use ingot_ops::Tensor;

    /// `op(x, skip, gamma[, beta])` in domain com.microsoft, lowered, and its outputs (the
    /// normalized value and the sum) for seeded inputs, with those of the standard ops.
    fn restated(op: &str, beta: bool) -> (Vec<Tensor>, Vec<Tensor>) {
        let inputs: Vec<Tensor> = (0..4)
            .map(|k| {
                let shape = if k < 2 { vec![2, 3, 8] } else { vec![8] };
                let n = shape.iter().product();
                Tensor::from_vec(shape, &data(n, k + 1)).unwrap()
            })
            .collect();
        let inputs = &inputs[..if beta { 4 } else { 3 }];
        let build = |contrib: bool| {
            let mut b = Builder::new();
            let x = b.input("x", &[2, 3, 8]);
            let skip = b.input("skip", &[2, 3, 8]);
            let gamma = b.input("gamma", &[8]);
            let mut ins = vec![x, skip, gamma];
            if beta {
                ins.push(b.input("beta", &[8]));
            }
            let eps = Attrs::new().with("epsilon", AttrValue::Float(1e-3));
            let (y, sum) = if contrib {
                let y = b.node(op, &ins, eps);
                let n = b.g.nodes.len() - 1;
                b.g.nodes[n].domain = "com.microsoft".into();
                let [mean, inv, sum] = [0, 1, 2].map(|k| b.g.add_value(format!("out{k}"), None));
                b.g.nodes[n].outputs.extend([mean, inv, sum]);
                (y, sum)
            } else {
                let sum = b.op("Add", &[x, skip]);
                let norm = if beta { "LayerNormalization" } else { "RMSNormalization" };
                let eps = eps.with("axis", AttrValue::Int(-1));
                let mut ins = vec![sum, gamma];
                ins.extend(beta.then(|| b.g.inputs[3]));
                (b.node(norm, &ins, eps), sum)
            };
            b.g.outputs = vec![y, sum];
            let mut g = b.g;
            super::super::lower::run(&mut g).unwrap();
            evaluate(&g, inputs)
        };
        (build(true), build(false))
    }

    #[test]
    fn skip_normalizations_are_an_add_and_the_standard_norm() {
        for (op, beta) in
            [("SkipSimplifiedLayerNormalization", false), ("SkipLayerNormalization", true)]
        {
            let (got, want) = restated(op, beta);
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.as_slice::<f32>().unwrap(), w.as_slice::<f32>().unwrap(), "{op}");
            }
        }
    }

    #[test]
    fn reading_the_statistics_is_refused() {
        let mut b = Builder::new();
        let x = b.input("x", &[2, 8]);
        let gamma = b.input("gamma", &[8]);
        let y = b.node("SkipSimplifiedLayerNormalization", &[x, x, gamma], Attrs::new());
        b.g.nodes[0].domain = "com.microsoft".into();
        let mean = b.g.add_value("mean", None);
        b.g.nodes[0].outputs.push(mean);
        b.g.outputs = vec![y, mean];
        let mut g = b.g;
        let e = super::super::lower::run(&mut g).unwrap_err().to_string();
        assert!(e.contains("output 1 (the mean) is read"), "{e}");
    }
}
