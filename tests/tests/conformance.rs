//! ONNX's backend test suites, compiled and run on the CPU and on Vulkan.
//!
//! Data: `target/onnx-tests/<suite>/<test>/{model.onnx, test_data_set_*/}`, made by
//! `bash tools/setup.sh` (tools/gen_onnx_tests.py). Each test compiles `model.onnx`, runs every
//! data set and compares each output with ONNX's expected one using ONNX's own runner rule
//! (numpy `assert_allclose`, rtol 1e-3, atol 1e-7, or the test's `data.json`); an output the
//! test gives in bfloat16, which Ingot returns as f32, is rounded to bfloat16 first and, as
//! ONNX's runner does, compared at rtol 2^-6 or more (two bfloat16 ulps). Inputs that
//! feed operand slots Ingot needs constant (shapes, axes, pads, scales: [`OPERANDS`]), directly
//! or through what is computed from them, are bound at compile time from the data set, as
//! `ingot compile --constant-input` does.
//!
//! Expected failures: `tests/expected-failures/all.txt` for tests that fail the same way on
//! every backend, and `{cpu,vulkan}.txt` for the ones that fail on one backend only; one
//! `test_name  # reason` a line, the reason the full first line of the error (and the line after
//! it where it ends with ':'). A listed test
//! that fails is fine; an unlisted failure or a listed test that passes fails the suite. Every
//! test runs; the summary and the failures are printed at the end. On Vulkan a message of the validation layer fails the test, and no
//! Vulkan device fails every test. The unfiltered node suite on Vulkan also checks the registry:
//! an op that promises Vulkan kernels (no `cpu_only`) must get one in some node test.
//!
//! Environment:
//! - `INGOT_TEST_FILTER=substring[,substring..]`: run only tests whose name contains one of
//!   them, printing each result with its full error (`INGOT_TEST_FILTER=test_conv cargo test -p ingot-tests --test
//!   conformance -- --nocapture`; add `vulkan` after `--nocapture` for the Vulkan suites only);
//! - `INGOT_UPDATE_EXPECTED_FAILURES=1`: rewrite the lists from this run's results instead of
//!   failing (new failures are added to the backend's list with their first error line as the
//!   reason, passing tests are removed; a test of `all.txt` that passes moves to the other
//!   backends' lists, and a test every backend lists moves to `all.txt`); review the diff
//!   before committing it.

use anyhow::{Context, Result, anyhow, bail};
use ingot_compiler::CompileOptions;
use ingot_tests::data::{Declared, Value, numbered_files, read_value_pb};
use ingot_tests::paths::{generated, repo_root};
use ingot_tests::{
    Tolerance, allclose, catch_panic, check_validation, run, session, session_on, validation_seen,
    vulkan,
};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

/// What the suites compile with as `--max-loop-iterations`: the storage planned for the scan
/// outputs of a `Loop` whose trip count is an input (test_loop11, the expanded Range tests). A
/// user gives the most their model runs; these tests run a few iterations, and a run past the
/// bound would fail the test with the runtime's error.
const MAX_LOOP_ITERATIONS: usize = 1024;

/// Ops whose registry entry promises Vulkan kernels (no `cpu_only`) although the node tests
/// give none of their steps one, each with why.
const VULKAN_UNEXERCISED: &[(&str, &str)] = &[];

const SUITES: [&str; 5] = ["node", "pytorch-converted", "pytorch-operator", "light", "simple"];
/// ONNX's runner defaults (onnx/backend/test/case/node and loader: rtol 1e-3, atol 1e-7).
const DEFAULT_TOLERANCE: Tolerance = Tolerance::new(1e-3, 1e-7);
/// ONNX's runner compares a bfloat16 output at no less than this rtol, two bfloat16 ulps
/// (onnx/backend/test/runner `assert_similar_outputs`): a backend that computes in f32 and a
/// reference that rounds every intermediate to bfloat16 differ by that much.
const BF16_MIN_RTOL: f64 = 1.0 / 64.0;
/// Without a filter, at most this many failures are listed one by one.
const MAX_LISTED: usize = 200;

