//! `ingot bench BUNDLE [--devices D] [--warmup N] [--iterations N] [--profile] [--json]`: load
//! time, first run, run-time distribution, device memory from the ledger beside the plan's
//! prediction, peak RSS; with `--profile`, where the time goes, per step and per op. The JSON
//! form is documented in README.md ("`ingot bench --json`") and versioned by `schema_version`.

use anyhow::{Context, Result};
use ingot_runtime::{Bundle, Ledger, MemoryKind, Session, StepProfile, Tensor, TensorDesc};
use serde_json::json;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// The bundle to measure.
    bundle: PathBuf,
    #[command(flatten)]
    session: crate::args::SessionArgs,
    /// Runs before the timed ones (at least 1: the first run, reported on its own, prepares
    /// what a device builds lazily).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    warmup: u64,
    /// Timed runs after the warm-up (at least 1).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    iterations: u64,
    #[command(flatten)]
    random: crate::random::RandomArgs,
    /// After the timed runs, as many profiled runs: each step's median time, sorted by time
    /// and summed per op (Vulkan: device timestamps, steps run one after another; CPU: wall
    /// time per step).
    #[arg(long)]
    profile: bool,
    /// One JSON object instead of text (with --profile, every step in the variant's order).
    #[arg(long)]
    json: bool,
    /// Write the report to FILE instead of standard output.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
}

/// The version of the `--json` report's layout: bumped when a field changes meaning or goes.
const BENCH_JSON_VERSION: u32 = 1;

/// The distribution of the timed runs, in milliseconds.
struct Stats {
    min: f64,
    mean: f64,
    median: f64,
    p90: f64,
    max: f64,
    stddev: f64,
}

impl Stats {
    /// Of at least one time.
    fn of(mut times: Vec<f64>) -> Stats {
        times.sort_by(f64::total_cmp);
        let n = times.len() as f64;
        let quantile = |q: f64| times[((n - 1.0) * q).round() as usize];
        let mean = times.iter().sum::<f64>() / n;
        let var = times.iter().map(|t| (t - mean) * (t - mean)).sum::<f64>() / n;
        Stats {
            min: times[0],
            mean,
            median: quantile(0.5),
            p90: quantile(0.9),
            max: times[times.len() - 1],
            stddev: var.sqrt(),
        }
    }
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

    let descs: Vec<&TensorDesc> = session.inputs().iter().map(|i| &i.desc).collect();
    let inputs = args.random.tensors(&descs)?;
    let start = Instant::now();
    session.run(&inputs)?;
    let first_run_ms = ms(start);
    for _ in 1..args.warmup {
        session.run(&inputs)?;
    }
    let mut times = Vec::with_capacity(args.iterations as usize);
    for _ in 0..args.iterations {
        let start = Instant::now();
        session.run(&inputs)?;
        times.push(ms(start));
    }
    let stats = Stats::of(times);
    let profile = match args.profile {
        true => Some(profile(&mut session, &inputs, args.iterations as usize)?),
        false => None,
    };

    let variant = match &args.session.variant {
        Some(name) => &bundle.manifest().variants[bundle.variant_index(name)?],
        None => bundle.manifest().variants.first().context("the bundle has no variants")?,
    };
    let planned_peak_bytes = session.planned_device_peak();
    let ledger_peak_bytes = ledger.total().peak;
    let by_kind: serde_json::Map<String, serde_json::Value> = MemoryKind::ALL
        .iter()
        .map(|&k| (k.name().to_string(), json!(ledger.usage(k).peak)))
        .collect();
    let peak_rss_bytes = rss_bytes("VmHWM:");

    let mut text = String::new();
    if args.json {
        let mut report = json!({
            "schema_version": BENCH_JSON_VERSION,
            "bundle": args.bundle.display().to_string(),
            "variant": variant.name,
            "devices": args.session.devices,
            "kernel_class": args.session.kernel_class,
            "device": session.device(),
            "threads": session.threads(),
            "spin": session.spin(),
            "inputs": {
                "seed": args.random.seed,
                "float_range": [args.random.float_range.0, args.random.float_range.1],
                "int_range": [args.random.int_range.0, args.random.int_range.1],
            },
            "warmup": args.warmup,
            "iterations": args.iterations,
            "load_ms": load_ms,
            "first_run_ms": first_run_ms,
            "min_ms": stats.min,
            "mean_ms": stats.mean,
            "median_ms": stats.median,
            "p90_ms": stats.p90,
            "max_ms": stats.max,
            "stddev_ms": stats.stddev,
            "ledger_peak_bytes": ledger_peak_bytes,
            "ledger_peak_by_kind": by_kind,
            "planned_peak_bytes": planned_peak_bytes,
            "peak_rss_bytes": peak_rss_bytes,
            "baseline_rss_bytes": baseline_rss_bytes,
        });
        if let Some(p) = &profile {
            report["profile"] = p.json();
        }
        text = crate::report::json_text(&report)?;
    } else {
        let t = &mut text;
        writeln!(t, "bundle    {} (variant {})", args.bundle.display(), variant.name)?;
        writeln!(t, "device    {} ({} CPU threads)", session.device(), session.threads())?;
        writeln!(t, "load      {load_ms:.1} ms")?;
        writeln!(t, "first run {first_run_ms:.1} ms")?;
        writeln!(
            t,
            "run       median {:.2} ms, p90 {:.2} ms, min {:.2}, mean {:.2}, max {:.2}, stddev \
             {:.2} ({} runs after {} warm-up)",
            stats.median,
            stats.p90,
            stats.min,
            stats.mean,
            stats.max,
            stats.stddev,
            args.iterations,
            args.warmup
        )?;
        writeln!(t, "device memory peak {ledger_peak_bytes} bytes (planned {planned_peak_bytes})")?;
        for k in MemoryKind::ALL {
            let peak = ledger.usage(k).peak;
            if peak > 0 {
                writeln!(t, "  {k:<8} {peak}")?;
            }
        }
        match (peak_rss_bytes, baseline_rss_bytes) {
            (Some(b), Some(base)) => writeln!(t, "peak RSS  {b} bytes ({base} before the bundle)")?,
            _ => writeln!(t, "peak RSS  unknown on this platform")?,
        }
        if let Some(p) = &profile {
            t.push_str(&p.text(stats.median));
        }
    }
    crate::report::emit(&text, args.output.as_deref())
}

