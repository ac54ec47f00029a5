//! Segments: one file per rank in `/dev/shm` holding its doorbell and one incoming ring per
//! peer on its host.
//!
//! Layout (offsets in bytes):
//!
//! | at | what |
//! |---|---|
//! | 0 | [`SegHeader`]: magic, version, communicator id, owner rank and pid, ring size, probe |
//! | 2048 | the owner's doorbell word, then (4 bytes on) its sleeper count |
//! | 4096 + i × (4096 + ring) | slot `i`: [`SlotCtl`] (ring control + producer rank), then the ring's data |
//!
//! The owner creates the file (`O_EXCL`, mode 0600), reserves its pages with `posix_fallocate`
//! (so that a full `/dev/shm` is an error now, not a SIGBUS later), writes the header with the
//! magic last (Release), and publishes the name. Peers map it and check the header. Once every
//! peer that will use it has mapped it, the owner unlinks the name: the memory lives on while
//! mapped and vanishes with the last mapping, so a crash after that leaves nothing behind. An
//! owner killed before it unlinks leaves the file; before creating its own, a rank removes the
//! files of owners that are gone ([`sweep_dead_segments`](crate::sweep_dead_segments)).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64 as StdAtomicU64, Ordering as StdOrdering};
use std::sync::Arc;

use ferroccl_transport::{Error, ErrorKind, Result};
use memmap2::{MmapMut, MmapOptions};

use crate::bell::Bell;
use crate::lane::LaneBox;
use crate::ring::RingCtl;

const SEG_MAGIC: u64 = 0x4d48_5353_4c43_5246; // "FRCLSSHM"
const SEG_VERSION: u32 = 3;
/// Bytes before the first slot.
pub(crate) const HDR_BYTES: usize = 4096;
/// Bytes of a slot's control page.
pub(crate) const CTL_BYTES: usize = 4096;
const BELL_OFF: usize = 2048;
const SLEEPERS_OFF: usize = BELL_OFF + 4;

/// The first bytes of a segment. Written by the owner before it publishes the name; `magic` last.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct SegHeader {
    magic: StdAtomicU64,
    version: u32,
    nslots: u32,
    ring_bytes: u64,
    comm_id: u64,
    owner_rank: u64,
    owner_pid: u64,
    /// The owner's pid namespace (nsfs inode): its pid means something only to peers in the same.
    pid_ns: u64,
    /// Address and value of a word in the owner's memory that peers read with
    /// `process_vm_readv` to learn whether cross-memory attach works.
    probe_addr: u64,
    probe_value: u64,
}

/// A slot's control page: the ring's counters and flags, and which rank produces into it.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct SlotCtl {
    pub ring: RingCtl,
    /// The producer's rank plus one (0: unused slot).
    pub producer: u64,
    /// The small-message lane's boxes, written by the producer (see `lane.rs`).
    pub lane: [LaneBox; 2],
}

const _: () = assert!(std::mem::size_of::<SlotCtl>() <= CTL_BYTES);

/// A shared mapping of a segment, kept alive by every ring, bell and connection that points into it.
#[derive(Debug)]
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
    _map: MmapMut,
}

