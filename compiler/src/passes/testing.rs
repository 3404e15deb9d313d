//! What the passes' tests share.

use crate::ir::{self, Const, Graph, Node, ValueId};
use crate::passes::lower;
use ingot_ops::{Tensor, TensorDesc, cpu};
use ingot_schema::{Attrs, DType};
use std::sync::Arc;

/// Evaluates `g` node by node with the CPU kernels, `inputs` in the order of `g.inputs`.
pub(crate) fn evaluate(g: &Graph, inputs: &[Tensor]) -> Vec<Tensor> {
    let mut values: Vec<Option<Arc<Tensor>>> =
        (g.values.iter()).map(|v| v.constant.as_ref().map(Const::tensor)).collect();
    for (&i, t) in g.inputs.iter().zip(inputs) {
        values[i] = Some(Arc::new(t.clone()));
    }
    for n in &g.nodes {
        let ins: Vec<&Tensor> = n.present_inputs().map(|v| values[v].as_deref().unwrap()).collect();
        let descs: Vec<TensorDesc> = n.outputs.iter().map(|&o| g.ty(o).unwrap().clone()).collect();
        let outs = cpu::eval(&n.op, &n.attrs, &ins, &descs)
            .unwrap_or_else(|e| panic!("{}: {e}", n.label()));
        for (&o, t) in n.outputs.iter().zip(outs) {
            values[o] = Some(Arc::new(t));
        }
    }
    g.outputs.iter().map(|&o| (*values[o].clone().unwrap()).clone()).collect()
}

/// A graph under construction, in ONNX terms (it is lowered when finished).
pub(crate) struct Builder {
    pub(crate) g: Graph,
}

impl Builder {
    pub(crate) fn new() -> Self {
        Builder { g: Graph { opset: 17, ..Default::default() } }
    }

    pub(crate) fn input(&mut self, name: &str, shape: &[usize]) -> ValueId {
        let v = self.g.add_value(name, Some(TensorDesc::new(DType::F32, shape.to_vec())));
        self.g.inputs.push(v);
        v
    }

    /// A constant of `shape` holding `values`, or distinct values from `seed` when empty.
    pub(crate) fn constant(
        &mut self,
        name: &str,
        shape: &[usize],
        values: &[f32],
        seed: usize,
    ) -> ValueId {
        let n = shape.iter().product();
        let data = if values.is_empty() { data(n, seed) } else { values.to_vec() };
        let t = Tensor::from_vec(shape.to_vec(), &data).unwrap();
        self.g.add_constant(name, Const::owned(t))
    }

    pub(crate) fn node(&mut self, op: &str, inputs: &[ValueId], attrs: Attrs) -> ValueId {
        let out = self.g.add_value(format!("{op}{}", self.g.nodes.len()), None);
        self.g.nodes.push(Node {
            name: format!("n{}", self.g.nodes.len()),
            op: op.into(),
            domain: String::new(),
            inputs: inputs.iter().map(|&i| Some(i)).collect(),
            outputs: vec![out],
            attrs,
        });
        out
    }

    pub(crate) fn op(&mut self, op: &str, inputs: &[ValueId]) -> ValueId {
        self.node(op, inputs, Attrs::new())
    }

    /// Lowers the graph, as the pipeline does before fusing.
    pub(crate) fn finish(mut self, outputs: &[ValueId]) -> Graph {
        self.g.outputs = outputs.to_vec();
        lower::run(&mut self.g).unwrap();
        ir::check(&self.g).unwrap();
        self.g
    }
}

/// `n` distinct, irregular values in about [-1.5, 1.5].
pub(crate) fn data(n: usize, seed: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 37 + seed * 11) % 23) as f32 / 7.3 - 1.5).collect()
}

/// Checks that `changed` computes what `original` does (f32 outputs equal, infinities and
/// NaNs included, or within 1e-5, relative above 1), both evaluated on the same irregular
/// inputs.
pub(crate) fn assert_agrees(changed: &Graph, original: &Graph) {
    let inputs: Vec<Tensor> = (original.inputs.iter().enumerate())
        .map(|(k, &i)| {
            let desc = original.ty(i).unwrap();
            Tensor::from_vec(desc.shape.clone(), &data(desc.elements(), 100 + k)).unwrap()
        })
        .collect();
    for (got, want) in evaluate(changed, &inputs).iter().zip(evaluate(original, &inputs)) {
        assert_eq!(got.desc(), want.desc());
        let (got, want) = (got.as_slice::<f32>().unwrap(), want.as_slice::<f32>().unwrap());
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            let same = a == b || (a.is_nan() && b.is_nan());
            assert!(
                same || (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "element {i}: {a}, originally {b}"
            );
        }
    }
}
