//! A communicator's part of a group on one stream, queued piece by piece. Its collectives
//! (`ncclAllReduce`, `ncclBroadcast`, `ncclReduce`, `ncclAllGather`, `ncclReduceScatter`,
//! `ncclAlltoAll`, each with a built-in operation or a pre-multiplied sum whose scalar is
//! known), gathers and scatters go one after another, in issue order: a collective slice by
//! slice, as the Rust API's stream calls do (`comm::stream_slices`), so that its copies in and
//! back overlap the transfers of the other slices and the pinned arena holds the slices in
//! flight, not the call; a gather or scatter as the agreement on its root, then its blocks in
//! rounds. Its `ncclSend`s and `ncclRecv`s then go in rounds, round `k` moving piece `k` of
//! every message, as the Rust API's stream groups do (`comm::stream_rounds`). That is the
//! order in which the blocking form runs the same operations (`run::execute`).
//!
//! The part must have its streams to itself in the group (communicators of one process on
//! their own GPUs and streams, the `ncclCommInitAll` pattern, qualify; communicators sharing
//! a stream do not), and something must be cut: a collective into several slices or a
//! message into several pieces (or the part is one collective, queued as any call is).
//! Otherwise, and for parts with splits or a scalar read when the call runs, the part stays
//! one job (`group`): one job is one round trip, not one per call. A part over several
//! streams is queued on the first of them, which `group` joins with the others before and
//! after it (NCCL orders a group as if it were queued on each of its streams).

use std::sync::Arc;

use super::comm::Shared;
use super::ops::{
    coll_layout, p2p_spans, refuse_overlaps, rooted_layout, validate, Layout, Op, Reduction, Rooted,
};
use super::run::{execute, header_kind, rooted_ops};
use crate::coll::CollKind;
use crate::comm::{P2pRounds, PieceOp, RoundContext, SliceJob, Sliced};
use crate::device::stream_queue::Work;
use crate::device::Device;
use crate::{Communicator, DataType, Error, ReduceOp, Result};

/// One collective of a batch, cut into slices.
struct Lone {
    call: Sliced,
    api: &'static str,
    kind: CollKind,
    dtype: DataType,
    op: ReduceOp,
}

/// What [`one`] makes of an operation.
enum One {
    Cut(Lone),
    /// A collective of no element.
    Empty,
    /// Not one that is cut here.
    Not,
}

/// `op` as a [`Lone`] collective on one of `streams` of `device`, queued on the first, where
/// it is one: a collective there with a reduction known now.
fn one(
    comm: &Communicator,
    device: Device,
    streams: &[usize],
    op: &Op,
    checked: bool,
) -> Result<One> {
    let Op::Coll {
        api,
        kind,
        send,
        recv,
        count,
        dtype,
        red: Reduction::Op(red),
        on: Some(on),
    } = *op
    else {
        return Ok(One::Not);
    };
    if on.device != device || !streams.contains(&on.stream) {
        return Ok(One::Not);
    }
    let (rank, n) = (comm.rank(), comm.nranks());
    if !checked {
        validate(op, rank, n)?;
    }
    let es = dtype.size();
    let (read, recv, in_place) = match coll_layout(api, kind, send, recv, count, dtype, rank, n)? {
        Layout::Empty => return Ok(One::Empty),
        Layout::InPlace { buf, len } => (None, (buf as u64, len / es), true),
        Layout::Apart {
            send,
            send_len,
            recv,
            recv_len,
        } => (
            (send_len > 0).then_some((send as u64, send_len / es)),
            (recv as u64, recv_len / es),
            false,
        ),
    };
    let written = !matches!(kind, CollKind::Reduce { root } if root != rank);
    let call = Sliced {
        dev: device,
        handle: streams[0],
        cut: comm.device_cut(kind, count, es),
        es,
        read,
        recv,
        in_place,
        written: written && recv.1 > 0,
    };
    Ok(One::Cut(Lone {
        call,
        api,
        kind,
        dtype,
        op: red,
    }))
}

