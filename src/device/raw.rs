//! Device memory named by raw addresses, for code outside Rust (the C ABI, the perf tools):
//! the device a thread works on, allocations that are not [`DeviceBuffer`]s, borrowed views of
//! them, and streams handed in by the caller.
//!
//! With the `cuda` provider these are driver calls (`cuCtxGetDevice`, `cuMemAlloc`,
//! `cuStreamSynchronize`, ...); with the host stand-in, the stand-in's registry and `memcpy`,
//! and any non-NULL stream handle names a stand-in stream (`host_stream`): a FIFO of copies
//! and flag waits that a synchronize runs in order (the stand-in runs no kernels).

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ops::Range;

use ferroccl_kernels::{DataType, Element};

use super::direct::StreamCall;
use super::{cuda, host, host_stream, Device, DeviceBuffer, Provider};
use crate::coll::CollKind;
use crate::{BufMut, BufRef, Communicator, Error, ErrorKind, ReduceOp, Result};

/// The environment variable naming the host stand-in's current device (default 0).
pub const DEVICE_ENV: &str = "FERRO_DEVICE";

impl Provider {
    /// The device this thread works on. `Cuda`: the device of the current context
    /// (`cuCtxGetDevice`, what a CUDA runtime program chose with `cudaSetDevice`), 0 when no
    /// context is current or there is no driver (a call that needs the device then reports
    /// the driver's error). `Host`: `FERRO_DEVICE` when it holds a device number, else 0.
    pub fn current_device(self) -> u32 {
        self.chosen_device().unwrap_or(0)
    }

    /// The device this thread works on where it is known: `Cuda`, where a context is current;
    /// `Host`, where `FERRO_DEVICE` holds a device number.
    pub fn chosen_device(self) -> Option<u32> {
        match self {
            Provider::Cuda => ferroccl_cuda::driver::driver()
                .ok()
                .and_then(|d| d.current_device().ok())
                .and_then(|d| u32::try_from(d).ok()),
            Provider::Host => std::env::var(DEVICE_ENV)
                .ok()
                .and_then(|v| v.trim().parse().ok()),
        }
    }
}

impl Device {
    /// Allocates `bytes` of device memory not owned by a [`DeviceBuffer`] (for `ncclMemAlloc`);
    /// free it with [`Device::free_raw`]. The host stand-in's memory is zeroed and, being heap
    /// memory, host-addressable (a real device's is not).
    pub fn alloc_raw(self, bytes: usize) -> Result<u64> {
        match self.provider {
            Provider::Cuda => cuda::alloc(self.ordinal, bytes),
            Provider::Host => host::alloc(self.ordinal, bytes),
        }
    }

    /// Whether `addr` is page-locked host memory (`cudaMallocHost`, `cudaHostAlloc`,
    /// `cudaHostRegister`; the host stand-in: its page-locked allocations, as
    /// [`Device::alloc_pinned_raw`] makes them). Pageable host memory and device memory are not.
    pub fn is_page_locked(self, addr: u64) -> bool {
        match self.provider {
            Provider::Cuda => cuda::is_page_locked(addr, self.ordinal),
            Provider::Host => host::is_pinned(addr),
        }
    }

    /// Allocates `bytes` of page-locked host memory (`cuMemAllocHost`; the stand-in: heap
    /// memory it registers as page-locked), for test programs; free it with
    /// [`Device::free_pinned_raw`].
    pub fn alloc_pinned_raw(self, bytes: usize) -> Result<*mut u8> {
        match self.provider {
            Provider::Cuda => cuda::alloc_pinned(self.ordinal, bytes),
            Provider::Host => host::alloc_pinned(bytes),
        }
    }

