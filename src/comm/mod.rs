//! The communicator: a group of ranks that run collectives together.

mod calibrate;
mod call;
mod calls;
mod config;
mod device_calls;
mod device_paths;
mod device_streams;
mod group;
mod init;
mod mesh;
mod order;
mod rendezvous;
mod shrink;
mod split;
mod stream_rounds;
mod stream_slices;
mod transports;
mod windows;
mod work;

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use ferroccl_kernels::{DataType, ElemOp};

use crate::bootstrap::{self, Store};
use crate::coll::{CollArgs, CollKind};
use crate::exec::Engine;
use crate::{Error, ErrorKind, Result};

pub use config::{parse_size, Config, DebugLevel};
pub(crate) use device_calls::call_count;
pub use device_calls::{BufMut, BufRef};
pub use group::Group;
#[cfg(feature = "capi")]
pub(crate) use stream_rounds::{P2pRounds, PieceOp, RoundContext};
#[cfg(feature = "capi")]
pub(crate) use stream_slices::{SliceJob, Sliced};
pub use windows::{DeviceWindow, Window};
pub use work::Work;

use call::{header_kind, Call};
use work::Worker;

/// A reduction operation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ReduceOp {
    /// Sum (wrapping for integers).
    Sum,
    /// Product (wrapping for integers).
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Sum divided by the number of ranks (integer division for integer types).
    Avg,
    /// Each rank's input multiplied by this rank's scalar, then summed (NCCL's
    /// `ncclRedOpCreatePreMulSum`). For integer types the scalar is truncated to an integer.
    PreMulSum(f64),
}

impl ReduceOp {
    /// The element-wise op the algorithms apply.
    pub fn elem_op(self) -> ElemOp {
        match self {
            ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PreMulSum(_) => ElemOp::Sum,
            ReduceOp::Prod => ElemOp::Prod,
            ReduceOp::Max => ElemOp::Max,
            ReduceOp::Min => ElemOp::Min,
        }
    }

    /// NCCL's code for the op (`ncclSum` = 0 ... `ncclAvg` = 4; 5 for pre-multiplied sums).
    pub fn code(self) -> u8 {
        use crate::wire::op;
        match self {
            ReduceOp::Sum => op::SUM,
            ReduceOp::Prod => op::PROD,
            ReduceOp::Max => op::MAX,
            ReduceOp::Min => op::MIN,
            ReduceOp::Avg => op::AVG,
            ReduceOp::PreMulSum(_) => op::PREMUL_SUM,
        }
    }

    /// Name as nccl-tests prints it.
    pub fn name(self) -> &'static str {
        crate::wire::op::name(self.code())
    }
}

#[derive(Debug)]
struct Inner {
    rank: usize,
    nranks: usize,
    id: u64,
    config: Config,
    listen_ip: IpAddr,
    engine: Mutex<Engine>,
    failed: Mutex<Option<Error>>,
    /// Whether `failed` holds an error (set once, after it does).
    has_failed: AtomicBool,
    /// Whether the peers were told of the failure (a notice and the connections closed).
    /// A failure recorded off the engine (a stream job's copy, a call left half queued) is
    /// told by the first turn after it, or at once where the engine is free.
    told: AtomicBool,
    aborted: Arc<AtomicBool>,
    /// The next ticket: handed out at issue, served in order (`serving`). A collective's
    /// sequence number is taken in its turn ([`Engine::next_seq`]), so it follows the same
    /// order without a lock at issue.
    next_ticket: AtomicU64,
    /// Held by a thread that waits for its turn on `turn`, and by one that wakes it.
    order: Mutex<()>,
    /// The ticket whose turn it is. Written at the end of each turn without the `order` lock,
    /// so a call whose turn comes at once takes no lock but the engine's.
    serving: AtomicU64,
    /// Threads waiting on `turn` for their ticket (under the `order` lock): with none,
    /// finishing a call wakes nobody (a condition variable's notify is a system call even
    /// without waiters).
    turn_waiters: AtomicUsize,
    turn: Condvar,
    splits: AtomicU64,
    groups: AtomicU64,
    /// The rendezvous store, kept to tell peers why this rank failed (and to learn why they did).
    store: Option<Arc<dyn Store>>,
    /// Keeps a rendezvous store this rank hosts alive as long as the communicator and the
    /// communicators shrunk from it (survivors meet through it, perhaps after this rank
    /// dropped the parent).
    store_server: Option<Arc<bootstrap::TcpStoreServer>>,
    /// Host id of every rank (equal ids: one host).
    hosts: Vec<u64>,
    /// Every rank's description (host, process).
    descs: Vec<ferroccl_transport::RankDesc>,
    /// Transport chosen for each peer (None for this rank).
    transports: Vec<Option<&'static str>>,
    /// Whether a connection carries CUDA device memory itself (the p2p transport).
    device_transport: bool,
    /// Whether device collectives are offered straight between the ranks' buffers (the
    /// engine's setting, known without its lock).
    peer_direct: bool,
    /// Whether windows are exchanged at registration (ranks of several processes of one host:
    /// the engine's setting, known without its lock).
    peer_windows: bool,
    /// Whether the ranks exchanged shared marks with their windows, so that calls through
    /// windows on a stream are queued on it (set once by the registration that did).
    windows_in_order: std::sync::atomic::AtomicBool,
}

