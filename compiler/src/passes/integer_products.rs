//! Integer products to float: a `MatMulInteger` whose one reader is a `Cast` to float32 becomes
//! one `MatMulIntegerToFloat` step in the Cast's place (`ingot_ops`' quantize family), with
//! both zero points given (a zero where the model has none); a `ConvInteger` of constant
//! 8-bit W read so becomes `x - x_zero` (a DequantizeLinear by 1) and a Conv that reads W as
//! its levels ([`conv_to_float`]), which both backends run as they run int8-weight convs.
//!
//! That is what `onnxruntime.quantization.quantize_dynamic` writes for every MatMul of a
//! transformer: `DynamicQuantizeLinear`, `MatMulInteger`, `Cast`, a `Mul` by the two scales'
//! product and an `Add` of the bias. As three steps the product is written as int32, read and
//! written again as float32, then scaled and biased in two more passes. As one step the GEMM
//! writes float32 straight away, and `fuse` then takes the scale and the bias in as post-ops,
//! applied to each block while it is in cache: the same bits in one pass over the output.

use super::PassError;
use crate::ir::{Const, Graph, ValueId};
use ingot_ops::Constant as _;
use ingot_ops::{Tensor, TensorDesc};
use ingot_schema::{AttrValue, Attrs, DType};

pub fn run(g: &mut Graph) -> Result<(), PassError> {
    let producers = g.producers();
    let uses = g.use_counts();
    let mut rewrites = Vec::new();
    for (at, cast) in g.nodes.iter().enumerate() {
        let (Some(&Some(product)), Some(&y)) = (cast.inputs.first(), cast.outputs.first()) else {
            continue;
        };
        let to_f32 = cast.op == "Cast" && g.ty(y).is_some_and(|t| t.dtype == DType::F32);
        let Some(p) = producers[product].filter(|_| to_f32 && uses[product] == 1) else {
            continue;
        };
        if matches!(g.nodes[p].op.as_str(), "MatMulInteger" | "ConvInteger") {
            rewrites.push((at, p));
        }
    }
    for (at, p) in rewrites {
        let product = g.nodes[p].clone();
        let given = |name: &str| product.attrs.int(name).is_ok_and(|v| v != 0);
        let (a_name, b_name) = match product.op.as_str() {
            "ConvInteger" => ("x_zero_point", "w_zero_point"),
            _ => ("a_zero_point", "b_zero_point"),
        };
        let mut operands = product.inputs.iter().copied().flatten();
        let (Some(a), Some(b)) = (operands.next(), operands.next()) else {
            continue;
        };
        let (a_zero, b_zero) = (
            given(a_name).then(|| operands.next()).flatten(),
            given(b_name).then(|| operands.next()).flatten(),
        );
        if product.op == "ConvInteger" {
            conv_to_float(g, (p, at), (a, b), (a_zero, b_zero));
            continue;
        }
        let zero_point = |g: &mut Graph, of, given: Option<ValueId>| {
            given.or_else(|| {
                let dtype = g.ty(of)?.dtype;
                let name = format!("{}:zero_point", g.values[of].name);
                let zero = Tensor::zeros(TensorDesc::new(dtype, vec![]));
                Some(g.add_constant(name, Const::owned(zero)))
            })
        };
        let (Some(a_zp), Some(b_zp)) = (zero_point(g, a, a_zero), zero_point(g, b, b_zero)) else {
            continue;
        };
        let node = &mut g.nodes[at];
        node.op = "MatMulIntegerToFloat".into();
        node.inputs = vec![Some(a), Some(b), Some(a_zp), Some(b_zp)];
        node.attrs = no_post_ops();
    }
    // The MatMulIntegers are read by nobody now.
    super::dce::run(g)
}

fn no_post_ops() -> Attrs {
    Attrs::new()
        .with("post_ops", AttrValue::Text(String::new()))
        .with("post_params", AttrValue::Floats(Vec::new()))
}

