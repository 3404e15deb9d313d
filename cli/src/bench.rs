//! `ingot bench BUNDLE [--devices D] [--iterations N] [--json]`: load time, first run, run-time
//! distribution, device memory from the ledger beside the plan's prediction, peak RSS.

use anyhow::{Context, Result};
use ingot_runtime::{Bundle, Ledger, MemoryKind, Tensor, TensorDesc};
use ingot_schema::DType;
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// The bundle to measure.
    bundle: PathBuf,
    #[command(flatten)]
    session: crate::args::SessionArgs,
    /// Timed runs after the first.
    #[arg(long, default_value_t = 20)]
    iterations: usize,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn main(args: Args) -> Result<()> {
    // What the process holds before the bundle: peak RSS minus this is the model's share.
    let baseline_rss_bytes = rss_bytes("VmRSS:");
    let start = Instant::now();
    let bundle = Arc::new(
        Bundle::open(&args.bundle)
            .with_context(|| format!("cannot open {}", args.bundle.display()))?,
    );
    let ledger = Ledger::new();
    let mut session = crate::args::open_session(&bundle, &args.session, true, &ledger)?;
    let load_ms = ms(start);

    let inputs: Vec<Tensor> = session.inputs().iter().map(|i| seeded(&i.desc)).collect();
    let start = Instant::now();
    session.run(&inputs)?;
    let first_run_ms = ms(start);
    let mut times = Vec::with_capacity(args.iterations);
    for _ in 0..args.iterations {
        let start = Instant::now();
        session.run(&inputs)?;
        times.push(ms(start));
    }
    times.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        let k = ((times.len() as f64 - 1.0) * q).round() as usize;
        times.get(k).copied().unwrap_or(first_run_ms)
    };
    let (median_ms, p90_ms) = (quantile(0.5), quantile(0.9));

    let variant = match &args.session.variant {
        Some(name) => &bundle.manifest().variants[bundle.variant_index(name)?],
        None => bundle.manifest().variants.first().context("the bundle has no variants")?,
    };
    let staged = ledger.usage(MemoryKind::Staging).peak > 0;
    let on_vulkan: Vec<bool> =
        session.placement().0.iter().map(|p| p.device.starts_with("vulkan")).collect();
    let planned_peak_bytes =
        ingot_runtime::ledger::planned_peak_placed(variant, &on_vulkan, staged);
    let ledger_peak_bytes = ledger.total().peak;
    let by_kind: serde_json::Map<String, serde_json::Value> = MemoryKind::ALL
        .iter()
        .map(|&k| (k.name().to_string(), json!(ledger.usage(k).peak)))
        .collect();
    let peak_rss_bytes = rss_bytes("VmHWM:");

    if args.json {
        let report = json!({
            "bundle": args.bundle.display().to_string(),
            "variant": variant.name,
            "device": session.device(),
            "iterations": args.iterations,
            "load_ms": load_ms,
            "first_run_ms": first_run_ms,
            "median_ms": median_ms,
            "p90_ms": p90_ms,
            "ledger_peak_bytes": ledger_peak_bytes,
            "ledger_peak_by_kind": by_kind,
            "planned_peak_bytes": planned_peak_bytes,
            "peak_rss_bytes": peak_rss_bytes,
            "baseline_rss_bytes": baseline_rss_bytes,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("bundle    {} (variant {})", args.bundle.display(), variant.name);
        println!("device    {}", session.device());
        println!("load      {load_ms:.1} ms");
        println!("first run {first_run_ms:.1} ms");
        println!(
            "run       median {median_ms:.2} ms, p90 {p90_ms:.2} ms ({} runs)",
            args.iterations
        );
        println!("device memory peak {ledger_peak_bytes} bytes (planned {planned_peak_bytes})");
        for k in MemoryKind::ALL {
            let peak = ledger.usage(k).peak;
            if peak > 0 {
                println!("  {k:<8} {peak}");
            }
        }
        match (peak_rss_bytes, baseline_rss_bytes) {
            (Some(b), Some(base)) => println!("peak RSS  {b} bytes ({base} before the bundle)"),
            _ => println!("peak RSS  unknown on this platform"),
        }
    }
    Ok(())
}

fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

/// A deterministic input: floats uniform in [0, 1) from a fixed seed, other types zero.
fn seeded(desc: &TensorDesc) -> Tensor {
    if desc.dtype != DType::F32 {
        return Tensor::zeros(desc.clone());
    }
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let values: Vec<f32> = (0..desc.elements())
        .map(|_| {
            // xorshift64*: plenty for a benchmark input.
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            let bits = state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
            bits as f32 / (1u64 << 24) as f32
        })
        .collect();
    Tensor::from_vec(desc.shape.clone(), &values).unwrap_or_else(|_| Tensor::zeros(desc.clone()))
}

/// A resident-set figure of this process (Linux: `VmRSS:` now, `VmHWM:` its peak), if the
/// platform says.
fn rss_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
