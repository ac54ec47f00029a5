//! The control segment: one file per rank in `/dev/shm` holding the flags of every incoming
//! ring (the payload slots live in the provider's memory, on the GPU for the cuda provider).
//!
//! The segment is viewed as an array of 64-bit atomic words and nothing else, so that every
//! access across processes is atomic. Layout (byte offsets):
//!
//! | at | what |
//! |---|---|
//! | 0 | header words: magic (written last, Release), version, communicator id, owner rank, owner pid, blocks, slots per ring |
//! | 2048 | the owner's doorbell word, then (4 bytes on) its sleeper count |
//! | 4096 + i × block | block `i`: the ring of one sending peer (see [`Block`]) |
//!
//! A block: word 0 the sender's rank + 1; word 1 `SENDER_CLOSED`; word 2 `RECEIVER_CLOSED`;
//! byte 64 the tail (slots the receiver has emptied, ever: the sender's credit); byte 128 +
//! 64 × s the flag line of slot `s` (8 words, see `proto::Line`); after the last line, the two
//! boxes of the sender's small-message lane (128 bytes each, shared memory's `LaneBox`).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use ferroccl_transport::{Error, Result};
use ferroccl_transport_shm::{Bell, LaneBox};
use memmap2::{MmapMut, MmapOptions};

use crate::proto::LINE_WORDS;

const MAGIC: u64 = 0x5032_5053_4c43_5246; // "FRCLSP2P"
/// 2: blocks end with the small-message lane's boxes.
const VERSION: u64 = 2;
const HDR_BYTES: usize = 4096;
const BELL_OFF: usize = 2048;
const SLEEPERS_OFF: usize = BELL_OFF + 4;
const H_MAGIC: usize = 0;
const H_VERSION: usize = 1;
const H_COMM: usize = 2;
const H_RANK: usize = 3;
const H_PID: usize = 4;
const H_BLOCKS: usize = 5;
const H_SLOTS: usize = 6;
const H_PID_NS: usize = 7;

/// Block word: the sending peer's rank plus one.
const B_PRODUCER: usize = 0;
/// Block flag words.
pub(crate) const SENDER_CLOSED: usize = 1;
/// Set by the receiver when it shuts the connection down.
pub(crate) const RECEIVER_CLOSED: usize = 2;
const B_TAIL: usize = 8;
const B_LINES: usize = 16;

/// Byte offset, in a block with `nslots` flag lines, of the lane's first box (64-aligned: the
/// lines are whole cache lines).
fn lane_offset(nslots: usize) -> usize {
    B_LINES * 8 + nslots * LINE_WORDS * 8
}

/// Bytes of one block with `nslots` flag lines.
fn block_bytes(nslots: usize) -> usize {
    (lane_offset(nslots) + 2 * std::mem::size_of::<LaneBox>()).next_multiple_of(4096)
}

/// A mapped control segment: 64-bit words shared with other processes.
#[derive(Debug)]
pub(crate) struct Shared {
    ptr: *mut u8,
    len: usize,
    _map: MmapMut,
}

// SAFETY: the mapping is shared memory reached only through atomics (`word`, `bell`).
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

impl Shared {
    fn map(file: &File, len: usize, path: &Path) -> Result<Shared> {
        // SAFETY: the file is a control segment only ferroccl ranks open, at least `len` bytes
        // long (set or checked by the caller); all access goes through atomic words.
        let mut map = unsafe { MmapOptions::new().len(len).populate().map_mut(file) }
            .map_err(|e| Error::io(format_args!("mapping {}", path.display()), &e))?;
        Ok(Shared {
            ptr: map.as_mut_ptr(),
            len,
            _map: map,
        })
    }

    /// The 64-bit word at byte `off` (8-aligned, in bounds: checked).
    pub(crate) fn word(&self, off: usize) -> &AtomicU64 {
        assert!(
            off.is_multiple_of(8) && off + 8 <= self.len,
            "word at {off} of a {}-byte segment",
            self.len
        );
        // SAFETY: in bounds and 8-aligned (asserted; the mapping is page-aligned), mapped while
        // `self` lives; any bit pattern is a valid AtomicU64 and every access is atomic.
        unsafe { &*self.ptr.add(off).cast::<AtomicU64>() }
    }

    /// The lane box at byte `off` (64-aligned, in bounds: checked).
    fn lane_box(&self, off: usize) -> &LaneBox {
        let size = std::mem::size_of::<LaneBox>();
        assert!(
            off.is_multiple_of(std::mem::align_of::<LaneBox>()) && off + size <= self.len,
            "lane box at {off} of a {}-byte segment",
            self.len
        );
        // SAFETY: in bounds and aligned for `LaneBox` (asserted; the mapping is page-aligned),
        // mapped while `self` lives. A `LaneBox` is atomic words only (any bit pattern is a
        // valid value, all zeros an empty box) and every access to it is atomic, so peers that
        // write it at the same time cannot cause undefined behaviour here.
        unsafe { &*self.ptr.add(off).cast::<LaneBox>() }
    }

