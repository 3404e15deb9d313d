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
    let (name, dims) =
        unsafe { (CStr::from_ptr(input.name), std::slice::from_raw_parts(input.dims, input.rank)) };
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
        assert_error(status, IngotStatus::InvalidArgument, "index 1 is out of range (1 tensors)");
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
        let status = unsafe { ingot_session_new(bundle, devices.as_ptr(), variant, &mut session) };
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
    let section = |name: &str| {
        let opened = Bundle::from_bytes(good).unwrap();
        opened.sections().find(|s| s.0 == name).unwrap().1
    };
    let mut flipped = good.to_vec();
    flipped[section("manifest").start + 3] ^= 0x40;
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
    // A corrupt weight: found before its first use, when a session is made.
    let mut weight = good.to_vec();
    weight[section("weights").start + 3] ^= 0x40;
    let (status, bundle) = open_memory(&weight);
    assert_eq!(status, IngotStatus::Ok, "weights are checked at first use");
    let mut session = null_mut();
    // SAFETY: a live bundle, a device list, a writable out-parameter; the bundle freed once.
    let status = unsafe {
        let status = ingot_session_new(bundle, c"cpu".as_ptr(), null(), &mut session);
        ingot_bundle_free(bundle);
        status
    };
    assert_error(status, IngotStatus::Bundle, "bundle weight 0 (bytes 0..");
    assert!(session.is_null());
    let mut bundle = null_mut();
    // SAFETY: a NUL-terminated path and a writable out-parameter.
    let status = unsafe { ingot_bundle_open(c"/nonexistent/model.ingot".as_ptr(), &mut bundle) };
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
    // Every source file of the library but this one.
    let mut files: Vec<_> =
        std::fs::read_dir(dir.join("src")).unwrap().map(|e| e.unwrap().path()).collect();
    files.retain(|f| f.file_name().is_some_and(|n| n != "tests.rs"));
    files.sort();
    let source: String = files.iter().map(|f| std::fs::read_to_string(f).unwrap()).collect();
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

/// The test bundle's output for `input_values` through the Rust API on the CPU.
fn expected_output() -> Vec<u8> {
    let bundle = Arc::new(Bundle::from_bytes(bundle_bytes()).unwrap());
    let mut rust = Session::new(bundle, SessionOptions::on("cpu").unwrap()).unwrap();
    let x = Tensor::from_vec(vec![1, 3, 32, 32], &input_values(3 * 32 * 32 * 4)).unwrap();
    rust.run(&[x]).unwrap().remove(0).bytes().to_vec()
}

/// `ingot_session_run_into` on one input and one output buffer.
fn run_into(session: *mut IngotSession, input: &[u8], output: &mut [u8]) -> IngotStatus {
    let inputs = [input.as_ptr().cast::<c_void>()];
    let outputs = [output.as_mut_ptr().cast::<c_void>()];
    // SAFETY: one input readable and one output writable for the lengths passed.
    unsafe {
        ingot_session_run_into(
            session,
            inputs.as_ptr(),
            &input.len(),
            1,
            outputs.as_ptr(),
            &output.len(),
            1,
        )
    }
}

/// Output of a CPU session of `bundle` (freed here) on `input_values`, through run_into.
fn run_bundle(bundle: *mut IngotBundle) -> Vec<u8> {
    let mut session = null_mut();
    // SAFETY: a live bundle, freed once, after the session took its share.
    let status = unsafe {
        let status = ingot_session_new(bundle, c"cpu".as_ptr(), null(), &mut session);
        ingot_bundle_free(bundle);
        status
    };
    assert_eq!(status, IngotStatus::Ok, "{}", last_error());
    let input = input_values(3 * 32 * 32 * 4);
    let mut output = vec![0f32; info(session, Side::Output, 0).bytes / 4];
    let status =
        run_into(session, bytemuck::cast_slice(&input), bytemuck::cast_slice_mut(&mut output));
    assert_eq!(status, IngotStatus::Ok, "{}", last_error());
    // SAFETY: freed once.
    unsafe { ingot_session_free(session) };
    bytemuck::cast_slice(&output).to_vec()
}