// SAFETY: the mapping is shared memory accessed only through atomics and the ring protocol.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(file: &File, len: usize) -> std::io::Result<Mapping> {
        // Populated: the page tables are filled now, so that the data path never takes a page
        // fault on a ring page touched for the first time.
        // SAFETY: the file is a segment only ferroccl ranks open; its size is at least `len`
        // (checked or set by the caller), and all concurrent access goes through atomics or the
        // ring protocol, never through references to plain bytes.
        let mut map = unsafe { MmapOptions::new().len(len).populate().map_mut(file)? };
        let ptr = map.as_mut_ptr();
        Ok(Mapping {
            ptr,
            len,
            _map: map,
        })
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is mapped (never, for a segment).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Pointer to byte `off` (`off <= len`).
    pub(crate) fn at(&self, off: usize) -> *mut u8 {
        assert!(
            off <= self.len,
            "offset {off} past a mapping of {}",
            self.len
        );
        // SAFETY: `off <= len`: in bounds or one past the end.
        unsafe { self.ptr.add(off) }
    }

    fn header(&self) -> &SegHeader {
        // SAFETY: the mapping is at least HDR_BYTES long and page-aligned; the header's plain
        // fields are written only before the name is published (or, for a mapping made by a
        // peer, before the Release store of `magic` that `open` reads with Acquire).
        unsafe { &*self.ptr.cast::<SegHeader>() }
    }

    /// The control page of slot `i` (bounds checked by the caller's layout).
    pub(crate) fn slot_ctl(&self, i: usize, ring_bytes: usize) -> &SlotCtl {
        let off = HDR_BYTES + i * (CTL_BYTES + ring_bytes);
        assert!(off + CTL_BYTES + ring_bytes <= self.len);
        // SAFETY: in bounds (asserted) and page-aligned; all fields are atomics except
        // `producer`, written by the owner before publishing the name.
        unsafe { &*self.at(off).cast::<SlotCtl>() }
    }

    /// Offset of slot `i`'s data bytes.
    pub(crate) fn slot_data(&self, i: usize, ring_bytes: usize) -> usize {
        HDR_BYTES + i * (CTL_BYTES + ring_bytes) + CTL_BYTES
    }
}

/// Bytes of a segment with `nslots` rings of `ring_bytes`.
pub fn segment_bytes(nslots: usize, ring_bytes: usize) -> usize {
    HDR_BYTES + nslots * (CTL_BYTES + ring_bytes)
}

/// A word whose address and value peers probe with cross-memory attach.
static PROBE: StdAtomicU64 = StdAtomicU64::new(0);

fn probe_word() -> (u64, u64) {
    let v = 0x7072_6f62_6566_7272u64 ^ u64::from(std::process::id());
    PROBE.store(v, StdOrdering::SeqCst);
    (PROBE.as_ptr() as u64, v)
}

/// This rank's own segment.
#[derive(Debug)]
pub struct OwnSegment {
    pub(crate) map: Arc<Mapping>,
    path: PathBuf,
    name: String,
    /// Rank producing into each slot.
    pub(crate) slot_ranks: Vec<usize>,
    pub(crate) ring_bytes: usize,
    pub(crate) rank: usize,
    unlinked: bool,
    /// Segments of dead owners removed from the directory before this one was created.
    swept: usize,
}

impl OwnSegment {
    /// Creates `dir/name` with one ring of `ring_bytes` (a power of two, at least 4096) per rank
    /// in `peers`. A full file system is an `Unsupported` error that says so, so that the caller
    /// can fall back to another transport.
    ///
    /// First removes the segments in `dir` whose owner process is gone
    /// ([`sweep_dead_segments`](crate::sweep_dead_segments)); [`swept`](Self::swept) says how many.
    pub fn create(
        dir: &Path,
        name: &str,
        comm_id: u64,
        rank: usize,
        peers: &[usize],
        ring_bytes: usize,
    ) -> Result<OwnSegment> {
        if !ring_bytes.is_power_of_two() || ring_bytes < 4096 {
            return Err(Error::invalid_argument(format!(
                "shared-memory ring of {ring_bytes} bytes: expected a power of two of at least 4096"
            )));
        }
        let swept = crate::sweep_dead_segments(dir);
        let path = dir.join(name);
        let len = segment_bytes(peers.len(), ring_bytes);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| Error::io(format_args!("creating {}", path.display()), &e))?;
        let map = match Self::init_file(&file, &path, len, peers, comm_id, rank, ring_bytes) {
            Ok(m) => m,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        Ok(OwnSegment {
            map: Arc::new(map),
            path,
            name: name.to_string(),
            slot_ranks: peers.to_vec(),
            ring_bytes,
            rank,
            unlinked: false,
            swept,
        })
    }

