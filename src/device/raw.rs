//! Device memory named by raw addresses, for code outside Rust (the C ABI, the perf tools):
//! the device a thread works on, allocations that are not [`DeviceBuffer`]s, borrowed views of
//! them, and streams handed in by the caller.
//!
//! With the `cuda` provider these are driver calls (`cuCtxGetDevice`, `cuMemAlloc`,
//! `cuStreamSynchronize`, ...); with the host stand-in, the stand-in's registry and `memcpy`,
//! and any non-NULL stream handle is a stand-in stream with nothing queued on it (the stand-in
//! runs no kernels, so there is no earlier work to wait for).

use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::marker::PhantomData;

use ferroccl_kernels::Element;

use super::{cuda, host, Device, DeviceBuffer, Provider};
use crate::{Error, Result};

/// The environment variable naming the host stand-in's current device (default 0).
pub const DEVICE_ENV: &str = "FERRO_DEVICE";

impl Provider {
    /// The device this thread works on. `Cuda`: the device of the current context
    /// (`cuCtxGetDevice`, what a CUDA runtime program chose with `cudaSetDevice`), 0 when no
    /// context is current or there is no driver (a call that needs the device then reports
    /// the driver's error). `Host`: `FERRO_DEVICE` when it holds a device number, else 0.
    pub fn current_device(self) -> u32 {
        match self {
            Provider::Cuda => ferroccl_cuda::driver::driver()
                .ok()
                .and_then(|d| d.current_device().ok())
                .and_then(|d| u32::try_from(d).ok())
                .unwrap_or(0),
            Provider::Host => std::env::var(DEVICE_ENV)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0),
        }
    }
}

impl Device {
    /// Allocates `bytes` of device memory not owned by a [`DeviceBuffer`] (for `ncclMemAlloc`);
    /// free it with [`Device::free_raw`]. The host stand-in's memory is zeroed and, being heap
    /// memory, host-addressable (a real device's is not).
    pub fn alloc_raw(self, bytes: usize) -> Result<u64> {
        match self.provider {
            Provider::Cuda => cuda::alloc(self.ordinal, bytes),
            Provider::Host => host::alloc(self.ordinal, bytes),
        }
    }

    /// Frees memory from [`Device::alloc_raw`].
    ///
    /// # Safety
    /// `addr` came from `alloc_raw` on this device, is freed once, and no work still uses it.
    pub unsafe fn free_raw(self, addr: u64) -> Result<()> {
        match self.provider {
            // SAFETY: per the caller.
            Provider::Cuda => unsafe { cuda::free(self.ordinal, addr) },
            // SAFETY: per the caller.
            Provider::Host => unsafe { host::free(addr) },
        }
    }

    /// Copies `dst.len()` bytes of device memory at `addr` to `dst`; returns when done.
    ///
    /// # Safety
    /// `[addr, addr + dst.len())` is live device memory of this device, not written meanwhile.
    pub unsafe fn read_raw(self, addr: u64, dst: &mut [u8]) -> Result<()> {
        match self.provider {
            // SAFETY: per the caller.
            Provider::Cuda => unsafe { cuda::download(self.ordinal, dst, addr) },
            Provider::Host => {
                // SAFETY: per the caller the range is a live stand-in allocation (heap memory);
                // `dst` is a distinct, exclusively borrowed host slice.
                unsafe {
                    std::ptr::copy_nonoverlapping(addr as *const u8, dst.as_mut_ptr(), dst.len())
                };
                Ok(())
            }
        }
    }

    /// Waits until the work queued on the caller's `stream` (a `CUstream` / `cudaStream_t` of
    /// this device) has run: `cuStreamSynchronize`. The host stand-in has nothing to wait for.
    ///
    /// # Safety
    /// With `Cuda`, `stream` is a live stream of this device's primary context, or one of the
    /// special handles `cudaStreamLegacy` (1) and `cudaStreamPerThread` (2).
    pub unsafe fn sync_stream(self, stream: *mut c_void) -> Result<()> {
        match self.provider {
            // SAFETY: per the caller.
            Provider::Cuda => unsafe { cuda::sync_foreign_stream(self.ordinal, stream) },
            Provider::Host => Ok(()),
        }
    }

    /// The device's PCI bus id (`0000:3b:00.0`); the host stand-in has none and says so.
    pub fn pci_bus_id(self) -> Result<String> {
        match self.provider {
            Provider::Cuda => cuda::pci_bus_id(self.ordinal),
            Provider::Host => Ok("none (host stand-in)".to_string()),
        }
    }

    /// The device's name (`NVIDIA H100 80GB HBM3`; `host stand-in device 0`).
    pub fn name(self) -> Result<String> {
        match self.provider {
            Provider::Cuda => cuda::name(self.ordinal),
            Provider::Host => Ok(self.to_string()),
        }
    }
}

impl<T: Element> DeviceBuffer<T> {
    /// A view of `len` elements of device memory at `addr` that it does not own: dropping the
    /// `ManuallyDrop` frees nothing (never call `ManuallyDrop::drop` on it).
    ///
    /// # Safety
    /// `[addr, addr + len × size)` is device memory of `device`, live and not used by anything
    /// else (another view included, unless both only read) while the view is used.
    pub unsafe fn view(device: Device, addr: u64, len: usize) -> Result<ManuallyDrop<Self>> {
        len.checked_mul(T::DTYPE.size()).ok_or_else(|| {
            Error::invalid_argument(format!("device view of {len} x {} overflows", T::DTYPE))
        })?;
        Ok(ManuallyDrop::new(DeviceBuffer {
            device,
            addr,
            len,
            _elems: PhantomData,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_memory_round_trips_through_views_on_the_stand_in() {
        let dev = Device::new(Provider::Host, 2).unwrap();
        let addr = dev.alloc_raw(16).unwrap();
        assert_eq!(Provider::Host.locate(addr, 16), Some(2));
        {
            // SAFETY: 16 live bytes of the stand-in device 2, used by this view alone.
            let mut v = unsafe { DeviceBuffer::<u32>::view(dev, addr, 4) }.unwrap();
            v.copy_from_host(&[1, 2, 3, 4]).unwrap();
        }
        let mut b = [0u8; 4];
        // SAFETY: the first 4 bytes of the allocation, live.
        unsafe { dev.read_raw(addr + 4, &mut b) }.unwrap();
        assert_eq!(u32::from_ne_bytes(b), 2);
        // SAFETY: stand-in streams need no live handle.
        unsafe { dev.sync_stream(std::ptr::without_provenance_mut(1)) }.unwrap();
        assert_eq!(Provider::Host.locate(addr, 16), Some(2), "a view frees nothing");
        // SAFETY: allocated above, freed once, nothing uses it.
        unsafe { dev.free_raw(addr) }.unwrap();
        assert_eq!(Provider::Host.locate(addr, 16), None);
        assert_eq!(dev.name().unwrap(), "host stand-in device 2");
    }
}
