//! Groups of point-to-point operations that run together.
//!
//! Messages longer than a piece travel as pieces, on every path alike. Device buffers go
//! straight to a transport that reads and writes their memory (the GPU peer-to-peer
//! transport); to any other, through the communicator's pinned staging, piece by piece: the
//! group runs in rounds, the copies of the other rounds' pieces overlapping the round on the
//! transports, in a few places of the staging buffers, which are kept for later groups.

use std::ops::Range;

use ferroccl_kernels::{as_bytes, as_bytes_mut, DataType, ElemOp, Element};
use ferroccl_transport::MemRef;

use super::device_calls::piece_bytes;
use super::{Communicator, Inner};
use crate::device::staging::{piece_range, pieces, slices_in_flight, RoundViews, Span};
use crate::device::{Device, DeviceBuffer, Hold, Staging};
use crate::exec::{OpContext, RawOp};
use crate::wire::{kind, op};
use crate::{Error, Result};

/// A device buffer of any element type, as a group handles it.
pub(super) trait DeviceBytes: std::fmt::Debug {
    /// Where it is.
    fn mem(&self) -> MemRef;
    /// Checks it is live memory of the communicator's device (returned); waits for queued
    /// stream jobs that use it.
    fn ready(&self, comm: &Communicator, what: &str) -> Result<Device>;
    /// Checks it is live memory of the communicator's device, without waiting for anything.
    fn check(&self, comm: &Communicator, what: &str) -> Result<Device>;
    /// Counts a queued stream job using it until the hold drops.
    fn hold(&self) -> Hold;
}

impl<T: Element> DeviceBytes for DeviceBuffer<T> {
    fn mem(&self) -> MemRef {
        DeviceBuffer::mem(self)
    }

    fn ready(&self, comm: &Communicator, what: &str) -> Result<Device> {
        let dev = comm.device_for("send/recv group", what, self)?;
        self.wait_idle();
        Ok(dev)
    }

    fn check(&self, comm: &Communicator, what: &str) -> Result<Device> {
        comm.device_for("send/recv group", what, self)
    }

    fn hold(&self) -> Hold {
        DeviceBuffer::hold(self)
    }
}

#[derive(Debug)]
pub(super) enum P2p<'a> {
    Send {
        buf: &'a [u8],
        dtype: DataType,
        peer: usize,
    },
    Recv {
        buf: &'a mut [u8],
        dtype: DataType,
        peer: usize,
    },
    SendDevice {
        buf: &'a dyn DeviceBytes,
        dtype: DataType,
        peer: usize,
    },
    RecvDevice {
        buf: &'a mut dyn DeviceBytes,
        dtype: DataType,
        peer: usize,
    },
    /// One piece of a message of `whole` bytes, in host memory (a stream job's round).
    SendPiece {
        piece: &'a [u8],
        whole: usize,
        dtype: DataType,
        peer: usize,
    },
    RecvPiece {
        piece: &'a mut [u8],
        whole: usize,
        dtype: DataType,
        peer: usize,
    },
}

impl P2p<'_> {
    /// The peer, and whether it is a send.
    fn peer(&self) -> (usize, bool) {
        match self {
            P2p::Send { peer, .. } | P2p::SendDevice { peer, .. } | P2p::SendPiece { peer, .. } => {
                (*peer, true)
            }
            P2p::Recv { peer, .. } | P2p::RecvDevice { peer, .. } | P2p::RecvPiece { peer, .. } => {
                (*peer, false)
            }
        }
    }

    /// The message's bytes (the whole message's, for a piece).
    pub(super) fn len(&self) -> usize {
        match self {
            P2p::Send { buf, .. } => buf.len(),
            P2p::Recv { buf, .. } => buf.len(),
            P2p::SendDevice { buf, .. } => buf.mem().len,
            P2p::RecvDevice { buf, .. } => buf.mem().len,
            P2p::SendPiece { whole, .. } | P2p::RecvPiece { whole, .. } => *whole,
        }
    }
}

