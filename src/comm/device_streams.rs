//! Stream-ordered collectives on device buffers: `*_device_on` takes a [`DeviceStream`] and
//! returns as soon as the job is queued; work queued on the stream afterwards sees the result.
//!
//! On the caller's thread every check of the blocking form runs first (an error is returned at
//! once, with the same message), then the communicator's stream queue
//! (`device::stream_queue`) records a gate on the stream, makes the stream wait for the job's
//! completion flag, and queues the job; the queue's thread waits for the gate (the work queued
//! on the stream before the call), runs the collective as the blocking form does (staged
//! through pinned host memory), and stores the flag, so the stream goes on.
//!
//! | case | what happens |
//! |---|---|
//! | the job fails | the stream is still released; the error becomes the communicator's ([`Communicator::async_error`]) and later calls fail with it |
//! | [`Communicator::abort`] | queued jobs fail without running, their streams are released |
//! | a blocking call (host or device, a group, send/recv) or an `*_async` host call on the communicator | waits until every queued job has finished |
//! | host access to a buffer a queued job uses | waits for that job ([`DeviceBuffer`]'s pending count) |
//! | a CUDA device whose streams cannot wait on host memory | the call synchronizes the stream and blocks (said once in the log) |

use std::sync::Arc;

use ferroccl_kernels::Element;

use crate::coll::CollKind;
use crate::device::stream_queue::{async_supported, record_gates};
use crate::device::{Device, DeviceBuffer, DeviceStream, Hold};
use crate::{Error, Result};

use super::device_calls::staged;
use super::*;

/// A buffer as a queued job reaches it: its place, and the hold that keeps host access and
/// `Drop` waiting until the job is over.
struct Held {
    addr: u64,
    len: usize,
    _hold: Hold,
}

impl Held {
    fn of<T: Element>(b: &DeviceBuffer<T>) -> Held {
        Held {
            addr: b.addr(),
            len: b.len(),
            _hold: b.hold(),
        }
    }

    /// A view of the buffer for the job.
    ///
    /// # Safety
    /// The buffer was live when the hold was taken; while the hold lives, its memory is not
    /// freed (`Drop` waits, `mem::forget` leaks it) and no host access touches it.
    unsafe fn view<T: Element>(
        &self,
        dev: Device,
    ) -> Result<std::mem::ManuallyDrop<DeviceBuffer<T>>> {
        // SAFETY: per the caller.
        unsafe { DeviceBuffer::<T>::view(dev, self.addr, self.len) }
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
        if let Some(e) = self.streams.failed() {
            return Err(e);
        }
        if !async_supported(dev) {
            stream.synchronize()?;
            return self.run_device(kind, send, recv, count, op);
        }
        self.prepare_stream_job(dev, send.map_or(0, |s| s.bytes()), recv.bytes())?;
        let handle = stream.handle();
        let gates = record_gates(dev, &[handle])?;
        let recv = Held::of(recv);
        let send = send.map(Held::of);
        let inner = Arc::clone(&self.inner);
        let state = Arc::clone(&self.device);
        let work = Box::new(move || {
            let run = || {
                // SAFETY: both were live device memory of `dev` (checked above) when their
                // holds were taken; the holds live as long as this job.
                let mut r = unsafe { recv.view::<T>(dev) }?;
                let s = match &send {
                    // SAFETY: as above; a send buffer is only read.
                    Some(s) => Some(unsafe { s.view::<T>(dev) }?),
                    None => None,
                };
                staged(&inner, &state, dev, kind, s.as_deref(), &mut r, count, op)
            };
            let r = run();
            if let Err(e) = &r {
                inner.fail(e.clone());
            }
            r
        });
        self.streams.enqueue(dev, &[handle], gates, work)
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
