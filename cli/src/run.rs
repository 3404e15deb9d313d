//! `ingot run BUNDLE (--input NAME=FILE.npy | --inputs FILE.npz | --random-inputs)
//! [-o DIR] [--expected DIR] [--print] [--json]`

use crate::npy;
use crate::random::RandomArgs;
use anyhow::{Context, Result, bail};
use ingot_runtime::{Bundle, IoInfo, Ledger, Session, Tensor};
use ingot_schema::DType;
use serde_json::json;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// The bundle to run.
    bundle: PathBuf,
    /// An input: NAME=FILE.npy. Repeatable, one per graph input.
    #[arg(long = "input", value_name = "NAME=FILE.npy", value_parser = crate::args::parse_constant_input)]
    inputs: Vec<(String, PathBuf)>,
    /// Inputs from a numpy archive (np.savez): one array per graph input, by name.
    #[arg(long = "inputs", value_name = "FILE.npz")]
    archive: Option<PathBuf>,
    /// Random inputs, seeded (see --seed, --float-range, --int-range); with -o they are saved
    /// under DIR/inputs/ to run again or to feed another runtime.
    #[arg(long, conflicts_with_all = ["inputs", "archive"])]
    random_inputs: bool,
    #[command(flatten)]
    random: RandomArgs,
    /// Write each output to DIR/<output name>.npy (names made file-safe).
    #[arg(short, long = "output-dir", value_name = "DIR")]
    output_dir: Option<PathBuf>,
    /// Compare each output with DIR/<output name>.npy: print the largest absolute and
    /// relative errors, and fail when an element is off by more than atol + rtol * |expected|.
    #[arg(long, value_name = "DIR")]
    expected: Option<PathBuf>,
    /// Relative tolerance of --expected.
    #[arg(long, default_value_t = 1e-3, requires = "expected")]
    rtol: f64,
    /// Absolute tolerance of --expected.
    #[arg(long, default_value_t = 1e-4, requires = "expected")]
    atol: f64,
    /// Print each output: shape, first values, range and argmax.
    #[arg(long)]
    print: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
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

    let inputs = gather_inputs(&args, &session)?;
    if let (true, Some(dir)) = (args.random_inputs, &args.output_dir) {
        let dir = dir.join("inputs");
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        for (info, t) in session.inputs().iter().zip(&inputs) {
            npy::write(&dir.join(format!("{}.npy", file_safe(&info.name))), t)?;
        }
    }
    let start = Instant::now();
    let outputs = session.run(&inputs)?;
    let run_ms = start.elapsed().as_secs_f64() * 1e3;

    let mut text = String::new();
    let mut reports = Vec::new();
    let mut failed = Vec::new();
    if let Some(dir) = &args.output_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    for (info, t) in session.outputs().iter().zip(&outputs) {
        let mut report = json!({"name": info.name, "dtype": t.dtype().name(), "shape": t.shape()});
        write!(text, "{} {} {}", info.name, t.dtype(), crate::args::shape_text(t.shape()))?;
        if let Some(dir) = &args.output_dir {
            let path = dir.join(format!("{}.npy", file_safe(&info.name)));
            npy::write(&path, t)?;
            write!(text, " -> {}", path.display())?;
            report["file"] = json!(path.display().to_string());
        }
        writeln!(text)?;
        if args.print {
            let s = summary(t);
            writeln!(text, "  {}", s.text())?;
            report["values"] = s.json();
        }
        if let Some(dir) = &args.expected {
            let c = compare(t, &dir.join(format!("{}.npy", file_safe(&info.name))), &args)
                .with_context(|| format!("output '{}'", info.name))?;
            writeln!(text, "  {}", c.text(&args))?;
            if c.mismatches > 0 {
                failed.push(info.name.clone());
            }
            report["comparison"] = c.json();
        }
        reports.push(report);
    }
    // After the run: a failover while running changes where a submodel runs.
    let placement = session.placement();
    write!(text, "{placement}")?;
    writeln!(text, "load {load_ms:.1} ms, run {run_ms:.1} ms")?;
    if args.json {
        text = crate::report::json_text(&json!({
            "bundle": args.bundle.display().to_string(),
            "device": session.device(),
            "placement": placement.to_string(),
            "load_ms": load_ms,
            "run_ms": run_ms,
            "outputs": reports,
        }))?;
    }
    crate::report::emit(&text, None)?;
    if !failed.is_empty() {
        bail!(
            "{} differ from --expected past rtol {} and atol {}: {}",
            if failed.len() == 1 { "1 output" } else { "outputs" },
            args.rtol,
            args.atol,
            failed.join(", ")
        );
    }
    Ok(())
}

