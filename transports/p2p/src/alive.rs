//! Whether a peer's process still exists: a pidfd polls readable once it has exited (FFI).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A pidfd for `pid`; `None` where the kernel offers none (older than 5.3) or the process is
/// already gone.
pub(crate) fn pidfd(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Whether the process behind `fd` has exited (never blocks).
pub(crate) fn exited(fd: &OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd; zero timeout.
    let rc = unsafe { libc::poll(&mut p, 1, 0) };
    rc > 0 && p.revents != 0
}

/// Whether no process `pid` exists (`kill(pid, 0)` fails with `ESRCH`; `EPERM` means alive).
pub(crate) fn is_gone(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if p <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists; no memory is involved.
    let rc = unsafe { libc::kill(p, 0) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}
