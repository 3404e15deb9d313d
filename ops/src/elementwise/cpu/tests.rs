//! Tests of the elementwise family; expected values are computed by hand unless a comment
//! names the script that produced them.

use crate::cpu::{KernelError, OpCx, eval, prepare};
use crate::tensor::{Element, Tensor, TensorDesc};
use half::f16;
use ingot_schema::{AttrValue, Attrs, DType};

fn t<T: Element>(shape: &[usize], data: &[T]) -> Tensor {
    Tensor::from_vec(shape.to_vec(), data).unwrap()
}

fn bools(shape: &[usize], data: &[u8]) -> Tensor {
    Tensor::from_bytes(TensorDesc::new(DType::Bool, shape), data).unwrap()
}

fn try_run(
    op: &str,
    attrs: &Attrs,
    inputs: &[&Tensor],
    dtype: DType,
    shape: &[usize],
) -> Result<Tensor, KernelError> {
    eval(op, attrs, inputs, &[TensorDesc::new(dtype, shape)]).map(|mut v| v.remove(0))
}

fn run(op: &str, attrs: &Attrs, inputs: &[&Tensor], dtype: DType, shape: &[usize]) -> Tensor {
    try_run(op, attrs, inputs, dtype, shape).unwrap_or_else(|e| panic!("{op}: {e}"))
}

/// A binary op whose output has the first input's type and the broadcast shape given.
fn bin(op: &str, a: &Tensor, b: &Tensor, shape: &[usize]) -> Tensor {
    run(op, &Attrs::new(), &[a, b], a.dtype(), shape)
}

fn float(v: f64) -> AttrValue {
    AttrValue::Float(v)
}
fn int(v: i64) -> AttrValue {
    AttrValue::Int(v)
}

fn close(got: &[f32], want: &[f32], tol: f32) -> bool {
    got.len() == want.len()
        && got.iter().zip(want).all(|(&g, &w)| {
            (g == w) || (g.is_nan() && w.is_nan()) || (g - w).abs() <= tol * (1.0 + w.abs())
        })
}

