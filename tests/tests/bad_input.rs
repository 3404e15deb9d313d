//! Bad input gives a clear error, never a panic: through the library API and through the
//! `ingot` binary (non-zero exit, a message on stderr, no "panicked").
//!
//! The CLI half runs `target/<profile>/ingot`; build it with `cargo build -p ingot-cli`
//! (tools/test.sh builds every target first).

use anyhow::Result;
use ingot_runtime::{Bundle, Tensor};
use ingot_schema::DType;
use ingot_schema::container::{COMPATIBLE, Container, FORMAT_MAJOR, SectionKind};
use ingot_tests::cli::{expect_clean_failure, expect_success, ingot};
use ingot_tests::data::write_npy;
use ingot_tests::model::OnnxModel;
use ingot_tests::paths::scratch_dir;
use ingot_tests::{catch_panic, compile, run, session};
use std::fmt::Display;
use std::path::{Path, PathBuf};

const OPSET: i64 = 17;

/// `out = Relu(image + bias)`, image and out f32 [2, 3], bias an initializer (so the bundle has
/// weights).
fn base_model() -> OnnxModel {
    let bias = Tensor::from_vec(vec![2, 3], &[0.5f32, -1.0, 2.0, -3.0, 0.25, 1.5]).unwrap();
    OnnxModel::new(OPSET)
        .input("image", DType::F32, &[2, 3])
        .initializer("bias", &bias)
        .node("add_bias", "Add", &["image", "bias"], &["sum"], vec![])
        .node("relu", "Relu", &["sum"], &["out"], vec![])
        .output("out", DType::F32, &[2, 3])
}

/// Writes the base model into `dir`, compiles it with the library and writes the bundle too.
fn base_bundle(dir: &Path) -> (PathBuf, Vec<u8>) {
    let model = dir.join("model.onnx");
    base_model().write(&model).unwrap();
    let bundle = compile(&model, &[]).unwrap_or_else(|e| panic!("the base model: {e:#}"));
    let path = dir.join("model.ingot");
    std::fs::write(&path, &bundle).unwrap();
    (path, bundle)
}

/// The error of a library call that must fail without panicking; its message must be non-empty
/// and contain each of `mentions`.
fn lib_error<T, E: Display>(what: &str, f: impl FnOnce() -> Result<T, E>, mentions: &[&str]) {
    let message = match catch_panic(f) {
        Err(panic) => panic!("{what}: {panic}, instead of returning an error"),
        Ok(Ok(_)) => panic!("{what}: succeeded, expected an error"),
        Ok(Err(e)) => format!("{e:#}"), // with anyhow's causes
    };
    check_message(what, &message, mentions);
}

/// Runs `ingot ARGS` and checks that it fails cleanly, mentioning each of `mentions`.
fn cli_error(what: &str, args: &[&dyn AsRef<std::ffi::OsStr>], mentions: &[&str]) -> String {
    let output = ingot(args.iter().map(|a| a.as_ref())).unwrap_or_else(|e| panic!("{e:#}"));
    let stderr = expect_clean_failure(what, &output).unwrap_or_else(|e| panic!("{e:#}"));
    check_message(what, &stderr, mentions);
    stderr
}

fn check_message(what: &str, message: &str, mentions: &[&str]) {
    assert!(!message.trim().is_empty(), "{what}: empty error message");
    for m in mentions {
        assert!(message.contains(m), "{what}: the error should mention {m:?}; it says: {message}");
    }
}

/// Compiling `model` fails, by the library and by `ingot compile`, which writes no bundle.
fn compile_fails(dir: &Path, model: &Path, mentions: &[&str]) {
    lib_error("compile", || compile(model, &[]), mentions);
    let out = dir.join("out.ingot");
    cli_error("ingot compile", &[&"compile", &model, &"-o", &out], mentions);
    assert!(!out.exists(), "ingot compile failed but left {}", out.display());
}

