//! Noticing at once that a peer process exited: pidfds, and a thread that waits on them.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::bell::Bell;

/// Opens a pidfd for `pid`: a descriptor that polls readable once the process has exited.
pub(crate) fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A thread that sleeps in `poll(2)` on the pidfds of a rank's shared-memory peers and rings the
/// rank's doorbell when one of them exits, so that a rank asleep on its doorbell notices a
/// crashed peer at once instead of at its next timed check. Stops when dropped.
#[derive(Debug)]
pub struct PeerWatch {
    exited: Arc<AtomicBool>,
    stop: Option<OwnedFd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PeerWatch {
    /// Whether a watched process has exited (set before the bell rings).
    pub fn exited(&self) -> bool {
        self.exited.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Watches the processes `pids` (other than this one) for rank `rank`, ringing `bell`.
    /// `None` where no peer is in another process or the watch cannot be set up (the timed
    /// checks still detect exits then).
    pub fn start(rank: usize, pids: &[u32], bell: Arc<Bell>) -> Option<Arc<PeerWatch>> {
        let me = std::process::id();
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut seen = Vec::new();
        for &p in pids {
            if p != me && !seen.contains(&p) {
                seen.push(p);
                fds.extend(pidfd_open(p));
            }
        }
        if fds.is_empty() {
            return None;
        }
        let mut pipe = [0i32; 2];
        // SAFETY: `pipe` is a writable array of two descriptors.
        if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return None;
        }
        // SAFETY: both descriptors are fresh and owned by nothing else.
        let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(pipe[0]), OwnedFd::from_raw_fd(pipe[1])) };
        let exited = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&exited);
        let thread = std::thread::Builder::new()
            .name(format!("ferroccl-watch-{rank}"))
            .spawn(move || {
                let mut fds = fds;
                loop {
                    let mut pfds: Vec<libc::pollfd> = std::iter::once(&rd)
                        .chain(fds.iter())
                        .map(|f| libc::pollfd {
                            fd: f.as_raw_fd(),
                            events: libc::POLLIN,
                            revents: 0,
                        })
                        .collect();
                    // SAFETY: `pfds` is a live array of `pfds.len()` pollfd structs.
                    let rc =
                        unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, -1) };
                    if rc < 0 || pfds[0].revents != 0 {
                        return;
                    }
                    let gone: Vec<usize> =
                        (1..pfds.len()).filter(|&i| pfds[i].revents != 0).collect();
                    for &i in gone.iter().rev() {
                        fds.remove(i - 1);
                    }
                    if !gone.is_empty() {
                        flag.store(true, std::sync::atomic::Ordering::Release);
                        bell.ring();
                    }
                    if fds.is_empty() {
                        return;
                    }
                }
            })
            .ok()?;
        Some(Arc::new(PeerWatch {
            exited,
            stop: Some(wr),
            thread: Some(thread),
        }))
    }
}

impl Drop for PeerWatch {
    fn drop(&mut self) {
        // Closing the pipe's write end makes the read end readable (EOF): the thread returns.
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
