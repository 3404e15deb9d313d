//! The `ingot` command as a user meets it: the options of run, bench and plan, the errors that
//! name their fix, and a closed pipe. Runs `target/<profile>/ingot` (`cargo build -p
//! ingot-cli`); bad_input.rs covers malformed models and bundles.

use ingot_runtime::Tensor;
use ingot_schema::DType;
use ingot_tests::cli::{expect_clean_failure, expect_success, ingot};
use ingot_tests::data::{read_npy, write_npy};
use ingot_tests::model::OnnxModel;
use ingot_tests::paths::{generated, scratch_dir};
use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `ingot ARGS` succeeds; its stdout.
fn succeeds(args: &[&dyn AsRef<OsStr>]) -> String {
    let what = format!("ingot {}", display(args));
    let output = ingot(args.iter().map(|a| a.as_ref())).unwrap_or_else(|e| panic!("{e:#}"));
    expect_success(&what, &output).unwrap_or_else(|e| panic!("{e:#}"))
}

/// `ingot ARGS` fails cleanly, its message naming each of `mentions`; its stderr.
fn fails(args: &[&dyn AsRef<OsStr>], mentions: &[&str]) -> String {
    let what = format!("ingot {}", display(args));
    let output = ingot(args.iter().map(|a| a.as_ref())).unwrap_or_else(|e| panic!("{e:#}"));
    let stderr = expect_clean_failure(&what, &output).unwrap_or_else(|e| panic!("{e:#}"));
    for m in mentions {
        assert!(stderr.contains(m), "{what}: the error should mention {m:?}; it says: {stderr}");
    }
    stderr
}

fn display(args: &[&dyn AsRef<OsStr>]) -> String {
    args.iter().map(|a| a.as_ref().to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ")
}

/// `probs = Softmax(image * scale)` over [2, 3], and `picked = Gather(table, ids)`: a float
/// input, an integer input, and an op whose data can be out of range.
fn write_bundle(dir: &Path) -> PathBuf {
    let scale = Tensor::from_vec(vec![2, 3], &[0.5f32, -1.0, 2.0, -3.0, 0.25, 1.5]).unwrap();
    let table = Tensor::from_vec(vec![4, 2], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]).unwrap();
    let model = dir.join("model.onnx");
    OnnxModel::new(17)
        .input("image", DType::F32, &[2, 3])
        .input("ids", DType::I64, &[3])
        .initializer("scale", &scale)
        .initializer("table", &table)
        .node("scale", "Mul", &["image", "scale"], &["scaled"], vec![])
        .node("softmax", "Softmax", &["scaled"], &["probs"], vec![])
        .node("pick", "Gather", &["table", "ids"], &["picked"], vec![])
        .output("probs", DType::F32, &[2, 3])
        .output("picked", DType::F32, &[3, 2])
        .write(&model)
        .unwrap();
    let bundle = dir.join("model.ingot");
    succeeds(&[&"compile", &model, &"-o", &bundle]);
    bundle
}

