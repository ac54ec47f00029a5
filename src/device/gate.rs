//! Ordering host work against a caller's stream without blocking the caller: a [`Gate`] is a
//! word the stream writes once the work queued before it is done (the host polls it), and a
//! [`Flag`] is a 32-bit counter in host-mapped pinned memory that the stream waits on
//! ([`Device::wait_flag`]) until the host stores a value at least as large.
//!
//! With the `cuda` provider these are `cuStreamWriteValue32` and `cuStreamWaitValue32` on
//! `cuMemHostAlloc(DEVICEMAP)` memory (both ran on an H100); with the host stand-in, positions in
//! and wait entries of its stream model (`host_stream`).

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use ferroccl_cuda::driver::driver;
use ferroccl_cuda::mem_ops::mem_ops;

use super::{cuda, host_stream, Device, Provider};
use crate::{Error, Result};

/// The point of a caller's stream where it was recorded: waiting for it waits for the work
/// queued on the stream before it.
#[derive(Debug)]
pub(crate) struct Gate {
    at: GateAt,
}

#[derive(Debug)]
enum GateAt {
    /// A word of mapped pinned memory that the stream sets to 1 (`cuStreamWriteValue32`) once
    /// the work before it is done: waiting polls host memory and makes no driver call, so a
    /// stream job's thread never blocks on the driver while the program's thread is in a
    /// synchronous call that waits for the job (docs/CUDA.md, "On a GPU").
    Cuda { word: GateWord, seen: bool },
    /// A stand-in stream and a position in it.
    Host { stream: usize, position: u64 },
}

/// One 32-bit word of the gate pool: mapped pinned memory of one device, host and device
/// addresses.
#[derive(Debug, Clone, Copy)]
struct GateWord {
    ordinal: u32,
    host: usize,
    dev: u64,
}

/// Free gate words. Pages are made on the caller's thread when the pool is empty and kept for
/// the process; a word goes back once its stream has written it.
static GATE_WORDS: Mutex<Vec<GateWord>> = Mutex::new(Vec::new());

/// Words of gates dropped before their stream wrote them (the host usually runs ahead of the
/// GPU: most gates a flag wait records are dropped unwritten when the next wait replaces
/// them). The stream may still write such a word, so it waits here until it has, and goes
/// back to the pool then ([`GateWord::take`] looks).
static UNWRITTEN: Mutex<Vec<GateWord>> = Mutex::new(Vec::new());

/// Words per page of the gate pool.
const GATE_PAGE_WORDS: usize = 1024;

impl GateWord {
    fn take(ordinal: u32) -> Result<GateWord> {
        let mut pool = GATE_WORDS.lock().unwrap_or_else(|p| p.into_inner());
        {
            let mut unwritten = UNWRITTEN.lock().unwrap_or_else(|p| p.into_inner());
            let mut k = 0;
            while k < unwritten.len() {
                if unwritten[k].atomic().load(Ordering::Acquire) != 0 {
                    pool.push(unwritten.swap_remove(k));
                } else {
                    k += 1;
                }
            }
        }
        if let Some(i) = pool.iter().position(|w| w.ordinal == ordinal) {
            return Ok(pool.swap_remove(i));
        }
        let d = cuda::bound(ordinal)?;
        let (host, dev) = mem_ops(d)
            .alloc_mapped(d, GATE_PAGE_WORDS * 4)
            .map_err(|e| cuda::convert(&e))?;
        for k in 1..GATE_PAGE_WORDS {
            pool.push(GateWord {
                ordinal,
                host: host as usize + 4 * k,
                dev: dev + 4 * k as u64,
            });
        }
        Ok(GateWord {
            ordinal,
            host: host as usize,
            dev,
        })
    }

    fn atomic(&self) -> &AtomicU32 {
        // SAFETY: a 4-byte-aligned word of a live page of mapped pinned memory (never freed),
        // only accessed atomically by the host.
        unsafe { AtomicU32::from_ptr(self.host as *mut u32) }
    }

    fn give_back(self) {
        GATE_WORDS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self);
    }
}

impl Gate {
    /// Waits until the work queued on the stream before the gate has run.
    #[cfg(test)]
    pub(crate) fn wait(&mut self) -> Result<()> {
        self.wait_or(|| None)
    }

