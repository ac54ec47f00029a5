//! The host stand-in provider (`FERRO_DEVICE_PROVIDER=host`): "device memory" is shared memory
//! (a memory file per allocation, which another process can map as CUDA IPC maps device
//! memory) kept in a registry of live allocations, copies are `memcpy`, and a stream is a queue of
//! copies that run, in order, when the stream is synchronized.
//!
//! It exists so that everything about device buffers except the CUDA calls — the API's checks,
//! the staging path, the collectives — runs in the CPU test suite. Because queued copies run
//! only at [`Queue::synchronize`], a path that reads a staging buffer before waiting for its
//! copy sees stale bytes in the tests, as it would on a GPU; with `FERRO_STANDIN_EAGER=1` they
//! run as they are queued instead, so a path that fills memory after queuing the copy that
//! reads it sees the copy take stale bytes (`host_stream`, "Eager streams"). An address the registry does not
//! hold (a plain `Vec`, a freed buffer) is "not device memory", as the CUDA driver's
//! pointer-attribute query answers for host memory.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use crate::{Error, Result};

/// Devices the stand-in offers (ordinals `0..DEVICES`), so that tests can pass a buffer of
/// another device.
pub(crate) const DEVICES: u32 = 4;

/// The devices the stand-in says it has ([`super::Provider::device_count`]):
/// `FERRO_STANDIN_DEVICES` (1 to [`DEVICES`]), as a machine with that many GPUs would, so
/// that tools which number their devices by local rank put several ranks on one (a one-GPU
/// machine); [`DEVICES`] where unset. Every ordinal below [`DEVICES`] stays usable.
pub(crate) fn visible_devices() -> Result<u32> {
    match std::env::var("FERRO_STANDIN_DEVICES") {
        Err(_) => Ok(DEVICES),
        Ok(v) => match v.trim().parse::<u32>() {
            Ok(n) if (1..=DEVICES).contains(&n) => Ok(n),
            _ => Err(Error::invalid_argument(format!(
                "FERRO_STANDIN_DEVICES={v:?}: the host stand-in offers 1 to {DEVICES} devices"
            ))),
        },
    }
}

/// Alignment of every allocation, device or staging (CUDA allocations are 256-byte aligned).
const ALIGN: usize = 256;

/// A live stand-in device allocation: a mapping of a memory file of its own (`memfd`), so that
/// another process can map it too ([`export`], [`import`]), as CUDA IPC maps device memory.
#[derive(Debug, Clone, Copy)]
struct Alloc {
    ordinal: u32,
    /// Bytes requested (the mapping holds at least one page).
    len: usize,
    /// The memory file, kept open for exports; `-1` for a mapping of another process's
    /// allocation ([`import`]).
    fd: i32,
    /// Exported ([`export`]): other processes may map it.
    exported: bool,
}

/// What an exported allocation holds once freed ([`free`]): every f32 and f64 a NaN, every
/// integer -1.
const POISON: u8 = 0xff;

/// Live allocations by start address.
static REGISTRY: Mutex<BTreeMap<usize, Alloc>> = Mutex::new(BTreeMap::new());

fn registry() -> MutexGuard<'static, BTreeMap<usize, Alloc>> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

fn layout(len: usize) -> Result<Layout> {
    Layout::from_size_align(len.max(1), ALIGN).map_err(|_| {
        Error::invalid_argument(format!("host stand-in device: {len} bytes is too large"))
    })
}

/// Zeroed heap memory of `len` bytes (at least one byte is allocated).
fn raw_alloc(len: usize) -> Result<*mut u8> {
    let l = layout(len)?;
    // SAFETY: `l` has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(l) };
    if p.is_null() {
        return Err(Error::new(
            crate::ErrorKind::System,
            format!("host stand-in device: out of memory allocating {len} bytes"),
        ));
    }
    Ok(p)
}

/// # Safety
/// `p` came from [`raw_alloc`] with the same `len` and is freed once.
unsafe fn raw_free(p: *mut u8, len: usize) {
    // SAFETY: per the caller; the layout is the one `raw_alloc` used.
    unsafe { std::alloc::dealloc(p, Layout::from_size_align_unchecked(len.max(1), ALIGN)) }
}

