//! Float16 weights for a float32 model (`CompileOptions::f16_weights`, `ingot compile
//! --f16-weights`): each constant float32 weight that the kernels of every backend read as f16
//! themselves (`ingot_ops::takes_f16_weights`: a Conv's W, a MatMul's or Gemm's B) is stored
//! as float16, rounded to nearest even. The bundle's weights and the device's weight memory
//! are then about half; the arithmetic stays f32 (each weight widened exactly as it is
//! loaded), so the outputs move by the weights' rounding alone, a relative 2^-11 per weight.
//! This is TensorFlow Lite's float16 quantization. Activations stay f32.
//!
//! An embedding table that Gathers read is stored f16 too: each Gather takes f16 rows and a
//! `Cast` widens them (exactly) right after it, so a run widens only the rows it reads.
//!
//! A weight is left f32 where any reader would not take it as f16 (an op of another kind, a
//! product of a non-f32 A), where it is a graph output, and where a value lies outside f16's
//! range (it would become infinite). Runs after the fusions, which fold normalisations into W
//! in f32 first, and after the 8-bit weights have their own forms.

use super::PassError;
use crate::ir::{Const, Graph, Node, ValueId};
use ingot_ops::{DType, Tensor, TensorDesc};
use ingot_schema::{AttrValue, Attrs};

pub fn run(g: &mut Graph) -> Result<(), PassError> {
    if !g.f16_weights {
        return Ok(());
    }
    let uses = g.use_counts();
    // Per constant, how many of its uses would read it as f16.
    let mut half_uses = vec![0usize; g.values.len()];
    for node in &g.nodes {
        for (slot, v) in node.inputs.iter().enumerate() {
            if let Some(v) = *v
                && reads_half(g, node, slot)
            {
                half_uses[v] += 1;
            }
        }
    }
    let mut is_half = vec![false; g.values.len()];
    for v in 0..g.values.len() {
        let Some(c) = g.constant(v) else { continue };
        if c.desc().dtype != DType::F32 || half_uses[v] == 0 || half_uses[v] != uses[v] {
            continue;
        }
        if let Some(half) = halved(&c.tensor()).map_err(|e| named(g, v, e))? {
            g.values[v].ty = Some(half.desc().clone());
            g.values[v].constant = Some(Const::owned(half));
            is_half[v] = true;
        }
    }
    // A Gather of a table now f16 takes f16 rows, widened right after it.
    let nodes = std::mem::take(&mut g.nodes);
    for mut node in nodes {
        let gathered = node.op == "Gather"
            && node.inputs.first().copied().flatten().is_some_and(|t| is_half[t]);
        let Some(&rows) = node.outputs.first().filter(|_| gathered) else {
            g.nodes.push(node);
            continue;
        };
        let shape = g.ty(rows).map(|t| t.shape.clone()).unwrap_or_default();
        let half = g.add_value(
            format!("{}:f16", g.values[rows].name),
            Some(TensorDesc::new(DType::F16, shape)),
        );
        g.inherit(rows, half);
        node.outputs[0] = half;
        let widen = Node {
            name: format!("{}:f32", node.name),
            op: "Cast".into(),
            domain: String::new(),
            inputs: vec![Some(half)],
            outputs: vec![rows],
            attrs: Attrs::new().with("to", AttrValue::Int(i64::from(DType::F32.onnx_code()))),
        };
        g.nodes.push(node);
        g.nodes.push(widen);
    }
    Ok(())
}

/// Whether `node` would read input `slot` as float16: a weight its f32 step's kernels widen
/// (`ingot_ops::takes_f16_weights`), or a Gather's table, whose rows are widened after it (not
/// one whose rows are bounded: the bound belongs to the Gather's output).
fn reads_half(g: &Graph, node: &Node, slot: usize) -> bool {
    if node.op == "Gather" {
        return slot == 0 && node.outputs.first().is_some_and(|o| !g.bounded.contains_key(o));
    }
    let a = node.inputs.first().copied().flatten().and_then(|a| g.ty(a));
    a.is_some_and(|a| a.dtype == DType::F32)
        && ingot_ops::takes_f16_weights(&node.op, &node.attrs, slot)
}

/// `t` rounded to float16, or `None` where a value lies outside f16's range.
fn halved(t: &Tensor) -> Result<Option<Tensor>, ingot_ops::cpu::KernelError> {
    const F16_MAX: f32 = 65504.0;
    let values = t.as_slice::<f32>()?;
    if !values.iter().all(|v| v.abs() <= F16_MAX) {
        return Ok(None);
    }
    let to = Attrs::new().with("to", AttrValue::Int(i64::from(DType::F16.onnx_code())));
    let desc = TensorDesc::new(DType::F16, t.desc().shape.clone());
    Ok(Some(ingot_ops::cpu::eval("Cast", &to, &[t], &[desc])?.remove(0)))
}

