//! Groups of point-to-point operations that run together.
//!
//! Device buffers go straight to a transport that reads and writes their memory (the GPU
//! peer-to-peer transport); to any other, through the communicator's pinned staging: copies
//! made before the group's step (sends) and after it (receives), each group's buffers one
//! after another in the staging buffers, which are kept for later groups.

use ferroccl_kernels::{as_bytes, as_bytes_mut, DataType, ElemOp, Element};
use ferroccl_transport::MemRef;

use super::{Communicator, Inner};
use crate::device::staging::spans_bytes;
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
        let mut st = super::lock(&self.comm.device);
        let staging = Communicator::staging(&mut st, dev)?;
        execute(inner, self.ops, Some(staging))
    }
}

/// Every operation's peer is a rank of the communicator.
pub(super) fn check_peers(inner: &Inner, ops: &[P2p<'_>]) -> Result<()> {
    let (rank, n) = (inner.rank, inner.nranks);
    for o in ops {
        let (peer, what) = match o {
            P2p::Send { peer, .. } | P2p::SendDevice { peer, .. } => (*peer, "send"),
            P2p::Recv { peer, .. } | P2p::RecvDevice { peer, .. } => (*peer, "recv"),
        };
        if peer >= n {
            return Err(Error::invalid_argument(format!(
                "{what} on rank {rank}: invalid peer {peer} (peer must be 0..{})",
                n - 1
            )));
        }
    }
    Ok(())
}

/// Runs checked operations (peers checked, device buffers checked and idle) as one step, in
/// the communicator's issue order; device buffers a peer's transport cannot reach go through
/// `staging` (the communicator's, for its bound device; needed only for such buffers).
pub(super) fn execute(
    inner: &Inner,
    mut ops: Vec<P2p<'_>>,
    mut staging: Option<&mut Staging>,
) -> Result<()> {
    let rank = inner.rank;
    let gno = inner
        .groups
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        + 1;
    let ticket = inner.ticket();
    inner.execute(ticket, |engine| {
            // Device buffers that the peer's transport cannot reach (and any to or from self)
            // go through the pinned staging: copied in here for sends, back after the step for
            // receives.
            let staged = |engine: &crate::exec::Engine, peer: usize, mem: MemRef| {
                peer == rank || !engine.accepts(peer, mem.space)
            };
            let (mut sends, mut recvs) = (Vec::new(), Vec::new());
            for o in &ops {
                match o {
                    P2p::SendDevice { buf, peer, .. } if staged(engine, *peer, buf.mem()) => {
                        sends.push((buf.mem().addr as u64, buf.mem().len))
                    }
                    P2p::RecvDevice { buf, peer, .. } if staged(engine, *peer, buf.mem()) => {
                        recvs.push((buf.mem().addr as u64, buf.mem().len))
                    }
                    _ => {}
                }
            }
            if staging.is_none() && !(sends.is_empty() && recvs.is_empty()) {
                return Err(Error::internal(format!(
                    "send/recv group on rank {rank}: device buffers to stage, no staging"
                )));
            }
            if let Some(s) = staging.as_deref_mut() {
                s.reserve(spans_bytes(&sends), spans_bytes(&recvs))?;
                // SAFETY: the spans are device buffers of the group, checked live memory of
                // the staging's device (`Group::run`), borrowed by the group while it runs.
                unsafe { s.stage_spans_in(&sends) }?;
            }
            let (sent_copies, mut recv_copies) = match staging.as_deref_mut() {
                Some(s) => s.span_views(&sends, &recvs)?,
                None => (Vec::new(), Vec::new()),
            };
            // Messages to self are copies, matched in order.
            let mut self_sends: Vec<&[u8]> = Vec::new();
            let mut raw = engine.take_ops();
            let mut dtype = DataType::Uint8;
            let mut copies = sent_copies.into_iter();
            for o in ops.iter() {
                let (buf, d, peer): (&[u8], DataType, usize) = match o {
                    P2p::Send { buf, dtype, peer } => (buf, *dtype, *peer),
                    P2p::SendDevice { buf, dtype, peer } if staged(engine, *peer, buf.mem()) => {
                        (copies.next().expect("one copy per staged send"), *dtype, *peer)
                    }
                    P2p::SendDevice { buf, dtype: d, peer } => {
                        engine.p2p_sent[*peer] += 1;
                        dtype = *d;
                        let mem = buf.mem();
                        raw.push(RawOp::SendDevice {
                            peer: *peer,
                            mem,
                            header: p2p_header(*d, mem.len, engine.p2p_sent[*peer]),
                        });
                        continue;
                    }
                    P2p::Recv { .. } | P2p::RecvDevice { .. } => continue,
                };
                if peer == rank {
                    self_sends.push(buf);
                } else {
                    engine.p2p_sent[peer] += 1;
                    dtype = d;
                    raw.push(RawOp::Send {
                        peer,
                        ptr: buf.as_ptr(),
                        len: buf.len(),
                        header: p2p_header(d, buf.len(), engine.p2p_sent[peer]),
                    });
                }
            }
            let mut self_recv = 0;
            let mut copies = recv_copies.iter_mut();
            for o in ops.iter_mut() {
                let (buf, d, peer): (&mut [u8], DataType, usize) = match o {
                    P2p::Recv { buf, dtype, peer } => (buf, *dtype, *peer),
                    P2p::RecvDevice { buf, dtype, peer } if staged(engine, *peer, buf.mem()) => {
                        let copy = copies.next().expect("one copy per staged receive");
                        (copy, *dtype, *peer)
                    }
                    P2p::RecvDevice { buf, dtype, peer } => {
                        engine.p2p_recvd[*peer] += 1;
                        let mem = buf.mem();
                        raw.push(RawOp::RecvDevice {
                            peer: *peer,
                            mem,
                            header: p2p_header(*dtype, mem.len, engine.p2p_recvd[*peer]),
                        });
                        continue;
                    }
                    P2p::Send { .. } | P2p::SendDevice { .. } => continue,
                };
                if peer == rank {
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
                    engine.p2p_recvd[peer] += 1;
                    raw.push(RawOp::Recv {
                        peer,
                        ptr: buf.as_mut_ptr(),
                        len: buf.len(),
                        header: p2p_header(d, buf.len(), engine.p2p_recvd[peer]),
                    });
                }
            }
            if self_recv != self_sends.len() {
                return Err(Error::invalid_usage(format!(
                    "group on rank {rank}: {} send(s) to self but {self_recv} receive(s) from self",
                    self_sends.len()
                )));
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
            let r = if raw.is_empty() {
                Ok(())
            } else {
                engine.run_step(&raw, DataType::Uint8, ElemOp::Sum, &ctx)
            };
            engine.return_ops(raw);
            r?;
            match staging {
                // SAFETY: the receive spans are device buffers of the group, checked live
                // memory of the staging's device and borrowed mutably by it while it runs.
                Some(s) if !recvs.is_empty() => unsafe { s.stage_spans_out(&recvs) },
                _ => Ok(()),
            }
        })
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
