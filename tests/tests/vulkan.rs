//! The Vulkan backend on this machine's CPU-type Vulkan device (Mesa's lavapipe), named
//! (`vulkan:cpu`, [`DeviceChoice::CpuType`]) since `vulkan` never picks one, driven directly
//! through `VulkanExecutable`: outputs equal the CPU backend's, device memory follows the
//! plan's allocation schedule event by event, and the validation layer stays silent.
//!
//! These tests fail, never skip, when no Vulkan device is found, and they must run under the
//! Khronos validation layer: run them with `INGOT_VULKAN_VALIDATION=1` (tools/test.sh exports
//! it), e.g. `INGOT_VULKAN_VALIDATION=1 cargo test -p ingot-tests --test vulkan`, or with
//! `=sync` to add synchronization validation (slower). Every warning or error the layer
//! reports fails the test that sees it.

use anyhow::{Context, Result};
use ingot_runtime::bundle::tensor_desc;
use ingot_runtime::ledger::{Action, planned_events, planned_peak};
use ingot_runtime::vulkan::{
    DeviceChoice, VulkanError, VulkanExecutable, VulkanOptions, devices, validation_messages,
};
use ingot_runtime::{
    Bundle, Device, Faults, Ledger, MemoryKind, Session, SessionError, SessionOptions, Tensor,
    TensorMut,
};
use ingot_schema::container::Container;
use ingot_schema::{DType, SectionKind, container, proto};
use ingot_tests::model::{OnnxModel, attr_int, attr_ints, attr_string};
use ingot_tests::paths::scratch_dir;
use ingot_tests::{Tolerance, allclose, compile};
use prost::Message as _;
use std::sync::Arc;

const OPSET: i64 = 17;

/// Fails unless the validation layer is on: these tests exist to run under it.
fn require_validation() {
    let setting = std::env::var("INGOT_VULKAN_VALIDATION");
    assert!(
        matches!(setting.as_deref(), Ok("1" | "sync")),
        "run the Vulkan tests with INGOT_VULKAN_VALIDATION=1 (tools/test.sh exports it), or \
         =sync for synchronization validation too; it is {setting:?}"
    );
}

fn assert_no_validation_messages() {
    let messages = validation_messages();
    assert!(messages.is_empty(), "the validation layer reported:\n{}", messages.join("\n"));
}

/// Compiles `model` (with the plan verifier on) into bundle bytes.
fn compiled(name: &str, model: &OnnxModel) -> Result<Vec<u8>> {
    let dir = scratch_dir(&format!("vulkan/{name}"));
    let path = dir.join("model.onnx");
    model.write(&path)?;
    compile(&path, &[])
}

/// Compiles `model` and opens the bundle.
fn bundle(name: &str, model: &OnnxModel) -> Result<Arc<Bundle>> {
    let bytes = compiled(name, model)?;
    Ok(Arc::new(Bundle::from_bytes(&bytes).context("open bundle")?))
}

/// `n` values in [-1, 1) from a fixed-seed generator, some exactly 0.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if i % 7 == 0 { 0.0 } else { (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0 }
        })
        .collect()
}

fn tensor(shape: &[usize], seed: u64) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_vec(shape.to_vec(), &values(n, seed)).unwrap()
}

/// Submodel 0 of variant 0 on the device `options` choose, or the backend's error.
fn prepare(
    bundle: Arc<Bundle>,
    options: &VulkanOptions,
    ledger: &Ledger,
) -> Result<VulkanExecutable, VulkanError> {
    VulkanExecutable::new(bundle, 0, 0, options, ledger, &Faults::default()).map_err(|f| {
        match f.error {
            SessionError::Vulkan(e) => match e.downcast::<VulkanError>() {
                Ok(e) => *e,
                Err(other) => panic!("expected a VulkanError at {:?}, got {other}", f.stage),
            },
            other => panic!("expected a Vulkan error at {:?}, got {other}", f.stage),
        }
    })
}

/// The options these tests run with: the CPU-type device (lavapipe), named.
fn cpu_type() -> VulkanOptions {
    VulkanOptions { device: DeviceChoice::CpuType, ..VulkanOptions::default() }
}

fn vulkan(bundle: &Arc<Bundle>, options: &VulkanOptions, ledger: &Ledger) -> VulkanExecutable {
    require_validation();
    let exe = prepare(Arc::clone(bundle), options, ledger)
        .unwrap_or_else(|e| panic!("no Vulkan executable (a Vulkan device is required): {e}"));
    assert_no_validation_messages();
    exe
}

/// Runs variant 0 on `exe`; outputs are allocated in the variant's shapes.
fn run_vulkan(exe: &mut VulkanExecutable, bundle: &Bundle, inputs: &[Tensor]) -> Vec<Tensor> {
    let v = &bundle.manifest().variants[0];
    let mut outputs: Vec<Tensor> =
        v.outputs.iter().map(|&t| Tensor::zeros(tensor_desc(&v.tensors[t as usize]))).collect();
    {
        let ins: Vec<_> = inputs.iter().map(Tensor::view).collect();
        let mut outs: Vec<TensorMut> = outputs.iter_mut().map(Tensor::view_mut).collect();
        exe.run(&ins, &mut outs).expect("Vulkan run");
    }
    assert_no_validation_messages();
    outputs
}

/// Runs every submodel of `bundle` on Vulkan, in a session with no other device (so one
/// without a kernel fails it).
fn run_vulkan_only(bundle: &Arc<Bundle>, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    require_validation();
    let options = SessionOptions { devices: vec![ingot_tests::vulkan()], ..Default::default() };
    let outputs = Session::new(Arc::clone(bundle), options)?.run(inputs)?;
    assert_no_validation_messages();
    Ok(outputs)
}

fn run_cpu(bundle: &Arc<Bundle>, inputs: &[Tensor]) -> Vec<Tensor> {
    let options = SessionOptions { devices: vec![Device::Cpu], ..SessionOptions::default() };
    let mut session = Session::new(Arc::clone(bundle), options).expect("CPU session");
    session.run(inputs).expect("CPU run")
}

/// The plan of variant 0.
fn plan(bundle: &Bundle) -> &proto::Plan {
    bundle.manifest().variants[0].plan.as_ref().unwrap()
}

/// The ledger's events without labels and totals.
fn events(ledger: &Ledger) -> Vec<(Action, MemoryKind, u64)> {
    ledger.events().into_iter().map(|e| (e.action, e.kind, e.bytes)).collect()
}

/// x -> Relu -> Neg -> Relu, and Abs(x) added back: dispatches that depend on each other (the
/// validation layer's synchronization checks see a missing barrier) and some that do not.
fn diamond(shape: &[usize]) -> OnnxModel {
    OnnxModel::new(OPSET)
        .input("x", DType::F32, shape)
        .node("r1", "Relu", &["x"], &["a"], vec![])
        .node("n", "Neg", &["a"], &["b"], vec![])
        .node("r2", "Relu", &["b"], &["c"], vec![])
        .node("abs", "Abs", &["x"], &["d"], vec![])
        .node("add", "Add", &["c", "d"], &["y"], vec![])
        .output("y", DType::F32, shape)
}

/// y = (x + w0) * w1 + w2, with weights of 12, 1000 and 4 bytes among others: three weights
/// uploaded in the plan's order.
fn with_weights() -> OnnxModel {
    OnnxModel::new(OPSET)
        .input("x", DType::F32, &[2, 250])
        .initializer("w0", &tensor(&[250], 11))
        .initializer("w1", &tensor(&[2, 1], 12))
        .initializer("w2", &tensor(&[3, 1, 1], 13))
        .node("add", "Add", &["x", "w0"], &["a"], vec![])
        .node("mul", "Mul", &["a", "w1"], &["b"], vec![])
        .node("add2", "Add", &["b", "w2"], &["y"], vec![])
        .output("y", DType::F32, &[3, 2, 250])
}

#[test]
fn a_vulkan_device_is_listed() {
    require_validation();
    let devices = devices().expect("Vulkan devices (a Vulkan device is required)");
    assert!(!devices.is_empty(), "no Vulkan device");
    for (i, d) in devices.iter().enumerate() {
        assert_eq!(d.index, i);
        assert!(["discrete", "integrated", "virtual", "cpu", "other"].contains(&d.kind));
    }
    assert_no_validation_messages();
}

#[test]
fn relu_equals_the_cpu() -> Result<()> {
    let model = OnnxModel::new(OPSET)
        .input("x", DType::F32, &[2, 3, 5])
        .node("relu", "Relu", &["x"], &["y"], vec![])
        .output("y", DType::F32, &[2, 3, 5]);
    let bundle = bundle("relu", &model)?;
    let mut exe = vulkan(&bundle, &cpu_type(), &Ledger::new());
    let x = tensor(&[2, 3, 5], 1);
    let got = run_vulkan(&mut exe, &bundle, std::slice::from_ref(&x));
    let want = run_cpu(&bundle, &[x]);
    assert_eq!(got, want);
    Ok(())
}

#[test]
fn dependent_dispatches_equal_the_cpu() -> Result<()> {
    let shape = [3, 7, 11];
    let bundle = bundle("diamond", &diamond(&shape))?;
    let mut exe = vulkan(&bundle, &cpu_type(), &Ledger::new());
    let x = tensor(&shape, 2);
    let got = run_vulkan(&mut exe, &bundle, std::slice::from_ref(&x));
    assert_eq!(got, run_cpu(&bundle, &[x]));
    Ok(())
}

/// The kernels a session's Vulkan device runs: the class `INGOT_KERNEL_CLASS` forces, else the
/// device's own (`device` as `Session::device` names it: `vulkan:N (name)`).
fn class_of(device: &str) -> proto::DeviceClass {
    match ingot_tests::kernel_class() {
        ingot_runtime::KernelClass::Gpu => proto::DeviceClass::Gpu,
        ingot_runtime::KernelClass::Cpu => proto::DeviceClass::Cpu,
        ingot_runtime::KernelClass::Auto => {
            let index = device.strip_prefix("vulkan:").and_then(|d| d.split(' ').next());
            let index: usize = index.and_then(|i| i.parse().ok()).expect("a Vulkan device");
            match devices().expect("Vulkan devices")[index].kind {
                "cpu" => proto::DeviceClass::Cpu,
                _ => proto::DeviceClass::Gpu,
            }
        }
    }
}

