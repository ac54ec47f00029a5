//! The CUDA driver API, loaded at run time from `libcuda.so.1` and checked before every use.
//!
//! [`driver()`] is the single entry: it loads the library once per process and returns either
//! the function table or the error every device entry point returns on a machine without an
//! NVIDIA driver ([`DRIVER_MISSING`]). Nothing here panics when the library is absent. Only the
//! calls ferroccl needs are bound, all present in CUDA 12 and CUDA 13 drivers.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use crate::dl::Library;
use crate::error::{CudaError, CudaErrorKind, Result};

mod peers;
mod pointers;

pub use pointers::*;

pub use peers::{
    IpcEventHandle, IpcMemHandle, CAPTURE_MODE_RELAXED, EVENT_DISABLE_TIMING, EVENT_INTERPROCESS,
    IPC_LAZY_ENABLE_PEER_ACCESS, STREAM_NON_BLOCKING,
};

/// The driver library's name.
pub const DRIVER_LIB: &str = "libcuda.so.1";

/// The message of every device entry point on a machine without an NVIDIA driver.
pub const DRIVER_MISSING: &str =
    "device buffers need an NVIDIA driver (libcuda.so.1 not found); host buffers work without one";

/// Overrides the driver library searched (a path, or a name for the loader); tests set it to a
/// missing file to check the no-driver path on a machine that has a driver.
pub const DRIVER_LIB_ENV: &str = "FERROCCL_CUDA_DRIVER";

/// `CUdevice`.
pub type Device = c_int;
/// `CUcontext`, `CUmodule`, `CUfunction`, `CUstream`, `CUevent`: opaque handles.
pub type Handle = *mut c_void;
/// `CUdeviceptr`.
pub type DevicePtr = u64;
type Status = c_int;

/// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`.
pub const ATTR_SM_COUNT: c_int = 16;
/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR`.
pub const ATTR_CC_MAJOR: c_int = 75;
/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR`.
pub const ATTR_CC_MINOR: c_int = 76;
/// `CUDA_ERROR_TOO_MANY_PEERS`: a device has as many peers enabled as it can.
const TOO_MANY_PEERS: c_int = 711;
macro_rules! driver_api {
    ($($field:ident = $sym:literal : fn($($arg:ty),*);)*) => {
        /// The driver functions ferroccl calls (each returns a `CUresult`).
        #[derive(Debug)]
        #[allow(missing_docs)]
        pub struct Driver {
            lib: Library,
            $(pub(crate) $field: unsafe extern "C" fn($($arg),*) -> Status,)*
            error_string: unsafe extern "C" fn(Status, *mut *const c_char) -> Status,
        }

        impl Driver {
            fn bind(lib: Library) -> std::result::Result<Driver, String> {
                // SAFETY: each field's type is the C signature of the driver function named
                // beside it (cuda.h; the `_v2` names are the 64-bit versions, in CUDA 12 and 13).
                unsafe {
                    Ok(Driver {
                        $($field: lib.function($sym)?,)*
                        error_string: lib.function("cuGetErrorString")?,
                        lib,
                    })
                }
            }
        }
    };
}

