//! Where a command's report goes: standard output, or the file `-o` names.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::Path;

/// Writes `text` to `output`, or to standard output when there is none.
pub fn emit(text: &str, output: Option<&Path>) -> Result<()> {
    match output {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
        }
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())?;
            Ok(out.flush()?)
        }
    }
}

/// `value` as pretty JSON with a final newline.
pub fn json_text(value: &serde_json::Value) -> Result<String> {
    Ok(serde_json::to_string_pretty(value)? + "\n")
}

/// True when `e` is a write into a pipe whose reader has gone (`ingot plan M | head`):
/// the command ends quietly and successfully then, as `cat` does.
pub fn is_closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