/// A profiled run gives the unprofiled run's outputs and one row per step in the variant's
/// order, each timed on the device that ran it: on Vulkan with its dispatch count (lavapipe
/// writes timestamps), on the CPU with none.
#[test]
fn a_profile_times_every_step_and_counts_its_dispatches() -> Result<()> {
    require_validation();
    let shape = [3, 7, 11];
    let bundle = bundle("profile", &diamond(&shape))?;
    let v = &bundle.manifest().variants[0];
    let x = tensor(&shape, 4);
    for device in [ingot_tests::vulkan(), Device::Cpu] {
        let options = SessionOptions { devices: vec![device], ..SessionOptions::default() };
        let mut session = Session::new(Arc::clone(&bundle), options)?;
        let want = session.run(std::slice::from_ref(&x))?;
        let on = session.device();
        // Twice: the first profiled run records its command buffer, the second replays it.
        for _ in 0..2 {
            let (got, profile) = session.profile(std::slice::from_ref(&x))?;
            assert_eq!(got, want, "{on}");
            let rows: Vec<(usize, &str, &str, &str)> = profile
                .iter()
                .map(|r| (r.index, r.name.as_str(), r.op.as_str(), r.device.as_str()))
                .collect();
            let labels: Vec<String> = v.steps.iter().map(|s| s.op_label()).collect();
            let steps: Vec<(usize, &str, &str, &str)> = v
                .steps
                .iter()
                .zip(&labels)
                .enumerate()
                .map(|(k, (s, label))| (k, s.name.as_str(), label.as_str(), on.as_str()))
                .collect();
            assert_eq!(rows, steps);
            for (row, step) in profile.iter().zip(&v.steps) {
                assert!(row.nanos.is_some(), "{row:?} is untimed");
                let dispatches = on.starts_with("vulkan").then(|| {
                    let entry = |c: proto::DeviceClass| {
                        step.vulkan.iter().find(|e| e.device_class == c as i32)
                    };
                    let entry = entry(class_of(&on)).or_else(|| entry(proto::DeviceClass::Any));
                    entry.map_or(0, |e| e.dispatches.len() as u32)
                });
                assert_eq!(row.dispatches, dispatches, "{row:?}");
            }
        }
    }
    assert_no_validation_messages();
    Ok(())
}

/// 4.2M floats: more than 65535 workgroups of 64 invocations, so the grid spans x and y or
/// the step takes several dispatches.
#[test]
fn one_tensor_of_over_4m_floats() -> Result<()> {
    let shape = [4_200_007];
    let bundle = bundle("large", &diamond(&shape))?;
    let dispatches = &bundle.manifest().variants[0].steps[0].vulkan[0].dispatches;
    let groups: Vec<_> = dispatches.iter().map(|d| &d.groups).collect();
    assert!(groups.len() > 1 || groups[0][1] > 1, "groups {groups:?}");
    let mut exe = vulkan(&bundle, &cpu_type(), &Ledger::new());
    let x = tensor(&shape, 3);
    let got = run_vulkan(&mut exe, &bundle, std::slice::from_ref(&x));
    assert_eq!(got, run_cpu(&bundle, &[x]));
    Ok(())
}

#[test]
fn weights_equal_the_cpu_and_memory_follows_the_plan() -> Result<()> {
    let bundle = bundle("weights", &with_weights())?;
    let plan = plan(&bundle);
    let weights =
        plan.allocations.iter().filter(|a| a.kind == proto::AllocationKind::Weight as i32).count();
    assert_eq!(weights, 3, "{plan:?}");
    let x = tensor(&[2, 250], 4);
    let want = run_cpu(&bundle, std::slice::from_ref(&x));
    let tolerance = Tolerance { rtol: 1e-6, atol: 1e-6 };
    for force_staging in [false, true] {
        let ledger = Ledger::new();
        let options = VulkanOptions { force_staging, ..cpu_type() };
        let mut exe = vulkan(&bundle, &options, &ledger);
        // A device whose memory the host cannot write stages every upload even unforced.
        let staged = force_staging || ledger.usage(MemoryKind::Staging).peak > 0;
        assert_eq!(events(&ledger), planned_events(plan, staged), "staged: {staged}");
        assert_eq!(ledger.total().peak, planned_peak(plan, staged));
        let got = run_vulkan(&mut exe, &bundle, std::slice::from_ref(&x));
        allclose(&got[0], &want[0], tolerance).map_err(anyhow::Error::msg)?;
        let loaded = ledger.events().len();
        drop(exe);
        assert_no_validation_messages();
        assert_eq!(ledger.total().current, 0);
        // Freed in reverse order of allocation (staging buffers were freed during the load).
        let frees: Vec<_> = events(&ledger).split_off(loaded);
        let mut allocations: Vec<_> = planned_events(plan, false)
            .into_iter()
            .map(|(_, kind, bytes)| (Action::Free, kind, bytes))
            .collect();
        allocations.reverse();
        assert_eq!(frees, allocations);
    }
    Ok(())
}

#[test]
fn twenty_runs_give_identical_outputs_and_allocate_nothing() -> Result<()> {
    let bundle = bundle("repeat", &with_weights())?;
    let ledger = Ledger::new();
    let mut exe = vulkan(&bundle, &cpu_type(), &ledger);
    let x = tensor(&[2, 250], 5);
    let loaded = ledger.events();
    let first = run_vulkan(&mut exe, &bundle, std::slice::from_ref(&x));
    for _ in 0..19 {
        // Different inputs in between: nothing of one run may leak into the next.
        run_vulkan(&mut exe, &bundle, &[tensor(&[2, 250], 6)]);
        assert_eq!(run_vulkan(&mut exe, &bundle, std::slice::from_ref(&x)), first);
    }
    assert_eq!(ledger.events(), loaded);
    Ok(())
}

#[test]
fn executables_share_the_device_and_free_it_last() -> Result<()> {
    let bundle = bundle("shared", &diamond(&[5]))?;
    let ledger = Ledger::new();
    let a = vulkan(&bundle, &cpu_type(), &ledger);
    let mut b = vulkan(&bundle, &cpu_type(), &ledger);
    assert_eq!(a.device(), b.device());
    drop(a);
    let x = tensor(&[5], 7);
    let got = run_vulkan(&mut b, &bundle, std::slice::from_ref(&x));
    assert_eq!(got, run_cpu(&bundle, &[x]));
    drop(b);
    assert_eq!(ledger.total().current, 0);
    assert_no_validation_messages();
    Ok(())
}

#[test]
fn an_unknown_device_index_is_an_error() {
    require_validation();
    let bundle = bundle("no_device", &diamond(&[4])).unwrap();
    let options = VulkanOptions { device: DeviceChoice::Index(1000), ..VulkanOptions::default() };
    let ledger = Ledger::new();
    match prepare(bundle, &options, &ledger) {
        // It names the index, the devices there are and how to name them.
        Err(VulkanError::Device(message)) => {
            assert!(message.contains("no Vulkan device 1000 (vulkan:1000)"), "{message}");
            assert!(message.contains("vulkan:0"), "{message}");
            assert!(message.contains("the loader reports"), "{message}");
        }
        other => panic!("expected a device error, got {other:?}"),
    }
    assert!(ledger.events().is_empty());
    assert_no_validation_messages();
}

/// `vulkan` ([`DeviceChoice::Best`]) takes a GPU, never a CPU-type device: where lavapipe is
/// the only device (CI), it is an error that names the device and how to ask for it, and
/// allocates nothing.
#[test]
fn the_best_device_is_never_cpu_type() {
    require_validation();
    let listed = devices().expect("Vulkan devices (a Vulkan device is required)");
    let cpu_types: Vec<_> = listed.iter().filter(|d| d.kind == "cpu").collect();
    assert!(!cpu_types.is_empty(), "no CPU-type Vulkan device (lavapipe is required): {listed:?}");
    let gpu = listed.iter().any(|d| matches!(d.kind, "discrete" | "integrated" | "virtual"));
    let bundle = bundle("best", &diamond(&[4])).unwrap();
    let ledger = Ledger::new();
    let best = VulkanOptions { device: DeviceChoice::Best, ..VulkanOptions::default() };
    match prepare(bundle, &best, &ledger) {
        Ok(exe) if gpu => assert_ne!(exe.device().kind, "cpu", "{}", exe.device()),
        Err(VulkanError::Device(message)) if !gpu => {
            let only = match cpu_types.len() {
                1 => "only a CPU-type device",
                _ => "only CPU-type devices",
            };
            let head = format!("no usable Vulkan GPU, {only} ({}", cpu_types[0]);
            assert!(message.starts_with(&head), "{message}");
            assert!(message.contains("name vulkan:cpu to use"), "{message}");
            assert!(ledger.events().is_empty());
        }
        other => panic!("devices {listed:?}: unexpected {other:?}"),
    }
    assert_no_validation_messages();
}

/// A step whose Vulkan entries were removed: the executable names it, and allocates nothing.
#[test]
fn a_step_without_a_kernel_is_unsupported() -> Result<()> {
    let bytes = compiled("unsupported", &diamond(&[4]))?;
    let mut manifest = Bundle::from_bytes(&bytes)?.manifest().clone();
    let step = &mut manifest.variants[0].steps[2];
    step.vulkan.clear();
    step.no_vulkan_kernel = "a test removed it".into();
    let (name, op) = (step.name.clone(), step.op.clone());
    let bundle = Arc::new(with_manifest(&bytes, &manifest)?);
    let ledger = Ledger::new();
    match prepare(bundle, &cpu_type(), &ledger) {
        Err(e @ VulkanError::Unsupported { index: 2, .. }) => {
            let message = e.to_string();
            assert!(message.contains(&name) && message.contains(&op), "{message}");
        }
        other => panic!("expected step 2 to be unsupported, got {other:?}"),
    }
    assert!(ledger.events().is_empty());
    Ok(())
}