/// `Cast(ConvInteger(x, w, x_zero, w_zero))` to float, with `w` and its zero point constant:
/// `x - x_zero` as a DequantizeLinear by 1 in the ConvInteger's place (node `p`), and in the
/// Cast's (`at`) a Conv that reads `w` as 8-bit levels with W's table (`ingot_ops`' conv
/// family: scale 1, the zero point, no bias). Its float32 sums are the int32 sums' value while
/// they stay below 2^24, as the products of 8-bit levels do unless a window holds hundreds of
/// them all near the extremes; past that they round as a float Conv does.
///
/// Where the Cast's one reader multiplies it by `x_scale * w_scale` (what `quantize_dynamic`
/// writes: the activation's scale, one value computed at run time, times the weight's, one
/// value or one per output channel), the scales go to the operands instead ([`scales`]):
/// the DequantizeLinear dequantizes x by x_scale, W's table holds w_scale, and the Conv takes
/// the Mul's place. `fuse` can then fold the bias that follows into W's table and take the
/// activation as a post-op, which a Mul by a run-time value kept out. The sums are then of
/// float products, each rounded once: within float32 rounding of the exact sums' scaled value.
fn conv_to_float(
    g: &mut Graph,
    (p, at): (usize, usize),
    (x, w): (ValueId, ValueId),
    (x_zero, w_zero): (Option<ValueId>, Option<ValueId>),
) -> Option<()> {
    let (x_type, w_type) = (g.ty(x)?.clone(), g.ty(w)?.clone());
    let m = *w_type.shape.first()?;
    g.constant(w)?;
    let scale_shape = match x_zero {
        Some(z) => g.ty(z)?.shape.clone(),
        None => vec![],
    };
    let scaled = scales(g, (p, at), (m, x_type.shape.len()), &scale_shape);
    let zeros = match w_zero {
        None => vec![0.0; m],
        Some(z) => match g.constant(z)?.to_f64s()?[..] {
            [z] => vec![z as f32; m],
            ref per_channel if per_channel.len() == m => {
                per_channel.iter().map(|&z| z as f32).collect()
            }
            _ => return None,
        },
    };
    let w_scales = scaled.as_ref().map_or_else(|| vec![1.0; m], |s| s.w_scales.clone());
    let table: Vec<f32> = [w_scales, zeros, vec![0.0; m]].concat();
    let table = Tensor::from_vec(ingot_ops::weight_table_shape(m).to_vec(), &table).ok()?;
    let one = Tensor::from_vec(scale_shape, &[1.0f32]).ok()?;
    let mut attrs = no_post_ops().with("dequantize_w", AttrValue::Int(1));
    for name in ["group", "kernel_shape", "strides", "dilations", "pads"] {
        attrs.set(name, g.nodes[p].attrs.get(name)?.clone());
    }
    // Nothing fails from here on.
    let name = g.values[x].name.clone();
    let x_scale = match &scaled {
        Some(s) => s.x_scale,
        None => g.add_constant(format!("{name}:one"), Const::owned(one)),
    };
    let table = g.add_constant(format!("{}:dequantization", g.values[w].name), Const::owned(table));
    let real = g.add_value(
        format!("{name}:levels"),
        Some(TensorDesc::new(DType::F32, x_type.shape.clone())),
    );
    let levels = &mut g.nodes[p];
    levels.op = "DequantizeLinear".into();
    levels.inputs = [Some(x), Some(x_scale)].into_iter().chain(x_zero.map(Some)).collect();
    levels.outputs = vec![real];
    levels.attrs = Attrs::new()
        .with("axis", AttrValue::Int(0))
        .with("block_size", AttrValue::Int(0))
        .with("to", AttrValue::Int(i64::from(DType::F32.onnx_code())));
    let conv = &mut g.nodes[at];
    conv.op = "Conv".into();
    conv.inputs = vec![Some(real), Some(w), Some(table)];
    conv.attrs = attrs;
    if let Some(s) = scaled {
        // The Conv writes the product's value; the Mul, its output renamed, is read by nobody.
        let product = g.nodes[s.mul].outputs[0];
        let unread = g.add_value(format!("{}:unread", g.values[product].name), None);
        g.nodes[s.mul].outputs = vec![unread];
        g.nodes[at].outputs = vec![product];
    }
    Some(())
}

/// The scales a ConvInteger's float product is multiplied by (see [`conv_to_float`]).
struct Scales {
    /// Node `mul` computes `Cast(product) * (x_scale * w_scale)`.
    mul: usize,
    /// One float32 value of `x_shape`, computed before the ConvInteger.
    x_scale: ValueId,
    /// One per output channel (a single value spread).
    w_scales: Vec<f32>,
}

