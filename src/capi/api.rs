//! The exported functions: every `ncclX` of `include/nccl.h`, and its `pncclX` alias.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use super::comm::{self, lookup, read_config, register, unregister, CommOptions, Shared};
use super::env;
use super::error::{error_string, guard, last_error_ptr, result_of, set_last_error};
use super::group;
use super::ops::{dtype_arg, read_scalar, Op, PreMul, Scalar};
use super::types::*;
use crate::bootstrap::{TcpStoreServer, UniqueId};
use crate::topo::iface;
use crate::{Communicator, Config, Error, Result};

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Stores `v` through the caller's out-pointer `p`, refusing NULL.
///
/// # Safety
/// `p` is NULL or valid for a write of `T`.
pub(super) unsafe fn put<T>(api: &str, name: &str, p: *mut T, v: T) -> Result<()> {
    if p.is_null() {
        return Err(Error::invalid_argument(format!("{api}: {name} is NULL")));
    }
    // SAFETY: non-NULL, and valid for a write by the caller's contract.
    unsafe { p.write(v) };
    Ok(())
}

pub(super) fn check_out<T>(api: &str, name: &str, p: *const T) -> Result<()> {
    if p.is_null() {
        return Err(Error::invalid_argument(format!("{api}: {name} is NULL")));
    }
    Ok(())
}

/// Runs an operation-issuing call; its argument error also fails the enclosing group.
pub(super) fn issuing(f: impl FnOnce() -> Result<ncclResult_t>) -> Result<ncclResult_t> {
    f().inspect_err(group::note_error)
}

// ----- version, unique id -----

nccl_api! {
    /// Writes `NCCL_VERSION_CODE` (2.32.3: 23203), the release whose API is implemented.
    fn ncclGetVersion / pncclGetVersion(version: *mut c_int) -> ncclResult_t {
        guard("ncclGetVersion", || {
            // SAFETY: the caller passes NULL or a writable int.
            unsafe { put("ncclGetVersion", "version", version, NCCL_VERSION_CODE) }?;
            Ok(ncclSuccess)
        })
    }
}

/// Store servers started by `ncclGetUniqueId`, by job magic, until a communicator of this
/// process takes one over.
pub(super) static SERVERS: LazyLock<Mutex<HashMap<u64, Arc<TcpStoreServer>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

nccl_api! {
    /// Creates a unique id: starts a rendezvous store in this process (kept until a
    /// communicator using the id is destroyed) and names it. With `NCCL_COMM_ID=host:port`,
    /// names a store at that address instead, which rank 0 will host.
    fn ncclGetUniqueId / pncclGetUniqueId(unique_id: *mut ncclUniqueId) -> ncclResult_t {
        const API: &str = "ncclGetUniqueId";
        guard(API, || {
            check_out(API, "uniqueId", unique_id)?;
            let uid = match env::comm_id(&env::process_env)? {
                Some(uid) => uid,
                None => {
                    let config = env::config()?;
                    let ip = iface::pick_address(config.socket_ifname.as_deref())
                        .map_err(|e| e.context(API))?;
                    let (uid, server) = UniqueId::create(SocketAddr::new(ip, 0))
                        .map_err(|e| e.context(API))?;
                    lock(&SERVERS).insert(uid.magic(), Arc::new(server));
                    uid
                }
            };
            // SAFETY: checked non-NULL; the caller passes a writable ncclUniqueId.
            unsafe { put(API, "uniqueId", unique_id, ncclUniqueId::from_bytes(uid.as_bytes())) }?;
            Ok(ncclSuccess)
        })
    }
}

/// `config` for a communicator bound to CUDA device `device`: its p2p receive slots go on that
/// device unless `FERRO_P2P_DEVICE` names another.
fn bound_to(mut config: Config, device: u32) -> Config {
    config.p2p_device = config.p2p_device.or(Some(device));
    config
}

/// The store server this rank should keep alive for `uid`, if this process hosts it.
fn server_for(api: &str, uid: &UniqueId, rank: usize) -> Result<Option<Arc<TcpStoreServer>>> {
    if let Some(s) = lock(&SERVERS).remove(&uid.magic()) {
        return Ok(Some(s));
    }
    if rank == 0 {
        if let Some(cid) = env::comm_id(&env::process_env)? {
            if cid == *uid {
                let s = TcpStoreServer::bind_with_magic(uid.addr(), uid.magic()).map_err(|e| {
                    e.context(format!(
                        "{api}: rank 0 hosts the store at NCCL_COMM_ID={}",
                        uid.addr()
                    ))
                })?;
                return Ok(Some(Arc::new(s)));
            }
        }
    }
    Ok(None)
}

