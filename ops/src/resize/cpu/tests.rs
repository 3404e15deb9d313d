//! Expected values from onnxruntime 1.31 (opset 18), checked against onnx.reference:
//!
//! ```python
//! def resize(x, scales=None, sizes=None, roi=None, **attrs):  # one Resize node, run by ORT
//! x = np.arange(1, 7, dtype=np.float32).reshape(1, 1, 2, 3)
//! y = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
//! ```
//! Each test names the call that produced its numbers.

use crate::cpu::eval;
use crate::tensor::{Tensor, TensorDesc};
use ingot_schema::{AttrValue, Attrs, DType};

fn text(s: &str) -> AttrValue {
    AttrValue::Text(s.into())
}

/// Canonical attributes with ONNX's defaults, then `over` applied.
fn attrs(scales: &[f64], sizes: &[i64], over: &[(&str, AttrValue)]) -> Attrs {
    let rank = sizes.len();
    let roi: Vec<f64> = [vec![0.0; rank], vec![1.0; rank]].concat();
    let base = Attrs::new()
        .with("mode", text("nearest"))
        .with("coordinate_transformation_mode", text("half_pixel"))
        .with("nearest_mode", text("round_prefer_floor"))
        .with("cubic_coeff_a", AttrValue::Float(-0.75))
        .with("exclude_outside", AttrValue::Int(0))
        .with("extrapolation_value", AttrValue::Float(0.0))
        .with("antialias", AttrValue::Int(0))
        .with("scales", AttrValue::Floats(scales.to_vec()))
        .with("sizes", AttrValue::Ints(sizes.to_vec()))
        .with("roi", AttrValue::Floats(roi));
    over.iter().fold(base, |a, (k, v)| a.with(k, v.clone()))
}

fn x() -> Tensor {
    Tensor::from_vec(vec![1, 1, 2, 3], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap()
}

fn y() -> Tensor {
    let v: Vec<f32> = (0..16).map(|i| i as f32).collect();
    Tensor::from_vec(vec![1, 1, 4, 4], &v).unwrap()
}

fn run(a: &Attrs, input: &Tensor) -> Vec<f32> {
    let sizes: Vec<usize> = a.ints("sizes").unwrap().iter().map(|&s| s as usize).collect();
    let out = eval("Resize", a, &[input], &[TensorDesc::new(input.dtype(), sizes)]).unwrap();
    out[0].to_vec::<f32>().unwrap()
}

fn assert_close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-4 * w.abs().max(1.0), "element {i}: {g} vs {w}\n{got:?}");
    }
}

// resize(x, scales=[1,1,2,2], mode="nearest", coordinate_transformation_mode="asymmetric",
//        nearest_mode="floor")
#[test]
fn nearest_upsample_by_two() {
    let a = attrs(
        &[1.0, 1.0, 2.0, 2.0],
        &[1, 1, 4, 6],
        &[("coordinate_transformation_mode", text("asymmetric")), ("nearest_mode", text("floor"))],
    );
    let want = [
        1., 1., 2., 2., 3., 3., 1., 1., 2., 2., 3., 3., 4., 4., 5., 5., 6., 6., 4., 4., 5., 5., 6.,
        6.,
    ];
    assert_close(&run(&a, &x()), &want);
    // Nearest moves bytes: an i64 tensor gives the same picks.
    let xi = Tensor::from_vec(vec![1, 1, 2, 3], &[1i64, 2, 3, 4, 5, 6]).unwrap();
    let out = eval("Resize", &a, &[&xi], &[TensorDesc::new(DType::I64, [1, 1, 4, 6])]).unwrap();
    let got: Vec<f32> = out[0].as_slice::<i64>().unwrap().iter().map(|&v| v as f32).collect();
    assert_eq!(got, want);
}

// resize(y, scales=[1,1,0.6,0.6], mode="nearest", nearest_mode="round_prefer_ceil")
#[test]
fn nearest_downsample_prefer_ceil() {
    let a = attrs(
        &[1.0, 1.0, 0.6f32 as f64, 0.6f32 as f64],
        &[1, 1, 2, 2],
        &[("nearest_mode", text("round_prefer_ceil"))],
    );
    assert_close(&run(&a, &y()), &[0., 2., 8., 10.]);
}

// resize(x, sizes=[1,1,3,4], mode="linear")
// resize(x, sizes=[1,1,3,5], mode="linear", coordinate_transformation_mode="align_corners")
#[test]
fn linear_half_pixel_and_align_corners() {
    let a = attrs(&[1.0, 1.0, 1.5, 4.0 / 3.0], &[1, 1, 3, 4], &[("mode", text("linear"))]);
    assert_close(
        &run(&a, &x()),
        &[1.0, 1.625, 2.375, 3.0, 2.5, 3.125, 3.875, 4.5, 4.0, 4.625, 5.375, 6.0],
    );
    let a = attrs(
        &[1.0, 1.0, 1.5, 5.0 / 3.0],
        &[1, 1, 3, 5],
        &[("mode", text("linear")), ("coordinate_transformation_mode", text("align_corners"))],
    );
    assert_close(
        &run(&a, &x()),
        &[1.0, 1.5, 2.0, 2.5, 3.0, 2.5, 3.0, 3.5, 4.0, 4.5, 4.0, 4.5, 5.0, 5.5, 6.0],
    );
}

