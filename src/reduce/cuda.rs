//! The CUDA reducer: the reduce-copy kernels of `ferroccl-cuda` on device memory of one GPU.
//!
//! Every step becomes one kernel launch on the reducer's stream (a copy: an async
//! device-to-device copy), then waits for the stream: completion is synchronous until the
//! stream-ordered device API lands. The kernels are compiled with NVRTC for the device's
//! architecture at first use, cached per process and on disk (`ferroccl_cuda::device`).
//!
//! Every entry checks the driver first: without one, [`CudaReducer::new`] and every step return
//! `device buffers need an NVIDIA driver (libcuda.so.1 not found); host buffers work without
//! one`, never a panic. Built and checked without a GPU; not yet run on one (see docs/CUDA.md).

use std::sync::{Mutex, OnceLock};

use ferroccl_cuda::device::DeviceKernels;
use ferroccl_cuda::driver::Handle;
use ferroccl_cuda::{CudaError, CudaErrorKind, RcArgs};
use ferroccl_kernels::{DataType, ElemOp};
use ferroccl_transport::{Error, ErrorKind, Fence, MemRef, MemSpace, Payload, PayloadMut, Result};

use super::{Mark, MarkUse, PeerMarks, Reducer, SharedMarkWords, NO_MARK};

mod marks;

const NAME: &str = "cuda reducer";

/// The CUDA layer's error as a ferroccl error: a missing driver or NVRTC is something optional
/// that is not available here; a bad device ordinal is the caller's argument.
fn convert(e: &CudaError) -> Error {
    let kind = match e.kind() {
        CudaErrorKind::DriverMissing | CudaErrorKind::NvrtcMissing => ErrorKind::Unsupported,
        CudaErrorKind::Invalid => ErrorKind::InvalidArgument,
        _ => ErrorKind::Internal,
    };
    Error::new(kind, e.message().to_string())
}

/// Whether kernels on CUDA device `a` of this process may read and write device `b`'s
/// memory: the same device, or the driver says `a` can access `b` as a peer (NVLink, or PCIe
/// peer access) and peer access from `a`'s primary context to `b`'s is enabled here. Settled
/// once per pair and process (whichever thread asks first enables it), the same answer every
/// time after; no driver, or an error: no (logged where enabling failed).
pub(crate) fn peer_reach(a: u32, b: u32) -> bool {
    if a == b {
        return true;
    }
    static KNOWN: Mutex<Vec<((u32, u32), bool)>> = Mutex::new(Vec::new());
    let mut known = KNOWN.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(&(_, r)) = known.iter().find(|(p, _)| *p == (a, b)) {
        return r;
    }
    let r = ferroccl_cuda::driver::driver().is_ok_and(|d| {
        let (Ok(da), Ok(db)) = (d.device(a), d.device(b)) else {
            return false;
        };
        if !d.can_access_peer(da, db).unwrap_or(false) {
            return false;
        }
        match d.enable_peer_access_between(da, db) {
            Ok(()) => true,
            Err(e) => {
                ferroccl_transport::log_line!(
                    "ferroccl WARN DEVICE: cuda device {a} can reach device {b}, but enabling \
                     peer access failed ({}): collectives between the ranks' buffers on both \
                     run their schedules instead",
                    e.message()
                );
                false
            }
        }
    });
    known.push(((a, b), r));
    r
}

/// Reduces device memory of one GPU with the NVRTC-compiled kernels.
#[derive(Debug)]
pub(crate) struct CudaReducer {
    ordinal: u32,
    kernels: OnceLock<std::result::Result<DeviceKernels, CudaError>>,
    /// Its two marks' events ([`MarkUse`]), made at the first mark (0: not yet) and never
    /// destroyed (see below the impl).
    events: Mutex<[usize; 2]>,
    /// The marks as interprocess events, made when first shared (`marks.rs`).
    shared: Mutex<marks::SharedEvents>,
}

impl CudaReducer {
    /// A reducer for CUDA device `ordinal`: checks the driver and the device now, compiles the
    /// kernels at the first step.
    pub(crate) fn new(ordinal: u32) -> Result<CudaReducer> {
        let driver = ferroccl_cuda::driver::driver().map_err(|e| convert(&e))?;
        driver.device(ordinal).map_err(|e| convert(&e))?;
        Ok(CudaReducer::unchecked(ordinal))
    }

