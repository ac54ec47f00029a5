//! `ncclParam*` (NCCL 2.32): ferroccl's settings read by name, as the communicators of this
//! process would see them now (`FERRO_*` over the `NCCL_*` names of [`super::env`], then the
//! defaults).
//!
//! Keys are ferroccl's own variable names (`FERRO_TIMEOUT`, ...) and the NCCL names it honours
//! (`NCCL_SOCKET_IFNAME`, `NCCL_BUFFSIZE`, ...). A value is its text; the integer getters
//! parse it (booleans read as 0/1, sizes in bytes, durations in the key's unit) and refuse a
//! value that does not fit the type asked for.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::LazyLock;

use super::api::put;
use super::env;
use super::error::guard;
use super::types::*;
use crate::{Config, Error, Result};

/// One setting: its key, its unit, and how to read it from a [`Config`].
struct Param {
    key: &'static str,
    about: &'static str,
    value: fn(&Config) -> String,
}

fn on(b: bool) -> String {
    u8::from(b).to_string()
}

/// Every key, in the order `ncclParamGetAllParameterKeys` lists them.
static PARAMS: &[Param] = &[
    Param {
        key: "FERRO_TIMEOUT",
        about: "seconds without progress before an operation fails",
        value: |c| c.timeout.as_secs_f64().to_string(),
    },
    Param {
        key: "FERRO_NSOCKS_PERPEER",
        about: "TCP streams per peer",
        value: |c| c.nstreams.to_string(),
    },
    Param {
        key: "FERRO_SOCKET_IFNAME",
        about: "network interfaces to listen on",
        value: |c| c.socket_ifname.clone().unwrap_or_default(),
    },
    Param {
        key: "FERRO_SLICE_BYTES",
        about: "largest message slice, bytes",
        value: |c| c.slice_bytes.to_string(),
    },
    Param {
        key: "FERRO_SPIN_US",
        about: "microseconds to spin before sleeping",
        value: |c| c.spin.as_micros().to_string(),
    },
    Param {
        key: "FERRO_DEBUG",
        about: "log level",
        value: |c| format!("{:?}", c.debug).to_ascii_uppercase(),
    },
    Param {
        key: "FERRO_TRANSPORTS",
        about: "transports in order of preference",
        value: |c| c.transports.join(","),
    },
    Param {
        key: "FERRO_ALGO",
        about: "forced algorithms",
        value: |c| c.algo.clone().unwrap_or_default(),
    },
    Param {
        key: "FERRO_SHM_RING_BYTES",
        about: "shared-memory ring per peer, bytes",
        value: |c| c.shm_ring_bytes.to_string(),
    },
    Param {
        key: "FERRO_SHM_CMA",
        about: "cross-memory attach for large shm messages (0/1)",
        value: |c| on(c.shm_cma),
    },
    Param {
        key: "FERRO_SHM_CMA_MIN",
        about: "smallest message sent by cross-memory attach, bytes",
        value: |c| c.shm_cma_min.to_string(),
    },
    Param {
        key: "FERRO_SHM_MAPPED_MIN",
        about: "smallest shm message read straight from a shared buffer, bytes",
        value: |c| c.shm_mapped_min.to_string(),
    },
    Param {
        key: "FERRO_SHM_DIR",
        about: "directory of shared-memory segments",
        value: |c| c.shm_dir.display().to_string(),
    },
    Param {
        key: "FERRO_CHECK_ROOT",
        about: "ranks check they agree on roots (0/1)",
        value: |c| on(c.check_root),
    },
    Param {
        key: "FERRO_HOST_ID",
        about: "host identity override",
        value: |c| c.host_id.clone().unwrap_or_default(),
    },
    Param {
        key: "FERRO_TUNE",
        about: "measure the cost model at init (1) or not (0)",
        value: |c| on(c.tune_measure),
    },
    Param {
        key: "FERRO_LINK_DELAY_US",
        about: "added link delay, microseconds (tests)",
        value: |c| c.link_delay.as_micros().to_string(),
    },
    Param {
        key: "NCCL_DEBUG",
        about: "log level (maps to FERRO_DEBUG)",
        value: |c| format!("{:?}", c.debug).to_ascii_uppercase(),
    },
    Param {
        key: "NCCL_SOCKET_IFNAME",
        about: "network interfaces (maps to FERRO_SOCKET_IFNAME)",
        value: |c| c.socket_ifname.clone().unwrap_or_default(),
    },
    Param {
        key: "NCCL_BUFFSIZE",
        about: "slice bytes (maps to FERRO_SLICE_BYTES)",
        value: |c| c.slice_bytes.to_string(),
    },
    Param {
        key: "NCCL_SHM_DISABLE",
        about: "1: no shared memory between local ranks",
        value: |c| on(!c.transports.iter().any(|t| t == "shm")),
    },
    Param {
        key: "NCCL_COMM_BLOCKING",
        about: "default of ncclConfig_t::blocking (0/1)",
        value: |_| on(env::default_blocking(&env::process_env)),
    },
    Param {
        key: "NCCL_COMM_ID",
        about: "store address host:port for ncclGetUniqueId",
        value: |_| env::process_env("NCCL_COMM_ID").unwrap_or_default(),
    },
];

