//! The stand-in's model of stream capture and graphs (`cuStreamBeginCapture`,
//! `cuStreamEndCapture`, `cuGraphLaunch`) and of host functions (`cuLaunchHostFunc`): copies
//! and host functions queued on a capturing stream are recorded, each launch queues them
//! again; what a graph cannot replay (a flag wait, a wait for another stream, a job that runs
//! once, a synchronize) invalidates the capture, as the driver's end then gives no graph.
//! What a capture is handed to keep (the model of a user object moved into the graph,
//! `cuGraphRetainUserObject`) is released once the graph and every launch of it queued so far
//! are gone, or when the capture ends invalidated.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use super::{kick, lock, stream, Entry, Fifo, STREAMS};
use crate::device::graph::Release;
use crate::{Error, Result};

/// What a capture or graph keeps for others: each [`Release`] runs when this drops.
#[derive(Default)]
pub(super) struct Kept(Vec<Release>);

impl Drop for Kept {
    fn drop(&mut self) {
        for release in self.0.drain(..) {
            release();
        }
    }
}

/// What a capture on a stand-in stream has recorded so far.
#[derive(Default)]
pub(super) struct Recording {
    steps: Vec<Step>,
    /// Something the model does not record was queued (a flag wait, a wait for another
    /// stream, a job that runs once): the capture ends with an error, as the driver's ends
    /// invalidated.
    pub(super) invalid: Option<&'static str>,
    /// What the graph will keep (released here where the capture ends invalidated).
    kept: Kept,
}

impl std::fmt::Debug for Recording {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Recording({} steps, invalid {:?})",
            self.steps.len(),
            self.invalid
        )
    }
}

/// Work a graph runs at each launch (a host function of a stand-in graph).
pub(crate) type Call = Arc<dyn Fn() -> Result<()> + Send + Sync>;

/// One step of a stand-in graph.
#[derive(Clone)]
enum Step {
    Copy { dst: usize, src: usize, len: usize },
    Call(Call),
}

/// A stand-in graph: the copies and host calls a capture recorded, in order; each launch
/// queues them on a stream again, with a hold on what the graph keeps.
#[derive(Clone, Default)]
pub(crate) struct Graph {
    steps: Vec<Step>,
    kept: Arc<Kept>,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Graph({} steps)", self.steps.len())
    }
}

impl Fifo {
    /// Queues `e`, or records it where a capture is open (what a graph cannot replay
    /// invalidates the capture).
    pub(super) fn push(&mut self, e: Entry) {
        let Some(rec) = self.capture.as_mut() else {
            self.entries.push_back(e);
            return;
        };
        match e {
            Entry::Copy { dst, src, len } => rec.steps.push(Step::Copy { dst, src, len }),
            Entry::WaitFlag { .. } => {
                rec.invalid.get_or_insert("a wait on a completion flag");
            }
            Entry::Run(_) => {
                rec.invalid.get_or_insert("a job that runs once (a kernel)");
            }
            Entry::After { .. } => {
                rec.invalid
                    .get_or_insert("a wait for another stream (an event)");
            }
        }
    }
}

/// The capture status of stand-in stream `handle`, as `cuStreamIsCapturing` gives it: 0 none,
/// 1 active, 2 invalidated.
pub(crate) fn capture_status(handle: usize) -> u32 {
    let fifo = lock(&STREAMS).get(&handle).map(Arc::clone);
    fifo.map_or(0, |f| match &lock(&f).capture {
        None => 0,
        Some(r) if r.invalid.is_some() => 2,
        Some(_) => 1,
    })
}

/// Queues `call` on stand-in stream `handle` (a host function: inside a capture, a step of
/// the graph, run at each launch).
pub(crate) fn call(handle: usize, call: Call) {
    let s = stream(handle);
    {
        let mut f = lock(&s);
        if let Some(rec) = f.capture.as_mut() {
            rec.steps.push(Step::Call(call));
            return;
        }
        f.entries.extend(host_fn(call));
    }
    kick(&s);
}

