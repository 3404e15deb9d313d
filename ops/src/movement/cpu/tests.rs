//! Expected values come from numpy (the script is quoted above each group) or, for tiny
//! cases, by hand.

use crate::cpu::eval;
use crate::tensor::{Tensor, TensorDesc};
use ingot_schema::{AttrValue, Attrs, DType};

fn ints(v: &[i64]) -> AttrValue {
    AttrValue::Ints(v.to_vec())
}

fn attrs(list: &[(&str, AttrValue)]) -> Attrs {
    list.iter().fold(Attrs::new(), |a, (k, v)| a.with(k, v.clone()))
}

/// `0, 1, 2, ...` as f32 in `shape`.
fn arange(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| i as f32).collect();
    Tensor::from_vec(shape.to_vec(), &v).unwrap()
}

fn i64s(shape: &[usize], v: &[i64]) -> Tensor {
    Tensor::from_vec(shape.to_vec(), v).unwrap()
}

fn f32_desc(shape: &[usize]) -> TensorDesc {
    TensorDesc::new(DType::F32, shape)
}

/// Runs a single-output op and returns its f32 output as integers.
fn run(op: &str, a: &Attrs, inputs: &[&Tensor], out: TensorDesc) -> Vec<i64> {
    let outs = eval(op, a, inputs, &[out]).unwrap_or_else(|e| panic!("{op}: {e}"));
    outs[0].as_slice::<f32>().unwrap().iter().map(|&v| v as i64).collect()
}

// import numpy as np
// x = np.arange(24).reshape(2,3,4)
// x.transpose(2,0,1); x[1:-3:-1, 2::-2, -1:0:-2]
#[test]
fn transpose_and_slice_match_numpy() {
    let x = arange(&[2, 3, 4]);
    let t = run("Transpose", &attrs(&[("perm", ints(&[2, 0, 1]))]), &[&x], f32_desc(&[4, 2, 3]));
    assert_eq!(
        t,
        [0, 4, 8, 12, 16, 20, 1, 5, 9, 13, 17, 21, 2, 6, 10, 14, 18, 22, 3, 7, 11, 15, 19, 23]
    );
    // Canonical slice: clamped per axis; -1 as an end means "past index 0" for a negative step.
    let a = attrs(&[
        ("starts", ints(&[1, 2, 3])),
        ("ends", ints(&[-1, -1, 0])),
        ("steps", ints(&[-1, -2, -2])),
    ]);
    assert_eq!(run("Slice", &a, &[&x], f32_desc(&[2, 2, 2])), [23, 21, 15, 13, 11, 9, 3, 1]);
    // An empty slice.
    let a = attrs(&[
        ("starts", ints(&[0, 2, 0])),
        ("ends", ints(&[2, 1, 4])),
        ("steps", ints(&[1, 1, 1])),
    ]);
    assert!(run("Slice", &a, &[&x], f32_desc(&[2, 0, 4])).is_empty());
}

// x = np.arange(24).reshape(2,3,4); x[:, i:i+1, :] for i = 1 and -2; x[:, 0:2, 1:3]
#[test]
fn a_dynamic_slice_takes_its_window_where_the_run_says() {
    let x = arange(&[2, 3, 4]);
    let one_row = attrs(&[("axes", ints(&[1])), ("sizes", ints(&[1]))]);
    for start in [1, -2] {
        let starts = i64s(&[1], &[start]);
        let y = run("DynamicSlice", &one_row, &[&x, &starts], f32_desc(&[2, 1, 4]));
        assert_eq!(y, [4, 5, 6, 7, 16, 17, 18, 19], "x[:, {start}:{}]", start + 1);
    }
    let block = attrs(&[("axes", ints(&[2, 1])), ("sizes", ints(&[2, 2]))]);
    let starts = Tensor::from_vec(vec![2], &[1i32, 0]).unwrap();
    let y = run("DynamicSlice", &block, &[&x, &starts], f32_desc(&[2, 2, 2]));
    assert_eq!(y, [1, 2, 5, 6, 13, 14, 17, 18]);
    // Where Slice would take fewer elements than the plan holds: a start past the end, one
    // whose window runs past it, and -1, whose end is 0 (Slice takes nothing).
    for start in [3, 5, -1, -4] {
        let starts = i64s(&[1], &[start]);
        let e = eval("DynamicSlice", &one_row, &[&x, &starts], &[f32_desc(&[2, 1, 4])]);
        let e = e.expect_err(&format!("start {start}")).to_string();
        assert!(e.contains("the plan holds 1"), "{e}");
    }
}