// resize(y, sizes=[1,1,3,3], mode="cubic", exclude_outside=1)
// resize(y, scales=[1,1,1.5,1.5], mode="cubic", coordinate_transformation_mode="asymmetric",
//        cubic_coeff_a=-0.5)
#[test]
fn cubic() {
    let a = attrs(
        &[1.0, 1.0, 0.75, 0.75],
        &[1, 1, 3, 3],
        &[("mode", text("cubic")), ("exclude_outside", AttrValue::Int(1))],
    );
    assert_close(
        &run(&a, &y()),
        &[0.580404, 1.964324, 3.348242, 6.11608, 7.5, 8.883919, 11.651756, 13.035677, 14.419596],
    );
    let a = attrs(
        &[1.0, 1.0, 1.5, 1.5],
        &[1, 1, 6, 6],
        &[
            ("mode", text("cubic")),
            ("coordinate_transformation_mode", text("asymmetric")),
            ("cubic_coeff_a", AttrValue::Float(-0.5)),
        ],
    );
    assert_close(
        &run(&a, &y()),
        &[
            0.0, 0.62963, 1.333335, 2.0, 2.740741, 3.074075, 2.518519, 3.148149, 3.851855,
            4.518519, 5.259262, 5.592595, 5.333339, 5.962969, 6.666676, 7.333339, 8.074082,
            8.407415, 8.0, 8.629631, 9.333337, 10.0, 10.740743, 11.074077, 10.962965, 11.592598,
            12.296303, 12.962965, 13.703709, 14.037044, 12.296299, 12.925932, 13.629637, 14.296301,
            15.037043, 15.370378,
        ],
    );
}

// resize(y, sizes=[1,1,3,3], roi=[0,0,0.4,0.6,1,1,1.2,1.7], mode="linear",
//        coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=10.0)
#[test]
fn tf_crop_and_resize_extrapolates() {
    let mut a = attrs(
        &[1.0, 1.0, 0.75, 0.75],
        &[1, 1, 3, 3],
        &[
            ("mode", text("linear")),
            ("coordinate_transformation_mode", text("tf_crop_and_resize")),
            ("extrapolation_value", AttrValue::Float(10.0)),
        ],
    );
    let roi = [0.0, 0.0, 0.4, 0.6, 1.0, 1.0, 1.2, 1.7].map(|v: f64| v as f32 as f64);
    a.set("roi", AttrValue::Floats(roi.to_vec()));
    assert_close(&run(&a, &y()), &[6.6, 10.0, 10.0, 11.400001, 10.0, 10.0, 10.0, 10.0, 10.0]);
}

// resize(y, sizes=[1,1,2,2], mode="linear", antialias=1)
#[test]
fn linear_antialias_downsample() {
    let a = attrs(
        &[1.0, 1.0, 0.5, 0.5],
        &[1, 1, 2, 2],
        &[("mode", text("linear")), ("antialias", AttrValue::Int(1))],
    );
    assert_close(&run(&a, &y()), &[3.125, 4.875, 10.125, 11.875]);
}

#[test]
fn identity_and_errors() {
    let a = attrs(&[1.0; 4], &[1, 1, 2, 3], &[("mode", text("linear"))]);
    assert_close(&run(&a, &x()), &[1., 2., 3., 4., 5., 6.]);
    // Sizes that disagree with the output are refused at prepare time.
    let a = attrs(&[1.0; 4], &[1, 1, 2, 4], &[]);
    let out = [TensorDesc::new(DType::F32, [1, 1, 2, 3])];
    assert!(eval("Resize", &a, &[&x()], &out).is_err());
    // Linear does not interpolate integers.
    let xi = Tensor::from_vec(vec![2], &[1i32, 2]).unwrap();
    let a = attrs(&[2.0], &[4], &[("mode", text("linear"))]);
    assert!(eval("Resize", &a, &[&xi], &[TensorDesc::new(DType::I32, [4])]).is_err());
}

/// Scales from a hostile bundle: not positive, not finite, or so small that an antialiasing
/// filter would be wider than any input, are errors at prepare time; a tiny scale without
/// antialiasing reads the edge pixel (by hand: with half_pixel, output 0 maps to
/// `0.5 / 1e-30 - 0.5`, far past the right edge, so every tap reads the last pixel).
#[test]
fn hostile_scales_are_errors_or_read_the_edge() {
    let out = [TensorDesc::new(DType::F32, [1, 1, 2, 1])];
    for s in [0.0, -0.0, -1.0, f64::NAN, f64::INFINITY] {
        let a = attrs(&[1.0, 1.0, 1.0, s], &[1, 1, 2, 1], &[("mode", text("linear"))]);
        assert!(eval("Resize", &a, &[&x()], &out).is_err(), "scale {s}");
    }
    let cubic_aa = [("mode", text("cubic")), ("antialias", AttrValue::Int(1))];
    let a = attrs(&[1.0, 1.0, 1.0, 1e-30], &[1, 1, 2, 1], &cubic_aa);
    assert!(eval("Resize", &a, &[&x()], &out).is_err());
    let a = attrs(&[1.0, 1.0, 1.0, 1e-30], &[1, 1, 2, 1], &[("mode", text("cubic"))]);
    assert_close(&run(&a, &x()), &[3.0, 6.0]);
}
