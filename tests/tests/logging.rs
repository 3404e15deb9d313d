//! What the runtime tells the app's logger: each submodel's device and the devices skipped
//! when a session is made (info), and a device that failed during a run (warn). Its own test
//! binary: the logger is one per process, and no other test shares it.

use anyhow::{Result, ensure};
use ingot_runtime::{Bundle, Faults, Session, SessionOptions, Stage, Tensor};
use ingot_schema::DType;
use ingot_tests::compile;
use ingot_tests::model::OnnxModel;
use ingot_tests::paths::scratch_dir;
use log::{Level, Log, Metadata, Record};
use std::sync::{Arc, Mutex};

struct Capture(Mutex<Vec<(Level, String)>>);

impl Log for Capture {
    fn enabled(&self, _: &Metadata) -> bool {
        true
    }

    fn log(&self, record: &Record) {
        // The compiler's dependencies (naga) log too.
        if record.target().starts_with("ingot") {
            self.0.lock().unwrap().push((record.level(), record.args().to_string()));
        }
    }

    fn flush(&self) {}
}

static RECORDS: Capture = Capture(Mutex::new(Vec::new()));

/// The records since the last call.
fn take() -> Vec<(Level, String)> {
    std::mem::take(&mut *RECORDS.0.lock().unwrap())
}

#[test]
fn placement_and_failover_reach_the_apps_logger() -> Result<()> {
    log::set_logger(&RECORDS).unwrap();
    log::set_max_level(log::LevelFilter::Trace);
    let model = OnnxModel::new(17)
        .input("x", DType::F32, &[2, 3])
        .node("relu", "Relu", &["x"], &["y"], vec![])
        .output("y", DType::F32, &[2, 3]);
    let path = scratch_dir("logging").join("model.onnx");
    model.write(&path)?;
    let bundle = Arc::new(Bundle::from_bytes(&compile(&path, &[])?)?);

    // The CPU fails its first run (an injected fault fires once): the second `cpu` of the
    // list takes the submodel over.
    let faults = Faults::default();
    faults.inject("cpu", Stage::Run);
    let options = SessionOptions { faults, ..SessionOptions::on("vulkan:99,cpu,cpu")? };
    let mut session = Session::new(bundle, options)?;
    let made = take();
    ensure!(made.iter().all(|(level, _)| *level == Level::Info), "{made:?}");
    let text: Vec<&str> = made.iter().map(|(_, m)| m.as_str()).collect();
    // One record a line of the placement report: the skipped Vulkan device among them.
    ensure!(text.join("\n") + "\n" == session.placement().to_string(), "{text:#?}");
    ensure!(text.iter().any(|m| m.contains("vulkan:99")), "{text:#?}");

    let x = Tensor::from_vec(vec![2, 3], &[-1.0f32, 2.0, -3.0, 4.0, -5.0, 6.0])?;
    let y = session.run(&[x])?;
    ensure!(y[0] == Tensor::from_vec(vec![2, 3], &[0.0f32, 2.0, 0.0, 4.0, 0.0, 6.0])?);
    let ran = take();
    ensure!(ran.len() == 2 && ran.iter().all(|(level, _)| *level == Level::Warn), "{ran:?}");
    ensure!(ran[0].1.starts_with("submodel 0: cpu: dispatch failed: injected fault"), "{ran:?}");
    ensure!(ran[1].1 == "submodel 0 now runs on cpu", "{ran:?}");
    // A run that goes well says nothing.
    session.run(&[Tensor::from_vec(vec![2, 3], &[0.0f32; 6])?])?;
    ensure!(take().is_empty());
    Ok(())
}