    /// Frees memory from [`Device::alloc_pinned_raw`].
    ///
    /// # Safety
    /// `p` came from `alloc_pinned_raw` on this device, is freed once, and no work still uses
    /// it.
    pub unsafe fn free_pinned_raw(self, p: *mut u8) -> Result<()> {
        match self.provider {
            // SAFETY: per the caller.
            Provider::Cuda => unsafe { cuda::free_pinned(self.ordinal, p) },
            Provider::Host => {
                let Some(len) = host::pinned_len(p) else {
                    return Err(Error::invalid_argument(format!(
                        "host stand-in: free of {p:p}, which is not live page-locked memory"
                    )));
                };
                // SAFETY: a live page-locked allocation of `len` bytes (the registry holds
                // it), freed once per the caller.
                unsafe { host::free_pinned(p, len) };
                Ok(())
            }
        }
    }

    /// Frees memory from [`Device::alloc_raw`].
    ///
    /// # Safety
    /// `addr` came from `alloc_raw` on this device, is freed once, and no work still uses it.
    pub unsafe fn free_raw(self, addr: u64) -> Result<()> {
        match self.provider {
            // SAFETY: per the caller.
            Provider::Cuda => unsafe { cuda::free(self.ordinal, addr) },
            // SAFETY: per the caller.
            Provider::Host => unsafe { host::free(addr) },
        }
    }

    /// Copies `dst.len()` bytes of device memory at `addr` to `dst`; returns when done.
    ///
    /// # Safety
    /// `[addr, addr + dst.len())` is live device memory of this device, not written meanwhile.
    pub unsafe fn read_raw(self, addr: u64, dst: &mut [u8]) -> Result<()> {
        match self.provider {
            // SAFETY: per the caller.
            Provider::Cuda => unsafe { cuda::download(self.ordinal, dst, addr) },
            Provider::Host => {
                // SAFETY: per the caller the range is a live stand-in allocation (host memory);
                // `dst` is a distinct, exclusively borrowed host slice.
                unsafe {
                    std::ptr::copy_nonoverlapping(addr as *const u8, dst.as_mut_ptr(), dst.len())
                };
                Ok(())
            }
        }
    }

    /// Copies `src` to device memory at `addr`; returns when done.
    ///
    /// # Safety
    /// `[addr, addr + src.len())` is live device memory of this device, used by nothing else.
    pub unsafe fn write_raw(self, addr: u64, src: &[u8]) -> Result<()> {
        match self.provider {
            // SAFETY: per the caller.
            Provider::Cuda => unsafe { cuda::upload(self.ordinal, addr, src) },
            Provider::Host => {
                // SAFETY: per the caller the range is a live stand-in allocation (host memory);
                // `src` is a distinct host slice.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), addr as *mut u8, src.len()) };
                Ok(())
            }
        }
    }

    /// Waits until the work queued on the caller's `stream` (a `CUstream` / `cudaStream_t` of
    /// this device) has run: `cuStreamSynchronize`. The host stand-in runs its model of the
    /// stream (copies and flag waits queued on it).
    ///
    /// # Safety
    /// With `Cuda`, `stream` is a live stream of this device's primary context, or one of the
    /// special handles `cudaStreamLegacy` (1) and `cudaStreamPerThread` (2).
    pub unsafe fn sync_stream(self, stream: *mut c_void) -> Result<()> {
        super::no_driver_here("sync_stream")?;
        match self.provider {
            // SAFETY: per the caller.
            Provider::Cuda => unsafe { cuda::sync_foreign_stream(self.ordinal, stream) },
            Provider::Host => host_stream::synchronize(stream as usize),
        }
    }

