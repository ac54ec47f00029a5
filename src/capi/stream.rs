//! Device buffers through the C ABI: a non-NULL `cudaStream_t`, `ncclMemAlloc` /
//! `ncclMemFree`, and the device a communicator is bound to at init.
//!
//! A NULL stream means host buffers, unless they are device memory: then it is NCCL's legacy
//! default stream, run in the blocking form ([`stream_arg`]).
//!
//! A non-NULL stream means the buffers are device memory of the communicator's device
//! (checked before anything runs: host memory is `ncclInvalidArgument`, returned at once).
//! On a blocking communicator the call then **returns at once**: its collective becomes a job
//! of the communicator's stream queue (`device::stream_queue`), which starts it when the work queued
//! on the stream before the call is done (an event recorded on the stream) and makes work
//! queued on the stream afterwards wait for it (the stream waits until a flag in host-mapped
//! memory reaches the job's number, `cuStreamWaitValue32`). A `cudaStreamSynchronize` on the
//! stream therefore returns once the result is in the output buffer. A collective that fails
//! still releases the stream; its error is the communicator's asynchronous error
//! (`ncclCommGetAsyncError`) and later calls on the communicator fail with it.
//!
//! The collective runs as before on the queue's thread: staged through pinned host memory
//! (sends, receives, gather and scatter through host copies of their buffers), a
//! `ncclScalarDevice` scalar read after the stream's earlier work. Inside
//! `ncclGroupStart`/`ncclGroupEnd` the group's stream work on each communicator becomes one
//! job at the outermost `ncclGroupEnd`, which returns without waiting for it. One thread may
//! drive several communicators without a group, as NCCL allows.
//!
//! Host-buffer (NULL stream) work on a communicator waits until its stream queue is empty
//! before it runs, so operations of one communicator still run in issue order on every rank;
//! so does a group that mixes host and device work on one communicator (it runs as one
//! blocking batch). Non-blocking communicators (`config.blocking = 0`) keep running stream
//! work on their background thread after a `cuStreamSynchronize` (`ncclInProgress` until it
//! is done). Where the device cannot wait on host-mapped memory (no `cuStreamWaitValue32`, or
//! no `CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY`), calls block as they did before: the stream
//! is synchronized and the call returns when the result is in place (logged once).
//!
//! The provider is `FERRO_DEVICE_PROVIDER` (`cuda` by default; `host`, the test stand-in,
//! treats any non-NULL stream as a stand-in stream, modelled as a FIFO of copies and flag
//! waits that `ferrocclStreamSynchronize` runs). Without a driver, a non-NULL stream and
//! `ncclMemAlloc` are `ncclSystemError` with the driver's message in `ncclGetLastError`.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{LazyLock, Mutex};

use ferroccl_kernels::DataType;

use super::api::{check_out, lock};
use super::capture;
use super::comm::Shared;
use super::error::guard;
use super::ops::{p2p_check, read_scalar, refuse_overlaps, Layout, Op, Reduction, RootedLayout};
use super::types::*;
use crate::coll::CollKind;
use crate::device::raw::{At, Span};
use crate::device::{Device, Provider};
use crate::{Communicator, Error, ErrorKind, ReduceOp, Result};

/// The device and stream of a call made with a non-NULL stream.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OnStream {
    /// The communicator's device: every buffer of the call must be its memory.
    pub device: Device,
    /// The caller's `cudaStream_t`, as a number (never dereferenced here).
    pub stream: usize,
    /// The stream is being captured into a CUDA graph: the call is recorded, not run
    /// (`super::capture`).
    pub captured: bool,
}

/// A device-layer failure as the C ABI reports it: a missing driver (or device) is a system
/// error (as NCCL reports a failing CUDA call), with the call named in front.
fn system(api: &str, e: Error) -> Error {
    let kind = match e.kind() {
        ErrorKind::Unsupported | ErrorKind::Internal => ErrorKind::System,
        k => k,
    };
    Error::new(kind, format!("{api}: {}", e.message()))
}

/// The device a communicator made now on this thread is bound to (`ncclCommCuDevice`): the
/// current device of the provider (`cuCtxGetDevice`; with the host stand-in `FERRO_DEVICE` or
/// 0). Without a driver, 0: host-buffer work needs none.
pub(crate) fn init_device() -> c_int {
    Provider::from_env()
        .map(|p| p.current_device())
        .ok()
        .and_then(|d| c_int::try_from(d).ok())
        .unwrap_or(0)
}

