//! The per-call `nccl*Config` collectives (NCCL 2.32): the plain collective plus an
//! `ncclCollConfig_t` read by its `size` prefix.
//!
//! | field | here |
//! |---|---|
//! | `minCTAs`, `maxCTAs`, `nvlsCTAs`, `cgaClusterSize`, `CTAPolicy`, `userProfilerTag`, `ext` | accepted (no CUDA kernels, no profiler plugins) |
//! | `algSelection` | ferroccl algorithm names (`ring`, `tree`, ...), `,` or `\|` separated: the call runs only if the tuner's pick is among them; with `forceAlgSelection = 0` it runs anyway |
//! | `launchCompletionEvent` | must be NULL (no CUDA events) |

use std::ffi::{c_int, c_void, CStr};
use std::str::FromStr;

use super::api::lookup_ready;
use super::colls::{collective, rooted};
use super::error::guard;
use super::ops::{dtype_arg, Rooted};
use super::types::*;
use crate::coll::{Algorithm, CollKind};
use crate::{Error, ErrorKind, Result};

/// The options of one call, after the checks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct CallOptions {
    /// Algorithms the call may use (empty: any).
    pub algorithms: Vec<Algorithm>,
    /// Whether a selection the call cannot honour is an error.
    pub force: bool,
}

/// Reads the caller's `ncclCollConfig_t` (NULL: no options).
///
/// # Safety
/// `config` is NULL or points to at least `config->size` readable bytes, with a NUL-terminated
/// `algSelection` when that is non-NULL.
pub(crate) unsafe fn read_coll_config(
    api: &str,
    config: *const ncclCollConfig_t,
) -> Result<CallOptions> {
    if config.is_null() {
        return Ok(CallOptions::default());
    }
    let mut c = ncclCollConfig_t::default();
    let prefix = std::mem::offset_of!(ncclCollConfig_t, ext);
    // SAFETY: the caller's config holds at least the header, whose first field is `size`.
    let size = unsafe { std::ptr::read_unaligned(config.cast::<usize>()) };
    if size < prefix {
        return Err(Error::invalid_argument(format!(
            "{api}: config->size is {size}, less than the {prefix}-byte header; initialize the \
             config with NCCL_COLLCONFIG_INITIALIZER"
        )));
    }
    let n = size.min(std::mem::size_of::<ncclCollConfig_t>());
    // SAFETY: the caller's config has `size` readable bytes and `n <= size`; `c` is plain
    // data of at least `n` bytes; they do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(
            config.cast::<u8>(),
            (&mut c as *mut ncclCollConfig_t).cast::<u8>(),
            n,
        )
    };
    if c.magic != NCCL_API_MAGIC {
        return Err(Error::invalid_argument(format!(
            "{api}: config->magic is {:#x}, expected {NCCL_API_MAGIC:#x}; initialize the config \
             with NCCL_COLLCONFIG_INITIALIZER",
            c.magic
        )));
    }
    for (name, v) in [
        ("minCTAs", c.minCTAs),
        ("maxCTAs", c.maxCTAs),
        ("nvlsCTAs", c.nvlsCTAs),
        ("cgaClusterSize", c.cgaClusterSize),
    ] {
        if v != NCCL_CONFIG_UNDEF_INT && v < 0 {
            return Err(Error::invalid_argument(format!(
                "{api}: config->{name} is {v} (must not be negative)"
            )));
        }
    }
    if !c.launchCompletionEvent.is_null() {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "{api}: config->launchCompletionEvent is {:p}, but this libnccl (ferroccl) has \
                 no CUDA events: pass NULL",
                c.launchCompletionEvent
            ),
        ));
    }
    let force = match c.forceAlgSelection {
        0 => false,
        1 | NCCL_CONFIG_UNDEF_INT => true,
        v => {
            return Err(Error::invalid_argument(format!(
                "{api}: config->forceAlgSelection is {v} (must be 0 or 1)"
            )))
        }
    };
    let algorithms = if c.algSelection.is_null() {
        Vec::new()
    } else {
        // SAFETY: a non-NULL algSelection is a NUL-terminated string by the caller's contract.
        let text = unsafe { CStr::from_ptr(c.algSelection) }.to_string_lossy();
        parse_selection(api, &text)?
    };
    Ok(CallOptions { algorithms, force })
}