#[test]
fn transpose_moves_every_dtype() {
    let v: Vec<i64> = (0..6).collect();
    let a = attrs(&[("perm", ints(&[1, 0]))]);
    let expect = [0, 3, 1, 4, 2, 5];
    let t = i64s(&[2, 3], &v);
    let out = eval("Transpose", &a, &[&t], &[TensorDesc::new(DType::I64, [3, 2])]).unwrap();
    assert_eq!(out[0].as_slice::<i64>().unwrap(), expect);
    let b: Vec<u8> = v.iter().map(|&x| x as u8).collect();
    let t = Tensor::from_vec(vec![2, 3], &b).unwrap();
    let out = eval("Transpose", &a, &[&t], &[TensorDesc::new(DType::U8, [3, 2])]).unwrap();
    assert_eq!(out[0].as_slice::<u8>().unwrap(), [0, 3, 1, 4, 2, 5]);
    let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x as f32)).collect();
    let t = Tensor::from_vec(vec![2, 3], &h).unwrap();
    let out = eval("Transpose", &a, &[&t], &[TensorDesc::new(DType::F16, [3, 2])]).unwrap();
    let got: Vec<f32> =
        out[0].as_slice::<half::f16>().unwrap().iter().map(|x| x.to_f32()).collect();
    assert_eq!(got, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
}

// y = np.arange(6).reshape(2,3)
// np.pad(y, ((1,1),(2,2)), mode="reflect"); np.pad(y, ((0,1),(2,0)), mode="edge")
// np.pad(y, ((1,0),(0,4)), mode="wrap"); np.pad(y, ((1,0),(0,0)), constant_values=7)[:, 1:]
#[test]
fn pad_modes_match_numpy() {
    let y = arange(&[2, 3]);
    let pad = |mode: &str, pads: &[i64], shape: &[usize]| {
        let a = attrs(&[
            ("mode", AttrValue::Text(mode.into())),
            ("pads", ints(pads)),
            ("value", AttrValue::Float(7.0)),
        ]);
        run("Pad", &a, &[&y], f32_desc(shape))
    };
    assert_eq!(
        pad("reflect", &[1, 2, 1, 2], &[4, 7]),
        [5, 4, 3, 4, 5, 4, 3, 2, 1, 0, 1, 2, 1, 0, 5, 4, 3, 4, 5, 4, 3, 2, 1, 0, 1, 2, 1, 0]
    );
    assert_eq!(pad("edge", &[0, 2, 1, 0], &[3, 5]), [0, 0, 0, 1, 2, 3, 3, 3, 4, 5, 3, 3, 3, 4, 5]);
    assert_eq!(
        pad("wrap", &[1, 0, 0, 4], &[3, 7]),
        [3, 4, 5, 3, 4, 5, 3, 0, 1, 2, 0, 1, 2, 0, 3, 4, 5, 3, 4, 5, 3]
    );
    // A negative pad crops.
    assert_eq!(pad("constant", &[1, -1, 0, 0], &[3, 2]), [7, 7, 1, 2, 4, 5]);
}

#[test]
fn pad_value_is_typed() {
    let t = i64s(&[2], &[1, 2]);
    let a = attrs(&[
        ("mode", AttrValue::Text("constant".into())),
        ("pads", ints(&[1, 1])),
        ("value", AttrValue::Int(i64::MIN)),
    ]);
    let out = eval("Pad", &a, &[&t], &[TensorDesc::new(DType::I64, [4])]).unwrap();
    assert_eq!(out[0].as_slice::<i64>().unwrap(), [i64::MIN, 1, 2, i64::MIN]);
}

