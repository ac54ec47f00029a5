//! The CUDA provider: device memory, pinned host memory, stream-ordered copies and pointer
//! queries through the driver of `ferroccl-cuda`, loaded at run time.
//!
//! Every entry loads the driver first: without one it returns `device buffers need an NVIDIA
//! driver (libcuda.so.1 not found); host buffers work without one`, never a panic. Every call
//! makes the device's primary context current on the calling thread first, since collectives
//! may run on any thread. Built, not yet run on a GPU (docs/CUDA.md).

use ferroccl_cuda::driver::{driver, DevicePtr, Driver, Handle};
use ferroccl_cuda::{CudaError, CudaErrorKind};

use crate::{Error, ErrorKind, Result};

/// The CUDA layer's error as a ferroccl error: a missing driver is something optional that is
/// not available here; a bad device ordinal is the caller's argument.
pub(crate) fn convert(e: &CudaError) -> Error {
    let kind = match e.kind() {
        CudaErrorKind::DriverMissing | CudaErrorKind::NvrtcMissing => ErrorKind::Unsupported,
        CudaErrorKind::Invalid => ErrorKind::InvalidArgument,
        _ => ErrorKind::Internal,
    };
    Error::new(kind, e.message().to_string())
}

fn loaded() -> Result<&'static Driver> {
    super::no_driver_here("a CUDA driver call")?;
    driver().map_err(|e| convert(&e))
}

/// The driver, with device `ordinal`'s primary context current on this thread.
pub(crate) fn bound(ordinal: u32) -> Result<&'static Driver> {
    let d = loaded()?;
    let dev = d.device(ordinal).map_err(|e| convert(&e))?;
    d.bind_primary_context(dev).map_err(|e| convert(&e))?;
    Ok(d)
}

/// Devices this process sees.
pub(crate) fn device_count() -> Result<u32> {
    loaded()?.device_count().map_err(|e| convert(&e))
}

/// `len` bytes of device memory on device `ordinal` (contents unspecified).
pub(crate) fn alloc(ordinal: u32, len: usize) -> Result<u64> {
    bound(ordinal)?.alloc(len).map_err(|e| convert(&e))
}

/// # Safety
/// `addr` came from [`alloc`] on `ordinal`, is freed once, no queued work still uses it.
pub(crate) unsafe fn free(ordinal: u32, addr: u64) -> Result<()> {
    let d = bound(ordinal)?;
    // SAFETY: per the caller.
    unsafe { d.free(addr) }.map_err(|e| convert(&e))
}

/// The device owning `[addr, addr + len)` (see [`holder`]), or `None`: host memory, an
/// address the driver does not know, or a range running past its memory (no driver: `None`
/// as well).
pub(crate) fn locate(addr: u64, len: usize, hint: u32) -> Option<u32> {
    holder(querying(hint)?, addr, len)
}

/// Whether `addr` is page-locked host memory the driver knows (`false` without a driver).
pub(crate) fn is_page_locked(addr: u64, hint: u32) -> bool {
    querying(hint).is_some_and(|d| d.is_page_locked_host(addr as DevicePtr))
}

/// The driver, ready for pointer queries on this thread. They need a current context
/// (without one the driver answers CUDA_ERROR_INVALID_CONTEXT, which would read as "not device
/// memory"): a thread with none (a thread of ferroccl's, or a program's thread that made no
/// CUDA call) gets the primary context of `hint`, the device the caller expects, rather than
/// one made on device 0. `None` without a driver.
fn querying(hint: u32) -> Option<&'static Driver> {
    let d = loaded().ok()?;
    if !d.has_current_context() {
        let dev = d.device(hint).ok()?;
        d.bind_primary_context(dev).ok()?;
    }
    Some(d)
}