/// Opening `bytes` as a bundle works (weights are checked at first use, not at open), but
/// making a session of it fails, on every device list, by the library and by `ingot run`;
/// `ingot inspect`, which checks every weight, fails too.
fn use_fails(dir: &Path, what: &str, bytes: &[u8], mentions: &[&str]) {
    let bundle = std::sync::Arc::new(Bundle::from_bytes(bytes).unwrap_or_else(|e| {
        panic!("{what}: the bundle should open (weights are checked at first use): {e}")
    }));
    for devices in ["cpu", "vulkan:cpu,cpu"] {
        let what = format!("{what}, a session on {devices}");
        let options = ingot_runtime::SessionOptions::on(devices).unwrap();
        lib_error(&what, || ingot_runtime::Session::new(bundle.clone(), options), mentions);
    }
    let path = dir.join("bad.ingot");
    std::fs::write(&path, bytes).unwrap();
    cli_error(&format!("ingot inspect ({what})"), &[&"inspect", &path], mentions);
    let run =
        [&"run" as &dyn AsRef<std::ffi::OsStr>, &path, &"--random-inputs", &"--devices", &"cpu"];
    cli_error(&format!("ingot run ({what})"), &run, mentions);
}

/// Opening `bytes` as a bundle fails, by the library and by `ingot inspect`.
fn open_fails(dir: &Path, what: &str, bytes: &[u8], mentions: &[&str]) {
    lib_error(what, || Bundle::from_bytes(bytes), mentions);
    let path = dir.join("bad.ingot");
    std::fs::write(&path, bytes).unwrap();
    cli_error(&format!("ingot inspect ({what})"), &[&"inspect", &path], mentions);
}

#[test]
fn truncated_onnx_file() {
    let dir = scratch_dir("bad_input/truncated_onnx");
    let bytes = base_model().to_bytes();
    for len in [bytes.len() / 2, bytes.len() - 1] {
        let model = dir.join(format!("truncated_{len}.onnx"));
        std::fs::write(&model, &bytes[..len]).unwrap();
        compile_fails(&dir, &model, &[]);
    }
}

#[test]
fn graph_with_a_cycle() {
    let dir = scratch_dir("bad_input/cycle");
    let model = dir.join("model.onnx");
    // a = image + b; b = Relu(a): a and b depend on each other.
    OnnxModel::new(OPSET)
        .input("image", DType::F32, &[2, 3])
        .node("add", "Add", &["image", "b"], &["a"], vec![])
        .node("relu", "Relu", &["a"], &["b"], vec![])
        .output("a", DType::F32, &[2, 3])
        .write(&model)
        .unwrap();
    compile_fails(&dir, &model, &["cycle"]);
}

#[test]
fn missing_initializer() {
    let dir = scratch_dir("bad_input/missing_initializer");
    let model = dir.join("model.onnx");
    OnnxModel::new(OPSET)
        .input("image", DType::F32, &[2, 3])
        .node("add_w", "Add", &["image", "w_missing"], &["out"], vec![])
        .output("out", DType::F32, &[2, 3])
        .write(&model)
        .unwrap();
    compile_fails(&dir, &model, &["w_missing"]);
}

#[test]
fn unsupported_op_names_node_and_op() {
    let dir = scratch_dir("bad_input/unsupported_op");
    let model = dir.join("model.onnx");
    OnnxModel::new(OPSET)
        .input("image", DType::F32, &[2, 3])
        .node("my_odd_node", "FrobnicateTensor", &["image"], &["out"], vec![])
        .output("out", DType::F32, &[2, 3])
        .write(&model)
        .unwrap();
    compile_fails(&dir, &model, &["my_odd_node", "FrobnicateTensor"]);
}

#[test]
fn run_input_of_wrong_shape_or_dtype() {
    let dir = scratch_dir("bad_input/wrong_input");
    let (bundle_path, bundle) = base_bundle(&dir);
    let out_dir = dir.join("outputs");

    // The right input works, through both paths.
    let good = Tensor::from_vec(vec![2, 3], &[1.0f32; 6]).unwrap();
    let mut s = session(&bundle).unwrap();
    run(&mut s, std::slice::from_ref(&good)).unwrap();
    let good_npy = dir.join("good.npy");
    write_npy(&good_npy, &good).unwrap();
    let arg = format!("image={}", good_npy.display());
    let output = ingot([
        "run".as_ref(),
        bundle_path.as_os_str(),
        "--input".as_ref(),
        arg.as_ref(),
        "--output-dir".as_ref(),
        out_dir.as_os_str(),
    ])
    .unwrap();
    expect_success("ingot run with the right input", &output).unwrap();

    let wrong = [
        ("wrong shape", Tensor::from_vec(vec![3, 2], &[1.0f32; 6]).unwrap()),
        ("wrong dtype", Tensor::from_vec(vec![2, 3], &[1i32; 6]).unwrap()),
        ("wrong rank", Tensor::from_vec(vec![6], &[1.0f32; 6]).unwrap()),
    ];
    for (what, input) in wrong {
        lib_error(what, || s.run(std::slice::from_ref(&input)), &["image"]);
        let npy = dir.join(format!("{}.npy", what.replace(' ', "_")));
        write_npy(&npy, &input).unwrap();
        let arg = format!("image={}", npy.display());
        cli_error(
            &format!("ingot run ({what})"),
            &[&"run", &bundle_path, &"--input", &arg, &"--output-dir", &out_dir],
            &["image"],
        );
    }
    lib_error("no inputs", || s.run(&[]), &["image"]);
    lib_error("two inputs", || s.run(&[good.clone(), good.clone()]), &[]);
}