/// The device current on this thread where one is (a CUDA context is current; with the host
/// stand-in, `FERRO_DEVICE` is set): where a communicator made now puts its p2p slots.
pub(crate) fn chosen_device() -> Option<u32> {
    Provider::from_env().ok().and_then(Provider::chosen_device)
}

/// The device whose buffers NULL-stream calls of a communicator made now (bound to
/// `cu_device`) may be handed, if any: with the host stand-in provider, or where the CUDA
/// driver is loaded in the process (a program that allocates with `cudaMalloc` has loaded it
/// before it makes its communicators). Decided once: elsewhere a NULL-stream call costs no
/// pointer query; where it is, one `cuPointerGetAttribute` per buffer (on a thread with no
/// current context, in the communicator's device's context).
pub(crate) fn null_stream_device(cu_device: c_int) -> Option<Device> {
    let provider = Provider::from_env().ok()?;
    if provider == Provider::Cuda && !crate::device::driver_in_process() {
        return None;
    }
    Device::new(provider, u32::try_from(cu_device).unwrap_or(0)).ok()
}

/// The `stream` argument of a call on `shared` whose buffers are `bufs`: `None` for NULL with
/// host buffers, else the device the buffers must be on (an error without a driver, or for a
/// device that does not exist). A NULL stream with device buffers is NCCL's legacy default
/// stream (stream 0), which runs in the blocking form: a program written for NCCL that passes
/// 0 with `cudaMalloc`'d buffers runs, where the host executor would fault on device memory.
pub(crate) fn stream_arg(
    api: &str,
    shared: &Shared,
    stream: cudaStream_t,
    bufs: &[*const c_void],
) -> Result<Option<OnStream>> {
    if stream.is_null() {
        let Some(device) = shared.null_stream_device else {
            return Ok(None);
        };
        let device_buffer = bufs
            .iter()
            .any(|&p| !p.is_null() && device.find(p as u64, 1).is_some());
        if !device_buffer {
            return Ok(None);
        }
    }
    let provider = Provider::from_env().map_err(|e| system(api, e))?;
    let ordinal = u32::try_from(shared.cu_device).unwrap_or(0);
    let device = Device::new(provider, ordinal).map_err(|e| {
        system(api, e).append(format!(
            "stream {stream:p} is non-NULL, which means device buffers; pass a NULL stream for \
             host buffers"
        ))
    })?;
    // Before anything touches the stream (a synchronize below would invalidate a capture),
    // for every call, whatever its count, and also while the communicator is still
    // initializing.
    // SAFETY: `stream` is the caller's stream of the communicator's device, per the NCCL
    // contract, or a special handle.
    let captured = unsafe { capture::status(api, shared, device, stream) }?;
    if page_locked_only(device, bufs) {
        if captured {
            return Err(capture::refuse(
                api,
                shared,
                stream as usize,
                "its buffers are page-locked host memory, which runs as a call on host buffers",
            ));
        }
        // Page-locked host memory (`cudaMallocHost`), which NCCL reaches through unified
        // addressing: the call runs as one on host buffers once the work queued on the stream
        // before it is done, and is done when it returns, so later work on the stream sees its
        // result.
        // SAFETY: `stream` is the caller's stream of the device, per the NCCL contract, or a
        // special handle.
        unsafe { device.sync_stream(stream.cast()) }.map_err(|e| system(api, e))?;
        return Ok(None);
    }
    if provider == Provider::Cuda && stream as usize == CUDA_STREAM_PER_THREAD && !captured {
        // `cudaStreamPerThread` names the calling thread's stream: the call may run on another
        // thread (a group's, a non-blocking communicator's), where it names another stream, so
        // the work queued before the call is waited for here. (A call being recorded is
        // recorded on this thread.)
        // SAFETY: the special handle is valid on any thread with a context; the device's is
        // made current.
        unsafe { device.sync_stream(stream.cast()) }.map_err(|e| system(api, e))?;
    }
    Ok(Some(OnStream {
        device,
        stream: stream as usize,
        captured,
    }))
}

/// Whether every buffer of `bufs` (NULL ones aside; at least one) is page-locked host memory
/// (one pointer query for the first buffer of a device-buffer call, which is not).
fn page_locked_only(device: Device, bufs: &[*const c_void]) -> bool {
    let mut used = bufs.iter().filter(|p| !p.is_null()).peekable();
    used.peek().is_some() && used.all(|&p| device.is_page_locked(p as u64))
}

