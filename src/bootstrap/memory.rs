//! An in-process store, for ranks that are threads of one process.
//!
//! `Table` (a map, a mutex and a condition variable) is also the state behind the TCP store
//! server.
#![forbid(unsafe_code)]

use std::collections::HashMap;
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

#[derive(Debug, Default)]
struct TableState {
    values: HashMap<String, Vec<u8>>,
    /// Once true, waiters return [`WaitError::Closed`] and no new wait starts.
    closed: bool,
}

/// A key/value map whose readers can wait for a key to appear.
#[derive(Debug, Default)]
pub(crate) struct Table {
    state: Mutex<TableState>,
    /// Notified (all waiters) whenever a value changes or the table closes.
    changed: Condvar,
}

impl Table {
    /// Locks the state. A panic while the lock is held cannot leave the map half-updated
    /// (every critical section is a single insert or lookup), so a poisoned lock is still usable.
    fn lock(&self) -> MutexGuard<'_, TableState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn set(&self, key: &str, value: &[u8]) {
        self.lock().values.insert(key.to_owned(), value.to_vec());
        self.changed.notify_all();
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

    pub(crate) fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut state = self.lock();
        let (new, text) = add_to_counter(key, state.values.get(key).map(Vec::as_slice), delta)?;
        state.values.insert(key.to_owned(), text);
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
        self.table.set(key, value);
        Ok(())
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
