//! Device memory: buffers on a GPU (or on the host stand-in) that collectives accept.
//!
//! | concept | item |
//! |---|---|
//! | who provides device memory (closed set) | [`Provider`]: `Cuda`, or `Host` (test stand-in) |
//! | one device of a provider | [`Device`] |
//! | a typed buffer on a device, freed on drop | [`DeviceBuffer`] |
//! | collectives on device buffers | `Communicator::all_reduce_device` and friends |
//! | a stream of a device (CUDA stream, or the stand-in's model of one) | [`DeviceStream`] |
//! | stream-ordered collectives: return at once, later work on the stream sees the result | `Communicator::all_reduce_device_on` and friends |
//! | is this address device memory? | [`Provider::locate`] |
//!
//! The provider comes from `FERRO_DEVICE_PROVIDER`: `cuda` (the default) reaches the GPU through
//! the CUDA driver loaded at run time; `host` is a stand-in whose "device memory" is heap
//! memory tracked in a registry, so every path except the CUDA calls runs in the CPU tests.
//! Without an NVIDIA driver the `cuda` provider returns `device buffers need an NVIDIA driver
//! (libcuda.so.1 not found); host buffers work without one`, never a panic.
//!
//! ```
//! use ferroccl::device::{Device, DeviceBuffer, Provider};
//! use ferroccl::{Communicator, Config, ReduceOp};
//!
//! let dev = Device::new(Provider::Host, 0).unwrap();
//! let comms = Communicator::local_group(2, Config::default()).unwrap();
//! std::thread::scope(|s| {
//!     for c in &comms {
//!         s.spawn(move || {
//!             c.set_device(dev).unwrap();
//!             let mut buf = DeviceBuffer::from_host(dev, &[c.rank() as f32 + 1.0; 4]).unwrap();
//!             c.all_reduce_device_in_place(&mut buf, ReduceOp::Sum).unwrap();
//!             assert_eq!(buf.to_vec().unwrap(), [3.0; 4]);
//!         });
//!     }
//! });
//! ```

mod cuda;
pub(crate) mod direct;
// Stream gates and completion flags serve the C ABI's stream-ordered calls.
#[cfg_attr(not(feature = "capi"), allow(dead_code))]
pub(crate) mod gate;
#[cfg_attr(not(feature = "capi"), allow(dead_code))]
pub(crate) mod graph;
mod host;
#[cfg_attr(not(feature = "capi"), allow(dead_code))]
pub(crate) mod host_stream;
pub(crate) mod ipc;
mod pending;
pub(crate) mod raw;
#[cfg_attr(not(feature = "capi"), allow(dead_code))]
pub(crate) mod recorded;
mod shared_marks;
pub(crate) mod staging;
mod stream;
#[cfg_attr(not(feature = "capi"), allow(dead_code))]
pub(crate) mod stream_queue;
pub(crate) mod stream_stage;

