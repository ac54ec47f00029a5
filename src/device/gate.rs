//! Ordering host work against a caller's stream without blocking the caller: a [`Gate`] is an
//! event recorded on the stream (the host waits for the work queued before it), and a
//! [`Flag`] is a 32-bit counter in host-mapped pinned memory that the stream waits on
//! ([`Device::wait_flag`]) until the host stores a value at least as large.
//!
//! With the `cuda` provider these are `cuEventRecord` / `cuEventSynchronize`,
//! `cuMemHostAlloc(DEVICEMAP)` and `cuStreamWaitValue32` (built, not yet run on a GPU); with
//! the host stand-in, positions in and wait entries of its stream model (`host_stream`).

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use ferroccl_cuda::driver::{driver, Handle};
use ferroccl_cuda::mem_ops::mem_ops;

use super::{cuda, host_stream, Device, Provider};
use crate::{Error, Result};

/// The point of a caller's stream where it was recorded: waiting for it waits for the work
/// queued on the stream before it.
#[derive(Debug)]
pub(crate) struct Gate {
    device: Device,
    at: GateAt,
}

#[derive(Debug)]
enum GateAt {
    /// A `CUevent` of the device's primary context, destroyed on drop.
    Cuda(Handle),
    /// A stand-in stream and a position in it.
    Host { stream: usize, position: u64 },
}

// SAFETY: a CUevent may be waited for and destroyed from any thread once its context is made
// current there (every use binds it); the handle is owned by this value alone.
unsafe impl Send for Gate {}

impl Gate {
    /// Waits until the work queued on the stream before the gate has run.
    pub(crate) fn wait(&self) -> Result<()> {
        match self.at {
            GateAt::Cuda(e) => {
                let d = cuda::bound(self.device.ordinal)?;
                // SAFETY: an event created and recorded in `Device::record_gate`, live until
                // this value drops.
                unsafe { d.sync_event(e) }.map_err(|e| cuda::convert(&e))
            }
            GateAt::Host { stream, position } => host_stream::run_to(stream, position),
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        if let GateAt::Cuda(e) = self.at {
            if let Ok(d) = cuda::bound(self.device.ordinal) {
                // SAFETY: created in `record_gate`, destroyed once here; the driver defers
                // the release until the recorded work is done.
                let _ = unsafe { d.destroy_event(e) };
            }
        }
    }
}

/// A 32-bit completion counter the host writes and a device stream waits on.
#[derive(Debug)]
pub(crate) struct Flag {
    device: Device,
    mem: FlagMem,
    /// Per stream waited on, a gate recorded after its last wait: before the pinned memory is
    /// freed, these are waited for, so no stream still waits on freed memory.
    passed: Mutex<Vec<(usize, Gate)>>,
}

#[derive(Debug)]
enum FlagMem {
    /// Pinned, device-mapped host memory: its host and device addresses.
    Cuda { host: *mut u8, dev: u64 },
    /// The stand-in: a shared counter its stream entries hold on to.
    Host(Arc<AtomicU32>),
}

// SAFETY: the pinned word is only touched through atomic operations (host) and by the device;
// it is owned by this value and freed once, on drop.
unsafe impl Send for Flag {}
// SAFETY: as above; `&Flag` only loads and stores atomically.
unsafe impl Sync for Flag {}

impl Flag {
    fn atomic(&self) -> &AtomicU32 {
        match &self.mem {
            // SAFETY: `host` is 4 live, 4-byte-aligned bytes of pinned memory (page aligned),
            // only accessed atomically by the host while this value lives.
            FlagMem::Cuda { host, .. } => unsafe { AtomicU32::from_ptr(host.cast()) },
            FlagMem::Host(a) => a,
        }
    }

    /// Stores `v` with release ordering: the work done before it is visible to whoever sees it.
    pub(crate) fn release(&self, v: u32) {
        self.atomic().store(v, Ordering::Release);
    }

