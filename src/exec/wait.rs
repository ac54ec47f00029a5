//! Waiting and time for the step driver: what a rank does while none of its ops can move.
//!
//! [`Waiter`] is the driver's only source of time and its only way to wait. [`SysWaiter`] is
//! the real one: it spins, then yields, then sleeps on the shared-memory doorbell (a futex) or
//! in poll(2) on the awaited connections' descriptors. Tests drive steps with a simulated one.

use std::time::{Duration, Instant};

use ferroccl_transport::{Doorbell, PollFd};

use super::step::{OpState, RawOp};
use super::Conn;

/// Pure busy-waiting before yielding between checks.
const PURE_SPIN: Duration = Duration::from_micros(10);
/// Longest sleep in poll(2) while shared-memory peers, which cannot wake poll, are awaited too.
const MIXED_SLEEP: Duration = Duration::from_millis(1);

/// The ops of a step that are not done yet, for a waiter to watch.
#[derive(Debug)]
pub(crate) struct Waiting<'a> {
    pub conns: &'a [Option<Conn>],
    pub ops: &'a [RawOp],
    pub st: &'a [OpState],
}

impl Waiting<'_> {
    /// Each awaited connection, with whether the op on it sends (else it receives).
    pub(crate) fn each(&self) -> impl Iterator<Item = (&Conn, bool)> + '_ {
        self.ops
            .iter()
            .zip(self.st)
            .filter(|(_, s)| !s.is_done())
            .filter_map(|(o, _)| {
                let c = self.conns.get(o.peer())?.as_ref()?;
                Some((c, o.is_send()))
            })
    }
}

/// Time and waiting, as the step driver sees them.
pub(crate) trait Waiter {
    /// The current time.
    fn now(&self) -> Instant;

    /// Called before each pass over the ops: a change made after this call must end the next
    /// [`Waiter::sleep`] at once (a doorbell waiter reads the doorbell here).
    fn arm(&mut self);

    /// Nothing moved for `idle_for`, still inside the spin budget: spin or yield briefly.
    fn pause(&mut self, idle_for: Duration);

    /// Nothing moved past the spin budget: sleep until one of `waiting`'s connections may move,
    /// for at most `limit` (it may return earlier for no reason).
    fn sleep(&mut self, waiting: &Waiting<'_>, limit: Duration);
}

/// Descriptor lists a [`SysWaiter`] fills, kept by the engine so that sleeping allocates
/// nothing once they have grown.
#[derive(Default)]
pub(crate) struct WaitBuffers {
    fds: Vec<PollFd>,
    sys: Vec<libc::pollfd>,
}

impl WaitBuffers {
    /// Lists with room for `fds` descriptors, so that the first sleep allocates nothing either.
    pub(crate) fn with_capacity(fds: usize) -> Self {
        WaitBuffers {
            fds: Vec::with_capacity(fds),
            sys: Vec::with_capacity(fds),
        }
    }
}

impl std::fmt::Debug for WaitBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitBuffers")
            .field("fds", &self.fds)
            .finish_non_exhaustive()
    }
}

/// The real clock and waits: spin, yield, then the doorbell or poll(2).
#[derive(Debug)]
pub(crate) struct SysWaiter<'a> {
    bell: Option<&'a dyn Doorbell>,
    /// The doorbell's value when the last pass began.
    seen: Option<u32>,
    bufs: &'a mut WaitBuffers,
}

impl<'a> SysWaiter<'a> {
    pub(crate) fn new(bell: Option<&'a dyn Doorbell>, bufs: &'a mut WaitBuffers) -> Self {
        SysWaiter {
            bell,
            seen: None,
            bufs,
        }
    }
}

impl Waiter for SysWaiter<'_> {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn arm(&mut self) {
        self.seen = self.bell.map(|b| b.seq());
    }

    fn pause(&mut self, idle_for: Duration) {
        if idle_for < PURE_SPIN {
            std::hint::spin_loop();
        } else {
            // Brief spinning catches a peer on another core; beyond that, give the core to a
            // rank that shares it (more ranks than cores) before checking again.
            std::thread::yield_now();
        }
    }

    fn sleep(&mut self, waiting: &Waiting<'_>, limit: Duration) {
        let fds = &mut self.bufs.fds;
        fds.clear();
        let mut on_bell = false;
        for (c, sending) in waiting.each() {
            on_bell |= c.uses_doorbell();
            c.poll_fds(sending, !sending, fds);
        }
        match (on_bell, self.bell, self.seen) {
            (true, Some(b), Some(seen)) if fds.is_empty() => b.wait(seen, limit),
            (true, _, _) => sleep_on(fds, &mut self.bufs.sys, limit.min(MIXED_SLEEP)),
            _ => sleep_on(fds, &mut self.bufs.sys, limit),
        }
    }
}

/// Sleeps in poll(2) on `fds` for at most `timeout` (at least 1 ms); `sys` is the reusable
/// array handed to the kernel.
fn sleep_on(fds: &[PollFd], sys: &mut Vec<libc::pollfd>, timeout: Duration) {
    sys.clear();
    sys.extend(fds.iter().map(|f| libc::pollfd {
        fd: f.fd,
        events: (if f.read { libc::POLLIN } else { 0 }) | (if f.write { libc::POLLOUT } else { 0 }),
        revents: 0,
    }));
    let ms = libc::c_int::try_from(timeout.as_millis())
        .unwrap_or(100)
        .max(1);
    // SAFETY: `sys` is a live array of `sys.len()` pollfd structs.
    unsafe { libc::poll(sys.as_mut_ptr(), sys.len() as libc::nfds_t, ms) };
}