driver_api! {
    init = "cuInit": fn(c_uint);
    driver_version = "cuDriverGetVersion": fn(*mut c_int);
    device_count = "cuDeviceGetCount": fn(*mut c_int);
    device_get = "cuDeviceGet": fn(*mut Device, c_int);
    device_attribute = "cuDeviceGetAttribute": fn(*mut c_int, c_int, Device);
    device_name = "cuDeviceGetName": fn(*mut c_char, c_int, Device);
    primary_ctx_retain = "cuDevicePrimaryCtxRetain": fn(*mut Handle, Device);
    ctx_set_current = "cuCtxSetCurrent": fn(Handle);
    ctx_get_current = "cuCtxGetCurrent": fn(*mut Handle);
    ctx_synchronize = "cuCtxSynchronize": fn();
    module_load_data = "cuModuleLoadData": fn(*mut Handle, *const c_void);
    module_get_function = "cuModuleGetFunction": fn(*mut Handle, Handle, *const c_char);
    launch_kernel = "cuLaunchKernel": fn(Handle, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint,
        c_uint, Handle, *mut *mut c_void, *mut *mut c_void);
    stream_create = "cuStreamCreate": fn(*mut Handle, c_uint);
    stream_synchronize = "cuStreamSynchronize": fn(Handle);
    mem_alloc = "cuMemAlloc_v2": fn(*mut DevicePtr, usize);
    mem_free = "cuMemFree_v2": fn(DevicePtr);
    memcpy_htod = "cuMemcpyHtoD_v2": fn(DevicePtr, *const c_void, usize);
    memcpy_dtoh = "cuMemcpyDtoH_v2": fn(*mut c_void, DevicePtr, usize);
    memcpy_dtod_async = "cuMemcpyDtoDAsync_v2": fn(DevicePtr, DevicePtr, usize, Handle);
    // Device buffers through host staging (ferroccl's `device` module): pinned host memory,
    // stream-ordered copies both ways, stream teardown, and telling device from host pointers.
    mem_alloc_host = "cuMemAllocHost_v2": fn(*mut *mut c_void, usize);
    mem_free_host = "cuMemFreeHost": fn(*mut c_void);
    memcpy_htod_async = "cuMemcpyHtoDAsync_v2": fn(DevicePtr, *const c_void, usize, Handle);
    memcpy_dtoh_async = "cuMemcpyDtoHAsync_v2": fn(*mut c_void, DevicePtr, usize, Handle);
    stream_destroy = "cuStreamDestroy_v2": fn(Handle);
    stream_wait_event = "cuStreamWaitEvent": fn(Handle, Handle, c_uint);
    pointer_attribute = "cuPointerGetAttribute": fn(*mut c_void, c_int, DevicePtr);
    pointer_attributes = "cuPointerGetAttributes": fn(c_uint, *mut c_int, *mut *mut c_void,
        DevicePtr);
    mem_get_address_range = "cuMemGetAddressRange_v2": fn(*mut DevicePtr, *mut usize, DevicePtr);
    event_create = "cuEventCreate": fn(*mut Handle, c_uint);
    event_record = "cuEventRecord": fn(Handle, Handle);
    event_synchronize = "cuEventSynchronize": fn(Handle);
    event_elapsed = "cuEventElapsedTime": fn(*mut f32, Handle, Handle);
    event_destroy = "cuEventDestroy_v2": fn(Handle);
    // The peer-to-peer transport (transports/p2p): peer access, IPC handles, async copies.
    can_access_peer = "cuDeviceCanAccessPeer": fn(*mut c_int, Device, Device);
    ctx_enable_peer_access = "cuCtxEnablePeerAccess": fn(Handle, c_uint);
    device_pci_bus_id = "cuDeviceGetPCIBusId": fn(*mut c_char, c_int, Device);
    device_by_pci_bus_id = "cuDeviceGetByPCIBusId": fn(*mut Device, *const c_char);
    ipc_get_mem_handle = "cuIpcGetMemHandle": fn(*mut IpcMemHandle, DevicePtr);
    ipc_open_mem_handle = "cuIpcOpenMemHandle_v2": fn(*mut DevicePtr, IpcMemHandle, c_uint);
    ipc_close_mem_handle = "cuIpcCloseMemHandle": fn(DevicePtr);
    ipc_get_event_handle = "cuIpcGetEventHandle": fn(*mut IpcEventHandle, Handle);
    ipc_open_event_handle = "cuIpcOpenEventHandle": fn(*mut Handle, IpcEventHandle);
    memcpy_async = "cuMemcpyAsync": fn(DevicePtr, DevicePtr, usize, Handle);
    event_query = "cuEventQuery": fn(Handle);
    // A caller's stream being captured into a CUDA graph (checked before anything is queued).
    stream_is_capturing = "cuStreamIsCapturing": fn(Handle, *mut c_int);
    // Calls recorded into a graph: the pinned memory they allocate while a capture is open.
    thread_exchange_capture_mode = "cuThreadExchangeStreamCaptureMode": fn(*mut c_int);
    // The C ABI (libnccl.so.2): the device a communicator binds to at init.
    ctx_get_device = "cuCtxGetDevice": fn(*mut Device);
    // Stream-ordered calls: what the call holds is let go once its stream has run it.
    launch_host_func = "cuLaunchHostFunc": fn(Handle, HostFn, *mut c_void);
}

