//! The rank's doorbell: a counter bumped under a mutex, a condvar to sleep on.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ferroccl_transport::Doorbell;

/// A doorbell for threads of one process. Peers call [`Bell::ring`] after they change a queue
/// this rank reads or writes; the rank sleeps in [`Doorbell::wait`].
///
/// No wake-up is lost: `ring` bumps the counter and then notifies while holding the mutex, and
/// `wait` checks the counter while holding the same mutex before it sleeps (releasing it
/// atomically), so a ring that comes after the check finds the sleeper already waiting.
#[derive(Debug, Default)]
pub struct Bell {
    /// Bumped by every ring (wrapping).
    seq: AtomicU32,
    /// Held to check `seq` before sleeping and to notify.
    lock: Mutex<()>,
    cv: Condvar,
}

impl Bell {
    /// A bell nobody has rung.
    pub fn new() -> Bell {
        Bell::default()
    }

    /// Bumps the counter and wakes every sleeper.
    pub fn ring(&self) {
        self.seq.fetch_add(1, Ordering::Release);
        let _held = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.cv.notify_all();
    }
}

impl Doorbell for Bell {
    fn identity(&self) -> usize {
        &self.seq as *const _ as usize
    }

    fn seq(&self) -> u32 {
        self.seq.load(Ordering::Acquire)
    }

    fn wait(&self, seen: u32, timeout: Duration) {
        let until = Instant::now() + timeout;
        let mut held = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        while self.seq.load(Ordering::Acquire) == seen {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            held = self
                .cv
                .wait_timeout(held, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}
