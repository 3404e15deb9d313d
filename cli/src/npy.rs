//! `.npy` files in and out of runtime tensors (numpy's format, through npyz).

use anyhow::{Context, Result, bail};
use ingot_runtime::Tensor;
use ingot_schema::DType;
use npyz::WriterBuilder;
use std::io::Read;
use std::path::Path;

/// Reads a C-ordered, little-endian `.npy` file.
pub fn read(path: &Path) -> Result<Tensor> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse(&bytes).with_context(|| format!("{} is not a usable .npy file", path.display()))
}

/// The arrays of a `.npz` archive (numpy's `savez`, compressed or not), by name, in the
/// archive's order.
pub fn read_archive(path: &Path) -> Result<Vec<(String, Tensor)>> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut archive = zip::ZipArchive::new(std::io::BufReader::new(file))
        .with_context(|| format!("{} is not a .npz (zip) archive", path.display()))?;
    let mut arrays = Vec::with_capacity(archive.len());
    for k in 0..archive.len() {
        let mut member = archive.by_index(k)?;
        let name = member.name()?.to_string();
        let mut bytes = Vec::with_capacity(member.size() as usize);
        member
            .read_to_end(&mut bytes)
            .with_context(|| format!("{}: cannot read {name}", path.display()))?;
        let tensor = parse(&bytes)
            .with_context(|| format!("{}: {name} is not a usable .npy array", path.display()))?;
        arrays.push((name.strip_suffix(".npy").unwrap_or(&name).to_string(), tensor));
    }
    Ok(arrays)
}

fn parse(bytes: &[u8]) -> Result<Tensor> {
    let file = npyz::NpyFile::new(bytes).context("no .npy header")?;
    if file.order() != npyz::Order::C {
        bail!("Fortran-ordered arrays are not supported; save it C-ordered (np.ascontiguousarray)");
    }
    let descr = match file.dtype() {
        npyz::DType::Plain(ts) => ts.to_string(),
        other => bail!("unsupported dtype {}", other.descr()),
    };
    let dtype = DType::from_numpy_descr(&descr)
        .with_context(|| format!("unsupported element type {descr}"))?;
    let shape: Vec<usize> = file.shape().iter().map(|&d| d as usize).collect();
    macro_rules! typed {
        ($t:ty) => {{
            let data: Vec<$t> = file.into_vec().context("bad data")?;
            Tensor::from_vec(shape, &data)?
        }};
    }
    Ok(match dtype {
        DType::F32 => typed!(f32),
        DType::F16 => typed!(half::f16),
        DType::F64 => typed!(f64),
        // numpy has no 4-bit types: `from_numpy_descr` gives int8 and uint8 for their bytes.
        DType::I8 | DType::I4 | DType::I2 => typed!(i8),
        DType::U8 | DType::U4 | DType::U2 => typed!(u8),
        DType::F8E4M3FN
        | DType::F8E4M3FNUZ
        | DType::F8E5M2
        | DType::F8E5M2FNUZ
        | DType::F8E8M0
        | DType::F4E2M1 => typed!(u8),
        DType::I16 => typed!(i16),
        DType::U16 => typed!(u16),
        DType::I32 => typed!(i32),
        DType::U32 => typed!(u32),
        DType::I64 => typed!(i64),
        DType::U64 => typed!(u64),
        DType::Bool => {
            let data: Vec<bool> = file.into_vec().context("bad data")?;
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
        // 4-bit integers are written as their one-byte storage (numpy has no 4-bit types).
        DType::I8 | DType::I4 | DType::I2 => typed!(i8, t.as_slice::<i8>()?.iter().copied()),
        DType::U8 | DType::U4 | DType::U2 => typed!(u8, t.as_slice::<u8>()?.iter().copied()),
        // Minifloats as their bits (numpy has no such types).
        DType::F8E4M3FN
        | DType::F8E4M3FNUZ
        | DType::F8E5M2
        | DType::F8E5M2FNUZ
        | DType::F8E8M0
        | DType::F4E2M1 => {
            typed!(u8, t.bytes().iter().copied())
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn npz_archives_read_stored_and_deflated_members() {
        let dir = std::env::temp_dir().join(format!("ingot-npz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = Tensor::from_vec(vec![2, 2], &[1.0f32, -2.0, 3.5, 0.25]).unwrap();
        let b = Tensor::from_vec(vec![3], &[7i64, 8, 9]).unwrap();
        let (pa, pb) = (dir.join("a.npy"), dir.join("b.npy"));
        write(&pa, &a).unwrap();
        write(&pb, &b).unwrap();
        let npz = dir.join("both.npz");
        let mut zip = zip::ZipWriter::new(std::fs::File::create(&npz).unwrap());
        let stored = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        let deflated = stored.compression_method(zip::CompressionMethod::Deflated);
        zip.start_file("x.npy", stored).unwrap();
        zip.write_all(&std::fs::read(&pa).unwrap()).unwrap();
        zip.start_file("ids.npy", deflated).unwrap();
        zip.write_all(&std::fs::read(&pb).unwrap()).unwrap();
        zip.finish().unwrap();

        let arrays = read_archive(&npz).unwrap();
        let names: Vec<&str> = arrays.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["x", "ids"]);
        assert_eq!(arrays[0].1.as_slice::<f32>().unwrap(), a.as_slice::<f32>().unwrap());
        assert_eq!(arrays[1].1.as_slice::<i64>().unwrap(), [7, 8, 9]);
        assert!(read_archive(&pa).is_err(), "a .npy file is not an archive");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
