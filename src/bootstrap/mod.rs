//! Rendezvous: how ranks find each other before any connection exists.
//!
//! A [`Store`] is a small key/value service every rank can reach (in memory for ranks that are
//! threads, a file for ranks on one host, TCP otherwise). Ranks publish their listening addresses
//! under agreed keys and read each other's.
//!
//! | piece | what it is |
//! |---|---|
//! | [`MemoryStore`] | a store shared by ranks that are threads of one process |
//! | [`FileStore`] | a store in a directory, for ranks that are processes on one host |
//! | [`TcpStore`] / [`TcpStoreServer`] | a store served by one rank over TCP, for everything else |
//! | [`UniqueId`] | 128 bytes (as NCCL's `ncclUniqueId`) naming a job's TCP store |
//! | [`env`](mod@env) | which launcher started this process (ferrorun, torchrun, SLURM, Open MPI) |
//!
//! Counters written by [`Store::add`] are stored as decimal ASCII text (`b"-12"`), in every
//! store, so `get` on a counter key returns its value as text and `add` on a key that `set`
//! wrote with such text continues from it.
//!
//! Which local address to publish (`FERRO_SOCKET_IFNAME`) is chosen by
//! [`topo::iface`](crate::topo::iface).
//!
//! ```
//! use std::time::Duration;
//! use ferroccl::bootstrap::{MemoryStore, Store};
//!
//! let store = MemoryStore::new();
//! let peer = store.clone(); // a handle to the same store, e.g. for another rank's thread
//! std::thread::spawn(move || peer.set("rank1/addr", b"10.0.0.2:4711")).join().unwrap().unwrap();
//! assert_eq!(store.get("rank1/addr", Duration::from_secs(1)).unwrap(), b"10.0.0.2:4711");
//! assert_eq!(store.add("arrived", 1).unwrap(), 1);
//! ```

use std::time::Duration;

use crate::{Error, Result};

pub mod env;
pub mod file;
pub mod memory;
pub mod tcp;
pub mod unique_id;

pub use env::{LaunchEnv, Launcher};
pub use file::FileStore;
pub use memory::MemoryStore;
pub use tcp::{TcpStore, TcpStoreServer};
pub use unique_id::UniqueId;

/// A key/value store shared by the ranks of one job.
///
/// Every method may block on the network for at most its deadline.
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Sets `key` to `value`, replacing any earlier value.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;

    /// As [`set`](Self::set), giving up after `timeout` where the store is remote (then an
    /// error of kind `Timeout` naming the key). Local stores ignore `timeout`.
    fn set_timeout(&self, key: &str, value: &[u8], timeout: Duration) -> Result<()> {
        let _ = timeout;
        self.set(key, value)
    }

    /// Returns the value of `key`, waiting until some rank sets it or `timeout` passes
    /// (then an error of kind `Timeout` naming the key).
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>>;

    /// Adds `delta` to the integer counter `key` (missing counts as 0) and returns the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;

    /// The local address this process reaches the store from, if the store is remote: peers
    /// that reach the store can usually reach this address too, so ranks listen on it.
    fn local_ip(&self) -> Option<std::net::IpAddr> {
        None
    }
}

/// The new value of counter `key` after adding `delta` to its stored text `current`
/// (`None`: missing, counts as 0), with the text to store.
///
/// Shared by every store so that all of them encode counters the same way.
pub(crate) fn add_to_counter(
    key: &str,
    current: Option<&[u8]>,
    delta: i64,
) -> Result<(i64, Vec<u8>)> {
    let old = match current {
        None => 0,
        Some(text) => std::str::from_utf8(text)
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .ok_or_else(|| {
                Error::invalid_usage(format!(
                    "store add to key '{key}': its value {:?} is not a decimal integer counter",
                    String::from_utf8_lossy(&text[..text.len().min(64)])
                ))
            })?,
    };
    let new = old.checked_add(delta).ok_or_else(|| {
        Error::invalid_argument(format!(
            "store add to key '{key}': {old} + {delta} overflows a 64-bit counter"
        ))
    })?;
    Ok((new, new.to_string().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn counters_are_decimal_text() {
        assert_eq!(add_to_counter("k", None, 5).unwrap(), (5, b"5".to_vec()));
        assert_eq!(
            add_to_counter("k", Some(b"-12"), 3).unwrap(),
            (-9, b"-9".to_vec())
        );
        let e = add_to_counter("k", Some(b"abc"), 1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUsage);
        assert!(e.message().contains("'k'") && e.message().contains("abc"));
        let e = add_to_counter("big", Some(b"9223372036854775807"), 1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    }
}
