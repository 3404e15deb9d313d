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

/// An open bundle (`IngotBundle`). Sessions share it, so it may be freed before them.
pub struct IngotBundle(Arc<Bundle>);

/// A session (`IngotSession`), with the C strings `IngotTensorInfo` points into.
pub struct IngotSession {
    session: Session,
    inputs: Vec<Io>,
    outputs: Vec<Io>,
}

struct Io {
    name: CString,
    desc: TensorDesc,
}

/// One input or output (`IngotTensorInfo`); `name` and `dims` belong to the session.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IngotTensorInfo {
    pub name: *const c_char,
    /// An ONNX `TensorProto.DataType` code (`IngotDType`).
    pub dtype: i32,
    pub rank: usize,
    pub dims: *const usize,
    /// The tensor's size in bytes: the product of `dims` times the element size.
    pub bytes: usize,
}

#[derive(Clone, Copy)]
enum Side {
    Input,
    Output,
}

impl IngotSession {
    fn io(&self, side: Side) -> &[Io] {
        match side {
            Side::Input => &self.inputs,
            Side::Output => &self.outputs,
        }
    }
}

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
        if path.is_null() {
            return Err(invalid("path is NULL"));
        }
        // SAFETY: non-null, so a NUL-terminated string by the header's contract.
        let path = unsafe { CStr::from_ptr(path) };
        // Unix paths are bytes; elsewhere they must be UTF-8.
        #[cfg(unix)]
        let path = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path.to_bytes());
        #[cfg(not(unix))]
        let path = path.to_str().map_err(|_| invalid("path is not UTF-8"))?;
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
        // SAFETY: the header asks for a writable `out` or NULL.
        let out = unsafe { out_ptr(out, "out") }?;
        if data.is_null() {
            return Err(invalid("data is NULL"));
        }
        // SAFETY: the header asks for `len` readable bytes at a non-null `data`.
        let bytes = unsafe { slice(data.cast::<u8>(), len, "data") }?;
        new_bundle(out, Bundle::from_bytes(bytes))
    })
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

/// Makes a session of `variant` (NULL: the first) on the devices `devices` names (NULL: the
/// default list, `vulkan,cpu`).
///
/// # Safety
/// `bundle` is NULL or a live bundle handle; `devices` and `variant` are NULL or
/// NUL-terminated strings; `out` is NULL or writable (see ingot.h).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_session_new(
    bundle: *const IngotBundle,
    devices: *const c_char,
    variant: *const c_char,
    out: *mut *mut IngotSession,
) -> IngotStatus {
    guard(|| {
        // SAFETY: the header asks for a writable `out`, a live `bundle` and NUL-terminated
        // strings, each or NULL.
        let (out, bundle, devices, variant) = unsafe {
            (
                out_ptr(out, "out")?,
                get(bundle, "bundle")?,
                text(devices, "devices")?,
                text(variant, "variant")?,
            )
        };
        let session_error = |e: SessionError| Error::from_chain(IngotStatus::Session, &e);
        let mut options = match devices {
            Some(list) => SessionOptions::on(list).map_err(session_error)?,
            None => SessionOptions::default(),
        };
        options.variant = variant.map(str::to_string);
        let session = Session::new(Arc::clone(&bundle.0), options).map_err(session_error)?;
        let io = |list: &[IoInfo]| -> Result<Vec<Io>, Error> {
            list.iter()
                .map(|i| {
                    let name = CString::new(i.name.as_str()).map_err(|_| {
                        Error::new(
                            IngotStatus::Session,
                            format!("the name {:?} holds a NUL byte", i.name),
                        )
                    })?;
                    Ok(Io { name, desc: i.desc.clone() })
                })
                .collect()
        };
        let (inputs, outputs) = (io(session.inputs())?, io(session.outputs())?);
        *out = Box::into_raw(Box::new(IngotSession { session, inputs, outputs }));
        Ok(())
    })
}

/// Frees a session; NULL is a no-op.
///
/// # Safety
/// `session` is NULL or a handle from `ingot_session_new` not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_session_free(session: *mut IngotSession) {
    if !session.is_null() {
        // SAFETY: a live handle made by `Box::into_raw`, given back once (header's contract).
        release(unsafe { Box::from_raw(session) });
    }
}

/// # Safety
/// `session` is NULL or live; `count` is NULL or writable.
unsafe fn io_count(session: *const IngotSession, count: *mut usize, side: Side) -> IngotStatus {
    guard(|| {
        // SAFETY: forwarded from this function's contract.
        let (count, session) = unsafe { (get_mut(count, "count")?, get(session, "session")?) };
        *count = session.io(side).len();
        Ok(())
    })
}