/// Where a suite runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Cpu,
    Vulkan,
}

const BACKENDS: [Backend; 2] = [Backend::Cpu, Backend::Vulkan];

/// The list of tests that fail the same way on every backend.
const ALL_BACKENDS_LIST: &str = "tests/expected-failures/all.txt";

impl Backend {
    /// The list of tests that fail on this backend only.
    fn expected_failures(self) -> &'static str {
        match self {
            Backend::Cpu => "tests/expected-failures/cpu.txt",
            Backend::Vulkan => "tests/expected-failures/vulkan.txt",
        }
    }
}

mod cpu {
    use super::*;

    #[test]
    fn node() {
        suite("node", Backend::Cpu);
    }

    #[test]
    fn pytorch_converted() {
        suite("pytorch-converted", Backend::Cpu);
    }

    #[test]
    fn pytorch_operator() {
        suite("pytorch-operator", Backend::Cpu);
    }

    #[test]
    fn light() {
        suite("light", Backend::Cpu);
    }

    #[test]
    fn simple() {
        suite("simple", Backend::Cpu);
    }
}

mod vulkan {
    use super::*;

    #[test]
    fn node() {
        suite("node", Backend::Vulkan);
    }

    #[test]
    fn pytorch_converted() {
        suite("pytorch-converted", Backend::Vulkan);
    }

    #[test]
    fn pytorch_operator() {
        suite("pytorch-operator", Backend::Vulkan);
    }

    #[test]
    fn light() {
        suite("light", Backend::Vulkan);
    }

    #[test]
    fn simple() {
        suite("simple", Backend::Vulkan);
    }
}

/// Every entry of each expected-failures list names a test that exists, so stale entries (a
/// renamed or removed test) do not linger.
#[test]
fn expected_failures_name_existing_tests() {
    let mut known = std::collections::HashSet::new();
    for suite in SUITES {
        let dir = generated(&format!("onnx-tests/{suite}")).unwrap_or_else(|e| panic!("{e:#}"));
        known.extend(test_dirs(&dir).into_iter().map(|(name, _)| name));
    }
    let lists = [ALL_BACKENDS_LIST].into_iter().chain(BACKENDS.map(Backend::expected_failures));
    for path in lists {
        let list = List::load(path).unwrap_or_else(|e| panic!("{e:#}"));
        let stale: Vec<&String> = list.0.keys().filter(|n| !known.contains(*n)).collect();
        assert!(stale.is_empty(), "{path} lists tests that do not exist; remove them: {stale:?}");
    }
    // Loading checks that no test is in all.txt and a backend's list both.
    for backend in BACKENDS {
        ExpectedFailures::load(backend).unwrap_or_else(|e| panic!("{e:#}"));
    }
}

