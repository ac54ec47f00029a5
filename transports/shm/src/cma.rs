//! Cross-memory attach: reading a peer process's memory with `process_vm_readv(2)`.

/// Why a read failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmaError {
    /// Not allowed here (ptrace policy, seccomp, missing syscall): use the rings instead.
    Denied(i32),
    /// The process is gone.
    Gone,
    /// Anything else (a bad address: the peer no longer holds the buffer).
    Other(i32),
}

/// Reads `dst.len()` bytes at `addr` in process `pid` into `dst`; returns the bytes read (the
/// kernel may stop short).
pub(crate) fn read(pid: u32, addr: u64, dst: &mut [u8]) -> Result<usize, CmaError> {
    if dst.is_empty() {
        return Ok(0);
    }
    let local = libc::iovec {
        iov_base: dst.as_mut_ptr().cast(),
        iov_len: dst.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as usize as *mut libc::c_void,
        iov_len: dst.len(),
    };
    // SAFETY: `local` describes the live, writable `dst`; the remote range is only read by the
    // kernel, which checks it against the other process's mappings (EFAULT if invalid).
    let rc = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if rc >= 0 {
        return Ok(rc as usize);
    }
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    Err(match errno {
        libc::EPERM | libc::EACCES | libc::ENOSYS => CmaError::Denied(errno),
        libc::ESRCH => CmaError::Gone,
        e => CmaError::Other(e),
    })
}

/// Whether this process can read the 8-byte word at `addr` in `pid` and finds `value` there.
pub(crate) fn probe(pid: u32, addr: u64, value: u64) -> bool {
    let mut b = [0u8; 8];
    matches!(read(pid, addr, &mut b), Ok(8)) && u64::from_ne_bytes(b) == value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_memory_and_rejects_bad_addresses() {
        let src: Vec<u8> = (0..1000).map(|i| (i * 13 % 251) as u8).collect();
        let mut dst = vec![0u8; 1000];
        let pid = std::process::id();
        match read(pid, src.as_ptr() as u64, &mut dst) {
            Ok(n) => {
                assert_eq!(n, 1000);
                assert_eq!(dst, src);
                assert!(matches!(read(pid, 8, &mut dst), Err(CmaError::Other(_))));
            }
            // Sandboxes may forbid the call; then nothing else here can be checked.
            Err(CmaError::Denied(e)) => println!("process_vm_readv denied here (errno {e})"),
            Err(e) => panic!("{e:?}"),
        }
    }
}