/// The bundle `original` (file bytes) with its manifest replaced.
fn with_manifest(original: &[u8], manifest: &proto::Manifest) -> Result<Bundle> {
    let parsed = Container::parse(original)?;
    let section = |kind| parsed.section(kind).map_or(&[][..], |s| &original[s.range.clone()]);
    let mut out = Vec::new();
    container::write(
        &mut out,
        &[
            (SectionKind::Manifest, &manifest.encode_to_vec()),
            (SectionKind::Kernels, section(SectionKind::Kernels)),
            (SectionKind::Weights, section(SectionKind::Weights)),
        ],
    )?;
    Ok(Bundle::from_bytes(&out)?)
}

/// Empty tensors get no memory and no binding; the other outputs are still computed.
#[test]
fn empty_tensors_are_skipped() -> Result<()> {
    let model = OnnxModel::new(OPSET)
        .input("x", DType::F32, &[0, 3])
        .input("w", DType::F32, &[2, 3])
        .node("empty", "Relu", &["x"], &["y"], vec![])
        .node("full", "Relu", &["w"], &["z"], vec![])
        .output("y", DType::F32, &[0, 3])
        .output("z", DType::F32, &[2, 3]);
    let bundle = bundle("empty", &model)?;
    let ledger = Ledger::new();
    let mut exe = vulkan(&bundle, &cpu_type(), &ledger);
    assert_eq!(events(&ledger), planned_events(plan(&bundle), false));
    let inputs = [tensor(&[0, 3], 8), tensor(&[2, 3], 9)];
    let got = run_vulkan(&mut exe, &bundle, &inputs);
    assert_eq!(got, run_cpu(&bundle, &inputs));
    Ok(())
}

/// Runs the ignored test `name` of this binary in a child process with `env` set (the loader
/// reads its environment once per process); returns its output.
fn child(name: &str, env: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args(["--exact", name, "--ignored", "--nocapture", "--test-threads=1"])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("1 passed"), "{name}:\n{text}");
    text
}

#[test]
fn no_driver_is_an_error() {
    require_validation();
    let nowhere = "/nonexistent/ingot_icd.json";
    child("without_a_driver", &[("VK_ICD_FILENAMES", nowhere), ("VK_DRIVER_FILES", nowhere)]);
}

#[test]
#[ignore = "run by no_driver_is_an_error in a process that has no Vulkan driver"]
fn without_a_driver() {
    let e = devices().unwrap_err();
    eprintln!("{e}");
    assert!(matches!(e, VulkanError::Instance(_)), "{e}");
    let bundle = bundle("no_driver", &diamond(&[4])).unwrap();
    let ledger = Ledger::new();
    let e = prepare(bundle, &cpu_type(), &ledger).unwrap_err();
    assert!(matches!(e, VulkanError::Instance(_)), "{e}");
    assert!(ledger.events().is_empty());
}

#[test]
fn a_missing_validation_layer_is_an_error() {
    require_validation();
    child(
        "without_the_validation_layer",
        &[("VK_LOADER_LAYERS_DISABLE", "VK_LAYER_KHRONOS_validation")],
    );
}

#[test]
#[ignore = "run by a_missing_validation_layer_is_an_error with the layer disabled"]
fn without_the_validation_layer() {
    match devices() {
        Err(VulkanError::Instance(message)) => {
            eprintln!("{message}");
            assert!(message.contains("VK_LAYER_KHRONOS_validation"), "{message}")
        }
        other => panic!("expected an instance error, got {other:?}"),
    }
}

/// A crop of a graph input is a view 12 bytes into it (bound from 0, push-constant word 3);
/// the result is reshaped into the output.
#[test]
fn views_of_inputs_and_outputs_equal_the_cpu() -> Result<()> {
    let ints = |v: &[i64]| Tensor::from_vec(vec![v.len()], v).unwrap();
    let model = OnnxModel::new(OPSET)
        .input("x", DType::F32, &[4, 3])
        .initializer("starts", &ints(&[1]))
        .initializer("ends", &ints(&[3]))
        .initializer("axes", &ints(&[0]))
        .initializer("flat", &ints(&[6]))
        .node("crop", "Slice", &["x", "starts", "ends", "axes"], &["c"], vec![])
        .node("relu", "Relu", &["c"], &["r"], vec![])
        .node("flatten", "Reshape", &["r", "flat"], &["y"], vec![])
        .output("y", DType::F32, &[6]);
    let bundle = bundle("views", &model)?;
    let v = &bundle.manifest().variants[0];
    let crop = proto::storage::Kind::View(proto::View { of: 0, byte_offset: 12 });
    assert!(
        v.tensors.iter().any(|t| t.storage.as_ref().and_then(|s| s.kind.as_ref()) == Some(&crop)),
        "the crop should be a view 12 bytes into x: {v:?}"
    );
    let mut exe = vulkan(&bundle, &cpu_type(), &Ledger::new());
    let x = tensor(&[4, 3], 10);
    let got = run_vulkan(&mut exe, &bundle, std::slice::from_ref(&x));
    assert_eq!(got, run_cpu(&bundle, &[x]));
    Ok(())
}

/// An allocation that fails after others were made frees everything made before it: the
/// bundle is edited so that an unused 1 TiB input joins the submodel's IO buffer, larger than
/// any device allocates.
#[test]
fn a_failed_load_frees_what_it_allocated() -> Result<()> {
    let model = with_weights().input("huge", DType::F32, &[1 << 38]);
    let bytes = compiled("failed_load", &model)?;
    let mut manifest = Bundle::from_bytes(&bytes)?.manifest().clone();
    let v = &mut manifest.variants[0];
    let huge = v.inputs[v.inputs.len() - 1];
    let sub = &mut v.submodels[0];
    sub.inputs.push(huge);
    let io = (sub.first_allocation + sub.allocation_count - 1) as usize;
    let plan = v.plan.as_mut().context("plan")?;
    assert_eq!(plan.allocations[io].kind, proto::AllocationKind::Io as i32);
    plan.allocations[io].bytes += 4 << 38;
    let bundle = Arc::new(with_manifest(&bytes, &manifest)?);
    require_validation();
    let ledger = Ledger::new();
    match prepare(bundle, &cpu_type(), &ledger) {
        Err(VulkanError::Limits { .. } | VulkanError::Allocation { .. }) => {}
        other => panic!("expected the IO buffer to fail, got {other:?}"),
    }
    let events = events(&ledger);
    let allocated = events.iter().filter(|e| e.0 == Action::Allocate).count();
    assert!(allocated >= 4, "weights and arena come first: {events:?}");
    assert_eq!(ledger.total().current, 0, "{events:?}");
    assert_no_validation_messages();
    Ok(())
}

/// A session of `bundle` on Vulkan alone, recording into `ledger`.
fn vulkan_session(bundle: &Arc<Bundle>, force_staging: bool, ledger: &Ledger) -> Session {
    require_validation();
    let options = SessionOptions {
        devices: vec![Device::Vulkan(VulkanOptions { force_staging, ..cpu_type() })],
        ledger: Some(ledger.clone()),
        ..SessionOptions::default()
    };
    let session = Session::new(Arc::clone(bundle), options)
        .unwrap_or_else(|e| panic!("no Vulkan session (a Vulkan device is required): {e}"));
    assert_no_validation_messages();
    session
}

/// A driver may allocate more than a buffer asks (memory requirements rounded to its own
/// granularity; an NVIDIA driver's exceeded the plan by up to 744 bytes on PP-OCR). lavapipe,
/// made coarser by `allocation_granularity`, plays such a device: the ledger is the plan's
/// schedule with each buffer rounded as the device rounds it, and the session's planned
/// device peak, which asks the device, is the ledger's peak, staged or not.
#[test]
fn the_planned_peak_follows_the_devices_rounding() -> Result<()> {
    use ingot_runtime::ledger::{peak_of, planned_events_placed};
    let bundle = bundle("rounding", &with_weights())?;
    let v = &bundle.manifest().variants[0];
    let x = tensor(&[2, 250], 18);
    let want = run_cpu(&bundle, std::slice::from_ref(&x));
    for granularity in [1, 256, 4096] {
        for force_staging in [false, true] {
            require_validation();
            let ledger = Ledger::new();
            let device =
                VulkanOptions { force_staging, allocation_granularity: granularity, ..cpu_type() };
            let options = SessionOptions {
                devices: vec![Device::Vulkan(device)],
                ledger: Some(ledger.clone()),
                ..SessionOptions::default()
            };
            let mut session = Session::new(Arc::clone(&bundle), options)?;
            let staged = force_staging || ledger.usage(MemoryKind::Staging).peak > 0;
            // lavapipe allocates exactly what is asked (whole words, as the plan's sizes are).
            let plan = planned_events_placed(v, &[true], staged);
            let rounded: Vec<_> = plan
                .iter()
                .map(|&(a, k, bytes)| (a, k, bytes.next_multiple_of(granularity)))
                .collect();
            let case = format!("granularity {granularity}, staged {staged}");
            assert_eq!(events(&ledger), rounded, "{case}");
            assert_eq!(session.planned_device_peak(), ledger.total().peak, "{case}");
            if granularity > 1 {
                assert!(ledger.total().peak > peak_of(plan), "{case}: nothing was rounded");
            }
            let got = session.run(std::slice::from_ref(&x))?;
            allclose(&got[0], &want[0], Tolerance::new(1e-6, 1e-6)).map_err(anyhow::Error::msg)?;
            drop(session);
            assert_eq!(ledger.total().current, 0, "{case}");
            assert_no_validation_messages();
        }
    }
    Ok(())
}

/// The labels of the weights the ledger shows allocated (or freed), sorted.
fn weight_labels(ledger: &Ledger, action: Action) -> Vec<String> {
    let mut labels: Vec<String> = ledger
        .events()
        .into_iter()
        .filter(|e| e.kind == MemoryKind::Weight && e.action == action)
        .map(|e| e.label)
        .collect();
    labels.sort();
    labels
}

