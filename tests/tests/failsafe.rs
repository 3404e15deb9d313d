//! The device fallback list: graphs cut into submodels where a step has no Vulkan kernel, every
//! preparation stage failing on purpose (feature `fault-injection`), failover while running,
//! and no Vulkan loader at all. Every run is compared with the all-CPU run, and the ledger
//! must show that a device that failed gave back everything it had allocated.
//!
//! Vulkan runs under the validation layer on lavapipe (tools/test.sh), named `vulkan:cpu`:
//! `vulkan` never picks a CPU-type device, so the default list `vulkan,cpu` runs on the CPU
//! there (tested below). No Vulkan device is a failure, not a skip.

use anyhow::{Context, Result, ensure};
use ingot_runtime::ledger::Action;
use ingot_runtime::{
    Bundle, Device, Faults, Ledger, Session, SessionError, SessionOptions, Stage, Tensor,
};
use ingot_schema::DType;
use ingot_tests::cli::{expect_clean_failure, expect_success, ingot};
use ingot_tests::model::{OnnxModel, attr_int};
use ingot_tests::paths::scratch_dir;
use ingot_tests::{Tolerance, check_validation, compile, validation_seen};
use std::sync::Arc;

const OPSET: i64 = 17;

/// y = MatMul(x, w) -> Relu -> [Cast to f64, Sqrt, Cast to f32] -> Add(relu) -> Mul(c): the
/// f64 steps have no Vulkan kernel, so the graph runs Vulkan -> CPU -> Vulkan, and the
/// residual crosses from the first submodel to the last through the boundary buffer. Both
/// Vulkan submodels read a weight.
fn split_model() -> OnnxModel {
    let w = Tensor::from_vec(vec![8, 8], &values(64, 3)).unwrap();
    let c = Tensor::from_vec(vec![8], &values(8, 5)).unwrap();
    OnnxModel::new(OPSET)
        .input("x", DType::F32, &[4, 8])
        .initializer("w", &w)
        .initializer("c", &c)
        .node("mm", "MatMul", &["x", "w"], &["m"], vec![])
        .node("relu", "Relu", &["m"], &["r"], vec![])
        .node("wide", "Cast", &["r"], &["d"], vec![attr_int("to", 11)])
        .node("root", "Sqrt", &["d"], &["s"], vec![])
        .node("narrow", "Cast", &["s"], &["n"], vec![attr_int("to", 1)])
        .node("residual", "Add", &["n", "r"], &["a"], vec![])
        .node("scale", "Mul", &["a", "c"], &["y"], vec![])
        .output("y", DType::F32, &[4, 8])
}

/// The same without the f64 detour: one submodel that Vulkan and the CPU can both run.
fn vulkan_model() -> OnnxModel {
    let w = Tensor::from_vec(vec![8, 8], &values(64, 3)).unwrap();
    OnnxModel::new(OPSET)
        .input("x", DType::F32, &[4, 8])
        .initializer("w", &w)
        .node("mm", "MatMul", &["x", "w"], &["m"], vec![])
        .node("relu", "Relu", &["m"], &["y"], vec![])
        .output("y", DType::F32, &[4, 8])
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    (0..n).map(|i| (((i as u64 * 2654435761 + seed * 97) % 1000) as f32 - 500.0) / 250.0).collect()
}

fn bundle(name: &str, model: &OnnxModel) -> Result<Arc<Bundle>> {
    let path = scratch_dir(&format!("failsafe/{name}")).join("model.onnx");
    model.write(&path)?;
    Ok(Arc::new(Bundle::from_bytes(&compile(&path, &[])?)?))
}

fn input() -> Tensor {
    Tensor::from_vec(vec![4, 8], &values(32, 11)).unwrap()
}

/// A session on `devices` with `faults` armed, and the ledger it records into.
fn open(
    bundle: &Arc<Bundle>,
    devices: &str,
    failover: bool,
    faults: Faults,
) -> Result<(Session, Ledger), SessionError> {
    let ledger = Ledger::new();
    let options = SessionOptions {
        failover,
        faults,
        ledger: Some(ledger.clone()),
        ..SessionOptions::on(devices)?
    };
    Ok((Session::new(Arc::clone(bundle), options)?, ledger))
}

/// Vulkan's MatMul sums in another order than the CPU's: equal within float rounding.
fn close(got: &Tensor, want: &Tensor) -> Result<()> {
    ingot_tests::allclose(got, want, Tolerance::new(1e-5, 1e-6)).map_err(anyhow::Error::msg)
}

