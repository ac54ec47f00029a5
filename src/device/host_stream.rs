//! The host stand-in's model of a caller's stream (a `cudaStream_t` from outside Rust): a
//! FIFO of entries that "the device" runs in order, named by the handle's number. Nothing runs
//! on its own: whoever waits for a point of the stream (a stream synchronize, a recorded
//! event) runs the entries up to that point, as a GPU would have by then.
//!
//! | entry | runs when |
//! |---|---|
//! | copy of bytes | at once, when reached |
//! | wait until a flag `>=` a value | when the flag (written by a host thread) gets there |
//! | a job (the model of a kernel, or of a host function) | at once, when reached; its error is the stream's, returned by every later wait for it |
//! | wait until another stream has run to a position (an event of it) | when that stream gets there: whoever waits runs that stream too |
//!
//! An event is a position in the FIFO (the count of entries queued when it was recorded):
//! waiting for it runs the entries before it. A flag wait that is never released would block
//! a synchronize forever, as on a GPU; the stand-in gives up after [`WAIT_LIMIT`] with an error
//! instead, so a test that breaks that promise fails rather than hangs.
//!
//! **Eager streams** (`FERRO_STANDIN_EAGER=1`, read once per process). Running entries only
//! when waited for is the latest a GPU could run them: a path that reads what a queued copy
//! writes without waiting for it sees stale bytes. The opposite mistake — filling memory on
//! the host after queuing a copy that reads it, as if the GPU had not got there yet — passes
//! that model. With eager streams every stream runs as early as a GPU could: an entry runs
//! as it is queued when the stream has nothing before it, and a "device" thread runs what a
//! released flag unblocks; the staging queues ([`super::host::Queue`]) copy as they are
//! queued. The suite runs the device tests in both modes (`scripts/test.sh`).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::{Error, ErrorKind, Result};

mod capture;
use capture::Recording;
#[cfg_attr(not(feature = "capi"), allow(unused_imports))]
pub(crate) use capture::{
    begin_capture, call, capture_status, end_capture, launch_graph, retain_in_capture, Call, Graph,
};

/// How long a stand-in stream waits for a flag before it reports an error.
pub(crate) const WAIT_LIMIT: Duration = Duration::from_secs(120);

/// Work a stand-in stream runs when it reaches it (the model of a kernel or a host function).
pub(crate) type Job = Box<dyn FnOnce() -> Result<()> + Send>;

/// How deep waits of streams on other streams may nest before a wait is taken for a cycle.
const MAX_CHAIN: usize = 64;

/// A word a stand-in stream can wait for ([`wait_flag`]): a host thread's flag, or a word
/// another process writes (`shared_marks`).
pub(crate) trait Flag: Send + Sync {
    /// Its value now.
    fn value(&self) -> u32;
    /// Says that a stream waits for it to reach `target` (where whoever writes it runs only
    /// when asked, as a lazy stand-in stream of another process does).
    fn ask(&self, target: u32) {
        let _ = target;
    }
}

impl Flag for AtomicU32 {
    fn value(&self) -> u32 {
        self.load(Ordering::Acquire)
    }
}

/// One entry of a stand-in stream.
enum Entry {
    /// `len` bytes from `src` to `dst`.
    Copy { dst: usize, src: usize, len: usize },
    /// Wait until `flag` reaches `value` (wrapping comparison, as `CU_STREAM_WAIT_VALUE_GEQ`).
    WaitFlag { flag: Arc<dyn Flag>, value: u32 },
    /// Run a job.
    Run(Job),
    /// Wait until stream `handle` (whose count of entries run is `progress`) has run the
    /// entries before position `upto`.
    After {
        handle: usize,
        progress: Arc<AtomicU64>,
        upto: u64,
    },
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Entry::Copy { len, .. } => write!(f, "Copy({len} bytes)"),
            Entry::WaitFlag { value, .. } => write!(f, "WaitFlag(>= {value})"),
            Entry::Run(_) => f.write_str("Run"),
            Entry::After { handle, upto, .. } => write!(f, "After(0x{handle:x} at {upto})"),
        }
    }
}