    /// Refuses the caller's `stream` of this device while it is being captured into a CUDA
    /// graph, for the Rust API's calls on a stream: they run on a host thread, ordered on the
    /// stream by an event and a flag wait, and a graph replay would repeat the flag wait
    /// without the collective. (The C ABI records its calls into graphs instead:
    /// `capi::capture`.) `call` names the call in the error ("all_reduce on rank 3"), built
    /// only when there is one. A NULL stream is never asked (the legacy stream is not
    /// captured; a capture elsewhere in the context makes its synchronize fail with the
    /// driver's message instead).
    ///
    /// # Safety
    /// As [`Device::sync_stream`].
    pub(crate) unsafe fn check_not_capturing(
        self,
        call: impl FnOnce() -> String,
        stream: *mut c_void,
    ) -> Result<()> {
        // SAFETY: per the caller.
        if unsafe { self.capture(stream) }? == super::graph::Capture::None {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::InvalidUsage,
            format!(
                "{}: stream {stream:p} is being captured into a CUDA graph; the Rust API's \
                 calls on a stream cannot be captured (they run on a host thread, which a \
                 graph replay would not run): call it outside the capture, or through the C \
                 ABI (ncclAllReduce and the others record into graphs)",
                call()
            ),
        ))
    }

    /// The device's PCI bus id (`0000:3b:00.0`); the host stand-in has none and says so.
    pub fn pci_bus_id(self) -> Result<String> {
        match self.provider {
            Provider::Cuda => cuda::pci_bus_id(self.ordinal),
            Provider::Host => Ok("stand-in".to_string()),
        }
    }

    /// The device's name (`NVIDIA H100 80GB HBM3`; `host stand-in device 0`).
    pub fn name(self) -> Result<String> {
        match self.provider {
            Provider::Cuda => cuda::name(self.ordinal),
            Provider::Host => Ok(self.to_string()),
        }
    }
}

/// A [`DeviceBuffer`] over device memory it does not own ([`DeviceBuffer::view`]): it
/// dereferences to the buffer, and neither it nor the buffer inside (even moved out of it)
/// frees any device memory when dropped.
#[derive(Debug)]
pub struct DeviceView<T: Element>(DeviceBuffer<T>);

impl<T: Element> std::ops::Deref for DeviceView<T> {
    type Target = DeviceBuffer<T>;
    fn deref(&self) -> &DeviceBuffer<T> {
        &self.0
    }
}

impl<T: Element> std::ops::DerefMut for DeviceView<T> {
    fn deref_mut(&mut self) -> &mut DeviceBuffer<T> {
        &mut self.0
    }
}

impl<T: Element> DeviceBuffer<T> {
    /// A view of `len` elements of device memory at `addr` that it does not own: dropping
    /// the view frees nothing.
    ///
    /// # Safety
    /// `[addr, addr + len × size)` is device memory of `device`, live and not used by anything
    /// else (another view included, unless both only read) while the view is used.
    pub unsafe fn view(device: Device, addr: u64, len: usize) -> Result<DeviceView<T>> {
        len.checked_mul(T::DTYPE.size()).ok_or_else(|| {
            Error::invalid_argument(format!("device view of {len} x {} overflows", T::DTYPE))
        })?;
        Ok(DeviceView(DeviceBuffer {
            device,
            addr,
            len,
            pending: super::Pending::default(),
            owned: false,
            _elems: PhantomData,
        }))
    }
}

impl DeviceBuffer<u8> {
    /// Bytes `r` of this buffer as a view of elements of `T` (a partial element at the end
    /// is left out) that shares the buffer's pending-job count, so host access to the buffer
    /// and its `Drop` wait for stream jobs queued on the view. `r` must lie inside the buffer.
    pub(crate) fn typed_part<T: Element>(&self, r: &Range<usize>) -> DeviceView<T> {
        debug_assert!(r.start <= r.end && r.end <= self.len);
        DeviceView(DeviceBuffer {
            device: self.device,
            addr: self.addr + r.start as u64,
            len: r.len() / T::DTYPE.size(),
            pending: self.pending.clone(),
            owned: false,
            _elems: PhantomData,
        })
    }
}

impl<T: Element> DeviceBuffer<T> {
    fn check_range(&self, what: &str, offset: usize, n: usize) -> Result<()> {
        if offset.checked_add(n).is_none_or(|end| end > self.len) {
            return Err(Error::invalid_argument(format!(
                "{what}: elements {offset}..{} are outside the device buffer of {} on {}",
                offset.saturating_add(n),
                self.len,
                self.device
            )));
        }
        Ok(())
    }

