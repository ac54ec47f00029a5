//! Result codes, the thread-local last-error string, and the guard every entry point runs in.

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::types::*;
use crate::{Error, ErrorKind, Result};

/// The one mapping from ferroccl's error kinds to `ncclResult_t`.
///
/// A deadline that passes while waiting for a peer is `ncclTimeout` (value 8, as in NVIDIA's
/// header); a peer that failed, left or disagreed is `ncclRemoteError`.
pub fn result_of(kind: ErrorKind) -> ncclResult_t {
    match kind {
        ErrorKind::InvalidArgument => ncclInvalidArgument,
        ErrorKind::InvalidUsage | ErrorKind::Aborted | ErrorKind::Unsupported => ncclInvalidUsage,
        ErrorKind::System => ncclSystemError,
        ErrorKind::Remote => ncclRemoteError,
        ErrorKind::Timeout => ncclTimeout,
        ErrorKind::Internal => ncclInternalError,
        _ => ncclInternalError,
    }
}

/// `ncclGetErrorString`'s text for `code`.
pub fn error_string(code: ncclResult_t) -> &'static CStr {
    match code {
        ncclSuccess => c"no error",
        ncclUnhandledCudaError => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        ncclSystemError => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        ncclInternalError => {
            c"internal error - please report this issue to the ferroccl developers"
        }
        ncclInvalidArgument => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        ncclInvalidUsage => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        ncclRemoteError => c"remote process exited or there was a network error",
        ncclInProgress => c"NCCL operation in progress",
        ncclTimeout => c"operation timed out",
        _ => c"unknown result code",
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `msg` as this thread's last error (what `ncclGetLastError` returns).
pub fn set_last_error(msg: &str) {
    // Interior NULs would cut the C string short; show them instead.
    let c = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

/// This thread's last error as a C string, valid until the next failing call on this thread.
pub fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

/// This thread's last error, as Rust text.
pub fn last_error() -> String {
    LAST_ERROR.with(|l| l.borrow().to_string_lossy().into_owned())
}

/// Records `e` as the last error, logs it when `NCCL_DEBUG`/`FERRO_DEBUG` asks for warnings,
/// and returns its code.
pub fn fail(e: &Error) -> ncclResult_t {
    let text = e.to_string();
    set_last_error(&text);
    if super::env::warn_enabled() {
        ferroccl_transport::log_line!("ferroccl (libnccl) WARN {text}");
    }
    result_of(e.kind())
}

/// Runs an entry point: a returned error becomes its code (and the last error), and a panic
/// becomes `ncclInternalError` instead of unwinding into C.
pub fn guard(api: &str, f: impl FnOnce() -> Result<ncclResult_t>) -> ncclResult_t {
    // The caller's current CUDA context is current again when the call returns, as NCCL leaves
    // the current device (a call binds its communicator's device while it runs).
    let r = ferroccl_cuda::driver::restoring_context(|| {
        let r = catch_unwind(AssertUnwindSafe(f));
        // A call on a stream being captured relaxed the thread's capture mode for its
        // duration (`capture`); the program gets its own back.
        super::capture::restore_mode();
        r
    });
    match r {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => fail(&e),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            fail(&Error::internal(format!("{api}: internal error: {what}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_to_results() {
        assert_eq!(result_of(ErrorKind::InvalidArgument), ncclInvalidArgument);
        assert_eq!(result_of(ErrorKind::Timeout), ncclTimeout);
        assert_eq!(ncclTimeout, 8);
        assert_eq!(ncclNumResults, 9);
        assert_eq!(result_of(ErrorKind::Remote), ncclRemoteError);
        assert_eq!(
            guard("t", || Err(Error::timeout("rank 1 did not answer"))),
            ncclTimeout
        );
        assert_eq!(error_string(ncclTimeout), c"operation timed out");
        assert_eq!(result_of(ErrorKind::System), ncclSystemError);
        assert_eq!(
            guard("t", || Err(Error::remote("rank 2 left"))),
            ncclRemoteError
        );
        assert!(last_error().contains("rank 2 left"));
        assert_eq!(guard("ncclX", || panic!("boom {}", 7)), ncclInternalError);
        assert!(last_error().contains("ncclX") && last_error().contains("boom 7"));
    }
}