/// Each step of `runs` profiled runs, with its median time.
struct Profile {
    runs: usize,
    steps: Vec<(StepProfile, Option<u64>)>,
}

fn profile(session: &mut Session, inputs: &[Tensor], runs: usize) -> Result<Profile> {
    let mut steps: Vec<(StepProfile, Vec<u64>)> = Vec::new();
    for _ in 0..runs {
        let (_, profile) = session.profile(inputs)?;
        if steps.is_empty() {
            steps = profile.iter().map(|s| (s.clone(), Vec::with_capacity(runs))).collect();
        }
        for ((_, times), s) in steps.iter_mut().zip(&profile) {
            times.extend(s.nanos);
        }
    }
    let median = |mut t: Vec<u64>| {
        t.sort_unstable();
        t.get(t.len() / 2).copied()
    };
    Ok(Profile { runs, steps: steps.into_iter().map(|(s, t)| (s, median(t))).collect() })
}

impl Profile {
    fn total_ns(&self) -> u64 {
        self.steps.iter().filter_map(|(_, t)| *t).sum()
    }

    /// Per op (with its post-ops): total nanoseconds and step count, largest total first.
    fn by_op(&self) -> Vec<(&str, u64, usize)> {
        let mut ops: BTreeMap<&str, (u64, usize)> = BTreeMap::new();
        for (s, t) in &self.steps {
            let e = ops.entry(s.op.as_str()).or_default();
            e.0 += t.unwrap_or(0);
            e.1 += 1;
        }
        let mut ops: Vec<_> = ops.into_iter().map(|(op, (t, n))| (op, t, n)).collect();
        ops.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        ops
    }

    fn text(&self, median_ms: f64) -> String {
        use std::fmt::Write;
        let total = self.total_ns();
        let share = |t: u64| if total == 0 { 0.0 } else { 100.0 * t as f64 / total as f64 };
        let mut out = String::new();
        let _ = writeln!(
            out,
            "profile   median of {} profiled runs: steps sum to {:.2} ms (unprofiled run {median_ms:.2} ms)",
            self.runs,
            total as f64 / 1e6
        );
        if self.steps.iter().any(|(_, t)| t.is_none()) {
            let _ = writeln!(out, "  (steps on a device without timestamps are untimed: -)");
        }
        let _ = writeln!(out, "by op\n  {:>6} {:>10} {:>5}  op", "share", "ms", "steps");
        for (op, t, n) in self.by_op() {
            let _ = writeln!(out, "  {:>5.1}% {:>10.3} {n:>5}  {op}", share(t), t as f64 / 1e6);
        }
        let mut order: Vec<&(StepProfile, Option<u64>)> = self.steps.iter().collect();
        order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.index.cmp(&b.0.index)));
        let _ = writeln!(
            out,
            "by step\n  {:>6} {:>10} {:>5} {:>5}  {:<24} {:<18} {:<9} name",
            "share", "ms", "disp", "step", "op", "output", "device"
        );
        for (s, t) in order {
            let dims: Vec<String> = s.output.iter().map(usize::to_string).collect();
            let device = s.device.split(' ').next().unwrap_or("");
            let _ = writeln!(
                out,
                "  {:>6} {:>10} {:>5} {:>5}  {:<24} {:<18} {:<9} {}",
                t.map_or("-".into(), |t| format!("{:.1}%", share(t))),
                t.map_or("-".into(), |t| format!("{:.3}", t as f64 / 1e6)),
                s.dispatches.map_or("-".into(), |d| d.to_string()),
                s.index,
                s.op,
                dims.join("x"),
                device,
                s.name
            );
        }
        out
    }

    fn json(&self) -> serde_json::Value {
        let steps: Vec<serde_json::Value> = self
            .steps
            .iter()
            .map(|(s, t)| {
                json!({
                    "index": s.index,
                    "name": s.name,
                    "op": s.op,
                    "output": s.output,
                    "submodel": s.submodel,
                    "device": s.device,
                    "dispatches": s.dispatches,
                    "median_ns": t,
                })
            })
            .collect();
        let ops: Vec<serde_json::Value> = self
            .by_op()
            .into_iter()
            .map(|(op, t, n)| json!({"op": op, "total_ns": t, "steps": n}))
            .collect();
        json!({"runs": self.runs, "total_ns": self.total_ns(), "by_op": ops, "steps": steps})
    }
}

fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

/// A resident-set figure of this process (Linux: `VmRSS:` now, `VmHWM:` its peak), if the
/// platform says.
fn rss_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
