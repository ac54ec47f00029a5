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
//! stream) becomes one job of the communicator's stream queue instead (`device::stream_queue`),
//! or, where the batch has its stream to itself and holds a long collective or a long
//! message, jobs slice by slice and round by round (`slices`): the call, or the outermost
//! `ncclGroupEnd`, returns without waiting for them. A batch over several streams runs after
//! the earlier work of all of them, and their later work after it ([`join`]), as NCCL orders a
//! group over several streams.
//! Other work on a communicator waits until its stream queue is empty, then runs as above.

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::capture;
use super::comm::Shared;
use super::ops::{
    coll_layout, p2p_spans, refuse_overlaps, rooted_layout, validate, Layout, Op, Reduction,
};
use super::run::execute;
use super::slices::{self, Pieces};
use super::stream::OnStream;
use super::types::*;
use crate::device::gate::Gate;
use crate::device::stream_queue::{landing, orders_call, record_gates, Work};
use crate::device::stream_stage::{arena_bytes, Span, Staged};
use crate::device::Device;
use crate::{Communicator, Error, Result};

#[derive(Debug, Default)]
struct Pending {
    depth: usize,
    /// The first argument error of a call inside the group: the group then runs nothing.
    error: Option<Error>,
    batches: Vec<(Arc<Shared>, Vec<Op>)>,
    /// Communicators that were given operations while still initializing (their arguments
    /// are checked when the group runs them).
    unchecked: Vec<Arc<Shared>>,
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
    let checked = match shared.try_ready() {
        Some(ready) => {
            let comm = ready?;
            validate(&op, comm.rank(), comm.nranks())?;
            true
        }
        None => false,
    };
    let queued = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Some(op);
        }
        if !checked && !g.unchecked.iter().any(|s| Arc::ptr_eq(s, shared)) {
            g.unchecked.push(Arc::clone(shared));
        }
        match g.batches.iter_mut().find(|(s, _)| Arc::ptr_eq(s, shared)) {
            Some((_, ops)) => ops.push(op),
            None => g.batches.push((Arc::clone(shared), vec![op])),
        }
        None
    });
    match queued {
        Some(op) => {
            let unchecked = if checked {
                vec![]
            } else {
                vec![Arc::clone(shared)]
            };
            run(vec![(Arc::clone(shared), vec![op])], &unchecked)
        }
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
        let unchecked = std::mem::take(&mut g.unchecked);
        Ok(Some((
            g.error.take(),
            std::mem::take(&mut g.batches),
            unchecked,
        )))
    })?;
    match taken {
        None => Ok(ncclSuccess),
        Some((Some(e), _, _)) => Err(e.context(
            "ncclGroupEnd: a call inside the group failed, so the group's operations were not run",
        )),
        Some((None, batches, unchecked)) => run(batches, &unchecked),
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
        g.unchecked.clear();
        if let Some(e) = g.error.take() {
            g.batches.clear();
            return Err(e.context(
                "ncclGroupSimulateEnd: a call inside the group failed, so nothing was simulated",
            ));
        }
        Ok(Some(std::mem::take(&mut g.batches)))
    })
}