    /// [`Gate::wait`], giving up with the error `give_up` returns: it is asked between sleeps,
    /// once the wait has spun and yielded for a while. A CUDA stream may never write its gate
    /// (a fault in the program's own kernels stops the stream; a stream being captured into a
    /// graph records the write instead of running it), so every wait of the queue's thread
    /// can be ended: by an abort, or by a deadline where nothing else would end it.
    pub(crate) fn wait_or(&mut self, give_up: impl Fn() -> Option<Error>) -> Result<()> {
        match &mut self.at {
            GateAt::Cuda { word, seen } => {
                let a = word.atomic();
                let mut spins = 0u32;
                while a.load(Ordering::Acquire) == 0 {
                    spins = spins.saturating_add(1);
                    if spins < 1 << 10 {
                        std::hint::spin_loop();
                    } else if spins < 1 << 12 {
                        std::thread::yield_now();
                    } else {
                        if let Some(e) = give_up() {
                            return Err(e);
                        }
                        std::thread::sleep(std::time::Duration::from_micros(50));
                    }
                }
                *seen = true;
                Ok(())
            }
            GateAt::Host { stream, position } => host_stream::run_to(*stream, *position),
        }
    }
}

/// A `give_up` for [`Gate::wait_or`] that ends the wait `limit` after its first question.
pub(crate) fn after(limit: std::time::Duration, what: &'static str) -> impl Fn() -> Option<Error> {
    let since = std::sync::OnceLock::new();
    move || {
        let t0 = *since.get_or_init(std::time::Instant::now);
        (t0.elapsed() >= limit).then(|| {
            Error::new(
                crate::ErrorKind::Timeout,
                format!(
                    "{what}: the stream did not get there in {} s (a fault in earlier work on \
                     it stops a stream; so does capturing it into a graph)",
                    limit.as_secs()
                ),
            )
        })
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        if let GateAt::Cuda { word, seen } = self.at {
            if seen || word.atomic().load(Ordering::Acquire) != 0 {
                word.give_back();
            } else {
                UNWRITTEN
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(word);
            }
        }
    }
}

