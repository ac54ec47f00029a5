//! Stream-ordered completion of calls made on a caller's stream (the C ABI's calls with a
//! non-NULL stream, the Rust API's `*_device_on` calls): per communicator, a FIFO of jobs run
//! by a thread of its own, started on the first stream call.
//!
//! A call (or a group's batch for one communicator) becomes one job with a sequence number
//! `seq`. On the caller's thread, after every synchronous check, [`StreamQueue::enqueue`]
//! (a) records a [`Gate`] on each stream the job uses, (b) queues on each of them a wait until
//! the communicator's completion [`Flag`] reaches `seq`, (c) pushes the job and returns. The
//! worker, for each job in call order: waits for its gates (the work queued on the streams
//! before the call), runs it, and stores `seq` in the flag (release ordering), so the
//! streams go on. A job that fails still stores `seq` (a stream is never left waiting); its
//! error becomes the communicator's asynchronous error and every later call fails with it.
//!
//! | event | what happens to the queue |
//! |---|---|
//! | host-buffer (NULL stream) work on the communicator, a blocking Rust collective | waits until the queue is empty ([`StreamQueue::drain`]) |
//! | `ncclCommFinalize`, `ncclCommDestroy`, dropping a Rust `Communicator` | drain, then the thread ends |
//! | `ncclCommAbort`, `Communicator::abort` | queued jobs fail without running, the running one fails promptly (the communicator is aborted); flags are still stored |

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Once};
use std::thread::JoinHandle;

use crossbeam_channel::Sender;

use crate::device::gate::{Flag, Gate};
use crate::device::graph::{HostCall, Release};
use crate::device::recorded::{Recorded, RecordedBytes};
use crate::device::staging::Pinned;
use crate::device::stream_stage::{Arenas, Span, Staged};
use crate::device::Device;
use crate::{Error, ErrorKind, Result};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The work of one job: runs on the worker after the gates; its error is the job's.
pub(crate) type Work = Box<dyn FnOnce() -> Result<()> + Send + 'static>;

/// What runs on the worker after a job's flag is stored, whatever happened to the job, before
/// the job stops counting as pending (staged jobs wait there for their copies back:
/// [`landing`]).
pub(crate) type After = Box<dyn FnOnce(&AtomicBool) + Send + 'static>;

/// One queued job.
struct Job {
    seq: u32,
    gates: Vec<Gate>,
    work: Work,
    flag: Arc<Flag>,
    after: Option<After>,
}

/// What the worker and the callers share.
#[derive(Debug, Default)]
struct Progress {
    /// Jobs pushed and not yet finished (their flag stored).
    pending: Mutex<usize>,
    idle: Condvar,
    /// The first error of a job.
    failed: Mutex<Option<Error>>,
    /// Set by [`StreamQueue::abort`]: jobs not yet started fail without running.
    aborted: AtomicBool,
    /// Set at the first job: until then [`StreamQueue::drain_if_used`] costs one load.
    used: AtomicBool,
}

/// The caller-side state, under one lock so that sequence numbers and queue order agree.
#[derive(Debug, Default)]
struct Inner {
    tx: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    /// The completion flag, made on the first job on the communicator's device.
    flag: Option<Arc<Flag>>,
    /// The sequence number of the last job pushed (the flag's value once it has finished).
    seq: u32,
}

/// One communicator's queue of stream jobs.
#[derive(Debug, Default)]
pub(crate) struct StreamQueue {
    inner: Mutex<Inner>,
    progress: Arc<Progress>,
    /// Pinned arenas of the jobs staged on the caller's streams (`stream_stage`).
    arenas: Mutex<Arenas>,
    /// The host work and arenas of calls recorded into CUDA graphs, kept while a graph may
    /// run them (`device::recorded`).
    recorded: Recorded,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("seq", &self.seq).finish()
    }
}