/// The entries of one stream not yet run. Invariant: `run` entries have left the front, so
/// entry `k` of `entries` has absolute position `run + k`.
#[derive(Debug, Default)]
struct Fifo {
    entries: VecDeque<Entry>,
    /// Entries run so far (shared with the entries of other streams that wait for this one).
    run: Arc<AtomicU64>,
    /// The error of a job that failed: every later wait for the stream returns it (sticky,
    /// as a CUDA context's error after a failed kernel).
    failed: Option<Error>,
    /// Being captured into a graph (the model of `cuStreamBeginCapture`): what is queued goes
    /// there instead of into `entries`.
    capture: Option<Recording>,
}

impl Fifo {
    fn run(&self) -> u64 {
        self.run.load(Ordering::Acquire)
    }
}

/// Stand-in streams by handle number.
static STREAMS: LazyLock<Mutex<HashMap<usize, Arc<Mutex<Fifo>>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Handles of streams forgotten ([`remove`]; handles are never reused): a wait for an event of
/// one waits for nothing, as a GPU finishes a destroyed stream's work by itself.
static GONE: LazyLock<Mutex<std::collections::HashSet<usize>>> =
    LazyLock::new(|| Mutex::new(std::collections::HashSet::new()));

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn stream(handle: usize) -> Arc<Mutex<Fifo>> {
    Arc::clone(lock(&STREAMS).entry(handle).or_default())
}

/// Whether `v` has reached `target` as `CU_STREAM_WAIT_VALUE_GEQ` compares (the difference as
/// a signed 32-bit number is not negative), so sequence numbers may wrap.
pub(crate) fn reached(v: u32, target: u32) -> bool {
    (v.wrapping_sub(target) as i32) >= 0
}

/// Whether stand-in streams run as early as a GPU could (`FERRO_STANDIN_EAGER=1`; see the
/// module docs). Read once per process.
pub(crate) fn eager() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("FERRO_STANDIN_EAGER").is_ok_and(|v| v.trim() == "1"))
}

/// Runs the entries at the front of `f` before position `upto` that can run now (copies,
/// jobs; waits whose flag or stream got there), stopping at the first wait that cannot;
/// whether it ran any.
fn run_ready(f: &mut Fifo, upto: u64) -> bool {
    let mut ran = false;
    while f.run() < upto {
        let ready = match f.entries.front() {
            None => return ran,
            Some(Entry::Copy { dst, src, len }) => {
                // SAFETY: `copy`'s caller keeps both ranges valid until the stream has run the
                // copy, which is now; the stream's lock orders it after earlier entries.
                unsafe { std::ptr::copy_nonoverlapping(*src as *const u8, *dst as *mut u8, *len) };
                true
            }
            Some(Entry::WaitFlag { flag, value }) => {
                let got = reached(flag.value(), *value);
                if !got {
                    flag.ask(*value);
                }
                got
            }
            Some(Entry::Run(_)) => true,
            Some(Entry::After { progress, upto, .. }) => progress.load(Ordering::Acquire) >= *upto,
        };
        if !ready {
            return ran;
        }
        if let Some(Entry::Run(job)) = f.entries.pop_front() {
            if let Err(e) = job() {
                f.failed.get_or_insert(e);
            }
        }
        f.run.fetch_add(1, Ordering::AcqRel);
        ran = true;
    }
    ran
}

/// With eager streams: runs what stream `s` can run now, and makes sure the "device" thread
/// runs what later flag releases unblock on any stream.
fn kick(s: &Mutex<Fifo>) {
    if !eager() {
        return;
    }
    run_ready(&mut lock(s), u64::MAX);
    static DEVICE: std::sync::Once = std::sync::Once::new();
    DEVICE.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("ferroccl-standin-device".into())
            .spawn(|| loop {
                let all: Vec<Arc<Mutex<Fifo>>> = lock(&STREAMS).values().map(Arc::clone).collect();
                let mut ran = false;
                for f in &all {
                    ran |= run_ready(&mut lock(f), u64::MAX);
                }
                if !ran {
                    std::thread::sleep(Duration::from_micros(50));
                }
            });
        // Without the thread a stream still runs when waited for, as in the lazy model.
        drop(spawned);
    });
}

/// Queues a wait until `flag` reaches `value` on stand-in stream `handle`.
pub(crate) fn wait_flag(handle: usize, flag: Arc<dyn Flag>, value: u32) {
    let s = stream(handle);
    lock(&s).push(Entry::WaitFlag { flag, value });
    kick(&s);
}

