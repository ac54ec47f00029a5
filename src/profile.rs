//! Where the time of a blocking collective goes, phase by phase (cargo feature `profile`).
//!
//! | phase | from .. to |
//! |---|---|
//! | `Enter` | the public call .. the engine (argument checks, ticket, lock) |
//! | `Plan` | the plan cache lookup (or the schedule's construction, the first time) |
//! | `Drive` | resolving a step's ops and the driver's bookkeeping between transport calls |
//! | `Send` | inside the transports' `send` |
//! | `Recv` | inside the transports' `recv` (passes that found the message there) |
//! | `Reduce` | reducing received bytes into the output |
//! | `Wait` | nothing could move: polling, spinning, yielding, sleeping |
//! | `Leave` | the last step .. the return to the caller (Avg's divide, call bookkeeping) |
//! | `Stage` | device calls that stage: copies between device buffers and pinned host memory, and waits for them |
//!
//! Built with the feature, every phase boundary reads the clock once (about 20-30 ns here) and
//! adds the time since the last boundary to the phase that ends, in counters of the calling
//! thread; [`take`] returns and clears them. Built without it, every function here is empty and
//! inlined away, so the data path pays nothing. Collectives run by a progress thread (the async
//! calls) count on that thread, not the caller's.
//!
//! ```
//! let p = ferroccl::profile::take();
//! assert_eq!(p.calls, 0);
//! ```

/// A part of one collective call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Phase {
    /// The public call up to the engine.
    Enter,
    /// The plan cache lookup.
    Plan,
    /// Op resolution and the driver's bookkeeping.
    Drive,
    /// Inside transport sends.
    Send,
    /// Inside transport receives that moved bytes.
    Recv,
    /// Reductions of received bytes.
    Reduce,
    /// Waiting for a peer.
    Wait,
    /// The last step back to the caller.
    Leave,
    /// Copies between device buffers and host staging, and their waits.
    Stage,
}

impl Phase {
    /// Every phase, in call order.
    pub const ALL: [Phase; 9] = [
        Phase::Enter,
        Phase::Plan,
        Phase::Drive,
        Phase::Send,
        Phase::Recv,
        Phase::Reduce,
        Phase::Wait,
        Phase::Leave,
        Phase::Stage,
    ];

    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Enter => "enter",
            Phase::Plan => "plan",
            Phase::Drive => "drive",
            Phase::Send => "send",
            Phase::Recv => "recv",
            Phase::Reduce => "reduce",
            Phase::Wait => "wait",
            Phase::Leave => "leave",
            Phase::Stage => "stage",
        }
    }
}

/// Counters of the calling thread since the last [`take`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Profile {
    /// Collective calls completed.
    pub calls: u64,
    /// Nanoseconds per phase, indexed by `Phase as usize`.
    pub ns: [u64; 9],
}

impl Profile {
    /// Whether the library was built with the `profile` feature (else every counter stays 0).
    pub const ENABLED: bool = cfg!(feature = "profile");

    /// Mean nanoseconds per call in `phase`.
    pub fn mean_ns(&self, phase: Phase) -> f64 {
        self.ns[phase as usize] as f64 / self.calls.max(1) as f64
    }
}

#[cfg(feature = "profile")]
mod on {
    use std::cell::RefCell;
    use std::time::Instant;

    use super::{Phase, Profile};

    #[derive(Default)]
    pub(super) struct State {
        pub counts: Profile,
        /// The open phase and when it began (None outside a call).
        pub open: Option<(Phase, Instant)>,
        /// Inside a wait: phase changes are counted as waiting.
        pub waiting: bool,
    }

    thread_local! {
        pub(super) static STATE: RefCell<State> = RefCell::new(State::default());
    }

    /// Closes the open phase and opens `next` (None: the call ends).
    pub(super) fn switch(next: Option<Phase>) {
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            let now = Instant::now();
            if let Some((p, t)) = s.open {
                s.counts.ns[p as usize] += now.duration_since(t).as_nanos() as u64;
            }
            s.open = next.map(|p| (p, now));
        });
    }
}

/// A collective call begins (phase `Enter`).
#[inline(always)]
pub(crate) fn begin() {
    #[cfg(feature = "profile")]
    {
        on::switch(Some(Phase::Enter));
        on::STATE.with(|s| s.borrow_mut().waiting = false);
    }
}

/// The call moves on to `phase` (ignored while waiting, and outside a call).
#[inline(always)]
pub(crate) fn phase(phase: Phase) {
    #[cfg(feature = "profile")]
    {
        let skip = on::STATE.with(|s| {
            let s = s.borrow();
            s.waiting || s.open.is_none()
        });
        if !skip {
            on::switch(Some(phase));
        }
    }
    #[cfg(not(feature = "profile"))]
    let _ = phase;
}

/// Nothing can move: time counts as waiting until [`wait_end`].
#[inline(always)]
pub(crate) fn wait_begin() {
    #[cfg(feature = "profile")]
    {
        phase(Phase::Wait);
        on::STATE.with(|s| s.borrow_mut().waiting = true);
    }
}

/// Something moved after a wait: back to the driver.
#[inline(always)]
pub(crate) fn wait_end() {
    #[cfg(feature = "profile")]
    {
        on::STATE.with(|s| s.borrow_mut().waiting = false);
        phase(Phase::Drive);
    }
}

/// The call returns to its caller.
#[inline(always)]
pub(crate) fn end() {
    #[cfg(feature = "profile")]
    {
        let open = on::STATE.with(|s| s.borrow().open.is_some());
        if open {
            on::switch(None);
            on::STATE.with(|s| s.borrow_mut().counts.calls += 1);
        }
    }
}

/// One collective call: [`begin`] now, [`end`] when dropped, on every return path.
pub(crate) struct Call(());

/// Starts counting one collective call (see [`Call`]).
#[inline(always)]
pub(crate) fn call() -> Call {
    begin();
    Call(())
}

impl Drop for Call {
    #[inline(always)]
    fn drop(&mut self) {
        end();
    }
}

/// The calling thread's counters since the last call, which it clears.
pub fn take() -> Profile {
    #[cfg(feature = "profile")]
    {
        on::STATE.with(|s| std::mem::take(&mut s.borrow_mut().counts))
    }
    #[cfg(not(feature = "profile"))]
    Profile::default()
}

#[cfg(all(test, feature = "profile"))]
mod tests {
    use super::*;

    #[test]
    fn phases_add_up_and_waits_absorb_inner_phases() {
        let _ = take();
        begin();
        phase(Phase::Plan);
        wait_begin();
        phase(Phase::Recv);
        std::thread::sleep(std::time::Duration::from_millis(2));
        wait_end();
        phase(Phase::Leave);
        end();
        // Outside a call nothing counts.
        phase(Phase::Send);
        end();
        let p = take();
        assert_eq!(p.calls, 1);
        assert!(p.ns[Phase::Wait as usize] >= 2_000_000, "{p:?}");
        assert_eq!(p.ns[Phase::Recv as usize], 0, "{p:?}");
        assert_eq!(p.ns[Phase::Send as usize], 0, "{p:?}");
        assert_eq!(take(), Profile::default());
    }
}