/// Unless `FERRO_STREAM_WAITS=1` says otherwise, a CUDA call with a stream that would stage
/// more than this many bytes through its stream's pinned arena blocks instead: the arena is
/// page-locked host memory as large as the largest such call rounded up to a power of two,
/// and the arenas it outgrew are kept too, until the communicator goes; it copies the call
/// whole where the blocking form pipelines slices.
pub(crate) const ORDER_MAX_BYTES: usize = 256 << 20;

/// Whether a call that stages `bytes` through a stream's arena completes in stream order,
/// given `FERRO_STREAM_WAITS` (`waits`) and the device's provider: `0` never, `1` always,
/// unset up to [`ORDER_MAX_BYTES`] on CUDA and always on the host stand-in.
fn orders(waits: Option<bool>, provider: crate::device::Provider, bytes: usize) -> bool {
    match waits {
        Some(w) => w,
        None => provider != crate::device::Provider::Cuda || bytes <= ORDER_MAX_BYTES,
    }
}

/// Whether a call on `device` that stages `bytes` through its stream's arena completes in
/// stream order ([`orders`]); says once per process when a call blocks for its size.
pub(crate) fn orders_call(device: Device, bytes: usize) -> bool {
    let yes = orders(stream_waits(), device.provider(), bytes);
    if !yes && stream_waits().is_none() {
        static SAID: Once = Once::new();
        SAID.call_once(|| {
            ferroccl_transport::log_line!(
                "ferroccl INFO COLL: a call with a stream that stages {bytes} bytes blocks until \
                 done: calls staging more than {ORDER_MAX_BYTES} bytes through the stream's \
                 pinned arena block (FERRO_STREAM_WAITS=1: every call in stream order)"
            )
        });
    }
    yes
}

/// Whether calls on `device`'s streams may complete asynchronously (see [`stream_waits`]);
/// where they were asked to but cannot, says once per process that stream calls block.
pub(crate) fn async_supported(device: Device) -> bool {
    if stream_waits() == Some(false) {
        return false;
    }
    if device.stream_waits_supported() {
        return true;
    }
    static SAID: Once = Once::new();
    SAID.call_once(|| {
        ferroccl_transport::log_line!(
            "ferroccl WARN COLL: {device} cannot make a stream wait on host-mapped memory \
             (cuStreamWaitValue32: {}; CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY); calls with a \
             stream block until their collective is done",
            crate::device::gate::cuda_wait_call().unwrap_or("not exported")
        )
    });
    false
}

/// The error that ends a wait of the queue's thread once the communicator is aborted.
fn aborted_error(aborted: &AtomicBool) -> Option<Error> {
    aborted.load(Ordering::SeqCst).then(|| {
        Error::new(
            ErrorKind::Aborted,
            "the communicator was aborted while its stream job waited for the stream",
        )
    })
}

/// Whether calls on the caller's stream `handle` of `device` run in the blocking form whatever
/// `FERRO_STREAM_WAITS` says: the NULL stream (NCCL's legacy default stream, for device
/// buffers handed to a NULL-stream call) always, and on CUDA the special handles
/// `cudaStreamLegacy` (1) and `cudaStreamPerThread` (2) too. A flag wait queued on the legacy
/// stream would hold every blocking stream of the context; the per-thread handle names another
/// stream on every thread, which the arenas and flags kept per handle cannot tell apart.
pub(crate) fn blocks_always(device: Device, handle: usize) -> bool {
    handle == 0 || (device.provider() == crate::device::Provider::Cuda && handle <= 2)
}

