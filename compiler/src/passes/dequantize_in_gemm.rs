//! Dequantize in the GEMM: a MatMul or Gemm whose B is `DequantizeLinear(q, scale, zero)` of
//! a constant 2-D int8 or uint8 `q` (the `lower` pass leaves such a DequantizeLinear unfolded:
//! `ingot_ops::keeps_constant_narrow`), or the chain some exporters write instead, reads `q`
//! itself, followed by B's dequantization: a float32 `[2, N]` constant of one scale and one
//! zero point per column of the product (`ingot_ops::dequantizes_b`; a per-tensor pair is
//! spread over the columns). The CPU's GEMM dequantizes B a block at a time as it packs it, the
//! Vulkan kernel as it loads it, so no float32 copy of the weight is ever whole: not in the
//! bundle, not in the arena, and no step writes one each run.
//!
//! B's scales must be one for the tensor or one per column of the product (per output channel,
//! as weight quantizers write them: DequantizeLinear's axis is B's column axis, 1 for a MatMul,
//! 0 for a Gemm with `transB`); a block-quantized B, one quantized per row, or one with float16
//! scales keeps its DequantizeLinear step.

use super::PassError;
use super::patterns::Patterns;
use crate::ir::{Const, Graph, ValueId};
use ingot_ops::Constant as _;
use ingot_ops::Tensor;
use ingot_schema::{AttrValue, DType};

pub fn run(g: &mut Graph) -> Result<(), PassError> {
    let mut rewrites = Vec::new();
    let p = Patterns::new(g);
    for (at, node) in g.nodes.iter().enumerate() {
        if !matches!(node.op.as_str(), "MatMul" | "Gemm") {
            continue;
        }
        if ingot_ops::dequantizes_b(&node.attrs) {
            continue;
        }
        let Some(b) = node.inputs.get(1).copied().flatten() else {
            continue;
        };
        let column_axis = if transposed(node) { 0 } else { 1 };
        if let Some(quantized) =
            dequantized(&p, b, column_axis).or_else(|| cast(&p, b, column_axis))
        {
            rewrites.push((at, quantized));
        }
    }
    for (at, QuantizedB { q, scales, zeros }) in rewrites {
        let Some(n) = g.ty(q).map(|t| t.shape[1 - usize::from(transposed(&g.nodes[at]))]) else {
            continue;
        };
        // Per column, as both backends read it.
        let spread = |v: &[f64], j: usize| v[if v.len() == 1 { 0 } else { j }] as f32;
        let zeros: Vec<f64> = zeros.iter().map(|&z| z as f64).collect();
        let values: Vec<f32> =
            (0..n).map(|j| spread(&scales, j)).chain((0..n).map(|j| spread(&zeros, j))).collect();
        let shape = ingot_ops::dequantization_shape(n).to_vec();
        let Ok(table) = Tensor::from_vec(shape, &values) else {
            continue;
        };
        let name = format!("{}.dequantization", g.values[q].name);
        let dq = g.add_constant(name, Const::owned(table));
        let node = &mut g.nodes[at];
        node.inputs[1] = Some(q);
        // Last of the product's own inputs: after A, B and Gemm's C, before post-op operands.
        let extras = ingot_ops::cpu::post::extra_inputs(&node.attrs)
            .map_err(|e| PassError::Node { node: node.name.clone(), message: e.to_string() })?;
        node.inputs.insert(node.inputs.len() - extras, Some(dq));
        node.attrs.set("dequantize_b", AttrValue::Int(1));
    }
    // Dequantizations that only products read are read by nobody now.
    super::dce::run(g)
}

/// Whether the product reads B transposed (a Gemm's `transB`): its columns are B's rows.
fn transposed(node: &crate::ir::Node) -> bool {
    node.op == "Gemm" && node.attrs.int("transB").unwrap_or(0) != 0
}

/// A constant 2-D 8-bit B, with its scales and zero points (one, or one per column).
struct QuantizedB {
    q: ValueId,
    scales: Vec<f64>,
    zeros: Vec<i64>,
}

