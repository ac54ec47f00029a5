//! Test hosts made of network namespaces, for integration tests.
//!
//! [`NetnsHosts::up`] takes an exclusive lock (so tests that build namespaces never overlap, even
//! across test binaries), runs `scripts/netns.sh up N`, and on drop runs `down` and releases the
//! lock. Host `i` is namespace `ferro<i>` at `10.231.0.<i+1>`; all hosts share one bridge.
//!
//! Use it from a test file with
//!
//! ```ignore
//! #[path = "common/netns.rs"]
//! mod netns;
//!
//! #[test]
//! fn over_two_hosts() {
//!     if let Err(why) = netns::netns_available() {
//!         println!("skipped: over_two_hosts: {why}");
//!         return;
//!     }
//!     let hosts = netns::NetnsHosts::up(2).unwrap();
//!     // ... ferrorun --netns {hosts.netns_arg()} ..., or hosts.run_in(1, || ...)
//! }
//! ```

// Each test binary uses a different part of this helper.
#![allow(dead_code)]

use std::fs::{File, OpenOptions};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Command;

/// The lock every namespace-building test holds while its hosts exist.
pub const LOCK_PATH: &str = "/tmp/ferroccl-netns.lock";

/// `scripts/netns.sh` in this repository.
pub fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/netns.sh")
}

/// `Ok` when namespaces can be built here (root, `ip netns`, veth, bridge); otherwise why not.
pub fn netns_available() -> Result<(), String> {
    let output = Command::new(script())
        .arg("check")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script().display()))?;
    if output.status.success() {
        Ok(())
    } else {
        let why = String::from_utf8_lossy(&output.stderr).trim().to_string();
        Err(if why.is_empty() {
            format!("netns.sh check failed ({})", output.status)
        } else {
            why
        })
    }
}

/// Runs `scripts/netns.sh ARGS` with extra environment; errors carry its output.
fn netns_sh(args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    let output = Command::new(script())
        .args(args)
        .envs(env.iter().copied())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script().display()))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "netns.sh {} failed ({}): {}{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// `n` test hosts that exist for the life of this value.
#[derive(Debug)]
pub struct NetnsHosts {
    n: usize,
    /// Holds the exclusive flock on [`LOCK_PATH`]; closing it releases the lock.
    _lock: File,
}

impl NetnsHosts {
    /// Waits for the lock, then builds hosts `ferro0..ferro{n-1}`.
    pub fn up(n: usize) -> Result<Self, String> {
        Self::up_with_env(n, &[])
    }

    /// [`NetnsHosts::up`] with every link limited to `rate` (tc syntax, e.g. `100mbit`).
    pub fn up_with_rate(n: usize, rate: &str) -> Result<Self, String> {
        Self::up_with_env(n, &[("RATE", rate)])
    }

    fn up_with_env(n: usize, env: &[(&str, &str)]) -> Result<Self, String> {
        let lock = lock_exclusive()?;
        let count = n.to_string();
        // On failure the lock is released when `lock` drops; the script already cleaned up.
        netns_sh(&["up", &count], env)?;
        Ok(NetnsHosts { n, _lock: lock })
    }

    /// Number of hosts.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Namespace name of host `i`.
    pub fn name(&self, i: usize) -> String {
        assert!(i < self.n, "host {i} out of range (have {})", self.n);
        format!("ferro{i}")
    }

    /// All namespace names, host 0 first.
    pub fn names(&self) -> Vec<String> {
        (0..self.n).map(|i| self.name(i)).collect()
    }

    /// The value for `ferrorun --netns`: every host, comma-separated.
    pub fn netns_arg(&self) -> String {
        self.names().join(",")
    }

    /// IPv4 address of host `i`.
    pub fn addr(&self, i: usize) -> Ipv4Addr {
        assert!(i < self.n, "host {i} out of range (have {})", self.n);
        Ipv4Addr::new(10, 231, 0, (i + 1) as u8)
    }

    /// Runs `f` on a thread that has entered host `i`'s network namespace. Sockets it creates
    /// stay in that namespace and may be used from any thread afterwards.
    pub fn run_in<T: Send>(&self, i: usize, f: impl FnOnce() -> T + Send) -> Result<T, String> {
        let path = format!("/run/netns/{}", self.name(i));
        let ns = File::open(&path).map_err(|e| format!("open {path}: {e}"))?;
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    // SAFETY: `ns` is an open namespace file for the whole call; setns changes
                    // only this thread's network namespace, and the thread ends after `f`.
                    let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
                    if rc != 0 {
                        return Err(format!(
                            "setns({path}): {}",
                            std::io::Error::last_os_error()
                        ));
                    }
                    Ok(f())
                })
                .join()
                .map_err(|_| format!("thread in {path} panicked"))?
        })
    }
}

impl Drop for NetnsHosts {
    fn drop(&mut self) {
        if let Err(e) = netns_sh(&["down"], &[]) {
            eprintln!("NetnsHosts: {e}");
        }
        // `_lock` closes after this, releasing the lock.
    }
}

fn lock_exclusive() -> Result<File, String> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(LOCK_PATH)
        .map_err(|e| format!("open {LOCK_PATH}: {e}"))?;
    loop {
        // SAFETY: flock on a descriptor owned by `file`, which outlives the call.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        if rc == 0 {
            return Ok(file);
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(format!("flock {LOCK_PATH}: {err}"));
        }
    }
}