/// What the driver tells of a device address: a trait so that [`holder`] runs over a model
/// of the driver in the tests.
trait Pointers {
    /// The device of the memory at `p` and, for memory of `cuMemAlloc`, its allocation (one
    /// query: `cuPointerGetAttributes`).
    fn facts(&self, p: u64) -> Option<(u32, Option<(u64, usize)>)>;
    /// The mapped piece holding `p` (`cuMemGetAddressRange`): one piece of memory mapped with
    /// `cuMemMap` (or of a pool).
    fn mapping(&self, p: u64) -> Option<(u64, usize)>;
    /// The range holding `p` (the range attributes): the allocation, or the reserved range of
    /// memory mapped with `cuMemMap`, mapped or not.
    fn range(&self, p: u64) -> Option<(u64, usize)>;
    /// Whether `p` is mapped to memory.
    fn mapped(&self, p: u64) -> Option<bool>;
}

impl Pointers for Driver {
    fn facts(&self, p: u64) -> Option<(u32, Option<(u64, usize)>)> {
        self.pointer_facts(p as DevicePtr)
            .map(|f| (f.device, f.allocation))
    }
    fn mapping(&self, p: u64) -> Option<(u64, usize)> {
        self.mapping_of_pointer(p as DevicePtr)
    }
    fn range(&self, p: u64) -> Option<(u64, usize)> {
        self.allocation_of_pointer(p as DevicePtr)
    }
    fn mapped(&self, p: u64) -> Option<bool> {
        self.is_mapped(p as DevicePtr)
    }
}

/// The device whose memory holds all of `[addr, addr + len)`: for `cuMemAlloc` memory, inside
/// the allocation of its first byte (one query, which tells both); otherwise inside the mapped
/// piece of its first byte, or, for memory mapped piece by piece into a reserved range
/// (`cuMemAddressReserve` + `cuMemMap`, as PyTorch's expandable segments make it), inside that
/// one reserved range with its last byte mapped on the same device. Two allocations that
/// happen to touch are two ranges, so a buffer running from one into the next is refused: the
/// driver refuses a copy across them. An unmapped hole between the first and the last byte of
/// a reservation is not looked for (a piece at a time would cost a query per piece); a copy
/// over one fails in the driver.
fn holder(q: &impl Pointers, addr: u64, len: usize) -> Option<u32> {
    let (first, allocation) = q.facts(addr)?;
    if len <= 1 {
        return Some(first);
    }
    let end = addr.checked_add(len as u64)?;
    let within =
        |(start, size): (u64, usize)| start.checked_add(size as u64).is_some_and(|e| end <= e);
    if let Some(a) = allocation {
        return within(a).then_some(first);
    }
    if q.mapping(addr).is_some_and(within) {
        return Some(first);
    }
    let range = q.range(addr)?;
    let last = end - 1;
    let ok = within(range)
        && q.range(last) == Some(range)
        && q.mapped(last) == Some(true)
        && q.facts(last).map(|f| f.0) == Some(first);
    ok.then_some(first)
}

/// `len` bytes of page-locked host memory (contents unspecified).
pub(crate) fn alloc_pinned(ordinal: u32, len: usize) -> Result<*mut u8> {
    bound(ordinal)?.alloc_pinned(len).map_err(|e| convert(&e))
}

/// # Safety
/// `p` came from [`alloc_pinned`], is freed once and no queued copy still uses it.
pub(crate) unsafe fn free_pinned(ordinal: u32, p: *mut u8) -> Result<()> {
    let d = bound(ordinal)?;
    // SAFETY: per the caller.
    unsafe { d.free_pinned(p) }.map_err(|e| convert(&e))
}

/// Runs `f` on this process's private non-blocking stream of device `ordinal`, made at its
/// first use and kept (one stream for every copy that must not go through the legacy stream:
/// see [`upload`]).
fn with_private<R>(ordinal: u32, f: impl FnOnce(&mut Stream) -> Result<R>) -> Result<R> {
    static PRIVATE: std::sync::Mutex<Vec<Stream>> = std::sync::Mutex::new(Vec::new());
    let mut streams = PRIVATE.lock().unwrap_or_else(|p| p.into_inner());
    let at = match streams.iter().position(|s| s.ordinal == ordinal) {
        Some(i) => i,
        None => {
            streams.push(Stream::new(ordinal)?);
            streams.len() - 1
        }
    };
    f(&mut streams[at])
}