fn suite(suite: &str, backend: Backend) {
    let dir = generated(&format!("onnx-tests/{suite}")).unwrap_or_else(|e| panic!("{e:#}"));
    let expected = ExpectedFailures::load(backend).unwrap_or_else(|e| panic!("{e:#}"));
    let filter = std::env::var("INGOT_TEST_FILTER").ok().filter(|f| !f.is_empty());
    let update = std::env::var_os("INGOT_UPDATE_EXPECTED_FAILURES").is_some_and(|v| v == "1");

    let start = Instant::now();
    let mut results = Vec::new();
    // Per op of the steps the tests compiled: whether one of them got a Vulkan kernel.
    let mut kernels = BTreeMap::<String, bool>::new();
    for (name, test_dir) in test_dirs(&dir) {
        if filter.as_ref().is_some_and(|f| !f.split(',').any(|part| name.contains(part))) {
            continue;
        }
        let mut steps = Vec::new();
        let outcome = match catch_panic(|| run_test(&test_dir, backend, &mut steps)) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("{e:#}")),
            Err(panic) => Err(panic),
        }
        // Paths inside the test dir read better (and list better) without the dir.
        .map_err(|e| e.replace(&format!("{}/", test_dir.display()), ""));
        for (op, vulkan) in steps {
            *kernels.entry(op).or_default() |= vulkan;
        }
        if filter.is_some() {
            match (&outcome, expected.reason(&name)) {
                (Ok(()), None) => println!("PASS {name}"),
                (Ok(()), Some(_)) => println!("PASS {name} (listed as an expected failure)"),
                (Err(e), Some(_)) => println!("FAIL {name} (expected): {e}"),
                (Err(e), None) => println!("FAIL {name}: {e}"),
            }
        }
        results.push((name, outcome));
    }

    let title = format!("{suite} on {backend:?}");
    let report = Report::new(&title, backend.expected_failures(), &results, &expected);
    let mut summary = report.render(filter.is_none(), start.elapsed().as_secs_f64());
    let claims = match (backend, suite, &filter) {
        (Backend::Vulkan, "node", None) => vulkan_claims(&kernels),
        _ => Ok(()),
    };
    if let Err(e) = &claims {
        summary.push_str(e);
    }
    if update {
        println!("{summary}");
        expected.update(&results).unwrap_or_else(|e| panic!("{e:#}"));
        println!("updated {} from this run", backend.expected_failures());
    } else if report.ok() && claims.is_ok() {
        println!("{summary}");
    } else {
        panic!("{summary}");
    }
}

/// Input slots that ONNX ops read as operands (shapes, axes, pads, scales, bounds...) and that
/// Ingot, compiling static graphs, needs constant. The node tests feed them as graph inputs;
/// the harness binds their values at compile time, as a user does with `--constant-input`.
const OPERANDS: &[(&str, &[usize])] = &[
    ("AffineGrid", &[1]),
    ("BlackmanWindow", &[0]),
    ("CenterCropPad", &[1]),
    ("Clip", &[1, 2]),
    ("Col2Im", &[1, 2]),
    ("ConstantOfShape", &[0]),
    ("CumProd", &[1]),
    ("CumSum", &[1]),
    ("DFT", &[1, 2]),
    ("Dropout", &[1, 2]),
    ("Expand", &[1]),
    ("HammingWindow", &[0]),
    ("HannWindow", &[0]),
    ("MaxUnpool", &[2]),
    ("MelWeightMatrix", &[0, 1, 2, 3, 4]),
    ("OneHot", &[1]),
    ("Pad", &[1, 2, 3]),
    ("Range", &[0, 1, 2]),
    ("ReduceL1", &[1]),
    ("ReduceL2", &[1]),
    ("ReduceLogSum", &[1]),
    ("ReduceLogSumExp", &[1]),
    ("ReduceMax", &[1]),
    ("ReduceMean", &[1]),
    ("ReduceMin", &[1]),
    ("ReduceProd", &[1]),
    ("ReduceSum", &[1]),
    ("ReduceSumSquare", &[1]),
    ("Reshape", &[1]),
    ("Resize", &[1, 2, 3]),
    ("SequenceAt", &[1]),
    ("SequenceErase", &[1]),
    ("SequenceInsert", &[2]),
    ("Slice", &[1, 2, 3, 4]),
    ("Split", &[1]),
    ("SplitToSequence", &[1]),
    ("STFT", &[1, 3]),
    ("Squeeze", &[1]),
    ("Tile", &[1]),
    ("Trilu", &[1]),
    ("Unsqueeze", &[1]),
    ("Upsample", &[1]),
];

/// A runtime input of a test's model: its name, what it is declared to be, and whether the
/// harness binds it at compile time.
struct RuntimeInput {
    name: String,
    declared: Declared,
    bound: bool,
}

