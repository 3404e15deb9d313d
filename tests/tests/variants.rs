//! Variants and the weight bank: a small decoder-only transformer exported as a prefill graph
//! and a decode graph (tools/make_decoder.py, run by tools/setup.sh), two files that each
//! carry a full copy of the weights under different names. One bundle holds both graphs and
//! one copy of the weights, and running prefill then decode through it gives ONNX Runtime's
//! logits and key/value caches.

use anyhow::{Context, Result, ensure};
use ingot_compiler::{CompileOptions, VariantSource, compile_variants};
use ingot_runtime::{Bundle, Session, SessionOptions, Tensor};
use ingot_schema::SectionKind;
use ingot_tests::cli::{expect_success, ingot};
use ingot_tests::data::read_npy;
use ingot_tests::paths::{generated, scratch_dir};
use ingot_tests::{Tolerance, allclose, check_validation};
use onnx_protobuf::ModelProto;
use protobuf::Message as _;
use std::path::PathBuf;
use std::sync::Arc;

const LAYERS: usize = 2;
const TOLERANCE: Tolerance = Tolerance::new(1e-4, 1e-5);

fn fixture(name: &str) -> Result<PathBuf> {
    generated(&format!("decoder/{name}"))
}

fn sources() -> Result<Vec<VariantSource>> {
    ["prefill", "decode"]
        .into_iter()
        .map(|name| {
            Ok(VariantSource {
                name: name.into(),
                model: fixture(&format!("{name}.onnx"))?,
                input_shapes: Vec::new(),
            })
        })
        .collect()
}

/// Bytes of the initializers of one ONNX file: one copy of the weights.
fn initializer_bytes(path: &PathBuf) -> Result<u64> {
    let model = ModelProto::parse_from_bytes(&std::fs::read(path)?)?;
    Ok(model.graph.initializer.iter().map(|t| t.raw_data.len() as u64).sum())
}

#[test]
fn one_bundle_stores_one_copy_of_the_weights() -> Result<()> {
    let bytes = compile_variants(&sources()?, &CompileOptions::default())?;
    let bundle = Bundle::from_bytes(&bytes)?;
    let weights = bundle
        .sections()
        .find(|(kind, _)| *kind == SectionKind::Weights.name())
        .map(|(_, r)| r.len() as u64)
        .context("no weights section")?;
    let one_copy = initializer_bytes(&fixture("prefill.onnx")?)?;
    let two_copies = one_copy + initializer_bytes(&fixture("decode.onnx")?)?;
    println!("weights section {weights} bytes; one copy {one_copy}, both files {two_copies}");
    ensure!(
        weights.abs_diff(one_copy) * 100 <= one_copy,
        "the weights section ({weights} bytes) is not within 1% of one copy ({one_copy})"
    );
    let names: Vec<&str> = bundle.manifest().variants.iter().map(|v| v.name.as_str()).collect();
    ensure!(names == ["prefill", "decode"], "{names:?}");
    Ok(())
}

/// Runs `variant` of `bundle` on `devices` with `inputs` by name; the outputs by name.
fn run(
    bundle: &Arc<Bundle>,
    variant: &str,
    devices: &str,
    inputs: &[(String, Tensor)],
) -> Result<Vec<(String, Tensor)>> {
    let options = SessionOptions { variant: Some(variant.into()), ..SessionOptions::on(devices)? };
    let mut session = Session::new(Arc::clone(bundle), options)?;
    let ordered = session
        .inputs()
        .iter()
        .map(|info| {
            inputs
                .iter()
                .find(|(name, _)| *name == info.name)
                .map(|(_, t)| t.clone())
                .with_context(|| format!("no input '{}'", info.name))
        })
        .collect::<Result<Vec<_>>>()?;
    let outputs = session.run(&ordered)?;
    Ok(session.outputs().iter().map(|o| o.name.clone()).zip(outputs).collect())
}

fn check(stage: &str, outputs: &[(String, Tensor)]) -> Result<()> {
    for (name, got) in outputs {
        let want = read_npy(&fixture(&format!("{stage}_{name}.npy"))?)?;
        allclose(got, &want, TOLERANCE).map_err(|e| anyhow::anyhow!("{stage} {name}: {e}"))?;
    }
    Ok(())
}