/// Copies host bytes to device memory; returns once they are there.
///
/// The copy runs on a private non-blocking stream, never the legacy stream: a legacy-stream
/// copy waits for every blocking stream of the context, among them a caller's stream that may
/// be waiting on a completion flag of a queued collective, and from pageable memory it may
/// return before its last bytes reach the device.
///
/// # Safety
/// `dst` is device memory of `ordinal` writable for `src.len()` bytes.
pub(crate) unsafe fn upload(ordinal: u32, dst: u64, src: &[u8]) -> Result<()> {
    with_private(ordinal, |s| {
        // SAFETY: per the caller; `src` is borrowed until the synchronize below.
        unsafe { s.upload(dst, src.as_ptr(), src.len()) }?;
        s.synchronize()
    })
}

/// Copies device memory to host bytes on the private stream (see [`upload`]); returns once
/// they are there.
///
/// # Safety
/// `src` is device memory of `ordinal` readable for `dst.len()` bytes.
pub(crate) unsafe fn download(ordinal: u32, dst: &mut [u8], src: u64) -> Result<()> {
    with_private(ordinal, |s| {
        // SAFETY: per the caller; `dst` is borrowed until the synchronize below.
        unsafe { s.download(dst.as_mut_ptr(), src, dst.len()) }?;
        s.synchronize()
    })
}

/// Copies device memory to device memory of the same device on the private stream (see
/// [`upload`]); returns once done.
///
/// # Safety
/// `src` is readable and `dst` writable device memory of `ordinal` for `len` bytes, the two
/// not overlapping.
pub(crate) unsafe fn copy_within(ordinal: u32, dst: u64, src: u64, len: usize) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    with_private(ordinal, |s| {
        let d = bound(ordinal)?;
        // SAFETY: per the caller; the private stream belongs to this device's primary context.
        unsafe { d.copy_async(dst, src, len, s.handle) }.map_err(|e| convert(&e))?;
        s.synchronize()
    })
}

/// Waits for the caller's `stream` of device `ordinal` (`cuStreamSynchronize`).
///
/// # Safety
/// `stream` is a live stream of the device's primary context, or `CU_STREAM_LEGACY` /
/// `CU_STREAM_PER_THREAD`.
pub(crate) unsafe fn sync_foreign_stream(
    ordinal: u32,
    stream: *mut std::ffi::c_void,
) -> Result<()> {
    let d = bound(ordinal)?;
    if stream.is_null() {
        // NCCL's stream 0, the legacy default stream: work queued there waits for the earlier
        // work of every blocking stream, so a call made on it waits for the whole context.
        return d.sync_context().map_err(|e| convert(&e));
    }
    // SAFETY: per the caller; the primary context is current.
    unsafe { d.sync_stream(stream) }.map_err(|e| convert(&e))
}

/// The capture status of the caller's `stream` of device `ordinal` (`cuStreamIsCapturing`:
/// 0 none, 1 active, 2 invalidated).
///
/// # Safety
/// As [`sync_foreign_stream`], `stream` not NULL.
pub(crate) unsafe fn capture_status(ordinal: u32, stream: *mut std::ffi::c_void) -> Result<u32> {
    let d = bound(ordinal)?;
    // SAFETY: per the caller; the primary context is current.
    unsafe { d.stream_capture_status(stream) }.map_err(|e| convert(&e))
}

