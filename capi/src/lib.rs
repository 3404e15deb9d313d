//! Ingot's C API: the runtime behind `include/ingot.h`, which is the contract and its
//! documentation. Handles are boxed Rust values handed out as opaque pointers; every entry
//! point runs inside `guard`, which turns an error into an `IngotStatus` plus a message for
//! `ingot_last_error()` and a panic into `INGOT_INTERNAL`, so no unwind crosses into C.

// A C ABI hands over raw pointers, which only `unsafe` code can read: every entry point checks
// its pointers for null and reads them in `unsafe` blocks whose SAFETY notes state what the
// header asks of the caller. Nothing else in this crate is unsafe.
#![allow(unsafe_code)]

use ingot_runtime::{Bundle, IoInfo, Session, SessionError, SessionOptions, Tensor, TensorDesc};
use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_void};
use std::fmt::Display;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::null_mut;
use std::sync::Arc;

/// What an entry point returns (`IngotStatus` in the header, same values).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IngotStatus {
    Ok = 0,
    /// A pointer, index, count or byte length the header forbids, or a string that is not
    /// UTF-8.
    InvalidArgument = 1,
    /// The bundle cannot be read or is not a valid bundle.
    Bundle = 2,
    /// The session cannot be made: unknown device or variant, no device can run a submodel.
    Session = 3,
    /// Running failed.
    Run = 4,
    /// A panic inside Ingot, caught at the boundary (a bug).
    Internal = 5,
    /// The input data is invalid for the model ([`SessionError::Data`]).
    Data = 6,
}

mod bundle;
mod logging;
mod options;
mod session;
#[cfg(test)]
mod tests;

pub use bundle::*;
pub use logging::*;
pub use options::*;
pub use session::*;

struct Error {
    status: IngotStatus,
    message: String,
}

impl Error {
    fn new(status: IngotStatus, message: impl Display) -> Error {
        Error { status, message: message.to_string() }
    }

    /// `error` with the causes its message does not already say.
    fn from_chain(status: IngotStatus, error: &dyn std::error::Error) -> Error {
        let mut message = error.to_string();
        let mut cause = error.source();
        while let Some(c) = cause {
            let text = c.to_string();
            if !message.contains(&text) {
                message = format!("{message}: {text}");
            }
            cause = c.source();
        }
        Error { status, message }
    }
}

fn invalid(message: impl Display) -> Error {
    Error::new(IngotStatus::InvalidArgument, message)
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // `try_with`: during thread teardown the slot may be gone; there is nobody to tell then.
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = c_string(message));
}

/// `text` as a C string; a NUL byte inside (from a bundle's or a device's text) becomes U+FFFD.
fn c_string(text: &str) -> CString {
    CString::new(text.replace('\0', "\u{fffd}")).unwrap_or_default()
}

/// Runs an entry point's body: its error or a panic becomes the status and the thread's last
/// error; success clears the last error.
fn guard(body: impl FnOnce() -> Result<(), Error>) -> IngotStatus {
    let outcome = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|panic| {
        let what = (panic.downcast_ref::<&str>().copied())
            .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("a panic without a message");
        Err(Error::new(IngotStatus::Internal, format!("internal error (a bug in Ingot): {what}")))
    });
    match outcome {
        Ok(()) => {
            set_last_error("");
            IngotStatus::Ok
        }
        Err(e) => {
            set_last_error(&e.message);
            e.status
        }
    }
}

/// Drops a handle the caller gave back. A free returns nothing and leaves the last error alone
/// (it is often called while handling another error), unless dropping panicked.
fn release<T>(value: Box<T>) {
    if catch_unwind(AssertUnwindSafe(|| drop(value))).is_err() {
        set_last_error("internal error (a bug in Ingot): a panic while freeing a handle");
    }
}

