//! Quantization round trips become one step: a `DequantizeLinear` of a `QuantizeLinear`'s
//! output, with the same scale, zero point, axis and block size, is `QuantizeDequantize` of the
//! QuantizeLinear's input. A QDQ model (`onnxruntime.quantization.quantize_static`, and the
//! exports of quantization-aware training) writes such a pair around every activation:
//! in pairs they are two steps and an int8 tensor per activation, one step and no int8
//! tensor here, with the same bits (`ingot_ops`' quantize family: `QuantizeDequantize`).
//!
//! Float32 only (x, scale and the QuantizeLinear's precision), which is what QDQ models use.
//! A QuantizeLinear that something else reads too stays for that reader.

use super::PassError;
use crate::ir::{Graph, Node, ValueId};
use ingot_schema::DType;

pub fn run(g: &mut Graph) -> Result<(), PassError> {
    let producers = g.producers();
    let mut rewrites = Vec::new();
    for (at, dq) in g.nodes.iter().enumerate() {
        if dq.op != "DequantizeLinear" {
            continue;
        }
        let Some(levels) = dq.inputs.first().copied().flatten() else {
            continue;
        };
        let Some(q) = producers[levels].map(|i| &g.nodes[i]) else {
            continue;
        };
        if q.op == "QuantizeLinear" && round_trip(g, q, dq) {
            rewrites.push((at, q.inputs.clone(), q.attrs.clone()));
        }
    }
    for (at, inputs, attrs) in rewrites {
        let node = &mut g.nodes[at];
        node.op = "QuantizeDequantize".into();
        node.inputs = inputs;
        node.attrs = attrs;
    }
    // QuantizeLinears that only their DequantizeLinears read are read by nobody now.
    super::dce::run(g)
}

/// Whether `dq` takes `q`'s levels back with `q`'s own scale and zero point, in float32.
fn round_trip(g: &Graph, q: &Node, dq: &Node) -> bool {
    let same = ["axis", "block_size"].iter().all(|a| q.attrs.get(a) == dq.attrs.get(a));
    let operand = |n: &Node, i: usize| n.inputs.get(i).copied().flatten();
    let f32 = |v: Option<ValueId>| v.and_then(|v| g.ty(v)).is_some_and(|t| t.dtype == DType::F32);
    let float32 = f32(operand(q, 0))
        && f32(operand(q, 1))
        && f32(dq.outputs.first().copied())
        && q.attrs.int("precision").ok() == Some(i64::from(DType::F32.onnx_code()));
    // The 4-bit levels stay two steps: `QuantizeDequantize` saturates to 8 or 16 bits.
    let levels = operand(dq, 0).and_then(|v| g.ty(v)).map(|t| t.dtype);
    let wide_levels = !matches!(levels, Some(DType::I4 | DType::U4));
    same && float32
        && wide_levels
        && same_value(g, operand(q, 1), operand(dq, 1))
        && same_value(g, operand(q, 2), operand(dq, 2))
}

/// The same value, or constants of the same type, shape and bytes (QDQ exporters write a
/// scale once per node).
fn same_value(g: &Graph, a: Option<ValueId>, b: Option<ValueId>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) if a == b => true,
        (Some(a), Some(b)) => match (g.constant(a), g.constant(b)) {
            (Some(x), Some(y)) => x.desc() == y.desc() && x.bytes() == y.bytes(),
            _ => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{self, Const};
    use crate::passes::testing::{Builder, evaluate};
    use ingot_ops::Tensor;
    use ingot_schema::{AttrValue, Attrs};

    /// `Relu(DequantizeLinear(QuantizeLinear(x, s, z), s', z'))`, int8 per tensor, or per
    /// axis 1 of [4, 6] with `per_axis`; `other_scale`: s' differs from s. With `keep`, the
    /// QuantizeLinear's levels are a graph output too.
    fn qdq(per_axis: bool, other_scale: bool, keep: bool) -> Graph {
        let mut b = Builder::new();
        let x = b.input("x", &[4, 6]);
        let n = if per_axis { 6 } else { 1 };
        let dims = if per_axis { vec![6] } else { vec![] };
        let constant = |b: &mut Builder, name: &str, v: Vec<f32>| {
            b.g.add_constant(name, Const::owned(Tensor::from_vec(dims.clone(), &v).unwrap()))
        };
        let s: Vec<f32> = (0..n).map(|i| 0.05 + i as f32 / 64.0).collect();
        let scale = constant(&mut b, "s", s.clone());
        let scale2 = constant(
            &mut b,
            "s2",
            s.iter().map(|v| v * if other_scale { 2.0 } else { 1.0 }).collect(),
        );
        let z: Vec<i8> = (0..n).map(|i| i as i8 - 2).collect();
        let zero = b.g.add_constant("z", Const::owned(Tensor::from_vec(dims.clone(), &z).unwrap()));
        let zero2 = b.g.add_constant("z2", Const::owned(Tensor::from_vec(dims, &z).unwrap()));
        let axis = Attrs::new().with("axis", AttrValue::Int(1));
        let levels = b.node("QuantizeLinear", &[x, scale, zero], axis.clone());
        let real = b.node("DequantizeLinear", &[levels, scale2, zero2], axis);
        let y = b.op("Relu", &[real]);
        let outputs = if keep { vec![y, levels] } else { vec![y] };
        b.finish(&outputs)
    }

    /// Runs the pass; checks the ops left and that the outputs are the same bits.
    fn rewritten(g: &Graph, ops: &[&str]) {
        let mut m = g.clone();
        run(&mut m).unwrap();
        ir::check(&m).unwrap();
        let left: Vec<&str> = m.nodes.iter().map(|n| n.op.as_str()).collect();
        assert_eq!(left, ops);
        // Values across the levels, halves (ties) among them, and past both ends.
        let x: Vec<f32> = (0..24).map(|i| (i as f32 - 12.0) * 0.0625 * 13.0).collect();
        let x = Tensor::from_vec(vec![4, 6], &x).unwrap();
        let (got, want) = (evaluate(&m, std::slice::from_ref(&x)), evaluate(g, &[x]));
        for (got, want) in got.iter().zip(&want) {
            assert_eq!((got.desc(), got.bytes()), (want.desc(), want.bytes()));
        }
    }

    #[test]
    fn pairs_become_one_step() {
        rewritten(&qdq(false, false, false), &["QuantizeDequantize", "Relu"]);
        // Per axis, the scale and zero point written twice, as exporters do.
        rewritten(&qdq(true, false, false), &["QuantizeDequantize", "Relu"]);
        // The levels read elsewhere too: the QuantizeLinear stays for that reader.
        rewritten(&qdq(false, false, true), &["QuantizeLinear", "QuantizeDequantize", "Relu"]);
    }

    #[test]
    fn a_different_scale_is_no_round_trip() {
        rewritten(&qdq(false, true, false), &["QuantizeLinear", "DequantizeLinear", "Relu"]);
    }
}
