//! Device collectives run straight on device buffers: the arena a communicator lends the
//! executor (the device's reducer and the engine's own device buffers), and the host stand-in
//! provider's reducer.
//!
//! Where every connection of a rank carries device memory itself (the GPU peer-to-peer
//! transport), a device collective needs no host copy: the transports send from and receive
//! into device memory, and the schedule's copies and reductions run on the device (the CUDA
//! reducer's kernels; on the stand-in, the host kernels on its heap "device memory").

use std::sync::Arc;

use ferroccl_kernels::{DataType, ElemOp};
use ferroccl_transport::{Fence, MemRef, MemSpace, Payload, PayloadMut};

use super::shared_marks::{self, OwnMarks};
use super::{host, host_stream, Device, DeviceBuffer, Provider};
use crate::exec::{ArenaUse, DeviceArena};
use crate::reduce::{
    CudaReducer, HostReducer, Mark, MarkUse, PeerMarks, Reducer, SharedMarkWords, NO_MARK,
};
use crate::{Error, Result};

/// Smallest arena buffer (a larger request takes at least twice the buffer it replaces).
const MIN_BUFFER: usize = 64 << 10;

/// A communicator's device arena: the reducer of its device and one buffer per use, grown as
/// needed and kept between calls (a repeated call of the same size allocates nothing).
#[derive(Debug)]
pub(crate) struct DirectArena {
    device: Device,
    reducer: Arc<dyn Reducer>,
    buffers: Vec<(ArenaUse, DeviceBuffer<u8>)>,
    /// Buffers replaced by larger ones, freed with the arena: `cuMemFree` may synchronize the
    /// device, which would wait for streams held at a flag by another communicator's job.
    retired: Vec<DeviceBuffer<u8>>,
    allocations: u64,
    /// The call running now, where it is ordered on a caller's stream.
    call: Option<StreamCall>,
}

/// A call ordered on a caller's stream: the stream's handle, and what keeps the call's
/// buffers alive until the stream has run it (the Rust API's holds; none from the C ABI,
/// whose callers keep them by NCCL's contract).
#[derive(Debug)]
pub(crate) struct StreamCall {
    pub stream: usize,
    pub holds: Vec<super::Hold>,
}

impl DirectArena {
    /// The arena of `device`: its reducer is made (and, with CUDA, the driver checked) now.
    pub(crate) fn new(device: Device) -> Result<DirectArena> {
        let reducer: Arc<dyn Reducer> = match device.provider() {
            Provider::Cuda => Arc::new(CudaReducer::new(device.ordinal())?),
            Provider::Host => Arc::new(StandInReducer::new(device.ordinal())),
        };
        Ok(DirectArena {
            device,
            reducer,
            buffers: Vec::new(),
            retired: Vec::new(),
            allocations: 0,
            call: None,
        })
    }

    /// Its device.
    pub(crate) fn device(&self) -> Device {
        self.device
    }

    /// Device allocations it has made.
    pub(crate) fn allocations(&self) -> u64 {
        self.allocations
    }

    /// Orders the next call on the caller's stream `call.stream` (until it ends or settles).
    pub(crate) fn begin_call(&mut self, call: StreamCall) {
        self.call = Some(call);
    }

    /// Ends the call begun by [`DirectArena::begin_call`]: where it did not settle, its holds
    /// go once the stream has run what the call queued (at once, where it queued nothing
    /// that could still touch the buffers: the stream then waits for nothing of the call).
    pub(crate) fn end_call(&mut self) -> Result<()> {
        let Some(call) = self.call.take() else {
            return Ok(());
        };
        if call.holds.is_empty() {
            return Ok(());
        }
        if let Err(e) = self
            .reducer
            .release_after(call.stream, Box::new(call.holds))
        {
            // Not queued (the holds are gone with the error): the buffers are let go once the
            // stream is done, waited for here.
            self.reducer.synchronize(Some(call.stream))?;
            return Err(e);
        }
        Ok(())
    }
}

impl DeviceArena for DirectArena {
    fn reducer(&self) -> Arc<dyn Reducer> {
        Arc::clone(&self.reducer)
    }