/// How long dropping a [`Flag`] waits for the streams that waited on it to pass.
const FLAG_DROP_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A 32-bit completion counter the host writes and a device stream waits on.
#[derive(Debug)]
pub(crate) struct Flag {
    device: Device,
    mem: FlagMem,
    /// Per stream waited on, a gate recorded after its last wait: before the pinned memory is
    /// freed, these are waited for, so no stream still waits on freed memory.
    passed: Mutex<Vec<(usize, Gate)>>,
    /// A stream waits on the word with no gate after its wait (recording one failed): the
    /// word is never freed.
    ungated: std::sync::atomic::AtomicBool,
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
        let mut stuck = false;
        for (_, mut g) in passed {
            let limit = after(FLAG_DROP_WAIT, "freeing a completion flag");
            if let Err(e) = g.wait_or(limit) {
                ferroccl_transport::log_line!(
                    "ferroccl WARN DEVICE: {e}; its 4 bytes of pinned memory are left allocated"
                );
                stuck = true;
            }
        }
        if stuck || *self.ungated.get_mut() {
            // A stream may still wait on the word: never free it under the GPU.
            return;
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
            ungated: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Records a [`Gate`] at the current end of the caller's `stream`.
    ///
    /// # Safety
    /// With `Cuda`, `stream` is a live stream of this device's primary context, or one of the
    /// special handles `cudaStreamLegacy` (1) and `cudaStreamPerThread` (2).
    pub(crate) unsafe fn record_gate(self, stream: *mut c_void) -> Result<Gate> {
        super::no_driver_here("record_gate")?;
        let at = match self.provider {
            Provider::Host => GateAt::Host {
                stream: stream as usize,
                position: host_stream::record(stream as usize),
            },
            Provider::Cuda => {
                let d = cuda::bound(self.ordinal)?;
                let word = GateWord::take(self.ordinal)?;
                word.atomic().store(0, Ordering::Release);
                // SAFETY: the stream per the caller; the word is mapped pinned memory that is
                // never freed.
                if let Err(e) = unsafe { mem_ops(d).write_value32(d, stream, word.dev, 1) } {
                    word.give_back();
                    return Err(cuda::convert(&e));
                }
                GateAt::Cuda { word, seen: false }
            }
        };
        Ok(Gate { at })
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
        super::no_driver_here("wait_flag")?;
        if flag.device != self {
            return Err(Error::internal(format!(
                "a completion flag of {} waited on from a stream of {self}",
                flag.device
            )));
        }
        match &flag.mem {
            FlagMem::Host(a) => host_stream::wait_flag(
                stream as usize,
                Arc::clone(a) as Arc<dyn host_stream::Flag>,
                value,
            ),
            FlagMem::Cuda { dev, .. } => {
                let d = cuda::bound(self.ordinal)?;
                // SAFETY: the stream per the caller; `dev` maps the flag's pinned word, which
                // stays allocated until the stream has passed this wait (the gate below).
                unsafe { mem_ops(d).wait_value32(d, stream, *dev, value) }
                    .map_err(|e| cuda::convert(&e))?;
            }
        }
        if let Provider::Cuda = self.provider {
            // The wait is queued: from here on the stream waits on the flag whatever happens,
            // so this returns Ok and the caller must store the value (an error here would
            // leave the stream waiting for a number nobody writes).
            // SAFETY: as above.
            match unsafe { self.record_gate(stream) } {
                Ok(g) => {
                    let key = stream as usize;
                    let mut passed = flag.passed.lock().unwrap_or_else(|p| p.into_inner());
                    passed.retain(|(s, _)| *s != key);
                    passed.push((key, g));
                }
                Err(e) => {
                    flag.ungated.store(true, Ordering::Relaxed);
                    ferroccl_transport::log_line!(
                        "ferroccl WARN DEVICE: no gate after a stream's wait on a completion \
                         flag ({e}); the flag's 4 bytes of pinned memory stay allocated"
                    );
                }
            }
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
        super::no_driver_here("copy_on_stream")?;
        match self.provider {
            Provider::Host => {
                super::host::check_copy_range("destination", dst as u64, len)?;
                super::host::check_copy_range("source", src as u64, len)?;
                // SAFETY: per the caller.
                unsafe { host_stream::copy(stream as usize, dst, src, len) }
            }
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
    /// Copies `dst.len()` bytes of device memory at `addr` to `dst` on the process's private
    /// non-blocking stream of the device (not the legacy stream, which would wait for a
    /// caller's stream that is itself waiting on a completion flag); returns when done.
    ///
    /// # Safety
    /// As for [`Device::read_raw`].
    pub(crate) unsafe fn read_private(self, addr: u64, dst: &mut [u8]) -> Result<()> {
        super::no_driver_here("read_private")?;
        match self.provider {
            // SAFETY: per the caller.
            Provider::Host => unsafe { self.read_raw(addr, dst) },
            // SAFETY: per the caller.
            Provider::Cuda => unsafe { cuda::download(self.ordinal, dst, addr) },
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
    fn a_gate_dropped_before_its_stream_wrote_it_returns_its_word_once_written() {
        // A word of plain host memory standing in for mapped pinned memory, on an ordinal no
        // other test uses (so `take` finds it without a driver).
        let mem: &'static AtomicU32 = Box::leak(Box::new(AtomicU32::new(0)));
        let word = GateWord {
            ordinal: 4242,
            host: mem as *const AtomicU32 as usize,
            dev: 0,
        };
        drop(Gate {
            at: GateAt::Cuda { word, seen: false },
        });
        // Not written yet: not in the pool (the stream may still write it).
        assert!(GATE_WORDS
            .lock()
            .unwrap()
            .iter()
            .all(|w| w.host != word.host));
        mem.store(1, Ordering::Release); // the stream writes it
        let again = GateWord::take(4242).expect("the written word comes back");
        assert_eq!(again.host, word.host);
        assert!(UNWRITTEN
            .lock()
            .unwrap()
            .iter()
            .all(|w| w.host != word.host));
    }

    #[test]
    fn a_stand_in_stream_waits_for_the_flag_and_gates_see_earlier_work() {
        let dev = Device::new(Provider::Host, 0).unwrap();
        let s = std::ptr::without_provenance_mut::<c_void>(0x5EED);
        let flag = dev.alloc_flag().unwrap();
        assert!(dev.stream_waits_supported());
        let src = [3u8; 8];
        let mut dst = [0u8; 8];
        // SAFETY: stand-in streams need no live handle; the arrays outlive the waits below.
        let mut gate = unsafe {
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
