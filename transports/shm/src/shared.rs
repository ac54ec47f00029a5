//! Host buffers that the other ranks of the host can map ([`SharedMem`]), and the receiving
//! side's cache of peers' buffers ([`PeerMaps`]).
//!
//! A payload sent over shared memory normally crosses through the receiver's ring: one copy
//! in, and a copy (or a reduction) out. When the sender's buffer is a [`SharedMem`], the frame
//! names the buffer instead (its file descriptor, a serial and the offset), the receiver maps
//! that buffer once (`/proc/<pid>/fd/<fd>`, read only) and copies or reduces straight from it,
//! acknowledging as it goes: the copy into the ring is gone, so a 2-rank allreduce moves the
//! same bytes through memory as two threads of one process would.
//!
//! A [`SharedMem`] is a `memfd` mapped shared; it is never resized, so a peer's mapping cannot
//! fault past its end. The registry that finds the buffer behind a payload's address holds one
//! entry per live buffer. The receiver keeps up to [`MAX_MAPS`] peers' buffers mapped; when it
//! maps a new one, it drops those whose descriptor in the peer no longer names the same file
//! (the peer freed them), so a freed buffer's memory goes back soon after.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::RwLock;

use ferroccl_transport::{Error, Result};

/// The name every shared buffer's `memfd` has, before its serial.
const NAME_PREFIX: &str = "ferroccl-buf-";
/// Peers' buffers a receiver keeps mapped at most.
pub(crate) const MAX_MAPS: usize = 32;

static SERIAL: AtomicU32 = AtomicU32::new(1);

/// Live buffers of this process by start address: (end, descriptor, serial).
static REGISTRY: RwLock<BTreeMap<usize, (usize, i32, u32)>> = RwLock::new(BTreeMap::new());

/// A host buffer in shared memory that the other ranks of the host read from directly when it
/// is sent (see the module docs). Zero-filled at allocation.
#[derive(Debug)]
pub struct SharedMem {
    ptr: NonNull<u8>,
    len: usize,
    /// Bytes mapped (`len` rounded up to a page, at least one page).
    mapped: usize,
    /// Open while the buffer lives: peers open it through `/proc/<pid>/fd`.
    _fd: OwnedFd,
}

// SAFETY: the mapping is plain memory owned by this value; access goes through `&self` /
// `&mut self` like a `Vec<u8>`.
unsafe impl Send for SharedMem {}
// SAFETY: as above: shared references give only shared access.
unsafe impl Sync for SharedMem {}

fn os_error(what: String) -> Error {
    Error::io(what, &std::io::Error::last_os_error())
}

impl SharedMem {
    /// Allocates `len` zeroed bytes of shared memory.
    pub fn new(len: usize) -> Result<SharedMem> {
        let page = page_size();
        let mapped = len
            .max(1)
            .checked_next_multiple_of(page)
            .ok_or_else(|| Error::invalid_argument(format!("shared buffer of {len} bytes")))?;
        let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
        let name = CString::new(format!("{NAME_PREFIX}{serial}")).expect("no NUL in the name");
        // SAFETY: a valid C string; the returned descriptor is owned below.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(os_error(format!(
                "shared buffer of {len} bytes: memfd_create"
            )));
        }
        // SAFETY: `raw` is a descriptor this call just opened and nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain system call on our descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), mapped as libc::off_t) } != 0 {
            return Err(os_error(format!("shared buffer of {len} bytes: ftruncate")));
        }
        // SAFETY: a fresh shared mapping of a file of exactly `mapped` bytes.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os_error(format!("shared buffer of {len} bytes: mmap")));
        }
        let ptr = NonNull::new(p.cast::<u8>()).expect("mmap returned a non-null address");
        let start = ptr.as_ptr() as usize;
        write_registry().insert(start, (start + len, fd.as_raw_fd(), serial));
        Ok(SharedMem {
            ptr,
            len,
            mapped,
            _fd: fd,
        })
    }

    /// Bytes in the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer's bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len <= mapped` bytes of a live mapping owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The buffer's bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive in this process.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for SharedMem {
    fn drop(&mut self) {
        write_registry().remove(&(self.ptr.as_ptr() as usize));
        // SAFETY: the mapping made in `new`, unmapped once; no slice of it outlives `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped) };
    }
}

fn write_registry() -> std::sync::RwLockWriteGuard<'static, BTreeMap<usize, (usize, i32, u32)>> {
    REGISTRY.write().unwrap_or_else(|e| e.into_inner())
}

