//! Opening bundles: from a path, a file descriptor range, or memory (copied or borrowed).

use super::*;

/// An open bundle (`IngotBundle`). Sessions share it, so it may be freed before them.
pub struct IngotBundle(pub(crate) Arc<Bundle>);

fn new_bundle(
    out: &mut *mut IngotBundle,
    bundle: Result<Bundle, ingot_runtime::BundleError>,
) -> Result<(), Error> {
    let bundle = bundle.map_err(|e| Error::from_chain(IngotStatus::Bundle, &e))?;
    *out = Box::into_raw(Box::new(IngotBundle(Arc::new(bundle))));
    Ok(())
}

/// Opens (maps) the bundle file at `path`.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string; `out` is NULL or writable (see ingot.h).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_bundle_open(
    path: *const c_char,
    out: *mut *mut IngotBundle,
) -> IngotStatus {
    guard(|| {
        // SAFETY: the header asks for a writable `out` or NULL.
        let out = unsafe { out_ptr(out, "out") }?;
        // SAFETY: the header asks for a NUL-terminated `path` or NULL.
        let path = unsafe { path_arg(path) }?.ok_or_else(|| invalid("path is NULL"))?;
        new_bundle(out, Bundle::open(path))
    })
}

/// Opens a bundle held in memory; the bytes are copied, so `data` may be freed on return.
///
/// # Safety
/// `data` is NULL or readable for `len` bytes; `out` is NULL or writable (see ingot.h).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_bundle_from_memory(
    data: *const c_void,
    len: usize,
    out: *mut *mut IngotBundle,
) -> IngotStatus {
    guard(|| {
        // SAFETY: the header asks for a writable `out` and `len` readable bytes at `data`.
        let (out, bytes) = unsafe { (out_ptr(out, "out")?, memory(data, len)?) };
        new_bundle(out, Bundle::from_bytes(bytes))
    })
}

/// Opens the bundle in the `length` bytes at `offset` of the open file `fd` (an Android
/// asset: `AAsset_openFileDescriptor64`). The range is mapped where `offset` is a multiple of
/// 64, else read into memory; the caller keeps `fd` (it may close it on return).
///
/// # Safety
/// `fd` is an open descriptor or negative; `out` is NULL or writable (see ingot.h).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_bundle_open_fd(
    fd: i32,
    offset: u64,
    length: u64,
    out: *mut *mut IngotBundle,
) -> IngotStatus {
    guard(|| {
        // SAFETY: the header asks for a writable `out` or NULL.
        let out = unsafe { out_ptr(out, "out") }?;
        #[cfg(unix)]
        {
            use std::os::fd::BorrowedFd;
            if fd < 0 {
                return Err(invalid(format!("fd {fd} is not a file descriptor")));
            }
            // A duplicate (closed when `file` drops), so that the caller's descriptor stays
            // theirs to close.
            // SAFETY: the header asks for a descriptor open during the call; it is only
            // duplicated here (a closed one fails with EBADF), never closed or kept.
            let copy = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned().map_err(|e| {
                Error::new(IngotStatus::Bundle, format!("cannot use file descriptor {fd}: {e}"))
            })?;
            let file = std::fs::File::from(copy);
            new_bundle(out, Bundle::open_range(&file, offset, length))
        }
        #[cfg(not(unix))]
        {
            let _ = (fd, offset, length, out);
            Err(invalid(
                "file descriptors are not supported on this platform; use ingot_bundle_open",
            ))
        }
    })
}

/// Opens a bundle in the caller's memory without copying it; the memory must outlive the
/// bundle and every session made from it, unchanged, and start at a multiple of 64 bytes.
///
/// # Safety
/// `data` is NULL or readable for `len` bytes that stay live and unchanged until the bundle
/// and its sessions are freed; `out` is NULL or writable (see ingot.h).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_bundle_from_borrowed_memory(
    data: *const c_void,
    len: usize,
    out: *mut *mut IngotBundle,
) -> IngotStatus {
    guard(|| {
        // SAFETY: the header asks for a writable `out` and `len` readable bytes at `data`,
        // live and unchanged until the bundle and its sessions are freed: as long as anything
        // reads them, which is what `'static` stands for here.
        let (out, bytes) = unsafe { (out_ptr(out, "out")?, memory::<'static>(data, len)?) };
        new_bundle(out, Bundle::from_static(bytes))
    })
}

/// The `len` bytes at `data`, which may not be NULL (even for 0 bytes: a bundle is never
/// empty, and NULL is more likely a caller's mistake).
///
/// # Safety
/// `data` is NULL or readable for `len` bytes, unchanged during `'a`.
unsafe fn memory<'a>(data: *const c_void, len: usize) -> Result<&'a [u8], Error> {
    if data.is_null() {
        return Err(invalid("data is NULL"));
    }
    // SAFETY: non-null, so readable for `len` bytes by this function's contract.
    unsafe { slice(data.cast::<u8>(), len, "data") }
}

/// Frees a bundle; NULL is a no-op. Sessions made from it stay valid.
///
/// # Safety
/// `bundle` is NULL or a handle from `ingot_bundle_open`/`_from_memory` not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_bundle_free(bundle: *mut IngotBundle) {
    if !bundle.is_null() {
        // SAFETY: a live handle made by `Box::into_raw`, given back once (header's contract).
        release(unsafe { Box::from_raw(bundle) });
    }
}