/// `cudaStreamPerThread` (`CU_STREAM_PER_THREAD`).
const CUDA_STREAM_PER_THREAD: usize = 2;

/// Checks that `name`'s `len` bytes at `p` are memory of the call's device.
pub(crate) fn check_span(
    api: &str,
    rank: usize,
    name: &str,
    p: *const u8,
    len: usize,
    on: OnStream,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let dev = on.device;
    let found = dev.find(p as u64, len);
    if found == Some(dev.ordinal()) {
        return Ok(());
    }
    let space = match found {
        Some(o) => format!("memory of {} device {o}", dev.provider()),
        // Its first byte is the device's: the count runs past the memory behind it.
        None if dev.find(p as u64, 1) == Some(dev.ordinal()) => format!(
            "not all device memory: it starts in memory of {dev} but runs past the allocation \
             (or the mapped memory) its first byte lies in"
        ),
        None if dev.is_page_locked(p as u64) => "page-locked host memory beside device memory \
             in one call (page-locked host memory is taken where all the call's buffers are: \
             the call then runs on them as host buffers once the stream's earlier work is done)"
            .to_string(),
        None => "host memory (or not live device memory)".to_string(),
    };
    Err(Error::invalid_argument(format!(
        "{api} on rank {rank}: {name} {p:p} ({len} bytes) is {space}, but stream 0x{:x} is non-NULL, which \
         means device buffers of the communicator's {dev} (ncclMemAlloc or cudaMalloc); pass a \
         NULL stream for host buffers",
        on.stream
    )))
}

/// Checks every buffer a collective's layout uses against the call's device.
pub(crate) fn check_layout(api: &str, rank: usize, layout: &Layout, on: OnStream) -> Result<()> {
    match *layout {
        Layout::Empty => Ok(()),
        Layout::InPlace { buf, len } => check_span(api, rank, "recvbuff", buf, len, on),
        Layout::Apart {
            send,
            send_len,
            recv,
            recv_len,
        } => {
            check_span(api, rank, "sendbuff", send, send_len, on)?;
            check_span(api, rank, "recvbuff", recv, recv_len, on)
        }
    }
}

/// Reads a pre-multiplied sum's scalar at `p` for a call on a stream: from the device when
/// it is device memory of the call's device, else from host memory.
///
/// # Safety
/// `p` points to one readable element of `dtype`, in host memory or the call's device memory.
pub(crate) unsafe fn read_scalar_on(p: *const u8, dtype: DataType, on: OnStream) -> Result<f64> {
    let dev = on.device;
    if dev.find(p as u64, dtype.size()) != Some(dev.ordinal()) {
        // SAFETY: host memory, readable per the caller.
        return Ok(unsafe { read_scalar(p, dtype) });
    }
    let mut b = [0u8; 8];
    // SAFETY: live device memory of `dev` (located above), one element.
    unsafe { dev.read_private(p as u64, &mut b[..dtype.size()]) }?;
    // SAFETY: `b` holds the element's bytes.
    Ok(unsafe { read_scalar(b.as_ptr(), dtype) })
}

/// Reads a pre-multiplied sum's scalar at `p` for a call on host buffers: from the device
/// where `p` is device memory (a `ncclScalarDevice` scalar beside page-locked host buffers
/// passed with a stream), else from host memory. Where the CUDA driver is not loaded in the
/// process, `p` is host memory and no pointer query is made.
///
/// # Safety
/// `p` points to one readable element of `dtype`, in host memory or device memory.
pub(crate) unsafe fn read_scalar_host_call(p: *const u8, dtype: DataType) -> Result<f64> {
    let device = Provider::from_env()
        .ok()
        .filter(|&pr| pr != Provider::Cuda || crate::device::driver_in_process())
        .and_then(|pr| {
            let o = pr.locate(p as u64, dtype.size())?;
            Device::new(pr, o).ok()
        });
    match device {
        // SAFETY: per the caller; device memory of `device` (located above).
        Some(device) => unsafe {
            read_scalar_on(
                p,
                dtype,
                OnStream {
                    device,
                    stream: 0,
                    captured: false,
                },
            )
        },
        // SAFETY: host memory, readable per the caller.
        None => Ok(unsafe { read_scalar(p, dtype) }),
    }
}

