//! Entry points of NCCL 2.32 that have no meaning in ferroccl yet. Each links, checks its
//! communicator, and returns `ncclInvalidUsage` with `ncclGetLastError` saying why, except
//! where a request is a no-op here (encryption off, a debug reset).

use std::ffi::{c_int, c_uint, c_void};

use super::comm::lookup;
use super::error::guard;
use super::types::*;
use crate::{Error, ErrorKind, Result};

fn unsupported(api: &str, what: &str) -> Result<ncclResult_t> {
    Err(Error::new(
        ErrorKind::Unsupported,
        format!("{api}: {what} is not supported by ferroccl yet"),
    ))
}

nccl_api! {
    /// Not supported: device-initiated one-sided writes into a peer's window with a signal.
    fn ncclPutSignal / pncclPutSignal(
        localbuff: *const c_void,
        count: usize,
        datatype: ncclDataType_t,
        peer: c_int,
        peer_win: ncclWindow_t,
        peer_win_offset: usize,
        sig_idx: c_int,
        ctx: c_int,
        flags: c_uint,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        const API: &str = "ncclPutSignal";
        let _ = (localbuff, count, datatype, peer, peer_win, peer_win_offset, sig_idx, ctx, flags, stream);
        guard(API, || {
            lookup(API, comm)?;
            unsupported(API, "a one-sided put with a signal (device-initiated, over CUDA streams)")
        })
    }
}

nccl_api! {
    /// Not supported: device-initiated signals.
    fn ncclSignal / pncclSignal(
        peer: c_int,
        sig_idx: c_int,
        ctx: c_int,
        flags: c_uint,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        const API: &str = "ncclSignal";
        let _ = (peer, sig_idx, ctx, flags, stream);
        guard(API, || {
            lookup(API, comm)?;
            unsupported(API, "a one-sided signal (device-initiated, over CUDA streams)")
        })
    }
}

nccl_api! {
    /// Not supported: waiting for device-initiated signals.
    fn ncclWaitSignal / pncclWaitSignal(
        n_desc: c_int,
        signal_descs: *mut ncclWaitSignalDesc_t,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        const API: &str = "ncclWaitSignal";
        let _ = (n_desc, signal_descs, stream);
        guard(API, || {
            lookup(API, comm)?;
            unsupported(API, "waiting for one-sided signals (device-initiated, over CUDA streams)")
        })
    }
}

nccl_api! {
    /// Encryption of TCP traffic: `NCCL_ENCRYPTION_MODE_NONE` succeeds (ferroccl's sockets are
    /// plain); a pre-shared key is not supported yet.
    fn ncclSetEncryption / pncclSetEncryption(config: *const ncclEncryptionConfig_t) -> ncclResult_t {
        const API: &str = "ncclSetEncryption";
        guard(API, || {
            super::api::check_out(API, "config", config)?;
            // SAFETY: non-NULL; the caller's struct starts with size, magic, version and mode.
            let (magic, mode) = unsafe { ((*config).magic, (*config).mode) };
            if magic != NCCL_API_MAGIC {
                return Err(Error::invalid_argument(format!(
                    "{API}: config->magic is {magic:#x}; initialize it with \
                     NCCL_ENCRYPTION_CONFIG_INITIALIZER"
                )));
            }
            match mode {
                0 => Ok(ncclSuccess),
                1 => unsupported(API, "encrypting TCP traffic with a pre-shared key"),
                m => Err(Error::invalid_argument(format!(
                    "{API}: invalid mode {m} (NCCL_ENCRYPTION_MODE_NONE = 0 or \
                     NCCL_ENCRYPTION_MODE_PSK = 1)"
                ))),
            }
        })
    }
}

nccl_api! {
    /// Re-reads the logging variables: ferroccl reads them when each communicator is
    /// created, so there is nothing to reset.
    fn ncclResetDebugInit / pncclResetDebugInit() {}
}
