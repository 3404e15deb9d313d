//! Node attributes -> `Attrs`, and the value of a `Constant` node.

use super::external::ExternalData;
use super::tensor;
use crate::ir::Const;
use ingot_ops::Constant as _;
use ingot_ops::Tensor;
use ingot_schema::{AttrValue, Attrs};
use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::{AttributeProto, NodeProto};

/// Converts a node's attributes. A TENSOR attribute `NAME` (ConstantOfShape's `value`)
/// becomes `NAME` = its elements (see [`tensor_value`]) and `NAME.dtype` = its ONNX element
/// type code.
/// STRINGS (e.g. LSTM's `activations`) become one Text joined with ','. GRAPH attributes are
/// left to the importer (see `Importer::node`).
pub(super) fn convert(protos: &[AttributeProto]) -> Result<Attrs, String> {
    let mut attrs = Attrs::new();
    for a in protos {
        let name = a.name.as_str();
        if attrs.contains(name) {
            return Err(format!("attribute '{name}' is given twice"));
        }
        if !a.ref_attr_name.is_empty() {
            return Err(format!(
                "attribute '{name}' refers to a function attribute ('{}'); functions are not \
                 supported",
                a.ref_attr_name
            ));
        }
        let kind = a
            .type_
            .enum_value()
            .map_err(|code| format!("attribute '{name}' has unknown type code {code}"))?;
        let value = match kind {
            AttributeType::INT => AttrValue::Int(a.i),
            AttributeType::FLOAT => AttrValue::Float(f64::from(a.f)),
            AttributeType::INTS => AttrValue::Ints(a.ints.clone()),
            AttributeType::FLOATS => {
                AttrValue::Floats(a.floats.iter().map(|&f| f64::from(f)).collect())
            }
            AttributeType::STRING => AttrValue::Text(utf8(name, &a.s)?),
            AttributeType::STRINGS => {
                let items =
                    a.strings.iter().map(|s| utf8(name, s)).collect::<Result<Vec<_>, _>>()?;
                if items.iter().any(|s| s.contains(',')) {
                    return Err(format!("attribute '{name}' has a string containing ','"));
                }
                AttrValue::Text(items.join(","))
            }
            AttributeType::TENSOR => {
                let t = a.t.as_ref().ok_or_else(|| format!("attribute '{name}' has no tensor"))?;
                // Tensor attributes are small; external data is not looked up for them.
                let value = tensor::to_const(t, &mut ExternalData::new(None))
                    .map_err(|m| format!("attribute '{name}': {m}"))?;
                // The type it was read as (a bfloat16 tensor is widened to float).
                let dtype = value.desc().dtype.onnx_code();
                attrs.set(&format!("{name}.dtype"), AttrValue::Int(i64::from(dtype)));
                tensor_value(&value).ok_or_else(|| format!("attribute '{name}': not numeric"))?
            }
            // The importer makes it a body of the graph and sets this name to its index.
            AttributeType::GRAPH => continue,
            // Optional's `type`, the only op attribute of types: an empty optional holds no
            // value whose type anything needs.
            AttributeType::TYPE_PROTO => continue,
            AttributeType::GRAPHS => {
                return Err(format!("attribute '{name}' is a list of subgraphs, not supported"));
            }
            other => {
                return Err(format!(
                    "attribute '{name}' has type {other:?}, which is not supported"
                ));
            }
        };
        attrs.set(name, value);
    }
    Ok(attrs)
}

/// A tensor's elements as an attribute value: one element as `Int` (integer and bool types,
/// exact) or `Float`, several as `Ints` or `Floats` (the runtime's ConstantOfShape reads a
/// scalar `value` and a `dtype`).
fn tensor_value(value: &Const) -> Option<AttrValue> {
    let integral = !value.desc().dtype.is_float();
    Some(match (integral, value.desc().elements() == 1) {
        (true, true) => AttrValue::Int(*value.to_i64s()?.first()?),
        (true, false) => AttrValue::Ints(value.to_i64s()?),
        (false, true) => AttrValue::Float(*value.to_f64s()?.first()?),
        (false, false) => AttrValue::Floats(value.to_f64s()?),
    })
}

fn utf8(name: &str, bytes: &[u8]) -> Result<String, String> {
    String::from_utf8(bytes.to_vec()).map_err(|_| format!("attribute '{name}' is not valid UTF-8"))
}

/// The value of a `Constant` node: exactly one of `value`, `value_float(s)`, `value_int(s)`.
pub(super) fn constant_value(node: &NodeProto, ext: &mut ExternalData) -> Result<Const, String> {
    let [a] = node.attribute.as_slice() else {
        return Err(format!(
            "a Constant needs exactly one value attribute, this one has {}",
            node.attribute.len()
        ));
    };
    let owned =
        |t: Result<Tensor, ingot_ops::TensorError>| t.map(Const::owned).map_err(|e| e.to_string());
    match a.name.as_str() {
        "value" => {
            let t = a.t.as_ref().ok_or("attribute 'value' has no tensor")?;
            tensor::to_const(t, ext)
        }
        "value_float" => owned(Tensor::from_vec(vec![], &[a.f])),
        "value_floats" => owned(Tensor::from_vec(vec![a.floats.len()], &a.floats)),
        "value_int" => owned(Tensor::from_vec(vec![], &[a.i])),
        "value_ints" => owned(Tensor::from_vec(vec![a.ints.len()], &a.ints)),
        "sparse_value" => Err("sparse constants are not supported".into()),
        "value_string" | "value_strings" => Err("string constants are not supported".into()),
        other => Err(format!("unknown Constant attribute '{other}'")),
    }
}