    /// Copies `src` into elements `offset..offset + src.len()`; returns when done.
    pub fn write_at(&mut self, offset: usize, src: &[T]) -> Result<()> {
        self.check_range("write_at", offset, src.len())?;
        self.wait_idle();
        let bytes = ferroccl_kernels::as_bytes(src);
        let at = self.addr + (offset * T::DTYPE.size()) as u64;
        match self.device.provider {
            // SAFETY: the range is inside the buffer (checked), which owns it.
            Provider::Cuda => unsafe { cuda::upload(self.device.ordinal, at, bytes) },
            Provider::Host => {
                // SAFETY: as above; host memory of the stand-in, `src` a distinct host slice.
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), at as *mut u8, bytes.len())
                };
                Ok(())
            }
        }
    }

    /// Copies elements `range` of `src`, a buffer of the same device, to elements from
    /// `offset` on of this one, device to device; returns when done.
    pub fn copy_from_device(
        &mut self,
        offset: usize,
        src: &DeviceBuffer<T>,
        range: Range<usize>,
    ) -> Result<()> {
        if src.device != self.device {
            return Err(Error::invalid_argument(format!(
                "copy_from_device: the source is on {}, this buffer on {}",
                src.device, self.device
            )));
        }
        if range.start > range.end {
            return Err(Error::invalid_argument(format!(
                "copy_from_device: elements {}..{} of the source are no range",
                range.start, range.end
            )));
        }
        src.check_range("copy_from_device (source)", range.start, range.len())?;
        self.check_range("copy_from_device", offset, range.len())?;
        src.wait_idle();
        self.wait_idle();
        let es = T::DTYPE.size() as u64;
        let (from, to) = (
            src.addr + range.start as u64 * es,
            self.addr + offset as u64 * es,
        );
        let bytes = range.len() * T::DTYPE.size();
        // SAFETY: both ranges lie in their buffers (checked), two distinct allocations (one
        // borrowed mutably, one shared), both of this device.
        unsafe { self.device.copy_within(to, from, bytes) }
    }

    /// Copies elements `offset..offset + dst.len()` into `dst`; returns when done.
    pub fn read_at(&self, offset: usize, dst: &mut [T]) -> Result<()> {
        self.check_range("read_at", offset, dst.len())?;
        self.wait_idle();
        let at = self.addr + (offset * T::DTYPE.size()) as u64;
        // SAFETY: the range is inside the buffer (checked), which owns it and is borrowed.
        unsafe {
            self.device
                .read_raw(at, ferroccl_kernels::as_bytes_mut(dst))
        }
    }
}

impl Device {
    /// Copies `len` bytes of this device's memory from `src` to `dst`, device to device;
    /// returns when done.
    ///
    /// # Safety
    /// Both ranges are live memory of this device for `len` bytes, `dst` used by nothing else
    /// meanwhile, and they do not overlap.
    pub(crate) unsafe fn copy_within(self, dst: u64, src: u64, len: usize) -> Result<()> {
        match self.provider {
            // SAFETY: per the caller.
            Provider::Cuda => unsafe { cuda::copy_within(self.ordinal, dst, src, len) },
            Provider::Host => {
                if len > 0 {
                    // SAFETY: per the caller; stand-in device memory is host memory.
                    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len) };
                }
                Ok(())
            }
        }
    }
}