    fn header(&self, i: usize) -> u64 {
        // Relaxed: read after the Acquire load of the magic (or by the owner).
        self.word(i * 8).load(Ordering::Relaxed)
    }
}

/// The doorbell of the segment in `shared`.
pub(crate) fn bell(shared: &Arc<Shared>) -> Arc<Bell> {
    let word = shared.word(BELL_OFF & !7);
    let base = (word as *const AtomicU64).cast::<AtomicU32>();
    // SAFETY: bytes BELL_OFF..BELL_OFF+8 are the doorbell and sleeper words (4-aligned, in
    // bounds: `word` checked the 8 bytes), mapped while the Arc lives and only used atomically.
    unsafe {
        Arc::new(Bell::from_raw(
            base,
            base.add((SLEEPERS_OFF - BELL_OFF) / 4),
            Arc::clone(shared) as Arc<dyn std::any::Any + Send + Sync>,
        ))
    }
}

/// One sending peer's ring flags inside a segment.
#[derive(Debug, Clone)]
pub(crate) struct Block {
    shared: Arc<Shared>,
    base: usize,
    nslots: usize,
}

impl Block {
    /// Word `i` of the block.
    pub(crate) fn word(&self, i: usize) -> &AtomicU64 {
        self.shared.word(self.base + i * 8)
    }

    /// Whether flag `i` (`SENDER_CLOSED`, `RECEIVER_CLOSED`) is set.
    pub(crate) fn flag(&self, i: usize) -> bool {
        // Acquire: pairs with the Release store that set it; what the setter did before
        // (its last flag lines, its credit) is visible.
        self.word(i).load(Ordering::Acquire) != 0
    }

    /// Sets flag `i`.
    pub(crate) fn set_flag(&self, i: usize) {
        // Release: see `flag`.
        self.word(i).store(1, Ordering::Release);
    }

    /// The tail: slots the receiver has emptied, ever.
    pub(crate) fn tail(&self) -> &AtomicU64 {
        self.word(B_TAIL)
    }

    /// Box `n % 2` of the lane that carries message `n` from the block's sender.
    pub(crate) fn lane_box(&self, n: u64) -> &LaneBox {
        let b = (n % 2) as usize;
        self.shared
            .lane_box(self.base + lane_offset(self.nslots) + b * std::mem::size_of::<LaneBox>())
    }

    /// Word `w` of slot `s`'s flag line.
    pub(crate) fn line(&self, s: usize, w: usize) -> &AtomicU64 {
        assert!(s < self.nslots && w < LINE_WORDS);
        self.word(B_LINES + s * LINE_WORDS + w)
    }
}

/// This rank's control segment.
#[derive(Debug)]
pub(crate) struct OwnCtl {
    pub shared: Arc<Shared>,
    path: PathBuf,
    /// The sending rank of each block.
    pub senders: Vec<usize>,
    pub nslots: usize,
    unlinked: bool,
}

