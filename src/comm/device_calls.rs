//! Collectives on device buffers: checked, then run straight on the device buffers where every
//! connection carries device memory (the p2p transport; the executor's copies and reductions
//! go through the device's reducer), else staged through pinned host memory, run by the host
//! executor over the same schedules and transports, and staged back.
//!
//! A communicator uses one device ([`Communicator::set_device`]); every device buffer it is
//! given must live there. Lengths, dtypes (by type), the device and the buffer being live
//! memory of it (the provider's pointer query) are checked before anything is copied or sent.
//! all_reduce, broadcast and reduce run in slices of `FERRO_DEVICE_SLICE_BYTES` on both paths,
//! one collective per slice (staged: while the copies of the other slices proceed on the
//! stream), so that ranks taking different paths exchange the same messages.
//!
//! Completion is synchronous: a call returns when its result is in the device buffer. The
//! stream-ordered forms (`*_device_on`, returning at once) are in `device_streams`.

use ferroccl_kernels::{as_bytes, as_bytes_mut, Element};

use crate::coll::CollKind;
use crate::device::direct::{DirectArena, StreamCall};
use crate::device::staging::{slices_in_flight, Cut};
use crate::device::stream_queue::{async_supported, blocks_always};
use crate::device::{Device, DeviceBuffer, Provider, Staging};
use crate::{Error, Result};

use super::device_paths::{direct, staged};
use super::*;

/// A communicator's device binding, its cached staging and its arena for collectives that
/// run straight on device buffers.
#[derive(Debug, Default)]
pub(super) struct DeviceState {
    device: Option<Device>,
    staging: Option<Staging>,
    arena: Option<DirectArena>,
    /// Whether collectives on the bound device run on the device buffers themselves (every
    /// connection carries its memory); asked once per binding.
    direct: Option<bool>,
    /// This communicator's entry among the process's communicators on the bound device.
    binding: Option<Binding>,
}

impl DeviceState {
    /// The arena of `dev`, made now where there is none (or one of another device).
    fn arena_of(&mut self, dev: Device) -> Result<&mut DirectArena> {
        if self.arena.as_ref().map(DirectArena::device) != Some(dev) {
            self.arena = Some(DirectArena::new(dev)?);
        }
        Ok(self.arena.as_mut().expect("set above"))
    }
}

/// How many communicators of this process are bound to each device.
static BOUND: Mutex<Vec<(Device, usize)>> = Mutex::new(Vec::new());

/// One communicator's count in [`BOUND`], for as long as it is bound to the device.
#[derive(Debug)]
struct Binding(Device);

impl Binding {
    fn new(device: Device) -> Binding {
        let mut b = lock(&BOUND);
        match b.iter_mut().find(|(d, _)| *d == device) {
            Some(e) => e.1 += 1,
            None => b.push((device, 1)),
        }
        Binding(device)
    }

    /// Communicators of this process bound to `device`.
    fn count(device: Device) -> usize {
        lock(&BOUND)
            .iter()
            .find(|(d, _)| *d == device)
            .map_or(0, |e| e.1)
    }
}

impl Drop for Binding {
    fn drop(&mut self) {
        let mut b = lock(&BOUND);
        if let Some(i) = b.iter().position(|(d, _)| *d == self.0) {
            b[i].1 -= 1;
            if b[i].1 == 0 {
                b.swap_remove(i);
            }
        }
    }
}

/// A buffer a collective reads: host memory or a device buffer.
#[derive(Debug, Clone, Copy)]
pub enum BufRef<'a, T: Element> {
    /// Host memory.
    Host(&'a [T]),
    /// Device memory.
    Device(&'a DeviceBuffer<T>),
}

/// A buffer a collective writes: host memory or a device buffer.
#[derive(Debug)]
pub enum BufMut<'a, T: Element> {
    /// Host memory.
    Host(&'a mut [T]),
    /// Device memory.
    Device(&'a mut DeviceBuffer<T>),
}

impl<T: Element> BufRef<'_, T> {
    fn len(&self) -> usize {
        match self {
            BufRef::Host(s) => s.len(),
            BufRef::Device(b) => b.len(),
        }
    }

    fn space(&self) -> String {
        match self {
            BufRef::Host(_) => "host memory".to_string(),
            BufRef::Device(b) => b.device().to_string(),
        }
    }
}

impl<T: Element> BufMut<'_, T> {
    fn len(&self) -> usize {
        match self {
            BufMut::Host(s) => s.len(),
            BufMut::Device(b) => b.len(),
        }
    }

    fn space(&self) -> String {
        match self {
            BufMut::Host(_) => "host memory".to_string(),
            BufMut::Device(b) => b.device().to_string(),
        }
    }
}

