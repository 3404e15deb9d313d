//! Real models beyond PP-OCR, each compiled with its case's input shapes and constant inputs,
//! run on the CPU and on Vulkan (lavapipe, under the validation layer; submodels of ops
//! without a Vulkan kernel on the CPU), and compared with ONNX Runtime's outputs. Prints the
//! worst element of every output.
//!
//! Data: `target/models/` (tools/fetch_models.sh) and `target/references/models/`
//! (manifest.txt, `<case>/{inputs,constants,outputs}/<name>.npy`), made by `bash
//! tools/setup.sh`; tools/make_model_references.py says what each case covers and how its
//! inputs were made.

use anyhow::{Context, Result, bail, ensure};
use ingot_compiler::CompileOptions;
use ingot_runtime::{DType, Device, Stage, Tensor};
use ingot_tests::data::read_npy;
use ingot_tests::paths::generated;
use ingot_tests::{
    Tolerance, check_validation, compare, run, session_with, validation_seen, vulkan,
};
use std::collections::BTreeMap;
use std::path::Path;

const TOLERANCE: Tolerance = Tolerance::new(1e-4, 1e-5);
/// For float16 outputs: about 20 f16 ulps. Both runtimes round every op's output to f16, each
/// after its own f32 arithmetic, and a deep net's roundings add up (YOLOv8n's box coordinates
/// differ by up to 0.2 at 10, 1.8e-2).
const HALF_TOLERANCE: Tolerance = Tolerance::new(2e-2, 2e-3);

/// A case with `perturbed/` outputs (a model that requantizes every layer, whose outputs move
/// visibly when a float32 ulp moves a value across a level: tools/make_model_references.py)
/// passes when its mean difference from ONNX Runtime is at most this many times ONNX
/// Runtime's own difference for an input moved by one part in 10^7. A wrong scale, zero point
/// or weight makes differences of the size of the quantization error, tens of times larger.
const SENSITIVITY_MARGIN: f64 = 2.0;

/// The mean absolute difference of two float tensors of one shape.
fn mean_difference(a: &Tensor, b: &Tensor) -> Result<f64> {
    ensure!(a.shape() == b.shape(), "shapes {:?} and {:?} differ", a.shape(), b.shape());
    let (a, b) = (a.to_vec::<f32>()?, b.to_vec::<f32>()?);
    let sum: f64 = a.iter().zip(&b).map(|(x, y)| f64::from((x - y).abs())).sum();
    Ok(sum / a.len().max(1) as f64)
}

/// The arrays of `dir`, by file stem; an absent directory has none.
fn arrays(dir: &Path) -> Result<BTreeMap<String, Tensor>> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(out) };
    for entry in entries {
        let path = entry?.path();
        if let Some(stem) = path.file_stem().and_then(|s| s.to_str()) {
            out.insert(stem.to_string(), read_npy(&path)?);
        }
    }
    Ok(out)
}

/// Cases whose every submodel has Vulkan kernels: their Vulkan run must not use the CPU
/// (opset 23's Attention, RMSNormalization and RotaryEmbedding; opset 24's TensorScatter; convs of int8 weights and
/// their post-ops; dynamic quantization's DynamicQuantizeLinear and ConvInteger; a float16
/// transformer and detector, their products, norms and convs widened to f32 steps by casts,
/// the detector's nearest upsampling moving f16 two to a word).
const ALL_ON_VULKAN_CASES: &[&str] = &[
    "decoder_f16",
    "yolov8n_320_f16",
    "llama_prefill",
    "llama_decode",
    "genai_llm_prefill",
    "genai_llm_decode",
    "yolov8n_320_weights_int8",
    "det_224_weights_int8",
    "yolov8n_320_dynamic",
    "decoder_dynamic",
    "decoder_dynamic_per_channel",
];

