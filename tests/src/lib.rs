//! Helpers shared by the workspace integration tests (`tests/tests/*.rs`).
//!
//! - [`paths`]: where the repo, the target dir, the generated test data and the `ingot` binary are;
//! - [`data`]: `.npy` and ONNX `.pb` files to and from [`Tensor`]s;
//! - [`compare`]: `allclose` with a report of the worst element;
//! - [`model`]: small ONNX models written from Rust;
//! - [`cli`]: the `ingot` binary, and checks that it fails cleanly;
//! - [`compile`], [`session`], [`run`]: the library path from model file to outputs.
//!
//! The data the tests read is made by `bash tools/setup.sh` ([`paths::SETUP_COMMAND`]).

pub mod cli;
pub mod compare;
pub mod data;
pub mod model;
pub mod paths;

pub use compare::{Comparison, Tolerance, allclose, compare};
pub use paths::{SETUP_COMMAND, target_dir};

use anyhow::{Context, Result, bail};
use ingot_compiler::CompileOptions;
use ingot_runtime::{Bundle, Device, Session, SessionOptions, Tensor};
use std::path::Path;
use std::sync::Arc;

/// Compiles `model` into bundle bytes, with the plan verifier on.
pub fn compile(model: &Path, input_shapes: &[(String, Vec<usize>)]) -> Result<Vec<u8>> {
    let options = CompileOptions {
        input_shapes: input_shapes.to_vec(),
        verify: true,
        ..CompileOptions::default()
    };
    ingot_compiler::compile_file(model, &options)
        .with_context(|| format!("compile {}", model.display()))
}

/// Opens bundle bytes in a session on the CPU.
pub fn session(bundle: &[u8]) -> Result<Session> {
    session_on(bundle, Device::Cpu)
}

/// Opens bundle bytes in a session on `device` alone (no fallback).
pub fn session_on(bundle: &[u8], device: Device) -> Result<Session> {
    session_with(bundle, vec![device])
}

/// Opens bundle bytes in a session on the device list `devices`.
pub fn session_with(bundle: &[u8], devices: Vec<Device>) -> Result<Session> {
    let bundle = Bundle::from_bytes(bundle).context("open bundle")?;
    let options = SessionOptions { devices, ..SessionOptions::default() };
    Session::new(Arc::new(bundle), options).context("create session")
}

/// The Vulkan device the tests use: the CPU-type one, lavapipe, named (`vulkan:cpu`), since
/// `vulkan` never picks a CPU-type device. The test command installs lavapipe and exports
/// `INGOT_VULKAN_VALIDATION=1`, so every Vulkan test runs under the Khronos validation layer;
/// no device is a failure, never a skip. `INGOT_KERNEL_CLASS=gpu` (or `cpu`) runs that class
/// of kernels whatever the device's own class: how the GPU kernels are tested on lavapipe.
pub fn vulkan() -> Device {
    Device::Vulkan(ingot_runtime::vulkan::VulkanOptions {
        device: ingot_runtime::vulkan::DeviceChoice::CpuType,
        kernel_class: kernel_class(),
        ..Default::default()
    })
}

/// The kernel class `INGOT_KERNEL_CLASS` names (`auto` when unset); a bad name panics, so a
/// typo cannot quietly test the wrong kernels.
pub fn kernel_class() -> ingot_runtime::KernelClass {
    let name = std::env::var("INGOT_KERNEL_CLASS").unwrap_or_else(|_| "auto".into());
    ingot_runtime::KernelClass::parse(&name).unwrap_or_else(|e| panic!("INGOT_KERNEL_CLASS: {e}"))
}

/// How many validation messages this thread has had so far, for [`check_validation`]. Per
/// thread: the suites of one test binary run in parallel, and another's message must not fail
/// this one.
pub fn validation_seen() -> usize {
    ingot_runtime::vulkan::validation_messages_of_this_thread().len()
}

/// Fails with the validation layer's messages if it sent this thread any since `seen`
/// ([`validation_seen`]) were counted.
pub fn check_validation(seen: usize) -> Result<()> {
    let messages = ingot_runtime::vulkan::validation_messages_of_this_thread();
    match messages.get(seen..) {
        Some(new) if !new.is_empty() => bail!("Vulkan validation: {}", new.join("\n")),
        _ => Ok(()),
    }
}

/// Runs `inputs` (in the session's input order) and checks the output count.
pub fn run(session: &mut Session, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    let outputs = session.run(inputs).context("run")?;
    if outputs.len() != session.outputs().len() {
        bail!(
            "run returned {} outputs, the session declares {}",
            outputs.len(),
            session.outputs().len()
        );
    }
    Ok(outputs)
}

/// Runs `f`, turning a panic into `Err("panicked at FILE:LINE: MESSAGE")` so that a suite can
/// record it and go on. The panic is not printed (the message is returned instead).
pub fn catch_panic<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    use std::cell::RefCell;
    use std::panic;
    use std::sync::Once;

    thread_local! {
        /// `Some` while this thread is inside `catch_panic`: the hook stores the message here.
        static CAUGHT: RefCell<Option<String>> = const { RefCell::new(None) };
    }
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let caught = CAUGHT.with(|c| {
                let mut c = c.borrow_mut();
                c.as_mut().map(|slot| {
                    let at = info
                        .location()
                        .map(|l| format!(" at {}:{}", l.file(), l.line()))
                        .unwrap_or_default();
                    let message = info
                        .payload()
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| info.payload().downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "(non-string payload)".into());
                    *slot = format!("panicked{at}: {message}");
                })
            });
            if caught.is_none() {
                default(info);
            }
        }));
    });

    CAUGHT.with(|c| *c.borrow_mut() = Some(String::new()));
    let result = panic::catch_unwind(panic::AssertUnwindSafe(f));
    let message = CAUGHT.with(|c| c.borrow_mut().take()).unwrap_or_default();
    result.map_err(|_| message)
}