/// Two sessions of one bundle on one device, staged or not: the second uploads nothing (the
/// ledger is the plan's schedule once, then without weights); dropping the first keeps every
/// weight, dropping the second frees each once.
#[test]
fn two_sessions_of_one_bundle_upload_each_weight_once() -> Result<()> {
    use ingot_runtime::ledger::{peak_of, planned_events_shared};
    let bundle = bundle("two_sessions", &with_weights())?;
    let v = &bundle.manifest().variants[0];
    let x = tensor(&[2, 250], 14);
    let want = run_cpu(&bundle, std::slice::from_ref(&x));
    let tolerance = Tolerance { rtol: 1e-6, atol: 1e-6 };
    for force_staging in [false, true] {
        let ledger = Ledger::new();
        let mut first = vulkan_session(&bundle, force_staging, &ledger);
        // A device whose memory the host cannot write stages every upload even unforced.
        let staged = force_staging || ledger.usage(MemoryKind::Staging).peak > 0;
        let mut second = vulkan_session(&bundle, force_staging, &ledger);
        let mut resident = std::collections::BTreeSet::new();
        let mut planned = planned_events_shared(v, &[true], staged, &mut resident);
        let alone = planned.len();
        planned.extend(planned_events_shared(v, &[true], staged, &mut resident));
        assert_eq!(events(&ledger), planned, "staged: {staged}");
        assert_eq!(events(&ledger)[..alone], planned_events(plan(&bundle), staged));
        assert_eq!(ledger.total().peak, peak_of(planned));
        assert_eq!(weight_labels(&ledger, Action::Allocate).len(), 3);
        for session in [&mut first, &mut second] {
            let got = session.run(std::slice::from_ref(&x))?;
            allclose(&got[0], &want[0], tolerance).map_err(anyhow::Error::msg)?;
        }
        let weights = ledger.usage(MemoryKind::Weight).current;
        let loaded = ledger.events().len();
        drop(first);
        let freed = events(&ledger).split_off(loaded);
        assert!(
            !freed.is_empty()
                && freed.iter().all(|e| e.0 == Action::Free && e.1 != MemoryKind::Weight),
            "the first session frees its arena and IO buffer only: {freed:?}"
        );
        assert_eq!(ledger.usage(MemoryKind::Weight).current, weights);
        let x2 = tensor(&[2, 250], 15);
        let got = second.run(std::slice::from_ref(&x2))?;
        let want2 = run_cpu(&bundle, &[x2]);
        allclose(&got[0], &want2[0], tolerance).map_err(anyhow::Error::msg)?;
        drop(second);
        assert_eq!(ledger.total().current, 0);
        assert_eq!(weight_labels(&ledger, Action::Free), weight_labels(&ledger, Action::Allocate));
    }
    assert_no_validation_messages();
    Ok(())
}

/// A shared weight stays in the ledger of the session that uploaded it, allocated and freed,
/// even when another session, with its own ledger, is the last to use it.
#[test]
fn a_shared_weight_is_recorded_by_its_uploader() -> Result<()> {
    let bundle = bundle("uploader", &with_weights())?;
    let (mine, theirs) = (Ledger::new(), Ledger::new());
    let first = vulkan_session(&bundle, false, &mine);
    let second = vulkan_session(&bundle, false, &theirs);
    let uploaded = weight_labels(&mine, Action::Allocate);
    assert_eq!(uploaded.len(), 3);
    assert!(weight_labels(&theirs, Action::Allocate).is_empty());
    let weights = mine.usage(MemoryKind::Weight).current;
    drop(first);
    assert_eq!(mine.total().current, weights, "{:?}", mine.events());
    drop(second);
    assert_eq!(weight_labels(&mine, Action::Free), uploaded);
    assert_eq!(mine.total().current, 0);
    assert!(weight_labels(&theirs, Action::Free).is_empty());
    assert_eq!(theirs.total().current, 0);
    assert_no_validation_messages();
    Ok(())
}

/// `w` is read before and after an f64 detour that has no Vulkan kernel, so the graph runs
/// Vulkan -> CPU -> Vulkan and both Vulkan submodels list `w` in their schedule: it is
/// uploaded once.
#[test]
fn two_submodels_reading_one_weight_allocate_it_once() -> Result<()> {
    use ingot_runtime::ledger::planned_events_shared;
    let w = tensor(&[8], 16);
    let model = OnnxModel::new(OPSET)
        .input("x", DType::F32, &[4, 8])
        .initializer("w", &w)
        .node("shift", "Add", &["x", "w"], &["a"], vec![])
        .node("relu", "Relu", &["a"], &["r"], vec![])
        .node("wide", "Cast", &["r"], &["d"], vec![attr_int("to", 11)])
        .node("root", "Sqrt", &["d"], &["s"], vec![])
        .node("narrow", "Cast", &["s"], &["n"], vec![attr_int("to", 1)])
        .node("scale", "Mul", &["n", "w"], &["y"], vec![])
        .output("y", DType::F32, &[4, 8]);
    let bundle = bundle("one_weight_two_submodels", &model)?;
    let v = &bundle.manifest().variants[0];
    assert_eq!(v.submodels.len(), 3, "{:?}", v.submodels);
    let listed: Vec<u32> = plan(&bundle)
        .allocations
        .iter()
        .filter(|a| a.kind == proto::AllocationKind::Weight as i32)
        .map(|a| a.weight)
        .collect();
    assert!(
        listed.len() == 2 && listed[0] == listed[1],
        "submodels 0 and 2 should both list the weight: {listed:?}"
    );
    require_validation();
    let ledger = Ledger::new();
    let options =
        SessionOptions { ledger: Some(ledger.clone()), ..SessionOptions::on("vulkan:cpu,cpu")? };
    let mut session = Session::new(Arc::clone(&bundle), options)?;
    let placement = session.placement();
    let on_vulkan: Vec<bool> = placement.0.iter().map(|p| p.device.starts_with("vulkan")).collect();
    assert_eq!(on_vulkan, [true, false, true], "{placement}");
    let staged = ledger.usage(MemoryKind::Staging).peak > 0;
    let planned = planned_events_shared(v, &on_vulkan, staged, &mut Default::default());
    assert_eq!(events(&ledger), planned);
    assert_eq!(session.planned_device_peak(), ledger.total().peak);
    assert_eq!(weight_labels(&ledger, Action::Allocate).len(), 1);
    let x = tensor(&[4, 8], 17);
    let got = session.run(std::slice::from_ref(&x))?;
    let want = run_cpu(&bundle, &[x]);
    allclose(&got[0], &want[0], Tolerance::new(1e-6, 1e-6)).map_err(anyhow::Error::msg)?;
    drop(session);
    assert_eq!(ledger.total().current, 0);
    assert_eq!(weight_labels(&ledger, Action::Free).len(), 1);
    assert_no_validation_messages();
    Ok(())
}

/// Sessions of one bundle created at the same moment on several threads: one uploads each
/// weight, the others wait for it and share it.
#[test]
fn sessions_created_on_several_threads_upload_each_weight_once() -> Result<()> {
    let bundle = bundle("threads", &with_weights())?;
    let x = tensor(&[2, 250], 18);
    let want = run_cpu(&bundle, std::slice::from_ref(&x));
    let ledger = Ledger::new();
    const THREADS: usize = 4;
    let (start, created) = (std::sync::Barrier::new(THREADS), std::sync::Barrier::new(THREADS));
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                start.wait();
                let mut session = vulkan_session(&bundle, false, &ledger);
                // Every session lives until all are made, so none can upload after another
                // dropped a weight.
                created.wait();
                let got = session.run(std::slice::from_ref(&x)).expect("Vulkan run");
                allclose(&got[0], &want[0], Tolerance::new(1e-6, 1e-6)).unwrap();
            });
        }
    });
    assert_eq!(weight_labels(&ledger, Action::Allocate).len(), 3);
    assert_eq!(weight_labels(&ledger, Action::Free), weight_labels(&ledger, Action::Allocate));
    assert_eq!(ledger.total().current, 0);
    assert_no_validation_messages();
    Ok(())
}

/// Recurrent layers over sequences longer than one dispatch runs (`rnn.wgsl` runs them in
/// chunks): the state carried between chunks in Y_h, or in Y when the layer has neither Y_h nor
/// Y_c; rows of W and R that are not whole vectors; sequence lengths that end inside a chunk.
#[test]
fn long_recurrent_sequences_equal_the_cpu() -> Result<()> {
    // Weights of a contracting recurrence (spectral radius about 1/2), so that rounding
    // differences fade instead of growing over the steps.
    let weights = |shape: &[usize], seed| {
        let scale = 0.5 * (3.0 / shape[2] as f32).sqrt();
        let n = shape.iter().product();
        let v: Vec<f32> = values(n, seed).iter().map(|v| v * scale).collect();
        Tensor::from_vec(shape.to_vec(), &v).unwrap()
    };
    // A GRU of hidden 130 (scalar loads, the second pass over r ⊙ h) with Y and Y_h.
    let (seq, batch, input, hidden) = (450, 2, 36, 130);
    let gru = OnnxModel::new(OPSET)
        .input("x", DType::F32, &[seq, batch, input])
        .initializer("W", &weights(&[1, 3 * hidden, input], 11))
        .initializer("R", &weights(&[1, 3 * hidden, hidden], 12))
        .initializer("B", &tensor(&[1, 6 * hidden], 13))
        .initializer("lens", &Tensor::from_vec(vec![batch], &[450i32, 300])?)
        .node(
            "gru",
            "GRU",
            &["x", "W", "R", "B", "lens"],
            &["y", "y_h"],
            vec![attr_int("hidden_size", hidden as i64)],
        )
        .output("y", DType::F32, &[seq, 1, batch, hidden])
        .output("y_h", DType::F32, &[1, batch, hidden]);
    // A bidirectional LSTM of hidden 132 with Y only, batch-major.
    let (seq, batch, input, hidden) = (400, 2, 64, 132);
    let lstm = OnnxModel::new(OPSET)
        .input("x", DType::F32, &[batch, seq, input])
        .initializer("W", &weights(&[2, 4 * hidden, input], 14))
        .initializer("R", &weights(&[2, 4 * hidden, hidden], 15))
        .initializer("lens", &Tensor::from_vec(vec![batch], &[350i64, 400])?)
        .node(
            "lstm",
            "LSTM",
            &["x", "W", "R", "", "lens"],
            &["y"],
            vec![
                attr_int("hidden_size", hidden as i64),
                attr_int("layout", 1),
                attr_string("direction", "bidirectional"),
            ],
        )
        .output("y", DType::F32, &[batch, seq, 2, hidden]);
    let tolerance = Tolerance { rtol: 1e-4, atol: 1e-4 };
    for (name, model, x) in [("long_gru", gru, [450, 2, 36]), ("long_lstm", lstm, [2, 400, 64])] {
        let bundle = bundle(name, &model)?;
        // Each class's kernel of the one step takes several dispatches.
        let steps = &bundle.manifest().variants[0].steps;
        let dispatches: Vec<usize> =
            steps.iter().flat_map(|s| &s.vulkan).map(|e| e.dispatches.len()).collect();
        assert!(!dispatches.is_empty() && dispatches.iter().all(|&n| n >= 2), "{dispatches:?}");
        let mut exe = vulkan(&bundle, &cpu_type(), &Ledger::new());
        let x = tensor(&x, 16);
        let got = run_vulkan(&mut exe, &bundle, std::slice::from_ref(&x));
        let want = run_cpu(&bundle, &[x]);
        for (g, w) in got.iter().zip(&want) {
            allclose(g, w, tolerance).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        }
    }
    Ok(())
}

