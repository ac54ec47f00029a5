//! Stream-ordered collectives on device buffers: `*_device_on` takes a [`DeviceStream`] and
//! returns as soon as the job is queued; work queued on the stream afterwards sees the result.
//!
//! On the caller's thread every check of the blocking form runs first (an error is returned at
//! once, with the same message). Then, all on the caller's stream and queued during the call:
//! copies of the buffers the collective reads into the stream's pinned arena, a gate (a word
//! the stream writes), the wait for the job's completion flag, and the copies of the result
//! back (`device::stream_stage`). The queue's thread waits for the gate by polling host
//! memory, runs the host collective on the arena and stores the flag, so the stream goes on;
//! it makes no driver call. It then waits, the same way, until the stream has run the copies
//! back, and only then lets the buffers go (host access and `Drop` wait for that).
//!
//! With the CUDA provider a call that would stage more than
//! [`ORDER_MAX_BYTES`](crate::device::stream_queue::ORDER_MAX_BYTES) blocks instead, unless
//! `FERRO_STREAM_WAITS=1`; `FERRO_STREAM_WAITS=0` makes every call block (docs/CUDA.md).
//!
//! | case | what happens |
//! |---|---|
//! | the job fails | the stream is still released; the error becomes the communicator's ([`Communicator::async_error`]) and later calls fail with it |
//! | [`Communicator::abort`] | queued jobs fail without running, their streams are released |
//! | a blocking call (host or device, a group, send/recv) or an `*_async` host call on the communicator | waits until every queued job has finished |
//! | host access to a buffer a queued job uses | waits for that job ([`DeviceBuffer`]'s pending count) |
//! | a CUDA device whose streams cannot wait on host memory | the call synchronizes the stream and blocks (said once in the log) |

use std::sync::Arc;

use ferroccl_kernels::{DataType, Element};

use crate::coll::CollKind;
use crate::device::stream_queue::{landing, orders_call, record_gates};
use crate::device::stream_stage::{arena_bytes, Span};
use crate::device::{DeviceBuffer, DeviceStream, Hold};
use crate::{Error, Result};

use super::call::header_kind;
use super::group::{check_peers, DeviceBytes, P2p};
use super::*;

/// The hold that keeps host access to a buffer and its `Drop` waiting until a queued job
/// and its copies back are over.
struct Held {
    _hold: Hold,
}

impl Held {
    fn of<T: Element>(b: &DeviceBuffer<T>) -> Held {
        Held { _hold: b.hold() }
    }
}

