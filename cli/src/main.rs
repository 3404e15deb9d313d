//! `ingot`: compile ONNX models into bundles, inspect them, run them.

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod args;
mod bench;
mod compile;
mod inspect;
mod logger;
mod npy;
mod plan;
mod random;
mod report;
mod run;

/// Ingot: an ahead-of-time compiler for on-device inference. ONNX in, memory-planned bundle
/// out; a thin runtime runs the bundle.
#[derive(Parser)]
#[command(name = "ingot", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// More messages on stderr: -v says where each submodel runs and why a device was
    /// skipped, -vv and -vvv add detail.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Only errors on stderr.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Compile ONNX models into one bundle.
    Compile(compile::Args),
    /// Run a bundle on .npy/.npz or random inputs; save, print or check its outputs.
    Run(run::Args),
    /// Describe a bundle: format, inputs and outputs, ops, memory, sections, kernels.
    Inspect(inspect::Args),
    /// Print the memory plan of a model or bundle (text, JSON or SVG).
    Plan(plan::Args),
    /// Measure a bundle: load, first run, run-time distribution, device memory against the
    /// plan, RSS, and with --profile the time per step and per op.
    Bench(bench::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logger::init(cli.verbose, cli.quiet);
    let result: Result<()> = match cli.command {
        Command::Compile(args) => compile::main(args),
        Command::Run(args) => run::main(args),
        Command::Inspect(args) => inspect::main(args),
        Command::Plan(args) => plan::main(args),
        Command::Bench(args) => bench::main(args),
    };
    // With INGOT_VULKAN_VALIDATION set, what the validation layer reported fails the command:
    // a driver that forgives invalid usage (lavapipe) would otherwise hide it.
    let messages = ingot_runtime::vulkan::validation_messages();
    if !messages.is_empty() {
        for m in &messages {
            eprintln!("vulkan validation {m}");
        }
        eprintln!("error: the Vulkan validation layer reported {} messages", messages.len());
        return ExitCode::FAILURE;
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of our output has gone (`| head`): nothing left to say, as for `cat`.
        Err(e) if report::is_closed_pipe(&e) => ExitCode::SUCCESS,
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
