//! The host provider (**test stand-in**, `FERRO_P2P_PROVIDER=host`): "device memory" is a file
//! in `/dev/shm` mapped by both ranks, its "IPC handle" the file name (plus an offset), copies
//! are `memcpy`. It runs the transport's protocol where there is no GPU, in one process or
//! across processes of one host.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferroccl_transport::{Error, Payload, PayloadMut, Result};
use memmap2::{MmapMut, MmapOptions};

/// A mapped data file: this rank's slots (owner) or a peer's (opened).
#[derive(Debug)]
pub(crate) struct HostMap {
    ptr: *mut u8,
    len: usize,
    path: PathBuf,
    owner: bool,
    _map: MmapMut,
}

// SAFETY: the bytes are reached only through `put` / `get`, whose ranges the ring protocol
// keeps disjoint between the two ranks (a slot is written by the sender before its flag and
// read by the receiver after it, then handed back).
unsafe impl Send for HostMap {}
// SAFETY: as above.
unsafe impl Sync for HostMap {}

impl HostMap {
    /// Creates and maps `dir/name` of `len` bytes.
    pub fn create(dir: &Path, name: &str, len: usize) -> Result<HostMap> {
        let path = dir.join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| Error::io(format_args!("creating {}", path.display()), &e))?;
        let made = file
            .set_len(len as u64)
            .map_err(|e| Error::io(format_args!("sizing {}", path.display()), &e))
            .and_then(|()| HostMap::map(&file, len, &path, true));
        if made.is_err() {
            let _ = std::fs::remove_file(&path);
        }
        made
    }

    /// Maps the peer's `dir/name`, which must hold at least `len` bytes.
    pub fn open(dir: &Path, name: &str, len: usize) -> Result<HostMap> {
        let path = dir.join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(format_args!("opening {}", path.display()), &e))?;
        let have = file
            .metadata()
            .map_err(|e| Error::io(format_args!("reading the size of {}", path.display()), &e))?
            .len() as usize;
        if have < len {
            return Err(Error::remote(format!(
                "{} holds {have} bytes, expected at least {len}",
                path.display()
            )));
        }
        HostMap::map(&file, len, &path, false)
    }

    fn map(file: &std::fs::File, len: usize, path: &Path, owner: bool) -> Result<HostMap> {
        // SAFETY: a data file only ferroccl ranks open, at least `len` bytes long (set or
        // checked by the caller); its bytes are reached only through `put` / `get`.
        let mut map = unsafe { MmapOptions::new().len(len.max(1)).populate().map_mut(file) }
            .map_err(|e| Error::io(format_args!("mapping {}", path.display()), &e))?;
        Ok(HostMap {
            ptr: map.as_mut_ptr(),
            len,
            path: path.to_path_buf(),
            owner,
            _map: map,
        })
    }

    /// Removes the file's name (the owner's, once every peer has mapped it).
    pub fn unlink(&self) {
        if self.owner {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    fn range(&self, at: usize, n: usize) -> Result<*mut u8> {
        if at.checked_add(n).is_none_or(|e| e > self.len) {
            return Err(Error::internal(format!(
                "p2p host provider: bytes {at}..{} past a {}-byte buffer",
                at.saturating_add(n),
                self.len
            )));
        }
        // SAFETY: `at + n <= len`: in bounds of the mapping.
        Ok(unsafe { self.ptr.add(at) })
    }
}

impl Drop for HostMap {
    fn drop(&mut self) {
        self.unlink();
    }
}

/// Copies `src[off..off + n]` to byte `at` of `map` (memcpy: done when it returns).
pub(crate) fn put(
    map: &Arc<HostMap>,
    at: usize,
    src: &Payload<'_>,
    off: usize,
    n: usize,
) -> Result<()> {
    let src = match src {
        Payload::Host(b) => *b,
        // SAFETY: with the host stand-in device provider, device memory is heap memory of this
        // process (see `stand_in_device`); the caller vouches that `m` is live for the call,
        // as for any payload.
        Payload::Device(m) if super::stand_in_device() => unsafe {
            std::slice::from_raw_parts(m.addr as *const u8, m.len)
        },
        Payload::Device(m) => return Err(no_device(m.space)),
    };
    let from = src
        .get(off..off + n)
        .ok_or_else(|| Error::internal("p2p host provider: source range past the payload"))?;
    let to = map.range(at, n)?;
    // SAFETY: `to..to + n` lies in the mapping (checked), which `map` keeps alive; the slot is
    // this sender's until its flag is out (ring protocol); `from` is a distinct live slice.
    unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), to, n) };
    Ok(())
}

/// Copies `n` bytes at byte `at` of `map` to `dst[off..off + n]`.
pub(crate) fn get(
    map: &Arc<HostMap>,
    at: usize,
    dst: &mut PayloadMut<'_>,
    off: usize,
    n: usize,
) -> Result<()> {
    let dst = match dst {
        PayloadMut::Host(b) => &mut **b,
        // SAFETY: as in `put`; the receive's destination is written by nothing else during it.
        PayloadMut::Device(m) if super::stand_in_device() => unsafe {
            std::slice::from_raw_parts_mut(m.addr as *mut u8, m.len)
        },
        PayloadMut::Device(m) => return Err(no_device(m.space)),
    };
    let to = dst
        .get_mut(off..off + n)
        .ok_or_else(|| Error::internal("p2p host provider: destination range past the buffer"))?;
    let from = map.range(at, n)?;
    // SAFETY: `from..from + n` lies in the mapping (checked), alive through `map`; the slot's
    // flag is out and the sender does not touch it until it is handed back (ring protocol).
    unsafe { std::ptr::copy_nonoverlapping(from, to.as_mut_ptr(), n) };
    Ok(())
}

/// The `n` bytes at `at` of the mapping, lent to the caller.
pub(crate) fn lend(map: &Arc<HostMap>, at: usize, n: usize) -> Result<Payload<'_>> {
    let from = map.range(at, n)?;
    // SAFETY: `from..from + n` lies in the mapping (checked), alive while `map` is borrowed;
    // the slot's flag is out and the sender does not touch it until it is handed back (ring
    // protocol), which happens only after the borrow ends.
    Ok(Payload::Host(unsafe {
        std::slice::from_raw_parts(from, n)
    }))
}

fn no_device(space: ferroccl_transport::MemSpace) -> Error {
    Error::internal(format!(
        "the p2p transport's host provider (a test stand-in) cannot reach {space} memory"
    ))
}
