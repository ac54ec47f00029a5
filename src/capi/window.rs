//! Memory windows (`ncclCommWindowRegister`, NCCL 2.27+): collective, as NCCL's. A host buffer
//! is registered with every connection of a communicator through the transport seam
//! (`Connection::register`): shared memory and TCP copy through their own buffers and need no
//! registration, so on them a window holds no region; a transport that moves bytes straight
//! into registered memory gets its regions made here and kept until the window is
//! deregistered. Every buffer is also registered with the communicator
//! ([`crate::Communicator::register_window`]): where its ranks are processes of one host with
//! the p2p transport, device buffers are exchanged (CUDA IPC) so that collectives on them go
//! straight between the ranks' buffers.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};

use super::api::{check_out, lock, put};
use super::comm::lookup;
use super::error::guard;
use super::types::*;
use crate::{Error, Result};

/// One registered window.
#[derive(Debug)]
struct Window {
    /// The communicator handle it was registered with.
    comm: usize,
    addr: usize,
    /// The communicator's registration, given back at deregistration.
    registered: crate::comm::Window,
    /// Registrations of the transports that need them; dropping them releases them.
    _regions: Vec<ferroccl_transport::Region>,
    /// The handle C holds (its address is the key).
    _handle: Box<ncclWindow_vidmem>,
}

static WINDOWS: LazyLock<Mutex<HashMap<usize, Window>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
static SERIAL: AtomicU64 = AtomicU64::new(1);

/// Drops every window of `comm` (when it is destroyed or aborted).
pub(crate) fn forget_comm(comm: ncclComm_t) {
    lock(&WINDOWS).retain(|_, w| w.comm != comm as usize);
}

/// Refuses a window's registration or deregistration inside `ncclGroupStart`/`ncclGroupEnd`
/// where it is an exchange between the ranks (processes of one host with p2p): it runs at
/// once, so one thread driving several ranks' communicators in a group would wait in the
/// first for ranks it has yet to reach.
fn exchange_allowed(api: &str, c: &crate::Communicator) -> Result<()> {
    if super::group::in_group() && c.exchanges_windows() {
        return Err(Error::invalid_usage(format!(
            "{api} inside ncclGroupStart/ncclGroupEnd: on this communicator (ranks that are \
             processes of one host, with the p2p transport) a window is exchanged between the \
             ranks at once; call it outside the group"
        )));
    }
    Ok(())
}

fn window_of(api: &str, comm: ncclComm_t, win: ncclWindow_t) -> Result<usize> {
    let windows = lock(&WINDOWS);
    match windows.get(&(win as usize)) {
        Some(w) if w.comm == comm as usize => Ok(w.addr),
        Some(_) => Err(Error::invalid_argument(format!(
            "{api}: window {win:p} was registered with another communicator"
        ))),
        None => Err(Error::invalid_argument(format!(
            "{api}: window {win:p} is not a registered window (never registered, or already \
             deregistered)"
        ))),
    }
}

nccl_api! {
    /// Registers `size` bytes at `buff` as a window of `comm` (`winFlags`: `NCCL_WIN_*`).
    fn ncclCommWindowRegister / pncclCommWindowRegister(
        comm: ncclComm_t,
        buff: *mut c_void,
        size: usize,
        win: *mut ncclWindow_t,
        win_flags: c_int,
    ) -> ncclResult_t {
        const API: &str = "ncclCommWindowRegister";
        guard(API, || {
            let shared = lookup(API, comm)?;
            check_out(API, "win", win)?;
            if buff.is_null() || size == 0 {
                return Err(Error::invalid_argument(format!(
                    "{API}: buff {buff:p} with size {size}: a window needs a non-NULL buffer of at least one byte"
                )));
            }
            if win_flags & !NCCL_WIN_KNOWN_FLAGS != 0 {
                return Err(Error::invalid_argument(format!(
                    "{API}: invalid winFlags {win_flags:#x} (known: NCCL_WIN_* = {NCCL_WIN_KNOWN_FLAGS:#x})"
                )));
            }
            let c = shared.wait_ready().map_err(|e| e.context(API))?;
            exchange_allowed(API, &c)?;
            // Work issued before (background work of a non-blocking communicator, stream
            // jobs) takes its turns first, on every rank alike.
            shared.wait_idle();
            // Device memory, asked without loading the CUDA driver into a host-only program.
            let found = c.device_of(buff as u64, size);
            let device = found.is_some();
            // The communicator's device (NCCL binds it at init; here a call binds it at its
            // first use), bound before the exchange: the ranks share the marks of its
            // reducer at registration, without which calls on a stream through windows block.
            if let (Some((provider, ordinal)), None) = (found, c.device()) {
                if c_int::try_from(ordinal).ok() == Some(shared.cu_device) {
                    let dev = crate::device::Device::new(provider, ordinal).map_err(|e| e.context(API))?;
                    c.set_device(dev).map_err(|e| e.context(API))?;
                }
            }
            // SAFETY: NCCL's contract: the buffer stays allocated until the window is
            // deregistered, which returns once every rank has unmapped it.
            let registered = unsafe { c.register_window(buff as u64, size) }.map_err(|e| e.context(API))?;
            let regions = match device {
                true => Vec::new(),
                false => c.register_host(buff.cast_const().cast(), size).map_err(|e| e.context(API))?,
            };
            let mut handle = Box::new(ncclWindow_vidmem { _serial: SERIAL.fetch_add(1, Ordering::Relaxed) });
            let h: ncclWindow_t = &mut *handle;
            lock(&WINDOWS).insert(h as usize, Window {
                comm: comm as usize,
                addr: buff as usize,
                registered,
                _regions: regions,
                _handle: handle,
            });
            // SAFETY: checked non-NULL; writable by the caller's contract.
            unsafe { put(API, "win", win, h) }?;
            Ok(ncclSuccess)
        })
    }
}

nccl_api! {
    /// Releases a window of `comm`.
    fn ncclCommWindowDeregister / pncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
        const API: &str = "ncclCommWindowDeregister";
        guard(API, || {
            let shared = lookup(API, comm)?;
            window_of(API, comm, win)?;
            let c = shared.wait_ready().map_err(|e| e.context(API))?;
            exchange_allowed(API, &c)?;
            shared.wait_idle();
            let w = lock(&WINDOWS).remove(&(win as usize));
            if let Some(w) = w {
                c.deregister_window(w.registered).map_err(|e| e.context(API))?;
            }
            Ok(ncclSuccess)
        })
    }
}

nccl_api! {
    /// Writes the buffer address a window was registered with.
    fn ncclWinGetUserPtr / pncclWinGetUserPtr(comm: ncclComm_t, win: ncclWindow_t, out_user_ptr: *mut *mut c_void) -> ncclResult_t {
        const API: &str = "ncclWinGetUserPtr";
        guard(API, || {
            lookup(API, comm)?;
            let addr = window_of(API, comm, win)?;
            // SAFETY: the caller passes NULL or a writable pointer. The address is the
            // caller's own buffer, handed back unchanged.
            unsafe { put(API, "outUserPtr", out_user_ptr, std::ptr::with_exposed_provenance_mut(addr)) }?;
            Ok(ncclSuccess)
        })
    }
}