// np.tile(y, (2,2)); np.broadcast_to(np.arange(3).reshape(3,1), (2,3,2))
#[test]
fn tile_and_expand_match_numpy() {
    let y = arange(&[2, 3]);
    let a = attrs(&[("repeats", ints(&[2, 2]))]);
    assert_eq!(
        run("Tile", &a, &[&y], f32_desc(&[4, 6])),
        [0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5, 0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5]
    );
    let c = arange(&[3, 1]);
    let a = attrs(&[("shape", ints(&[2, 3, 2]))]);
    assert_eq!(
        run("Expand", &a, &[&c], f32_desc(&[2, 3, 2])),
        [0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2]
    );
}

// d = np.arange(16).reshape(1,8,1,2); b = 2; s = np.arange(32).reshape(1,2,4,4)
// DCR: d.reshape(1,b,b,2,1,2).transpose(0,3,4,1,5,2).reshape(1,2,2,4)
// CRD: d.reshape(1,2,b,b,1,2).transpose(0,1,4,2,5,3).reshape(1,2,2,4)
// SpaceToDepth DCR: s.reshape(1,2,2,2,2,2).transpose(0,3,5,1,2,4).reshape(1,8,2,2)
//              CRD: s.reshape(1,2,2,2,2,2).transpose(0,1,3,5,2,4).reshape(1,8,2,2)
#[test]
fn depth_and_space_match_numpy() {
    let d = arange(&[1, 8, 1, 2]);
    let d2s = |mode: &str| {
        let a = attrs(&[("blocksize", AttrValue::Int(2)), ("mode", AttrValue::Text(mode.into()))]);
        run("DepthToSpace", &a, &[&d], f32_desc(&[1, 2, 2, 4]))
    };
    assert_eq!(d2s("DCR"), [0, 4, 1, 5, 8, 12, 9, 13, 2, 6, 3, 7, 10, 14, 11, 15]);
    assert_eq!(d2s("CRD"), [0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15]);
    let s = arange(&[1, 2, 4, 4]);
    let s2d = |mode: &str| {
        let a = attrs(&[("blocksize", AttrValue::Int(2)), ("mode", AttrValue::Text(mode.into()))]);
        run("SpaceToDepth", &a, &[&s], f32_desc(&[1, 8, 2, 2]))
    };
    assert_eq!(
        s2d("DCR"),
        [
            0, 2, 8, 10, 16, 18, 24, 26, 1, 3, 9, 11, 17, 19, 25, 27, 4, 6, 12, 14, 20, 22, 28, 30,
            5, 7, 13, 15, 21, 23, 29, 31
        ]
    );
    assert_eq!(
        s2d("CRD"),
        [
            0, 2, 8, 10, 1, 3, 9, 11, 4, 6, 12, 14, 5, 7, 13, 15, 16, 18, 24, 26, 17, 19, 25, 27,
            20, 22, 28, 30, 21, 23, 29, 31
        ]
    );
}

#[test]
fn concat_and_split_interleave_blocks() {
    let a = arange(&[2, 1]);
    let b = Tensor::from_vec(vec![2, 2], &[10.0f32, 11.0, 12.0, 13.0]).unwrap();
    let axis = attrs(&[("axis", AttrValue::Int(1))]);
    let joined = run("Concat", &axis, &[&a, &b], f32_desc(&[2, 3]));
    assert_eq!(joined, [0, 10, 11, 1, 12, 13]);
    let j = Tensor::from_vec(vec![2, 3], &[0.0f32, 10.0, 11.0, 1.0, 12.0, 13.0]).unwrap();
    let parts = eval(
        "Split",
        &axis.clone().with("split", ints(&[1, 2])),
        &[&j],
        &[f32_desc(&[2, 1]), f32_desc(&[2, 2])],
    )
    .unwrap();
    assert_eq!(parts[0], a);
    assert_eq!(parts[1], b);
    assert!(eval("Concat", &axis, &[&a, &b], &[f32_desc(&[2, 4])]).is_err());
}