/// The count NCCL's convention gives a `kind` call with these buffer lengths (as the typed
/// host entries compute it); `None` when a length that must split into `n` blocks does not.
pub(super) fn count_of(
    kind: CollKind,
    send: Option<usize>,
    recv: usize,
    n: usize,
) -> Option<usize> {
    let blocks = |len: usize| len.is_multiple_of(n).then_some(len / n);
    match (kind, send) {
        (CollKind::AllReduce | CollKind::Reduce { .. } | CollKind::AllGather, Some(s)) => Some(s),
        (CollKind::Broadcast { .. } | CollKind::ReduceScatter, Some(_)) => Some(recv),
        (CollKind::AllToAll, Some(s)) => blocks(s),
        (CollKind::AllGather | CollKind::ReduceScatter | CollKind::AllToAll, None) => blocks(recv),
        (_, None) => Some(recv),
    }
}

/// [`count_of`] for rank `rank` of `n`, or the error naming the call and the length that
/// does not split into `n` blocks.
pub(crate) fn call_count(
    kind: CollKind,
    rank: usize,
    send: Option<usize>,
    recv: usize,
    n: usize,
) -> Result<usize> {
    count_of(kind, send, recv, n).ok_or_else(|| {
        Error::invalid_argument(format!(
            "{} on rank {rank}: buffer of {} elements is not a multiple of nranks {n}",
            kind.name(),
            send.unwrap_or(recv)
        ))
    })
}

impl Communicator {
    /// Binds this communicator to `device`: device buffers passed to its collectives must live
    /// there. Binding another device drops the cached staging of the previous one.
    pub fn set_device(&self, device: Device) -> Result<()> {
        let mut st = lock(&self.device);
        if st.device != Some(device) {
            st.staging = None;
            st.arena = None;
            st.direct = None;
            st.binding = None;
            st.binding = Some(Binding::new(device));
            st.device = Some(device);
        }
        Ok(())
    }

    /// The device bound with [`Communicator::set_device`], if any.
    pub fn device(&self) -> Option<Device> {
        lock(&self.device).device
    }

    /// Whether collectives on device buffers of the bound device run on the buffers
    /// themselves: every connection of this rank carries device memory (the GPU peer-to-peer
    /// transport), and `FERRO_DEVICE_DIRECT` is not `0`. Otherwise (or with no device bound)
    /// they are staged through pinned host memory.
    pub fn device_direct(&self) -> bool {
        let mut st = lock(&self.device);
        self.direct_for(&mut st)
    }

    fn direct_for(&self, st: &mut MutexGuard<'_, DeviceState>) -> bool {
        let Some(dev) = st.device else {
            return false;
        };
        if !self.inner.config.device_direct {
            return false;
        }
        *st.direct.get_or_insert_with(|| {
            let engine = self.inner.engine.lock().unwrap_or_else(|p| p.into_inner());
            let direct = engine.accepts_all(dev.space());
            if let (false, ferroccl_transport::MemSpace::Cuda(n)) = (direct, dev.space()) {
                if let Some(slots) = engine.other_device(n) {
                    ferroccl_transport::log_line!(
                        "ferroccl rank {} WARN: device collectives on CUDA device {n} are \
                         staged through host memory: this communicator's p2p receive slots \
                         are on device {slots} (FERRO_P2P_DEVICE, else the device current \
                         when it was made); FERRO_P2P_DEVICE={n} runs them straight on the \
                         device",
                        self.inner.rank
                    );
                }
            }
            direct
        })
    }