/// # Safety
/// `session` is NULL or live; `info` is NULL or writable.
unsafe fn io_info(
    session: *const IngotSession,
    index: usize,
    info: *mut IngotTensorInfo,
    side: Side,
) -> IngotStatus {
    guard(|| {
        // SAFETY: forwarded from this function's contract.
        let (info, session) = unsafe { (get_mut(info, "info")?, get(session, "session")?) };
        let list = session.io(side);
        let io = list.get(index).ok_or_else(|| {
            invalid(format!("index {index} is out of range ({} tensors)", list.len()))
        })?;
        *info = IngotTensorInfo {
            name: io.name.as_ptr(),
            dtype: io.desc.dtype.onnx_code(),
            rank: io.desc.shape.len(),
            dims: io.desc.shape.as_ptr(),
            bytes: io.desc.bytes(),
        };
        Ok(())
    })
}

/// The number of inputs of the session.
///
/// # Safety
/// `session` is NULL or a live session handle; `count` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_session_input_count(
    session: *const IngotSession,
    count: *mut usize,
) -> IngotStatus {
    // SAFETY: the same contract.
    unsafe { io_count(session, count, Side::Input) }
}

/// The number of outputs of the session.
///
/// # Safety
/// `session` is NULL or a live session handle; `count` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_session_output_count(
    session: *const IngotSession,
    count: *mut usize,
) -> IngotStatus {
    // SAFETY: the same contract.
    unsafe { io_count(session, count, Side::Output) }
}

/// Input `index`: name, dtype, dims and byte size.
///
/// # Safety
/// `session` is NULL or a live session handle; `info` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_session_input_info(
    session: *const IngotSession,
    index: usize,
    info: *mut IngotTensorInfo,
) -> IngotStatus {
    // SAFETY: the same contract.
    unsafe { io_info(session, index, info, Side::Input) }
}

/// Output `index`: name, dtype, dims and byte size.
///
/// # Safety
/// `session` is NULL or a live session handle; `info` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_session_output_info(
    session: *const IngotSession,
    index: usize,
    info: *mut IngotTensorInfo,
) -> IngotStatus {
    // SAFETY: the same contract.
    unsafe { io_info(session, index, info, Side::Output) }
}

/// Checks that the caller passes `count` buffers of exactly the byte sizes `list` needs.
fn check_buffers(side: &str, list: &[Io], count: usize, bytes: &[usize]) -> Result<(), Error> {
    if count != list.len() {
        return Err(invalid(format!("expected {} {side}s, got {count}", list.len())));
    }
    for (io, &got) in list.iter().zip(bytes) {
        if got != io.desc.bytes() {
            return Err(invalid(format!(
                "{side} '{}' ({} {:?}) needs {} bytes, got {got}",
                io.name.to_string_lossy(),
                io.desc.dtype,
                io.desc.shape,
                io.desc.bytes()
            )));
        }
    }
    Ok(())
}

/// Runs the session on the caller's input buffers and writes its outputs into the caller's
/// output buffers (untouched when the run fails).
///
/// # Safety
/// `session` is NULL or a live session handle; `inputs`/`input_bytes` are NULL or arrays of
/// `input_count` entries, each input readable for its byte length; `outputs`/`output_bytes`
/// are NULL or arrays of `output_count` entries, each output writable for its byte length
/// and overlapping no input (see ingot.h).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_session_run(
    session: *mut IngotSession,
    inputs: *const *const c_void,
    input_bytes: *const usize,
    input_count: usize,
    outputs: *const *mut c_void,
    output_bytes: *const usize,
    output_count: usize,
) -> IngotStatus {
    guard(|| {
        // SAFETY: the header asks for a live `session` and arrays of the given counts, or
        // NULL.
        let (session, inputs, input_bytes, outputs, output_bytes) = unsafe {
            (
                get_mut(session, "session")?,
                slice(inputs, input_count, "inputs")?,
                slice(input_bytes, input_count, "input_bytes")?,
                slice(outputs, output_count, "outputs")?,
                slice(output_bytes, output_count, "output_bytes")?,
            )
        };
        check_buffers("input", &session.inputs, input_count, input_bytes)?;
        check_buffers("output", &session.outputs, output_count, output_bytes)?;
        for (io, (ptr, &len)) in session.outputs.iter().zip(outputs.iter().zip(output_bytes)) {
            if ptr.is_null() && len > 0 {
                let name = io.name.to_string_lossy();
                return Err(invalid(format!("output '{name}' is NULL")));
            }
        }
        let tensors = session
            .inputs
            .iter()
            .zip(inputs.iter().zip(input_bytes))
            .map(|(io, (&ptr, &len))| {
                let what = format!("input '{}'", io.name.to_string_lossy());
                // SAFETY: the header asks for `len` readable bytes at each input pointer.
                let bytes = unsafe { slice(ptr.cast::<u8>(), len, &what) }?;
                Tensor::from_bytes(io.desc.clone(), bytes).map_err(invalid)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let results = session.session.run(&tensors).map_err(|e| {
            let status = match e {
                SessionError::Data { .. } => IngotStatus::Data,
                _ => IngotStatus::Run,
            };
            Error::from_chain(status, &e)
        })?;
        for (result, (&ptr, &len)) in results.iter().zip(outputs.iter().zip(output_bytes)) {
            if len > 0 {
                // SAFETY: non-null (checked above), and the header asks for `len` writable
                // bytes there that no other live reference covers (the inputs were copied).
                let buffer = unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u8>(), len) };
                buffer.copy_from_slice(result.bytes());
            }
        }
        Ok(())
    })
}