/// Runs collective `kind` on the device buffers of `layout` after waiting for the caller's
/// stream (a `ncclScalarDevice` scalar is read after the wait); returns when the result is in
/// the output buffer.
///
/// # Safety
/// `layout` came from `coll_layout` and passed [`check_layout`] for `on`; the caller keeps the
/// buffers live and unused by anything else until this returns (NCCL's contract).
pub(crate) unsafe fn run_coll(
    comm: &Communicator,
    api: &str,
    kind: CollKind,
    layout: &Layout,
    dtype: DataType,
    red: Reduction,
    on: OnStream,
) -> Result<()> {
    if matches!(layout, Layout::Empty) {
        return Ok(());
    }
    if comm.device() != Some(on.device) {
        comm.set_device(on.device)?;
    }
    // Straight between the ranks' buffers in stream order where every rank agrees (returns
    // once queued); a device scalar is read after the stream is waited for.
    let ordered =
        matches!(red, Reduction::Op(_)) && comm.orders_between_buffers(on.device, on.stream);
    if !ordered {
        wait_stream(api, on)?;
    }
    // Read after the wait: earlier work on the stream may write a device scalar.
    let op = match red {
        Reduction::Op(op) => op,
        // SAFETY: the scalar's address was given to ncclRedOpCreatePreMulSum with
        // ncclScalarDevice; NCCL's contract keeps it readable while operations use it.
        Reduction::ScalarAt(p, d) => ReduceOp::PreMulSum(unsafe { read_scalar_on(p, d, on) }?),
    };
    let dev = on.device;
    let span = |addr: *const u8, bytes: usize| Span {
        device: dev,
        addr: addr as u64,
        bytes,
    };
    let (send, recv) = match *layout {
        Layout::Empty => return Ok(()),
        Layout::InPlace { buf, len } => (None, span(buf, len)),
        Layout::Apart {
            send,
            send_len,
            recv,
            recv_len,
        } => (Some(span(send, send_len)), span(recv, recv_len)),
    };
    let stream = ordered.then_some(on.stream);
    // SAFETY: the layout's buffers are device memory of `dev` (checked by the caller), live
    // and the call's alone until it completes, on a stream until the stream has run it
    // (NCCL's contract), and `on.stream` is the caller's stream of `dev`; `coll_layout`
    // refuses overlapping buffers outside the in-place layout, which has no send span.
    unsafe { comm.collective_at_on(kind, send, recv, dtype, op, stream) }
        .map_err(|e| e.context(api))
}

/// Checks the buffers of a gather or scatter against the call's device.
pub(crate) fn check_rooted(api: &str, rank: usize, l: &RootedLayout, on: OnStream) -> Result<()> {
    let &(send, send_len, recv, recv_len, ..) = l;
    check_span(api, rank, "sendbuff", send, send_len, on)?;
    check_span(api, rank, "recvbuff", recv.cast_const(), recv_len, on)
}

/// Waits for the work queued on the caller's stream before the call (the blocking form; a
/// stream job runs on host copies instead, `device::stream_stage`).
pub(crate) fn wait_stream(api: &str, on: OnStream) -> Result<()> {
    let stream = std::ptr::without_provenance_mut::<c_void>(on.stream);
    // SAFETY: the caller's stream of the communicator's device (NCCL's contract for the
    // stream argument), or a special handle; never dereferenced by ferroccl.
    unsafe { on.device.sync_stream(stream) }.map_err(|e| system(api, e))
}

