//! Waiting and time for the step driver: what a rank does while none of its ops can move.
//!
//! [`Waiter`] is the driver's only source of time and its only way to wait. [`SysWaiter`] is
//! the real one: it spins, then yields, then sleeps on the shared-memory doorbell (a futex) or
//! in poll(2) on the awaited connections' descriptors. Tests drive steps with a simulated one.

use std::time::{Duration, Instant};

use ferroccl_transport::{Doorbell, PollFd};

use super::step::{OpState, RawOp};
use super::Conn;

/// Pure busy-waiting before yielding between checks, while the peers seem to run on other cores.
const PURE_SPIN: Duration = Duration::from_micros(10);
/// While the peers seem to share this rank's core, one wait in this many spins [`PURE_SPIN`]
/// anyway, to find out whether they have moved to another core since.
const PROBE_EVERY: u32 = 64;
/// Each probe that finds the core still shared doubles the interval, up to this many waits: a
/// failed probe costs a whole [`PURE_SPIN`] (the peer cannot run while this rank spins), which
/// every 64 waits cost 4 ranks on 2 cores about 0.1 µs per call.
const PROBE_MAX: u32 = 4096;
/// Waits in a row whose every yield returned at once that switch a shared core back to
/// spinning.
const FAST_WAITS: u32 = 8;
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

    /// Something moved after nothing had for `idle_for`: the wait that began then is over.
    fn resumed(&mut self, _idle_for: Duration) {}

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
    /// Spin or yield, learned from this rank's earlier waits.
    pub(crate) policy: SpinPolicy,
}

impl WaitBuffers {
    /// Lists with room for `fds` descriptors, so that the first sleep allocates nothing either.
    pub(crate) fn with_capacity(fds: usize) -> Self {
        WaitBuffers {
            fds: Vec::with_capacity(fds),
            sys: Vec::with_capacity(fds),
            policy: SpinPolicy::default(),
        }
    }
}

impl std::fmt::Debug for WaitBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitBuffers")
            .field("fds", &self.fds)
            .field("policy", &self.policy)
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
        if self.bufs.policy.spins(idle_for) {
            std::hint::spin_loop();
        } else {
            // Brief spinning catches a peer on another core; beyond that, or at once when the
            // peers share this core, give the core to a rank that shares it before checking
            // again.
            let t = Instant::now();
            std::thread::yield_now();
            self.bufs.policy.yielded(t.elapsed());
        }
    }

    fn resumed(&mut self, idle_for: Duration) {
        self.bufs.policy.resumed(idle_for);
    }

    fn sleep(&mut self, waiting: &Waiting<'_>, limit: Duration) {
        self.bufs.policy.slept();
        let fds = &mut self.bufs.fds;
        fds.clear();
        let mut on_bell = false;
        let mut polling = false;
        for (c, sending) in waiting.each() {
            on_bell |= c.uses_doorbell();
            polling |= c.in_flight();
            c.poll_fds(sending, !sending, fds);
        }
        if polling {
            // A copy on a GPU stream rings no doorbell when it ends: a sleep would last until
            // the limit (up to MAX_SLEEP: 100 ms per step), so give the core away and poll.
            std::thread::yield_now();
            return;
        }
        match (on_bell, self.bell, self.seen) {
            (true, Some(b), Some(seen)) if fds.is_empty() => b.wait(seen, limit),
            (true, _, _) => sleep_on(fds, &mut self.bufs.sys, limit.min(MIXED_SLEEP)),
            _ => sleep_on(fds, &mut self.bufs.sys, limit),
        }
    }
}

