//! Sessions: making one (with options), its inputs and outputs, running it, its placement.

use super::*;
use ingot_runtime::{TensorMut, TensorRef};

/// A session (`IngotSession`), with the C strings `IngotTensorInfo` points into.
pub struct IngotSession {
    pub(crate) session: Session,
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
pub(crate) enum Side {
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
        let mut options = match devices {
            Some(list) => SessionOptions::on(list).map_err(session_error)?,
            None => SessionOptions::default(),
        };
        options.variant = variant.map(str::to_string);
        *out = new_session(bundle, options)?;
        Ok(())
    })
}

/// Makes a session of `bundle` with `options` (NULL: the defaults). The options may be freed
/// or changed afterwards.
///
/// # Safety
/// `bundle` is NULL or a live bundle handle; `options` is NULL or a live options handle;
/// `out` is NULL or writable (see ingot.h).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_session_new_with_options(
    bundle: *const IngotBundle,
    options: *const IngotSessionOptions,
    out: *mut *mut IngotSession,
) -> IngotStatus {
    guard(|| {
        // SAFETY: the header asks for a writable `out`, a live `bundle` and live `options`,
        // each or NULL (only `options` may be).
        let (out, bundle, options) =
            unsafe { (out_ptr(out, "out")?, get(bundle, "bundle")?, options.as_ref()) };
        let options = options.map_or_else(SessionOptions::default, |o| o.0.clone());
        *out = new_session(bundle, options)?;
        Ok(())
    })
}

fn session_error(e: SessionError) -> Error {
    let status = match e {
        SessionError::Bundle(ingot_runtime::BundleError::CorruptWeight { .. }) => {
            IngotStatus::Bundle
        }
        _ => IngotStatus::Session,
    };
    Error::from_chain(status, &e)
}

/// A session handle of `bundle` made with `options`.
fn new_session(bundle: &IngotBundle, options: SessionOptions) -> Result<*mut IngotSession, Error> {
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
    Ok(Box::into_raw(Box::new(IngotSession { session, inputs, outputs })))
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
pub(crate) unsafe fn io_info(
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

/// Output `index` as the last run filled it: its info, with the dims and bytes the run wrote
/// where a dim depends on the data (otherwise the same as `ingot_session_output_info`).
///
/// # Safety
/// `session` is NULL or a live session handle; `info` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_session_output_result_info(
    session: *const IngotSession,
    index: usize,
    info: *mut IngotTensorInfo,
) -> IngotStatus {
    guard(|| {
        // SAFETY: forwarded from this function's contract.
        let (info, session) = unsafe { (get_mut(info, "info")?, get(session, "session")?) };
        let found = session.outputs.get(index).zip(session.session.output_shape(index));
        let (io, dims) = found.ok_or_else(|| {
            invalid(format!("index {index} is out of range ({} outputs)", session.outputs.len()))
        })?;
        *info = IngotTensorInfo {
            name: io.name.as_ptr(),
            dtype: io.desc.dtype.onnx_code(),
            rank: dims.len(),
            dims: dims.as_ptr(),
            bytes: dims.iter().product::<usize>() * io.desc.dtype.size(),
        };
        Ok(())
    })
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
        // SAFETY: forwarded from this function's contract.
        let (session, ins, outs) = unsafe {
            run_arguments(
                session,
                (inputs, input_bytes, input_count),
                (outputs, output_bytes, output_count),
            )
        }?;
        let tensors = (session.inputs.iter().zip(&ins))
            .map(|(io, b)| {
                // SAFETY: the header asks for `len` readable bytes at each input pointer
                // (non-null where len > 0, checked by `run_arguments`).
                let bytes = unsafe { slice(b.ptr, b.len, "input") }?;
                Tensor::from_bytes(io.desc.clone(), bytes).map_err(invalid)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let results = session.session.run(&tensors).map_err(run_error)?;
        for (result, b) in results.iter().zip(&outs) {
            if b.len > 0 {
                // SAFETY: non-null (checked by `run_arguments`), and the header asks for `len`
                // writable bytes there that no other live reference covers (the inputs were
                // copied).
                let buffer = unsafe { std::slice::from_raw_parts_mut(b.ptr.cast_mut(), b.len) };
                // A bounded output is its run's length: a prefix of the buffer.
                buffer[..result.bytes().len()].copy_from_slice(result.bytes());
            }
        }
        Ok(())
    })
}

/// A failed run as a status: what the caller passed, the data, or the devices.
fn run_error(e: SessionError) -> Error {
    let status = match e {
        SessionError::Data { .. } => IngotStatus::Data,
        SessionError::IoCount { .. }
        | SessionError::IoMismatch { .. }
        | SessionError::IoBytes { .. }
        | SessionError::Misaligned { .. } => IngotStatus::InvalidArgument,
        _ => IngotStatus::Run,
    };
    Error::from_chain(status, &e)
}

/// Runs the session reading the caller's input buffers and writing its output buffers in
/// place: nothing is copied and no tensor memory is allocated per run.
///
/// # Safety
/// As `ingot_session_run`; and each buffer is aligned to its element size, and no output
/// overlaps an input or another output (both checked, but a buffer must be valid for its
/// length).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_session_run_into(
    session: *mut IngotSession,
    inputs: *const *const c_void,
    input_bytes: *const usize,
    input_count: usize,
    outputs: *const *mut c_void,
    output_bytes: *const usize,
    output_count: usize,
) -> IngotStatus {
    guard(|| {
        // SAFETY: forwarded from this function's contract.
        let (session, ins, outs) = unsafe {
            run_arguments(
                session,
                (inputs, input_bytes, input_count),
                (outputs, output_bytes, output_count),
            )
        }?;
        // Rust may not hold a writable view of bytes that another view also covers.
        for (j, out) in outs.iter().enumerate() {
            if ins.iter().chain(&outs[..j]).any(|b| b.overlaps(out)) {
                let name = session.outputs[j].name.to_string_lossy();
                return Err(invalid(format!(
                    "output '{name}' overlaps an input or another output buffer"
                )));
            }
        }
        let ins: Vec<TensorRef> = (session.inputs.iter().zip(ins))
            .map(|(io, b)| {
                // SAFETY: the header asks for `len` readable bytes at each input pointer
                // (non-null where len > 0, checked by `run_arguments`), not written during the
                // call: no output overlaps it (checked above).
                let bytes = unsafe { slice(b.ptr, b.len, "input") }?;
                Ok(TensorRef { dtype: io.desc.dtype, shape: &io.desc.shape, bytes })
            })
            .collect::<Result<_, Error>>()?;
        let mut outs: Vec<TensorMut> = (session.outputs.iter().zip(outs))
            .map(|(io, b)| {
                let bytes: &mut [u8] = if b.len == 0 {
                    &mut []
                } else {
                    // SAFETY: non-null (checked by `run_arguments`), writable for `len` bytes by
                    // the header's contract, and overlapping no other view (checked above).
                    unsafe { std::slice::from_raw_parts_mut(b.ptr.cast_mut(), b.len) }
                };
                TensorMut { dtype: io.desc.dtype, shape: &io.desc.shape, bytes }
            })
            .collect();
        session.session.run_into(&ins, &mut outs).map_err(run_error)
    })
}

