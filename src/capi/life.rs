//! Communicator life after NCCL 2.19: scalable init, per-communicator unique ids, grow, shrink,
//! revoke, suspend and resume, memory statistics.

use std::ffi::c_int;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::api::{check_out, init_rank, lock, put, SERVERS};
use super::comm::{lookup, read_config, register, Shared};
use super::env;
use super::error::guard;
use super::types::*;
use crate::bootstrap::UniqueId;
use crate::topo::iface;
use crate::{Error, Result};

nccl_api! {
    /// As `ncclCommInitRankConfig`, given `nId` unique ids (the same list, in the same order,
    /// on every rank). The ranks meet through the store of `commIds[0]`; the others are
    /// checked, and stores this process started for them are closed (ferroccl's rendezvous is
    /// one small exchange per rank, which one store serves).
    fn ncclCommInitRankScalable / pncclCommInitRankScalable(
        newcomm: *mut ncclComm_t,
        nranks: c_int,
        myrank: c_int,
        n_id: c_int,
        comm_ids: *mut ncclUniqueId,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        const API: &str = "ncclCommInitRankScalable";
        guard(API, || {
            let n = usize::try_from(n_id).ok().filter(|&k| k >= 1 && k <= nranks.max(1) as usize)
                .ok_or_else(|| Error::invalid_argument(format!(
                    "{API}: invalid nId {n_id} (must be 1..nranks = {nranks})"
                )))?;
            check_out(API, "commIds", comm_ids)?;
            // SAFETY: a non-NULL commIds holds nId ids by the caller's contract.
            let ids = unsafe { std::slice::from_raw_parts(comm_ids, n) };
            for (i, id) in ids.iter().enumerate() {
                let uid = UniqueId::from_bytes(id.to_bytes()).map_err(|e| {
                    e.context(format!("{API}: commIds[{i}] is not an id from ncclGetUniqueId"))
                })?;
                if i > 0 {
                    lock(&SERVERS).remove(&uid.magic());
                }
            }
            // SAFETY: the caller passes NULL or an initialized config of `config->size` bytes.
            let opts = unsafe { read_config(API, config, env::default_blocking(&env::process_env)) }?;
            // SAFETY: the caller passes NULL or a writable ncclComm_t.
            unsafe { init_rank(API, newcomm, nranks, &ids[0], myrank, opts) }
        })
    }
}

nccl_api! {
    /// Makes a unique id for `ncclCommGrow` on `comm` (one at a time: the previous one must
    /// have been used). This process hosts its rendezvous store.
    fn ncclCommGetUniqueId / pncclCommGetUniqueId(comm: ncclComm_t, unique_id: *mut ncclUniqueId) -> ncclResult_t {
        const API: &str = "ncclCommGetUniqueId";
        guard(API, || {
            let shared = lookup(API, comm)?;
            check_out(API, "uniqueId", unique_id)?;
            let mut fresh = lock(&shared.fresh_id);
            if let Some(magic) = *fresh {
                if lock(&SERVERS).contains_key(&magic) {
                    return Err(Error::invalid_usage(format!(
                        "{API}: the id made by the previous call has not been used yet"
                    )));
                }
            }
            let config = env::config()?;
            let ip = iface::pick_address(config.socket_ifname.as_deref()).map_err(|e| e.context(API))?;
            let (uid, server) = UniqueId::create(SocketAddr::new(ip, 0)).map_err(|e| e.context(API))?;
            lock(&SERVERS).insert(uid.magic(), Arc::new(server));
            *fresh = Some(uid.magic());
            // SAFETY: checked non-NULL; writable by the caller's contract.
            unsafe { put(API, "uniqueId", unique_id, ncclUniqueId::from_bytes(uid.as_bytes())) }?;
            Ok(ncclSuccess)
        })
    }
}

