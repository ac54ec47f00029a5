//! The state behind an `ncclComm_t`: the table of live communicators, initialization that may
//! finish in the background, and the per-communicator thread that runs non-blocking work.

use std::collections::HashMap;
use std::ffi::{c_int, c_uint};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard};

use crossbeam_channel::Sender;

use super::ops::PreMul;
use super::types::*;
use crate::bootstrap::TcpStoreServer;
use crate::device::stream_queue::StreamQueue;
use crate::device::Device;
use crate::{Communicator, Error, ErrorKind, Result};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where a communicator is in its life.
#[derive(Debug)]
pub(crate) enum State {
    /// Initialization (init or split) has not finished.
    Init,
    /// Ready for operations.
    Ready(Arc<Communicator>),
    /// Initialization failed.
    Failed(Error),
}

type Job = Box<dyn FnOnce() + Send + 'static>;

/// The thread that runs one communicator's non-blocking work, in order.
#[derive(Debug)]
struct Worker {
    tx: Sender<Job>,
    thread: std::thread::JoinHandle<()>,
}

/// One communicator as the C API sees it.
#[derive(Debug)]
pub(crate) struct Shared {
    /// `config.blocking`: whether calls complete before they return.
    pub blocking: bool,
    /// What `ncclCommCuDevice` reports (the device list entry, 0 without one).
    pub cu_device: c_int,
    /// The device whose buffers a NULL-stream call may be handed (`stream::null_stream_device`),
    /// decided when the communicator is made; `None`: NULL always means host buffers.
    pub null_stream_device: Option<Device>,
    state: Mutex<State>,
    state_changed: Condvar,
    worker: Mutex<Option<Worker>>,
    /// Jobs submitted to the worker and not yet finished.
    pending: Mutex<usize>,
    idle: Condvar,
    /// The first error of background work.
    async_error: Mutex<Option<Error>>,
    /// Set by `ncclCommFinalize`: no more operations.
    pub finalized: AtomicBool,
    /// Set by `ncclCommAbort`: an initialization still running aborts what it makes.
    aborted: AtomicBool,
    /// Operations made by `ncclRedOpCreatePreMulSum`: index `op - ncclNumOps`.
    pub redops: Mutex<Vec<Option<PreMul>>>,
    /// `ncclCommRegister` handles: handle value -> (buffer address, size).
    pub registrations: Mutex<HashMap<usize, (usize, usize)>>,
    /// The rendezvous store this rank hosts, kept alive as long as the communicator.
    server: Mutex<Option<Arc<TcpStoreServer>>>,
    /// Set by `ncclCommSuspend`, cleared by `ncclCommResume`: no operations meanwhile.
    pub suspended: AtomicBool,
    /// Set by `ncclCommRevoke`: operations fail; destroy, abort and shrink remain.
    pub revoked: AtomicBool,
    /// The unique id `ncclCommGetUniqueId` handed out and no communicator has used yet.
    pub fresh_id: Mutex<Option<u64>>,
    /// Calls with a non-NULL stream on a blocking communicator, run in call order.
    pub streams: StreamQueue,
}

impl Shared {
    /// A communicator still being initialized.
    pub fn new(blocking: bool, cu_device: c_int) -> Arc<Shared> {
        Arc::new(Shared {
            blocking,
            cu_device,
            null_stream_device: super::stream::null_stream_device(cu_device),
            state: Mutex::new(State::Init),
            state_changed: Condvar::new(),
            worker: Mutex::new(None),
            pending: Mutex::new(0),
            idle: Condvar::new(),
            async_error: Mutex::new(None),
            finalized: AtomicBool::new(false),
            aborted: AtomicBool::new(false),
            redops: Mutex::new(Vec::new()),
            registrations: Mutex::new(HashMap::new()),
            server: Mutex::new(None),
            suspended: AtomicBool::new(false),
            revoked: AtomicBool::new(false),
            fresh_id: Mutex::new(None),
            streams: StreamQueue::default(),
        })
    }

    /// A communicator that is ready.
    pub fn ready(comm: Communicator, blocking: bool, cu_device: c_int) -> Arc<Shared> {
        let s = Self::new(blocking, cu_device);
        s.finish_init(Ok(comm));
        s
    }

    /// Keeps `server` alive as long as this communicator.
    pub fn keep_server(&self, server: Arc<TcpStoreServer>) {
        *lock(&self.server) = Some(server);
    }

    /// Ends initialization with `r`.
    pub fn finish_init(&self, r: Result<Communicator>) {
        let state = match r {
            Ok(c) => {
                if self.aborted.load(Ordering::SeqCst) {
                    c.abort();
                }
                State::Ready(Arc::new(c))
            }
            Err(e) => State::Failed(e),
        };
        *lock(&self.state) = state;
        self.state_changed.notify_all();
    }

