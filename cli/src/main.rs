//! `ingot`: compile ONNX models into bundles, inspect them, run them.

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod args;
mod bench;
mod compile;
mod inspect;
mod npy;
mod plan;
mod run;

/// Ingot: an ahead-of-time compiler for on-device inference. ONNX in, memory-planned bundle
/// out; a thin runtime runs the bundle.
#[derive(Parser)]
#[command(name = "ingot", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compile an ONNX model into a bundle.
    Compile(compile::Args),
    /// Run a bundle on .npy inputs and write its outputs as .npy files.
    Run(run::Args),
    /// Describe a bundle: format, inputs and outputs, ops, memory, sections.
    Inspect(inspect::Args),
    /// Print the memory plan of a model or bundle (text or JSON).
    Plan(plan::Args),
    /// Measure a bundle: load, first run, run times, device memory against the plan, RSS.
    Bench(bench::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result: Result<()> = match cli.command {
        Command::Compile(args) => compile::main(args),
        Command::Run(args) => run::main(args),
        Command::Inspect(args) => inspect::main(args),
        Command::Plan(args) => plan::main(args),
        Command::Bench(args) => bench::main(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One paragraph: the outermost context, then each cause.
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}
