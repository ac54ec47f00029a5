//! Stream memory operations: a caller's stream waits until a 32-bit flag in host-mapped pinned
//! memory reaches a value (`cuStreamWaitValue32`), which the host writes when an operation the
//! stream depends on is done; the other way, the stream writes a word the host polls
//! (`cuStreamWriteValue32`) once the work queued before it is done. This is how a call made
//! with a stream returns at once while work queued on the stream after it still waits for its
//! result.
//!
//! The calls are bound on first use, not when the driver loads: a driver without them still
//! serves everything else, and [`MemOps::supported`] says no (the C ABI then falls back to
//! blocking calls). `cuStreamWaitValue32_v2` is taken where the driver exports it (CUDA 11.7 and
//! later, where 32-bit waits need no opt-in), else `cuStreamWaitValue32` with the device's
//! `CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1`. Both need
//! `CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY`. The wait ran on an H100 (driver 580); the write is
//! built, not yet run on a GPU.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::OnceLock;

use crate::driver::{Device, DevicePtr, Driver, Handle};
use crate::error::{CudaError, CudaErrorKind, Result};

/// `CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY`.
pub const ATTR_CAN_MAP_HOST_MEMORY: c_int = 19;
/// `CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1` (the opt-in of the first memory-op calls).
pub const ATTR_CAN_USE_STREAM_MEM_OPS_V1: c_int = 92;
/// `CU_STREAM_WAIT_VALUE_GEQ`: wait until `(int32_t)(*addr - value) >= 0` (wraps around).
pub const WAIT_VALUE_GEQ: c_uint = 0;
/// `CU_MEMHOSTALLOC_PORTABLE`: pinned for every context.
pub const MEMHOSTALLOC_PORTABLE: c_uint = 1;
/// `CU_MEMHOSTALLOC_DEVICEMAP`: mapped into the device's address space.
pub const MEMHOSTALLOC_DEVICEMAP: c_uint = 2;

type Status = c_int;
type WaitValue32 = unsafe extern "C" fn(Handle, DevicePtr, u32, c_uint) -> Status;
type WriteValue32 = unsafe extern "C" fn(Handle, DevicePtr, u32, c_uint) -> Status;
type HostAlloc = unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> Status;
type HostDevicePtr = unsafe extern "C" fn(*mut DevicePtr, *mut c_void, c_uint) -> Status;

/// The memory-op calls of the loaded driver, each `None` when the driver lacks it.
#[derive(Debug)]
pub struct MemOps {
    wait_value32: Option<(WaitValue32, &'static str)>,
    write_value32: Option<(WriteValue32, &'static str)>,
    host_alloc: Option<HostAlloc>,
    host_device_ptr: Option<HostDevicePtr>,
}

/// The memory-op calls of `d` (bound once per process).
pub fn mem_ops(d: &Driver) -> &'static MemOps {
    static OPS: OnceLock<MemOps> = OnceLock::new();
    OPS.get_or_init(|| {
        let lib = d.library();
        // SAFETY: each type is the C signature of the named driver function (cuda.h):
        // CUresult cuStreamWaitValue32(CUstream, CUdeviceptr, cuuint32_t, unsigned int) and
        // cuStreamWriteValue32 with the same parameters (the `_v2` names have the same ones);
        // cuMemHostAlloc(void **, size_t, unsigned int);
        // cuMemHostGetDevicePointer_v2(CUdeviceptr *, void *, unsigned int).
        unsafe {
            let wait = ["cuStreamWaitValue32_v2", "cuStreamWaitValue32"]
                .into_iter()
                .find_map(|n| lib.function::<WaitValue32>(n).ok().map(|f| (f, n)));
            let write = ["cuStreamWriteValue32_v2", "cuStreamWriteValue32"]
                .into_iter()
                .find_map(|n| lib.function::<WriteValue32>(n).ok().map(|f| (f, n)));
            MemOps {
                wait_value32: wait,
                write_value32: write,
                host_alloc: lib.function("cuMemHostAlloc").ok(),
                host_device_ptr: lib.function("cuMemHostGetDevicePointer_v2").ok(),
            }
        }
    })
}

fn missing(call: &str) -> CudaError {
    CudaError::new(
        CudaErrorKind::Driver,
        format!("{call} is not exported by this CUDA driver (too old?)"),
    )
}

impl MemOps {
    /// Whether `device` can wait on a host-mapped flag from a stream: the calls are there and
    /// the device maps host memory (and, with only the first wait call, has opted in). Asked
    /// of the driver once per device and process (every call on a stream asks this).
    pub fn supported(&self, d: &Driver, device: Device) -> bool {
        static KNOWN: std::sync::Mutex<Vec<(Device, bool)>> = std::sync::Mutex::new(Vec::new());
        let mut known = KNOWN.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&(_, on)) = known.iter().find(|(k, _)| *k == device) {
            return on;
        }
        let on = self.ask_supported(d, device);
        known.push((device, on));
        on
    }

