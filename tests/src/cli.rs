//! Running the `ingot` binary and checking how it fails.

use crate::paths::ingot_binary;
use anyhow::{Context, Result, bail};
use std::ffi::OsStr;
use std::process::{Command, Output};

/// Runs `ingot ARGS...` and returns what it did (whatever its exit status).
pub fn ingot<I, S>(args: I) -> Result<Output>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let binary = ingot_binary()?;
    Command::new(&binary).args(args).output().with_context(|| format!("run {}", binary.display()))
}

/// Checks that a command failed the way a user should see it fail: a non-zero exit code and a
/// message on stderr, not a panic. Returns stderr.
pub fn expect_clean_failure(what: &str, output: &Output) -> Result<String> {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    if output.status.success() {
        bail!("{what}: exited 0, expected an error; stderr: {stderr}");
    }
    if stderr.trim().is_empty() {
        bail!("{what}: exited with {} and printed no error", output.status);
    }
    // A panic exits with 101 and says "panicked"; a signal has no exit code.
    if stderr.contains("panicked") || output.status.code().is_none_or(|c| c == 101) {
        bail!("{what}: crashed ({}) instead of reporting an error:\n{stderr}", output.status);
    }
    Ok(stderr)
}

/// Checks that a command succeeded; returns stdout.
pub fn expect_success(what: &str, output: &Output) -> Result<String> {
    if !output.status.success() {
        bail!(
            "{what}: exited with {}:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
