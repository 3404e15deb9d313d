//! `ingot run BUNDLE --input NAME=FILE.npy --output-dir DIR`

use crate::npy;
use anyhow::{Context, Result, bail};
use ingot_runtime::{Bundle, Ledger, Session, Tensor};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// The bundle to run.
    bundle: PathBuf,
    /// An input: NAME=FILE.npy. One per graph input.
    #[arg(long = "input", value_name = "NAME=FILE.npy", value_parser = crate::args::parse_constant_input)]
    inputs: Vec<(String, PathBuf)>,
    /// Directory for the outputs, written as <output name>.npy (names made file-safe).
    #[arg(long)]
    output_dir: PathBuf,
    #[command(flatten)]
    session: crate::args::SessionArgs,
    /// Return the error when running a submodel fails, instead of moving it to the next
    /// device and running it again.
    #[arg(long)]
    no_failover: bool,
}

/// A name that is safe as a file name on every platform.
pub fn file_safe(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' })
        .collect();
    if s.is_empty() || s.starts_with('.') { format!("_{s}") } else { s }
}

pub fn main(args: Args) -> Result<()> {
    let start = Instant::now();
    let bundle = Arc::new(
        Bundle::open(&args.bundle)
            .with_context(|| format!("cannot open {}", args.bundle.display()))?,
    );
    let ledger = Ledger::new();
    let mut session =
        crate::args::open_session(&bundle, &args.session, !args.no_failover, &ledger)?;
    let load_ms = start.elapsed().as_secs_f64() * 1e3;

    let mut inputs: Vec<Tensor> = Vec::new();
    for info in session.inputs() {
        let Some((_, path)) = args.inputs.iter().find(|(n, _)| n == &info.name) else {
            bail!(
                "missing --input {}=FILE.npy (the bundle's inputs: {})",
                info.name,
                input_names(&session)
            );
        };
        inputs.push(npy::read(path).with_context(|| format!("input '{}'", info.name))?);
    }
    for (name, _) in &args.inputs {
        if !session.inputs().iter().any(|i| &i.name == name) {
            bail!("the bundle has no input '{name}'; its inputs: {}", input_names(&session));
        }
    }
    let start = Instant::now();
    let outputs = session.run(&inputs)?;
    let run_ms = start.elapsed().as_secs_f64() * 1e3;

    std::fs::create_dir_all(&args.output_dir)
        .with_context(|| format!("cannot create {}", args.output_dir.display()))?;
    for (info, t) in session.outputs().iter().zip(&outputs) {
        let path = args.output_dir.join(format!("{}.npy", file_safe(&info.name)));
        npy::write(&path, t)?;
        println!("{} {} {:?} -> {}", info.name, t.dtype(), t.shape(), path.display());
    }
    // After the run: a failover while running changes where a submodel runs.
    print!("{}", session.placement());
    println!("load {load_ms:.1} ms, run {run_ms:.1} ms");
    Ok(())
}

fn input_names(s: &Session) -> String {
    s.inputs().iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", ")
}