/// Einsum in float32, in the forms of ONNX's node tests (which use double, which the Vulkan
/// kernels do not take): a batched diagonal, a batched product, an inner product to a scalar,
/// a sum and a transpose.
#[test]
fn einsum_equals_the_cpu() -> Result<()> {
    // (equation, input shapes, output shape)
    type Form<'a> = (&'a str, &'a [&'a [usize]], &'a [usize]);
    let forms: [Form; 5] = [
        ("...ii ->...i", &[&[3, 5, 5]], &[3, 5]),
        ("bij, bjk -> bik", &[&[5, 2, 3], &[5, 3, 4]], &[5, 2, 4]),
        ("i,i", &[&[5], &[5]], &[]),
        ("ij->i", &[&[3, 4]], &[3]),
        ("ij->ji", &[&[3, 4]], &[4, 3]),
    ];
    let mut model = OnnxModel::new(OPSET);
    let mut inputs = Vec::new();
    for (k, (equation, shapes, out)) in forms.iter().enumerate() {
        let names: Vec<String> = (0..shapes.len()).map(|i| format!("x{k}_{i}")).collect();
        for (name, shape) in names.iter().zip(shapes.iter()) {
            model = model.input(name, DType::F32, shape);
            inputs.push(tensor(shape, 20 + inputs.len() as u64));
        }
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let y = format!("y{k}");
        model = model
            .node(
                &format!("einsum{k}"),
                "Einsum",
                &names,
                &[&y],
                vec![attr_string("equation", equation)],
            )
            .output(&y, DType::F32, out);
    }
    let bundle = bundle("einsum", &model)?;
    // Every step runs on Vulkan.
    let steps = &bundle.manifest().variants[0].steps;
    assert!(steps.iter().all(|s| s.op == "Einsum" && !s.vulkan.is_empty()), "{steps:?}");
    let mut exe = vulkan(&bundle, &cpu_type(), &Ledger::new());
    let got = run_vulkan(&mut exe, &bundle, &inputs);
    let want = run_cpu(&bundle, &inputs);
    let tolerance = Tolerance { rtol: 1e-5, atol: 1e-6 };
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        allclose(g, w, tolerance).map_err(|e| anyhow::anyhow!("{}: {e}", forms[k].0))?;
    }
    Ok(())
}

/// SiLU written as exporters write it, `x * Sigmoid(x)`: after a Conv and a MatMul it becomes
/// their `Swish` post-op, alone one `Swish` step; every step runs on Vulkan and equals the
/// CPU, which equals x · sigmoid(x) computed here.
#[test]
fn silu_fused_or_alone_equals_the_cpu() -> Result<()> {
    let silu = |m: OnnxModel, x: &str, y: &str| {
        let s = format!("{y}_sigmoid");
        m.node(&s, "Sigmoid", &[x], &[&s], vec![]).node(y, "Mul", &[x, &s], &[y], vec![])
    };
    let mut model = OnnxModel::new(OPSET)
        .input("x", DType::F32, &[1, 3, 8, 8])
        .input("a", DType::F32, &[6, 16])
        .input("z", DType::F32, &[40])
        .initializer("w", &tensor(&[4, 3, 3, 3], 40))
        .initializer("b", &tensor(&[4], 41))
        .initializer("w2", &tensor(&[16, 5], 42))
        .node("conv", "Conv", &["x", "w", "b"], &["c"], vec![attr_ints("pads", &[1, 1, 1, 1])])
        .node("matmul", "MatMul", &["a", "w2"], &["m"], vec![]);
    model = silu(silu(silu(model, "c", "y1"), "m", "y2"), "z", "y3");
    let model = model
        .output("y1", DType::F32, &[1, 4, 8, 8])
        .output("y2", DType::F32, &[6, 5])
        .output("y3", DType::F32, &[40]);
    let bundle = bundle("silu", &model)?;
    let steps = &bundle.manifest().variants[0].steps;
    let ops: Vec<String> = steps.iter().map(|s| s.op_label()).collect();
    assert_eq!(ops, ["Conv+Swish", "MatMul+Swish", "Swish"]);
    assert!(steps.iter().all(|s| !s.vulkan.is_empty()), "every step has a Vulkan kernel");
    // Where exp overflows: x / inf is -0, and x itself at the other end.
    let mut zs = values(40, 45);
    zs[..2].copy_from_slice(&[-200.0, 200.0]);
    let z = Tensor::from_vec(vec![40], &zs)?;
    let inputs = [tensor(&[1, 3, 8, 8], 43), tensor(&[6, 16], 44), z];
    let mut exe = vulkan(&bundle, &cpu_type(), &Ledger::new());
    let got = run_vulkan(&mut exe, &bundle, &inputs);
    let want = run_cpu(&bundle, &inputs);
    let tolerance = Tolerance { rtol: 1e-5, atol: 1e-6 };
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        allclose(g, w, tolerance).map_err(|e| anyhow::anyhow!("output {k}: {e}"))?;
    }
    let direct: Vec<f32> = zs.iter().map(|&x| x * (1.0 / (1.0 + (-x).exp()))).collect();
    let direct = Tensor::from_vec(vec![40], &direct)?;
    allclose(&want[2], &direct, tolerance).map_err(anyhow::Error::msg)
}

/// A conv of one channel with long windows (an audio front end's STFT: 258 windows of 256
/// taps at stride 128, then a Relu), which runs as one matrix product read through strides.
#[test]
fn long_window_conv_equals_the_cpu() -> Result<()> {
    let model = OnnxModel::new(OPSET)
        .input("x", DType::F32, &[2, 1, 832])
        .initializer("w", &tensor(&[258, 1, 256], 30))
        .initializer("b", &tensor(&[258], 31))
        .node(
            "stft",
            "Conv",
            &["x", "w", "b"],
            &["s"],
            vec![attr_ints("kernel_shape", &[256]), attr_ints("strides", &[128])],
        )
        .node("relu", "Relu", &["s"], &["y"], vec![])
        .output("y", DType::F32, &[2, 258, 5]);
    let bundle = bundle("long_window", &model)?;
    let mut exe = vulkan(&bundle, &cpu_type(), &Ledger::new());
    let x = tensor(&[2, 1, 832], 32);
    let got = run_vulkan(&mut exe, &bundle, std::slice::from_ref(&x));
    let want = run_cpu(&bundle, &[x]);
    allclose(&got[0], &want[0], Tolerance { rtol: 1e-4, atol: 1e-5 }).map_err(anyhow::Error::msg)
}

/// A pipeline cache file: the first executable writes it (starting with the device's header:
/// size 32, version 1, vendor, device, cache UUID), later ones read it; a file of another
/// device or driver, or one that is not a cache at all, is ignored and replaced. The outputs
/// never change and the validation layer stays silent.
#[test]
fn a_pipeline_cache_file_is_written_reused_and_replaced_when_foreign() -> Result<()> {
    let bundle = bundle("pipeline_cache", &with_weights())?;
    let path = scratch_dir("vulkan/pipeline_cache").join("pipelines.bin");
    let _ = std::fs::remove_file(&path);
    let options = VulkanOptions { pipeline_cache: Some(path.clone()), ..cpu_type() };
    let x = tensor(&[2, 250], 3);
    let want = run_cpu(&bundle, std::slice::from_ref(&x));
    let run = || {
        let mut exe = vulkan(&bundle, &options, &Ledger::new());
        let got = run_vulkan(&mut exe, &bundle, std::slice::from_ref(&x));
        allclose(&got[0], &want[0], Tolerance { rtol: 1e-6, atol: 1e-6 }).unwrap();
    };
    run();
    let written = std::fs::read(&path).context("the first executable writes the cache")?;
    let word =
        |bytes: &[u8], i: usize| u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
    assert!(written.len() >= 32, "{} bytes", written.len());
    assert_eq!((word(&written, 0), word(&written, 1)), (32, 1), "header size and version");
    let header = written[..32].to_vec();
    println!("pipeline cache: {} bytes", written.len());
    run();
    assert_eq!(std::fs::read(&path)?[..32], header, "read back, still this device's");

    let mut foreign = written.clone();
    foreign[16] ^= 0xff; // another driver build: its cache UUID differs
    for (what, bytes) in [("another driver's", foreign), ("not a cache", b"junk".repeat(40))] {
        std::fs::write(&path, &bytes)?;
        run();
        let now = std::fs::read(&path)?;
        assert_eq!(now[..32], header, "{what}: replaced by this device's cache");
    }
    assert_no_validation_messages();
    Ok(())
}

