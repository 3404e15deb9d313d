use crate::cpu::eval;
use crate::{Tensor, TensorDesc};
use half::f16;
use ingot_schema::{AttrValue, Attrs, DType};

fn linear(axis: i64, block: i64, to: DType, precision: DType) -> Attrs {
    Attrs::new()
        .with("axis", AttrValue::Int(axis))
        .with("block_size", AttrValue::Int(block))
        .with("to", AttrValue::Int(i64::from(to.onnx_code())))
        .with("precision", AttrValue::Int(i64::from(precision.onnx_code())))
}

fn t<T: crate::Element>(shape: &[usize], v: &[T]) -> Tensor {
    Tensor::from_vec(shape.to_vec(), v).unwrap()
}

fn run(op: &str, attrs: &Attrs, inputs: &[&Tensor], out: &[TensorDesc]) -> Vec<Tensor> {
    eval(op, attrs, inputs, out).unwrap()
}

#[test]
fn dequantize_per_tensor_axis_and_block() {
    // ONNX's example: (x - 128) * 2.
    let a = linear(0, 0, DType::F32, DType::F32);
    let x = t(&[4], &[0u8, 3, 128, 255]);
    let y = run(
        "DequantizeLinear",
        &a,
        &[&x, &t(&[], &[2f32]), &t(&[], &[128u8])],
        &[TensorDesc::new(DType::F32, [4])],
    );
    assert_eq!(y[0].to_vec::<f32>().unwrap(), [-256.0, -250.0, 0.0, 254.0]);
    // Per axis 1 of [2, 3, 2], int8 with zero points.
    let x = t(&[2, 3, 2], &[-128i8, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 127]);
    let s = t(&[3], &[1f32, 0.5, 0.25]);
    let z = t(&[3], &[0i8, 2, -4]);
    let a = linear(1, 0, DType::F32, DType::F32);
    let y = run("DequantizeLinear", &a, &[&x, &s, &z], &[TensorDesc::new(DType::F32, [2, 3, 2])]);
    assert_eq!(
        y[0].to_vec::<f32>().unwrap(),
        [-128.0, 0.0, -0.5, 0.0, 1.75, 2.0, 5.0, 6.0, 2.5, 3.0, 3.25, 32.75]
    );
    // Blocks of 2 along the last axis of [2, 3] (the last block short), f16 scales into f16.
    let a = linear(1, 2, DType::F16, DType::F32);
    let x = t(&[2, 3], &[10u16, 20, 30, 40, 50, 60]);
    let s = t(&[2, 2], &[1.0, 0.5, 2.0, 0.25].map(f16::from_f32));
    let y = run("DequantizeLinear", &a, &[&x, &s], &[TensorDesc::new(DType::F16, [2, 3])]);
    let want = [10.0, 20.0, 15.0, 80.0, 100.0, 15.0].map(f16::from_f32);
    assert_eq!(y[0].to_vec::<f16>().unwrap(), want);
}

#[test]
fn quantize_rounds_half_to_even_and_saturates() {
    // ONNX's example: x / 2 + 128, 1.5 rounding to 2, saturated.
    let a = linear(0, 0, DType::U8, DType::F32);
    let x = t(&[6], &[0f32, 2.0, 3.0, 1000.0, -254.0, -1000.0]);
    let y = run(
        "QuantizeLinear",
        &a,
        &[&x, &t(&[], &[2f32]), &t(&[], &[128u8])],
        &[TensorDesc::new(DType::U8, [6])],
    );
    assert_eq!(y[0].to_vec::<u8>().unwrap(), [128, 129, 130, 255, 1, 0]);
    // int8 per axis 0, no zero point; 2.5 and -2.5 go to the even neighbours.
    let a = linear(0, 0, DType::I8, DType::F32);
    let x = t(&[2, 3], &[2.5f32, -2.5, 3.5, 1000.0, -1000.0, 0.75]);
    let s = t(&[2], &[1f32, 0.5]);
    let y = run("QuantizeLinear", &a, &[&x, &s], &[TensorDesc::new(DType::I8, [2, 3])]);
    assert_eq!(y[0].to_vec::<i8>().unwrap(), [2, -2, 4, 127, -128, 2]);
}