#[test]
fn copies_and_dropout_mask() {
    let x = arange(&[2, 3]);
    let r = eval("Reshape", &Attrs::new(), &[&x], &[f32_desc(&[3, 2])]).unwrap();
    assert_eq!(r[0].bytes(), x.bytes());
    let d = eval(
        "Dropout",
        &Attrs::new(),
        &[&x],
        &[f32_desc(&[2, 3]), TensorDesc::new(DType::Bool, [2, 3])],
    )
    .unwrap();
    assert_eq!(d[0], x);
    assert_eq!(d[1].as_slice::<u8>().unwrap(), [1; 6]);
    assert!(eval("Reshape", &Attrs::new(), &[&x], &[f32_desc(&[4])]).is_err());
}

// g = np.arange(12).reshape(3,4)
// np.take(g, np.array([[-1,0],[2,2]]), axis=1)
// np.take_along_axis(g, np.array([[2,0,1,-1],[0,0,2,1]]) % 3, axis=0)
#[test]
fn gathers_match_numpy() {
    let g = arange(&[3, 4]);
    let idx = i64s(&[2, 2], &[-1, 0, 2, 2]);
    let a = attrs(&[("axis", AttrValue::Int(1))]);
    assert_eq!(
        run("Gather", &a, &[&g, &idx], f32_desc(&[3, 2, 2])),
        [3, 0, 2, 2, 7, 4, 6, 6, 11, 8, 10, 10]
    );
    let idx = Tensor::from_vec(vec![2, 4], &[2i32, 0, 1, -1, 0, 0, 2, 1]).unwrap();
    let a = attrs(&[("axis", AttrValue::Int(0))]);
    assert_eq!(
        run("GatherElements", &a, &[&g, &idx], f32_desc(&[2, 4])),
        [8, 1, 6, 11, 0, 1, 10, 7]
    );
    // An index out of range is an error, not a panic.
    let bad = i64s(&[1], &[4]);
    let a = attrs(&[("axis", AttrValue::Int(1))]);
    assert!(eval("Gather", &a, &[&g, &bad], &[f32_desc(&[3, 1])]).is_err());
}

// ONNX GatherND examples (by hand): data [[[0,1],[2,3]],[[4,5],[6,7]]]
#[test]
fn gather_nd_and_scatter_nd() {
    let data = arange(&[2, 2, 2]);
    let gnd = |batch: i64, idx: &Tensor, out: &[usize]| {
        let a = attrs(&[("batch_dims", AttrValue::Int(batch))]);
        run("GatherND", &a, &[&data, idx], f32_desc(out))
    };
    // indices [[0,1],[1,0]] -> [[2,3],[4,5]]
    assert_eq!(gnd(0, &i64s(&[2, 2], &[0, 1, 1, 0]), &[2, 2]), [2, 3, 4, 5]);
    // ONNX doc example 5: indices [[1],[0]] with batch_dims 1 -> [[2,3],[4,5]]
    assert_eq!(gnd(1, &i64s(&[2, 1], &[1, 0]), &[2, 2]), [2, 3, 4, 5]);
    // The same indices without batch dims pick whole planes.
    let planes = gnd(0, &i64s(&[2, 1], &[1, 0]), &[2, 2, 2]);
    assert_eq!(planes, [4, 5, 6, 7, 0, 1, 2, 3]);
    // ScatterND: data arange(8), indices [[4],[3],[1],[7]], updates [9,10,11,12]
    let d = arange(&[8]);
    let idx = i64s(&[4, 1], &[4, 3, 1, 7]);
    let upd = Tensor::from_vec(vec![4], &[9.0f32, 10.0, 11.0, 12.0]).unwrap();
    let a = attrs(&[("reduction", AttrValue::Text("none".into()))]);
    assert_eq!(
        run("ScatterND", &a, &[&d, &idx, &upd], f32_desc(&[8])),
        [0, 11, 2, 10, 9, 5, 6, 12]
    );
    // ScatterElements (ONNX doc example): data zeros(3,3), axis 0.
    let z = Tensor::zeros(f32_desc(&[3, 3]));
    let idx = i64s(&[2, 3], &[1, 0, 2, 0, 2, 1]);
    let upd = Tensor::from_vec(vec![2, 3], &[1.0f32, 1.1, 1.2, 2.0, 2.1, 2.2]).unwrap();
    let a = attrs(&[("axis", AttrValue::Int(0)), ("reduction", AttrValue::Text("none".into()))]);
    let out = eval("ScatterElements", &a, &[&z, &idx, &upd], &[f32_desc(&[3, 3])]).unwrap();
    assert_eq!(out[0].as_slice::<f32>().unwrap(), [2.0, 1.1, 0.0, 1.0, 0.0, 2.2, 0.0, 2.1, 1.2]);
}

