//! Lowering and shape inference of the movement family. Expected shapes follow the ONNX spec
//! (and numpy, whose slicing and splitting rules ONNX copies); each case is small enough to
//! check by hand.

use super::OPS;
use crate::lower::{LowerCx, OpResult};
use crate::{Constant, Node};
use crate::{Tensor, TensorDesc};
use ingot_schema::{AttrValue, Attrs, DType};
use std::sync::Arc;

/// One input of a test node.
enum In {
    /// A run-time tensor of this type.
    X(DType, Vec<usize>),
    /// A constant.
    C(Tensor),
    /// An omitted optional input.
    Omitted,
}

fn x(shape: &[usize]) -> In {
    In::X(DType::F32, shape.to_vec())
}

fn c64(v: &[i64]) -> In {
    In::C(Tensor::from_vec(vec![v.len()], v).unwrap())
}

fn scalar_i64(v: i64) -> In {
    In::C(Tensor::from_vec(Vec::<usize>::new(), &[v]).unwrap())
}

/// Lowers an `op` node for `opset` and infers its outputs; returns the lowered node and its
/// output types.
fn lower(
    op: &str,
    opset: i64,
    attrs: Attrs,
    inputs: Vec<In>,
    n_out: usize,
) -> OpResult<(Node, Vec<TensorDesc>)> {
    let consts: Vec<Option<Arc<Tensor>>> = inputs
        .iter()
        .map(|i| match i {
            In::C(t) => Some(Arc::new(t.clone())),
            _ => None,
        })
        .collect();
    let descs: Vec<Option<TensorDesc>> = inputs
        .iter()
        .zip(&consts)
        .map(|(i, c)| match (i, c) {
            (In::X(dt, s), _) => Some(TensorDesc::new(*dt, s.clone())),
            (_, Some(c)) => Some(c.desc().clone()),
            _ => None,
        })
        .collect();
    let mut node = Node {
        name: "n".into(),
        op: op.into(),
        domain: String::new(),
        inputs: descs.iter().enumerate().map(|(i, d)| d.as_ref().map(|_| i)).collect(),
        outputs: (100..100 + n_out).collect(),
        attrs,
    };
    let cx = LowerCx {
        opset,
        inputs: descs.iter().map(Option::as_ref).collect(),
        consts: consts.iter().map(|c| c.as_ref().map(|c| c as &dyn Constant)).collect(),
    };
    let def = OPS.iter().find(|d| d.name == op).unwrap();
    (def.lower)(&mut node, &cx)?;
    let ins: Vec<&TensorDesc> = node
        .inputs
        .iter()
        .map(|i| descs[i.expect("lowering left an omitted input")].as_ref().unwrap())
        .collect();
    let outs = (def.infer)(&node, &ins)?;
    Ok((node, outs))
}

fn shapes(outs: &[TensorDesc]) -> Vec<Vec<usize>> {
    outs.iter().map(|d| d.shape.clone()).collect()
}

fn a(list: &[(&str, AttrValue)]) -> Attrs {
    list.iter().fold(Attrs::new(), |a, (k, v)| a.with(k, v.clone()))
}

fn ints(v: &[i64]) -> AttrValue {
    AttrValue::Ints(v.to_vec())
}

#[test]
fn reshape_resolves_zero_and_minus_one() {
    let (n, o) = lower("Reshape", 13, Attrs::new(), vec![x(&[2, 3, 4]), c64(&[0, -1])], 1).unwrap();
    assert_eq!(n.attrs.ints("shape").unwrap(), [2, 12]);
    assert_eq!(n.inputs.len(), 1);
    assert_eq!(o[0].shape, [2, 12]);
    // allowzero keeps a literal 0 (and then the element counts must agree).
    let z = a(&[("allowzero", AttrValue::Int(1))]);
    let (n, _) = lower("Reshape", 14, z, vec![x(&[0, 3]), c64(&[3, 0])], 1).unwrap();
    assert_eq!(n.attrs.ints("shape").unwrap(), [3, 0]);
    assert!(!n.attrs.contains("allowzero"));
    assert!(lower("Reshape", 13, Attrs::new(), vec![x(&[2, 3]), c64(&[-1, -1])], 1).is_err());
    assert!(lower("Reshape", 13, Attrs::new(), vec![x(&[2, 3]), c64(&[4, -1])], 1).is_err());
}