    /// The communicator, or `None` while it is being initialized.
    pub fn try_ready(&self) -> Option<Result<Arc<Communicator>>> {
        match &*lock(&self.state) {
            State::Init => None,
            State::Ready(c) => Some(Ok(Arc::clone(c))),
            State::Failed(e) => Some(Err(e.clone())),
        }
    }

    /// The communicator, waiting for its initialization to finish.
    pub fn wait_ready(&self) -> Result<Arc<Communicator>> {
        let mut s = lock(&self.state);
        loop {
            match &*s {
                State::Init => {
                    s = self
                        .state_changed
                        .wait(s)
                        .unwrap_or_else(|p| p.into_inner())
                }
                State::Ready(c) => return Ok(Arc::clone(c)),
                State::Failed(e) => return Err(e.clone()),
            }
        }
    }

    /// Runs `job` on this communicator's worker thread, after the jobs submitted before it.
    pub fn submit(self: &Arc<Self>, job: impl FnOnce() + Send + 'static) -> Result<()> {
        let this = Arc::clone(self);
        let wrapped: Job = Box::new(move || {
            if catch_unwind(AssertUnwindSafe(job)).is_err() {
                this.record_async(Error::internal("a background operation panicked"));
            }
            let mut p = lock(&this.pending);
            *p = p.saturating_sub(1);
            this.idle.notify_all();
        });
        *lock(&self.pending) += 1;
        let mut w = lock(&self.worker);
        if w.is_none() {
            let (tx, rx) = crossbeam_channel::unbounded::<Job>();
            let thread = std::thread::Builder::new()
                .name("ferroccl-capi".into())
                .spawn(move || {
                    for job in rx {
                        job();
                    }
                })
                .map_err(|e| {
                    *lock(&self.pending) -= 1;
                    Error::io("starting a communicator's background thread", &e)
                })?;
            *w = Some(Worker { tx, thread });
        }
        let sent = w.as_ref().map(|w| w.tx.send(wrapped).is_ok());
        if sent != Some(true) {
            *lock(&self.pending) -= 1;
            return Err(Error::internal(
                "a communicator's background thread has stopped",
            ));
        }
        Ok(())
    }

    /// Whether background work is queued or running.
    pub fn busy(&self) -> bool {
        *lock(&self.pending) > 0
    }

    /// Waits until no background work and no stream job is queued or running.
    pub fn wait_idle(&self) {
        let mut p = lock(&self.pending);
        while *p > 0 {
            p = self.idle.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        drop(p);
        self.streams.drain();
    }

    /// Records the first error of background work.
    pub fn record_async(&self, e: Error) {
        lock(&self.async_error).get_or_insert(e);
    }

    /// `ncclCommGetAsyncError`: `Ok(None)` while work is in progress, else the first error.
    pub fn async_status(&self) -> Option<Option<Error>> {
        if self.busy() {
            return None;
        }
        let comm = self.try_ready()?;
        if let Some(e) = lock(&self.async_error).clone() {
            return Some(Some(e));
        }
        if let Some(e) = self.streams.failed() {
            return Some(Some(e));
        }
        match comm {
            Err(e) => Some(Some(e)),
            Ok(c) => Some(c.async_error()),
        }
    }

    /// Stops the worker thread and the stream queue's after the work queued on them, and
    /// waits for them.
    pub fn stop_worker(&self) {
        let w = lock(&self.worker).take();
        if let Some(Worker { tx, thread }) = w {
            drop(tx);
            let _ = thread.join();
        }
        self.streams.stop();
    }

    /// Aborts: operations in flight fail promptly; an initialization still running aborts
    /// its communicator when it finishes. Does not wait.
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::SeqCst);
        // Queued stream jobs fail without running (their streams are still released).
        self.streams.abort();
        if let Some(Ok(c)) = self.try_ready() {
            c.abort();
        }
        // The worker drains its queue (failing fast) and exits once the channel is closed.
        drop(lock(&self.worker).take());
    }
}

/// Live communicators by handle address. The box gives each handle a distinct address; C
/// never sees more than that address, and the library never dereferences it.
type Table = HashMap<usize, (Box<ncclComm>, Arc<Shared>)>;

static COMMS: LazyLock<Mutex<Table>> = LazyLock::new(|| Mutex::new(HashMap::new()));
static SERIAL: AtomicU64 = AtomicU64::new(1);

/// Makes a handle for `shared`.
pub(crate) fn register(shared: Arc<Shared>) -> ncclComm_t {
    let mut boxed = Box::new(ncclComm {
        _serial: SERIAL.fetch_add(1, Ordering::Relaxed),
    });
    let handle: ncclComm_t = &mut *boxed;
    lock(&COMMS).insert(handle as usize, (boxed, shared));
    handle
}

