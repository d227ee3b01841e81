//! A run stopped by SIGINT or SIGTERM removes the archive it was writing, then dies of
//! the signal as it would have (same status for the shell).
//!
//! Archives are written to a temporary file beside their destination and renamed over it
//! once finished ([`tract_ragged::npz::NpzSink`]), so that a killed run leaves the previous
//! output as it was; the temporary file, possibly hundreds of megabytes, would stay. What
//! SIGKILL leaves is removed by the next run writing the same destination.

use std::ffi::CString;
use std::path::Path;
use std::sync::atomic::{AtomicPtr, Ordering};

/// The temporary file to remove on a signal: a C string leaked for the handler, or null.
static PARTIAL: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());

extern "C" fn on_signal(signal: libc::c_int) {
    let path = PARTIAL.swap(std::ptr::null_mut(), Ordering::SeqCst);
    // SAFETY: unlink, signal and raise are async-signal-safe; `path`, where not null, is a
    // NUL-terminated string `remove_on_signal` leaked, never freed.
    unsafe {
        if !path.is_null() {
            libc::unlink(path);
        }
        libc::signal(signal, libc::SIG_DFL);
        libc::raise(signal);
    }
}

/// From now on, SIGINT and SIGTERM remove `partial` (if it still exists) before ending the
/// process. A later call replaces the file to remove.
pub fn remove_on_signal(partial: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = CString::new(partial.as_os_str().as_bytes()) else {
        return;
    };
    // The previous string is leaked: the handler may be reading it.
    PARTIAL.store(path.into_raw(), Ordering::SeqCst);
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: installs a handler that only calls async-signal-safe functions.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}
