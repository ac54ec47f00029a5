//! A stream-ordered group of device sends and receives longer than a piece, as stream jobs,
//! one per round: round `k` moves piece `k` (`device_calls::piece_bytes`) of every message,
//! in the group's order, as the blocking form's rounds do, so that a rank whose group is
//! stream-ordered and one whose group blocks exchange the same messages. The stream's arena
//! holds the rounds in flight, not the group's buffers ([`Communicator::queue_rounds`]).
//!
//! The Rust API's `Group::run_on` and the C ABI's groups of `ncclSend`/`ncclRecv` on one
//! stream both queue their rounds here ([`Communicator::queue_p2p_rounds`]).

use std::sync::Arc;

use ferroccl_kernels::DataType;

use crate::device::staging::{piece_range, pieces, slices_in_flight};
use crate::device::stream_queue::{orders_call, StreamQueue, Work};
use crate::device::stream_stage::{RangeGroup, Staged, Window};
use crate::device::{Device, DeviceStream, Hold};
use crate::{Error, Result};

use super::device_streams::{arena_bytes_at, arena_bytes_mut_at};
use super::group::{execute_round, Group, P2p};
use super::stream_slices::{Rounds, ALIGN_INPUT};
use super::Communicator;

/// One send or receive of a device group queued in rounds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PieceOp {
    /// A send (else a receive).
    pub send: bool,
    pub dtype: DataType,
    pub peer: usize,
    /// The device buffer's address and bytes.
    pub addr: u64,
    pub len: usize,
}

/// A device group of sends and receives cut into rounds of `piece`-byte pieces, with the
/// arena room its rounds in flight take.
#[derive(Debug, Clone)]
pub(crate) struct P2pRounds {
    ops: Vec<PieceOp>,
    piece: usize,
    rounds: usize,
    window: usize,
    place: usize,
}

impl P2pRounds {
    /// `ops` (in the group's order) in pieces of `piece` bytes: as many rounds as the
    /// longest message has pieces; a round's place holds one piece of every message.
    pub(crate) fn new(ops: Vec<PieceOp>, piece: usize) -> Self {
        let rounds = ops.iter().map(|o| pieces(o.len, piece)).max().unwrap_or(1);
        let place: usize = ops
            .iter()
            .map(|o| o.len.min(piece).next_multiple_of(ALIGN_INPUT))
            .sum();
        let window = slices_in_flight(rounds, place);
        P2pRounds {
            ops,
            piece,
            rounds,
            window,
            place,
        }
    }

    /// How many rounds (1 where every message is one piece).
    #[cfg(feature = "capi")]
    pub(crate) fn rounds(&self) -> usize {
        self.rounds
    }

    /// The operations, in the group's order.
    #[cfg(feature = "capi")]
    pub(crate) fn ops(&self) -> &[PieceOp] {
        &self.ops
    }

    /// Bytes of the stream's arena the rounds in flight take.
    pub(crate) fn arena_bytes(&self) -> usize {
        Window::bytes(self.place, self.window)
    }

    /// Round `k`'s device ranges: one per operation (empty where its message has no piece
    /// `k`), so that staged range `i` is operation `i`'s piece.
    fn groups(&self, k: usize) -> Vec<RangeGroup> {
        self.ops
            .iter()
            .map(|o| {
                let r = piece_range(o.len, self.piece, k);
                RangeGroup {
                    ranges: vec![(o.addr + r.start as u64, r.len())],
                    read: o.send,
                    written: !o.send,
                }
            })
            .collect()
    }
}

/// What a failed round's error gains: the round's index, and where it ran.
pub(crate) type RoundContext = Arc<dyn Fn(Error, usize) -> Error + Send + Sync>;

impl Communicator {
    /// Bytes of one piece of a send or receive (`device_calls::piece_bytes`).
    #[cfg(feature = "capi")]
    pub(crate) fn piece_bytes(&self) -> usize {
        super::device_calls::piece_bytes(&self.inner)
    }
}