/// Runs `f` with this thread's capture interaction mode relaxed (see
/// `Driver::capture_relaxed`), in device `ordinal`'s primary context.
pub(crate) fn capture_relaxed<T>(ordinal: u32, f: impl FnOnce() -> T) -> Result<T> {
    let d = bound(ordinal)?;
    d.capture_relaxed(f).map_err(|e| convert(&e))
}

/// Sets this thread's capture interaction mode; returns the one it had.
pub(crate) fn exchange_capture_mode(ordinal: u32, mode: u32) -> Result<u32> {
    let d = bound(ordinal)?;
    d.exchange_capture_mode(mode).map_err(|e| convert(&e))
}

/// Queues `f(data)` on the caller's `stream` of device `ordinal` (`cuLaunchHostFunc`; inside
/// a capture, a host node of the graph, run at each launch).
///
/// # Safety
/// As [`sync_foreign_stream`], `stream` not NULL; `f` makes no CUDA call, and `data` stays
/// valid for every run of it (each launch of a graph that holds it).
pub(crate) unsafe fn queue_host_fn(
    ordinal: u32,
    stream: *mut std::ffi::c_void,
    f: ferroccl_cuda::driver::HostFn,
    data: *mut std::ffi::c_void,
) -> Result<()> {
    let d = bound(ordinal)?;
    // SAFETY: per the caller; the primary context is current.
    unsafe { d.launch_host_func(stream, f, data) }.map_err(|e| convert(&e))
}

/// Hands `data` to the graph being captured on the caller's `stream` of device `ordinal`:
/// `destroy(data)` runs once that graph and everything made from it are gone
/// (`ferroccl_cuda::user_objects`). `Ok(false)` where the driver cannot (then never).
///
/// # Safety
/// As [`sync_foreign_stream`], `stream` not NULL; `destroy` makes no CUDA call and `data`
/// stays valid until it runs.
pub(crate) unsafe fn retain_in_capture(
    ordinal: u32,
    stream: *mut std::ffi::c_void,
    destroy: ferroccl_cuda::driver::HostFn,
    data: *mut std::ffi::c_void,
) -> Result<bool> {
    let d = bound(ordinal)?;
    let calls = ferroccl_cuda::user_objects::user_objects(d);
    // SAFETY: per the caller; the primary context is current.
    unsafe { calls.retain_in_capture(d, stream, destroy, data) }.map_err(|e| convert(&e))
}

/// The PCI bus id of device `ordinal`.
pub(crate) fn pci_bus_id(ordinal: u32) -> Result<String> {
    let d = loaded()?;
    let dev = d.device(ordinal).map_err(|e| convert(&e))?;
    d.pci_bus_id(dev).map_err(|e| convert(&e))
}

/// The name of device `ordinal`.
pub(crate) fn name(ordinal: u32) -> Result<String> {
    let d = loaded()?;
    let dev = d.device(ordinal).map_err(|e| convert(&e))?;
    d.name(dev).map_err(|e| convert(&e))
}

/// A non-blocking stream of one device with a pool of events (marks), destroyed on drop.
#[derive(Debug)]
pub(crate) struct Stream {
    ordinal: u32,
    handle: Handle,
    /// Events created so far, reused by [`Stream::mark`]: none is created per call once the
    /// pool holds as many as a call's slices.
    events: Vec<Handle>,
}

// SAFETY: a CUstream may be used from any thread with its context current (every method binds
// it); the handle is owned by this value and destroyed once.
unsafe impl Send for Stream {}

impl Stream {
    pub(crate) fn new(ordinal: u32) -> Result<Stream> {
        let handle = bound(ordinal)?.create_stream().map_err(|e| convert(&e))?;
        Ok(Stream {
            ordinal,
            handle,
            events: Vec::new(),
        })
    }

    /// The `CUstream` handle (owned by this value).
    pub(crate) fn handle(&self) -> Handle {
        self.handle
    }

