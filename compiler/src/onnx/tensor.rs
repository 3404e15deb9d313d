//! `TensorProto` -> constant, for every encoding ONNX allows: the typed repeated fields,
//! `raw_data` (little endian) and external data. Errors are plain messages; the caller adds
//! the model and the tensor's name.

use super::external::ExternalData;
use crate::ir::Const;
use bytemuck::Pod;
use ingot_ops::{Tensor, TensorDesc};
use ingot_schema::DType;
use onnx_protobuf::TensorProto;
use onnx_protobuf::tensor_proto::{DataLocation, DataType};
use protobuf::Enum;

/// The ONNX name of an element type code, for messages (`FLOAT16`, `STRING`...).
pub(super) fn onnx_type_name(code: i32) -> String {
    match DataType::from_i32(code) {
        Some(t) => format!("{t:?}"),
        None => format!("unknown type code {code}"),
    }
}

/// ONNX's bfloat16. Ingot carries it as f32, which holds every bfloat16 exactly (a bfloat16
/// is the high half of an f32): bfloat16 tensors are widened as they are read, inputs and
/// outputs declared bfloat16 are f32 in the bundle, and a cast to bfloat16 rounds to its
/// precision (`Cast` attribute `bfloat16`). Arithmetic then runs at f32 precision.
pub(crate) const BFLOAT16: i32 = DataType::BFLOAT16 as i32;

/// Values of `bits` bits (4 or 2), 8 / `bits` to a byte, the first in the low bits, as ONNX
/// stores INT4, UINT4, FLOAT4E2M1, INT2 and UINT2 (in raw_data, int32_data and external data
/// alike): one byte each, as Ingot keeps them (`DType::I4` and `I2` sign-extended).
fn unpack(packed: impl Iterator<Item = u8>, count: usize, bits: u32, signed: bool) -> Vec<u8> {
    let per_byte = 8 / bits;
    let mask = (1u8 << bits) - 1;
    let widen = |v: u8| if signed && v >> (bits - 1) != 0 { v | !mask } else { v };
    packed
        .flat_map(|b| (0..per_byte).map(move |k| widen((b >> (k * bits)) & mask)))
        .take(count)
        .collect()
}

/// Whether a packed type's values are sign-extended into their byte.
fn sign_extends(dtype: DType) -> bool {
    matches!(dtype, DType::I4 | DType::I2)
}

/// The element type for an ONNX type code; unsupported types give a message.
pub(super) fn dtype(code: i32) -> Result<DType, String> {
    if code == BFLOAT16 {
        return Ok(DType::F32);
    }
    DType::from_onnx_code(code).ok_or_else(|| {
        format!(
            "element type {} is not supported (Ingot runs float, float16, double, float8, \
             float4, bool and 2- to 64-bit integers, and bfloat16 as float)",
            onnx_type_name(code)
        )
    })
}

/// bfloat16 bit patterns as the f32 values they are.
fn widen_bf16(bits: impl Iterator<Item = u16>) -> Vec<f32> {
    bits.map(|b| f32::from_bits(u32::from(b) << 16)).collect()
}

/// Size in bytes of a tensor, `None` if its non-zero dims multiply past `isize::MAX` bytes
/// (zeros are skipped in that bound, so that no product of dims overflows, even in an empty
/// tensor).
pub(crate) fn checked_bytes(dtype: DType, shape: &[usize]) -> Option<usize> {
    let bound = shape
        .iter()
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d.max(1)))
        .filter(|&b| b <= isize::MAX as usize)?;
    Some(if shape.contains(&0) { 0 } else { bound })
}

/// Element type and shape of a tensor proto, checked.
pub(super) fn desc(t: &TensorProto) -> Result<TensorDesc, String> {
    let dtype = dtype(t.data_type)?;
    let shape = t
        .dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("negative dim {d} in shape {:?}", t.dims)))
        .collect::<Result<Vec<_>, _>>()?;
    checked_bytes(dtype, &shape).ok_or_else(|| format!("shape {shape:?} is too large"))?;
    Ok(TensorDesc::new(dtype, shape))
}

/// A tensor proto as a constant: owned for inline data, mapped for external data.
pub(super) fn to_const(t: &TensorProto, ext: &mut ExternalData) -> Result<Const, String> {
    let desc = desc(t)?;
    if t.segment.is_some() {
        return Err("segmented tensors are not supported".into());
    }
    match t.data_location.enum_value() {
        Ok(DataLocation::EXTERNAL) if t.data_type == BFLOAT16 => {
            // Read as the 16-bit patterns the file holds, then widened (owned, not mapped).
            let bits =
                ext.load(TensorDesc::new(DType::U16, desc.shape.clone()), &t.external_data)?;
            let bits = bits.bytes().chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]]));
            let values = widen_bf16(bits);
            Tensor::from_bytes(desc, bytemuck::cast_slice(&values))
                .map(Const::owned)
                .map_err(|e| e.to_string())
        }
        Ok(DataLocation::EXTERNAL) if desc.dtype.packed_bits().is_some() => {
            let bits = desc.dtype.packed_bits().unwrap_or(8);
            let bytes = desc.elements().div_ceil((8 / bits) as usize);
            let packed = ext.load(TensorDesc::new(DType::U8, vec![bytes]), &t.external_data)?;
            let (count, signed) = (desc.elements(), sign_extends(desc.dtype));
            let values = unpack(packed.bytes().iter().copied(), count, bits, signed);
            Tensor::from_bytes(desc, &values).map(Const::owned).map_err(|e| e.to_string())
        }
        Ok(DataLocation::EXTERNAL) => ext.load(desc, &t.external_data),
        Ok(DataLocation::DEFAULT) => decode_inline(t, desc).map(Const::owned),
        Err(code) => Err(format!("unknown data_location {code}")),
    }
}

