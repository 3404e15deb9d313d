//! Where the libraries' log records go: stderr, one line each, at the level `-v`/`-q` choose.
//! Reports stay on stdout (or `-o FILE`), so piping a report never carries a log line.

use log::{Level, LevelFilter, Log, Metadata, Record};

struct Stderr;

impl Log for Stderr {
    fn enabled(&self, metadata: &Metadata) -> bool {
        // Ingot's own records at the level asked for; its dependencies' (naga traces every
        // expression it parses) only from warnings up.
        let ours = metadata.target().starts_with("ingot");
        metadata.level() <= if ours { log::max_level() } else { LevelFilter::Warn }
    }

    fn log(&self, record: &Record) {
        if self.enabled(record.metadata()) {
            let level = match record.level() {
                Level::Error => "error",
                Level::Warn => "warning",
                Level::Info => "info",
                Level::Debug => "debug",
                Level::Trace => "trace",
            };
            eprintln!("{level}: {}", record.args());
        }
    }

    fn flush(&self) {}
}

/// Warnings by default; each `-v` one level more (info: where each submodel runs and why a
/// device was skipped); `-q` errors only.
pub fn init(verbose: u8, quiet: bool) {
    let level = match (quiet, verbose) {
        (true, _) => LevelFilter::Error,
        (false, 0) => LevelFilter::Warn,
        (false, 1) => LevelFilter::Info,
        (false, 2) => LevelFilter::Debug,
        (false, _) => LevelFilter::Trace,
    };
    // Fails only when a logger is already set, which `main` does not do twice.
    if log::set_logger(&Stderr).is_ok() {
        log::set_max_level(level);
    }
}