/// The communicator behind `comm`, an error naming `api` if it is not a live handle.
pub(crate) fn lookup(api: &str, comm: ncclComm_t) -> Result<Arc<Shared>> {
    if comm.is_null() {
        return Err(Error::invalid_argument(format!("{api}: comm is NULL")));
    }
    lock(&COMMS)
        .get(&(comm as usize))
        .map(|(_, s)| Arc::clone(s))
        .ok_or_else(|| not_live(api, comm))
}

/// Removes `comm` from the table, returning its state.
pub(crate) fn unregister(api: &str, comm: ncclComm_t) -> Result<Arc<Shared>> {
    if comm.is_null() {
        return Err(Error::invalid_argument(format!("{api}: comm is NULL")));
    }
    lock(&COMMS)
        .remove(&(comm as usize))
        .map(|(_, s)| s)
        .ok_or_else(|| not_live(api, comm))
}

fn not_live(api: &str, comm: ncclComm_t) -> Error {
    Error::invalid_argument(format!(
        "{api}: comm {comm:p} is not a live communicator (never created, or already destroyed)"
    ))
}

/// Number of live communicators (for tests).
pub fn live_count() -> usize {
    lock(&COMMS).len()
}

/// Options of a new communicator, read from an `ncclConfig_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommOptions {
    /// Whether calls complete before they return.
    pub blocking: bool,
}

/// Reads the caller's `ncclConfig_t` (NULL: defaults). Only the prefix that the caller's
/// `size` covers is read; fields newer than the caller's `version` keep their defaults.
///
/// # Safety
/// `config` is NULL or points to at least `config->size` readable bytes (at least the 16-byte
/// `size`/`magic`/`version` prefix).
pub unsafe fn read_config(
    api: &str,
    config: *const ncclConfig_t,
    default_blocking: bool,
) -> Result<CommOptions> {
    let mut opts = CommOptions {
        blocking: default_blocking,
    };
    if config.is_null() {
        return Ok(opts);
    }
    let mut c = ncclConfig_t::default();
    let prefix = std::mem::offset_of!(ncclConfig_t, blocking);
    // SAFETY: the caller's config holds at least the prefix, whose first field is `size`.
    let size = unsafe { std::ptr::read_unaligned(config.cast::<usize>()) };
    if size < prefix {
        return Err(Error::invalid_argument(format!(
            "{api}: config->size is {size}, less than the {prefix}-byte header; initialize the \
             config with NCCL_CONFIG_INITIALIZER"
        )));
    }
    let n = size.min(std::mem::size_of::<ncclConfig_t>());
    // SAFETY: the caller's config has `size` readable bytes and `n <= size`; `c` is a
    // plain-data struct of at least `n` bytes, and the two do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(
            config.cast::<u8>(),
            (&mut c as *mut ncclConfig_t).cast::<u8>(),
            n,
        )
    };
    if c.magic != NCCL_API_MAGIC {
        return Err(Error::invalid_argument(format!(
            "{api}: config->magic is {:#x}, expected {NCCL_API_MAGIC:#x}; initialize the config \
             with NCCL_CONFIG_INITIALIZER",
            c.magic
        )));
    }
    // Fields a caller's NCCL version did not have keep their defaults.
    const SPLIT_SHARE_SINCE: c_uint = 21800;
    if c.version < SPLIT_SHARE_SINCE {
        c.splitShare = NCCL_CONFIG_UNDEF_INT;
    }
    match c.blocking {
        NCCL_CONFIG_UNDEF_INT => {}
        0 | 1 => opts.blocking = c.blocking == 1,
        v => {
            return Err(Error::invalid_argument(format!(
                "{api}: config->blocking is {v} (must be 0 or 1)"
            )))
        }
    }
    for (name, v) in [
        ("cgaClusterSize", c.cgaClusterSize),
        ("minCTAs", c.minCTAs),
        ("maxCTAs", c.maxCTAs),
    ] {
        if v != NCCL_CONFIG_UNDEF_INT && v < 0 {
            return Err(Error::invalid_argument(format!(
                "{api}: config->{name} is {v} (must not be negative)"
            )));
        }
    }
    if c.splitShare != NCCL_CONFIG_UNDEF_INT && !matches!(c.splitShare, 0 | 1) {
        return Err(Error::invalid_argument(format!(
            "{api}: config->splitShare is {} (must be 0 or 1)",
            c.splitShare
        )));
    }
    Ok(opts)
}

/// The error an operation on a communicator that is still initializing returns from query
/// calls, with `ncclInProgress`.
pub(crate) fn still_initializing(api: &str) -> Error {
    Error::new(
        ErrorKind::InvalidUsage,
        format!(
            "{api}: the communicator is still being initialized; poll ncclCommGetAsyncError \
             until it returns something other than ncclInProgress"
        ),
    )
}
