//! Compile an ONNX model into a bundle, print the plan's summary, run the bundle, print the
//! outputs. `cargo run -p quickstart -- [MODEL.onnx [INPUT=1x3x224x224 ...]]` (default: the
//! small CNN of examples/plan-snapshot, batch 1).

use ingot_compiler::{CompileOptions, compile_file, plan_text};
use ingot_runtime::{Bundle, DType, Session, SessionOptions, Tensor};
use std::path::PathBuf;
use std::sync::Arc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (model, shapes) = match args.split_first() {
        Some((model, shapes)) => (PathBuf::from(model), shapes.to_vec()),
        None => (
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../plan-snapshot/model.onnx"),
            vec!["x=1x3x32x32".to_string()],
        ),
    };
    // Symbolic dims get a size here: Ingot compiles static shapes.
    let input_shapes = shapes
        .iter()
        .map(|s| {
            let (name, dims) = s.split_once('=').ok_or("shapes look like NAME=1x3x32x32")?;
            let dims = dims.split('x').map(str::parse).collect::<Result<Vec<usize>, _>>()?;
            Ok((name.to_string(), dims))
        })
        .collect::<Result<Vec<_>, Box<dyn std::error::Error>>>()?;
    let options = CompileOptions { input_shapes, ..CompileOptions::default() };

    // The plan: where every tensor lives, decided before anything runs.
    let plan = plan_text(&model, &options)?;
    println!("== plan of {}", model.display());
    for line in plan.lines().take_while(|l| !l.starts_with("steps:")) {
        println!("{line}");
    }

    // The bundle (what `ingot compile` writes): one variant, `main`.
    let bytes = compile_file(&model, &options)?;
    println!("== bundle: {} bytes", bytes.len());

    // Run it on a Vulkan GPU where a submodel can, else the CPU (a CPU-type Vulkan device
    // such as lavapipe only where named: `SessionOptions::on("vulkan:cpu,cpu")`).
    let mut session =
        Session::new(Arc::new(Bundle::from_bytes(&bytes)?), SessionOptions::default())?;
    print!("{}", session.placement());
    let inputs = session
        .inputs()
        .iter()
        .map(|info| {
            let n: usize = info.desc.shape.iter().product();
            match info.desc.dtype {
                DType::F32 => {
                    let values: Vec<f32> = (0..n).map(|i| ((i % 29) as f32 - 14.0) / 7.0).collect();
                    Tensor::from_vec(info.desc.shape.clone(), &values)
                }
                _ => Ok(Tensor::zeros(info.desc.clone())),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let outputs = session.run(&inputs)?;
    for (info, t) in session.outputs().iter().zip(&outputs) {
        let head: Vec<f32> = match t.dtype() {
            DType::F32 => t.as_slice::<f32>()?.iter().take(6).copied().collect(),
            _ => Vec::new(),
        };
        println!("{} {:?}: {head:?} ...", info.name, t.shape());
    }
    Ok(())
}