/// Whether a waiting rank busy-waits or yields its core: a state machine fed with how long each
/// wait lasted, so that it can be driven without a clock.
///
/// A peer on another core answers within the pure spin; a peer that shares this rank's core
/// (more ranks than free cores: the scheduler may put both ranks of a 2-rank job on one core
/// while the other is busy) cannot run until this rank yields, so every wait spent the whole
/// [`PURE_SPIN`] for nothing (a 2-rank 8 B allreduce took 13 µs instead of 0.8 µs).
///
/// A wait that ended only after yielding, where a yield handed the core to another task (it
/// took [`SLOW_YIELD`] or more), switches to yielding at once. Two kinds of evidence switch
/// back to spinning:
/// - [`FAST_WAITS`] waits in a row whose yields all returned at once (nobody else wanted this
///   core, so spinning hurts no one). One such wait is not enough: under EEVDF a yield may
///   return at once although the rank sharing the core is runnable, and on some runs of 4
///   ranks on 2 cores one rank switched back after 40 % of its waits, each time to spin the
///   next wait's 10 µs in vain.
/// - A probe answered within the spin: one wait in [`PROBE_EVERY`] in the yielding mode spins,
///   for when the peer has moved to another core while a third task shares this one.
///
/// A switch back is on trial: if it does not last (with four ranks on two cores, a wait that
/// only needs the peers on the other core is answered spinning, and the next wait needs this
/// core's other rank again), the probe interval doubles, up to [`PROBE_MAX`], and so does the
/// number of fast waits needed; a probe that finds the core still shared doubles it too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SpinPolicy {
    /// The last wait that said anything ended only after a slow yield.
    shared: bool,
    /// Waits since the mode last changed or probed, while `shared`.
    since_probe: u32,
    /// Waits from one probe to the next while `shared` (0: [`PROBE_EVERY`]); while not
    /// `shared`, non-zero on trial after a switch back to spinning, until [`PROBE_EVERY`] waits
    /// in a row (counted in `since_probe`) were answered within the spin.
    probe_every: u32,
    /// A yield of the current wait handed the core to another task.
    slow_yield: bool,
    /// A yield of the current wait returned at once, while `shared`.
    fast_yield: bool,
    /// Waits in a row whose yields all returned at once, while `shared`.
    fast_waits: u32,
    /// The current wait went to sleep.
    slept: bool,
}

impl SpinPolicy {
    /// Pure spin of the current wait.
    fn budget(&self) -> Duration {
        if self.shared && !self.since_probe.is_multiple_of(self.probe_interval()) {
            Duration::ZERO
        } else {
            PURE_SPIN
        }
    }

    /// Waits from one probe to the next while shared.
    fn probe_interval(&self) -> u32 {
        self.probe_every.max(PROBE_EVERY)
    }

    /// Whether a wait begins by spinning (the peers seem to have cores of their own).
    pub(crate) fn spins_first(&self) -> bool {
        !self.budget().is_zero()
    }

    /// Whether a wait idle for `idle_for` so far spins (else it yields).
    pub(crate) fn spins(&self, idle_for: Duration) -> bool {
        idle_for < self.budget()
    }

    /// Whether the peers seem to share this rank's core (waits yield at once, but probes).
    #[cfg(test)]
    pub(crate) fn shared(&self) -> bool {
        self.shared
    }

    /// A yield of the current wait returned after `took`.
    pub(crate) fn yielded(&mut self, took: Duration) {
        if took >= SLOW_YIELD {
            self.slow_yield = true;
        } else if self.shared {
            self.fast_yield = true;
        }
    }

    /// The current wait goes to sleep.
    pub(crate) fn slept(&mut self) {
        self.slept = true;
    }

    /// A wait ended after `idle_for`: update the mode and choose the next wait's pure spin.
    pub(crate) fn resumed(&mut self, idle_for: Duration) {
        // Only a wait that spun tells: the peer answered while this rank held the core (not
        // shared), or only once it yielded the core to another task (shared), however long
        // that took (with four ranks to a core, each spinning first, a wait lasts several
        // spins). A wait that went on to sleep says nothing of that; a shared wait whose
        // yields all returned at once counts towards FAST_WAITS.
        let slow_yield = std::mem::take(&mut self.slow_yield);
        let fast_yield = std::mem::take(&mut self.fast_yield);
        let slept = std::mem::take(&mut self.slept);
        let was_shared = self.shared;
        let spun = !self.budget().is_zero();
        if spun {
            if idle_for < PURE_SPIN {
                self.shared = false;
            } else if slow_yield && !slept {
                self.shared = true;
            }
        }
        if slow_yield || slept {
            self.fast_waits = 0;
        } else if was_shared && !spun && fast_yield {
            // Nobody else wanted this core while this rank waited: once that has held for
            // enough waits in a row, spinning costs no one anything.
            self.fast_waits += 1;
            if self.fast_waits >= self.fast_waits_needed() {
                self.shared = false;
            }
        }
        if !self.shared {
            self.fast_waits = 0;
            if was_shared {
                // Back to spinning on trial, by a probe answered spinning (it may only have
                // waited for peers on other cores while the one sharing this core had already
                // answered) or by fast yields (which EEVDF may give a rank whose core-mate is
                // runnable): the interval is kept until PROBE_EVERY waits in a row were
                // answered within the spin.
                self.since_probe = 0;
                self.probe_every = self.probe_interval();
            } else if self.probe_every != 0 {
                if idle_for < PURE_SPIN {
                    self.since_probe += 1;
                    if self.since_probe >= PROBE_EVERY {
                        self.since_probe = 0;
                        self.probe_every = 0;
                    }
                } else {
                    self.since_probe = 0;
                }
            }
            return;
        }
        if (was_shared && spun) || (!was_shared && self.probe_every != 0) {
            // A probe found the core still shared (or said nothing), or a switch back to
            // spinning did not last: probe half as often.
            self.probe_every = (self.probe_interval() * 2).min(PROBE_MAX);
            self.since_probe = 0;
        } else if !was_shared {
            self.since_probe = 0;
        }
        self.since_probe += 1;
    }

