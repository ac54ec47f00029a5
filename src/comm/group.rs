//! Groups of point-to-point operations that run together.

use ferroccl_kernels::{as_bytes, as_bytes_mut, DataType, ElemOp, Element};

use super::Communicator;
use crate::exec::{OpContext, RawOp};
use crate::wire::{kind, op};
use crate::{Error, Result};

#[derive(Debug)]
enum P2p<'a> {
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
    comm: &'a Communicator,
    ops: Vec<P2p<'a>>,
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

    /// Runs every operation of the group and waits for all of them.
    pub fn run(self) -> Result<()> {
        // Stream jobs queued earlier run first, on every rank alike.
        self.comm.streams.drain_if_used();
        let inner = &self.comm.inner;
        let (rank, n) = (inner.rank, inner.nranks);
        let gno = inner
            .groups
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        for o in &self.ops {
            let (peer, what) = match o {
                P2p::Send { peer, .. } => (*peer, "send"),
                P2p::Recv { peer, .. } => (*peer, "recv"),
            };
            if peer >= n {
                return Err(Error::invalid_argument(format!(
                    "{what} on rank {rank}: invalid peer {peer} (peer must be 0..{})",
                    n - 1
                )));
            }
        }
        if let Some(e) = inner.failed_error() {
            return Err(e);
        }
        let ticket = inner.ticket();
        let mut ops = self.ops;
        inner.execute(ticket, |engine| {
            // Messages to self are copies, matched in order.
            let mut self_sends: Vec<&[u8]> = Vec::new();
            let mut raw = engine.take_ops();
            let mut dtype = DataType::Uint8;
            for o in ops.iter_mut() {
                match o {
                    P2p::Send { buf, peer, .. } if *peer == rank => self_sends.push(buf),
                    P2p::Send { buf, dtype: d, peer } => {
                        engine.p2p_sent[*peer] += 1;
                        dtype = *d;
                        raw.push(RawOp::Send {
                            peer: *peer,
                            ptr: buf.as_ptr(),
                            len: buf.len(),
                            header: p2p_header(*d, buf.len(), engine.p2p_sent[*peer]),
                        });
                    }
                    P2p::Recv { .. } => {}
                }
            }
            let mut self_recv = 0;
            for o in ops.iter_mut() {
                if let P2p::Recv { buf, dtype: d, peer } = o {
                    if *peer == rank {
                        let src = self_sends.get(self_recv).ok_or_else(|| {
                            Error::invalid_usage(format!(
                                "group on rank {rank}: a receive from self has no matching send to self"
                            ))
                        })?;
                        if src.len() != buf.len() {
                            return Err(Error::invalid_argument(format!(
                                "group on rank {rank}: send to self of {} bytes, receive from self of {} bytes",
                                src.len(),
                                buf.len()
                            )));
                        }
                        buf.copy_from_slice(src);
                        self_recv += 1;
                    } else {
                        engine.p2p_recvd[*peer] += 1;
                        raw.push(RawOp::Recv {
                            peer: *peer,
                            ptr: buf.as_mut_ptr(),
                            len: buf.len(),
                            header: p2p_header(*d, buf.len(), engine.p2p_recvd[*peer]),
                        });
                    }
                }
            }
            if self_recv != self_sends.len() {
                return Err(Error::invalid_usage(format!(
                    "group on rank {rank}: {} send(s) to self but {self_recv} receive(s) from self",
                    self_sends.len()
                )));
            }
            if raw.is_empty() {
                engine.return_ops(raw);
                return Ok(());
            }
            let ctx = OpContext {
                name: "send/recv group",
                seq: gno,
                rank,
                kind: kind::SEND_RECV,
                dtype,
                op: op::NONE,
                count: 0,
                root: u32::MAX,
            };
            let r = engine.run_step(&raw, DataType::Uint8, ElemOp::Sum, &ctx);
            engine.return_ops(raw);
            r
        })
    }
}

fn p2p_header(dtype: DataType, len: usize, seq: u64) -> ferroccl_transport::Header {
    ferroccl_transport::Header {
        kind: kind::SEND_RECV,
        dtype: dtype as u8,
        op: op::NONE,
        seq,
        count: (len / dtype.size()) as u64,
        root: u32::MAX,
        len: len as u64,
    }
}
