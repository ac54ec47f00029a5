//! The software provider's shared memory and raw memory access: one segment per process in
//! `/dev/shm` (its memory-region table, its queue pairs' inbound immediates, its doorbell),
//! byte copies into a peer's registered memory (a plain copy within the process,
//! `process_vm_writev` across processes), and the futex calls of the doorbell.
//!
//! Every word a peer reads or writes is an atomic; the segment is a file of zeros at first,
//! which is a valid value of every atomic.

use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use memmap2::MmapMut;

/// Memory-region slots per process.
pub(crate) const MR_SLOTS: usize = 4096;
/// Queue-pair slots per process.
pub(crate) const QP_SLOTS: usize = 256;
/// Immediates a queue pair holds before its owner polls them.
pub(crate) const IN_DEPTH: usize = 4096;

const MAGIC: u64 = 0x3174_666f_7362_6966; // "fibsoft1"

/// A memory region as peers see it. `rkey` is published last (Release) and cleared first.
#[repr(C)]
pub(crate) struct MrSlot {
    /// 0: free.
    pub rkey: AtomicU32,
    _pad: AtomicU32,
    pub addr: AtomicU64,
    pub len: AtomicU64,
}

/// One immediate in flight: the value and the bytes its write carried.
#[repr(C)]
pub(crate) struct ImmSlot {
    pub imm: AtomicU32,
    pub len: AtomicU32,
}

/// A queue pair as peers see it. The inbound ring is single-producer (the one remote queue
/// pair of the connection) and single-consumer (the owner): `head` counts immediates
/// written (Release, by the producer), `tail` those taken (Release, by the owner).
#[repr(C)]
pub(crate) struct QpSlot {
    /// [`crate::soft::QpState`] as a number.
    pub state: AtomicU32,
    /// The queue pair number now in the slot (0: none).
    pub qpn: AtomicU32,
    pub head: AtomicU64,
    pub tail: AtomicU64,
    pub ring: [ImmSlot; IN_DEPTH],
}

#[repr(C)]
pub(crate) struct Layout {
    magic: AtomicU64,
    pub pid: AtomicU32,
    /// The doorbell: bumped by peers after each delivery.
    pub bell: AtomicU32,
    /// Owner threads asleep on the doorbell.
    pub waiters: AtomicU32,
    _pad: AtomicU32,
    pub mrs: [MrSlot; MR_SLOTS],
    pub qps: [QpSlot; QP_SLOTS],
}

/// A mapped segment (this process's or a peer's).
pub(crate) struct Segment {
    map: MmapMut,
    pub path: PathBuf,
    /// Whether this process created it (and removes it when dropped).
    owner: bool,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment").field("path", &self.path).finish()
    }
}

/// The directory of the segments.
fn dir() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}

/// The file name of process `pid`'s segment number `nonce`.
pub(crate) fn name(pid: u32, nonce: u64) -> String {
    format!("ferro-ibsoft-{pid}-{nonce:x}")
}

