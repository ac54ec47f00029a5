//! The real verbs provider: libibverbs loaded at run time (`dlopen`), so that building needs
//! no rdma-core. This version probes for the library and its devices and reports what it
//! finds; the data path over libibverbs (`ibv_post_send` and `ibv_poll_cq` are inline
//! functions of verbs.h that call through the context's operation table, so a binding must
//! reproduce that table's layout) is not built yet, and the transport says so instead of
//! offering itself.

use std::ffi::{c_char, c_int, c_void, CStr};

/// What a probe of libibverbs found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// The library is not installed (or not on the loader's path).
    NoLibrary(String),
    /// The library loaded; these devices exist (maybe none).
    Devices(Vec<String>),
}

impl Probe {
    /// Why the real provider is not offered, in one line.
    pub fn why_not(&self) -> String {
        match self {
            Probe::NoLibrary(e) => {
                format!("no libibverbs.so.1 ({e}; install rdma-core, or check LD_LIBRARY_PATH)")
            }
            Probe::Devices(d) if d.is_empty() => {
                "libibverbs found no RDMA device on this host".to_string()
            }
            Probe::Devices(d) => format!(
                "libibverbs found {} ({}), but this build's verbs provider has no data path \
                 yet (FERRO_IB_PROVIDER=soft runs the protocol over the software provider)",
                d.join(", "),
                if d.len() == 1 { "1 device" } else { "devices" }
            ),
        }
    }
}

type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
type FreeDeviceList = unsafe extern "C" fn(*mut *mut c_void);
type GetDeviceName = unsafe extern "C" fn(*mut c_void) -> *const c_char;

/// Loads libibverbs and lists its devices.
pub fn probe() -> Probe {
    // SAFETY: dlopen with a constant NUL-terminated name; the handle is kept (never closed),
    // as libibverbs expects to stay loaded once its providers are.
    let lib = unsafe {
        libc::dlopen(
            c"libibverbs.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        )
    };
    if lib.is_null() {
        // SAFETY: dlerror returns a thread-local message or NULL.
        let err = unsafe { libc::dlerror() };
        let msg = if err.is_null() {
            "dlopen failed".to_string()
        } else {
            // SAFETY: a non-NULL dlerror result is a NUL-terminated string.
            unsafe { CStr::from_ptr(err) }
                .to_string_lossy()
                .into_owned()
        };
        return Probe::NoLibrary(msg);
    }
    let sym = |name: &CStr| {
        // SAFETY: `lib` is a live handle and `name` is NUL-terminated.
        unsafe { libc::dlsym(lib, name.as_ptr()) }
    };
    let (get, free, name) = (
        sym(c"ibv_get_device_list"),
        sym(c"ibv_free_device_list"),
        sym(c"ibv_get_device_name"),
    );
    if get.is_null() || free.is_null() || name.is_null() {
        return Probe::NoLibrary("libibverbs.so.1 lacks ibv_get_device_list".to_string());
    }
    // SAFETY: the symbols are libibverbs' exported functions with these C signatures
    // (verbs.h); the list is freed once, after the names are copied.
    unsafe {
        let get: GetDeviceList = std::mem::transmute::<*mut c_void, GetDeviceList>(get);
        let free: FreeDeviceList = std::mem::transmute::<*mut c_void, FreeDeviceList>(free);
        let name: GetDeviceName = std::mem::transmute::<*mut c_void, GetDeviceName>(name);
        let mut n: c_int = 0;
        let list = get(&mut n);
        if list.is_null() {
            return Probe::Devices(Vec::new());
        }
        let mut out = Vec::new();
        for i in 0..n.max(0) as usize {
            let d = *list.add(i);
            let p = name(d);
            if !p.is_null() {
                out.push(CStr::from_ptr(p).to_string_lossy().into_owned());
            }
        }
        free(list);
        Probe::Devices(out)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn probe_reports_in_one_line() {
        let p = super::probe();
        let why = p.why_not();
        assert!(!why.contains('\n') && !why.is_empty(), "{why}");
        eprintln!("real verbs provider: {why}");
    }
}