/// Bytes mapped for an allocation of `len` bytes: whole pages, at least one.
fn mapped_len(len: usize) -> usize {
    // Below isize::MAX (`layout` refuses more first), so this cannot overflow.
    len.max(1).div_ceil(4096) * 4096
}

fn os_error(what: &str, len: usize) -> Error {
    Error::new(
        crate::ErrorKind::System,
        format!(
            "host stand-in device: {what} of {len} bytes failed: {}",
            std::io::Error::last_os_error()
        ),
    )
}

/// Maps `len` bytes of memory file `fd`, shared.
fn map_file(fd: i32, len: usize) -> Result<*mut u8> {
    // SAFETY: a fresh shared mapping of an open file; the kernel picks the address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            mapped_len(len),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(os_error("mapping", len));
    }
    Ok(p.cast())
}

/// Every live allocation keeps a file open: the soft limit on open files is raised to the hard
/// one once, so that tests holding many buffers do not run out.
fn raise_file_limit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `l` is a valid rlimit to read into and then to set from.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
                l.rlim_cur = l.rlim_max;
                libc::setrlimit(libc::RLIMIT_NOFILE, &l);
            }
        }
    });
}

/// Allocates `len` bytes of "device memory" on device `ordinal` (zeroed) and registers it.
pub(crate) fn alloc(ordinal: u32, len: usize) -> Result<u64> {
    layout(len)?;
    raise_file_limit();
    // SAFETY: a NUL-terminated name; the flags are memfd_create's.
    let fd = unsafe { libc::memfd_create(c"ferroccl-standin".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(os_error("a memory file", len));
    }
    let sized = i64::try_from(mapped_len(len)).unwrap_or(i64::MAX);
    // SAFETY: `fd` is the open memory file made above.
    let p = match unsafe { libc::ftruncate(fd, sized) } {
        0 => map_file(fd, len),
        _ => Err(os_error("sizing a memory file", len)),
    };
    match p {
        Ok(p) => {
            registry().insert(
                p as usize,
                Alloc {
                    ordinal,
                    len,
                    fd,
                    exported: false,
                },
            );
            Ok(p as u64)
        }
        Err(e) => {
            // SAFETY: `fd` is open and closed once.
            unsafe { libc::close(fd) };
            Err(e)
        }
    }
}

/// The inode of memory file `fd`, which names it in an export.
fn file_id(fd: i32) -> Result<u64> {
    // SAFETY: `st` is a valid stat buffer to write into; `fd` is an open memory file.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(os_error("reading a memory file's identity", 0));
    }
    Ok(st.st_ino)
}

/// Unmaps an allocation's memory and closes its file.
fn unmap(addr: u64, a: Alloc) {
    // SAFETY: `addr` is the start of a mapping of `mapped_len(a.len)` bytes made by
    // `map_file`, which the registry held and no longer does; `fd`, where set, is its file.
    unsafe {
        libc::munmap(addr as *mut libc::c_void, mapped_len(a.len));
        if a.fd >= 0 {
            libc::close(a.fd);
        }
    }
}

/// Frees an allocation of [`alloc`]; an address the registry does not hold, or the mapping of
/// another process's allocation ([`close_import`] closes those), is an error.
///
/// # Safety
/// No queued copy still uses the allocation.
pub(crate) unsafe fn free(addr: u64) -> Result<()> {
    let mut reg = registry();
    match reg.get(&(addr as usize)).copied() {
        Some(a) if a.fd >= 0 => {
            reg.remove(&(addr as usize));
            drop(reg);
            if a.exported {
                // Memory a GPU frees may be handed to anyone next: another process that still
                // reads it through its mapping reads garbage, which the stand-in makes sure of
                // (its file outlives this mapping while others map it).
                // SAFETY: the allocation's own mapping of `a.len` bytes, still mapped, which
                // no queued work uses (this function's contract).
                unsafe { std::ptr::write_bytes(addr as *mut u8, POISON, a.len) };
            }
            unmap(addr, a);
            Ok(())
        }
        Some(_) => Err(Error::internal(format!(
            "host stand-in device: free of 0x{addr:x}, a mapping of another process's \
             allocation (it is closed, not freed)"
        ))),
        None => Err(Error::internal(format!(
            "host stand-in device: free of 0x{addr:x}, which is not a live allocation"
        ))),
    }
}