/// Prefill, then one decode step fed with the prefill's caches and ONNX Runtime's next
/// token: logits and caches equal ONNX Runtime's at each step.
fn prefill_then_decode(devices: &str) -> Result<()> {
    let bundle =
        Arc::new(Bundle::from_bytes(&compile_variants(&sources()?, &CompileOptions::default())?)?);
    let ids = read_npy(&fixture("prefill_input_ids.npy")?)?;
    let prefill = run(&bundle, "prefill", devices, &[("input_ids".into(), ids)])?;
    check("prefill", &prefill)?;
    let mut inputs = vec![("input_ids".to_string(), read_npy(&fixture("decode_input_ids.npy")?)?)];
    for l in 0..LAYERS {
        for kind in ["key", "value"] {
            let present = prefill
                .iter()
                .find(|(name, _)| *name == format!("present_{kind}_{l}"))
                .map(|(_, t)| t.clone())
                .with_context(|| format!("prefill has no present_{kind}_{l}"))?;
            inputs.push((format!("past_{kind}_{l}"), present));
        }
    }
    let decode = run(&bundle, "decode", devices, &inputs)?;
    check("decode", &decode)
}

#[test]
fn prefill_then_decode_matches_onnx_runtime_on_the_cpu() -> Result<()> {
    prefill_then_decode("cpu")
}

#[test]
fn prefill_then_decode_matches_onnx_runtime_on_vulkan() -> Result<()> {
    let seen = ingot_runtime::vulkan::validation_messages().len();
    prefill_then_decode("vulkan:cpu")?;
    check_validation(seen)
}

/// `ingot compile`s the decoder's prefill and decode graphs into one bundle in scratch dir
/// `scratch`; returns the bundle's path and the prefill model's.
fn compile_decoder(scratch: &str) -> Result<(PathBuf, PathBuf)> {
    let out = scratch_dir(scratch).join("decoder.ingot");
    let [prefill, decode] = ["prefill", "decode"].map(|n| fixture(&format!("{n}.onnx")));
    let (prefill, decode) = (prefill?, decode?);
    let compiled = ingot([
        "compile".into(),
        format!("--variant=prefill={}", prefill.display()),
        format!("--variant=decode={}", decode.display()),
        "-o".into(),
        out.display().to_string(),
    ])?;
    expect_success("compile", &compiled)?;
    Ok((out, prefill))
}

#[test]
fn inspect_reports_the_shared_weights() -> Result<()> {
    let (out, prefill) = compile_decoder("variants/inspect")?;
    let json: serde_json::Value = serde_json::from_str(&expect_success(
        "inspect --json",
        &ingot(["inspect".as_ref(), out.as_os_str(), "--json".as_ref()])?,
    )?)?;
    let one_copy = initializer_bytes(&prefill)?;
    let unique = json["unique_weight_bytes"].as_u64().context("unique_weight_bytes")?;
    ensure!(unique.abs_diff(one_copy) * 100 <= one_copy, "{unique} vs {one_copy}");
    for v in json["variants"].as_array().context("variants")? {
        let referenced = v["referenced_weight_bytes"].as_u64().context("referenced")?;
        ensure!(
            referenced.abs_diff(one_copy) * 100 <= one_copy,
            "variant {} references {referenced} bytes, one copy is {one_copy}",
            v["name"]
        );
    }
    let text = expect_success("inspect", &ingot(["inspect".as_ref(), out.as_os_str()])?)?;
    // The sections' offsets and the producer's version are the only parts that would change
    // with unrelated work; the snapshot keeps the rest.
    let stable: String = text
        .lines()
        .filter(|l| !l.starts_with("section ") && !l.starts_with("format "))
        .map(|l| format!("{l}\n"))
        .collect();
    insta::assert_snapshot!(stable);
    Ok(())
}