// ----- communicators -----

/// # Safety
/// `out` is NULL or writable.
pub(super) unsafe fn init_rank(
    api: &str,
    out: *mut ncclComm_t,
    nranks: c_int,
    id: &ncclUniqueId,
    rank: c_int,
    opts: CommOptions,
) -> Result<ncclResult_t> {
    check_out(api, "comm", out)?;
    let n = usize::try_from(nranks)
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| {
            Error::invalid_argument(format!("{api}: invalid nranks {nranks} (must be >= 1)"))
        })?;
    let r = usize::try_from(rank)
        .ok()
        .filter(|&r| r < n)
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "{api}: invalid rank {rank} (rank must be 0..{})",
                n - 1
            ))
        })?;
    let uid = UniqueId::from_bytes(id.to_bytes())
        .map_err(|e| e.context(format!("{api}: commId is not an id from ncclGetUniqueId")))?;
    let mut config = env::config()?;
    // A thread with no current context binds to device 0 (NCCL's default device) but keeps
    // the slots' default (the rank's place on its host), which a program that chose no
    // device before init more likely means (a CUDA 11 runtime's cudaSetDevice makes no
    // context).
    if let Some(d) = super::stream::chosen_device() {
        config = bound_to(config, d);
    }
    let shared = Shared::new(opts.blocking, super::stream::init_device());
    if let Some(s) = server_for(api, &uid, r)? {
        shared.keep_server(s);
    }
    let api_owned = api.to_string();
    let init =
        move || Communicator::from_unique_id(&uid, r, n, config).map_err(|e| e.context(&api_owned));
    if opts.blocking && !group::in_group() {
        match init() {
            Ok(c) => {
                shared.finish_init(Ok(c));
                // SAFETY: checked non-NULL; writable by the caller's contract.
                unsafe { out.write(register(shared)) };
                Ok(ncclSuccess)
            }
            Err(e) => {
                // SAFETY: as above.
                unsafe { out.write(std::ptr::null_mut()) };
                Err(e)
            }
        }
    } else {
        let s = Arc::clone(&shared);
        shared.submit(move || s.finish_init(init()))?;
        let handle = register(Arc::clone(&shared));
        // SAFETY: checked non-NULL; writable by the caller's contract.
        unsafe { out.write(handle) };
        if group::in_group() {
            group::touch(&shared);
            return Ok(ncclSuccess);
        }
        Ok(ncclInProgress)
    }
}

nccl_api! {
    /// Joins communicator `commId` as `rank` of `nranks` (blocking).
    fn ncclCommInitRank / pncclCommInitRank(
        comm: *mut ncclComm_t,
        nranks: c_int,
        comm_id: ncclUniqueId,
        rank: c_int,
    ) -> ncclResult_t {
        const API: &str = "ncclCommInitRank";
        guard(API, || {
            let opts = CommOptions { blocking: env::default_blocking(&env::process_env) };
            // SAFETY: the caller passes NULL or a writable ncclComm_t.
            unsafe { init_rank(API, comm, nranks, &comm_id, rank, opts) }
        })
    }
}

nccl_api! {
    /// As `ncclCommInitRank`, with a config (`NULL`: defaults). With `config->blocking = 0`
    /// it returns `ncclInProgress` at once; poll `ncclCommGetAsyncError`.
    fn ncclCommInitRankConfig / pncclCommInitRankConfig(
        comm: *mut ncclComm_t,
        nranks: c_int,
        comm_id: ncclUniqueId,
        rank: c_int,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        const API: &str = "ncclCommInitRankConfig";
        guard(API, || {
            // SAFETY: the caller passes NULL or an initialized config of `config->size` bytes.
            let opts = unsafe { read_config(API, config, env::default_blocking(&env::process_env)) }?;
            // SAFETY: the caller passes NULL or a writable ncclComm_t.
            unsafe { init_rank(API, comm, nranks, &comm_id, rank, opts) }
        })
    }
}