    fn buffer(&mut self, use_: ArenaUse, bytes: usize) -> Result<MemRef> {
        let at = self.buffers.iter().position(|(u, _)| *u == use_);
        if let Some(i) = at {
            if self.buffers[i].1.len() >= bytes {
                return Ok(self.buffers[i].1.mem());
            }
        }
        let old = at.map_or(0, |i| self.buffers[i].1.len());
        let len = bytes.max(old.saturating_mul(2)).max(MIN_BUFFER);
        // No step uses the old buffer any more (each use asks again per call); it is kept
        // until the arena drops (see `retired`).
        if let Some(i) = at {
            let (_, old) = self.buffers.swap_remove(i);
            self.retired.push(old);
        }
        let buf = DeviceBuffer::<u8>::new(self.device, len)?;
        self.allocations += 1;
        let mem = buf.mem();
        self.buffers.push((use_, buf));
        Ok(mem)
    }

    fn download(&mut self, dst: &mut [u8], src: MemRef) -> Result<()> {
        self.check_operand("download", &src, dst.len())?;
        // SAFETY: `src` is live memory of this device holding `dst.len()` bytes (checked
        // above), which the call that lent it does not touch while the engine runs it.
        unsafe { self.device.read_raw(src.addr as u64, dst) }
    }

    fn call_stream(&self) -> Option<usize> {
        self.call.as_ref().map(|c| c.stream)
    }

    fn settle(&mut self) -> Result<()> {
        match self.call.take() {
            Some(c) => self.reducer.synchronize(Some(c.stream)),
            None => Ok(()),
        }
    }

    fn scratch(&mut self, bytes: usize) -> Result<crate::exec::ScratchAlloc> {
        let buf = DeviceBuffer::<u8>::new(self.device, bytes)?;
        self.allocations += 1;
        let (provider, ordinal) = (self.device.provider(), self.device.ordinal());
        let export = super::ipc::export(provider, ordinal, buf.addr(), bytes)?;
        Ok(crate::exec::ScratchAlloc {
            offered: crate::exec::Offered {
                addr: buf.addr(),
                len: bytes,
                export: Some(export),
            },
            mapper: Box::new(super::ipc::ByProvider { provider, ordinal }),
            owned: crate::exec::Owned::new(Box::new(buf)),
        })
    }

    fn upload(&mut self, dst: MemRef, src: &[u8]) -> Result<()> {
        self.check_operand("upload", &dst, src.len())?;
        // SAFETY: as in `download`: live memory of this device for `src.len()` bytes, the
        // call's output, written by nothing else while the engine runs it.
        unsafe { self.device.write_raw(dst.addr as u64, src) }
    }
}

impl DirectArena {
    /// Checks that `m` is memory of this arena's device holding at least `bytes`.
    fn check_operand(&self, what: &str, m: &MemRef, bytes: usize) -> Result<()> {
        if m.space != MemSpace::Cuda(self.device.ordinal()) || m.len < bytes {
            return Err(Error::internal(format!(
                "device arena of {}: {what} of {bytes} bytes from {} memory of {} bytes",
                self.device, m.space, m.len
            )));
        }
        Ok(())
    }
}

/// The stand-in provider's reducer: the host kernels on the stand-in's "device memory" (host
/// host memory), every device operand checked to be a live stand-in allocation of its device
/// first. Sources may also be host memory; destinations are always device memory.
#[derive(Debug)]
pub(crate) struct StandInReducer {
    ordinal: u32,
    /// Its own stand-in stream (the model of the CUDA reducer's), made at first use.
    own: std::sync::OnceLock<usize>,
    /// Its marks as another process sees them, made when first shared.
    shared: std::sync::Mutex<Option<Arc<OwnMarks>>>,
}

impl Drop for StandInReducer {
    fn drop(&mut self) {
        if let Some(&h) = self.own.get() {
            host_stream::remove(h);
        }
    }
}

impl StandInReducer {
    pub(crate) fn new(ordinal: u32) -> StandInReducer {
        StandInReducer {
            ordinal,
            own: std::sync::OnceLock::new(),
            shared: std::sync::Mutex::new(None),
        }
    }