thread_local! {
    /// Set while a stream job's work runs on its queue's thread (see [`no_driver_here`]).
    static IN_STREAM_JOB: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` marked as a stream job's work: device calls in it fail ([`no_driver_here`]).
pub(crate) fn as_stream_job<R>(f: impl FnOnce() -> R) -> R {
    struct Unmark;
    impl Drop for Unmark {
        fn drop(&mut self) {
            IN_STREAM_JOB.with(|m| m.set(false));
        }
    }
    IN_STREAM_JOB.with(|m| m.set(true));
    let _unmark = Unmark;
    f()
}

/// An error where the calling thread runs a stream job's work: a job must make no driver
/// call (nor, with the stand-in, its equivalent), since on a GPU one blocked while the
/// program's thread was in a synchronous call that waited for the job (docs/CUDA.md, "On a
/// GPU"). Every CUDA driver use and the stand-in's stream and copy calls check it.
pub(crate) fn no_driver_here(what: &str) -> crate::Result<()> {
    if IN_STREAM_JOB.with(std::cell::Cell::get) {
        return Err(crate::Error::internal(format!(
            "{what} on a stream job's thread: a stream job must make no device call (one can \
             block while the program's thread waits for the job)"
        )));
    }
    Ok(())
}

use std::fmt;
use std::marker::PhantomData;
use std::sync::Once;

use ferroccl_kernels::{as_bytes, as_bytes_mut, Element};
use ferroccl_transport::{MemRef, MemSpace};

use crate::{Error, Result};

pub(crate) use pending::{Hold, Pending};
pub use raw::DEVICE_ENV;
pub use raw::{DeviceView, RawDeviceP2p};
pub(crate) use staging::Staging;
pub use stream::DeviceStream;

/// What every `cuda` provider entry returns on a machine without an NVIDIA driver.
pub use ferroccl_cuda::DRIVER_MISSING;

/// The environment variable choosing the [`Provider`]: `cuda` (default) or `host`.
pub const PROVIDER_ENV: &str = "FERRO_DEVICE_PROVIDER";

/// Who provides device memory. A closed set: each variant is matched where it is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    /// NVIDIA GPUs through the CUDA driver (`libcuda.so.1`, loaded at run time).
    Cuda,
    /// A stand-in for tests on machines without a GPU: "device memory" is host memory kept in
    /// a registry of allocations (an address it did not allocate is not device memory), copies
    /// are `memcpy`, and a stream is a queue of copies run in order when it is synchronized.
    /// It offers devices `0..4`.
    Host,
}

impl Provider {
    /// The provider `FERRO_DEVICE_PROVIDER` names (`cuda` when unset).
    pub fn from_env() -> Result<Provider> {
        Provider::parse(std::env::var(PROVIDER_ENV).ok().as_deref())
    }

    /// The provider a `FERRO_DEVICE_PROVIDER` value names (`None`: unset).
    fn parse(v: Option<&str>) -> Result<Provider> {
        match v.map(str::to_ascii_lowercase).as_deref() {
            None | Some("" | "cuda") => Ok(Provider::Cuda),
            Some("host") => Ok(Provider::Host),
            Some(_) => Err(Error::invalid_argument(format!(
                "{PROVIDER_ENV}={:?}: expected cuda or host",
                v.unwrap_or_default()
            ))),
        }
    }

    /// `cuda` or `host`.
    pub fn name(self) -> &'static str {
        match self {
            Provider::Cuda => "cuda",
            Provider::Host => "host",
        }
    }

    /// How many devices it offers. `Cuda` without a driver: the missing-driver error.
    pub fn device_count(self) -> Result<u32> {
        match self {
            Provider::Cuda => cuda::device_count(),
            Provider::Host => host::visible_devices(),
        }
    }

    /// The device ordinal whose live memory holds all of `[addr, addr + len)`, or `None` when
    /// it is not device memory of this provider (host memory, a freed buffer, a range past an
    /// allocation's end). `Cuda` asks the driver (`cuPointerGetAttribute`); `Host` asks its
    /// registry. This is the check a raw address from outside Rust gets before any copy.
    pub fn locate(self, addr: u64, len: usize) -> Option<u32> {
        match self {
            Provider::Cuda => cuda::locate(addr, len, 0),
            Provider::Host => host::locate(addr, len),
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether the CUDA driver library is loaded in this process (never loads it).
pub(crate) fn driver_in_process() -> bool {
    let named = std::env::var("FERROCCL_CUDA_DRIVER").ok();
    let names = named
        .iter()
        .map(String::as_str)
        .chain(std::iter::once("libcuda.so.1"));
    names.into_iter().any(|n| {
        let Ok(c) = std::ffi::CString::new(n) else {
            return false;
        };
        // SAFETY: `c` is a NUL-terminated name; RTLD_NOLOAD only looks a loaded library up,
        // and the reference it takes is dropped at once.
        unsafe {
            let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY);
            if h.is_null() {
                false
            } else {
                libc::dlclose(h);
                true
            }
        }
    })
}

/// One device of a [`Provider`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    provider: Provider,
    ordinal: u32,
}

impl Device {
    /// The ordinal of the device whose live memory holds all of `[addr, addr + len)`, `None`
    /// for host memory or memory no live allocation covers ([`Provider::locate`] for a range
    /// this device is expected to hold: on a thread with no current CUDA context, the query
    /// runs in this device's primary context, made current, not in one made on device 0).
    pub fn find(self, addr: u64, len: usize) -> Option<u32> {
        match self.provider {
            Provider::Cuda => cuda::locate(addr, len, self.ordinal),
            Provider::Host => host::locate(addr, len),
        }
    }

    /// Device `ordinal` of `provider`, checked against the devices it offers.
    pub fn new(provider: Provider, ordinal: u32) -> Result<Device> {
        let n = provider.device_count()?;
        if ordinal >= n {
            return Err(Error::invalid_argument(format!(
                "{provider} device {ordinal} does not exist (this process sees {n})"
            )));
        }
        if provider == Provider::Host {
            static SAID: Once = Once::new();
            SAID.call_once(|| {
                ferroccl_transport::log_line!(
                    "ferroccl WARN DEVICE: device buffers on the host stand-in provider \
                     ({PROVIDER_ENV}=host) are host memory: a test stand-in, no GPU is used"
                )
            });
        }
        Ok(Device { provider, ordinal })
    }

    /// Device `ordinal` of the provider `FERRO_DEVICE_PROVIDER` names.
    pub fn from_env(ordinal: u32) -> Result<Device> {
        Device::new(Provider::from_env()?, ordinal)
    }

    /// Its provider.
    pub fn provider(self) -> Provider {
        self.provider
    }

    /// Its ordinal within the provider.
    pub fn ordinal(self) -> u32 {
        self.ordinal
    }

    /// Its memory space as the transports name it.
    pub fn space(self) -> MemSpace {
        MemSpace::Cuda(self.ordinal)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.provider {
            Provider::Cuda => write!(f, "cuda device {}", self.ordinal),
            Provider::Host => write!(f, "host stand-in device {}", self.ordinal),
        }
    }
}

/// `len` elements of `T` on a [`Device`], freed when dropped. The host cannot read it
/// directly: data moves in and out with [`DeviceBuffer::copy_from_host`] and
/// [`DeviceBuffer::copy_to_host`], and collectives take it by reference.
///
/// # Stream-ordered collectives
///
/// A stream-ordered call (`Communicator::all_reduce_device_on` and friends) returns before its
/// collective has run, while the buffer is already free to borrow again. Every buffer therefore
/// carries a count of the queued jobs that use it: a job holds it up from the call until it has
/// finished (failed or aborted included), and every host-side access first waits until the
/// count is zero: [`DeviceBuffer::copy_to_host`], [`DeviceBuffer::copy_from_host`],
/// [`DeviceBuffer::to_vec`], `read_at`, `write_at`, the blocking collectives, and `Drop` (so
/// the memory is never freed under a running job). Soundness rests on this count, not on a
/// guard: `std::mem::forget` of a buffer only leaks its memory, which the job may still use.
/// Device work the caller queues on the stream itself needs no wait: the stream orders it.
#[derive(Debug)]
pub struct DeviceBuffer<T: Element> {
    device: Device,
    addr: u64,
    len: usize,
    /// Queued stream jobs using the buffer (shared with them).
    pending: Pending,
    /// Whether `Drop` frees the memory: false for views of memory owned elsewhere
    /// ([`DeviceBuffer::view`]), whichever value holds them.
    owned: bool,
    _elems: PhantomData<T>,
}

impl<T: Element> DeviceBuffer<T> {
    /// Allocates `len` elements on `device`; the contents are unspecified until written (the
    /// host stand-in zeroes them).
    pub fn new(device: Device, len: usize) -> Result<DeviceBuffer<T>> {
        let bytes = len.checked_mul(T::DTYPE.size()).ok_or_else(|| {
            Error::invalid_argument(format!("device buffer of {len} x {} overflows", T::DTYPE))
        })?;
        let addr = match device.provider {
            Provider::Cuda => cuda::alloc(device.ordinal, bytes)?,
            Provider::Host => host::alloc(device.ordinal, bytes)?,
        };
        Ok(DeviceBuffer {
            device,
            addr,
            len,
            pending: Pending::default(),
            owned: true,
            _elems: PhantomData,
        })
    }

    /// A buffer on `device` holding a copy of `src`.
    pub fn from_host(device: Device, src: &[T]) -> Result<DeviceBuffer<T>> {
        let mut b = DeviceBuffer::new(device, src.len())?;
        b.copy_from_host(src)?;
        Ok(b)
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes.
    pub fn bytes(&self) -> usize {
        self.len * T::DTYPE.size()
    }

    /// The device it lives on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The device ordinal it lives on.
    pub fn ordinal(&self) -> u32 {
        self.device.ordinal
    }

    /// Its device address (a `CUdeviceptr` with the `cuda` provider), for code outside Rust.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Where it is, as the transports describe memory.
    pub fn mem(&self) -> MemRef {
        MemRef {
            space: self.device.space(),
            addr: self.addr as usize,
            len: self.bytes(),
        }
    }

    fn check_len(&self, what: &str, n: usize) -> Result<()> {
        if n != self.len {
            return Err(Error::invalid_argument(format!(
                "{what}: host slice has {n} elements, the device buffer on {} has {}",
                self.device, self.len
            )));
        }
        Ok(())
    }

    /// Copies `src` (of exactly [`DeviceBuffer::len`] elements) into the buffer; returns when
    /// the copy is done.
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<()> {
        self.check_len("copy_from_host", src.len())?;
        self.pending.wait_idle();
        let src = as_bytes(src);
        match self.device.provider {
            // SAFETY: the buffer owns `bytes()` == `src.len()` bytes of this device's memory.
            Provider::Cuda => unsafe { cuda::upload(self.device.ordinal, self.addr, src) },
            Provider::Host => {
                // SAFETY: the allocation at `addr` holds `src.len()` bytes and is owned by
                // `self`, borrowed mutably; `src` is a distinct host slice.
                unsafe {
                    std::ptr::copy_nonoverlapping(src.as_ptr(), self.addr as *mut u8, src.len())
                };
                Ok(())
            }
        }
    }

    /// Copies the buffer into `dst` (of exactly [`DeviceBuffer::len`] elements); returns when
    /// the copy is done.
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        self.check_len("copy_to_host", dst.len())?;
        self.pending.wait_idle();
        let dst = as_bytes_mut(dst);
        match self.device.provider {
            // SAFETY: the buffer owns `bytes()` == `dst.len()` bytes of this device's memory.
            Provider::Cuda => unsafe { cuda::download(self.device.ordinal, dst, self.addr) },
            Provider::Host => {
                // SAFETY: the allocation at `addr` holds `dst.len()` bytes and is owned by
                // `self`; `dst` is a distinct, exclusively borrowed host slice.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.addr as *const u8,
                        dst.as_mut_ptr(),
                        dst.len(),
                    )
                };
                Ok(())
            }
        }
    }

    /// The contents, copied to a new vector.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut v = vec![T::from_f64(0.0); self.len];
        self.copy_to_host(&mut v)?;
        Ok(v)
    }

    /// A second handle to the same memory that frees nothing (a view) and shares the queued
    /// jobs' count, so host access and `Drop` of either wait for jobs queued on the other.
    pub(crate) fn alias(&self) -> DeviceBuffer<T> {
        DeviceBuffer {
            device: self.device,
            addr: self.addr,
            len: self.len,
            pending: self.pending.clone(),
            owned: false,
            _elems: PhantomData,
        }
    }

    /// Counts a queued job using the buffer until the returned hold drops.
    pub(crate) fn hold(&self) -> Hold {
        self.pending.hold()
    }

    /// Queued jobs using the buffer now.
    #[cfg(test)]
    pub(crate) fn pending_jobs(&self) -> usize {
        self.pending.count()
    }

    /// Waits until no queued job uses the buffer.
    pub(crate) fn wait_idle(&self) {
        self.pending.wait_idle();
    }

    /// Checks that the buffer is still live device memory of its device (the provider's
    /// registry or the driver's pointer query), for `name` on `rank`.
    pub(crate) fn check_live(&self, name: &str, rank: usize, what: &str) -> Result<()> {
        if self.bytes() == 0
            || self.device.find(self.addr, self.bytes()) == Some(self.device.ordinal)
        {
            return Ok(());
        }
        Err(Error::invalid_argument(format!(
            "{name} on rank {rank}: the {what} buffer (0x{:x}, {} bytes) is not live memory of {}",
            self.addr,
            self.bytes(),
            self.device
        )))
    }
}

impl<T: Element> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if !self.owned {
            // A view: the memory is its owner's, and the jobs using it hold the count.
            return;
        }
        // A queued job may still use the memory: free it only once none does.
        self.pending.wait_idle();
        let r = match self.device.provider {
            // SAFETY: allocated in `new` on this device, freed once, here; every copy into or
            // out of it completed before the call that queued it returned.
            Provider::Cuda => unsafe { cuda::free(self.device.ordinal, self.addr) },
            // SAFETY: as above.
            Provider::Host => unsafe { host::free(self.addr) },
        };
        if let Err(e) = r {
            ferroccl_transport::log_line!("ferroccl WARN DEVICE: freeing a device buffer: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_jobs_work_may_make_no_device_call() {
        let dev = Device::new(Provider::Host, 0).unwrap();
        let stream = std::ptr::without_provenance_mut(0x5e_0002);
        // SAFETY: a stand-in stream handle, never dereferenced.
        let outside = unsafe { dev.sync_stream(stream) };
        assert!(outside.is_ok(), "allowed outside a job");
        let e = as_stream_job(|| {
            // SAFETY: as above.
            unsafe { dev.sync_stream(stream) }.unwrap_err()
        });
        assert!(e.to_string().contains("stream job's thread"), "{e}");
        // SAFETY: as above.
        let after = unsafe { dev.sync_stream(stream) };
        assert!(after.is_ok(), "the mark ends with the job");
        let panicked = std::panic::catch_unwind(|| as_stream_job(|| panic!("job panics")));
        assert!(panicked.is_err());
        assert!(
            no_driver_here("a call").is_ok(),
            "the mark ends when the job panics"
        );
    }

    #[test]
    fn host_provider_buffers_round_trip_and_are_located() {
        let dev = Device::new(Provider::Host, 1).unwrap();
        let mut b = DeviceBuffer::<u32>::new(dev, 5).unwrap();
        assert_eq!(b.to_vec().unwrap(), [0; 5]);
        b.copy_from_host(&[1, 2, 3, 4, 5]).unwrap();
        assert_eq!(b.to_vec().unwrap(), [1, 2, 3, 4, 5]);
        assert_eq!(Provider::Host.locate(b.addr(), 20), Some(1));
        assert_eq!(Provider::Host.locate(b.addr(), 21), None);
        let e = b.copy_from_host(&[1, 2]).unwrap_err();
        assert!(e.to_string().contains("host slice has 2 elements"), "{e}");
        let mut short = [0u32; 4];
        let e = b.copy_to_host(&mut short).unwrap_err();
        assert!(e.to_string().contains("has 5"), "{e}");
        let addr = b.addr();
        drop(b);
        assert_eq!(Provider::Host.locate(addr, 20), None, "freed on drop");
    }

    #[test]
    fn provider_names() {
        assert_eq!(Provider::parse(None).unwrap(), Provider::Cuda);
        assert_eq!(Provider::parse(Some("CUDA")).unwrap(), Provider::Cuda);
        assert_eq!(Provider::parse(Some("host")).unwrap(), Provider::Host);
        let e = Provider::parse(Some("gpu")).unwrap_err();
        assert!(
            e.to_string()
                .contains("FERRO_DEVICE_PROVIDER=\"gpu\": expected cuda or host"),
            "{e}"
        );
    }

    #[test]
    fn devices_are_checked() {
        let e = Device::new(Provider::Host, 4).unwrap_err();
        assert!(
            e.to_string().contains("host device 4 does not exist"),
            "{e}"
        );
        assert_eq!(
            Device::new(Provider::Host, 3).unwrap().to_string(),
            "host stand-in device 3"
        );
    }

    #[test]
    fn empty_buffers_work() {
        let dev = Device::new(Provider::Host, 0).unwrap();
        let b = DeviceBuffer::<f64>::from_host(dev, &[]).unwrap();
        assert!(b.is_empty());
        assert!(b.to_vec().unwrap().is_empty());
        b.check_live("x", 0, "send").unwrap();
    }
}