    /// Whether calls with a stream on `streams` of `dev` may return at once and complete in
    /// stream order ([`async_supported`]) on this communicator (bound to `dev`). Not on a stream
    /// that always blocks ([`blocks_always`]). Not on a CUDA device that
    /// another communicator of this process is bound to, and not where one of its connections carries
    /// CUDA device memory itself (the p2p transport's cuda provider): that transport makes
    /// driver calls to move even host bytes, and the stream job that would drive it must make
    /// none (docs/CUDA.md, "On a GPU"), so such calls block instead.
    pub(crate) fn stream_jobs_supported(&self, dev: Device, streams: &[usize]) -> bool {
        if streams.iter().any(|&h| blocks_always(dev, h)) || !async_supported(dev) {
            return false;
        }
        if dev.provider() == Provider::Cuda && Binding::count(dev) > 1 {
            static SHARED: std::sync::Once = std::sync::Once::new();
            SHARED.call_once(|| {
                ferroccl_transport::log_line!(
                    "ferroccl INFO COLL: calls with a stream block until done where several \
                     communicators of this process use one GPU: a stream waiting on one \
                     communicator's flag can hold the hardware queue that another's copies \
                     need (CUDA_DEVICE_MAX_CONNECTIONS), and neither would finish"
                )
            });
            return false;
        }
        // Known from init: the engine's lock may be held by a queued job for as long as it
        // waits for its peers, and this must not wait.
        if !job_calls_driver(dev.provider(), self.inner.device_transport) {
            return true;
        }
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            ferroccl_transport::log_line!(
                "ferroccl INFO COLL: calls with a stream block until done on communicators \
                 with p2p connections (except the collectives their ranks take between their \
                 buffers: ranks of one process, buffers in windows, or any buffers through \
                 scratch windows, FERRO_DEVICE_SCRATCH_BYTES): that transport makes CUDA \
                 driver calls, which the stream-ordered form must not make on its own thread"
            )
        });
        false
    }

    /// Why calls of this communicator on `dev` cannot be recorded into a CUDA graph, if they
    /// cannot. A recorded call runs its collective in a host function of the graph, which
    /// must make no CUDA call: not where a connection carries device memory itself (the p2p
    /// transport's cuda provider moves even host bytes with the driver). Nor where several
    /// communicators of this process use one CUDA device (ranks as threads): the driver may
    /// run host functions one at a time, so one rank's would wait for another's.
    #[cfg(feature = "capi")]
    pub(crate) fn capture_refusal(&self, dev: Device) -> Option<&'static str> {
        if job_calls_driver(dev.provider(), self.inner.device_transport) {
            return Some(
                "its connections move bytes with CUDA driver calls (the p2p transport), which \
                 the host function a recorded call runs at each launch must not make",
            );
        }
        if dev.provider() == Provider::Cuda && Binding::count(dev) > 1 {
            return Some(
                "several communicators of this process use the GPU, and the driver may run the \
                 host functions of graphs one at a time, so one rank's would wait for another's",
            );
        }
        None
    }

    /// How a device collective of `count` elements of `es` bytes is cut ([`cut`]).
    #[cfg(feature = "capi")]
    pub(crate) fn device_cut(&self, kind: CollKind, count: usize, es: usize) -> Cut {
        cut(&self.inner, kind, count, es)
    }

    /// Device allocations made for collectives that run straight on device buffers (the
    /// engine's scratch and receive stages; cached like the staging).
    pub fn device_arena_allocations(&self) -> u64 {
        lock(&self.device)
            .arena
            .as_ref()
            .map_or(0, DirectArena::allocations)
    }

    /// Collectives (device slices counted one by one) that went straight between the ranks'
    /// buffers, one reduce-copy kernel per rank reading the other ranks' inputs and writing
    /// their outputs (ranks that are threads of one process; [`Config::device_peer`]). Waits
    /// for a call in progress.
    pub fn device_peer_calls(&self) -> u64 {
        self.inner
            .engine
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .peer_calls()
    }

    /// Pinned staging allocations this communicator has made (they are cached: a repeated
    /// call of the same size makes none).
    pub fn staging_allocations(&self) -> u64 {
        lock(&self.device)
            .staging
            .as_ref()
            .map_or(0, Staging::allocations)
    }

    /// Bytes of pinned host memory this communicator's staging holds now: what the largest
    /// calls staged so far needed at once (a few slices or pieces of a call cut into them).
    pub fn staging_bytes(&self) -> usize {
        lock(&self.device)
            .staging
            .as_ref()
            .map_or(0, Staging::bytes)
    }

    /// Runs collective `kind` on host or device buffers (both in the same space; `send: None`
    /// means in place, laid out as the typed in-place calls lay it out). The count follows
    /// from the lengths as in the typed calls (`all_reduce`: `send.len()`; `all_gather`:
    /// `send.len()`; `reduce_scatter`: `recv.len()`; `all_to_all`: `send.len() / nranks`).
    pub fn collective<T: Element>(
        &self,
        kind: CollKind,
        send: Option<BufRef<'_, T>>,
        recv: BufMut<'_, T>,
        op: ReduceOp,
    ) -> Result<()> {
        let (name, rank, n) = (kind.name(), self.inner.rank, self.inner.nranks);
        let count = call_count(kind, rank, send.as_ref().map(BufRef::len), recv.len(), n)?;
        match (send, recv) {
            (None, BufMut::Host(r)) => {
                self.raw_collective(kind, None, as_bytes_mut(r), count, T::DTYPE, op)
            }
            (Some(BufRef::Host(s)), BufMut::Host(r)) => self.raw_collective(
                kind,
                Some(as_bytes(s)),
                as_bytes_mut(r),
                count,
                T::DTYPE,
                op,
            ),
            (None, BufMut::Device(r)) => self.run_device(kind, None, r, count, op),
            (Some(BufRef::Device(s)), BufMut::Device(r)) => {
                self.run_device(kind, Some(s), r, count, op)
            }
            (Some(s), r) => Err(Error::invalid_argument(format!(
                "{name} on rank {rank}: the send buffer is {} but the receive buffer is {}; \
                 both must be in one memory space",
                s.space(),
                r.space()
            ))),
        }
    }

    /// The bound device, checked against a buffer's (`what`: send, receive).
    pub(super) fn device_for<T: Element>(
        &self,
        name: &str,
        what: &str,
        buf: &DeviceBuffer<T>,
    ) -> Result<Device> {
        self.device_for_live(name, what, buf, true)
    }

    /// [`Communicator::device_for`]; `live`: also ask the driver whether the buffer is live
    /// memory of its device (`false` where the caller asked it just before).
    fn device_for_live<T: Element>(
        &self,
        name: &str,
        what: &str,
        buf: &DeviceBuffer<T>,
        live: bool,
    ) -> Result<Device> {
        let rank = self.inner.rank;
        let Some(dev) = self.device() else {
            return Err(Error::invalid_usage(format!(
                "{name} on rank {rank}: the {what} buffer is on {}, but no device is bound to \
                 this communicator (call Communicator::set_device first)",
                buf.device()
            )));
        };
        if buf.device() != dev {
            return Err(Error::invalid_argument(format!(
                "{name} on rank {rank}: the {what} buffer is on {}; this communicator uses {dev}",
                buf.device()
            )));
        }
        if live {
            buf.check_live(name, rank, what)?;
        }
        Ok(dev)
    }

    /// The staging of `dev`, created at the first call.
    pub(super) fn staging<'a>(
        st: &'a mut MutexGuard<'_, DeviceState>,
        dev: Device,
    ) -> Result<&'a mut Staging> {
        if st.staging.as_ref().map(Staging::device) != Some(dev) {
            st.staging = Some(Staging::new(dev)?);
        }
        Ok(st.staging.as_mut().expect("set above"))
    }

    /// The checks every device call makes before anything is copied or sent: both buffers on
    /// the bound device and live, the call's arguments (the same as the host calls'). Returns
    /// the device. `live: false` leaves out the driver's pointer queries, for a caller that
    /// made them already (the C ABI's check of the call's spans, which names NCCL's
    /// arguments).
    pub(crate) fn check_device<T: Element>(
        &self,
        kind: CollKind,
        send: Option<&DeviceBuffer<T>>,
        recv: &DeviceBuffer<T>,
        count: usize,
        op: ReduceOp,
        live: bool,
    ) -> Result<Device> {
        let name = kind.name();
        let dev = self.device_for_live(name, "receive", recv, live)?;
        // In place the send buffer is the receive buffer (or its start), checked just now: a
        // driver query less on every call.
        let within = |s: &DeviceBuffer<T>| {
            s.device() == recv.device() && s.addr() == recv.addr() && s.bytes() <= recv.bytes()
        };
        if let Some(s) = send {
            self.device_for_live(name, "send", s, live && !within(s))?;
        }
        Call::check(
            &self.inner,
            name,
            header_kind(kind),
            kind,
            send.map(|s| s.bytes()),
            recv.bytes(),
            count,
            T::DTYPE,
            op,
        )?;
        Ok(dev)
    }

    /// A blocking device collective: checked, then run ([`Communicator::run_device_at`]).
    pub(super) fn run_device<T: Element>(
        &self,
        kind: CollKind,
        send: Option<&DeviceBuffer<T>>,
        recv: &mut DeviceBuffer<T>,
        count: usize,
        op: ReduceOp,
    ) -> Result<()> {
        let dev = self.check_device(kind, send, recv, count, op, true)?;
        self.run_device_at(dev, kind, send, recv, count, op, None)
    }

    /// A device collective after [`Communicator::check_device`] passed, on the device it
    /// returned: blocking (`on: None`), or ordered on a caller's stream (`on`, from
    /// [`Communicator::orders_between_buffers`]'s callers), where the call goes straight
    /// between the ranks' buffers in stream order if every rank agrees, and returns once that
    /// is queued; otherwise it waits for the stream and runs as a blocking call. (A call on a
    /// stream checks before it chooses its path, and asks the driver about its buffers once.)
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run_device_at<T: Element>(
        &self,
        dev: Device,
        kind: CollKind,
        send: Option<&DeviceBuffer<T>>,
        recv: &mut DeviceBuffer<T>,
        count: usize,
        op: ReduceOp,
        on: Option<StreamCall>,
    ) -> Result<()> {
        let _call = crate::profile::call();
        // Stream jobs queued earlier run first (on every rank alike), and none still uses
        // the buffers. (A call ordered on a stream comes after earlier work on it by the
        // stream's order, whatever holds that work keeps.)
        self.streams.drain_if_used();
        if on.is_none() {
            recv.wait_idle();
            if let Some(s) = send {
                s.wait_idle();
            }
        }
        let mut st = lock(&self.device);
        if self.direct_for(&mut st) {
            let arena = st.arena_of(dev)?;
            if let Some(call) = on {
                arena.begin_call(call);
            }
            let r = direct(&self.inner, arena, kind, send, recv, count, op);
            let end = arena.end_call();
            return r.and(end);
        }
        drop(st);
        if let Some(call) = on {
            // SAFETY: the caller's stream of `dev` (checked by the caller).
            unsafe { dev.sync_stream(std::ptr::without_provenance_mut(call.stream)) }?;
        }
        staged(&self.inner, &self.device, dev, kind, send, recv, count, op)
    }

    /// Whether a call on the caller's stream `handle` of `dev` goes straight between the
    /// ranks' buffers in stream order: every rank a thread of this process (the path between
    /// the buffers is on), or a process holding usable windows whose ranks shared their marks,
    /// the stream one that a call may queue work on (not the NULL stream, nor on CUDA the
    /// legacy and per-thread handles), and `FERRO_STREAM_WAITS` not `0`.
    /// Such calls do not use stream jobs: where the ranks do not agree to the path, the call
    /// waits for the stream and runs as a blocking call.
    pub(crate) fn orders_between_buffers(&self, dev: Device, handle: usize) -> bool {
        let in_order = self.inner.peer_direct
            || self
                .inner
                .windows_in_order
                .load(std::sync::atomic::Ordering::Acquire);
        !blocks_always(dev, handle)
            && crate::device::stream_queue::stream_waits() != Some(false)
            && in_order
            && self.device_direct()
    }

    /// The reducer of the bound device's arena (made now where there is none), where device
    /// collectives run on the buffers themselves: the one whose marks windows share.
    pub(crate) fn direct_reducer(&self) -> Option<std::sync::Arc<dyn crate::reduce::Reducer>> {
        let mut st = lock(&self.device);
        let dev = st.device?;
        if !self.direct_for(&mut st) {
            return None;
        }
        let arena = st.arena_of(dev).ok()?;
        Some(crate::exec::DeviceArena::reducer(arena))
    }

    // ----- typed entries on device buffers -----

    /// [`Communicator::all_reduce`] on device buffers.
    pub fn all_reduce_device<T: Element>(
        &self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        op: ReduceOp,
    ) -> Result<()> {
        let count = send.len();
        self.run_device(CollKind::AllReduce, Some(send), recv, count, op)
    }

    /// [`Communicator::all_reduce_in_place`] on a device buffer.
    pub fn all_reduce_device_in_place<T: Element>(
        &self,
        buf: &mut DeviceBuffer<T>,
        op: ReduceOp,
    ) -> Result<()> {
        let count = buf.len();
        self.run_device(CollKind::AllReduce, None, buf, count, op)
    }

    /// [`Communicator::broadcast`] on a device buffer.
    pub fn broadcast_device<T: Element>(
        &self,
        buf: &mut DeviceBuffer<T>,
        root: usize,
    ) -> Result<()> {
        let count = buf.len();
        self.run_device(
            CollKind::Broadcast { root },
            None,
            buf,
            count,
            ReduceOp::Sum,
        )
    }

    /// [`Communicator::reduce`] on device buffers (`recv` is ignored, and may be empty, off
    /// the root).
    pub fn reduce_device<T: Element>(
        &self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let count = send.len();
        self.run_device(CollKind::Reduce { root }, Some(send), recv, count, op)
    }

    /// [`Communicator::all_gather`] on device buffers.
    pub fn all_gather_device<T: Element>(
        &self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        let count = send.len();
        self.run_device(CollKind::AllGather, Some(send), recv, count, ReduceOp::Sum)
    }

    /// [`Communicator::reduce_scatter`] on device buffers.
    pub fn reduce_scatter_device<T: Element>(
        &self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        op: ReduceOp,
    ) -> Result<()> {
        let count = recv.len();
        self.run_device(CollKind::ReduceScatter, Some(send), recv, count, op)
    }

    /// [`Communicator::all_to_all`] on device buffers.
    pub fn all_to_all_device<T: Element>(
        &self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        self.collective(
            CollKind::AllToAll,
            Some(BufRef::Device(send)),
            BufMut::Device(recv),
            ReduceOp::Sum,
        )
    }

    /// Whether a send or receive of a device buffer to `peer` goes straight through its
    /// transport (one that carries device memory itself, with `FERRO_DEVICE_DIRECT` on).
    fn direct_to(&self, peer: usize, dev: Device) -> bool {
        self.inner.config.device_direct && peer != self.inner.rank && {
            let engine = self.inner.engine.lock().unwrap_or_else(|p| p.into_inner());
            engine.accepts(peer, dev.space())
        }
    }

    /// [`Communicator::send`] of a device buffer: straight from it where the peer's transport
    /// carries device memory (the GPU peer-to-peer transport), else staged through pinned host
    /// memory. The peer may receive into host or device memory.
    pub fn send_device<T: Element>(&self, buf: &DeviceBuffer<T>, peer: usize) -> Result<()> {
        use crate::device::staging::Slot;
        let dev = self.device_for("send", "send", buf)?;
        if self.direct_to(peer, dev) {
            let mut g = self.group();
            g.send_device(buf, peer);
            return g.run();
        }
        self.streams.drain_if_used();
        buf.wait_idle();
        let mut st = lock(&self.device);
        let staging = Self::staging(&mut st, dev)?;
        staging.reserve(buf.bytes(), 0)?;
        staging.stage_in(Slot::Input, buf)?;
        let (input, _) = staging.buffers::<T>(buf.len(), 0)?;
        self.send(&*input, peer)
    }

    /// [`Communicator::recv`] into a device buffer (straight into it where the peer's
    /// transport carries device memory; see [`Communicator::send_device`]).
    pub fn recv_device<T: Element>(&self, buf: &mut DeviceBuffer<T>, peer: usize) -> Result<()> {
        use crate::device::staging::Slot;
        let dev = self.device_for("recv", "receive", buf)?;
        if self.direct_to(peer, dev) {
            let mut g = self.group();
            g.recv_device(buf, peer);
            return g.run();
        }
        self.streams.drain_if_used();
        buf.wait_idle();
        let mut st = lock(&self.device);
        let staging = Self::staging(&mut st, dev)?;
        staging.reserve(0, buf.bytes())?;
        let (_, output) = staging.buffers::<T>(0, buf.len())?;
        self.recv(output, peer)?;
        staging.stage_out(Slot::Output, buf)
    }
}

