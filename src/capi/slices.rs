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
//! The part must have its stream to itself in the group (communicators of one process on
//! their own GPUs and streams, the `ncclCommInitAll` pattern, qualify; communicators sharing
//! a stream do not), and something must be cut: a collective into several slices or a
//! message into several pieces (or the part is one collective, queued as any call is).
//! Otherwise, and for parts with splits, a scalar read when the call runs, or several streams
//! (NCCL joins a group's streams), the part stays one job (`group`): one job is one round
//! trip, not one per call.

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

/// `op` as a [`Lone`] collective on `stream` of `device`, where it is one: a collective there
/// with a reduction known now.
fn one(comm: &Communicator, device: Device, stream: usize, op: &Op, checked: bool) -> Result<One> {
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
    if on.device != device || on.stream != stream {
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
        handle: on.stream,
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
            execute(&comm, vec![op]).map_err(|e| ran_later(e, api, rank, None))
        })
    };
    // SAFETY: the call's ranges were checked as live memory of its device when it was made
    // (`validate`), and NCCL's contract keeps them the call's until the stream has run past
    // them; `call.handle` is the caller's stream of that device.
    unsafe { comm.queue_slices(&shared.streams, &call, (), job) }
}

/// `ops` as the pieces' operations of a group in rounds, where every one is a `ncclSend` or
/// `ncclRecv` on `stream` of `device`.
fn piece_ops<'a>(
    device: Device,
    stream: usize,
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
        if on.device != device || on.stream != stream {
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

/// A gather or scatter on `stream` of `device` as a [`Part`], where it is one.
fn rooted(
    comm: &Communicator,
    device: Device,
    stream: usize,
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
    if on.device != device || on.stream != stream {
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

/// A batch on one stream queued piece by piece: its collectives, gathers and scatters one after
/// another, in issue order, each slice by slice ([`queue`]) or round by round, then its sends
/// and receives in rounds ([`queue_p2p`]). That is the order in which the blocking form runs a
/// batch (`run::execute`: the others in issue order, then the sends and receives at once), so
/// a rank whose group blocks and one whose group is queued here exchange the same messages.
pub(super) struct Pieces {
    device: Device,
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

/// `ops`, all on `stream` of `device`, as [`Pieces`], where they can be and that is worth it:
/// collectives with a reduction known now, gathers, scatters, sends and receives, one of them
/// cut (a collective into several slices, a message into several pieces), or one collective
/// alone (queued as any call is). Otherwise (a split, a scalar read when the call runs, or
/// nothing cut) `None`: one job is one round trip, not one per part. `checked`: their
/// arguments were checked when they were issued. A receive buffer overlapping another buffer
/// of the sends and receives is refused, as on every path.
pub(super) fn pieces(
    comm: &Communicator,
    device: Device,
    stream: usize,
    ops: &[Op],
    checked: bool,
) -> Result<Option<Pieces>> {
    let mut parts = Vec::new();
    let mut p2p = Vec::new();
    for op in ops {
        match op {
            Op::Send { .. } | Op::Recv { .. } => p2p.push(op),
            Op::Coll { .. } => match one(comm, device, stream, op, checked)? {
                One::Cut(l) => parts.push(Part::Coll(l)),
                One::Empty => {}
                One::Not => return Ok(None),
            },
            Op::Rooted { .. } => match rooted(comm, device, stream, op, checked)? {
                Some(part) => parts.push(part),
                None => return Ok(None),
            },
            Op::Split { .. } => return Ok(None),
        }
    }
    let rounds = if p2p.is_empty() {
        None
    } else {
        let Some(pieces) = piece_ops(device, stream, p2p.iter().copied()) else {
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
        stream,
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
mod tests {
    use super::*;
    use crate::capi::stream::OnStream;
    use crate::device::Provider;
    use crate::Config;

    /// Three thread ranks whose device calls are cut into 64 KiB slices and pieces, and a
    /// stand-in device.
    fn three_ranks() -> (Vec<Communicator>, Device) {
        let config = Config {
            device_slice_bytes: Some(64 << 10),
            ..Config::default()
        };
        let comms = Communicator::local_group(3, config).unwrap();
        (comms, Device::new(Provider::Host, 0).unwrap())
    }

    /// Stream `stream` of `device`.
    fn on(device: Device, stream: usize) -> Option<OnStream> {
        Some(OnStream { device, stream })
    }

    /// The collectives of `p`, in order.
    fn colls(p: &Pieces) -> Vec<&Lone> {
        p.parts
            .iter()
            .filter_map(|p| match p {
                Part::Coll(l) => Some(l),
                Part::Rooted { .. } => None,
            })
            .collect()
    }

    #[test]
    fn long_sends_and_receives_on_one_stream_are_queued_in_rounds() {
        let (comms, dev) = three_ranks();
        let comm = &comms[1];
        let on = |stream| on(dev, stream);
        let long = (1 << 20) / 4 + 6; // f32: 17 pieces of 64 KiB
        let send = |at: usize, count, peer, stream| Op::Send {
            buf: at as *const u8,
            count,
            dtype: DataType::Float32,
            peer,
            on: on(stream),
        };
        let recv = |at: usize, count, peer, stream| Op::Recv {
            buf: at as *mut u8,
            count,
            dtype: DataType::Float32,
            peer,
            on: on(stream),
        };
        let plan =
            |ops: &[Op]| pieces(comm, dev, 0x77, ops, true).map(|p| p.and_then(|p| p.rounds));
        let long_send = || send(0x10_0000, long, 2, 0x77);
        let group = [
            long_send(),
            send(0x90_0000, 6, 0, 0x77),
            recv(0x200_0000, long, 0, 0x77),
            recv(0x300_0000, 0, 2, 0x77),
        ];
        let r = plan(&group).unwrap().expect("in rounds");
        assert_eq!(r.rounds(), 17);
        assert_eq!(r.ops().len(), 4);
        assert_eq!((r.ops()[0].send, r.ops()[0].peer), (true, 2));
        assert_eq!((r.ops()[2].addr, r.ops()[2].len), (0x200_0000, long * 4));
        // Bytes on the wire, as the C ABI's blocking and host paths send them.
        assert!(r.ops().iter().all(|o| o.dtype == DataType::Uint8));
        // Places for the rounds in flight: 3 pieces of at most 64 KiB each (and an empty one),
        // not the 2 MiB of the buffers.
        let arena = r.arena_bytes();
        assert!(arena <= 4 * (3 * (64 << 10) + 1024), "{arena}");

        // Every message one piece: one job is one round trip, not one per piece.
        assert!(plan(&[send(0x1000, 6, 0, 0x77), recv(0x2000, 6, 2, 0x77)])
            .unwrap()
            .is_none());
        // Over two streams, on another device: one job, as before.
        assert!(plan(&[long_send(), send(0x9000, 6, 0, 0x78)])
            .unwrap()
            .is_none());
        let other = Device::new(Provider::Host, 1).unwrap();
        assert!(pieces(comm, other, 0x77, &[long_send()], true)
            .unwrap()
            .is_none());
        // A receive overlapping another buffer of the group is refused, naming both.
        let e = plan(&[long_send(), recv(0x10_0000 + 4096, 8, 0, 0x77)])
            .map(|_| ())
            .unwrap_err();
        assert!(e.to_string().contains("overlap"), "{e}");
        assert!(e.to_string().contains("0x101000"), "{e}");
    }

    #[test]
    fn collectives_beside_long_messages_are_queued_in_slices_then_rounds() {
        let (comms, dev) = three_ranks();
        let comm = &comms[1];
        let on = |stream| on(dev, stream);
        let long = (1 << 20) / 4 + 6; // f32: 17 pieces, or slices, of 64 KiB
        let send = |at: usize, count| Op::Send {
            buf: at as *const u8,
            count,
            dtype: DataType::Float32,
            peer: 2,
            on: on(0x77),
        };
        let recv = |at: usize, count| Op::Recv {
            buf: at as *mut u8,
            count,
            dtype: DataType::Float32,
            peer: 0,
            on: on(0x77),
        };
        let coll = |at: usize, count, red, stream| Op::Coll {
            api: "ncclAllReduce",
            kind: CollKind::AllReduce,
            send: at as *const u8,
            recv: at as *mut u8,
            count,
            dtype: DataType::Float32,
            red,
            on: on(stream),
        };
        let sum = Reduction::Op(ReduceOp::Sum);
        let plan = |ops: &[Op]| pieces(comm, dev, 0x77, ops, true);

        // A long message beside a short collective: the collective (one slice), then 17
        // rounds; the arena holds the larger part, not the buffers.
        let p = plan(&[
            send(0x10_0000, long),
            coll(0x900_0000, 10, sum, 0x77),
            recv(0x200_0000, long),
        ])
        .unwrap()
        .expect("in pieces");
        assert_eq!(colls(&p).len(), 1);
        assert_eq!(colls(&p)[0].call.cut.slices, 1);
        let r = p.rounds.as_ref().expect("rounds");
        assert_eq!(
            (p.device, p.stream, r.rounds(), r.ops().len()),
            (dev, 0x77, 17, 2)
        );
        assert_eq!(
            p.arena_bytes(),
            r.arena_bytes().max(p.parts[0].arena_bytes())
        );
        assert!(p.arena_bytes() < 1 << 20, "{}", p.arena_bytes());

        // A long collective beside short messages: its slices, then one round. Collectives
        // keep their issue order (a sum of no element dropped, as every path skips it).
        let p = plan(&[
            coll(0x900_0000, long, sum, 0x77),
            send(0x10_0000, 6),
            coll(0x800_0000, 0, sum, 0x77),
            coll(0xa00_0000, 12, sum, 0x77),
            recv(0x200_0000, 6),
        ])
        .unwrap()
        .expect("in pieces");
        let got: Vec<(u64, usize)> = colls(&p)
            .iter()
            .map(|l| (l.call.recv.0, l.call.cut.slices))
            .collect();
        assert_eq!(got, [(0x900_0000, 17), (0xa00_0000, 1)]);
        assert_eq!(p.rounds.as_ref().map(P2pRounds::rounds), Some(1));

        // Collectives alone, and messages alone, as before.
        let alone = plan(&[coll(0x900_0000, long, sum, 0x77)]).unwrap().unwrap();
        assert!(alone.rounds.is_none() && colls(&alone).len() == 1);
        let alone = plan(&[send(0x10_0000, long)]).unwrap().unwrap();
        assert!(alone.parts.is_empty() && alone.rounds.is_some());

        // One job, not pieces: nothing longer than a slice or piece; a collective on another
        // stream; a scalar read when the call runs.
        let short = [send(0x10_0000, 6), coll(0x900_0000, 10, sum, 0x77)];
        assert!(plan(&short).unwrap().is_none());
        let elsewhere = [send(0x10_0000, long), coll(0x900_0000, 10, sum, 0x78)];
        assert!(plan(&elsewhere).unwrap().is_none());
        let scalar = Reduction::ScalarAt(0x40 as *const u8, DataType::Float32);
        let read_later = [send(0x10_0000, long), coll(0x900_0000, 10, scalar, 0x77)];
        assert!(plan(&read_later).unwrap().is_none());

        // A receive overlapping a send of the group is refused, as on every path.
        let e = plan(&[
            send(0x10_0000, long),
            coll(0x900_0000, 10, sum, 0x77),
            recv(0x10_0000 + 64, 8),
        ])
        .map(|_| ())
        .unwrap_err();
        assert!(e.to_string().contains("overlap"), "{e}");
    }

    #[test]
    fn long_gathers_and_scatters_are_queued_in_rounds_after_the_agreement() {
        let (comms, dev) = three_ranks();
        let long = (1 << 20) / 4 + 6; // f32: 17 pieces of 64 KiB
        let rooted = |which, send: usize, recv: usize, count| Op::Rooted {
            api: "ncclGather",
            which,
            root: 0,
            send: send as *const u8,
            recv: recv as *mut u8,
            count,
            dtype: DataType::Float32,
            on: on(dev, 0x77),
        };
        let plan = |rank: usize, ops: &[Op]| pieces(&comms[rank], dev, 0x77, ops, true).unwrap();
        // (send?, peer, address, bytes) of a part's rounds, with their count.
        let moves = |p: &Pieces| -> (usize, Vec<(bool, usize, u64, usize)>) {
            assert_eq!(p.parts.len(), 1);
            let Part::Rooted { rounds, .. } = &p.parts[0] else {
                panic!("a gather or scatter")
            };
            let ops = rounds.ops().iter();
            (
                rounds.rounds(),
                ops.map(|o| {
                    assert_eq!(o.dtype, DataType::Uint8, "bytes, as every C ABI path sends");
                    (o.send, o.peer, o.addr, o.len)
                })
                .collect(),
            )
        };
        let bytes = long * 4;
        let (send, recv) = (0x100_0000, 0x1000_0000);
        // The root of a gather, out of place: its own block to itself, then one from each
        // peer, in 17 rounds.
        let p = plan(0, &[rooted(Rooted::Gather, send, recv, long)]).expect("in pieces");
        assert!(p.rounds.is_none());
        let r = recv as u64;
        assert_eq!(
            moves(&p),
            (
                17,
                vec![
                    (true, 0, send as u64, bytes),
                    (false, 0, r, bytes),
                    (false, 1, r + bytes as u64, bytes),
                    (false, 2, r + 2 * bytes as u64, bytes),
                ]
            )
        );
        // In place at the root: its block is already there.
        let p = plan(0, &[rooted(Rooted::Gather, recv, recv, long)]).expect("in pieces");
        assert_eq!(moves(&p).1.len(), 2);
        // A scatter's other rank: one receive from the root.
        let p = plan(2, &[rooted(Rooted::Scatter, send, recv, long)]).expect("in pieces");
        assert_eq!(moves(&p), (17, vec![(false, 0, r, bytes)]));
        // Beside a long send, in issue order: the gather, then the send.
        let tail = Op::Send {
            buf: 0x4000_0000 as *const u8,
            count: long,
            dtype: DataType::Float32,
            peer: 0,
            on: on(dev, 0x77),
        };
        let p = plan(1, &[tail, rooted(Rooted::Gather, send, recv, long)]).expect("in pieces");
        assert_eq!(moves(&p), (17, vec![(true, 0, send as u64, bytes)]));
        assert_eq!(p.rounds.as_ref().map(|r| r.ops().len()), Some(1));
        // One piece each: one job, as before.
        assert!(plan(1, &[rooted(Rooted::Gather, send, recv, 6)]).is_none());
    }

    #[test]
    fn calls_alone_in_their_group_are_cut_and_the_rest_is_not() {
        let config = Config {
            device_slice_bytes: Some(16),
            ..Config::default()
        };
        let comms = Communicator::local_group(2, config).unwrap();
        let comm = &comms[1];
        let dev = Device::new(Provider::Host, 0).unwrap();
        let on = Some(OnStream {
            device: dev,
            stream: 0x77,
        });
        let (send, recv) = (0x1000 as *const u8, 0x9000 as *mut u8);
        let coll = |kind, send, count, red| Op::Coll {
            api: "ncclAllReduce",
            kind,
            send,
            recv,
            count,
            dtype: DataType::Float32,
            red,
            on,
        };
        let sum = Reduction::Op(ReduceOp::Sum);
        let cuts = |ops: &[Op]| -> Option<Vec<Lone>> {
            let p = pieces(comm, dev, 0x77, ops, true).unwrap()?;
            assert!(p.rounds.is_none());
            let lones = p.parts.into_iter().map(|p| match p {
                Part::Coll(l) => l,
                Part::Rooted { .. } => unreachable!("no gather"),
            });
            Some(lones.collect())
        };
        let cut = |ops: &[Op]| cuts(ops).map(|mut v| v.remove(0));

        // 10 floats in 16-byte slices: 3 slices, 3 places of 16 input and 16 output bytes.
        let l = cut(&[coll(CollKind::AllReduce, send, 10, sum)]).expect("cut");
        assert_eq!((l.call.cut.slices, l.call.handle), (3, 0x77));
        assert_eq!(l.call.read, Some((0x1000, 10)));
        assert_eq!(l.call.recv, (0x9000, 10));
        assert!(!l.call.in_place && l.call.written);
        assert!(l.call.arena_bytes() <= 3 * 512, "{}", l.call.arena_bytes());
        // In place.
        let l = cut(&[coll(CollKind::AllReduce, recv, 10, sum)]).expect("cut");
        assert!(l.call.in_place && l.call.read.is_none());
        // A reduce's non-root (rank 1, root 0) writes nothing back.
        let l = cut(&[coll(CollKind::Reduce { root: 0 }, send, 10, sum)]).expect("cut");
        assert!(!l.call.written);
        // A broadcast's non-root reads nothing.
        let l = cut(&[coll(CollKind::Broadcast { root: 0 }, send, 10, sum)]).expect("cut");
        assert!(l.call.read.is_none() && !l.call.in_place);

        // all_gather: 10 floats per rank into 2 blocks, cut by the larger buffer's bytes (80
        // in 16-byte slices: 5 slices of 2 elements per block).
        let l = cut(&[coll(CollKind::AllGather, send, 10, sum)]).expect("cut");
        assert_eq!((l.call.cut.in_blocks, l.call.cut.out_blocks), (1, 2));
        assert_eq!((l.call.cut.slices, l.call.recv), (5, (0x9000, 20)));
        // In place: block 1 of the output is the input.
        let l = cut(&[coll(CollKind::AllGather, recv.wrapping_add(40), 10, sum)]).expect("cut");
        assert!(l.call.in_place && l.call.recv == (0x9000, 20));

        // Several collectives: each cut on its own; one of no element dropped.
        let three = [
            coll(CollKind::AllReduce, send, 10, sum),
            coll(CollKind::AllReduce, send, 0, sum),
            coll(CollKind::AllToAll, send, 10, sum),
        ];
        let all = cuts(&three).expect("cut");
        assert_eq!(all.len(), 2);
        assert_eq!(
            (all[1].call.cut.in_blocks, all[1].call.cut.out_blocks),
            (2, 2)
        );
        assert!(cuts(&[coll(CollKind::AllReduce, send, 0, sum)])
            .expect("cut")
            .is_empty());
        // Several of one slice each: one job is one round trip, not one per call.
        let small = [
            coll(CollKind::AllReduce, send, 4, sum),
            coll(CollKind::AllReduce, send, 3, sum),
        ];
        assert!(cuts(&small).is_none());
        assert!(
            cuts(&small[..1]).is_some(),
            "alone, it is queued as any call"
        );
        // Over two streams: NCCL joins a group's streams, which one job does.
        let mut other_stream = coll(CollKind::AllReduce, send, 10, sum);
        if let Op::Coll { on, .. } = &mut other_stream {
            *on = Some(OnStream {
                device: dev,
                stream: 0x78,
            });
        }
        let two_streams = [coll(CollKind::AllReduce, send, 10, sum), other_stream];
        assert!(cuts(&two_streams).is_none());

        // Not cut here: a scalar read when it runs (alone or among others), another device.
        let scalar = Reduction::ScalarAt(0x40 as *const u8, DataType::Float32);
        let other = Device::new(Provider::Host, 1).unwrap();
        assert!(cuts(&[coll(CollKind::AllReduce, send, 10, scalar)]).is_none());
        let two = [
            coll(CollKind::AllReduce, send, 10, sum),
            coll(CollKind::AllReduce, send, 10, scalar),
        ];
        assert!(cuts(&two).is_none());
        let ops = [coll(CollKind::AllReduce, send, 10, sum)];
        assert!(pieces(comm, other, 0x77, &ops, true).unwrap().is_none());
    }
}