nccl_api! {
    /// Creates `ndev` communicators of this process, ranks 0..ndev, into `comms[0..ndev]`,
    /// communicator `i` bound to device `devlist[i]` (`devlist` NULL: device `i`): the device
    /// its calls with a non-NULL stream use (`ncclCommCuDevice`).
    fn ncclCommInitAll / pncclCommInitAll(
        comms: *mut ncclComm_t,
        ndev: c_int,
        devlist: *const c_int,
    ) -> ncclResult_t {
        const API: &str = "ncclCommInitAll";
        guard(API, || {
            check_out(API, "comms", comms)?;
            let n = usize::try_from(ndev).ok().filter(|&n| n >= 1).ok_or_else(|| {
                Error::invalid_argument(format!("{API}: invalid ndev {ndev} (must be >= 1)"))
            })?;
            let devs: Vec<c_int> = if devlist.is_null() {
                (0..ndev).collect()
            } else {
                // SAFETY: a non-NULL devlist holds ndev ints by the caller's contract.
                unsafe { std::slice::from_raw_parts(devlist, n) }.to_vec()
            };
            if let Some((i, d)) = devs.iter().enumerate().find(|(_, &d)| d < 0) {
                return Err(Error::invalid_argument(format!(
                    "{API}: invalid device devlist[{i}] = {d} (must be >= 0)"
                )));
            }
            let config = env::config()?;
            let configs = devs
                .iter()
                .map(|&d| bound_to(config.clone(), u32::try_from(d).unwrap_or(0)))
                .collect();
            let made = Communicator::local_group_with(configs).map_err(|e| e.context(API))?;
            for (i, (c, dev)) in made.into_iter().zip(devs).enumerate() {
                let handle = register(Shared::ready(c, true, dev));
                // SAFETY: comms holds ndev writable handles by the caller's contract.
                unsafe { comms.add(i).write(handle) };
            }
            Ok(ncclSuccess)
        })
    }
}

nccl_api! {
    /// Splits `comm`: ranks passing the same `color` form a new communicator, ordered by
    /// `key`; `NCCL_SPLIT_NOCOLOR` (-1) takes part and gets NULL. Every rank must call it.
    fn ncclCommSplit / pncclCommSplit(
        comm: ncclComm_t,
        color: c_int,
        key: c_int,
        newcomm: *mut ncclComm_t,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        const API: &str = "ncclCommSplit";
        guard(API, || issuing(|| {
            let parent = lookup(API, comm)?;
            check_out(API, "newcomm", newcomm)?;
            let color = match color {
                NCCL_SPLIT_NOCOLOR => None,
                c => Some(u32::try_from(c).map_err(|_| {
                    Error::invalid_argument(format!(
                        "{API}: invalid color {c} (must be >= 0 or NCCL_SPLIT_NOCOLOR)"
                    ))
                })?),
            };
            // SAFETY: the caller passes NULL or an initialized config of `config->size` bytes.
            let opts = unsafe { read_config(API, config, parent.blocking) }?;
            let child = color.map(|_| Shared::new(opts.blocking, parent.cu_device));
            let handle = child.clone().map_or(std::ptr::null_mut(), register);
            // SAFETY: checked non-NULL; writable by the caller's contract.
            unsafe { newcomm.write(handle) };
            let op = Op::Split { color, key: i64::from(key), child };
            let r = group::issue(API, &parent, op);
            if r.is_err() && !handle.is_null() && !group::in_group() {
                let _ = unregister(API, handle);
                // SAFETY: as above.
                unsafe { newcomm.write(std::ptr::null_mut()) };
            }
            r
        }))
    }
}

nccl_api! {
    /// Finishes the communicator's queued work; afterwards only `ncclCommDestroy` is allowed.
    /// Non-blocking: `ncclInProgress` until the work is done.
    fn ncclCommFinalize / pncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
        const API: &str = "ncclCommFinalize";
        guard(API, || {
            let shared = lookup(API, comm)?;
            if shared.revoked.load(Ordering::SeqCst) {
                return Err(Error::invalid_usage(format!(
                    "{API}: the communicator was revoked (ncclCommRevoke); destroy it with \
                     ncclCommDestroy instead"
                )));
            }
            shared.finalized.store(true, Ordering::SeqCst);
            if shared.blocking {
                shared.wait_idle();
                // And this rank's shares queued on a stream straight between the processes'
                // buffers (windows, scratch windows), which the other ranks' shares wait for.
                if let Some(Ok(c)) = shared.try_ready() {
                    if let Err(e) = c.finalize() {
                        shared.record_async(e);
                    }
                }
            } else if shared.busy() {
                return Ok(ncclInProgress);
            }
            match shared.async_status() {
                None => Ok(ncclInProgress),
                Some(None) => Ok(ncclSuccess),
                Some(Some(e)) => Err(e.context(API)),
            }
        })
    }
}

