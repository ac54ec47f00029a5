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

use std::ops::Range;

use ferroccl_kernels::{DataType, Element};

use crate::coll::CollKind;
use crate::device::direct::StreamCall;
use crate::device::stream_queue::orders_call;
use crate::device::{DeviceBuffer, DeviceStream, Hold};
use crate::{Error, Result};

use super::device_calls::call_count;
use super::group::{check_peers, DeviceBytes, P2p};
use super::*;

/// The hold that keeps host access to a buffer and its `Drop` waiting until a queued job
/// and its copies back are over.
pub(super) struct Held {
    _hold: Hold,
}

impl Held {
    pub(super) fn of<T: Element>(b: &DeviceBuffer<T>) -> Held {
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
        let dev = self.check_device(kind, send, recv, count, op, true)?;
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
        let handle = stream.handle();
        if self.orders_between_buffers(dev, handle) {
            // Straight between the ranks' buffers, in stream order (`exec::peer`): the
            // buffers are held until the stream has run the call.
            let mut holds = vec![recv.hold()];
            holds.extend(send.map(DeviceBuffer::hold));
            let call = StreamCall {
                stream: handle,
                holds,
            };
            return self.run_device_at(dev, kind, send, recv, count, op, Some(call));
        }
        if !self.stream_jobs_supported(dev, &[handle]) {
            stream.synchronize()?;
            return self.run_device(kind, send, recv, count, op);
        }
        // The ranges the jobs read and write are staged through the stream's pinned arena by
        // copies queued on the stream now (`device::stream_stage`): the jobs run the host
        // collective on the arena and make no driver call. Cut into slices as the blocking
        // form cuts the call, the slices in flight staged at once (`stream_slices`).
        let arena = self.slices_arena_bytes(dev, kind, send, recv, count);
        if !orders_call(dev, arena) {
            stream.synchronize()?;
            return self.run_device(kind, send, recv, count, op);
        }
        self.run_slices_on(dev, kind, send, recv, count, op, handle)
    }

    /// [`Communicator::raw_collective_device`] ordered on `stream`, as the typed `*_device_on`
    /// calls are: byte ranges of device buffers holding elements of `dtype` (`send: None`: in
    /// place), checked now, queued on the stream, and the call returns at once. Host access to
    /// either buffer and its `Drop` wait until the job is over. The entry of code that holds
    /// raw device memory of one element type per call (the Python backend's tensors).
    ///
    /// ```
    /// use ferroccl::coll::CollKind;
    /// use ferroccl::device::{Device, DeviceBuffer, DeviceStream, Provider};
    /// use ferroccl::{Communicator, Config, DataType, ReduceOp};
    ///
    /// let dev = Device::new(Provider::Host, 0).unwrap(); // the host stand-in
    /// let c = Communicator::local_group(1, Config::default()).unwrap().remove(0);
    /// c.set_device(dev).unwrap();
    /// let stream = DeviceStream::new(dev).unwrap();
    /// let bytes: Vec<u8> = [1.5f32, 2.5].iter().flat_map(|x| x.to_ne_bytes()).collect();
    /// let mut buf = DeviceBuffer::from_host(dev, &bytes).unwrap();
    /// c.raw_collective_device_on(
    ///     CollKind::AllReduce, None, (&mut buf, 0..8), DataType::Float32, ReduceOp::Sum, &stream,
    /// )
    /// .unwrap();
    /// stream.synchronize().unwrap();
    /// assert_eq!(buf.to_vec().unwrap(), bytes);
    /// ```
    pub fn raw_collective_device_on(
        &self,
        kind: CollKind,
        send: Option<(&DeviceBuffer<u8>, Range<usize>)>,
        recv: (&mut DeviceBuffer<u8>, Range<usize>),
        dtype: DataType,
        op: ReduceOp,
        stream: &DeviceStream,
    ) -> Result<()> {
        self.check_raw_ranges(kind, send.as_ref(), (&*recv.0, &recv.1), dtype)?;
        ferroccl_kernels::with_element!(dtype, T => {
            let s = send.as_ref().map(|(b, r)| b.typed_part::<T>(r));
            let mut r = recv.0.typed_part::<T>(&recv.1);
            let (rank, n) = (self.inner.rank, self.inner.nranks);
            let count = call_count(kind, rank, s.as_ref().map(|s| s.len()), r.len(), n)?;
            self.run_device_on(kind, s.as_deref(), &mut r, count, op, stream)
        })
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
        // Every buffer, checked on the communicator's device, with whether it is written.
        let mut holds = Vec::with_capacity(self.ops.len());
        let mut bound = None;
        let mut mems = Vec::with_capacity(self.ops.len());
        for (i, o) in self.ops.iter().enumerate() {
            let (buf, what, written): (&dyn DeviceBytes, &str, bool) = match o {
                P2p::SendDevice { buf, .. } => (*buf, "send", false),
                P2p::RecvDevice { buf, .. } => (&**buf, "receive", true),
                P2p::Send { .. }
                | P2p::Recv { .. }
                | P2p::SendPiece { .. }
                | P2p::RecvPiece { .. } => {
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
            mems.push((buf.mem(), written));
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
        // Every group goes in rounds of pieces (one round where every message is one
        // piece), as the blocking form cuts it.
        let piece = super::device_calls::piece_bytes(&comm.inner);
        self.queue_rounds_on(stream, holds, piece)
    }
}

/// A stream job's `len` bytes of the arena at `at`, read (empty, touching nothing, for 0).
///
/// # Safety
/// `at..at + len` is arena memory that nothing writes for the lifetime the caller picks.
pub(super) unsafe fn arena_bytes_at<'a>(at: usize, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: per the caller.
    unsafe { std::slice::from_raw_parts(at as *const u8, len) }
}

/// As [`arena_bytes_at`], written.
///
/// # Safety
/// `at..at + len` is arena memory that nothing else reads or writes for the lifetime the
/// caller picks.
pub(super) unsafe fn arena_bytes_mut_at<'a>(at: usize, len: usize) -> &'a mut [u8] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: per the caller.
    unsafe { std::slice::from_raw_parts_mut(at as *mut u8, len) }
}

#[cfg(test)]
mod tests {
    use crate::coll::CollKind;
    use crate::device::{host_stream, Device, DeviceBuffer, DeviceStream, Provider};
    use crate::{Communicator, Config, DataType, ErrorKind, ReduceOp};