    /// Records mark `k` at the current end of the stream (event `k` of the pool).
    pub(crate) fn mark(&mut self, k: usize) -> Result<()> {
        let d = bound(self.ordinal)?;
        while self.events.len() <= k {
            self.events.push(d.create_event().map_err(|e| convert(&e))?);
        }
        // SAFETY: both handles are live and belong to this device's primary context.
        unsafe { d.record_event(self.events[k], self.handle) }.map_err(|e| convert(&e))
    }

    /// Waits until the work queued before mark `k` has run.
    pub(crate) fn wait_mark(&mut self, k: usize) -> Result<()> {
        let d = bound(self.ordinal)?;
        let Some(&e) = self.events.get(k) else {
            return Err(Error::internal(format!(
                "cuda stream: mark {k} was never recorded"
            )));
        };
        // SAFETY: a live event of the pool.
        unsafe { d.sync_event(e) }.map_err(|e| convert(&e))
    }

    /// Queues a host-to-device copy.
    ///
    /// # Safety
    /// `src` readable, `dst` device memory of this device writable, for `len` bytes until
    /// [`Stream::synchronize`] returns.
    pub(crate) unsafe fn upload(&mut self, dst: u64, src: *const u8, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let d = bound(self.ordinal)?;
        // SAFETY: per the caller; the stream belongs to this device's primary context.
        unsafe { d.upload_async(dst, src, len, self.handle) }.map_err(|e| convert(&e))
    }

    /// Queues a device-to-host copy.
    ///
    /// # Safety
    /// `src` device memory of this device readable, `dst` writable, for `len` bytes until
    /// [`Stream::synchronize`] returns.
    pub(crate) unsafe fn download(&mut self, dst: *mut u8, src: u64, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let d = bound(self.ordinal)?;
        // SAFETY: per the caller; the stream belongs to this device's primary context.
        unsafe { d.download_async(dst, src, len, self.handle) }.map_err(|e| convert(&e))
    }