/// Whether a stream job's host collective would make CUDA driver calls: on a CUDA device, where
/// a connection carries device memory itself (so moves host bytes with the driver too). The
/// host stand-in's transports make none.
fn job_calls_driver(provider: Provider, device_transport: bool) -> bool {
    provider == Provider::Cuda && device_transport
}

/// How a device collective is cut into slices ([`Cut`]), the same on every path (blocking
/// and stream-ordered, staged and straight on the device), so that ranks taking different
/// paths exchange the same messages. Element-wise collectives in slices of
/// `FERRO_DEVICE_SLICE_BYTES`; the blocked layouts (all_gather, reduce_scatter, all_to_all)
/// in slices of about that many bytes of their larger buffer, except where collectives may run
/// straight on device buffers (the p2p transport in `FERRO_TRANSPORTS`), which run those whole:
/// a rank may take either path (`FERRO_DEVICE_DIRECT` may differ between ranks), and only the
/// transport list is the same on every rank; and on one rank, which has no connection that
/// could refuse device memory. No slice is without elements. Every rank must see the same
/// `FERRO_DEVICE_SLICE_BYTES` and `FERRO_TRANSPORTS`.
pub(super) fn cut(inner: &Inner, kind: CollKind, count: usize, es: usize) -> Cut {
    let one_host = inner.hosts.iter().all(|h| Some(h) == inner.hosts.first());
    cut_for(&inner.config, inner.nranks, one_host, kind, count, es)
}