fn cpu_outputs(bundle: &Arc<Bundle>) -> Result<Vec<Tensor>> {
    let (mut s, _) = open(bundle, "cpu", true, Faults::default())?;
    Ok(s.run(&[input()])?)
}

/// Devices that hold memory now, by the ledger.
fn vulkan_bytes_held(ledger: &Ledger) -> u64 {
    let devices: std::collections::BTreeSet<String> = ledger
        .events()
        .iter()
        .filter(|e| e.device.starts_with("vulkan"))
        .map(|e| e.device.to_string())
        .collect();
    devices.iter().map(|d| ledger.held_on(d)).sum()
}

#[test]
fn an_op_without_a_vulkan_kernel_splits_the_graph_vulkan_cpu_vulkan() -> Result<()> {
    let seen = validation_seen();
    let bundle = bundle("split", &split_model())?;
    let v = &bundle.manifest().variants[0];
    ensure!(v.submodels.len() == 3, "want 3 submodels: {:?}", v.submodels);
    let (mut session, _) = open(&bundle, "vulkan:cpu,cpu", true, Faults::default())?;
    let placement = session.placement();
    let devices: Vec<&str> = placement.0.iter().map(|p| p.device.as_str()).collect();
    ensure!(
        devices[0].starts_with("vulkan") && devices[1] == "cpu" && devices[2].starts_with("vulkan"),
        "want vulkan, cpu, vulkan:\n{placement}"
    );
    let why = &placement.0[1].skipped;
    ensure!(
        why.len() == 1 && why[0].stage == Stage::Kernels && why[0].reason.contains("'wide' (Cast)"),
        "the CPU submodel should say which step has no kernel:\n{placement}"
    );
    let got = session.run(&[input()])?;
    let want = cpu_outputs(&bundle)?;
    close(&got[0], &want[0])?;
    check_validation(seen)
}

#[test]
fn the_plan_text_shows_submodels_and_boundary_tensors() -> Result<()> {
    let path = scratch_dir("failsafe/plan_text").join("model.onnx");
    split_model().write(&path)?;
    let text = ingot_compiler::plan_text(&path, &Default::default())?;
    let submodels = text.split("\nsteps:").next().context("the plan text has a steps section")?;
    insta::assert_snapshot!(submodels);
    Ok(())
}

/// Each preparation stage failing on Vulkan: every submodel still runs (on the CPU), the
/// output equals the CPU's, the placement names the stage, and whatever Vulkan had allocated
/// before it failed is freed by the time the session is ready.
#[test]
fn every_injected_preparation_failure_falls_back_to_the_cpu() -> Result<()> {
    let seen = validation_seen();
    let bundle = bundle("inject_prepare", &split_model())?;
    let want = cpu_outputs(&bundle)?;
    for stage in
        [Stage::Instance, Stage::Device, Stage::Pipelines, Stage::Weights, Stage::Arena, Stage::Io]
    {
        let faults = Faults::default();
        faults.inject("vulkan", stage);
        let (mut session, ledger) = open(&bundle, "vulkan:cpu,cpu", true, faults)?;
        let placement = session.placement();
        ensure!(
            placement.0.iter().all(|p| p.device == "cpu"),
            "{stage:?}: every submodel should run on the CPU:\n{placement}"
        );
        for k in [0, 2] {
            let skip = &placement.0[k].skipped;
            ensure!(
                skip.iter().any(|s| s.stage == stage && s.device == "vulkan:cpu"),
                "{stage:?}: submodel {k} should name the stage:\n{placement}"
            );
        }
        ensure!(
            vulkan_bytes_held(&ledger) == 0,
            "{stage:?}: Vulkan memory left: {:?}",
            ledger.events()
        );
        if matches!(stage, Stage::Weights | Stage::Arena | Stage::Io) {
            let allocated = ledger
                .events()
                .iter()
                .any(|e| e.device.starts_with("vulkan") && e.action == Action::Allocate);
            ensure!(allocated, "{stage:?}: the fault fires after an allocation");
        }
        let got = session.run(&[input()])?;
        ensure!(got == want, "{stage:?}: outputs differ from the CPU's");
    }
    check_validation(seen)
}

/// The CPU failing first, with Vulkan after it in the list.
#[test]
fn a_cpu_failure_falls_over_to_vulkan() -> Result<()> {
    let seen = validation_seen();
    let bundle = bundle("inject_cpu", &vulkan_model())?;
    let want = cpu_outputs(&bundle)?;
    for stage in [Stage::Pipelines, Stage::Arena] {
        let faults = Faults::default();
        faults.inject("cpu", stage);
        let (mut session, ledger) = open(&bundle, "cpu,vulkan:cpu", true, faults)?;
        let placement = session.placement();
        ensure!(
            placement.0[0].device.starts_with("vulkan")
                && placement.0[0].skipped.iter().any(|s| s.stage == stage),
            "{stage:?}:\n{placement}"
        );
        ensure!(ledger.held_on("cpu") == 0, "{:?}", ledger.events());
        let got = session.run(&[input()])?;
        close(&got[0], &want[0])?;
    }
    check_validation(seen)
}

