//! `ingot compile MODEL.onnx -o OUT.ingot`, or several graphs into one bundle:
//! `ingot compile --variant prefill=a.onnx --variant decode=b.onnx -o OUT.ingot`.

use anyhow::{Context, Result, bail};
use ingot_compiler::{CompileOptions, VariantSource, compile_variants_to};
use serde_json::json;
use std::fmt::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// The ONNX model (one variant, named `main`).
    #[arg(required_unless_present = "variants", conflicts_with = "variants")]
    model: Option<PathBuf>,
    /// A variant: NAME=MODEL.onnx. Repeatable; one bundle holds them all, each weight once.
    /// The same file may appear under several names with different input shapes.
    #[arg(long = "variant", value_name = "NAME=MODEL.onnx", value_parser = crate::args::parse_constant_input)]
    variants: Vec<(String, PathBuf)>,
    /// Where to write the bundle.
    #[arg(short, long)]
    output: PathBuf,
    /// Fix a graph input's shape: NAME=1x3x48x192, or VARIANT:NAME=1x128 for one variant.
    /// Repeatable. Required for symbolic dims; accepted for a static input when it agrees.
    #[arg(long = "input-shape", value_name = "[VARIANT:]NAME=DIMS", value_parser = crate::args::parse_input_shape)]
    input_shapes: Vec<(String, Vec<usize>)>,
    /// Bind a graph input to a value at compile time: NAME=FILE.npy. Repeatable. The input
    /// becomes a constant and everything computed from it folds.
    #[arg(long = "constant-input", value_name = "NAME=FILE.npy", value_parser = crate::args::parse_constant_input)]
    constant_inputs: Vec<(String, PathBuf)>,
    /// Fix a sequence input's length and its elements' shapes: NAME=2x3,4 (a scalar element
    /// is (), an empty sequence NAME=). Repeatable. The input becomes one tensor input per
    /// element, NAME[0], NAME[1], ...
    #[arg(long = "input-sequence", value_name = "NAME=DIMS,...", value_parser = crate::args::parse_input_sequence)]
    sequence_inputs: Vec<(String, Vec<Vec<usize>>)>,
    /// An optional input that holds nothing in this bundle. Repeatable. Without it, an
    /// optional input holds its element.
    #[arg(long = "absent-input", value_name = "NAME")]
    absent_inputs: Vec<String>,
    /// The most iterations a Loop whose trip count is known only at run time may run, where it
    /// has scan outputs: their storage is planned for that many rows, and a run that would
    /// need more stops with an error naming the loop.
    #[arg(long, value_name = "N")]
    max_loop_iterations: Option<usize>,
    /// Store the float32 weights of convs, matrix products and embedding tables (a Gather's,
    /// whose rows are widened after it) as float16: about half the bundle and the device's
    /// weight memory. Arithmetic stays float32; outputs move by the weights' rounding (a
    /// relative 2^-11 each). A weight another op reads too, or one past float16's range, stays
    /// float32.
    #[arg(long)]
    f16_weights: bool,
    /// Run the independent plan verifier (always on in debug builds).
    #[arg(long)]
    verify: bool,
    /// The devices the bundle is for. `cpu` alone leaves the Vulkan kernels out (a smaller
    /// bundle for an app that only runs the CPU backend; a runtime then skips Vulkan for it);
    /// any Vulkan name (vulkan, vulkan:N, vulkan:cpu) includes them.
    #[arg(long, default_value = "vulkan,cpu", value_delimiter = ',')]
    devices: Vec<String>,
    /// Print the summary as JSON (bundle, bytes, weights, kernels, each variant's plan).
    #[arg(long)]
    json: bool,
}