/// A host function queued on a stream (`CUhostFn`): runs on a driver thread once the stream
/// reaches it, and must make no CUDA call.
pub type HostFn = unsafe extern "C" fn(*mut c_void);

static DRIVER: OnceLock<Result<Driver>> = OnceLock::new();

thread_local! {
    /// Inside [`restoring_context`] on this thread: `Some(None)` until a call of this crate
    /// changes the current context, then `Some(Some(ctx))`, the context current before (0:
    /// none). `None` outside.
    static SCOPE: std::cell::Cell<Option<Option<usize>>> = const { std::cell::Cell::new(None) };
}

/// What a [`restoring_context`] scope leaves current, given the context current before it.
#[derive(Debug, PartialEq, Eq)]
enum Leave {
    /// The caller's own context, made current again.
    Saved(usize),
    /// The caller had none: device 0's primary context, which the CUDA runtime's lazy
    /// initialisation in NCCL's calls (`cudaFree(NULL)`, `cudaMalloc`) leaves current on such
    /// a thread; a program that goes on with driver calls (`cuStreamCreate` after
    /// `ncclMemAlloc`) needs one.
    Primary0,
}

fn leave(saved: usize) -> Leave {
    if saved == 0 {
        Leave::Primary0
    } else {
        Leave::Saved(saved)
    }
}

/// Runs `f`, then makes current again the context that was current on this thread before `f`
/// changed it, if it did (NCCL's calls leave the caller's current device as they found it; a
/// program's next `cudaMalloc` or launch must not land on the communicator's GPU); a thread
/// that had none is left with device 0's primary context, as NCCL leaves it. Costs two
/// thread-local accesses when nothing changes the context; nested scopes restore at the
/// outermost.
pub fn restoring_context<R>(f: impl FnOnce() -> R) -> R {
    if SCOPE.get().is_some() {
        return f();
    }
    SCOPE.set(Some(None));
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(Some(ctx)) = SCOPE.replace(None) {
                if let Some(Ok(d)) = DRIVER.get() {
                    match leave(ctx) {
                        Leave::Saved(ctx) => {
                            // SAFETY: `ctx` was current on this thread before the scope (a
                            // context the program or this crate holds).
                            let _ = unsafe { d.set_current_raw(ctx as Handle) };
                        }
                        // Outside the scope now, so this switch is not noted.
                        Leave::Primary0 => {
                            if let Ok(dev) = d.device(0) {
                                let _ = d.bind_primary_context(dev);
                            }
                        }
                    }
                }
            }
        }
    }
    let _restore = Restore;
    f()
}

/// The driver library for this process: loaded and initialised (`cuInit`) on the first call,
/// the same answer afterwards. Without an NVIDIA driver: an error with [`DRIVER_MISSING`].
pub fn driver() -> Result<&'static Driver> {
    DRIVER
        .get_or_init(|| {
            let name = std::env::var(DRIVER_LIB_ENV).unwrap_or_else(|_| DRIVER_LIB.to_string());
            Driver::load(&name)
        })
        .as_ref()
        .map_err(Clone::clone)
}

impl Driver {
    /// Loads the driver from `name` and calls `cuInit`.
    fn load(name: &str) -> Result<Driver> {
        let lib = Library::open(&[name.to_string()]).map_err(|why| {
            CudaError::new(
                CudaErrorKind::DriverMissing,
                format!(
                    "{DRIVER_MISSING} [searched {name}: {why}; a driver outside the loader's \
                     path needs LD_LIBRARY_PATH]"
                ),
            )
        })?;
        let d = Driver::bind(lib).map_err(|why| {
            CudaError::new(
                CudaErrorKind::DriverMissing,
                format!("{DRIVER_MISSING} [{why}: the driver is older than CUDA 12?]"),
            )
        })?;
        // SAFETY: cuInit takes flags 0 and may be called more than once.
        d.check("cuInit", unsafe { (d.init)(0) })?;
        Ok(d)
    }