    /// Waits for every queued copy.
    pub(crate) fn synchronize(&mut self) -> Result<()> {
        let d = bound(self.ordinal)?;
        // SAFETY: the stream was created in `new` and is destroyed only on drop.
        unsafe { d.sync_stream(self.handle) }.map_err(|e| convert(&e))
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Ok(d) = bound(self.ordinal) {
            // SAFETY: the stream and the events were created by this value, are synchronized
            // and then destroyed once, here; nothing is queued after the sync.
            unsafe {
                let _ = d.sync_stream(self.handle);
                for &e in &self.events {
                    let _ = d.destroy_event(e);
                }
                let _ = d.destroy_stream(self.handle);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{holder, Pointers};
    use std::cell::Cell;

    /// A model of the driver's answers: allocations and reserved ranges, each with its device
    /// and its mapped pieces (an allocation is one piece, its whole self).
    struct Model {
        ranges: Vec<Range>,
        queries: Cell<usize>,
    }

    /// An allocation or a reserved range: start, size, device, mapped pieces (start, size),
    /// whether it is an allocation of `cuMemAlloc`.
    struct Range(u64, usize, u32, Vec<(u64, usize)>, bool);

    impl Model {
        fn new() -> Model {
            Model {
                ranges: Vec::new(),
                queries: Cell::new(0),
            }
        }
        /// A `cuMemAlloc` allocation.
        fn alloc(mut self, start: u64, size: usize, dev: u32) -> Model {
            self.ranges
                .push(Range(start, size, dev, vec![(start, size)], true));
            self
        }
        /// A reserved range with these pieces mapped.
        fn reserve(mut self, start: u64, size: usize, dev: u32, pieces: &[(u64, usize)]) -> Model {
            self.ranges
                .push(Range(start, size, dev, pieces.to_vec(), false));
            self
        }
        fn find(&self, p: u64) -> Option<&Range> {
            self.queries.set(self.queries.get() + 1);
            self.ranges
                .iter()
                .find(|r| p >= r.0 && p - r.0 < r.1 as u64)
        }
        fn piece(&self, p: u64) -> Option<(u64, usize)> {
            let r = self.find(p)?;
            r.3.iter()
                .copied()
                .find(|&(s, n)| p >= s && p - s < n as u64)
        }
    }

    impl Pointers for Model {
        // An unmapped address of a reservation still answers its device: the check must not
        // lean on the driver refusing it.
        fn facts(&self, p: u64) -> Option<(u32, Option<(u64, usize)>)> {
            self.find(p).map(|r| (r.2, r.4.then_some((r.0, r.1))))
        }
        fn mapping(&self, p: u64) -> Option<(u64, usize)> {
            self.piece(p)
        }
        fn range(&self, p: u64) -> Option<(u64, usize)> {
            self.find(p).map(|r| (r.0, r.1))
        }
        fn mapped(&self, p: u64) -> Option<bool> {
            self.find(p)?;
            Some(self.piece(p).is_some())
        }
    }

    #[test]
    fn a_buffer_inside_one_allocation_costs_one_query() {
        let m = Model::new().alloc(0x1000, 0x1000, 0);
        assert_eq!(holder(&m, 0x1000, 0x1000), Some(0));
        assert_eq!(
            m.queries.get(),
            1,
            "the device and the allocation in one, nothing more"
        );
        assert_eq!(holder(&m, 0x1800, 0x800), Some(0));
        assert_eq!(
            holder(&m, 0x1800, 0x801),
            None,
            "one byte past the allocation"
        );
        assert_eq!(holder(&m, 0x1fff, 1), Some(0));
        assert_eq!(holder(&m, 0x1fff, 0), Some(0));
        assert_eq!(holder(&m, 0x3000, 4), None, "not device memory");
        assert_eq!(
            holder(&m, u64::MAX - 1, 16),
            None,
            "an end past the address space"
        );
    }

    #[test]
    fn allocations_that_touch_are_not_one_buffer() {
        let m = Model::new()
            .alloc(0x1000, 0x1000, 0)
            .alloc(0x2000, 0x1000, 0);
        assert_eq!(holder(&m, 0x1800, 0x1000), None);
        assert_eq!(holder(&m, 0x2000, 0x1000), Some(0));
    }

    #[test]
    fn a_reserved_range_mapped_piece_by_piece_holds_buffers_across_its_pieces() {
        // PyTorch's expandable segments: a reservation, pieces mapped from its start, the rest
        // not mapped (yet).
        let m = Model::new().reserve(0x10000, 0x10000, 1, &[(0x10000, 0x4000), (0x14000, 0x4000)]);
        assert_eq!(holder(&m, 0x13000, 0x2000), Some(1), "across two pieces");
        assert_eq!(holder(&m, 0x10000, 0x8000), Some(1), "every mapped piece");
        assert_eq!(holder(&m, 0x11000, 0x1000), Some(1), "inside one piece");
        assert_eq!(
            holder(&m, 0x16000, 0x4000),
            None,
            "its last byte not mapped"
        );
        assert_eq!(holder(&m, 0x1f000, 0x2000), None, "past the reservation");
        assert_eq!(holder(&m, 0x18000, 0x10), None, "not mapped at all");
    }

    #[test]
    fn a_buffer_is_refused_where_its_last_byte_is_another_devices_or_another_ranges() {
        let m = Model::new()
            .reserve(0x10000, 0x8000, 0, &[(0x10000, 0x8000)])
            .reserve(0x18000, 0x8000, 1, &[(0x18000, 0x8000)]);
        assert_eq!(holder(&m, 0x17000, 0x2000), None);
        let m = Model::new()
            .reserve(0x10000, 0x8000, 0, &[(0x10000, 0x8000)])
            .reserve(0x18000, 0x8000, 0, &[(0x18000, 0x8000)]);
        assert_eq!(
            holder(&m, 0x17000, 0x2000),
            None,
            "two reservations that touch"
        );
    }
}