impl Communicator {
    /// Sends bytes `send.1` of a device buffer to rank `to` and receives bytes `recv.1` of
    /// another from rank `from`, in one group (see [`crate::Group::send_device`]): the perf
    /// tools' send/recv on device buffers. Both ranges must have the same length.
    pub fn raw_send_recv_device(
        &self,
        send: (&DeviceBuffer<u8>, Range<usize>),
        to: usize,
        recv: (&mut DeviceBuffer<u8>, Range<usize>),
        from: usize,
    ) -> Result<()> {
        if send.1.len() != recv.1.len() {
            return Err(Error::invalid_argument(format!(
                "send/recv on rank {}: {} bytes sent, {} received",
                self.rank(),
                send.1.len(),
                recv.1.len()
            )));
        }
        let ops = [
            RawDeviceP2p::send(to, false, send.1),
            RawDeviceP2p::recv(from, recv.1),
        ];
        self.raw_group_device(send.0, recv.0, &ops)
    }

    /// Runs sends and receives of byte ranges of two device buffers as one group (see
    /// [`crate::Group::send_device`]): the perf tools' point-to-point patterns on device
    /// buffers (gather, scatter, hypercube). Sends read either buffer; receives write `recv`.
    /// Every range must lie in its buffer, and no receive range may overlap another receive's
    /// or a send's range of `recv`. A send to this rank and a receive from it copy locally.
    pub fn raw_group_device(
        &self,
        send: &DeviceBuffer<u8>,
        recv: &mut DeviceBuffer<u8>,
        ops: &[RawDeviceP2p],
    ) -> Result<()> {
        let rank = self.rank();
        let bad = |what: String| {
            Err(Error::invalid_argument(format!(
                "send/recv on rank {rank}: {what}"
            )))
        };
        for (i, o) in ops.iter().enumerate() {
            let (r, len) = (&o.range, if o.in_recv { recv.len } else { send.len });
            if r.start > r.end || r.end > len {
                return bad(format!(
                    "bytes {r:?} lie outside the device buffer of {len} bytes they name"
                ));
            }
            if !o.send && !o.in_recv {
                return bad("a receive into the send buffer".to_string());
            }
            let clash = ops[..i].iter().any(|p| {
                p.in_recv
                    && o.in_recv
                    && (!p.send || !o.send)
                    && p.range.start < r.end
                    && r.start < p.range.end
            });
            if clash {
                return bad(format!(
                    "receive bytes {r:?} overlap another range of the receive buffer"
                ));
            }
        }
        send.wait_idle();
        recv.wait_idle();
        let ops: Vec<(bool, usize, At)> = ops
            .iter()
            .map(|o| {
                let b: &DeviceBuffer<u8> = if o.in_recv { recv } else { send };
                let span = Span {
                    device: b.device,
                    addr: b.addr + o.range.start as u64,
                    bytes: o.range.len(),
                };
                (o.send, o.peer, At::Device(span))
            })
            .collect();
        // SAFETY: each range lies inside its buffer (checked above), whose memory on its device
        // stays live while the buffers are borrowed here; receive ranges lie in `recv`,
        // borrowed mutably, and overlap no other op's range (checked above).
        unsafe { self.group_at(&ops) }
    }

    /// Runs sends (`true`) and receives of memory named by address, device ranges and host
    /// ranges alike, as one group ([`crate::Group::send_device`], [`crate::Group::send`]):
    /// the entry of [`Communicator::raw_group_device`] and of the C ABI's sends and receives
    /// (a group may mix device and host buffers, as NCCL's may).
    ///
    /// # Safety
    /// Each range is memory of its space (a device span: of its device), live while the call
    /// runs; a receive's range is used by nothing else meanwhile (no other op's range overlaps
    /// it).
    pub(crate) unsafe fn group_at(&self, ops: &[(bool, usize, At)]) -> Result<()> {
        // The device ranges as views, in the order of their operations.
        let mut views = Vec::with_capacity(ops.len());
        for &(_, _, at) in ops {
            if let At::Device(sp) = at {
                // SAFETY: per this function's contract.
                views.push(unsafe { DeviceBuffer::<u8>::view(sp.device, sp.addr, sp.bytes) }?);
            }
        }
        let mut views = views.iter_mut();
        let mut g = self.group();
        for &(send, peer, at) in ops {
            match at {
                At::Device(_) => {
                    let v = views.next().expect("one view per device range");
                    if send {
                        g.send_device(&**v, peer);
                    } else {
                        g.recv_device(&mut **v, peer);
                    }
                }
                // An empty range may be NULL: no slice is made of it.
                At::Host(_, 0) if send => {
                    g.send::<u8>(&[], peer);
                }
                At::Host(_, 0) => {
                    g.recv::<u8>(&mut [], peer);
                }
                At::Host(p, len) if send => {
                    // SAFETY: per this function's contract, `len` live bytes at `p`.
                    g.send(unsafe { std::slice::from_raw_parts(p, len) }, peer);
                }
                At::Host(p, len) => {
                    // SAFETY: per this function's contract, `len` live bytes at `p`, used by
                    // nothing else while the group runs.
                    g.recv(
                        unsafe { std::slice::from_raw_parts_mut(p.cast_mut(), len) },
                        peer,
                    );
                }
            }
        }
        g.run()
    }