fn page_size() -> usize {
    // SAFETY: plain query.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Where a payload lies in a shared buffer of this process: what a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Located {
    pub fd: u32,
    pub serial: u32,
    pub offset: u64,
}

impl Located {
    /// The frame's two words.
    pub fn encode(self) -> (u64, u64) {
        (
            u64::from(self.fd) | u64::from(self.serial) << 32,
            self.offset,
        )
    }

    pub fn decode(a: u64, b: u64) -> Located {
        Located {
            fd: a as u32,
            serial: (a >> 32) as u32,
            offset: b,
        }
    }
}

/// The shared buffer that holds all of `addr .. addr + len`, if any.
pub(crate) fn locate(addr: usize, len: usize) -> Option<Located> {
    let reg = REGISTRY.read().unwrap_or_else(|e| e.into_inner());
    let (&start, &(end, fd, serial)) = reg.range(..=addr).next_back()?;
    (addr.checked_add(len)? <= end).then_some(Located {
        fd: fd as u32,
        serial,
        offset: (addr - start) as u64,
    })
}

/// One peer's buffer, mapped read only.
#[derive(Debug)]
struct PeerMap {
    fd: u32,
    serial: u32,
    /// (device, inode) of the file, to tell when the peer's descriptor names another one.
    id: (u64, u64),
    ptr: NonNull<u8>,
    len: usize,
    /// When it was last used (a counter), for eviction.
    used: u64,
}

/// A receiver's mappings of one peer process's shared buffers.
#[derive(Debug)]
pub(crate) struct PeerMaps {
    pid: u32,
    maps: Vec<PeerMap>,
    clock: u64,
}

// SAFETY: the mappings are read-only views owned by this value.
unsafe impl Send for PeerMaps {}

impl PeerMaps {
    pub fn new(pid: u32) -> PeerMaps {
        PeerMaps {
            pid,
            maps: Vec::new(),
            clock: 0,
        }
    }

    /// `len` bytes at `at` in the peer's buffer, mapped now if they are not yet. The view stays
    /// valid until the next call on `self` (which may unmap other buffers).
    pub fn view(&mut self, at: Located, len: usize) -> std::result::Result<&[u8], String> {
        self.clock += 1;
        let i = match self
            .maps
            .iter()
            .position(|m| m.fd == at.fd && m.serial == at.serial)
        {
            Some(i) => i,
            None => {
                let m = self.map(at)?;
                self.sweep();
                self.maps.push(m);
                self.maps.len() - 1
            }
        };
        let m = &mut self.maps[i];
        m.used = self.clock;
        let end = at
            .offset
            .checked_add(len as u64)
            .filter(|&e| e <= m.len as u64)
            .ok_or_else(|| {
                format!(
                    "{} bytes at offset {} are past the end of shared buffer {} ({} bytes)",
                    len, at.offset, at.serial, m.len
                )
            })?;
        // SAFETY: `offset..end` lies inside the live read-only mapping `m`, which the peer
        // never shrinks (`SharedMem` is never resized), and stays mapped while `self` is
        // borrowed.
        Ok(unsafe {
            std::slice::from_raw_parts(
                m.ptr.as_ptr().add(at.offset as usize),
                (end - at.offset) as usize,
            )
        })
    }

    fn proc_path(&self, fd: u32) -> String {
        format!("/proc/{}/fd/{fd}", self.pid)
    }

