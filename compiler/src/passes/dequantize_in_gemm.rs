//! Dequantize in the GEMM: a MatMul or Gemm whose B is `DequantizeLinear(q, scale, zero)` of
//! a constant 2-D int8 or uint8 `q` (the `lower` pass leaves such a DequantizeLinear unfolded:
//! `ingot_ops::keeps_constant_narrow`), or the chain some exporters write instead, reads `q`
//! itself, followed by B's dequantization: a float32 `[2, N]` constant of one scale and one
//! zero point per column of the product (`ingot_ops::dequantizes_b`; a per-tensor pair is
//! spread over the columns). The CPU's GEMM dequantizes B a block at a time as it packs it, the
//! Vulkan kernel as it loads it, so no float32 copy of the weight is ever whole: not in the
//! bundle, not in the arena, and no step writes one each run.
//!
//! A Conv whose W is such a dequantization of a constant 8-bit W reads it the same way
//! (`ingot_ops::dequantizes_w`): its inputs become X, W's integers and, in B's place, W's
//! table: per output channel a scale, a zero point and the bias (zero where the model has
//! none; a bias that is not a constant keeps the DequantizeLinear step). Its GEMMs dequantize a
//! block of W's rows at a time.
//!
//! The scales must be one for the tensor or one per column of the product (per output channel,
//! as weight quantizers write them: DequantizeLinear's axis is B's column axis, 1 for a MatMul,
//! 0 for a Gemm with `transB` and for a Conv's W); a block-quantized weight, one quantized
//! along another axis, or one with float16 scales keeps its DequantizeLinear step.

use super::PassError;
use super::patterns::Patterns;
use crate::ir::{Const, Graph, ValueId};
use ingot_ops::Constant as _;
use ingot_ops::Tensor;
use ingot_schema::{AttrValue, DType};

/// The Convs: before `fuse`, so that it folds a per-channel affine map after such a Conv (a
/// BatchNormalization, a learnt scale) into W's table as it folds one into a float W.
pub fn convs(g: &mut Graph) -> Result<(), PassError> {
    rewrite(g, true)
}

/// The products: after `fuse`, which may still give a Gemm its C (B's dequantization follows
/// C among the product's own inputs).
pub fn products(g: &mut Graph) -> Result<(), PassError> {
    rewrite(g, false)
}

/// Rewrites the Convs (`convs`) or the MatMuls and Gemms.
fn rewrite(g: &mut Graph, convs: bool) -> Result<(), PassError> {
    let mut rewrites = Vec::new();
    let p = Patterns::new(g);
    for (at, node) in g.nodes.iter().enumerate() {
        let Some(weight) = Weight::of(node).filter(|w| w.conv == convs) else {
            continue;
        };
        if ingot_ops::dequantizes_b(&node.attrs) || ingot_ops::dequantizes_w(&node.attrs) {
            continue;
        }
        let Some(b) = node.inputs.get(1).copied().flatten() else {
            continue;
        };
        // A Conv's bias goes into W's table: it must be a constant.
        let bias = node.inputs.get(2).copied().flatten();
        if weight.conv && bias.is_some_and(|c| g.constant(c).is_none()) {
            continue;
        }
        if let Some(quantized) = dequantized(&p, b, weight).or_else(|| cast(&p, b, weight)) {
            rewrites.push((at, weight, quantized));
        }
    }
    for (at, weight, QuantizedB { q, scales, zeros }) in rewrites {
        let Some(n) = g.ty(q).map(|t| t.shape[weight.axis]) else {
            continue;
        };
        // Per column, as both backends read it.
        let spread = |v: &[f64], j: usize| v[if v.len() == 1 { 0 } else { j }] as f32;
        let zeros: Vec<f64> = zeros.iter().map(|&z| z as f64).collect();
        let mut values: Vec<f32> =
            (0..n).map(|j| spread(&scales, j)).chain((0..n).map(|j| spread(&zeros, j))).collect();
        let mut shape = ingot_ops::dequantization_shape(n).to_vec();
        if weight.conv {
            // The bias, or zeros.
            let bias = g.nodes[at].inputs.get(2).copied().flatten();
            match bias.map(|c| g.constant(c).and_then(|c| c.to_f64s())) {
                None => values.extend(std::iter::repeat_n(0.0, n)),
                Some(Some(b)) if b.len() == n => values.extend(b.iter().map(|&b| b as f32)),
                Some(_) => continue,
            }
            shape = ingot_ops::weight_table_shape(n).to_vec();
        }
        let Ok(table) = Tensor::from_vec(shape, &values) else {
            continue;
        };
        let name = format!("{}.dequantization", g.values[q].name);
        let dq = g.add_constant(name, Const::owned(table));
        let node = &mut g.nodes[at];
        node.inputs[1] = Some(q);
        if weight.conv {
            // In B's place (present whenever post-op operands follow it).
            match node.inputs.get_mut(2) {
                Some(b) => *b = Some(dq),
                None => node.inputs.push(Some(dq)),
            }
            node.attrs.set("dequantize_w", AttrValue::Int(1));
            continue;
        }
        // Last of the product's own inputs: after A, B and Gemm's C, before post-op operands.
        let extras = ingot_ops::cpu::post::extra_inputs(&node.attrs)
            .map_err(|e| PassError::Node { node: node.name.clone(), message: e.to_string() })?;
        node.inputs.insert(node.inputs.len() - extras, Some(dq));
        node.attrs.set("dequantize_b", AttrValue::Int(1));
    }
    // Dequantizations that only products read are read by nobody now.
    super::dce::run(g)
}