/// Slices of element-wise device collectives where `FERRO_DEVICE_SLICE_BYTES` is unset.
const DEVICE_SLICE_BYTES: usize = 4 << 20;
/// The same in a communicator on one host that tries the p2p transport: a slice straight on
/// the device costs host round trips of its own (a flag, an event, a launch per step), which
/// 4 MiB slices paid 32 times for 128 MiB; 64 MiB ones halved the time of 8–256 MiB calls on
/// an H100 and an H200. A rank of such a communicator that stages (`FERRO_DEVICE_DIRECT=0`,
/// or a peer without peer access) stages in these slices too: its staging overlaps less.
const DIRECT_SLICE_BYTES: usize = 64 << 20;

/// [`cut`] for a communicator of `n` ranks with `config`, all on one host where `one_host`
/// (the same on every rank: every rank knows every rank's host).
fn cut_for(
    config: &Config,
    n: usize,
    one_host: bool,
    kind: CollKind,
    count: usize,
    es: usize,
) -> Cut {
    let (in_len, out_len) = kind.buffer_lens(1, n);
    let bytes = slice_bytes(config, one_host);
    let slices = if kind.is_elementwise() {
        let per = (bytes / es).max(1);
        count.div_ceil(per).max(1)
    } else if n > 1 && cuts_blocks(config) {
        // A slice's part of one block is one copy each way: at least 1/64 of a slice's bytes
        // (64 KiB by default), so that many ranks do not make many tiny copies.
        let most = (count * es / (bytes / 64).max(1)).max(1);
        let wanted = (count * es * in_len.max(out_len))
            .div_ceil(bytes)
            .clamp(1, most.min(count.max(1)));
        // No slice without elements: every path runs each slice as a collective.
        count.div_ceil(count.div_ceil(wanted).max(1)).max(1)
    } else {
        // One rank: no connection, so the path straight on device buffers is open, and it
        // runs these layouts whole.
        1
    };
    Cut {
        count,
        slices,
        in_blocks: in_len,
        out_blocks: out_len,
        window: slices_in_flight(slices, bytes),
    }
}

