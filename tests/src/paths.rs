//! Where things are: the repo, its target dir, generated data, the `ingot` binary.

use anyhow::{Result, bail};
use std::path::{Path, PathBuf};

/// The command that makes every file the tests read (run from the repo root).
pub const SETUP_COMMAND: &str = "bash tools/setup.sh";

/// The workspace root.
pub fn repo_root() -> &'static Path {
    // This crate lives in <root>/tests; its manifest dir is absolute.
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir)
}

/// The cargo target dir: `$CARGO_TARGET_DIR` (relative to the repo root, as tools/setup.sh
/// takes it) or `<root>/target`. The generated test data lives here too.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => repo_root().join(dir),
        None => repo_root().join("target"),
    }
}

/// `target/<rel>`, or an error that says how to generate it.
pub fn generated(rel: &str) -> Result<PathBuf> {
    let path = target_dir().join(rel);
    if !path.exists() {
        bail!(
            "{} is missing: generate the test data with `{SETUP_COMMAND}` from the repo root",
            path.display()
        );
    }
    Ok(path)
}

/// A fresh, empty scratch dir for one test: `target/ingot-tests/<name>`.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = target_dir().join("ingot-tests").join(name);
    // Leftovers from an earlier run are removed; errors surface when the test writes.
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// The `ingot` binary cargo built beside this test executable (`target/<profile>/ingot`, the
/// test itself being `target/<profile>/deps/<test>-<hash>`). Cargo does not build another
/// package's binary for our tests, so this errors, with the build command, when the binary is
/// missing or stale: older than a source file its dep-info (`ingot.d`) lists, which is the
/// rule cargo itself rebuilds by.
pub fn ingot_binary() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let Some(profile_dir) = exe.parent().and_then(Path::parent) else {
        bail!("cannot locate the profile dir from {}", exe.display());
    };
    let binary = profile_dir.join(format!("ingot{}", std::env::consts::EXE_SUFFIX));
    let build = "cargo build -p ingot-cli";
    let Ok(built) = binary.metadata().and_then(|m| m.modified()) else {
        bail!("{} does not exist: build it with `{build}`", binary.display());
    };
    let dep_info = std::fs::read_to_string(profile_dir.join("ingot.d")).unwrap_or_default();
    for source in dep_info_sources(&dep_info) {
        let fresh = source.metadata().and_then(|m| m.modified()).is_ok_and(|m| m <= built);
        if !fresh {
            bail!(
                "{} is older than {} (or was built from elsewhere): rebuild it with `{build}`",
                binary.display(),
                source.display()
            );
        }
    }
    Ok(binary)
}

/// The prerequisites of a make-style dep-info file (`target: a.rs b\ c.rs`).
fn dep_info_sources(dep_info: &str) -> Vec<PathBuf> {
    let Some((_, sources)) = dep_info.lines().next().and_then(|l| l.split_once(": ")) else {
        return Vec::new();
    };
    sources
        .replace("\\ ", "\0")
        .split_whitespace()
        .map(|p| PathBuf::from(p.replace('\0', " ")))
        .collect()
}