/// Every cast from and to the types held one value per byte (minifloats, 2- and 4-bit
/// integers) gives the CPU's bytes exactly: from every code of each, and to each from every
/// float16 value, a sweep over f32's bit patterns (E8M0 rounds on bits float16 lacks) and the
/// integers around the small types' ranges.
#[test]
fn casts_of_byte_types_equal_the_cpu_bit_for_bit() -> Result<()> {
    let minifloats = [
        DType::F8E4M3FN,
        DType::F8E4M3FNUZ,
        DType::F8E5M2,
        DType::F8E5M2FNUZ,
        DType::F8E8M0,
        DType::F4E2M1,
    ];
    let small_ints = [DType::I4, DType::U4, DType::I2, DType::U2];
    let mut floats: Vec<f32> = (0..=u16::MAX).map(|b| half::f16::from_bits(b).to_f32()).collect();
    floats.extend((0..1u64 << 16).map(|k| f32::from_bits((k * 65_521) as u32)));
    let ints: Vec<i32> = (-300..300).collect();
    let to = |d: DType| attr_int("to", d.onnx_code().into());
    let mut model = OnnxModel::new(25).input("x", DType::F32, &[floats.len()]).input(
        "n",
        DType::I32,
        &[ints.len()],
    );
    let mut inputs = vec![
        Tensor::from_vec(vec![floats.len()], &floats)?,
        Tensor::from_vec(vec![ints.len()], &ints)?,
    ];
    let mut outputs = 0;
    let mut cast = |model: OnnxModel, x: &str, d: DType, len: usize, attrs| {
        outputs += 1;
        let y = format!("y{outputs}");
        model.node(&y, "Cast", &[x], &[&y], attrs).output(&y, d, &[len])
    };
    for d in minifloats {
        // Every code, decoded to f32 and float16.
        let codes = if d == DType::F4E2M1 { 16 } else { 256 };
        let name = format!("codes_{d}");
        model = model.input(&name, d, &[codes]);
        let bytes: Vec<u8> = (0..codes).map(|b| b as u8).collect();
        inputs.push(Tensor::from_bytes(ingot_runtime::TensorDesc::new(d, [codes]), &bytes)?);
        for t in [DType::F32, DType::F16] {
            model = cast(model, &name, t, codes, vec![to(t)]);
        }
        // Floats encoded, saturating or not (E8M0: each rounding).
        let modes: Vec<Vec<_>> = match d {
            DType::F8E8M0 => ["up", "down", "nearest"]
                .iter()
                .flat_map(|m| {
                    [0, 1].map(|s| vec![attr_string("round_mode", m), attr_int("saturate", s)])
                })
                .collect(),
            _ => vec![vec![attr_int("saturate", 0)], vec![attr_int("saturate", 1)]],
        };
        for attrs in modes {
            let attrs = [vec![to(d)], attrs].concat();
            model = cast(model, "x", d, floats.len(), attrs);
        }
        model = cast(model, "n", d, ints.len(), vec![to(d)]);
    }
    for d in small_ints {
        model = cast(model, "x", d, floats.len(), vec![to(d)]);
        model = cast(model, "n", d, ints.len(), vec![to(d)]);
    }
    // The casts are independent: the partition makes each its own submodel.
    let bundle = bundle("byte_casts", &model)?;
    let got = run_vulkan_only(&bundle, &inputs)?;
    let want = run_cpu(&bundle, &inputs);
    assert_eq!(got.len(), outputs);
    for (k, (got, want)) in got.iter().zip(&want).enumerate() {
        let differ = got.bytes().iter().zip(want.bytes()).filter(|(g, w)| g != w).count();
        assert_eq!(differ, 0, "output y{}: {differ} bytes differ ({:?})", k + 1, got.desc());
    }
    Ok(())
}

/// CumProd (its ONNX node tests feed the axis as an input, which Ingot needs constant): on
/// Vulkan as on the CPU, and the CPU as numpy's `cumprod`.
#[test]
fn cum_prod_equals_the_cpu_and_numpy() -> Result<()> {
    let axis = Tensor::from_vec(vec![], &[1i64])?;
    let model = OnnxModel::new(OPSET)
        .input("x", DType::F32, &[2, 3, 4])
        .input("n", DType::I32, &[2, 3])
        .initializer("axis", &axis)
        .node("f", "CumProd", &["x", "axis"], &["y"], vec![attr_int("reverse", 1)])
        .node("i", "CumProd", &["n", "axis"], &["m"], vec![attr_int("exclusive", 1)])
        .output("y", DType::F32, &[2, 3, 4])
        .output("m", DType::I32, &[2, 3]);
    let bundle = bundle("cum_prod", &model)?;
    let mut exe = vulkan(&bundle, &cpu_type(), &Ledger::new());
    let inputs = [tensor(&[2, 3, 4], 5), Tensor::from_vec(vec![2, 3], &[2i32, 3, 4, -1, 5, 6])?];
    let got = run_vulkan(&mut exe, &bundle, &inputs);
    let want = run_cpu(&bundle, &inputs);
    assert_eq!(got, want);
    // np.cumprod(n, axis=1) shifted right by one (exclusive): [[1, 2, 6], [1, -1, -5]].
    assert_eq!(want[1].to_vec::<i32>()?, [1, 2, 6, 1, -1, -5]);
    let x = inputs[0].to_vec::<f32>()?;
    let y = want[0].to_vec::<f32>()?;
    // Reversed along axis 1: y[b, j, k] = x[b, j, k] * y[b, j + 1, k].
    for b in 0..2 {
        for k in 0..4 {
            let at = |j: usize| b * 12 + j * 4 + k;
            assert_eq!(y[at(2)], x[at(2)]);
            assert_eq!(y[at(1)], x[at(1)] * y[at(2)]);
            assert_eq!(y[at(0)], x[at(0)] * y[at(1)]);
        }
    }
    Ok(())
}

/// A spatial transformer's ops (AffineGrid, GridSample) at sizes beyond the node tests', in 2
/// and 3 dims, every mode and padding: Vulkan within f32 rounding of the CPU. GridSample reads
/// a grid given as an input (one the backends would compute an ulp apart would move nearest
/// samples at ties), spread past [-1, 1] so that every padding is exercised.
#[test]
fn affine_grid_then_grid_sample_equals_the_cpu() -> Result<()> {
    let cases: [(&[usize], &[usize]); 2] =
        [(&[2, 3, 17, 23], &[2, 3, 11, 29]), (&[1, 2, 5, 6, 7], &[1, 2, 4, 3, 9])];
    for (k, (x_shape, out)) in cases.into_iter().enumerate() {
        let r = x_shape.len() - 2;
        let size =
            Tensor::from_vec(vec![out.len()], &out.iter().map(|&d| d as i64).collect::<Vec<_>>())?;
        let grid_shape = [&out[..1], &out[2..], &[r]].concat();
        let mut model = OnnxModel::new(22)
            .input("x", DType::F32, x_shape)
            .input("theta", DType::F32, &[out[0], r, r + 1])
            .input("grid", DType::F32, &grid_shape)
            .initializer("size", &size)
            .node(
                "grid",
                "AffineGrid",
                &["theta", "size"],
                &["g"],
                vec![attr_int("align_corners", 0)],
            )
            .output("g", DType::F32, &grid_shape);
        let mut outputs = 0;
        for mode in ["nearest", "linear", "cubic"] {
            for padding in ["zeros", "border", "reflection"] {
                outputs += 1;
                let y = format!("y{outputs}");
                let attrs = vec![
                    attr_string("mode", mode),
                    attr_string("padding_mode", padding),
                    attr_int("align_corners", (outputs % 2) as i64),
                ];
                model = model.node(&y, "GridSample", &["x", "grid"], &[&y], attrs).output(
                    &y,
                    DType::F32,
                    out,
                );
            }
        }
        let bundle = bundle(&format!("stn{k}"), &model)?;
        // A zoom out, rotated a little.
        let mut theta = Vec::new();
        for b in 0..out[0] {
            for row in 0..r {
                for col in 0..=r {
                    let diagonal = if row == col { 1.3 } else { 0.0 };
                    let turn = if col < r && col != row { 0.2 * (b as f32 + 1.0) } else { 0.0 };
                    theta.push(diagonal + turn + if col == r { 0.1 } else { 0.0 });
                }
            }
        }
        let n: usize = grid_shape.iter().product();
        let spread: Vec<f32> = values(n, 21 + k as u64).iter().map(|v| 1.4 * v).collect();
        let inputs = [
            tensor(x_shape, 9 + k as u64),
            Tensor::from_vec(vec![out[0], r, r + 1], &theta)?,
            Tensor::from_vec(grid_shape.clone(), &spread)?,
        ];
        let got = run_vulkan_only(&bundle, &inputs)?;
        let want = run_cpu(&bundle, &inputs);
        for (j, (g, w)) in got.iter().zip(&want).enumerate() {
            allclose(g, w, Tolerance::new(1e-4, 1e-5))
                .map_err(|e| anyhow::anyhow!("case {k}, output {j}: {e}"))?;
        }
    }
    Ok(())
}

