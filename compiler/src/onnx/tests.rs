//! Import tests on small models built in code. Expected values are written by hand (float16
//! bit patterns from IEEE 754 binary16: 1.0 = 0x3C00, -2.0 = 0xC000, 0.5 = 0x3800).

use super::*;
use ingot_schema::{AttrValue, DType};
use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::tensor_proto::{DataLocation, DataType};
use onnx_protobuf::tensor_shape_proto::Dimension;
use onnx_protobuf::{
    AttributeProto, OperatorSetIdProto, SparseTensorProto, StringStringEntryProto,
    TensorShapeProto, TypeProto,
};
use protobuf::{EnumOrUnknown, MessageField};

// ---- builders ----

fn tp(name: &str, dtype: DataType, dims: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        data_type: dtype as i32,
        dims: dims.to_vec(),
        ..Default::default()
    }
}

fn raw_f32(name: &str, dims: &[i64], data: &[f32]) -> TensorProto {
    TensorProto { raw_data: bytemuck::cast_slice(data).to_vec(), ..tp(name, DataType::FLOAT, dims) }
}

enum D {
    V(i64),
    P(&'static str),
    Unknown,
}

fn vi(name: &str, elem: DataType, dims: Option<&[D]>) -> ValueInfoProto {
    let shape = dims.map(|dims| TensorShapeProto {
        dim: dims
            .iter()
            .map(|d| Dimension {
                value: match d {
                    D::V(v) => Some(dimension::Value::DimValue(*v)),
                    D::P(p) => Some(dimension::Value::DimParam(p.to_string())),
                    D::Unknown => None,
                },
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    });
    ValueInfoProto {
        name: name.into(),
        type_: MessageField::some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: elem as i32,
                shape: shape.into(),
                ..Default::default()
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn out(name: &str) -> ValueInfoProto {
    ValueInfoProto { name: name.into(), ..Default::default() }
}

fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        op_type: op.into(),
        name: name.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn attr(name: &str, kind: AttributeType) -> AttributeProto {
    AttributeProto { name: name.into(), type_: EnumOrUnknown::new(kind), ..Default::default() }
}

fn model(opset: i64, graph: GraphProto) -> ModelProto {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: "".into(),
            version: opset,
            ..Default::default()
        }],
        graph: MessageField::some(graph),
        ..Default::default()
    }
}

/// x: f32 [1, 3] -> Relu -> y.
fn relu_graph() -> GraphProto {
    GraphProto {
        input: vec![vi("x", DataType::FLOAT, Some(&[D::V(1), D::V(3)]))],
        node: vec![node("Relu", "relu", &["x"], &["y"])],
        output: vec![out("y")],
        ..Default::default()
    }
}

const UNSUPPORTED: &[&str] = &["NonMaxSuppression", "TopK", "If"];

fn test_support(domain: &str, op: &str) -> bool {
    domain.is_empty() && !UNSUPPORTED.contains(&op)
}

fn import_in(
    m: &ModelProto,
    dir: Option<&Path>,
    options: &ImportOptions,
) -> Result<Graph, ImportError> {
    let bytes = m.write_to_bytes().unwrap();
    import("test.onnx", &bytes, dir, options, &test_support)
}

fn import_ok(m: &ModelProto) -> Graph {
    let g = import_in(m, None, &ImportOptions::default()).unwrap();
    crate::ir::check(&g).unwrap();
    g
}

fn import_err(m: &ModelProto, options: &ImportOptions) -> String {
    import_in(m, None, options).unwrap_err().to_string()
}

fn shapes(list: &[(&str, &[usize])]) -> ImportOptions {
    ImportOptions {
        input_shapes: list.iter().map(|(n, d)| (n.to_string(), d.to_vec())).collect(),
        ..ImportOptions::default()
    }
}

/// The constant value named `name`.
fn constant(g: &Graph, name: &str) -> Arc<Tensor> {
    let v = g.values.iter().find(|v| v.name == name).unwrap();
    v.constant.as_ref().unwrap().tensor()
}

use std::sync::Arc;

/// A graph whose only content is the given initializers (all also graph outputs).
fn initializers(inits: Vec<TensorProto>) -> ModelProto {
    let output = inits.iter().map(|t| out(&t.name)).collect();
    model(13, GraphProto { initializer: inits, output, ..Default::default() })
}

// ---- tensors ----

#[test]
fn every_typed_field_decodes() {
    let mut t_f32 = tp("f32", DataType::FLOAT, &[2]);
    t_f32.float_data = vec![1.5, -2.0];
    let mut t_f64 = tp("f64", DataType::DOUBLE, &[2]);
    t_f64.double_data = vec![0.25, 1e300];
    let mut t_i64 = tp("i64", DataType::INT64, &[2]);
    t_i64.int64_data = vec![-7, i64::MAX];
    let mut t_i32 = tp("i32", DataType::INT32, &[2]);
    t_i32.int32_data = vec![-3, 70000];
    let mut t_i16 = tp("i16", DataType::INT16, &[2]);
    t_i16.int32_data = vec![-300, 300];
    let mut t_u16 = tp("u16", DataType::UINT16, &[1]);
    t_u16.int32_data = vec![65535];
    let mut t_i8 = tp("i8", DataType::INT8, &[3]);
    t_i8.int32_data = vec![-128, 0, 127];
    let mut t_u8 = tp("u8", DataType::UINT8, &[2]);
    t_u8.int32_data = vec![0, 255];
    let mut t_bool = tp("bool", DataType::BOOL, &[3]);
    t_bool.int32_data = vec![1, 0, 1];
    let mut t_f16 = tp("f16", DataType::FLOAT16, &[3]);
    t_f16.int32_data = vec![0x3C00, 0xC000, 0x3800];
    let mut t_u32 = tp("u32", DataType::UINT32, &[1]);
    t_u32.uint64_data = vec![4_000_000_000];
    let mut t_u64 = tp("u64", DataType::UINT64, &[1]);
    t_u64.uint64_data = vec![u64::MAX];
    let g = import_ok(&initializers(vec![
        t_f32, t_f64, t_i64, t_i32, t_i16, t_u16, t_i8, t_u8, t_bool, t_f16, t_u32, t_u64,
    ]));

    assert_eq!(constant(&g, "f32").as_slice::<f32>().unwrap(), &[1.5, -2.0]);
    assert_eq!(constant(&g, "f64").as_slice::<f64>().unwrap(), &[0.25, 1e300]);
    assert_eq!(constant(&g, "i64").as_slice::<i64>().unwrap(), &[-7, i64::MAX]);
    assert_eq!(constant(&g, "i32").as_slice::<i32>().unwrap(), &[-3, 70000]);
    assert_eq!(constant(&g, "i16").as_slice::<i16>().unwrap(), &[-300, 300]);
    assert_eq!(constant(&g, "u16").as_slice::<u16>().unwrap(), &[65535]);
    assert_eq!(constant(&g, "i8").as_slice::<i8>().unwrap(), &[-128, 0, 127]);
    assert_eq!(constant(&g, "u8").as_slice::<u8>().unwrap(), &[0, 255]);
    let b = constant(&g, "bool");
    assert_eq!(b.dtype(), DType::Bool);
    assert_eq!(b.as_slice::<u8>().unwrap(), &[1, 0, 1]);
    let h = constant(&g, "f16");
    let h: Vec<f32> = h.as_slice::<half::f16>().unwrap().iter().map(|v| v.to_f32()).collect();
    assert_eq!(h, [1.0, -2.0, 0.5]);
    assert_eq!(constant(&g, "u32").as_slice::<u32>().unwrap(), &[4_000_000_000]);
    assert_eq!(constant(&g, "u64").as_slice::<u64>().unwrap(), &[u64::MAX]);
    // Constants carry their type.
    let v = g.values.iter().find(|v| v.name == "i8").unwrap();
    assert_eq!(v.ty, Some(TensorDesc::new(DType::I8, vec![3])));
}

#[test]
fn raw_data_scalars_and_empty_tensors() {
    let f16 = TensorProto {
        raw_data: vec![0x00, 0x3C, 0x00, 0xC0], // little-endian 1.0, -2.0
        ..tp("h", DataType::FLOAT16, &[2, 1])
    };
    let i8s = TensorProto { raw_data: vec![0xFF, 0x02], ..tp("b", DataType::INT8, &[2]) };
    let scalar = raw_f32("s", &[], &[4.25]);
    let empty = tp("e", DataType::FLOAT, &[0, 5]);
    let g = import_ok(&initializers(vec![f16, i8s, scalar, empty]));
    let h = constant(&g, "h");
    assert_eq!(h.shape(), &[2, 1]);
    assert_eq!(
        h.as_slice::<half::f16>().unwrap(),
        &[half::f16::from_bits(0x3C00), half::f16::from_bits(0xC000)]
    );
    assert_eq!(constant(&g, "b").as_slice::<i8>().unwrap(), &[-1, 2]);
    let s = constant(&g, "s");
    assert_eq!(s.shape(), &[] as &[usize]);
    assert_eq!(s.as_slice::<f32>().unwrap(), &[4.25]);
    let e = constant(&g, "e");
    assert_eq!(e.shape(), &[0, 5]);
    assert!(e.bytes().is_empty());
}

#[test]
fn bad_tensors_name_the_tensor() {
    let cases: Vec<(TensorProto, &str)> = vec![
        (tp("names", DataType::STRING, &[1]), "STRING"),
        (tp("bf", DataType::BFLOAT16, &[1]), "neither raw_data nor int32_data"),
        (tp("f8", DataType::FLOAT8E4M3FN, &[1]), "neither raw_data nor int32_data"),
        (tp("c", DataType::COMPLEX64, &[1]), "COMPLEX64"),
        (tp("nodata", DataType::FLOAT, &[2]), "no data"),
        (
            TensorProto { raw_data: vec![0; 7], ..tp("short", DataType::FLOAT, &[2]) },
            "raw_data holds 7 bytes; the tensor needs 8",
        ),
        (
            TensorProto { float_data: vec![1.0], ..tp("few", DataType::FLOAT, &[2]) },
            "float_data holds 1 values",
        ),
        (tp("neg", DataType::FLOAT, &[-1]), "negative dim"),
        (tp("huge", DataType::FLOAT, &[1 << 40, 1 << 40, 0]), "too large"),
    ];
    for (t, expected) in cases {
        let name = t.name.clone();
        let e = import_in(&initializers(vec![t]), None, &ImportOptions::default()).unwrap_err();
        assert!(matches!(e, ImportError::Tensor { .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains(&format!("tensor '{name}'")), "{msg}");
        assert!(msg.contains(expected), "{msg}");
        assert!(msg.starts_with("test.onnx: "), "{msg}");
    }
}

#[test]
fn sparse_initializers_are_refused() {
    let mut m = initializers(vec![]);
    let g = m.graph.as_mut().unwrap();
    g.sparse_initializer.push(SparseTensorProto {
        values: MessageField::some(tp("sp", DataType::FLOAT, &[1])),
        ..Default::default()
    });
    let msg = import_err(&m, &ImportOptions::default());
    assert!(msg.contains("'sp'") && msg.contains("sparse"), "{msg}");
}

fn external(name: &str, dims: &[i64], entries: &[(&str, &str)]) -> TensorProto {
    TensorProto {
        data_location: EnumOrUnknown::new(DataLocation::EXTERNAL),
        external_data: entries
            .iter()
            .map(|(k, v)| StringStringEntryProto {
                key: k.to_string(),
                value: v.to_string(),
                ..Default::default()
            })
            .collect(),
        ..tp(name, DataType::FLOAT, dims)
    }
}

#[test]
fn external_data_is_mapped_and_bounds_checked() {
    let dir = std::env::temp_dir().join(format!("ingot-onnx-external-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let mut bytes = vec![0xAAu8; 8];
    bytes.extend_from_slice(bytemuck::cast_slice(&[1.0f32, 2.0, 3.0]));
    std::fs::write(dir.join("weights.bin"), &bytes).unwrap();
    std::fs::write(dir.join("sub/w.bin"), bytemuck::cast_slice(&[7.0f32])).unwrap();

    let ok = initializers(vec![
        external("w", &[3], &[("location", "weights.bin"), ("offset", "8"), ("length", "12")]),
        external("head", &[2], &[("location", "weights.bin")]),
        external("sub", &[1], &[("location", "sub/w.bin"), ("checksum", "x")]),
        external("none", &[0], &[("location", "weights.bin"), ("offset", "20")]),
    ]);
    let g = import_in(&ok, Some(&dir), &ImportOptions::default()).unwrap();
    assert_eq!(constant(&g, "w").as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0]);
    let w = g.values.iter().find(|v| v.name == "w").unwrap();
    assert_eq!(w.constant.as_ref().unwrap().bytes(), &bytes[8..20]);
    assert_eq!(constant(&g, "head").bytes(), &bytes[..8]);
    assert_eq!(constant(&g, "sub").as_slice::<f32>().unwrap(), &[7.0]);
    assert_eq!(constant(&g, "none").shape(), &[0]);

    // Also through a file: the model's directory is where external data is looked up.
    std::fs::write(dir.join("model.onnx"), ok.write_to_bytes().unwrap()).unwrap();
    let g = import_file(&dir.join("model.onnx"), &ImportOptions::default());
    // import_file uses the real op table; this graph has no nodes, so it imports.
    assert_eq!(constant(&g.unwrap(), "w").as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0]);

    let bad: Vec<(TensorProto, Option<&Path>, &str)> = vec![
        (
            external("past", &[4], &[("location", "weights.bin"), ("offset", "8")]),
            Some(&dir),
            "holds 20 bytes; the tensor needs 16 bytes at offset 8",
        ),
        (
            external("len", &[3], &[("location", "weights.bin"), ("length", "4")]),
            Some(&dir),
            "has length 4",
        ),
        (external("missing", &[1], &[("location", "nope.bin")]), Some(&dir), "nope.bin"),
        (
            external("escape", &[1], &[("location", "../weights.bin")]),
            Some(&dir),
            "must be a relative path inside",
        ),
        (
            external("abs", &[1], &[("location", "/etc/passwd")]),
            Some(&dir),
            "must be a relative path inside",
        ),
        (external("noloc", &[1], &[]), Some(&dir), "no 'location'"),
        (
            external("off", &[1], &[("location", "weights.bin"), ("offset", "-1")]),
            Some(&dir),
            "not a byte count",
        ),
        (external("nodir", &[1], &[("location", "weights.bin")]), None, "without its directory"),
        (
            external(
                "overflow",
                &[1],
                &[("location", "weights.bin"), ("offset", &usize::MAX.to_string())],
            ),
            Some(&dir),
            "holds 20 bytes",
        ),
    ];
    for (t, base, expected) in bad {
        let name = t.name.clone();
        let msg = import_in(&initializers(vec![t]), base, &ImportOptions::default())
            .unwrap_err()
            .to_string();
        assert!(msg.contains(&format!("tensor '{name}'")), "{msg}");
        assert!(msg.contains(expected), "{msg}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn read_tensor_proto_round_trips() {
    let t = raw_f32("t", &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let (name, tensor) = read_tensor_proto(&t.write_to_bytes().unwrap()).unwrap();
    assert_eq!(name, "t");
    assert_eq!(tensor.shape(), &[2, 2]);
    assert_eq!(tensor.as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0, 4.0]);
    let bytes = t.write_to_bytes().unwrap();
    let e = read_tensor_proto(&bytes[..bytes.len() - 3]).unwrap_err();
    assert!(matches!(e, ImportError::Parse { .. }), "{e}");
}

// ---- constants and inputs ----

#[test]
fn constant_nodes_become_values() {
    let mut value = attr("value", AttributeType::TENSOR);
    value.t = MessageField::some(raw_f32("ignored", &[2], &[0.5, 1.5]));
    let mut vf = attr("value_float", AttributeType::FLOAT);
    vf.f = 2.5;
    let mut vfs = attr("value_floats", AttributeType::FLOATS);
    vfs.floats = vec![1.0, 2.0];
    let mut vi_ = attr("value_int", AttributeType::INT);
    vi_.i = -4;
    let mut vis = attr("value_ints", AttributeType::INTS);
    vis.ints = vec![1, 2, 3];
    let consts = [("a", value), ("b", vf), ("c", vfs), ("d", vi_), ("e", vis)];
    let mut graph = relu_graph();
    for (name, a) in consts {
        let mut n = node("Constant", "", &[], &[name]);
        n.attribute.push(a);
        graph.node.push(n);
        graph.output.push(out(name));
    }
    let g = import_ok(&model(13, graph));
    assert_eq!(g.nodes.len(), 1, "Constant nodes produce no node");
    assert_eq!(constant(&g, "a").as_slice::<f32>().unwrap(), &[0.5, 1.5]);
    let b = constant(&g, "b");
    assert_eq!((b.shape(), b.as_slice::<f32>().unwrap()), (&[][..], &[2.5f32][..]));
    assert_eq!(constant(&g, "c").as_slice::<f32>().unwrap(), &[1.0, 2.0]);
    let d = constant(&g, "d");
    assert_eq!((d.shape(), d.as_slice::<i64>().unwrap()), (&[][..], &[-4i64][..]));
    assert_eq!(constant(&g, "e").as_slice::<i64>().unwrap(), &[1, 2, 3]);

    let mut s = attr("value_string", AttributeType::STRING);
    s.s = b"hi".to_vec();
    let mut n = node("Constant", "txt", &[], &["s"]);
    n.attribute.push(s);
    let msg = import_err(
        &model(13, GraphProto { node: vec![n], ..Default::default() }),
        &ImportOptions::default(),
    );
    assert!(msg.contains("node 'txt' (Constant)") && msg.contains("string"), "{msg}");
}

#[test]
fn initializer_listed_as_input_is_a_constant() {
    let mut graph = relu_graph();
    graph.node = vec![node("Add", "add", &["x", "w"], &["y"])];
    graph.input.push(vi("w", DataType::FLOAT, Some(&[D::V(3)])));
    graph.initializer.push(raw_f32("w", &[3], &[1.0, 2.0, 3.0]));
    let g = import_ok(&model(13, graph.clone()));
    assert_eq!(g.inputs.len(), 1);
    assert_eq!(g.values[g.inputs[0]].name, "x");
    assert_eq!(constant(&g, "w").as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0]);
    let add = &g.nodes[0];
    assert_eq!(g.values[add.inputs[1].unwrap()].name, "w");

    let msg = import_err(&model(13, graph), &shapes(&[("w", &[3])]));
    assert!(msg.contains("'w' is an initializer"), "{msg}");
    assert!(msg.contains("the inputs are: x"), "{msg}");
}

/// An input shaped like PP-OCR's detector input.
fn dynamic_model() -> ModelProto {
    let dims = [D::P("p2o.DynamicDimension.0"), D::V(3), D::Unknown, D::V(-1)];
    model(
        12,
        GraphProto {
            input: vec![
                vi("x", DataType::FLOAT, Some(&dims)),
                vi("s", DataType::INT64, Some(&[D::V(2)])),
            ],
            node: vec![node("Relu", "", &["x"], &["y"])],
            output: vec![out("y"), out("s")],
            ..Default::default()
        },
    )
}

#[test]
fn symbolic_dims_need_input_shapes() {
    let m = dynamic_model();
    let e = import_in(&m, None, &ImportOptions::default()).unwrap_err();
    assert!(matches!(e, ImportError::InputShape { .. }));
    let msg = e.to_string();
    assert!(
        msg.contains("input 'x' has dynamic shape [p2o.DynamicDimension.0, 3, ?, -1]"),
        "{msg}"
    );
    assert!(msg.contains("--input-shape x=Ax3xBxC"), "{msg}");

    // Agreeing shapes, also for the static input.
    let g = import_in(&m, None, &shapes(&[("x", &[1, 3, 48, 192]), ("s", &[2])])).unwrap();
    let x = &g.values[g.inputs[0]];
    assert_eq!(x.ty, Some(TensorDesc::new(DType::F32, vec![1, 3, 48, 192])));
    let s = &g.values[g.inputs[1]];
    assert_eq!(s.ty, Some(TensorDesc::new(DType::I64, vec![2])));
    assert!(g.ty(g.nodes[0].outputs[0]).is_none(), "intermediates stay untyped");

    type Shapes<'a> = &'a [(&'a str, &'a [usize])];
    let cases: &[(Shapes, &[&str])] = &[
        (
            &[("x", &[1, 4, 48, 192])],
            &[
                "--input-shape x=1x4x48x192 does not match input 'x'",
                "[p2o.DynamicDimension.0, 3, ?, -1]",
                "dim 1 is 3",
            ],
        ),
        (&[("x", &[1, 3, 48])], &["x=1x3x48 has 3 dims, but input 'x' has 4"]),
        (&[("x", &[1, 3, 4, 4]), ("s", &[3])], &["does not match input 's' of shape [2]"]),
        (&[("image", &[1])], &["'image' is not a graph input; the inputs are: x, s"]),
        (&[("x", &[1, 3, 4, 4]), ("x", &[1, 3, 4, 4])], &["twice"]),
    ];
    for (opts, expected) in cases {
        let msg = import_err(&m, &shapes(opts));
        for part in *expected {
            assert!(msg.contains(part), "{msg}\n  should contain: {part}");
        }
    }
}

#[test]
fn input_without_shape_takes_any_rank_from_options() {
    let mut graph = relu_graph();
    graph.input = vec![vi("x", DataType::FLOAT, None)];
    let m = model(13, graph);
    let msg = import_err(&m, &ImportOptions::default());
    assert!(msg.contains("input 'x' has no shape"), "{msg}");
    let g = import_in(&m, None, &shapes(&[("x", &[2, 5])])).unwrap();
    assert_eq!(g.ty(g.inputs[0]).unwrap().shape, vec![2, 5]);

    let mut graph = relu_graph();
    graph.input = vec![vi("x", DataType::STRING, Some(&[D::V(1)]))];
    let msg = import_err(&model(13, graph), &ImportOptions::default());
    assert!(msg.contains("input 'x'") && msg.contains("STRING"), "{msg}");
}

// ---- nodes ----

#[test]
fn attributes_are_converted() {
    let mut n = node("ConstantOfShape", "fill", &["x"], &["y"]);
    let mut a = attr("i", AttributeType::INT);
    a.i = -3;
    let mut f = attr("f", AttributeType::FLOAT);
    f.f = 0.25;
    let mut s = attr("mode", AttributeType::STRING);
    s.s = b"nearest".to_vec();
    let mut is = attr("pads", AttributeType::INTS);
    is.ints = vec![1, 2];
    let mut fs = attr("scales", AttributeType::FLOATS);
    fs.floats = vec![0.5, 2.0];
    let mut ss = attr("activations", AttributeType::STRINGS);
    ss.strings = vec![b"Sigmoid".to_vec(), b"Tanh".to_vec()];
    let mut t = attr("value", AttributeType::TENSOR);
    let mut value = tp("", DataType::INT64, &[1]);
    value.int64_data = vec![7];
    t.t = MessageField::some(value);
    let tensor_attr = |name: &str, value: TensorProto| {
        let mut a = attr(name, AttributeType::TENSOR);
        a.t = MessageField::some(value);
        a
    };
    let half = tensor_attr("half", raw_f32("", &[1], &[0.5]));
    let mut b = tp("", DataType::BOOL, &[1]);
    b.int32_data = vec![1];
    let flag = tensor_attr("flag", b);
    let mut pair = tp("", DataType::INT32, &[2]);
    pair.int32_data = vec![3, -4];
    let pair = tensor_attr("pair", pair);
    let big = tensor_attr(
        "big",
        TensorProto { int64_data: vec![i64::MAX], ..tp("", DataType::INT64, &[]) },
    );
    n.attribute = vec![a, f, s, is, fs, ss, t, half, flag, pair, big];
    let mut graph = relu_graph();
    graph.node = vec![n];
    let g = import_ok(&model(13, graph));
    let attrs = &g.nodes[0].attrs;
    assert_eq!(attrs.int("i").unwrap(), -3);
    assert_eq!(attrs.get("f"), Some(&AttrValue::Float(0.25)));
    assert_eq!(attrs.text("mode").unwrap(), "nearest");
    assert_eq!(attrs.ints("pads").unwrap(), &[1, 2]);
    assert_eq!(attrs.floats("scales").unwrap(), &[0.5, 2.0]);
    assert_eq!(attrs.text("activations").unwrap(), "Sigmoid,Tanh");
    assert_eq!(attrs.get("value"), Some(&AttrValue::Int(7)));
    assert_eq!(attrs.int("value.dtype").unwrap(), DataType::INT64 as i64);
    assert_eq!(attrs.get("half"), Some(&AttrValue::Float(0.5)));
    assert_eq!(attrs.int("half.dtype").unwrap(), DataType::FLOAT as i64);
    assert_eq!(attrs.get("flag"), Some(&AttrValue::Int(1)));
    assert_eq!(attrs.int("flag.dtype").unwrap(), DataType::BOOL as i64);
    assert_eq!(attrs.ints("pair").unwrap(), &[3, -4]);
    assert_eq!(attrs.get("big"), Some(&AttrValue::Int(i64::MAX)), "integers stay exact");

    let mut graph = relu_graph();
    graph.node[0].attribute = vec![attr("body", AttributeType::GRAPH)];
    let msg = import_err(&model(13, graph), &ImportOptions::default());
    assert!(msg.contains("node 'relu' (Relu)") && msg.contains("'body'"), "{msg}");
}

#[test]
fn unsupported_ops_are_all_listed() {
    let mut graph = relu_graph();
    graph.node.push(node("NonMaxSuppression", "nms", &["y"], &["z"]));
    graph.node.push(node("TopK", "", &["y"], &["t", "ti"]));
    let mut custom = node("Gelu", "g", &["y"], &["u"]);
    custom.domain = "com.microsoft".into();
    graph.node.push(custom);
    let mut onnx_domain = node("NonMaxSuppression", "nms2", &["y"], &["w"]);
    onnx_domain.domain = "ai.onnx".into();
    graph.node.push(onnx_domain);
    let e = import_in(&model(13, graph), None, &ImportOptions::default()).unwrap_err();
    let ImportError::Unsupported { ops, nodes, .. } = &e else { panic!("{e}") };
    assert_eq!(ops, &["NonMaxSuppression", "TopK", "Gelu"]);
    assert_eq!(
        nodes,
        &[
            "node 'nms' (NonMaxSuppression, domain ai.onnx, opset 13)",
            "unnamed node #2 (TopK, domain ai.onnx, opset 13)",
            "node 'g' (Gelu, domain com.microsoft, no opset imported)",
            "node 'nms2' (NonMaxSuppression, domain ai.onnx, opset 13)",
        ]
    );
    assert!(e.to_string().contains("4 node(s)"), "{e}");
}

#[test]
fn optional_inputs_and_outputs() {
    let mut graph = relu_graph();
    // Clip with an omitted min and a given max; Dropout with an omitted mask output, twice.
    graph.initializer.push(raw_f32("hi", &[], &[6.0]));
    graph.node = vec![
        node("Clip", "clip", &["x", "", "hi"], &["c"]),
        node("Dropout", "", &["c"], &["d", ""]),
        node("Dropout", "", &["d"], &["y", ""]),
    ];
    let g = import_ok(&model(13, graph));
    let clip = &g.nodes[0];
    assert_eq!(clip.inputs.len(), 3);
    assert!(clip.inputs[1].is_none());
    assert_eq!(g.values[clip.inputs[2].unwrap()].name, "hi");
    let (m1, m2) = (g.nodes[1].outputs[1], g.nodes[2].outputs[1]);
    assert_ne!(m1, m2);
    assert_eq!(g.values[m1].name, "Dropout#1:1");
    assert_eq!(g.values[m2].name, "Dropout#2:1");
    assert_eq!(g.nodes[1].domain, "");
}

#[test]
fn nodes_are_sorted_topologically() {
    let mut graph = relu_graph();
    graph.node = vec![
        node("Neg", "c", &["b"], &["y"]),
        node("Relu", "a", &["x"], &["a"]),
        node("Add", "b", &["a", "x"], &["b"]),
    ];
    let g = import_ok(&model(13, graph));
    let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!(g.values[g.outputs[0]].name, "y");
}

#[test]
fn structural_errors() {
    let cases: Vec<(Vec<NodeProto>, &str)> = vec![
        (
            vec![
                node("Relu", "p", &["q_out"], &["p_out"]),
                node("Relu", "q", &["p_out"], &["q_out"]),
                node("Relu", "r", &["x"], &["y"]),
            ],
            "cycle through node '",
        ),
        (vec![node("Add", "self", &["x", "y"], &["y"])], "cycle through node 'self' (Add)"),
        (
            vec![node("Add", "add", &["x", "w"], &["y"])],
            "node 'add' (Add) reads 'w', which no node, initializer or graph input defines",
        ),
        (
            vec![node("Relu", "one", &["x"], &["y"]), node("Relu", "two", &["x"], &["y"])],
            "value 'y' is defined twice; the second definition is node 'two' (Relu)",
        ),
        (
            vec![node("Relu", "shadow", &["x"], &["x"]), node("Relu", "", &["x"], &["y"])],
            "value 'x' is defined twice",
        ),
        (vec![node("Relu", "r", &["x"], &["z"])], "graph output 'y' is not produced"),
    ];
    for (nodes, expected) in cases {
        let mut graph = relu_graph();
        graph.node = nodes;
        let msg = import_err(&model(13, graph), &ImportOptions::default());
        assert!(msg.contains(expected), "{msg}\n  should contain: {expected}");
    }
}

#[test]
fn opsets_are_checked() {
    for (version, expected) in
        [(5, "opset 5 of the default ONNX domain is older"), (29, "opset 29")]
    {
        let msg = import_err(&model(version, relu_graph()), &ImportOptions::default());
        assert!(msg.contains(expected), "{msg}");
    }
    let mut m = model(13, relu_graph());
    m.opset_import[0].domain = "ai.onnx".into();
    assert_eq!(import_ok(&m).opset, 13);
    for v in [6, 7, 11, 21, 28] {
        assert_eq!(import_ok(&model(v, relu_graph())).opset, v);
    }
    m.opset_import.clear();
    let msg = import_err(&m, &ImportOptions::default());
    assert!(msg.contains("imports no opset"), "{msg}");
}

#[test]
fn malformed_bytes_are_errors() {
    let bytes = model(13, relu_graph()).write_to_bytes().unwrap();
    for cut in [1, bytes.len() / 2, bytes.len() - 1] {
        let e = import("cut.onnx", &bytes[..cut], None, &ImportOptions::default(), &test_support)
            .unwrap_err();
        assert!(e.to_string().starts_with("cut.onnx: "), "{e}");
    }
    let e = import_bytes(&[0xFF; 16], None, &ImportOptions::default()).unwrap_err();
    assert!(matches!(e, ImportError::Parse { .. }), "{e}");
    // Zero bytes parse as an empty ModelProto: no graph.
    let msg = import_bytes(&[], None, &ImportOptions::default()).unwrap_err().to_string();
    assert!(msg.contains("holds no graph"), "{msg}");
    let e = import_file(Path::new("/nonexistent/m.onnx"), &ImportOptions::default()).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/m.onnx"), "{e}");
}

#[test]
fn empty_graph_imports() {
    let g = import_ok(&model(17, GraphProto::default()));
    assert!(g.nodes.is_empty() && g.values.is_empty() && g.inputs.is_empty());
    assert_eq!(g.opset, 17);
}

#[test]
fn large_chain_imports_fast_and_in_order() {
    // 20k nodes given in reverse order: sorting must not be quadratic.
    let n = 20_000;
    let mut graph = relu_graph();
    graph.node = (0..n)
        .rev()
        .map(|i| {
            let input = if i == 0 { "x".to_string() } else { format!("v{i}") };
            let output = if i == n - 1 { "y".to_string() } else { format!("v{}", i + 1) };
            node("Relu", &format!("n{i}"), &[&input], &[&output])
        })
        .collect();
    let start = std::time::Instant::now();
    let g = import_ok(&model(13, graph));
    assert!(start.elapsed().as_secs_f64() < 2.0, "{:?}", start.elapsed());
    assert_eq!(g.nodes[0].name, "n0");
    assert_eq!(g.nodes[n - 1].name, format!("n{}", n - 1));
}

// ---- subgraphs ----

/// An `If` over `c` whose branches both define `t` (allowed: each is its own scope) from the
/// outer `x` and `k`; the then branch also reads the outer initializer `w`.
fn if_graph() -> GraphProto {
    let branch = |op: &str, inputs: &[&str]| GraphProto {
        node: vec![node(op, &format!("{op}_b"), inputs, &["t"])],
        output: vec![out("t")],
        ..Default::default()
    };
    let mut if_node = node("If", "if", &["c"], &["y"]);
    let mut then = attr("then_branch", AttributeType::GRAPH);
    then.g = MessageField::some(branch("Add", &["x", "w"]));
    let mut other = attr("else_branch", AttributeType::GRAPH);
    other.g = MessageField::some(branch("Neg", &["k"]));
    if_node.attribute = vec![then, other];
    GraphProto {
        initializer: vec![raw_f32("w", &[3], &[1.0, 2.0, 3.0])],
        input: vec![vi("x", DataType::FLOAT, Some(&[D::V(3)])), vi("c", DataType::BOOL, Some(&[]))],
        node: vec![node("Relu", "relu", &["x"], &["k"]), if_node],
        output: vec![out("y")],
        ..Default::default()
    }
}

#[test]
fn an_if_keeps_its_branches_as_bodies_and_reads_what_they_capture() {
    let g = import_ok(&model(17, if_graph()));
    let id = |name: &str| g.values.iter().position(|v| v.name == name).unwrap();
    let if_node = g.nodes.iter().find(|n| n.op == "If").unwrap();
    // The condition, then every outer value a branch reads, in id order.
    let mut captured = vec![id("w"), id("x"), id("k")];
    captured.sort();
    let expected: Vec<Option<ValueId>> =
        std::iter::once(id("c")).chain(captured).map(Some).collect();
    assert_eq!(if_node.inputs, expected);
    let body = |attr: &str| &g.bodies[if_node.attrs.int(attr).unwrap() as usize];
    let (then, other) = (body("then_branch"), body("else_branch"));
    assert_eq!(then.nodes[0].op, "Add");
    assert_eq!(other.nodes[0].op, "Neg");
    // Each branch's `t` is a value of its own, the second renamed.
    assert_eq!(g.values[then.outputs[0]].name, "t");
    assert_eq!(g.values[other.outputs[0]].name, "t_1");
    // Relu comes before the If that reads its output.
    assert_eq!(g.nodes.iter().map(|n| n.op.as_str()).collect::<Vec<_>>(), ["Relu", "If"]);
}

#[test]
fn a_branch_cannot_read_what_only_the_other_branch_defines() {
    let mut graph = if_graph();
    let other = graph.node[1].attribute[1].g.as_mut().unwrap();
    other.node[0].input = vec!["t_then_only".into()];
    let then = graph.node[1].attribute[0].g.as_mut().unwrap();
    then.node.insert(0, node("Relu", "r_then", &["x"], &["t_then_only"]));
    let msg = import_err(&model(17, graph), &ImportOptions::default());
    assert!(msg.contains("node 'Neg_b' (Neg) reads 't_then_only'"), "{msg}");
}

// ---- bfloat16 ----

#[test]
fn bfloat16_is_read_as_float() {
    // 1.0 = 0x3F80, -2.5 = 0xC020, 0.5 = 0x3F00 (the high halves of their f32 bits).
    let raw = TensorProto {
        raw_data: vec![0x80, 0x3F, 0x20, 0xC0],
        ..tp("raw", DataType::BFLOAT16, &[2])
    };
    let mut typed = tp("typed", DataType::BFLOAT16, &[1]);
    typed.int32_data = vec![0x3F00];
    let graph = GraphProto {
        output: vec![out("raw"), out("typed"), out("x")],
        initializer: vec![raw, typed],
        input: vec![vi("x", DataType::BFLOAT16, Some(&[D::V(2)]))],
        ..Default::default()
    };
    let g = import_ok(&model(17, graph));
    assert_eq!(constant(&g, "raw").as_slice::<f32>().unwrap(), &[1.0, -2.5]);
    assert_eq!(constant(&g, "typed").as_slice::<f32>().unwrap(), &[0.5]);
    let x = g.values.iter().find(|v| v.name == "x").unwrap();
    assert_eq!(x.ty, Some(TensorDesc::new(DType::F32, vec![2])));

    let short = TensorProto { raw_data: vec![0x80, 0x3F], ..tp("short", DataType::BFLOAT16, &[2]) };
    let msg = import_err(&initializers(vec![short]), &ImportOptions::default());
    assert!(msg.contains("'short'") && msg.contains("needs 4"), "{msg}");
}

// ---- 4- and 2-bit integers, float4 ----

#[test]
fn four_bit_integers_are_unpacked_one_per_byte() {
    // Two values per byte, the first in the low nibble: int4 [-8, 7, -1] is 0x78, 0x0F.
    let raw = TensorProto { raw_data: vec![0x78, 0x0F], ..tp("raw", DataType::INT4, &[3]) };
    let mut typed = tp("typed", DataType::UINT4, &[3]);
    typed.int32_data = vec![0xA5, 0x0F];
    let graph = GraphProto {
        output: vec![out("raw"), out("typed")],
        initializer: vec![raw, typed],
        ..Default::default()
    };
    let g = import_ok(&model(21, graph));
    assert_eq!(constant(&g, "raw").as_slice::<i8>().unwrap(), &[-8, 7, -1]);
    assert_eq!(constant(&g, "raw").desc().dtype, DType::I4);
    assert_eq!(constant(&g, "typed").bytes(), &[5, 10, 15]);

    // Three values need two bytes, not three.
    let long = TensorProto { raw_data: vec![0, 0, 0], ..tp("long", DataType::INT4, &[3]) };
    let msg = import_err(&initializers(vec![long]), &ImportOptions::default());
    assert!(msg.contains("'long'") && msg.contains("3 4-bit values need 2"), "{msg}");
}

#[test]
fn two_bit_integers_and_float4_are_unpacked_one_per_byte() {
    // ONNX's codes 26 (INT2) and 23 (FLOAT4E2M1), which onnx-protobuf does not name.
    let with_code = |name, code, dims: &[i64]| TensorProto {
        data_type: code,
        ..tp(name, DataType::INT4, dims)
    };
    // Four values per byte, the first in the low bits: int2 [-2, 1, -1, 0, 1] is 0x36, 0x01.
    let int2 = TensorProto { raw_data: vec![0x36, 0x01], ..with_code("int2", 26, &[5]) };
    let mut typed = with_code("typed", 26, &[5]);
    typed.int32_data = vec![0x36, 0x01];
    // float4 0x71: 0.5 (code 1), then 6 (code 7), kept as their codes.
    let f4 = TensorProto { raw_data: vec![0x71], ..with_code("f4", 23, &[2]) };
    let graph = GraphProto {
        output: vec![out("int2"), out("typed"), out("f4")],
        initializer: vec![int2, typed, f4],
        ..Default::default()
    };
    let g = import_ok(&model(25, graph));
    assert_eq!(constant(&g, "int2").as_slice::<i8>().unwrap(), &[-2, 1, -1, 0, 1]);
    assert_eq!(constant(&g, "int2").desc().dtype, DType::I2);
    assert_eq!(constant(&g, "typed").as_slice::<i8>().unwrap(), &[-2, 1, -1, 0, 1]);
    assert_eq!(constant(&g, "f4").bytes(), &[1, 7]);
    assert_eq!(constant(&g, "f4").desc().dtype, DType::F4E2M1);

    let long = TensorProto { raw_data: vec![0, 0], ..with_code("long", 26, &[3]) };
    let msg = import_err(&initializers(vec![long]), &ImportOptions::default());
    assert!(msg.contains("'long'") && msg.contains("3 2-bit values need 1"), "{msg}");
}

#[test]
fn a_branch_given_as_a_number_or_a_reserved_attribute_is_refused() {
    let mut graph = if_graph();
    graph.node[1].attribute[1] = AttributeProto { i: 0, ..attr("else_branch", AttributeType::INT) };
    let msg = import_err(&model(17, graph), &ImportOptions::default());
    assert!(msg.contains("node 'if' (If): attribute 'else_branch' is not a subgraph"), "{msg}");

    let mut graph = if_graph();
    graph.node[0].attribute =
        vec![AttributeProto { i: 9, ..attr("ingot.partials", AttributeType::INT) }];
    let msg = import_err(&model(17, graph), &ImportOptions::default());
    assert!(msg.contains("attribute 'ingot.partials' has a name Ingot reserves"), "{msg}");
}
