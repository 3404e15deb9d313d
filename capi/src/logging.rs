//! The log callback: Ingot's `log` records delivered to the app.

use super::*;

/// A function that receives Ingot's log records (`IngotLogCallback`): the level (1 error,
/// 2 warning, 3 info, 4 debug, 5 trace), the message, and the caller's `user` pointer.
pub type IngotLogCallback = Option<unsafe extern "C" fn(i32, *const c_char, *mut c_void)>;

/// The callback and its `user` pointer, as `ingot_set_log_callback` last set them.
#[derive(Clone, Copy)]
struct LogTarget {
    callback: unsafe extern "C" fn(i32, *const c_char, *mut c_void),
    user: *mut c_void,
}

// SAFETY: the header makes the caller answer for `user` on any thread that calls into Ingot
// (records are delivered on the thread of the call that made them); Ingot never reads it.
unsafe impl Send for LogTarget {}
// SAFETY: as for Send: Ingot only hands the pointer back to the caller's callback.
unsafe impl Sync for LogTarget {}

static LOG_TARGET: std::sync::RwLock<Option<LogTarget>> = std::sync::RwLock::new(None);

/// The `log` logger the C API installs: each record to the callback, if one is set.
struct ToCallback;

impl log::Log for ToCallback {
    fn enabled(&self, _: &log::Metadata) -> bool {
        LOG_TARGET.read().is_ok_and(|t| t.is_some())
    }

    fn log(&self, record: &log::Record) {
        // Copied out so that the callback may itself set another one without a deadlock.
        let target = *LOG_TARGET.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(t) = target {
            let message = c_string(&record.args().to_string());
            // SAFETY: the header's contract for the callback: callable with a level, a
            // NUL-terminated message valid during the call, and the caller's `user`.
            unsafe { (t.callback)(record.level() as i32, message.as_ptr(), t.user) };
        }
    }

    fn flush(&self) {}
}

/// Sends Ingot's log records (where each submodel runs, why a device was skipped, a device
/// that failed during a run) to `callback` with `user`; NULL stops them. Fails where the
/// process already has another `log` logger (a Rust host that set its own).
///
/// # Safety
/// `callback` is NULL or a function that may be called as the header describes, on any
/// thread that calls into Ingot, until another call replaces it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ingot_set_log_callback(
    callback: IngotLogCallback,
    user: *mut c_void,
) -> IngotStatus {
    static INSTALLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    guard(|| {
        let installed = *INSTALLED.get_or_init(|| {
            let ours = log::set_logger(&ToCallback).is_ok();
            if ours {
                log::set_max_level(log::LevelFilter::Trace);
            }
            ours
        });
        if !installed {
            return Err(invalid("this process already has a log logger (log::set_logger)"));
        }
        let target = callback.map(|callback| LogTarget { callback, user });
        *LOG_TARGET.write().unwrap_or_else(std::sync::PoisonError::into_inner) = target;
        Ok(())
    })
}