#[test]
fn run_makes_saves_prints_and_checks_outputs() {
    let dir = scratch_dir("cli/run");
    let bundle = write_bundle(&dir);
    let first = dir.join("first");
    // Random inputs, saved beside the outputs; ids within the table's 4 rows.
    let report = succeeds(&[
        &"run",
        &bundle,
        &"--random-inputs",
        &"--seed",
        &"3",
        &"--int-range",
        &"0,3",
        &"--float-range",
        &"-1,1",
        &"--devices",
        &"cpu",
        &"-o",
        &first,
        &"--print",
    ]);
    let image = read_npy(&first.join("inputs/image.npy")).unwrap();
    let ids = read_npy(&first.join("inputs/ids.npy")).unwrap();
    assert!(image.as_slice::<f32>().unwrap().iter().all(|v| (-1.0..1.0).contains(v)));
    assert!(ids.as_slice::<i64>().unwrap().iter().all(|v| (0..=3).contains(v)));
    // --print: each output's values and argmax, computed here from the saved output.
    let probs = read_npy(&first.join("probs.npy")).unwrap();
    let p = probs.as_slice::<f32>().unwrap();
    let argmax = (0..p.len()).fold(0, |a, k| if p[k] > p[a] { k } else { a });
    assert!(report.contains(&format!("argmax {argmax}")), "{report}");
    assert!(report.contains(&format!("{:.6}", p[0])), "{report}");

    // The saved inputs, given back as files and as one .npz, match the saved outputs.
    let npz = dir.join("inputs.npz");
    write_npz(
        &npz,
        &[("image", &first.join("inputs/image.npy")), ("ids", &first.join("inputs/ids.npy"))],
    );
    let image_arg = format!("image={}", first.join("inputs/image.npy").display());
    let ids_arg = format!("ids={}", first.join("inputs/ids.npy").display());
    let again = succeeds(&[
        &"run",
        &bundle,
        &"--input",
        &image_arg,
        &"--input",
        &ids_arg,
        &"--devices",
        &"cpu",
        &"--expected",
        &first,
    ]);
    assert_eq!(again.matches(": ok").count(), 2, "{again}");
    // On lavapipe (named), with a pipeline cache file: it is written, the outputs still match.
    let cache = dir.join("pipelines.bin");
    let _ = std::fs::remove_file(&cache);
    let vulkan = succeeds(&[
        &"run",
        &bundle,
        &"--inputs",
        &npz,
        &"--expected",
        &first,
        &"--devices",
        &"vulkan:cpu",
        &"--pipeline-cache",
        &cache,
    ]);
    assert_eq!(vulkan.matches(": ok").count(), 2, "{vulkan}");
    assert!(cache.is_file(), "run --pipeline-cache wrote no {}", cache.display());
    let json = succeeds(&[&"run", &bundle, &"--inputs", &npz, &"--expected", &first, &"--json"]);
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    for output in json["outputs"].as_array().unwrap() {
        assert_eq!(output["comparison"]["mismatches"], 0, "{output}");
    }

    // An expected output off by more than the tolerance: a non-zero exit naming the output.
    let wrong = dir.join("wrong");
    std::fs::create_dir_all(&wrong).unwrap();
    std::fs::copy(first.join("picked.npy"), wrong.join("picked.npy")).unwrap();
    let mut off = p.to_vec();
    off[4] += 0.01;
    write_npy(&wrong.join("probs.npy"), &Tensor::from_vec(vec![2, 3], &off).unwrap()).unwrap();
    let output = ingot([
        "run".as_ref(),
        bundle.as_os_str(),
        "--inputs".as_ref(),
        npz.as_os_str(),
        "--expected".as_ref(),
        wrong.as_os_str(),
        "--devices".as_ref(),
        "cpu".as_ref(),
    ])
    .unwrap();
    let stderr = expect_clean_failure("run --expected (one output off)", &output).unwrap();
    assert!(stderr.contains("probs") && !stderr.contains("picked"), "{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("1 elements off, the worst at flat index 4"), "{stdout}");
    // A looser tolerance accepts it.
    succeeds(&[
        &"run",
        &bundle,
        &"--inputs",
        &npz,
        &"--expected",
        &wrong,
        &"--atol",
        &"0.02",
        &"--devices",
        &"cpu",
    ]);
}

/// Writes an uncompressed `.npz` (numpy's `savez`) of the given `.npy` files.
fn write_npz(path: &Path, members: &[(&str, &Path)]) {
    use std::io::Write;
    let mut zip = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let options =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, file) in members {
        zip.start_file(format!("{name}.npy"), options).unwrap();
        zip.write_all(&std::fs::read(file).unwrap()).unwrap();
    }
    zip.finish().unwrap();
}