/// The keys as C strings, for `ncclParamGetAllParameterKeys`.
struct KeyTable {
    _keys: Vec<CString>,
    ptrs: Vec<*const c_char>,
}

// SAFETY: the pointers point into `_keys`, which is never changed after creation.
unsafe impl Send for KeyTable {}
// SAFETY: as above; the table is only read.
unsafe impl Sync for KeyTable {}

static KEYS: LazyLock<KeyTable> = LazyLock::new(|| {
    let keys: Vec<CString> = PARAMS
        .iter()
        .map(|p| CString::new(p.key).unwrap_or_default())
        .collect();
    let ptrs = keys.iter().map(|k| k.as_ptr()).collect();
    KeyTable { _keys: keys, ptrs }
});

thread_local! {
    /// The last string handed out on this thread (valid until the next string getter).
    static LAST_VALUE: RefCell<CString> = RefCell::new(CString::default());
}

fn index_of(api: &str, key: *const c_char) -> Result<usize> {
    if key.is_null() {
        return Err(Error::invalid_argument(format!("{api}: key is NULL")));
    }
    // SAFETY: a non-NULL key is a NUL-terminated string by the caller's contract.
    let k = unsafe { CStr::from_ptr(key) }.to_string_lossy();
    PARAMS
        .iter()
        .position(|p| p.key == k.trim())
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "{api}: unknown parameter {k:?} (ncclParamGetAllParameterKeys lists the {} keys)",
                PARAMS.len()
            ))
        })
}

fn handle_index(api: &str, h: ncclParamHandle_t) -> Result<usize> {
    (h as usize)
        .checked_sub(1)
        .filter(|&i| i < PARAMS.len())
        .ok_or_else(|| {
            Error::invalid_argument(format!("{api}: handle {h:p} was not made by ncclParamBind"))
        })
}

/// The current text of parameter `i`.
fn value_of(i: usize) -> Result<String> {
    let config = env::config()?;
    Ok((PARAMS[i].value)(&config))
}

/// Keeps `text` as this thread's last value and returns a pointer to it.
fn hand_out(text: &str) -> *const c_char {
    let c = CString::new(text.replace('\0', "")).unwrap_or_default();
    LAST_VALUE.with(|v| {
        *v.borrow_mut() = c;
        v.borrow().as_ptr()
    })
}

nccl_api! {
    /// Binds `key` (a name of `ncclParamGetAllParameterKeys`) to a handle.
    fn ncclParamBind / pncclParamBind(out: *mut ncclParamHandle_t, key: *const c_char) -> ncclResult_t {
        const API: &str = "ncclParamBind";
        guard(API, || {
            let i = index_of(API, key)?;
            let h: ncclParamHandle_t = std::ptr::without_provenance_mut(i + 1);
            // SAFETY: the caller passes NULL or a writable handle.
            unsafe { put(API, "out", out, h) }?;
            Ok(ncclSuccess)
        })
    }
}

/// Reads a parameter as an integer of type `T`.
fn get_int<T: TryFrom<i128>>(api: &str, h: ncclParamHandle_t, out: *mut T) -> Result<ncclResult_t> {
    let i = handle_index(api, h)?;
    let text = value_of(i)?;
    let key = PARAMS[i].key;
    let n: i128 = match text.trim() {
        "" => 0,
        t => t
            .parse::<i128>()
            .or_else(|_| t.parse::<f64>().map(|f| f as i128).map_err(drop))
            .map_err(|_| {
                Error::invalid_usage(format!(
                    "{api}: {key} is {text:?}, not a number (read it with ncclParamGetStr)"
                ))
            })?,
    };
    let v = T::try_from(n).map_err(|_| {
        Error::invalid_usage(format!(
            "{api}: {key} is {n}, which does not fit {} bytes",
            std::mem::size_of::<T>()
        ))
    })?;
    // SAFETY: the caller passes NULL or a writable T.
    unsafe { put(api, "out", out, v) }?;
    Ok(ncclSuccess)
}

macro_rules! int_getter {
    ($name:ident / $pname:ident, $t:ty) => {
        nccl_api! {
            /// Reads a bound parameter as an integer of this width.
            fn $name / $pname(h: ncclParamHandle_t, out: *mut $t) -> ncclResult_t {
                guard(stringify!($name), || get_int(stringify!($name), h, out))
            }
        }
    };
}