/// `inspect --kernels`: every module once, with its bytes and the steps of both variants that
/// use it; the totals add up and agree with the bundle's sections and weight bank.
#[test]
fn inspect_lists_every_kernel_with_its_users() -> Result<()> {
    let (out, _) = compile_decoder("variants/inspect-kernels")?;
    let inspect = |args: &[&str]| -> Result<String> {
        let mut argv = vec!["inspect".as_ref(), out.as_os_str()];
        argv.extend(args.iter().map(|a| std::ffi::OsStr::new(*a)));
        expect_success("inspect", &ingot(argv)?)
    };
    let summary: serde_json::Value = serde_json::from_str(&inspect(&["--json"])?)?;
    let listing: serde_json::Value = serde_json::from_str(&inspect(&["--kernels", "--json"])?)?;
    let modules = listing["modules"].as_array().context("modules")?;
    ensure!(!modules.is_empty(), "the decoder has Vulkan kernels");
    ensure!(listing["kernels"] == summary["kernels"], "{listing} vs {summary}");
    ensure!(listing["weight_bytes"] == summary["unique_weight_bytes"]);
    let bytes: Vec<u64> = modules.iter().filter_map(|m| m["bytes"].as_u64()).collect();
    ensure!(bytes.len() == modules.len() && bytes.windows(2).all(|w| w[0] >= w[1]));
    ensure!(listing["kernel_bytes"].as_u64() == Some(bytes.iter().sum()));
    ensure!(listing["largest_kernel_bytes"].as_u64() == bytes.first().copied());
    let large = bytes.iter().filter(|&&b| b > 64 * 1024).count() as u64;
    ensure!(listing["kernels_over_64k"].as_u64() == Some(large));
    let mut ids: Vec<u64> = modules.iter().filter_map(|m| m["kernel"].as_u64()).collect();
    ids.sort_unstable();
    ensure!(ids == (0..modules.len() as u64).collect::<Vec<_>>(), "{ids:?}");
    for m in modules {
        let steps = m["steps"].as_array().context("steps")?;
        ensure!(!steps.is_empty(), "kernel {} has no user", m["kernel"]);
        let wg = m["workgroup_size"].as_array().context("workgroup_size")?;
        ensure!(wg.len() == 3 && wg.iter().all(|d| d.as_u64() >= Some(1)), "{m}");
    }
    let users: Vec<&str> = modules
        .iter()
        .flat_map(|m| m["steps"].as_array().into_iter().flatten())
        .filter_map(|s| s.as_str())
        .collect();
    for variant in ["prefill", "decode"] {
        ensure!(users.iter().any(|u| u.starts_with(&format!("{variant}:"))), "{users:?}");
    }
    let text = inspect(&["--kernels"])?;
    ensure!(text.lines().count() == modules.len() + 1, "{text}");
    ensure!(text.lines().last().is_some_and(|l| l.contains(" over 64 KiB")), "{text}");
    Ok(())
}

/// Prefill and decode sessions of one bundle on one Vulkan device: every weight is uploaded
/// once (the ledger has one allocation per bank entry), the peak is the unique weights plus
/// both sessions' arenas and IO buffers, dropping one session keeps what the other reads, and
/// dropping both frees everything.
#[test]
fn two_sessions_on_one_device_upload_each_weight_once() -> Result<()> {
    use ingot_runtime::ledger::Action;
    use ingot_runtime::{Ledger, MemoryKind};
    use ingot_schema::proto::AllocationKind;
    let seen = ingot_runtime::vulkan::validation_messages().len();
    let bundle =
        Arc::new(Bundle::from_bytes(&compile_variants(&sources()?, &CompileOptions::default())?)?);
    let ledger = Ledger::new();
    let open = |variant: &str| -> Result<Session> {
        let options = SessionOptions {
            variant: Some(variant.into()),
            ledger: Some(ledger.clone()),
            ..SessionOptions::on("vulkan:cpu")?
        };
        Ok(Session::new(Arc::clone(&bundle), options)?)
    };
    let prefill = open("prefill")?;
    let decode = open("decode")?;
    // What the plans say: the union of both variants' weights, each variant's arena and IO.
    let mut weights = std::collections::BTreeMap::new();
    let mut activations = 0;
    for v in &bundle.manifest().variants {
        for a in &v.plan.as_ref().context("plan")?.allocations {
            match AllocationKind::try_from(a.kind) {
                Ok(AllocationKind::Weight) => {
                    weights.insert(a.weight, a.bytes);
                }
                _ => activations += a.bytes,
            }
        }
    }
    let events = ledger.events();
    let uploads: Vec<_> = events
        .iter()
        .filter(|e| e.kind == MemoryKind::Weight && e.action == Action::Allocate)
        .collect();
    let labels: Vec<&str> = uploads.iter().map(|e| e.label.as_str()).collect();
    ensure!(
        uploads.len() == weights.len(),
        "{} weight allocations for {} bank entries: {labels:?}",
        uploads.len(),
        weights.len()
    );
    let unique: u64 = weights.values().sum();
    let uploaded: u64 = uploads.iter().map(|e| e.bytes).sum();
    ensure!(
        uploaded == unique,
        "{uploaded} weight bytes uploaded, the bank entries both variants read hold {unique}"
    );
    ensure!(
        ledger.total().peak == unique + activations,
        "peak {} != unique weights {unique} + arenas and IO {activations}",
        ledger.total().peak
    );
    drop(prefill);
    let held = ledger.usage(MemoryKind::Weight).current;
    let decode_reads: u64 = bundle.manifest().variants[1]
        .plan
        .as_ref()
        .context("plan")?
        .allocations
        .iter()
        .filter(|a| a.kind == AllocationKind::Weight as i32)
        .map(|a| a.bytes)
        .sum();
    ensure!(
        held == decode_reads,
        "after prefill dropped: {held} weight bytes held, decode reads {decode_reads}"
    );
    drop(decode);
    ensure!(ledger.total().current == 0, "{:?}", ledger.events());
    check_validation(seen)
}