    /// Where the library was loaded from.
    pub fn path(&self) -> &str {
        &self.lib.name
    }

    /// The loaded library, for calls bound on first use ([`crate::mem_ops`]).
    pub(crate) fn library(&self) -> &Library {
        &self.lib
    }

    /// Turns a `CUresult` into a result naming the call and the CUDA error.
    pub fn check(&self, call: &str, status: c_int) -> Result<()> {
        if status == 0 {
            return Ok(());
        }
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorString stores a static string (or leaves NULL) for any status.
        let msg = if unsafe { (self.error_string)(status, &mut p) } == 0 && !p.is_null() {
            // SAFETY: non-NULL, NUL-terminated, static.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        } else {
            "unknown CUDA error".to_string()
        };
        Err(CudaError::new(
            CudaErrorKind::Driver,
            format!("{call} failed: {msg} (CUresult {status})"),
        ))
    }

    /// The driver's CUDA version, as `cuDriverGetVersion` reports it (12040 for 12.4).
    pub fn version(&self) -> Result<i32> {
        let mut v = 0;
        // SAFETY: `v` is a valid out-pointer.
        self.check("cuDriverGetVersion", unsafe {
            (self.driver_version)(&mut v)
        })?;
        Ok(v)
    }

    /// How many CUDA devices this process sees.
    pub fn device_count(&self) -> Result<u32> {
        Ok(self.devices()?.len() as u32)
    }

    /// The device of ordinal `ordinal`, checked against the count.
    pub fn device(&self, ordinal: u32) -> Result<Device> {
        let devices = self.devices()?;
        devices.get(ordinal as usize).copied().ok_or_else(|| {
            CudaError::new(
                CudaErrorKind::Invalid,
                format!(
                    "cuda device {ordinal} does not exist (this process sees {})",
                    devices.len()
                ),
            )
        })
    }

