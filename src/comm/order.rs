//! Issue order, failure recording and failure reports.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::exec::Engine;
use crate::{Error, ErrorKind, Result};

use super::*;

/// How long a rank that lost a peer's connection looks in the store for the peer's reason.
const EXPLAIN_WAIT: Duration = Duration::from_millis(300);
/// How long a failing rank tries to leave its reason in the store (whose host may be gone).
const PUBLISH_WAIT: Duration = Duration::from_secs(1);

/// Runs `f` on a thread of its own and waits at most `limit` for its result: a store request
/// on a failure path must not outlive the deadline, whatever the store's own timeouts (its host
/// may be stopped or cut off). A request still running then finishes unobserved.
fn bounded<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::Builder::new()
        .name("ferroccl-report".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .ok()?;
    rx.recv_timeout(limit).ok()
}

impl Inner {
    /// Takes the next ticket: the place of an operation in issue order.
    pub(super) fn ticket(&self) -> u64 {
        // Relaxed: the count alone orders the tickets; what a turn publishes is ordered by
        // `serving`.
        self.next_ticket.fetch_add(1, Ordering::Relaxed)
    }

    /// The first failure, if any. The flag spares the lock on every call of a healthy
    /// communicator.
    pub(super) fn failed_error(&self) -> Option<Error> {
        // Acquire: pairs with the Release store in `fail`, after the error was stored.
        if !self.has_failed.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        lock(&self.failed).clone()
    }

    /// Records the first failure.
    pub(super) fn fail(&self, e: Error) {
        let mut f = lock(&self.failed);
        if f.is_none() {
            if self.config.debug >= DebugLevel::Warn && e.kind() != ErrorKind::Aborted {
                ferroccl_transport::log_line!("ferroccl rank {} WARN: {e}", self.rank);
            }
            *f = Some(e);
            // Release: the error above is in place for whoever sees the flag.
            self.has_failed
                .store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// Records the first failure and tells the peers where the engine is free (a notice, the
    /// connections closed, the reason left in the store), without waiting for a turn: for a
    /// failure off the engine, on a thread that may hold a turn's place itself. Where the
    /// engine is busy, the turn that holds it tells them when it ends, or the next turn when
    /// it starts.
    pub(super) fn fail_and_tell(&self, e: Error) {
        self.fail(e);
        self.tell_if_untold();
    }

    /// Tells the peers of the failure recorded, where there is one they were not told of and
    /// the engine is free.
    fn tell_if_untold(&self) {
        if self.told.load(Ordering::SeqCst) {
            return;
        }
        let Some(e) = self.failed_error() else {
            return;
        };
        if let Ok(mut engine) = self.engine.try_lock() {
            self.tell(&mut engine, &e);
        }
    }

    /// Tells the peers of `e` once: a failure notice where one can be written, the
    /// connections closed, then the reason in the store (whose host may be the rank that
    /// failed), not waited for.
    fn tell(&self, engine: &mut Engine, e: &Error) {
        if self.told.swap(true, Ordering::SeqCst) {
            return;
        }
        engine.notify_failure(e, 0);
        engine.shutdown_all();
        self.publish_failure(e, Duration::ZERO);
    }

    /// Runs `f` on the engine when `ticket`'s turn comes; failures fail the communicator.
    pub(super) fn execute(
        &self,
        ticket: u64,
        f: impl FnOnce(&mut Engine) -> Result<()>,
    ) -> Result<()> {
        self.take_turn(ticket, f)
    }

    /// Takes the next ticket and runs `f` on the engine when its turn comes, with the
    /// collective's sequence number (taken in the turn, so in issue order) where `collective`,
    /// 0 otherwise: [`Inner::ticket`] then [`Inner::execute`], for a call that runs on the
    /// caller's thread.
    pub(super) fn execute_next(
        &self,
        collective: bool,
        f: impl FnOnce(&mut Engine, u64) -> Result<()>,
    ) -> Result<()> {
        let ticket = self.ticket();
        self.take_turn(ticket, |e| {
            let seq = if collective { e.next_seq() } else { 0 };
            f(e, seq)
        })
    }

    fn take_turn(&self, ticket: u64, f: impl FnOnce(&mut Engine) -> Result<()>) -> Result<()> {
        struct Turn<'a>(&'a Inner, u64);
        impl Drop for Turn<'_> {
            fn drop(&mut self) {
                // A failure recorded off the engine after this turn last looked (the engine
                // is free now: the turn's guard went first).
                self.0.tell_if_untold();
                // SeqCst, with the waiters' count below and in the wait: either this load sees
                // a waiter's count (and the notify under the lock reaches it, as it holds the
                // lock from its check to its wait), or that waiter's check sees this store.
                self.0.serving.store(self.1 + 1, Ordering::SeqCst);
                if self.0.turn_waiters.load(Ordering::SeqCst) > 0 {
                    let _o = lock(&self.0.order);
                    self.0.turn.notify_all();
                }
            }
        }
        if self.serving.load(Ordering::SeqCst) != ticket {
            // Another call's turn: wait for ours (the usual case, a turn that comes at once,
            // takes no lock here).
            let mut o = lock(&self.order);
            self.turn_waiters.fetch_add(1, Ordering::SeqCst);
            while self.serving.load(Ordering::SeqCst) != ticket {
                o = self.turn.wait(o).unwrap_or_else(|p| p.into_inner());
            }
            self.turn_waiters.fetch_sub(1, Ordering::SeqCst);
        }
        let _turn = Turn(self, ticket);
        if let Some(e) = self.failed_error() {
            if !self.told.load(Ordering::SeqCst) {
                self.tell(&mut lock(&self.engine), &e);
            }
            return Err(e);
        }
        let mut engine = lock(&self.engine);
        match f(&mut engine) {
            Ok(()) => {
                // A failure recorded off the engine while this turn held it is told now.
                if let Some(e) = self.failed_error() {
                    self.tell(&mut engine, &e);
                }
                Ok(())
            }
            Err(e) => {
                // Peers hear of it first, over the connections (a failure notice where one can
                // be written, then the close), and only then through the store, whose host may
                // be the rank that failed.
                let e = self.explain(engine.with_pending_notice(e));
                self.fail(e.clone());
                // A failure recorded off the engine during the turn came first: `f` may have
                // failed of it (the connections it closed), and it is what the peers and the
                // caller must hear.
                let e = self.failed_error().unwrap_or(e);
                let first = !self.told.swap(true, Ordering::SeqCst);
                if first {
                    engine.notify_failure(&e, 0);
                    engine.shutdown_all();
                }
                drop(engine);
                if first {
                    self.publish_failure(&e, PUBLISH_WAIT);
                }
                Err(e)
            }
        }
    }