    /// A reducer whose driver is checked at the first step only (tests of argument checks).
    fn unchecked(ordinal: u32) -> CudaReducer {
        CudaReducer {
            ordinal,
            kernels: OnceLock::new(),
            events: Mutex::new([0; 2]),
            shared: Mutex::default(),
        }
    }

    fn kernels(&self) -> Result<&DeviceKernels> {
        self.kernels
            .get_or_init(|| DeviceKernels::new(self.ordinal))
            .as_ref()
            .map_err(convert)
    }

    /// The device reference behind an operand, which must be on this reducer's device.
    fn device(&self, what: &str, space: MemSpace, mem: Option<MemRef>) -> Result<MemRef> {
        match mem {
            Some(m) if m.space == MemSpace::Cuda(self.ordinal) && m.addr == 0 && m.len > 0 => {
                Err(Error::invalid_argument(format!(
                    "{NAME} (cuda device {}): the {what} operand is a null device pointer \
                     ({} bytes)",
                    self.ordinal, m.len
                )))
            }
            Some(m) if m.space == MemSpace::Cuda(self.ordinal) => Ok(m),
            _ => Err(Error::invalid_argument(format!(
                "{NAME} (cuda device {}): the {what} operand is {space} memory; this reducer \
                 reaches only cuda device {} memory",
                self.ordinal, self.ordinal
            ))),
        }
    }

    /// An operand of [`Reducer::queue_many`]: memory of this device, or of another device
    /// of this process that this one reaches ([`peer_reach`], which enabled the access).
    fn many_operand(&self, what: &str, m: MemRef) -> Result<MemRef> {
        match m.space {
            MemSpace::Cuda(o) if o != self.ordinal && peer_reach(self.ordinal, o) => {
                if m.addr == 0 && m.len > 0 {
                    return Err(Error::invalid_argument(format!(
                        "{NAME} (cuda device {}): the {what} operand on cuda device {o} is a \
                         null device pointer ({} bytes)",
                        self.ordinal, m.len
                    )));
                }
                Ok(m)
            }
            _ => self.device(what, m.space, Some(m)),
        }
    }

    fn read(&self, what: &str, p: Payload<'_>) -> Result<MemRef> {
        match p {
            Payload::Host(_) => self.device(what, MemSpace::Host, None),
            Payload::Device(m) => self.device(what, m.space, Some(m)),
        }
    }

    fn write(&self, what: &str, p: PayloadMut<'_>) -> Result<MemRef> {
        match p {
            PayloadMut::Host(_) => self.device(what, MemSpace::Host, None),
            PayloadMut::Device(m) => self.device(what, m.space, Some(m)),
        }
    }

    /// Checks the lengths and queues one reduce-copy of `srcs` into `dst` on stream `on` (`None`:
    /// the kernels' own), whose kernels it returns: the caller waits for the stream ([`wait`]),
    /// marks it ([`Reducer::queue`]), or orders later work on it.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        on: Option<usize>,
        dtype: DataType,
        op: ElemOp,
        dst: MemRef,
        srcs: &[MemRef],
        scale: Option<f64>,
        divide: Option<u64>,
    ) -> Result<&DeviceKernels> {
        if let Some(s) = srcs.iter().find(|s| s.len != dst.len) {
            return Err(Error::internal(format!(
                "{NAME}: operand lengths differ ({} and {} bytes)",
                dst.len, s.len
            )));
        }
        if !dst.len.is_multiple_of(dtype.size()) {
            return Err(Error::internal(format!(
                "{NAME}: {} bytes is not a whole number of {dtype} elements",
                dst.len
            )));
        }
        let k = self.kernels()?;
        let addrs: Vec<u64> = srcs.iter().map(|s| s.addr as u64).collect();
        let mut args = RcArgs::new(&addrs, &[dst.addr as u64], (dst.len / dtype.size()) as u64);
        if let Some(f) = scale {
            args = args.with_scale(dtype, 1, f);
        }
        if let Some(n) = divide {
            args = args.with_divide(dtype, n);
        }
        // SAFETY: the operands are `Payload::Device` references on this reducer's device, whose
        // makers vouch that they are live device allocations of `len` bytes (MemRef's
        // contract: on a caller's stream, until the stream has run the kernel); the lengths
        // were checked equal above, and the caller waits for the stream or holds the memory
        // until the mark it makes is done, so the memory outlives the kernel. The stream is
        // the kernels' own or the caller's stream of this device.
        unsafe { k.reduce_copy_on(stream_of(k, on), dtype, op, &args) }.map_err(|e| convert(&e))?;
        Ok(k)
    }
}