impl Communicator {
    #[allow(clippy::too_many_arguments)]
    fn run_device_on<T: Element>(
        &self,
        kind: CollKind,
        send: Option<&DeviceBuffer<T>>,
        recv: &mut DeviceBuffer<T>,
        count: usize,
        op: ReduceOp,
        stream: &DeviceStream,
    ) -> Result<()> {
        let (name, rank) = (kind.name(), self.inner.rank);
        let dev = self.check_device(kind, send, recv, count, op)?;
        if stream.device() != dev {
            return Err(Error::invalid_argument(format!(
                "{name} on rank {rank}: the stream is on {}; this communicator uses {dev}",
                stream.device()
            )));
        }
        // SAFETY: `stream` is a live stream of `dev` (a `DeviceStream`).
        unsafe { dev.check_not_capturing(|| format!("{name} on rank {rank}"), stream.raw()) }?;
        if let Some(e) = self.streams.failed() {
            return Err(e);
        }
        if !self.stream_jobs_supported(dev, &[stream.handle()]) {
            stream.synchronize()?;
            return self.run_device(kind, send, recv, count, op);
        }
        let handle = stream.handle();
        let es = T::DTYPE.size();
        let is_root = kind.root() == Some(rank);
        let send_read = !matches!(kind, CollKind::Broadcast { .. }) || is_root;
        let recv_written = !matches!(kind, CollKind::Reduce { .. }) || is_root;
        let (in_len, out_len) = (send.map_or(0, |s| s.len()), recv.len());
        let in_place = send.is_none();
        // The ranges the job reads and writes, staged through the stream's pinned arena by
        // copies queued on the stream now (`device::stream_stage`): the job runs the host
        // collective on the arena and makes no driver call.
        let mut spans = vec![Span {
            addr: recv.addr(),
            len: recv.bytes(),
            read: in_place,
            written: recv_written,
        }];
        if let Some(s) = send.filter(|_| send_read) {
            spans.push(Span {
                addr: s.addr(),
                len: s.bytes(),
                read: true,
                written: false,
            });
        }
        if !orders_call(dev, arena_bytes(&spans)) {
            stream.synchronize()?;
            return self.run_device(kind, send, recv, count, op);
        }
        // SAFETY: both buffers are live device memory of `dev` (checked above), held below
        // until the stream has run the copies back; `handle` is a stream of `dev`.
        let st = unsafe { self.streams.stage(dev, handle, &spans) }?;
        let recv_at = st.host_of(recv.addr()).unwrap_or(0);
        let send_at = send
            .filter(|_| send_read)
            .map(|s| st.host_of(s.addr()).unwrap_or(0));
        let gates = record_gates(dev, &[handle])?;
        let holds = (Held::of(recv), send.map(Held::of));
        let inner = Arc::clone(&self.inner);
        let work = Box::new(move || {
            let run = || {
                // SAFETY: `recv_at` and `send_at` are the arena copies of the buffers
                // (`out_len` and `in_len` elements, 0 where empty), which the stream filled
                // before the gate the worker waited for, and which no other job uses until
                // this one's flag (the stream runs the next job's copies after it).
                let (input, output) = unsafe {
                    let output: &mut [u8] = if out_len == 0 {
                        &mut []
                    } else {
                        std::slice::from_raw_parts_mut(recv_at as *mut u8, out_len * es)
                    };
                    let input: Option<&[u8]> = match (in_len, send_at) {
                        (_, None) if in_place => None,
                        (0, _) | (_, None) => Some(&[]),
                        (n, Some(at)) => Some(std::slice::from_raw_parts(at as *const u8, n * es)),
                    };
                    (input, output)
                };
                super::calls::blocking_on(
                    &inner,
                    kind.name(),
                    header_kind(kind),
                    kind,
                    input,
                    output,
                    count,
                    T::DTYPE,
                    op,
                )
            };
            let r = run();
            if let Err(e) = &r {
                inner.fail(e.clone());
            }
            r
        });
        // After the job: wait until the stream has run the copies back, then let the buffers
        // go, so host access and `Drop` see the result.
        let (landed, after) = landing(holds);
        self.streams
            .enqueue(dev, &[handle], gates, work, Some(after))?;
        // SAFETY: as for the staging above.
        let g = unsafe { self.streams.copy_back(dev, handle, &st) }?;
        let _ = landed.send(vec![g]);
        Ok(())
    }

    // ----- typed stream-ordered entries -----

    /// [`Communicator::all_reduce_device`] ordered on `stream`: returns once queued.
    pub fn all_reduce_device_on<T: Element>(
        &self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        op: ReduceOp,
        stream: &DeviceStream,
    ) -> Result<()> {
        let count = send.len();
        self.run_device_on(CollKind::AllReduce, Some(send), recv, count, op, stream)
    }

    /// [`Communicator::all_reduce_device_in_place`] ordered on `stream`.
    pub fn all_reduce_device_in_place_on<T: Element>(
        &self,
        buf: &mut DeviceBuffer<T>,
        op: ReduceOp,
        stream: &DeviceStream,
    ) -> Result<()> {
        let count = buf.len();
        self.run_device_on(CollKind::AllReduce, None, buf, count, op, stream)
    }

    /// [`Communicator::broadcast_device`] ordered on `stream`.
    pub fn broadcast_device_on<T: Element>(
        &self,
        buf: &mut DeviceBuffer<T>,
        root: usize,
        stream: &DeviceStream,
    ) -> Result<()> {
        let count = buf.len();
        let kind = CollKind::Broadcast { root };
        self.run_device_on(kind, None, buf, count, ReduceOp::Sum, stream)
    }