/// TensorScatter of a [2, 1, 4, 1] cache (rows 0..8) by a [2, 1, 2, 1] update (rows 90..93).
#[test]
fn tensor_scatter_writes_rows_from_each_batchs_index() {
    let cache = arange(&[2, 1, 4, 1]);
    let update = Tensor::from_vec(vec![2, 1, 2, 1], &[90.0f32, 91.0, 92.0, 93.0]).unwrap();
    let scatter = |mode: &str, write: Option<&[i64]>| {
        let a = attrs(&[("axis", AttrValue::Int(2)), ("mode", AttrValue::Text(mode.into()))]);
        let w = write.map(|w| i64s(&[2], w));
        let mut inputs = vec![&cache, &update];
        inputs.extend(w.as_ref());
        eval("TensorScatter", &a, &inputs, &[f32_desc(&[2, 1, 4, 1])])
            .map(|o| o[0].as_slice::<f32>().unwrap().iter().map(|&v| v as i64).collect::<Vec<_>>())
    };
    assert_eq!(scatter("linear", Some(&[1, 2])).unwrap(), [0, 90, 91, 3, 4, 5, 92, 93]);
    // Without write indices every batch writes at 0.
    assert_eq!(scatter("linear", None).unwrap(), [90, 91, 2, 3, 92, 93, 6, 7]);
    // Circular: batch 0 from row 3 wraps to row 0; batch 1 from 5 is row 1.
    assert_eq!(scatter("circular", Some(&[3, 5])).unwrap(), [91, 1, 2, 90, 4, 92, 93, 7]);
    // A linear write past the cache, or a negative index, is an error naming it.
    for bad in [[3, 0], [0, -1]] {
        let e = scatter("linear", Some(&bad)).unwrap_err().to_string();
        assert!(e.contains("does not fit a cache of 4"), "{e}");
    }
}