nccl_api! {
    /// Waits for the communicator's queued work, closes its connections and frees it.
    fn ncclCommDestroy / pncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
        const API: &str = "ncclCommDestroy";
        guard(API, || {
            let shared = unregister(API, comm)?;
            super::window::forget_comm(comm);
            shared.stop_worker();
            if let Some(Ok(c)) = shared.try_ready() {
                drop(shared);
                if let Ok(c) = Arc::try_unwrap(c) {
                    // An earlier failure was already reported by the call that hit it.
                    let _ = c.destroy();
                }
            }
            Ok(ncclSuccess)
        })
    }
}

nccl_api! {
    /// Aborts the communicator (operations in flight fail promptly, peers notice) and frees
    /// it. Does not wait for peers.
    fn ncclCommAbort / pncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
        const API: &str = "ncclCommAbort";
        guard(API, || {
            let shared = unregister(API, comm)?;
            super::window::forget_comm(comm);
            shared.abort();
            Ok(ncclSuccess)
        })
    }
}

nccl_api! {
    /// Writes `ncclInProgress` while initialization or non-blocking work runs, then
    /// `ncclSuccess` or the communicator's first error (whose text `ncclGetLastError` then
    /// returns).
    fn ncclCommGetAsyncError / pncclCommGetAsyncError(
        comm: ncclComm_t,
        async_error: *mut ncclResult_t,
    ) -> ncclResult_t {
        const API: &str = "ncclCommGetAsyncError";
        guard(API, || {
            let shared = lookup(API, comm)?;
            check_out(API, "asyncError", async_error)?;
            let code = match shared.async_status() {
                None => ncclInProgress,
                Some(None) => ncclSuccess,
                Some(Some(e)) => {
                    set_last_error(&e.to_string());
                    result_of(e.kind())
                }
            };
            // SAFETY: checked non-NULL; writable by the caller's contract.
            unsafe { async_error.write(code) };
            Ok(ncclSuccess)
        })
    }
}

/// The ready communicator for a query, or `Ok(Err(code))` while it initializes.
pub(super) fn query(
    api: &str,
    comm: ncclComm_t,
) -> Result<std::result::Result<Arc<Communicator>, ncclResult_t>> {
    let shared = lookup(api, comm)?;
    match shared.try_ready() {
        None => {
            set_last_error(&comm::still_initializing(api).to_string());
            Ok(Err(ncclInProgress))
        }
        Some(r) => Ok(Ok(r.map_err(|e| e.context(api))?)),
    }
}

/// The communicator behind `comm` if it is ready (`None` while it initializes).
pub(super) fn lookup_ready(api: &str, comm: ncclComm_t) -> Result<Option<Arc<Communicator>>> {
    match lookup(api, comm)?.try_ready() {
        None => Ok(None),
        Some(r) => Ok(Some(r.map_err(|e| e.context(api))?)),
    }
}

nccl_api! {
    /// Writes the number of ranks.
    fn ncclCommCount / pncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
        const API: &str = "ncclCommCount";
        guard(API, || {
            check_out(API, "count", count)?;
            let c = match query(API, comm)? {
                Ok(c) => c,
                Err(code) => return Ok(code),
            };
            // SAFETY: the caller passes a writable int (checked non-NULL).
            unsafe { put(API, "count", count, c.nranks() as c_int) }?;
            Ok(ncclSuccess)
        })
    }
}

nccl_api! {
    /// Writes this rank.
    fn ncclCommUserRank / pncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
        const API: &str = "ncclCommUserRank";
        guard(API, || {
            check_out(API, "rank", rank)?;
            let c = match query(API, comm)? {
                Ok(c) => c,
                Err(code) => return Ok(code),
            };
            // SAFETY: the caller passes a writable int (checked non-NULL).
            unsafe { put(API, "rank", rank, c.rank() as c_int) }?;
            Ok(ncclSuccess)
        })
    }
}