/// The weight (input 1) an op may read as 8-bit integers: the axis of its per-channel scales
/// (a product's columns, a Conv's output channels) and the rank it must have.
#[derive(Clone, Copy)]
struct Weight {
    axis: usize,
    conv: bool,
}

impl Weight {
    fn of(node: &crate::ir::Node) -> Option<Weight> {
        // A Gemm's B with `transB` is [N, K]: its columns are B's rows.
        let transposed = node.op == "Gemm" && node.attrs.int("transB").unwrap_or(0) != 0;
        match node.op.as_str() {
            "MatMul" | "Gemm" => Some(Weight { axis: usize::from(!transposed), conv: false }),
            "Conv" => Some(Weight { axis: 0, conv: true }),
            _ => None,
        }
    }

    /// Whether a weight of `rank` dimensions fits: a matrix, or a Conv's [M, C/group, k..].
    fn fits(self, rank: usize) -> bool {
        if self.conv { rank >= 3 } else { rank == 2 }
    }
}

/// A constant 2-D 8-bit B, with its scales and zero points (one, or one per column).
struct QuantizedB {
    q: ValueId,
    scales: Vec<f64>,
    zeros: Vec<i64>,
}

/// `v` as `DequantizeLinear(q, scale, zero)`, per tensor or along the weight's axis.
fn dequantized(p: &Patterns, v: ValueId, weight: Weight) -> Option<QuantizedB> {
    let g = p.g;
    let node = p.produced_by(v, "DequantizeLinear")?;
    if node.attrs.int("block_size").ok()? != 0 || g.ty(v)?.dtype != DType::F32 {
        return None;
    }
    let (q, scale) = (node.inputs.first().copied()??, node.inputs.get(1).copied()??);
    let per_column = g.constant(scale)?.desc().elements() != 1;
    if per_column && node.attrs.int("axis").ok()? != weight.axis as i64 {
        return None;
    }
    let zeros = match node.inputs.get(2).copied().flatten() {
        None => vec![0],
        Some(z) => g.constant(z)?.tensor().to_i64s()?,
    };
    Some(QuantizedB { q: narrow(g, q, weight)?, scales: f32s(g, scale)?, zeros })
}

/// `v` as exporters also write a dequantization: `Mul(Cast(q) - zero, scale)` (or `+ -zero`,
/// or no zero point), with float constants for the zero point and the scale, each one value
/// or one per column (shape [1, N], [N], or [N, 1] for a Gemm's transposed B; [M, 1, 1, 1]
/// for a Conv's W).
fn cast(p: &Patterns, v: ValueId, weight: Weight) -> Option<QuantizedB> {
    let g = p.g;
    // The weight's shape is the Mul's.
    let shaped = (weight, g.ty(v)?.shape.len());
    let mul = p.produced_by(v, "Mul")?;
    let (x, scale) = Patterns::pairs(mul)?
        .into_iter()
        .find(|&(x, s)| g.constant(s).is_some() && g.constant(x).is_none())?;
    let (shifted, zeros) = match (p.produced_by(x, "Sub"), p.produced_by(x, "Add")) {
        (Some(sub), _) => match sub.inputs[..] {
            [Some(c), Some(z)] if g.constant(z).is_some() => (c, whole(g, z, 1.0, shaped)?),
            _ => return None,
        },
        (None, Some(add)) => {
            let (c, z) =
                Patterns::pairs(add)?.into_iter().find(|&(_, z)| g.constant(z).is_some())?;
            (c, whole(g, z, -1.0, shaped)?)
        }
        (None, None) => (x, vec![0]),
    };
    let cast = p.produced_by(shifted, "Cast")?;
    let q = narrow(g, cast.inputs.first().copied()??, weight)?;
    let (min, max) = if g.ty(q)?.dtype == DType::I8 { (-128, 127) } else { (0, 255) };
    if zeros.iter().any(|&z| z < min || z > max)
        || g.ty(v)?.dtype != DType::F32
        || g.constant(scale)?.desc().dtype != DType::F32
    {
        return None;
    }
    per_channel_shape(g, scale, shaped)?;
    Some(QuantizedB { q, scales: f32s(g, scale)?, zeros })
}