#[test]
fn truncated_bundle() {
    let dir = scratch_dir("bad_input/truncated_bundle");
    let (_, bundle) = base_bundle(&dir);
    for len in [0, 8, 63, 64, 100, bundle.len() / 2, bundle.len() - 1] {
        open_fails(&dir, &format!("bundle cut to {len} bytes"), &bundle[..len], &[]);
    }
}

#[test]
fn one_flipped_byte_in_each_section() {
    let dir = scratch_dir("bad_input/flipped_byte");
    let (_, bundle) = base_bundle(&dir);
    let container = Container::parse(&bundle).unwrap();
    let mut places = vec![("header".to_string(), 20, ""), ("section table".to_string(), 72, "")];
    for s in &container.sections {
        if !s.range.is_empty() && s.kind != SectionKind::Weights {
            let at = s.range.start + s.range.len() / 2;
            places.push((format!("{} section", s.kind.name()), at, s.kind.name()));
        }
    }
    assert!(places.len() >= 3, "expected a manifest section: {container:?}");
    for (what, at, mention) in places {
        let mut bad = bundle.clone();
        bad[at] ^= 0x10;
        let mentions: &[&str] = if mention.is_empty() { &[] } else { &[mention] };
        open_fails(&dir, &format!("byte {at} flipped ({what})"), &bad, mentions);
    }
    // A weight's byte: refused before the weight is used, by its own checksum.
    let weights = container.section(SectionKind::Weights).expect("a weights section");
    let at = weights.range.start + 5;
    let mut bad = bundle.clone();
    bad[at] ^= 0x10;
    use_fails(&dir, &format!("byte {at} flipped (weight 0)"), &bad, &["weight 0", "corrupt"]);
}

/// A bundle of format 2.0, before weights had checksums of their own: its whole weights
/// section is checked at open, as then.
#[test]
fn a_format_2_0_bundle_has_its_weights_checked_at_open() {
    let dir = scratch_dir("bad_input/format_2_0");
    let (_, bundle) = base_bundle(&dir);
    let mut old = bundle.clone();
    old[10..12].copy_from_slice(&0u16.to_le_bytes());
    let crc = crc32fast::hash(&old[0..60]);
    old[60..64].copy_from_slice(&crc.to_le_bytes());
    let opened = Bundle::from_bytes(&old).expect("a valid 2.0 bundle opens");
    assert_eq!(opened.format_version(), (COMPATIBLE.0, 0));
    let weights =
        Container::parse(&old).unwrap().section(SectionKind::Weights).unwrap().range.clone();
    old[weights.start + 5] ^= 0x10;
    open_fails(
        &dir,
        "a 2.0 bundle with a flipped weight byte",
        &old,
        &["weights section", "corrupt"],
    );
}

#[test]
fn bundle_of_a_future_major_version() {
    let dir = scratch_dir("bad_input/future_version");
    let (_, bundle) = base_bundle(&dir);
    let mut future = bundle.clone();
    let major = FORMAT_MAJOR + 1;
    future[8..10].copy_from_slice(&major.to_le_bytes());
    // A consistent header, so the version is what is wrong (it is checked first anyway).
    let crc = crc32fast::hash(&future[0..60]);
    future[60..64].copy_from_slice(&crc.to_le_bytes());
    // The base bundle has no run-time loop: it is written as the oldest format that holds it.
    let version = format!("{major}.{}", COMPATIBLE.1);
    open_fails(&dir, "a future major version", &future, &[&version]);
}