    /// Reserves, maps and fills in a freshly created segment file.
    fn init_file(
        file: &File,
        path: &Path,
        len: usize,
        peers: &[usize],
        comm_id: u64,
        rank: usize,
        ring_bytes: usize,
    ) -> Result<Mapping> {
        let dir = path.parent().unwrap_or(path);
        // SAFETY: fallocate on a live descriptor we own; no memory is passed.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
        match rc {
            0 => {}
            libc::ENOSPC => {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "{} has no room for a {len}-byte shared-memory segment ({} rings of {ring_bytes} bytes); \
                         enlarge it (e.g. docker --shm-size) or lower FERRO_SHM_RING_BYTES",
                        dir.display(),
                        peers.len()
                    ),
                ))
            }
            libc::EOPNOTSUPP | libc::EINVAL => file
                .set_len(len as u64)
                .map_err(|e| Error::io(format_args!("sizing {}", path.display()), &e))?,
            e => {
                return Err(Error::io(
                    format_args!("reserving {len} bytes for {}", path.display()),
                    &std::io::Error::from_raw_os_error(e),
                ))
            }
        }
        let map = Mapping::new(file, len)
            .map_err(|e| Error::io(format_args!("mapping {}", path.display()), &e))?;
        let (probe_addr, probe_value) = probe_word();
        // SAFETY: the mapping is fresh, private to this rank until the name is published, at
        // least HDR_BYTES long and page-aligned.
        unsafe {
            let h = map.ptr.cast::<SegHeader>();
            (*h).version = SEG_VERSION;
            (*h).nslots = peers.len() as u32;
            (*h).ring_bytes = ring_bytes as u64;
            (*h).comm_id = comm_id;
            (*h).owner_rank = rank as u64;
            (*h).owner_pid = u64::from(std::process::id());
            (*h).pid_ns = crate::host::namespace_inode("pid");
            (*h).probe_addr = probe_addr;
            (*h).probe_value = probe_value;
        }
        for (i, &p) in peers.iter().enumerate() {
            let off = HDR_BYTES + i * (CTL_BYTES + ring_bytes);
            // SAFETY: in bounds (`len` covers every slot), page-aligned, not yet shared.
            unsafe { (*map.at(off).cast::<SlotCtl>()).producer = p as u64 + 1 };
        }
        // Release: everything above is visible to a peer that reads the magic with Acquire.
        map.header().magic.store(SEG_MAGIC, StdOrdering::Release);
        Ok(map)
    }

    /// The file name peers open (in the same directory).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many segments of owners that are gone [`create`](Self::create) removed first.
    pub fn swept(&self) -> usize {
        self.swept
    }

    /// Removes the name from the file system (idempotent); the memory stays while mapped.
    pub fn unlink(&mut self) {
        if !self.unlinked {
            self.unlinked = true;
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// This rank's doorbell.
    pub fn bell(&self) -> Arc<Bell> {
        Arc::new(Bell::new(Arc::clone(&self.map), BELL_OFF, SLEEPERS_OFF))
    }

    pub(crate) fn slot_of(&self, producer: usize) -> Option<usize> {
        self.slot_ranks.iter().position(|&r| r == producer)
    }
}

impl Drop for OwnSegment {
    fn drop(&mut self) {
        self.unlink();
    }
}

/// The owner a segment file's header names: `(pid, pid namespace inode)`. `None` when the
/// header is not complete — the file is shorter than a header, its magic is not written (yet),
/// or it was made by another layout version.
pub(crate) fn header_owner(file: &File) -> std::io::Result<Option<(u64, u64)>> {
    use std::mem::{offset_of, size_of};
    let mut buf = [0u8; size_of::<SegHeader>()];
    match file.read_exact_at(&mut buf, 0) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let word = |off: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&buf[off..off + 8]);
        u64::from_ne_bytes(w)
    };
    let at = offset_of!(SegHeader, version);
    let version = u32::from_ne_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
    if word(offset_of!(SegHeader, magic)) != SEG_MAGIC || version != SEG_VERSION {
        return Ok(None);
    }
    Ok(Some((
        word(offset_of!(SegHeader, owner_pid)),
        word(offset_of!(SegHeader, pid_ns)),
    )))
}