impl Communicator {
    /// Queues `r` on `handle`, the caller's stream of `dev`, in `queue` (this communicator's,
    /// or the C ABI's queue of it), one job per round; each round runs its pieces as the
    /// blocking form's round does (`group::execute_round`), a failed one's error passed
    /// through `context`. The last job holds `keep` until the stream has copied every round
    /// back.
    ///
    /// # Safety
    /// Every operation's range is live device memory of `dev` that stays the group's until
    /// the stream has run past it (what `keep` holds, or NCCL's contract); no receive range
    /// overlaps another range of the group; `handle` is the caller's stream of `dev`.
    pub(crate) unsafe fn queue_p2p_rounds<K: Send + 'static>(
        &self,
        queue: &StreamQueue,
        dev: Device,
        handle: usize,
        r: &P2pRounds,
        keep: K,
        context: RoundContext,
    ) -> Result<()> {
        let ops = Arc::new(r.ops.clone());
        let job = |k: usize, st: &Staged| -> Work {
            let at: Vec<(usize, usize)> = (0..ops.len())
                .map(|i| (st.host_at(i).unwrap_or(0), st.len_at(i)))
                .collect();
            let ops = Arc::clone(&ops);
            let inner = Arc::clone(&self.inner);
            let context = Arc::clone(&context);
            Box::new(move || {
                let round: Vec<P2p<'_>> = ops
                    .iter()
                    .zip(&at)
                    .map(|(o, &(host, n))| {
                        let (whole, dtype, peer) = (o.len, o.dtype, o.peer);
                        // SAFETY: `host..host + n` is the arena's copy of this operation's
                        // piece of round `k` (filled by the stream before the gate the worker
                        // waited for, for a send), which no other job uses until this one's
                        // flag and copies back; receive pieces overlap nothing (no receive
                        // range overlaps another, per the caller). Empty pieces use no memory.
                        unsafe {
                            if o.send {
                                P2p::SendPiece {
                                    piece: arena_bytes_at(host, n),
                                    whole,
                                    dtype,
                                    peer,
                                }
                            } else {
                                P2p::RecvPiece {
                                    piece: arena_bytes_mut_at(host, n),
                                    whole,
                                    dtype,
                                    peer,
                                }
                            }
                        }
                    })
                    .collect();
                execute_round(&inner, round, k).map_err(|e| context(e, k))
            })
        };
        let rounds = Rounds {
            dev,
            handle,
            rounds: r.rounds,
            window: r.window,
            place: r.place,
        };
        // SAFETY: every range is a piece of an operation's range, live device memory of `dev`
        // the group's until the stream has run past it, per this function's contract.
        unsafe { self.queue_rounds(queue, &rounds, |k| r.groups(k), keep, job) }
    }
}

impl Group<'_> {
    /// Queues a checked group of device sends and receives (see [`Group::run_on`]) on
    /// `stream` in rounds of `piece`-byte pieces, one job each. Where the rounds in flight
    /// take more than stays in stream order, the stream is synchronized and the group runs
    /// before this returns. `holds` keep the buffers until the stream has copied everything
    /// back.
    pub(super) fn queue_rounds_on(
        self,
        stream: &DeviceStream,
        holds: Vec<Hold>,
        piece: usize,
    ) -> Result<()> {
        let comm = self.comm;
        let (dev, handle) = (stream.device(), stream.handle());
        let ops: Vec<PieceOp> = self
            .ops
            .iter()
            .map(|o| {
                let (send, mem, dtype, peer) = match o {
                    P2p::SendDevice { buf, dtype, peer } => (true, buf.mem(), *dtype, *peer),
                    P2p::RecvDevice { buf, dtype, peer } => (false, buf.mem(), *dtype, *peer),
                    _ => unreachable!("a group on a stream holds device buffers only"),
                };
                PieceOp {
                    send,
                    dtype,
                    peer,
                    addr: mem.addr as u64,
                    len: mem.len,
                }
            })
            .collect();
        let r = P2pRounds::new(ops, piece);
        if !orders_call(dev, r.arena_bytes()) {
            drop(holds);
            stream.synchronize()?;
            return self.run();
        }
        let rank = comm.inner.rank;
        let context: RoundContext = Arc::new(move |e: Error, k: usize| {
            e.append(format!(
                "rank {rank}; the group was queued on a stream and ran after the call \
                 returned (round {k})"
            ))
        });
        // SAFETY: every range is a device buffer of the group, checked live memory of `dev`
        // by `run_on` (which also refused a receive buffer overlapping another), held by
        // `holds` until the stream has copied everything back; `handle` is the caller's
        // stream of `dev` (a `DeviceStream`).
        unsafe { comm.queue_p2p_rounds(&comm.streams, dev, handle, &r, holds, context) }
    }
}

