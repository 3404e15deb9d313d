//! `ingot compile MODEL.onnx -o OUT.ingot`

use anyhow::{Context, Result};
use ingot_compiler::{CompileOptions, bundle, compile_graph};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// The ONNX model.
    model: PathBuf,
    /// Where to write the bundle.
    #[arg(short, long)]
    output: PathBuf,
    /// Fix a graph input's shape: NAME=1x3x48x192. Repeatable. Required for symbolic dims;
    /// accepted for a static input when it agrees.
    #[arg(long = "input-shape", value_name = "NAME=DIMS", value_parser = super::parse_input_shape)]
    input_shapes: Vec<(String, Vec<usize>)>,
    /// Run the independent plan verifier (always on in debug builds).
    #[arg(long)]
    verify: bool,
}

pub fn main(args: Args) -> Result<()> {
    let start = Instant::now();
    let options = CompileOptions {
        input_shapes: args.input_shapes,
        verify: args.verify,
    };
    let c = compile_graph(&args.model, &options)
        .with_context(|| format!("cannot compile {}", args.model.display()))?;
    let bytes = bundle::write(&[bundle::CompiledVariant {
        name: "main",
        graph: &c.graph,
        plan: &c.plan,
    }])?;
    std::fs::write(&args.output, &bytes)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    let weights: u64 = c
        .plan
        .weights
        .iter()
        .filter_map(|&v| c.graph.values[v].ty.as_ref())
        .map(|t| t.bytes() as u64)
        .sum();
    println!(
        "compiled {} -> {} ({} steps, {} bytes): arena {} bytes (lower bound {}), weights {} bytes, {:.1} ms",
        args.model.display(),
        args.output.display(),
        c.graph.nodes.len(),
        bytes.len(),
        c.plan.arena_bytes,
        c.plan.lower_bound_bytes,
        weights,
        start.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}