/// The session's inputs in its order, from the files or the generator the arguments name.
/// Names are checked first: an unknown name is usually a typo of a missing one.
fn gather_inputs(args: &Args, session: &Session) -> Result<Vec<Tensor>> {
    let known = || session.inputs().iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", ");
    if args.random_inputs {
        let descs: Vec<_> = session.inputs().iter().map(|i| &i.desc).collect();
        return args.random.tensors(&descs);
    }
    let mut given: Vec<(String, Tensor, String)> = Vec::new();
    if let Some(path) = &args.archive {
        for (name, t) in npy::read_archive(path)? {
            given.push((name.clone(), t, format!("{}[{name}]", path.display())));
        }
    }
    for (name, path) in &args.inputs {
        let t = npy::read(path).with_context(|| format!("input '{name}'"))?;
        given.push((name.clone(), t, path.display().to_string()));
    }
    for (name, _, from) in &given {
        if !session.inputs().iter().any(|i| &i.name == name) {
            bail!("the bundle has no input '{name}' (from {from}); its inputs: {}", known());
        }
    }
    let mut inputs = Vec::with_capacity(session.inputs().len());
    for info in session.inputs() {
        let Some(k) = given.iter().rposition(|(n, _, _)| n == &info.name) else {
            bail!(
                "input '{}' is missing: give --input {}=FILE.npy, --inputs FILE.npz or \
                 --random-inputs (the bundle's inputs: {})",
                info.name,
                info.name,
                known()
            );
        };
        let (_, t, from) = given.swap_remove(k);
        check_input(info, &t, &from)?;
        inputs.push(t);
    }
    Ok(inputs)
}

/// The input's type and shape are the bundle's, or the error says how to make them so.
fn check_input(info: &IoInfo, t: &Tensor, from: &str) -> Result<()> {
    let want = info.desc.dtype;
    if t.dtype() != want {
        bail!(
            "input '{}' ({from}) holds {}, the bundle takes {}: save it as {} (numpy: \
             a.astype(np.{}))",
            info.name,
            t.dtype().numpy_name(),
            want.numpy_name(),
            want.numpy_name(),
            want.numpy_name()
        );
    }
    if t.shape() != info.desc.shape {
        let shape = crate::args::shape_text(t.shape());
        bail!(
            "input '{}' ({from}) has shape {shape}, the bundle was compiled for {}: compile \
             with --input-shape {}={shape} to run this shape",
            info.name,
            crate::args::shape_text(&info.desc.shape),
            info.name
        );
    }
    Ok(())
}

/// Every element as f64 (bool as 0 or 1): what printing and comparing need.
fn values(t: &Tensor) -> Vec<f64> {
    macro_rules! all {
        ($t:ty) => {
            t.as_slice::<$t>().map(|v| v.iter().map(|&x| x as f64).collect()).unwrap_or_default()
        };
    }
    match t.dtype() {
        DType::F32 => all!(f32),
        DType::F64 => all!(f64),
        DType::F16 => t
            .as_slice::<half::f16>()
            .map(|v| v.iter().map(|x| x.to_f64()).collect())
            .unwrap_or_default(),
        DType::I8 | DType::I4 | DType::I2 => all!(i8),
        DType::U8 | DType::Bool | DType::U4 | DType::U2 => all!(u8),
        DType::I16 => all!(i16),
        DType::U16 => all!(u16),
        DType::I32 => all!(i32),
        DType::U32 => all!(u32),
        DType::I64 => all!(i64),
        DType::U64 => all!(u64),
        d @ (DType::F8E4M3FN
        | DType::F8E4M3FNUZ
        | DType::F8E5M2
        | DType::F8E5M2FNUZ
        | DType::F8E8M0
        | DType::F4E2M1) => {
            let f = ingot_runtime::minifloat::Format::of(d);
            t.bytes().iter().map(|&b| f.map_or(f64::NAN, |f| f64::from(f.decode(b)))).collect()
        }
    }
}