#[test]
fn a_failure_while_running_fails_over_to_the_next_device() -> Result<()> {
    let seen = validation_seen();
    let bundle = bundle("inject_run", &split_model())?;
    let want = cpu_outputs(&bundle)?;
    let faults = Faults::default();
    faults.inject("vulkan", Stage::Run);
    let (mut session, ledger) = open(&bundle, "vulkan:cpu,cpu", true, faults)?;
    let got = session.run(&[input()])?;
    let placement = session.placement();
    // The first submodel met the fault, moved to the CPU and ran again from its inputs.
    ensure!(
        placement.0[0].device == "cpu"
            && placement.0[0]
                .skipped
                .iter()
                .any(|s| s.stage == Stage::Run && s.reason.contains("injected")),
        "{placement}"
    );
    ensure!(placement.0[2].device.starts_with("vulkan"), "{placement}");
    close(&got[0], &want[0])?;
    // Submodel 0's Vulkan memory went with it: what Vulkan holds now is submodel 2's alone.
    let (_whole, alone) = open(&bundle, "vulkan:cpu,cpu", true, Faults::default())?;
    let (held, all) = (vulkan_bytes_held(&ledger), vulkan_bytes_held(&alone));
    ensure!(held > 0 && held < all, "{held} bytes held, {all} with submodel 0");
    let again = session.run(&[input()])?;
    ensure!(again == got, "a second run differs");
    check_validation(seen)
}

#[test]
fn without_failover_a_run_failure_is_an_error_and_the_session_stays_usable() -> Result<()> {
    let seen = validation_seen();
    let bundle = bundle("no_failover", &split_model())?;
    let want = cpu_outputs(&bundle)?;
    let faults = Faults::default();
    faults.inject("vulkan", Stage::Run);
    let (mut session, _) = open(&bundle, "vulkan:cpu,cpu", false, faults)?;
    match session.run(&[input()]) {
        Err(e @ SessionError::Vulkan(_)) => {
            ensure!(e.to_string().contains("lost"), "{e}")
        }
        other => anyhow::bail!("expected the injected device loss, got {other:?}"),
    }
    ensure!(session.placement().0[0].device.starts_with("vulkan"));
    let got = session.run(&[input()])?;
    close(&got[0], &want[0])?;
    check_validation(seen)
}

#[test]
fn a_submodel_no_device_can_run_is_a_clear_error() -> Result<()> {
    let bundle = bundle("vulkan_only", &split_model())?;
    let e = match open(&bundle, "vulkan:cpu", true, Faults::default()) {
        Err(e) => e.to_string(),
        Ok(_) => anyhow::bail!("a Vulkan-only session cannot run the f64 casts"),
    };
    ensure!(e.contains("submodel 1") && e.contains("'wide' (Cast)"), "{e}");
    let e = match open(&bundle, "vulkan,tpu", true, Faults::default()) {
        Err(e) => e.to_string(),
        Ok(_) => anyhow::bail!("tpu is no device"),
    };
    ensure!(e.contains("tpu") && e.contains("vulkan:cpu"), "{e}");
    Ok(())
}