#[test]
fn flatten_squeeze_unsqueeze() {
    let (n, o) =
        lower("Flatten", 13, a(&[("axis", AttrValue::Int(-1))]), vec![x(&[2, 3, 4])], 1).unwrap();
    assert_eq!((n.attrs.int("axis").unwrap(), o[0].shape.clone()), (2, vec![6, 4]));
    let (_, o) =
        lower("Flatten", 13, a(&[("axis", AttrValue::Int(3))]), vec![x(&[2, 3, 4])], 1).unwrap();
    assert_eq!(o[0].shape, [24, 1]);
    // Squeeze: attribute before opset 13, input after, every 1 when omitted.
    let (n, o) = lower("Squeeze", 11, a(&[("axes", ints(&[-1]))]), vec![x(&[1, 3, 1])], 1).unwrap();
    assert_eq!((n.attrs.ints("axes").unwrap(), o[0].shape.as_slice()), (&[2][..], &[1, 3][..]));
    let (n, o) = lower("Squeeze", 13, Attrs::new(), vec![x(&[1, 3, 1]), c64(&[0])], 1).unwrap();
    assert_eq!((n.inputs.len(), o[0].shape.as_slice()), (1, &[3, 1][..]));
    let (_, o) = lower("Squeeze", 13, Attrs::new(), vec![x(&[1, 3, 1])], 1).unwrap();
    assert_eq!(o[0].shape, [3]);
    assert!(lower("Squeeze", 13, Attrs::new(), vec![x(&[2, 3]), c64(&[0])], 1).is_err());
    // Unsqueeze axes count against the output rank.
    let (n, o) = lower("Unsqueeze", 13, Attrs::new(), vec![x(&[3, 4]), c64(&[-1, 0])], 1).unwrap();
    assert_eq!(n.attrs.ints("axes").unwrap(), [0, 3]);
    assert_eq!(o[0].shape, [1, 3, 4, 1]);
    assert!(lower("Unsqueeze", 13, Attrs::new(), vec![x(&[3]), c64(&[0, 0])], 1).is_err());
}

#[test]
fn dropout_shape_and_size() {
    let ratio = In::C(Tensor::from_vec(Vec::<usize>::new(), &[0.3f32]).unwrap());
    let (n, o) = lower("Dropout", 13, Attrs::new(), vec![x(&[2, 3]), ratio], 2).unwrap();
    assert_eq!(n.inputs.len(), 1);
    assert_eq!(o[1], TensorDesc::new(DType::Bool, [2, 3]));
    let ratio = In::C(Tensor::from_vec(Vec::<usize>::new(), &[0.3f32]).unwrap());
    let training = In::C(Tensor::from_bools(Vec::<usize>::new(), &[true]).unwrap());
    assert!(lower("Dropout", 13, Attrs::new(), vec![x(&[2]), ratio, training], 1).is_err());

    let se = a(&[("start", AttrValue::Int(-3)), ("end", AttrValue::Int(100))]);
    let (n, o) = lower("Shape", 15, se, vec![x(&[2, 3, 4, 5])], 1).unwrap();
    assert_eq!((n.attrs.int("start").unwrap(), n.attrs.int("end").unwrap()), (1, 4));
    assert_eq!(o[0], TensorDesc::new(DType::I64, [3]));
    let (_, o) = lower("Size", 13, Attrs::new(), vec![x(&[2, 3])], 1).unwrap();
    assert_eq!(o[0], TensorDesc::new(DType::I64, []));
}