/// Queues a copy of `len` bytes on stand-in stream `handle`.
///
/// # Safety
/// `src` is readable and `dst` writable for `len` bytes, not overlapping, until the stream has
/// run the copy (a synchronize or an event recorded after it returned).
pub(crate) unsafe fn copy(handle: usize, dst: *mut u8, src: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    let s = stream(handle);
    lock(&s).push(Entry::Copy {
        dst: dst as usize,
        src: src as usize,
        len,
    });
    kick(&s);
}

/// Queues `job` on stand-in stream `handle`: it runs when the stream reaches it (whoever
/// waits for the stream runs it, or with eager streams as early as it can); an error it
/// returns is the stream's, returned by every later wait for the stream.
pub(crate) fn launch(handle: usize, job: Job) {
    launch_at(handle, job);
}

/// [`launch`], returning the job's position in the stream (it has run once the stream has run
/// the entries before position + 1).
pub(crate) fn launch_at(handle: usize, job: Job) -> u64 {
    let s = stream(handle);
    let at = {
        let mut f = lock(&s);
        f.push(Entry::Run(job));
        (f.run() + f.entries.len() as u64).saturating_sub(1)
    };
    kick(&s);
    at
}

/// Queues on stand-in stream `handle` a wait until stream `other` has run the entries before
/// position `upto` (an event recorded on it: `cuStreamWaitEvent`).
pub(crate) fn wait_for(handle: usize, other: usize, upto: u64) {
    let progress = {
        let mut streams = lock(&STREAMS);
        if lock(&GONE).contains(&other) {
            return;
        }
        let fifo = streams.entry(other).or_default();
        let run = Arc::clone(&lock(fifo).run);
        run
    };
    let s = stream(handle);
    lock(&s).push(Entry::After {
        handle: other,
        progress,
        upto,
    });
    kick(&s);
}

/// Points of stand-in streams up to which something waits to be let go (a stream-ordered
/// call's holds, [`release_later`]), run by [`run_releases`].
static RELEASES: Mutex<Vec<(usize, u64)>> = Mutex::new(Vec::new());

/// Says that host code may wait (for a buffer's holds) until stand-in stream `handle` has run
/// what is queued on it now: [`run_releases`] then runs it there, as a GPU gets there by itself.
pub(crate) fn release_later(handle: usize) {
    let upto = record(handle);
    lock(&RELEASES).push((handle, upto));
}

/// Runs every stand-in stream to the points of [`release_later`] (a failed entry keeps its
/// error for the stream's own waits); whether there were any.
pub(crate) fn run_releases() -> bool {
    let todo = std::mem::take(&mut *lock(&RELEASES));
    for &(handle, upto) in &todo {
        if !lock(&GONE).contains(&handle) {
            let _ = run_to(handle, upto);
        }
    }
    !todo.is_empty()
}

/// Records an event at the current end of stand-in stream `handle`: its position.
pub(crate) fn record(handle: usize) -> u64 {
    let s = stream(handle);
    let f = lock(&s);
    f.run() + f.entries.len() as u64
}

/// Runs the entries of stand-in stream `handle` before position `upto` (an event), waiting for
/// flags as it meets them and running the streams it waits for; an error after [`WAIT_LIMIT`]
/// on one flag, or the error of a job that failed.
pub(crate) fn run_to(handle: usize, upto: u64) -> Result<()> {
    run_chain(handle, upto, 0)
}

fn run_chain(handle: usize, upto: u64, depth: usize) -> Result<()> {
    if depth > MAX_CHAIN {
        return Err(Error::internal(format!(
            "host stand-in stream 0x{handle:x}: waits of streams on other streams nest more \
             than {MAX_CHAIN} deep (streams that wait for each other in a cycle never finish)"
        )));
    }
    let s = stream(handle);
    let mut since: Option<Instant> = None;
    let mut nap = Duration::from_micros(20);
    loop {
        let other = {
            let mut f = lock(&s);
            let ran = run_ready(&mut f, upto);
            if let Some(e) = &f.failed {
                return Err(e.clone());
            }
            if f.run() >= upto || f.entries.is_empty() {
                return Ok(());
            }
            if ran {
                since = None;
                nap = Duration::from_micros(20);
                continue;
            }
            match f.entries.front() {
                Some(Entry::After {
                    handle,
                    progress,
                    upto,
                }) => Some((*handle, Arc::clone(progress), *upto)),
                _ => None,
            }
        };
        // A wait for another stream: run that one (this one's lock released, as a GPU runs
        // both), then go on here. (A stream forgotten meanwhile never gets there: the wait
        // then runs into the time limit below.)
        if let Some((other, progress, at)) = other {
            run_chain(other, at, depth + 1)?;
            if progress.load(Ordering::Acquire) >= at {
                continue;
            }
        }
        let t0 = *since.get_or_insert_with(Instant::now);
        if t0.elapsed() > WAIT_LIMIT {
            return Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "host stand-in stream 0x{handle:x}: a wait on a completion flag or on \
                     another stream was not released within {} s",
                    WAIT_LIMIT.as_secs()
                ),
            ));
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(1));
    }
}