#[cfg(test)]
mod tests {
    use crate::device::{Device, DeviceBuffer, DeviceStream, Provider};
    use crate::{Communicator, Config};

    /// A group of long messages on a stream runs in rounds through a few pieces of the
    /// stream's arena: 17 pieces of 64 KiB each way, two messages to one peer and one to
    /// itself, every element checked, and the arena holds 4 rounds, not the buffers.
    #[test]
    fn a_group_of_long_messages_on_a_stream_holds_the_rounds_in_flight() {
        let dev = Device::new(Provider::Host, 1).unwrap();
        let config = Config {
            device_slice_bytes: Some(64 << 10),
            ..Config::default()
        };
        let comms = Communicator::local_group(2, config).unwrap();
        let n = (1 << 18) + 7; // u32: 17 pieces
        let value = |r: usize, b: usize, i: usize| (r * 100_000_000 + b * 1_000_000 + i) as u32;
        std::thread::scope(|sc| {
            for c in &comms {
                sc.spawn(move || {
                    c.set_device(dev).unwrap();
                    let (r, peer) = (c.rank(), 1 - c.rank());
                    let data = |r: usize, b: usize, len: usize| -> Vec<u32> {
                        (0..len).map(|i| value(r, b, i)).collect()
                    };
                    let s = DeviceStream::new(dev).unwrap();
                    let a = DeviceBuffer::from_host(dev, &data(r, 0, n)).unwrap();
                    let b = DeviceBuffer::from_host(dev, &data(r, 1, 1000)).unwrap();
                    let mut x = DeviceBuffer::<u32>::new(dev, n).unwrap();
                    let mut y = DeviceBuffer::<u32>::new(dev, 1000).unwrap();
                    let mut own = DeviceBuffer::<u32>::new(dev, n).unwrap();
                    let mut g = c.group();
                    g.send_device(&a, peer)
                        .send_device(&b, peer)
                        .send_device(&a, r)
                        .recv_device(&mut x, peer)
                        .recv_device(&mut y, peer)
                        .recv_device(&mut own, r);
                    g.run_on(&s).unwrap();
                    s.synchronize().unwrap();
                    assert!(x.to_vec().unwrap() == data(peer, 0, n), "rank {r}: long");
                    assert!(
                        y.to_vec().unwrap() == data(peer, 1, 1000),
                        "rank {r}: short"
                    );
                    assert!(
                        own.to_vec().unwrap() == data(r, 0, n),
                        "rank {r}: to itself"
                    );
                    let arena = c.streams.arena_bytes();
                    // A round's place: 6 pieces of at most 64 KiB, 4 places (about 1 MiB,
                    // rounded up to 2); the buffers whole would take 4 MiB (8 rounded up).
                    assert!(arena <= 2 << 20, "rank {r}: arena of {arena} bytes");
                    assert!(c.async_error().is_none());
                });
            }
        });
    }
}
