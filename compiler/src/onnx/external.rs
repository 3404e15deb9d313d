//! External tensor data: files beside the model, each mapped once and never read whole.
//!
//! A tensor with `data_location: EXTERNAL` names its bytes with `location` (a path relative
//! to the model's directory), `offset` (default 0) and `length` (default: the tensor's size).

use crate::ir::Const;
use ingot_ops::{Tensor, TensorDesc};
use memmap2::Mmap;
use onnx_protobuf::StringStringEntryProto;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

pub(super) struct ExternalData {
    /// The model's directory; `None` when the model came as bytes without one.
    base_dir: Option<PathBuf>,
    maps: HashMap<PathBuf, Arc<Mmap>>,
}

impl ExternalData {
    pub fn new(base_dir: Option<&Path>) -> Self {
        Self { base_dir: base_dir.map(Path::to_path_buf), maps: HashMap::new() }
    }

    /// The constant for a tensor of type `desc` whose bytes the entries locate.
    pub fn load(
        &mut self,
        desc: TensorDesc,
        entries: &[StringStringEntryProto],
    ) -> Result<Const, String> {
        let mut location = None;
        let mut offset = 0;
        let mut length = None;
        for e in entries {
            let number = || {
                e.value.parse::<usize>().map_err(|_| {
                    format!("external data entry '{}' = '{}' is not a byte count", e.key, e.value)
                })
            };
            match e.key.as_str() {
                "location" => location = Some(e.value.as_str()),
                "offset" => offset = number()?,
                "length" => length = Some(number()?),
                _ => {} // "checksum" and future keys do not change where the bytes are
            }
        }
        let location = location.ok_or("external data has no 'location' entry")?;
        let rel = Path::new(location);
        // Like ONNX's checker: external data must stay inside the model's directory.
        if location.is_empty()
            || !rel.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(format!(
                "external data location '{location}' must be a relative path inside the \
                 model's directory"
            ));
        }
        let Some(base) = &self.base_dir else {
            return Err(format!(
                "its data is in the external file '{location}', but the model was given as \
                 bytes without its directory"
            ));
        };
        let path = base.join(rel);
        let need = desc.bytes();
        if let Some(len) = length
            && len != need
        {
            return Err(format!(
                "external data in {} has length {len}; shape {:?} of {} needs {need} bytes",
                path.display(),
                desc.shape,
                desc.dtype
            ));
        }
        let map = self.map(&path)?;
        let range = offset
            .checked_add(need)
            .filter(|&end| end <= map.len())
            .map(|end| offset..end)
            .ok_or_else(|| {
                format!(
                    "external data file {} holds {} bytes; the tensor needs {need} bytes at \
                     offset {offset}",
                    path.display(),
                    map.len()
                )
            })?;
        if need == 0 {
            return Ok(Const::owned(Tensor::zeros(desc)));
        }
        Ok(Const::mapped(desc, map, range))
    }

    fn map(&mut self, path: &Path) -> Result<Arc<Mmap>, String> {
        if let Some(map) = self.maps.get(path) {
            return Ok(map.clone());
        }
        let mapped = File::open(path)
            .and_then(|f| map_file(&f))
            .map_err(|e| format!("cannot map external data file {}: {e}", path.display()))?;
        let map = Arc::new(mapped);
        self.maps.insert(path.to_path_buf(), map.clone());
        Ok(map)
    }
}

#[allow(unsafe_code)]
fn map_file(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: the map is read-only and we only ever read it through `&[u8]`. memmap2's one
    // remaining requirement is that no one truncates or rewrites the file while it is mapped;
    // external weight files are inputs the compiler does not modify, and changing them under
    // a running compile is outside its contract (as for every mmap-based model loader).
    unsafe { Mmap::map(file) }
}