/// Bytes of an exported allocation's handle that the stand-in uses: a tag, the owner's pid,
/// its memory file's descriptor, the length and the device.
const HANDLE_TAG: u64 = u64::from_le_bytes(*b"ferroSTI");

/// The handle another process opens with [`import`] to map the allocation holding
/// `[addr, addr + len)`, with the allocation's start and length (CUDA:
/// `cuMemGetAddressRange` and `cuIpcGetMemHandle`).
pub(crate) fn export(addr: u64, len: usize) -> Result<(u64, usize, [u8; 64])> {
    let mut reg = registry();
    let found = reg
        .range(..=addr as usize)
        .next_back()
        .filter(|(&start, a)| {
            (addr as usize)
                .checked_add(len)
                .is_some_and(|e| e <= start + a.len)
        });
    let Some((&start, &a)) = found else {
        return Err(Error::invalid_argument(format!(
            "host stand-in device: 0x{addr:x}..+{len} is not in one live allocation"
        )));
    };
    if a.fd < 0 {
        return Err(Error::invalid_argument(format!(
            "host stand-in device: 0x{addr:x} is a mapping of another process's allocation, \
             which cannot be exported again"
        )));
    }
    let words = [
        HANDLE_TAG,
        u64::from(std::process::id()),
        a.fd as u64,
        a.len as u64,
        u64::from(a.ordinal),
        file_id(a.fd)?,
    ];
    let mut h = [0u8; 64];
    for (i, w) in words.iter().enumerate() {
        h[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
    }
    reg.insert(
        start,
        Alloc {
            exported: true,
            ..a
        },
    );
    Ok((start as u64, a.len, h))
}

/// Maps another process's allocation from its [`export`] handle, for a reduce-copy on device
/// `ordinal` (refused where the devices differ and stand-in devices do not reach each other,
/// as `cuIpcOpenMemHandle` fails without peer access). The mapping is device memory of the
/// owner's device until [`close_import`].
pub(crate) fn import(ordinal: u32, handle: &[u8; 64], reach: bool) -> Result<u64> {
    let w = |i: usize| u64::from_le_bytes(handle[8 * i..8 * i + 8].try_into().unwrap_or([0; 8]));
    let (pid, fd, len, owner) = (w(1), w(2), w(3) as usize, w(4) as u32);
    if w(0) != HANDLE_TAG {
        return Err(Error::invalid_argument(
            "host stand-in device: not a stand-in memory handle".to_string(),
        ));
    }
    if owner != ordinal && !reach {
        return Err(Error::invalid_argument(format!(
            "host stand-in device: device {ordinal} cannot map memory of device {owner} (no \
             peer access)"
        )));
    }
    let path = format!("/proc/{pid}/fd/{fd}");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| {
            Error::new(
                crate::ErrorKind::System,
                format!("host stand-in device: opening {path} (another process's memory): {e}"),
            )
        })?;
    layout(len)?;
    // The file must be the one exported (a descriptor number the owner reused since, or one of
    // another pid namespace, is another file) and hold the whole length.
    let meta = file.metadata().map_err(|e| {
        Error::new(
            crate::ErrorKind::System,
            format!("host stand-in device: {path}: {e}"),
        )
    })?;
    if std::os::unix::fs::MetadataExt::ino(&meta) != w(5) || meta.len() < mapped_len(len) as u64 {
        return Err(Error::invalid_argument(format!(
            "host stand-in device: {path} is not the memory the handle exported (freed since?)"
        )));
    }
    let p = map_file(std::os::fd::AsRawFd::as_raw_fd(&file), len)?;
    registry().insert(
        p as usize,
        Alloc {
            ordinal: owner,
            len,
            fd: -1,
            exported: false,
        },
    );
    Ok(p as u64)
}

/// Unmaps a mapping of [`import`].
///
/// # Safety
/// No queued work still uses it.
pub(crate) unsafe fn close_import(addr: u64) -> Result<()> {
    let mut reg = registry();
    match reg.get(&(addr as usize)).copied() {
        Some(a) if a.fd < 0 => {
            reg.remove(&(addr as usize));
            drop(reg);
            unmap(addr, a);
            Ok(())
        }
        _ => Err(Error::internal(format!(
            "host stand-in device: 0x{addr:x} is not a mapping of another process's memory"
        ))),
    }
}