    /// [`Communicator::reduce_device`] ordered on `stream`.
    pub fn reduce_device_on<T: Element>(
        &self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        op: ReduceOp,
        root: usize,
        stream: &DeviceStream,
    ) -> Result<()> {
        let count = send.len();
        let kind = CollKind::Reduce { root };
        self.run_device_on(kind, Some(send), recv, count, op, stream)
    }

    /// [`Communicator::all_gather_device`] ordered on `stream`.
    pub fn all_gather_device_on<T: Element>(
        &self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        stream: &DeviceStream,
    ) -> Result<()> {
        let count = send.len();
        let kind = CollKind::AllGather;
        self.run_device_on(kind, Some(send), recv, count, ReduceOp::Sum, stream)
    }

    /// [`Communicator::all_to_all_device`] ordered on `stream`: `send` holds `nranks` blocks
    /// of `send.len() / nranks` elements, block `j` going to rank `j`; `recv` the same size.
    pub fn all_to_all_device_on<T: Element>(
        &self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        stream: &DeviceStream,
    ) -> Result<()> {
        let (rank, n) = (self.inner.rank, self.inner.nranks);
        if !send.len().is_multiple_of(n) {
            return Err(Error::invalid_argument(format!(
                "all_to_all on rank {rank}: buffer of {} elements is not a multiple of nranks {n}",
                send.len()
            )));
        }
        let count = send.len() / n;
        let kind = CollKind::AllToAll;
        self.run_device_on(kind, Some(send), recv, count, ReduceOp::Sum, stream)
    }

    /// [`Communicator::send_device`] ordered on `stream`: returns once queued; the peer may
    /// receive in any form.
    pub fn send_device_on<T: Element>(
        &self,
        buf: &DeviceBuffer<T>,
        peer: usize,
        stream: &DeviceStream,
    ) -> Result<()> {
        let mut g = self.group();
        g.send_device(buf, peer);
        g.run_on(stream)
    }

    /// [`Communicator::recv_device`] ordered on `stream`: later work on the stream sees the
    /// received bytes.
    pub fn recv_device_on<T: Element>(
        &self,
        buf: &mut DeviceBuffer<T>,
        peer: usize,
        stream: &DeviceStream,
    ) -> Result<()> {
        let mut g = self.group();
        g.recv_device(buf, peer);
        g.run_on(stream)
    }

    /// [`Communicator::reduce_scatter_device`] ordered on `stream`.
    pub fn reduce_scatter_device_on<T: Element>(
        &self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        op: ReduceOp,
        stream: &DeviceStream,
    ) -> Result<()> {
        let count = recv.len();
        self.run_device_on(CollKind::ReduceScatter, Some(send), recv, count, op, stream)
    }
}