/// Sends and receives, some of them on device buffers: every buffer checked (NULL, device,
/// overlap), the streams waited for, then one group of device and host operations, each
/// device buffer straight to its peer's transport where it carries device memory (p2p),
/// through pinned staging in pieces otherwise. Without a device buffer, `run` runs them.
///
/// # Safety
/// The operations' buffers are the caller's, live and the group's alone until it completes.
pub(crate) unsafe fn p2p_on_streams(
    comm: &Communicator,
    ops: Vec<Op>,
    run: impl FnOnce(&[Op]) -> Result<()>,
) -> Result<()> {
    if !ops.iter().any(|op| {
        matches!(
            op,
            Op::Send { on: Some(_), .. } | Op::Recv { on: Some(_), .. }
        )
    }) {
        return run(&ops);
    }
    let (rank, n) = (comm.rank(), comm.nranks());
    let mut group: Vec<(bool, usize, At)> = Vec::with_capacity(ops.len());
    let mut streams: Vec<OnStream> = Vec::new();
    for op in &ops {
        let (send, api, name, buf, count, dtype, peer, on) = match *op {
            Op::Send {
                buf,
                count,
                dtype,
                peer,
                on,
            } => (true, "ncclSend", "sendbuff", buf, count, dtype, peer, on),
            Op::Recv {
                buf,
                count,
                dtype,
                peer,
                on,
            } => (
                false,
                "ncclRecv",
                "recvbuff",
                buf.cast_const(),
                count,
                dtype,
                peer,
                on,
            ),
            _ => {
                return Err(Error::internal(
                    "ncclGroupEnd: a group of sends and receives holds another operation",
                ))
            }
        };
        let bytes = p2p_check(api, name, buf, count, dtype, peer, n)?;
        let at = match on {
            Some(on) => {
                check_span(api, rank, name, buf, bytes, on)?;
                if !streams.iter().any(|s| s.stream == on.stream) {
                    streams.push(on);
                }
                At::Device(Span {
                    device: on.device,
                    addr: buf as u64,
                    bytes,
                })
            }
            None => At::Host(buf, bytes),
        };
        group.push((send, peer, at));
    }
    let spans: Vec<(*const u8, usize, bool)> = group
        .iter()
        .map(|&(send, _, at)| match at {
            At::Device(sp) => (sp.addr as *const u8, sp.bytes, !send),
            At::Host(p, len) => (p, len, !send),
        })
        .collect();
    refuse_overlaps("buffers", &spans)?;
    for on in &streams {
        wait_stream("ncclGroupEnd", *on)?;
    }
    let dev = streams[0].device;
    if streams.iter().any(|s| s.device != dev) {
        return Err(Error::invalid_argument(format!(
            "ncclGroupEnd on rank {rank}: device buffers of {dev} and {} in one group",
            streams
                .iter()
                .find(|s| s.device != dev)
                .map_or(dev, |s| s.device)
        )));
    }
    // SAFETY: per this function's contract; every range was checked as live memory of its
    // space (device ranges of `dev`), and no receive overlaps another range.
    unsafe { device_spans(comm, dev, &group) }
}

/// Runs sends (`true`) and receives, given as (send?, peer, range), as one group on `dev`
/// ([`Communicator::group_at`]).
///
/// # Safety
/// As [`Communicator::group_at`]; the device ranges are memory of `dev`.
pub(crate) unsafe fn device_spans(
    comm: &Communicator,
    dev: Device,
    ops: &[(bool, usize, At)],
) -> Result<()> {
    if comm.device() != Some(dev) {
        comm.set_device(dev)?;
    }
    // SAFETY: per this function's contract.
    unsafe { comm.group_at(ops) }
}

/// Blocks from `ncclMemAlloc` not yet freed, by address, with their device.
static ALLOCATIONS: LazyLock<Mutex<HashMap<usize, Device>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

nccl_api! {
    /// Allocates `size` bytes of device memory on the current device (`cudaSetDevice`'s) through
    /// the provider of `FERRO_DEVICE_PROVIDER`. Without a driver: `ncclSystemError`.
    fn ncclMemAlloc / pncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
        const API: &str = "ncclMemAlloc";
        guard(API, || {
            check_out(API, "ptr", ptr)?;
            if size == 0 {
                return Err(Error::invalid_argument(format!("{API}: size is 0")));
            }
            let provider = Provider::from_env().map_err(|e| system(API, e))?;
            let dev = Device::new(provider, provider.current_device()).map_err(|e| system(API, e))?;
            let addr = dev
                .alloc_raw(size)
                .map_err(|e| system(API, e).append(format!("allocating {size} bytes on {dev}")))?;
            lock(&ALLOCATIONS).insert(addr as usize, dev);
            // SAFETY: checked non-NULL; writable by the caller's contract.
            unsafe { ptr.write(std::ptr::with_exposed_provenance_mut(addr as usize)) };
            Ok(ncclSuccess)
        })
    }
}