    /// The current value.
    #[cfg(test)]
    pub(crate) fn value(&self) -> u32 {
        self.atomic().load(Ordering::Acquire)
    }
}

impl Drop for Flag {
    fn drop(&mut self) {
        let passed = std::mem::take(self.passed.get_mut().unwrap_or_else(|p| p.into_inner()));
        for (_, g) in passed {
            if let Err(e) = g.wait() {
                ferroccl_transport::log_line!(
                    "ferroccl WARN DEVICE: waiting for a stream to pass a completion flag: {e}"
                );
            }
        }
        if let FlagMem::Cuda { host, .. } = self.mem {
            // SAFETY: allocated by `Device::alloc_flag`, freed once; every stream that waited
            // on it has passed its wait (the gates above).
            let r = unsafe { cuda::free_pinned(self.device.ordinal, host) };
            if let Err(e) = r {
                ferroccl_transport::log_line!("ferroccl WARN DEVICE: freeing a flag: {e}");
            }
        }
    }
}

impl Device {
    /// Whether a caller's stream of this device can wait on a [`Flag`]: the host stand-in
    /// always; CUDA when the driver has the memory-op calls and the device maps host memory.
    pub(crate) fn stream_waits_supported(self) -> bool {
        match self.provider {
            Provider::Host => true,
            Provider::Cuda => cuda::bound(self.ordinal).is_ok_and(|d| {
                d.device(self.ordinal)
                    .is_ok_and(|dev| mem_ops(d).supported(d, dev))
            }),
        }
    }

    /// A new [`Flag`] holding 0.
    pub(crate) fn alloc_flag(self) -> Result<Flag> {
        let mem = match self.provider {
            Provider::Host => FlagMem::Host(Arc::new(AtomicU32::new(0))),
            Provider::Cuda => {
                let d = cuda::bound(self.ordinal)?;
                let (host, dev) = mem_ops(d)
                    .alloc_mapped(d, 4)
                    .map_err(|e| cuda::convert(&e))?;
                // SAFETY: 4 fresh bytes of pinned memory, page aligned, not shared yet.
                unsafe { host.cast::<u32>().write(0) };
                FlagMem::Cuda { host, dev }
            }
        };
        Ok(Flag {
            device: self,
            mem,
            passed: Mutex::new(Vec::new()),
        })
    }

    /// Records a [`Gate`] at the current end of the caller's `stream`.
    ///
    /// # Safety
    /// With `Cuda`, `stream` is a live stream of this device's primary context, or one of the
    /// special handles `cudaStreamLegacy` (1) and `cudaStreamPerThread` (2).
    pub(crate) unsafe fn record_gate(self, stream: *mut c_void) -> Result<Gate> {
        let at = match self.provider {
            Provider::Host => GateAt::Host {
                stream: stream as usize,
                position: host_stream::record(stream as usize),
            },
            Provider::Cuda => {
                let d = cuda::bound(self.ordinal)?;
                let e = d.create_event().map_err(|e| cuda::convert(&e))?;
                // SAFETY: `e` was just created in the bound context; the stream per the caller.
                if let Err(err) = unsafe { d.record_event(e, stream) } {
                    // SAFETY: created above, unused, destroyed once.
                    let _ = unsafe { d.destroy_event(e) };
                    return Err(cuda::convert(&err));
                }
                GateAt::Cuda(e)
            }
        };
        Ok(Gate { device: self, at })
    }

    /// Queues on the caller's `stream` a wait until `flag` reaches `value` (wrapping
    /// comparison), then records the point after it in `flag`, which waits for it before its
    /// memory is freed.
    ///
    /// # Safety
    /// As for [`Device::record_gate`]; `flag` belongs to this device.
    pub(crate) unsafe fn wait_flag(
        self,
        stream: *mut c_void,
        flag: &Flag,
        value: u32,
    ) -> Result<()> {
        if flag.device != self {
            return Err(Error::internal(format!(
                "a completion flag of {} waited on from a stream of {self}",
                flag.device
            )));
        }
        match &flag.mem {
            FlagMem::Host(a) => host_stream::wait_flag(stream as usize, Arc::clone(a), value),
            FlagMem::Cuda { dev, .. } => {
                let d = cuda::bound(self.ordinal)?;
                // SAFETY: the stream per the caller; `dev` maps the flag's pinned word, which
                // stays allocated until the stream has passed this wait (the gate below).
                unsafe { mem_ops(d).wait_value32(d, stream, *dev, value) }
                    .map_err(|e| cuda::convert(&e))?;
            }
        }
        if let Provider::Cuda = self.provider {
            // SAFETY: as above.
            let g = unsafe { self.record_gate(stream) }?;
            let key = stream as usize;
            let mut passed = flag.passed.lock().unwrap_or_else(|p| p.into_inner());
            passed.retain(|(s, _)| *s != key);
            passed.push((key, g));
        }
        Ok(())
    }

