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
fn conv_to_float(
    g: &mut Graph,
    (p, at): (usize, usize),
    (x, w): (ValueId, ValueId),
    (x_zero, w_zero): (Option<ValueId>, Option<ValueId>),
) -> Option<()> {
    let (x_type, w_type) = (g.ty(x)?.clone(), g.ty(w)?.clone());
    let m = *w_type.shape.first()?;
    g.constant(w)?;
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
    let table: Vec<f32> = [vec![1.0; m], zeros, vec![0.0; m]].concat();
    let table = Tensor::from_vec(ingot_ops::weight_table_shape(m).to_vec(), &table).ok()?;
    let scale_shape = match x_zero {
        Some(z) => g.ty(z)?.shape.clone(),
        None => vec![],
    };
    let one = Tensor::from_vec(scale_shape, &[1.0f32]).ok()?;
    let mut attrs = no_post_ops().with("dequantize_w", AttrValue::Int(1));
    for name in ["group", "kernel_shape", "strides", "dilations", "pads"] {
        attrs.set(name, g.nodes[p].attrs.get(name)?.clone());
    }
    // Nothing fails from here on.
    let name = g.values[x].name.clone();
    let one = g.add_constant(format!("{name}:one"), Const::owned(one));
    let table = g.add_constant(format!("{}:dequantization", g.values[w].name), Const::owned(table));
    let real = g.add_value(
        format!("{name}:levels"),
        Some(TensorDesc::new(DType::F32, x_type.shape.clone())),
    );
    let levels = &mut g.nodes[p];
    levels.op = "DequantizeLinear".into();
    levels.inputs = [Some(x), Some(one)].into_iter().chain(x_zero.map(Some)).collect();
    levels.outputs = vec![real];
    levels.attrs = Attrs::new()
        .with("axis", AttrValue::Int(0))
        .with("block_size", AttrValue::Int(0))
        .with("to", AttrValue::Int(i64::from(DType::F32.onnx_code())));
    let conv = &mut g.nodes[at];
    conv.op = "Conv".into();
    conv.inputs = vec![Some(real), Some(w), Some(table)];
    conv.attrs = attrs;
    Some(())
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

    /// `Cast(ConvInteger(x, w, zx, zw)) * s` over a uint8 x [1, 4, 6, 5] and an int8 w
    /// [6, 2, 3, 3] in 2 groups, stride 2, padded, with a zero point per output channel; s a
    /// scalar input.
    fn dynamic_conv() -> Graph {
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
        // The scale as dynamic quantization computes it: at run time.
        let s = b.input("s", &[]);
        let y = b.op("Mul", &[real, s]);
        b.finish(&[y])
    }

    #[test]
    fn a_conv_cast_to_float_reads_its_8_bit_weights_as_a_float_conv() {
        let g = dynamic_conv();
        let mut m = g.clone();
        run(&mut m).unwrap();
        super::super::fuse::run(&mut m).unwrap();
        ir::check(&m).unwrap();
        let left: Vec<&str> = m.nodes.iter().map(|n| n.op.as_str()).collect();
        assert_eq!(left, ["DequantizeLinear", "Conv"]);
        assert!(ingot_ops::dequantizes_w(&m.nodes[1].attrs));
        assert_eq!(m.nodes[1].attrs.text("post_ops").unwrap(), "Mul");
        let x: Vec<u8> = (0..120).map(|i| (i * 97 % 256) as u8).collect();
        let x = Tensor::from_vec(vec![1, 4, 6, 5], &x).unwrap();
        let s = Tensor::from_vec(vec![], &[0.0123f32]).unwrap();
        let (want, got) = (evaluate(&g, &[x.clone(), s.clone()]), evaluate(&m, &[x, s]));
        // Sums of a few dozen 8-bit products: float32 holds them exactly.
        assert_eq!(want[0].to_vec::<f32>().unwrap(), got[0].to_vec::<f32>().unwrap());
    }

    #[test]
    fn a_product_read_elsewhere_stays() {
        rewritten(&dynamic_matmul(true, true), &["MatMulInteger", "Cast", "Mul", "Add"]);
    }
}
