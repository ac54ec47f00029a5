//! Windows of device memory (`ncclCommWindowRegister`): registered on every rank at once, so
//! that collectives on communicators whose ranks are processes of one host can go straight
//! between the ranks' buffers (docs/CUDA.md, "Across processes: windows").

use ferroccl_kernels::DataType;

use std::ops::{Deref, DerefMut};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ferroccl_kernels::Element;

use crate::device::ipc::{self, ByProvider};
use crate::device::{DeviceBuffer, Provider};
use crate::exec::{Offered, OpContext};
use crate::wire::{kind, op};
use crate::Result;

use super::Communicator;

/// A registered window of a communicator ([`Communicator::register_window`]); give it back
/// with [`Communicator::deregister_window`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a window is given back with Communicator::deregister_window"]
pub struct Window {
    /// Its place in the communicator's list (the same on every rank); `None` where the
    /// communicator exchanges no windows.
    place: Option<usize>,
    /// The communicator it belongs to (its shared state's address).
    comm: usize,
    addr: u64,
    len: usize,
}

impl Window {
    /// Where the buffer starts.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never: a window holds a byte at least).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A device buffer registered as a window ([`Communicator::register_device_window`]): it is
/// used as the buffer (`Deref` to a view of it: replacing or swapping the view frees nothing,
/// and a buffer put in its place lies in no window), and gives the buffer back at
/// [`Communicator::deregister_device_window`]. Dropped while still registered, it keeps the
/// memory (leaked, with a warning) rather than free what other processes may still map.
#[derive(Debug)]
#[must_use = "a device window is given back with Communicator::deregister_device_window"]
pub struct DeviceWindow<T: Element> {
    /// The registered buffer, owned here until deregistration gives it back.
    owned: Option<DeviceBuffer<T>>,
    /// What the program uses: a view of `owned` (frees nothing).
    view: DeviceBuffer<T>,
    window: Option<Window>,
}

impl<T: Element> Deref for DeviceWindow<T> {
    type Target = DeviceBuffer<T>;
    fn deref(&self) -> &DeviceBuffer<T> {
        &self.view
    }
}

impl<T: Element> DerefMut for DeviceWindow<T> {
    fn deref_mut(&mut self) -> &mut DeviceBuffer<T> {
        &mut self.view
    }
}

impl<T: Element> Drop for DeviceWindow<T> {
    fn drop(&mut self) {
        if let (Some(b), Some(w)) = (self.owned.take(), self.window.take()) {
            if w.place.is_some() {
                ferroccl_transport::log_line!(
                    "ferroccl WARN DEVICE: a device window of {} bytes was dropped while still \
                     registered; its memory is kept (other processes may map it): deregister \
                     it with Communicator::deregister_device_window",
                    w.len
                );
                std::mem::forget(b);
            }
        }
    }
}

impl Communicator {
    /// Registers the `len` bytes at `addr` as a window of this communicator: a collective
    /// call (every rank registers one, in the same order; lengths may differ). Where the
    /// ranks are processes of one host with the p2p transport ([`crate::Config::device_peer`]),
    /// each rank exports the device allocation holding its buffer (CUDA IPC), every other
    /// process maps it, and later collectives whose buffers lie in windows go straight between
    /// the ranks' buffers, one reduce-copy per rank, instead of through the transport's slots.
    /// Elsewhere nothing is exchanged and the window only names the buffer. Host memory, or
    /// memory that cannot be exported (mapped piece by piece with `cuMemMap`), is accepted: its
    /// window carries no collective.
    ///
    /// # Safety
    /// The memory stays allocated until [`Communicator::deregister_window`] has returned on
    /// this rank (which it does only once every rank has unmapped it); a window never
    /// deregistered, until every rank's communicator is gone (each process unmaps the others'
    /// buffers when its communicator drops).
    pub unsafe fn register_window(&self, addr: u64, len: usize) -> Result<Window> {
        let inner = &self.inner;
        if let Some(e) = inner.failed_error() {
            return Err(e);
        }
        let comm = Arc::as_ptr(inner) as usize;
        if !inner.peer_windows {
            // Nothing is exchanged: a local name for the buffer, no turn taken.
            return Ok(Window {
                place: None,
                comm,
                addr,
                len,
            });
        }
        // Operations queued before on a stream take their turns first, on every rank.
        self.streams.drain_if_used();
        let found = self.device_of(addr, len);
        let export = match found {
            Some((p, o)) => ipc::export(p, o, addr, len)
                .map_err(|e| {
                    ferroccl_transport::log_line!(
                        "ferroccl INFO P2P: rank {}: window 0x{addr:x}..+{len} not exported: {e}",
                        inner.rank
                    )
                })
                .ok(),
            _ => None,
        };
        let mine = Offered { addr, len, export };
        let mapper = ByProvider {
            provider: found.map_or(Provider::Host, |f| f.0),
            ordinal: found.map_or(0, |f| f.1),
        };
        // The reducer whose marks the ranks share, where calls run on the buffers.
        let reducer = found.and_then(|_| self.direct_reducer());
        if found.is_some() && self.device().is_none() {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                ferroccl_transport::log_line!(
                    "ferroccl WARN P2P: rank {}: a window of device memory registered before a \
                     device was bound to the communicator (Communicator::set_device): its marks \
                     are not shared, so calls on a stream through windows wait for their \
                     streams until a later registration with the device bound (said once)",
                    inner.rank
                )
            });
        }
        let mut place = None;
        inner.execute_next(true, |e, seq| {
            place = e.register_window(
                mine,
                &mapper,
                reducer,
                &window_ctx("register_window", seq, inner.rank),
            )?;
            inner
                .windows_in_order
                .store(e.windows_in_order(), Ordering::Release);
            Ok(())
        })?;
        Ok(Window {
            place,
            comm,
            addr,
            len,
        })
    }

    /// The provider and device whose memory holds `[addr, addr + len)`: asked of the bound
    /// device's provider, or of `FERRO_DEVICE_PROVIDER`'s where none is bound, but never by
    /// loading the CUDA driver into a process that has not (host memory needs no driver).
    pub(crate) fn device_of(&self, addr: u64, len: usize) -> Option<(Provider, u32)> {
        let (provider, hint) = match self.device() {
            Some(d) => (d.provider(), d.ordinal()),
            None => (Provider::from_env().ok()?, 0),
        };
        if provider == Provider::Cuda && !crate::device::driver_in_process() {
            return None;
        }
        crate::device::Device::new(provider, hint)
            .ok()?
            .find(addr, len)
            .map(|o| (provider, o))
    }

    /// Deregisters a window of [`Communicator::register_window`]: a collective call, in the
    /// same order on every rank. It returns once every rank has unmapped it, so the buffer
    /// may be freed after.
    pub fn deregister_window(&self, w: Window) -> Result<()> {
        let inner = &self.inner;
        if w.comm != Arc::as_ptr(inner) as usize {
            return Err(crate::Error::invalid_argument(format!(
                "deregister_window on rank {}: the window (0x{:x}, {} bytes) was registered \
                 with another communicator",
                inner.rank, w.addr, w.len
            )));
        }
        let Some(place) = w.place else {
            return Ok(());
        };
        if let Some(e) = inner.failed_error() {
            return Err(e);
        }
        self.streams.drain_if_used();
        inner.execute_next(true, |e, seq| {
            let r = e.deregister_window(place, &window_ctx("deregister_window", seq, inner.rank));
            inner
                .windows_in_order
                .store(e.windows_in_order(), Ordering::Release);
            r
        })
    }

    /// Registers device buffer `buf` as a window of this communicator, as
    /// [`Communicator::register_window`] does (collective), keeping the buffer until
    /// [`Communicator::deregister_device_window`] gives it back. Where the registration fails
    /// after other ranks may have mapped the buffer, it is kept (leaked) rather than freed.
    pub fn register_device_window<T: Element>(
        &self,
        buf: DeviceBuffer<T>,
    ) -> Result<DeviceWindow<T>> {
        // SAFETY: the window owns the buffer from here on: it is freed only once deregistered
        // (`deregister_device_window`), never while registered (leaked instead).
        match unsafe { self.register_window(buf.addr(), buf.bytes().max(1)) } {
            Ok(w) => Ok(DeviceWindow {
                view: buf.alias(),
                owned: Some(buf),
                window: Some(w),
            }),
            Err(e) => {
                std::mem::forget(buf);
                Err(e)
            }
        }
    }

    /// Deregisters a window of [`Communicator::register_device_window`] (collective) and gives
    /// its buffer back. On error the buffer is kept (leaked): another process may map it still.
    pub fn deregister_device_window<T: Element>(
        &self,
        mut w: DeviceWindow<T>,
    ) -> Result<DeviceBuffer<T>> {
        let (buf, window) = (w.owned.take(), w.window.take());
        let (Some(buf), Some(window)) = (buf, window) else {
            return Err(crate::Error::internal("a device window without its buffer"));
        };
        match self.deregister_window(window) {
            Ok(()) => Ok(buf),
            Err(e) => {
                std::mem::forget(buf);
                Err(e)
            }
        }
    }

    /// Whether this communicator exchanges windows at registration (its ranks are processes
    /// of one host, with the p2p transport, up to 8): the same on every rank.
    pub fn exchanges_windows(&self) -> bool {
        self.inner.peer_windows
    }
}

pub(super) fn window_ctx(name: &'static str, seq: u64, rank: usize) -> OpContext {
    OpContext {
        name,
        seq,
        rank,
        kind: kind::WINDOW,
        dtype: DataType::Uint64,
        op: op::NONE,
        count: 0,
        root: u32::MAX,
    }
}