#[test]
fn constant_of_shape_and_range() {
    // The importer gives `value` and `value.dtype` (7 = INT64).
    let v = a(&[("value", AttrValue::Int(5)), ("value.dtype", AttrValue::Int(7))]);
    let (n, o) = lower("ConstantOfShape", 13, v, vec![c64(&[2, 3])], 1).unwrap();
    assert!(n.inputs.is_empty());
    assert_eq!(o[0], TensorDesc::new(DType::I64, [2, 3]));
    assert_eq!(n.attrs.get("value"), Some(&AttrValue::Int(5)));
    assert!(!n.attrs.contains("value.dtype"));
    let (n, o) = lower("ConstantOfShape", 13, Attrs::new(), vec![c64(&[])], 1).unwrap();
    assert_eq!(o[0], TensorDesc::new(DType::F32, []));
    assert_eq!(n.attrs.get("value"), Some(&AttrValue::Float(0.0)));

    // np.arange(10, 4, -3) has 2 elements; np.arange(1.0, 2.05, 0.25, np.float32) has 5.
    let (n, o) =
        lower("Range", 13, Attrs::new(), vec![scalar_i64(10), scalar_i64(4), scalar_i64(-3)], 1)
            .unwrap();
    assert!(n.inputs.is_empty());
    assert_eq!(o[0], TensorDesc::new(DType::I64, [2]));
    let f = |v: f32| In::C(Tensor::from_vec(Vec::<usize>::new(), &[v]).unwrap());
    let (_, o) = lower("Range", 13, Attrs::new(), vec![f(1.0), f(2.05), f(0.25)], 1).unwrap();
    assert_eq!(o[0], TensorDesc::new(DType::F32, [5]));
    let (_, o) =
        lower("Range", 13, Attrs::new(), vec![scalar_i64(3), scalar_i64(1), scalar_i64(1)], 1)
            .unwrap();
    assert_eq!(o[0].shape, [0]);
}

#[test]
fn transpose_concat_split() {
    let (n, o) = lower("Transpose", 13, Attrs::new(), vec![x(&[2, 3, 4])], 1).unwrap();
    assert_eq!(
        (n.attrs.ints("perm").unwrap(), o[0].shape.as_slice()),
        (&[2, 1, 0][..], &[4, 3, 2][..])
    );
    assert!(lower("Transpose", 13, a(&[("perm", ints(&[0, 0]))]), vec![x(&[2, 3])], 1).is_err());

    let (n, o) =
        lower("Concat", 13, a(&[("axis", AttrValue::Int(-1))]), vec![x(&[2, 3]), x(&[2, 1])], 1)
            .unwrap();
    assert_eq!((n.attrs.int("axis").unwrap(), o[0].shape.as_slice()), (1, &[2, 4][..]));

    // Equal parts by default; opset 18's num_outputs leaves a smaller last part (7 -> 3,3,1).
    let (n, o) = lower("Split", 13, Attrs::new(), vec![x(&[6, 2])], 3).unwrap();
    assert_eq!(n.attrs.ints("split").unwrap(), [2, 2, 2]);
    assert_eq!(shapes(&o), [[2, 2], [2, 2], [2, 2]]);
    let k = a(&[("num_outputs", AttrValue::Int(3)), ("axis", AttrValue::Int(-1))]);
    let (n, o) = lower("Split", 18, k, vec![x(&[2, 7])], 3).unwrap();
    assert_eq!(n.attrs.ints("split").unwrap(), [3, 3, 1]);
    assert_eq!(o[2].shape, [2, 1]);
    assert!(!n.attrs.contains("num_outputs"));
    let (n, _) = lower("Split", 13, Attrs::new(), vec![x(&[5]), c64(&[2, 3])], 2).unwrap();
    assert_eq!((n.attrs.ints("split").unwrap(), n.inputs.len()), (&[2, 3][..], 1));
    let (n, _) = lower("Split", 11, a(&[("split", ints(&[4, 1]))]), vec![x(&[5])], 2).unwrap();
    assert_eq!(n.attrs.ints("split").unwrap(), [4, 1]);
    assert!(lower("Split", 13, Attrs::new(), vec![x(&[5])], 2).is_err());
}