impl StreamQueue {
    /// Queues `work` on the streams `streams` of `device` (see the module docs), with `gates`
    /// recorded on them by [`record_gates`] (a group records every communicator's gates before
    /// it queues any wait, so communicators sharing a stream do not wait for each other), and
    /// `after` run on the worker once the job's flag is stored (also when the job fails or is
    /// aborted; dropped unrun when the job never reaches the worker). An error here (the
    /// thread, a driver call) is returned at once and nothing of `work` runs.
    pub(crate) fn enqueue(
        &self,
        device: Device,
        streams: &[usize],
        gates: Vec<Gate>,
        work: Work,
        after: Option<After>,
    ) -> Result<()> {
        let p = &self.progress;
        let mut inner = lock(&self.inner);
        if p.aborted.load(Ordering::SeqCst) {
            return Err(Error::new(
                ErrorKind::Aborted,
                "the communicator was aborted",
            ));
        }
        if inner.thread.is_none() {
            let (tx, rx) = crossbeam_channel::unbounded::<Job>();
            let progress = Arc::clone(p);
            let thread = std::thread::Builder::new()
                .name("ferroccl-stream".into())
                .spawn(move || {
                    // Jobs that never ran (after an abort) are dropped once the queue is
                    // empty: their closures may hold the communicator's last handle, whose
                    // teardown makes driver calls, and every later job's flag must be
                    // stored before that (a stream waiting on one would hold the device).
                    let mut unrun = Vec::new();
                    for job in rx {
                        unrun.extend(run_job(&progress, job));
                    }
                    drop(unrun);
                })
                .map_err(|e| Error::io("starting a communicator's stream thread", &e))?;
            inner.tx = Some(tx);
            inner.thread = Some(thread);
        }
        let flag = match &inner.flag {
            Some(f) => Arc::clone(f),
            None => {
                let f = Arc::new(device.alloc_flag()?);
                inner.flag = Some(Arc::clone(&f));
                f
            }
        };
        let seq = inner.seq.wrapping_add(1);
        let mut waiting = 0;
        let mut failure = None;
        for &s in streams {
            let handle = std::ptr::without_provenance_mut(s);
            // SAFETY: as above; the flag is the communicator's, made on `device`.
            match unsafe { device.wait_flag(handle, &flag, seq) } {
                Ok(()) => waiting += 1,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let work = match failure {
            // Nothing waits for this number: give it up and report the error.
            Some(e) if waiting == 0 => return Err(e),
            // Some stream waits for it: a job that only stores it, in order.
            Some(e) => {
                let job = Job {
                    seq,
                    gates: Vec::new(),
                    work: Box::new(|| Ok(())),
                    flag,
                    after,
                };
                self.push(&mut inner, job)?;
                return Err(e);
            }
            None => work,
        };
        let job = Job {
            seq,
            gates,
            work,
            flag,
            after,
        };
        self.push(&mut inner, job)
    }

    fn push(&self, inner: &mut Inner, job: Job) -> Result<()> {
        let seq = job.seq;
        self.progress.used.store(true, Ordering::SeqCst);
        *lock(&self.progress.pending) += 1;
        let sent = inner.tx.as_ref().map(|tx| tx.send(job));
        match sent {
            Some(Ok(())) => {
                inner.seq = seq;
                Ok(())
            }
            Some(Err(crossbeam_channel::SendError(job))) => {
                // The thread is gone: store the number here so no stream waits forever.
                inner.seq = seq;
                finish(&self.progress, &job.flag, seq);
                Err(Error::internal(
                    "a communicator's stream thread has stopped",
                ))
            }
            None => {
                *lock(&self.progress.pending) -= 1;
                Err(Error::internal(
                    "a communicator's stream thread has stopped",
                ))
            }
        }
    }

    /// Stages `spans` of a job on the caller's `stream` of `device` (see `stream_stage`): the
    /// copies in are queued on the stream now; record the job's gates after this.
    ///
    /// # Safety
    /// As for `Arenas::stage`.
    pub(crate) unsafe fn stage(
        &self,
        device: Device,
        stream: usize,
        spans: &[Span],
    ) -> Result<Staged> {
        // SAFETY: per the caller.
        unsafe { lock(&self.arenas).stage(device, stream, spans) }
    }

    /// Stages `spans` of a call being recorded into a graph on the caller's `stream` in an
    /// arena of its own (a spare one if any fits); the copies in are recorded now. Keep the
    /// arena with the call ([`StreamQueue::keep_captured`]).
    ///
    /// # Safety
    /// As for `Arenas::stage`.
    pub(crate) unsafe fn stage_captured(
        &self,
        device: Device,
        stream: usize,
        spans: &[Span],
    ) -> Result<(Staged, Pinned)> {
        let arena = |bytes| self.recorded.arena(device, bytes);
        // SAFETY: per the caller; the arena is kept with the call.
        unsafe { Arenas::stage_captured(device, stream, spans, arena) }
    }

    /// Keeps `call`, queued on a stream being captured, and its `arena` until the release
    /// returned runs (hand it to the graph) or the queue drops: each launch of the graph runs
    /// the call.
    pub(crate) fn keep_captured(&self, call: Arc<HostCall>, arena: Pinned) -> Release {
        self.recorded.keep(call, arena)
    }

    /// Frees the arenas of recorded calls whose graphs are gone (a call not being recorded;
    /// one atomic load where there are none).
    pub(crate) fn free_spare_arenas(&self) {
        self.recorded.free_spares();
    }

    /// Pinned bytes held for calls recorded into graphs.
    pub(crate) fn recorded_bytes(&self) -> RecordedBytes {
        self.recorded.bytes()
    }

    /// Bytes of pinned memory in this queue's arenas.
    #[cfg(test)]
    pub(crate) fn arena_bytes(&self) -> usize {
        lock(&self.arenas).bytes()
    }

    /// Room for the slices in flight of a call on the caller's `stream` in its arena
    /// (`Arenas::window`); nothing is copied.
    pub(crate) fn window(
        &self,
        device: Device,
        stream: usize,
        place: usize,
        places: usize,
    ) -> Result<crate::device::stream_stage::Window> {
        lock(&self.arenas).window(device, stream, place, places)
    }

    /// Queues `staged`'s copies back on its stream (after the job's flag wait, queued by
    /// [`StreamQueue::enqueue`]) and returns a gate after them, for the job's [`landing`].
    ///
    /// # Safety
    /// As for `Staged::copy_back`.
    pub(crate) unsafe fn copy_back(
        &self,
        device: Device,
        stream: usize,
        staged: &Staged,
    ) -> Result<Gate> {
        // SAFETY: per the caller.
        unsafe { staged.copy_back() }?;
        let handle = std::ptr::without_provenance_mut(stream);
        // SAFETY: the caller's stream of `device` (as for `copy_back`).
        unsafe { device.record_gate(handle) }
    }

    /// Waits until every job pushed so far has finished, its after-step included (so a
    /// staged job's copies back are in device memory: [`landing`]).
    pub(crate) fn drain(&self) {
        let p = &self.progress;
        let mut n = lock(&p.pending);
        while *n > 0 {
            n = p.idle.wait(n).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// [`StreamQueue::drain`] where a job was ever queued (one atomic load otherwise).
    pub(crate) fn drain_if_used(&self) {
        if self.progress.used.load(Ordering::SeqCst) {
            self.drain();
        }
    }

    /// Whether jobs are queued or running.
    #[cfg(test)]
    pub(crate) fn busy(&self) -> bool {
        *lock(&self.progress.pending) > 0
    }

    /// The first error of a job, if one failed.
    pub(crate) fn failed(&self) -> Option<Error> {
        lock(&self.progress.failed).clone()
    }

    /// Records `e` as the queue's first error, if it has none (a call recorded into a graph
    /// failed at a launch): later calls fail with it.
    pub(crate) fn record_failure(&self, e: Error) {
        lock(&self.progress.failed).get_or_insert(e);
    }

    /// Drains the queue and ends the thread; the flag is freed once no stream waits on it.
    pub(crate) fn stop(&self) {
        let (tx, thread, flag) = {
            let mut inner = lock(&self.inner);
            (inner.tx.take(), inner.thread.take(), inner.flag.take())
        };
        drop(tx);
        if let Some(t) = thread {
            let _ = t.join();
        }
        drop(flag);
    }

    /// Jobs not yet started fail without running (their flags still stored); the thread
    /// ends after them. Does not wait. The running job is the communicator's to abort.
    pub(crate) fn abort(&self) {
        self.progress.aborted.store(true, Ordering::SeqCst);
        let mut inner = lock(&self.inner);
        drop(inner.tx.take());
        drop(inner.thread.take());
    }
}

/// Records a gate at the current end of each of `streams` of `device`.
pub(crate) fn record_gates(device: Device, streams: &[usize]) -> Result<Vec<Gate>> {
    streams
        .iter()
        .map(|&s| {
            let handle = std::ptr::without_provenance_mut(s);
            // SAFETY: `s` is the caller's stream of the communicator's device (NCCL's contract
            // for the stream argument), never dereferenced here.
            unsafe { device.record_gate(handle) }
        })
        .collect()
}

/// Stores `seq` in `flag` and counts the job finished.
fn finish(p: &Progress, flag: &Flag, seq: u32) {
    flag.release(seq);
    count_finished(p);
}

fn count_finished(p: &Progress) {
    let mut n = lock(&p.pending);
    *n = n.saturating_sub(1);
    p.idle.notify_all();
}

/// A job's after-step that waits (polling host memory, no driver call) for the gates sent on
/// the returned channel, those after the job's copies back ([`StreamQueue::copy_back`]), then
/// drops `keep` (the Rust API's holds on its buffers). A channel dropped unsent waits for
/// nothing. Since the job counts as pending until its after-step is done,
/// [`StreamQueue::drain`] returns only once the results are in device memory.
pub(crate) fn landing<K: Send + 'static>(keep: K) -> (Sender<Vec<Gate>>, After) {
    let (tx, rx) = crossbeam_channel::bounded::<Vec<Gate>>(1);
    let after: After = Box::new(move |aborted: &AtomicBool| {
        for mut g in rx.recv().unwrap_or_default() {
            if let Err(e) = g.wait_or(|| aborted_error(aborted)) {
                ferroccl_transport::log_line!(
                    "ferroccl WARN COLL: waiting for a stream job's copies back: {e}"
                );
            }
        }
        drop(keep);
    });
    (tx, after)
}

/// `FERRO_STREAM_WAITS`: `1` makes calls with a stream return at once and complete in stream
/// order (the caller's stream waits on a host-mapped flag), `0` makes them block until their
/// collective is done; unset, calls complete in stream order, except CUDA calls that stage
/// more than [`ORDER_MAX_BYTES`] ([`orders`]). An earlier design deadlocked on an H100 when the
/// program's thread made a synchronous legacy-stream copy (`cudaMemcpy`) right after the
/// call (its job made driver calls); the job now makes none, and the stream-ordered form
/// passed there, with such a copy after every call (docs/CUDA.md, "On a GPU"). Read once per
/// process.
pub(crate) fn stream_waits() -> Option<bool> {
    static ON: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        match std::env::var("FERRO_STREAM_WAITS")
            .as_deref()
            .map(str::trim)
        {
            Ok("0") => Some(false),
            Ok("1") => Some(true),
            _ => None,
        }
    })
}

/// Whether `FERRO_DEBUG=DEBUG` asks for a line per stream job (read once per process).
fn trace_jobs() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("FERRO_DEBUG").is_ok_and(|v| v.eq_ignore_ascii_case("DEBUG")))
}

