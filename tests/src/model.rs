//! Small ONNX models written from Rust, for tests that need a model made to order.
//!
//! ```no_run
//! use ingot_tests::model::{OnnxModel, attr_int};
//! use ingot_schema::DType;
//! let bytes = OnnxModel::new(17)
//!     .input("x", DType::F32, &[2, 3])
//!     .node("softmax", "Softmax", &["x"], &["y"], vec![attr_int("axis", 1)])
//!     .output("y", DType::F32, &[2, 3])
//!     .to_bytes();
//! ```

use anyhow::{Context, Result};
use ingot_runtime::Tensor;
use ingot_schema::DType;
use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::tensor_shape_proto::{Dimension, dimension};
use onnx_protobuf::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TypeProto, ValueInfoProto, type_proto,
};
use protobuf::Message;
use std::path::Path;

/// A single-graph ONNX model in the default domain.
#[derive(Clone, Debug)]
pub struct OnnxModel {
    opset: i64,
    graph: GraphProto,
}

impl OnnxModel {
    pub fn new(opset: i64) -> Self {
        let mut graph = GraphProto::new();
        graph.name = "test".into();
        Self { opset, graph }
    }

    pub fn input(mut self, name: &str, dtype: DType, shape: &[usize]) -> Self {
        self.graph.input.push(value_info(name, dtype, shape));
        self
    }

    pub fn output(mut self, name: &str, dtype: DType, shape: &[usize]) -> Self {
        self.graph.output.push(value_info(name, dtype, shape));
        self
    }

    /// An input that is a sequence of `dtype` tensors (element shape left open), or an
    /// optional of one with `optional`.
    pub fn sequence_input(mut self, name: &str, dtype: DType, optional: bool) -> Self {
        self.graph.input.push(sequence_info(name, dtype, optional));
        self
    }

    /// An output that is a sequence of `dtype` tensors, or an optional of one.
    pub fn sequence_output(mut self, name: &str, dtype: DType, optional: bool) -> Self {
        self.graph.output.push(sequence_info(name, dtype, optional));
        self
    }

    pub fn initializer(mut self, name: &str, value: &Tensor) -> Self {
        self.graph.initializer.push(tensor_proto(name, value));
        self
    }

    pub fn node(
        mut self,
        name: &str,
        op: &str,
        inputs: &[&str],
        outputs: &[&str],
        attrs: Vec<AttributeProto>,
    ) -> Self {
        let mut node = NodeProto::new();
        node.name = name.into();
        node.op_type = op.into();
        node.input = inputs.iter().map(|s| s.to_string()).collect();
        node.output = outputs.iter().map(|s| s.to_string()).collect();
        node.attribute = attrs;
        self.graph.node.push(node);
        self
    }

    /// An `If` node `name` on `cond` giving `output`, with branches `then` and `other`.
    pub fn if_node(
        self,
        name: &str,
        cond: &str,
        output: &str,
        then: &OnnxModel,
        other: &OnnxModel,
    ) -> Self {
        let branches = vec![attr_graph("then_branch", then), attr_graph("else_branch", other)];
        self.node(name, "If", &[cond], &[output], branches)
    }

    pub fn proto(&self) -> ModelProto {
        let mut model = ModelProto::new();
        model.ir_version = 8;
        model.producer_name = "ingot-tests".into();
        let mut opset = OperatorSetIdProto::new();
        opset.version = self.opset;
        model.opset_import.push(opset);
        model.graph = protobuf::MessageField::some(self.graph.clone());
        model
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        // Writing a message into a Vec cannot fail.
        self.proto().write_to_bytes().unwrap_or_default()
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.to_bytes()).with_context(|| format!("write {}", path.display()))
    }
}

fn value_info(name: &str, dtype: DType, shape: &[usize]) -> ValueInfoProto {
    let mut dims = TensorShapeProto::new();
    dims.dim = shape
        .iter()
        .map(|&d| {
            let mut dim = Dimension::new();
            dim.value = Some(dimension::Value::DimValue(d as i64));
            dim
        })
        .collect();
    let mut tensor = type_proto::Tensor::new();
    tensor.elem_type = dtype.onnx_code();
    tensor.shape = protobuf::MessageField::some(dims);
    let mut ty = TypeProto::new();
    ty.value = Some(type_proto::Value::TensorType(tensor));
    let mut info = ValueInfoProto::new();
    info.name = name.into();
    info.type_ = protobuf::MessageField::some(ty);
    info
}

fn sequence_info(name: &str, dtype: DType, optional: bool) -> ValueInfoProto {
    let mut tensor = type_proto::Tensor::new();
    tensor.elem_type = dtype.onnx_code();
    let wrap = |value| {
        let mut ty = TypeProto::new();
        ty.value = Some(value);
        protobuf::MessageField::some(ty)
    };
    let mut sequence = type_proto::Sequence::new();
    sequence.elem_type = wrap(type_proto::Value::TensorType(tensor));
    let mut ty = type_proto::Value::SequenceType(sequence);
    if optional {
        let mut o = type_proto::Optional::new();
        o.elem_type = wrap(ty);
        ty = type_proto::Value::OptionalType(o);
    }
    let mut info = ValueInfoProto::new();
    info.name = name.into();
    info.type_ = wrap(ty);
    info
}

/// `value` as a TensorProto with `raw_data` (little endian; bools one byte each).
pub fn tensor_proto(name: &str, value: &Tensor) -> TensorProto {
    let mut t = TensorProto::new();
    t.name = name.into();
    t.data_type = value.dtype().onnx_code();
    t.dims = value.shape().iter().map(|&d| d as i64).collect();
    t.raw_data = value.bytes().to_vec();
    t
}

fn attr(name: &str, ty: AttributeType) -> AttributeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = ty.into();
    a
}

pub fn attr_int(name: &str, v: i64) -> AttributeProto {
    AttributeProto { i: v, ..attr(name, AttributeType::INT) }
}

pub fn attr_ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto { ints: v.to_vec(), ..attr(name, AttributeType::INTS) }
}

pub fn attr_float(name: &str, v: f32) -> AttributeProto {
    AttributeProto { f: v, ..attr(name, AttributeType::FLOAT) }
}

pub fn attr_floats(name: &str, v: &[f32]) -> AttributeProto {
    AttributeProto { floats: v.to_vec(), ..attr(name, AttributeType::FLOATS) }
}

pub fn attr_string(name: &str, v: &str) -> AttributeProto {
    AttributeProto { s: v.as_bytes().to_vec(), ..attr(name, AttributeType::STRING) }
}

pub fn attr_tensor(name: &str, v: &Tensor) -> AttributeProto {
    AttributeProto {
        t: protobuf::MessageField::some(tensor_proto("", v)),
        ..attr(name, AttributeType::TENSOR)
    }
}

/// A subgraph attribute (an `If` branch): `body`'s graph; its opset is the outer model's.
pub fn attr_graph(name: &str, body: &OnnxModel) -> AttributeProto {
    AttributeProto {
        g: protobuf::MessageField::some(body.graph.clone()),
        ..attr(name, AttributeType::GRAPH)
    }
}