    /// Runs collective `kind` on byte ranges of device buffers holding elements of `dtype`
    /// (`send: None`: in place), as [`Communicator::collective`] does on typed buffers: the
    /// perf tools' entry, whose buffers serve every data type.
    pub fn raw_collective_device(
        &self,
        kind: CollKind,
        send: Option<(&DeviceBuffer<u8>, Range<usize>)>,
        recv: (&mut DeviceBuffer<u8>, Range<usize>),
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        self.check_raw_ranges(kind, send.as_ref(), (recv.0, &recv.1), dtype)?;
        let span = |b: &DeviceBuffer<u8>, r: &Range<usize>| Span {
            device: b.device,
            addr: b.addr + r.start as u64,
            bytes: r.len(),
        };
        let send = send.as_ref().map(|(b, r)| span(b, r));
        let recv_span = span(recv.0, &recv.1);
        // SAFETY: the ranges lie inside their buffers (checked above), which own their memory
        // on their devices; `recv` is borrowed mutably and `send` shared, so neither range is
        // used by anything else while the call runs, and they do not overlap.
        unsafe { self.collective_at_on(kind, send, recv_span, dtype, op, None) }
    }

    /// Checks that the byte ranges of a raw device collective are whole elements of `dtype`
    /// inside their buffers, naming the collective, the rank and the range.
    pub(crate) fn check_raw_ranges(
        &self,
        kind: CollKind,
        send: Option<&(&DeviceBuffer<u8>, Range<usize>)>,
        recv: (&DeviceBuffer<u8>, &Range<usize>),
        dtype: DataType,
    ) -> Result<()> {
        let es = dtype.size();
        let check = |b: &DeviceBuffer<u8>, r: &Range<usize>, what: &str| {
            if r.start > r.end || r.end > b.len || !(r.end - r.start).is_multiple_of(es) {
                return Err(Error::invalid_argument(format!(
                    "{} on rank {}: {what} bytes {r:?} of a device buffer of {} bytes are not \
                     whole elements of {dtype} inside it",
                    kind.name(),
                    self.rank(),
                    b.len
                )));
            }
            Ok(())
        };
        if let Some((b, r)) = send {
            check(b, r, "send")?;
        }
        check(recv.0, recv.1, "receive")
    }