/// `v` as `DequantizeLinear(q, scale, zero)`, per tensor or along `column_axis`.
fn dequantized(p: &Patterns, v: ValueId, column_axis: i64) -> Option<QuantizedB> {
    let g = p.g;
    let node = p.produced_by(v, "DequantizeLinear")?;
    if node.attrs.int("block_size").ok()? != 0 || g.ty(v)?.dtype != DType::F32 {
        return None;
    }
    let (q, scale) = (node.inputs.first().copied()??, node.inputs.get(1).copied()??);
    let per_column = g.constant(scale)?.desc().elements() != 1;
    if per_column && node.attrs.int("axis").ok()? != column_axis {
        return None;
    }
    let zeros = match node.inputs.get(2).copied().flatten() {
        None => vec![0],
        Some(z) => g.constant(z)?.tensor().to_i64s()?,
    };
    Some(QuantizedB { q: narrow_matrix(g, q)?, scales: f32s(g, scale)?, zeros })
}

/// `v` as exporters also write a dequantization: `Mul(Cast(q) - zero, scale)` (or `+ -zero`,
/// or no zero point), with float constants for the zero point and the scale, each one value
/// or one per column (shape [1, N], [N], or [N, 1] for a Gemm's transposed B).
fn cast(p: &Patterns, v: ValueId, column_axis: i64) -> Option<QuantizedB> {
    let g = p.g;
    let mul = p.produced_by(v, "Mul")?;
    let (x, scale) = Patterns::pairs(mul)?
        .into_iter()
        .find(|&(x, s)| g.constant(s).is_some() && g.constant(x).is_none())?;
    let (shifted, zeros) = match (p.produced_by(x, "Sub"), p.produced_by(x, "Add")) {
        (Some(sub), _) => match sub.inputs[..] {
            [Some(c), Some(z)] if g.constant(z).is_some() => (c, whole(g, z, 1.0, column_axis)?),
            _ => return None,
        },
        (None, Some(add)) => {
            let (c, z) =
                Patterns::pairs(add)?.into_iter().find(|&(_, z)| g.constant(z).is_some())?;
            (c, whole(g, z, -1.0, column_axis)?)
        }
        (None, None) => (x, vec![0]),
    };
    let cast = p.produced_by(shifted, "Cast")?;
    let q = narrow_matrix(g, cast.inputs.first().copied()??)?;
    let (min, max) = if g.ty(q)?.dtype == DType::I8 { (-128, 127) } else { (0, 255) };
    if zeros.iter().any(|&z| z < min || z > max)
        || g.ty(v)?.dtype != DType::F32
        || g.constant(scale)?.desc().dtype != DType::F32
    {
        return None;
    }
    per_column_shape(g, scale, column_axis)?;
    Some(QuantizedB { q, scales: f32s(g, scale)?, zeros })
}

/// `v` if it is a constant 2-D int8 or uint8 matrix.
fn narrow_matrix(g: &Graph, v: ValueId) -> Option<ValueId> {
    let d = g.constant(v)?.desc();
    (d.shape.len() == 2 && matches!(d.dtype, DType::I8 | DType::U8)).then_some(v)
}

/// A float32 constant's values.
fn f32s(g: &Graph, v: ValueId) -> Option<Vec<f64>> {
    let c = g.constant(v)?;
    let values = c.tensor().as_slice::<f32>().ok()?.iter().map(|&s| f64::from(s)).collect();
    Some(values)
}

/// Whether a constant broadcast against a 2-D B has one value, or one per column (along
/// `column_axis`): shape [], [1], [N], [1, N] for axis 1; [N, 1] for axis 0.
fn per_column_shape(g: &Graph, v: ValueId, column_axis: i64) -> Option<()> {
    let shape = &g.constant(v)?.desc().shape;
    let one = shape.iter().product::<usize>() == 1;
    let fits = match (column_axis, &shape[..]) {
        _ if one => true,
        (1, [_] | [1, _]) => true,
        (0, [_, 1]) => true,
        _ => false,
    };
    fits.then_some(())
}