#[test]
fn run_into_reads_and_writes_the_callers_buffers_in_place() {
    let session = session(c"cpu");
    let expected = expected_output();
    let input = input_values(3 * 32 * 32 * 4);
    let input_bytes: &[u8] = bytemuck::cast_slice(&input);
    // Output words: 4-aligned, with room to shift by a byte.
    let mut words = vec![0u32; expected.len() / 4 + 1];
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut words);
    assert_eq!(run_into(session, input_bytes, &mut bytes[..expected.len()]), IngotStatus::Ok);
    assert_eq!(&bytes[..expected.len()], expected, "run_into and the Rust API differ");

    let status = run_into(session, input_bytes, &mut bytes[1..expected.len() + 1]);
    assert_error(status, IngotStatus::InvalidArgument, "output 'logits' is not aligned to 4 bytes");
    let status = run_into(session, input_bytes, &mut bytes[..expected.len() - 4]);
    assert_error(status, IngotStatus::InvalidArgument, "needs");
    // An output over the input: refused before any byte is written.
    let mut shared = input.clone();
    let inputs = [shared.as_ptr().cast::<c_void>()];
    let outputs = [shared.as_mut_ptr().cast::<c_void>()];
    let (input_len, output_len) = (input_bytes.len(), expected.len());
    // SAFETY: both pointers cover `shared`, which is longer than either length (asserted).
    let status = unsafe {
        assert!(output_len <= input_len);
        ingot_session_run_into(
            session,
            inputs.as_ptr(),
            &input_len,
            1,
            outputs.as_ptr(),
            &output_len,
            1,
        )
    };
    assert_error(status, IngotStatus::InvalidArgument, "overlaps an input");
    assert_eq!(shared, input);
    // SAFETY: freed once.
    unsafe { ingot_session_free(session) };
}

#[test]
fn options_reach_the_session() {
    let (status, bundle) = open_memory(bundle_bytes());
    assert_eq!(status, IngotStatus::Ok);
    let mut options = null_mut();
    let mut session = null_mut();
    // SAFETY: live handles, NUL-terminated strings, writable out-parameters; each handle
    // freed once.
    unsafe {
        assert_eq!(ingot_session_options_new(&mut options), IngotStatus::Ok);
        assert_eq!(ingot_session_options_set_devices(options, c"cpu".as_ptr()), IngotStatus::Ok);
        let status = ingot_session_options_set_devices(options, c"gpu".as_ptr());
        assert_error(status, IngotStatus::Session, "unknown device 'gpu'");
        assert_eq!(ingot_session_options_set_threads(options, 3), IngotStatus::Ok);
        assert_eq!(ingot_session_options_set_spin(options, 0), IngotStatus::Ok);
        assert_eq!(ingot_session_options_set_variant(options, c"main".as_ptr()), IngotStatus::Ok);
        let cache = c"/tmp/ingot-pipelines.bin";
        let status = ingot_session_options_set_pipeline_cache(options, cache.as_ptr());
        assert_eq!(status, IngotStatus::Ok);
        assert_eq!(
            (*options).0.pipeline_cache.as_deref(),
            Some("/tmp/ingot-pipelines.bin".as_ref())
        );
        let status = ingot_session_new_with_options(bundle, options, &mut session);
        assert_eq!(status, IngotStatus::Ok, "{}", last_error());
        let made = &(*session).session;
        // The failed set_devices left "cpu".
        assert_eq!((made.device(), made.threads(), made.spin()), ("cpu".to_string(), 3, false));
        ingot_session_free(session);

        assert_eq!(ingot_session_options_set_variant(options, c"decode".as_ptr()), IngotStatus::Ok);
        let status = ingot_session_new_with_options(bundle, options, &mut session);
        assert_error(status, IngotStatus::Session, "no variant 'decode'");
        assert!(session.is_null());
        let status = ingot_session_options_set_threads(null_mut(), 1);
        assert_error(status, IngotStatus::InvalidArgument, "options is NULL");
        ingot_session_options_free(options);

        // NULL options: the defaults.
        let status = ingot_session_new_with_options(bundle, null(), &mut session);
        assert_eq!(status, IngotStatus::Ok, "{}", last_error());
        let made = &(*session).session;
        assert_eq!((made.threads(), made.spin()), (ingot_runtime::cpu::default_threads(), true));
        ingot_session_free(session);
        ingot_bundle_free(bundle);
    }
}

#[test]
fn a_session_runs_on_one_thread_after_another() {
    // Handles are plain addresses to C; they cross threads as such.
    let session = session(c"cpu") as usize;
    let expected = expected_output();
    let run_here = move || {
        let input = input_values(3 * 32 * 32 * 4);
        let mut output = vec![0f32; expected_output().len() / 4];
        let out = bytemuck::cast_slice_mut(&mut output);
        let status = run_into(session as *mut IngotSession, bytemuck::cast_slice(&input), out);
        assert_eq!(status, IngotStatus::Ok, "{}", last_error());
        bytemuck::cast_slice::<f32, u8>(&output).to_vec()
    };
    let first = std::thread::spawn(run_here).join().unwrap();
    let second = std::thread::spawn(run_here).join().unwrap();
    assert_eq!((first, second), (expected.clone(), expected.clone()));
    assert_eq!(run_here(), expected);
    // SAFETY: freed once, after the threads that used it ended.
    unsafe { ingot_session_free(session as *mut IngotSession) };
}

