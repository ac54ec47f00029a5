//! [`DeviceStream`]: a stream of a [`Device`] that stream-ordered collectives
//! (`Communicator::all_reduce_device_on` and friends) are ordered on.
//!
//! With the `cuda` provider it is a non-blocking `CUstream` of the device's primary context
//! (made by [`DeviceStream::new`], or the caller's own one wrapped by
//! [`DeviceStream::from_raw`]); built, not yet run on a GPU. With the host stand-in it is the
//! stand-in's model of a stream: a FIFO that runs when it is waited for
//! ([`DeviceStream::synchronize`]), so a test sees what a GPU stream would have done by then.

use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::{cuda, host_stream, Device, Provider};
use crate::Result;

/// Stand-in stream numbers handed out by [`DeviceStream::new`]: far from the small numbers
/// tests and the special CUDA handles (1, 2) use.
static NEXT_HOST_STREAM: AtomicUsize = AtomicUsize::new(0x5_7000_0000);

/// A new stand-in stream handle, distinct from every other of this process.
pub(crate) fn next_host_handle() -> usize {
    NEXT_HOST_STREAM.fetch_add(1, Ordering::Relaxed)
}

/// A stream of a [`Device`]: work queued on it runs in order.
///
/// Dropping a stream made by [`DeviceStream::new`] synchronizes and destroys it on CUDA (so it
/// waits for the stream-ordered collectives queued on it) and forgets it on the stand-in; a
/// caller's stream ([`DeviceStream::from_raw`]) is left alone.
///
/// ```
/// use ferroccl::device::{Device, DeviceStream, Provider};
///
/// let dev = Device::new(Provider::Host, 0).unwrap();
/// let s = DeviceStream::new(dev).unwrap();
/// s.synchronize().unwrap();
/// assert_eq!(s.device(), dev);
/// ```
pub struct DeviceStream {
    device: Device,
    raw: usize,
    owned: Owned,
}

enum Owned {
    /// Made by [`DeviceStream::new`] on CUDA: destroyed (after a synchronize) on drop.
    Cuda(#[allow(dead_code)] Mutex<cuda::Stream>),
    /// Made by [`DeviceStream::new`] on the stand-in: forgotten on drop.
    Host,
    /// The caller's stream ([`DeviceStream::from_raw`]): left alone.
    Foreign,
}

impl fmt::Debug for DeviceStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let owner = match self.owned {
            Owned::Cuda(_) | Owned::Host => "owned",
            Owned::Foreign => "caller's",
        };
        f.debug_struct("DeviceStream")
            .field("device", &self.device)
            .field("raw", &format_args!("0x{:x}", self.raw))
            .field("owner", &owner)
            .finish()
    }
}

impl DeviceStream {
    /// A new stream of `device`: a non-blocking CUDA stream (`cuStreamCreate`), or a fresh
    /// stand-in stream. Without an NVIDIA driver the `cuda` provider returns the
    /// missing-driver error.
    pub fn new(device: Device) -> Result<DeviceStream> {
        match device.provider {
            Provider::Cuda => {
                let s = cuda::Stream::new(device.ordinal)?;
                Ok(DeviceStream {
                    device,
                    raw: s.handle() as usize,
                    owned: Owned::Cuda(Mutex::new(s)),
                })
            }
            Provider::Host => Ok(DeviceStream {
                device,
                raw: next_host_handle(),
                owned: Owned::Host,
            }),
        }
    }

    /// Wraps the caller's stream `raw` (a `CUstream` / `cudaStream_t`; with the stand-in, any
    /// number naming one of its streams). Dropping the value leaves the stream alone.
    ///
    /// # Safety
    /// With `Cuda`, `raw` is a stream of `device`'s primary context (or `cudaStreamLegacy` (1)
    /// / `cudaStreamPerThread` (2)) and stays live while this value or any work queued through
    /// it is in use.
    pub unsafe fn from_raw(device: Device, raw: *mut c_void) -> DeviceStream {
        DeviceStream {
            device,
            raw: raw as usize,
            owned: Owned::Foreign,
        }
    }

    /// The device it belongs to.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The stream handle (a `CUstream` with the `cuda` provider), for code outside Rust.
    pub fn raw(&self) -> *mut c_void {
        std::ptr::without_provenance_mut(self.raw)
    }

    /// The handle as a number, as the stream queue takes it.
    pub(crate) fn handle(&self) -> usize {
        self.raw
    }

    /// Waits until the work queued on the stream so far has run (`cuStreamSynchronize`; the
    /// stand-in runs its FIFO), stream-ordered collectives included.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: an owned stream is live until drop; a caller's one per `from_raw`'s contract.
        unsafe { self.device.sync_stream(self.raw()) }
    }
}

impl Drop for DeviceStream {
    fn drop(&mut self) {
        // `Owned::Cuda` synchronizes and destroys its stream itself.
        if let Owned::Host = self.owned {
            host_stream::remove(self.raw);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stand_in_streams_are_distinct_and_synchronize() {
        let dev = Device::new(Provider::Host, 1).unwrap();
        let (a, b) = (
            DeviceStream::new(dev).unwrap(),
            DeviceStream::new(dev).unwrap(),
        );
        assert_ne!(a.raw(), b.raw());
        a.synchronize().unwrap();
        // SAFETY: stand-in streams need no live handle.
        let c = unsafe { DeviceStream::from_raw(dev, a.raw()) };
        assert_eq!(c.raw(), a.raw());
        c.synchronize().unwrap();
        assert!(format!("{c:?}").contains("caller's"));
    }

    #[test]
    fn streams_can_be_shared_between_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<DeviceStream>();
    }

    #[test]
    fn without_a_driver_a_cuda_stream_is_the_clear_error() {
        if cuda::device_count().is_ok() {
            return; // a driver is present: this test is for machines without one
        }
        // A cuda device value as `Device::new` would give on a machine with a GPU.
        let dev = Device {
            provider: Provider::Cuda,
            ordinal: 0,
        };
        let e = DeviceStream::new(dev).unwrap_err();
        assert!(e.to_string().contains(crate::device::DRIVER_MISSING), "{e}");
    }
}
