//! Test data files to and from [`Tensor`]: `.npy` (numpy) and `.pb` (ONNX TensorProto).

use anyhow::{Context, Result, bail};
use ingot_runtime::Tensor;
use ingot_schema::DType;
use npyz::{TypeChar, WriterBuilder};
use std::path::Path;

/// Reads a little-endian, C-order `.npy` file of a plain numeric or bool type.
pub fn read_npy(path: &Path) -> Result<Tensor> {
    let read = || -> Result<Tensor> {
        let npy = npyz::NpyFile::new(std::io::BufReader::new(std::fs::File::open(path)?))?;
        if npy.order() != npyz::Order::C {
            bail!("Fortran-order arrays are not supported");
        }
        let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
        let npyz::DType::Plain(ty) = npy.dtype() else {
            bail!("structured dtype {:?} is not supported", npy.dtype());
        };
        macro_rules! typed {
            ($t:ty) => {
                Tensor::from_vec(shape, &npy.into_vec::<$t>()?)?
            };
        }
        Ok(match (ty.type_char(), ty.size_field()) {
            (TypeChar::Float, 4) => typed!(f32),
            (TypeChar::Float, 8) => typed!(f64),
            (TypeChar::Float, 2) => typed!(half::f16),
            (TypeChar::Int, 1) => typed!(i8),
            (TypeChar::Int, 2) => typed!(i16),
            (TypeChar::Int, 4) => typed!(i32),
            (TypeChar::Int, 8) => typed!(i64),
            (TypeChar::Uint, 1) => typed!(u8),
            (TypeChar::Uint, 2) => typed!(u16),
            (TypeChar::Uint, 4) => typed!(u32),
            (TypeChar::Uint, 8) => typed!(u64),
            (TypeChar::Bool, 1) => Tensor::from_bools(shape, &npy.into_vec::<bool>()?)?,
            _ => bail!("dtype {ty} is not supported"),
        })
    };
    read().with_context(|| format!("read {}", path.display()))
}

/// Writes `t` as a `.npy` file.
pub fn write_npy(path: &Path, t: &Tensor) -> Result<()> {
    let write = || -> Result<()> {
        let shape: Vec<u64> = t.shape().iter().map(|&d| d as u64).collect();
        let file = std::io::BufWriter::new(std::fs::File::create(path)?);
        macro_rules! typed {
            ($t:ty, $data:expr) => {{
                let mut w = npyz::WriteOptions::<$t>::new()
                    .default_dtype()
                    .shape(&shape)
                    .writer(file)
                    .begin_nd()?;
                w.extend($data)?;
                w.finish()?;
            }};
        }
        match t.dtype() {
            DType::F32 => typed!(f32, t.to_vec::<f32>()?),
            DType::F64 => typed!(f64, t.to_vec::<f64>()?),
            DType::F16 => typed!(half::f16, t.to_vec::<half::f16>()?),
            DType::I8 | DType::I4 | DType::I2 => typed!(i8, t.to_vec::<i8>()?),
            DType::I16 => typed!(i16, t.to_vec::<i16>()?),
            DType::I32 => typed!(i32, t.to_vec::<i32>()?),
            DType::I64 => typed!(i64, t.to_vec::<i64>()?),
            // Minifloats as their bits (numpy has no such types).
            DType::U8 | DType::U4 | DType::U2 => typed!(u8, t.to_vec::<u8>()?),
            DType::F8E4M3FN
            | DType::F8E4M3FNUZ
            | DType::F8E5M2
            | DType::F8E5M2FNUZ
            | DType::F8E8M0
            | DType::F4E2M1 => {
                typed!(u8, t.to_vec::<u8>()?)
            }
            DType::U16 => typed!(u16, t.to_vec::<u16>()?),
            DType::U32 => typed!(u32, t.to_vec::<u32>()?),
            DType::U64 => typed!(u64, t.to_vec::<u64>()?),
            DType::Bool => typed!(bool, t.bytes().iter().map(|&b| b != 0)),
        }
        Ok(())
    };
    write().with_context(|| format!("write {}", path.display()))
}