#[test]
fn quantize_in_float16_rounds_the_quotient_first() {
    // 1.5009765625 / 1.0 in f16 is itself, which rounds to 2; the f16 quotient of 2049 / 2048
    // is 1.0 (f16 has 10 bits), which rounds to 1 where f32's 1.00049 would too: pick a case
    // where they differ, 2.5 + 2^-11, an f32 value whose f16 rounding is 2.5 (then even: 2).
    let x = t(&[1], &[f16::from_f32(2.5)]);
    let s = t(&[], &[f16::from_f32(1.0)]);
    let a = linear(0, 0, DType::U8, DType::F16);
    let y = run("QuantizeLinear", &a, &[&x, &s], &[TensorDesc::new(DType::U8, [1])]);
    assert_eq!(y[0].to_vec::<u8>().unwrap(), [2]);
    let x = t(&[1], &[2.5f32 + 1.0 / 2048.0]);
    for (precision, want) in [(DType::F32, 3u8), (DType::F16, 2)] {
        let a = linear(0, 0, DType::U8, precision);
        let y =
            run("QuantizeLinear", &a, &[&x, &t(&[], &[1f32])], &[TensorDesc::new(DType::U8, [1])]);
        assert_eq!(y[0].to_vec::<u8>().unwrap(), [want], "{precision}");
    }
}

#[test]
fn dynamic_quantize_maps_zero_exactly() {
    // ONNX's example.
    let x = t(&[6], &[0f32, 2.0, -3.0, -2.5, 1.34, 0.5]);
    let out = [
        TensorDesc::new(DType::U8, [6]),
        TensorDesc::new(DType::F32, []),
        TensorDesc::new(DType::U8, []),
    ];
    let y = run("DynamicQuantizeLinear", &Attrs::new(), &[&x], &out);
    assert_eq!(y[0].to_vec::<u8>().unwrap(), [153, 255, 0, 26, 221, 179]);
    assert_eq!(y[1].to_vec::<f32>().unwrap(), [5.0f32 / 255.0]);
    assert_eq!(y[2].to_vec::<u8>().unwrap(), [153]);
    // All zeros: scale 1/255, zero point 0.
    let y = run("DynamicQuantizeLinear", &Attrs::new(), &[&t(&[6], &[0f32; 6])], &out);
    assert_eq!((y[0].to_vec::<u8>().unwrap(), y[2].to_vec::<u8>().unwrap()), (vec![0; 6], vec![0]));
}

fn integer(a_zero: bool, b_zero: bool) -> Attrs {
    Attrs::new()
        .with("a_zero_point", AttrValue::Int(i64::from(a_zero)))
        .with("b_zero_point", AttrValue::Int(i64::from(b_zero)))
}

/// Deterministic bytes.
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 56) as u8
        })
        .collect()
}

#[test]
fn integer_products_are_exact_past_float32s_integers() {
    // A all 255 minus 0, B all -128 minus 127: every product is -65025, and a contraction of
    // 1000 sums to -65,025,000, far past 2^24 where float32 stops holding every integer.
    let (m, k, n) = (3, 1000, 5);
    let a = t(&[m, k], &vec![255u8; m * k]);
    let b = t(&[k, n], &vec![-128i8; k * n]);
    let out = [TensorDesc::new(DType::I32, [m, n])];
    let y = run(
        "MatMulInteger",
        &integer(true, true),
        &[&a, &b, &t(&[], &[0u8]), &t(&[], &[127i8])],
        &out,
    );
    assert_eq!(y[0].to_vec::<i32>().unwrap(), vec![-65_025_000; m * n]);
    // Random operands, B batched [2, k, n] with a zero point per column of each matrix.
    let (av, bv) = (bytes(m * k, 1), bytes(2 * k * n, 2));
    let bi: Vec<i8> = bv.iter().map(|&v| v as i8).collect();
    let zb: Vec<i8> = (0..2 * n).map(|j| j as i8 * 7 - 30).collect();
    let a = t(&[m, k], &av);
    let b = t(&[2, k, n], &bi);
    let (za, zbt) = (t(&[1], &[100u8]), t(&[2, 1, n], &zb));
    let out = [TensorDesc::new(DType::I32, [2, m, n])];
    let y = run("MatMulInteger", &integer(true, true), &[&a, &b, &za, &zbt], &out);
    let mut want = vec![0i64; 2 * m * n];
    for g in 0..2 {
        for i in 0..m {
            for j in 0..n {
                want[(g * m + i) * n + j] = (0..k)
                    .map(|p| {
                        (i64::from(av[i * k + p]) - 100)
                            * (i64::from(bi[(g * k + p) * n + j]) - i64::from(zb[g * n + j]))
                    })
                    .sum();
            }
        }
    }
    let got: Vec<i64> = y[0].to_vec::<i32>().unwrap().into_iter().map(i64::from).collect();
    assert_eq!(got, want);
    // Without zero points.
    let y = run("MatMulInteger", &integer(false, false), &[&a, &b], &out);
    let plain: i64 = (0..k).map(|p| i64::from(av[p]) * i64::from(bi[p * n])).sum();
    assert_eq!(i64::from(y[0].to_vec::<i32>().unwrap()[0]), plain);
    // A 2-D uint8 B with a zero point per column, which the GEMM reads as levels, against
    // one and several rows of A (the vector and the blocked products).
    for rows in [1, m] {
        let bu = bytes(k * n, 3);
        let zu: Vec<u8> = (0..n).map(|j| (j * 50) as u8).collect();
        let a = t(&[rows, k], &av[..rows * k]);
        let (b, za, zb) = (t(&[k, n], &bu), t(&[], &[7u8]), t(&[n], &zu));
        let out = [TensorDesc::new(DType::I32, [rows, n])];
        let y = run("MatMulInteger", &integer(true, true), &[&a, &b, &za, &zb], &out);
        let want: Vec<i64> = (0..rows * n)
            .map(|e| {
                let (i, j) = (e / n, e % n);
                (0..k)
                    .map(|p| {
                        (i64::from(av[i * k + p]) - 7)
                            * (i64::from(bu[p * n + j]) - i64::from(zu[j]))
                    })
                    .sum()
            })
            .collect();
        let got: Vec<i64> = y[0].to_vec::<i32>().unwrap().into_iter().map(i64::from).collect();
        assert_eq!(got, want, "{rows} rows");
    }
}