    fn ask_supported(&self, d: &Driver, device: Device) -> bool {
        let (Some((_, name)), Some(_), Some(_), Some(_)) = (
            self.wait_value32,
            self.write_value32,
            self.host_alloc,
            self.host_device_ptr,
        ) else {
            return false;
        };
        let on = |attr| d.attribute(device, attr).is_ok_and(|v| v != 0);
        on(ATTR_CAN_MAP_HOST_MEMORY)
            && (name.ends_with("_v2") || on(ATTR_CAN_USE_STREAM_MEM_OPS_V1))
    }

    /// Which wait call is bound (`None`: neither).
    pub fn wait_call(&self) -> Option<&'static str> {
        self.wait_value32.map(|(_, n)| n)
    }

    /// `len` bytes of pinned host memory mapped into the current context's device
    /// (`cuMemHostAlloc` with `PORTABLE | DEVICEMAP`), with their device address
    /// (`cuMemHostGetDevicePointer`). Free with [`Driver::free_pinned`].
    pub fn alloc_mapped(&self, d: &Driver, len: usize) -> Result<(*mut u8, DevicePtr)> {
        let alloc = self.host_alloc.ok_or_else(|| missing("cuMemHostAlloc"))?;
        let get = self
            .host_device_ptr
            .ok_or_else(|| missing("cuMemHostGetDevicePointer_v2"))?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; a context is current (the caller bound one).
        d.check("cuMemHostAlloc", unsafe {
            alloc(
                &mut p,
                len.max(1),
                MEMHOSTALLOC_PORTABLE | MEMHOSTALLOC_DEVICEMAP,
            )
        })?;
        let mut dp: DevicePtr = 0;
        // SAFETY: `p` was just mapped with DEVICEMAP; `dp` is a valid out-pointer; flags 0.
        let r = d.check("cuMemHostGetDevicePointer", unsafe { get(&mut dp, p, 0) });
        if let Err(e) = r {
            // SAFETY: allocated just above, unused, freed once.
            let _ = unsafe { d.free_pinned(p.cast()) };
            return Err(e);
        }
        Ok((p.cast(), dp))
    }

    /// Queues on `stream` a wait until the 32-bit word at device address `addr` is at least
    /// `value` (`CU_STREAM_WAIT_VALUE_GEQ`, compared as a wrapping difference).
    ///
    /// # Safety
    /// `stream` is a live stream of the current context (or a special handle); `addr` is the
    /// device address of mapped host memory that stays allocated until the stream has passed
    /// the wait.
    pub unsafe fn wait_value32(
        &self,
        d: &Driver,
        stream: Handle,
        addr: DevicePtr,
        value: u32,
    ) -> Result<()> {
        let (wait, name) = self
            .wait_value32
            .ok_or_else(|| missing("cuStreamWaitValue32"))?;
        // SAFETY: per the caller.
        d.check(name, unsafe { wait(stream, addr, value, WAIT_VALUE_GEQ) })
    }

    /// Queues on `stream` a write of `value` to the 32-bit word at device address `addr`,
    /// after the work queued before it (with the driver's default memory barrier, so that
    /// what that work wrote is visible to whoever sees the value).
    ///
    /// # Safety
    /// As for [`MemOps::wait_value32`]: `addr` is mapped host memory that stays allocated
    /// until the stream has run the write.
    pub unsafe fn write_value32(
        &self,
        d: &Driver,
        stream: Handle,
        addr: DevicePtr,
        value: u32,
    ) -> Result<()> {
        let (write, name) = self
            .write_value32
            .ok_or_else(|| missing("cuStreamWriteValue32"))?;
        // SAFETY: per the caller; flags 0 (the default, with a memory barrier).
        d.check(name, unsafe { write(stream, addr, value, 0) })
    }
}