/// A group of `nranks` ranks that run collectives together; this process's handle is one rank.
///
/// Calls from several threads are allowed and are ordered: every operation, blocking or
/// asynchronous, runs in the order it was issued. A failed operation fails the communicator:
/// every later call returns the same error.
#[derive(Debug)]
pub struct Communicator {
    inner: Arc<Inner>,
    worker: Mutex<Option<Worker>>,
    /// The device bound for device buffers, and its cached pinned staging (shared with the
    /// stream jobs, which stage through it on the queue's thread).
    device: Arc<Mutex<device_calls::DeviceState>>,
    /// Stream-ordered device collectives (`*_device_on`), run in call order.
    streams: crate::device::stream_queue::StreamQueue,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) use ferroccl_transport::hash64;

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: `b` is a writable 8-byte buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 8, 0) };
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    if n == 8 {
        u64::from_le_bytes(b) ^ t
    } else {
        hash64(&[&t.to_le_bytes(), &std::process::id().to_le_bytes()])
    }
}

impl Communicator {
    /// This rank, in `0..nranks()`.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Ranks in the communicator.
    pub fn nranks(&self) -> usize {
        self.inner.nranks
    }

    /// This rank's host id: ranks with equal ids share a host (machine id, host name and
    /// network namespace, or `FERRO_HOST_ID`).
    pub fn host_id(&self) -> u64 {
        self.inner.hosts[self.inner.rank]
    }

    /// This rank's position among the ranks of its host, in rank order (`0..local_nranks()`).
    pub fn local_rank(&self) -> usize {
        crate::topo::local_position(self.inner.rank, &self.inner.hosts).0
    }

    /// Ranks of this communicator on this rank's host (this one included).
    pub fn local_nranks(&self) -> usize {
        crate::topo::local_position(self.inner.rank, &self.inner.hosts).1
    }