    /// The stand-in stream `on` names (`None`: the reducer's own).
    fn stream(&self, on: Option<usize>) -> usize {
        on.unwrap_or_else(|| *self.own.get_or_init(super::stream::next_host_handle))
    }

    fn check(&self, what: &str, m: &MemRef) -> Result<()> {
        self.check_on(what, m, self.ordinal)
    }

    /// Checks that `m` is live memory of stand-in device `ordinal`.
    fn check_on(&self, what: &str, m: &MemRef, ordinal: u32) -> Result<()> {
        if m.space != MemSpace::Cuda(ordinal) {
            return Err(Error::invalid_argument(format!(
                "host stand-in reducer (device {}): the {what} operand is {} memory",
                self.ordinal, m.space
            )));
        }
        if m.len > 0 && host::locate(m.addr as u64, m.len) != Some(ordinal) {
            return Err(Error::invalid_argument(format!(
                "host stand-in reducer (device {}): the {what} operand (0x{:x}, {} bytes) is \
                 not live memory of device {ordinal}",
                self.ordinal, m.addr, m.len
            )));
        }
        Ok(())
    }

    /// Checks an operand of [`Reducer::queue_many`]: live memory of this device or of one
    /// it reaches ([`standin_reach`]).
    fn many_operand(&self, what: &str, m: &MemRef) -> Result<()> {
        let ordinal = match m.space {
            MemSpace::Cuda(o) if o == self.ordinal || standin_reach() => o,
            _ => self.ordinal,
        };
        self.check_on(what, m, ordinal)
    }

    /// Checks every operand of a reduce-copy ([`StandInReducer::many_operand`]).
    fn many_operands(&self, dsts: &[MemRef], srcs: &[MemRef]) -> Result<()> {
        let dsts = dsts.iter().map(|m| ("destination", m));
        dsts.chain(srcs.iter().map(|m| ("source", m)))
            .try_for_each(|(what, m)| self.many_operand(what, m))
    }

    /// The reduce-copy of [`Reducer::queue_many`] as the stream runs it: every operand checked
    /// live again (a buffer freed before the stream got here is an error, not a wild access).
    fn reduce_many_now(
        &self,
        dtype: DataType,
        op: ElemOp,
        dsts: &[MemRef],
        srcs: &[MemRef],
        premul: Option<f64>,
    ) -> Result<()> {
        let len = srcs[0].len;
        self.many_operands(dsts, srcs)?;
        if len == 0 {
            return Ok(());
        }
        let mut acc = vec![0u8; len];
        let mut scaled = vec![0u8; if premul.is_some() { len } else { 0 }];
        for (k, m) in srcs.iter().enumerate() {
            // SAFETY: `m` lies in a live stand-in allocation (host memory, checked above) that
            // a rank of this process holds until its stream has waited for every rank's share; no
            // destination is written while this slice lives (the sources are read whole into
            // the accumulator first).
            let src =
                Payload::Host(unsafe { std::slice::from_raw_parts(m.addr as *const u8, m.len) });
            let src = match premul {
                Some(f) => {
                    HostReducer.scale_into(dtype, PayloadMut::Host(&mut scaled), src, f)?;
                    Payload::Host(&scaled[..])
                }
                None => src,
            };
            if k == 0 {
                HostReducer.copy(PayloadMut::Host(&mut acc), src)?;
            } else {
                HostReducer.reduce_inplace(dtype, op, PayloadMut::Host(&mut acc), src)?;
            }
        }
        for m in dsts {
            // SAFETY: as for the sources above; every source slice is gone, and no two
            // destinations overlap (the ranks' buffers were checked apart).
            let d = unsafe { std::slice::from_raw_parts_mut(m.addr as *mut u8, m.len) };
            HostReducer.copy(PayloadMut::Host(d), Payload::Host(&acc))?;
        }
        Ok(())
    }