/// Writes a complete header naming owner `pid` in pid namespace `pid_ns` into `file` (tests of
/// the sweep plant such files without creating real segments).
#[cfg(test)]
pub(crate) fn write_test_header(file: &File, pid: u64, pid_ns: u64) -> std::io::Result<()> {
    use std::mem::offset_of;
    file.set_len(HDR_BYTES as u64)?;
    file.write_all_at(
        &SEG_VERSION.to_ne_bytes(),
        offset_of!(SegHeader, version) as u64,
    )?;
    file.write_all_at(&pid.to_ne_bytes(), offset_of!(SegHeader, owner_pid) as u64)?;
    file.write_all_at(&pid_ns.to_ne_bytes(), offset_of!(SegHeader, pid_ns) as u64)?;
    file.write_all_at(
        &SEG_MAGIC.to_ne_bytes(),
        offset_of!(SegHeader, magic) as u64,
    )
}

/// A peer's segment, mapped by this rank.
#[derive(Debug)]
pub struct PeerSegment {
    pub(crate) map: Arc<Mapping>,
    pub(crate) ring_bytes: usize,
    /// This rank's slot in it.
    pub(crate) slot: usize,
    pub(crate) owner_rank: usize,
    pub(crate) owner_pid: u32,
    /// Whether the owner's pid is meaningful here (same pid namespace).
    pub(crate) same_pid_ns: bool,
    pub(crate) probe: (u64, u64),
}

impl PeerSegment {
    /// Maps the segment `dir/name` that rank `owner` created for communicator `comm_id`, and
    /// finds the slot where `my_rank` produces.
    pub fn open(
        dir: &Path,
        name: &str,
        comm_id: u64,
        owner: usize,
        my_rank: usize,
    ) -> Result<PeerSegment> {
        let path = dir.join(name);
        let bad = |why: String| {
            Error::remote(format!(
                "rank {my_rank}: shared-memory segment {} of rank {owner}: {why}",
                path.display()
            ))
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(format_args!("opening {}", path.display()), &e))?;
        let len = file
            .metadata()
            .map_err(|e| Error::io(format_args!("reading the size of {}", path.display()), &e))?
            .len() as usize;
        if len < HDR_BYTES {
            return Err(bad(format!("only {len} bytes")));
        }
        let map = Mapping::new(&file, len)
            .map_err(|e| Error::io(format_args!("mapping {}", path.display()), &e))?;
        let h = map.header();
        // Acquire: pairs with the owner's Release store; the header fields are then complete.
        let magic = h.magic.load(StdOrdering::Acquire);
        if magic != SEG_MAGIC || h.version != SEG_VERSION {
            return Err(bad(format!(
                "magic {magic:#x} version {} (expected {SEG_MAGIC:#x} version {SEG_VERSION})",
                h.version
            )));
        }
        if h.comm_id != comm_id || h.owner_rank != owner as u64 {
            return Err(bad(format!(
                "belongs to communicator {:#018x} rank {}, expected {comm_id:#018x} rank {owner}",
                h.comm_id, h.owner_rank
            )));
        }
        let ring_bytes = h.ring_bytes as usize;
        let nslots = h.nslots as usize;
        if !ring_bytes.is_power_of_two() || segment_bytes(nslots, ring_bytes) > len {
            return Err(bad(format!(
                "{nslots} rings of {ring_bytes} bytes do not fit in {len} bytes"
            )));
        }
        let slot = (0..nslots)
            .find(|&i| map.slot_ctl(i, ring_bytes).producer == my_rank as u64 + 1)
            .ok_or_else(|| bad(format!("has no ring for rank {my_rank}")))?;
        let same_pid_ns = h.pid_ns == crate::host::namespace_inode("pid");
        let out = PeerSegment {
            ring_bytes,
            slot,
            owner_rank: owner,
            owner_pid: h.owner_pid as u32,
            same_pid_ns,
            probe: (h.probe_addr, h.probe_value),
            map: Arc::new(map),
        };
        Ok(out)
    }

    /// The owner's doorbell.
    pub fn bell(&self) -> Arc<Bell> {
        Arc::new(Bell::new(Arc::clone(&self.map), BELL_OFF, SLEEPERS_OFF))
    }
}