/// Runs what stand-in stream `handle` can run now before position `upto`, never waiting (a
/// wait for another stream of the process first runs that one as far as it can go now);
/// whether the stream got there. What other processes ask of this one's streams is served so,
/// by one thread that must not block on one stream while another could go on.
pub(crate) fn advance(handle: usize, upto: u64) -> bool {
    advance_chain(handle, upto, 0)
}

fn advance_chain(handle: usize, upto: u64, depth: usize) -> bool {
    if depth > MAX_CHAIN {
        return false;
    }
    let s = stream(handle);
    loop {
        let other = {
            let mut f = lock(&s);
            run_ready(&mut f, upto);
            if f.run() >= upto || f.entries.is_empty() {
                return true;
            }
            match f.entries.front() {
                Some(Entry::After { handle, upto, .. }) => Some((*handle, *upto)),
                _ => None,
            }
        };
        match other {
            Some((o, at)) if advance_chain(o, at, depth + 1) => continue,
            _ => return false,
        }
    }
}

/// Runs every entry queued on stand-in stream `handle` so far (a stream synchronize).
pub(crate) fn synchronize(handle: usize) -> Result<()> {
    if let Some(rec) = lock(&stream(handle)).capture.as_mut() {
        // As the driver: a synchronize of a stream being captured fails and invalidates it.
        rec.invalid.get_or_insert("a synchronize of the stream");
        return Err(Error::invalid_usage(format!(
            "host stand-in stream 0x{handle:x} is being captured into a graph: it cannot be \
             synchronized"
        )));
    }
    run_to(handle, record(handle))
}

/// Forgets stand-in stream `handle` (its owner dropped it); entries not yet run are dropped,
/// as a GPU drops a destroyed stream's state (a gate recorded on it then has nothing to wait for).
pub(crate) fn remove(handle: usize) {
    let mut streams = lock(&STREAMS);
    lock(&GONE).insert(handle);
    streams.remove(&handle);
}

/// Whether stand-in stream `handle` was forgotten ([`remove`]).
pub(crate) fn gone(handle: usize) -> bool {
    lock(&GONE).contains(&handle)
}

