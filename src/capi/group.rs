//! `ncclGroupStart` / `ncclGroupEnd`: a thread-local nesting depth and the operations queued
//! while it is above zero. A call outside any group is a group of one operation.
//!
//! At the outermost `ncclGroupEnd` the queued operations run, per communicator: collectives
//! and splits in issue order, then all sends and receives at once. Communicators run at the
//! same time, each on its own thread, so one thread may drive several communicators of one
//! process (the `ncclCommInitAll` pattern) without deadlock. Non-blocking communicators get
//! their work queued on their background thread and the call returns `ncclInProgress`.
//!
//! Work with a non-NULL stream on a blocking communicator (every operation of its batch on a
//! stream) becomes one job of the communicator's stream queue instead (`device::stream_queue`): the
//! call, or the outermost `ncclGroupEnd`, returns without waiting for it. Other work on a
//! communicator waits until its stream queue is empty, then runs as above.

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::comm::Shared;
use super::ops::{coll_layout, validate, Layout, Op};
use super::run::execute;
use super::stream::OnStream;
use super::types::*;
use crate::device::gate::Gate;
use crate::device::stream_queue::{async_supported, record_gates, Work};
use crate::device::Device;
use crate::{Error, Result};

#[derive(Debug, Default)]
struct Pending {
    depth: usize,
    /// The first argument error of a call inside the group: the group then runs nothing.
    error: Option<Error>,
    batches: Vec<(Arc<Shared>, Vec<Op>)>,
}

thread_local! {
    static GROUP: RefCell<Pending> = RefCell::new(Pending::default());
}

/// `ncclGroupStart`.
pub(crate) fn start() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

/// Whether this thread is inside a group.
pub(crate) fn in_group() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

/// Notes a failed call: inside a group, the group will fail too (as in NCCL).
pub(crate) fn note_error(e: &Error) {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.error.get_or_insert_with(|| e.clone());
        }
    });
}

/// Makes the group's end wait for `shared` (a communicator initialized inside the group).
pub(crate) fn touch(shared: &Arc<Shared>) {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if !g.batches.iter().any(|(s, _)| Arc::ptr_eq(s, shared)) {
            g.batches.push((Arc::clone(shared), Vec::new()));
        }
    });
}

/// Issues `op` on `shared`: queued inside a group, run now outside one. Arguments are checked
/// now when the communicator is ready, else when the operation runs.
pub(crate) fn issue(api: &str, shared: &Arc<Shared>, op: Op) -> Result<ncclResult_t> {
    if shared.finalized.load(Ordering::SeqCst) {
        return Err(Error::invalid_usage(format!(
            "{api}: the communicator was finalized (ncclCommFinalize); only \
             ncclCommDestroy is allowed now"
        )));
    }
    if shared.revoked.load(Ordering::SeqCst) {
        return Err(Error::invalid_usage(format!(
            "{api}: the communicator was revoked (ncclCommRevoke); only ncclCommDestroy, \
             ncclCommAbort and ncclCommShrink are allowed now"
        )));
    }
    if shared.suspended.load(Ordering::SeqCst) {
        return Err(Error::invalid_usage(format!(
            "{api}: the communicator is suspended (ncclCommSuspend); call ncclCommResume first"
        )));
    }
    if let Some(e) = shared.streams.failed() {
        return Err(e.context(format!(
            "{api}: an earlier operation queued on a stream of this communicator failed"
        )));
    }
    if let Some(ready) = shared.try_ready() {
        let comm = ready?;
        validate(&op, comm.rank(), comm.nranks())?;
    }
    let queued = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Some(op);
        }
        match g.batches.iter_mut().find(|(s, _)| Arc::ptr_eq(s, shared)) {
            Some((_, ops)) => ops.push(op),
            None => g.batches.push((Arc::clone(shared), vec![op])),
        }
        None
    });
    match queued {
        Some(op) => run(vec![(Arc::clone(shared), vec![op])]),
        None => Ok(ncclSuccess),
    }
}

/// `ncclGroupEnd`.
pub(crate) fn end() -> Result<ncclResult_t> {
    let taken = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Error::invalid_usage(
                "ncclGroupEnd: not inside a group (no matching ncclGroupStart)",
            ));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(None);
        }
        Ok(Some((g.error.take(), std::mem::take(&mut g.batches))))
    })?;
    match taken {
        None => Ok(ncclSuccess),
        Some((Some(e), _)) => Err(e.context(
            "ncclGroupEnd: a call inside the group failed, so the group's operations were not run",
        )),
        Some((None, batches)) => run(batches),
    }
}

/// The queued work of one communicator: the communicator and its operations.
pub(crate) type Batch = (Arc<Shared>, Vec<Op>);

/// `ncclGroupSimulateEnd`: ends the group like `ncclGroupEnd` but hands the queued operations
/// back instead of running them (`None` below the outermost level).
pub(crate) fn end_without_running() -> Result<Option<Vec<Batch>>> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Error::invalid_usage(
                "ncclGroupSimulateEnd: not inside a group (no matching ncclGroupStart)",
            ));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(None);
        }
        if let Some(e) = g.error.take() {
            g.batches.clear();
            return Err(e.context(
                "ncclGroupSimulateEnd: a call inside the group failed, so nothing was simulated",
            ));
        }
        Ok(Some(std::mem::take(&mut g.batches)))
    })
}