enum A {
    F(f64),
    T(&'static str),
}
use A::{F, T};

type Case = (&'static str, &'static [(&'static str, A)], &'static [f32], &'static [f32]);

// (op, attributes, x, y) with y from onnxruntime 1.31 on f32, by this script:
// # Expected outputs of the unary float ops from onnxruntime (opset 20).
// import numpy as np, onnx, onnxruntime as ort
// from onnx import helper, TensorProto
// X = [-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5]
// UNIT = [-0.9, -0.5, 0.0, 0.3, 0.9]
// POS = [0.1, 0.5, 1.0, 2.5, 10.0]
// GE1 = [1.0, 1.5, 3.0, 10.0]
// cases = [
//  ("Ceil", {}, X), ("Floor", {}, X), ("Round", {}, [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.6, -2.4]),
//  ("Sqrt", {}, POS), ("Reciprocal", {}, X[:3] + X[4:]), ("Exp", {}, X), ("Log", {}, POS),
//  ("Sin", {}, X), ("Cos", {}, X), ("Tan", {}, X), ("Asin", {}, UNIT), ("Acos", {}, UNIT),
//  ("Atan", {}, X), ("Sinh", {}, X), ("Cosh", {}, X), ("Tanh", {}, X), ("Asinh", {}, X),
//  ("Acosh", {}, GE1), ("Atanh", {}, UNIT), ("Sigmoid", {}, X), ("Erf", {}, X),
//  ("LeakyRelu", {"alpha": 0.1}, X), ("Elu", {"alpha": 0.5}, X),
//  ("Selu", {"alpha": 1.5, "gamma": 2.0}, X), ("Celu", {"alpha": 2.0}, X),
//  ("HardSigmoid", {"alpha": 0.25, "beta": 0.4}, X), ("HardSwish", {}, X + [-4.0, 5.0]),
//  ("Softplus", {}, X + [30.0, -30.0]), ("Softsign", {}, X), ("Mish", {}, X),
//  ("Gelu", {"approximate": "none"}, X), ("Gelu", {"approximate": "tanh"}, X),
//  ("ThresholdedRelu", {"alpha": 0.5}, X), ("Swish", {"alpha": 0.75}, X + [-100.0, 100.0]),
// ]
// for op, attrs, xs in cases:
//     node = helper.make_node(op, ["x"], ["y"], **attrs)
//     g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [len(xs)])],
//                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, [len(xs)])])
//     m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)
//     s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
//     y = s.run(None, {"x": np.array(xs, np.float32)})[0]
//     a = ", ".join(f'("{k}", T("{v}"))' if isinstance(v, str) else f'("{k}", F({float(v)!r}))' for k, v in attrs.items())
//     f32 = lambda vs: "[" + ", ".join(str(np.float32(v)) for v in vs) + "]"
//     print(f'    ("{op}", &[{a}], &{f32(xs)}, &{f32(y)}),')
#[rustfmt::skip]
#[allow(clippy::approx_constant)] // printed values, not constants
const UNARY_FLOAT: &[Case] = &[
    ("Ceil", &[], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5], &[-3.0, -1.0, -0.0, 0.0, 1.0, 1.0, 1.0, 2.0, 4.0]),
    ("Floor", &[], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5], &[-3.0, -2.0, -1.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0]),
    ("Round", &[], &[-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.6, -2.4], &[-2.0, -2.0, -0.0, 0.0, 2.0, 2.0, 3.0, -2.0]),
    ("Sqrt", &[], &[0.1, 0.5, 1.0, 2.5, 10.0], &[0.31622776, 0.70710677, 1.0, 1.5811388, 3.1622777]),
    ("Reciprocal", &[], &[-3.0, -1.5, -0.5, 0.25, 0.5, 1.0, 2.0, 3.5], &[-0.33333334, -0.6666667, -2.0, 4.0, 2.0, 1.0, 0.5, 0.2857143]),
    ("Exp", &[], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5], &[0.049787067, 0.22313017, 0.60653067, 1.0, 1.2840254, 1.6487212, 2.7182817, 7.389056, 33.11545]),
    ("Log", &[], &[0.1, 0.5, 1.0, 2.5, 10.0], &[-2.3025851, -0.6931472, 0.0, 0.91629076, 2.3025851]),
    ("Sin", &[], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5], &[-0.14112, -0.997495, -0.47942555, 0.0, 0.24740396, 0.47942555, 0.84147096, 0.9092974, -0.35078323]),
    ("Cos", &[], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5], &[-0.9899925, 0.0707372, 0.87758255, 1.0, 0.9689124, 0.87758255, 0.5403023, -0.4161468, -0.9364567]),
    ("Tan", &[], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5], &[0.14254655, -14.10142, -0.5463025, 0.0, 0.25534192, 0.5463025, 1.5574077, -2.1850398, 0.37458563]),
    ("Asin", &[], &[-0.9, -0.5, 0.0, 0.3, 0.9], &[-1.1197696, -0.52359873, 0.0, 0.3046927, 1.1197695]),
    ("Acos", &[], &[-0.9, -0.5, 0.0, 0.3, 0.9], &[2.6905658, 2.0943952, 1.5707964, 1.2661039, 0.45102686]),
    ("Atan", &[], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5], &[-1.2490458, -0.9827938, -0.46364754, 0.0, 0.24497868, 0.46364754, 0.7853981, 1.1071489, 1.2924967]),
    ("Sinh", &[], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5], &[-10.017875, -2.1292794, -0.5210953, 0.0, 0.25261232, 0.5210953, 1.1752012, 3.6268604, 16.542627]),
    ("Cosh", &[], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5], &[10.067662, 2.3524096, 1.127626, 1.0, 1.0314131, 1.127626, 1.5430806, 3.7621958, 16.572824]),
    ("Tanh", &[], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5], &[-0.9950547, -0.9051482, -0.46211717, 0.0, 0.24491866, 0.46211717, 0.7615942, 0.9640276, 0.99817795]),
    ("Asinh", &[], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5], &[-1.8184465, -1.1947632, -0.48121184, 0.0, 0.24746647, 0.48121184, 0.8813736, 1.4436355, 1.9657205]),
    ("Acosh", &[], &[1.0, 1.5, 3.0, 10.0], &[0.0, 0.9624237, 1.7627472, 2.993223]),
    ("Atanh", &[], &[-0.9, -0.5, 0.0, 0.3, 0.9], &[-1.4722193, -0.54930615, 0.0, 0.30951962, 1.4722193]),
    ("Sigmoid", &[], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5], &[0.047425866, 0.18242556, 0.3775407, 0.5, 0.56217647, 0.6224593, 0.7310586, 0.8807971, 0.9706878]),
    ("Erf", &[], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5], &[-0.9999779, -0.96610516, -0.5204999, 0.0, 0.2763264, 0.5204999, 0.8427008, 0.9953223, 0.9999993]),
    ("LeakyRelu", &[("alpha", F(0.1))], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5], &[-0.3, -0.15, -0.05, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5]),
    ("Elu", &[("alpha", F(0.5))], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5], &[-0.47510648, -0.38843492, -0.19673467, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5]),
    ("Selu", &[("alpha", F(1.5)), ("gamma", F(2.0))], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5], &[-2.8506389, -2.3306096, -1.180408, 0.0, 0.5, 1.0, 2.0, 4.0, 7.0]),
    ("Celu", &[("alpha", F(2.0))], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5], &[-1.5537397, -1.0552669, -0.44239843, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5]),
    ("HardSigmoid", &[("alpha", F(0.25)), ("beta", F(0.4))], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5], &[0.0, 0.025000006, 0.275, 0.4, 0.4625, 0.525, 0.65, 0.9, 1.0]),
    ("HardSwish", &[], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5, -4.0, 5.0], &[-0.0, -0.375, -0.20833333, 0.0, 0.13541667, 0.29166666, 0.6666667, 1.6666667, 3.5, -0.0, 5.0]),
    ("Softplus", &[], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5, 30.0, -30.0], &[0.048587356, 0.20141326, 0.474077, 0.6931472, 0.8259395, 0.974077, 1.3132617, 2.126928, 3.5297503, 30.0, 9.357623e-14]),
    ("Softsign", &[], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5], &[-0.75, -0.6, -0.33333334, 0.0, 0.2, 0.33333334, 0.5, 0.6666667, 0.7777778]),
    ("Mish", &[], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5], &[-0.14564745, -0.2980997, -0.22074378, 0.0, 0.16957243, 0.37524524, 0.8650985, 1.943959, 3.4939907]),
    ("Gelu", &[("approximate", T("none"))], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5], &[-0.0040496886, -0.100210816, -0.15426877, 0.0, 0.14967658, 0.34573123, 0.8413447, 1.9544997, 3.4991858]),
    ("Gelu", &[("approximate", T("tanh"))], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5], &[-0.0036375225, -0.10042843, -0.154286, 0.0, 0.14967535, 0.345714, 0.841192, 1.9545977, 3.4993837]),
    ("Swish", &[("alpha", F(0.75))], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5, -100.0, 100.0], &[-0.2860483, -0.3676275, -0.2036667, 0.0, 0.13668454, 0.2963333, 0.6791787, 1.6351489, 3.2635868, -0.0, 100.0]),
    ("ThresholdedRelu", &[("alpha", F(0.5))], &[-3.0, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5], &[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.5]),
];

#[test]
fn shrink_zeroes_the_band_and_moves_the_rest_by_bias() {
    let attrs = Attrs::new().with("bias", float(0.25)).with("lambd", float(1.0));
    let x = t(&[6], &[-3.0f32, -1.0, 0.5, 1.0, 2.0, f32::NAN]);
    let y = run("Shrink", &attrs, &[&x], DType::F32, &[6]).to_vec::<f32>().unwrap();
    assert_eq!(y[..5], [-2.75, 0.0, 0.0, 0.0, 1.75], "the band [-lambd, lambd] is closed");
    assert_eq!(y[5], 0.0, "NaN compares false both ways");
}

#[test]
fn unary_float_ops_match_onnxruntime() {
    for (op, attrs, x, want) in UNARY_FLOAT {
        let mut a = Attrs::new();
        for (name, v) in attrs.iter() {
            a.set(
                name,
                match v {
                    F(v) => float(*v),
                    T(s) => AttrValue::Text(s.to_string()),
                },
            );
        }
        let n = [x.len()];
        let y = run(op, &a, &[&t(&n, x)], DType::F32, &n);
        let got = y.as_slice::<f32>().unwrap();
        assert!(close(got, want, 2e-6), "{op} f32: got {got:?}, want {want:?}");

        let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let y = run(op, &a, &[&t(&n, &x64)], DType::F64, &n);
        let got: Vec<f32> = y.as_slice::<f64>().unwrap().iter().map(|&v| v as f32).collect();
        assert!(close(&got, want, 2e-6), "{op} f64: got {got:?}, want {want:?}");

        let x16: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
        let y = run(op, &a, &[&t(&n, &x16)], DType::F16, &n);
        let got: Vec<f32> = y.as_slice::<f16>().unwrap().iter().map(|v| v.to_f32()).collect();
        assert!(close(&got, want, 4e-3), "{op} f16: got {got:?}, want {want:?}");
    }
}