/// `v` if it is a constant int8 or uint8 of the weight's rank.
fn narrow(g: &Graph, v: ValueId, weight: Weight) -> Option<ValueId> {
    let d = g.constant(v)?.desc();
    (weight.fits(d.shape.len()) && matches!(d.dtype, DType::I8 | DType::U8)).then_some(v)
}

/// A float32 constant's values.
fn f32s(g: &Graph, v: ValueId) -> Option<Vec<f64>> {
    let c = g.constant(v)?;
    let values = c.tensor().as_slice::<f32>().ok()?.iter().map(|&s| f64::from(s)).collect();
    Some(values)
}

/// Whether a constant broadcast against the weight has one value, or one per channel along
/// the weight's axis: shape [], [1], [N], [1, N] for a product's columns (axis 1); [N, 1] for
/// a transposed B's (axis 0); [M, 1, 1, 1] for a Conv's output channels.
fn per_channel_shape(g: &Graph, v: ValueId, (weight, rank): (Weight, usize)) -> Option<()> {
    let shape = &g.constant(v)?.desc().shape;
    let one = shape.iter().product::<usize>() == 1;
    // Aligned to the weight's trailing dimensions, as broadcasting aligns them.
    let lead = rank.checked_sub(shape.len())?;
    let along_axis = (0..shape.len()).all(|i| shape[i] == 1 || lead + i == weight.axis);
    (one || along_axis).then_some(())
}