/// `*ptr` for reading, or an error naming `what` when `ptr` is null.
///
/// # Safety
/// `ptr` is null or points to a live, aligned `T` not written during `'a`.
unsafe fn get<'a, T>(ptr: *const T, what: &str) -> Result<&'a T, Error> {
    // SAFETY: forwarded from this function's contract.
    unsafe { ptr.as_ref() }.ok_or_else(|| invalid(format!("{what} is NULL")))
}

/// `*ptr` for writing, or an error naming `what` when `ptr` is null.
///
/// # Safety
/// `ptr` is null or valid for reads and writes of an aligned `T`, not used elsewhere during
/// `'a`.
unsafe fn get_mut<'a, T>(ptr: *mut T, what: &str) -> Result<&'a mut T, Error> {
    // SAFETY: forwarded from this function's contract.
    unsafe { ptr.as_mut() }.ok_or_else(|| invalid(format!("{what} is NULL")))
}

/// An out-parameter for a pointer, set to NULL first so that a failed call leaves NULL there.
///
/// # Safety
/// As [`get_mut`].
unsafe fn out_ptr<'a, T>(ptr: *mut *mut T, what: &str) -> Result<&'a mut *mut T, Error> {
    // SAFETY: forwarded from this function's contract.
    let out = unsafe { get_mut(ptr, what) }?;
    *out = null_mut();
    Ok(out)
}

/// A NUL-terminated UTF-8 string, or `None` for NULL.
///
/// # Safety
/// `ptr` is null or points to a NUL-terminated string that lives and stays unchanged for `'a`.
unsafe fn text<'a>(ptr: *const c_char, what: &str) -> Result<Option<&'a str>, Error> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null, so NUL-terminated and live by this function's contract.
    let bytes = unsafe { CStr::from_ptr(ptr) };
    bytes.to_str().map(Some).map_err(|_| invalid(format!("{what} is not UTF-8")))
}

/// A file path, or `None` for NULL: bytes on Unix, UTF-8 elsewhere.
///
/// # Safety
/// As [`text`].
unsafe fn path_arg(ptr: *const c_char) -> Result<Option<std::path::PathBuf>, Error> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null, so NUL-terminated and live by this function's contract.
    let bytes = unsafe { CStr::from_ptr(ptr) };
    #[cfg(unix)]
    let path = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(bytes.to_bytes());
    #[cfg(not(unix))]
    let path = bytes.to_str().map_err(|_| invalid("path is not UTF-8"))?;
    Ok(Some(path.into()))
}

/// `len` elements at `ptr`; NULL is allowed only when `len` is 0.
///
/// # Safety
/// When `len > 0`, `ptr` is null or valid for reads of `len` aligned `T`s not written during
/// `'a`.
unsafe fn slice<'a, T>(ptr: *const T, len: usize, what: &str) -> Result<&'a [T], Error> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-null and valid for `len` elements by this function's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// The version of the library, e.g. `0.1.0`; a static string.
#[unsafe(no_mangle)]
pub extern "C" fn ingot_version() -> *const c_char {
    const VERSION: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(v) => v,
            Err(_) => c"",
        };
    VERSION.as_ptr()
}

/// The message of this thread's last failed call, `""` after a successful one. Valid until
/// the next `ingot_` call on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn ingot_last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|e| e.try_borrow().map(|s| s.as_ptr()).ok())
        .ok()
        .flatten()
        .unwrap_or(c"".as_ptr())
}

/// Bytes per element of an `IngotDType` code; 0 for a code Ingot does not know.
#[unsafe(no_mangle)]
pub extern "C" fn ingot_dtype_size(dtype: i32) -> usize {
    ingot_runtime::DType::from_onnx_code(dtype).map_or(0, |d| d.size())
}

/// Frees a string an `ingot_` function returned as `char *`; NULL is a no-op.
///
/// # Safety
/// `string` is NULL or a string from this library not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_string_free(string: *mut c_char) {
    if !string.is_null() {
        // SAFETY: made by `CString::into_raw` and given back once (header's contract).
        release(Box::new(unsafe { CString::from_raw(string) }));
    }
}