nccl_api! {
    /// Writes the communicator's device: the current device when it was made
    /// (`cuCtxGetDevice`; the host stand-in: `FERRO_DEVICE`, else 0), its `ncclCommInitAll`
    /// devlist entry, or its parent's for a split.
    fn ncclCommCuDevice / pncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
        const API: &str = "ncclCommCuDevice";
        guard(API, || {
            let shared = lookup(API, comm)?;
            // SAFETY: the caller passes NULL or a writable int.
            unsafe { put(API, "device", device, shared.cu_device) }?;
            Ok(ncclSuccess)
        })
    }
}

nccl_api! {
    /// A short description of `result`.
    fn ncclGetErrorString / pncclGetErrorString(result: ncclResult_t) -> *const c_char {
        error_string(result).as_ptr()
    }
}

nccl_api! {
    /// The last error of this thread, in words naming the call, argument and value (empty if
    /// none). Valid until the next failing call on this thread. `comm` is not used.
    fn ncclGetLastError / pncclGetLastError(comm: ncclComm_t) -> *const c_char {
        let _ = comm;
        last_error_ptr()
    }
}

// ----- reduction operations -----

nccl_api! {
    /// Makes a reduction that multiplies each rank's input by `*scalar` (of `datatype`) and
    /// sums. `ncclScalarHostImmediate`: the scalar is read now; `ncclScalarDevice`: read
    /// each time an operation runs (host memory here).
    fn ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(
        op: *mut ncclRedOp_t,
        scalar: *mut c_void,
        datatype: ncclDataType_t,
        residence: ncclScalarResidence_t,
        comm: ncclComm_t,
    ) -> ncclResult_t {
        const API: &str = "ncclRedOpCreatePreMulSum";
        guard(API, || {
            let shared = lookup(API, comm)?;
            check_out(API, "op", op)?;
            let dtype = dtype_arg(API, datatype)?;
            if scalar.is_null() {
                return Err(Error::invalid_argument(format!("{API}: scalar is NULL")));
            }
            let scalar = match residence {
                // SAFETY: a non-NULL scalar points to one element of `datatype`.
                ncclScalarHostImmediate => Scalar::Value(unsafe { read_scalar(scalar.cast(), dtype) }),
                ncclScalarDevice => Scalar::At(scalar.cast_const().cast()),
                r => {
                    return Err(Error::invalid_argument(format!(
                        "{API}: invalid residence {r} (ncclScalarDevice = 0 or ncclScalarHostImmediate = 1)"
                    )))
                }
            };
            if let Scalar::Value(v) = scalar {
                if !v.is_finite() {
                    return Err(Error::invalid_argument(format!("{API}: scalar {v} is not finite")));
                }
            }
            let made = PreMul { dtype, scalar };
            let mut ops = lock(&shared.redops);
            let index = match ops.iter().position(Option::is_none) {
                Some(i) => {
                    ops[i] = Some(made);
                    i
                }
                None => {
                    ops.push(Some(made));
                    ops.len() - 1
                }
            };
            let code = c_int::try_from(index)
                .ok()
                .and_then(|i| i.checked_add(ncclNumOps))
                .ok_or_else(|| Error::invalid_usage(format!("{API}: too many operations")))?;
            // SAFETY: checked non-NULL; writable by the caller's contract.
            unsafe { op.write(code) };
            Ok(ncclSuccess)
        })
    }
}

nccl_api! {
    /// Frees an operation made by `ncclRedOpCreatePreMulSum` on `comm`.
    fn ncclRedOpDestroy / pncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t {
        const API: &str = "ncclRedOpDestroy";
        guard(API, || {
            let shared = lookup(API, comm)?;
            let mut ops = lock(&shared.redops);
            let slot = usize::try_from(op - ncclNumOps).ok().and_then(|i| ops.get_mut(i));
            match slot {
                Some(s @ Some(_)) => {
                    *s = None;
                    Ok(ncclSuccess)
                }
                _ => Err(Error::invalid_argument(format!(
                    "{API}: invalid operation {op} (not made by ncclRedOpCreatePreMulSum on this \
                     communicator, or already destroyed; built-in operations 0..{} cannot be \
                     destroyed)",
                    ncclNumOps - 1
                ))),
            }
        })
    }
}