/// The [`Scales`] of the ConvInteger at node `p`, cast to float at node `at`, of `m` output
/// channels and output rank `rank`, whose x scale must have the shape `x_shape` (its zero
/// point's); None unless the Cast's one reader is such a Mul.
fn scales(
    g: &Graph,
    (p, at): (usize, usize),
    (m, rank): (usize, usize),
    x_shape: &[usize],
) -> Option<Scales> {
    let real = *g.nodes[at].outputs.first()?;
    let (producers, uses) = (g.producers(), g.use_counts());
    let mul = g.nodes.iter().position(|n| n.op == "Mul" && n.inputs.contains(&Some(real)))?;
    let &[Some(a), Some(b)] = &g.nodes[mul].inputs[..] else { return None };
    let product = if a == real { b } else { a };
    let scales = &g.nodes[producers[product]?];
    let &[Some(u), Some(v)] = &scales.inputs[..] else { return None };
    if uses[real] != 1 || scales.op != "Mul" || product == real {
        return None;
    }
    // One value, or one per output channel ([M, 1, 1], [1, M, 1, 1]: along the output's
    // axis 1): the weight's scales, constant.
    let per_channel = |k: ValueId| {
        let c = g.constant(k)?;
        let values = c.to_f64s()?;
        let shape = &c.desc().shape;
        let lead = rank.checked_sub(shape.len())?;
        let channels =
            (shape.iter().enumerate()).all(|(d, &e)| if d + lead == 1 { e == m } else { e == 1 });
        let spread = match values[..] {
            [v] => vec![v as f32; m],
            _ if channels => values.iter().map(|&v| v as f32).collect(),
            _ => return None,
        };
        (c.desc().dtype == DType::F32).then_some(spread)
    };
    // The activation's: one float32 value of the zero point's shape, known before the conv.
    let one_value = |k: ValueId| {
        let t = g.ty(k)?;
        let early = producers[k].is_none_or(|q| q < p);
        (t.dtype == DType::F32 && t.shape == x_shape && early).then_some(k)
    };
    let (x_scale, w_scales) = match (one_value(u), per_channel(v)) {
        (Some(x), Some(w)) => (x, w),
        _ => (one_value(v)?, per_channel(u)?),
    };
    Some(Scales { mul, x_scale, w_scales })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir;
    use crate::passes::testing::{Builder, evaluate};

    fn constant<T: ingot_ops::Element>(
        b: &mut Builder,
        name: &str,
        dims: &[usize],
        v: &[T],
    ) -> usize {
        b.g.add_constant(name, Const::owned(Tensor::from_vec(dims.to_vec(), v).unwrap()))
    }

    /// `Cast(MatMulInteger(a, w, za?, zw?)) * s + bias` over a uint8 `a` [3, 5] and an int8
    /// `w` [5, 4]; with `both`, the zero points are given (zw one per column). With `keep`,
    /// the int32 product is a graph output too.
    fn dynamic_matmul(both: bool, keep: bool) -> Graph {
        let mut b = Builder::new();
        let a = b.g.add_value("a", Some(TensorDesc::new(DType::U8, vec![3, 5])));
        b.g.inputs.push(a);
        let w: Vec<i8> = (0..20).map(|i| (i * 37 % 255 - 127) as i8).collect();
        let w = constant(&mut b, "w", &[5, 4], &w);
        let mut inputs = vec![a, w];
        if both {
            inputs.push(constant(&mut b, "za", &[], &[131u8]));
            inputs.push(constant(&mut b, "zw", &[4], &[-3i8, 0, 5, 127]));
        }
        let product = b.op("MatMulInteger", &inputs);
        let to = Attrs::new().with("to", AttrValue::Int(i64::from(DType::F32.onnx_code())));
        let real = b.node("Cast", &[product], to);
        let s = constant(&mut b, "s", &[], &[0.0123f32]);
        let scaled = b.op("Mul", &[real, s]);
        let bias = constant(&mut b, "bias", &[4], &[0.5f32, -1.0, 2.0, 0.25]);
        let y = b.op("Add", &[scaled, bias]);
        let outputs = if keep { vec![y, product] } else { vec![y] };
        b.finish(&outputs)
    }

    fn rewritten(g: &Graph, ops: &[&str]) {
        let mut m = g.clone();
        run(&mut m).unwrap();
        super::super::fuse::run(&mut m).unwrap();
        ir::check(&m).unwrap();
        let left: Vec<&str> = m.nodes.iter().map(|n| n.op.as_str()).collect();
        assert_eq!(left, ops);
        let a: Vec<u8> = (0..15).map(|i| (i * 53 % 256) as u8).collect();
        let a = Tensor::from_vec(vec![3, 5], &a).unwrap();
        let (want, got) = (evaluate(g, std::slice::from_ref(&a)), evaluate(&m, &[a]));
        for (w, g) in want.iter().zip(&got) {
            assert_eq!(w.desc(), g.desc());
            assert_eq!(w.bytes(), g.bytes(), "the same bits");
        }
    }

    #[test]
    fn a_product_cast_to_float_becomes_one_step_with_its_scale_and_bias() {
        rewritten(&dynamic_matmul(true, false), &["MatMulIntegerToFloat"]);
        rewritten(&dynamic_matmul(false, false), &["MatMulIntegerToFloat"]);
    }

    /// `Cast(ConvInteger(x, w, zx, zw))` over a uint8 x [1, 4, 6, 5] and an int8 w
    /// [6, 2, 3, 3] in 2 groups, stride 2, padded, with a zero point per output channel; the
    /// builder and the Cast's output.
    fn dynamic_conv_product() -> (Builder, ValueId) {
        let mut b = Builder::new();
        let x = b.g.add_value("x", Some(TensorDesc::new(DType::U8, vec![1, 4, 6, 5])));
        b.g.inputs.push(x);
        let w: Vec<i8> = (0..108).map(|i| (i * 53 % 255 - 127) as i8).collect();
        let w = constant(&mut b, "w", &[6, 2, 3, 3], &w);
        let zx = constant(&mut b, "zx", &[], &[117u8]);
        let zw = constant(&mut b, "zw", &[6], &[0i8, -5, 3, 127, -128, 9]);
        let attrs = Attrs::new()
            .with("group", AttrValue::Int(2))
            .with("strides", AttrValue::Ints(vec![2, 2]))
            .with("pads", AttrValue::Ints(vec![1, 0, 1, 2]));
        let product = b.node("ConvInteger", &[x, w, zx, zw], attrs);
        let to = Attrs::new().with("to", AttrValue::Int(i64::from(DType::F32.onnx_code())));
        let real = b.node("Cast", &[product], to);
        (b, real)
    }

    /// [`dynamic_conv_product`] times s, a scalar input (the scale as dynamic quantization
    /// computes it: at run time).
    fn dynamic_conv() -> Graph {
        let (mut b, real) = dynamic_conv_product();
        let s = b.input("s", &[]);
        let y = b.op("Mul", &[real, s]);
        b.finish(&[y])
    }

    /// [`dynamic_conv_product`] as `quantize_dynamic` writes the rest: times x's scale (an
    /// input) times the weight's (one per output channel), then a bias and SiLU.
    fn dynamic_conv_with_bias_and_silu() -> Graph {
        let (mut b, real) = dynamic_conv_product();
        let x_scale = b.input("s", &[]);
        let w_scale = constant(&mut b, "w_scale", &[6, 1, 1], &[0.5f32, 0.25, 2.0, 1.5, 0.75, 1.0]);
        let scale = b.op("Mul", &[x_scale, w_scale]);
        let y = b.op("Mul", &[real, scale]);
        let bias = constant(&mut b, "bias", &[1, 6, 1, 1], &[0.1f32, -0.2, 0.3, 0.0, 1.0, -1.0]);
        let biased = b.op("Add", &[y, bias]);
        let gate = b.op("Sigmoid", &[biased]);
        let out = b.op("Mul", &[biased, gate]);
        b.finish(&[out])
    }

    /// Runs this pass and `fuse` on `g`; returns the result, its ops, and the first output of
    /// `g` and of the result on the same x and s.
    fn fused_conv(g: &Graph) -> (Graph, Vec<String>, [Vec<f32>; 2]) {
        let mut m = g.clone();
        run(&mut m).unwrap();
        super::super::fuse::run(&mut m).unwrap();
        ir::check(&m).unwrap();
        let ops = m.nodes.iter().map(|n| n.op.clone()).collect();
        let x: Vec<u8> = (0..120).map(|i| (i * 97 % 256) as u8).collect();
        let x = Tensor::from_vec(vec![1, 4, 6, 5], &x).unwrap();
        let s = Tensor::from_vec(vec![], &[0.0123f32]).unwrap();
        let outputs = [evaluate(g, &[x.clone(), s.clone()]), evaluate(&m, &[x, s])]
            .map(|o| o[0].to_vec::<f32>().unwrap());
        (m, ops, outputs)
    }

    #[test]
    fn a_conv_cast_to_float_reads_its_8_bit_weights_as_a_float_conv() {
        let (m, ops, [want, got]) = fused_conv(&dynamic_conv());
        assert_eq!(ops, ["DequantizeLinear", "Conv"]);
        assert!(ingot_ops::dequantizes_w(&m.nodes[1].attrs));
        assert_eq!(m.nodes[1].attrs.text("post_ops").unwrap(), "Mul");
        // Sums of a few dozen 8-bit products: float32 holds them exactly.
        assert_eq!(want, got);
    }

    #[test]
    fn the_scales_of_a_dynamic_conv_move_to_its_operands() {
        let (m, ops, [want, got]) = fused_conv(&dynamic_conv_with_bias_and_silu());
        assert_eq!(ops, ["DequantizeLinear", "Conv"], "the bias folds, SiLU is a post-op");
        assert_eq!(m.nodes[1].attrs.text("post_ops").unwrap(), "Swish");
        assert_eq!(m.nodes[0].inputs[1], Some(m.inputs[1]), "x is dequantized by its scale");
        // Sums of float products, each rounded once, against exact sums scaled: within
        // float32 rounding of the largest output (the sums cancel: outputs near 0.25 come
        // from terms in the hundreds).
        let largest = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (w, g) in want.iter().zip(&got) {
            assert!((w - g).abs() <= 1e-6 * largest, "{g}, want {w} (largest {largest})");
        }
    }

    #[test]
    fn a_product_read_elsewhere_stays() {
        rewritten(&dynamic_matmul(true, true), &["MatMulInteger", "Cast", "Mul", "Add"]);
    }
}
