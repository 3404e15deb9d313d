//! Session options: an opaque handle with one setter per option, so that options can be added
//! without breaking the ABI.

use super::*;

/// Options for `ingot_session_new_with_options` (`IngotSessionOptions`).
pub struct IngotSessionOptions(pub(crate) SessionOptions);

/// Makes session options with the defaults: the default device list, the first variant, one
/// CPU thread per physical core, spinning on.
///
/// # Safety
/// `out` is NULL or writable (see ingot.h).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_session_options_new(
    out: *mut *mut IngotSessionOptions,
) -> IngotStatus {
    guard(|| {
        // SAFETY: the header asks for a writable `out` or NULL.
        let out = unsafe { out_ptr(out, "out") }?;
        *out = Box::into_raw(Box::new(IngotSessionOptions(SessionOptions::default())));
        Ok(())
    })
}

/// Frees session options; NULL is a no-op. Sessions made with them are not affected.
///
/// # Safety
/// `options` is NULL or a handle from `ingot_session_options_new` not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_session_options_free(options: *mut IngotSessionOptions) {
    if !options.is_null() {
        // SAFETY: a live handle made by `Box::into_raw`, given back once (header's contract).
        release(unsafe { Box::from_raw(options) });
    }
}

/// Runs `set` on the options behind a handle.
///
/// # Safety
/// `options` is NULL or a live options handle used by no other thread during the call.
unsafe fn set(
    options: *mut IngotSessionOptions,
    set: impl FnOnce(&mut SessionOptions) -> Result<(), Error>,
) -> IngotStatus {
    guard(|| {
        // SAFETY: forwarded from this function's contract.
        let options = unsafe { get_mut(options, "options") }?;
        set(&mut options.0)
    })
}

/// The devices to try for each submodel, in order (as `ingot_session_new` takes them); NULL
/// restores the default list. An unknown name is INGOT_SESSION and leaves the list as it was.
///
/// # Safety
/// `options` is NULL or a live options handle; `devices` is NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_session_options_set_devices(
    options: *mut IngotSessionOptions,
    devices: *const c_char,
) -> IngotStatus {
    // SAFETY: the header asks for a live handle and a NUL-terminated string or NULL.
    unsafe {
        set(options, |o| {
            o.devices = match text(devices, "devices")? {
                Some(list) => {
                    SessionOptions::on(list)
                        .map_err(|e| Error::from_chain(IngotStatus::Session, &e))?
                        .devices
                }
                None => SessionOptions::default().devices,
            };
            Ok(())
        })
    }
}

/// The variant to run; NULL: the bundle's first. An unknown name fails at session creation.
///
/// # Safety
/// `options` is NULL or a live options handle; `variant` is NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_session_options_set_variant(
    options: *mut IngotSessionOptions,
    variant: *const c_char,
) -> IngotStatus {
    // SAFETY: the header asks for a live handle and a NUL-terminated string or NULL.
    unsafe {
        set(options, |o| {
            o.variant = text(variant, "variant")?.map(str::to_string);
            Ok(())
        })
    }
}

/// The CPU backend's threads, the calling thread included; 0: one per physical core.
///
/// # Safety
/// `options` is NULL or a live options handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_session_options_set_threads(
    options: *mut IngotSessionOptions,
    threads: usize,
) -> IngotStatus {
    // SAFETY: the header asks for a live handle.
    unsafe {
        set(options, |o| {
            o.threads = (threads > 0).then_some(threads);
            Ok(())
        })
    }
}

/// Whether idle CPU threads spin a while for work during a run (nonzero, the default) or
/// park at once (0).
///
/// # Safety
/// `options` is NULL or a live options handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_session_options_set_spin(
    options: *mut IngotSessionOptions,
    spin: i32,
) -> IngotStatus {
    // SAFETY: the header asks for a live handle.
    unsafe {
        set(options, |o| {
            o.spin = spin != 0;
            Ok(())
        })
    }
}

/// A file that keeps compiled Vulkan pipelines between runs of the app (in its cache
/// directory); NULL: none.
///
/// # Safety
/// `options` is NULL or a live options handle; `path` is NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_session_options_set_pipeline_cache(
    options: *mut IngotSessionOptions,
    path: *const c_char,
) -> IngotStatus {
    // SAFETY: the header asks for a live handle and a NUL-terminated string or NULL.
    unsafe {
        set(options, |o| {
            o.pipeline_cache = path_arg(path)?;
            Ok(())
        })
    }
}
