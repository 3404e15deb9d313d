//! Resize lowering. Output sizes follow the ONNX spec: `floor(in * scale)` for scales, and for
//! keep_aspect_ratio_policy one common scale with sizes rounded half up (ONNX's
//! resize_upsample_sizes_nearest_not_larger case: 2x2 with sizes [7, 8] gives 7x7).

use super::OPS;
use crate::lower::{LowerCx, OpResult};
use crate::{Constant, Node};
use crate::{Tensor, TensorDesc};
use ingot_schema::{AttrValue, Attrs, DType};
use std::sync::Arc;

fn floats(v: &[f32]) -> Option<Arc<Tensor>> {
    Some(Arc::new(Tensor::from_vec(vec![v.len()], v).unwrap()))
}

fn ints(v: &[i64]) -> Option<Arc<Tensor>> {
    Some(Arc::new(Tensor::from_vec(vec![v.len()], v).unwrap()))
}

/// Lowers a Resize of an f32 `shape` with constant operands roi, scales, sizes (None =
/// omitted), then infers its output.
fn lower(
    opset: i64,
    attrs: Attrs,
    shape: &[usize],
    operands: [Option<Arc<Tensor>>; 3],
) -> OpResult<(Node, TensorDesc)> {
    let x = TensorDesc::new(DType::F32, shape.to_vec());
    let mut inputs = vec![Some(&x)];
    let mut consts = vec![None];
    for c in &operands {
        inputs.push(c.as_ref().map(|c| Tensor::desc(c)));
        consts.push(c.as_ref().map(|c| c as &dyn Constant));
    }
    let mut node = Node {
        name: "r".into(),
        op: "Resize".into(),
        domain: String::new(),
        inputs: inputs.iter().enumerate().map(|(i, d)| d.map(|_| i)).collect(),
        outputs: vec![9],
        attrs,
    };
    let cx = LowerCx { opset, inputs, consts };
    (OPS[0].lower)(&mut node, &cx)?;
    assert_eq!(node.inputs, [Some(0)]);
    let out = (OPS[0].infer)(&node, &[&x])?.remove(0);
    Ok((node, out))
}

fn text(s: &str) -> AttrValue {
    AttrValue::Text(s.into())
}

#[test]
fn scales_give_floored_sizes_and_defaults() {
    // Opset 11: roi and scales are required inputs; an empty roi means none.
    let (n, out) =
        lower(11, Attrs::new(), &[1, 3, 5, 5], [floats(&[]), floats(&[1.0, 1.0, 2.0, 0.5]), None])
            .unwrap();
    assert_eq!(out.shape, [1, 3, 10, 2]);
    let a = &n.attrs;
    assert_eq!(a.text("mode").unwrap(), "nearest");
    assert_eq!(a.text("coordinate_transformation_mode").unwrap(), "half_pixel");
    assert_eq!(a.text("nearest_mode").unwrap(), "round_prefer_floor");
    assert_eq!(a.get("cubic_coeff_a"), Some(&AttrValue::Float(-0.75)));
    assert_eq!(a.int("exclude_outside").unwrap(), 0);
    assert_eq!(a.int("antialias").unwrap(), 0);
    assert_eq!(a.floats("scales").unwrap(), [1.0, 1.0, 2.0, 0.5]);
    assert_eq!(a.floats("roi").unwrap(), [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]);
}

#[test]
fn sizes_give_scales() {
    let (n, out) = lower(
        13,
        Attrs::new().with("mode", text("linear")),
        &[1, 1, 4, 2],
        [None, None, ints(&[1, 1, 2, 3])],
    )
    .unwrap();
    assert_eq!(out.shape, [1, 1, 2, 3]);
    assert_eq!(n.attrs.floats("scales").unwrap(), [1.0, 1.0, 0.5, 1.5]);
}

#[test]
fn axes_keep_aspect_ratio_and_roi() {
    let a = Attrs::new()
        .with("axes", AttrValue::Ints(vec![2, -1]))
        .with("keep_aspect_ratio_policy", text("not_larger"));
    let (n, out) = lower(18, a, &[1, 1, 2, 2], [None, None, ints(&[7, 8])]).unwrap();
    assert_eq!(out.shape, [1, 1, 7, 7]);
    assert_eq!(n.attrs.floats("scales").unwrap(), [1.0, 1.0, 3.5, 3.5]);
    assert!(!n.attrs.contains("axes"));

    // roi over the listed axes lands on those axes; the others keep [0, 1].
    let a = Attrs::new()
        .with("axes", AttrValue::Ints(vec![3]))
        .with("coordinate_transformation_mode", text("tf_crop_and_resize"));
    let (n, out) = lower(18, a, &[1, 1, 4, 4], [floats(&[0.25, 0.75]), None, ints(&[3])]).unwrap();
    assert_eq!(out.shape, [1, 1, 4, 3]);
    assert_eq!(n.attrs.floats("roi").unwrap(), [0.0, 0.0, 0.0, 0.25, 1.0, 1.0, 1.0, 0.75]);
}

#[test]
fn bad_operands_are_errors() {
    let both = [None, floats(&[1.0, 2.0]), ints(&[1, 4])];
    assert!(lower(13, Attrs::new(), &[1, 2], both).is_err());
    assert!(lower(13, Attrs::new(), &[1, 2], [None, None, None]).is_err());
    let a = Attrs::new().with("mode", text("bicubic"));
    assert!(lower(13, a, &[1, 2], [None, floats(&[1.0, 2.0]), None]).is_err());
    let a = Attrs::new().with("antialias", AttrValue::Int(1));
    assert!(lower(18, a, &[1, 2], [None, floats(&[1.0, 2.0]), None]).is_err());
}

#[test]
fn upsample_is_an_asymmetric_resize_rounding_down() {
    // Opset 7: scales an attribute, bilinear spelled its old way; opset 9: scales input 1.
    let x = TensorDesc::new(DType::F32, vec![1, 1, 3, 3]);
    let upsample = OPS.iter().find(|d| d.name == "Upsample").unwrap();
    let scales = [1.0, 1.0, 2.0, 1.5];
    for opset in [7, 9] {
        let s = floats(&scales.map(|v| v as f32));
        let attrs = Attrs::new().with("mode", text("bilinear"));
        let (inputs, consts, attrs) = match opset {
            7 => (
                vec![Some(&x)],
                vec![None],
                attrs.with("scales", AttrValue::Floats(scales.to_vec())),
            ),
            _ => (
                vec![Some(&x), s.as_ref().map(|c| Tensor::desc(c))],
                vec![None, s.as_ref().map(|c| c as &dyn Constant)],
                attrs,
            ),
        };
        let mut node = Node {
            name: "u".into(),
            op: "Upsample".into(),
            domain: String::new(),
            inputs: inputs.iter().enumerate().map(|(i, _)| Some(i)).collect(),
            outputs: vec![9],
            attrs,
        };
        (upsample.lower)(&mut node, &LowerCx { opset, inputs, consts }).unwrap();
        assert_eq!((node.op.as_str(), node.inputs.as_slice()), ("Resize", &[Some(0)][..]));
        let out = (upsample.infer)(&node, &[&x]).unwrap().remove(0);
        assert_eq!(out.shape, [1, 1, 6, 4]);
        let a = &node.attrs;
        assert_eq!(a.text("mode").unwrap(), "linear");
        assert_eq!(a.text("coordinate_transformation_mode").unwrap(), "asymmetric");
        assert_eq!(a.text("nearest_mode").unwrap(), "floor");
    }
}