int_getter!(ncclParamGetI8 / pncclParamGetI8, i8);
int_getter!(ncclParamGetI16 / pncclParamGetI16, i16);
int_getter!(ncclParamGetI32 / pncclParamGetI32, i32);
int_getter!(ncclParamGetI64 / pncclParamGetI64, i64);
int_getter!(ncclParamGetU8 / pncclParamGetU8, u8);
int_getter!(ncclParamGetU16 / pncclParamGetU16, u16);
int_getter!(ncclParamGetU32 / pncclParamGetU32, u32);
int_getter!(ncclParamGetU64 / pncclParamGetU64, u64);

nccl_api! {
    /// Reads a bound parameter as text, valid until the next string getter on this thread.
    fn ncclParamGetStr / pncclParamGetStr(h: ncclParamHandle_t, out: *mut *const c_char) -> ncclResult_t {
        const API: &str = "ncclParamGetStr";
        guard(API, || {
            let i = handle_index(API, h)?;
            api_check_out(API, out)?;
            let p = hand_out(&value_of(i)?);
            // SAFETY: checked non-NULL; writable by the caller's contract.
            unsafe { put(API, "out", out, p) }?;
            Ok(ncclSuccess)
        })
    }
}

fn api_check_out<T>(api: &str, p: *const T) -> Result<()> {
    super::api::check_out(api, "out", p)
}

nccl_api! {
    /// Copies a bound parameter's text (without a NUL) into `out` (`maxLen` bytes) and its
    /// length into `len`; a value longer than `maxLen` is `ncclInvalidArgument`.
    fn ncclParamGet / pncclParamGet(h: ncclParamHandle_t, out: *mut c_void, max_len: c_int, len: *mut c_int) -> ncclResult_t {
        const API: &str = "ncclParamGet";
        guard(API, || {
            let i = handle_index(API, h)?;
            let text = value_of(i)?;
            let n = text.len();
            let room = usize::try_from(max_len).unwrap_or(0);
            if n > room {
                return Err(Error::invalid_argument(format!(
                    "{API}: {} is {n} bytes, more than maxLen {max_len}",
                    PARAMS[i].key
                )));
            }
            if n > 0 {
                api_check_out(API, out)?;
                // SAFETY: `out` is non-NULL and holds maxLen >= n writable bytes by the
                // caller's contract; `text` is a separate allocation.
                unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), out.cast::<u8>(), n) };
            }
            // SAFETY: the caller passes NULL or a writable int.
            unsafe { put(API, "len", len, n as c_int) }?;
            Ok(ncclSuccess)
        })
    }
}

nccl_api! {
    /// A parameter's text by key, valid until the next string getter on this thread.
    fn ncclParamGetParameter / pncclParamGetParameter(key: *const c_char, value: *mut *const c_char, value_len: *mut c_int) -> ncclResult_t {
        const API: &str = "ncclParamGetParameter";
        guard(API, || {
            let i = index_of(API, key)?;
            api_check_out(API, value)?;
            let text = value_of(i)?;
            let n = text.len() as c_int;
            let p = hand_out(&text);
            // SAFETY: checked non-NULL; writable by the caller's contract.
            unsafe { put(API, "value", value, p) }?;
            if !value_len.is_null() {
                // SAFETY: non-NULL and writable by the caller's contract.
                unsafe { value_len.write(n) };
            }
            Ok(ncclSuccess)
        })
    }
}

nccl_api! {
    /// Every key: a table of `tableLen` C strings owned by the library.
    fn ncclParamGetAllParameterKeys / pncclParamGetAllParameterKeys(table: *mut *mut *const c_char, table_len: *mut c_int) -> ncclResult_t {
        const API: &str = "ncclParamGetAllParameterKeys";
        guard(API, || {
            let keys = &*KEYS;
            // The table is never written through: C's `const char***` only asks for a mutable
            // outer pointer.
            let p = keys.ptrs.as_ptr().cast_mut();
            // SAFETY: the caller passes NULL or writable pointers.
            unsafe { put(API, "table", table, p) }?;
            // SAFETY: as above.
            unsafe { put(API, "tableLen", table_len, keys.ptrs.len() as c_int) }?;
            Ok(ncclSuccess)
        })
    }
}

nccl_api! {
    /// Logs every parameter with its value and meaning.
    fn ncclParamDumpAll / pncclParamDumpAll() {
        let _ = guard("ncclParamDumpAll", || {
            let config = env::config()?;
            for p in PARAMS {
                ferroccl_transport::log_line!(
                    "ferroccl (libnccl) PARAM {}={} ({})",
                    p.key,
                    (p.value)(&config),
                    p.about
                );
            }
            Ok(ncclSuccess)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_reads_from_the_default_config() {
        let c = Config::default();
        for p in PARAMS {
            let _ = (p.value)(&c);
        }
        assert_eq!((PARAMS[0].value)(&c), "600");
        let mut seen = std::collections::HashSet::new();
        assert!(PARAMS.iter().all(|p| seen.insert(p.key)), "duplicate key");
    }
}
