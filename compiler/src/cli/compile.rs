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
    /// Bind a graph input to a value at compile time: NAME=FILE.npy. Repeatable. The input
    /// becomes a constant and everything computed from it folds.
    #[arg(long = "constant-input", value_name = "NAME=FILE.npy", value_parser = super::parse_constant_input)]
    constant_inputs: Vec<(String, PathBuf)>,
    /// Run the independent plan verifier (always on in debug builds).
    #[arg(long)]
    verify: bool,
}

pub fn main(args: Args) -> Result<()> {
    let start = Instant::now();
    let mut constant_inputs = Vec::new();
    for (name, path) in &args.constant_inputs {
        constant_inputs.push((
            name.clone(),
            super::npy::read(path).with_context(|| format!("--constant-input {name}"))?,
        ));
    }
    let options = CompileOptions {
        input_shapes: args.input_shapes,
        constant_inputs,
        verify: args.verify,
        ..CompileOptions::default()
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
    let p = &c.plan;
    println!(
        "compiled {} -> {} ({} bytes, {} steps) in {:.1} ms",
        args.model.display(),
        args.output.display(),
        bytes.len(),
        p.steps().count(),
        start.elapsed().as_secs_f64() * 1e3
    );
    let opened = ingot_runtime::Bundle::from_bytes(&bytes)?;
    for v in &opened.manifest().variants {
        let missing: Vec<_> = v.steps.iter().filter(|s| s.vulkan.is_empty()).collect();
        println!(
            "vulkan: {} of {} steps have kernels, {} unique kernels in the bundle",
            v.steps.len() - missing.len(),
            v.steps.len(),
            opened.manifest().kernels.len()
        );
        for s in missing.iter().take(5) {
            println!(
                "  no kernel for '{}' ({}): {}",
                s.name, s.op, s.no_vulkan_kernel
            );
        }
        if missing.len() > 5 {
            println!(
                "  ... and {} more (ingot inspect lists them)",
                missing.len() - 5
            );
        }
    }
    println!(
        "memory: arena {} bytes (lower bound {}, ratio {:.4}, naive {}), weights {weights} bytes; {} over {}",
        p.arena_bytes,
        p.lower_bound_bytes,
        if p.lower_bound_bytes == 0 {
            1.0
        } else {
            p.arena_bytes as f64 / p.lower_bound_bytes as f64
        },
        p.naive_bytes,
        p.strategy,
        p.schedule
    );
    Ok(())
}
