//! The C example (capi/examples/run_bundle.c, built and run by capi/run_example.sh on the
//! PP-OCR direction classifier) gives the Rust API's outputs: bit for bit on the CPU, within
//! a tolerance on `vulkan:cpu,cpu` (Vulkan on lavapipe, named: `vulkan` picks GPUs only), with
//! the same placement report, which also reaches its log callback. The example opens the
//! bundle three ways (mapped, by file descriptor, copied from memory), sets session options
//! and runs in place on two threads in turn.
//!
//! Data: `target/models/` and `target/references/`, made by `bash tools/setup.sh`. Needs a C
//! compiler (`cc`).

use ingot_runtime::{Bundle, Session, SessionOptions, Tensor, TensorDesc};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

const INPUT: &str = "references/ch_ppocr_mobile_v2.0_cls_infer/1x3x48x192/input_0.npy";

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// The data bytes of a little-endian, C-order .npy file holding `desc` (version 1 to 3
/// headers; the dtype and shape are checked against the header's text).
fn read_npy(path: &Path, desc: &TensorDesc) -> Vec<u8> {
    let file = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&file[..6], b"\x93NUMPY", "{}", path.display());
    let (len, start) = match file[6] {
        1 => (u16::from_le_bytes([file[8], file[9]]) as usize, 10),
        _ => (u32::from_le_bytes([file[8], file[9], file[10], file[11]]) as usize, 12),
    };
    let header = std::str::from_utf8(&file[start..start + len]).unwrap();
    assert!(header.contains("'descr': '<f4'"), "{header}");
    let dims: Vec<String> = desc.shape.iter().map(usize::to_string).collect();
    assert!(header.contains(&format!("'shape': ({})", dims.join(", "))), "{header}");
    assert!(header.contains("'fortran_order': False"), "{header}");
    let data = file[start + len..].to_vec();
    assert_eq!(data.len(), desc.bytes(), "{}", path.display());
    data
}

/// Runs the C example on `devices` with `options` into its own directory; returns its stdout,
/// its stderr and output 0.
fn run_c_example(devices: &str, options: &[&str]) -> (String, String, PathBuf) {
    let name = format!("{devices}{}", options.first().copied().unwrap_or(""));
    let out = target_dir().join(format!("capi/out-{}", name.replace([',', ':', ' '], "-")));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("run_example.sh");
    let mut command = Command::new("bash");
    command.arg(&script).arg(devices).arg(&out).args(options);
    let _ = std::fs::remove_file(out.join("output_0.npy"));
    let result = command.output().expect("bash runs");
    let stdout = String::from_utf8_lossy(&result.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&result.stderr).into_owned();
    assert!(result.status.success(), "run_example.sh {devices} failed:\n{stdout}\n{stderr}");
    (stdout, stderr, out.join("output_0.npy"))
}

#[test]
fn c_example_matches_the_rust_api() {
    // Mapped, through a file descriptor on one thread, and copied into memory on lavapipe
    // with a pipeline cache file.
    let cache = target_dir().join("capi/pipelines.bin");
    let _ = std::fs::remove_file(&cache);
    let cache_arg = cache.to_str().expect("a UTF-8 target path");
    let cases: [(&str, &[&str], f32); 3] = [
        ("cpu", &[], 0.0),
        ("cpu", &["--from-fd", "--threads", "1"], 0.0),
        ("vulkan:cpu,cpu", &["--from-memory", "--pipeline-cache", cache_arg], 1e-5),
    ];
    for (devices, options, tolerance) in cases {
        let (stdout, stderr, c_output) = run_c_example(devices, options);
        if options.contains(&cache_arg) {
            assert!(cache.is_file(), "no pipeline cache at {}", cache.display());
        }
        print!("== run_example.sh {devices} {options:?}\n{stdout}");
        assert!(stdout.contains("ran twice in place"), "{stdout}");

        let bundle = Arc::new(Bundle::open(target_dir().join("capi/cls.ingot")).unwrap());
        let mut session = Session::new(bundle, SessionOptions::on(devices).unwrap()).unwrap();
        let placement = session.placement().to_string();
        assert!(stdout.contains(&placement), "the C example's placement differs:\n{placement}");
        // The same lines reached its log callback, one record each.
        for line in placement.lines() {
            let record = format!("run_bundle: info: {line}\n");
            assert!(stderr.contains(&record), "no log record '{record}' in:\n{stderr}");
        }
        let desc = session.inputs()[0].desc.clone();
        let x = read_npy(&target_dir().join(INPUT), &desc);
        let expected = session.run(&[Tensor::from_bytes(desc, &x).unwrap()]).unwrap();
        let expected = &expected[0];
        let got = read_npy(&c_output, expected.desc());

        if tolerance == 0.0 {
            assert_eq!(got, expected.bytes(), "{devices}: C and Rust outputs differ");
        } else {
            let got = Tensor::from_bytes(expected.desc().clone(), &got).unwrap();
            let pairs =
                got.as_slice::<f32>().unwrap().iter().zip(expected.as_slice::<f32>().unwrap());
            for (i, (c, rust)) in pairs.enumerate() {
                assert!(
                    (c - rust).abs() <= tolerance,
                    "{devices}: element {i}: C {c}, Rust {rust}"
                );
            }
        }
    }
}
