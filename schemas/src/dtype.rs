//! Element types shared by the compiler and the runtime.

use crate::proto::DataType;
use std::fmt;

/// The element type of a tensor. Bool is stored as one byte per element (0 or 1), and the
/// 4- and 2-bit integers of opsets 21 and 25 one byte per element too (ONNX packs two or four
/// per byte): I4 and I2 as the sign-extended byte (-8..=7, the bits of an i8), U4 and U2 as
/// the byte (0..=15, a u8), so every kernel that reads int8 or uint8 reads them as they are.
/// The float8 types of opsets 19 and 24 are their bytes, FLOAT4E2M1 its bits in a byte's low
/// nibble; only casts and (de)quantization convert them (`ingot_ops::minifloat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    F64,
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    Bool,
    I4,
    U4,
    F8E4M3FN,
    F8E4M3FNUZ,
    F8E5M2,
    F8E5M2FNUZ,
    F8E8M0,
    F4E2M1,
    I2,
    U2,
}

impl DType {
    pub const ALL: [DType; 22] = [
        DType::F32,
        DType::F16,
        DType::F64,
        DType::I8,
        DType::U8,
        DType::I16,
        DType::U16,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
        DType::Bool,
        DType::I4,
        DType::U4,
        DType::F8E4M3FN,
        DType::F8E4M3FNUZ,
        DType::F8E5M2,
        DType::F8E5M2FNUZ,
        DType::F8E8M0,
        DType::F4E2M1,
        DType::I2,
        DType::U2,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::Bool | DType::I4 | DType::U4 | DType::I2 => 1,
            DType::U2 | DType::F4E2M1 | DType::F8E8M0 => 1,
            DType::F8E4M3FN | DType::F8E4M3FNUZ | DType::F8E5M2 | DType::F8E5M2FNUZ => 1,
            DType::F16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// The short lower-case name used in plans, errors and the CLI (`f32`, `i64`, `bool`...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::F64 => "f64",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I16 => "i16",
            DType::U16 => "u16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::U64 => "u64",
            DType::Bool => "bool",
            DType::I4 => "i4",
            DType::U4 => "u4",
            DType::F8E4M3FN => "f8e4m3fn",
            DType::F8E4M3FNUZ => "f8e4m3fnuz",
            DType::F8E5M2 => "f8e5m2",
            DType::F8E5M2FNUZ => "f8e5m2fnuz",
            DType::F8E8M0 => "f8e8m0",
            DType::F4E2M1 => "f4e2m1",
            DType::I2 => "i2",
            DType::U2 => "u2",
        }
    }

    /// numpy's name of the type (`float32`, `int64`, `bool`...), for hints and the Python package.
    pub const fn numpy_name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::F64 => "float64",
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::I16 => "int16",
            DType::U16 => "uint16",
            DType::I32 => "int32",
            DType::U32 => "uint32",
            DType::I64 => "int64",
            DType::U64 => "uint64",
            DType::Bool => "bool",
            DType::I4 => "int4",
            DType::U4 => "uint4",
            DType::F8E4M3FN => "float8_e4m3fn",
            DType::F8E4M3FNUZ => "float8_e4m3fnuz",
            DType::F8E5M2 => "float8_e5m2",
            DType::F8E5M2FNUZ => "float8_e5m2fnuz",
            DType::F8E8M0 => "float8_e8m0fnu",
            DType::F4E2M1 => "float4_e2m1fn",
            DType::I2 => "int2",
            DType::U2 => "uint2",
        }
    }

    /// The little-endian numpy type string (`.npy` header `descr`): `<f4`, `|u1`...
    /// Single-byte types are written with `|` (no byte order), the others with `<`; numpy has
    /// no 2-bit, 4-bit or 8-bit float types, so those travel as int8 and uint8 (their storage).
    pub const fn numpy_descr(self) -> &'static str {
        match self {
            DType::F32 => "<f4",
            DType::F16 => "<f2",
            DType::F64 => "<f8",
            DType::I8 => "|i1",
            DType::U8 => "|u1",
            DType::I16 => "<i2",
            DType::U16 => "<u2",
            DType::I32 => "<i4",
            DType::U32 => "<u4",
            DType::I64 => "<i8",
            DType::U64 => "<u8",
            DType::Bool => "|b1",
            DType::I4 | DType::I2 => "|i1",
            DType::U4 | DType::U2 => "|u1",
            DType::F8E4M3FN | DType::F8E4M3FNUZ | DType::F8E5M2 | DType::F8E5M2FNUZ => "|u1",
            DType::F8E8M0 | DType::F4E2M1 => "|u1",
        }
    }

    /// The type of a numpy type string (int8 and uint8 for `|i1` and `|u1`), if Ingot supports it (`=` is native order, which
    /// every target Ingot runs on has little-endian).
    pub fn from_numpy_descr(descr: &str) -> Option<DType> {
        let (order, kind) = descr.split_at_checked(1)?;
        let little = matches!(order, "<" | "|" | "=");
        DType::ALL.into_iter().find(|d| little && d.numpy_descr()[1..] == *kind)
    }

    /// One of the float types of 8 bits or fewer, the float8s and FLOAT4E2M1 (which no
    /// arithmetic kernel takes: `ingot_ops::minifloat` converts them).
    pub const fn is_minifloat(self) -> bool {
        matches!(
            self,
            DType::F8E4M3FN
                | DType::F8E4M3FNUZ
                | DType::F8E5M2
                | DType::F8E5M2FNUZ
                | DType::F8E8M0
                | DType::F4E2M1
        )
    }

    /// The integers ONNX packs several to a byte (in files; Ingot keeps one a byte), and the
    /// bits of each: 4 for I4 and U4, 2 for I2 and U2. FLOAT4E2M1 packs as U4 does.
    pub const fn packed_bits(self) -> Option<u32> {
        match self {
            DType::I4 | DType::U4 | DType::F4E2M1 => Some(4),
            DType::I2 | DType::U2 => Some(2),
            _ => None,
        }
    }

    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::F64)
    }

    /// The ONNX `TensorProto.DataType` number of this type.
    pub const fn onnx_code(self) -> i32 {
        self.to_proto() as i32
    }

    /// The type for an ONNX `TensorProto.DataType` number, if Ingot supports it.
    pub fn from_onnx_code(code: i32) -> Option<DType> {
        DataType::try_from(code).ok().and_then(DType::from_proto)
    }

    pub const fn to_proto(self) -> DataType {
        match self {
            DType::F32 => DataType::F32,
            DType::F16 => DataType::F16,
            DType::F64 => DataType::F64,
            DType::I8 => DataType::I8,
            DType::U8 => DataType::U8,
            DType::I16 => DataType::I16,
            DType::U16 => DataType::U16,
            DType::I32 => DataType::I32,
            DType::U32 => DataType::U32,
            DType::I64 => DataType::I64,
            DType::U64 => DataType::U64,
            DType::Bool => DataType::Bool,
            DType::I4 => DataType::I4,
            DType::U4 => DataType::U4,
            DType::F8E4M3FN => DataType::F8e4m3fn,
            DType::F8E4M3FNUZ => DataType::F8e4m3fnuz,
            DType::F8E5M2 => DataType::F8e5m2,
            DType::F8E5M2FNUZ => DataType::F8e5m2fnuz,
            DType::F8E8M0 => DataType::F8e8m0,
            DType::F4E2M1 => DataType::F4e2m1,
            DType::I2 => DataType::I2,
            DType::U2 => DataType::U2,
        }
    }

    pub const fn from_proto(dt: DataType) -> Option<DType> {
        Some(match dt {
            DataType::Unspecified => return None,
            DataType::F32 => DType::F32,
            DataType::F16 => DType::F16,
            DataType::F64 => DType::F64,
            DataType::I8 => DType::I8,
            DataType::U8 => DType::U8,
            DataType::I16 => DType::I16,
            DataType::U16 => DType::U16,
            DataType::I32 => DType::I32,
            DataType::U32 => DType::U32,
            DataType::I64 => DType::I64,
            DataType::U64 => DType::U64,
            DataType::Bool => DType::Bool,
            DataType::I4 => DType::I4,
            DataType::U4 => DType::U4,
            DataType::F8e4m3fn => DType::F8E4M3FN,
            DataType::F8e4m3fnuz => DType::F8E4M3FNUZ,
            DataType::F8e5m2 => DType::F8E5M2,
            DataType::F8e5m2fnuz => DType::F8E5M2FNUZ,
            DataType::F8e8m0 => DType::F8E8M0,
            DataType::F4e2m1 => DType::F4E2M1,
            DataType::I2 => DType::I2,
            DataType::U2 => DType::U2,
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proto_and_onnx_codes_round_trip() {
        for dt in DType::ALL {
            assert_eq!(DType::from_proto(dt.to_proto()), Some(dt));
            assert_eq!(DType::from_onnx_code(dt.onnx_code()), Some(dt));
        }
        // ONNX FLOAT is 1, INT64 is 7, BOOL is 9: the proto enum mirrors ONNX's numbering.
        assert_eq!(DType::from_onnx_code(1), Some(DType::F32));
        assert_eq!(DType::from_onnx_code(7), Some(DType::I64));
        assert_eq!(DType::from_onnx_code(9), Some(DType::Bool));
        assert_eq!(DType::from_onnx_code(8), None, "ONNX STRING is not a tensor type we run");
        assert_eq!(
            (DType::from_onnx_code(21), DType::from_onnx_code(22)),
            (Some(DType::U4), Some(DType::I4))
        );
        let codes = [23, 24, 25, 26].map(DType::from_onnx_code);
        assert_eq!(
            codes,
            [DType::F4E2M1, DType::F8E8M0, DType::U2, DType::I2].map(Some),
            "FLOAT4E2M1, FLOAT8E8M0, UINT2, INT2"
        );
    }

    #[test]
    fn numpy_type_strings_round_trip() {
        for dt in DType::ALL {
            let storage = match dt {
                DType::I4 | DType::I2 => DType::I8,
                dt if dt.size() == 1 && dt != DType::I8 && dt != DType::Bool => DType::U8,
                dt => dt,
            };
            assert_eq!(DType::from_numpy_descr(dt.numpy_descr()), Some(storage));
        }
        assert_eq!(DType::from_numpy_descr("=f4"), Some(DType::F32));
        assert_eq!(DType::from_numpy_descr(">f4"), None, "big-endian data is refused");
        assert_eq!(DType::from_numpy_descr("<c8"), None);
        assert_eq!(DType::from_numpy_descr(""), None);
    }
}