#[test]
fn one_hot_trilu_cumsum() {
    // OneHot of [1, -1, 5] with depth 3 on axis 1 (by hand): -1 is 2, 5 is all off.
    let idx = i64s(&[3], &[1, -1, 5]);
    let values = Tensor::from_vec(vec![2], &[0.0f32, 9.0]).unwrap();
    let a = attrs(&[("axis", AttrValue::Int(1)), ("depth", AttrValue::Int(3))]);
    assert_eq!(run("OneHot", &a, &[&idx, &values], f32_desc(&[3, 3])), [0, 9, 0, 0, 0, 9, 0, 0, 0]);
    // On axis 0 the same hits are transposed.
    let a = attrs(&[("axis", AttrValue::Int(0)), ("depth", AttrValue::Int(3))]);
    assert_eq!(run("OneHot", &a, &[&idx, &values], f32_desc(&[3, 3])), [0, 0, 0, 9, 0, 0, 0, 9, 0]);
    // np.triu(np.arange(12).reshape(3,4), 1); np.tril(..., -1)
    let m = arange(&[3, 4]);
    let tri = |upper: i64, k: i64| {
        let a = attrs(&[("upper", AttrValue::Int(upper)), ("k", AttrValue::Int(k))]);
        run("Trilu", &a, &[&m], f32_desc(&[3, 4]))
    };
    assert_eq!(tri(1, 1), [0, 1, 2, 3, 0, 0, 6, 7, 0, 0, 0, 11]);
    assert_eq!(tri(0, -1), [0, 0, 0, 0, 4, 0, 0, 0, 8, 9, 0, 0]);
    // np.cumsum([[1,2,3],[4,5,6]], axis=1) reversed and exclusive: [[5,3,0],[11,6,0]]
    let c = i64s(&[2, 3], &[1, 2, 3, 4, 5, 6]);
    let a = attrs(&[
        ("axis", AttrValue::Int(1)),
        ("exclusive", AttrValue::Int(1)),
        ("reverse", AttrValue::Int(1)),
    ]);
    let out = eval("CumSum", &a, &[&c], &[TensorDesc::new(DType::I64, [2, 3])]).unwrap();
    assert_eq!(out[0].as_slice::<i64>().unwrap(), [5, 3, 0, 11, 6, 0]);
    let a = attrs(&[
        ("axis", AttrValue::Int(0)),
        ("exclusive", AttrValue::Int(0)),
        ("reverse", AttrValue::Int(0)),
    ]);
    let out = eval("CumSum", &a, &[&c], &[TensorDesc::new(DType::I64, [2, 3])]).unwrap();
    assert_eq!(out[0].as_slice::<i64>().unwrap(), [1, 2, 3, 5, 7, 9]);
    // np.cumprod: [[1,2,3],[4,10,18]] down the columns; along rows reversed and exclusive
    // [[6,3,1],[30,6,1]].
    let out = eval("CumProd", &a, &[&c], &[TensorDesc::new(DType::I64, [2, 3])]).unwrap();
    assert_eq!(out[0].as_slice::<i64>().unwrap(), [1, 2, 3, 4, 10, 18]);
    let a = attrs(&[
        ("axis", AttrValue::Int(1)),
        ("exclusive", AttrValue::Int(1)),
        ("reverse", AttrValue::Int(1)),
    ]);
    let out = eval("CumProd", &a, &[&c], &[TensorDesc::new(DType::I64, [2, 3])]).unwrap();
    assert_eq!(out[0].as_slice::<i64>().unwrap(), [6, 3, 1, 30, 6, 1]);
}

#[test]
fn constant_of_shape_and_range() {
    let a = attrs(&[
        ("value", AttrValue::Int(-3)),
        ("dtype", AttrValue::Int(DType::I32.onnx_code().into())),
        ("shape", ints(&[2, 2])),
    ]);
    let out = eval("ConstantOfShape", &a, &[], &[TensorDesc::new(DType::I32, [2, 2])]).unwrap();
    assert_eq!(out[0].as_slice::<i32>().unwrap(), [-3; 4]);
    // np.arange(10, 4, -3) == [10, 7]
    let a = attrs(&[
        ("start", AttrValue::Int(10)),
        ("limit", AttrValue::Int(4)),
        ("delta", AttrValue::Int(-3)),
        ("dtype", AttrValue::Int(DType::I64.onnx_code().into())),
    ]);
    let out = eval("Range", &a, &[], &[TensorDesc::new(DType::I64, [2])]).unwrap();
    assert_eq!(out[0].as_slice::<i64>().unwrap(), [10, 7]);
    let a = attrs(&[
        ("start", AttrValue::Float(0.5)),
        ("limit", AttrValue::Float(2.0)),
        ("delta", AttrValue::Float(0.5)),
        ("dtype", AttrValue::Int(DType::F32.onnx_code().into())),
    ]);
    let out = eval("Range", &a, &[], &[f32_desc(&[3])]).unwrap();
    assert_eq!(out[0].as_slice::<f32>().unwrap(), [0.5, 1.0, 1.5]);
}