/// Products whose B is an 8-bit weight that a DequantizeLinear expands read it as it is (the
/// compiler's `dequantize_in_gemm`), on both kernel classes, and equal the CPU: B stored
/// [K, N] and [N, K] (Gemm's transB), K and N multiples of 4 or not (each way the kernel reads
/// B's words), int8 and uint8, per column and per tensor, with a fused bias and activation,
/// Gemm's C, and a residual written over in place.
#[test]
fn products_of_8_bit_weights_equal_the_cpu() -> Result<()> {
    // (op, A's shape, K, N, int8, per column, what follows the product)
    type Case<'a> = (&'a str, &'a [usize], usize, usize, bool, bool, &'a str);
    // Each B holds at least 1024 values: smaller ones are folded to float constants.
    let cases: [Case; 6] = [
        ("MatMul", &[2, 5, 64], 64, 48, true, true, "bias+relu"),
        ("Gemm", &[6, 32], 32, 40, false, false, "c"),
        ("Gemm", &[6, 30], 30, 36, false, true, ""),
        ("MatMul", &[3, 37], 37, 30, true, false, ""),
        ("MatMul", &[5, 33], 33, 32, false, true, ""),
        ("MatMul", &[4, 64], 64, 16, true, true, "residual"),
    ];
    let mut model = OnnxModel::new(OPSET);
    let mut inputs = Vec::new();
    for (i, &(op, a, k, n, signed, per_column, then)) in cases.iter().enumerate() {
        let gemm = op == "Gemm";
        let q_shape = if gemm { [n, k] } else { [k, n] };
        // Zero points per column, or one for the tensor.
        let (q, scale, zero) = quantized_weight(&q_shape, i, signed, per_column.then_some(n))?;
        let (x, w, p, y) = (format!("x{i}"), format!("w{i}"), format!("p{i}"), format!("y{i}"));
        let (qn, sn, zn) = (format!("q{i}"), format!("s{i}"), format!("z{i}"));
        model = model
            .input(&x, DType::F32, a)
            .initializer(&qn, &q)
            .initializer(&sn, &scale)
            .initializer(&zn, &zero)
            .node(
                &format!("dq{i}"),
                "DequantizeLinear",
                &[&qn, &sn, &zn],
                &[&w],
                vec![attr_int("axis", if gemm { 0 } else { 1 })],
            );
        inputs.push(tensor(a, 40 + i as u64));
        let mut out = a[..a.len() - 1].to_vec();
        out.push(n);
        let product = if then.is_empty() { &y } else { &p };
        model = match gemm {
            true if then == "c" => {
                let c = format!("c{i}");
                model.initializer(&c, &tensor(&[n], 60 + i as u64)).node(
                    &format!("gemm{i}"),
                    "Gemm",
                    &[&x, &w, &c],
                    &[product],
                    vec![attr_int("transB", 1)],
                )
            }
            true => model.node(
                &format!("gemm{i}"),
                "Gemm",
                &[&x, &w],
                &[product],
                vec![attr_int("transB", 1)],
            ),
            false => model.node(&format!("matmul{i}"), "MatMul", &[&x, &w], &[product], vec![]),
        };
        model = match then {
            "c" => model.node(&format!("relu{i}"), "Relu", &[&p], &[&y], vec![]),
            "bias+relu" => {
                let (b, s) = (format!("b{i}"), format!("sum{i}"));
                model
                    .initializer(&b, &tensor(&[n], 70 + i as u64))
                    .node(&format!("bias{i}"), "Add", &[&p, &b], &[&s], vec![])
                    .node(&format!("relu{i}"), "Relu", &[&s], &[&y], vec![])
            }
            "residual" => {
                let r = format!("r{i}");
                inputs.push(tensor(&out, 80 + i as u64));
                model.input(&r, DType::F32, &out).node(
                    &format!("residual{i}"),
                    "Add",
                    &[&r, &p],
                    &[&y],
                    vec![],
                )
            }
            _ => model,
        };
        model = model.output(&y, DType::F32, &out);
    }
    let bundle = bundle("products_of_8_bit_weights", &model)?;
    let v = &bundle.manifest().variants[0];
    let narrow = [proto::DataType::I8 as i32, proto::DataType::U8 as i32];
    let products: Vec<&proto::Step> =
        v.steps.iter().filter(|s| ["MatMul", "Gemm"].contains(&s.op.as_str())).collect();
    assert_eq!(products.len(), cases.len(), "{:?}", v.steps);
    for s in &products {
        let b = &v.tensors[s.inputs[1] as usize];
        assert!(narrow.contains(&b.dtype), "{} reads a {:?} B", s.name, b.dtype);
        assert!(!s.vulkan.is_empty(), "{} has no Vulkan kernel", s.name);
    }
    assert!(!v.steps.iter().any(|s| s.op == "DequantizeLinear"), "{:?}", v.steps);
    equal_the_cpu_on_both_classes(&bundle, &inputs, |k| format!("case {k} {:?}", cases[k]))
}

/// Convs whose weights are int8 or uint8 run them as 8-bit words (`Conv` with
/// `dequantize_w`), dequantized as each kernel loads them, on both kernel classes, and equal the
/// CPU: pointwise (rows of whole words or not), one pixel, a general window with a bias and
/// Relu, grouped, depthwise, a long 1-D window, a residual written over in place; per channel
/// and per tensor.
#[test]
fn convs_of_8_bit_weights_equal_the_cpu() -> Result<()> {
    // (X's shape, W's shape, group, pads, int8, per channel, what follows the conv)
    type Case<'a> = (&'a [usize], &'a [usize], i64, i64, bool, bool, &'a str);
    // Each W holds at least 1024 values: smaller ones are folded to float constants.
    let cases: [Case; 8] = [
        (&[1, 16, 8, 8], &[64, 16, 1, 1], 1, 0, true, true, ""),
        (&[1, 6, 5, 5], &[200, 6, 1, 1], 1, 0, false, true, ""),
        (&[1, 64, 1, 1], &[32, 64, 1, 1], 1, 0, true, false, ""),
        (&[1, 16, 7, 7], &[16, 16, 3, 3], 1, 1, false, true, "bias+relu"),
        (&[1, 16, 6, 6], &[32, 8, 3, 3], 2, 1, true, true, "bias+relu"),
        (&[1, 128, 6, 6], &[128, 1, 3, 3], 128, 1, true, true, ""),
        (&[1, 1, 200], &[32, 1, 40], 1, 0, false, false, ""),
        (&[1, 32, 4, 4], &[32, 32, 1, 1], 1, 0, true, true, "residual"),
    ];
    let mut model = OnnxModel::new(OPSET);
    let mut inputs = Vec::new();
    for (i, &(xs, ws, group, pad, signed, per_channel, then)) in cases.iter().enumerate() {
        let m = ws[0];
        let (q, scale, zero) = quantized_weight(ws, i, signed, per_channel.then_some(m))?;
        let (x, w, c, y) = (format!("x{i}"), format!("w{i}"), format!("c{i}"), format!("y{i}"));
        let (qn, sn, zn) = (format!("q{i}"), format!("s{i}"), format!("z{i}"));
        let rank = xs.len() - 2;
        let out: Vec<usize> = [xs[0], m]
            .into_iter()
            .chain((0..rank).map(|d| xs[d + 2] + 2 * pad as usize - ws[d + 2] + 1))
            .collect();
        model = model
            .input(&x, DType::F32, xs)
            .initializer(&qn, &q)
            .initializer(&sn, &scale)
            .initializer(&zn, &zero)
            .node(
                &format!("dq{i}"),
                "DequantizeLinear",
                &[&qn, &sn, &zn],
                &[&w],
                vec![attr_int("axis", 0)],
            );
        inputs.push(tensor(xs, 40 + i as u64));
        let conv_out = if then.is_empty() { &y } else { &c };
        let attrs = vec![attr_int("group", group), attr_ints("pads", &vec![pad; 2 * rank])];
        model = match then {
            "bias+relu" => {
                let b = format!("b{i}");
                model
                    .initializer(&b, &tensor(&[m], 70 + i as u64))
                    .node(&format!("conv{i}"), "Conv", &[&x, &w, &b], &[conv_out], attrs)
                    .node(&format!("relu{i}"), "Relu", &[&c], &[&y], vec![])
            }
            "residual" => {
                let r = format!("r{i}");
                inputs.push(tensor(&out, 80 + i as u64));
                model
                    .input(&r, DType::F32, &out)
                    .node(&format!("conv{i}"), "Conv", &[&x, &w], &[conv_out], attrs)
                    .node(&format!("residual{i}"), "Add", &[&r, &c], &[&y], vec![])
            }
            _ => model.node(&format!("conv{i}"), "Conv", &[&x, &w], &[conv_out], attrs),
        };
        model = model.output(&y, DType::F32, &out);
    }
    let bundle = bundle("convs_of_8_bit_weights", &model)?;
    let v = &bundle.manifest().variants[0];
    let narrow = [proto::DataType::I8 as i32, proto::DataType::U8 as i32];
    let convs: Vec<&proto::Step> = v.steps.iter().filter(|s| s.op == "Conv").collect();
    assert_eq!(convs.len(), cases.len(), "{:?}", v.steps);
    for s in &convs {
        let w = &v.tensors[s.inputs[1] as usize];
        assert!(narrow.contains(&w.dtype), "{} reads a {:?} W", s.name, w.dtype);
        assert!(!s.vulkan.is_empty(), "{} has no Vulkan kernel", s.name);
    }
    assert!(!v.steps.iter().any(|s| s.op == "DequantizeLinear"), "{:?}", v.steps);
    equal_the_cpu_on_both_classes(&bundle, &inputs, |k| format!("case {k} {:?}", cases[k]))
}

/// An 8-bit weight of `shape` (int8, or uint8), its scales and zero points: one for the tensor,
/// or `per_axis` of each. Distinct levels for each `seed`.
fn quantized_weight(
    shape: &[usize],
    seed: usize,
    signed: bool,
    per_axis: Option<usize>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let len: usize = shape.iter().product();
    let levels = (0..len).map(|e| (e * 37 + seed * 11) % 256);
    let (zeros, dims) = match per_axis {
        Some(n) => (n, vec![n]),
        None => (1, vec![]),
    };
    let (q, zero) = match signed {
        true => {
            let q: Vec<i8> = levels.map(|v| v as u8 as i8).collect();
            let z: Vec<i8> = (0..zeros).map(|j| (j % 5) as i8 - 2).collect();
            (Tensor::from_vec(shape.to_vec(), &q)?, Tensor::from_vec(dims.clone(), &z)?)
        }
        false => {
            let q: Vec<u8> = levels.map(|v| v as u8).collect();
            let z: Vec<u8> = (0..zeros).map(|j| 120 + (j % 9) as u8).collect();
            (Tensor::from_vec(shape.to_vec(), &q)?, Tensor::from_vec(dims.clone(), &z)?)
        }
    };
    let scale: Vec<f32> = (0..zeros).map(|j| 0.002 + j as f32 * 1e-4).collect();
    Ok((q, Tensor::from_vec(dims, &scale)?, zero))
}

