//! Rendezvous: how ranks find each other before any connection exists.
//!
//! A [`Store`] is a small key/value service every rank can reach (in memory for ranks that are
//! threads, a file for ranks on one host, TCP otherwise). Ranks publish their listening addresses
//! under agreed keys and read each other's.

use std::time::Duration;

use crate::Result;

/// A key/value store shared by the ranks of one job.
///
/// Every method may block on the network for at most its deadline.
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Sets `key` to `value`, replacing any earlier value.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;

    /// Returns the value of `key`, waiting until some rank sets it or `timeout` passes
    /// (then an error of kind `Timeout` naming the key).
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>>;

    /// Adds `delta` to the integer counter `key` (missing counts as 0) and returns the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;
}