/// The device whose live allocation holds all of `[addr, addr + len)`; `None`: not device
/// memory (host memory, a freed buffer, or a range running past an allocation's end).
pub(crate) fn locate(addr: u64, len: usize) -> Option<u32> {
    let addr = addr as usize;
    let reg = registry();
    let (&start, a) = reg.range(..=addr).next_back()?;
    let end = addr.checked_add(len)?;
    (end <= start + a.len.max(1) && (len == 0 || end <= start + a.len)).then_some(a.ordinal)
}

/// Checks one side of a copy as the CUDA driver does: a range that starts in a device
/// allocation must end inside it (the driver answers `CUDA_ERROR_INVALID_VALUE`).
pub(crate) fn check_copy_range(what: &str, addr: u64, len: usize) -> Result<()> {
    if len == 0 || locate(addr, 1).is_none() || locate(addr, len).is_some() {
        return Ok(());
    }
    Err(Error::internal(format!(
        "host stand-in device: a copy's {what} 0x{addr:x}..+{len} runs past the end of its \
         allocation (the CUDA driver refuses it: invalid argument)"
    )))
}

/// Live page-locked allocations' stand-ins: start address and length.
static PINNED: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());

fn pinned() -> MutexGuard<'static, BTreeMap<usize, usize>> {
    PINNED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Page-locked host memory's stand-in: plain heap memory, zeroed, not registered as device
/// memory but as page-locked (as the driver knows `cuMemAllocHost` memory).
pub(crate) fn alloc_pinned(len: usize) -> Result<*mut u8> {
    let p = raw_alloc(len)?;
    pinned().insert(p as usize, len);
    Ok(p)
}

/// # Safety
/// `p` came from [`alloc_pinned`] with the same `len`, is freed once and no queued copy still
/// uses it.
pub(crate) unsafe fn free_pinned(p: *mut u8, len: usize) {
    pinned().remove(&(p as usize));
    // SAFETY: per the caller.
    unsafe { raw_free(p, len) }
}

/// The length of the live page-locked allocation starting at `p`, if it is one.
pub(crate) fn pinned_len(p: *mut u8) -> Option<usize> {
    pinned().get(&(p as usize)).copied()
}

/// Whether `addr` lies in a live page-locked allocation.
pub(crate) fn is_pinned(addr: u64) -> bool {
    let addr = addr as usize;
    pinned()
        .range(..=addr)
        .next_back()
        .is_some_and(|(&start, &len)| addr < start + len.max(1))
}

/// A copy waiting in a [`Queue`].
#[derive(Debug, Clone, Copy)]
struct Copy {
    dst: usize,
    src: usize,
    len: usize,
}

/// A stream's stand-in: copies queued in order, run at [`Queue::synchronize`] or when a mark
/// recorded after them is waited for ([`Queue::wait_mark`]), as a CUDA event would.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    copies: Vec<Copy>,
    /// Copies of `copies` already run (a prefix).
    done: usize,
    /// Mark `k`: how many copies were queued when it was recorded.
    marks: Vec<usize>,
}

impl Queue {
    /// Queues a copy of `len` bytes from `src` to `dst`.
    ///
    /// # Safety
    /// `src` is readable and `dst` writable for `len` bytes, not overlapping, until the queue
    /// has been synchronized.
    pub(crate) unsafe fn copy(&mut self, dst: *mut u8, src: *const u8, len: usize) {
        if len > 0 {
            self.copies.push(Copy {
                dst: dst as usize,
                src: src as usize,
                len,
            });
            if super::host_stream::eager() {
                // As early as a GPU could: nothing is queued before it that has not run.
                self.run_to(self.copies.len());
            }
        }
    }

    /// Runs the queued copies up to (not including) index `upto`, in order.
    fn run_to(&mut self, upto: usize) {
        while self.done < upto.min(self.copies.len()) {
            let c = self.copies[self.done];
            // SAFETY: `copy`'s caller guaranteed both ranges until the queue is synchronized
            // (waiting for a later mark is part of that).
            unsafe { std::ptr::copy_nonoverlapping(c.src as *const u8, c.dst as *mut u8, c.len) }
            self.done += 1;
        }
    }

