//! `.npy` files in and out of runtime tensors (numpy's format, through npyz).

use anyhow::{Context, Result, bail};
use ingot_runtime::Tensor;
use ingot_schema::DType;
use npyz::WriterBuilder;
use std::path::Path;

fn dtype_of(descr: &str) -> Option<DType> {
    // Single-byte types are written with '|', multi-byte little-endian ones with '<'.
    Some(match descr {
        "<f4" => DType::F32,
        "<f2" => DType::F16,
        "<f8" => DType::F64,
        "|i1" => DType::I8,
        "|u1" => DType::U8,
        "<i2" => DType::I16,
        "<u2" => DType::U16,
        "<i4" => DType::I32,
        "<u4" => DType::U32,
        "<i8" => DType::I64,
        "<u8" => DType::U64,
        "|b1" => DType::Bool,
        _ => return None,
    })
}

/// Reads a C-ordered, little-endian `.npy` file.
pub fn read(path: &Path) -> Result<Tensor> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let file = npyz::NpyFile::new(&bytes[..])
        .with_context(|| format!("{} is not a valid .npy file", path.display()))?;
    if file.order() != npyz::Order::C {
        bail!("{}: Fortran-ordered arrays are not supported; save it C-ordered", path.display());
    }
    let descr = match file.dtype() {
        npyz::DType::Plain(ts) => ts.to_string(),
        other => bail!("{}: unsupported dtype {}", path.display(), other.descr()),
    };
    let dtype = dtype_of(&descr)
        .with_context(|| format!("{}: unsupported element type {descr}", path.display()))?;
    let shape: Vec<usize> = file.shape().iter().map(|&d| d as usize).collect();
    macro_rules! typed {
        ($t:ty) => {{
            let data: Vec<$t> =
                file.into_vec().with_context(|| format!("{}: bad data", path.display()))?;
            Tensor::from_vec(shape, &data)?
        }};
    }
    Ok(match dtype {
        DType::F32 => typed!(f32),
        DType::F16 => typed!(half::f16),
        DType::F64 => typed!(f64),
        DType::I8 => typed!(i8),
        DType::U8 => typed!(u8),
        DType::I16 => typed!(i16),
        DType::U16 => typed!(u16),
        DType::I32 => typed!(i32),
        DType::U32 => typed!(u32),
        DType::I64 => typed!(i64),
        DType::U64 => typed!(u64),
        DType::Bool => {
            let data: Vec<bool> =
                file.into_vec().with_context(|| format!("{}: bad data", path.display()))?;
            Tensor::from_bools(shape, &data)?
        }
    })
}

/// Writes `t` as a `.npy` file.
pub fn write(path: &Path, t: &Tensor) -> Result<()> {
    let shape: Vec<u64> = t.shape().iter().map(|&d| d as u64).collect();
    let file =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    macro_rules! typed {
        ($t:ty, $data:expr) => {{
            let mut w = npyz::WriteOptions::<$t>::new()
                .default_dtype()
                .shape(&shape)
                .writer(&mut out)
                .begin_nd()?;
            w.extend($data)?;
            w.finish()?;
        }};
    }
    match t.dtype() {
        DType::F32 => typed!(f32, t.as_slice::<f32>()?.iter().copied()),
        DType::F16 => typed!(half::f16, t.as_slice::<half::f16>()?.iter().copied()),
        DType::F64 => typed!(f64, t.as_slice::<f64>()?.iter().copied()),
        DType::I8 => typed!(i8, t.as_slice::<i8>()?.iter().copied()),
        DType::U8 => typed!(u8, t.as_slice::<u8>()?.iter().copied()),
        DType::I16 => typed!(i16, t.as_slice::<i16>()?.iter().copied()),
        DType::U16 => typed!(u16, t.as_slice::<u16>()?.iter().copied()),
        DType::I32 => typed!(i32, t.as_slice::<i32>()?.iter().copied()),
        DType::U32 => typed!(u32, t.as_slice::<u32>()?.iter().copied()),
        DType::I64 => typed!(i64, t.as_slice::<i64>()?.iter().copied()),
        DType::U64 => typed!(u64, t.as_slice::<u64>()?.iter().copied()),
        DType::Bool => typed!(bool, t.bytes().iter().map(|&b| b != 0)),
    }
    Ok(())
}