/// The model's runtime inputs (graph inputs that are not initializers), in order, and what
/// its outputs are declared to be. An input is bound at compile time where it sets a shape:
/// it is read by an operand slot of [`OPERANDS`] or reaches one through what is computed from
/// it (an expanded window function's length, cast and offset before it becomes a Range's
/// limit), or it is an `If`'s condition or a `Loop`'s trip count or condition where that
/// node takes or gives a sequence or optional, whose elements a static graph must know.
/// Reading its shape alone (Shape, Size) sets none.
fn runtime_io(model: &Path) -> Result<(Vec<RuntimeInput>, Vec<Declared>)> {
    use onnx_protobuf::type_proto::Value as Type;
    use protobuf::Message;
    let bytes = std::fs::read(model).with_context(|| model.display().to_string())?;
    let m = onnx_protobuf::ModelProto::parse_from_bytes(&bytes)?;
    let g = m.graph.as_ref().context("model has no graph")?;
    let initializers: std::collections::BTreeSet<&str> =
        g.initializer.iter().map(|t| t.name.as_str()).collect();
    let declared =
        |vi: &onnx_protobuf::ValueInfoProto| match vi.type_.as_ref().and_then(|t| t.value.as_ref())
        {
            Some(Type::SequenceType(_)) => Declared::Sequence,
            Some(Type::OptionalType(_)) => Declared::Optional,
            _ => Declared::Tensor,
        };
    let containers: std::collections::BTreeSet<&str> = (g.input.iter())
        .chain(&g.output)
        .chain(&g.value_info)
        .filter(|vi| declared(vi) != Declared::Tensor)
        .map(|vi| vi.name.as_str())
        .collect();
    let is_operand = |n: &onnx_protobuf::NodeProto, k: usize| {
        let op = n.op_type.as_str();
        let holds = || n.input.iter().chain(&n.output).any(|v| containers.contains(v.as_str()));
        OPERANDS.iter().any(|(o, slots)| *o == op && slots.contains(&k))
            || (op == "If" && k == 0 && holds())
            || (op == "Loop" && k < 2 && holds())
    };
    // Whether `input` sets a shape: a walk over what is computed from it (each value once),
    // until a use is an operand slot; reading a shape alone (Shape, Size) goes no further.
    let sets_shape = |input: &str| {
        let mut seen = std::collections::BTreeSet::from([input]);
        let mut next = vec![input];
        while let Some(v) = next.pop() {
            for n in &g.node {
                for (k, _) in n.input.iter().enumerate().filter(|(_, x)| *x == v) {
                    if is_operand(n, k) {
                        return true;
                    }
                    if !matches!(n.op_type.as_str(), "Shape" | "Size") {
                        next.extend(n.output.iter().map(String::as_str).filter(|o| seen.insert(o)));
                    }
                }
            }
        }
        false
    };
    let inputs = g
        .input
        .iter()
        .filter(|i| !initializers.contains(i.name.as_str()))
        .map(|i| RuntimeInput {
            name: i.name.clone(),
            declared: declared(i),
            bound: sets_shape(&i.name),
        })
        .collect();
    Ok((inputs, g.output.iter().map(declared).collect()))
}

/// Checks the registry's Vulkan claims against what the node tests compiled (`kernels`: per op,
/// whether one of its steps got a Vulkan kernel): an op without `cpu_only` that some test
/// compiled must have had a kernel at least once, unless [`VULKAN_UNEXERCISED`] says why
/// not; and every entry there must still be needed.
fn vulkan_claims(kernels: &BTreeMap<String, bool>) -> Result<(), String> {
    let claims = |op: &str| ingot_ops::lookup(op).is_some_and(|o| o.vulkan().is_ok());
    let listed = |op: &str| VULKAN_UNEXERCISED.iter().any(|(o, _)| *o == op);
    let unbacked: Vec<&str> = kernels
        .iter()
        .filter(|&(op, &kernel)| !kernel && claims(op) && !listed(op))
        .map(|(op, _)| op.as_str())
        .collect();
    let stale: Vec<&str> = VULKAN_UNEXERCISED
        .iter()
        .map(|(op, _)| *op)
        .filter(|op| kernels.get(*op).is_none_or(|&k| k) || !claims(op))
        .collect();
    let mut e = String::new();
    if !unbacked.is_empty() {
        let _ = writeln!(
            e,
            "\nops that promise Vulkan kernels (no cpu_only) but got none in any node test: \
             {unbacked:?}; mark them cpu_only(why), or list them in VULKAN_UNEXERCISED with why"
        );
    }
    if !stale.is_empty() {
        let _ = writeln!(e, "\nVULKAN_UNEXERCISED entries no longer needed: {stale:?}");
    }
    if e.is_empty() { Ok(()) } else { Err(e) }
}