/// Queues `lone` on its stream, one job per slice. Each job runs the host collective on its
/// slice's arena copies (as any C ABI operation runs, `run::execute`).
fn queue(shared: &Arc<Shared>, lone: Lone) -> Result<()> {
    let comm = shared.wait_ready()?;
    let Lone {
        call,
        api,
        kind,
        dtype,
        op,
    } = lone;
    let rank = comm.rank();
    let es = dtype.size();
    let job = |j: SliceJob| -> Work {
        let s = Arc::clone(shared);
        let (send, recv) = if call.in_place {
            // One buffer, NCCL's in-place layout for the slice's count.
            let (i, o) = kind.in_place_offsets(j.count, rank);
            let base = j.output.0 as *mut u8;
            (
                base.wrapping_add(i * es).cast_const(),
                base.wrapping_add(o * es),
            )
        } else {
            let recv = if j.output.1 == 0 {
                std::ptr::null_mut()
            } else {
                j.output.0 as *mut u8
            };
            let send = match j.input {
                None => std::ptr::null(),
                Some((at, _)) => at as *const u8,
            };
            (send, recv)
        };
        let op = Op::Coll {
            api,
            kind,
            send,
            recv,
            count: j.count,
            dtype,
            red: Reduction::Op(op),
            on: None,
        };
        Box::new(move || {
            let comm = s.wait_ready()?;
            // A host call (no stream): nothing to check against a device.
            execute(&comm, vec![op], true).map_err(|e| ran_later(e, api, rank, None))
        })
    };
    // SAFETY: the call's ranges were checked as live memory of its device when it was made
    // (`validate`), and NCCL's contract keeps them the call's until the stream has run past
    // them; `call.handle` is the caller's stream of that device.
    unsafe { comm.queue_slices(&shared.streams, &call, (), job) }
}

/// `ops` as the pieces' operations of a group in rounds, where every one is a `ncclSend` or
/// `ncclRecv` on one of `streams` of `device`.
fn piece_ops<'a>(
    device: Device,
    streams: &[usize],
    ops: impl Iterator<Item = &'a Op>,
) -> Option<Vec<PieceOp>> {
    let mut pieces = Vec::new();
    for op in ops {
        let (send, buf, count, dtype, peer, on) = match *op {
            Op::Send {
                buf,
                count,
                dtype,
                peer,
                on: Some(on),
            } => (true, buf, count, dtype, peer, on),
            Op::Recv {
                buf,
                count,
                dtype,
                peer,
                on: Some(on),
            } => (false, buf.cast_const(), count, dtype, peer, on),
            _ => return None,
        };
        if on.device != device || !streams.contains(&on.stream) {
            return None;
        }
        pieces.push(bytes(send, peer, buf, count * dtype.size()));
    }
    Some(pieces)
}

/// A send or receive of `len` bytes at `buf` as an operation of a group in rounds. Bytes, as
/// every other path of the C ABI sends them (`run::run_p2p`, `stream::p2p_on_streams`,
/// `run::rooted_ops`): a rank whose group blocks and one whose group is queued here must send
/// the same headers.
fn bytes(send: bool, peer: usize, buf: *const u8, len: usize) -> PieceOp {
    PieceOp {
        send,
        dtype: DataType::Uint8,
        peer,
        addr: buf as u64,
        len,
    }
}

/// A gather or scatter on one of `streams` of `device` as a [`Part`], where it is one.
fn rooted(
    comm: &Communicator,
    device: Device,
    streams: &[usize],
    op: &Op,
    checked: bool,
) -> Result<Option<Part>> {
    let Op::Rooted {
        api,
        which,
        root,
        send,
        recv,
        count,
        dtype,
        on: Some(on),
    } = *op
    else {
        return Ok(None);
    };
    if on.device != device || !streams.contains(&on.stream) {
        return Ok(None);
    }
    let (rank, n) = (comm.rank(), comm.nranks());
    if !checked {
        validate(op, rank, n)?;
    }
    let layout = rooted_layout(api, which, root, send, recv, count, dtype, rank, n)?;
    let ops = rooted_ops(which, root, rank, n, &layout)
        .into_iter()
        .map(|(send, peer, p, len)| bytes(send, peer, p, len))
        .collect();
    Ok(Some(Part::Rooted {
        api,
        which,
        root,
        count,
        dtype,
        rounds: P2pRounds::new(ops, comm.piece_bytes()),
    }))
}

