//! The PP-OCR models (detector, recogniser, direction classifier) compiled with the input shapes
//! of each reference case and run on the CPU and on Vulkan, compared with ONNX Runtime's
//! outputs. On Vulkan the test also checks the device memory: the ledger's load trace is the
//! plan's allocation schedule event by event (with and without staged uploads), repeated runs
//! give identical outputs and allocate nothing, and dropping the session frees everything.
//!
//! Data: `target/models/*.onnx` and `target/references/` (manifest.txt, `<model>/<shape>/
//! {input,output}_<i>.npy`), made by `bash tools/setup.sh` (tools/make_references.py says how
//! the inputs and the reference were made). Prints the worst element of every output.

use anyhow::{Context, Result, anyhow, bail, ensure};
use ingot_runtime::ledger::{Action, planned_events, planned_peak};
use ingot_runtime::vulkan::{DeviceChoice, VulkanOptions};
use ingot_runtime::{
    Bundle, Device, Faults, Ledger, MemoryKind, Session, SessionOptions, Stage, Tensor,
};
use ingot_schema::proto::AllocationKind;
use ingot_tests::data::read_npy;
use ingot_tests::paths::generated;
use ingot_tests::{
    Tolerance, check_validation, compare, compile, run, session, session_on, validation_seen,
    vulkan,
};
use std::sync::Arc;

const TOLERANCE: Tolerance = Tolerance::new(1e-4, 1e-5);

const DET: &str = "ch_PP-OCRv4_det_infer.onnx";
const REC: &str = "ch_PP-OCRv4_rec_infer.onnx";
const CLS: &str = "ch_ppocr_mobile_v2.0_cls_infer.onnx";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Cpu,
    Vulkan,
    /// Vulkan with every weight uploaded through a staging buffer, as on a discrete GPU.
    VulkanStaged,
}

#[test]
fn det() {
    check_model(DET, Backend::Cpu);
}

#[test]
fn rec() {
    check_model(REC, Backend::Cpu);
}

#[test]
fn cls() {
    check_model(CLS, Backend::Cpu);
}

/// cls's squeeze-and-excitation blocks end in `features * gate` read by a 1x1 conv: each such
/// product becomes its conv's channel scales (`Mul+Conv` steps), and no Mul step is left.
#[test]
fn squeeze_excitation_products_become_channel_scales() -> Result<()> {
    use protobuf::Message as _;
    let path = generated(&format!("models/{CLS}"))?;
    let onnx = onnx_protobuf::ModelProto::parse_from_bytes(&std::fs::read(&path)?)?;
    let nodes = &onnx.graph.node;
    let read_by_conv =
        |out: &String| nodes.iter().any(|n| n.op_type == "Conv" && n.input[0] == *out);
    let gates = nodes.iter().filter(|n| n.op_type == "Mul" && read_by_conv(&n.output[0])).count();
    ensure!(gates > 0, "{CLS} has no product read by a conv");
    let case = manifest()?.into_iter().find(|c| c.model == CLS).context("no cls case")?;
    let bundle = Bundle::from_bytes(&compile(&path, &case.inputs)?)?;
    let steps = &bundle.manifest().variants[0].steps;
    let labels: Vec<String> = steps.iter().map(|s| s.op_label()).collect();
    let scaled = labels.iter().filter(|l| l.starts_with("Mul+Conv")).count();
    let products = steps.iter().filter(|s| s.op == "Mul").count();
    ensure!(
        (scaled, products) == (gates, 0),
        "{gates} gate products: {scaled} Mul+Conv and {products} Mul steps in {labels:?}"
    );
    Ok(())
}

/// The CPU splits work at places that do not depend on the thread count, so every output is
/// the same bits on 1 thread as on 3 (more than this machine's cores, with uneven splits).
#[test]
fn cpu_outputs_do_not_depend_on_the_thread_count() {
    let result = (|| -> Result<()> {
        for model in [DET, REC, CLS] {
            let case = manifest()?
                .into_iter()
                .find(|c| c.model == model)
                .ok_or_else(|| anyhow!("references/manifest.txt has no case for {model}"))?;
            let bundle = compile(&generated(&format!("models/{model}"))?, &case.inputs)?;
            let dir = generated(&format!("references/{}", case.case))?;
            let inputs = (0..case.inputs.len())
                .map(|i| read_npy(&dir.join(format!("input_{i}.npy"))))
                .collect::<Result<Vec<_>>>()?;
            let on = |threads| -> Result<Vec<Tensor>> {
                let options =
                    SessionOptions { threads: Some(threads), ..SessionOptions::on("cpu")? };
                let bundle = Arc::new(Bundle::from_bytes(&bundle)?);
                run(&mut Session::new(bundle, options)?, &inputs)
            };
            let (one, three) = (on(1)?, on(3)?);
            for (i, (a, b)) in one.iter().zip(&three).enumerate() {
                if a.bytes() != b.bytes() {
                    bail!("{model}: output {i} differs between 1 and 3 threads");
                }
            }
        }
        Ok(())
    })();
    if let Err(e) = result {
        panic!("{e:#}");
    }
}

