//! Device memory shared between processes: a rank exports the allocation holding a buffer
//! (CUDA: `cuMemGetAddressRange` and `cuIpcGetMemHandle`), another process maps it from the
//! 64-byte handle (`cuIpcOpenMemHandle`, peer access enabled lazily) and unmaps it when done
//! (`cuIpcCloseMemHandle`). The host stand-in does the same with a memory file per allocation
//! (`host::export`). The communicator's windows use it ([`crate::Communicator::register_window`]).

use super::{cuda, host, Provider};
use ferroccl_transport::MemSpace;

use crate::{Error, Result};

/// An exported allocation: where it starts in its owner's process, its length, and the handle
/// another process maps it from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exported {
    pub base: u64,
    pub len: usize,
    pub handle: [u8; 64],
}

/// Exports the allocation of `provider` device `ordinal` holding `[addr, addr + len)`. Memory
/// that cannot be exported (host memory, memory mapped piece by piece with `cuMemMap`, a
/// stream-ordered pool's) is an error naming why.
pub(crate) fn export(provider: Provider, ordinal: u32, addr: u64, len: usize) -> Result<Exported> {
    match provider {
        Provider::Host => {
            let (base, len, handle) = host::export(addr, len)?;
            Ok(Exported { base, len, handle })
        }
        Provider::Cuda => {
            let d = cuda::bound(ordinal)?;
            let Some((base, size)) = d.mapping_of_pointer(addr) else {
                return Err(Error::invalid_argument(format!(
                    "0x{addr:x} is not device memory the CUDA driver knows"
                )));
            };
            if addr
                .checked_add(len as u64)
                .is_none_or(|e| e > base + size as u64)
            {
                return Err(Error::invalid_argument(format!(
                    "0x{addr:x}..+{len} runs past its allocation (0x{base:x}..+{size})"
                )));
            }
            let h = d.ipc_handle(base).map_err(|e| cuda::convert(&e))?;
            Ok(Exported {
                base,
                len: size,
                handle: h.0,
            })
        }
    }
}

/// Maps an allocation another process exported, for work on device `ordinal` of this process
/// (the stand-in refuses another device's memory where its devices do not reach each other,
/// `FERRO_STANDIN_PEER_ACCESS=0`). Returns where it starts here.
pub(crate) fn import(provider: Provider, ordinal: u32, handle: &[u8; 64]) -> Result<u64> {
    match provider {
        Provider::Host => host::import(ordinal, handle, super::direct::standin_reach()),
        Provider::Cuda => {
            let d = cuda::bound(ordinal)?;
            d.ipc_open(&ferroccl_cuda::driver::IpcMemHandle(*handle))
                .map_err(|e| cuda::convert(&e))
        }
    }
}

/// A mapping of another process's allocation ([`import`]), unmapped when dropped. Whoever
/// queues work on it waits for that work before dropping it (the collectives over windows
/// wait for every share within the call).
#[derive(Debug)]
pub(crate) struct Mapping {
    provider: Provider,
    ordinal: u32,
    addr: u64,
}

impl Mapping {
    /// Maps what `handle` exports for work on device `ordinal` ([`import`]).
    pub fn open(provider: Provider, ordinal: u32, handle: &[u8; 64]) -> Result<Mapping> {
        let addr = import(provider, ordinal, handle)?;
        Ok(Mapping {
            provider,
            ordinal,
            addr,
        })
    }

    /// Where the allocation starts in this process.
    pub fn addr(&self) -> u64 {
        self.addr
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: made by `import` with this provider and device, closed only here; its users
        // waited for their work on it before letting it go (the type's contract).
        if let Err(e) = unsafe { close(self.provider, self.ordinal, self.addr) } {
            ferroccl_transport::log_line!(
                "ferroccl WARN DEVICE: unmapping another process's memory at 0x{:x}: {e}",
                self.addr
            );
        }
    }
}

