//! An in-process store, for ranks that are threads of one process.
//!
//! `Table` (a map, a mutex and a condition variable) is also the state behind the TCP store
//! server, which bounds the bytes it holds.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::{add_to_counter, Store};
use crate::{Error, Result};

/// Why [`Table::wait_get`] returned without a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitError {
    /// The deadline passed before anyone set the key.
    TimedOut,
    /// The table was closed (its server is shutting down).
    Closed,
}

/// Why [`Table::set`] or [`Table::add`] stored nothing: the table would pass its byte limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Full {
    /// Bytes of keys and values held now.
    pub(crate) held: usize,
    /// The most the table holds.
    pub(crate) limit: usize,
    /// What the table would hold after the change.
    pub(crate) wanted: usize,
}

impl fmt::Display for Full {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "store full: {} bytes held, at most {}; this change would make it {}",
            self.held, self.limit, self.wanted
        )
    }
}

#[derive(Debug, Default)]
struct TableState {
    values: HashMap<String, Vec<u8>>,
    /// The sum of `key.len() + value.len()` over `values`.
    held: usize,
    /// Once true, waiters return [`WaitError::Closed`] and no new wait starts.
    closed: bool,
}

impl TableState {
    /// Stores `value` under `key` unless the table would then hold more than `limit` bytes.
    fn insert(&mut self, key: &str, value: Vec<u8>, limit: usize) -> std::result::Result<(), Full> {
        let old = self.values.get(key).map_or(0, |v| key.len() + v.len());
        let wanted = (self.held - old).saturating_add(key.len() + value.len());
        if wanted > limit {
            return Err(Full {
                held: self.held,
                limit,
                wanted,
            });
        }
        self.values.insert(key.to_owned(), value);
        self.held = wanted;
        Ok(())
    }
}

/// A key/value map whose readers can wait for a key to appear.
#[derive(Debug)]
pub(crate) struct Table {
    state: Mutex<TableState>,
    /// Notified (all waiters) whenever a value changes or the table closes.
    changed: Condvar,
    /// The most bytes of keys and values the table holds.
    limit: usize,
}

impl Default for Table {
    /// A table without a byte limit.
    fn default() -> Table {
        Table::with_limit(usize::MAX)
    }
}

impl Table {
    /// An empty table that refuses changes that would make it hold more than `limit` bytes
    /// of keys and values.
    pub(crate) fn with_limit(limit: usize) -> Table {
        Table {
            state: Mutex::new(TableState::default()),
            changed: Condvar::new(),
            limit,
        }
    }

    /// Locks the state. A panic while the lock is held cannot leave the map half-updated
    /// (every critical section is a single insert or lookup, with `held` updated after the
    /// insert, which cannot panic), so a poisoned lock is still usable.
    fn lock(&self) -> MutexGuard<'_, TableState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets `key` to `value`, unless the table would then hold more than its limit.
    pub(crate) fn set(&self, key: &str, value: &[u8]) -> std::result::Result<(), Full> {
        self.lock().insert(key, value.to_vec(), self.limit)?;
        self.changed.notify_all();
        Ok(())
    }

    /// Bytes of keys and values held now.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.lock().held
    }

    /// The value of `key`, waiting until it is set, `timeout` passes or the table closes.
    pub(crate) fn wait_get(
        &self,
        key: &str,
        timeout: Duration,
    ) -> std::result::Result<Vec<u8>, WaitError> {
        let deadline = Instant::now().checked_add(timeout);
        let mut state = self.lock();
        loop {
            if let Some(value) = state.values.get(key) {
                return Ok(value.clone());
            }
            if state.closed {
                return Err(WaitError::Closed);
            }
            let left = match deadline {
                // A timeout too large for `Instant` waits without deadline.
                None => Duration::from_secs(3600),
                Some(d) => d.saturating_duration_since(Instant::now()),
            };
            if left.is_zero() {
                return Err(WaitError::TimedOut);
            }
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Adds `delta` to counter `key`; fails (`InvalidUsage`) when the table would pass its
    /// limit.
    pub(crate) fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut state = self.lock();
        let (new, text) = add_to_counter(key, state.values.get(key).map(Vec::as_slice), delta)?;
        state
            .insert(key, text, self.limit)
            .map_err(|full| Error::invalid_usage(format!("store add to key '{key}': {full}")))?;
        drop(state);
        self.changed.notify_all();
        Ok(new)
    }

    /// Wakes every waiter with [`WaitError::Closed`] (unless its key is already set).
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }
}

/// A store shared by ranks that are threads of one process.
///
/// `MemoryStore` is a handle: clones share the same map, so give each rank's thread a clone
/// (or wrap one in an `Arc<dyn Store>`).
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    table: Arc<Table>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }
}