#[test]
fn det_vulkan() {
    check_model(DET, Backend::Vulkan);
}

#[test]
fn rec_vulkan() {
    check_model(REC, Backend::Vulkan);
}

#[test]
fn cls_vulkan() {
    check_model(CLS, Backend::Vulkan);
}

#[test]
fn cls_vulkan_staged() {
    check_model(CLS, Backend::VulkanStaged);
}

/// Every model on `vulkan:cpu,cpu` (lavapipe, named): healthy, and with Vulkan failing at each preparation stage
/// and once while running. The outputs match ONNX Runtime every time, the placement names
/// the stage, and a device that failed at preparation holds no memory.
#[test]
fn every_model_survives_every_fault() {
    let stages = [
        None,
        Some(Stage::Instance),
        Some(Stage::Device),
        Some(Stage::Pipelines),
        Some(Stage::Weights),
        Some(Stage::Arena),
        Some(Stage::Io),
        Some(Stage::Run),
    ];
    let mut failures = Vec::new();
    for model in [DET, REC, CLS] {
        let case = manifest()
            .and_then(|cases| {
                cases
                    .into_iter()
                    .find(|c| c.model == model)
                    .with_context(|| format!("no case for {model}"))
            })
            .unwrap_or_else(|e| panic!("{e:#}"));
        for stage in stages {
            if let Err(e) = check_fault(&case, stage) {
                failures.push(format!("{} with a fault at {stage:?}: {e:#}", case.case));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn check_fault(case: &Case, stage: Option<Stage>) -> Result<()> {
    let model_path = generated(&format!("models/{}", case.model))?;
    let dir = generated(&format!("references/{}", case.case))?;
    let bundle = Arc::new(Bundle::from_bytes(&compile(&model_path, &case.inputs)?)?);
    let seen = validation_seen();
    let faults = Faults::default();
    if let Some(stage) = stage {
        faults.inject("vulkan", stage);
    }
    let ledger = Ledger::new();
    let options = SessionOptions {
        faults,
        ledger: Some(ledger.clone()),
        ..SessionOptions::on("vulkan:cpu,cpu")?
    };
    let mut session = Session::new(bundle, options)?;
    let inputs = (0..case.inputs.len())
        .map(|i| read_npy(&dir.join(format!("input_{i}.npy"))))
        .collect::<Result<Vec<_>>>()?;
    let got = run(&mut session, &inputs)?;
    for (i, g) in got.iter().enumerate() {
        let want = read_npy(&dir.join(format!("output_{i}.npy")))?;
        let c = compare(g, &want, TOLERANCE).map_err(anyhow::Error::msg)?;
        if !c.passed() {
            bail!("output {i}: {c}");
        }
    }
    let placement = session.placement();
    let [only] = &placement.0[..] else {
        bail!("PP-OCR should be one submodel:\n{placement}");
    };
    let want_device = if stage.is_some() { "cpu" } else { "vulkan" };
    if !only.device.starts_with(want_device) || only.skipped.iter().map(|s| s.stage).ne(stage) {
        bail!("want it on {want_device} after a fault at {stage:?}:\n{placement}");
    }
    let on_vulkan = |e: &ingot_runtime::ledger::LedgerEvent| e.device.starts_with("vulkan");
    let vulkan_bytes =
        ledger.events().iter().filter(|e| on_vulkan(e)).fold(0i128, |held, e| match e.action {
            Action::Allocate => held + i128::from(e.bytes),
            Action::Free => held - i128::from(e.bytes),
        });
    if stage.is_some() && vulkan_bytes != 0 {
        bail!("the failed device still holds {vulkan_bytes} bytes");
    }
    check_validation(seen)
}

/// One line of manifest.txt:
/// `model=FILE case=DIR inputs=NAME:1x3x48x192[,...] outputs=NAME[,...]`.
struct Case {
    model: String,
    case: String,
    inputs: Vec<(String, Vec<usize>)>,
    outputs: Vec<String>,
}

fn manifest() -> Result<Vec<Case>> {
    let path = generated("references/manifest.txt")?;
    let text = std::fs::read_to_string(&path)?;
    let mut cases = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')) {
        let field = |key: &str| {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                .ok_or_else(|| anyhow!("{}: no {key}= in {line:?}", path.display()))
        };
        let inputs = field("inputs")?
            .split(',')
            .map(|spec| {
                let (name, dims) = spec
                    .rsplit_once(':')
                    .ok_or_else(|| anyhow!("bad input {spec:?} in {line:?}"))?;
                let dims = dims
                    .split('x')
                    .map(str::parse)
                    .collect::<Result<Vec<usize>, _>>()
                    .with_context(|| format!("bad shape in {line:?}"))?;
                Ok((name.to_string(), dims))
            })
            .collect::<Result<_>>()?;
        cases.push(Case {
            model: field("model")?.to_string(),
            case: field("case")?.to_string(),
            inputs,
            outputs: field("outputs")?.split(',').map(String::from).collect(),
        });
    }
    Ok(cases)
}

fn check_model(model: &str, backend: Backend) {
    let result = (|| -> Result<Vec<String>> {
        let cases: Vec<Case> = manifest()?.into_iter().filter(|c| c.model == model).collect();
        if cases.is_empty() {
            bail!("references/manifest.txt has no case for {model}");
        }
        let mut failures = Vec::new();
        for case in &cases {
            failures.extend(check_case(case, backend)?);
        }
        Ok(failures)
    })();
    match result {
        Ok(failures) => assert!(failures.is_empty(), "{}", failures.join("\n")),
        Err(e) => panic!("{model}: {e:#}"),
    }
}

/// Compiles and runs one case; returns a line per output that does not match.
fn check_case(case: &Case, backend: Backend) -> Result<Vec<String>> {
    let model_path = generated(&format!("models/{}", case.model))?;
    let dir = generated(&format!("references/{}", case.case))?;
    let bundle = compile(&model_path, &case.inputs)?;
    let seen = validation_seen();
    let mut session = match backend {
        Backend::Cpu => session(&bundle)?,
        Backend::Vulkan => session_on(&bundle, vulkan())?,
        Backend::VulkanStaged => session_on(
            &bundle,
            Device::Vulkan(VulkanOptions {
                device: DeviceChoice::CpuType,
                force_staging: true,
                kernel_class: ingot_tests::kernel_class(),
                ..VulkanOptions::default()
            }),
        )?,
    };
    let inputs = (0..case.inputs.len())
        .map(|i| read_npy(&dir.join(format!("input_{i}.npy"))))
        .collect::<Result<Vec<_>>>()?;
    let got = run(&mut session, &inputs)?;
    if got.len() != case.outputs.len() {
        bail!("{}: {} outputs, want {}", case.case, got.len(), case.outputs.len());
    }
    let mut failures = Vec::new();
    for (i, (g, name)) in got.iter().zip(&case.outputs).enumerate() {
        let want = read_npy(&dir.join(format!("output_{i}.npy")))?;
        let ours = &session.outputs()[i].name;
        if ours != name {
            failures.push(format!("{}: output {i} is named '{ours}', want '{name}'", case.case));
        }
        match compare(g, &want, TOLERANCE) {
            Ok(c) => {
                println!("{} {name}: {c}", case.case);
                if !c.passed() {
                    failures.push(format!("{} {name}: {c}", case.case));
                }
            }
            Err(e) => failures.push(format!("{} {name}: {e}", case.case)),
        }
    }
    if backend != Backend::Cpu {
        check_device_memory(&bundle, session, &inputs, &got, backend)
            .with_context(|| format!("{} on {backend:?}", case.case))?;
        check_validation(seen)?;
    }
    Ok(failures)
}

/// The ledger of a Vulkan session: its load trace is the plan's schedule, event by event;
/// more runs give the same outputs and allocate nothing; dropping it frees everything.
fn check_device_memory(
    bundle: &[u8],
    mut session: Session,
    inputs: &[Tensor],
    first: &[Tensor],
    backend: Backend,
) -> Result<()> {
    let opened = Bundle::from_bytes(bundle)?;
    let plan = opened.manifest().variants[0].plan.as_ref().context("no plan")?;
    let staged = backend == Backend::VulkanStaged;
    let ledger = session.ledger().clone();
    let trace: Vec<(Action, MemoryKind, u64)> =
        ledger.events().iter().map(|e| (e.action, e.kind, e.bytes)).collect();
    let planned = planned_events(plan, staged);
    if trace != planned {
        let diff = trace
            .iter()
            .zip(&planned)
            .position(|(a, b)| a != b)
            .unwrap_or(trace.len().min(planned.len()));
        bail!(
            "the ledger's load trace ({} events) differs from the plan's schedule ({} events) \
             at event {diff}: {:?} vs {:?}",
            trace.len(),
            planned.len(),
            trace.get(diff),
            planned.get(diff)
        );
    }
    let peak = ledger.total().peak;
    if peak != planned_peak(plan, staged) {
        bail!(
            "device memory peaked at {peak} bytes; the plan predicts {}",
            planned_peak(plan, staged)
        );
    }
    // Never more than weights + max(arena + io, largest staging buffer).
    let bytes = |kind| -> u64 {
        plan.allocations.iter().filter(|a| a.kind == kind as i32).map(|a| a.bytes).sum()
    };
    let largest = plan
        .allocations
        .iter()
        .filter(|a| a.kind == AllocationKind::Weight as i32)
        .map(|a| a.bytes)
        .max()
        .unwrap_or(0);
    let activations = bytes(AllocationKind::Arena) + bytes(AllocationKind::Io);
    let bound = bytes(AllocationKind::Weight) + activations.max(if staged { largest } else { 0 });
    if peak > bound {
        bail!("device memory peaked at {peak} bytes, over W + max(A, staging) = {bound}");
    }

    let events = ledger.events().len();
    for run_index in 1..=5 {
        let again = run(&mut session, inputs)?;
        if again.iter().zip(first).any(|(a, b)| a.bytes() != b.bytes()) {
            bail!("run {run_index} gave different outputs than the first");
        }
    }
    if ledger.events().len() != events {
        bail!("running again allocated device memory: {:?}", &ledger.events()[events..]);
    }
    drop(session);
    if ledger.total().current != 0 {
        bail!("{} bytes still allocated after the session dropped", ledger.total().current);
    }
    Ok(())
}

/// `--f16-weights` on the PP-OCR models, on the CPU and on Vulkan: the weights of every conv and
/// product are float16 (the bundle's weights under 55% of the float32 ones' bytes: biases and
/// norms stay f32), and the outputs stay
/// within a stated tolerance of the float32 weights' run on the same backend, the weights' rounding
/// (a relative 2^-11 each) being all that moves them. The recogniser reads a rendered line of
/// digits the same with both, and reads characters at all.
#[test]
fn f16_weights_move_outputs_little_and_read_the_same_text() -> Result<()> {
    // rec's character probabilities and cls's class scores move by under a hundredth (2e-2
    // relative); det's text probabilities by under 5e-2 where they are steep, around 0.5 (4e-2
    // measured, 17 of 50176 pixels past 1e-2).
    let tolerance = |model: &str| match model {
        DET => Tolerance::new(0.0, 5e-2),
        _ => Tolerance::new(2e-2, 1e-2),
    };
    let compile_with = |model: &str, inputs: &[(String, Vec<usize>)], f16_weights: bool| {
        let options = ingot_compiler::CompileOptions {
            input_shapes: inputs.to_vec(),
            verify: true,
            f16_weights,
            ..Default::default()
        };
        ingot_compiler::compile_file(&generated(&format!("models/{model}"))?, &options)
            .with_context(|| format!("compile {model}"))
    };
    let mut failures = Vec::new();
    for model in [DET, REC, CLS] {
        let case = manifest()?
            .into_iter()
            .find(|c| c.model == model)
            .ok_or_else(|| anyhow!("references/manifest.txt has no case for {model}"))?;
        let dir = generated(&format!("references/{}", case.case))?;
        let mut inputs = vec![read_npy(&dir.join("input_0.npy"))?];
        if model == REC {
            inputs.push(digit_line(&case.inputs[0].1, "3141592653")?);
        }
        let (full, half) =
            (compile_with(model, &case.inputs, false)?, compile_with(model, &case.inputs, true)?);
        let weight_bytes = |bundle: &[u8]| -> Result<u64> {
            let bundle = Bundle::from_bytes(bundle)?;
            Ok(bundle.manifest().weights.iter().map(|w| w.length).sum())
        };
        let (f32_bytes, f16_bytes) = (weight_bytes(&full)?, weight_bytes(&half)?);
        let ratio = f16_bytes as f64 / f32_bytes as f64;
        println!("{model}: weights {f32_bytes} -> {f16_bytes} bytes ({ratio:.3})");
        ensure!(ratio < 0.55, "{model}: f16 weights are {ratio:.3} of the f32 ones' bytes");
        for device in [Device::Cpu, vulkan()] {
            let (mut a, mut b) = (session_on(&full, device.clone())?, session_on(&half, device)?);
            for (k, input) in inputs.iter().enumerate() {
                let feed = std::slice::from_ref(input);
                let (want, got) = (run(&mut a, feed)?, run(&mut b, feed)?);
                let c = compare(&got[0], &want[0], tolerance(model)).map_err(|e| anyhow!(e))?;
                println!("{model} input {k} on {}: f16 weights against f32: {c}", a.device());
                if !c.passed() {
                    failures.push(format!("{model} input {k} on {}: {c}", a.device()));
                }
                if model == REC && k == 1 {
                    let (text, read) = (greedy_ctc(&want[0])?, greedy_ctc(&got[0])?);
                    println!("{model} on {}: reads {text:?} (f32), {read:?} (f16)", a.device());
                    ensure!(text.len() >= 5, "rec reads {text:?} from ten digits");
                    ensure!(text == read, "rec reads {text:?} with f32 weights, {read:?} f16");
                }
            }
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

/// `text` (digits) drawn dark on a light line of `shape` [1, 3, H, W] in a 5x7 bitmap font
/// scaled by 4, preprocessed as PP-OCR's recogniser wants: (x / 255 - 0.5) / 0.5.
fn digit_line(shape: &[usize], text: &str) -> Result<Tensor> {
    const GLYPHS: [[u8; 7]; 10] = [
        [0x0e, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0e],
        [0x04, 0x0c, 0x04, 0x04, 0x04, 0x04, 0x0e],
        [0x0e, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1f],
        [0x1f, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0e],
        [0x02, 0x06, 0x0a, 0x12, 0x1f, 0x02, 0x02],
        [0x1f, 0x10, 0x1e, 0x01, 0x01, 0x11, 0x0e],
        [0x06, 0x08, 0x10, 0x1e, 0x11, 0x11, 0x0e],
        [0x1f, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08],
        [0x0e, 0x11, 0x11, 0x0e, 0x11, 0x11, 0x0e],
        [0x0e, 0x11, 0x11, 0x0f, 0x01, 0x02, 0x0c],
    ];
    const SCALE: usize = 4;
    let &[1, 3, h, w] = shape else { bail!("not a [1, 3, H, W] input: {shape:?}") };
    let mut ink = vec![false; h * w];
    let top = h.saturating_sub(7 * SCALE) / 2;
    for (i, digit) in text.bytes().enumerate() {
        let glyph = GLYPHS[usize::from(digit - b'0')];
        let left = 8 + i * 7 * SCALE;
        for (r, bits) in glyph.iter().enumerate() {
            for c in (0..5).filter(|c| bits & (0x10 >> c) != 0) {
                for (y, x) in (0..SCALE).flat_map(|y| (0..SCALE).map(move |x| (y, x))) {
                    let (row, col) = (top + r * SCALE + y, left + c * SCALE + x);
                    ensure!(row < h && col < w, "{text:?} does not fit a {h}x{w} line");
                    ink[row * w + col] = true;
                }
            }
        }
    }
    let plane: Vec<f32> = ink.iter().map(|&i| if i { -1.0 } else { 0.9 }).collect();
    Ok(Tensor::from_vec(shape.to_vec(), &plane.repeat(3))?)
}

/// The recogniser's greedy CTC reading of probabilities [1, T, classes]: each step's most
/// likely class, repeats merged, the blank (class 0) dropped.
fn greedy_ctc(probabilities: &Tensor) -> Result<Vec<usize>> {
    let &[1, steps, classes] = probabilities.shape() else {
        bail!("not [1, T, classes]: {:?}", probabilities.shape());
    };
    let p = probabilities.to_vec::<f32>()?;
    let best = (0..steps).map(|t| {
        let row = &p[t * classes..][..classes];
        (0..classes).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap_or(0)
    });
    let mut read = Vec::new();
    let mut last = 0;
    for class in best {
        if class != 0 && class != last {
            read.push(class);
        }
        last = class;
    }
    Ok(read)
}