    /// A source: stand-in device memory, or host memory (a transport's receive buffer lent
    /// to the reduction: the p2p transport's host provider keeps its slots there).
    fn read<'a>(&self, what: &str, p: Payload<'a>) -> Result<(MemRef, Payload<'a>)> {
        let m = match p {
            Payload::Host(b) => return Ok((MemRef::host(b.as_ptr(), b.len()), p)),
            Payload::Device(m) => m,
        };
        self.check(what, &m)?;
        if m.len == 0 {
            return Ok((m, Payload::Host(&[])));
        }
        // SAFETY: `m` lies in a live stand-in allocation (host memory, checked above) that the
        // executor's caller holds for the call; no operand written by the same step overlaps
        // it (checked by `disjoint` before any slice is made).
        let s = unsafe { std::slice::from_raw_parts(m.addr as *const u8, m.len) };
        Ok((m, Payload::Host(s)))
    }

    fn write<'a>(&self, p: PayloadMut<'a>) -> Result<(MemRef, PayloadMut<'a>)> {
        let PayloadMut::Device(m) = p else {
            return Err(Error::invalid_argument(
                "host stand-in reducer: the destination is host memory",
            ));
        };
        self.check("destination", &m)?;
        if m.len == 0 {
            return Ok((m, PayloadMut::Host(&mut [])));
        }
        // SAFETY: as in `read`; the destination is used by nothing else during the step.
        let s = unsafe { std::slice::from_raw_parts_mut(m.addr as *mut u8, m.len) };
        Ok((m, PayloadMut::Host(s)))
    }
}

/// `FERRO_STANDIN_FAIL_MANY=N` (test tooling): the stand-in's reduce-copies of many buffers
/// of exactly `N` bytes fail, as a kernel that cannot launch would, so that the tests see
/// what the other ranks of a call make of one rank's failed share. Read once per process.
fn fail_many_at() -> Option<usize> {
    static AT: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *AT.get_or_init(|| {
        std::env::var("FERRO_STANDIN_FAIL_MANY")
            .ok()
            .and_then(|v| v.trim().parse().ok())
    })
}

/// Whether distinct stand-in devices reach each other's memory in a reduce-copy of many
/// buffers, as GPUs with peer access do: yes, unless `FERRO_STANDIN_PEER_ACCESS=0` (test
/// tooling: GPUs without it). Read once per process.
pub(crate) fn standin_reach() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("FERRO_STANDIN_PEER_ACCESS").map_or(true, |v| v.trim() != "0"))
}

/// Refuses a destination that overlaps a source (the slices would alias).
fn disjoint(dst: &PayloadMut<'_>, srcs: &[&Payload<'_>]) -> Result<()> {
    let d = dst.mem();
    if srcs.iter().any(|s| s.mem().overlaps(&d)) {
        return Err(Error::internal(format!(
            "host stand-in reducer: the destination (0x{:x}, {} bytes) overlaps a source",
            d.addr, d.len
        )));
    }
    Ok(())
}

