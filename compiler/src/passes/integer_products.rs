//! Integer products to float: a `MatMulInteger` whose one reader is a `Cast` to float32 becomes
//! one `MatMulIntegerToFloat` step in the Cast's place (`ingot_ops`' quantize family), with
//! both zero points given (a zero where the model has none).
//!
//! That is what `onnxruntime.quantization.quantize_dynamic` writes for every MatMul of a
//! transformer: `DynamicQuantizeLinear`, `MatMulInteger`, `Cast`, a `Mul` by the two scales'
//! product and an `Add` of the bias. As three steps the product is written as int32, read and
//! written again as float32, then scaled and biased in two more passes. As one step the GEMM
//! writes float32 straight away, and `fuse` then takes the scale and the bias in as post-ops,
//! applied to each block while it is in cache: the same bits in one pass over the output.

use super::PassError;
use crate::ir::{Const, Graph};
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
        if g.nodes[p].op == "MatMulInteger" {
            rewrites.push((at, p));
        }
    }
    for (at, p) in rewrites {
        let product = g.nodes[p].clone();
        let given = |name: &str| product.attrs.int(name).is_ok_and(|v| v != 0);
        let (a_zero, b_zero) = (given("a_zero_point"), given("b_zero_point"));
        let mut operands = product.inputs.iter().copied().flatten();
        let (Some(a), Some(b)) = (operands.next(), operands.next()) else {
            continue;
        };
        let mut zero_point = |g: &mut Graph, of, given: bool| match given {
            true => operands.next(),
            false => {
                let dtype = g.ty(of)?.dtype;
                let name = format!("{}:zero_point", g.values[of].name);
                let zero = Tensor::zeros(TensorDesc::new(dtype, vec![]));
                Some(g.add_constant(name, Const::owned(zero)))
            }
        };
        let (Some(a_zp), Some(b_zp)) = (zero_point(g, a, a_zero), zero_point(g, b, b_zero)) else {
            continue;
        };
        let node = &mut g.nodes[at];
        node.op = "MatMulIntegerToFloat".into();
        node.inputs = vec![Some(a), Some(b), Some(a_zp), Some(b_zp)];
        node.attrs = Attrs::new()
            .with("post_ops", AttrValue::Text(String::new()))
            .with("post_params", AttrValue::Floats(Vec::new()));
    }
    // The MatMulIntegers are read by nobody now.
    super::dce::run(g)
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

    #[test]
    fn a_product_read_elsewhere_stays() {
        rewritten(&dynamic_matmul(true, true), &["MatMulInteger", "Cast", "Mul", "Add"]);
    }
}