nccl_api! {
    /// Frees memory from `ncclMemAlloc` (NULL: nothing).
    fn ncclMemFree / pncclMemFree(ptr: *mut c_void) -> ncclResult_t {
        const API: &str = "ncclMemFree";
        guard(API, || {
            if ptr.is_null() {
                return Ok(ncclSuccess);
            }
            let Some(dev) = lock(&ALLOCATIONS).remove(&(ptr as usize)) else {
                return Err(Error::invalid_argument(format!(
                    "{API}: {ptr:p} was not allocated by ncclMemAlloc (or was already freed)"
                )));
            };
            // SAFETY: allocated by ncclMemAlloc on `dev` and freed once (just removed from
            // the live blocks); NCCL's contract: no operation still uses it.
            unsafe { dev.free_raw(ptr as u64) }.map_err(|e| system(API, e))?;
            Ok(ncclSuccess)
        })
    }
}

/// The device of the thread's provider for a test hook's stream.
pub(super) fn hook_device(api: &str) -> Result<Device> {
    let provider = Provider::from_env().map_err(|e| system(api, e))?;
    Device::new(provider, provider.current_device()).map_err(|e| system(api, e))
}

/// Waits until the work queued on `stream` has run, through the device provider: the host
/// stand-in runs its model of the stream (copies, and waits on completion flags); `cuda` is
/// `cuStreamSynchronize`. Not part of NCCL's API: the test programs' `cudaStreamSynchronize`
/// (`tests/c/cuda_stub/cuda_runtime.h`), so that they run without a CUDA runtime.
///
/// # Safety
/// `stream` is a stream of the current device (any value with the stand-in).
#[no_mangle]
pub unsafe extern "C" fn ferrocclStreamSynchronize(stream: cudaStream_t) -> ncclResult_t {
    const API: &str = "ferrocclStreamSynchronize";
    guard(API, || {
        let dev = hook_device(API)?;
        // SAFETY: per the caller.
        unsafe { dev.sync_stream(stream.cast()) }.map_err(|e| system(API, e))?;
        Ok(ncclSuccess)
    })
}

/// Queues a copy of `bytes` from `src` to `dst` on `stream` through the device provider (the
/// stand-in's stream model, or `cuMemcpyAsync`). Not part of NCCL's API: the test programs'
/// `cudaMemcpyAsync`.
///
/// # Safety
/// Both ranges stay valid for `bytes` until the stream has run the copy; `stream` as for
/// [`ferrocclStreamSynchronize`].
#[no_mangle]
pub unsafe extern "C" fn ferrocclMemcpyAsync(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    stream: cudaStream_t,
) -> ncclResult_t {
    const API: &str = "ferrocclMemcpyAsync";
    guard(API, || {
        if bytes > 0 && (dst.is_null() || src.is_null()) {
            return Err(Error::invalid_argument(format!(
                "{API}: dst {dst:p} or src {src:p} is NULL for {bytes} bytes"
            )));
        }
        let dev = hook_device(API)?;
        // SAFETY: per the caller.
        unsafe { dev.copy_on_stream(stream.cast(), dst.cast(), src.cast(), bytes) }
            .map_err(|e| system(API, e))?;
        Ok(ncclSuccess)
    })
}

/// Allocates `bytes` of page-locked host memory through the device provider
/// (`cuMemAllocHost`; the host stand-in: heap memory it registers as page-locked), into
/// `*ptr`. Not part of NCCL's API: the test programs' `cudaMallocHost`.
///
/// # Safety
/// `ptr` is writable.
#[no_mangle]
pub unsafe extern "C" fn ferrocclMemAllocHost(ptr: *mut *mut c_void, bytes: usize) -> ncclResult_t {
    const API: &str = "ferrocclMemAllocHost";
    guard(API, || {
        if ptr.is_null() {
            return Err(Error::invalid_argument(format!("{API}: ptr is NULL")));
        }
        let p = hook_device(API)?
            .alloc_pinned_raw(bytes)
            .map_err(|e| system(API, e))?;
        // SAFETY: checked non-NULL; writable per the caller.
        unsafe { *ptr = p.cast() };
        Ok(ncclSuccess)
    })
}