    /// Queues a copy of `len` bytes from `src` to `dst` on the caller's `stream` (either may
    /// be host or device memory).
    ///
    /// # Safety
    /// Both ranges stay valid for `len` bytes until the stream has run the copy; with `Cuda`,
    /// the stream as for [`Device::record_gate`].
    pub(crate) unsafe fn copy_on_stream(
        self,
        stream: *mut c_void,
        dst: *mut u8,
        src: *const u8,
        len: usize,
    ) -> Result<()> {
        match self.provider {
            // SAFETY: per the caller.
            Provider::Host => unsafe { host_stream::copy(stream as usize, dst, src, len) },
            Provider::Cuda => {
                let d = cuda::bound(self.ordinal)?;
                // SAFETY: per the caller; unified addressing names host and device memory.
                unsafe { d.copy_async(dst as u64, src as u64, len, stream) }
                    .map_err(|e| cuda::convert(&e))?;
            }
        }
        Ok(())
    }
}

impl Device {
    /// Makes, on the caller's thread, what [`Device::read_private`] and
    /// [`Device::write_private`] use, so that a stream job's thread creates no stream.
    pub(crate) fn prepare_private(self) -> Result<()> {
        match self.provider {
            Provider::Host => Ok(()),
            Provider::Cuda => cuda::prepare_private(self.ordinal),
        }
    }

    /// Copies `dst.len()` bytes of device memory at `addr` to `dst` on the process's private
    /// non-blocking stream of the device (not the legacy stream, which would wait for a
    /// caller's stream that is itself waiting on a completion flag); returns when done.
    ///
    /// # Safety
    /// As for [`Device::read_raw`].
    pub(crate) unsafe fn read_private(self, addr: u64, dst: &mut [u8]) -> Result<()> {
        match self.provider {
            // SAFETY: per the caller.
            Provider::Host => unsafe { self.read_raw(addr, dst) },
            // SAFETY: per the caller.
            Provider::Cuda => unsafe { cuda::download(self.ordinal, dst, addr) },
        }
    }

    /// Copies `src` to device memory at `addr` on a private non-blocking stream (see
    /// [`Device::read_private`]); returns when done.
    ///
    /// # Safety
    /// As for [`Device::write_raw`].
    pub(crate) unsafe fn write_private(self, addr: u64, src: &[u8]) -> Result<()> {
        match self.provider {
            // SAFETY: per the caller.
            Provider::Host => unsafe { self.write_raw(addr, src) },
            // SAFETY: per the caller.
            Provider::Cuda => unsafe { cuda::upload(self.ordinal, addr, src) },
        }
    }
}

/// The driver's answer to which wait call it has, for logs (`None` without a driver).
pub(crate) fn cuda_wait_call() -> Option<&'static str> {
    driver().ok().and_then(|d| mem_ops(d).wait_call())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stand_in_stream_waits_for_the_flag_and_gates_see_earlier_work() {
        let dev = Device::new(Provider::Host, 0).unwrap();
        let s = std::ptr::without_provenance_mut::<c_void>(0x5EED);
        let flag = dev.alloc_flag().unwrap();
        assert!(dev.stream_waits_supported());
        let src = [3u8; 8];
        let mut dst = [0u8; 8];
        // SAFETY: stand-in streams need no live handle; the arrays outlive the waits below.
        let gate = unsafe {
            dev.copy_on_stream(s, dst.as_mut_ptr(), src.as_ptr(), 4)
                .unwrap();
            let g = dev.record_gate(s).unwrap();
            dev.wait_flag(s, &flag, 1).unwrap();
            dev.copy_on_stream(s, dst.as_mut_ptr().add(4), src.as_ptr(), 4)
                .unwrap();
            g
        };
        gate.wait().unwrap();
        assert_eq!(
            dst,
            [3, 3, 3, 3, 0, 0, 0, 0],
            "the gate ran what came before it"
        );
        flag.release(1);
        assert_eq!(flag.value(), 1);
        // SAFETY: as above.
        unsafe { dev.sync_stream(s) }.unwrap();
        assert_eq!(dst, [3; 8]);
    }

    #[test]
    fn without_a_driver_cuda_streams_cannot_wait_and_say_so() {
        if driver().is_ok() {
            return; // a machine with a driver: nothing to check here
        }
        // A device value made directly: `Device::new` would refuse the missing driver first.
        let dev = Device {
            provider: Provider::Cuda,
            ordinal: 0,
        };
        assert!(!dev.stream_waits_supported());
        let e = dev.alloc_flag().unwrap_err();
        assert!(e.to_string().contains("NVIDIA driver"), "{e}");
        // SAFETY: without a driver nothing is called with the handle.
        let e = unsafe { dev.record_gate(std::ptr::without_provenance_mut(1)) }.unwrap_err();
        assert!(e.to_string().contains("NVIDIA driver"), "{e}");
        assert_eq!(cuda_wait_call(), None);
    }
}