/// The default list, `vulkan,cpu`, never runs on a CPU-type Vulkan device: where lavapipe is
/// the only Vulkan device (CI), every submodel runs on the CPU, and the placement report says
/// once, as a notice, why `vulkan` was skipped, naming the device and how to ask for it; Vulkan
/// allocates nothing. Where there is a GPU, `vulkan` takes it instead.
#[test]
fn the_default_list_leaves_a_cpu_type_vulkan_device_to_the_cpu_backend() -> Result<()> {
    let seen = validation_seen();
    let listed =
        ingot_runtime::vulkan::devices().context("Vulkan devices (a Vulkan device is required)")?;
    let cpu_types: Vec<_> = listed.iter().filter(|d| d.kind == "cpu").collect();
    ensure!(!cpu_types.is_empty(), "no CPU-type Vulkan device (lavapipe is required): {listed:?}");
    let gpu = listed.iter().any(|d| matches!(d.kind, "discrete" | "integrated" | "virtual"));
    let bundle = bundle("default_list", &split_model())?;
    let ledger = Ledger::new();
    let options = SessionOptions { ledger: Some(ledger.clone()), ..SessionOptions::default() };
    let names: Vec<String> = options.devices.iter().map(Device::name).collect();
    ensure!(names == ["vulkan", "cpu"], "the default list is {names:?}");
    let mut session = Session::new(Arc::clone(&bundle), options)?;
    let placement = session.placement();
    if gpu {
        let on_cpu_type = |device: &str| {
            cpu_types.iter().any(|d| device == format!("vulkan:{} ({})", d.index, d.name))
        };
        ensure!(
            placement.0[0].device.starts_with("vulkan:") && !on_cpu_type(&placement.0[0].device),
            "a GPU is listed ({listed:?}):\n{placement}"
        );
    } else {
        let only = match cpu_types.len() {
            1 => "only a CPU-type device",
            _ => "only CPU-type devices",
        };
        let reason = format!("Vulkan device: no usable Vulkan GPU, {only} ({}", cpu_types[0]);
        for p in &placement.0 {
            let skip = &p.skipped;
            ensure!(
                p.device == "cpu"
                    && skip.len() == 1
                    && skip[0].device == "vulkan"
                    && skip[0].stage == Stage::Device
                    && skip[0].reason.starts_with(&reason)
                    && skip[0].reason.contains("name vulkan:cpu to use"),
                "submodel {} should run on the CPU, skipping vulkan for its CPU-type device:\n\
                 {placement}",
                p.index
            );
        }
        let text = placement.to_string();
        ensure!(
            text.starts_with(&format!("notice: vulkan: device creation failed: {reason}"))
                && text.lines().filter(|l| l.starts_with("notice:")).count() == 1
                && !text.contains("  skipped"),
            "{text}"
        );
        ensure!(
            ledger.events().iter().all(|e| !e.device.starts_with("vulkan")),
            "Vulkan allocated: {:?}",
            ledger.events()
        );
    }
    let got = session.run(&[input()])?;
    close(&got[0], &cpu_outputs(&bundle)?[0])?;
    check_validation(seen)
}

/// A machine without the Vulkan loader (`INGOT_VULKAN_LOADER` names a library that does not
/// exist): `vulkan,cpu` runs on the CPU with one line of notice; `vulkan` alone is an error.
#[test]
fn without_a_vulkan_loader_the_cli_runs_on_the_cpu() -> Result<()> {
    let dir = scratch_dir("failsafe/no_loader");
    let model = dir.join("model.onnx");
    split_model().write(&model)?;
    let bundle = dir.join("model.ingot");
    let x = dir.join("x.npy");
    ingot_tests::data::write_npy(&x, &input())?;
    let compiled =
        ingot(["compile".as_ref(), model.as_os_str(), "-o".as_ref(), bundle.as_os_str()])?;
    expect_success("compile", &compiled)?;
    let run = |devices: &str, out: &str| -> Result<std::process::Output> {
        let binary = ingot_tests::paths::ingot_binary()?;
        Ok(std::process::Command::new(binary)
            .env("INGOT_VULKAN_LOADER", dir.join("no-such-libvulkan.so"))
            .args(["run".as_ref(), bundle.as_os_str(), "--devices".as_ref()])
            .arg(devices)
            .arg("--input")
            .arg(format!("x={}", x.display()))
            .arg("--output-dir")
            .arg(dir.join(out))
            .output()?)
    };
    let stdout = expect_success("run on vulkan,cpu", &run("vulkan,cpu", "out")?)?;
    let notices = stdout.lines().filter(|l| l.starts_with("notice:")).count();
    ensure!(
        notices == 1 && stdout.contains("no-such-libvulkan"),
        "want one notice line naming the loader:\n{stdout}"
    );
    ensure!(
        stdout.lines().filter(|l| l.starts_with("submodel")).count() == 3
            && !stdout.contains("  skipped"),
        "{stdout}"
    );
    let y = ingot_tests::data::read_npy(&dir.join("out/y.npy"))?;
    ensure!(y == cpu_outputs(&Arc::new(Bundle::open(&bundle)?))?[0]);
    let stderr = expect_clean_failure("run on vulkan alone", &run("vulkan", "none")?)?;
    ensure!(
        stderr.contains("no device in the list can run submodel 0")
            && stderr.contains("no-such-libvulkan"),
        "{stderr}"
    );
    Ok(())
}

