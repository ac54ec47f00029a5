//! The peer-to-peer transport's calls (transports/p2p) and the interprocess events: peer
//! access, CUDA IPC handles of plain `cuMemAlloc` memory, copies on a stream of its own and
//! events to poll them.

use std::ffi::{c_char, c_int, c_uint, CStr};

use super::{Device, DevicePtr, Driver, Handle, TOO_MANY_PEERS};
use crate::error::{CudaError, CudaErrorKind, Result};

/// `CUipcMemHandle`: 64 opaque bytes naming an allocation to another process.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpcMemHandle(pub [u8; 64]);

/// `CUipcEventHandle`: 64 opaque bytes naming an interprocess event to another process.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpcEventHandle(pub [u8; 64]);

/// `CU_EVENT_INTERPROCESS` (with [`EVENT_DISABLE_TIMING`], as the driver requires).
pub const EVENT_INTERPROCESS: c_uint = 4;

/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`.
pub const IPC_LAZY_ENABLE_PEER_ACCESS: c_uint = 1;
/// `CU_STREAM_NON_BLOCKING`.
pub const STREAM_NON_BLOCKING: c_uint = 1;
/// `CU_EVENT_DISABLE_TIMING`.
pub const EVENT_DISABLE_TIMING: c_uint = 2;
/// `CUDA_ERROR_NOT_READY`: `cuEventQuery` on work still queued.
const NOT_READY: c_int = 600;

/// `CU_STREAM_CAPTURE_MODE_RELAXED`: a thread in this mode may make calls a capture open
/// elsewhere (or its own) would otherwise forbid, such as allocations.
pub const CAPTURE_MODE_RELAXED: u32 = 2;

impl Driver {
    /// Makes `ctx` (from [`Driver::bind_primary_context`]) current on this thread.
    ///
    /// # Safety
    /// `ctx` is a context the driver handed out and still holds (a retained primary context).
    pub unsafe fn set_current(&self, ctx: Handle) -> Result<()> {
        self.note_switch();
        // SAFETY: per the caller; the call reads no memory of ours.
        unsafe { self.set_current_raw(ctx) }
    }

    /// Whether `device` can map memory of `peer` (`cuDeviceCanAccessPeer`); a device can
    /// always reach its own memory.
    pub fn can_access_peer(&self, device: Device, peer: Device) -> Result<bool> {
        if device == peer {
            return Ok(true);
        }
        let mut v = 0;
        // SAFETY: `v` is a valid out-pointer; both devices came from the driver.
        self.check("cuDeviceCanAccessPeer", unsafe {
            (self.can_access_peer)(&mut v, device, peer)
        })?;
        Ok(v != 0)
    }

    /// Lets the current context reach memory of the context `peer` directly
    /// (`cuCtxEnablePeerAccess`; access already enabled counts as done).
    ///
    /// # Safety
    /// A context is current on this thread, and `peer` is a context the driver handed out and
    /// still holds (a retained primary context of another device).
    pub unsafe fn enable_peer_access(&self, peer: Handle) -> Result<()> {
        // SAFETY: per the caller.
        match unsafe { self.try_enable_peer_access(peer) }? {
            true => Ok(()),
            false => self.check("cuCtxEnablePeerAccess", TOO_MANY_PEERS),
        }
    }

    /// [`Driver::enable_peer_access`], answering `false` where the device has as many peers
    /// enabled as it can (`CUDA_ERROR_TOO_MANY_PEERS`): copies to the peer's memory still
    /// work, staged by the driver; kernels cannot reach it.
    ///
    /// # Safety
    /// As for [`Driver::enable_peer_access`].
    pub unsafe fn try_enable_peer_access(&self, peer: Handle) -> Result<bool> {
        /// `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`.
        const ALREADY_ENABLED: c_int = 704;
        // SAFETY: per the caller; the call reads no memory of ours.
        let status = unsafe { (self.ctx_enable_peer_access)(peer, 0) };
        match status {
            ALREADY_ENABLED => Ok(true),
            TOO_MANY_PEERS => Ok(false),
            s => self.check("cuCtxEnablePeerAccess", s).map(|()| true),
        }
    }

    /// Lets kernels in `device`'s primary context reach memory of `peer`'s
    /// (`cuCtxEnablePeerAccess` from the one to the other; already enabled counts as done),
    /// from any thread: the context current on this thread before is current again after.
    pub fn enable_peer_access_between(&self, device: Device, peer: Device) -> Result<()> {
        let (from, to) = (self.primary_context(device)?, self.primary_context(peer)?);
        let mut saved = std::ptr::null_mut();
        // SAFETY: `saved` is a valid out-pointer.
        self.check("cuCtxGetCurrent", unsafe {
            (self.ctx_get_current)(&mut saved)
        })?;
        // SAFETY: `from` is a retained primary context, never released.
        unsafe { self.set_current_raw(from) }?;
        // SAFETY: `from` is current (set above); `to` is a retained primary context.
        let r = unsafe { self.enable_peer_access(to) };
        // SAFETY: `saved` was current on this thread (a context the program or this crate
        // holds), or null (none).
        let back = unsafe { self.set_current_raw(saved) };
        r.and(back)
    }

    /// The device's PCI bus id (`0000:3b:00.0`): the same GPU has the same id in every process,
    /// whatever its ordinal there.
    pub fn pci_bus_id(&self, device: Device) -> Result<String> {
        let mut buf = [0 as c_char; 32];
        // SAFETY: the buffer holds 32 bytes, the length passed.
        self.check("cuDeviceGetPCIBusId", unsafe {
            (self.device_pci_bus_id)(buf.as_mut_ptr(), buf.len() as c_int, device)
        })?;
        // SAFETY: the driver wrote a NUL-terminated id into `buf`.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// The device with PCI bus id `id` as this process numbers it; an error when this process
    /// does not see it (`CUDA_VISIBLE_DEVICES`).
    pub fn device_by_pci_bus_id(&self, id: &str) -> Result<Device> {
        let c = std::ffi::CString::new(id).map_err(|_| {
            CudaError::new(
                CudaErrorKind::Invalid,
                format!("PCI bus id {id:?} holds a NUL byte"),
            )
        })?;
        let mut d = 0;
        // SAFETY: `d` is a valid out-pointer, `c` a NUL-terminated string alive for the call.
        self.check("cuDeviceGetByPCIBusId", unsafe {
            (self.device_by_pci_bus_id)(&mut d, c.as_ptr())
        })?;
        Ok(d)
    }

    /// The IPC handle of an allocation from [`Driver::alloc`] (not stream-ordered pool memory,
    /// which IPC cannot export), for another process to open.
    pub fn ipc_handle(&self, p: DevicePtr) -> Result<IpcMemHandle> {
        let mut h = IpcMemHandle([0; 64]);
        // SAFETY: `h` is a valid out-pointer of the handle's size; the driver checks `p`.
        self.check("cuIpcGetMemHandle", unsafe {
            (self.ipc_get_mem_handle)(&mut h, p)
        })?;
        Ok(h)
    }

    /// Maps another process's allocation into the current context
    /// (`CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`); close it with [`Driver::ipc_close`].
    pub fn ipc_open(&self, h: &IpcMemHandle) -> Result<DevicePtr> {
        let mut p = 0;
        // SAFETY: `p` is a valid out-pointer; the handle is passed by value as cuda.h declares.
        self.check("cuIpcOpenMemHandle", unsafe {
            (self.ipc_open_mem_handle)(&mut p, *h, IPC_LAZY_ENABLE_PEER_ACCESS)
        })?;
        Ok(p)
    }

    /// Unmaps memory from [`Driver::ipc_open`].
    ///
    /// # Safety
    /// `p` came from [`Driver::ipc_open`], is closed once, and no queued work still uses it.
    pub unsafe fn ipc_close(&self, p: DevicePtr) -> Result<()> {
        // SAFETY: per the caller.
        self.check("cuIpcCloseMemHandle", unsafe {
            (self.ipc_close_mem_handle)(p)
        })
    }

    /// Creates an event another process can wait for (`CU_EVENT_INTERPROCESS`, without timing)
    /// in the current context, with the handle that process opens it from
    /// ([`Driver::ipc_open_event`]).
    pub fn create_ipc_event(&self) -> Result<(Handle, IpcEventHandle)> {
        let mut e = std::ptr::null_mut();
        // SAFETY: `e` is a valid out-pointer; interprocess events must not time.
        self.check("cuEventCreate", unsafe {
            (self.event_create)(&mut e, EVENT_DISABLE_TIMING | EVENT_INTERPROCESS)
        })?;
        let mut h = IpcEventHandle([0; 64]);
        // SAFETY: `h` is a valid out-pointer of the handle's size; `e` the event made above.
        self.check("cuIpcGetEventHandle", unsafe {
            (self.ipc_get_event_handle)(&mut h, e)
        })?;
        Ok((e, h))
    }

    /// Opens another process's interprocess event ([`Driver::create_ipc_event`]) in the
    /// current context: a stream here can then wait for its records there.
    pub fn ipc_open_event(&self, h: &IpcEventHandle) -> Result<Handle> {
        let mut e = std::ptr::null_mut();
        // SAFETY: `e` is a valid out-pointer; the handle is passed by value as cuda.h declares.
        self.check("cuIpcOpenEventHandle", unsafe {
            (self.ipc_open_event_handle)(&mut e, *h)
        })?;
        Ok(e)
    }

    /// Whether `stream` is being captured into a CUDA graph (`cuStreamIsCapturing`): 0 not,
    /// 1 an active capture, 2 a capture invalidated and not yet ended.
    ///
    /// # Safety
    /// `stream` is a live stream of the current context, or a special handle.
    pub unsafe fn stream_capture_status(&self, stream: Handle) -> Result<u32> {
        let mut status: c_int = 0;
        // SAFETY: per the caller; `status` is a valid out-pointer of the enum's size.
        self.check("cuStreamIsCapturing", unsafe {
            (self.stream_is_capturing)(stream, &mut status)
        })?;
        Ok(u32::try_from(status).unwrap_or(2))
    }

    /// Sets this thread's capture interaction mode (`cuThreadExchangeStreamCaptureMode`: 0
    /// global, 1 thread-local, 2 relaxed) and returns the one it had.
    pub fn exchange_capture_mode(&self, mode: u32) -> Result<u32> {
        let mut m = c_int::try_from(mode).unwrap_or(0);
        // SAFETY: `m` is a valid in/out pointer of the enum's size.
        self.check("cuThreadExchangeStreamCaptureMode", unsafe {
            (self.thread_exchange_capture_mode)(&mut m)
        })?;
        Ok(u32::try_from(m).unwrap_or(0))
    }

    /// Runs `f` with this thread's capture interaction mode relaxed, then restores the mode:
    /// an allocation made while a capture is open in the global or thread-local mode would
    /// otherwise invalidate it. The driver still refuses calls that conflict with the capture
    /// itself (a synchronize of the capturing stream).
    pub fn capture_relaxed<T>(&self, f: impl FnOnce() -> T) -> Result<T> {
        let before = self.exchange_capture_mode(CAPTURE_MODE_RELAXED)?;
        let out = f();
        self.exchange_capture_mode(before)?;
        Ok(out)
    }

    /// Whether the work before `e`'s last record is done (`cuEventQuery`, which never blocks).
    ///
    /// # Safety
    /// `e` is a live event from [`Driver::create_event`].
    pub unsafe fn event_done(&self, e: Handle) -> Result<bool> {
        // SAFETY: per the caller.
        let status = unsafe { (self.event_query)(e) };
        if status == NOT_READY {
            return Ok(false);
        }
        self.check("cuEventQuery", status)?;
        Ok(true)
    }

    /// Queues a copy of `len` bytes from `src` to `dst` on `s`; either may be device memory of
    /// any context or host memory (unified addressing).
    ///
    /// # Safety
    /// Both ranges are valid for `len` bytes until the copy is done (an event recorded after it
    /// completes), and nothing else writes `dst` meanwhile.
    pub unsafe fn copy_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
        s: Handle,
    ) -> Result<()> {
        // SAFETY: per the caller.
        self.check("cuMemcpyAsync", unsafe {
            (self.memcpy_async)(dst, src, len, s)
        })
    }
}
