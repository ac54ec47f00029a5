//! Tensors in device memory (CUDA tensors): collectives and groups of sends and receives
//! ordered on the caller's stream, and the raw device memory the tests use.
//!
//! A call names the device by index (the provider is `FERRO_DEVICE_PROVIDER`'s: CUDA unless
//! the host stand-in is asked for) and the stream by its handle (`torch.cuda.Stream.cuda_stream`).
//! It is queued on that stream, as NCCL's calls are: it returns once queued, starts when the
//! work queued on the stream before it is done, and later work on the stream sees its result
//! (`Communicator::raw_collective_device_on`, `Group::run_on`). The communicator binds to the
//! device of its first such call; a tensor on another device is refused.

use std::ffi::c_void;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use ferroccl::coll::CollKind;
use ferroccl::device::{Device, DeviceBuffer, DeviceStream, DeviceView};
use ferroccl::{Communicator, DataType, Error, ReduceOp, Result};

/// Device memory as the Python layer names it: an address and a byte length on a device.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DevSpan {
    pub addr: u64,
    pub len: usize,
}

/// Where a call runs: the device (by index) and the caller's stream handle on it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct On {
    pub device: u32,
    pub stream: usize,
}

/// The device `index` of the configured provider.
pub(crate) fn device(index: u32) -> Result<Device> {
    Device::from_env(index)
}

/// Binds `comm` to `dev` on its first device call; refuses another device afterwards.
fn bind(comm: &Communicator, dev: Device, what: &str) -> Result<()> {
    match comm.device() {
        None => comm.set_device(dev),
        Some(d) if d == dev => Ok(()),
        Some(d) => Err(Error::invalid_argument(format!(
            "{what} on rank {}: the tensor is on {dev}, but this process group runs on {d} \
             (one device per process group)",
            comm.rank()
        ))),
    }
}

/// A view of `span` on `dev`.
///
/// # Safety
/// `span` is the memory of a tensor the Python layer keeps alive until the call that uses the
/// view returns; afterwards only work queued on the caller's stream touches it, which
/// PyTorch's stream semantics keep valid (a freed block is reused only after that work).
unsafe fn view(dev: Device, span: DevSpan) -> Result<DeviceView<u8>> {
    // SAFETY: per this function's contract; the collective checks that the range is live
    // device memory of `dev` before anything is queued.
    unsafe { DeviceBuffer::<u8>::view(dev, span.addr, span.len) }
}

/// Queues collective `kind` on `send` (`None`: in place) and `recv`, elements of `dtype`, on
/// the caller's stream.
///
/// # Safety
/// As for [`view`]; `recv` is written by nothing else meanwhile and `send` does not overlap it.
pub(crate) unsafe fn collective(
    comm: &Communicator,
    kind: CollKind,
    send: Option<DevSpan>,
    recv: DevSpan,
    dtype: DataType,
    op: ReduceOp,
    on: On,
) -> Result<()> {
    let dev = device(on.device)?;
    bind(comm, dev, kind.name())?;
    // SAFETY: per this function's contract.
    let mut r = unsafe { view(dev, recv) }?;
    let s = match send {
        // SAFETY: as above.
        Some(sp) => Some(unsafe { view(dev, sp) }?),
        None => None,
    };
    // SAFETY: the caller's stream of `dev` (the Python layer passes the current stream of the
    // tensor's device), live while the call queues work on it.
    let stream = unsafe { DeviceStream::from_raw(dev, on.stream as *mut c_void) };
    let send = s.as_ref().map(|b| (&**b, 0..b.len()));
    let rlen = r.len();
    comm.raw_collective_device_on(kind, send, (&mut *r, 0..rlen), dtype, op, &stream)
}