fn named(g: &Graph, v: ValueId, e: impl std::fmt::Display) -> PassError {
    PassError::Graph(format!("storing weight {} as float16: {e}", g.values[v].name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testing::{Builder, data, evaluate};
    use half::f16;

    fn conv_attrs() -> Attrs {
        Attrs::new().with("pads", AttrValue::Ints(vec![1; 4]))
    }

    /// A conv and a product whose weights take f16, an embedding table that a Gather and a
    /// MatMul share, a product's weight that an Add reads too, and one too large for f16.
    fn model() -> (Graph, [ValueId; 5]) {
        let mut b = Builder::new();
        let x = b.input("x", &[1, 2, 4, 4]);
        let w = b.constant("w", &[3, 2, 3, 3], &[], 1);
        let bias = b.constant("bias", &[3], &[], 2);
        let y = b.node("Conv", &[x, w, bias], conv_attrs());
        let flat = b.constant("shape", &[2], &[3.0, 16.0], 0);
        let shape = b.node("Cast", &[flat], Attrs::new().with("to", AttrValue::Int(7)));
        let rows = b.node("Reshape", &[y, shape], Attrs::new());
        let proj = b.constant("proj", &[16, 5], &[], 3);
        let p = b.op("MatMul", &[rows, proj]);
        let table = b.constant("table", &[5, 4], &[], 4);
        let ids = b.input("ids", &[2]);
        let ids = b.node("Cast", &[ids], Attrs::new().with("to", AttrValue::Int(7)));
        let gathered = b.node("Gather", &[table, ids], Attrs::new());
        let tied = b.op("MatMul", &[p, table]);
        let mut huge = data(20, 5);
        huge[7] = 1e5;
        let big = b.constant("big", &[4, 5], &huge, 0);
        let q = b.op("MatMul", &[tied, big]);
        let shared = b.constant("shared", &[4, 5], &[], 6);
        let r = b.op("MatMul", &[tied, shared]);
        let e = b.input("e", &[4, 5]);
        let u = b.op("Add", &[e, shared]);
        (b.finish(&[q, gathered, r, u]), [w, proj, table, big, shared])
    }

    #[test]
    fn weights_every_reader_widens_become_f16_and_the_rest_stay() {
        let (original, [w, proj, table, big, shared]) = model();
        let mut g = original.clone();
        run(&mut g).unwrap();
        assert!(g.values.iter().all(|v| v.ty.as_ref().is_none_or(|t| t.dtype != DType::F16)));
        g.f16_weights = true;
        run(&mut g).unwrap();
        crate::ir::check(&g).unwrap();
        let dtype = |v: ValueId| g.constant(v).unwrap().desc().dtype;
        assert_eq!(dtype(w), DType::F16, "a conv's W");
        assert_eq!(dtype(proj), DType::F16, "a product's B");
        assert_eq!(dtype(table), DType::F16, "a product's B and a Gather's table");
        assert_eq!(dtype(big), DType::F32, "1e5 is past f16's range");
        assert_eq!(dtype(shared), DType::F32, "an Add reads it too");
        // The bias stays f32: the conv takes only W as f16.
        let bias = g.nodes.iter().find(|n| n.op == "Conv").unwrap().inputs[2].unwrap();
        assert_eq!(dtype(bias), DType::F32);
        // The Gather takes f16 rows, widened right after it.
        let at = g.nodes.iter().position(|n| n.op == "Gather").unwrap();
        let (gather, widen) = (&g.nodes[at], &g.nodes[at + 1]);
        assert_eq!((widen.op.as_str(), widen.inputs[0]), ("Cast", Some(gather.outputs[0])));
        assert_eq!(g.ty(gather.outputs[0]).unwrap().dtype, DType::F16);
        // Rounded to nearest even, and the model computes with those values.
        let rounded: Vec<f16> = original
            .constant(w)
            .unwrap()
            .tensor()
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|&v| f16::from_f32(v))
            .collect();
        assert_eq!(g.constant(w).unwrap().tensor().to_vec::<f16>().unwrap(), rounded);
        let x = Tensor::from_vec(vec![1, 2, 4, 4], &data(32, 9)).unwrap();
        let ids = Tensor::from_vec(vec![2], &[0.0f32, 3.0]).unwrap();
        let e = Tensor::from_vec(vec![4, 5], &data(20, 11)).unwrap();
        let inputs = [x, ids, e];
        let (got, want) = (evaluate(&g, &inputs), evaluate(&original, &inputs));
        for (k, (got, want)) in got.iter().zip(&want).enumerate() {
            let (got, want) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
            assert_eq!(got.len(), want.len());
            if k < 3 {
                assert_ne!(got, want, "output {k}: f16 weights move it");
            }
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() <= 4e-3 * b.abs().max(1.0), "output {k}: {a} against {b}");
            }
        }
    }
}