#[cfg(unix)]
#[test]
fn opens_a_bundle_inside_a_file_by_descriptor() {
    use std::os::fd::AsRawFd;
    let expected = expected_output();
    let bundle = bundle_bytes();
    let path = std::env::temp_dir().join(format!("ingot-capi-fd-{}.bin", std::process::id()));
    // At 4096 the bundle is mapped; at 4099 (4-aligned only, like an APK asset) it is read.
    for prefix in [4096, 4099] {
        let mut file = vec![0xa5u8; prefix];
        file.extend_from_slice(bundle);
        file.extend_from_slice(b"trailing bytes of another asset");
        std::fs::write(&path, &file).unwrap();
        let opened = std::fs::File::open(&path).unwrap();
        let (fd, len) = (opened.as_raw_fd(), bundle.len() as u64);
        let mut handle = null_mut();
        // SAFETY: an open descriptor and a writable out-parameter.
        let status = unsafe { ingot_bundle_open_fd(fd, prefix as u64, len, &mut handle) };
        assert_eq!(status, IngotStatus::Ok, "offset {prefix}: {}", last_error());
        // The caller's descriptor is still theirs, and its position was not moved.
        use std::io::Seek;
        assert_eq!((&opened).stream_position().unwrap(), 0);
        drop(opened);
        assert_eq!(run_bundle(handle), expected, "offset {prefix}");

        let opened = std::fs::File::open(&path).unwrap();
        let fd = opened.as_raw_fd();
        // SAFETY: as above.
        let status = unsafe { ingot_bundle_open_fd(fd, prefix as u64, len + 64, &mut handle) };
        assert_error(status, IngotStatus::Bundle, "past the end of the");
        assert!(handle.is_null());
        // SAFETY: as above.
        let status = unsafe { ingot_bundle_open_fd(fd, prefix as u64 + 64, len, &mut handle) };
        assert_error(status, IngotStatus::Bundle, "");
    }
    std::fs::remove_file(&path).unwrap();
    // SAFETY: a negative descriptor (refused) and a writable out-parameter.
    let status = unsafe { ingot_bundle_open_fd(-1, 0, 10, &mut null_mut()) };
    assert_error(status, IngotStatus::InvalidArgument, "fd -1 is not a file descriptor");
}

#[test]
fn borrowed_memory_is_used_in_place() {
    /// 64-byte blocks, so that a Vec of them starts 64-aligned.
    #[derive(Clone, Copy)]
    #[repr(C, align(64))]
    struct Block([u8; 64]);
    let bundle = bundle_bytes();
    let mut blocks = vec![Block([0; 64]); bundle.len().div_ceil(64) + 1];
    // SAFETY: `blocks` is plain bytes, `size_of_val` of them long.
    let bytes = unsafe {
        std::slice::from_raw_parts_mut(blocks.as_mut_ptr().cast::<u8>(), size_of_val(&blocks[..]))
    };
    bytes[..bundle.len()].copy_from_slice(bundle);
    let mut handle = null_mut();
    // SAFETY: readable for `bundle.len()` bytes that outlive the bundle and its session
    // (freed in `run_bundle`, before `blocks` drops).
    let status = unsafe {
        ingot_bundle_from_borrowed_memory(bytes.as_ptr().cast(), bundle.len(), &mut handle)
    };
    assert_eq!(status, IngotStatus::Ok, "{}", last_error());
    assert_eq!(run_bundle(handle), expected_output());

    bytes.copy_within(..bundle.len(), 8);
    // SAFETY: as above; the call fails, so nothing is kept.
    let status = unsafe {
        ingot_bundle_from_borrowed_memory(bytes[8..].as_ptr().cast(), bundle.len(), &mut handle)
    };
    assert_error(status, IngotStatus::Bundle, "not aligned to 64 bytes");
    assert!(handle.is_null());
}

#[test]
fn an_outputs_result_info_is_its_info_where_no_dim_depends_on_the_data() {
    let session = session(c"cpu");
    let declared = info(session, Side::Output, 0);
    let result_info = |index| {
        let mut got = IngotTensorInfo { name: null(), dtype: 0, rank: 0, dims: null(), bytes: 0 };
        // SAFETY: a live session and a writable info.
        let status = unsafe { ingot_session_output_result_info(session, index, &mut got) };
        (status, got)
    };
    let input = input_values(info(session, Side::Input, 0).bytes);
    let mut output = vec![0u8; declared.bytes];
    assert_eq!(run(session, &input, size_of_val(&input[..]), &mut output), IngotStatus::Ok);
    let (status, got) = result_info(0);
    assert_eq!(status, IngotStatus::Ok, "{}", last_error());
    // SAFETY: both dims arrays hold `rank` entries and live as long as the session.
    let dims = |i: &IngotTensorInfo| unsafe { std::slice::from_raw_parts(i.dims, i.rank) }.to_vec();
    assert_eq!(
        (got.dtype, got.bytes, dims(&got)),
        (declared.dtype, declared.bytes, dims(&declared))
    );
    assert_error(result_info(1).0, IngotStatus::InvalidArgument, "index 1 is out of range");
    // SAFETY: a live session, freed once.
    unsafe { ingot_session_free(session) };
}