/// The bytes of a device call's slices for `config`, on a communicator all on one host where
/// `one_host` (the same on every rank).
fn slice_bytes(config: &Config, one_host: bool) -> usize {
    match config.device_slice_bytes {
        Some(b) => b.max(1),
        None if one_host && !cuts_blocks(config) => DIRECT_SLICE_BYTES,
        None => DEVICE_SLICE_BYTES,
    }
}

/// The bytes of the pieces that sends and receives of more are cut into, on every path (host
/// buffers, staged and direct device buffers, stream jobs), so that every rank cuts a message
/// alike whatever its buffers: the device slices, in whole 64-byte units (whole elements of
/// every type), so that a staged group holds a few pieces of pinned memory, not its buffers;
/// at least [`MIN_PIECE_BYTES`], so that tiny slices do not make thousands of messages.
pub(super) fn piece_bytes(inner: &Inner) -> usize {
    let one_host = inner.hosts.iter().all(|h| Some(h) == inner.hosts.first());
    (slice_bytes(&inner.config, one_host) / 64 * 64).max(MIN_PIECE_BYTES)
}

/// The smallest piece a send or receive is cut into.
pub(super) const MIN_PIECE_BYTES: usize = 64 << 10;

/// Whether the blocked layouts are cut into slices: no collective can run straight on device
/// buffers (no transport that carries device memory is tried), whose path runs them whole.
fn cuts_blocks(config: &Config) -> bool {
    !config.tries_p2p()
}

#[cfg(test)]
mod tests;