/// Queues a group of sends (`true`) and receives on the caller's stream.
///
/// # Safety
/// As for [`view`]; no receive's span overlaps another span of the group.
pub(crate) unsafe fn group(
    comm: &Communicator,
    ops: &[(bool, DevSpan, usize)],
    on: On,
) -> Result<()> {
    let dev = device(on.device)?;
    bind(comm, dev, "send/recv group")?;
    let mut views = Vec::with_capacity(ops.len());
    for &(_, span, _) in ops {
        // SAFETY: per this function's contract.
        views.push(unsafe { view(dev, span) }?);
    }
    // SAFETY: as in `collective`.
    let stream = unsafe { DeviceStream::from_raw(dev, on.stream as *mut c_void) };
    let mut g = comm.group();
    for (&(is_send, _, peer), v) in ops.iter().zip(views.iter_mut()) {
        if is_send {
            g.send_device(&**v, peer);
        } else {
            g.recv_device(&mut **v, peer);
        }
    }
    g.run_on(&stream)
}

// ----- raw device memory and streams, for tests without PyTorch's CUDA -----
//
// With `FERRO_DEVICE_PROVIDER=host` (the host stand-in) these make "device memory" that the
// device calls above accept, so the Python layer's device path runs on a machine without a
// GPU; with CUDA they are plain driver allocations and copies.

/// Allocates `nbytes` of memory on device `index`; returns its address.
#[pyfunction]
pub fn device_alloc(index: u32, nbytes: usize) -> PyResult<u64> {
    device(index)
        .and_then(|d| d.alloc_raw(nbytes))
        .map_err(crate::to_py)
}

/// Frees memory from `device_alloc` (once, with no work still using it).
#[pyfunction]
pub fn device_free(index: u32, addr: u64) -> PyResult<()> {
    let d = device(index).map_err(crate::to_py)?;
    // SAFETY: the caller passes an address `device_alloc` returned for this device, once,
    // after the work using it (tests synchronize their streams first).
    unsafe { d.free_raw(addr) }.map_err(crate::to_py)
}

/// Copies `data` to device memory at `addr` (inside a `device_alloc` allocation).
#[pyfunction]
pub fn device_write(index: u32, addr: u64, data: &[u8]) -> PyResult<()> {
    let d = device(index).map_err(crate::to_py)?;
    check_live(d, addr, data.len())?;
    // SAFETY: the range is live device memory of `d` (checked above); tests write memory
    // no queued work uses.
    unsafe { d.write_raw(addr, data) }.map_err(crate::to_py)
}

/// Reads `nbytes` of device memory at `addr` (inside a `device_alloc` allocation).
#[pyfunction]
pub fn device_read(py: Python<'_>, index: u32, addr: u64, nbytes: usize) -> PyResult<Py<PyBytes>> {
    let d = device(index).map_err(crate::to_py)?;
    check_live(d, addr, nbytes)?;
    let mut v = vec![0u8; nbytes];
    // SAFETY: the range is live device memory of `d` (checked above).
    unsafe { d.read_raw(addr, &mut v) }.map_err(crate::to_py)?;
    Ok(PyBytes::new(py, &v).unbind())
}

/// Waits until the work queued on stream `handle` of device `index` has run (the stand-in
/// runs its model of the stream then).
#[pyfunction]
pub fn stream_synchronize(py: Python<'_>, index: u32, handle: usize) -> PyResult<()> {
    let d = device(index).map_err(crate::to_py)?;
    py.allow_threads(|| {
        // SAFETY: the caller's live stream of the device (tests pass the stand-in's numbers
        // or a CUDA stream they made).
        unsafe { d.sync_stream(handle as *mut c_void) }
    })
    .map_err(crate::to_py)
}

fn check_live(d: Device, addr: u64, nbytes: usize) -> PyResult<()> {
    if nbytes > 0 && d.find(addr, nbytes) != Some(d.ordinal()) {
        let past = if d.find(addr, 1) == Some(d.ordinal()) {
            ": they start in it but run past the allocation (or the mapped memory) of their \
             first byte"
        } else {
            ""
        };
        return Err(crate::Error::new_err(format!(
            "ferroccl: {nbytes} bytes at 0x{addr:x} are not live memory of {d}{past}"
        )));
    }
    Ok(())
}