#[test]
fn user_errors_name_their_fix() {
    let dir = scratch_dir("cli/errors");
    let bundle = write_bundle(&dir);
    let image = dir.join("image.npy");
    write_npy(&image, &Tensor::from_vec(vec![2, 3], &[0.5f32; 6]).unwrap()).unwrap();
    let image_arg = format!("image={}", image.display());

    // A wrong input name: the unknown one and the ones there are.
    let typo = format!("imgae={}", image.display());
    fails(&[&"run", &bundle, &"--input", &typo], &["no input 'imgae'", "image, ids"]);
    fails(&[&"run", &bundle, &"--input", &image_arg], &["'ids' is missing", "--random-inputs"]);
    // float64 for a float32 input; a shape the bundle was not compiled for.
    let wide = dir.join("wide.npy");
    write_npy(&wide, &Tensor::from_vec(vec![2, 3], &[0.5f64; 6]).unwrap()).unwrap();
    let wide_arg = format!("image={}", wide.display());
    fails(&[&"run", &bundle, &"--input", &wide_arg, &"--random-inputs"], &["cannot be used with"]);
    let ids = dir.join("ids.npy");
    write_npy(&ids, &Tensor::from_vec(vec![3], &[0i64, 1, 7]).unwrap()).unwrap();
    let ids_arg = format!("ids={}", ids.display());
    fails(
        &[&"run", &bundle, &"--input", &wide_arg, &"--input", &ids_arg],
        &["holds float64", "save it as float32", "astype(np.float32)"],
    );
    let tall = dir.join("tall.npy");
    write_npy(&tall, &Tensor::from_vec(vec![3, 2], &[0.5f32; 6]).unwrap()).unwrap();
    let tall_arg = format!("image={}", tall.display());
    fails(
        &[&"run", &bundle, &"--input", &tall_arg, &"--input", &ids_arg],
        &["shape 3x2", "compiled for 2x3", "--input-shape image=3x2"],
    );
    // Index 7 of a 4-row table: a data error, named with its step, not a device failure.
    let stderr = fails(
        &[&"run", &bundle, &"--input", &image_arg, &"--input", &ids_arg, &"--devices", &"cpu"],
        &["invalid input data", "'pick' (Gather)", "index 7 is out of range"],
    );
    assert!(!stderr.contains("no device in the list"), "{stderr}");
    // A directory where a bundle or model goes.
    for command in ["run", "inspect", "bench", "plan"] {
        fails(&[&command, &dir], &["is a directory"]);
    }
    // Counts that measure nothing.
    fails(&[&"bench", &bundle, &"--iterations", &"0"], &["--iterations"]);
    fails(&[&"bench", &bundle, &"--warmup", &"0"], &["--warmup"]);
    fails(&[&"plan", &bundle, &"--json", &"--format", &"svg"], &["cannot be used with"]);
    // A bundle's weights were stored when it was compiled.
    fails(&[&"plan", &bundle, &"--f16-weights"], &["--f16-weights apply to ONNX models"]);
}

/// `compile --f16-weights` stores a product's weight as float16, half its bytes, and the run
/// is the float32 one but for the weight's rounding.
#[test]
fn f16_weights_halve_a_products_weight() {
    let dir = scratch_dir("cli/f16_weights");
    let w: Vec<f32> = (0..64 * 32).map(|i| ((i * 37 % 101) as f32 - 50.0) / 33.0).collect();
    let model = dir.join("model.onnx");
    OnnxModel::new(17)
        .input("x", DType::F32, &[2, 64])
        .initializer("w", &Tensor::from_vec(vec![64, 32], &w).unwrap())
        .node("product", "MatMul", &["x", "w"], &["y"], vec![])
        .output("y", DType::F32, &[2, 32])
        .write(&model)
        .unwrap();
    let compiled = |name: &str, extra: &[&dyn AsRef<OsStr>]| {
        let bundle = dir.join(name);
        let mut args: Vec<&dyn AsRef<OsStr>> = vec![&"compile", &model, &"-o", &bundle, &"--json"];
        args.extend(extra);
        let json: serde_json::Value = serde_json::from_str(&succeeds(&args)).unwrap();
        (bundle, json["weight_bytes"].as_u64().unwrap())
    };
    let (full, full_bytes) = compiled("f32.ingot", &[]);
    let (half, half_bytes) = compiled("f16.ingot", &[&"--f16-weights"]);
    assert_eq!((full_bytes, half_bytes), (64 * 32 * 4, 64 * 32 * 2));
    let inspected = succeeds(&[&"inspect", &half]);
    assert!(inspected.contains("by type: f16 1 entries, 4096 bytes\n"), "{inspected}");
    let x = dir.join("x.npy");
    write_npy(&x, &Tensor::from_vec(vec![2, 64], &[0.25f32; 128]).unwrap()).unwrap();
    let x_arg = format!("x={}", x.display());
    let outputs = |bundle: &Path, out: &str| {
        let out = dir.join(out);
        succeeds(&[&"run", &bundle, &"--input", &x_arg, &"--devices", &"cpu", &"-o", &out]);
        read_npy(&out.join("y.npy")).unwrap().to_vec::<f32>().unwrap()
    };
    let (want, got) = (outputs(&full, "f32"), outputs(&half, "f16"));
    assert_ne!(got, want, "the weight's rounding shows");
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 2e-3 * w.abs().max(1.0), "{g} against {w}");
    }
}