impl Group<'_> {
    /// Queues the group on `stream`, as `ncclGroupStart`, `ncclSend`/`ncclRecv` on one
    /// stream, `ncclGroupEnd` do: returns once queued, the operations start when earlier work
    /// on the stream is done, and later work on the stream sees the received bytes. Every
    /// operation must be on a device buffer ([`Group::send_device`], [`Group::recv_device`])
    /// of the communicator's device, and no receive buffer may overlap another buffer of the
    /// group. The buffers are staged through the stream's pinned arena, as the other
    /// stream-ordered calls are (see the module docs); on a device whose streams cannot wait,
    /// with `FERRO_STREAM_WAITS=0`, and on CUDA for a group too large for the arena (see the
    /// module docs), the call synchronizes the stream and runs the group before it returns.
    ///
    /// ```
    /// use ferroccl::device::{Device, DeviceBuffer, DeviceStream, Provider};
    /// use ferroccl::{Communicator, Config};
    ///
    /// let dev = Device::new(Provider::Host, 0).unwrap(); // the host stand-in
    /// let comms = Communicator::local_group(2, Config::default()).unwrap();
    /// std::thread::scope(|s| {
    ///     for c in &comms {
    ///         s.spawn(move || {
    ///             c.set_device(dev).unwrap();
    ///             let stream = DeviceStream::new(dev).unwrap();
    ///             let mine = DeviceBuffer::from_host(dev, &[c.rank() as u32; 4]).unwrap();
    ///             let mut theirs = DeviceBuffer::<u32>::new(dev, 4).unwrap();
    ///             let peer = 1 - c.rank();
    ///             let mut g = c.group();
    ///             g.send_device(&mine, peer);
    ///             g.recv_device(&mut theirs, peer);
    ///             g.run_on(&stream).unwrap();
    ///             stream.synchronize().unwrap();
    ///             assert_eq!(theirs.to_vec().unwrap(), [peer as u32; 4]);
    ///         });
    ///     }
    /// });
    /// ```
    pub fn run_on(self, stream: &DeviceStream) -> Result<()> {
        let comm = self.comm;
        let rank = comm.inner.rank;
        check_peers(&comm.inner, &self.ops)?;
        // (address, bytes, written) of every buffer, checked on the communicator's device.
        let mut spans: Vec<Span> = Vec::with_capacity(self.ops.len());
        let mut holds = Vec::with_capacity(self.ops.len());
        let mut bound = None;
        let mut mems = Vec::with_capacity(self.ops.len());
        for (i, o) in self.ops.iter().enumerate() {
            let (buf, what, written): (&dyn DeviceBytes, &str, bool) = match o {
                P2p::SendDevice { buf, .. } => (*buf, "send", false),
                P2p::RecvDevice { buf, .. } => (&**buf, "receive", true),
                P2p::Send { .. } | P2p::Recv { .. } => {
                    return Err(Error::invalid_argument(format!(
                        "send/recv group on rank {rank}: operation {i} is on host memory; a \
                         group run on a stream takes device buffers only (Group::send_device, \
                         Group::recv_device), or run it with Group::run"
                    )))
                }
            };
            let dev = buf.check(comm, what)?;
            bound = Some(dev);
            if stream.device() != dev {
                return Err(Error::invalid_argument(format!(
                    "send/recv group on rank {rank}: the stream is on {}; this communicator \
                     uses {dev}",
                    stream.device()
                )));
            }
            let mem = buf.mem();
            mems.push((mem, written));
            spans.push(Span {
                addr: mem.addr as u64,
                len: mem.len,
                read: !written,
                written,
            });
            holds.push(buf.hold());
        }
        let Some(dev) = bound else {
            // No operation: nothing to queue.
            return Ok(());
        };
        for (i, (a, aw)) in mems.iter().enumerate() {
            for (b, bw) in &mems[i + 1..] {
                if (*aw || *bw) && a.len > 0 && b.len > 0 && a.overlaps(b) {
                    return Err(Error::invalid_argument(format!(
                        "send/recv group on rank {rank}: device buffers 0x{:x} ({} bytes) and \
                         0x{:x} ({} bytes) overlap and one of them is a receive buffer",
                        a.addr, a.len, b.addr, b.len
                    )));
                }
            }
        }
        let call = || format!("send/recv group on rank {rank}");
        // SAFETY: `stream` is a live stream of `dev` (a `DeviceStream`).
        unsafe { dev.check_not_capturing(call, stream.raw()) }?;
        if let Some(e) = comm.streams.failed().or_else(|| comm.inner.failed_error()) {
            return Err(e);
        }
        if !comm.stream_jobs_supported(dev, &[stream.handle()]) {
            drop(holds);
            stream.synchronize()?;
            return self.run();
        }
        let handle = stream.handle();
        if !orders_call(dev, arena_bytes(&spans)) {
            drop(holds);
            stream.synchronize()?;
            return self.run();
        }
        // The job's operations, on the arena's copies: (send?, host address, bytes, dtype,
        // peer).
        // SAFETY: every span is live device memory of `dev` (checked above), held below until
        // the stream has run the copies back; `handle` is a stream of `dev`.
        let st = unsafe { comm.streams.stage(dev, handle, &spans) }?;
        let plan: Vec<(bool, usize, usize, DataType, usize)> = self
            .ops
            .iter()
            .zip(&spans)
            .map(|(o, sp)| {
                let at = st.host_of(sp.addr).unwrap_or(0);
                match o {
                    P2p::SendDevice { dtype, peer, .. } => (true, at, sp.len, *dtype, *peer),
                    P2p::RecvDevice { dtype, peer, .. } => (false, at, sp.len, *dtype, *peer),
                    P2p::Send { .. } | P2p::Recv { .. } => unreachable!("refused above"),
                }
            })
            .collect();
        let gates = record_gates(dev, &[handle])?;
        let inner = Arc::clone(&comm.inner);
        let work = Box::new(move || {
            let ops: Vec<P2p<'_>> = plan
                .iter()
                .map(|&(send, at, len, dtype, peer)| {
                    // SAFETY: `at..at + len` is the arena's copy of the operation's buffer
                    // (filled by the stream before the gate the worker waited for where it is
                    // sent), which no other job uses until this one's flag; no receive range
                    // overlaps another range (checked above). Empty ranges use no memory.
                    unsafe {
                        if send {
                            let b: &[u8] = if len == 0 {
                                &[]
                            } else {
                                std::slice::from_raw_parts(at as *const u8, len)
                            };
                            P2p::Send {
                                buf: b,
                                dtype,
                                peer,
                            }
                        } else {
                            let b: &mut [u8] = if len == 0 {
                                &mut []
                            } else {
                                std::slice::from_raw_parts_mut(at as *mut u8, len)
                            };
                            P2p::Recv {
                                buf: b,
                                dtype,
                                peer,
                            }
                        }
                    }
                })
                .collect();
            let r = super::group::execute(&inner, ops).map_err(|e| {
                e.append(format!(
                    "rank {}; the group was queued on a stream and ran after the call returned",
                    inner.rank
                ))
            });
            if let Err(e) = &r {
                inner.fail(e.clone());
            }
            r
        });
        let (landed, after) = landing(holds);
        comm.streams
            .enqueue(dev, &[handle], gates, work, Some(after))?;
        // SAFETY: as for the staging above.
        let g = unsafe { comm.streams.copy_back(dev, handle, &st) }?;
        let _ = landed.send(vec![g]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::device::{host_stream, Device, DeviceBuffer, DeviceStream, Provider};
    use crate::{Communicator, Config, ErrorKind, ReduceOp};

    #[test]
    fn a_stream_being_captured_into_a_graph_is_refused_before_anything_is_queued() {
        let dev = Device::new(Provider::Host, 0).unwrap();
        let c = Communicator::local_group(1, Config::default())
            .unwrap()
            .remove(0);
        c.set_device(dev).unwrap();
        let s = DeviceStream::new(dev).unwrap();
        let send = DeviceBuffer::from_host(dev, &[1.0f32, 2.0, 3.0]).unwrap();
        let mut recv = DeviceBuffer::<f32>::new(dev, 3).unwrap();
        host_stream::set_capturing(s.handle(), true);
        let e = c
            .all_reduce_device_on(&send, &mut recv, ReduceOp::Sum, &s)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUsage, "{e}");
        for part in ["all_reduce", "rank 0", "captured into a CUDA graph"] {
            assert!(e.message().contains(part), "{part:?} in {e}");
        }
        let mut g = c.group();
        g.send_device(&send, 0).recv_device(&mut recv, 0);
        let e = g.run_on(&s).unwrap_err();
        assert!(e.message().contains("send/recv group on rank 0"), "{e}");
        assert_eq!(host_stream::pending(s.handle()), 0, "nothing was queued");
        // Once the capture ends, the same calls run.
        host_stream::set_capturing(s.handle(), false);
        c.all_reduce_device_on(&send, &mut recv, ReduceOp::Sum, &s)
            .unwrap();
        s.synchronize().unwrap();
        assert_eq!(recv.to_vec().unwrap(), [1.0, 2.0, 3.0]);
    }
}