/// Runs one job on the worker: gates, work, then its flag, whatever happened. Returns the work
/// where it did not run (aborted), for the worker to drop later.
fn run_job(p: &Progress, job: Job) -> Option<Work> {
    let Job {
        seq,
        mut gates,
        work,
        flag,
        after,
    } = job;
    let traced = trace_jobs();
    if traced {
        ferroccl_transport::log_line!(
            "ferroccl pid {} DEBUG COLL: stream job {seq}: waiting for {} gate(s)",
            std::process::id(),
            gates.len()
        );
    }
    let mut unrun = None;
    let r = if p.aborted.load(Ordering::SeqCst) {
        unrun = Some(work);
        Err(Error::new(
            ErrorKind::Aborted,
            "the communicator was aborted before this operation started",
        ))
    } else {
        gates
            .iter_mut()
            .try_for_each(|g| g.wait_or(|| aborted_error(&p.aborted)))
            .map_err(|e| e.context("waiting for the work queued on the stream before the call"))
            .and_then(|()| {
                if traced {
                    ferroccl_transport::log_line!(
                        "ferroccl pid {} DEBUG COLL: stream job {seq}: gates passed, running",
                        std::process::id()
                    );
                }
                catch_unwind(AssertUnwindSafe(|| crate::device::as_stream_job(work)))
                    .unwrap_or_else(|_| {
                        Err(Error::internal("an operation queued on a stream panicked"))
                    })
            })
    };
    if traced {
        ferroccl_transport::log_line!(
            "ferroccl pid {} DEBUG COLL: stream job {seq}: {}; storing the flag",
            std::process::id(),
            match &r {
                Ok(()) => "done".to_string(),
                Err(e) => format!("failed: {e}"),
            }
        );
    }
    if let Err(e) = r {
        lock(&p.failed).get_or_insert(e);
    }
    flag.release(seq);
    drop(gates);
    if let Some(a) = after {
        a(&p.aborted);
    }
    count_finished(p);
    unrun
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Provider;
    use std::sync::atomic::AtomicUsize;
    use std::time::{Duration, Instant};

    fn stream(n: usize) -> *mut std::ffi::c_void {
        std::ptr::without_provenance_mut(n)
    }

    #[test]
    fn calls_complete_in_stream_order_unless_told_or_too_large_on_cuda() {
        let big = ORDER_MAX_BYTES + 1;
        for p in [Provider::Cuda, Provider::Host] {
            assert!(orders(None, p, ORDER_MAX_BYTES), "{p:?}: the default");
            assert!(
                orders(Some(true), p, big),
                "{p:?}: FERRO_STREAM_WAITS=1 has no limit"
            );
            assert!(
                !orders(Some(false), p, 8),
                "{p:?}: FERRO_STREAM_WAITS=0 blocks"
            );
        }
        assert!(
            !orders(None, Provider::Cuda, big),
            "a call too large for the arena blocks"
        );
        assert!(
            orders(None, Provider::Host, big),
            "the stand-in pins nothing"
        );
    }

    #[test]
    fn the_null_stream_and_cudas_special_handles_always_block() {
        let host = Device::new(Provider::Host, 0).unwrap();
        assert!(blocks_always(host, 0));
        assert!(!blocks_always(host, 1) && !blocks_always(host, 2) && !blocks_always(host, 7));
        // A Cuda device value needs no driver to be named here.
        let cuda = Device {
            provider: Provider::Cuda,
            ordinal: 0,
        };
        assert!(blocks_always(cuda, 0) && blocks_always(cuda, 1) && blocks_always(cuda, 2));
        assert!(!blocks_always(cuda, 0x7f00_1234));
    }

    #[test]
    fn jobs_run_in_order_after_the_call_returns_and_release_the_stream() {
        let dev = Device::new(Provider::Host, 0).unwrap();
        let q = StreamQueue::default();
        let order = Arc::new(Mutex::new(Vec::new()));
        let s = 0x51_0001;
        for i in 0..3 {
            let o = Arc::clone(&order);
            let t0 = Instant::now();
            q.enqueue(
                dev,
                &[s],
                record_gates(dev, &[s]).unwrap(),
                Box::new(move || {
                    std::thread::sleep(Duration::from_millis(30));
                    lock(&o).push(i);
                    Ok(())
                }),
                None,
            )
            .unwrap();
            assert!(t0.elapsed() < Duration::from_millis(25), "returned at once");
        }
        assert!(q.busy());
        // SAFETY: stand-in streams need no live handle.
        unsafe { dev.sync_stream(stream(s)) }.unwrap();
        assert_eq!(
            *lock(&order),
            [0, 1, 2],
            "the stream waited for every job, in order"
        );
        q.drain();
        assert!(!q.busy());
        assert!(q.failed().is_none());
        q.stop();
    }

    #[test]
    fn a_failing_job_still_releases_and_is_kept() {
        let dev = Device::new(Provider::Host, 1).unwrap();
        let q = StreamQueue::default();
        let s = 0x51_0002;
        let ran = Arc::new(AtomicUsize::new(0));
        q.enqueue(
            dev,
            &[s],
            record_gates(dev, &[s]).unwrap(),
            Box::new(|| Err(Error::remote("all_reduce on rank 1: peer 0 disagrees"))),
            None,
        )
        .unwrap();
        let r = Arc::clone(&ran);
        q.enqueue(
            dev,
            &[s],
            record_gates(dev, &[s]).unwrap(),
            Box::new(move || {
                r.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }),
            None,
        )
        .unwrap();
        // SAFETY: stand-in streams need no live handle.
        unsafe { dev.sync_stream(stream(s)) }.unwrap();
        let e = q.failed().unwrap();
        assert!(e.to_string().contains("peer 0 disagrees"), "{e}");
        assert_eq!(
            ran.load(Ordering::SeqCst),
            1,
            "later jobs still run (and fail themselves)"
        );
        q.stop();
    }

    #[test]
    fn abort_fails_queued_jobs_without_running_them() {
        let dev = Device::new(Provider::Host, 2).unwrap();
        let q = StreamQueue::default();
        let s = 0x51_0003;
        let (go_tx, go_rx) = crossbeam_channel::bounded::<()>(1);
        let ran = Arc::new(AtomicUsize::new(0));
        q.enqueue(
            dev,
            &[s],
            record_gates(dev, &[s]).unwrap(),
            Box::new(move || {
                let _ = go_rx.recv();
                Ok(())
            }),
            None,
        )
        .unwrap();
        let r = Arc::clone(&ran);
        q.enqueue(
            dev,
            &[s],
            record_gates(dev, &[s]).unwrap(),
            Box::new(move || {
                r.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }),
            None,
        )
        .unwrap();
        q.abort();
        go_tx.send(()).unwrap();
        // SAFETY: stand-in streams need no live handle.
        unsafe { dev.sync_stream(stream(s)) }.unwrap();
        q.drain();
        assert_eq!(ran.load(Ordering::SeqCst), 0, "the queued job did not run");
        let e = q.failed().unwrap();
        assert_eq!(e.kind(), ErrorKind::Aborted, "{e}");
        let e = q
            .enqueue(dev, &[s], Vec::new(), Box::new(|| Ok(())), None)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Aborted);
    }

    #[test]
    fn the_gate_waits_for_earlier_work_on_the_stream() {
        let dev = Device::new(Provider::Host, 3).unwrap();
        let q = StreamQueue::default();
        let s = 0x51_0004;
        let src = Box::new(42u32);
        let dst = Arc::new(AtomicU32Box::default());
        // Earlier work on the stream: a copy into `dst`, run only when the stream runs.
        // SAFETY: both live until the stream is synchronized below.
        unsafe {
            dev.copy_on_stream(
                stream(s),
                dst.0.as_ptr().cast(),
                (&*src as *const u32).cast(),
                4,
            )
        }
        .unwrap();
        let d = Arc::clone(&dst);
        q.enqueue(
            dev,
            &[s],
            record_gates(dev, &[s]).unwrap(),
            Box::new(move || {
                let v = d.0.load(Ordering::Acquire);
                if v == 42 {
                    Ok(())
                } else {
                    Err(Error::internal(format!("ran before the earlier copy: {v}")))
                }
            }),
            None,
        )
        .unwrap();
        // SAFETY: stand-in streams need no live handle.
        unsafe { dev.sync_stream(stream(s)) }.unwrap();
        assert!(q.failed().is_none(), "{:?}", q.failed());
        q.stop();
    }

    /// A word another thread reads while the stand-in stream copies into it.
    #[derive(Debug, Default)]
    struct AtomicU32Box(std::sync::atomic::AtomicU32);
}