/// Compiles a test's model and checks every data set (compiling once per data set when
/// operand inputs are bound, since their values are part of the compiled graph). Adds the op
/// of every step compiled to `steps`, with whether it got a Vulkan kernel.
fn run_test(dir: &Path, backend: Backend, steps: &mut Vec<(String, bool)>) -> Result<()> {
    let tolerance = tolerance(dir)?;
    let model = dir.join("model.onnx");
    let (inputs_info, outputs_declared) = runtime_io(&model)?;
    let data_sets = sorted_entries(dir)
        .into_iter()
        .filter(|p| file_name(p).starts_with("test_data_set_"))
        .collect::<Vec<_>>();
    if data_sets.is_empty() {
        bail!("{} has no test_data_set_* dir", dir.display());
    }
    for data_set in data_sets {
        let set = file_name(&data_set);
        let read = |prefix, declared: &[Declared]| -> Result<Vec<Value>> {
            let files = numbered_files(&data_set, prefix, "pb");
            let kind = |k: usize| declared.get(k).copied().unwrap_or(Declared::Tensor);
            files.iter().enumerate().map(|(k, p)| read_value_pb(p, kind(k))).collect()
        };
        let declared: Vec<Declared> = inputs_info.iter().map(|i| i.declared).collect();
        let inputs = read("input", &declared)?;
        // The expected tensors, each with whether the test gives it in bfloat16 (which Ingot
        // reads, computes and returns as f32).
        let mut wants = Vec::new();
        for (k, value) in read("output", &outputs_declared)?.into_iter().enumerate() {
            let file = data_set.join(format!("output_{k}.pb"));
            let bf16 = matches!(value, Value::Tensor(_)) && declared_bf16(&file)?;
            wants.extend(value.tensors().into_iter().map(|t| (t, bf16)));
        }
        let mut options = CompileOptions {
            verify: true,
            max_loop_iterations: Some(MAX_LOOP_ITERATIONS),
            ..CompileOptions::default()
        };
        let mut runtime = Vec::new();
        for (k, value) in inputs.into_iter().enumerate() {
            let Some(input) = inputs_info.get(k) else {
                runtime.extend(value.tensors());
                continue;
            };
            let name = input.name.clone();
            // An optional holds nothing, or is its value.
            let value = match value {
                Value::Optional(None) => {
                    options.absent_inputs.push(name);
                    continue;
                }
                Value::Optional(Some(v)) => *v,
                v => v,
            };
            match value {
                Value::Tensor(t) if input.bound => options.constant_inputs.push((name, t)),
                // Its shape as a user fixes one (the model may leave dims open).
                Value::Tensor(t) => {
                    options.input_shapes.push((name, t.shape().to_vec()));
                    runtime.push(t);
                }
                sequence => {
                    let tensors = sequence.tensors();
                    let shapes = tensors.iter().map(|t| t.shape().to_vec()).collect();
                    options.sequence_inputs.push((name, shapes));
                    runtime.extend(tensors);
                }
            }
        }
        let bundle = ingot_compiler::compile_file(&model, &options).map_err(|e| {
            // The compiler names the model file; here it is always the test's model.onnx.
            let prefix = format!("{}: ", model.display());
            anyhow!("compile: {}", e.to_string().replace(&prefix, ""))
        })?;
        let seen = validation_seen();
        let opened = ingot_runtime::Bundle::from_bytes(&bundle)?;
        let variants = opened.manifest().variants.iter();
        steps.extend(variants.flat_map(|v| &v.steps).map(|s| (s.op.clone(), !s.vulkan.is_empty())));
        let mut session = match backend {
            Backend::Cpu => session(&bundle)?,
            Backend::Vulkan => session_on(&bundle, vulkan())?,
        };
        let got = run(&mut session, &runtime).with_context(|| set.clone())?;
        if backend == Backend::Vulkan {
            check_validation(seen)?;
        }
        if got.len() != wants.len() {
            bail!("{set}: {} outputs, the test expects {}", got.len(), wants.len());
        }
        for (i, (g, (w, bf16))) in got.iter().zip(&wants).enumerate() {
            let name = session.outputs().get(i).map_or("?", |o| o.name.as_str());
            let (g, tolerance) = if *bf16 {
                let wider = Tolerance::new(tolerance.rtol.max(BF16_MIN_RTOL), tolerance.atol);
                (&rounded_to_bf16(g)?, wider)
            } else {
                (g, tolerance)
            };
            allclose(g, w, tolerance).map_err(|e| anyhow!("{set}: output {i} '{name}': {e}"))?;
        }
    }
    Ok(())
}