impl Reducer for StandInReducer {
    fn name(&self) -> &'static str {
        "host stand-in"
    }

    fn serves(&self, space: MemSpace) -> bool {
        space == MemSpace::Cuda(self.ordinal)
    }

    fn reduce(
        &self,
        dtype: DataType,
        op: ElemOp,
        dst: PayloadMut<'_>,
        a: Payload<'_>,
        b: Payload<'_>,
    ) -> Result<()> {
        if dst.mem() == a.mem() {
            return self.reduce_inplace(dtype, op, dst, b);
        }
        disjoint(&dst, &[&a, &b])?;
        let (_, a) = self.read("first", a)?;
        let (_, b) = self.read("second", b)?;
        let (_, d) = self.write(dst)?;
        HostReducer.reduce(dtype, op, d, a, b)
    }

    fn reduce_inplace(
        &self,
        dtype: DataType,
        op: ElemOp,
        dst: PayloadMut<'_>,
        src: Payload<'_>,
    ) -> Result<()> {
        disjoint(&dst, &[&src])?;
        let (_, s) = self.read("source", src)?;
        let (_, d) = self.write(dst)?;
        HostReducer.reduce_inplace(dtype, op, d, s)
    }

    fn scale_into(
        &self,
        dtype: DataType,
        dst: PayloadMut<'_>,
        src: Payload<'_>,
        factor: f64,
    ) -> Result<()> {
        disjoint(&dst, &[&src])?;
        let (_, s) = self.read("source", src)?;
        let (_, d) = self.write(dst)?;
        HostReducer.scale_into(dtype, d, s, factor)
    }

    fn divide(&self, dtype: DataType, buf: PayloadMut<'_>, n: u64) -> Result<()> {
        let (_, d) = self.write(buf)?;
        HostReducer.divide(dtype, d, n)
    }

    fn copy(&self, dst: PayloadMut<'_>, src: Payload<'_>) -> Result<()> {
        disjoint(&dst, &[&src])?;
        let (_, s) = self.read("source", src)?;
        let (_, d) = self.write(dst)?;
        HostReducer.copy(d, s)
    }

    fn reduces_many(&self) -> bool {
        true
    }

    fn reaches(&self, from: MemSpace, to: MemSpace) -> bool {
        from == to
            || matches!((from, to), (MemSpace::Cuda(_), MemSpace::Cuda(_))) && standin_reach()
    }

    /// Yes, unless `FERRO_STANDIN_PLAIN=0` (test tooling: memory as a pool's or `cuMemMap`'s,
    /// which peer access does not cover).
    fn peer_mappable(&self, _m: MemRef) -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| std::env::var("FERRO_STANDIN_PLAIN").map_or(true, |v| v.trim() != "0"))
    }

    /// Checks the operands now, then queues the reduce-copy on the stand-in stream (the
    /// caller's, or the reducer's own): it runs when the stream reaches it, in the kernel's
    /// order (the first source scaled, then each next one combined into it, the result written
    /// to every destination once every source is read), each operand checked live again then.
    fn queue_many(
        &self,
        on: Option<usize>,
        dtype: DataType,
        op: ElemOp,
        dsts: &[MemRef],
        srcs: &[MemRef],
        premul: Option<f64>,
    ) -> Result<()> {
        let len = crate::reduce::many_len("host stand-in reducer", dtype, dsts, srcs)?;
        if fail_many_at() == Some(len) {
            return Err(Error::internal(format!(
                "host stand-in reducer (device {}): a reduce-copy of {} bytes fails \
                 (FERRO_STANDIN_FAIL_MANY)",
                self.ordinal, len
            )));
        }
        self.many_operands(dsts, srcs)?;
        if len == 0 {
            return Ok(());
        }
        let me = StandInReducer::new(self.ordinal);
        let (dsts, srcs) = (dsts.to_vec(), srcs.to_vec());
        host_stream::launch(
            self.stream(on),
            Box::new(move || me.reduce_many_now(dtype, op, &dsts, &srcs, premul)),
        );
        Ok(())
    }

    fn queue_divide(&self, on: Option<usize>, dtype: DataType, buf: MemRef, n: u64) -> Result<()> {
        self.check("buffer", &buf)?;
        if buf.len == 0 {
            return Ok(());
        }
        let me = StandInReducer::new(self.ordinal);
        host_stream::launch(
            self.stream(on),
            Box::new(move || {
                me.check("buffer", &buf)?;
                // SAFETY: `buf` lies in a live stand-in allocation (checked just now), the
                // output of a call whose rank holds it until its stream has run this; the
                // stream's order puts every share that writes it before this.
                let b = unsafe { std::slice::from_raw_parts_mut(buf.addr as *mut u8, buf.len) };
                HostReducer.divide(dtype, PayloadMut::Host(b), n)
            }),
        );
        Ok(())
    }

    fn mark(&self, on: Option<usize>, _which: MarkUse) -> Result<Mark> {
        let h = self.stream(on);
        Ok([h as u64, host_stream::record(h)])
    }

    fn wait_mark(&self, on: Option<usize>, mark: Mark) -> Result<()> {
        if mark != NO_MARK {
            host_stream::wait_for(self.stream(on), mark[0] as usize, mark[1]);
        }
        Ok(())
    }

    fn share_marks(&self) -> Result<SharedMarkWords> {
        let mut sh = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        if sh.is_none() {
            *sh = Some(OwnMarks::new(self.ordinal)?);
        }
        Ok(sh.as_ref().map_or([0; 16], |m| m.words()))
    }

    fn open_marks(&self, words: &SharedMarkWords) -> Result<PeerMarks> {
        shared_marks::open(self.ordinal, words)
    }

    fn mark_shared(&self, on: Option<usize>, which: MarkUse) -> Result<u64> {
        let sh = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        match sh.as_ref() {
            Some(m) => Ok(m.record(self.stream(on), which)),
            None => Err(Error::internal(
                "host stand-in reducer: a shared mark recorded before it was shared",
            )),
        }
    }

    fn wait_shared(&self, on: Option<usize>, p: &PeerMarks, which: MarkUse, w: u64) -> Result<()> {
        shared_marks::wait(self.stream(on), p, which, w)
    }

    fn mark_settled(&self, on: Option<usize>) -> Result<()> {
        let sh = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = sh.as_ref() {
            m.settle_point(self.stream(on));
        }
        Ok(())
    }

    fn settle_shared(&self, _limit: std::time::Duration) -> Result<()> {
        let sh = self
            .shared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        sh.map_or(Ok(()), |m| m.settle())
    }

    fn synchronize(&self, on: Option<usize>) -> Result<()> {
        host_stream::synchronize(self.stream(on))
    }

    /// Queues the release on the stream; a stand-in stream runs only when waited for, and host
    /// access to a held buffer runs it to there ([`host_stream::run_releases`]) before it
    /// waits for the holds, as a GPU gets there by itself.
    fn release_after(&self, on: usize, held: Box<dyn std::any::Any + Send>) -> Result<()> {
        host_stream::launch(
            on,
            Box::new(move || {
                drop(held);
                Ok(())
            }),
        );
        host_stream::release_later(on);
        Ok(())
    }

    /// The stand-in of a kernel queued and not waited for (`FERRO_P2P_QUEUED_REDUCE=1`):
    /// the operands are checked now and the reduction runs at the fence's second poll, so a
    /// rank that read the result, or a transport that reused the lent piece, before the fence
    /// was done would see stale bytes.
    fn queue(
        &self,
        dtype: DataType,
        op: ElemOp,
        dst: PayloadMut<'_>,
        a: Option<Payload<'_>>,
        b: Payload<'_>,
    ) -> Result<Option<Box<dyn Fence>>> {
        let (d, a, b) = (dst.mem(), a.map(|a| a.mem()), b.mem());
        self.check("destination", &d)?;
        for m in a.iter().chain([&b]).filter(|m| m.space != MemSpace::Host) {
            self.check("source", m)?;
        }
        Ok(Some(Box::new(Deferred {
            reducer: StandInReducer::new(self.ordinal),
            dtype,
            op,
            dst: d,
            a,
            b,
            polls: 0,
        })))
    }
}