/// Algorithm names separated by `,`, `|` or spaces.
fn parse_selection(api: &str, text: &str) -> Result<Vec<Algorithm>> {
    text.split([',', '|', ' '])
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .map(|w| {
            Algorithm::from_str(&w.to_ascii_lowercase()).map_err(|_| {
                let known: Vec<String> = Algorithm::ALL.iter().map(|a| a.to_string()).collect();
                Error::invalid_argument(format!(
                    "{api}: config->algSelection names {w:?}, not an algorithm of ferroccl \
                     (known: {})",
                    known.join(", ")
                ))
            })
        })
        .collect()
}

/// Checks `opts` against what the call would run; `Ok` when it may run.
fn check_selection(
    api: &str,
    opts: &CallOptions,
    comm: ncclComm_t,
    kind: CollKind,
    count: usize,
    datatype: ncclDataType_t,
) -> Result<()> {
    if opts.algorithms.is_empty() || !opts.force {
        return Ok(());
    }
    let Some(c) = lookup_ready(api, comm)? else {
        // Still initializing: the call itself reports that.
        return Ok(());
    };
    let dtype = dtype_arg(api, datatype)?;
    let algo = c.algorithm_for(kind, count, dtype);
    if opts.algorithms.contains(&algo) {
        return Ok(());
    }
    let wanted: Vec<String> = opts.algorithms.iter().map(|a| a.to_string()).collect();
    Err(Error::invalid_usage(format!(
        "{api}: config->algSelection asks for {} but this call runs {algo} (ferroccl picks one \
         algorithm per call size; set FERRO_ALGO to force one, or forceAlgSelection = 0)",
        wanted.join(", ")
    )))
}

/// Runs a plain collective after reading and checking its config.
#[allow(clippy::too_many_arguments)]
fn with_config(
    api: &'static str,
    kind: CollKind,
    config: *const ncclCollConfig_t,
    comm: ncclComm_t,
    count: usize,
    datatype: ncclDataType_t,
    run: impl FnOnce() -> ncclResult_t,
) -> ncclResult_t {
    guard(api, || {
        // SAFETY: the caller passes NULL or an initialized config of `config->size` bytes.
        let checked = unsafe { read_coll_config(api, config) }
            .and_then(|opts| check_selection(api, &opts, comm, kind, count, datatype));
        if let Err(e) = checked {
            super::group::note_error(&e);
            return Err(e);
        }
        Ok(run())
    })
}

nccl_api! {
    /// `ncclAllReduce` with per-call options (`config` NULL: the plain call).
    fn ncclAllReduceConfig / pncclAllReduceConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
        op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        const API: &str = "ncclAllReduceConfig";
        with_config(API, CollKind::AllReduce, config, comm, count, datatype, || {
            collective(API, |_| CollKind::AllReduce, None, sendbuff, recvbuff, count, datatype, Some(op), comm, stream)
        })
    }
}

nccl_api! {
    /// `ncclBroadcast` with per-call options.
    fn ncclBroadcastConfig / pncclBroadcastConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
        root: c_int, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        const API: &str = "ncclBroadcastConfig";
        let r = usize::try_from(root).unwrap_or(0);
        with_config(API, CollKind::Broadcast { root: r }, config, comm, count, datatype, || {
            collective(API, |root| CollKind::Broadcast { root }, Some(root), sendbuff, recvbuff, count, datatype, None, comm, stream)
        })
    }
}

nccl_api! {
    /// `ncclReduce` with per-call options.
    fn ncclReduceConfig / pncclReduceConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
        op: ncclRedOp_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t,
        config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        const API: &str = "ncclReduceConfig";
        let r = usize::try_from(root).unwrap_or(0);
        with_config(API, CollKind::Reduce { root: r }, config, comm, count, datatype, || {
            collective(API, |root| CollKind::Reduce { root }, Some(root), sendbuff, recvbuff, count, datatype, Some(op), comm, stream)
        })
    }
}

nccl_api! {
    /// `ncclAllGather` with per-call options.
    fn ncclAllGatherConfig / pncclAllGatherConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: ncclDataType_t,
        comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        const API: &str = "ncclAllGatherConfig";
        with_config(API, CollKind::AllGather, config, comm, sendcount, datatype, || {
            collective(API, |_| CollKind::AllGather, None, sendbuff, recvbuff, sendcount, datatype, None, comm, stream)
        })
    }
}