/// Runs the batches of one group; see the module docs.
fn run(batches: Vec<(Arc<Shared>, Vec<Op>)>) -> Result<ncclResult_t> {
    let mut in_progress = false;
    let mut blocking = Vec::new();
    let mut stream_jobs = Vec::new();
    for (shared, ops) in batches {
        if shared.blocking {
            match stream_job(&shared, ops)? {
                Ok(job) => stream_jobs.push((shared, job)),
                Err(ops) => blocking.push((shared, ops)),
            }
            continue;
        }
        in_progress = true;
        if ops.is_empty() {
            continue;
        }
        let s = Arc::clone(&shared);
        shared.submit(move || {
            if let Err(e) = s.wait_ready().and_then(|c| execute(&c, ops)) {
                s.record_async(e);
            }
        })?;
    }
    // Every gate of the group is recorded before any wait is queued: communicators of the
    // group that share a stream must not wait for each other's jobs.
    for (shared, job) in stream_jobs {
        shared
            .streams
            .enqueue(job.device, &job.streams, job.gates, job.work)?;
    }
    let results: Vec<Result<()>> = if blocking.len() == 1 {
        blocking.into_iter().map(run_blocking).collect()
    } else {
        std::thread::scope(|scope| {
            let handles: Vec<_> = blocking
                .into_iter()
                .map(|b| {
                    std::thread::Builder::new()
                        .name("ferroccl-group".into())
                        .spawn_scoped(scope, move || run_blocking(b))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| match h {
                    Err(e) => Err(Error::io("ncclGroupEnd: starting a thread", &e)),
                    Ok(h) => h.join().unwrap_or_else(|_| {
                        Err(Error::internal(
                            "ncclGroupEnd: a communicator's thread panicked",
                        ))
                    }),
                })
                .collect()
        })
    };
    for r in results {
        r?;
    }
    Ok(if in_progress {
        ncclInProgress
    } else {
        ncclSuccess
    })
}

fn run_blocking((shared, ops): (Arc<Shared>, Vec<Op>)) -> Result<()> {
    let comm = shared.wait_ready()?;
    if ops.is_empty() {
        return Ok(());
    }
    // Stream jobs issued before this work come first.
    shared.streams.drain();
    execute(&comm, ops)
}

/// The stream of `op`, if it has one (`None`: host buffers, or a split).
fn stream_of(op: &Op) -> Option<OnStream> {
    match op {
        Op::Coll { on, .. } | Op::Rooted { on, .. } | Op::Send { on, .. } | Op::Recv { on, .. } => {
            *on
        }
        Op::Split { .. } => None,
    }
}

/// The most bytes any collective of `ops` stages in and out (gathers, scatters, sends and
/// receives use host copies of their own); layouts that do not check count nothing.
fn staged_bytes(ops: &[Op], rank: usize, nranks: usize) -> (usize, usize) {
    let (mut input, mut output) = (0, 0);
    for op in ops {
        if let Op::Coll {
            api,
            kind,
            send,
            recv,
            count,
            dtype,
            ..
        } = *op
        {
            let (i, o) = match coll_layout(api, kind, send, recv, count, dtype, rank, nranks) {
                Ok(Layout::InPlace { len, .. }) => (0, len),
                Ok(Layout::Apart {
                    send_len, recv_len, ..
                }) => (send_len, recv_len),
                Ok(Layout::Empty) | Err(_) => (0, 0),
            };
            input = input.max(i);
            output = output.max(o);
        }
    }
    (input, output)
}

/// A batch of one communicator that will run as one stream job.
struct StreamJob {
    device: Device,
    streams: Vec<usize>,
    gates: Vec<Gate>,
    work: Work,
}

/// The batch `ops` of blocking communicator `shared` as a stream job, its gates recorded, when
/// every operation has a stream and the device can wait on a flag; else the batch back, to
/// run now.
fn stream_job(
    shared: &Arc<Shared>,
    mut ops: Vec<Op>,
) -> Result<std::result::Result<StreamJob, Vec<Op>>> {
    let Some(first) = ops.first().and_then(stream_of) else {
        return Ok(Err(ops));
    };
    if !ops.iter().all(|op| stream_of(op).is_some()) || !async_supported(first.device) {
        return Ok(Err(ops));
    }
    let mut streams: Vec<usize> = Vec::new();
    for op in &mut ops {
        if let Op::Coll { on: Some(on), .. }
        | Op::Rooted { on: Some(on), .. }
        | Op::Send { on: Some(on), .. }
        | Op::Recv { on: Some(on), .. } = op
        {
            // The job waits for the stream's earlier work (its gate) before it runs.
            on.waited = true;
            if !streams.contains(&on.stream) {
                streams.push(on.stream);
            }
        }
    }
    // What the job's staged calls need is made here, on the caller's thread (see
    // `Communicator::prepare_stream_job`); a communicator still initialising prepares in
    // its job.
    if let Some(Ok(comm)) = shared.try_ready() {
        let (input, output) = staged_bytes(&ops, comm.rank(), comm.nranks());
        comm.prepare_stream_job(first.device, input, output)?;
    }
    let gates = record_gates(first.device, &streams)?;
    let s = Arc::clone(shared);
    let work: Work = Box::new(move || {
        let comm = s.wait_ready()?;
        let rank = comm.rank();
        execute(&comm, ops).map_err(|e| {
            e.append(format!(
                "rank {rank}; the operation was queued on a stream and ran after the call \
                 returned"
            ))
        })
    });
    Ok(Ok(StreamJob {
        device: first.device,
        streams,
        gates,
        work,
    }))
}