/// Decodes data stored in the proto itself: `raw_data` if present, else the typed field
/// that ONNX assigns to the element type.
pub(super) fn decode_inline(t: &TensorProto, desc: TensorDesc) -> Result<Tensor, String> {
    if t.data_type == BFLOAT16 {
        // Two bytes each in raw_data, the low 16 bits of each int32_data value otherwise.
        let values = if t.raw_data.is_empty() {
            count_check(&desc, "int32_data", t.int32_data.len())?;
            widen_bf16(t.int32_data.iter().map(|&v| v as u16))
        } else {
            if t.raw_data.len() != 2 * desc.elements() {
                return Err(format!(
                    "raw_data holds {} bytes; the bfloat16 tensor needs {}",
                    t.raw_data.len(),
                    2 * desc.elements()
                ));
            }
            widen_bf16(t.raw_data.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])))
        };
        return Tensor::from_bytes(desc, bytemuck::cast_slice(&values)).map_err(|e| e.to_string());
    }
    if let Some(bits) = desc.dtype.packed_bits() {
        let (count, signed) = (desc.elements(), sign_extends(desc.dtype));
        let per_byte = (8 / bits) as usize;
        let bytes = count.div_ceil(per_byte);
        let packed: Vec<u8> = if t.raw_data.is_empty() {
            let field = &t.int32_data;
            if field.len() != bytes {
                let what = format!("int32_data ({per_byte} {bits}-bit values each)");
                count_check(&desc, &what, field.len() * per_byte)?;
            }
            field.iter().map(|&v| v as u8).collect()
        } else if t.raw_data.len() == bytes {
            t.raw_data.clone()
        } else {
            return Err(format!(
                "raw_data holds {} bytes; {count} {bits}-bit values need {bytes}",
                t.raw_data.len()
            ));
        };
        let values = unpack(packed.into_iter(), count, bits, signed);
        return Tensor::from_bytes(desc, &values).map_err(|e| e.to_string());
    }
    if !t.raw_data.is_empty() {
        let need = desc.bytes();
        return Tensor::from_bytes(desc, &t.raw_data).map_err(|_| {
            format!("raw_data holds {} bytes; the tensor needs {need}", t.raw_data.len())
        });
    }
    use DType::*;
    // Narrow types travel in int32_data (float16 as its bits) and u32 in uint64_data; the
    // conversions keep the low bits, as ONNX's own reader (numpy_helper.to_array) does.
    match desc.dtype {
        F32 => same(desc, "float_data", &t.float_data),
        F64 => same(desc, "double_data", &t.double_data),
        I64 => same(desc, "int64_data", &t.int64_data),
        U64 => same(desc, "uint64_data", &t.uint64_data),
        I32 => same(desc, "int32_data", &t.int32_data),
        U32 => converted(desc, "uint64_data", &t.uint64_data, |v| v as u32),
        I16 => converted(desc, "int32_data", &t.int32_data, |v| v as i16),
        U16 => converted(desc, "int32_data", &t.int32_data, |v| v as u16),
        I8 => converted(desc, "int32_data", &t.int32_data, |v| v as i8),
        U8 => converted(desc, "int32_data", &t.int32_data, |v| v as u8),
        Bool => converted(desc, "int32_data", &t.int32_data, |v| u8::from(v != 0)),
        F16 => converted(desc, "int32_data", &t.int32_data, |v| half::f16::from_bits(v as u16)),
        I4 | U4 | I2 | U2 | F4E2M1 => Err("packed types are unpacked above".into()),
        // Each int32 holds one float8's bits.
        F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ | F8E8M0 => {
            converted(desc, "int32_data", &t.int32_data, |v| v as u8)
        }
    }
}

fn count_check(desc: &TensorDesc, field: &str, len: usize) -> Result<(), String> {
    let need = desc.elements();
    match len {
        _ if len == need => Ok(()),
        0 => Err(format!("no data: neither raw_data nor {field} holds the {need} elements")),
        _ => Err(format!("{field} holds {len} values; shape {:?} needs {need}", desc.shape)),
    }
}

/// A typed field whose elements are already the tensor's element type.
fn same<T: Pod>(desc: TensorDesc, field: &str, data: &[T]) -> Result<Tensor, String> {
    count_check(&desc, field, data.len())?;
    Tensor::from_bytes(desc, bytemuck::cast_slice(data)).map_err(|e| e.to_string())
}

/// A typed field that carries a narrower element type.
fn converted<S: Copy, T: Pod>(
    desc: TensorDesc,
    field: &str,
    data: &[S],
    f: impl Fn(S) -> T,
) -> Result<Tensor, String> {
    count_check(&desc, field, data.len())?;
    let values: Vec<T> = data.iter().map(|&v| f(v)).collect();
    Tensor::from_bytes(desc, bytemuck::cast_slice(&values)).map_err(|e| e.to_string())
}