    /// The name of the transport connecting this rank with `peer` (`"shm"`, `"tcp"`); `None`
    /// for this rank itself or a rank out of range.
    pub fn transport(&self, peer: usize) -> Option<&'static str> {
        self.inner.transports.get(peer).copied().flatten()
    }

    /// The largest allreduce (in bytes) that runs as one exchange through the connections'
    /// small-message lanes, as every rank agreed at init (`FERRO_SMALL_LANE_BYTES`); 0 where
    /// some pair of ranks has no lane (not every pair is on shared memory) or a rank disabled
    /// them.
    pub fn small_lane_bytes(&self) -> usize {
        let engine = self.inner.engine.lock().unwrap_or_else(|p| p.into_inner());
        engine.lane_bytes()
    }

    /// The cost model this rank's tuner uses, when `FERRO_TUNE=measure` calibrated it at init
    /// (every rank holds the same figures); `None` while it runs on the documented defaults.
    pub fn calibrated_model(&self) -> Option<crate::plan::CostModel> {
        let engine = self.inner.engine.lock().unwrap_or_else(|p| p.into_inner());
        engine.calibrated_model().cloned()
    }

    /// The algorithm a `kind` call of `count` elements of `dtype` runs on this communicator
    /// (the tuner's pick or `FERRO_ALGO`'s), as logged at `FERRO_DEBUG=DEBUG`.
    pub fn algorithm_for(
        &self,
        kind: CollKind,
        count: usize,
        dtype: DataType,
    ) -> crate::coll::Algorithm {
        let args = CollArgs {
            kind,
            count,
            in_place: false,
        };
        let engine = self.inner.engine.lock().unwrap_or_else(|p| p.into_inner());
        engine.algorithm_for(&args, dtype.size())
    }

    /// What a `kind` call of `count` elements of `dtype` runs, by name, as the trace names it:
    /// `lane` for an allreduce small enough for the small-message lane (with no `FERRO_ALGO`
    /// and an operation other than a pre-multiplied sum), else
    /// [`Communicator::algorithm_for`]'s name.
    pub fn route_for(&self, kind: CollKind, count: usize, dtype: DataType) -> &'static str {
        let args = CollArgs {
            kind,
            count,
            in_place: false,
        };
        let engine = self.inner.engine.lock().unwrap_or_else(|p| p.into_inner());
        engine.route_for(&args, dtype.size())
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The first error this communicator hit, if any (NCCL's `ncclCommGetAsyncError`).
    pub fn async_error(&self) -> Option<Error> {
        self.inner.failed_error()
    }

    /// Fails this communicator with `e`: every later operation returns it (the C ABI's calls
    /// left half issued).
    #[cfg(feature = "capi")]
    pub(crate) fn fail_with(&self, e: Error) {
        self.inner.fail_and_tell(e);
    }

    /// Aborts: every operation in flight or queued fails promptly with an `Aborted` error,
    /// connections are closed so peers notice at once, and every later call fails. Returns
    /// without waiting for peers.
    pub fn abort(&self) {
        self.inner.aborted.store(true, Ordering::SeqCst);
        let e = Error::new(
            ErrorKind::Aborted,
            format!("rank {}: the communicator was aborted", self.inner.rank),
        );
        self.inner.fail(e.clone());
        // Queued stream jobs fail without running (their streams are still released).
        self.streams.abort();
        if let Ok(mut engine) = self.inner.engine.try_lock() {
            self.inner.told.store(true, Ordering::SeqCst);
            engine.notify_failure(&e, 0);
            engine.shutdown_all();
        }
        // abort() returns at once: the report finishes (or not) on its own thread.
        self.inner.publish_failure(&e, Duration::ZERO);
    }

    /// Waits for every operation issued so far — stream-ordered ones included, until their
    /// results are in device memory — and returns the communicator's error if it failed (not
    /// an abort), as NCCL's `ncclCommFinalize` does. The connections stay open: a process that
    /// leaves right after its last stream-ordered call, with the jobs still queued, would fail
    /// its peers mid-collective.
    pub fn finalize(&self) -> Result<()> {
        self.streams.drain_if_used();
        // Calls queued on a stream straight between the buffers of processes (windows,
        // scratch windows) too; then the scratch windows go, once every rank is here.
        let r = self
            .inner
            .execute_next(false, |e, _| self.end_peer_shares(e, "finalize"));
        match self.async_error() {
            Some(e) if e.kind() != ErrorKind::Aborted => Err(e),
            _ => r.or(Ok(())),
        }
    }

    /// Waits for every queued operation, then closes the connections. Returns the
    /// communicator's error if it failed.
    pub fn destroy(self) -> Result<()> {
        self.streams.drain_if_used();
        let r = self.inner.execute_next(false, |e, _| {
            let settled = self.end_peer_shares(e, "destroy");
            e.shutdown_all();
            settled
        });
        match self.async_error() {
            Some(e) if e.kind() != ErrorKind::Aborted => Err(e),
            _ => r.or(Ok(())),
        }
    }

    /// Waits for this rank's last shares queued on a stream through windows or the scratch
    /// windows, then, where the scratch windows are held, lets go of them with every rank
    /// (`name`: the call, in errors); see [`crate::exec::Engine::end_scratch`].
    fn end_peer_shares(&self, e: &mut crate::exec::Engine, name: &'static str) -> Result<()> {
        if !e.scratch_held() {
            return e.settle_peer_shares();
        }
        let ctx = windows::window_ctx(name, e.next_seq(), self.inner.rank);
        let r = e.end_scratch(&ctx);
        self.inner
            .windows_in_order
            .store(e.windows_in_order(), Ordering::Release);
        r
    }

    fn worker(&self) -> Result<MutexGuard<'_, Option<Worker>>> {
        let mut w = lock(&self.worker);
        if w.is_none() {
            *w = Some(Worker::start(self.inner.rank)?);
        }
        Ok(w)
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Let queued stream jobs and other queued work finish (or fail), then stop the threads.
        self.streams.stop();
        drop(lock(&self.worker).take());
        let mut e = lock(&self.inner.engine);
        // Dropping is destroying without the error: the scratch windows go once every rank is
        // here, not while another process may still copy out of this one's (a communicator
        // that failed frees its scratch without the others' word; they failed too).
        if e.scratch_held() && self.inner.failed_error().is_none() {
            let _ = self.end_peer_shares(&mut e, "drop");
        }
        e.shutdown_all();
    }
}