/// Whether the serialized TensorProto at `path` is bfloat16, which Ingot reads, computes and
/// returns as f32.
fn declared_bf16(path: &Path) -> Result<bool> {
    use protobuf::Message;
    let bytes = std::fs::read(path).with_context(|| path.display().to_string())?;
    let t = onnx_protobuf::TensorProto::parse_from_bytes(&bytes)?;
    Ok(t.data_type == onnx_protobuf::tensor_proto::DataType::BFLOAT16 as i32)
}

/// An f32 output rounded to bfloat16 (ties to even), as a caller storing a bfloat16 output
/// does: how it is compared with a reference the test gives in bfloat16.
fn rounded_to_bf16(t: &ingot_runtime::Tensor) -> Result<ingot_runtime::Tensor> {
    let round = |x: f32| {
        let b = x.to_bits();
        if x.is_nan() {
            x
        } else {
            f32::from_bits(b.wrapping_add(0x7FFF + ((b >> 16) & 1)) & 0xFFFF_0000)
        }
    };
    let values: Vec<f32> = t.to_vec::<f32>()?.into_iter().map(round).collect();
    Ok(ingot_runtime::Tensor::from_vec(t.shape().to_vec(), &values)?)
}

/// The test's tolerance: `data.json`'s `rtol`/`atol` where given (the light models have one),
/// else ONNX's defaults.
fn tolerance(dir: &Path) -> Result<Tolerance> {
    let path = dir.join("data.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(DEFAULT_TOLERANCE);
    };
    let number = |key: &str| -> Result<Option<f64>> {
        let Some(at) = text.find(&format!("\"{key}\"")) else {
            return Ok(None);
        };
        let rest = text[at + key.len() + 2..].trim_start();
        let rest = rest.strip_prefix(':').unwrap_or(rest).trim_start();
        let end =
            rest.find(|c: char| !(c.is_ascii_digit() || "+-.eE".contains(c))).unwrap_or(rest.len());
        let value =
            rest[..end].parse().with_context(|| format!("{}: bad {key}", path.display()))?;
        Ok(Some(value))
    };
    Ok(Tolerance::new(
        number("rtol")?.unwrap_or(DEFAULT_TOLERANCE.rtol),
        number("atol")?.unwrap_or(DEFAULT_TOLERANCE.atol),
    ))
}

/// `(name, dir)` of every test in a suite dir, sorted by name.
fn test_dirs(suite_dir: &Path) -> Vec<(String, PathBuf)> {
    sorted_entries(suite_dir)
        .into_iter()
        .filter(|p| p.join("model.onnx").is_file())
        .map(|p| (file_name(&p), p))
        .collect()
}

fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    entries.sort();
    entries
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// A suite's results sorted into the four outcomes.
struct Report<'a> {
    suite: &'a str,
    list: &'a str,
    passed: usize,
    expected_failures: usize,
    failed: Vec<(&'a str, &'a str)>,
    /// Listed tests that passed, each with the list that has it.
    unexpected_passes: Vec<(&'a str, &'static str)>,
}