/// Runs the batches of one group; see the module docs. The operations of the communicators in
/// `unchecked` were issued before they were ready, so their arguments were not checked yet.
fn run(batches: Vec<(Arc<Shared>, Vec<Op>)>, unchecked: &[Arc<Shared>]) -> Result<ncclResult_t> {
    let mut in_progress = false;
    let mut blocking = Vec::new();
    let mut stream_jobs = Vec::new();
    // Which batches of blocking communicators can run as stream jobs. If one with streams
    // cannot (too large, p2p connections), none does: a blocking batch waits for its streams,
    // and a job queued there by this group may need a peer that blocks in turn on a job of its
    // own (the choice depends on sizes, so it can differ from rank to rank).
    let streams: Vec<Vec<usize>> = batches
        .iter()
        .map(|(_, ops)| distinct_streams(ops))
        .collect();
    let mut plans = Vec::with_capacity(batches.len());
    for (i, (shared, ops)) in batches.iter().enumerate() {
        let checked = !unchecked.iter().any(|s| Arc::ptr_eq(s, shared));
        let plan = if let Some(rec) = capture::plan(shared, ops, checked)? {
            // Blocking or not: a call recorded into a graph returns once recorded, and a
            // non-blocking communicator's is not left in progress.
            Plan::Capture(rec)
        } else if shared.blocking {
            plan_job(shared, ops, checked, alone(&streams, i))?
        } else {
            Plan::Host
        };
        plans.push(plan);
    }
    all_or_none(&mut plans);
    // Arenas of recorded calls whose graphs are gone are freed by calls not recorded (none
    // is freed while this thread records one).
    if !plans.iter().any(|p| matches!(p, Plan::Capture(_))) {
        for (shared, _) in &batches {
            shared.streams.free_spare_arenas();
        }
    }
    // A part over several streams is joined with all of them before anything of the group is
    // staged (and after its copies back, below).
    let joins = joined(&batches, &plans, &streams);
    for (shared, device, streams) in &joins {
        join(shared, *device, streams)?;
    }
    for ((shared, ops), plan) in batches.into_iter().zip(plans) {
        // Whether the operations were checked when issued (then not again when run).
        let checked = !unchecked.iter().any(|s| Arc::ptr_eq(s, &shared));
        // Only blocking communicators plan jobs, pieces or blocks; any recorded into a graph.
        match plan {
            Plan::Capture(rec) => capture::record(&shared, ops, rec)?,
            Plan::Job(device, spans) => {
                let job = stream_job(&shared, ops, device, spans)?;
                stream_jobs.push((shared, job));
            }
            Plan::Pieces(p) => slices::queue_pieces(&shared, p)?,
            Plan::Block => blocking.push((shared, ops, checked)),
            Plan::Host if shared.blocking => blocking.push((shared, ops, checked)),
            Plan::Host => {
                in_progress = true;
                if ops.is_empty() {
                    continue;
                }
                let s = Arc::clone(&shared);
                shared.submit(move || {
                    if let Err(e) = s.wait_ready().and_then(|c| execute(&c, ops, checked)) {
                        s.record_async(e);
                    }
                })?;
            }
        }
    }
    // Every gate of the group is recorded before any wait is queued: communicators of the
    // group that share a stream must not wait for each other's jobs.
    for (shared, job) in stream_jobs {
        // The job's after-step waits for its copies back, so that a drained queue (destroy,
        // finalize, a NULL-stream call) has its results in device memory.
        let (landed, after) = landing(());
        shared
            .streams
            .enqueue(job.device, &job.streams, job.gates, job.work, Some(after))?;
        let mut gates = Vec::with_capacity(job.staged.len());
        for (stream, st) in &job.staged {
            // SAFETY: the ranges are the call's device memory until the stream has run past
            // them (NCCL's contract); the arenas live until the queue drops.
            gates.push(unsafe { shared.streams.copy_back(job.device, *stream, st) }?);
        }
        let _ = landed.send(gates);
    }
    for (shared, device, streams) in joins {
        // The part is queued: a stream left unjoined would run ahead of it, so the
        // communicator fails rather than let it.
        if let Err(e) = join(&shared, device, &streams) {
            shared.wait_ready()?.fail_with(e.clone());
            return Err(e);
        }
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

fn run_blocking((shared, ops, checked): (Arc<Shared>, Vec<Op>, bool)) -> Result<()> {
    let comm = shared.wait_ready()?;
    if ops.is_empty() {
        return Ok(());
    }
    // Stream jobs issued before this work come first.
    shared.streams.drain();
    execute(&comm, ops, checked)
}

/// The batches queued as stream jobs ([`Plan::Job`], [`Plan::Pieces`]) whose operations use
/// several streams (`streams`, per batch): each communicator with its device and those streams.
fn joined(
    batches: &[(Arc<Shared>, Vec<Op>)],
    plans: &[Plan],
    streams: &[Vec<usize>],
) -> Vec<(Arc<Shared>, Device, Vec<usize>)> {
    let mut joins = Vec::new();
    for (((shared, ops), plan), streams) in batches.iter().zip(plans).zip(streams) {
        if streams.len() < 2 || !matches!(plan, Plan::Job(..) | Plan::Pieces(..)) {
            continue;
        }
        if let Some(first) = ops.iter().find_map(stream_of) {
            joins.push((Arc::clone(shared), first.device, streams.clone()));
        }
    }
    joins
}

/// The streams of `ops`, each once, in the order they first appear.
fn distinct_streams(ops: &[Op]) -> Vec<usize> {
    let mut streams: Vec<usize> = Vec::new();
    for on in ops.iter().filter_map(stream_of) {
        if !streams.contains(&on.stream) {
            streams.push(on.stream);
        }
    }
    streams
}

/// NCCL orders a group over several streams as if it were queued on each of them: after the
/// earlier work of all, before the later work of all. A communicator's part stages each
/// operation on its own stream (one job) or queues its pieces on the first stream
/// ([`slices::pieces`]); queued before the part and again after its copies back, a job that
/// runs nothing, gated on every one of `streams` and waited for by every one, makes each of
/// them wait for the others. It waits only for work queued before it, so it never waits for a
/// peer.
fn join(shared: &Shared, device: Device, streams: &[usize]) -> Result<()> {
    let gates = record_gates(device, streams)?;
    shared
        .streams
        .enqueue(device, streams, gates, Box::new(|| Ok(())), None)
}

/// Whether batch `i` of a group uses no stream of another batch, given each batch's streams:
/// then it may be queued slice by slice and round by round, each job gated and waited for in
/// turn, without a wait of its own holding up another batch's gate (see [`run`]).
fn alone(streams: &[Vec<usize>], i: usize) -> bool {
    streams
        .iter()
        .enumerate()
        .all(|(j, theirs)| j == i || !theirs.iter().any(|s| streams[i].contains(s)))
}

/// The stream of `op`, if it has one (`None`: host buffers, or a split).
pub(super) fn stream_of(op: &Op) -> Option<OnStream> {
    match op {
        Op::Coll { on, .. } | Op::Rooted { on, .. } | Op::Send { on, .. } | Op::Recv { on, .. } => {
            *on
        }
        Op::Split { .. } => None,
    }
}

/// How a batch runs.
enum Plan {
    /// Not a blocking communicator's, or no operation with a stream: as before.
    Host,
    /// With streams, blocking: the streams are synchronized first.
    Block,
    /// As one stream job on the device: per stream, the device ranges to stage.
    Job(Device, Vec<(usize, Vec<Span>)>),
    /// The batch holds collectives, gathers, scatters, sends and receives on one stream that
    /// no other batch of the group uses, and a collective cut into slices or a message longer
    /// than a piece: stream jobs slice by slice and round by round (`slices::pieces`).
    Pieces(Pieces),
    /// On a stream being captured into a CUDA graph: recorded (`capture`).
    Capture(capture::Recorded),
}

/// If one batch with streams blocks, every one does (see [`run`]).
fn all_or_none(plans: &mut [Plan]) {
    if plans.iter().any(|p| matches!(p, Plan::Block)) {
        for p in plans {
            if matches!(p, Plan::Job(..) | Plan::Pieces(..)) {
                *p = Plan::Block;
            }
        }
    }
}

/// Whether the batch `ops` of blocking communicator `shared` can run as one stream job: every
/// operation has a stream, the device can wait on a flag, and the ranges fit the arenas
/// ([`orders_call`]); with the ranges to stage per stream. `checked`: the operations'
/// arguments were checked when they were issued. `alone`: no other batch of the group uses
/// its streams, so it may run as jobs slice by slice and round by round ([`Plan::Pieces`]);
/// batches sharing a stream must record every gate before any wait (see [`run`]).
fn plan_job(shared: &Shared, ops: &[Op], checked: bool, alone: bool) -> Result<Plan> {
    let Some(first) = ops.iter().find_map(stream_of) else {
        return Ok(Plan::Host);
    };
    let comm = shared.wait_ready()?;
    if comm.device() != Some(first.device) {
        comm.set_device(first.device)?;
    }
    let streams = distinct_streams(ops);
    // Collectives that may go straight between the ranks' buffers in stream order run as
    // the blocking form runs them (`stream::run_coll`), which queues them on their streams.
    if !ops.iter().all(|op| stream_of(op).is_some())
        || !comm.stream_jobs_supported(first.device, &streams)
        || streams
            .iter()
            .any(|&s| comm.orders_between_buffers(first.device, s))
    {
        return Ok(Plan::Block);
    }
    if alone {
        if let Some(p) = slices::pieces(&comm, first.device, &streams, ops, checked)? {
            if !orders_call(first.device, p.arena_bytes()) {
                return Ok(Plan::Block);
            }
            return Ok(Plan::Pieces(p));
        }
    }
    // A job runs its staged collectives on the arena's copies of whole buffers, where a
    // blocked layout cut into slices has no contiguous slice to run on: such a group blocks
    // (the blocking form cuts it as every path does).
    let cut_blocks = ops.iter().any(|op| match *op {
        Op::Coll {
            kind, count, dtype, ..
        } => !kind.is_elementwise() && comm.device_cut(kind, count, dtype.size()).slices > 1,
        _ => false,
    });
    if cut_blocks {
        return Ok(Plan::Block);
    }
    let by_stream = stream_spans(shared, first.device, ops, checked)?;
    if !orders_call(
        first.device,
        by_stream.iter().map(|(_, s)| arena_bytes(s)).sum(),
    ) {
        return Ok(Plan::Block);
    }
    Ok(Plan::Job(first.device, by_stream))
}

/// The device ranges of `ops` (every one made with a stream), per stream.
pub(super) fn stream_spans(
    shared: &Shared,
    device: Device,
    ops: &[Op],
    checked: bool,
) -> Result<Vec<(usize, Vec<Span>)>> {
    let comm = shared.wait_ready()?;
    let (rank, nranks) = (comm.rank(), comm.nranks());
    // Operations issued while the communicator was still initializing (ncclCommInitRank
    // inside the group) could not be checked then; their buffers must be device memory of
    // `device` before any copy is queued.
    if !checked {
        for op in ops.iter() {
            validate(op, rank, nranks)?;
        }
    }
    // A receive overlapping another buffer of the group would be staged twice and copied
    // back in an order nobody chose: refused, as on every path.
    refuse_overlaps("device buffers", &p2p_spans(ops))?;
    let span = |addr: *const u8, len: usize, read: bool, written: bool| Span {
        addr: addr as u64,
        len,
        read,
        written,
    };
    // Per stream, the ranges of its operations.
    let mut by_stream: Vec<(usize, Vec<Span>)> = Vec::new();
    for op in ops.iter() {
        let Some(on) = stream_of(op) else { continue };
        let mut spans = Vec::new();
        match *op {
            Op::Coll {
                api,
                kind,
                send,
                recv,
                count,
                dtype,
                red,
                ..
            } => {
                match coll_layout(api, kind, send, recv, count, dtype, rank, nranks)? {
                    Layout::Empty => {}
                    Layout::InPlace { buf, len } => spans.push(span(buf, len, true, true)),
                    Layout::Apart {
                        send,
                        send_len,
                        recv,
                        recv_len,
                    } => {
                        spans.push(span(send, send_len, true, false));
                        spans.push(span(recv, recv_len, false, true));
                    }
                }
                if let Reduction::ScalarAt(p, d) = red {
                    if device.find(p as u64, d.size()) == Some(device.ordinal()) {
                        spans.push(span(p, d.size(), true, false));
                    }
                }
            }
            Op::Rooted {
                api,
                which,
                root,
                send,
                recv,
                count,
                dtype,
                ..
            } => {
                let (send, send_len, recv, recv_len, ..) =
                    rooted_layout(api, which, root, send, recv, count, dtype, rank, nranks)?;
                spans.push(span(send, send_len, true, false));
                // Read too: the root's own block may already be there (in place).
                spans.push(span(recv, recv_len, true, true));
            }
            Op::Send {
                buf, count, dtype, ..
            } => {
                spans.push(span(buf, count * dtype.size(), true, false));
            }
            Op::Recv {
                buf, count, dtype, ..
            } => {
                spans.push(span(buf, count * dtype.size(), false, true));
            }
            Op::Split { .. } => {}
        }
        match by_stream.iter_mut().find(|(s, _)| *s == on.stream) {
            Some((_, v)) => v.extend(spans),
            None => by_stream.push((on.stream, spans)),
        }
    }
    Ok(by_stream)
}

/// Each stream's placement, and the indexes of the collectives staged.
type StagedOps = (Vec<(usize, Staged)>, Vec<usize>);

/// Stages `by_stream`, the device ranges of `ops` ([`stream_spans`]), in the arenas of their
/// streams, queues the copies in, and rewrites the operations to run on the host copies
/// (`on: None`). Returns each stream's placement, whose copies back are queued once the job's
/// flag waits are, and the indexes of the collectives rewritten (cut into slices when the
/// job runs: [`slice_colls`]).
fn stage_ops(
    shared: &Shared,
    device: Device,
    ops: &mut [Op],
    by_stream: Vec<(usize, Vec<Span>)>,
) -> Result<StagedOps> {
    let mut staged = Vec::with_capacity(by_stream.len());
    for (stream, spans) in by_stream {
        // SAFETY: every range was checked as live memory of `device` when its call was made
        // (`validate`), and NCCL's contract keeps it the operation's until the stream has run
        // past it; `stream` is the caller's stream of that device.
        let st = unsafe { shared.streams.stage(device, stream, &spans) }?;
        staged.push((stream, st));
    }
    let colls = point_at_arenas(ops, &staged);
    Ok((staged, colls))
}

/// Rewrites `ops` to run on the host copies `staged` holds of their device ranges (`on:
/// None`); returns the indexes of the collectives rewritten.
pub(super) fn point_at_arenas(ops: &mut [Op], staged: &[(usize, Staged)]) -> Vec<usize> {
    let host = |stream: usize, p: *const u8| -> *const u8 {
        staged
            .iter()
            .find(|(s, _)| *s == stream)
            .and_then(|(_, st)| st.host_of(p as u64))
            .map_or(p, |h| h as *const u8)
    };
    let mut colls = Vec::new();
    for (i, op) in ops.iter_mut().enumerate() {
        match op {
            Op::Coll {
                send,
                recv,
                red,
                on,
                ..
            } => {
                let Some(o) = on.take() else { continue };
                colls.push(i);
                *send = host(o.stream, *send);
                *recv = host(o.stream, *recv).cast_mut();
                if let Reduction::ScalarAt(p, _) = red {
                    *p = host(o.stream, *p);
                }
            }
            Op::Rooted { send, recv, on, .. } => {
                let Some(o) = on.take() else { continue };
                *send = host(o.stream, *send);
                *recv = host(o.stream, *recv).cast_mut();
            }
            Op::Send { buf, on, .. } => {
                if let Some(o) = on.take() {
                    *buf = host(o.stream, *buf);
                }
            }
            Op::Recv { buf, on, .. } => {
                if let Some(o) = on.take() {
                    *buf = host(o.stream, *buf).cast_mut();
                }
            }
            Op::Split { .. } => {}
        }
    }
    colls
}

/// `ops` with each collective at an index of `colls` (device collectives staged for a stream
/// job) cut into the slices the blocking form cuts a device collective into
/// ([`Communicator::device_cut`]), so that a rank whose call blocks and one whose call is
/// a stream job exchange the same messages.
pub(super) fn slice_colls(comm: &Communicator, ops: Vec<Op>, colls: &[usize]) -> Vec<Op> {
    let mut out = Vec::with_capacity(ops.len());
    for (i, op) in ops.into_iter().enumerate() {
        match op {
            Op::Coll {
                api,
                kind,
                send,
                recv,
                count,
                dtype,
                red,
                on: None,
            } if colls.contains(&i) && kind.is_elementwise() => {
                let cut = comm.device_cut(kind, count, dtype.size());
                for k in 0..cut.slices {
                    let r = cut.range(k);
                    let off = r.start * dtype.size();
                    // Element-wise collectives' buffers all hold `count` elements, so a slice
                    // is the same range of each; an unused (NULL) buffer stays NULL.
                    let send = if send.is_null() {
                        send
                    } else {
                        send.wrapping_add(off)
                    };
                    let recv = if recv.is_null() {
                        recv
                    } else {
                        recv.wrapping_add(off)
                    };
                    out.push(Op::Coll {
                        api,
                        kind,
                        send,
                        recv,
                        count: r.len(),
                        dtype,
                        red,
                        on: None,
                    });
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// The NCCL names of `ops`' calls, each once ("ncclAllReduce, ncclSend").
pub(super) fn op_names(ops: &[Op]) -> String {
    let mut names: Vec<&str> = Vec::new();
    for op in ops {
        let name = match op {
            Op::Coll { api, .. } | Op::Rooted { api, .. } => api,
            Op::Send { .. } => "ncclSend",
            Op::Recv { .. } => "ncclRecv",
            Op::Split { .. } => continue,
        };
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names.join(", ")
}

/// A batch of one communicator that will run as one stream job.
struct StreamJob {
    device: Device,
    streams: Vec<usize>,
    gates: Vec<Gate>,
    work: Work,
    /// Per stream, where its device ranges were staged (copied back after the flag wait).
    staged: Vec<(usize, Staged)>,
}

/// The batch `ops` of blocking communicator `shared` as a stream job on `device`, its gates
/// recorded, with `by_stream` the ranges [`plan_job`] found to stage.
fn stream_job(
    shared: &Arc<Shared>,
    mut ops: Vec<Op>,
    device: Device,
    by_stream: Vec<(usize, Vec<Span>)>,
) -> Result<StreamJob> {
    let streams: Vec<usize> = by_stream.iter().map(|(s, _)| *s).collect();
    // The device ranges go through pinned arenas, copied on the caller's streams (see
    // `device::stream_stage`): the job then runs host operations and calls no driver.
    let (staged, colls) = stage_ops(shared, device, &mut ops, by_stream)?;
    let gates = record_gates(device, &streams)?;
    // The calls by their NCCL names, for the job's error (its operations now look like host
    // calls, which name ferroccl's operation only).
    let names = op_names(&ops);
    let s = Arc::clone(shared);
    let work: Work = Box::new(move || {
        let comm = s.wait_ready()?;
        let rank = comm.rank();
        let ops = slice_colls(&comm, ops, &colls);
        // Checked before the job was made (`plan_job`).
        execute(&comm, ops, true).map_err(|e| {
            e.context(&names).append(format!(
                "rank {rank}; the operation was queued on a stream and ran after the call \
                 returned"
            ))
        })
    });
    Ok(StreamJob {
        device,
        streams,
        gates,
        work,
        staged,
    })
}

#[cfg(test)]
mod tests;
