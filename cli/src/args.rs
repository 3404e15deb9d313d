//! What the subcommands share: argument parsers and opening a session.

use anyhow::{Context, Result, bail};
use ingot_runtime::{Bundle, Device, Ledger, Session, SessionOptions};
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

/// Parses `NAME=FILE.npy` (`--constant-input`, `--input`).
pub fn parse_constant_input(s: &str) -> Result<(String, std::path::PathBuf)> {
    let (name, path) = s
        .split_once('=')
        .with_context(|| format!("'{s}' should look like NAME=FILE.npy"))?;
    Ok((name.to_string(), std::path::PathBuf::from(path)))
}

/// Opens a session of `variant` whose submodels each run on the first of `devices` (names as
/// [`Device::parse`] takes them) that prepares them. Failover moves a submodel whose run
/// fails to the next device.
pub fn open_session(
    bundle: &Arc<Bundle>,
    variant: Option<&str>,
    devices: &[String],
    failover: bool,
    threads: Option<usize>,
    ledger: &Ledger,
) -> Result<Session> {
    // Every name is checked before any device is tried.
    let devices = devices
        .iter()
        .map(|name| Device::parse(name))
        .collect::<Result<Vec<_>, _>>()?;
    let options = SessionOptions {
        variant: variant.map(str::to_string),
        devices,
        failover,
        threads,
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
        assert_eq!(
            parse_input_shape("x=1x3x48x192").unwrap(),
            ("x".into(), vec![1, 3, 48, 192])
        );
        assert_eq!(parse_input_shape("a=b=7").unwrap(), ("a=b".into(), vec![7]));
        assert!(parse_input_shape("x").is_err());
        assert!(parse_input_shape("x=1xfoo").is_err());
        assert_eq!(shape_text(&[]), "scalar");
    }
}