impl<'a> Report<'a> {
    fn new(
        suite: &'a str,
        list: &'a str,
        results: &'a [(String, Result<(), String>)],
        expected: &ExpectedFailures,
    ) -> Self {
        let mut r = Report {
            suite,
            list,
            passed: 0,
            expected_failures: 0,
            failed: Vec::new(),
            unexpected_passes: Vec::new(),
        };
        for (name, outcome) in results {
            match (outcome, expected.list_of(name)) {
                (Ok(()), None) => r.passed += 1,
                (Ok(()), Some(list)) => r.unexpected_passes.push((name, list)),
                (Err(_), Some(_)) => r.expected_failures += 1,
                (Err(e), None) => r.failed.push((name, e)),
            }
        }
        r
    }

    fn ok(&self) -> bool {
        self.failed.is_empty() && self.unexpected_passes.is_empty()
    }

    fn render(&self, cap: bool, seconds: f64) -> String {
        let mut s = format!(
            "{} tests: {} passed, {} expected failures, {} failed",
            self.suite,
            self.passed,
            self.expected_failures,
            self.failed.len()
        );
        if !self.unexpected_passes.is_empty() {
            let _ = write!(s, ", {} unexpectedly passed", self.unexpected_passes.len());
        }
        let _ = write!(s, " ({seconds:.1} s)");
        let limit = if cap { MAX_LISTED } else { usize::MAX };
        for (name, error) in self.failed.iter().take(limit) {
            let _ = write!(s, "\n  FAILED {name}: {}", reason_of(error));
        }
        if self.failed.len() > limit {
            let _ = write!(s, "\n  ... and {} more", self.failed.len() - limit);
        }
        for (name, list) in &self.unexpected_passes {
            let fix = if *list == ALL_BACKENDS_LIST {
                "move it to the lists of the backends it still fails on"
            } else {
                "remove it"
            };
            let _ =
                write!(s, "\n  PASSED {name}, which {list} lists as an expected failure: {fix}");
        }
        if !self.failed.is_empty() {
            let _ = write!(
                s,
                "\n  (a failure that is not a bug to fix now goes into {} as `name  # reason`, or \
                 into {ALL_BACKENDS_LIST} if every backend fails it alike; INGOT_TEST_FILTER=name \
                 shows the full error)",
                self.list
            );
        }
        s
    }
}

/// The reason a failure is listed with: its error's first line, and the next one where a line
/// ends with ':' (what it introduces: the nodes, the device), without '#'.
fn reason_of(error: &str) -> String {
    let mut reason = String::new();
    for line in error.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if !reason.is_empty() {
            reason.push(' ');
        }
        reason.push_str(line);
        if !line.ends_with(':') {
            break;
        }
    }
    reason.replace('#', "")
}

/// One list file: test name -> reason.
struct List(BTreeMap<String, String>);

impl List {
    fn load(path: &str) -> Result<List> {
        let path = repo_root().join(path);
        let text =
            std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        let mut entries = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, reason) = line.split_once('#').unwrap_or((line, ""));
            let (name, reason) = (name.trim(), reason.trim());
            if name.contains(char::is_whitespace) || reason.is_empty() {
                bail!("{}:{}: expected `test_name  # reason`, got {line:?}", path.display(), n + 1);
            }
            if entries.insert(name.to_string(), reason.to_string()).is_some() {
                bail!("{}:{}: {name} is listed twice", path.display(), n + 1);
            }
        }
        Ok(List(entries))
    }

    /// Rewrites the file: its leading comment block, then the entries, sorted.
    fn save(&self, path: &str) -> Result<()> {
        let path = repo_root().join(path);
        let text = std::fs::read_to_string(&path)?;
        let mut out: String = text
            .lines()
            .take_while(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect();
        for (name, reason) in &self.0 {
            let _ = writeln!(out, "{name}  # {reason}");
        }
        std::fs::write(&path, out).with_context(|| format!("write {}", path.display()))
    }
}