nccl_api! {
    /// `ncclReduceScatter` with per-call options.
    fn ncclReduceScatterConfig / pncclReduceScatterConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: ncclDataType_t,
        op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        const API: &str = "ncclReduceScatterConfig";
        with_config(API, CollKind::ReduceScatter, config, comm, recvcount, datatype, || {
            collective(API, |_| CollKind::ReduceScatter, None, sendbuff, recvbuff, recvcount, datatype, Some(op), comm, stream)
        })
    }
}

nccl_api! {
    /// `ncclAlltoAll` with per-call options.
    fn ncclAlltoAllConfig / pncclAlltoAllConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
        comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        const API: &str = "ncclAlltoAllConfig";
        with_config(API, CollKind::AllToAll, config, comm, count, datatype, || {
            collective(API, |_| CollKind::AllToAll, None, sendbuff, recvbuff, count, datatype, None, comm, stream)
        })
    }
}

/// Gather and scatter are made of sends and receives: a selection of algorithms cannot hold.
fn rooted_selection(api: &str, config: *const ncclCollConfig_t) -> ncclResult_t {
    guard(api, || {
        // SAFETY: the caller passes NULL or an initialized config of `config->size` bytes.
        let opts = unsafe { read_coll_config(api, config) }?;
        if opts.force && !opts.algorithms.is_empty() {
            return Err(Error::invalid_usage(format!(
                "{api}: config->algSelection cannot be honoured: ferroccl runs gather and \
                 scatter as sends and receives (set forceAlgSelection = 0)"
            )));
        }
        Ok(ncclSuccess)
    })
}

nccl_api! {
    /// `ncclGather` with per-call options.
    fn ncclGatherConfig / pncclGatherConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
        root: c_int, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        const API: &str = "ncclGatherConfig";
        match rooted_selection(API, config) {
            ncclSuccess => rooted(API, Rooted::Gather, sendbuff, recvbuff, count, datatype, root, comm, stream),
            code => code,
        }
    }
}

nccl_api! {
    /// `ncclScatter` with per-call options.
    fn ncclScatterConfig / pncclScatterConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
        root: c_int, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        const API: &str = "ncclScatterConfig";
        match rooted_selection(API, config) {
            ncclSuccess => rooted(API, Rooted::Scatter, sendbuff, recvbuff, count, datatype, root, comm, stream),
            code => code,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::c_char;

    #[test]
    fn selection_names_algorithms() {
        let a = parse_selection("t", "ring, Tree").unwrap();
        assert_eq!(a.len(), 2);
        assert!(parse_selection("t", "").unwrap().is_empty());
        let e = parse_selection("ncclAllReduceConfig", "nvls").unwrap_err();
        assert!(
            e.message().contains("\"nvls\"") && e.message().contains("known"),
            "{e}"
        );
    }

    #[test]
    fn config_is_read_by_size() {
        // SAFETY: pointers to live configs of the stated size.
        unsafe {
            assert_eq!(
                read_coll_config("t", std::ptr::null()).unwrap(),
                CallOptions::default()
            );
            let mut c = ncclCollConfig_t::default();
            assert!(read_coll_config("t", &c).unwrap().force);
            c.magic = 1;
            let e = read_coll_config("t", &c).unwrap_err();
            assert!(e.message().contains("NCCL_COLLCONFIG_INITIALIZER"), "{e}");
            c = ncclCollConfig_t::default();
            c.launchCompletionEvent = std::ptr::without_provenance_mut(8);
            let e = read_coll_config("t", &c).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Unsupported);
            c = ncclCollConfig_t::default();
            let sel = c"ring";
            c.algSelection = sel.as_ptr().cast::<c_char>();
            c.forceAlgSelection = 0;
            let o = read_coll_config("t", &c).unwrap();
            assert!(!o.force && o.algorithms.len() == 1);
            // A caller whose struct ends before algSelection: the field is never read.
            c.size = std::mem::offset_of!(ncclCollConfig_t, algSelection);
            assert!(read_coll_config("t", &c).unwrap().algorithms.is_empty());
        }
    }
}