impl Store for MemoryStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        // The table has no limit, so this error does not happen; it is passed on all the same.
        self.table
            .set(key, value)
            .map_err(|full| Error::invalid_usage(format!("store set of key '{key}': {full}")))
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.table.wait_get(key, timeout).map_err(|e| match e {
            WaitError::TimedOut => Error::timeout(format!(
                "store get of key '{key}' from the in-memory store: nobody set it within {timeout:?}"
            )),
            // Invariant: a MemoryStore's table is never closed.
            WaitError::Closed => Error::internal(format!(
                "store get of key '{key}': in-memory store closed"
            )),
        })
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.table.add(key, delta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use std::thread;

    #[test]
    fn set_get_add() {
        let s = MemoryStore::new();
        s.set("a", b"alpha").unwrap();
        s.set("b", b"beta").unwrap();
        assert_eq!(s.get("a", Duration::ZERO).unwrap(), b"alpha");
        assert_eq!(s.get("b", Duration::ZERO).unwrap(), b"beta");
        s.set("a", b"again").unwrap();
        assert_eq!(s.get("a", Duration::ZERO).unwrap(), b"again");
        assert_eq!(s.add("n", 3).unwrap(), 3);
        assert_eq!(s.add("n", -10).unwrap(), -7);
        assert_eq!(s.get("n", Duration::ZERO).unwrap(), b"-7");
        assert_eq!(s.add("a", 1).unwrap_err().kind(), ErrorKind::InvalidUsage);
    }

    #[test]
    fn get_waits_for_a_later_set() {
        let s = MemoryStore::new();
        let writer = s.clone();
        let t = thread::spawn(move || {
            thread::sleep(Duration::from_millis(50));
            writer.set("late", b"value-7").unwrap();
        });
        let start = Instant::now();
        assert_eq!(s.get("late", Duration::from_secs(10)).unwrap(), b"value-7");
        assert!(start.elapsed() >= Duration::from_millis(40));
        t.join().unwrap();
    }

    #[test]
    fn get_times_out_naming_the_key() {
        let s = MemoryStore::new();
        let start = Instant::now();
        let e = s.get("never", Duration::from_millis(60)).unwrap_err();
        assert!(start.elapsed() >= Duration::from_millis(60));
        assert_eq!(e.kind(), ErrorKind::Timeout);
        assert!(e.message().contains("'never'"), "{e}");
    }

    #[test]
    fn concurrent_adds_count_every_increment() {
        let s = MemoryStore::new();
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let s = s.clone();
                thread::spawn(move || {
                    for _ in 0..100 {
                        s.add("c", i + 1).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // 100 * (1 + 2 + ... + 8)
        assert_eq!(s.add("c", 0).unwrap(), 3600);
    }

    #[test]
    fn table_counts_bytes_and_refuses_past_its_limit() {
        let t = Table::with_limit(100);
        t.set("a", &[1; 90]).unwrap();
        assert_eq!(t.held(), 91);
        // 91 + 1 + 10 > 100: refused, nothing changes.
        assert_eq!(
            t.set("b", &[2; 10]),
            Err(Full {
                held: 91,
                limit: 100,
                wanted: 102
            })
        );
        assert_eq!(t.held(), 91);
        assert_eq!(t.wait_get("b", Duration::ZERO), Err(WaitError::TimedOut));
        // A counter fits (key "c" and text "1").
        assert_eq!(t.add("c", 1).unwrap(), 1);
        assert_eq!(t.held(), 93);
        // Replacing a value counts only the difference: 93 - 91 + 96 = 98.
        t.set("a", &[3; 95]).unwrap();
        assert_eq!(t.held(), 98);
        // A counter growing to three digits passes the limit: 98 - 2 + 4 = 100 fits, 101 not.
        assert_eq!(t.add("c", 99).unwrap(), 100);
        assert_eq!(t.held(), 100);
        let e = t.add("d", 1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUsage);
        assert!(
            e.message().contains("'d'")
                && e.message()
                    .contains("store full: 100 bytes held, at most 100"),
            "{e}"
        );
        assert_eq!(t.add("c", 0).unwrap(), 100);
        // Shrinking makes room again.
        t.set("a", b"").unwrap();
        assert_eq!(t.held(), 5);
        t.set("b", &[2; 10]).unwrap();
        assert_eq!(t.held(), 16);
        assert_eq!(t.wait_get("b", Duration::ZERO).unwrap(), [2; 10]);
    }

    #[test]
    fn closed_table_wakes_waiters() {
        let t = Arc::new(Table::default());
        let waiter = {
            let t = Arc::clone(&t);
            thread::spawn(move || t.wait_get("k", Duration::from_secs(30)))
        };
        thread::sleep(Duration::from_millis(30));
        t.close();
        assert_eq!(waiter.join().unwrap(), Err(WaitError::Closed));
    }
}