/// Entries of stand-in stream `handle` not yet run.
#[cfg(test)]
pub(crate) fn pending(handle: usize) -> usize {
    lock(&stream(handle)).entries.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_waits_hold_back_later_copies() {
        let h = 0xA11CE;
        let flag = Arc::new(AtomicU32::new(0));
        let src = [7u8; 4];
        let mut dst = [0u8; 4];
        let before = record(h);
        wait_flag(h, Arc::clone(&flag) as Arc<dyn Flag>, 2);
        // SAFETY: both arrays outlive the synchronize below.
        unsafe { copy(h, dst.as_mut_ptr(), src.as_ptr(), 4) };
        let after = record(h);
        assert_eq!(after, before + 2);
        run_to(h, before).unwrap();
        assert_eq!(pending(h), 2, "nothing before the first event");
        let f = Arc::clone(&flag);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            f.store(1, Ordering::Release);
            std::thread::sleep(Duration::from_millis(50));
            f.store(2, Ordering::Release);
        });
        let t0 = Instant::now();
        synchronize(h).unwrap();
        assert!(
            t0.elapsed() >= Duration::from_millis(90),
            "{:?}",
            t0.elapsed()
        );
        assert_eq!(dst, [7; 4], "the copy ran after the wait");
        assert_eq!(pending(h), 0);
        t.join().unwrap();
    }

    #[test]
    fn eager_streams_run_what_a_released_flag_unblocks_without_a_wait() {
        // Checked where the suite runs with FERRO_STANDIN_EAGER=1 (scripts/test.sh); the lazy
        // model is the test above.
        if !eager() {
            return;
        }
        let h = 0xEA9E2;
        let flag = Arc::new(AtomicU32::new(0));
        let src = Box::new([5u8; 8]);
        let dst = Box::new(std::sync::Mutex::new([0u8; 8]));
        let d = dst.lock().unwrap().as_mut_ptr();
        // SAFETY: both boxes outlive the stream's run of the copy (waited for below).
        unsafe { copy(h, d, src.as_ptr(), 4) };
        wait_flag(h, Arc::clone(&flag) as Arc<dyn Flag>, 1);
        // SAFETY: as above.
        unsafe { copy(h, d.wrapping_add(4), src.as_ptr(), 4) };
        assert_eq!(
            pending(h),
            2,
            "the copy before the wait ran as it was queued"
        );
        flag.store(1, Ordering::Release);
        let t0 = Instant::now();
        while pending(h) > 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "nothing ran the released stream"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(*dst.lock().unwrap(), [5; 8]);
        remove(h);
    }

    #[test]
    fn a_wait_for_another_stream_runs_that_stream_to_the_event_and_no_further() {
        if eager() {
            return; // the lazy model: what runs when
        }
        let (a, b) = (0x0A_0001, 0x0A_0002);
        let log = Arc::new(Mutex::new(Vec::new()));
        let job = |what: &'static str| -> Job {
            let log = Arc::clone(&log);
            Box::new(move || {
                lock(&log).push(what);
                Ok(())
            })
        };
        launch(a, job("a1"));
        let mark = record(a);
        launch(a, job("a2"));
        wait_for(b, a, mark);
        launch(b, job("b1"));
        assert!(lock(&log).is_empty(), "nothing runs until waited for");
        synchronize(b).unwrap();
        assert_eq!(*lock(&log), ["a1", "b1"], "b ran a to its event only");
        assert_eq!(pending(a), 1);
        synchronize(a).unwrap();
        assert_eq!(*lock(&log), ["a1", "b1", "a2"]);
        // A wait for an event of a stream that is gone waits for nothing.
        remove(a);
        wait_for(b, a, mark + 100);
        launch(b, job("b2"));
        synchronize(b).unwrap();
        assert_eq!(lock(&log).last(), Some(&"b2"));
        remove(b);
    }

    #[test]
    fn a_failed_job_is_the_streams_error_from_then_on() {
        let h = 0x0B_0001;
        launch(h, Box::new(|| Err(Error::internal("kernel fault"))));
        let ran = Arc::new(AtomicU32::new(0));
        let r = Arc::clone(&ran);
        launch(
            h,
            Box::new(move || {
                r.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }),
        );
        for _ in 0..2 {
            let e = synchronize(h).unwrap_err();
            assert!(e.to_string().contains("kernel fault"), "{e}");
        }
        assert_eq!(ran.load(Ordering::SeqCst), 1, "later entries still ran");
        remove(h);
    }

    #[test]
    fn streams_that_wait_for_each_other_in_a_cycle_are_an_error_not_a_hang() {
        if eager() {
            return;
        }
        let (a, b) = (0x0C_0001, 0x0C_0002);
        // Each waits for the other to get past its own wait.
        wait_for(a, b, 1);
        wait_for(b, a, 1);
        let e = synchronize(a).unwrap_err();
        assert!(e.to_string().contains("cycle"), "{e}");
        remove(a);
        remove(b);
    }

    #[test]
    fn releases_run_their_streams_when_host_code_waits() {
        if eager() {
            return;
        }
        let h = 0x0D_0001;
        let done = Arc::new(AtomicU32::new(0));
        let d = Arc::clone(&done);
        launch(
            h,
            Box::new(move || {
                d.store(1, Ordering::SeqCst);
                Ok(())
            }),
        );
        release_later(h);
        assert_eq!(done.load(Ordering::SeqCst), 0);
        assert!(run_releases());
        assert_eq!(done.load(Ordering::SeqCst), 1);
        remove(h);
    }

    #[test]
    fn comparison_wraps_like_the_driver() {
        assert!(reached(5, 5));
        assert!(reached(6, 5));
        assert!(!reached(4, 5));
        assert!(reached(1, u32::MAX), "1 comes after u32::MAX");
        assert!(!reached(u32::MAX, 1));
    }
}