    /// Waits in a row whose yields all returned at once that switch a shared core back to
    /// spinning: [`FAST_WAITS`], times the probe interval's growth (each switch back that did
    /// not last asks for twice the evidence).
    fn fast_waits_needed(&self) -> u32 {
        FAST_WAITS * (self.probe_interval() / PROBE_EVERY)
    }
}

/// A `sched_yield` that takes this long ran another task: alone on its core it returns within
/// 1 µs here (99.97 % of 200,000 calls under load), while handing the core to a peer rank
/// and back takes the peer's whole turn (1.5 µs or more).
const SLOW_YIELD: Duration = Duration::from_micros(1);

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

#[cfg(test)]
mod tests {
    use super::*;

    const fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn spins_until_a_wait_needs_a_yield_then_yields_at_once() {
        let mut p = SpinPolicy::default();
        assert!(p.spins(us(0)) && p.spins(us(9)) && !p.spins(us(10)));
        p.resumed(us(2));
        assert!(!p.shared() && p.spins(us(9)));
        // Answered after the spin, but the yields ran nobody else: a slow peer elsewhere.
        p.yielded(us(0));
        p.resumed(us(12));
        assert!(!p.shared() && p.spins(us(9)));
        // Answered after a yield that ran another task: the peer needed this core.
        p.yielded(us(0));
        p.yielded(us(2));
        p.resumed(us(12));
        assert!(p.shared() && !p.spins(us(0)));
        // Waits that yield at once say nothing, however short or long.
        p.resumed(us(1));
        p.resumed(us(30_000));
        assert!(p.shared() && !p.spins(us(0)));
    }

    /// Drives shared-mode waits answered after a yield (1 µs) until one spins (a probe);
    /// returns how many waits yielded first before it.
    fn waits_to_next_probe(p: &mut SpinPolicy) -> u32 {
        let mut n = 0;
        while !p.spins(us(0)) {
            p.resumed(us(1));
            n += 1;
            assert!(n <= 2 * PROBE_MAX, "no probe in {n} waits");
        }
        n
    }

    #[test]
    fn a_shared_core_is_probed_and_left_when_the_probe_is_answered_spinning() {
        let mut p = SpinPolicy::default();
        p.yielded(us(2));
        p.resumed(us(12));
        assert_eq!(waits_to_next_probe(&mut p), PROBE_EVERY - 1);
        // The probe spins; answered only after the spin and a slow yield, it keeps yielding
        // first, and probes half as often.
        p.yielded(us(3));
        p.resumed(us(11));
        assert!(p.shared());
        assert_eq!(waits_to_next_probe(&mut p), 2 * PROBE_EVERY - 1);
        // The peer moved to another core: the probe is answered within the spin.
        p.resumed(us(1));
        assert!(!p.shared() && p.spins(us(9)));
    }

    #[test]
    fn probes_that_find_the_core_shared_back_off_to_the_longest_interval() {
        let mut p = SpinPolicy::default();
        p.yielded(us(2));
        p.resumed(us(12));
        let mut gaps = Vec::new();
        for _ in 0..10 {
            gaps.push(waits_to_next_probe(&mut p) + 1);
            p.yielded(us(3));
            p.resumed(us(11));
            assert!(p.shared());
        }
        assert_eq!(
            gaps,
            [64, 128, 256, 512, 1024, 2048, 4096, 4096, 4096, 4096].map(|g: u32| g),
            "PROBE_EVERY doubling to PROBE_MAX"
        );
    }