#[test]
fn bench_json_reports_its_settings_and_distribution() {
    let dir = scratch_dir("cli/bench");
    let bundle = write_bundle(&dir);
    let report = dir.join("bench.json");
    let stdout = succeeds(&[
        &"bench",
        &bundle,
        &"--devices",
        &"cpu",
        &"--threads",
        &"1",
        &"--no-spin",
        &"--warmup",
        &"2",
        &"--iterations",
        &"5",
        &"--int-range",
        &"0,3",
        &"--json",
        &"-o",
        &report,
    ]);
    assert!(stdout.is_empty(), "-o writes the report to the file only: {stdout}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["schema_version"], 1);
    assert_eq!(r["devices"], serde_json::json!(["cpu"]));
    assert_eq!(r["device"], "cpu");
    assert_eq!((&r["threads"], &r["warmup"], &r["iterations"]), (&1.into(), &2.into(), &5.into()));
    assert_eq!((&r["kernel_class"], &r["spin"]), (&"auto".into(), &false.into()));
    assert_eq!(r["inputs"]["int_range"], serde_json::json!([0, 3]));
    let ms = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} missing: {r}"));
    assert!(ms("min_ms") <= ms("median_ms") && ms("median_ms") <= ms("p90_ms"));
    assert!(ms("p90_ms") <= ms("max_ms") && ms("min_ms") <= ms("mean_ms"));
    assert!(ms("mean_ms") <= ms("max_ms") && ms("stddev_ms") >= 0.0);
}

#[test]
fn every_printing_command_takes_json_and_an_output_file() {
    let dir = scratch_dir("cli/json");
    let bundle = write_bundle(&dir);
    let plan_json = succeeds(&[&"plan", &bundle, &"--json"]);
    assert_eq!(plan_json, succeeds(&[&"plan", &bundle, &"--format", &"json"]));
    let plan: serde_json::Value = serde_json::from_str(&plan_json).unwrap();
    assert!(plan["schema_version"].is_u64(), "{plan}");
    for (command, extra) in [("plan", None), ("inspect", None), ("inspect", Some("--kernels"))] {
        let file = dir.join(format!("{command}.out"));
        let mut args: Vec<&dyn AsRef<OsStr>> = vec![&command, &bundle];
        if let Some(extra) = &extra {
            args.push(extra);
        }
        let printed = succeeds(&args);
        args.extend([&"-o" as &dyn AsRef<OsStr>, &file]);
        assert_eq!(succeeds(&args), "", "{command} -o prints nothing");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), printed, "{command} -o");
        args.truncate(args.len() - 2);
        args.push(&"--json");
        let json = succeeds(&args);
        serde_json::from_str::<serde_json::Value>(&json)
            .unwrap_or_else(|e| panic!("{command} --json: {e}: {json}"));
    }
    let model = dir.join("model.onnx");
    let out = dir.join("again.ingot");
    let compiled = succeeds(&[&"compile", &model, &"-o", &out, &"--json"]);
    let compiled: serde_json::Value = serde_json::from_str(&compiled).unwrap();
    assert_eq!(compiled["bundle_bytes"], std::fs::metadata(&out).unwrap().len());
}

/// `ingot plan M --json | head -1`: the reader goes after one line, and ingot ends quietly
/// with success, as `cat` does, instead of panicking on the broken pipe.
#[test]
fn a_reader_that_closes_the_pipe_ends_the_command_quietly() {
    let model = generated("models/ch_PP-OCRv4_rec_infer.onnx").unwrap();
    let binary = ingot_tests::paths::ingot_binary().unwrap();
    let args = [
        "plan".as_ref(),
        model.as_os_str(),
        "--input-shape".as_ref(),
        "x=1x3x48x320".as_ref(),
        "--json".as_ref(),
    ];
    // The whole plan is larger than a pipe's buffer (64 KiB on Linux), so the writer is
    // still writing when the reader goes.
    let whole = Command::new(&binary).args(args).output().unwrap();
    assert!(whole.status.success() && whole.stdout.len() > 96 << 10, "{}", whole.stdout.len());
    let mut child = Command::new(&binary)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap(); // then closed
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success() && stderr.is_empty(), "{}: {stderr}", output.status);
}