/// A backend test's value: a tensor, or a sequence or optional of values.
#[derive(Debug)]
pub enum Value {
    Tensor(Tensor),
    Sequence(Vec<Value>),
    Optional(Option<Box<Value>>),
}

/// What a test value is declared to be (the model's input or output type): which message its
/// `.pb` file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Declared {
    Tensor,
    Sequence,
    Optional,
}

impl Value {
    /// The tensors it holds, in order, as Ingot's graph edges take them (`x[0]`, `x[1]`, ...).
    pub fn tensors(self) -> Vec<Tensor> {
        match self {
            Value::Tensor(t) => vec![t],
            Value::Sequence(list) => list.into_iter().flat_map(Value::tensors).collect(),
            Value::Optional(v) => v.map_or_else(Vec::new, |v| v.tensors()),
        }
    }
}

/// Reads a backend test's serialized value: a TensorProto, SequenceProto or OptionalProto, as
/// `declared` says.
pub fn read_value_pb(path: &Path, declared: Declared) -> Result<Value> {
    let bytes = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
    let value = match declared {
        Declared::Tensor => tensor_message(&bytes).map(Value::Tensor),
        Declared::Sequence => sequence_message(&bytes),
        Declared::Optional => optional_message(&bytes),
    };
    value.with_context(|| format!("decode {}", path.display()))
}

fn tensor_message(bytes: &[u8]) -> Result<Tensor> {
    Ok(ingot_compiler::onnx::read_tensor_proto(bytes)?.1)
}

/// The value in field `field` of a SequenceProto or OptionalProto (which onnx-protobuf does
/// not generate; ONNX's `onnx-ml.proto`): 3 a tensor, 5 a sequence, 7 an optional.
fn element(field: u32, bytes: &[u8]) -> Result<Value> {
    Ok(match field {
        3 => Value::Tensor(tensor_message(bytes)?),
        5 => sequence_message(bytes)?,
        7 => optional_message(bytes)?,
        _ => bail!("field {field}: sparse tensors and maps are not supported"),
    })
}

/// The (field, bytes) of each length-delimited field of a message, other fields skipped.
fn fields(bytes: &[u8]) -> Result<Vec<(u32, Vec<u8>)>> {
    use protobuf::rt::WireType;
    let mut is = protobuf::CodedInputStream::from_bytes(bytes);
    let mut out = Vec::new();
    while let Some(tag) = is.read_raw_tag_or_eof()? {
        let wire = WireType::new(tag & 7).context("bad wire type")?;
        match wire {
            WireType::LengthDelimited => out.push((tag >> 3, is.read_bytes()?)),
            _ => is.skip_field(wire)?,
        }
    }
    Ok(out)
}

fn sequence_message(bytes: &[u8]) -> Result<Value> {
    let values = fields(bytes)?.into_iter().filter(|(f, _)| *f != 1); // 1: the name
    Ok(Value::Sequence(values.map(|(f, b)| element(f, &b)).collect::<Result<_>>()?))
}

fn optional_message(bytes: &[u8]) -> Result<Value> {
    let mut values = fields(bytes)?.into_iter().filter(|(f, _)| *f != 1);
    let value = values.next().map(|(f, b)| element(f, &b)).transpose()?;
    if values.next().is_some() {
        bail!("an optional holds more than one value");
    }
    Ok(Value::Optional(value.map(Box::new)))
}

/// The numbered files `<dir>/<prefix>_0.<ext>`, `_1`, ... up to the first missing one.
pub fn numbered_files(dir: &Path, prefix: &str, ext: &str) -> Vec<std::path::PathBuf> {
    (0..).map(|i| dir.join(format!("{prefix}_{i}.{ext}"))).take_while(|p| p.exists()).collect()
}