// d = np.arange(6.); np.add.at(d, [1, 1, 4], [10., 20., 30.])  -> [0, 31, 2, 3, 34, 5]
// d = np.arange(6.).reshape(3,2); rows [2, 0, 2] maxed with [[5,-1],[9,9],[-3,7]] in turn
//   -> [[9, 9], [2, 3], [5, 7]]
#[test]
fn scatter_reductions_accumulate_repeats() {
    let d = arange(&[6]);
    let idx = i64s(&[3, 1], &[1, 1, 4]);
    let upd = Tensor::from_vec(vec![3], &[10.0f32, 20.0, 30.0]).unwrap();
    let a = attrs(&[("reduction", AttrValue::Text("add".into()))]);
    assert_eq!(run("ScatterND", &a, &[&d, &idx, &upd], f32_desc(&[6])), [0, 31, 2, 3, 34, 5]);
    let d = arange(&[3, 2]);
    let idx = i64s(&[3, 1], &[2, 0, 2]);
    let upd = Tensor::from_vec(vec![3, 2], &[5.0f32, -1.0, 9.0, 9.0, -3.0, 7.0]).unwrap();
    let a = attrs(&[("reduction", AttrValue::Text("max".into()))]);
    assert_eq!(run("ScatterND", &a, &[&d, &idx, &upd], f32_desc(&[3, 2])), [9, 9, 2, 3, 5, 7]);
    // ScatterElements with mul on i32, axis 1: [[1, 2, 3]] * updates [4, 5] at columns [2, 2].
    let d = Tensor::from_vec(vec![1, 3], &[1i32, 2, 3]).unwrap();
    let idx = i64s(&[1, 2], &[2, 2]);
    let upd = Tensor::from_vec(vec![1, 2], &[4i32, 5]).unwrap();
    let a = attrs(&[("axis", AttrValue::Int(1)), ("reduction", AttrValue::Text("mul".into()))]);
    let out =
        eval("ScatterElements", &a, &[&d, &idx, &upd], &[TensorDesc::new(DType::I32, [1, 3])]);
    assert_eq!(out.unwrap()[0].as_slice::<i32>().unwrap(), [1, 2, 60]);
}