/// A caller's buffer: where it starts and how many bytes it has.
struct Buffer {
    ptr: *const u8,
    len: usize,
}

impl Buffer {
    fn overlaps(&self, other: &Buffer) -> bool {
        let (a, b) = (self.ptr as usize, other.ptr as usize);
        self.len > 0 && other.len > 0 && a < b + other.len && b < a + self.len
    }
}

/// An array of buffer pointers, their byte lengths, and the count, as the run calls take them.
type Buffers<P> = (*const P, *const usize, usize);

/// The arguments of a run: the session, and the caller's input and output buffers, checked
/// for count and byte length; a NULL buffer is an error unless it is empty.
///
/// # Safety
/// `session` is NULL or live and used by no other thread; each array is NULL or holds its
/// count of entries.
unsafe fn run_arguments<'a>(
    session: *mut IngotSession,
    inputs: Buffers<*const c_void>,
    outputs: Buffers<*mut c_void>,
) -> Result<(&'a mut IngotSession, Vec<Buffer>, Vec<Buffer>), Error> {
    // SAFETY: forwarded from this function's contract.
    let (session, input_ptrs, input_bytes, output_ptrs, output_bytes) = unsafe {
        (
            get_mut(session, "session")?,
            slice(inputs.0, inputs.2, "inputs")?,
            slice(inputs.1, inputs.2, "input_bytes")?,
            slice(outputs.0, outputs.2, "outputs")?,
            slice(outputs.1, outputs.2, "output_bytes")?,
        )
    };
    check_buffers("input", &session.inputs, inputs.2, input_bytes)?;
    check_buffers("output", &session.outputs, outputs.2, output_bytes)?;
    let side = |list: &[Io], pointers: Vec<*const u8>, bytes: &[usize], side: &str| {
        list.iter()
            .zip(pointers.into_iter().zip(bytes))
            .map(|(io, (ptr, &len))| {
                if ptr.is_null() && len > 0 {
                    let name = io.name.to_string_lossy();
                    return Err(invalid(format!("{side} '{name}' is NULL")));
                }
                Ok(Buffer { ptr, len })
            })
            .collect::<Result<Vec<_>, Error>>()
    };
    let ins =
        side(&session.inputs, input_ptrs.iter().map(|p| p.cast()).collect(), input_bytes, "input")?;
    let outs = side(
        &session.outputs,
        output_ptrs.iter().map(|p| p.cast_const().cast()).collect(),
        output_bytes,
        "output",
    )?;
    Ok((session, ins, outs))
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
