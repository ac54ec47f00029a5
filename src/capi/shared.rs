//! ferroccl's additions to the C API (`include/ferroccl.h`): host memory in shared memory.
//! Host buffers (NULL stream) that lie in a block from `ferrocclMemAllocShared` are read by
//! ranks on the same host straight from the block instead of through the shared-memory
//! transport's rings (see [`crate::SharedBuf`], which holds the same memory for Rust).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{LazyLock, Mutex};

use ferroccl_transport_shm::SharedMem;

use super::api::{check_out, lock};
use super::error::guard;
use super::types::*;
use crate::Error;

/// Blocks from `ferrocclMemAllocShared` not yet freed, by address.
static BLOCKS: LazyLock<Mutex<HashMap<usize, SharedMem>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

nccl_api! {
    /// Allocates `size` zero-filled bytes of host memory in shared memory.
    fn ferrocclMemAllocShared / pferrocclMemAllocShared(
        ptr: *mut *mut c_void,
        size: usize,
    ) -> ncclResult_t {
        const API: &str = "ferrocclMemAllocShared";
        guard(API, || {
            check_out(API, "ptr", ptr)?;
            if size == 0 {
                return Err(Error::invalid_argument(format!("{API}: size is 0")));
            }
            let mut mem = SharedMem::new(size).map_err(|e| e.context(API))?;
            let p = mem.as_mut_slice().as_mut_ptr();
            lock(&BLOCKS).insert(p as usize, mem);
            // SAFETY: checked non-NULL; writable by the caller's contract.
            unsafe { ptr.write(p.cast()) };
            Ok(ncclSuccess)
        })
    }
}

nccl_api! {
    /// Frees a block from `ferrocclMemAllocShared` (NULL: nothing).
    fn ferrocclMemFreeShared / pferrocclMemFreeShared(ptr: *mut c_void) -> ncclResult_t {
        const API: &str = "ferrocclMemFreeShared";
        guard(API, || {
            if ptr.is_null() {
                return Ok(ncclSuccess);
            }
            match lock(&BLOCKS).remove(&(ptr as usize)) {
                Some(_) => Ok(ncclSuccess),
                None => Err(Error::invalid_argument(format!(
                    "{API}: {ptr:p} was not allocated by ferrocclMemAllocShared (or was \
                     already freed)"
                ))),
            }
        })
    }
}