/// The end of a squeeze-and-excitation block, `Conv1x1(x * gate)` with a gate per image and
/// channel, runs as one Conv that scales its input's channels (`Mul+Conv`): equal to the CPU
/// on both kernel classes, for two images, with a bias and a residual, and with neither.
#[test]
fn channel_scales_equal_the_cpu() -> Result<()> {
    let (n, c, m) = (2, 12, 8);
    let model = OnnxModel::new(OPSET)
        .input("x", DType::F32, &[n, c, 5, 7])
        .input("r", DType::F32, &[n, m, 5, 7])
        .initializer("wg", &tensor(&[c, c, 1, 1], 1))
        .initializer("w", &tensor(&[m, c, 1, 1], 2))
        .initializer("b", &tensor(&[m], 3))
        .node("pool", "GlobalAveragePool", &["x"], &["p"], vec![])
        .node("fc", "Conv", &["p", "wg"], &["l"], vec![])
        .node("gate", "Sigmoid", &["l"], &["s"], vec![])
        .node("mul", "Mul", &["x", "s"], &["xs"], vec![])
        .node("proj", "Conv", &["xs", "w", "b"], &["z"], vec![])
        .node("add", "Add", &["z", "r"], &["y"], vec![])
        .node("mul2", "Mul", &["s", "x"], &["sx"], vec![])
        .node("proj2", "Conv", &["sx", "w"], &["y2"], vec![])
        .output("y", DType::F32, &[n, m, 5, 7])
        .output("y2", DType::F32, &[n, m, 5, 7]);
    let bundle = bundle("channel_scales", &model)?;
    let labels: Vec<String> =
        bundle.manifest().variants[0].steps.iter().map(|s| s.op_label()).collect();
    let scaled = labels.iter().filter(|l| l.starts_with("Mul+Conv")).count();
    assert_eq!(scaled, 2, "{labels:?}");
    assert!(!labels.iter().any(|l| l == "Mul"), "{labels:?}");
    let inputs = [tensor(&[n, c, 5, 7], 4), tensor(&[n, m, 5, 7], 5)];
    equal_the_cpu_on_both_classes(&bundle, &inputs, |k| ["y", "y2"][k].to_string())
}

/// Runs `bundle` on lavapipe with each kernel class under the validation layer and compares
/// every output with the CPU's (1e-5); `case` names output k in an error.
fn equal_the_cpu_on_both_classes(
    bundle: &Arc<Bundle>,
    inputs: &[Tensor],
    case: impl Fn(usize) -> String,
) -> Result<()> {
    let want = run_cpu(bundle, inputs);
    for class in [ingot_runtime::KernelClass::Cpu, ingot_runtime::KernelClass::Gpu] {
        require_validation();
        let device = Device::Vulkan(VulkanOptions { kernel_class: class, ..cpu_type() });
        let options = SessionOptions { devices: vec![device], ..Default::default() };
        let got = Session::new(Arc::clone(bundle), options)?.run(inputs)?;
        assert_no_validation_messages();
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            allclose(g, w, Tolerance { rtol: 1e-5, atol: 1e-5 })
                .map_err(|e| anyhow::anyhow!("{class:?} kernels, {}: {e}", case(k)))?;
        }
    }
    Ok(())
}

/// A float16 detector's upsampling on Vulkan, two elements to a word (an input of an odd
/// element count, whose last word is half past its end), and float16 products the compiler
/// widens to f32 steps between casts, which read their f16 weights themselves, two to a word:
/// a MatMul, a Gemm of B stored [N, K] with its bias and a residual, a Conv with its bias and a
/// Relu, and a Conv of an odd count of weights (its last word half past W's end). All on Vulkan
/// alone, equal to the CPU on both kernel classes.
#[test]
fn float16_upsampling_and_products_run_on_vulkan() -> Result<()> {
    let to = |d: DType| attr_int("to", i64::from(d.onnx_code()));
    let scales = Tensor::from_vec(vec![4], &[1.0f32, 1.0, 2.0, 2.0])?;
    let model = OnnxModel::new(19)
        .input("x", DType::F32, &[1, 3, 5, 5])
        .input("a", DType::F32, &[4, 6])
        .initializer("scales", &scales)
        .initializer("b", &tensor(&[6, 3], 3))
        .node("half", "Cast", &["x"], &["h"], vec![to(DType::F16)])
        .node(
            "up",
            "Resize",
            &["h", "", "scales"],
            &["u"],
            vec![attr_string("mode", "nearest"), attr_string("nearest_mode", "floor")],
        )
        .node("back", "Cast", &["u"], &["y"], vec![to(DType::F32)])
        .node("ha", "Cast", &["a"], &["ah"], vec![to(DType::F16)])
        .node("hb", "Cast", &["b"], &["bh"], vec![to(DType::F16)])
        .node("product", "MatMul", &["ah", "bh"], &["p"], vec![])
        .node("pf", "Cast", &["p"], &["z"], vec![to(DType::F32)])
        .initializer("bt", &tensor(&[3, 6], 4))
        .initializer("c", &tensor(&[3], 5))
        .node("hbt", "Cast", &["bt"], &["bth"], vec![to(DType::F16)])
        .node("hc", "Cast", &["c"], &["ch"], vec![to(DType::F16)])
        .node("gemm", "Gemm", &["ah", "bth", "ch"], &["q"], vec![attr_int("transB", 1)])
        .node("residual", "Add", &["q", "p"], &["qp"], vec![])
        .node("qf", "Cast", &["qp"], &["g"], vec![to(DType::F32)])
        .initializer("w", &tensor(&[4, 3, 3, 3], 6))
        .initializer("wb", &tensor(&[4], 7))
        .node("hw", "Cast", &["w"], &["wh"], vec![to(DType::F16)])
        .node("hwb", "Cast", &["wb"], &["wbh"], vec![to(DType::F16)])
        .node("conv", "Conv", &["h", "wh", "wbh"], &["k"], vec![attr_ints("pads", &[1; 4])])
        .node("relu", "Relu", &["k"], &["kr"], vec![])
        .node("kf", "Cast", &["kr"], &["c16"], vec![to(DType::F32)])
        .initializer("w1", &tensor(&[1, 3, 3, 3], 8))
        .node("hw1", "Cast", &["w1"], &["w1h"], vec![to(DType::F16)])
        .node("conv1", "Conv", &["h", "w1h"], &["k1"], vec![])
        .node("k1f", "Cast", &["k1"], &["odd"], vec![to(DType::F32)])
        .output("y", DType::F32, &[1, 3, 10, 10])
        .output("z", DType::F32, &[4, 3])
        .output("g", DType::F32, &[4, 3])
        .output("c16", DType::F32, &[1, 4, 5, 5])
        .output("odd", DType::F32, &[1, 1, 3, 3]);
    let bundle = bundle("float16_upsampling_and_products", &model)?;
    let inputs = [tensor(&[1, 3, 5, 5], 1), tensor(&[4, 6], 2)];
    let names = ["y", "z", "g", "c16", "odd"];
    equal_the_cpu_on_both_classes(&bundle, &inputs, |k| names[k].to_string())
}

/// Detectors' and decoders' region and cache ops equal the CPU on both kernel classes:
/// DeformConv with a mask and no bias (the mask in the first optional slot), RoiAlign in max
/// mode, MaxUnpool of a MaxPool's indices, Col2Im with strides and pads, and TensorScatter in
/// circular mode.
#[test]
fn region_and_cache_ops_equal_the_cpu() -> Result<()> {
    let ints = |name: &str, v: &[i64]| attr_ints(name, v);
    let i64s = |shape: &[usize], v: &[i64]| Tensor::from_vec(shape.to_vec(), v).unwrap();
    let model = OnnxModel::new(24)
        .input("x", DType::F32, &[1, 4, 6, 6])
        .input("offset", DType::F32, &[1, 36, 6, 6])
        .input("mask", DType::F32, &[1, 18, 6, 6])
        .input("rois", DType::F32, &[3, 4])
        .input("cols", DType::F32, &[1, 6, 8])
        .input("cache", DType::F32, &[2, 8, 4])
        .input("update", DType::F32, &[2, 3, 4])
        .initializer("w", &tensor(&[6, 2, 3, 3], 1))
        .initializer("batch", &i64s(&[3], &[0, 0, 0]))
        .initializer("image", &i64s(&[2], &[3, 5]))
        .initializer("block", &i64s(&[2], &[1, 2]))
        .initializer("write", &i64s(&[2], &[6, 1]))
        .node(
            "deform",
            "DeformConv",
            &["x", "w", "offset", "", "mask"],
            &["d"],
            vec![ints("pads", &[1, 1, 1, 1]), attr_int("group", 2), attr_int("offset_group", 2)],
        )
        .node(
            "roi",
            "RoiAlign",
            &["x", "rois", "batch"],
            &["r"],
            vec![
                attr_string("mode", "max"),
                attr_int("output_height", 2),
                attr_int("output_width", 3),
                attr_int("sampling_ratio", 2),
            ],
        )
        .node(
            "pool",
            "MaxPool",
            &["x"],
            &["p", "i"],
            vec![ints("kernel_shape", &[2, 2]), ints("strides", &[2, 2])],
        )
        .node(
            "unpool",
            "MaxUnpool",
            &["p", "i"],
            &["u"],
            vec![ints("kernel_shape", &[2, 2]), ints("strides", &[2, 2])],
        )
        .node(
            "fold",
            "Col2Im",
            &["cols", "image", "block"],
            &["f"],
            vec![ints("strides", &[2, 1]), ints("pads", &[1, 0, 0, 0])],
        )
        .node(
            "scatter",
            "TensorScatter",
            &["cache", "update", "write"],
            &["s"],
            vec![attr_int("axis", 1), attr_string("mode", "circular")],
        )
        .output("d", DType::F32, &[1, 6, 6, 6])
        .output("r", DType::F32, &[3, 4, 2, 3])
        .output("u", DType::F32, &[1, 4, 6, 6])
        .output("f", DType::F32, &[1, 3, 3, 5])
        .output("s", DType::F32, &[2, 8, 4]);
    let bundle = bundle("region_and_cache_ops", &model)?;
    let rois = Tensor::from_vec(
        vec![3, 4],
        &[0.5f32, 1.0, 4.0, 5.5, -1.0, 2.0, 3.0, 3.0, 2.0, 0.0, 6.5, 2.5],
    )?;
    let inputs = [
        tensor(&[1, 4, 6, 6], 2),
        tensor(&[1, 36, 6, 6], 3),
        tensor(&[1, 18, 6, 6], 4),
        rois,
        tensor(&[1, 6, 8], 5),
        tensor(&[2, 8, 4], 6),
        tensor(&[2, 3, 4], 7),
    ];
    equal_the_cpu_on_both_classes(&bundle, &inputs, |k| ["d", "r", "u", "f", "s"][k].to_string())
}