/// The stream `on` names (`None`: the kernels' own).
fn stream_of(k: &DeviceKernels, on: Option<usize>) -> Handle {
    on.map_or(k.stream(), |h| h as Handle)
}

impl CudaReducer {
    /// The kernels, bound on this thread, and the stream `on` names ([`stream_of`]).
    fn on(&self, on: Option<usize>) -> Result<(&DeviceKernels, Handle)> {
        let k = self.kernels()?;
        k.bind().map_err(|e| convert(&e))?;
        Ok((k, stream_of(k, on)))
    }

    /// Queues `b = b / n` on stream `on` ([`CudaReducer::launch`]).
    fn divide_on(
        &self,
        on: Option<usize>,
        dtype: DataType,
        b: MemRef,
        n: u64,
    ) -> Result<&DeviceKernels> {
        if n == 0 {
            return Err(Error::internal(format!("{NAME}: divide by 0 ranks")));
        }
        self.launch(on, dtype, ElemOp::Sum, b, &[b], None, Some(n))
    }

    /// The event of mark `which`, made now if it was not yet (the context bound).
    fn event(&self, k: &DeviceKernels, which: MarkUse) -> Result<Handle> {
        let mut ev = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let slot = &mut ev[which as usize];
        if *slot == 0 {
            *slot = k.driver().create_event().map_err(|e| convert(&e))? as usize;
        }
        Ok(*slot as Handle)
    }
}

// The marks' events are not destroyed with the reducer: another rank's thread may queue a
// wait for this rank's done mark after this rank has left the call (and dropped its
// communicator), and nothing tells this rank when every such wait is queued; a wait queued on
// a destroyed event fails, or waits for whatever event took its handle. So the (at most two)
// events of a reducer live as long as the process.

/// Lets a stream-ordered call's holds go (`cuLaunchHostFunc`'s function): `data` is the
/// `Box<Box<dyn Any + Send>>` that [`Reducer::release_after`] leaked.
unsafe extern "C" fn release(data: *mut std::ffi::c_void) {
    // SAFETY: `release_after` passed a pointer from `Box::into_raw` of this type, and the
    // driver calls this once per launch.
    drop(unsafe { Box::from_raw(data.cast::<Box<dyn std::any::Any + Send>>()) });
}

/// Waits until the kernels' stream has run what was queued on it.
fn wait(k: &DeviceKernels) -> Result<()> {
    k.synchronize().map_err(|e| convert(&e))
}

/// The mark after a queued reduction: done once the kernel has run.
#[derive(Debug)]
struct Queued(ferroccl_cuda::device::Mark);

impl Fence for Queued {
    fn done(&mut self) -> Result<bool> {
        self.0.done().map_err(|e| convert(&e))
    }
    fn wait(&mut self) -> Result<()> {
        self.0.wait().map_err(|e| convert(&e))
    }
}