nccl_api! {
    /// Grows `comm` to `nRanks` ranks. Existing ranks pass `comm` and `rank = -1`, one of them
    /// (the root) the id from `ncclCommGetUniqueId`, the others NULL; they keep their ranks.
    /// New ranks pass `comm = NULL`, the root's id and their rank (from the old size up). The
    /// existing ranks learn the id from the root over `comm`; then everyone joins the id's
    /// rendezvous as a new communicator.
    fn ncclCommGrow / pncclCommGrow(
        comm: ncclComm_t,
        n_ranks: c_int,
        unique_id: *const ncclUniqueId,
        rank: c_int,
        newcomm: *mut ncclComm_t,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        const API: &str = "ncclCommGrow";
        guard(API, || {
            check_out(API, "newcomm", newcomm)?;
            if comm.is_null() {
                // A new rank.
                check_out(API, "uniqueId", unique_id)?;
                // SAFETY: non-NULL; points to an id by the caller's contract.
                let id = unsafe { *unique_id };
                // SAFETY: the caller passes NULL or an initialized config.
                let opts = unsafe { read_config(API, config, env::default_blocking(&env::process_env)) }?;
                // SAFETY: checked non-NULL; writable.
                return unsafe { init_rank(API, newcomm, n_ranks, &id, rank, opts) };
            }
            let parent = lookup(API, comm)?;
            if rank != -1 {
                return Err(Error::invalid_argument(format!(
                    "{API}: invalid rank {rank} for an existing rank (must be -1: existing ranks keep theirs)"
                )));
            }
            let c = parent.wait_ready().map_err(|e| e.context(API))?;
            // Stream jobs issued before come first (this is a collective on the parent).
            parent.streams.drain();
            if usize::try_from(n_ranks).map_or(true, |n| n <= c.nranks()) {
                return Err(Error::invalid_argument(format!(
                    "{API}: invalid nRanks {n_ranks} (must be more than the {} ranks of comm)",
                    c.nranks()
                )));
            }
            let mut mine = [0u8; 1 + NCCL_UNIQUE_ID_BYTES];
            if !unique_id.is_null() {
                // SAFETY: non-NULL; points to an id by the caller's contract.
                let id = unsafe { *unique_id };
                mine[0] = 1;
                mine[1..].copy_from_slice(&id.to_bytes());
            }
            let mut all = vec![0u8; mine.len() * c.nranks()];
            c.all_gather(&mine, &mut all).map_err(|e| e.context(API))?;
            let roots: Vec<usize> = (0..c.nranks()).filter(|&r| all[r * mine.len()] == 1).collect();
            let [root] = roots[..] else {
                return Err(Error::invalid_usage(format!(
                    "{API}: exactly one existing rank must pass the id from ncclCommGetUniqueId; \
                     ranks {roots:?} did"
                )));
            };
            let mut bytes = [0u8; NCCL_UNIQUE_ID_BYTES];
            let at = root * mine.len() + 1;
            bytes.copy_from_slice(&all[at..at + NCCL_UNIQUE_ID_BYTES]);
            let id = ncclUniqueId::from_bytes(&bytes);
            // SAFETY: the caller passes NULL or an initialized config.
            let opts = unsafe { read_config(API, config, parent.blocking) }?;
            // SAFETY: checked non-NULL; writable.
            unsafe { init_rank(API, newcomm, n_ranks, &id, c.rank() as c_int, opts) }
        })
    }
}

nccl_api! {
    /// The ranks not in `excludeRanksList` form a new communicator, renumbered in rank order.
    /// Every surviving rank calls it with the same list; the excluded ranks (dead, or declared
    /// dead) take no part. Works on a failed or revoked communicator. `NCCL_SHRINK_ABORT`
    /// aborts the parent's operations first; without it, the parent's queued work is waited
    /// for. `config` NULL: the parent's blocking mode.
    fn ncclCommShrink / pncclCommShrink(
        comm: ncclComm_t,
        exclude_ranks_list: *mut c_int,
        exclude_ranks_count: c_int,
        newcomm: *mut ncclComm_t,
        config: *mut ncclConfig_t,
        shrink_flags: c_int,
    ) -> ncclResult_t {
        const API: &str = "ncclCommShrink";
        guard(API, || {
            let parent = lookup(API, comm)?;
            check_out(API, "newcomm", newcomm)?;
            if shrink_flags & !NCCL_SHRINK_ABORT != 0 {
                return Err(Error::invalid_argument(format!(
                    "{API}: invalid shrinkFlags {shrink_flags:#x} (NCCL_SHRINK_DEFAULT = 0 or \
                     NCCL_SHRINK_ABORT = 1)"
                )));
            }
            let count = usize::try_from(exclude_ranks_count).map_err(|_| Error::invalid_argument(format!(
                "{API}: invalid excludeRanksCount {exclude_ranks_count} (must be >= 0)"
            )))?;
            let list: Vec<c_int> = if count == 0 {
                Vec::new()
            } else {
                check_out(API, "excludeRanksList", exclude_ranks_list)?;
                // SAFETY: a non-NULL list holds excludeRanksCount ints by the caller's contract.
                unsafe { std::slice::from_raw_parts(exclude_ranks_list, count) }.to_vec()
            };
            let exclude = list.iter().map(|&r| usize::try_from(r).map_err(|_| Error::invalid_argument(format!(
                "{API}: invalid excluded rank {r} (must be >= 0)"
            )))).collect::<Result<Vec<usize>>>()?;
            // SAFETY: the caller passes NULL or an initialized config of `config->size` bytes.
            let opts = unsafe { read_config(API, config, parent.blocking) }?;
            if shrink_flags & NCCL_SHRINK_ABORT != 0 {
                if let Some(Ok(c)) = parent.try_ready() {
                    c.abort();
                }
            } else {
                parent.wait_idle();
            }
            let c = parent.wait_ready().map_err(|e| e.context(API))?;
            let child = Shared::new(opts.blocking, parent.cu_device);
            let work = move || c.shrink(&exclude).map_err(|e| e.context(API));
            if opts.blocking {
                let made = work()?;
                child.finish_init(Ok(made));
                // SAFETY: checked non-NULL; writable by the caller's contract.
                unsafe { newcomm.write(register(child)) };
                return Ok(ncclSuccess);
            }
            let s = Arc::clone(&child);
            child.submit(move || s.finish_init(work()))?;
            // SAFETY: checked non-NULL; writable by the caller's contract.
            unsafe { newcomm.write(register(child)) };
            Ok(ncclInProgress)
        })
    }
}