struct Summary {
    first: Vec<f64>,
    min: f64,
    max: f64,
    mean: f64,
    argmax: Option<usize>,
}

const FIRST_VALUES: usize = 8;

fn summary(t: &Tensor) -> Summary {
    let v = values(t);
    let argmax =
        (0..v.len()).filter(|&k| !v[k].is_nan()).reduce(|a, b| if v[b] > v[a] { b } else { a });
    Summary {
        first: v.iter().copied().take(FIRST_VALUES).collect(),
        min: v.iter().copied().fold(f64::INFINITY, f64::min),
        max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        mean: v.iter().sum::<f64>() / v.len().max(1) as f64,
        argmax,
    }
}

impl Summary {
    fn text(&self) -> String {
        let first: Vec<String> = self.first.iter().map(|v| format!("{v:.6}")).collect();
        let more = if self.first.len() == FIRST_VALUES { ", ..." } else { "" };
        let argmax = self.argmax.map_or("-".into(), |k| k.to_string());
        format!(
            "[{}{more}] min {:.6} max {:.6} mean {:.6} argmax {argmax}",
            first.join(", "),
            self.min,
            self.max,
            self.mean
        )
    }

    fn json(&self) -> serde_json::Value {
        // JSON has no NaN or infinity: those become null.
        let num = |v: f64| if v.is_finite() { json!(v) } else { json!(null) };
        json!({
            "first": self.first.iter().map(|&v| num(v)).collect::<Vec<_>>(),
            "min": num(self.min),
            "max": num(self.max),
            "mean": num(self.mean),
            "argmax": self.argmax,
        })
    }
}

struct Comparison {
    file: PathBuf,
    max_abs: f64,
    max_rel: f64,
    mismatches: usize,
    worst: Option<usize>,
}

/// Compares `t` with the `.npy` at `path`, elementwise as numpy's `allclose` does (NaN
/// matches only NaN).
fn compare(t: &Tensor, path: &Path, args: &Args) -> Result<Comparison> {
    let expected = npy::read(path)?;
    if expected.shape() != t.shape() {
        bail!(
            "{} has shape {}, the output {}",
            path.display(),
            crate::args::shape_text(expected.shape()),
            crate::args::shape_text(t.shape())
        );
    }
    let (got, want) = (values(t), values(&expected));
    let mut c = Comparison {
        file: path.to_path_buf(),
        max_abs: 0.0,
        max_rel: 0.0,
        mismatches: 0,
        worst: None,
    };
    let mut worst_excess = f64::NEG_INFINITY;
    for (k, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let (err, bound) = if g.is_nan() || w.is_nan() {
            (if g.is_nan() && w.is_nan() { 0.0 } else { f64::INFINITY }, 0.0)
        } else if g == w {
            (0.0, 0.0) // equal infinities too
        } else {
            ((g - w).abs(), args.atol + args.rtol * w.abs())
        };
        c.max_abs = c.max_abs.max(err);
        if w != 0.0 && err > 0.0 {
            c.max_rel = c.max_rel.max(err / w.abs());
        }
        if err > bound {
            c.mismatches += 1;
            if err - bound > worst_excess {
                worst_excess = err - bound;
                c.worst = Some(k);
            }
        }
    }
    Ok(c)
}

impl Comparison {
    fn text(&self, args: &Args) -> String {
        let verdict = match self.worst {
            None => "ok".to_string(),
            Some(k) => format!("{} elements off, the worst at flat index {k}", self.mismatches),
        };
        format!(
            "vs {}: max abs error {:.3e}, max rel error {:.3e} (rtol {}, atol {}): {verdict}",
            self.file.display(),
            self.max_abs,
            self.max_rel,
            args.rtol,
            args.atol
        )
    }

    fn json(&self) -> serde_json::Value {
        let num = |v: f64| if v.is_finite() { json!(v) } else { json!(null) };
        json!({
            "file": self.file.display().to_string(),
            "max_abs_error": num(self.max_abs),
            "max_rel_error": num(self.max_rel),
            "mismatches": self.mismatches,
            "worst_index": self.worst,
        })
    }
}
