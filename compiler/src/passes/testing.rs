//! What the passes' tests share.

use crate::ir::{Const, Graph};
use ingot_ops::{Tensor, TensorDesc, cpu};
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