#[test]
fn slice_resolves_and_clamps_every_axis() {
    // x[1:-3:-1, 2::-2, -1:0:-2] on (2,3,4): numpy gives shape (2, 2, 2).
    let (n, o) = lower(
        "Slice",
        13,
        Attrs::new(),
        vec![
            x(&[2, 3, 4]),
            c64(&[1, 2, -1]),
            c64(&[-3, i64::MIN, 0]),
            In::Omitted,
            c64(&[-1, -2, -2]),
        ],
        1,
    )
    .unwrap();
    assert_eq!(n.inputs.len(), 1);
    assert_eq!(n.attrs.ints("starts").unwrap(), [1, 2, 3]);
    assert_eq!(n.attrs.ints("ends").unwrap(), [-1, -1, 0]);
    assert_eq!(n.attrs.ints("steps").unwrap(), [-1, -2, -2]);
    assert_eq!(o[0].shape, [2, 2, 2]);
    // x[:, 1:1000] with axes [-1]: the other axis is whole.
    let (n, o) = lower(
        "Slice",
        13,
        Attrs::new(),
        vec![x(&[2, 4]), c64(&[1]), c64(&[i64::MAX]), c64(&[-1])],
        1,
    )
    .unwrap();
    assert_eq!(n.attrs.ints("starts").unwrap(), [0, 1]);
    assert_eq!(n.attrs.ints("ends").unwrap(), [2, 4]);
    assert_eq!(o[0].shape, [2, 3]);
    // A start past the end gives an empty axis.
    let (_, o) = lower("Slice", 13, Attrs::new(), vec![x(&[4]), c64(&[5]), c64(&[7])], 1).unwrap();
    assert_eq!(o[0].shape, [0]);
    assert!(
        lower(
            "Slice",
            13,
            Attrs::new(),
            vec![x(&[4]), c64(&[0]), c64(&[2]), c64(&[0]), c64(&[0])],
            1
        )
        .is_err()
    );
}

#[test]
fn pad_canonical_for_every_axis() {
    // Opset 18 axes: pads [1, 2] on axis -1 only -> every axis listed.
    let value = In::C(Tensor::from_vec(Vec::<usize>::new(), &[2.5f32]).unwrap());
    let (n, o) = lower(
        "Pad",
        18,
        a(&[("mode", AttrValue::Text("reflect".into()))]),
        vec![x(&[2, 3]), c64(&[1, 2]), value, c64(&[-1])],
        1,
    )
    .unwrap();
    assert_eq!(n.attrs.ints("pads").unwrap(), [0, 1, 0, 2]);
    assert_eq!(n.attrs.get("value"), Some(&AttrValue::Float(2.5)));
    assert_eq!(n.attrs.text("mode").unwrap(), "reflect");
    assert_eq!((n.inputs.len(), o[0].shape.as_slice()), (1, &[2, 6][..]));
    // Integer data gets an integer value; an omitted constant_value is 0.
    let (n, o) =
        lower("Pad", 13, Attrs::new(), vec![In::X(DType::I64, vec![3]), c64(&[-1, 2])], 1).unwrap();
    assert_eq!(n.attrs.get("value"), Some(&AttrValue::Int(0)));
    assert_eq!(n.attrs.text("mode").unwrap(), "constant");
    assert_eq!(o[0].shape, [4]);
    assert!(lower("Pad", 13, Attrs::new(), vec![x(&[3]), c64(&[-2, -2])], 1).is_err());
}

#[test]
fn center_crop_pad_is_a_centred_pad() {
    // Crop 5 -> 2 (one off the front, two off the back) and pad 4 -> 7 (one before, two after),
    // the odd pixel at the end either way; a third axis left alone by `axes`.
    let attrs = Attrs::new().with("axes", AttrValue::Ints(vec![0, -2]));
    let (n, o) = lower("CenterCropPad", 18, attrs, vec![x(&[5, 4, 3]), c64(&[2, 7])], 1).unwrap();
    assert_eq!(n.attrs.ints("pads").unwrap(), [-1, 1, 0, -2, 2, 0]);
    assert_eq!(n.attrs.text("mode").unwrap(), "constant");
    assert_eq!((n.inputs.len(), o[0].shape.as_slice()), (1, &[2, 7, 3][..]));
}

#[test]
fn tile_expand_depth_space() {
    let (n, o) = lower("Tile", 13, Attrs::new(), vec![x(&[2, 3]), c64(&[2, 1])], 1).unwrap();
    assert_eq!((n.inputs.len(), o[0].shape.as_slice()), (1, &[4, 3][..]));
    // np.broadcast_shapes((3, 1), (2, 1, 4)) == (2, 3, 4)
    let (n, o) = lower("Expand", 13, Attrs::new(), vec![x(&[3, 1]), c64(&[2, 1, 4])], 1).unwrap();
    assert_eq!(n.attrs.ints("shape").unwrap(), [2, 3, 4]);
    assert_eq!(o[0].shape, [2, 3, 4]);
    assert!(lower("Expand", 13, Attrs::new(), vec![x(&[3]), c64(&[2])], 1).is_err());
    let b = a(&[("blocksize", AttrValue::Int(2))]);
    let (n, o) = lower("DepthToSpace", 13, b.clone(), vec![x(&[1, 8, 2, 3])], 1).unwrap();
    assert_eq!((n.attrs.text("mode").unwrap(), o[0].shape.as_slice()), ("DCR", &[1, 2, 4, 6][..]));
    let (_, o) = lower("SpaceToDepth", 13, b, vec![x(&[1, 2, 4, 6])], 1).unwrap();
    assert_eq!(o[0].shape, [1, 8, 2, 3]);
}