/// `ingot bench --profile` on a graph cut Vulkan -> CPU -> Vulkan: every step once, in order,
/// with its submodel's device (dispatch counts on Vulkan, none on the CPU); the per-op totals
/// add up to the steps' total; the text lists every step.
#[test]
fn bench_profile_reports_every_step_on_its_device() -> Result<()> {
    let dir = scratch_dir("failsafe/profile");
    let model = dir.join("model.onnx");
    split_model().write(&model)?;
    let path = dir.join("model.ingot");
    let compiled = ingot(["compile".as_ref(), model.as_os_str(), "-o".as_ref(), path.as_os_str()])?;
    expect_success("compile", &compiled)?;
    let bench = |json: bool| -> Result<String> {
        let mut args = vec![path.as_os_str(), "--iterations".as_ref(), "2".as_ref()];
        args.extend(["--profile", "--devices", "vulkan:cpu,cpu"].map(std::ffi::OsStr::new));
        if json {
            args.push("--json".as_ref());
        }
        let output = ingot(std::iter::once("bench".as_ref()).chain(args))?;
        expect_success("bench --profile", &output)
    };
    let report: serde_json::Value = serde_json::from_str(&bench(true)?)?;
    let profile = &report["profile"];
    let bundle = Bundle::open(&path)?;
    let v = &bundle.manifest().variants[0];
    let steps = profile["steps"].as_array().context("profile.steps")?;
    ensure!(steps.len() == v.steps.len(), "{profile:#}");
    let submodel_of = |k: usize| {
        v.submodels.iter().position(|s| {
            (s.first_step as usize..(s.first_step + s.step_count) as usize).contains(&k)
        })
    };
    for (k, (row, step)) in steps.iter().zip(&v.steps).enumerate() {
        ensure!(row["index"] == k && row["name"] == step.name.as_str(), "{row}");
        ensure!(row["submodel"].as_u64().map(|s| s as usize) == submodel_of(k), "{row}");
        let on_cpu = row["device"] == "cpu";
        ensure!(on_cpu == (row["submodel"] == 1), "only submodel 1 runs on the CPU: {row}");
        ensure!(on_cpu == row["dispatches"].is_null(), "{row}");
        ensure!(row["median_ns"].is_u64(), "{row}");
    }
    let by_op: u64 = profile["by_op"]
        .as_array()
        .context("by_op")?
        .iter()
        .map(|o| o["total_ns"].as_u64().unwrap_or(0))
        .sum();
    ensure!(Some(by_op) == profile["total_ns"].as_u64(), "{profile:#}");
    let text = bench(false)?;
    ensure!(text.contains("by op") && text.contains("by step"), "{text}");
    for step in &v.steps {
        ensure!(text.lines().any(|l| l.ends_with(&format!(" {}", step.name))), "{text}");
    }
    Ok(())
}

/// `CompileOptions::cpu_only` (`ingot compile --devices cpu`): the split model's bundle has no
/// kernels section and one CPU submodel; a list that starts with Vulkan skips it saying why
/// and runs on the CPU, with the outputs of the full bundle on the CPU, bit for bit.
#[test]
fn a_cpu_only_bundle_skips_vulkan_saying_why() -> Result<()> {
    use ingot_schema::container::{Container, SectionKind};
    let path = scratch_dir("failsafe/cpu_only").join("model.onnx");
    split_model().write(&path)?;
    let options =
        ingot_compiler::CompileOptions { cpu_only: true, verify: true, ..Default::default() };
    let bytes = ingot_compiler::compile_file(&path, &options)?;
    let container = Container::parse(&bytes)?;
    ensure!(container.section(SectionKind::Kernels).is_none(), "{container:?}");
    let cpu_only = Arc::new(Bundle::from_bytes(&bytes)?);
    let m = cpu_only.manifest();
    ensure!(m.cpu_only && m.kernels.is_empty());
    ensure!(m.variants[0].submodels.len() == 1, "one submodel: nothing to cut around");
    ensure!(m.variants[0].steps.iter().all(|s| s.vulkan.is_empty()));

    let (mut session, _) = open(&cpu_only, "vulkan:cpu,cpu", true, Faults::default())?;
    let placement = session.placement();
    let skip = &placement.0[0].skipped;
    ensure!(placement.0[0].device == "cpu" && skip.len() == 1, "{placement}");
    ensure!(skip[0].stage == Stage::Kernels, "{placement}");
    ensure!(skip[0].reason.contains("compiled for the CPU only"), "{placement}");
    let full = bundle("cpu_only_full", &split_model())?;
    ensure!(
        session.run(&[input()])? == cpu_outputs(&full)?,
        "the CPU-only bundle's outputs differ"
    );
    // Deterministic, like every bundle.
    ensure!(ingot_compiler::compile_file(&path, &options)? == bytes);
    Ok(())
}