    fn f64_bytes(v: impl IntoIterator<Item = f64>) -> Vec<u8> {
        v.into_iter().flat_map(f64::to_ne_bytes).collect()
    }

    #[test]
    fn raw_collectives_on_a_stream_run_on_byte_ranges_and_hold_their_buffer() {
        let dev = Device::new(Provider::Host, 0).unwrap();
        let n = 3;
        let comms = Communicator::local_group(n, Config::default()).unwrap();
        std::thread::scope(|s| {
            for c in &comms {
                s.spawn(move || {
                    c.set_device(dev).unwrap();
                    let r = c.rank() as f64;
                    let stream = DeviceStream::new(dev).unwrap();
                    // all_reduce in place on bytes 8.. of a 7-element buffer (element 0 kept).
                    let host: Vec<f64> = (0..7).map(|i| 10.0 * i as f64 + r).collect();
                    let mut buf = DeviceBuffer::from_host(dev, &f64_bytes(host.clone())).unwrap();
                    let (kind, dt, op) = (CollKind::AllReduce, DataType::Float64, ReduceOp::Sum);
                    c.raw_collective_device_on(kind, None, (&mut buf, 8..56), dt, op, &stream)
                        .unwrap();
                    assert_eq!(buf.pending_jobs(), 1, "the view's job holds the buffer");
                    // all_gather of 2 elements per rank into a second buffer.
                    let send = DeviceBuffer::from_host(dev, &f64_bytes([r, -r])).unwrap();
                    let mut all = DeviceBuffer::<u8>::new(dev, 16 * n).unwrap();
                    let ag = CollKind::AllGather;
                    let recv = (&mut all, 0..16 * n);
                    c.raw_collective_device_on(ag, Some((&send, 0..16)), recv, dt, op, &stream)
                        .unwrap();
                    stream.synchronize().unwrap();
                    let mut want = vec![host[0]];
                    let sum: f64 = (0..n).map(|k| k as f64).sum();
                    want.extend((1..7).map(|i| n as f64 * 10.0 * i as f64 + sum));
                    assert_eq!(buf.to_vec().unwrap(), f64_bytes(want));
                    assert_eq!(buf.pending_jobs(), 0);
                    let want = f64_bytes((0..n).flat_map(|k| [k as f64, -(k as f64)]));
                    assert_eq!(all.to_vec().unwrap(), want);
                });
            }
        });
    }

    #[test]
    fn raw_collectives_on_a_stream_refuse_partial_elements_and_bad_splits() {
        let dev = Device::new(Provider::Host, 0).unwrap();
        let c = Communicator::local_group(1, Config::default())
            .unwrap()
            .remove(0);
        c.set_device(dev).unwrap();
        let stream = DeviceStream::new(dev).unwrap();
        let mut buf = DeviceBuffer::<u8>::new(dev, 24).unwrap();
        let (dt, op) = (DataType::Float32, ReduceOp::Sum);
        let e = c
            .raw_collective_device_on(CollKind::AllReduce, None, (&mut buf, 0..6), dt, op, &stream)
            .unwrap_err();
        for part in ["all_reduce on rank 0", "receive bytes 0..6", "f32"] {
            assert!(e.message().contains(part), "{part:?} in {e}");
        }
        let e = c
            .raw_collective_device_on(
                CollKind::AllReduce,
                None,
                (&mut buf, 8..32),
                dt,
                op,
                &stream,
            )
            .unwrap_err();
        assert!(e.message().contains("8..32"), "{e}");
        assert_eq!(
            host_stream::pending(stream.handle()),
            0,
            "nothing was queued"
        );
    }

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
        host_stream::begin_capture(s.handle()).unwrap();
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
        host_stream::end_capture(s.handle()).unwrap();
        c.all_reduce_device_on(&send, &mut recv, ReduceOp::Sum, &s)
            .unwrap();
        s.synchronize().unwrap();
        assert_eq!(recv.to_vec().unwrap(), [1.0, 2.0, 3.0]);
    }
}