#[test]
fn trilu_cumsum_index_ops() {
    let (n, _) = lower("Trilu", 14, Attrs::new(), vec![x(&[3, 3]), scalar_i64(-1)], 1).unwrap();
    assert_eq!((n.attrs.int("upper").unwrap(), n.attrs.int("k").unwrap()), (1, -1));
    assert_eq!(n.inputs.len(), 1);
    let (n, _) = lower("CumSum", 14, Attrs::new(), vec![x(&[3, 3]), scalar_i64(-1)], 1).unwrap();
    assert_eq!(n.attrs.int("axis").unwrap(), 1);
    assert_eq!(n.attrs.int("exclusive").unwrap(), 0);

    let idx = In::X(DType::I64, vec![2, 5]);
    let (n, o) =
        lower("Gather", 13, a(&[("axis", AttrValue::Int(-1))]), vec![x(&[3, 4]), idx], 1).unwrap();
    assert_eq!((n.attrs.int("axis").unwrap(), o[0].shape.as_slice()), (1, &[3, 2, 5][..]));
    let idx = In::X(DType::I64, vec![2, 1]);
    let (_, o) =
        lower("GatherND", 13, a(&[("batch_dims", AttrValue::Int(1))]), vec![x(&[2, 2, 2]), idx], 1)
            .unwrap();
    assert_eq!(o[0].shape, [2, 2]);
    let idx = In::X(DType::F32, vec![2]);
    assert!(lower("Gather", 13, Attrs::new(), vec![x(&[3]), idx], 1).is_err());
    let upd = x(&[2]);
    let idx = In::X(DType::I64, vec![2, 1]);
    let r = a(&[("reduction", AttrValue::Text("sum".into()))]);
    assert!(lower("ScatterND", 16, r, vec![x(&[4]), idx, upd], 1).is_err());

    // OneHot: depth 5 (a float constant is fine), axis -1 of the output.
    let depth = In::C(Tensor::from_vec(vec![1], &[5.0f32]).unwrap());
    let (n, o) =
        lower("OneHot", 11, Attrs::new(), vec![In::X(DType::I64, vec![2, 3]), depth, x(&[2])], 1)
            .unwrap();
    assert_eq!(n.inputs, [Some(0), Some(2)]);
    assert_eq!((n.attrs.int("axis").unwrap(), n.attrs.int("depth").unwrap()), (2, 5));
    assert_eq!(o[0], TensorDesc::new(DType::F32, [2, 3, 5]));
}

#[test]
fn bitcast_reads_the_bytes_as_a_type_of_their_width() {
    let to = |code: i64| a(&[("to", AttrValue::Int(code))]);
    let (_, outs) = lower("BitCast", 26, to(6), vec![x(&[2, 3])], 1).unwrap();
    assert_eq!(outs, [TensorDesc::new(DType::I32, vec![2, 3])]);
    let bools = In::X(DType::Bool, vec![4]);
    let (_, outs) = lower("BitCast", 26, to(2), vec![bools], 1).unwrap();
    assert_eq!(outs, [TensorDesc::new(DType::U8, vec![4])]);
    // Another width, bfloat16 (float32 in Ingot), a 4-bit type (a byte each in Ingot).
    let err = |code, input| lower("BitCast", 26, to(code), vec![input], 1).unwrap_err().0;
    assert!(err(7, x(&[2])).contains("f32 is 4 bytes, i64 8"), "{}", err(7, x(&[2])));
    assert!(err(16, x(&[2])).contains("bfloat16"));
    assert!(err(3, In::X(DType::I4, vec![2])).contains("a byte each"));
}