/// The entries that run `call` as the driver runs a host function: on a thread of its own,
/// the stream waiting until it returns (so the stream is not held meanwhile, and whoever
/// waits for an earlier point of it is not held up by the call).
fn host_fn(call: Call) -> [Entry; 2] {
    let done = Arc::new(AtomicU32::new(0));
    let d = Arc::clone(&done);
    let start = Entry::Run(Box::new(move || {
        std::thread::Builder::new()
            .name("ferroccl-standin-host-fn".into())
            .spawn(move || {
                if let Err(e) = call() {
                    ferroccl_transport::log_line!(
                        "ferroccl WARN DEVICE: a stand-in host function failed: {e}"
                    );
                }
                d.store(1, Ordering::Release);
            })
            .map(drop)
            .map_err(|e| Error::io("starting a stand-in host function's thread", &e))
    }));
    [
        start,
        Entry::WaitFlag {
            flag: done,
            value: 1,
        },
    ]
}

/// Begins a capture on stand-in stream `handle` (`cuStreamBeginCapture`).
pub(crate) fn begin_capture(handle: usize) -> Result<()> {
    let s = stream(handle);
    let mut f = lock(&s);
    if f.capture.is_some() {
        return Err(Error::invalid_usage(format!(
            "host stand-in stream 0x{handle:x} is already being captured"
        )));
    }
    f.capture = Some(Recording::default());
    Ok(())
}

/// Ends the capture on stand-in stream `handle` (`cuStreamEndCapture`): its graph, or why it
/// was invalidated.
pub(crate) fn end_capture(handle: usize) -> Result<Graph> {
    let s = stream(handle);
    let rec = lock(&s).capture.take().ok_or_else(|| {
        Error::invalid_usage(format!(
            "host stand-in stream 0x{handle:x} is not being captured"
        ))
    })?;
    match rec.invalid {
        Some(what) => Err(Error::invalid_usage(format!(
            "host stand-in stream 0x{handle:x}: the capture was invalidated by {what} queued \
             while it was open"
        ))),
        None => Ok(Graph {
            steps: rec.steps,
            kept: Arc::new(rec.kept),
        }),
    }
}

/// Queues the steps of `graph` on stand-in stream `handle` (`cuGraphLaunch`).
pub(crate) fn launch_graph(handle: usize, graph: &Graph) -> Result<()> {
    let s = stream(handle);
    {
        let mut f = lock(&s);
        if f.capture.is_some() {
            return Err(Error::invalid_usage(format!(
                "host stand-in stream 0x{handle:x}: a graph launched on a stream being captured"
            )));
        }
        for step in &graph.steps {
            match step {
                &Step::Copy { dst, src, len } => f.entries.push_back(Entry::Copy { dst, src, len }),
                Step::Call(c) => f.entries.extend(host_fn(Arc::clone(c))),
            }
        }
        // The launch holds what the graph keeps until the stream has run it.
        let kept = Arc::clone(&graph.kept);
        f.entries.push_back(Entry::Run(Box::new(move || {
            drop(kept);
            Ok(())
        })));
    }
    kick(&s);
    Ok(())
}

/// Hands `release` to the capture open on stand-in stream `handle` (the model of a user
/// object moved into the graph being captured): it runs once the graph and the launches
/// queued from it are gone, or at the capture's end where that was invalidated.
pub(crate) fn retain_in_capture(handle: usize, release: Release) -> Result<()> {
    let s = stream(handle);
    let mut f = lock(&s);
    let Some(rec) = f.capture.as_mut() else {
        drop(f);
        drop(release);
        return Err(Error::invalid_usage(format!(
            "host stand-in stream 0x{handle:x} is not being captured"
        )));
    };
    rec.kept.0.push(release);
    Ok(())
}