    /// Runs every queued copy, in order.
    pub(crate) fn synchronize(&mut self) {
        self.run_to(self.copies.len());
        self.copies.clear();
        self.marks.clear();
        self.done = 0;
    }

    /// Records mark `k` after the copies queued so far.
    pub(crate) fn mark(&mut self, k: usize) {
        if self.marks.len() <= k {
            self.marks.resize(k + 1, 0);
        }
        self.marks[k] = self.copies.len();
    }

    /// Runs the copies queued before mark `k` (an unrecorded mark is an error).
    pub(crate) fn wait_mark(&mut self, k: usize) -> Result<()> {
        let Some(&upto) = self.marks.get(k) else {
            return Err(Error::internal(format!(
                "host stand-in stream: mark {k} was never recorded"
            )));
        };
        self.run_to(upto);
        Ok(())
    }

    /// Copies still waiting.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.copies.len() - self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_tells_device_from_host_memory() {
        let a = alloc(2, 100).unwrap();
        assert_eq!(locate(a, 100), Some(2));
        assert_eq!(locate(a + 10, 90), Some(2));
        assert_eq!(locate(a + 10, 91), None, "runs past the end");
        let v: Vec<u8> = (0..100).collect();
        assert_eq!(locate(v.as_ptr() as u64, 100), None, "a Vec is host memory");
        // SAFETY: nothing is queued on it.
        unsafe { free(a).unwrap() };
        assert_eq!(locate(a, 100), None, "freed");
        // SAFETY: as above.
        let e = unsafe { free(a) }.unwrap_err();
        assert!(e.to_string().contains("not a live allocation"), "{e}");
    }

    #[test]
    fn a_copy_range_may_not_run_past_its_allocation() {
        let a = alloc(0, 64).unwrap();
        assert!(check_copy_range("source", a, 64).is_ok());
        assert!(check_copy_range("source", a + 60, 4).is_ok());
        let e = check_copy_range("source", a + 32, 64).unwrap_err();
        assert!(e.to_string().contains("runs past the end"), "{e}");
        let host = [0u8; 8];
        assert!(check_copy_range("destination", host.as_ptr() as u64, 8).is_ok());
        // SAFETY: allocated above, nothing queued.
        unsafe { free(a) }.unwrap();
    }

    #[test]
    fn queued_copies_run_in_order_at_synchronize() {
        let src = [1u8, 2, 3, 4];
        let src2 = [9u8, 9];
        let mut dst = [0u8; 4];
        let mut q = Queue::default();
        // SAFETY: all three arrays outlive the synchronize below.
        unsafe {
            q.copy(dst.as_mut_ptr(), src.as_ptr(), 4);
            q.copy(dst.as_mut_ptr().add(1), src2.as_ptr(), 2);
        }
        if crate::device::host_stream::eager() {
            assert_eq!(q.pending(), 0);
            assert_eq!(dst, [1, 9, 9, 4], "eager: run as queued, in issue order");
            return;
        }
        assert_eq!(q.pending(), 2);
        assert_eq!(dst, [0; 4], "nothing runs before synchronize");
        q.synchronize();
        assert_eq!(dst, [1, 9, 9, 4], "in issue order");
        assert_eq!(q.pending(), 0);
    }

    #[test]
    fn waiting_for_a_mark_runs_only_the_copies_before_it() {
        let src = [1u8, 2, 3, 4];
        let mut dst = [0u8; 4];
        let mut q = Queue::default();
        // SAFETY: both arrays outlive the synchronize below.
        unsafe {
            q.copy(dst.as_mut_ptr(), src.as_ptr(), 2);
            q.mark(0);
            q.copy(dst.as_mut_ptr().add(2), src.as_ptr().add(2), 2);
            q.mark(1);
        }
        if crate::device::host_stream::eager() {
            assert_eq!(dst, [1, 2, 3, 4], "eager: run as queued");
            return;
        }
        q.wait_mark(0).unwrap();
        assert_eq!(dst, [1, 2, 0, 0]);
        assert_eq!(q.pending(), 1);
        assert!(q.wait_mark(5).is_err());
        q.wait_mark(1).unwrap();
        assert_eq!(dst, [1, 2, 3, 4]);
        q.synchronize();
        assert_eq!(q.pending(), 0);
    }
}