/// A float zero point's values times `sign`, if every one is a whole number.
fn whole(g: &Graph, v: ValueId, sign: f64, weight: (Weight, usize)) -> Option<Vec<i64>> {
    per_channel_shape(g, v, weight)?;
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

    /// `DequantizeLinear(q, scale, zero, axis)` of an int8 `q` of `shape`, with `scales`
    /// scales and zero points.
    fn dequantized_weight(b: &mut Builder, shape: Vec<usize>, axis: i64, scales: usize) -> ValueId {
        let n = shape.iter().product::<usize>();
        let q: Vec<i8> = (0..n).map(|i| (i * 37 % 251) as u8 as i8).collect();
        let q = b.g.add_constant("q", Const::owned(Tensor::from_vec(shape, &q).unwrap()));
        let dims = if scales == 1 { vec![] } else { vec![scales] };
        let s: Vec<f32> = (0..scales).map(|i| 0.01 + i as f32 / 512.0).collect();
        let z: Vec<i8> = (0..scales).map(|i| (i % 5) as i8 - 2).collect();
        let scale =
            b.g.add_constant("scale", Const::owned(Tensor::from_vec(dims.clone(), &s).unwrap()));
        let zero = b.g.add_constant("zero", Const::owned(Tensor::from_vec(dims, &z).unwrap()));
        let axis = Attrs::new().with("axis", AttrValue::Int(axis));
        b.node("DequantizeLinear", &[q, scale, zero], axis)
    }

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
        let w = dequantized_weight(&mut b, vec![rows, cols], axis, scales);
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
        convs(&mut m).unwrap();
        products(&mut m).unwrap();
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

    /// `Conv(x, DequantizeLinear(q, scale, zero, axis))` of a [16, 8, 3, 3] int8 `q` with
    /// `scales` scales, with a bias or not, and with `residual` then `Relu(conv + r)`.
    fn conv(axis: i64, scales: usize, bias: bool, residual: bool) -> Graph {
        let mut b = Builder::new();
        let x = b.input("x", &[1, 8, 6, 6]);
        let w = dequantized_weight(&mut b, vec![16, 8, 3, 3], axis, scales);
        let pads = Attrs::new().with("pads", AttrValue::Ints(vec![1; 4]));
        let mut y = match bias {
            true => {
                let bias = b.constant("bias", &[16], &[], 3);
                b.node("Conv", &[x, w, bias], pads)
            }
            false => b.node("Conv", &[x, w], pads),
        };
        if residual {
            let r = b.input("r", &[1, 16, 6, 6]);
            let sum = b.op("Add", &[y, r]);
            y = b.op("Relu", &[sum]);
        }
        b.finish(&[y])
    }

    #[test]
    fn convs_read_their_8_bit_weights() {
        // Per output channel, without a bias: W's table holds zeros for it.
        let m = rewritten(&conv(0, 16, false, false), &["Conv"]);
        let node = &m.nodes[0];
        assert!(ingot_ops::dequantizes_w(&node.attrs));
        assert_eq!(node.inputs.len(), 3);
        assert_eq!(m.ty(node.inputs[1].unwrap()).unwrap().dtype, DType::I8);
        let table = m.constant(node.inputs[2].unwrap()).unwrap();
        assert_eq!(table.desc().shape, [3, 16]);
        let table = table.tensor().to_f64s().unwrap();
        assert_eq!((table[3] as f32, table[16 + 3], table[32 + 3]), (0.01 + 3.0 / 512.0, 1.0, 0.0));
        // Per tensor, with a bias: the bias is the table's last row.
        let g = conv(1, 1, true, false);
        let bias = g.constant(g.nodes[1].inputs[2].unwrap()).unwrap().to_f64s().unwrap();
        let m = rewritten(&g, &["Conv"]);
        let table = m.constant(m.nodes[0].inputs[2].unwrap()).unwrap().to_f64s().unwrap();
        assert_eq!(table[32..], bias[..]);
        // Fused with a residual after it, as the pipeline runs them: [x, q, table, r], the
        // residual the input the output may be written over.
        let g = conv(0, 16, false, true);
        let r = g.inputs[1];
        let mut m = rewritten(&g, &["Conv", "Add", "Relu"]);
        crate::passes::fuse::run(&mut m).unwrap();
        assert_agrees(&m, &g);
        let node = &m.nodes[0];
        assert_eq!((m.nodes.len(), node.inputs.len()), (1, 4));
        assert_eq!(node.inputs[3], Some(r));
        assert_eq!(ingot_ops::cpu::post::in_place_input("Conv", &node.attrs), Some(3));
        // Scales per input channel (axis 1) are not the GEMM's rows: the step stays.
        rewritten(&conv(1, 8, true, false), &["DequantizeLinear", "Conv"]);
    }

    #[test]
    fn affine_maps_after_such_convs_fold_into_their_tables() {
        // Conv(x, DQ(q)) + bias, then * k (one per channel), + 0.25, Relu: one Conv, whose
        // scales are k times W's, whose bias is bias * k + 0.25, whose one post-op is the Relu.
        let mut b = Builder::new();
        let x = b.input("x", &[1, 8, 6, 6]);
        let w = dequantized_weight(&mut b, vec![16, 8, 3, 3], 0, 16);
        let bias = b.constant("bias", &[16], &[], 3);
        let y = b.node("Conv", &[x, w, bias], Attrs::new());
        let k = b.constant("k", &[16, 1, 1], &[], 5);
        let y = b.op("Mul", &[k, y]);
        let t = b.constant("t", &[], &[0.25], 0);
        let y = b.op("Add", &[y, t]);
        let y = b.op("Relu", &[y]);
        let g = b.finish(&[y]);
        let mut m = g.clone();
        convs(&mut m).unwrap();
        assert_eq!(m.nodes[0].op, "Conv");
        let table = m.constant(m.nodes[0].inputs[2].unwrap()).unwrap().to_f64s().unwrap();
        crate::passes::fuse::run(&mut m).unwrap();
        ir::check(&m).unwrap();
        assert_agrees(&m, &g);
        let node = &m.nodes[0];
        assert_eq!((m.nodes.len(), node.attrs.text("post_ops").unwrap()), (1, "Relu"));
        let folded = m.constant(node.inputs[2].unwrap()).unwrap().to_f64s().unwrap();
        let value = |v| g.constant(v).unwrap().to_f64s().unwrap();
        let (k, bias) = (value(k), value(bias));
        for j in 0..16 {
            assert_eq!(folded[j] as f32, (table[j] * k[j]) as f32);
            assert_eq!(folded[16 + j], table[16 + j]);
            // Folded one map at a time: the Mul's, then the Add's.
            let scaled = (bias[j] * k[j]) as f32;
            assert_eq!(folded[32 + j] as f32, (f64::from(scaled) + 0.25) as f32);
        }
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