/// # Safety
/// `session` is NULL or live; `out` is NULL or writable.
unsafe fn session_string(
    session: *const IngotSession,
    out: *mut *mut c_char,
    make: impl FnOnce(&Session) -> Result<String, Error>,
) -> IngotStatus {
    guard(|| {
        // SAFETY: forwarded from this function's contract.
        let (out, session) = unsafe { (out_ptr(out, "out")?, get(session, "session")?) };
        *out = c_string(&make(&session.session)?).into_raw();
        Ok(())
    })
}

/// The placement report: one line per submodel with its device, and every device skipped
/// with the stage and the reason. Free it with `ingot_string_free`.
///
/// # Safety
/// `session` is NULL or a live session handle; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_session_placement(
    session: *const IngotSession,
    out: *mut *mut c_char,
) -> IngotStatus {
    // SAFETY: the same contract.
    unsafe { session_string(session, out, |s| Ok(s.placement().to_string())) }
}

/// The number of submodels of the session's variant.
///
/// # Safety
/// `session` is NULL or a live session handle; `count` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_session_submodel_count(
    session: *const IngotSession,
    count: *mut usize,
) -> IngotStatus {
    guard(|| {
        // SAFETY: the header asks for a live `session` and a writable `count`, or NULL.
        let (count, session) = unsafe { (get_mut(count, "count")?, get(session, "session")?) };
        *count = session.session.placement().0.len();
        Ok(())
    })
}