/// One part of a batch queued piece by piece, in issue order.
enum Part {
    /// A collective, slice by slice.
    Coll(Lone),
    /// A gather or scatter: one job in which the ranks agree on its root and count (as the
    /// blocking form does first, `run::run_one`), then its sends and receives in rounds (the
    /// root's own block a send to itself and a receive from itself, unless in place).
    Rooted {
        api: &'static str,
        which: Rooted,
        root: usize,
        count: usize,
        dtype: DataType,
        rounds: P2pRounds,
    },
}

impl Part {
    /// Bytes of the stream's arena it takes.
    fn arena_bytes(&self) -> usize {
        match self {
            Part::Coll(l) => l.call.arena_bytes(),
            Part::Rooted { rounds, .. } => rounds.arena_bytes(),
        }
    }

    /// Whether it is cut: a collective into several slices, a message into several pieces.
    fn is_cut(&self) -> bool {
        match self {
            Part::Coll(l) => l.call.cut.slices > 1,
            Part::Rooted { rounds, .. } => rounds.rounds() > 1,
        }
    }
}

/// A batch queued piece by piece on one stream: its collectives, gathers and scatters one after
/// another, in issue order, each slice by slice ([`queue`]) or round by round, then its sends
/// and receives in rounds ([`queue_p2p`]). That is the order in which the blocking form runs a
/// batch (`run::execute`: the others in issue order, then the sends and receives at once), so
/// a rank whose group blocks and one whose group is queued here exchange the same messages.
pub(super) struct Pieces {
    device: Device,
    /// The stream its pieces are queued on: the first of the batch's streams.
    stream: usize,
    parts: Vec<Part>,
    rounds: Option<P2pRounds>,
}

impl Pieces {
    /// Bytes of the stream's arena it takes: its parts run one after another.
    pub(super) fn arena_bytes(&self) -> usize {
        let most = self.parts.iter().map(Part::arena_bytes).max().unwrap_or(0);
        most.max(self.rounds.as_ref().map_or(0, P2pRounds::arena_bytes))
    }
}

/// `ops`, each on one of `streams` of `device`, as [`Pieces`] queued on the first, where they can be and that is worth it:
/// collectives with a reduction known now, gathers, scatters, sends and receives, one of them
/// cut (a collective into several slices, a message into several pieces), or one collective
/// alone (queued as any call is). Otherwise (a split, a scalar read when the call runs, or
/// nothing cut) `None`: one job is one round trip, not one per part. `checked`: their
/// arguments were checked when they were issued. A receive buffer overlapping another buffer
/// of the sends and receives is refused, as on every path.
pub(super) fn pieces(
    comm: &Communicator,
    device: Device,
    streams: &[usize],
    ops: &[Op],
    checked: bool,
) -> Result<Option<Pieces>> {
    let mut parts = Vec::new();
    let mut p2p = Vec::new();
    for op in ops {
        match op {
            Op::Send { .. } | Op::Recv { .. } => p2p.push(op),
            Op::Coll { .. } => match one(comm, device, streams, op, checked)? {
                One::Cut(l) => parts.push(Part::Coll(l)),
                One::Empty => {}
                One::Not => return Ok(None),
            },
            Op::Rooted { .. } => match rooted(comm, device, streams, op, checked)? {
                Some(part) => parts.push(part),
                None => return Ok(None),
            },
            Op::Split { .. } => return Ok(None),
        }
    }
    let rounds = if p2p.is_empty() {
        None
    } else {
        let Some(pieces) = piece_ops(device, streams, p2p.iter().copied()) else {
            return Ok(None);
        };
        Some(P2pRounds::new(pieces, comm.piece_bytes()))
    };
    let cut = parts.iter().any(Part::is_cut) || rounds.as_ref().is_some_and(|r| r.rounds() > 1);
    let one_call = rounds.is_none()
        && parts.len() <= 1
        && !parts.iter().any(|p| matches!(p, Part::Rooted { .. }));
    if !cut && !one_call {
        return Ok(None);
    }
    if rounds.is_some() {
        if !checked {
            for op in &p2p {
                validate(op, comm.rank(), comm.nranks())?;
            }
        }
        refuse_overlaps("device buffers", &p2p_spans(ops))?;
    }
    Ok(Some(Pieces {
        device,
        stream: streams[0],
        parts,
        rounds,
    }))
}