/// Sends and receives that run together (NCCL's group calls). Build it with
/// [`Communicator::group`], add operations, then [`Group::run`]. All operations progress at
/// once, so a group where every rank sends to and receives from its neighbours cannot deadlock.
/// Operations to the same peer are matched in the order they were added.
///
/// ```
/// use ferroccl::{Communicator, Config};
/// let comms = Communicator::local_group(3, Config::default()).unwrap();
/// std::thread::scope(|s| {
///     for c in &comms {
///         s.spawn(move || {
///             let n = c.nranks();
///             let mine = [c.rank() as u32; 5];
///             let mut from_left = [0u32; 5];
///             let mut g = c.group();
///             g.send(&mine, (c.rank() + 1) % n);
///             g.recv(&mut from_left, (c.rank() + n - 1) % n);
///             g.run().unwrap();
///             assert_eq!(from_left, [((c.rank() + n - 1) % n) as u32; 5]);
///         });
///     }
/// });
/// ```
#[derive(Debug)]
pub struct Group<'a> {
    pub(super) comm: &'a Communicator,
    pub(super) ops: Vec<P2p<'a>>,
}

impl<'a> Group<'a> {
    pub(crate) fn new(comm: &'a Communicator) -> Self {
        Group {
            comm,
            ops: Vec::new(),
        }
    }

    /// Adds a send of `buf` to `peer`.
    pub fn send<T: Element>(&mut self, buf: &'a [T], peer: usize) -> &mut Self {
        self.ops.push(P2p::Send {
            buf: as_bytes(buf),
            dtype: T::DTYPE,
            peer,
        });
        self
    }

    /// Adds a receive from `peer` into `buf`.
    pub fn recv<T: Element>(&mut self, buf: &'a mut [T], peer: usize) -> &mut Self {
        self.ops.push(P2p::Recv {
            buf: as_bytes_mut(buf),
            dtype: T::DTYPE,
            peer,
        });
        self
    }

    /// Adds a send of the device buffer `buf` to `peer` (the communicator's device, bound with
    /// [`Communicator::set_device`]). Over a transport that reaches device memory (the GPU
    /// peer-to-peer transport) it leaves from the buffer itself; otherwise through a host copy.
    pub fn send_device<T: Element>(&mut self, buf: &'a DeviceBuffer<T>, peer: usize) -> &mut Self {
        self.ops.push(P2p::SendDevice {
            buf,
            dtype: T::DTYPE,
            peer,
        });
        self
    }

    /// Adds a receive from `peer` into the device buffer `buf` (see [`Group::send_device`]).
    pub fn recv_device<T: Element>(
        &mut self,
        buf: &'a mut DeviceBuffer<T>,
        peer: usize,
    ) -> &mut Self {
        self.ops.push(P2p::RecvDevice {
            buf,
            dtype: T::DTYPE,
            peer,
        });
        self
    }

    /// Runs every operation of the group and waits for all of them.
    pub fn run(self) -> Result<()> {
        // Stream jobs queued earlier run first, on every rank alike.
        self.comm.streams.drain_if_used();
        let inner = &self.comm.inner;
        check_peers(inner, &self.ops)?;
        if let Some(e) = inner.failed_error() {
            return Err(e);
        }
        let mut dev = None;
        for o in &self.ops {
            match o {
                P2p::SendDevice { buf, .. } => dev = Some(buf.ready(self.comm, "send")?),
                P2p::RecvDevice { buf, .. } => dev = Some(buf.ready(self.comm, "receive")?),
                _ => {}
            }
        }
        let Some(dev) = dev else {
            return execute(inner, self.ops, None);
        };
        let ops = copy_to_self(inner, dev, self.ops)?;
        let mut st = super::lock(&self.comm.device);
        let staging = Communicator::staging(&mut st, dev)?;
        execute(inner, ops, Some(staging))
    }
}