// ----- groups -----

nccl_api! {
    /// Starts (or nests) a group on this thread: operations are queued until the matching
    /// outermost `ncclGroupEnd`.
    fn ncclGroupStart / pncclGroupStart() -> ncclResult_t {
        guard("ncclGroupStart", || {
            group::start();
            Ok(ncclSuccess)
        })
    }
}

nccl_api! {
    /// Ends a group; the outermost end runs the queued operations and waits for them
    /// (non-blocking communicators: `ncclInProgress`).
    fn ncclGroupEnd / pncclGroupEnd() -> ncclResult_t {
        guard("ncclGroupEnd", group::end)
    }
}

// ----- memory -----

static REG_SERIAL: AtomicUsize = AtomicUsize::new(1);

nccl_api! {
    /// Registers a buffer with the communicator. Host buffers need no registration here: the
    /// handle only has to be given back to `ncclCommDeregister`.
    fn ncclCommRegister / pncclCommRegister(
        comm: ncclComm_t,
        buff: *mut c_void,
        size: usize,
        handle: *mut *mut c_void,
    ) -> ncclResult_t {
        const API: &str = "ncclCommRegister";
        guard(API, || {
            let shared = lookup(API, comm)?;
            check_out(API, "handle", handle)?;
            if buff.is_null() {
                return Err(Error::invalid_argument(format!("{API}: buff is NULL")));
            }
            let key = 0x1000 + 16 * REG_SERIAL.fetch_add(1, Ordering::Relaxed);
            lock(&shared.registrations).insert(key, (buff as usize, size));
            // SAFETY: checked non-NULL; writable by the caller's contract. The handle is an
            // opaque number, never dereferenced.
            unsafe { handle.write(std::ptr::without_provenance_mut(key)) };
            Ok(ncclSuccess)
        })
    }
}

nccl_api! {
    /// Releases a handle from `ncclCommRegister`.
    fn ncclCommDeregister / pncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
        const API: &str = "ncclCommDeregister";
        guard(API, || {
            let shared = lookup(API, comm)?;
            let removed = lock(&shared.registrations).remove(&(handle as usize));
            match removed {
                Some(_) => Ok(ncclSuccess),
                None => Err(Error::invalid_argument(format!(
                    "{API}: handle {handle:p} is not registered with this communicator"
                ))),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The p2p slots of a communicator go on its device: the one current at init (through
    /// `bound_to`), each `ncclCommInitAll` devlist entry, a split's parent's; a device named by
    /// `FERRO_P2P_DEVICE` wins.
    #[test]
    fn communicators_put_their_p2p_slots_on_their_own_device() {
        assert_eq!(bound_to(Config::default(), 2).p2p_device, Some(2));
        let named = Config {
            p2p_device: Some(3),
            ..Config::default()
        };
        assert_eq!(bound_to(named, 2).p2p_device, Some(3), "the variable wins");

        let slots = |c: ncclComm_t| {
            let s = lookup("test", c).unwrap();
            let comm = s.wait_ready().unwrap();
            comm.config().p2p_device
        };
        let mut comms = [std::ptr::null_mut(); 2];
        let devlist: [c_int; 2] = [1, 0];
        // SAFETY: room for two handles, two devices.
        let r = unsafe { ncclCommInitAll(comms.as_mut_ptr(), 2, devlist.as_ptr()) };
        assert_eq!(r, ncclSuccess);
        assert_eq!((slots(comms[0]), slots(comms[1])), (Some(1), Some(0)));
        let mut children = [std::ptr::null_mut(); 2];
        // SAFETY: live communicators, writable handles, NULL configs.
        unsafe {
            assert_eq!(ncclGroupStart(), ncclSuccess);
            for (c, child) in comms.iter().zip(children.iter_mut()) {
                let r = ncclCommSplit(*c, 0, 0, child, std::ptr::null_mut());
                assert_eq!(r, ncclSuccess);
            }
            assert_eq!(ncclGroupEnd(), ncclSuccess);
        }
        assert_eq!((slots(children[0]), slots(children[1])), (Some(1), Some(0)));
        for c in children.into_iter().chain(comms) {
            // SAFETY: a live communicator, destroyed once.
            assert_eq!(unsafe { ncclCommDestroy(c) }, ncclSuccess);
        }
    }
}