/// The tests expected to fail on one backend: `all.txt` and the backend's own list.
struct ExpectedFailures {
    backend: Backend,
    /// Test name -> (reason, the list that has it).
    entries: BTreeMap<String, (String, &'static str)>,
}

/// Serialises read-modify-write of the lists between the suites, which run on parallel
/// threads.
static LIST_LOCK: Mutex<()> = Mutex::new(());

impl ExpectedFailures {
    fn load(backend: Backend) -> Result<Self> {
        let own = backend.expected_failures();
        let mut entries: BTreeMap<String, (String, &'static str)> = List::load(ALL_BACKENDS_LIST)?
            .0
            .into_iter()
            .map(|(name, reason)| (name, (reason, ALL_BACKENDS_LIST)))
            .collect();
        for (name, reason) in List::load(own)?.0 {
            if entries.insert(name.clone(), (reason, own)).is_some() {
                bail!(
                    "{name} is in {ALL_BACKENDS_LIST} and in {}: keep it in one",
                    backend.expected_failures()
                );
            }
        }
        Ok(Self { backend, entries })
    }

    fn reason(&self, name: &str) -> Option<&str> {
        self.entries.get(name).map(|(reason, _)| reason.as_str())
    }

    /// The list that has `name`.
    fn list_of(&self, name: &str) -> Option<&'static str> {
        self.entries.get(name).map(|&(_, list)| list)
    }

    /// Rewrites the lists from `results` of this backend (re-read under the lock, as other
    /// suites may have updated them): a failing test not listed goes into this backend's list
    /// with its error's reason ([`reason_of`]; a reason already given is kept, unless it is a
    /// cut one the new reason completes); a passing test leaves this backend's list, and if it was in
    /// `all.txt`, moves to the other backends' lists; a test every backend's list has moves to
    /// `all.txt` when the reasons agree.
    fn update(&self, results: &[(String, Result<(), String>)]) -> Result<()> {
        let _guard = LIST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let mut all = List::load(ALL_BACKENDS_LIST)?;
        let mut lists: Vec<(Backend, List)> = BACKENDS
            .iter()
            .map(|&b| Ok((b, List::load(b.expected_failures())?)))
            .collect::<Result<_>>()?;
        let others = |b: Backend| b != self.backend;
        for (name, outcome) in results {
            match outcome {
                Ok(()) => {
                    if let Some(reason) = all.0.remove(name) {
                        for (_, list) in lists.iter_mut().filter(|(b, _)| others(*b)) {
                            list.0.insert(name.clone(), reason.clone());
                        }
                    }
                    for (_, list) in lists.iter_mut().filter(|(b, _)| !others(*b)) {
                        list.0.remove(name);
                    }
                }
                Err(e) => {
                    let first = reason_of(e);
                    let listed = all.0.get_mut(name).or_else(|| {
                        let own = lists.iter_mut().find(|(b, _)| !others(*b));
                        own.and_then(|(_, l)| l.0.get_mut(name))
                    });
                    match listed {
                        Some(reason) => {
                            // A reason cut off, or ending where its next line began.
                            let cut = reason
                                .strip_suffix("...")
                                .or_else(|| reason.ends_with(':').then_some(reason.as_str()));
                            if cut.is_some_and(|c| first.starts_with(c) && first.len() > c.len()) {
                                *reason = first;
                            }
                        }
                        None => {
                            let own = lists.iter_mut().find(|(b, _)| !others(*b));
                            if let Some((_, list)) = own {
                                list.0.insert(name.clone(), first);
                            }
                        }
                    }
                }
            }
        }
        // A test every backend lists with the same reason fails everywhere alike.
        let everywhere: Vec<(String, String)> = lists[0]
            .1
            .0
            .iter()
            .filter(|(n, r)| lists.iter().all(|(_, l)| l.0.get(*n) == Some(*r)))
            .map(|(n, r)| (n.clone(), r.clone()))
            .collect();
        for (name, reason) in everywhere {
            for (_, list) in lists.iter_mut() {
                list.0.remove(&name);
            }
            all.0.insert(name, reason);
        }
        all.save(ALL_BACKENDS_LIST)?;
        for (b, list) in &lists {
            list.save(b.expected_failures())?;
        }
        Ok(())
    }
}