/// A float zero point's values times `sign`, if every one is a whole number.
fn whole(g: &Graph, v: ValueId, sign: f64, column_axis: i64) -> Option<Vec<i64>> {
    per_column_shape(g, v, column_axis)?;
    let values = g.constant(v)?.to_f64s()?;
    let whole = |z: f64| (z.fract() == 0.0 && z.abs() <= 255.0).then_some((sign * z) as i64);
    values.into_iter().map(whole).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{self, Const};
    use crate::passes::testing::{Builder, assert_agrees, evaluate};
    use ingot_ops::Tensor;
    use ingot_schema::Attrs;

    /// `op(x, DequantizeLinear(q, scale, zero, axis))` of a [rows, cols] int8 `q`, with
    /// `scales` scales (and zero points), lowered.
    fn product(op: &str, trans_b: bool, dims: (usize, usize), axis: i64, scales: usize) -> Graph {
        product_then(op, trans_b, dims, axis, scales, false)
    }

    /// [`product`], and with `residual` then `Relu(product + r)` of a graph input `r`.
    fn product_then(
        op: &str,
        trans_b: bool,
        (rows, cols): (usize, usize),
        axis: i64,
        scales: usize,
        residual: bool,
    ) -> Graph {
        let mut b = Builder::new();
        let k = if trans_b { cols } else { rows };
        let x = b.input("x", &[3, k]);
        let q: Vec<i8> = (0..rows * cols).map(|i| (i * 37 % 251) as u8 as i8).collect();
        let q =
            b.g.add_constant("q", Const::owned(Tensor::from_vec(vec![rows, cols], &q).unwrap()));
        let dims = if scales == 1 { vec![] } else { vec![scales] };
        let s: Vec<f32> = (0..scales).map(|i| 0.01 + i as f32 / 512.0).collect();
        let z: Vec<i8> = (0..scales).map(|i| (i % 5) as i8 - 2).collect();
        let scale =
            b.g.add_constant("scale", Const::owned(Tensor::from_vec(dims.clone(), &s).unwrap()));
        let zero = b.g.add_constant("zero", Const::owned(Tensor::from_vec(dims, &z).unwrap()));
        let w = b.node(
            "DequantizeLinear",
            &[q, scale, zero],
            Attrs::new().with("axis", AttrValue::Int(axis)),
        );
        let attrs = match op {
            "Gemm" => Attrs::new().with("transB", AttrValue::Int(trans_b as i64)),
            _ => Attrs::new(),
        };
        let mut y = b.node(op, &[x, w], attrs);
        if residual {
            let r = b.input("r", &[3, if trans_b { rows } else { cols }]);
            let sum = b.op("Add", &[y, r]);
            y = b.op("Relu", &[sum]);
        }
        b.finish(&[y])
    }

    /// Runs the pass; checks the ops left and that the outputs are the same bits.
    fn rewritten(g: &Graph, ops: &[&str]) -> Graph {
        let mut m = g.clone();
        run(&mut m).unwrap();
        ir::check(&m).unwrap();
        let left: Vec<&str> = m.nodes.iter().map(|n| n.op.as_str()).collect();
        assert_eq!(left, ops);
        assert_agrees(&m, g);
        let inputs: Vec<Tensor> = (g.inputs.iter())
            .map(|&v| {
                let shape = g.ty(v).unwrap().shape.clone();
                let n = shape.iter().product();
                Tensor::from_vec(shape, &vec![0.5f32; n]).unwrap()
            })
            .collect();
        let (got, want) = (evaluate(&m, &inputs), evaluate(g, &inputs));
        assert_eq!(got[0].bytes(), want[0].bytes(), "the GEMM's values are DequantizeLinear's");
        m
    }

    #[test]
    fn products_read_their_8_bit_weights() {
        // Per column of a MatMul's [K, N] B, and per tensor.
        let m = rewritten(&product("MatMul", false, (64, 48), 1, 48), &["MatMul"]);
        let q = m.nodes[0].inputs[1].unwrap();
        assert_eq!(m.ty(q).unwrap().dtype, DType::I8);
        assert!(ingot_ops::dequantizes_b(&m.nodes[0].attrs));
        // B's dequantization: scales then zero points, one of each per column.
        let dq = m.constant(m.nodes[0].inputs[2].unwrap()).unwrap();
        assert_eq!(dq.desc().shape, [2, 48]);
        let dq = dq.tensor().to_f64s().unwrap();
        assert_eq!((dq[1] as f32, dq[48 + 1]), (0.01 + 1.0 / 512.0, -1.0));
        // One scale and zero point for the tensor, spread over the columns.
        let m = rewritten(&product("MatMul", false, (64, 48), 0, 1), &["MatMul"]);
        let dq = m.constant(m.nodes[0].inputs[2].unwrap()).unwrap().tensor().to_f64s().unwrap();
        assert_eq!((dq.len(), dq[47] as f32, dq[95]), (96, 0.01, -2.0));
        // A Gemm's [N, K] B with transB: its columns are q's rows.
        rewritten(&product("Gemm", true, (48, 64), 0, 48), &["Gemm"]);
        rewritten(&product("Gemm", false, (64, 48), 1, 48), &["Gemm"]);
    }

    #[test]
    fn the_dequantization_comes_before_post_op_operands() {
        // Gemm(x, DQ(q)ᵀ) + r, then Relu, fused: [x, q, C, r] -> [x, q, C, dq, r]; the
        // residual still the input the output may be written over.
        let mut g = product_then("Gemm", true, (48, 64), 0, 48, true);
        let r = g.inputs[1];
        crate::passes::fuse::run(&mut g).unwrap();
        let fused: Vec<&str> = g.nodes.iter().map(|n| n.op.as_str()).collect();
        assert_eq!(fused, ["DequantizeLinear", "Gemm"]);
        let m = rewritten(&g, &["Gemm"]);
        let gemm = &m.nodes[0];
        assert_eq!(gemm.inputs.len(), 5);
        assert_eq!(m.ty(gemm.inputs[3].unwrap()).unwrap().shape, [2, 48]);
        assert_eq!(gemm.inputs[4], Some(r));
        assert_eq!(ingot_ops::cpu::post::in_place_input("Gemm", &gemm.attrs), Some(4));
    }

    #[test]
    fn other_quantizations_keep_their_step() {
        // One scale per row of B (along the contraction): the GEMM's scales are per column.
        rewritten(&product("MatMul", false, (64, 48), 0, 64), &["DequantizeLinear", "MatMul"]);
        rewritten(&product("Gemm", true, (48, 64), 1, 64), &["DequantizeLinear", "Gemm"]);
    }

    /// `MatMul(x, Mul(Cast(q) (+|-) zero, scale))` of a [64, 48] int8 q: the chain some
    /// exporters write for a dequantization. `zero`: the op and the shape of its constant.
    fn chain(scale_shape: &[usize], zero: Option<(&str, &[usize])>) -> Graph {
        let mut b = Builder::new();
        let x = b.input("x", &[3, 64]);
        let q: Vec<i8> = (0..64 * 48).map(|i| (i * 37 % 251) as u8 as i8).collect();
        let q = b.g.add_constant("q", Const::owned(Tensor::from_vec(vec![64, 48], &q).unwrap()));
        let real = b.node("Cast", &[q], Attrs::new().with("to", AttrValue::Int(1)));
        let shifted = match zero {
            None => real,
            Some((op, shape)) => {
                let n: usize = shape.iter().product();
                let z: Vec<f32> = (0..n).map(|i| (i % 5) as f32 - 2.0).collect();
                let z = b.constant("zero", shape, &z, 0);
                b.op(op, &[real, z])
            }
        };
        let n: usize = scale_shape.iter().product();
        let s: Vec<f32> = (0..n).map(|i| 0.01 + i as f32 / 512.0).collect();
        let s = b.constant("scale", scale_shape, &s, 0);
        let w = b.op("Mul", &[s, shifted]);
        let y = b.op("MatMul", &[x, w]);
        b.finish(&[y])
    }

    #[test]
    fn exported_chains_read_their_8_bit_weights() {
        rewritten(&chain(&[1, 48], None), &["MatMul"]);
        rewritten(&chain(&[], None), &["MatMul"]);
        rewritten(&chain(&[48], Some(("Sub", &[1, 48]))), &["MatMul"]);
        rewritten(&chain(&[1, 48], Some(("Add", &[]))), &["MatMul"]);
        // Per row of B: the chain stays.
        rewritten(&chain(&[64, 1], None), &["Cast", "Mul", "MatMul"]);
    }
}
