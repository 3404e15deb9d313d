//! What the subcommands share: argument parsers and opening a session.

use anyhow::{Context, Result, bail};
use ingot_runtime::{Bundle, Device, KernelClass, Ledger, Session, SessionOptions};
use std::sync::Arc;

/// Parses `NAME=1x3x48x192` (`--input-shape`).
pub fn parse_input_shape(s: &str) -> Result<(String, Vec<usize>)> {
    let (name, dims) = s
        .rsplit_once('=')
        .with_context(|| format!("--input-shape '{s}' should look like NAME=1x3x48x192"))?;
    if name.is_empty() {
        bail!("--input-shape '{s}' has no input name");
    }
    let dims = if dims.is_empty() {
        Vec::new() // a scalar
    } else {
        dims.split('x')
            .map(|d| d.trim().parse::<usize>())
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| {
                format!("--input-shape '{s}': dims must be numbers separated by 'x'")
            })?
    };
    Ok((name.to_string(), dims))
}

/// Parses `NAME=2x3,4,()` (`--input-sequence`): each element's dims, `()` for a scalar;
/// `NAME=` is an empty sequence.
pub fn parse_input_sequence(s: &str) -> Result<(String, Vec<Vec<usize>>)> {
    let (name, list) = s
        .rsplit_once('=')
        .with_context(|| format!("--input-sequence '{s}' should look like NAME=2x3,4"))?;
    if name.is_empty() {
        bail!("--input-sequence '{s}' has no input name");
    }
    let elements = match list {
        "" => Vec::new(),
        list => list
            .split(',')
            .map(|dims| match dims.trim() {
                "()" => Ok(Vec::new()),
                dims => Ok(parse_input_shape(&format!("{name}={dims}"))?.1),
            })
            .collect::<Result<_>>()
            .with_context(|| {
                format!("--input-sequence '{s}': elements are dims like 2x3, or () for a scalar")
            })?,
    };
    Ok((name.to_string(), elements))
}

/// Parses `NAME=FILE.npy` (`--constant-input`, `--input`).
pub fn parse_constant_input(s: &str) -> Result<(String, std::path::PathBuf)> {
    let (name, path) =
        s.split_once('=').with_context(|| format!("'{s}' should look like NAME=FILE.npy"))?;
    Ok((name.to_string(), std::path::PathBuf::from(path)))
}

/// The values of `--constant-input NAME=FILE.npy` arguments, read.
pub fn read_constant_inputs(
    list: &[(String, std::path::PathBuf)],
) -> Result<Vec<(String, ingot_runtime::Tensor)>> {
    list.iter()
        .map(|(name, path)| {
            let value =
                crate::npy::read(path).with_context(|| format!("--constant-input {name}"))?;
            Ok((name.clone(), value))
        })
        .collect()
}

/// Where and how `run` and `bench` run a bundle.
#[derive(clap::Args)]
pub struct SessionArgs {
    /// Devices to try for each submodel, in order: vulkan (the best GPU: discrete,
    /// integrated, virtual; never a CPU-type device), vulkan:N (by index), vulkan:cpu (a
    /// CPU-type device such as lavapipe, used only where named), cpu.
    #[arg(long, default_value = "vulkan,cpu", value_delimiter = ',')]
    pub devices: Vec<String>,
    /// Threads for the CPU backend (default: one per physical core).
    #[arg(long)]
    threads: Option<usize>,
    /// The CPU backend's idle threads spin a while for work between steps before they park
    /// (the default).
    #[arg(long, overrides_with = "no_spin")]
    spin: bool,
    /// The CPU backend's idle threads park at once: slower steps, cores left to the rest of
    /// the machine.
    #[arg(long, overrides_with = "spin")]
    no_spin: bool,
    /// Which Vulkan kernels run: auto (the device's class), cpu (the CPU-type kernels) or
    /// gpu (the GPU kernels, on any device: how lavapipe runs them in tests).
    #[arg(long, default_value = "auto")]
    pub kernel_class: String,
    /// The variant to run (default: the first).
    #[arg(long)]
    pub variant: Option<String>,
    /// A file that keeps compiled Vulkan pipelines between runs: read before pipelines are
    /// made, written after where it changed (a foreign or broken file is replaced).
    #[arg(long, value_name = "FILE")]
    pub pipeline_cache: Option<std::path::PathBuf>,
}

/// Opens a session whose submodels each run on the first device of `args.devices` that
/// prepares them. With `failover`, a submodel whose run fails moves to the next device.
pub fn open_session(
    bundle: &Arc<Bundle>,
    args: &SessionArgs,
    failover: bool,
    ledger: &Ledger,
) -> Result<Session> {
    // Every name is checked before any device is tried.
    let devices =
        args.devices.iter().map(|name| Device::parse(name)).collect::<Result<Vec<_>, _>>()?;
    let options = SessionOptions {
        variant: args.variant.clone(),
        devices,
        failover,
        threads: args.threads,
        spin: !args.no_spin,
        kernel_class: KernelClass::parse(&args.kernel_class)?,
        pipeline_cache: args.pipeline_cache.clone(),
        ledger: Some(ledger.clone()),
        ..SessionOptions::default()
    };
    Ok(Session::new(bundle.clone(), options)?)
}

/// Formats a shape as `1x3x48x192` (`scalar` for rank 0).
pub fn shape_text(shape: &[usize]) -> String {
    let dims: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    ingot_compiler::plan::render::shape_text(&dims)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_shapes_parse_and_errors_explain() {
        assert_eq!(parse_input_shape("x=1x3x48x192").unwrap(), ("x".into(), vec![1, 3, 48, 192]));
        assert_eq!(parse_input_shape("a=b=7").unwrap(), ("a=b".into(), vec![7]));
        assert!(parse_input_shape("x").is_err());
        assert!(parse_input_shape("x=1xfoo").is_err());
        let seq = |s| parse_input_sequence(s).unwrap();
        assert_eq!(seq("s=2x3,4,()"), ("s".into(), vec![vec![2, 3], vec![4], vec![]]));
        assert_eq!(seq("s="), ("s".into(), vec![]));
        assert!(parse_input_sequence("s=2x,3").is_err());
        assert!(parse_input_sequence("=2").is_err());
        assert_eq!(shape_text(&[]), "scalar");
    }
}