/// Unmaps memory of [`import`].
///
/// # Safety
/// `addr` came from [`import`] with the same provider and device, is closed once, and no
/// queued work still uses it.
pub(crate) unsafe fn close(provider: Provider, ordinal: u32, addr: u64) -> Result<()> {
    match provider {
        // SAFETY: per the caller.
        Provider::Host => unsafe { host::close_import(addr) },
        Provider::Cuda => {
            let d = cuda::bound(ordinal)?;
            // SAFETY: per the caller.
            unsafe { d.ipc_close(addr) }.map_err(|e| cuda::convert(&e))
        }
    }
}

/// Maps through the device provider, for work on this rank's device.
pub(crate) struct ByProvider {
    pub provider: Provider,
    pub ordinal: u32,
}

impl crate::exec::Mapper for ByProvider {
    fn map(&self, handle: &[u8; 64]) -> Result<Mapping> {
        Mapping::open(self.provider, self.ordinal, handle)
    }

    fn space(&self, addr: u64, len: usize) -> Option<MemSpace> {
        let dev = crate::device::Device::new(self.provider, self.ordinal).ok()?;
        dev.find(addr, len).map(MemSpace::Cuda)
    }

    fn reaches(&self, from: MemSpace, to: MemSpace) -> bool {
        match (from, to) {
            (MemSpace::Cuda(a), MemSpace::Cuda(b)) if a != b => match self.provider {
                Provider::Cuda => crate::reduce::peer_reach(a, b),
                Provider::Host => crate::device::direct::standin_reach(),
            },
            _ => from == to,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exported_allocation_maps_again_and_shares_its_bytes() {
        let a = host::alloc(1, 10_000).unwrap();
        let e = export(Provider::Host, 1, a + 100, 50).unwrap();
        assert_eq!((e.base, e.len), (a, 10_000));
        let m = import(Provider::Host, 1, &e.handle).unwrap();
        assert_ne!(m, a, "a second mapping");
        assert_eq!(
            host::locate(m + 9_000, 1000),
            Some(1),
            "device memory of the owner's device"
        );
        // SAFETY: both mappings are live, 10,000 bytes, and nothing else uses them.
        unsafe {
            *(a as *mut u8).add(1234) = 77;
            assert_eq!(*(m as *const u8).add(1234), 77);
            *(m as *mut u8).add(9) = 5;
            assert_eq!(*(a as *const u8).add(9), 5);
        }
        assert!(
            export(Provider::Host, 1, m, 1).is_err(),
            "a mapping is not exported again"
        );
        // SAFETY: not used after.
        let e2 = unsafe { host::free(m) }.unwrap_err();
        assert!(e2.to_string().contains("closed, not freed"), "{e2}");
        // SAFETY: as above.
        unsafe { close(Provider::Host, 1, m) }.unwrap();
        assert_eq!(host::locate(m, 1), None);
        // Another device maps it only where the devices reach each other.
        let e3 = host::import(0, &e.handle, false).unwrap_err();
        assert!(e3.to_string().contains("no peer access"), "{e3}");
        let m2 = Mapping::open(Provider::Host, 0, &e.handle).unwrap();
        assert_eq!(host::locate(m2.addr(), 10_000), Some(1));
        drop(m2);
        assert!(
            export(Provider::Host, 1, a + 9_990, 11).is_err(),
            "past its end"
        );
        let v = [0u8; 16];
        assert!(
            export(Provider::Host, 0, v.as_ptr() as u64, 16).is_err(),
            "host memory"
        );
        // SAFETY: nothing queued on it.
        unsafe { host::free(a) }.unwrap();
        // A handle of memory freed since names no memory, even where its descriptor number
        // was given to a new allocation (or to another file: tests run on several threads).
        let b = host::alloc(1, 10_000).unwrap();
        let stale = import(Provider::Host, 1, &e.handle)
            .unwrap_err()
            .to_string();
        assert!(
            stale.contains("not the memory") || stale.contains("opening /proc/"),
            "{stale}"
        );
        // SAFETY: nothing queued on it.
        unsafe { host::free(b) }.unwrap();
    }

    #[test]
    fn without_a_driver_cuda_exports_return_an_error() {
        if cuda::device_count().is_ok() {
            return;
        }
        let e = export(Provider::Cuda, 0, 0x1000, 8).unwrap_err();
        assert!(e.to_string().contains("libcuda"), "{e}");
        assert!(import(Provider::Cuda, 0, &[0; 64]).is_err());
    }
}
