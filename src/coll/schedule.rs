//! Schedules: what one rank does in one collective, as plain data.
//!
//! A [`Schedule`] is a list of [`Step`]s run in order. Within a step, the [`Op::Copy`] ops run
//! first, in order; then every communication op of the step (sends, receives) progresses
//! concurrently, and the step ends when all of them have completed. Messages between an ordered
//! pair of ranks are matched first-in first-out: the k-th `Send` from `a` to `b` is the k-th
//! `Recv`/`RecvReduce` at `b` from `a`, and both have the same length.
//!
//! Offsets and lengths count elements, not bytes.

/// Which buffer a [`Span`] lies in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufKind {
    /// The caller's send buffer (read only).
    Input,
    /// The caller's receive buffer.
    Output,
    /// Communicator-owned scratch space of [`Schedule::scratch`] elements.
    Scratch,
}

/// A range of elements in one buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Span {
    /// Which buffer.
    pub buf: BufKind,
    /// First element.
    pub offset: usize,
    /// Number of elements.
    pub len: usize,
}

impl Span {
    /// `len` elements of `buf` starting at `offset`.
    pub const fn new(buf: BufKind, offset: usize, len: usize) -> Self {
        Span { buf, offset, len }
    }

    /// One past the last element.
    pub const fn end(&self) -> usize {
        self.offset + self.len
    }
}

/// One operation of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Send `src` to `peer`.
    Send {
        /// Destination rank.
        peer: usize,
        /// What to send.
        src: Span,
    },
    /// Receive from `peer` into `dst`.
    Recv {
        /// Source rank.
        peer: usize,
        /// Where the data lands.
        dst: Span,
    },
    /// Receive from `peer` and reduce: `dst = src (op) incoming`. `src` and `dst` have the same
    /// length; they may be the same span.
    RecvReduce {
        /// Source rank.
        peer: usize,
        /// Local contribution.
        src: Span,
        /// Where the reduced result lands.
        dst: Span,
    },
    /// Local copy `dst = src` (the executor skips it when both name the same memory).
    Copy {
        /// From.
        src: Span,
        /// To.
        dst: Span,
    },
}

/// Ops that run together.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Step {
    /// The ops; see the module docs for their order.
    pub ops: Vec<Op>,
}

/// Everything one rank does for one collective call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schedule {
    /// The rank this schedule is for.
    pub rank: usize,
    /// Ranks in the communicator.
    pub nranks: usize,
    /// Scratch elements the schedule needs.
    pub scratch: usize,
    /// Steps, run in order.
    pub steps: Vec<Step>,
}

impl Schedule {
    /// Every op, step by step.
    pub fn ops(&self) -> impl Iterator<Item = &Op> {
        self.steps.iter().flat_map(|s| s.ops.iter())
    }

    /// Peers this schedule sends to or receives from.
    pub fn peers(&self) -> Vec<usize> {
        let mut p: Vec<usize> = self
            .ops()
            .filter_map(|op| match *op {
                Op::Send { peer, .. } | Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => {
                    Some(peer)
                }
                Op::Copy { .. } => None,
            })
            .collect();
        p.sort_unstable();
        p.dedup();
        p
    }
}