#[test]
fn sign_abs_neg_relu_on_integers() {
    let x = t(&[4], &[-3i32, 0, 4, i32::MIN]);
    let one = |op| run(op, &Attrs::new(), &[&x], DType::I32, &[4]).to_vec::<i32>().unwrap();
    assert_eq!(one("Abs"), [3, 0, 4, i32::MIN], "abs(MIN) wraps, no panic");
    assert_eq!(one("Neg"), [3, 0, -4, i32::MIN]);
    assert_eq!(one("Sign"), [-1, 0, 1, -1]);
    assert_eq!(one("Relu"), [0, 0, 4, 0]);
    let x = t(&[3], &[-2i64, 0, 7]);
    let y = run("Relu", &Attrs::new(), &[&x], DType::I64, &[3]);
    assert_eq!(y.to_vec::<i64>().unwrap(), [0, 0, 7]);
    let x = t(&[4], &[-2.0f32, -0.0, 0.0, f32::NAN]);
    let y = run("Sign", &Attrs::new(), &[&x], DType::F32, &[4]).to_vec::<f32>().unwrap();
    assert_eq!(&y[..3], &[-1.0, 0.0, 0.0]);
    assert!(y[3].is_nan());
}

#[test]
fn not_isnan_isinf_give_bools() {
    let b = bools(&[2], &[0, 1]);
    let y = run("Not", &Attrs::new(), &[&b], DType::Bool, &[2]);
    assert_eq!(y.bytes(), &[1, 0]);
    let x = t(&[4], &[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.0]);
    let y = run("IsNaN", &Attrs::new(), &[&x], DType::Bool, &[4]);
    assert_eq!(y.bytes(), &[1, 0, 0, 0]);
    for (neg, pos, want) in [(1, 1, [0, 1, 1, 0]), (0, 1, [0, 1, 0, 0]), (1, 0, [0, 0, 1, 0])] {
        let a = Attrs::new().with("detect_negative", int(neg)).with("detect_positive", int(pos));
        let y = run("IsInf", &a, &[&x], DType::Bool, &[4]);
        assert_eq!(y.bytes(), &want, "IsInf neg={neg} pos={pos}");
    }
    let i = t(&[1], &[1i32]);
    assert!(matches!(
        try_run("IsNaN", &Attrs::new(), &[&i], DType::Bool, &[1]),
        Err(KernelError::DType { .. })
    ));
    assert!(try_run("Not", &Attrs::new(), &[&x], DType::Bool, &[4]).is_err());
}

#[test]
fn clip_with_and_without_bounds() {
    let x = t(&[5], &[-5.0f32, -0.5, 0.5, 5.0, f32::NAN]);
    let unbounded =
        Attrs::new().with("min", float(f64::NEG_INFINITY)).with("max", float(f64::INFINITY));
    let y = run("Clip", &unbounded, &[&x], DType::F32, &[5]).to_vec::<f32>().unwrap();
    assert_eq!(&y[..4], &[-5.0, -0.5, 0.5, 5.0]);
    assert!(y[4].is_nan(), "NaN passes through");
    let unit = Attrs::new().with("min", float(-1.0)).with("max", float(1.0));
    let y = run("Clip", &unit, &[&x], DType::F32, &[5]).to_vec::<f32>().unwrap();
    assert_eq!(&y[..4], &[-1.0, -0.5, 0.5, 1.0]);
    // min > max: everything becomes max.
    let inverted = Attrs::new().with("min", float(2.0)).with("max", float(1.0));
    let y = run("Clip", &inverted, &[&x], DType::F32, &[5]).to_vec::<f32>().unwrap();
    assert_eq!(&y[..4], &[1.0, 1.0, 1.0, 1.0]);

    let xi = t(&[3], &[-5i64, 0, i64::MAX]);
    let a = Attrs::new().with("min", int(-2)).with("max", int(i64::MAX - 1));
    let y = run("Clip", &a, &[&xi], DType::I64, &[3]);
    assert_eq!(y.to_vec::<i64>().unwrap(), [-2, 0, i64::MAX - 1], "int bounds stay exact");
    let xi = t(&[2], &[i32::MIN, i32::MAX]);
    let y = run("Clip", &unbounded, &[&xi], DType::I32, &[2]);
    assert_eq!(y.to_vec::<i32>().unwrap(), [i32::MIN, i32::MAX]);
    assert!(try_run("Clip", &Attrs::new(), &[&x], DType::F32, &[5]).is_err());
}

