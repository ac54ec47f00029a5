//! Small helpers shared by the algorithms: splitting a range into parts and assembling steps.
#![forbid(unsafe_code)]

use super::{Op, Schedule, Span, Step};

/// Start and length of part `i` when `len` elements are split into `parts` nearly equal parts:
/// the first `len % parts` parts are one element longer than the others.
pub(crate) fn part(len: usize, parts: usize, i: usize) -> (usize, usize) {
    let base = len / parts;
    let extra = len % parts;
    (i * base + i.min(extra), base + usize::from(i < extra))
}

/// Assembles a [`Schedule`] step by step. Zero-length ops and empty steps are dropped, so that
/// uneven splits (counts smaller than the number of ranks) produce no empty messages; both
/// ends of a message derive its length from the same arithmetic, so they drop it together.
#[derive(Debug)]
pub(crate) struct Builder {
    sched: Schedule,
    ops: Vec<Op>,
}

impl Builder {
    /// A builder for `rank` of `nranks`.
    pub(crate) fn new(rank: usize, nranks: usize) -> Self {
        Builder {
            sched: Schedule {
                rank,
                nranks,
                ..Schedule::default()
            },
            ops: Vec::new(),
        }
    }

    /// Adds a local copy to the current step.
    pub(crate) fn copy(&mut self, src: Span, dst: Span) {
        if src.len > 0 {
            self.ops.push(Op::Copy { src, dst });
        }
    }

    /// Adds a send to the current step.
    pub(crate) fn send(&mut self, peer: usize, src: Span) {
        if src.len > 0 {
            self.ops.push(Op::Send { peer, src });
        }
    }

    /// Adds a receive to the current step.
    pub(crate) fn recv(&mut self, peer: usize, dst: Span) {
        if dst.len > 0 {
            self.ops.push(Op::Recv { peer, dst });
        }
    }

    /// Adds a receive-and-reduce to the current step.
    pub(crate) fn recv_reduce(&mut self, peer: usize, src: Span, dst: Span) {
        if dst.len > 0 {
            self.ops.push(Op::RecvReduce { peer, src, dst });
        }
    }

    /// Closes the current step (dropped when it has no ops).
    pub(crate) fn end_step(&mut self) {
        if !self.ops.is_empty() {
            let ops = std::mem::take(&mut self.ops);
            self.sched.steps.push(Step { ops });
        }
    }

    /// Closes the last step and returns the schedule, which needs `scratch` elements.
    pub(crate) fn finish(mut self, scratch: usize) -> Schedule {
        self.end_step();
        self.sched.scratch = scratch;
        self.sched
    }
}