    /// Runs collective `kind` on device memory named by address (`send: None`: in place) with
    /// elements of `dtype`: the entry of code outside Rust (the C ABI) and of
    /// [`Communicator::raw_collective_device`]. Blocking (`stream: None`), or ordered on the
    /// caller's stream `stream` of the spans' device where
    /// [`Communicator::orders_between_buffers`] said so: it then returns once the call is
    /// queued there (or, where the ranks do not agree to go between their buffers, after
    /// waiting for the stream, done).
    ///
    /// # Safety
    /// Each span is device memory of its device, live while the call runs (with a stream:
    /// until the stream has run it, NCCL's contract for a call on a stream); `recv` is used by
    /// nothing else meanwhile, `send` is not written by anything and does not overlap `recv`;
    /// `stream` is a live stream of the spans' device. With a stream, the caller has found the
    /// spans live memory of their device (the C ABI's `check_layout`, when the call was
    /// issued): they are not asked of the driver again.
    pub(crate) unsafe fn collective_at_on(
        &self,
        kind: CollKind,
        send: Option<Span>,
        recv: Span,
        dtype: DataType,
        op: ReduceOp,
        stream: Option<usize>,
    ) -> Result<()> {
        ferroccl_kernels::with_element!(dtype, T => {
            // SAFETY: per this function's contract.
            unsafe { self.collective_at_typed::<T>(kind, send, recv, op, stream) }
        })
    }

    /// # Safety
    /// As for [`Communicator::collective_at_on`], with `T` the element type.
    unsafe fn collective_at_typed<T: Element>(
        &self,
        kind: CollKind,
        send: Option<Span>,
        recv: Span,
        op: ReduceOp,
        stream: Option<usize>,
    ) -> Result<()> {
        let es = T::DTYPE.size();
        // SAFETY: per this function's contract (a partial element is left out of the view).
        let mut r = unsafe { DeviceBuffer::<T>::view(recv.device, recv.addr, recv.bytes / es) }?;
        let s = match send {
            Some(sp) => {
                // SAFETY: as above.
                let v = unsafe { DeviceBuffer::<T>::view(sp.device, sp.addr, sp.bytes / es) }?;
                Some(v)
            }
            None => None,
        };
        let Some(stream) = stream else {
            return self.collective(
                kind,
                s.as_deref().map(BufRef::Device),
                BufMut::Device(&mut r),
                op,
            );
        };
        let (rank, n) = (self.rank(), self.nranks());
        let count = crate::comm::call_count(kind, rank, s.as_ref().map(|s| s.len()), r.len(), n)?;
        let call = StreamCall {
            stream,
            holds: Vec::new(),
        };
        // The caller asked the driver about the spans (this function's contract).
        let s = s.as_deref();
        let dev = self.check_device(kind, s, &r, count, op, false)?;
        self.run_device_at(dev, kind, s, &mut r, count, op, Some(call))
    }
}

/// One send or receive of [`Communicator::raw_group_device`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawDeviceP2p {
    /// A send (`false`: a receive).
    pub send: bool,
    /// The peer rank (this rank: a local copy).
    pub peer: usize,
    /// Whether `range` lies in the group's receive buffer (receives always do).
    pub in_recv: bool,
    /// Its bytes.
    pub range: Range<usize>,
}

impl RawDeviceP2p {
    /// A send of bytes `range` of the send buffer, or of the receive buffer (`in_recv`).
    pub fn send(peer: usize, in_recv: bool, range: Range<usize>) -> RawDeviceP2p {
        RawDeviceP2p {
            send: true,
            peer,
            in_recv,
            range,
        }
    }

    /// A receive into bytes `range` of the receive buffer.
    pub fn recv(peer: usize, range: Range<usize>) -> RawDeviceP2p {
        RawDeviceP2p {
            send: false,
            peer,
            in_recv: true,
            range,
        }
    }
}

/// Where an operation of [`Communicator::group_at`] reads or writes: a device range, or
/// `len` bytes of host memory at an address.
#[derive(Debug, Clone, Copy)]
pub(crate) enum At {
    Device(Span),
    /// Made by the C ABI (groups mixing host and device buffers) only.
    #[cfg_attr(not(feature = "capi"), allow(dead_code))]
    Host(*const u8, usize),
}

/// A range of device memory named by address: `bytes` at `addr` on `device`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    /// The device whose memory it is.
    pub device: Device,
    /// The first byte.
    pub addr: u64,
    /// Its length in bytes.
    pub bytes: usize,
}

#[cfg(test)]
mod tests;