/// `plan` binds `--constant-input` as `compile` does: an `If` on the bound input keeps only
/// its branch; without the binding both branches are planned, joined by a `Where`.
#[test]
fn plan_binds_constant_inputs_so_an_if_folds() {
    use ingot_tests::model::attr_graph;
    let dir = scratch_dir("cli/plan_constant_input");
    let branch = |op: &str| {
        OnnxModel::new(17).node(&format!("{op}_b"), op, &["x"], &["t"], vec![]).output(
            "t",
            DType::F32,
            &[2],
        )
    };
    let model = dir.join("if.onnx");
    OnnxModel::new(17)
        .input("x", DType::F32, &[2])
        .input("flag", DType::Bool, &[])
        .node(
            "if",
            "If",
            &["flag"],
            &["y"],
            vec![
                attr_graph("then_branch", &branch("Relu")),
                attr_graph("else_branch", &branch("Neg")),
            ],
        )
        .output("y", DType::F32, &[2])
        .write(&model)
        .unwrap();
    let flag = dir.join("flag.npy");
    write_npy(&flag, &Tensor::from_bools(Vec::<usize>::new(), &[true]).unwrap()).unwrap();
    let bound = format!("flag={}", flag.display());

    let folded = succeeds(&[&"plan", &model, &"--constant-input", &bound]);
    assert!(
        folded.contains("Relu") && !folded.contains("Neg") && !folded.contains("Where"),
        "{folded}"
    );
    let both = succeeds(&[&"plan", &model]);
    assert!(both.contains("Relu") && both.contains("Neg") && both.contains("Where"), "{both}");
    let bundle = write_bundle(&dir);
    fails(&[&"plan", &bundle, &"--constant-input", &bound], &["apply to ONNX models"]);
}

/// A sequence input is a tensor input per element, as `--input-sequence` gives them, and a
/// sequence output a tensor output per element; an absent optional input holds nothing.
#[test]
fn sequences_at_the_graph_edges_are_their_elements() {
    let dir = scratch_dir("cli/sequences");
    let model = dir.join("sequences.onnx");
    let zero = Tensor::from_vec(Vec::<usize>::new(), &[0i64]).unwrap();
    OnnxModel::new(18)
        .sequence_input("s", DType::F32, false)
        .input("t", DType::F32, &[2])
        .sequence_input("maybe", DType::F32, true)
        .initializer("zero", &zero)
        .node("insert", "SequenceInsert", &["s", "t", "zero"], &["longer"], vec![])
        .node("concat", "ConcatFromSequence", &["longer"], &["joined"], vec![])
        .node("has", "OptionalHasElement", &["maybe"], &["given"], vec![])
        .sequence_output("longer", DType::F32, false)
        .output("joined", DType::F32, &[5])
        .output("given", DType::Bool, &[])
        .write(&model)
        .unwrap();
    let bundle = dir.join("sequences.ingot");
    fails(&[&"compile", &model, &"-o", &bundle], &["--input-sequence s=DIMS,DIMS"]);
    fails(
        &[
            &"compile",
            &model,
            &"-o",
            &bundle,
            &"--input-sequence",
            &"s=1,2",
            &"--absent-input",
            &"t",
        ],
        &["--absent-input t", "not an optional input"],
    );
    let compiled = succeeds(&[
        &"compile",
        &model,
        &"-o",
        &bundle,
        &"--input-sequence",
        &"s=1,2",
        &"--absent-input",
        &"maybe",
    ]);
    assert!(compiled.contains("compiled"), "{compiled}");

    let write = |name: &str, values: &[f32]| {
        let path = dir.join(format!("{name}.npy"));
        write_npy(&path, &Tensor::from_vec(vec![values.len()], values).unwrap()).unwrap();
        format!("{name}={}", path.display())
    };
    let (s0, s1, t) = (write("s[0]", &[1.0]), write("s[1]", &[2.0, 3.0]), write("t", &[8.0, 9.0]));
    let out = dir.join("out");
    succeeds(&[
        &"run",
        &bundle,
        &"--devices",
        &"cpu",
        &"--input",
        &s0,
        &"--input",
        &s1,
        &"--input",
        &t,
        &"-o",
        &out,
    ]);
    // Files are named file-safe: `longer[0]` is longer_0_.npy.
    let read = |name: &str| read_npy(&out.join(format!("{name}.npy"))).unwrap();
    assert_eq!(read("longer_0_").to_vec::<f32>().unwrap(), [8.0, 9.0]);
    assert_eq!(read("longer_1_").to_vec::<f32>().unwrap(), [1.0]);
    assert_eq!(read("longer_2_").to_vec::<f32>().unwrap(), [2.0, 3.0]);
    assert_eq!(read("joined").to_vec::<f32>().unwrap(), [8.0, 9.0, 1.0, 2.0, 3.0]);
    assert_eq!(read("given").bytes(), [0]);
}