    /// Every device this process sees, by ordinal: asked of the driver once per process (the
    /// count and the handles do not change after `cuInit`, and every call that binds a device
    /// asks for one).
    fn devices(&self) -> Result<&'static [Device]> {
        static DEVICES: OnceLock<Vec<Device>> = OnceLock::new();
        if let Some(d) = DEVICES.get() {
            return Ok(d);
        }
        let mut n = 0;
        // SAFETY: `n` is a valid out-pointer.
        self.check("cuDeviceGetCount", unsafe { (self.device_count)(&mut n) })?;
        let mut all = Vec::new();
        for k in 0..n.max(0) {
            let mut d = 0;
            // SAFETY: `d` is a valid out-pointer; the ordinal is below the count.
            self.check("cuDeviceGet", unsafe { (self.device_get)(&mut d, k) })?;
            all.push(d);
        }
        Ok(DEVICES.get_or_init(|| all))
    }

    /// An integer attribute of `device`.
    pub fn attribute(&self, device: Device, attr: c_int) -> Result<i32> {
        let mut v = 0;
        // SAFETY: `v` is a valid out-pointer; `device` came from cuDeviceGet.
        self.check("cuDeviceGetAttribute", unsafe {
            (self.device_attribute)(&mut v, attr, device)
        })?;
        Ok(v)
    }

    /// The compute capability as NVRTC's architecture number (`80` for sm_80).
    pub fn arch(&self, device: Device) -> Result<u32> {
        let major = self.attribute(device, ATTR_CC_MAJOR)?;
        let minor = self.attribute(device, ATTR_CC_MINOR)?;
        Ok((major * 10 + minor) as u32)
    }

    /// The device's name (`NVIDIA H100 80GB HBM3`).
    pub fn name(&self, device: Device) -> Result<String> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: the buffer holds 256 bytes, the length passed.
        self.check("cuDeviceGetName", unsafe {
            (self.device_name)(buf.as_mut_ptr(), buf.len() as c_int, device)
        })?;
        // SAFETY: the driver wrote a NUL-terminated name into `buf`.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// The device of the context current on this thread (`cuCtxGetDevice`: the device a CUDA
    /// runtime program chose with `cudaSetDevice`); an error when no context is current.
    pub fn current_device(&self) -> Result<Device> {
        let mut d = 0;
        // SAFETY: `d` is a valid out-pointer.
        self.check("cuCtxGetDevice", unsafe { (self.ctx_get_device)(&mut d) })?;
        Ok(d)
    }

    /// Makes `device`'s primary context current on this thread and returns it.
    pub fn bind_primary_context(&self, device: Device) -> Result<Handle> {
        let ctx = self.primary_context(device)?;
        // SAFETY: `ctx` is a retained primary context, never released.
        unsafe { self.set_current(ctx) }?;
        Ok(ctx)
    }

    /// `device`'s primary context, retained (once per device and process, for the process's
    /// life), not made current.
    pub fn primary_context(&self, device: Device) -> Result<Handle> {
        // Retained once per device and process, kept for the process's life: a retain per
        // call would take the driver's lock each time and grow the reference count forever.
        static RETAINED: std::sync::Mutex<Vec<(Device, usize)>> = std::sync::Mutex::new(Vec::new());
        let mut retained = RETAINED.lock().unwrap_or_else(|p| p.into_inner());
        let ctx = match retained.iter().find(|(d, _)| *d == device) {
            Some(&(_, ctx)) => ctx as Handle,
            None => {
                let mut ctx = std::ptr::null_mut();
                // SAFETY: `ctx` is a valid out-pointer; `device` came from cuDeviceGet.
                self.check("cuDevicePrimaryCtxRetain", unsafe {
                    (self.primary_ctx_retain)(&mut ctx, device)
                })?;
                retained.push((device, ctx as usize));
                ctx
            }
        };
        Ok(ctx)
    }

    /// Inside a [`restoring_context`] scope, remembers the context current before the first
    /// change.
    fn note_switch(&self) {
        if SCOPE.get() == Some(None) {
            let mut ctx = std::ptr::null_mut();
            // SAFETY: `ctx` is a valid out-pointer.
            let s = unsafe { (self.ctx_get_current)(&mut ctx) };
            if s == 0 {
                SCOPE.set(Some(Some(ctx as usize)));
            }
        }
    }

    /// `cuCtxSetCurrent` without noting anything (the restore itself).
    ///
    /// # Safety
    /// `ctx` is a live context or null.
    unsafe fn set_current_raw(&self, ctx: Handle) -> Result<()> {
        // SAFETY: per the caller.
        self.check("cuCtxSetCurrent", unsafe { (self.ctx_set_current)(ctx) })
    }

    /// Whether a context is current on this thread (`cuCtxGetCurrent`).
    pub fn has_current_context(&self) -> bool {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid out-pointer.
        let s = unsafe { (self.ctx_get_current)(&mut ctx) };
        s == 0 && !ctx.is_null()
    }

    /// Allocates `len` bytes of device memory in the current context.
    pub fn alloc(&self, len: usize) -> Result<DevicePtr> {
        let mut p = 0;
        // SAFETY: `p` is a valid out-pointer; a context is current (bind_primary_context).
        self.check("cuMemAlloc", unsafe {
            (self.mem_alloc)(&mut p, len.max(1))
        })?;
        Ok(p)
    }

    /// Frees memory from [`Driver::alloc`].
    ///
    /// # Safety
    /// `p` came from [`Driver::alloc`], is freed once, and no queued work still uses it.
    pub unsafe fn free(&self, p: DevicePtr) -> Result<()> {
        // SAFETY: per the caller.
        self.check("cuMemFree", unsafe { (self.mem_free)(p) })
    }

    /// Allocates `len` bytes of page-locked host memory in the current context (the staging
    /// buffers of device data crossing host-only transports).
    pub fn alloc_pinned(&self, len: usize) -> Result<*mut u8> {
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; a context is current (bind_primary_context).
        self.check("cuMemAllocHost", unsafe {
            (self.mem_alloc_host)(&mut p, len.max(1))
        })?;
        Ok(p.cast())
    }

    /// Frees memory from [`Driver::alloc_pinned`].
    ///
    /// # Safety
    /// `p` came from [`Driver::alloc_pinned`], is freed once, and no queued copy still uses it.
    pub unsafe fn free_pinned(&self, p: *mut u8) -> Result<()> {
        // SAFETY: per the caller.
        self.check("cuMemFreeHost", unsafe { (self.mem_free_host)(p.cast()) })
    }

    /// Queues a copy of `len` host bytes at `src` to device memory `dst` on `stream`.
    ///
    /// # Safety
    /// `src` is readable and `dst` device memory writable for `len` bytes until the stream has
    /// run the copy; `stream` belongs to the current context.
    pub unsafe fn upload_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: Handle,
    ) -> Result<()> {
        // SAFETY: per the caller.
        self.check("cuMemcpyHtoDAsync", unsafe {
            (self.memcpy_htod_async)(dst, src.cast(), len, stream)
        })
    }

    /// Queues a copy of `len` bytes of device memory `src` to host memory `dst` on `stream`.
    ///
    /// # Safety
    /// `src` is device memory readable and `dst` host memory writable for `len` bytes until
    /// the stream has run the copy; `stream` belongs to the current context.
    pub unsafe fn download_async(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: Handle,
    ) -> Result<()> {
        // SAFETY: per the caller.
        self.check("cuMemcpyDtoHAsync", unsafe {
            (self.memcpy_dtoh_async)(dst.cast(), src, len, stream)
        })
    }

    /// Creates a non-blocking stream in the current context.
    pub fn create_stream(&self) -> Result<Handle> {
        let mut s = std::ptr::null_mut();
        // SAFETY: `s` is a valid out-pointer; the flag makes the stream non-blocking.
        self.check("cuStreamCreate", unsafe {
            (self.stream_create)(&mut s, STREAM_NON_BLOCKING)
        })?;
        Ok(s)
    }

    /// Waits until everything queued on `stream` has run.
    ///
    /// # Safety
    /// `stream` is a live stream of the current context (from [`Driver::create_stream`], or a
    /// caller's `cudaStream_t`, which is the same handle), or one of the special handles
    /// `CU_STREAM_LEGACY` (1) and `CU_STREAM_PER_THREAD` (2).
    pub unsafe fn sync_stream(&self, stream: Handle) -> Result<()> {
        // SAFETY: per the caller.
        self.check("cuStreamSynchronize", unsafe {
            (self.stream_synchronize)(stream)
        })
    }

    /// Waits for all work of the current context (`cuCtxSynchronize`).
    pub fn sync_context(&self) -> Result<()> {
        // SAFETY: reads no memory of ours.
        self.check("cuCtxSynchronize", unsafe { (self.ctx_synchronize)() })
    }

    /// Destroys a stream from [`Driver::create_stream`].
    ///
    /// # Safety
    /// `stream` is destroyed once and not used afterwards.
    pub unsafe fn destroy_stream(&self, stream: Handle) -> Result<()> {
        // SAFETY: per the caller.
        self.check("cuStreamDestroy", unsafe { (self.stream_destroy)(stream) })
    }

    /// Makes work queued on `stream` after this call wait for `event` (recorded on another
    /// stream) to complete, without blocking the host.
    ///
    /// # Safety
    /// `stream` and `event` are live handles of the current context; flags are 0.
    pub unsafe fn stream_wait(&self, stream: Handle, event: Handle) -> Result<()> {
        // SAFETY: per the caller.
        self.check("cuStreamWaitEvent", unsafe {
            (self.stream_wait_event)(stream, event, 0)
        })
    }

    /// Creates an event without timing (`CU_EVENT_DISABLE_TIMING`) in the current context: a
    /// mark in a stream that the host or another stream can wait for.
    pub fn create_event(&self) -> Result<Handle> {
        let mut e = std::ptr::null_mut();
        // SAFETY: `e` is a valid out-pointer; the flag turns timing off.
        self.check("cuEventCreate", unsafe {
            (self.event_create)(&mut e, EVENT_DISABLE_TIMING)
        })?;
        Ok(e)
    }

    /// Records `event` at the current end of `stream`.
    ///
    /// # Safety
    /// `event` and `stream` are live handles of the current context.
    pub unsafe fn record_event(&self, event: Handle, stream: Handle) -> Result<()> {
        // SAFETY: per the caller.
        self.check("cuEventRecord", unsafe {
            (self.event_record)(event, stream)
        })
    }

    /// Waits until the work before `event`'s last record has run.
    ///
    /// # Safety
    /// `event` is a live event.
    pub unsafe fn sync_event(&self, event: Handle) -> Result<()> {
        // SAFETY: per the caller.
        self.check("cuEventSynchronize", unsafe {
            (self.event_synchronize)(event)
        })
    }

    /// Queues `f(data)` on `stream`: the driver runs it on a thread of its own once the work
    /// queued before it has run, and the work queued after it waits until it returns.
    ///
    /// # Safety
    /// `stream` is a live stream of the current context; `f` makes no CUDA call and may be
    /// called with `data` on another thread, once.
    pub unsafe fn launch_host_func(
        &self,
        stream: Handle,
        f: HostFn,
        data: *mut c_void,
    ) -> Result<()> {
        // SAFETY: per the caller.
        self.check("cuLaunchHostFunc", unsafe {
            (self.launch_host_func)(stream, f, data)
        })
    }

    /// Destroys an event from [`Driver::create_event`].
    ///
    /// # Safety
    /// `event` is destroyed once and not used afterwards.
    pub unsafe fn destroy_event(&self, event: Handle) -> Result<()> {
        // SAFETY: per the caller.
        self.check("cuEventDestroy", unsafe { (self.event_destroy)(event) })
    }

    /// Copies host bytes to device memory; returns once they are in device memory.
    ///
    /// `cuMemcpyHtoD` from pageable memory may return while the last part of the copy is
    /// still on its way to the device (up to 64 KiB, or the last staged piece of a larger
    /// copy), and work on a non-blocking stream is not ordered after it: so the copy is
    /// followed by a synchronize of the legacy stream, which it was queued on.
    ///
    /// # Safety
    /// `dst` is device memory of at least `src.len()` bytes.
    pub unsafe fn upload(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        // SAFETY: `src` is readable for its length; the caller vouches for `dst`.
        self.check("cuMemcpyHtoD", unsafe {
            (self.memcpy_htod)(dst, src.as_ptr().cast(), src.len())
        })?;
        // SAFETY: the legacy stream (handle 0) always exists in a current context.
        self.check("cuStreamSynchronize", unsafe {
            (self.stream_synchronize)(std::ptr::null_mut())
        })
    }

    /// Copies device memory to host bytes (synchronous).
    ///
    /// # Safety
    /// `src` is device memory of at least `dst.len()` bytes.
    pub unsafe fn download(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        // SAFETY: `dst` is writable for its length; the caller vouches for `src`.
        self.check("cuMemcpyDtoH", unsafe {
            (self.memcpy_dtoh)(dst.as_mut_ptr().cast(), src, dst.len())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_scope_ends_with_its_outermost_call_even_after_a_panic() {
        assert_eq!(SCOPE.get(), None);
        let v = restoring_context(|| {
            assert_eq!(SCOPE.get(), Some(None), "inside: nothing switched yet");
            // A switch noted inside is kept by a nested scope for the outer one to restore.
            SCOPE.set(Some(Some(0)));
            restoring_context(|| 7)
        });
        assert_eq!(v, 7);
        assert_eq!(SCOPE.get(), None, "the outer scope ended it");
        let r = std::panic::catch_unwind(|| restoring_context(|| panic!("inside a scope")));
        assert!(r.is_err());
        assert_eq!(SCOPE.get(), None, "a panic ends the scope too");
    }

    #[test]
    fn a_scope_never_leaves_a_thread_without_a_context() {
        assert_eq!(leave(0), Leave::Primary0);
        assert_eq!(leave(0x7f00_1000), Leave::Saved(0x7f00_1000));
    }
}