/// The device submodel `index` runs on now (`cpu`, `vulkan:0 (llvmpipe ...)`). Free it with
/// `ingot_string_free`.
///
/// # Safety
/// `session` is NULL or a live session handle; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_session_submodel_device(
    session: *const IngotSession,
    index: usize,
    out: *mut *mut c_char,
) -> IngotStatus {
    // SAFETY: the same contract.
    unsafe {
        session_string(session, out, |s| {
            let placement = s.placement();
            let count = placement.0.len();
            placement.0.into_iter().nth(index).map(|p| p.device).ok_or_else(|| {
                invalid(format!("index {index} is out of range ({count} submodels)"))
            })
        })
    }
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

/// A function that receives Ingot's log records (`IngotLogCallback`): the level (1 error,
/// 2 warning, 3 info, 4 debug, 5 trace), the message, and the caller's `user` pointer.
pub type IngotLogCallback = Option<unsafe extern "C" fn(i32, *const c_char, *mut c_void)>;

/// The callback and its `user` pointer, as `ingot_set_log_callback` last set them.
#[derive(Clone, Copy)]
struct LogTarget {
    callback: unsafe extern "C" fn(i32, *const c_char, *mut c_void),
    user: *mut c_void,
}

// SAFETY: the header makes the caller answer for `user` on any thread that calls into Ingot
// (records are delivered on the thread of the call that made them); Ingot never reads it.
unsafe impl Send for LogTarget {}
// SAFETY: as for Send: Ingot only hands the pointer back to the caller's callback.
unsafe impl Sync for LogTarget {}

static LOG_TARGET: std::sync::RwLock<Option<LogTarget>> = std::sync::RwLock::new(None);

/// The `log` logger the C API installs: each record to the callback, if one is set.
struct ToCallback;

impl log::Log for ToCallback {
    fn enabled(&self, _: &log::Metadata) -> bool {
        LOG_TARGET.read().is_ok_and(|t| t.is_some())
    }

    fn log(&self, record: &log::Record) {
        // Copied out so that the callback may itself set another one without a deadlock.
        let target = *LOG_TARGET.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(t) = target {
            let message = c_string(&record.args().to_string());
            // SAFETY: the header's contract for the callback: callable with a level, a
            // NUL-terminated message valid during the call, and the caller's `user`.
            unsafe { (t.callback)(record.level() as i32, message.as_ptr(), t.user) };
        }
    }

    fn flush(&self) {}
}

/// Sends Ingot's log records (where each submodel runs, why a device was skipped, a device
/// that failed during a run) to `callback` with `user`; NULL stops them. Fails where the
/// process already has another `log` logger (a Rust host that set its own).
///
/// # Safety
/// `callback` is NULL or a function that may be called as the header describes, on any
/// thread that calls into Ingot, until another call replaces it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_set_log_callback(
    callback: IngotLogCallback,
    user: *mut c_void,
) -> IngotStatus {
    static INSTALLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    guard(|| {
        let installed = *INSTALLED.get_or_init(|| {
            let ours = log::set_logger(&ToCallback).is_ok();
            if ours {
                log::set_max_level(log::LevelFilter::Trace);
            }
            ours
        });
        if !installed {
            return Err(invalid("this process already has a log logger (log::set_logger)"));
        }
        let target = callback.map(|callback| LogTarget { callback, user });
        *LOG_TARGET.write().unwrap_or_else(std::sync::PoisonError::into_inner) = target;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_runtime::DType;
    use std::ptr::null;
    use std::sync::OnceLock;

    /// examples/plan-snapshot/model.onnx (a small conv block, input x: 1x3x32x32 f32)
    /// compiled once.
    fn bundle_bytes() -> &'static [u8] {
        static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
        BYTES.get_or_init(|| {
            let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../examples/plan-snapshot/model.onnx");
            let options = ingot_compiler::CompileOptions {
                input_shapes: vec![("x".into(), vec![1, 3, 32, 32])],
                ..Default::default()
            };
            ingot_compiler::compile_file(&model, &options).unwrap()
        })
    }

    fn last_error() -> String {
        // SAFETY: ingot_last_error never returns NULL, and the string lives until the next
        // ingot_ call on this thread; it is copied at once.
        unsafe { CStr::from_ptr(ingot_last_error()) }.to_string_lossy().into_owned()
    }

    /// Asserts `status` is `expected` with a last error containing `needle`.
    #[track_caller]
    fn assert_error(status: IngotStatus, expected: IngotStatus, needle: &str) {
        let message = last_error();
        assert_eq!(status, expected, "message: {message}");
        assert!(message.contains(needle), "'{message}' should mention '{needle}'");
    }

    fn open_memory(bytes: &[u8]) -> (IngotStatus, *mut IngotBundle) {
        let mut bundle = null_mut();
        // SAFETY: `bytes` is readable for its length; `bundle` is writable.
        let status =
            unsafe { ingot_bundle_from_memory(bytes.as_ptr().cast(), bytes.len(), &mut bundle) };
        (status, bundle)
    }

    /// A session on `devices` of the test bundle; the bundle is freed at once.
    fn session(devices: &CStr) -> *mut IngotSession {
        let (status, bundle) = open_memory(bundle_bytes());
        assert_eq!(status, IngotStatus::Ok, "{}", last_error());
        let mut session = null_mut();
        // SAFETY: a live bundle, a NUL-terminated device list, a writable out-parameter; the
        // bundle is freed once, after the session took its share.
        let status = unsafe {
            let status = ingot_session_new(bundle, devices.as_ptr(), null(), &mut session);
            ingot_bundle_free(bundle);
            status
        };
        assert_eq!(status, IngotStatus::Ok, "{}", last_error());
        session
    }

    fn info(session: *const IngotSession, side: Side, index: usize) -> IngotTensorInfo {
        let mut info = IngotTensorInfo { name: null(), dtype: 0, rank: 0, dims: null(), bytes: 0 };
        // SAFETY: a live session and a writable info.
        let status = unsafe { io_info(session, index, &mut info, side) };
        assert_eq!(status, IngotStatus::Ok, "{}", last_error());
        info
    }

    fn input_values(bytes: usize) -> Vec<f32> {
        (0..bytes / 4).map(|i| (i % 13) as f32 / 13.0 - 0.5).collect()
    }

    /// Runs `session` on one f32 input and one output buffer of the given byte lengths.
    fn run(
        session: *mut IngotSession,
        input: &[f32],
        input_len: usize,
        output: &mut [u8],
    ) -> IngotStatus {
        let inputs = [input.as_ptr().cast::<c_void>()];
        let outputs = [output.as_mut_ptr().cast::<c_void>()];
        assert!(input_len <= size_of_val(input));
        // SAFETY: one input readable for `input_len` bytes (at most its length, asserted),
        // one output writable for its length.
        unsafe {
            ingot_session_run(
                session,
                inputs.as_ptr(),
                &input_len,
                1,
                outputs.as_ptr(),
                &output.len(),
                1,
            )
        }
    }

    #[test]
    fn runs_like_the_rust_api_bit_for_bit() {
        let session = session(c"cpu");
        let (input, output) = (info(session, Side::Input, 0), info(session, Side::Output, 0));
        // SAFETY: `name` and `dims` live as long as the session, which is live.
        let (name, dims) = unsafe {
            (CStr::from_ptr(input.name), std::slice::from_raw_parts(input.dims, input.rank))
        };
        assert_eq!((name, dims, input.dtype), (c"x", &[1, 3, 32, 32][..], 1));
        assert_eq!(input.bytes, 3 * 32 * 32 * 4);
        let values = input_values(input.bytes);
        let mut got = vec![0u8; output.bytes];
        assert_eq!(run(session, &values, input.bytes, &mut got), IngotStatus::Ok);
        assert_eq!(last_error(), "");

        let bundle = Arc::new(Bundle::from_bytes(bundle_bytes()).unwrap());
        let mut rust = Session::new(bundle, SessionOptions::on("cpu").unwrap()).unwrap();
        let x = Tensor::from_vec(vec![1, 3, 32, 32], &values).unwrap();
        let expected = rust.run(&[x]).unwrap();
        assert_eq!(got, expected[0].bytes());
        assert_eq!(output.dtype, expected[0].dtype().onnx_code());

        let mut text = null_mut();
        let mut count = 0;
        let mut device = null_mut();
        // SAFETY: a live session, writable out-parameters; the strings are read once and
        // freed once, the session freed once.
        let (placement, device_name) = unsafe {
            assert_eq!(ingot_session_placement(session, &mut text), IngotStatus::Ok);
            assert_eq!(ingot_session_submodel_count(session, &mut count), IngotStatus::Ok);
            assert_eq!(ingot_session_submodel_device(session, 0, &mut device), IngotStatus::Ok);
            let strings = (
                CStr::from_ptr(text).to_str().unwrap().to_string(),
                CStr::from_ptr(device).to_str().unwrap().to_string(),
            );
            let status = ingot_session_submodel_device(session, count, &mut device);
            assert_error(status, IngotStatus::InvalidArgument, "out of range");
            assert!(device.is_null());
            ingot_string_free(text);
            ingot_session_free(session);
            strings
        };
        assert_eq!(placement, rust.placement().to_string());
        assert_eq!(count, rust.placement().0.len());
        assert_eq!(device_name, "cpu");
    }

    #[test]
    fn null_pointers_are_errors() {
        let session = session(c"cpu");
        let mut bundle = null_mut();
        let mut count = 0;
        let mut info = info(session, Side::Input, 0);
        let mut text = null_mut();
        // SAFETY: every pointer is either NULL (the point of the test) or valid.
        unsafe {
            let status = ingot_bundle_open(null(), &mut bundle);
            assert_error(status, IngotStatus::InvalidArgument, "path is NULL");
            assert!(bundle.is_null());
            let status = ingot_bundle_open(c"x.ingot".as_ptr(), null_mut());
            assert_error(status, IngotStatus::InvalidArgument, "out is NULL");
            let status = ingot_bundle_from_memory(null(), 10, &mut bundle);
            assert_error(status, IngotStatus::InvalidArgument, "data is NULL");
            let status = ingot_session_new(null(), null(), null(), &mut null_mut());
            assert_error(status, IngotStatus::InvalidArgument, "bundle is NULL");
            let status = ingot_session_input_count(null(), &mut count);
            assert_error(status, IngotStatus::InvalidArgument, "session is NULL");
            let status = ingot_session_output_count(session, null_mut());
            assert_error(status, IngotStatus::InvalidArgument, "count is NULL");
            let status = ingot_session_output_info(null(), 0, &mut info);
            assert_error(status, IngotStatus::InvalidArgument, "session is NULL");
            let status = ingot_session_input_info(session, 0, null_mut());
            assert_error(status, IngotStatus::InvalidArgument, "info is NULL");
            let status = ingot_session_run(null_mut(), null(), null(), 0, null(), null(), 0);
            assert_error(status, IngotStatus::InvalidArgument, "session is NULL");
            let status = ingot_session_run(session, null(), null(), 1, null(), null(), 1);
            assert_error(status, IngotStatus::InvalidArgument, "inputs is NULL");
            let status = ingot_session_placement(null(), &mut text);
            assert_error(status, IngotStatus::InvalidArgument, "session is NULL");
            assert!(text.is_null());
            let status = ingot_session_submodel_count(session, null_mut());
            assert_error(status, IngotStatus::InvalidArgument, "count is NULL");
            // The frees take NULL and keep the last error.
            ingot_bundle_free(null_mut());
            ingot_session_free(null_mut());
            ingot_string_free(null_mut());
            assert!(last_error().contains("count is NULL"));
            ingot_session_free(session);
        }
    }

    #[test]
    fn wrong_buffers_are_errors_and_leave_outputs_alone() {
        let session = session(c"cpu");
        let (input, output) = (info(session, Side::Input, 0), info(session, Side::Output, 0));
        let values = input_values(input.bytes);
        let mut out = vec![7u8; output.bytes];
        let status = run(session, &values, input.bytes - 4, &mut out);
        assert_error(
            status,
            IngotStatus::InvalidArgument,
            "input 'x' (f32 [1, 3, 32, 32]) needs 12288 bytes, got 12284",
        );
        let status = run(session, &values, input.bytes, &mut out[..output.bytes - 1]);
        assert_error(status, IngotStatus::InvalidArgument, "got");
        assert!(out.iter().all(|&b| b == 7));

        let inputs = [values.as_ptr().cast::<c_void>()];
        let outputs = [out.as_mut_ptr().cast::<c_void>()];
        let lengths = [input.bytes, output.bytes];
        let null_input = [null::<c_void>()];
        // SAFETY: arrays at least as long as the counts passed, buffers as long as the
        // lengths passed, or NULL.
        unsafe {
            let status = ingot_session_run(
                session,
                inputs.as_ptr(),
                lengths.as_ptr(),
                0,
                outputs.as_ptr(),
                &lengths[1],
                1,
            );
            assert_error(status, IngotStatus::InvalidArgument, "expected 1 inputs, got 0");
            let status = ingot_session_run(
                session,
                inputs.as_ptr(),
                lengths.as_ptr(),
                1,
                outputs.as_ptr(),
                lengths.as_ptr(),
                0,
            );
            assert_error(status, IngotStatus::InvalidArgument, "expected 1 outputs, got 0");
            let status = ingot_session_run(
                session,
                null_input.as_ptr(),
                lengths.as_ptr(),
                1,
                outputs.as_ptr(),
                &lengths[1],
                1,
            );
            assert_error(status, IngotStatus::InvalidArgument, "input 'x' is NULL");
            let status = ingot_session_run(
                session,
                inputs.as_ptr(),
                lengths.as_ptr(),
                1,
                [null_mut()].as_ptr(),
                &lengths[1],
                1,
            );
            assert_error(status, IngotStatus::InvalidArgument, "is NULL");
            let mut probe = input;
            let status = ingot_session_input_info(session, 1, &mut probe);
            assert_error(
                status,
                IngotStatus::InvalidArgument,
                "index 1 is out of range (1 tensors)",
            );
        }
        assert!(out.iter().all(|&b| b == 7));
        // The session still runs after all that.
        assert_eq!(run(session, &values, input.bytes, &mut out), IngotStatus::Ok);
        // SAFETY: freed once.
        unsafe { ingot_session_free(session) };
    }

    #[test]
    fn bad_devices_and_variants_are_session_errors() {
        let (status, bundle) = open_memory(bundle_bytes());
        assert_eq!(status, IngotStatus::Ok);
        let cases: [(&CStr, Option<&CStr>, &str); 4] = [
            (c"gpu,cpu", None, "unknown device 'gpu'"),
            (c"", None, "device list is empty"),
            (c"cpu", Some(c"decode"), "no variant 'decode'"),
            (c"cpu", Some(c"\xff"), "variant is not UTF-8"),
        ];
        for (devices, variant, needle) in cases {
            // Not NULL, so that the test sees the call clear it.
            let mut session = std::ptr::dangling_mut::<IngotSession>();
            let variant = variant.map_or(null(), CStr::as_ptr);
            // SAFETY: a live bundle, NUL-terminated strings or NULL, a writable out.
            let status =
                unsafe { ingot_session_new(bundle, devices.as_ptr(), variant, &mut session) };
            let expected = if needle.contains("UTF-8") {
                IngotStatus::InvalidArgument
            } else {
                IngotStatus::Session
            };
            assert_error(status, expected, needle);
            assert!(session.is_null(), "a failed call leaves NULL");
        }
        // SAFETY: freed once.
        unsafe { ingot_bundle_free(bundle) };
    }

    #[test]
    fn corrupt_bundles_are_bundle_errors() {
        let good = bundle_bytes();
        let mut flipped = good.to_vec();
        let last = flipped.len() - 1;
        flipped[last] ^= 0x40;
        let cases: [(&[u8], &str); 4] = [
            (&good[..good.len() / 2], "truncated"),
            (&flipped, "checksum mismatch"),
            (b"not a bundle at all", "not an Ingot bundle"),
            (&[], "the file is 0 bytes"),
        ];
        for (bytes, needle) in cases {
            let (status, bundle) = open_memory(bytes);
            assert_error(status, IngotStatus::Bundle, needle);
            assert!(bundle.is_null());
        }
        let mut bundle = null_mut();
        // SAFETY: a NUL-terminated path and a writable out-parameter.
        let status =
            unsafe { ingot_bundle_open(c"/nonexistent/model.ingot".as_ptr(), &mut bundle) };
        assert_error(status, IngotStatus::Bundle, "/nonexistent/model.ingot");
    }

    #[test]
    fn opens_a_bundle_file() {
        let path = std::env::temp_dir().join(format!("ingot-capi-{}.ingot", std::process::id()));
        std::fs::write(&path, bundle_bytes()).unwrap();
        let c_path = CString::new(path.to_str().unwrap()).unwrap();
        let mut bundle = null_mut();
        let mut session = null_mut();
        let mut count = 0;
        // SAFETY: a NUL-terminated path, live handles, writable out-parameters; each handle
        // freed once.
        unsafe {
            assert_eq!(ingot_bundle_open(c_path.as_ptr(), &mut bundle), IngotStatus::Ok);
            assert_eq!(ingot_session_new(bundle, null(), null(), &mut session), IngotStatus::Ok);
            ingot_bundle_free(bundle);
            assert_eq!(ingot_session_output_count(session, &mut count), IngotStatus::Ok);
            ingot_session_free(session);
        }
        std::fs::remove_file(&path).unwrap();
        assert_eq!(count, 1);
    }

    #[test]
    fn a_panic_becomes_an_internal_error() {
        // `resume_unwind` unwinds like a panic without calling the panic hook (no noise).
        let status = guard(|| std::panic::resume_unwind(Box::new("boom")));
        assert_error(status, IngotStatus::Internal, "internal error (a bug in Ingot): boom");
    }

    #[test]
    fn last_error_is_per_thread() {
        let (status, _) = open_memory(b"junk");
        assert_eq!(status, IngotStatus::Bundle);
        let other = std::thread::spawn(last_error).join().unwrap();
        assert_eq!(other, "");
        assert!(!last_error().is_empty());
        // A success clears it.
        assert_eq!(guard(|| Ok(())), IngotStatus::Ok);
        assert_eq!(last_error(), "");
    }

    #[test]
    fn dtype_codes_are_onnx_codes() {
        for dtype in DType::ALL {
            assert_eq!(ingot_dtype_size(dtype.onnx_code()), dtype.size());
        }
        assert_eq!(ingot_dtype_size(0), 0);
        assert_eq!(ingot_dtype_size(8), 0); // STRING
    }

    /// What the header's thread rules rest on.
    /// An index out of range in the input data is INGOT_DATA, named with its step, and the
    /// session runs valid data afterwards.
    #[test]
    fn invalid_data_is_its_own_status() {
        let dir = ingot_tests::paths::scratch_dir("capi/data");
        let model = dir.join("gather.onnx");
        let table = Tensor::from_vec(vec![4, 2], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        ingot_tests::model::OnnxModel::new(17)
            .input("ids", DType::I64, &[2])
            .initializer("table", &table.unwrap())
            .node("pick", "Gather", &["table", "ids"], &["picked"], vec![])
            .output("picked", DType::F32, &[2, 2])
            .write(&model)
            .unwrap();
        let bytes = ingot_compiler::compile_file(&model, &Default::default()).unwrap();
        let (status, bundle) = open_memory(&bytes);
        assert_eq!(status, IngotStatus::Ok, "{}", last_error());
        let mut session = null_mut();
        // SAFETY: a live bundle, a NUL-terminated device list, a writable out-parameter.
        let status = unsafe { ingot_session_new(bundle, c"cpu".as_ptr(), null(), &mut session) };
        assert_eq!(status, IngotStatus::Ok, "{}", last_error());
        let run_ids = |ids: [i64; 2], picked: &mut [f32; 4]| {
            let inputs = [ids.as_ptr().cast::<c_void>()];
            let outputs = [picked.as_mut_ptr().cast::<c_void>()];
            // SAFETY: one input of 16 readable bytes, one output of 16 writable bytes.
            unsafe { ingot_session_run(session, inputs.as_ptr(), &16, 1, outputs.as_ptr(), &16, 1) }
        };
        let mut picked = [0.0f32; 4];
        assert_error(run_ids([1, 7], &mut picked), IngotStatus::Data, "index 7 is out of range");
        assert!(last_error().contains("'pick' (Gather)"), "{}", last_error());
        assert_eq!(picked, [0.0; 4], "outputs are untouched on failure");
        assert_eq!(run_ids([3, 0], &mut picked), IngotStatus::Ok, "{}", last_error());
        assert_eq!(picked, [7.0, 8.0, 1.0, 2.0]);
        // SAFETY: each freed once, the session first.
        unsafe {
            ingot_session_free(session);
            ingot_bundle_free(bundle);
        }
    }

    #[test]
    fn bundles_may_be_shared_between_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Bundle>();
    }

    /// Records the log callback received, with the `user` pointer it came with.
    static RECORDS: std::sync::Mutex<Vec<(i32, String, usize)>> = std::sync::Mutex::new(Vec::new());

    unsafe extern "C" fn record(level: i32, message: *const c_char, user: *mut c_void) {
        // SAFETY: Ingot passes a NUL-terminated message, valid during the call.
        let message = unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned();
        RECORDS.lock().unwrap().push((level, message, user as usize));
    }

    /// The records that mention `needle` (other tests make sessions at the same time).
    fn records_about(needle: &str) -> Vec<(i32, String, usize)> {
        RECORDS.lock().unwrap().iter().filter(|r| r.1.contains(needle)).cloned().collect()
    }

    #[test]
    fn the_log_callback_gets_the_placement_until_it_is_unset() {
        let user = 0x1e55_usize as *mut c_void;
        // SAFETY: `record` may be called from any thread until it is replaced.
        assert_eq!(unsafe { ingot_set_log_callback(Some(record), user) }, IngotStatus::Ok);
        // A device name no other test uses: the skip mentions it.
        let first = session(c"vulkan:98,cpu");
        // SAFETY: a live session, freed once.
        unsafe { ingot_session_free(first) };
        let skips = records_about("vulkan:98");
        assert!(!skips.is_empty(), "no record names the skipped device");
        assert!(
            skips.iter().all(|r| r.0 == log::Level::Info as i32 && r.2 == user as usize),
            "{skips:?}"
        );
        // SAFETY: NULL stops the records.
        assert_eq!(unsafe { ingot_set_log_callback(None, null_mut()) }, IngotStatus::Ok);
        let second = session(c"vulkan:97,cpu");
        // SAFETY: a live session, freed once.
        unsafe { ingot_session_free(second) };
        assert_eq!(records_about("vulkan:97"), []);
    }

    /// The header is written by hand: its enums and functions must be this file's.
    #[test]
    fn header_matches_the_library() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let header = std::fs::read_to_string(dir.join("include/ingot.h")).unwrap();
        let source = std::fs::read_to_string(dir.join("src/lib.rs")).unwrap();
        let constant = |name: &str| -> i32 {
            let line = header
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("{name} =")))
                .unwrap_or_else(|| panic!("{name} is not in ingot.h"));
            line.split('=').nth(1).unwrap().trim().trim_end_matches(',').parse().unwrap()
        };
        for dtype in DType::ALL {
            let name = format!("INGOT_DTYPE_{}", dtype.name().to_uppercase());
            assert_eq!(constant(&name), dtype.onnx_code(), "{name}");
        }
        let statuses = [
            ("INGOT_OK", IngotStatus::Ok),
            ("INGOT_INVALID_ARGUMENT", IngotStatus::InvalidArgument),
            ("INGOT_BUNDLE", IngotStatus::Bundle),
            ("INGOT_SESSION", IngotStatus::Session),
            ("INGOT_RUN", IngotStatus::Run),
            ("INGOT_INTERNAL", IngotStatus::Internal),
            ("INGOT_DATA", IngotStatus::Data),
        ];
        for (name, status) in statuses {
            assert_eq!(constant(name), status as i32, "{name}");
        }
        let levels = [
            ("INGOT_LOG_ERROR", log::Level::Error),
            ("INGOT_LOG_WARNING", log::Level::Warn),
            ("INGOT_LOG_INFO", log::Level::Info),
            ("INGOT_LOG_DEBUG", log::Level::Debug),
            ("INGOT_LOG_TRACE", log::Level::Trace),
        ];
        for (name, level) in levels {
            assert_eq!(constant(name), level as i32, "{name}");
        }
        // The functions declared in the header's code (comments dropped) against the ones
        // this file exports.
        let code: String = header
            .split("/*")
            .enumerate()
            .map(|(i, chunk)| match i {
                0 => chunk,
                _ => chunk.split_once("*/").map_or("", |(_, after)| after),
            })
            .collect();
        let exports: String = source.lines().filter(|l| l.contains("extern \"C\" fn ")).collect();
        let declared = functions(&code);
        assert!(declared.contains("ingot_session_run") && declared.len() > 10);
        assert_eq!(declared, functions(&exports));
    }

    /// Every `ingot_name(` in `text`.
    fn functions(text: &str) -> std::collections::BTreeSet<&str> {
        let ident = |c: char| c.is_alphanumeric() || c == '_';
        text.match_indices("ingot_")
            .filter(|(i, _)| !text[..*i].ends_with(ident))
            .filter_map(|(i, _)| {
                let len = text[i..].find(|c: char| !ident(c))?;
                text[i + len..].starts_with('(').then(|| &text[i..i + len])
            })
            .collect()
    }
}