pub fn main(args: Args) -> Result<()> {
    let start = Instant::now();
    let constant_inputs = crate::args::read_constant_inputs(&args.constant_inputs)?;
    let sources: Vec<VariantSource> = match &args.model {
        Some(model) => vec![VariantSource {
            name: "main".into(),
            model: model.clone(),
            input_shapes: Vec::new(),
        }],
        None => args
            .variants
            .iter()
            .map(|(name, model)| VariantSource {
                name: name.clone(),
                model: model.clone(),
                input_shapes: Vec::new(),
            })
            .collect(),
    };
    // `VARIANT:NAME=DIMS` goes to that variant; anything else to all (an input may itself
    // be named `a:b`, so only a known variant's prefix is split off).
    let (mut sources, mut shared) = (sources, Vec::new());
    for (name, dims) in args.input_shapes {
        let target = name.split_once(':').and_then(|(variant, input)| {
            let k = sources.iter().position(|s| s.name == variant)?;
            Some((k, input.to_string()))
        });
        match target {
            Some((k, input)) => sources[k].input_shapes.push((input, dims)),
            None => shared.push((name, dims)),
        }
    }
    if args.model.is_some() && !args.variants.is_empty() {
        bail!("give either MODEL or --variant NAME=MODEL, not both");
    }
    let mut cpu_only = true;
    for name in &args.devices {
        let device =
            ingot_runtime::Device::parse(name).with_context(|| format!("--devices {name}"))?;
        cpu_only &= matches!(device, ingot_runtime::Device::Cpu);
    }
    let options = CompileOptions {
        input_shapes: shared,
        constant_inputs,
        sequence_inputs: args.sequence_inputs,
        absent_inputs: args.absent_inputs,
        verify: args.verify,
        cpu_only,
        max_loop_iterations: args.max_loop_iterations,
        f16_weights: args.f16_weights,
        ..CompileOptions::default()
    };
    let m = compile_variants_to(&sources, &options, &args.output)
        .with_context(|| format!("cannot compile into {}", args.output.display()))?;
    let bytes = std::fs::metadata(&args.output)
        .with_context(|| format!("cannot read {}", args.output.display()))?
        .len();
    let millis = start.elapsed().as_secs_f64() * 1e3;
    let models: Vec<String> = sources.iter().map(|s| s.model.display().to_string()).collect();
    let unique: u64 = m.weights.iter().map(|w| w.length).sum();
    let mut text = String::new();
    let mut variants = Vec::new();
    writeln!(
        text,
        "compiled {} -> {} ({bytes} bytes) in {millis:.1} ms",
        models.join(", "),
        args.output.display()
    )?;
    let kernels = match m.cpu_only {
        true => "no Vulkan kernels (compiled for the CPU only)".to_string(),
        false => format!("{} unique Vulkan kernels", m.kernels.len()),
    };
    writeln!(text, "weights: {} entries, {unique} bytes; {kernels}", m.weights.len())?;
    for v in &m.variants {
        let p = v.plan.clone().unwrap_or_default();
        // Where every step is the CPU's by request, none needs listing.
        let listed = if m.cpu_only { &[][..] } else { &v.submodels[..] };
        let on_cpu: Vec<_> = listed
            .iter()
            .filter_map(|sub| {
                let steps = sub.first_step as usize..(sub.first_step + sub.step_count) as usize;
                let culprit =
                    v.steps[steps.clone()].iter().find(|s| !s.no_vulkan_kernel.is_empty())?;
                Some((steps, culprit))
            })
            .collect();
        writeln!(
            text,
            "variant {}: {} steps, {} submodels ({}); arena {} bytes (lower bound {}, ratio \
             {:.4}, naive {}), boundary {} bytes; {} over {}",
            v.name,
            v.steps.len(),
            v.submodels.len(),
            match m.cpu_only {
                true => "all for the CPU".to_string(),
                false => format!("{} need the CPU", on_cpu.len()),
            },
            p.arena_bytes,
            p.lower_bound_bytes,
            if p.lower_bound_bytes == 0 {
                1.0
            } else {
                p.arena_bytes as f64 / p.lower_bound_bytes as f64
            },
            p.naive_bytes,
            p.boundary_bytes,
            p.strategy,
            p.schedule
        )?;
        for (steps, s) in &on_cpu {
            writeln!(
                text,
                "  steps {}..{} on the CPU: '{}' ({}) has no Vulkan kernel: {}",
                steps.start, steps.end, s.name, s.op, s.no_vulkan_kernel
            )?;
        }
        let cpu_steps: Vec<serde_json::Value> = on_cpu
            .iter()
            .map(|(steps, s)| {
                json!({"steps": [steps.start, steps.end], "name": s.name, "op": s.op,
                       "reason": s.no_vulkan_kernel})
            })
            .collect();
        variants.push(json!({
            "name": v.name,
            "steps": v.steps.len(),
            "submodels": v.submodels.len(),
            "arena_bytes": p.arena_bytes,
            "lower_bound_bytes": p.lower_bound_bytes,
            "naive_bytes": p.naive_bytes,
            "boundary_bytes": p.boundary_bytes,
            "strategy": p.strategy,
            "schedule": p.schedule,
            "need_the_cpu": cpu_steps,
        }));
    }
    if args.json {
        text = crate::report::json_text(&json!({
            "models": models,
            "bundle": args.output.display().to_string(),
            "bundle_bytes": bytes,
            "compile_ms": millis,
            "weight_entries": m.weights.len(),
            "weight_bytes": unique,
            "kernels": m.kernels.len(),
            "cpu_only": m.cpu_only,
            "variants": variants,
        }))?;
    }
    crate::report::emit(&text, None)
}
