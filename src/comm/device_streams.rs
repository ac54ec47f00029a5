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
//! With the CUDA provider the calls block unless `FERRO_STREAM_WAITS=1` (docs/CUDA.md, "On a
//! GPU"); the host stand-in runs them in stream order.
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
use crate::device::stream_queue::{async_supported, landing, record_gates};
use crate::device::stream_stage::Span;
use crate::device::{DeviceBuffer, DeviceStream, Hold};
use crate::{Error, Result};

use super::call::header_kind;
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
        if let Some(e) = self.streams.failed() {
            return Err(e);
        }
        if !async_supported(dev) {
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