/// A stand-in reduction queued and not yet run ([`Reducer::queue`]).
#[derive(Debug)]
struct Deferred {
    reducer: StandInReducer,
    dtype: DataType,
    op: ElemOp,
    dst: MemRef,
    a: Option<MemRef>,
    b: MemRef,
    polls: u32,
}

impl Fence for Deferred {
    fn done(&mut self) -> Result<bool> {
        self.polls += 1;
        match self.polls {
            1 => Ok(false),
            2 => {
                let source = |m: MemRef| -> Payload<'_> {
                    if m.space != MemSpace::Host {
                        return Payload::Device(m);
                    }
                    if m.len == 0 {
                        return Payload::Host(&[]);
                    }
                    // SAFETY: host memory a transport lent (its slot), which it keeps
                    // unchanged until this fence is done (`Connection::recv_lent_device`).
                    Payload::Host(unsafe { std::slice::from_raw_parts(m.addr as *const u8, m.len) })
                };
                let (a, b) = (self.a.map(source), source(self.b));
                let d = PayloadMut::Device(self.dst);
                crate::reduce::reduce_now(&self.reducer, self.dtype, self.op, d, a, b)?;
                Ok(true)
            }
            _ => Ok(true),
        }
    }

    /// Waited for only where the receive was given up (an error, a drop): the reduction is
    /// not run then, as a kernel's result is of no use to anyone.
    fn wait(&mut self) -> Result<()> {
        self.polls = self.polls.max(3);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(ordinal: u32) -> Device {
        Device::new(Provider::Host, ordinal).unwrap()
    }

    #[test]
    fn arena_buffers_are_kept_and_grow() {
        let mut a = DirectArena::new(dev(1)).unwrap();
        let s1 = a.buffer(ArenaUse::Scratch, 100).unwrap();
        assert_eq!(s1.space, MemSpace::Cuda(1));
        assert!(s1.len >= 100);
        assert_eq!(a.buffer(ArenaUse::Scratch, 100).unwrap(), s1);
        let st = a.buffer(ArenaUse::Stage(0), 10).unwrap();
        assert!(!st.overlaps(&s1));
        assert_eq!(a.allocations(), 2);
        let big = a.buffer(ArenaUse::Scratch, MIN_BUFFER + 1).unwrap();
        assert!(big.len > MIN_BUFFER);
        assert_eq!(a.allocations(), 3);
        assert_eq!(a.device(), dev(1));
    }

    #[test]
    fn stand_in_reducer_reduces_device_memory_and_refuses_anything_else() {
        let d = dev(2);
        let r = StandInReducer::new(2);
        let a = DeviceBuffer::from_host(d, &[1f32, 2.0, 3.0]).unwrap();
        let b = DeviceBuffer::from_host(d, &[10f32, 20.0, 30.0]).unwrap();
        let out = DeviceBuffer::<f32>::new(d, 3).unwrap();
        let (pa, pb, po) = (a.mem(), b.mem(), out.mem());
        r.reduce(
            DataType::Float32,
            ElemOp::Sum,
            PayloadMut::Device(po),
            Payload::Device(pa),
            Payload::Device(pb),
        )
        .unwrap();
        assert_eq!(out.to_vec().unwrap(), [11.0, 22.0, 33.0]);
        // dst == a: in place.
        r.reduce(
            DataType::Float32,
            ElemOp::Max,
            PayloadMut::Device(po),
            Payload::Device(po),
            Payload::Device(pa),
        )
        .unwrap();
        assert_eq!(out.to_vec().unwrap(), [11.0, 22.0, 33.0]);
        r.divide(DataType::Float32, PayloadMut::Device(po), 11)
            .unwrap();
        assert_eq!(out.to_vec().unwrap(), [1.0, 2.0, 3.0]);
        // Another device's memory, host memory, a range past the end, overlapping operands.
        let other = DeviceBuffer::from_host(dev(3), &[0f32; 3]).unwrap();
        let e = r
            .copy(PayloadMut::Device(po), Payload::Device(other.mem()))
            .unwrap_err();
        assert!(e.to_string().contains("cuda device 3"), "{e}");
        // A host source (a transport's lent buffer) is read; a host destination is refused.
        let host: Vec<u8> = [5f32, 6.0, 7.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        r.copy(PayloadMut::Device(po), Payload::Host(&host))
            .unwrap();
        assert_eq!(out.to_vec().unwrap(), [5.0, 6.0, 7.0]);
        let mut h = [0u8; 12];
        let e = r
            .copy(PayloadMut::Host(&mut h), Payload::Device(pa))
            .unwrap_err();
        assert!(e.to_string().contains("host memory"), "{e}");
        let past = MemRef {
            len: pa.len + 4,
            ..pa
        };
        let e = r
            .copy(PayloadMut::Device(po), Payload::Device(past))
            .unwrap_err();
        assert!(e.to_string().contains("not live memory"), "{e}");
        let e = r
            .copy(
                PayloadMut::Device(po.sub(4, 8)),
                Payload::Device(po.sub(0, 8)),
            )
            .unwrap_err();
        assert!(e.to_string().contains("overlaps"), "{e}");
        assert!(r.serves(MemSpace::Cuda(2)) && !r.serves(MemSpace::Host));
        drop(out);
    }
}