/// Frees memory from [`ferrocclMemAllocHost`]. Not part of NCCL's API: the test programs'
/// `cudaFreeHost`.
///
/// # Safety
/// `ptr` came from `ferrocclMemAllocHost`, is freed once, and no work still uses it.
#[no_mangle]
pub unsafe extern "C" fn ferrocclMemFreeHost(ptr: *mut c_void) -> ncclResult_t {
    const API: &str = "ferrocclMemFreeHost";
    guard(API, || {
        // SAFETY: per the caller.
        unsafe { hook_device(API)?.free_pinned_raw(ptr.cast()) }.map_err(|e| system(API, e))?;
        Ok(ncclSuccess)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_calls_whose_buffers_are_all_page_locked_run_as_host_calls() {
        let dev = Device::new(Provider::Host, 0).unwrap();
        let a = dev.alloc_pinned_raw(64).unwrap();
        let b = dev.alloc_pinned_raw(64).unwrap();
        let d = dev.alloc_raw(64).unwrap() as *const c_void;
        let pageable = [0u8; 64];
        let null = std::ptr::null();
        let (a_, b_) = (
            a.cast_const().cast::<c_void>(),
            b.cast_const().cast::<c_void>(),
        );
        assert!(page_locked_only(dev, &[a_, b_]));
        assert!(page_locked_only(dev, &[null, b_]), "in place: one buffer");
        assert!(!page_locked_only(dev, &[null, null]), "no buffer at all");
        assert!(!page_locked_only(dev, &[a_, d]), "beside device memory");
        assert!(
            !page_locked_only(dev, &[a_, pageable.as_ptr().cast()]),
            "beside pageable"
        );
        let on = OnStream {
            device: dev,
            stream: 1,
            captured: false,
        };
        let e = check_span("ncclAllReduce", 0, "sendbuff", a, 64, on).unwrap_err();
        assert!(
            e.to_string()
                .contains("page-locked host memory beside device memory"),
            "{e}"
        );
        // SAFETY: allocated above, unused.
        unsafe {
            dev.free_pinned_raw(a).unwrap();
            dev.free_pinned_raw(b).unwrap();
            dev.free_raw(d as u64).unwrap();
        }
    }

    #[test]
    fn host_memory_on_a_stream_is_named() {
        let on = OnStream {
            device: Device::new(Provider::Host, 0).unwrap(),
            stream: 1,
            captured: false,
        };
        let v = [0u8; 64];
        let e = check_span("ncclAllReduce", 1, "sendbuff", v.as_ptr(), 64, on).unwrap_err();
        let m = e.to_string();
        assert!(m.contains("ncclAllReduce on rank 1: sendbuff"), "{m}");
        assert!(m.contains("is host memory"), "{m}");
        assert!(m.contains("stream 0x1"), "{m}");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        let other = Device::new(Provider::Host, 1).unwrap();
        let a = other.alloc_raw(64).unwrap();
        let e = check_span("ncclAllReduce", 1, "recvbuff", a as *const u8, 64, on).unwrap_err();
        assert!(e.to_string().contains("memory of host device 1"), "{e}");
        let mine = on.device.alloc_raw(64).unwrap();
        check_span("x", 1, "recvbuff", mine as *const u8, 64, on).unwrap();
        // SAFETY: allocated above, unused.
        unsafe {
            other.free_raw(a).unwrap();
            on.device.free_raw(mine).unwrap();
        }
    }

    #[test]
    fn a_capture_is_seen_and_an_invalidated_one_is_invalid_usage() {
        let device = Device::new(Provider::Host, 0).unwrap();
        // A handle no other test uses: stand-in streams are process-wide.
        let h = 0x6a7a;
        let stream: cudaStream_t = std::ptr::without_provenance_mut(h);
        let comm = Communicator::local_group(1, crate::Config::default())
            .unwrap()
            .remove(0);
        let ready = Shared::ready(comm, true, 0);
        let initializing = Shared::new(true, 0);
        let status = |shared: &Shared| {
            // SAFETY: a stand-in stream needs no live handle.
            unsafe { capture::status("ncclAllReduce", shared, device, stream) }
        };
        assert!(!status(&ready).unwrap());
        crate::device::host_stream::begin_capture(h).unwrap();
        assert!(status(&ready).unwrap());
        // A synchronize invalidates it, as the driver's does.
        crate::device::host_stream::synchronize(h).unwrap_err();
        for (shared, who) in [
            (&ready, "ncclAllReduce on rank 0: stream 0x6a7a"),
            (
                &initializing,
                "ncclAllReduce (communicator not ready): stream 0x6a7a",
            ),
        ] {
            let e = status(shared).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidUsage, "{e}");
            let m = e.to_string();
            assert!(m.contains(who), "{m}");
            assert!(m.contains("was invalidated"), "{m}");
        }
        crate::device::host_stream::end_capture(h).unwrap_err();
        assert!(!status(&ready).unwrap());
    }
}