fn check_case(case: &str, model: &str) -> Result<()> {
    let dir = generated(&format!("references/models/{case}"))?;
    let inputs = arrays(&dir.join("inputs"))?;
    let constants = arrays(&dir.join("constants"))?;
    let expected = arrays(&dir.join("outputs"))?;
    let moved = arrays(&dir.join("perturbed"))?;
    let options = CompileOptions {
        input_shapes: inputs.iter().map(|(n, t)| (n.clone(), t.shape().to_vec())).collect(),
        constant_inputs: constants.into_iter().collect(),
        verify: true,
        ..CompileOptions::default()
    };
    let model_path = generated(&format!("models/{model}"))?;
    let bundle = ingot_compiler::compile_file(&model_path, &options)
        .with_context(|| format!("compile {model}"))?;

    let mut failures = Vec::new();
    // Submodels of ops that have no Vulkan kernel (the partition made them CPU submodels)
    // run on the CPU in the Vulkan run; every other one must run on Vulkan.
    let runs =
        [("cpu", &bundle, vec![Device::Cpu]), ("vulkan:cpu", &bundle, vec![vulkan(), Device::Cpu])];
    for (backend, bundle, devices) in runs {
        let seen = validation_seen();
        let mut session = session_with(bundle, devices)?;
        for p in &session.placement().0 {
            if let Some(skip) = p.skipped.iter().find(|s| s.stage != Stage::Kernels) {
                bail!("{case}: submodel {} ({}) left Vulkan: {skip}", p.index, p.ops);
            }
        }
        if backend.starts_with("vulkan") && !session.device().contains("vulkan") {
            bail!("{case}: nothing ran on Vulkan: {}", session.placement());
        }
        let on_cpu = session.placement().0.iter().any(|p| !p.device.starts_with("vulkan"));
        if backend.starts_with("vulkan") && ALL_ON_VULKAN_CASES.contains(&case) && on_cpu {
            bail!("{case}: a submodel ran on the CPU: {}", session.placement());
        }
        let feed = session
            .inputs()
            .iter()
            .map(|i| inputs.get(&i.name).cloned().with_context(|| format!("no input {}", i.name)))
            .collect::<Result<Vec<_>>>()?;
        let names: Vec<String> = session.outputs().iter().map(|o| o.name.clone()).collect();
        let outputs = run(&mut session, &feed).context(backend)?;
        check_bounded_run_into(&mut session, &feed, &outputs).context(backend)?;
        check_validation(seen)?;
        for (name, got) in names.iter().zip(&outputs) {
            let want = expected.get(name).with_context(|| format!("no reference for {name}"))?;
            if let Some(moved) = moved.get(name) {
                let (ours, own) = (mean_difference(got, want)?, mean_difference(moved, want)?);
                println!(
                    "{case} on {backend}: {name}: mean difference {ours:.3e}; ONNX Runtime's own \
                     for an input moved by 1e-7: {own:.3e}"
                );
                if ours > SENSITIVITY_MARGIN * own {
                    failures.push(format!(
                        "{backend}: {name}: mean difference {ours:.3e}, over {SENSITIVITY_MARGIN} \
                         times the model's own {own:.3e}"
                    ));
                }
                continue;
            }
            let tolerance = match want.dtype() {
                DType::F16 => HALF_TOLERANCE,
                _ => TOLERANCE,
            };
            match compare(got, want, tolerance) {
                Ok(c) => {
                    println!("{case} on {backend}: {name}: {c}");
                    if !c.passed() {
                        failures.push(format!("{backend}: {name}: {c}"));
                    }
                }
                Err(e) => failures.push(format!("{backend}: {name}: {e}")),
            }
        }
    }
    if !failures.is_empty() {
        bail!("{case}:\n  {}", failures.join("\n  "));
    }
    Ok(())
}

/// Where outputs are bounded (NMS), `run_into` on buffers of the bound gives what `run` did:
/// the rows the run kept at the start of each buffer, and their shape from `output_shape`.
fn check_bounded_run_into(
    session: &mut ingot_runtime::Session,
    feed: &[Tensor],
    outputs: &[Tensor],
) -> Result<()> {
    if session.outputs().iter().all(|o| o.bounded.is_none()) {
        return Ok(());
    }
    let mut buffers: Vec<Tensor> =
        session.outputs().iter().map(|o| Tensor::zeros(o.desc.clone())).collect();
    let ins: Vec<_> = feed.iter().map(Tensor::view).collect();
    let mut outs: Vec<_> = buffers.iter_mut().map(Tensor::view_mut).collect();
    session.run_into(&ins, &mut outs)?;
    for (j, (buffer, want)) in buffers.iter().zip(outputs).enumerate() {
        let shape = session.output_shape(j).context("no output shape")?;
        ensure!(
            shape == want.shape(),
            "output {j}: run_into's shape {shape:?}, run's {:?}",
            want.shape()
        );
        let filled = &buffer.bytes()[..want.bytes().len()];
        ensure!(filled == want.bytes(), "output {j}: run_into wrote other values than run");
    }
    Ok(())
}

/// Every case of the manifest: `case=DIR model=FILE.onnx` a line.
#[test]
fn real_models_match_onnx_runtime_on_the_cpu_and_vulkan() -> Result<()> {
    let manifest = generated("references/models/manifest.txt")?;
    let text = std::fs::read_to_string(&manifest)?;
    let mut failures = Vec::new();
    let mut cases = 0;
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let field = |key: &str| {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                .with_context(|| format!("{}: line without {key}: {line}", manifest.display()))
        };
        let (case, model) = (field("case")?, field("model")?);
        cases += 1;
        if let Err(e) = check_case(case, model) {
            failures.push(format!("{e:#}"));
        }
    }
    if cases == 0 {
        bail!("{} lists no case", manifest.display());
    }
    if !failures.is_empty() {
        bail!("{} of {cases} cases failed:\n{}", failures.len(), failures.join("\n"));
    }
    Ok(())
}

/// The steps of `file`'s bundle (under target/), by op, in order.
fn step_ops(file: &str) -> Result<Vec<String>> {
    let bytes = ingot_compiler::compile_file(&generated(file)?, &CompileOptions::default())
        .with_context(|| format!("compile {file}"))?;
    let bundle = ingot_runtime::Bundle::from_bytes(&bytes)?;
    Ok(bundle.manifest().variants[0].steps.iter().map(|s| s.op.clone()).collect())
}

/// The decoder fixture as older exporters write it (normalizations as ReduceMean chains,
/// GELU in pieces) compiles to the steps of the graph written with whole ops: a norm step
/// where the fixture has LayerNormalization (an RMS norm for the final one), the GELUs inside
/// their MatMuls as the Relus are.
#[test]
fn exported_normalizations_and_gelus_compile_to_whole_ops() -> Result<()> {
    let whole = step_ops("decoder/prefill.onnx")?;
    let exported = step_ops("models/prefill_exported.onnx")?;
    let expected: Vec<String> = {
        let mut norms = 0;
        let total = whole.iter().filter(|op| *op == "LayerNormalization").count();
        (whole.iter())
            .map(|op| match op.as_str() {
                "LayerNormalization" => {
                    norms += 1;
                    if norms == total { "RMSNormalization" } else { op }.to_string()
                }
                _ => op.clone(),
            })
            .collect()
    };
    ensure!(exported == expected, "exported steps {exported:?}\nexpected {expected:?}");
    Ok(())
}