impl Reducer for CudaReducer {
    fn name(&self) -> &'static str {
        "cuda"
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
        let (d, a, b) = (
            self.write("destination", dst)?,
            self.read("first", a)?,
            self.read("second", b)?,
        );
        wait(self.launch(None, dtype, op, d, &[a, b], None, None)?)
    }

    fn reduce_inplace(
        &self,
        dtype: DataType,
        op: ElemOp,
        dst: PayloadMut<'_>,
        src: Payload<'_>,
    ) -> Result<()> {
        let (d, s) = (self.write("destination", dst)?, self.read("source", src)?);
        wait(self.launch(None, dtype, op, d, &[d, s], None, None)?)
    }

    fn scale_into(
        &self,
        dtype: DataType,
        dst: PayloadMut<'_>,
        src: Payload<'_>,
        factor: f64,
    ) -> Result<()> {
        let (d, s) = (self.write("destination", dst)?, self.read("source", src)?);
        wait(self.launch(None, dtype, ElemOp::Sum, d, &[s], Some(factor), None)?)
    }

    fn divide(&self, dtype: DataType, buf: PayloadMut<'_>, n: u64) -> Result<()> {
        let b = self.write("buffer", buf)?;
        wait(self.divide_on(None, dtype, b, n)?)
    }

    fn reduces_many(&self) -> bool {
        true
    }

    fn reaches(&self, from: MemSpace, to: MemSpace) -> bool {
        match (from, to) {
            (MemSpace::Cuda(a), MemSpace::Cuda(b)) => peer_reach(a, b),
            _ => from == to,
        }
    }

    /// A process that sees one GPU has every rank on it, where any memory will do: it answers
    /// yes without a pointer query (which would cost every call between the buffers one).
    fn peer_mappable(&self, m: MemRef) -> bool {
        static ONE_GPU: OnceLock<bool> = OnceLock::new();
        let one_gpu = *ONE_GPU.get_or_init(|| {
            self.kernels()
                .ok()
                .and_then(|k| k.driver().device_count().ok())
                .is_some_and(|n| n <= 1)
        });
        m.len == 0
            || one_gpu
            || self
                .kernels()
                .ok()
                .and_then(|k| {
                    k.bind()
                        .ok()
                        .and_then(|()| k.driver().is_plain_allocation(m.addr as u64))
                })
                .unwrap_or(false)
    }

    fn queue_many(
        &self,
        on: Option<usize>,
        dtype: DataType,
        op: ElemOp,
        dsts: &[MemRef],
        srcs: &[MemRef],
        premul: Option<f64>,
    ) -> Result<()> {
        let len = super::many_len(NAME, dtype, dsts, srcs)?;
        let on_device = |what: &str, ms: &[MemRef]| {
            ms.iter()
                .map(|m| self.many_operand(what, *m))
                .collect::<Result<Vec<MemRef>>>()
        };
        let (srcs, dsts) = (on_device("source", srcs)?, on_device("destination", dsts)?);
        if len == 0 {
            return Ok(());
        }
        let k = self.kernels()?;
        let s: Vec<u64> = srcs.iter().map(|m| m.addr as u64).collect();
        let d: Vec<u64> = dsts.iter().map(|m| m.addr as u64).collect();
        let mut args = RcArgs::new(&s, &d, (len / dtype.size()) as u64);
        if let Some(f) = premul {
            args = args.with_scale(dtype, (1u32 << s.len()) - 1, f);
        }
        // SAFETY: every operand is a non-null reference on this reducer's device or on one its
        // context has peer access to (checked above; `peer_reach` enabled it), which its maker
        // vouches is live device memory of `len` bytes until the stream has run the kernel
        // (MemRef's contract and this method's: here the buffers of ranks that are threads of
        // this process, each held by its rank until its stream has waited for every rank's
        // share); the lengths were checked equal. `stream` is the kernels' own or the caller's
        // stream of this device's primary context. A destination that is also a source is the
        // same memory, which the kernel reads element by element before writing it.
        unsafe { k.reduce_copy_on(stream_of(k, on), dtype, op, &args) }.map_err(|e| convert(&e))
    }

    fn queue_divide(&self, on: Option<usize>, dtype: DataType, buf: MemRef, n: u64) -> Result<()> {
        let b = self.device("buffer", buf.space, Some(buf))?;
        self.divide_on(on, dtype, b, n).map(|_| ())
    }

    fn mark(&self, on: Option<usize>, which: MarkUse) -> Result<Mark> {
        let (k, stream) = self.on(on)?;
        let ev = self.event(k, which)?;
        // SAFETY: `ev` is this reducer's live event; `stream` a live stream of the bound
        // context (the kernels' own, or the caller's of this device).
        unsafe { k.driver().record_event(ev, stream) }.map_err(|e| convert(&e))?;
        Ok([ev as u64, 0])
    }

    fn wait_mark(&self, on: Option<usize>, mark: Mark) -> Result<()> {
        if mark == NO_MARK {
            return Ok(());
        }
        let (k, stream) = self.on(on)?;
        // SAFETY: `mark` came from `mark` of a reducer of this process, whose event lives as
        // long as its communicator, which takes part in the call that waits for it; the
        // driver lets a stream wait for an event of another context or device.
        unsafe { k.driver().stream_wait(stream, mark[0] as Handle) }.map_err(|e| convert(&e))
    }

    fn share_marks(&self) -> Result<SharedMarkWords> {
        self.share_marks_now()
    }

    fn open_marks(&self, words: &SharedMarkWords) -> Result<PeerMarks> {
        self.open_marks_now(words)
    }

    fn mark_shared(&self, on: Option<usize>, which: MarkUse) -> Result<u64> {
        self.mark_shared_now(on, which)
    }

    fn wait_shared(&self, on: Option<usize>, p: &PeerMarks, which: MarkUse, _w: u64) -> Result<()> {
        self.wait_shared_now(on, p, which)
    }

    fn mark_settled(&self, on: Option<usize>) -> Result<()> {
        self.mark_settled_now(on)
    }

    fn release_shared(&self, peers: &[Option<PeerMarks>]) -> Result<()> {
        self.release_shared_now(peers)
    }

    fn settle_shared(&self, limit: std::time::Duration) -> Result<()> {
        self.settle_shared_now(limit)
    }

    fn synchronize_within(&self, on: Option<usize>, limit: std::time::Duration) -> Result<()> {
        self.synchronize_within_now(on, limit)
    }

    fn synchronize(&self, on: Option<usize>) -> Result<()> {
        let (k, stream) = self.on(on)?;
        // SAFETY: a live stream of the bound context.
        unsafe { k.driver().sync_stream(stream) }.map_err(|e| convert(&e))
    }

    fn release_after(&self, on: usize, held: Box<dyn std::any::Any + Send>) -> Result<()> {
        let (k, stream) = self.on(Some(on))?;
        let data = Box::into_raw(Box::new(held));
        // SAFETY: `release` makes no CUDA call and takes back `data` once; the stream is the
        // caller's stream of this device.
        let r = unsafe { k.driver().launch_host_func(stream, release, data.cast()) };
        if let Err(e) = r {
            // Not queued: the holds go now and the error returns; the caller (`end_call`)
            // waits for the stream instead.
            // SAFETY: `data` was not handed to the driver, so it is still ours, once.
            drop(unsafe { Box::from_raw(data) });
            return Err(convert(&e));
        }
        Ok(())
    }

    fn queue(
        &self,
        dtype: DataType,
        op: ElemOp,
        dst: PayloadMut<'_>,
        a: Option<Payload<'_>>,
        b: Payload<'_>,
    ) -> Result<Option<Box<dyn Fence>>> {
        let d = self.write("destination", dst)?;
        let a = match a {
            Some(a) => self.read("first", a)?,
            None => d,
        };
        let b = self.read("second", b)?;
        let k = self.launch(None, dtype, op, d, &[a, b], None, None)?;
        let mark = k.mark().map_err(|e| convert(&e))?;
        Ok(Some(Box::new(Queued(mark))))
    }

    fn copy(&self, dst: PayloadMut<'_>, src: Payload<'_>) -> Result<()> {
        let (d, s) = (self.write("destination", dst)?, self.read("source", src)?);
        if d.len != s.len {
            return Err(Error::internal(format!(
                "{NAME}: copy of {} bytes into {} bytes",
                s.len, d.len
            )));
        }
        if d.addr == s.addr {
            return Ok(());
        }
        let k = self.kernels()?;
        // SAFETY: as in `run`: live device allocations of `len` bytes by MemRef's contract,
        // waited for before returning. Distinct device references of one schedule step do not
        // overlap (the executor's buffers are disjoint).
        unsafe { k.copy(d.addr as u64, s.addr as u64, d.len) }.map_err(|e| convert(&e))?;
        k.synchronize().map_err(|e| convert(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(ordinal: u32, addr: usize, len: usize) -> MemRef {
        MemRef {
            space: MemSpace::Cuda(ordinal),
            addr,
            len,
        }
    }

    /// On a machine without a driver (this suite's machines): the reducer and every step say
    /// so, with the message users see.
    #[test]
    fn without_a_driver_every_entry_returns_the_clear_error() {
        if ferroccl_cuda::driver::driver().is_ok() {
            return; // a machine with a driver: scripts/gpu-check.sh covers it
        }
        let e = CudaReducer::new(0).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported);
        assert!(
            e.message().starts_with(ferroccl_cuda::DRIVER_MISSING),
            "{e}"
        );
        let r = CudaReducer::unchecked(0);
        let (a, b, d) = (dev(0, 0x1000, 64), dev(0, 0x2000, 64), dev(0, 0x3000, 64));
        let f32_ = DataType::Float32;
        let results = [
            r.reduce(
                f32_,
                ElemOp::Sum,
                PayloadMut::Device(d),
                Payload::Device(a),
                Payload::Device(b),
            ),
            r.reduce_inplace(f32_, ElemOp::Max, PayloadMut::Device(d), Payload::Device(a)),
            r.scale_into(f32_, PayloadMut::Device(d), Payload::Device(a), 0.5),
            r.divide(f32_, PayloadMut::Device(d), 4),
            r.copy(PayloadMut::Device(d), Payload::Device(a)),
            r.queue_many(None, f32_, ElemOp::Sum, &[d, a], &[a, b], Some(0.5)),
            r.mark(None, MarkUse::Ready).map(|_| ()),
            r.wait_mark(None, [1, 0]),
            r.synchronize(None),
            r.share_marks().map(|_| ()),
            r.open_marks(&[0; 16]).map(|_| ()),
            r.mark_shared(None, MarkUse::Done).map(|_| ()),
            r.synchronize_within(None, std::time::Duration::from_secs(1)),
        ];
        for e in results {
            let e = e.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
            assert!(
                e.message().starts_with(ferroccl_cuda::DRIVER_MISSING),
                "{e}"
            );
        }
    }

    #[test]
    fn reduce_copies_of_many_buffers_are_checked_before_any_launch() {
        let r = CudaReducer::unchecked(1);
        let f32_ = DataType::Float32;
        let (a, b) = (dev(1, 0x1000, 64), dev(1, 0x2000, 64));
        // Another device's operand (where this device does not reach it), a short one, nine
        // sources, a partial element.
        let mut cases = vec![
            (vec![a], vec![a, dev(1, 0x3000, 32)], "lengths differ"),
            (vec![a], vec![b; 9], "9 sources"),
            (
                vec![dev(1, 0x1000, 6)],
                vec![dev(1, 0x2000, 6)],
                "not a whole number",
            ),
        ];
        if !peer_reach(1, 0) {
            cases.push((
                vec![a],
                vec![a, dev(0, 0x3000, 64)],
                "source operand is cuda device 0",
            ));
        }
        for (dsts, srcs, says) in cases {
            let e = r
                .queue_many(None, f32_, ElemOp::Sum, &dsts, &srcs, None)
                .unwrap_err();
            assert!(e.message().contains(says), "{e}");
        }
    }

    /// A device reaches itself; without a driver no other; the answer for a pair is the
    /// process's, whichever reducer is asked, and the same when asked again.
    #[test]
    fn which_devices_a_reduce_copy_reaches() {
        let (r0, r1) = (CudaReducer::unchecked(0), CudaReducer::unchecked(1));
        let cuda = MemSpace::Cuda;
        assert!(r1.reaches(cuda(1), cuda(1)) && r1.reaches(cuda(3), cuda(3)));
        assert!(!r1.reaches(cuda(1), MemSpace::Host) && !r1.reaches(MemSpace::Host, cuda(1)));
        for (a, b) in [(0, 1), (1, 0), (1, 2)] {
            let first = r0.reaches(cuda(a), cuda(b));
            assert_eq!(first, r1.reaches(cuda(a), cuda(b)));
            assert_eq!(first, r0.reaches(cuda(a), cuda(b)));
            if ferroccl_cuda::driver::driver().is_err() {
                assert!(!first, "{a} reaches {b} without a driver");
            }
        }
    }

    #[test]
    fn operands_on_the_wrong_space_or_device_are_refused_before_any_launch() {
        let r = CudaReducer::unchecked(1);
        assert!(r.serves(MemSpace::Cuda(1)));
        assert!(!r.serves(MemSpace::Cuda(0)) && !r.serves(MemSpace::Host));
        let mut host = [0u8; 16];
        let e = r
            .reduce_inplace(
                DataType::Float32,
                ElemOp::Sum,
                PayloadMut::Host(&mut host),
                Payload::Device(dev(1, 0x1000, 16)),
            )
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(
            e.message().contains("destination operand is host memory"),
            "{e}"
        );
        let e = r
            .copy(
                PayloadMut::Device(dev(1, 0x1000, 16)),
                Payload::Device(dev(0, 0x2000, 16)),
            )
            .unwrap_err();
        assert!(
            e.message()
                .contains("source operand is cuda device 0 memory"),
            "{e}"
        );
        let e = r
            .reduce(
                DataType::Float32,
                ElemOp::Sum,
                PayloadMut::Device(dev(1, 0x1000, 16)),
                Payload::Device(dev(1, 0x2000, 16)),
                Payload::Device(dev(1, 0x3000, 12)),
            )
            .unwrap_err();
        assert!(e.message().contains("lengths differ"), "{e}");
        let e = r
            .divide(DataType::Float64, PayloadMut::Device(dev(1, 0x1000, 12)), 2)
            .unwrap_err();
        assert!(e.message().contains("whole number"), "{e}");
        let e = r
            .divide(DataType::Float32, PayloadMut::Device(dev(1, 0, 16)), 2)
            .unwrap_err();
        assert!(
            e.message()
                .contains("buffer operand is a null device pointer"),
            "{e}"
        );
    }
}