    fn map(&self, at: Located) -> std::result::Result<PeerMap, String> {
        let path = self.proc_path(at.fd);
        let cpath = CString::new(path.clone()).expect("no NUL in the path");
        // SAFETY: a valid C string; the descriptor is owned below.
        let raw = unsafe { libc::open(cpath.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if raw < 0 {
            return Err(format!(
                "opening {path}: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: a descriptor this call just opened.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // What was opened, by its own name: the peer's descriptor may have changed since the
        // frame was written only if the peer broke the protocol, but check it is its buffer.
        let target = std::fs::read_link(format!("/proc/self/fd/{raw}"))
            .map_err(|e| format!("reading the name of {path}: {e}"))?;
        let want = format!("/memfd:{NAME_PREFIX}{}", at.serial);
        let target = target.to_string_lossy();
        if target != want && !target.starts_with(&format!("{want} ")) {
            return Err(format!(
                "{path} is {target}, not shared buffer {} of process {}",
                at.serial, self.pid
            ));
        }
        let st = fstat(&fd).map_err(|e| format!("fstat of {path}: {e}"))?;
        let len = st.st_size as usize;
        if len == 0 {
            return Err(format!("{path} is empty"));
        }
        // SAFETY: a read-only shared mapping of the whole file, which its owner never shrinks.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!(
                "mapping {path}: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(PeerMap {
            fd: at.fd,
            serial: at.serial,
            id: (st.st_dev, st.st_ino),
            ptr: NonNull::new(p.cast::<u8>()).expect("mmap returned a non-null address"),
            len,
            used: self.clock,
        })
    }

    /// Unmaps buffers the peer has freed (its descriptor is gone or names another file), then
    /// the least recently used ones beyond [`MAX_MAPS`] - 1.
    fn sweep(&mut self) {
        let mut i = 0;
        while i < self.maps.len() {
            let m = &self.maps[i];
            let same = std::fs::metadata(self.proc_path(m.fd))
                .map(|st| {
                    use std::os::unix::fs::MetadataExt;
                    (st.dev(), st.ino()) == m.id
                })
                .unwrap_or(false);
            if same {
                i += 1;
            } else {
                unmap(self.maps.swap_remove(i));
            }
        }
        while self.maps.len() >= MAX_MAPS {
            let oldest = (0..self.maps.len())
                .min_by_key(|&i| self.maps[i].used)
                .expect("maps is not empty");
            unmap(self.maps.swap_remove(oldest));
        }
    }

    /// Peer buffers mapped now.
    #[cfg(test)]
    pub fn mapped(&self) -> usize {
        self.maps.len()
    }
}

fn unmap(m: PeerMap) {
    // SAFETY: a mapping made by `PeerMaps::map`, dropped from the list, so no view of it is
    // alive (views borrow the `PeerMaps`).
    unsafe { libc::munmap(m.ptr.as_ptr().cast(), m.len) };
}

impl Drop for PeerMaps {
    fn drop(&mut self) {
        for m in self.maps.drain(..) {
            unmap(m);
        }
    }
}

fn fstat(fd: &OwnedFd) -> std::io::Result<libc::stat> {
    // SAFETY: `stat` is plain data; zeroes are a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a live descriptor and a valid out pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_found_by_any_range_inside_it_and_forgotten_when_freed() {
        let mut a = SharedMem::new(10_000).unwrap();
        assert_eq!(a.len(), 10_000);
        assert!(a.as_slice().iter().all(|&b| b == 0));
        a.as_mut_slice()[5] = 7;
        let base = a.as_slice().as_ptr() as usize;
        let at = locate(base + 100, 200).unwrap();
        assert_eq!(at.offset, 100);
        assert_eq!(Located::decode(at.encode().0, at.encode().1), at);
        assert!(locate(base + 9_900, 200).is_none(), "past the end");
        assert!(locate(base + 9_800, 200).is_some());
        let v = [0u8; 64];
        assert!(locate(v.as_ptr() as usize, 64).is_none());
        drop(a);
        assert!(locate(base + 100, 200).is_none());
    }

    #[test]
    fn a_peer_maps_the_buffer_through_proc_and_sees_writes() {
        let mut a = SharedMem::new(1 << 16).unwrap();
        a.as_mut_slice()[..4].copy_from_slice(&[1, 2, 3, 4]);
        let at = locate(a.as_slice().as_ptr() as usize + 1, 3).unwrap();
        let mut maps = PeerMaps::new(std::process::id());
        assert_eq!(maps.view(at, 3).unwrap(), &[2, 3, 4]);
        a.as_mut_slice()[2] = 9;
        assert_eq!(maps.view(at, 3).unwrap(), &[2, 9, 4]);
        let err = maps.view(at, 1 << 20).unwrap_err();
        assert!(err.contains("past the end"), "{err}");
        // Another buffer: the freed first one is unmapped when the second is mapped.
        drop(a);
        let b = SharedMem::new(4096).unwrap();
        let at_b = locate(b.as_slice().as_ptr() as usize, 1).unwrap();
        maps.view(at_b, 1).unwrap();
        assert_eq!(maps.mapped(), 1);
    }

    #[test]
    fn a_descriptor_that_is_not_a_shared_buffer_is_refused() {
        let f = std::fs::File::open("/proc/self/status").unwrap();
        let at = Located {
            fd: f.as_raw_fd() as u32,
            serial: 1,
            offset: 0,
        };
        let err = PeerMaps::new(std::process::id()).view(at, 1).unwrap_err();
        assert!(err.contains("not shared buffer"), "{err}");
    }
}