/// MatMulIntegerToFloat with post-ops `ops` against MatMulInteger, a Cast and the post-ops
/// as their own kernels, to the bit.
fn integer_to_float_is_its_steps(
    a: &Tensor,
    b: &Tensor,
    zeros: [&Tensor; 2],
    ops: &str,
    extras: &[&Tensor],
) {
    let shape = crate::matmul::matmul_shape(&a.desc().shape, &b.desc().shape).unwrap();
    let int32 = [TensorDesc::new(DType::I32, shape.clone())];
    let product = run("MatMulInteger", &integer(true, true), &[a, b, zeros[0], zeros[1]], &int32);
    let real = TensorDesc::new(DType::F32, shape.clone());
    let cast = Attrs::new().with("to", AttrValue::Int(i64::from(DType::F32.onnx_code())));
    let real_product = run("Cast", &cast, &[&product[0]], std::slice::from_ref(&real));
    let want = crate::cpu::post::tests::unfused(real_product[0].clone(), ops, &[], extras);
    let attrs = crate::cpu::post::tests::with_post(Attrs::new(), ops, &[]);
    let mut inputs = vec![a, b, zeros[0], zeros[1]];
    inputs.extend(extras);
    let got = run("MatMulIntegerToFloat", &attrs, &inputs, &[real]);
    assert_eq!(got[0].to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap(), "{ops}, {shape:?}");
}

#[test]
fn an_integer_product_to_float_is_the_product_cast_then_its_post_ops() {
    let n = 6;
    let scale = t(&[n], &(0..n).map(|j| 0.001 + j as f32 * 3e-4).collect::<Vec<_>>());
    let bias = t(&[n], &(0..n).map(|j| j as f32 * 0.37 - 1.0).collect::<Vec<_>>());
    // One piece of the contraction (the GEMM writes the output) and four (int32 first).
    for k in [40, 1000] {
        for rows in [1, 5] {
            let a = t(&[rows, k], &bytes(rows * k, 4));
            let bi: Vec<i8> = bytes(k * n, 5).iter().map(|&v| v as i8).collect();
            let b = t(&[k, n], &bi);
            let za = t(&[], &[129u8]);
            let zb = t(&[n], &(0..n).map(|j| j as i8 * 9 - 20).collect::<Vec<_>>());
            let residual =
                t(&[rows, n], &(0..rows * n).map(|e| e as f32 * 0.5).collect::<Vec<_>>());
            integer_to_float_is_its_steps(&a, &b, [&za, &zb], "", &[]);
            integer_to_float_is_its_steps(&a, &b, [&za, &zb], "Mul,Add,Relu", &[&scale, &bias]);
            // A leading Add: the product lands on the residual.
            integer_to_float_is_its_steps(&a, &b, [&za, &zb], "Add,Mul", &[&residual, &scale]);
        }
    }
    // A batched B, which the GEMM cannot read as one matrix of levels.
    let a = t(&[3, 20], &bytes(60, 6));
    let b = t(&[2, 20, n], &bytes(2 * 20 * n, 7));
    integer_to_float_is_its_steps(&a, &b, [&t(&[], &[3u8]), &t(&[], &[250u8])], "Mul", &[&scale]);
}

