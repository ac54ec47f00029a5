//! Graph-owned user objects: what a call recorded into a CUDA graph uses (its pinned arena,
//! its host function) is handed to the graph being captured as a user object
//! (`cuUserObjectCreate`, `cuGraphRetainUserObject`), whose destructor the driver calls once
//! the graph, every executable graph made from it and every launch of those are gone. That is
//! how NCCL ties its recorded calls' memory to their graphs.
//!
//! The calls are bound on first use, not when the driver loads (CUDA 11.3 added them; CUDA 13
//! renamed the capture query): a driver without them serves everything else, and
//! [`UserObjects::retain_in_capture`] then says so, so the caller keeps the memory as long as
//! it would otherwise. `cuStreamGetCaptureInfo_v3` (CUDA 12.3 and later) is taken where the
//! driver exports it, else `cuStreamGetCaptureInfo_v2`: the graph is the fourth parameter of
//! both.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::OnceLock;

use crate::driver::{Driver, Handle, HostFn};
use crate::error::{CudaError, CudaErrorKind, Result};

/// `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`, the one flag `cuUserObjectCreate` takes.
pub const USER_OBJECT_NO_DESTRUCTOR_SYNC: c_uint = 1;
/// `CU_GRAPH_USER_OBJECT_MOVE`: the caller's reference moves to the graph.
pub const GRAPH_USER_OBJECT_MOVE: c_uint = 1;
/// `CU_STREAM_CAPTURE_STATUS_ACTIVE`.
const CAPTURE_ACTIVE: c_int = 1;

type Status = c_int;
type InfoV2 = unsafe extern "C" fn(
    Handle,
    *mut c_int,
    *mut u64,
    *mut Handle,
    *mut *const Handle,
    *mut usize,
) -> Status;
type InfoV3 = unsafe extern "C" fn(
    Handle,
    *mut c_int,
    *mut u64,
    *mut Handle,
    *mut *const Handle,
    *mut *const c_void,
    *mut usize,
) -> Status;
type Create = unsafe extern "C" fn(*mut Handle, *mut c_void, HostFn, c_uint, c_uint) -> Status;
type Retain = unsafe extern "C" fn(Handle, Handle, c_uint, c_uint) -> Status;

/// The capture query of the loaded driver.
#[derive(Debug, Clone, Copy)]
enum Info {
    V3(InfoV3),
    V2(InfoV2),
}

/// The user-object calls of the loaded driver, each `None` when the driver lacks it.
#[derive(Debug)]
pub struct UserObjects {
    info: Option<Info>,
    create: Option<Create>,
    retain: Option<Retain>,
}

/// The user-object calls of `d` (bound once per process).
pub fn user_objects(d: &Driver) -> &'static UserObjects {
    static CALLS: OnceLock<UserObjects> = OnceLock::new();
    CALLS.get_or_init(|| {
        let lib = d.library();
        // SAFETY: each type is the C signature of the named driver function (cuda.h):
        // cuStreamGetCaptureInfo_v3(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *,
        // const CUgraphNode **, const CUgraphEdgeData **, size_t *); _v2 the same without the
        // edge data; cuUserObjectCreate(CUuserObject *, void *, CUhostFn, unsigned int,
        // unsigned int); cuGraphRetainUserObject(CUgraph, CUuserObject, unsigned int,
        // unsigned int).
        unsafe {
            let info = lib
                .function::<InfoV3>("cuStreamGetCaptureInfo_v3")
                .map(Info::V3)
                .or_else(|_| {
                    lib.function::<InfoV2>("cuStreamGetCaptureInfo_v2")
                        .map(Info::V2)
                })
                .ok();
            UserObjects {
                info,
                create: lib.function("cuUserObjectCreate").ok(),
                retain: lib.function("cuGraphRetainUserObject").ok(),
            }
        }
    })
}

impl UserObjects {
    /// Hands `data` to the graph being captured on `stream`: the driver calls
    /// `destroy(data)` once, on a thread of its own, when that graph, every executable graph
    /// made from it and their launches are gone. `Ok(false)`, and `destroy` never called,
    /// where the driver lacks the calls or could not make the object; an error where the
    /// stream is not in an active capture.
    ///
    /// # Safety
    /// `stream` is a live stream of the current context; `destroy` makes no CUDA call and
    /// `data` stays valid until it is called.
    pub unsafe fn retain_in_capture(
        &self,
        d: &Driver,
        stream: Handle,
        destroy: HostFn,
        data: *mut c_void,
    ) -> Result<bool> {
        let (Some(info), Some(create), Some(retain)) = (self.info, self.create, self.retain) else {
            return Ok(false);
        };
        let mut status: c_int = 0;
        let mut graph: Handle = std::ptr::null_mut();
        let (id, deps, edges, ndeps) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        // SAFETY: per the caller; the out-pointers are valid, the optional ones NULL.
        let r = unsafe {
            match info {
                Info::V3(f) => f(stream, &mut status, id, &mut graph, deps, edges, ndeps),
                Info::V2(f) => f(stream, &mut status, id, &mut graph, deps, ndeps),
            }
        };
        d.check("cuStreamGetCaptureInfo", r)?;
        if status != CAPTURE_ACTIVE || graph.is_null() {
            return Err(CudaError::new(
                CudaErrorKind::Driver,
                format!("cuStreamGetCaptureInfo: stream {stream:p} is not in an active capture (status {status})"),
            ));
        }
        let mut obj: Handle = std::ptr::null_mut();
        // SAFETY: `obj` is a valid out-pointer; `destroy` and `data` per the caller; one
        // reference, the caller's, moved to the graph below.
        let r = unsafe { create(&mut obj, data, destroy, 1, USER_OBJECT_NO_DESTRUCTOR_SYNC) };
        if r != 0 {
            return Ok(false);
        }
        // SAFETY: `graph` is the capture's graph (live while the capture is), `obj` the
        // object just made, whose one reference moves to it.
        let r = unsafe { retain(graph, obj, 1, GRAPH_USER_OBJECT_MOVE) };
        // Where the graph did not take it, the object is left with its reference (never
        // destroyed): releasing it would call `destroy` while the graph may hold the work.
        Ok(r == 0)
    }
}