/// Runs each device send to this rank whose matching receive from it (the same place among
/// the receives from this rank, of the same length) is a device buffer too as one
/// device-to-device copy on `dev`, in the communicator's issue order, and returns the other
/// operations. Messages to this rank never reach a transport, so the peers see no
/// difference; the pairs left (host buffers, lengths that differ) go through the group as
/// before, which checks them.
fn copy_to_self<'a>(inner: &Inner, dev: Device, ops: Vec<P2p<'a>>) -> Result<Vec<P2p<'a>>> {
    let (sends, recvs) = to_self(inner.rank, &ops);
    // (source, destination) of each pair copied on the device, and which ops they were.
    let mut pairs: Vec<(MemRef, MemRef)> = Vec::new();
    let mut copied = vec![false; ops.len()];
    for (&s, &r) in sends.iter().zip(&recvs) {
        let (P2p::SendDevice { buf: from, .. }, P2p::RecvDevice { buf: to, .. }) =
            (&ops[s], &ops[r])
        else {
            continue;
        };
        let (from, to) = (from.mem(), to.mem());
        if from.len == to.len && !from.overlaps(&to) {
            pairs.push((from, to));
            copied[s] = true;
            copied[r] = true;
        }
    }
    if pairs.is_empty() {
        return Ok(ops);
    }
    inner.execute_next(false, |_, _| {
        for (from, to) in &pairs {
            // SAFETY: both are device buffers of the group, checked live memory of `dev` and
            // idle (`Group::run`), the receive borrowed mutably by the group; they do not
            // overlap.
            unsafe { dev.copy_within(to.addr as u64, from.addr as u64, to.len) }?;
        }
        Ok(())
    })?;
    Ok(ops
        .into_iter()
        .zip(copied)
        .filter_map(|(o, c)| (!c).then_some(o))
        .collect())
}

