//! `ingot plan MODEL.onnx|BUNDLE.ingot [--variant V] [--format text|json|svg]`

use anyhow::{Context, Result, bail};
use ingot_compiler::plan::render;
use ingot_compiler::{CompileOptions, bundle, compile_graph};
use ingot_runtime::Bundle;
use ingot_schema::container::MAGIC;
use std::io::Read;
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
    Svg,
}

#[derive(clap::Args)]
pub struct Args {
    /// An ONNX model (compiled on the fly) or a bundle.
    input: PathBuf,
    /// Which variant of a bundle (default: the first).
    #[arg(long)]
    variant: Option<String>,
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// Print what each planning mechanism saves (an ONNX model only): naive bytes, the lower
    /// bound with nothing shared, with views, with in-place writes and with reordering, the
    /// arena, and the planning time.
    #[arg(long)]
    stats: bool,
    /// As for `ingot compile`, when the input is an ONNX model.
    #[arg(long = "input-shape", value_name = "NAME=DIMS", value_parser = crate::args::parse_input_shape)]
    input_shapes: Vec<(String, Vec<usize>)>,
}

fn is_bundle(path: &Path) -> Result<bool> {
    let mut magic = [0u8; 8];
    let mut f =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    Ok(f.read_exact(&mut magic).is_ok() && magic == MAGIC)
}

pub fn main(args: Args) -> Result<()> {
    if args.stats {
        return print_stats(&args);
    }
    let variant = if is_bundle(&args.input)? {
        if !args.input_shapes.is_empty() {
            bail!(
                "--input-shape applies to ONNX models; {} is a bundle with static shapes",
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
        let options =
            CompileOptions { input_shapes: args.input_shapes, ..CompileOptions::default() };
        let c = compile_graph(&args.input, &options)
            .with_context(|| format!("cannot compile {}", args.input.display()))?;
        let name = args.variant.as_deref().unwrap_or("main");
        bundle::variant(&c.variant(name), &[])
    };
    match args.format {
        Format::Text => print!("{}", render::text(&variant)),
        Format::Json => println!("{}", serde_json::to_string_pretty(&render::json(&variant))?),
        Format::Svg => print!("{}", render::svg(&variant)),
    }
    Ok(())
}

fn print_stats(args: &Args) -> Result<()> {
    if is_bundle(&args.input)? {
        bail!("--stats plans an ONNX model; {} is a bundle", args.input.display());
    }
    let options =
        CompileOptions { input_shapes: args.input_shapes.clone(), ..CompileOptions::default() };
    let c = compile_graph(&args.input, &options)
        .with_context(|| format!("cannot compile {}", args.input.display()))?;
    let s = ingot_compiler::plan::stats(&c.graph, ingot_compiler::plan::Target::cpu());
    println!("{}", ingot_compiler::plan::Stats::header());
    println!("{}", s.row(&args.input.display().to_string()));
    Ok(())
}