impl OwnCtl {
    /// Creates `dir/name` with one block of `nslots` lines per rank of `senders`.
    pub fn create(
        dir: &Path,
        name: &str,
        comm_id: u64,
        rank: usize,
        senders: &[usize],
        nslots: usize,
    ) -> Result<OwnCtl> {
        let path = dir.join(name);
        let len = HDR_BYTES + senders.len() * block_bytes(nslots);
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
            .and_then(|()| Shared::map(&file, len, &path));
        let shared = match made {
            Ok(s) => Arc::new(s),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        let put = |i: usize, v: u64| shared.word(i * 8).store(v, Ordering::Relaxed);
        put(H_VERSION, VERSION);
        put(H_COMM, comm_id);
        put(H_RANK, rank as u64);
        put(H_PID, u64::from(std::process::id()));
        put(H_BLOCKS, senders.len() as u64);
        put(H_SLOTS, nslots as u64);
        put(H_PID_NS, ferroccl_transport_shm::namespace_inode("pid"));
        let own = OwnCtl {
            shared,
            path,
            senders: senders.to_vec(),
            nslots,
            unlinked: false,
        };
        for (i, &s) in senders.iter().enumerate() {
            own.block(i)
                .word(B_PRODUCER)
                .store(s as u64 + 1, Ordering::Relaxed);
        }
        // Release: the header and blocks above are visible to a peer that reads the magic.
        own.shared.word(H_MAGIC).store(MAGIC, Ordering::Release);
        Ok(own)
    }

    /// Block `i`.
    pub fn block(&self, i: usize) -> Block {
        Block {
            shared: Arc::clone(&self.shared),
            base: HDR_BYTES + i * block_bytes(self.nslots),
            nslots: self.nslots,
        }
    }

    /// Removes the name (idempotent); the memory stays while mapped.
    pub fn unlink(&mut self) {
        if !self.unlinked {
            self.unlinked = true;
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for OwnCtl {
    fn drop(&mut self) {
        self.unlink();
    }
}

/// A peer's control segment, mapped to produce into its block for this rank.
#[derive(Debug)]
pub(crate) struct PeerCtl {
    pub shared: Arc<Shared>,
    pub block: Block,
    pub owner_pid: u32,
}

impl PeerCtl {
    /// Maps `dir/name`, made by rank `owner` of communicator `comm_id`, and finds the block
    /// where `me` produces; `nslots` must match this rank's.
    pub fn open(
        dir: &Path,
        name: &str,
        comm_id: u64,
        owner: usize,
        me: usize,
        nslots: usize,
    ) -> Result<PeerCtl> {
        let path = dir.join(name);
        let bad = |why: String| {
            Error::remote(format!(
                "rank {me}: p2p control segment {} of rank {owner}: {why}",
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
        let shared = Arc::new(Shared::map(&file, len, &path)?);
        // Acquire: pairs with the owner's Release store; the header is complete.
        let magic = shared.word(H_MAGIC).load(Ordering::Acquire);
        if magic != MAGIC || shared.header(H_VERSION) != VERSION {
            return Err(bad(format!("magic {magic:#x} is not a p2p segment's")));
        }
        if shared.header(H_COMM) != comm_id || shared.header(H_RANK) != owner as u64 {
            return Err(bad(format!(
                "belongs to communicator {:#018x} rank {}",
                shared.header(H_COMM),
                shared.header(H_RANK)
            )));
        }
        let (blocks, theirs) = (
            shared.header(H_BLOCKS) as usize,
            shared.header(H_SLOTS) as usize,
        );
        if theirs != nslots {
            return Err(bad(format!(
                "rings of {theirs} slots, this rank uses {nslots} (FERRO_P2P_SLOTS must agree)"
            )));
        }
        if HDR_BYTES + blocks * block_bytes(nslots) > len {
            return Err(bad(format!("{blocks} blocks do not fit in {len} bytes")));
        }
        let block = (0..blocks)
            .map(|i| Block {
                shared: Arc::clone(&shared),
                base: HDR_BYTES + i * block_bytes(nslots),
                nslots,
            })
            .find(|b| b.word(B_PRODUCER).load(Ordering::Relaxed) == me as u64 + 1)
            .ok_or_else(|| bad(format!("has no ring for rank {me}")))?;
        Ok(PeerCtl {
            owner_pid: shared.header(H_PID) as u32,
            shared,
            block,
        })
    }
}

/// Removes the control segments in `dir` (and the host provider's slot files beside them) of
/// ranks whose process is gone: a rank killed between `listen` and `connect` leaves both.
/// Only complete headers count (magic written, the owner's pid namespace this process's, its
/// pid gone); anything else stays. Returns how many segments it removed. Best effort.
pub(crate) fn sweep(dir: &Path) -> usize {
    use std::os::unix::fs::FileExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let my_ns = ferroccl_transport_shm::namespace_inode("pid");
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(stem) = name
            .to_str()
            .filter(|n| n.starts_with(crate::FILE_PREFIX))
            .and_then(|n| n.strip_suffix("-ctl"))
        else {
            continue;
        };
        let Ok(file) = File::open(entry.path()) else {
            continue;
        };
        let mut h = [0u8; 64];
        if my_ns == 0 || file.read_exact_at(&mut h, 0).is_err() {
            continue;
        }
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&h[i * 8..i * 8 + 8]);
            u64::from_ne_bytes(w)
        };
        let pid = word(H_PID);
        if word(H_MAGIC) != MAGIC
            || word(H_PID_NS) != my_ns
            || pid == u64::from(std::process::id())
            || !u32::try_from(pid).is_ok_and(crate::alive::is_gone)
        {
            continue;
        }
        if std::fs::remove_file(entry.path()).is_ok() {
            let _ = std::fs::remove_file(dir.join(format!("{stem}-slots")));
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_removes_the_files_of_dead_owners_only() {
        let dir = std::env::temp_dir().join(crate::file_name(0, 0, "sweep"));
        std::fs::create_dir_all(&dir).unwrap();
        // A pid that is surely gone: a child that ran and was reaped.
        let dead = std::process::Command::new("true")
            .spawn()
            .and_then(|mut c| c.wait().map(|_| c.id()))
            .unwrap();
        let mut made = Vec::new();
        for (rank, owner) in [(0, dead), (1, std::process::id())] {
            let name = crate::file_name(5, rank, "ctl");
            let mut own = OwnCtl::create(&dir, &name, 5, rank, &[1 - rank], 2).unwrap();
            own.shared
                .word(H_PID * 8)
                .store(u64::from(owner), Ordering::Relaxed);
            let slots = name.replace("-ctl", "-slots");
            std::fs::write(dir.join(&slots), b"x").unwrap();
            // Keep the files: forget the owner's unlink.
            own.unlinked = true;
            made.push((name, slots));
        }
        assert_eq!(sweep(&dir), 1);
        let left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            !left.contains(&made[0].0) && !left.contains(&made[0].1),
            "{left:?}"
        );
        assert!(
            left.contains(&made[1].0) && left.contains(&made[1].1),
            "{left:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