    #[test]
    fn a_probe_whose_answer_does_not_last_backs_off_too() {
        let mut p = SpinPolicy::default();
        p.yielded(us(2));
        p.resumed(us(12));
        waits_to_next_probe(&mut p);
        // The probe only waited for peers on the other core: answered spinning.
        p.resumed(us(1));
        assert!(!p.shared());
        // The next wait needs this core's other rank again: spun in vain, then a slow yield.
        p.yielded(us(3));
        p.resumed(us(12));
        assert!(p.shared());
        assert_eq!(waits_to_next_probe(&mut p), 2 * PROBE_EVERY - 1);
        // The probe (interval 128) is answered spinning: on trial again.
        p.resumed(us(1));
        assert!(!p.shared());
        // PROBE_EVERY - 1 waits answered within the spin, one that outlasted it (a slow peer
        // elsewhere, no slow yield), then PROBE_EVERY - 1 more: not PROBE_EVERY in a row, so
        // a wait that needs the core-mate again still doubles the interval.
        for _ in 0..PROBE_EVERY - 1 {
            p.resumed(us(1));
        }
        p.yielded(Duration::from_nanos(300));
        p.resumed(us(15));
        for _ in 0..PROBE_EVERY - 1 {
            p.resumed(us(1));
        }
        assert!(!p.shared());
        p.yielded(us(3));
        p.resumed(us(12));
        assert!(p.shared());
        assert_eq!(waits_to_next_probe(&mut p), 4 * PROBE_EVERY - 1);
        // On trial once more; exactly PROBE_EVERY waits in a row answered spinning forget it.
        p.resumed(us(1));
        for _ in 0..PROBE_EVERY {
            p.resumed(us(1));
        }
        p.yielded(us(3));
        p.resumed(us(12));
        assert!(p.shared());
        assert_eq!(waits_to_next_probe(&mut p), PROBE_EVERY - 1);
    }

    #[test]
    fn a_wait_that_slept_says_nothing() {
        let mut p = SpinPolicy::default();
        p.yielded(us(2));
        p.slept();
        p.resumed(us(40));
        assert!(!p.shared());
        p.yielded(us(2));
        p.resumed(us(12));
        p.resumed(us(1));
        // Probing wait that ran into sleep: still shared.
        while !p.spins(us(0)) {
            p.resumed(us(1));
        }
        p.resumed(Duration::from_millis(3));
        assert!(p.shared());
    }

    /// A yield that returned at once (nobody else wanted the core).
    const FAST: Duration = Duration::from_nanos(400);

    /// A wait of 3 µs whose one yield returned at once.
    fn fast_wait(p: &mut SpinPolicy) {
        p.yielded(FAST);
        p.resumed(us(3));
    }

    /// `waits - 1` fast waits leave a shared core shared; the next one switches it back.
    fn switches_back_after(p: &mut SpinPolicy, waits: u32) {
        for _ in 0..waits - 1 {
            fast_wait(p);
            assert!(p.shared());
        }
        fast_wait(p);
        assert!(!p.shared());
    }

    #[test]
    fn waits_whose_yields_run_nobody_else_go_back_to_spinning() {
        let mut p = SpinPolicy::default();
        p.yielded(us(2));
        p.resumed(us(12));
        assert!(p.shared());
        // The peer (now elsewhere) keeps this rank waiting; its yields return at once.
        for _ in 0..FAST_WAITS - 1 {
            fast_wait(&mut p);
            assert!(p.shared() && !p.spins(us(0)));
        }
        // A wait with a yield that ran another task starts the count again.
        p.yielded(FAST);
        p.yielded(us(2));
        p.resumed(us(3));
        // Waits answered before any yield say nothing.
        p.resumed(us(0));
        switches_back_after(&mut p, FAST_WAITS);
        assert!(p.spins(us(9)));
        // On trial: the next wait needs the core-mate after all. Back to yielding, and now
        // twice the evidence is needed to switch back.
        p.yielded(us(3));
        p.resumed(us(12));
        assert!(p.shared());
        switches_back_after(&mut p, 2 * FAST_WAITS);
    }

    #[test]
    fn a_probe_that_needed_a_slow_yield_restarts_the_count_of_fast_waits() {
        let mut p = SpinPolicy::default();
        p.yielded(us(2));
        p.resumed(us(12));
        // Waits answered before any yield, then FAST_WAITS - 1 fast ones just before the probe.
        for _ in 0..PROBE_EVERY - FAST_WAITS {
            p.resumed(us(1));
        }
        for _ in 0..FAST_WAITS - 1 {
            fast_wait(&mut p);
            assert!(p.shared());
        }
        assert!(p.spins(us(0)), "the probe");
        // The probe spins in vain and needs a slow yield: the core is still shared.
        p.yielded(us(3));
        p.resumed(us(12));
        assert!(p.shared());
        // So the fast waits start from zero, and the failed probe doubled the evidence needed.
        switches_back_after(&mut p, 2 * FAST_WAITS);
    }
}