    pub(super) fn failure_key(&self, rank: usize) -> String {
        format!("ferroccl/{:016x}/failed/{rank}", self.id)
    }

    /// Tells peers, through the store, why this rank is about to close its connections.
    pub(super) fn publish_failure(&self, e: &Error, wait: Duration) {
        if let Some(store) = &self.store {
            let (store, key, why) = (
                Arc::clone(store),
                self.failure_key(self.rank),
                e.message().to_string(),
            );
            let _ = bounded(wait, move || store.set(&key, why.as_bytes()));
        }
    }

    /// A lost connection to a peer that failed on purpose: add the peer's own reason, which
    /// names the rank that really failed.
    pub(super) fn explain(&self, e: Error) -> Error {
        let (Some(peer), Some(store)) = (e.peer(), &self.store) else {
            return e;
        };
        if e.kind() != ErrorKind::Remote || e.origin().is_some() {
            return e;
        }
        let (store, key) = (Arc::clone(store), self.failure_key(peer));
        let limit = EXPLAIN_WAIT + Duration::from_millis(200);
        match bounded(limit, move || store.get(&key, EXPLAIN_WAIT)) {
            Some(Ok(why)) => e.append(format!(
                "rank {peer} had failed: {}",
                String::from_utf8_lossy(&why)
            )),
            _ => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{Communicator, Config, Error, ErrorKind, ReduceOp};

    /// A failure recorded off the engine (as a stream job's copy or a call left half queued
    /// records one) reaches the peers at once, not at their deadline: the peer's next call
    /// fails naming the reason, while the failed rank's communicator is still alive.
    #[test]
    fn a_failure_off_the_engine_is_told_to_the_peers() {
        let config = Config {
            timeout: Duration::from_secs(60),
            ..Config::default()
        };
        let comms = Communicator::local_group(2, config).unwrap();
        // Rank 0 keeps its communicator until rank 1 is through (its sender dropped, however
        // it ended): a dropped communicator would close the connections anyway.
        let (through, wait) = std::sync::mpsc::channel::<()>();
        let mut wait = Some(wait);
        let mut through = Some(through);
        std::thread::scope(|sc| {
            for c in &comms {
                let wait = if c.rank() == 0 { wait.take() } else { None };
                let through = if c.rank() == 1 { through.take() } else { None };
                sc.spawn(move || {
                    let _through = through;
                    if let Some(w) = wait {
                        let why = "rank 0: a copy of a queued slice failed (test)";
                        c.inner
                            .fail_and_tell(Error::new(ErrorKind::System, why.to_string()));
                        assert!(c.async_error().is_some());
                        let _ = w.recv();
                    } else {
                        let send = [1.0f32; 5];
                        let mut recv = [0.0f32; 5];
                        let e = c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap_err();
                        assert_ne!(e.kind(), ErrorKind::Timeout, "{e}");
                        assert!(e.to_string().contains("rank 0"), "{e}");
                    }
                });
            }
        });
    }
}
