//! Compiles the model into a bundle in OUT_DIR; src/main.rs `include_bytes!`es it. A compile
//! error (an unsupported op, a missing input shape) fails the build, not the app.

use ingot_compiler::{CompileOptions, compile_file};
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The small CNN the other examples use; an app points at its own model.
    let model = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../plan-snapshot/model.onnx");
    println!("cargo::rerun-if-changed={}", model.display());
    let options = CompileOptions {
        // The model's batch dimension is symbolic: the bundle fixes it.
        input_shapes: vec![("x".into(), vec![1, 3, 32, 32])],
        ..CompileOptions::default()
    };
    let bundle = compile_file(&model, &options)?;
    std::fs::write(PathBuf::from(std::env::var("OUT_DIR")?).join("model.ingot"), bundle)?;
    Ok(())
}
