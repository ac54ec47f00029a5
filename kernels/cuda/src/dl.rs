//! A shared library opened at run time (`dlopen`), kept for the life of the process.

use std::ffi::{c_void, CStr, CString};

/// An open shared library. Never closed: function pointers taken from it stay valid for the
/// life of the process.
#[derive(Debug)]
pub(crate) struct Library {
    handle: *mut c_void,
    /// The name or path it was opened by.
    pub(crate) name: String,
}

// SAFETY: a dlopen handle is a process-wide token; dlsym on it is thread-safe, and the library
// is never closed.
unsafe impl Send for Library {}
// SAFETY: as above; the struct is never mutated after opening.
unsafe impl Sync for Library {}

/// The last `dlerror()` message, or a placeholder.
fn last_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call
    // on this thread; it is copied at once.
    let msg = unsafe { libc::dlerror() };
    if msg.is_null() {
        "unknown dlopen error".to_string()
    } else {
        // SAFETY: non-NULL, NUL-terminated (see above).
        unsafe { CStr::from_ptr(msg) }
            .to_string_lossy()
            .into_owned()
    }
}

impl Library {
    /// Opens the first of `names` that loads; on failure, every name with its `dlerror`.
    pub(crate) fn open(names: &[String]) -> std::result::Result<Library, String> {
        let mut why = Vec::new();
        for name in names {
            let Ok(c) = CString::new(name.as_str()) else {
                why.push(format!("{name}: name holds a NUL byte"));
                continue;
            };
            // SAFETY: `c` is a valid NUL-terminated path; RTLD_NOW resolves symbols now, so a
            // broken library fails here rather than at a later call.
            let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if handle.is_null() {
                why.push(last_error());
            } else {
                return Ok(Library {
                    handle,
                    name: name.clone(),
                });
            }
        }
        Err(why.join("; "))
    }

    /// The address of `symbol` as a function pointer of type `F`.
    ///
    /// # Safety
    /// `F` must be an `extern "C"` function pointer type matching the symbol's real signature.
    pub(crate) unsafe fn function<F: Copy>(&self, symbol: &str) -> std::result::Result<F, String> {
        assert_eq!(
            std::mem::size_of::<F>(),
            std::mem::size_of::<*mut c_void>(),
            "dlsym target must be a function pointer"
        );
        let c = CString::new(symbol).map_err(|_| format!("{symbol}: bad symbol name"))?;
        // SAFETY: the handle is open (never closed) and `c` is NUL-terminated.
        let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        if p.is_null() {
            return Err(format!("{}: symbol {symbol} not found", self.name));
        }
        // SAFETY: F is pointer-sized (asserted) and, per the caller, the symbol's signature.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
    }
}