#[test]
fn qlinear_matmul_requantizes_as_the_reference() {
    // ONNX's test_qlinearmatmul_2D_uint8_float32.
    let a = t(&[2, 4], &[208u8, 236, 0, 238, 3, 214, 255, 29]);
    let b = t(&[4, 3], &[152u8, 51, 244, 60, 26, 255, 0, 127, 246, 127, 254, 247]);
    let s = |v: f32| t(&[], &[v]);
    let z = |v: u8| t(&[], &[v]);
    let inputs = [&a, &s(0.0066), &z(113), &b, &s(0.00705), &z(114), &s(0.0107), &z(118)];
    let y = run("QLinearMatMul", &Attrs::new(), &inputs, &[TensorDesc::new(DType::U8, [2, 3])]);
    assert_eq!(y[0].to_vec::<u8>().unwrap(), [168, 115, 255, 1, 66, 151]);
}

#[test]
fn misfit_steps_are_errors_not_panics() {
    let a = linear(1, 0, DType::F32, DType::F32);
    let x = t(&[2, 3], &[0u8; 6]);
    let bad = eval(
        "DequantizeLinear",
        &a,
        &[&x, &t(&[2], &[1f32, 2.0])],
        &[TensorDesc::new(DType::F32, [2, 3])],
    );
    assert!(bad.is_err());
    let bad = eval(
        "DequantizeLinear",
        &a,
        &[&x, &t(&[], &[1f32])],
        &[TensorDesc::new(DType::F32, [3, 2])],
    );
    assert!(bad.is_err());
    let bad = eval(
        "MatMulInteger",
        &integer(false, false),
        &[&x, &x],
        &[TensorDesc::new(DType::I32, [2, 3])],
    );
    assert!(bad.is_err());
}

#[test]
fn float32_levels_are_the_float64_paths_levels() {
    use super::{Level, Precision, level, level_f32};
    fn check<Q: Level + PartialEq + std::fmt::Debug>(zero_points: &[i32]) {
        let scales = [1.0f32, 0.5, 0.1, 3.0e-3, 7.0, 1.0e-30];
        let mut xs: Vec<f32> = (-600..600).map(|i| i as f32 * 0.25).collect();
        xs.extend((0..2000).map(|i| ((i * 7919) % 100_003) as f32 * 1.37 - 60_000.0));
        xs.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 8.4e6, -8.4e6, 1.0e30, -0.0]);
        for &s in &scales {
            for &z in zero_points {
                for &x in &xs {
                    let want: Q = level(Precision::F32.ratio(f64::from(x), s), z);
                    let got: Q = level_f32(x, s, z as f32);
                    assert_eq!(got, want, "x {x}, scale {s}, zero point {z}");
                }
            }
        }
    }
    check::<i8>(&[0, -128, 127, 3]);
    check::<u8>(&[0, 128, 255]);
    check::<i16>(&[0, -32768, 32767, 100]);
    check::<u16>(&[0, 32768, 65535]);
}

#[test]
fn a_round_trip_is_its_two_steps_to_the_bit() {
    // Per tensor and per axis 1 of [3, 4]; halves, saturation, infinities and NaN.
    let mut x: Vec<f32> = (0..12).map(|i| (i as f32 - 6.0) * 0.125).collect();
    x[0] = f32::NAN;
    x[1] = f32::INFINITY;
    x[11] = -1.0e9;
    let x = t(&[3, 4], &x);
    let f32_out = [TensorDesc::new(DType::F32, vec![3, 4])];
    for (scale, zero) in [
        (t(&[], &[0.25f32]), t(&[], &[-3i8])),
        (t(&[4], &[0.25f32, 0.5, 1.0e-3, 2.0]), t(&[4], &[0i8, 127, -128, 5])),
    ] {
        let q = linear(1, 0, DType::I8, DType::F32);
        let levels = run(
            "QuantizeLinear",
            &q,
            &[&x, &scale, &zero],
            &[TensorDesc::new(DType::I8, vec![3, 4])],
        );
        let dq = linear(1, 0, DType::F32, DType::F32);
        let want = run("DequantizeLinear", &dq, &[&levels[0], &scale, &zero], &f32_out);
        let got = run("QuantizeDequantize", &q, &[&x, &scale, &zero], &f32_out);
        assert_eq!(got[0].bytes(), want[0].bytes(), "scale {:?}", scale.as_slice::<f32>());
    }
    // Float16 is not one of its types.
    let h = t(&[2], &[f16::ONE, f16::ONE]);
    let q = linear(0, 0, DType::I8, DType::F32);
    let out = [TensorDesc::new(DType::F32, vec![2])];
    assert!(eval("QuantizeDequantize", &q, &[&h, &t(&[], &[1f32])], &out).is_err());
}