#[test]
fn broadcasting_binary_ops() {
    // Per channel: [1,2,2,2] + [2,1,1].
    let x = t(&[1, 2, 2, 2], &[0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
    let c = t(&[2, 1, 1], &[10.0f32, 20.0]);
    let y = bin("Add", &x, &c, &[1, 2, 2, 2]);
    assert_eq!(y.to_vec::<f32>().unwrap(), [10.0, 11.0, 12.0, 13.0, 24.0, 25.0, 26.0, 27.0]);
    // Scalar on either side.
    let s = t(&[], &[2.0f32]);
    assert_eq!(bin("Mul", &s, &c, &[2, 1, 1]).to_vec::<f32>().unwrap(), [20.0, 40.0]);
    assert_eq!(bin("Sub", &c, &s, &[2, 1, 1]).to_vec::<f32>().unwrap(), [8.0, 18.0]);
    // Outer difference: [3,1] - [1,4].
    let a = t(&[3, 1], &[1i64, 2, 3]);
    let b = t(&[1, 4], &[10i64, 20, 30, 40]);
    let y = bin("Sub", &a, &b, &[3, 4]);
    assert_eq!(
        y.to_vec::<i64>().unwrap(),
        [-9, -19, -29, -39, -8, -18, -28, -38, -7, -17, -27, -37]
    );
    // Both sides broadcast: [2,1,3] / [2,1]. numpy:
    //   a = np.arange(6, dtype=np.float32).reshape(2, 1, 3) - 2.5
    //   b = np.array([[4.0], [-0.5]], dtype=np.float32); (a / b).ravel()
    let a = t(&[2, 1, 3], &[-2.5f32, -1.5, -0.5, 0.5, 1.5, 2.5]);
    let b = t(&[2, 1], &[4.0f32, -0.5]);
    let y = bin("Div", &a, &b, &[2, 2, 3]);
    assert_eq!(
        y.to_vec::<f32>().unwrap(),
        [-0.625, -0.375, -0.125, 5.0, 3.0, 1.0, 0.125, 0.375, 0.625, -1.0, -3.0, -5.0]
    );
    // An output larger than both inputs' broadcast repeats the value (no short blocks).
    let a = t(&[2, 1], &[1i32, 2]);
    let y = bin("Add", &a, &a, &[2, 3]);
    assert_eq!(y.to_vec::<i32>().unwrap(), [2, 2, 2, 4, 4, 4]);
    // f16 computes each result in f32 and rounds once. numpy:
    //   np.float16([1.5, 0.1, 1000]) + np.float16([2.0, 0.2, 0.3]) -> [3.5, 0.2998046875, 1000.5]
    //   (0.2998046875 = 307/1024)
    let h = |v: &[f32]| v.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>();
    let y = bin("Add", &t(&[3], &h(&[1.5, 0.1, 1000.0])), &t(&[3], &h(&[2.0, 0.2, 0.3])), &[3]);
    assert_eq!(y.to_vec::<f16>().unwrap(), h(&[3.5, 307.0 / 1024.0, 1000.5]));
}

#[test]
fn integer_div_truncates_and_mod_follows_fmod() {
    let a = t(&[5], &[7i32, -7, 7, -7, 5]);
    let b = t(&[5], &[2i32, 2, -2, -2, 0]);
    assert_eq!(bin("Div", &a, &b, &[5]).to_vec::<i32>().unwrap(), [3, -3, -3, 3, 0]);
    let a = t(&[2], &[9u8, 200]);
    let b = t(&[], &[4u8]);
    assert_eq!(bin("Div", &a, &b, &[2]).to_vec::<u8>().unwrap(), [2, 50]);
    assert_eq!(bin("Add", &a, &t(&[], &[100u8]), &[2]).to_vec::<u8>().unwrap(), [109, 44], "wraps");

    // numpy: np.mod / np.fmod of [-7, 7, -7, 7] by [3, -3, -3, 3], and of
    // float32 [-7.5, 7.5] by [2, -2].
    let a = t(&[4], &[-7i64, 7, -7, 7]);
    let b = t(&[4], &[3i64, -3, -3, 3]);
    let m = |fmod, a: &Tensor, b: &Tensor| {
        run("Mod", &Attrs::new().with("fmod", int(fmod)), &[a, b], a.dtype(), a.shape())
    };
    assert_eq!(m(0, &a, &b).to_vec::<i64>().unwrap(), [2, -2, -1, 1]);
    assert_eq!(m(1, &a, &b).to_vec::<i64>().unwrap(), [-1, 1, -1, 1]);
    let a = t(&[2], &[-7.5f32, 7.5]);
    let b = t(&[2], &[2.0f32, -2.0]);
    assert_eq!(m(0, &a, &b).to_vec::<f32>().unwrap(), [0.5, -0.5]);
    assert_eq!(m(1, &a, &b).to_vec::<f32>().unwrap(), [-1.5, 1.5]);
}

#[test]
fn pow_prelu_and_bitshift() {
    let y = bin("Pow", &t(&[2], &[2.0f32, 3.0]), &t(&[2], &[3i64, -1]), &[2]);
    assert_eq!(y.to_vec::<f32>().unwrap(), [8.0, 1.0 / 3.0]);
    let y = bin("Pow", &t(&[3], &[1i32, 2, 3]), &t(&[3], &[4i32, 5, 6]), &[3]);
    assert_eq!(y.to_vec::<i32>().unwrap(), [1, 32, 729]);
    let x = t(&[3], &[-3.0f32, 0.5, 4.0]);
    let y = bin("Pow", &x, &t(&[], &[2.0f32]), &[3]);
    assert_eq!(y.to_vec::<f32>().unwrap(), [9.0, 0.25, 16.0]);
    let y = bin("Pow", &x, &t(&[1], &[0.5f64]), &[3]).to_vec::<f32>().unwrap();
    assert!(y[0].is_nan());
    assert_eq!(&y[1..], &[0.5f32.sqrt(), 2.0]);

    // The slope broadcasts to X: [2,2] with [2,1].
    let x = t(&[2, 2], &[-1.0f32, 2.0, -3.0, 4.0]);
    let slope = t(&[2, 1], &[0.1f32, 0.5]);
    let y = bin("PRelu", &x, &slope, &[2, 2]);
    assert_eq!(y.to_vec::<f32>().unwrap(), [-0.1, 2.0, -1.5, 4.0]);

    let shift = |dir: &str, a: &Tensor, b: &Tensor| {
        let attrs = Attrs::new().with("direction", AttrValue::Text(dir.into()));
        run("BitShift", &attrs, &[a, b], a.dtype(), a.shape())
    };
    let y = shift("LEFT", &t(&[3], &[16u8, 1, 255]), &t(&[3], &[1u8, 7, 8]));
    assert_eq!(y.to_vec::<u8>().unwrap(), [32, 128, 0]);
    let y = shift("RIGHT", &t(&[2], &[16u32, 255]), &t(&[2], &[2u32, 40]));
    assert_eq!(y.to_vec::<u32>().unwrap(), [4, 0]);
    // Signed: right shifts are arithmetic; out-of-range amounts give 0, or -1 for a negative
    // value shifted right (the ONNX reference, onnx/reference/ops/op_bitshift.py).
    let a = t(&[4], &[-8i8, -1, 64, -128]);
    let y = shift("RIGHT", &a, &t(&[4], &[1i8, 1, 8, -1]));
    assert_eq!(y.to_vec::<i8>().unwrap(), [-4, -1, 0, -1]);
    let y = shift("LEFT", &a, &t(&[4], &[1i8, 0, 1, 8]));
    assert_eq!(y.to_vec::<i8>().unwrap(), [-16, -1, -128, 0]);
}

#[test]
fn bitwise_ops_take_every_integer_type_and_broadcast() {
    let a = t(&[2, 2], &[0b1100i32, -1, 0x7fff_ffff, i32::MIN]);
    let b = t(&[2], &[0b1010i32, 0x0f0f]);
    let y = |op| bin(op, &a, &b, &[2, 2]).to_vec::<i32>().unwrap();
    assert_eq!(y("BitwiseAnd"), [0b1000, 0x0f0f, 0b1010, 0]);
    assert_eq!(y("BitwiseOr"), [0b1110, -1, 0x7fff_ffff, i32::MIN | 0x0f0f]);
    assert_eq!(y("BitwiseXor"), [0b0110, !0x0f0f, 0x7fff_fff5, i32::MIN | 0x0f0f]);
    let x = t(&[3], &[0u8, 0x0f, 0xff]);
    let not = run("BitwiseNot", &Attrs::new(), &[&x], DType::U8, &[3]);
    assert_eq!(not.to_vec::<u8>().unwrap(), [0xff, 0xf0, 0]);
    let x = t(&[2], &[u64::MAX, 1]);
    let y = bin("BitwiseXor", &x, &t(&[], &[3u64]), &[2]);
    assert_eq!(y.to_vec::<u64>().unwrap(), [u64::MAX - 3, 2]);
    // Floats have no bits to operate on.
    let f = t(&[1], &[1.0f32]);
    assert!(try_run("BitwiseAnd", &Attrs::new(), &[&f, &f], DType::F32, &[1]).is_err());
}

#[test]
fn comparisons_and_logic_give_bools() {
    let a = t(&[2, 1], &[1.0f32, 3.0]);
    let b = t(&[3], &[0.0f32, 3.0, 5.0]);
    let cmp = |op, a: &Tensor, b: &Tensor, shape: &[usize]| {
        run(op, &Attrs::new(), &[a, b], DType::Bool, shape).bytes().to_vec()
    };
    assert_eq!(cmp("Greater", &a, &b, &[2, 3]), [1, 0, 0, 1, 0, 0]);
    assert_eq!(cmp("GreaterOrEqual", &a, &b, &[2, 3]), [1, 0, 0, 1, 1, 0]);
    assert_eq!(cmp("Less", &a, &b, &[2, 3]), [0, 1, 1, 0, 0, 1]);
    assert_eq!(cmp("LessOrEqual", &a, &b, &[2, 3]), [0, 1, 1, 0, 1, 1]);
    assert_eq!(cmp("Equal", &a, &b, &[2, 3]), [0, 0, 0, 0, 1, 0]);
    let i = t(&[3], &[1i64, -2, 3]);
    assert_eq!(cmp("Equal", &i, &t(&[], &[-2i64]), &[3]), [0, 1, 0]);
    assert_eq!(cmp("Less", &i, &t(&[], &[2i64]), &[3]), [1, 1, 0]);

    let p = bools(&[4], &[0, 0, 1, 1]);
    let q = bools(&[4], &[0, 1, 0, 1]);
    assert_eq!(cmp("Equal", &p, &q, &[4]), [1, 0, 0, 1]);
    assert_eq!(cmp("And", &p, &q, &[4]), [0, 0, 0, 1]);
    assert_eq!(cmp("Or", &p, &q, &[4]), [0, 1, 1, 1]);
    assert_eq!(cmp("Xor", &p, &q, &[4]), [0, 1, 1, 0]);
    assert!(try_run("And", &Attrs::new(), &[&a, &a], DType::Bool, &[2, 1]).is_err());
}

#[test]
fn variadic_ops_broadcast_all_inputs() {
    let a = t(&[3], &[1.0f32, 5.0, 3.0]);
    let b = t(&[2, 1], &[2.0f32, 4.0]);
    let c = t(&[], &[10.0f32]);
    let none = Attrs::new();
    let y = run("Max", &none, &[&a, &b, &t(&[], &[0.0f32])], DType::F32, &[2, 3]);
    assert_eq!(y.to_vec::<f32>().unwrap(), [2.0, 5.0, 3.0, 4.0, 5.0, 4.0]);
    let y = run("Sum", &none, &[&a, &b, &c], DType::F32, &[2, 3]);
    assert_eq!(y.to_vec::<f32>().unwrap(), [13.0, 17.0, 15.0, 15.0, 19.0, 17.0]);
    let y = run("Mean", &none, &[&a, &b], DType::F32, &[2, 3]);
    assert_eq!(y.to_vec::<f32>().unwrap(), [1.5, 3.5, 2.5, 2.5, 4.5, 3.5]);
    let y = run("Sum", &none, &[&a], DType::F32, &[3]);
    assert_eq!(y.to_vec::<f32>().unwrap(), [1.0, 5.0, 3.0]);
    // The third input is the one that broadcasts.
    let y = run("Min", &none, &[&a, &a, &b], DType::F32, &[2, 3]);
    assert_eq!(y.to_vec::<f32>().unwrap(), [1.0, 2.0, 2.0, 1.0, 4.0, 3.0]);
    let n = t(&[2], &[f32::NAN, 1.0]);
    let y = run("Min", &none, &[&t(&[2], &[0.0f32, f32::NAN]), &n], DType::F32, &[2]);
    assert!(y.to_vec::<f32>().unwrap().iter().all(|v| v.is_nan()), "NaN propagates");
    let y = run("Max", &none, &[&t(&[2], &[-1i32, 7]), &t(&[], &[0i32])], DType::I32, &[2]);
    assert_eq!(y.to_vec::<i32>().unwrap(), [0, 7]);
    assert!(try_run("Max", &none, &[&a, &t(&[3], &[1i32, 2, 3])], DType::F32, &[3]).is_err());
}

#[test]
fn where_selects_any_type_with_broadcasting() {
    let cond = bools(&[2, 1], &[1, 0]);
    let x = t(&[3], &[1i64, 2, 3]);
    let y = t(&[], &[-1i64]);
    let out = run("Where", &Attrs::new(), &[&cond, &x, &y], DType::I64, &[2, 3]);
    assert_eq!(out.to_vec::<i64>().unwrap(), [1, 2, 3, -1, -1, -1]);
    let cond = bools(&[3], &[1, 0, 1]);
    let x = t(&[3], &[1.0f32, 2.0, 3.0]);
    let y = t(&[3], &[-1.0f32, -2.0, -3.0]);
    let out = run("Where", &Attrs::new(), &[&cond, &x, &y], DType::F32, &[3]);
    assert_eq!(out.to_vec::<f32>().unwrap(), [1.0, -2.0, 3.0]);
    let p = bools(&[3], &[1, 1, 0]);
    let out = run("Where", &Attrs::new(), &[&cond, &p, &bools(&[], &[0])], DType::Bool, &[3]);
    assert_eq!(out.bytes(), &[1, 0, 0]);
    let bad = t(&[3], &[1u8, 0, 1]);
    assert!(try_run("Where", &Attrs::new(), &[&bad, &x, &y], DType::F32, &[3]).is_err());
}

/// A tensor of `dt` holding `vals` (small non-negative integers, exact in every type).
fn of_type(dt: DType, vals: &[u8]) -> Tensor {
    let n = [vals.len()];
    let conv = |f: fn(u8) -> f64| vals.iter().map(|&v| f(v)).collect::<Vec<f64>>();
    let v = conv(f64::from);
    match dt {
        DType::F32 => t(&n, &v.iter().map(|&v| v as f32).collect::<Vec<_>>()),
        DType::F16 => t(&n, &v.iter().map(|&v| f16::from_f64(v)).collect::<Vec<_>>()),
        DType::F64 => t(&n, &v),
        DType::I8 => t(&n, &vals.iter().map(|&v| v as i8).collect::<Vec<_>>()),
        DType::U8 => t(&n, vals),
        DType::I16 => t(&n, &vals.iter().map(|&v| v as i16).collect::<Vec<_>>()),
        DType::U16 => t(&n, &vals.iter().map(|&v| v as u16).collect::<Vec<_>>()),
        DType::I32 => t(&n, &vals.iter().map(|&v| v as i32).collect::<Vec<_>>()),
        DType::U32 => t(&n, &vals.iter().map(|&v| v as u32).collect::<Vec<_>>()),
        DType::I64 => t(&n, &vals.iter().map(|&v| v as i64).collect::<Vec<_>>()),
        DType::U64 => t(&n, &vals.iter().map(|&v| v as u64).collect::<Vec<_>>()),
        DType::Bool => bools(&n, &vals.iter().map(|&v| (v != 0) as u8).collect::<Vec<_>>()),
        DType::I4 | DType::U4 | DType::I2 | DType::U2 => {
            Tensor::from_bytes(TensorDesc::new(dt, n.to_vec()), vals).unwrap()
        }
        DType::F8E4M3FN
        | DType::F8E4M3FNUZ
        | DType::F8E5M2
        | DType::F8E5M2FNUZ
        | DType::F8E8M0
        | DType::F4E2M1 => {
            let f = crate::minifloat::Format::of(dt).unwrap();
            let bits: Vec<u8> = v.iter().map(|&v| f.encode(v, true)).collect();
            Tensor::from_bytes(TensorDesc::new(dt, n.to_vec()), &bits).unwrap()
        }
    }
}

fn cast_to(x: &Tensor, dt: DType) -> Tensor {
    let a = Attrs::new().with("to", int(dt.onnx_code() as i64));
    run("Cast", &a, &[x], dt, x.shape())
}

/// Whether `v` is exact in `dt`.
fn exact_in(dt: DType, v: u8) -> bool {
    match dt {
        DType::Bool | DType::I2 => v <= 1,
        DType::U2 => v <= 3,
        DType::I4 => v <= 7,
        DType::U4 => v <= 15,
        DType::F4E2M1 => [0, 1, 2, 3, 4, 6].contains(&v),
        // Powers of two, and no zero.
        DType::F8E8M0 => v.is_power_of_two(),
        _ => true,
    }
}

#[test]
fn cast_between_every_pair_of_types() {
    for src in DType::ALL {
        for dst in DType::ALL {
            // Values exact in both (96 is exact in every float8 format); wrapping and range
            // rules have tests of their own.
            let vals: Vec<u8> = [0, 1, 2, 3, 4, 6, 96]
                .into_iter()
                .filter(|&v| exact_in(src, v) && exact_in(dst, v))
                .collect();
            let y = cast_to(&of_type(src, &vals), dst);
            assert_eq!(y, of_type(dst, &vals), "{src} -> {dst}");
        }
    }
}

#[test]
fn casts_to_4_bits_follow_onnx_reference() {
    // ONNX's node tests (ml_dtypes): floats truncate, out of range gives 0; integers wrap.
    let x = t(&[9], &[-9.0f32, -8.6, -2.5, -0.5, 6.7, 7.4, 8.0, 15.5, f32::NAN]);
    let signed: Vec<i8> = [0, -8, -2, 0, 6, 7, 0, 0, 0].into();
    assert_eq!(cast_to(&x, DType::I4).as_slice::<i8>().unwrap(), signed);
    assert_eq!(cast_to(&x, DType::U4).bytes(), &[0, 0, 0, 0, 6, 7, 8, 15, 0]);
    let i = t(&[5], &[-9i32, 8, 15, 16, 100]);
    assert_eq!(cast_to(&i, DType::I4).as_slice::<i8>().unwrap(), [7, -8, -1, 0, 4]);
    assert_eq!(cast_to(&i, DType::U4).bytes(), &[7, 8, 15, 0, 4]);
    let back = cast_to(&cast_to(&t(&[2], &[-8i8, 7]), DType::I4), DType::F32);
    assert_eq!(back.to_vec::<f32>().unwrap(), [-8.0, 7.0]);
}

#[test]
fn casts_to_2_bits_follow_onnx_reference() {
    // ONNX's test_cast_FLOAT_to_INT2 and _UINT2: out of range gives 0.
    let x = t(&[8], &[-3.0f32, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, -1.5]);
    let signed: Vec<i8> = [0, -2, -1, 0, 1, 0, 0, -1].into();
    assert_eq!(cast_to(&x, DType::I2).as_slice::<i8>().unwrap(), signed);
    assert_eq!(cast_to(&x, DType::U2).bytes(), &[0, 0, 0, 0, 1, 2, 3, 0]);
    // Integers wrap.
    let i = t(&[4], &[-3i32, 2, 5, -1]);
    assert_eq!(cast_to(&i, DType::I2).as_slice::<i8>().unwrap(), [1, -2, 1, -1]);
    assert_eq!(cast_to(&i, DType::U2).bytes(), &[1, 2, 1, 3]);
}

#[test]
fn casts_to_e8m0_take_round_mode() {
    let x = t(&[4], &[1.1f32, 1.6, 3.0, 0.3]);
    let cast = |mode: &str| {
        let a = Attrs::new()
            .with("to", int(DType::F8E8M0.onnx_code() as i64))
            .with("saturate", int(1))
            .with("round_mode", AttrValue::Text(mode.into()));
        run("Cast", &a, &[&x], DType::F8E8M0, &[4]).bytes().to_vec()
    };
    assert_eq!(cast("up"), [128, 128, 129, 126]);
    assert_eq!(cast("down"), [127, 127, 128, 125]);
    assert_eq!(cast("nearest"), [127, 128, 129, 125]);
}

#[test]
fn cast_edge_cases() {
    let x = t(&[4], &[-2.7f32, 2.7, -0.5, 1e10]);
    assert_eq!(
        cast_to(&x, DType::I32).to_vec::<i32>().unwrap(),
        [-2, 2, 0, i32::MAX],
        "truncates toward zero; out of range saturates"
    );
    assert_eq!(cast_to(&x, DType::I64).to_vec::<i64>().unwrap()[..3], [-2, 2, 0]);
    let x = t(&[4], &[0.0f32, -0.0, 0.5, f32::NAN]);
    assert_eq!(cast_to(&x, DType::Bool).bytes(), &[0, 0, 1, 1], "NaN is true");
    assert_eq!(
        cast_to(&t(&[2], &[300i64, -1]), DType::U8).to_vec::<u8>().unwrap(),
        [44, 255],
        "integers wrap like C"
    );
    // numpy: np.float32([0.1, 65504, 1e5, -0.0, 1/3]).astype(np.float16).astype(np.float32)
    //   -> [0.0999755859375 (819/8192), 65504, inf, -0.0, 0.333251953125 (1365/4096)]
    let x = t(&[5], &[0.1f32, 65504.0, 1e5, -0.0, 1.0 / 3.0]);
    let back = cast_to(&cast_to(&x, DType::F16), DType::F32).to_vec::<f32>().unwrap();
    assert_eq!(back, [819.0 / 8192.0, 65504.0, f32::INFINITY, -0.0, 1365.0 / 4096.0]);
    assert!(back[3].is_sign_negative());
    // CastLike takes the type from its second input.
    let like = t(&[1], &[0i64]);
    let y = run("CastLike", &Attrs::new(), &[&t(&[2], &[-1.5f32, 3.9]), &like], DType::I64, &[2]);
    assert_eq!(y.to_vec::<i64>().unwrap(), [-1, 3]);
    let wrong_to = Attrs::new().with("to", int(DType::I32.onnx_code() as i64));
    assert!(try_run("Cast", &wrong_to, &[&x], DType::F16, &[5]).is_err());
}

#[test]
fn a_cast_to_bfloat16_rounds_to_its_precision_ties_to_even() {
    // bfloat16 keeps 8 significant bits: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 (ties go
    // to the even 1), 1 + 3 * 2^-8 halfway between 1 + 2^-7 and 1 + 2^-6 (to the even
    // 1 + 2^-6); f32::MAX is past the largest bfloat16 (0x7F7F...) and rounds to infinity.
    let x =
        t(&[7], &[1.0f32, 1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, -2.5e-3, f32::MAX, -0.0, f32::NAN]);
    let attrs =
        Attrs::new().with("to", int(DType::F32.onnx_code() as i64)).with("bfloat16", int(1));
    let y = run("Cast", &attrs, &[&x], DType::F32, &[7]).to_vec::<f32>().unwrap();
    // -2.5e-3 is 0xBB23D70A: the low half 0xD70A is past halfway, so it rounds up to 0xBB24.
    let want = [1.0, 1.0, 1.0 + 4.0 / 256.0, f32::from_bits(0xBB24_0000), f32::INFINITY, -0.0];
    assert_eq!(y[..6], want);
    assert!(y[5].is_sign_negative() && y[6].is_nan());
    // From anything but float, it is refused.
    assert!(try_run("Cast", &attrs, &[&t(&[1], &[1i32])], DType::F32, &[1]).is_err());
}

#[test]
fn prepare_rejects_bad_shapes_and_types() {
    let none = Attrs::new();
    let a = t(&[2, 3], &[0.0f32; 6]);
    let b = t(&[4], &[0.0f32; 4]);
    assert!(try_run("Add", &none, &[&a, &b], DType::F32, &[2, 3]).is_err());
    let i = t(&[2, 3], &[0i32; 6]);
    assert!(try_run("Add", &none, &[&a, &i], DType::F32, &[2, 3]).is_err());
    assert!(try_run("Add", &none, &[&a, &a], DType::I32, &[2, 3]).is_err());
    assert!(try_run("Relu", &none, &[&a], DType::F32, &[3, 2]).is_err());
    assert!(matches!(
        try_run("Sqrt", &none, &[&i], DType::I32, &[2, 3]),
        Err(KernelError::DType { .. })
    ));
}

#[test]
fn run_checks_tensors_against_what_was_prepared() {
    let desc = TensorDesc::new(DType::F32, [2, 3]);
    let kernel = prepare(&OpCx {
        op: "Add",
        attrs: &Attrs::new(),
        inputs: &[desc.clone(), desc.clone()],
        outputs: std::slice::from_ref(&desc),
    })
    .unwrap();
    let small = t(&[2], &[1.0f32, 2.0]);
    let mut out = Tensor::zeros(desc);
    let r = kernel.run(&[small.view(), small.view()], &mut [out.view_mut()]);
    assert!(matches!(r, Err(KernelError::Invalid(_))));
}

/// Runs `op` with its output over input `aliased` and returns that buffer.
fn run_in_place(op: &str, attrs: &Attrs, inputs: &[&Tensor], aliased: usize) -> Tensor {
    let descs: Vec<TensorDesc> = inputs.iter().map(|t| t.desc().clone()).collect();
    let out = descs[aliased].clone();
    let kernel =
        prepare(&OpCx { op, attrs, inputs: &descs, outputs: std::slice::from_ref(&out) }).unwrap();
    let mut buffer = inputs[aliased].clone();
    let views: Vec<_> = inputs
        .iter()
        .enumerate()
        .map(|(k, t)| {
            let mut v = t.view();
            if k == aliased {
                v.bytes = &[];
            }
            v
        })
        .collect();
    kernel
        .run_in_place(aliased, &views, &mut [buffer.view_mut()])
        .unwrap_or_else(|e| panic!("{op} in place: {e}"));
    buffer
}

#[test]
fn in_place_runs_equal_ordinary_runs() {
    let x = t(&[2, 3, 2], &[-3.0f32, -1.5, 0.0, 0.5, 1.0, 2.5, -2.0, 4.0, 3.0, -0.5, 1.5, -4.0]);
    let channel = t(&[3, 1], &[10.0f32, 20.0, 30.0]);
    let shape = [2, 3, 2];
    for op in crate::elementwise::OPS
        .iter()
        .map(|d| d.name)
        .filter(|op| super::in_place(op, &Attrs::new(), 0))
    {
        let unary = !matches!(
            op,
            "Add"
                | "Sub"
                | "Mul"
                | "Div"
                | "Mod"
                | "PRelu"
                | "SwiGLU"
                | "BitShift"
                | "BitwiseAnd"
                | "BitwiseOr"
                | "BitwiseXor"
                | "And"
                | "Or"
                | "Xor"
                | "Equal"
                | "Greater"
                | "GreaterOrEqual"
                | "Less"
                | "LessOrEqual"
                | "CastLike"
        );
        if !unary || matches!(op, "Not" | "IsNaN" | "IsInf" | "Cast" | "BitwiseNot") {
            continue; // covered below, or their output type differs from f32
        }
        let mut attrs = Attrs::new();
        for (name, v) in
            [("alpha", 0.5), ("beta", 0.25), ("gamma", 1.5), ("min", -1.0), ("max", 2.0)]
                .into_iter()
                .chain([("bias", 0.5), ("lambd", 1.0)])
        {
            attrs.set(name, float(v));
        }
        attrs.set("approximate", AttrValue::Text("none".into()));
        let want = run(op, &attrs, &[&x], DType::F32, &shape);
        let got = run_in_place(op, &attrs, &[&x], 0);
        let (w, g) = (want.to_vec::<f32>().unwrap(), got.to_vec::<f32>().unwrap());
        let same = w.iter().zip(&g).all(|(a, b)| a == b || (a.is_nan() && b.is_nan()));
        assert!(same, "{op}: {w:?} vs {g:?}");
    }
    // Binary, over either operand, with the other broadcast per channel.
    for op in ["Add", "Sub", "Mul", "Div", "PRelu"] {
        let want = bin(op, &x, &channel, &shape);
        assert_eq!(run_in_place(op, &Attrs::new(), &[&x, &channel], 0), want, "{op}");
    }
    // SwiGLU's operands have one shape.
    let alpha = Attrs::new().with("alpha", float(0.5));
    let want = run("SwiGLU", &alpha, &[&x, &x], DType::F32, &shape);
    assert_eq!(run_in_place("SwiGLU", &alpha, &[&x, &x], 0), want);
    let want = bin("Sub", &channel, &x, &shape);
    assert_eq!(run_in_place("Sub", &Attrs::new(), &[&channel, &x], 1), want);
    // Other types take the kernels that call the op through a pointer: the same, in place.
    let x = t(&[2, 3, 2], &[-3i32, -1, 0, 5, 1, 2, -2, 4, 3, -5, 1, -4]);
    let channel = t(&[3, 1], &[10i32, 20, 30]);
    for op in ["Add", "Sub", "Mul", "Div", "Mod"] {
        let attrs = Attrs::new().with("fmod", int(0));
        let want = run(op, &attrs, &[&x, &channel], DType::I32, &shape);
        assert_eq!(run_in_place(op, &attrs, &[&x, &channel], 0), want, "{op}");
        let want = run(op, &attrs, &[&channel, &x], DType::I32, &shape);
        assert_eq!(run_in_place(op, &attrs, &[&channel, &x], 1), want, "{op} over input 1");
    }
    assert_eq!(
        run_in_place("Neg", &Attrs::new(), &[&x], 0),
        run("Neg", &Attrs::new(), &[&x], DType::I32, &shape)
    );
}

#[test]
fn a_cast_refuses_tensors_of_other_types_or_sizes() {
    let x = t(&[4], &[1i32, 2, 3, 4]);
    let attrs = Attrs::new().with("to", int(DType::F64.onnx_code() as i64));
    let out = TensorDesc::new(DType::F64, vec![4]);
    let cx = OpCx {
        op: "Cast",
        attrs: &attrs,
        inputs: std::slice::from_ref(x.desc()),
        outputs: std::slice::from_ref(&out),
    };
    let kernel = prepare(&cx).unwrap();
    let mut y = Tensor::zeros(out.clone());
    assert!(kernel.run(&[x.view()], &mut [y.view_mut()]).is_ok());
    // An f32 input of the same bytes, then too few elements: errors, not garbage.
    let wrong_type = t(&[4], &[1f32, 2.0, 3.0, 4.0]);
    let err = kernel.run(&[wrong_type.view()], &mut [y.view_mut()]).unwrap_err();
    assert!(err.to_string().contains("prepared to cast i32 to f64"), "{err}");
    let short = t(&[3], &[1i32, 2, 3]);
    assert!(kernel.run(&[short.view()], &mut [y.view_mut()]).is_err());
}

#[test]
fn casts_between_types_of_one_size_run_in_place() {
    let cases = [
        (t(&[5], &[-2i32, -1, 0, 7, 1 << 30]), DType::F32),
        (t(&[3], &[1.5f64, -0.0, 1e300]), DType::I64),
        (bools(&[4], &[0, 1, 1, 0]), DType::U8),
        (t(&[4], &[0u8, 1, 2, 255]), DType::Bool),
        (t(&[3], &[-1i16, 0, 300]), DType::F16),
    ];
    for (x, dt) in cases {
        let want = cast_to(&x, dt);
        let attrs = Attrs::new().with("to", int(dt.onnx_code() as i64));
        let kernel = prepare(&OpCx {
            op: "Cast",
            attrs: &attrs,
            inputs: std::slice::from_ref(x.desc()),
            outputs: std::slice::from_ref(want.desc()),
        })
        .unwrap();
        let mut buffer = x.clone();
        let mut view = buffer.view_mut();
        view.dtype = dt;
        kernel.run_in_place(0, &[], &mut [view]).unwrap();
        assert_eq!(buffer.bytes(), want.bytes(), "{} -> {dt}", x.dtype());
    }
}