/// Every operation's peer is a rank of the communicator.
pub(super) fn check_peers(inner: &Inner, ops: &[P2p<'_>]) -> Result<()> {
    let (rank, n) = (inner.rank, inner.nranks);
    for o in ops {
        let (peer, send) = o.peer();
        let what = if send { "send" } else { "recv" };
        if peer >= n {
            return Err(Error::invalid_argument(format!(
                "{what} on rank {rank}: invalid peer {peer} (peer must be 0..{})",
                n - 1
            )));
        }
    }
    Ok(())
}

/// Runs checked operations (peers checked, device buffers checked and idle) in the
/// communicator's issue order; device buffers a peer's transport cannot reach (and any to or
/// from this rank) go through `staging` (the communicator's, for its bound device; needed
/// only for such buffers).
///
/// Every message longer than a piece ([`piece_bytes`]) travels as pieces, one message each,
/// on every path alike, so ranks whose buffers differ (host, staged, straight on the device)
/// cut the same way. Without staged buffers the group is one step with every piece of every
/// message. With them it runs in rounds, round `k` moving piece `k` of every message, while
/// the staging copies the other rounds' pieces in and out ([`Staging::pipeline_spans`]).
pub(super) fn execute(
    inner: &Inner,
    ops: Vec<P2p<'_>>,
    staging: Option<&mut Staging>,
) -> Result<()> {
    let rank = inner.rank;
    run_group(inner, ops, |r, ops| {
        let (engine, piece) = (&*r.engine, r.piece);
        let staged = |engine: &crate::exec::Engine, peer: usize, mem: MemRef| {
            peer == rank || !engine.accepts(peer, mem.space)
        };
        let span = |mem: MemRef| Span {
            dev: mem.addr as u64,
            len: mem.len,
            piece,
        };
        let (mut sends, mut recvs) = (Vec::new(), Vec::new());
        let mut rounds = 1;
        for o in ops.iter() {
            match o {
                P2p::SendDevice { buf, peer, .. } if staged(engine, *peer, buf.mem()) => {
                    sends.push(span(buf.mem()))
                }
                P2p::RecvDevice { buf, peer, .. } if staged(engine, *peer, buf.mem()) => {
                    recvs.push(span(buf.mem()))
                }
                _ => {}
            }
            rounds = rounds.max(pieces(o.len(), piece));
        }
        match staging {
            _ if sends.is_empty() && recvs.is_empty() => {
                r.run(ops, 0..rounds, &staged, (Vec::new(), Vec::new()))
            }
            None => Err(Error::internal(format!(
                "send/recv group on rank {rank}: device buffers to stage, no staging"
            ))),
            Some(s) => {
                let room = |v: &[Span]| v.iter().map(|s| s.len.min(piece)).sum::<usize>();
                let window = slices_in_flight(rounds, room(&sends).max(room(&recvs)));
                s.reserve_spans(&sends, &recvs, window).and_then(|()| {
                    // SAFETY: the spans are device buffers of the group, checked live memory
                    // of the staging's device (`Group::run`), borrowed by the group (receives
                    // mutably) while it runs.
                    unsafe {
                        s.pipeline_spans(&sends, &recvs, rounds, window, |k, views| {
                            r.run(ops, k..k + 1, &staged, views)
                        })
                    }
                })
            }
        }
    })
}

/// Runs `body` on the engine in the communicator's issue order, with `ops` checked (sends to
/// this rank match its receives) and a [`Round`] to move them.
fn run_group<'o>(
    inner: &Inner,
    mut ops: Vec<P2p<'o>>,
    body: impl FnOnce(&mut Round<'_, '_>, &mut [P2p<'o>]) -> Result<()>,
) -> Result<()> {
    let rank = inner.rank;
    let gno = inner
        .groups
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        + 1;
    let piece = piece_bytes(inner);
    let ticket = inner.ticket();
    inner.execute(ticket, |engine| {
        check_self(rank, &ops)?;
        let ctx = group_context(rank, gno, &ops);
        let mut raw = engine.take_ops();
        let mut r = Round {
            engine,
            rank,
            piece,
            raw: &mut raw,
            ctx: &ctx,
        };
        let result = body(&mut r, &mut ops);
        let Round { engine, .. } = r;
        engine.return_ops(raw);
        result
    })
}

/// The context a group's steps report under: the dtype of its last send to another rank.
fn group_context(rank: usize, gno: u64, ops: &[P2p<'_>]) -> OpContext {
    let dtype = ops
        .iter()
        .rev()
        .find_map(|o| match o {
            P2p::Send { dtype, peer, .. }
            | P2p::SendDevice { dtype, peer, .. }
            | P2p::SendPiece { dtype, peer, .. }
                if *peer != rank =>
            {
                Some(*dtype)
            }
            _ => None,
        })
        .unwrap_or(DataType::Uint8);
    OpContext {
        name: "send/recv group",
        seq: gno,
        rank,
        kind: kind::SEND_RECV,
        dtype,
        op: op::NONE,
        count: 0,
        root: u32::MAX,
    }
}

/// Runs round `k` of a group queued on a stream in rounds: `ops` are [`P2p::SendPiece`] and
/// [`P2p::RecvPiece`], piece `k` of each message in host memory (an empty piece where a
/// message has no piece `k`), in the group's order: the same messages, in the same order, as
/// the blocking form's round `k`.
pub(crate) fn execute_round(inner: &Inner, ops: Vec<P2p<'_>>, k: usize) -> Result<()> {
    run_group(inner, ops, |r, ops| {
        r.run(ops, k..k + 1, &|_, _, _| false, (Vec::new(), Vec::new()))
    })
}

/// The indexes of the sends to `rank` and of the receives from it among `ops`, in order: the
/// `i`-th of each make a pair.
fn to_self(rank: usize, ops: &[P2p<'_>]) -> (Vec<usize>, Vec<usize>) {
    let of = |send: bool| -> Vec<usize> {
        (0..ops.len())
            .filter(|&i| ops[i].peer() == (rank, send))
            .collect()
    };
    (of(true), of(false))
}

/// Sends to this rank and receives from it match in order, one for one, of equal lengths:
/// checked before anything moves.
fn check_self(rank: usize, ops: &[P2p<'_>]) -> Result<()> {
    let (sends, recvs) = to_self(rank, ops);
    let lens = |v: Vec<usize>| -> Vec<usize> { v.into_iter().map(|i| ops[i].len()).collect() };
    let (sends, recvs) = (lens(sends), lens(recvs));
    for (i, (&s, &r)) in sends.iter().zip(&recvs).enumerate() {
        if s != r {
            return Err(Error::invalid_argument(format!(
                "group on rank {rank}: send to self of {s} bytes, receive from self of {r} \
                 bytes (the {} pair to self)",
                ordinal(i + 1)
            )));
        }
    }
    if recvs.len() > sends.len() {
        return Err(Error::invalid_usage(format!(
            "group on rank {rank}: a receive from self has no matching send to self"
        )));
    }
    if sends.len() > recvs.len() {
        return Err(Error::invalid_usage(format!(
            "group on rank {rank}: {} send(s) to self but {} receive(s) from self",
            sends.len(),
            recvs.len()
        )));
    }
    Ok(())
}

fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// One step of a group: the pieces of a range of rounds of every message.
struct Round<'e, 'r> {
    engine: &'e mut crate::exec::Engine,
    rank: usize,
    piece: usize,
    raw: &'r mut Vec<RawOp>,
    ctx: &'r OpContext,
}

impl Round<'_, '_> {
    /// Moves pieces `rounds` of every message of `ops`, round-major: piece `k` of every
    /// message (in the order of the ops) before piece `k + 1` of any, so that a channel's
    /// messages follow one order whether a rank runs a group in one step or in rounds.
    /// `views` holds the staged buffers' pieces (one round only, in the order of their ops);
    /// `staged` says which device buffers are staged.
    fn run(
        &mut self,
        ops: &mut [P2p<'_>],
        rounds: Range<usize>,
        staged: &dyn Fn(&crate::exec::Engine, usize, MemRef) -> bool,
        (sent, mut recvd): RoundViews<'_>,
    ) -> Result<()> {
        let (rank, piece) = (self.rank, self.piece);
        let engine = &mut *self.engine;
        let raw = &mut *self.raw;
        raw.clear();
        let is_staged = |engine: &crate::exec::Engine, o: &P2p<'_>| match o {
            P2p::SendDevice { buf, peer, .. } => staged(engine, *peer, buf.mem()),
            P2p::RecvDevice { buf, peer, .. } => staged(engine, *peer, buf.mem()),
            _ => false,
        };
        if rounds.len() > 1 && ops.iter().any(|o| is_staged(engine, o)) {
            return Err(Error::internal(format!(
                "send/recv group on rank {rank}: staged buffers in a step of {} rounds",
                rounds.len()
            )));
        }
        // The header of the next message on a channel (`seq`: its count of messages so far).
        let header = |seq: &mut u64, d: DataType, len: usize, bytes: usize| {
            *seq += 1;
            p2p_header(d, len, bytes, *seq)
        };
        // Sends (and the pieces sent to this rank, in the order the receives take them).
        let mut self_sends: Vec<&[u8]> = Vec::new();
        for k in rounds.clone() {
            let mut views = sent.iter();
            for o in ops.iter() {
                let staged = is_staged(engine, o);
                // Host bytes: a host buffer is the whole message; a staged view or a piece is
                // the piece itself. None: a device buffer handed to the transport.
                let (bytes, dtype, peer, len): (Option<&[u8]>, _, _, _) = match o {
                    P2p::Send { buf, dtype, peer } => (Some(&buf[..]), *dtype, *peer, buf.len()),
                    P2p::SendDevice { buf, dtype, peer } if staged => {
                        let view = views.next().expect("one view per staged send");
                        (Some(view), *dtype, *peer, buf.mem().len)
                    }
                    P2p::SendDevice { buf, dtype, peer } => (None, *dtype, *peer, buf.mem().len),
                    P2p::SendPiece {
                        piece,
                        whole,
                        dtype,
                        peer,
                    } => (Some(*piece), *dtype, *peer, *whole),
                    P2p::Recv { .. } | P2p::RecvDevice { .. } | P2p::RecvPiece { .. } => continue,
                };
                if k >= pieces(len, piece) {
                    continue;
                }
                let p = piece_range(len, piece, k);
                let Some(b) = bytes else {
                    let P2p::SendDevice { buf, .. } = o else {
                        unreachable!("only device sends go to the transport as they are")
                    };
                    raw.push(RawOp::SendDevice {
                        peer,
                        mem: buf.mem().sub(p.start, p.len()),
                        header: header(&mut engine.p2p_sent[peer], dtype, len, p.len()),
                    });
                    continue;
                };
                let b = if matches!(o, P2p::Send { .. }) {
                    &b[p]
                } else {
                    b
                };
                if peer == rank {
                    self_sends.push(b);
                } else {
                    raw.push(RawOp::Send {
                        peer,
                        ptr: b.as_ptr(),
                        len: b.len(),
                        header: header(&mut engine.p2p_sent[peer], dtype, len, b.len()),
                    });
                }
            }
        }
        // Receives.
        let mut self_recvs = self_sends.into_iter();
        for k in rounds {
            let mut views = recvd.iter_mut();
            for o in ops.iter_mut() {
                let staged = is_staged(engine, o);
                // A host buffer is the whole message; a staged view is the piece itself.
                let whole = matches!(o, P2p::Recv { .. });
                let mem = match o {
                    P2p::RecvDevice { buf, .. } => Some(buf.mem()),
                    _ => None,
                };
                let (bytes, dtype, peer, len): (Option<&mut [u8]>, _, _, _) = match o {
                    P2p::Recv { buf, dtype, peer } => {
                        let len = buf.len();
                        (Some(&mut buf[..]), *dtype, *peer, len)
                    }
                    P2p::RecvDevice { buf, dtype, peer } if staged => {
                        let view = views.next().expect("one view per staged receive");
                        (Some(&mut view[..]), *dtype, *peer, buf.mem().len)
                    }
                    P2p::RecvDevice { buf, dtype, peer } => (None, *dtype, *peer, buf.mem().len),
                    P2p::RecvPiece {
                        piece,
                        whole,
                        dtype,
                        peer,
                    } => (Some(&mut piece[..]), *dtype, *peer, *whole),
                    P2p::Send { .. } | P2p::SendDevice { .. } | P2p::SendPiece { .. } => continue,
                };
                if k >= pieces(len, piece) {
                    continue;
                }
                let p = piece_range(len, piece, k);
                match bytes {
                    Some(b) => {
                        let dst = if whole { &mut b[p] } else { b };
                        if peer == rank {
                            let src = self_recvs.next().expect("sends to self checked");
                            dst.copy_from_slice(src);
                        } else {
                            raw.push(RawOp::Recv {
                                peer,
                                ptr: dst.as_mut_ptr(),
                                len: dst.len(),
                                header: header(&mut engine.p2p_recvd[peer], dtype, len, dst.len()),
                            });
                        }
                    }
                    None => {
                        let mem = mem.expect("only direct device receives have no host bytes");
                        raw.push(RawOp::RecvDevice {
                            peer,
                            mem: mem.sub(p.start, p.len()),
                            header: header(&mut engine.p2p_recvd[peer], dtype, len, p.len()),
                        });
                    }
                }
            }
        }
        if raw.is_empty() {
            return Ok(());
        }
        engine.run_step(raw, DataType::Uint8, ElemOp::Sum, self.ctx)
    }
}

/// The header of one piece of `bytes` bytes of a message of `len` bytes: its count is the
/// whole message's, so a receive of another length is refused at its first piece, before a
/// byte lands.
fn p2p_header(dtype: DataType, len: usize, bytes: usize, seq: u64) -> ferroccl_transport::Header {
    ferroccl_transport::Header {
        kind: kind::SEND_RECV,
        dtype: dtype as u8,
        op: op::NONE,
        seq,
        count: (len / dtype.size()) as u64,
        root: u32::MAX,
        len: bytes as u64,
    }
}