/// Removes segments left by processes that no longer exist (a killed rank cannot remove its
/// own).
fn sweep() {
    let Ok(rd) = std::fs::read_dir(dir()) else {
        return;
    };
    for e in rd.flatten() {
        let n = e.file_name();
        let Some(rest) = n.to_str().and_then(|s| s.strip_prefix("ferro-ibsoft-")) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !pid_alive(pid) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

impl Segment {
    /// Creates this process's segment number `nonce`.
    pub(crate) fn create(nonce: u64) -> std::io::Result<Segment> {
        sweep();
        let path = dir().join(name(std::process::id(), nonce));
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        f.set_len(std::mem::size_of::<Layout>() as u64)?;
        let seg = Segment::map(&f, path, true)?;
        seg.layout()
            .pid
            .store(std::process::id(), Ordering::Relaxed);
        seg.layout().magic.store(MAGIC, Ordering::Release);
        Ok(seg)
    }

    /// Maps process `pid`'s segment number `nonce`.
    pub(crate) fn open(pid: u32, nonce: u64) -> std::io::Result<Segment> {
        let path = dir().join(name(pid, nonce));
        let f = OpenOptions::new().read(true).write(true).open(&path)?;
        if f.metadata()?.len() < std::mem::size_of::<Layout>() as u64 {
            return Err(std::io::Error::other("segment too short"));
        }
        let seg = Segment::map(&f, path, false)?;
        if seg.layout().magic.load(Ordering::Acquire) != MAGIC
            || seg.layout().pid.load(Ordering::Relaxed) != pid
        {
            return Err(std::io::Error::other("not a software-verbs segment"));
        }
        Ok(seg)
    }

    fn map(f: &File, path: PathBuf, owner: bool) -> std::io::Result<Segment> {
        // SAFETY: the file is ours or a peer's segment, sized to the layout; every access to
        // the mapping goes through atomics (see `layout`), so a peer writing at the same time
        // is not a data race.
        let map = unsafe { MmapMut::map_mut(f)? };
        Ok(Segment { map, path, owner })
    }

    /// The segment's words.
    pub(crate) fn layout(&self) -> &Layout {
        debug_assert!(self.map.len() >= std::mem::size_of::<Layout>());
        // SAFETY: the mapping is at least `size_of::<Layout>()` bytes (checked at open and set
        // at create), page aligned (more than any atomic needs), lives as long as `self`, and
        // `Layout` is made of atomics only, for which every bit pattern (zeros at first) is
        // valid and concurrent access from other processes is defined.
        unsafe { &*(self.map.as_ptr() as *const Layout) }
    }

    /// Rings the segment's doorbell.
    pub(crate) fn ring(&self) {
        let l = self.layout();
        l.bell.fetch_add(1, Ordering::Release);
        if l.waiters.load(Ordering::Acquire) > 0 {
            futex_wake(&l.bell);
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if self.owner {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Whether process `pid` exists and has not exited. A process that has exited but not yet been
/// reaped by its parent (a zombie) still answers `kill(pid, 0)`; it counts as gone, as its
/// queue pairs can never answer again.
pub(crate) fn pid_alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 sends nothing; it only checks that the process exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    !exited(pid)
}

/// Whether `/proc` shows process `pid` as exited (zombie or dead). Where `/proc` cannot be
/// read, nothing is known and the answer is no.
fn exited(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which is in parentheses and may itself hold any
    // character: take the text after the last ')'.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| matches!(state, "Z" | "X" | "x"))
}

/// Why a copy into a peer failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyError {
    /// The destination is not mapped in the peer.
    Fault,
    /// The peer process is gone.
    Gone,
    /// The kernel refused access to the peer (ptrace policy).
    Denied,
}

/// Copies `len` bytes from `src` (this process) to `dst` in process `pid`.
///
/// # Safety
///
/// `src..src+len` must be readable memory of this process (a region the caller registered).
/// Where `pid` is this process, `dst..dst+len` must be writable memory that nothing else
/// accesses during the copy (a region the receiver registered and handed over with its
/// clear-to-send).
pub(crate) unsafe fn copy_to(pid: u32, dst: u64, src: usize, len: usize) -> Result<(), CopyError> {
    if len == 0 {
        return Ok(());
    }
    if pid == std::process::id() {
        // SAFETY: the caller's contract: both ranges are valid and do not overlap (distinct
        // registrations handed to one RDMA WRITE).
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len) };
        return Ok(());
    }
    let mut done = 0usize;
    while done < len {
        let local = libc::iovec {
            iov_base: (src + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        let remote = libc::iovec {
            iov_base: (dst as usize + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: `local` lies in readable memory (the caller's contract); the kernel checks
        // the remote range against the peer's mappings and fails with EFAULT outside them.
        let n = unsafe { libc::process_vm_writev(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n < 0 {
            return Err(match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::ESRCH) => CopyError::Gone,
                Some(libc::EPERM) => CopyError::Denied,
                _ => CopyError::Fault,
            });
        }
        if n == 0 {
            return Err(CopyError::Fault);
        }
        done += n as usize;
    }
    Ok(())
}

/// Sleeps while `word` equals `seen`, at most `timeout` (a shared futex: peers in other
/// processes wake it).
pub(crate) fn futex_wait(word: &AtomicU32, seen: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT reads the aligned 32-bit word (alive for the call) and compares it
    // with `seen`; the timespec outlives the call.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            seen,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes every thread asleep on `word`.
pub(crate) fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the word's address as a key.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::pid_alive;
    use std::time::{Duration, Instant};

    #[test]
    fn an_exited_child_not_yet_reaped_is_not_alive() {
        assert!(pid_alive(std::process::id()));
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        let start = Instant::now();
        while pid_alive(pid) {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "pid {pid} still counts as alive after it exited"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // Not reaped until here: the answer above came from its zombie state.
        assert!(child.try_wait().expect("wait").is_some());
        assert!(!pid_alive(pid));
    }
}
