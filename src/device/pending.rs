//! The count of queued stream jobs that use a device buffer (see [`super::DeviceBuffer`]'s
//! docs): jobs hold it up, host-side accesses wait until it is zero.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug, Default)]
struct Count {
    n: Mutex<usize>,
    idle: Condvar,
}

/// A buffer's count of pending jobs (a clone counts the same jobs: typed views of a byte
/// buffer share it, so host access to the buffer waits for jobs queued on a view).
#[derive(Debug, Default, Clone)]
pub(crate) struct Pending(Arc<Count>);

/// One job's share of a [`Pending`] count, given back when dropped (whether the job ran,
/// failed, or was dropped unrun).
#[derive(Debug)]
pub(crate) struct Hold(Arc<Count>);

impl Pending {
    /// Counts one more job until the returned hold drops.
    pub(crate) fn hold(&self) -> Hold {
        *lock(&self.0.n) += 1;
        Hold(Arc::clone(&self.0))
    }

    /// Waits until no job holds the count. Stand-in streams that hold buffers until they get
    /// somewhere are run there meanwhile (`host_stream::run_releases`).
    pub(crate) fn wait_idle(&self) {
        let mut n = lock(&self.0.n);
        while *n > 0 {
            drop(n);
            let ran = super::host_stream::run_releases();
            n = lock(&self.0.n);
            if *n > 0 {
                let nap = Duration::from_millis(if ran { 1 } else { 10 });
                n = self
                    .0
                    .idle
                    .wait_timeout(n, nap)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        }
    }

    /// Values sharing the count (this one, its clones, the holds).
    #[cfg(test)]
    pub(crate) fn shares(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    /// Jobs holding it now.
    #[cfg(test)]
    pub(crate) fn count(&self) -> usize {
        *lock(&self.0.n)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut n = lock(&self.0.n);
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.0.idle.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn waits_until_every_hold_is_dropped() {
        let p = Pending::default();
        let (a, b) = (p.hold(), p.hold());
        assert_eq!(p.count(), 2);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            drop(a);
            std::thread::sleep(Duration::from_millis(30));
            drop(b);
        });
        p.wait_idle();
        assert_eq!(p.count(), 0);
        t.join().unwrap();
        p.wait_idle();
    }
}
