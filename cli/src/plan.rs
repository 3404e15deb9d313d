//! `ingot plan MODEL.onnx|BUNDLE.ingot [--variant V] [--format text|json|svg] [-o FILE]
//! [--input-shape NAME=DIMS]... [--constant-input NAME=FILE.npy]...`

use anyhow::{Context, Result, bail};
use ingot_compiler::plan::render;
use ingot_compiler::{CompileOptions, bundle, compile_graph};
use ingot_runtime::Bundle;
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Format {
    /// One line per step and per tensor: what `ingot plan` output under review looks like.
    Text,
    /// Everything the text says, with a `schema_version`, for tools.
    Json,
    /// The arena over time (tensors as boxes) beside the weights, on one byte scale.
    Svg,
}

#[derive(clap::Args)]
pub struct Args {
    /// An ONNX model (compiled on the fly) or a bundle.
    input: PathBuf,
    /// Which variant of a bundle (default: the first).
    #[arg(long)]
    variant: Option<String>,
    /// The output format.
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// The same as --format json.
    #[arg(long, conflicts_with = "format")]
    json: bool,
    /// Write the plan to FILE instead of standard output.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Print what each planning mechanism saves (an ONNX model only): naive bytes, the lower
    /// bound with nothing shared, with views, with in-place writes and with reordering, the
    /// arena, and the planning time. A text table only.
    #[arg(long, conflicts_with_all = ["format", "json"])]
    stats: bool,
    /// As for `ingot compile`, when the input is an ONNX model.
    #[arg(long = "input-shape", value_name = "NAME=DIMS", value_parser = crate::args::parse_input_shape)]
    input_shapes: Vec<(String, Vec<usize>)>,
    /// As for `ingot compile`, when the input is an ONNX model: the input becomes a constant,
    /// and what depends on it folds (an `If` on it picks its branch).
    #[arg(long = "constant-input", value_name = "NAME=FILE.npy", value_parser = crate::args::parse_constant_input)]
    constant_inputs: Vec<(String, PathBuf)>,
    /// As for `ingot compile`, when the input is an ONNX model.
    #[arg(long = "input-sequence", value_name = "NAME=DIMS,...", value_parser = crate::args::parse_input_sequence)]
    sequence_inputs: Vec<(String, Vec<Vec<usize>>)>,
    /// As for `ingot compile`, when the input is an ONNX model.
    #[arg(long = "absent-input", value_name = "NAME")]
    absent_inputs: Vec<String>,
    /// As for `ingot compile`, when the input is an ONNX model.
    #[arg(long, value_name = "N")]
    max_loop_iterations: Option<usize>,
    /// As for `ingot compile`, when the input is an ONNX model.
    #[arg(long)]
    f16_weights: bool,
}

/// How an ONNX model given to `plan` is compiled.
fn compile_options(args: &Args) -> Result<CompileOptions> {
    Ok(CompileOptions {
        input_shapes: args.input_shapes.clone(),
        constant_inputs: crate::args::read_constant_inputs(&args.constant_inputs)?,
        sequence_inputs: args.sequence_inputs.clone(),
        absent_inputs: args.absent_inputs.clone(),
        max_loop_iterations: args.max_loop_iterations,
        f16_weights: args.f16_weights,
        ..CompileOptions::default()
    })
}

fn is_bundle(path: &Path) -> Result<bool> {
    Ok(ingot_runtime::bundle::is_bundle_file(path)?)
}

pub fn main(args: Args) -> Result<()> {
    if args.stats {
        return print_stats(&args);
    }
    let variant = if is_bundle(&args.input)? {
        if !args.input_shapes.is_empty()
            || !args.constant_inputs.is_empty()
            || !args.sequence_inputs.is_empty()
            || !args.absent_inputs.is_empty()
            || args.max_loop_iterations.is_some()
            || args.f16_weights
        {
            bail!(
                "--input-shape, --constant-input, --input-sequence, --absent-input, \
                 --max-loop-iterations and --f16-weights apply to ONNX models; {} is a bundle, \
                 compiled with its shapes, constants and weights",
                args.input.display()
            );
        }
        let bundle = Bundle::open(&args.input)
            .with_context(|| format!("cannot open {}", args.input.display()))?;
        let index = match &args.variant {
            Some(name) => bundle.variant_index(name)?,
            None => 0,
        };
        bundle.manifest().variants.get(index).cloned().context("the bundle has no variants")?
    } else {
        let c = compile_graph(&args.input, &compile_options(&args)?)
            .with_context(|| format!("cannot compile {}", args.input.display()))?;
        let name = args.variant.as_deref().unwrap_or("main");
        bundle::variant(&c.variant(name), &[])
    };
    let format = if args.json { Format::Json } else { args.format };
    let text = match format {
        Format::Text => render::text(&variant),
        Format::Json => crate::report::json_text(&render::json(&variant))?,
        Format::Svg => render::svg(&variant),
    };
    crate::report::emit(&text, args.output.as_deref())
}

fn print_stats(args: &Args) -> Result<()> {
    if is_bundle(&args.input)? {
        bail!("--stats plans an ONNX model; {} is a bundle", args.input.display());
    }
    let c = compile_graph(&args.input, &compile_options(args)?)
        .with_context(|| format!("cannot compile {}", args.input.display()))?;
    let s = ingot_compiler::plan::stats(&c.graph, ingot_compiler::plan::Target::cpu());
    let text = format!(
        "{}\n{}\n",
        ingot_compiler::plan::Stats::header(),
        s.row(&args.input.display().to_string())
    );
    crate::report::emit(&text, args.output.as_deref())
}
