//! A pipeline cache kept in a file between runs of an app. Creating a compute pipeline
//! compiles its kernel for the device, which on a phone's first start takes long; a driver
//! handed the cache of the last run skips that work. Best effort throughout: a missing,
//! unreadable or foreign file (another device, another driver version) is ignored and a
//! failed write is reported, but neither stops a session.

use super::context::Context;
use ash::vk;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `VkPipelineCacheHeaderVersionOne`: headerSize, headerVersion, vendorID and deviceID (u32,
/// little-endian), then the 16-byte pipelineCacheUUID.
const HEADER_BYTES: usize = 32;

/// The header a cache of this device and driver starts with.
pub fn header(vendor_id: u32, device_id: u32, uuid: [u8; vk::UUID_SIZE]) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[0..4].copy_from_slice(&(HEADER_BYTES as u32).to_le_bytes());
    h[4..8].copy_from_slice(&(vk::PipelineCacheHeaderVersion::ONE.as_raw() as u32).to_le_bytes());
    h[8..12].copy_from_slice(&vendor_id.to_le_bytes());
    h[12..16].copy_from_slice(&device_id.to_le_bytes());
    h[16..32].copy_from_slice(&uuid);
    h
}

/// A pipeline cache seeded from a file; [`FileCache::save`] writes it back. Destroyed on drop.
pub struct FileCache {
    cx: Arc<Context>,
    pub cache: vk::PipelineCache,
    path: PathBuf,
    /// What the file held, to leave an unchanged cache unwritten.
    loaded: Vec<u8>,
}

impl FileCache {
    /// A cache holding what `path` holds where that was written for this device and driver
    /// (checked here, not left to drivers, some of which trust it); `None` where even an
    /// empty cache cannot be made.
    pub fn open(cx: &Arc<Context>, path: &Path) -> Option<FileCache> {
        let shown = path.display();
        let loaded = match std::fs::read(path) {
            Ok(bytes) if bytes.starts_with(&cx.cache_header) => bytes,
            Ok(_) => {
                log::warn!(
                    "pipeline cache {shown}: not this device's or driver's; starting afresh"
                );
                Vec::new()
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                log::warn!("pipeline cache {shown}: cannot read it ({e}); starting afresh");
                Vec::new()
            }
        };
        let info = vk::PipelineCacheCreateInfo::default().initial_data(&loaded);
        // SAFETY: `info` and the bytes it points to live until the call returns; the data is
        // empty or starts with this device's header.
        match unsafe { cx.device.create_pipeline_cache(&info, None) } {
            Ok(cache) => {
                if !loaded.is_empty() {
                    log::info!("pipeline cache {shown}: {} bytes loaded", loaded.len());
                }
                Some(FileCache { cx: Arc::clone(cx), cache, path: path.to_path_buf(), loaded })
            }
            Err(r) => {
                log::warn!("pipeline cache {shown}: vkCreatePipelineCache: {r}; not using it");
                None
            }
        }
    }

    /// Writes the cache to its file where it changed: to a temporary file first, renamed over
    /// the old one, so that no reader (another process of the app) sees half a cache.
    pub fn save(&self) {
        let shown = self.path.display();
        // SAFETY: a cache created on this device and not destroyed yet.
        let data = match unsafe { self.cx.device.get_pipeline_cache_data(self.cache) } {
            Ok(data) => data,
            Err(r) => return log::warn!("pipeline cache {shown}: vkGetPipelineCacheData: {r}"),
        };
        if data == self.loaded {
            return;
        }
        let mut temporary = self.path.clone().into_os_string();
        temporary.push(format!(".{}.tmp", std::process::id()));
        let written = std::fs::write(&temporary, &data)
            .and_then(|()| std::fs::rename(&temporary, &self.path));
        match written {
            Ok(()) => log::info!("pipeline cache {shown}: {} bytes written", data.len()),
            Err(e) => {
                let _ = std::fs::remove_file(&temporary);
                log::warn!("pipeline cache {shown}: cannot write it: {e}");
            }
        }
    }
}

impl Drop for FileCache {
    fn drop(&mut self) {
        // SAFETY: created on this device; no pipeline creation uses it any more (it lives in
        // one executable's preparation only).
        unsafe { self.cx.device.destroy_pipeline_cache(self.cache, None) };
    }
}