/// Attribute values from a hostile bundle are errors at prepare time, never an overflow, an
/// out-of-bounds read or a table as long as an absurd dimension.
#[test]
fn hostile_attributes_are_errors() {
    let x = arange(&[2, 3]);
    let slice = |starts: &[i64], ends: &[i64], steps: &[i64], out: &[usize]| {
        let a = attrs(&[("starts", ints(starts)), ("ends", ints(ends)), ("steps", ints(steps))]);
        eval("Slice", &a, &[&x], &[f32_desc(out)])
    };
    // An end past the dimension (the compiler clamps it; a bundle may not).
    assert!(slice(&[0, 0], &[2, 4], &[1, 1], &[2, 4]).is_err());
    // Steps and ends whose products overflow.
    assert!(slice(&[0, 0], &[2, i64::MAX], &[1, i64::MAX / 2], &[2, 3]).is_err());
    assert!(slice(&[0, i64::MAX], &[2, 0], &[1, i64::MIN], &[2, 1]).is_err());
    // An empty slice with an absurd start, and one-element slices with an absurd step, are fine.
    assert!(slice(&[0, i64::MAX], &[2, 0], &[1, 1], &[2, 0]).is_ok());
    assert_eq!(
        run(
            "Slice",
            &attrs(&[
                ("starts", ints(&[1, 2])),
                ("ends", ints(&[2, i64::MAX])),
                ("steps", ints(&[1, i64::MAX])),
            ]),
            &[&x],
            f32_desc(&[1, 1]),
        ),
        [5]
    );

    let pad = |pads: &[i64], out: &[usize]| {
        let a = attrs(&[
            ("pads", ints(pads)),
            ("mode", AttrValue::Text("constant".into())),
            ("value", AttrValue::Float(0.0)),
        ]);
        eval("Pad", &a, &[&x], &[f32_desc(out)])
    };
    // Pads whose sum overflows i64 but is a valid length: every position is past the input.
    let zeros = pad(&[0, i64::MIN, 0, i64::MAX], &[2, 2]).unwrap();
    assert_eq!(zeros[0].as_slice::<f32>().unwrap(), [0.0; 4]);
    // A declared output other than the padded shape is refused before a table as long as
    // the padded dim is made.
    assert!(pad(&[0, 1 << 40, 0, 0], &[2, 4]).is_err());
    // An empty output whatever the other dims say.
    assert!(pad(&[0, 0, -2, 0], &[0, 3]).is_ok());

    let x4 = arange(&[1, 4, 2, 2]);
    let blocks = |op: &str, b: i64| {
        let a = attrs(&[("blocksize", AttrValue::Int(b)), ("mode", AttrValue::Text("DCR".into()))]);
        eval(op, &a, &[&x4], &[f32_desc(&[1, 1, 4, 4])])
    };
    assert!(blocks("DepthToSpace", 1 << 32).is_err());
    assert!(blocks("SpaceToDepth", i64::MAX).is_err());

    let tile = attrs(&[("repeats", ints(&[1 << 62, 1 << 62]))]);
    assert!(eval("Tile", &tile, &[&x], &[f32_desc(&[2, 3])]).is_err());

    // Trilu's k far outside the matrix keeps all or nothing.
    let upper = |k: i64| {
        let a = attrs(&[("upper", AttrValue::Int(1)), ("k", AttrValue::Int(k))]);
        run("Trilu", &a, &[&x], f32_desc(&[2, 3]))
    };
    assert_eq!(upper(i64::MIN), [0, 1, 2, 3, 4, 5]);
    assert_eq!(upper(i64::MAX), [0, 0, 0, 0, 0, 0]);
}

#[test]
fn eye_like_puts_ones_on_diagonal_k() {
    let eye = |k: i64, dtype: DType| {
        let a = attrs(&[
            ("shape", ints(&[3, 4])),
            ("dtype", AttrValue::Int(dtype.onnx_code().into())),
            ("k", AttrValue::Int(k)),
        ]);
        eval("EyeLike", &a, &[], &[TensorDesc::new(dtype, [3, 4])]).unwrap().remove(0)
    };
    let ones = |t: Tensor| t.to_vec::<i32>().unwrap();
    assert_eq!(ones(eye(0, DType::I32)), [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0]);
    assert_eq!(ones(eye(2, DType::I32)), [0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0]);
    assert_eq!(ones(eye(-2, DType::I32)), [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]);
    assert_eq!(eye(1, DType::F32).to_vec::<f32>().unwrap()[1], 1.0);
    assert!(ones(eye(5, DType::I32)).iter().all(|&v| v == 0), "past the last column");
}

#[test]
fn reverse_sequence_reverses_each_batch_up_to_its_length() {
    // Batch along axis 0, time along axis 1: [[1, 2, 3], [4, 5, 6]] with lengths 2 and 3.
    let x = i64s(&[2, 3], &[1, 2, 3, 4, 5, 6]);
    let lens = i64s(&[2], &[2, 3]);
    let a = attrs(&[("time_axis", AttrValue::Int(1)), ("batch_axis", AttrValue::Int(0))]);
    let out =
        eval("ReverseSequence", &a, &[&x, &lens], &[TensorDesc::new(DType::I64, [2, 3])]).unwrap();
    assert_eq!(out[0].as_slice::<i64>().unwrap(), [2, 1, 3, 6, 5, 4]);
    let too_long = i64s(&[2], &[4, 1]);
    assert!(
        eval("ReverseSequence", &a, &[&x, &too_long], &[TensorDesc::new(DType::I64, [2, 3])])
            .is_err()
    );
}