/// Queues `p` ([`pieces`]) in order, the stream's arena first grown for its largest
/// collective, so that little is left to fail after the first part is queued but a driver call
/// or a stopped queue. A part that cannot be queued after another was fails the communicator:
/// the group would be half issued, out of step with the peers.
pub(super) fn queue_pieces(shared: &Arc<Shared>, p: Pieces) -> Result<()> {
    let Pieces {
        device,
        stream,
        parts,
        rounds,
    } = p;
    let most = parts
        .iter()
        .filter_map(|p| match p {
            Part::Coll(l) => Some(l),
            Part::Rooted { .. } => None,
        })
        .max_by_key(|l| l.call.arena_bytes());
    if let Some(most) = most {
        shared
            .wait_ready()?
            .reserve_slices(&shared.streams, &most.call)?;
    }
    let mut queued = 0;
    let mut go = |r: Result<()>| -> Result<()> {
        if let Err(e) = r {
            if queued > 0 {
                shared.wait_ready()?.fail_with(e.clone());
            }
            return Err(e);
        }
        queued += 1;
        Ok(())
    };
    for part in parts {
        match part {
            Part::Coll(lone) => go(queue(shared, lone))?,
            Part::Rooted {
                api,
                which,
                root,
                count,
                dtype,
                rounds,
            } => {
                go(agree(shared, device, api, which, root, count, dtype))?;
                if !rounds.ops().is_empty() {
                    go(queue_p2p(shared, device, stream, &rounds, api))?;
                }
            }
        }
    }
    if let Some(r) = rounds {
        let names = match (
            r.ops().iter().any(|o| o.send),
            r.ops().iter().any(|o| !o.send),
        ) {
            (true, true) => "ncclSend, ncclRecv",
            (true, false) => "ncclSend",
            _ => "ncclRecv",
        };
        go(queue_p2p(shared, device, stream, &r, names))?;
    }
    Ok(())
}

/// What the error of an operation queued on a stream gains: the call's name, the rank, and
/// that it ran after the call returned.
fn ran_later(e: Error, names: &str, rank: usize, round: Option<usize>) -> Error {
    let round = round.map_or(String::new(), |k| format!(" (round {k})"));
    e.context(names).append(format!(
        "rank {rank}; the operation was queued on a stream and ran after the call returned{round}"
    ))
}

/// Queues the job in which the ranks agree on a gather's or scatter's root and count, as the
/// blocking form does before it moves anything. It touches no buffer, so no stream waits for
/// it; the rounds queued after it run after it.
#[allow(clippy::too_many_arguments)]
fn agree(
    shared: &Arc<Shared>,
    device: Device,
    api: &'static str,
    which: Rooted,
    root: usize,
    count: usize,
    dtype: DataType,
) -> Result<()> {
    let rank = shared.wait_ready()?.rank();
    let s = Arc::clone(shared);
    let work: Work = Box::new(move || {
        let comm = s.wait_ready()?;
        comm.agree_on_root(api, header_kind(which), root, count, dtype)
            .map_err(|e| ran_later(e, api, rank, None))
    });
    shared.streams.enqueue(device, &[], Vec::new(), work, None)
}

/// Queues the group `r` on `stream` of `device`, one job per round; each job moves its pieces
/// on the arena's copies as the blocking form's round does. `names`: the calls, for errors.
fn queue_p2p(
    shared: &Arc<Shared>,
    device: Device,
    stream: usize,
    r: &P2pRounds,
    names: &'static str,
) -> Result<()> {
    let comm = shared.wait_ready()?;
    let rank = comm.rank();
    let context: RoundContext =
        Arc::new(move |e: Error, k: usize| ran_later(e, names, rank, Some(k)));
    // SAFETY: the operations' buffers were checked as live memory of `device` when they were
    // issued (or by `pieces`), no receive buffer overlaps another (`pieces` for sends and
    // receives, `rooted_layout` for a gather's or scatter's blocks), and NCCL's contract keeps
    // them the group's until the stream has run past it; `stream` is the caller's stream of
    // `device`.
    unsafe { comm.queue_p2p_rounds(&shared.streams, device, stream, r, (), context) }
}

#[cfg(test)]
mod tests;