nccl_api! {
    /// Stops the communicator's operations: those in flight fail promptly (peers notice) and
    /// later ones are refused, while `ncclCommDestroy`, `ncclCommAbort` and `ncclCommShrink`
    /// remain. `revokeFlags` must be `NCCL_REVOKE_DEFAULT` (0). Returns once quiescent.
    fn ncclCommRevoke / pncclCommRevoke(comm: ncclComm_t, revoke_flags: c_int) -> ncclResult_t {
        const API: &str = "ncclCommRevoke";
        guard(API, || {
            let shared = lookup(API, comm)?;
            if revoke_flags != 0 {
                return Err(Error::invalid_argument(format!(
                    "{API}: invalid revokeFlags {revoke_flags} (must be NCCL_REVOKE_DEFAULT = 0)"
                )));
            }
            shared.revoked.store(true, Ordering::SeqCst);
            if let Some(Ok(c)) = shared.try_ready() {
                c.abort();
            }
            Ok(ncclSuccess)
        })
    }
}

nccl_api! {
    /// Suspends the communicator (`flags`: `NCCL_SUSPEND_MEM` or 0): operations are refused
    /// until `ncclCommResume`. ferroccl holds no GPU memory, so there is nothing to release.
    fn ncclCommSuspend / pncclCommSuspend(comm: ncclComm_t, flags: c_int) -> ncclResult_t {
        const API: &str = "ncclCommSuspend";
        guard(API, || {
            let shared = lookup(API, comm)?;
            if flags & !NCCL_SUSPEND_MEM != 0 {
                return Err(Error::invalid_argument(format!(
                    "{API}: invalid flags {flags:#x} (NCCL_SUSPEND_MEM = 1 is the only flag)"
                )));
            }
            shared.wait_idle();
            if shared.suspended.swap(true, Ordering::SeqCst) {
                return Err(Error::invalid_usage(format!("{API}: the communicator is already suspended")));
            }
            Ok(ncclSuccess)
        })
    }
}

nccl_api! {
    /// Resumes a suspended communicator.
    fn ncclCommResume / pncclCommResume(comm: ncclComm_t) -> ncclResult_t {
        const API: &str = "ncclCommResume";
        guard(API, || {
            let shared = lookup(API, comm)?;
            if !shared.suspended.swap(false, Ordering::SeqCst) {
                return Err(Error::invalid_usage(format!(
                    "{API}: the communicator is not suspended (ncclCommSuspend)"
                )));
            }
            Ok(ncclSuccess)
        })
    }
}

nccl_api! {
    /// GPU memory statistics: ferroccl allocates no GPU memory, so sizes are 0;
    /// `ncclStatGpuMemSuspended` is 1 while the communicator is suspended.
    fn ncclCommMemStats / pncclCommMemStats(comm: ncclComm_t, stat: ncclCommMemStat_t, value: *mut u64) -> ncclResult_t {
        const API: &str = "ncclCommMemStats";
        guard(API, || {
            let shared = lookup(API, comm)?;
            let v = match stat {
                ncclStatGpuMemSuspend | ncclStatGpuMemPersist | ncclStatGpuMemTotal => 0,
                ncclStatGpuMemSuspended => u64::from(shared.suspended.load(Ordering::SeqCst)),
                s => return Err(Error::invalid_argument(format!(
                    "{API}: invalid stat {s} (ncclStatGpuMemSuspend = 0 .. ncclStatGpuMemTotal = 3)"
                ))),
            };
            // SAFETY: the caller passes NULL or a writable uint64_t.
            unsafe { put(API, "value", value, v) }?;
            Ok(ncclSuccess)
        })
    }
}
