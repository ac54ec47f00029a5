//! The schedule checker: runs the schedules of all ranks symbolically and proves them right.
//!
//! Every element is represented by what it holds: a set of ranks (a `u64` bitmask) and an
//! input index. Rank `r`'s input element `i` starts as `({r}, i)`; a reduction of two values
//! with the same index unions their sets. At the end, element `i` of a reduction's output must
//! hold `(all ranks, i)`, and element `i` of a broadcast, all_gather or all_to_all output the
//! `({source rank}, source index)` it was copied from.
//!
//! [`check_schedules`] verifies, in order:
//!
//! 1. shape: one schedule per rank, with matching `rank` and `nranks`;
//! 2. every span lies inside its buffer (input and output lengths from
//!    [`CollKind::buffer_lens`], scratch from [`Schedule::scratch`]), peers are valid, the two
//!    spans of a copy or a receive-reduce have equal lengths and are either the same memory or
//!    disjoint, and nothing writes a buffer it must not (the input out of place; the output of
//!    a reduce on a rank other than the root);
//! 3. within a step, no communication op writes memory another one reads or writes;
//! 4. the `k`-th send from `a` to `b` and the `k`-th receive at `b` from `a` have the same
//!    length, and every message has both ends;
//! 5. the ranks progress without deadlock when a send completes only together with its
//!    receive (rendezvous), each rank finishing a step once all its communication ops have met
//!    their peers' ops in the peers' current steps;
//! 6. no op reads uninitialized memory, no reduction combines different elements or counts a
//!    rank twice, the outputs hold the expected values (on the root only for reduce) and, out
//!    of place, the inputs are unchanged.
//!
//! In-place calls have one buffer per rank holding input and output at
//! [`CollKind::in_place_offsets`]; spans are compared by the memory they name, not by buffer
//! kind. Ranks other than the root hold no meaningful input in a broadcast: reading it counts
//! as reading uninitialized memory.
//!
//! The symbolic memory takes 16 bytes per element of every buffer of every rank; a
//! [`Checker`] keeps it between calls.
//!
//! [`CollKind::buffer_lens`]: crate::coll::CollKind::buffer_lens
//! [`CollKind::in_place_offsets`]: crate::coll::CollKind::in_place_offsets
#![forbid(unsafe_code)]

mod layout;
mod messages;
mod ops;
mod sim;

use super::{build, AlgoOptions, BufKind, CollArgs, Op, Schedule, Span};
use layout::Layout;
use messages::match_messages;
use ops::check_ops;
use sim::{Sim, Val};

/// The most ranks the checker handles (contributions are a `u64` bitmask).
pub const MAX_RANKS: usize = 64;

/// Checks that `args` and `nranks` describe a call the algorithms can build: `1 <= nranks <=`
/// [`MAX_RANKS`] for the checker, a root below `nranks`, and buffer lengths that fit `usize`.
pub fn validate(args: &CollArgs, nranks: usize) -> Result<(), String> {
    let name = args.kind.name();
    if nranks == 0 || nranks > MAX_RANKS {
        return Err(format!(
            "{name}: nranks {nranks} out of range (the checker handles 1..={MAX_RANKS})"
        ));
    }
    if let Some(root) = args.kind.root() {
        if root >= nranks {
            return Err(format!(
                "{name}: invalid root {root} (root must be 0..{})",
                nranks - 1
            ));
        }
    }
    if args.count.checked_mul(nranks).is_none() {
        return Err(format!(
            "{name}: count {} times nranks {nranks} overflows",
            args.count
        ));
    }
    Ok(())
}

/// Builds the schedules of all `nranks` ranks with [`build`] and checks them with
/// [`check_schedules`].
pub fn check(args: &CollArgs, nranks: usize, opts: &AlgoOptions) -> Result<(), String> {
    Checker::new().check(args, nranks, opts)
}

/// Checks explicit schedules (`schedules[r]` for rank `r`) of one collective call; see the
/// module docs for what is verified. The error names the collective, the rank, the step, the
/// op and the offending value.
pub fn check_schedules(
    args: &CollArgs,
    nranks: usize,
    schedules: &[Schedule],
) -> Result<(), String> {
    Checker::new().check_schedules(args, nranks, schedules)
}

/// A checker that keeps its symbolic memory between calls: sweeps over many calls run several
/// times faster than with the free functions, which start from fresh memory each time.
#[derive(Debug, Default)]
pub struct Checker {
    /// The symbolic memory of all ranks, one after another.
    mem: Vec<Val>,
}

impl Checker {
    /// A checker with no memory yet.
    pub fn new() -> Self {
        Checker::default()
    }

    /// Like [`check`].
    pub fn check(
        &mut self,
        args: &CollArgs,
        nranks: usize,
        opts: &AlgoOptions,
    ) -> Result<(), String> {
        validate(args, nranks)?;
        let scheds: Vec<Schedule> = (0..nranks)
            .map(|rank| build(args, rank, nranks, opts))
            .collect();
        self.check_schedules(args, nranks, &scheds)
    }

    /// Like [`check_schedules`].
    pub fn check_schedules(
        &mut self,
        args: &CollArgs,
        nranks: usize,
        schedules: &[Schedule],
    ) -> Result<(), String> {
        let what = describe_call(args, nranks);
        check_inner(&mut self.mem, args, nranks, schedules).map_err(|e| format!("{what}: {e}"))
    }
}

fn check_inner(
    mem: &mut Vec<Val>,
    args: &CollArgs,
    nranks: usize,
    scheds: &[Schedule],
) -> Result<(), String> {
    validate(args, nranks)?;
    if scheds.len() != nranks {
        return Err(format!("{} schedules for {nranks} ranks", scheds.len()));
    }
    for (r, s) in scheds.iter().enumerate() {
        if s.rank != r || s.nranks != nranks {
            return Err(format!(
                "schedule {r} is for rank {} of {} ranks",
                s.rank, s.nranks
            ));
        }
    }
    let mut origin = 0;
    let mut layouts = Vec::with_capacity(nranks);
    for s in scheds {
        let lay = Layout::new(args, s.rank, nranks, s.scratch, origin);
        origin = lay.end();
        check_ops(args, nranks, s, &lay)?;
        layouts.push(lay);
    }
    let partners = match_messages(nranks, scheds)?;
    let mut sim = Sim::new(mem, args, nranks, scheds, &layouts, partners);
    sim.run()?;
    sim.check_results()
}

/// `all_reduce(count=10, in place, nranks=4)`.
fn describe_call(args: &CollArgs, nranks: usize) -> String {
    let root = match args.kind.root() {
        Some(root) => format!("root={root}, "),
        None => String::new(),
    };
    let place = if args.in_place {
        "in place"
    } else {
        "out of place"
    };
    format!(
        "{}({root}count={}, {place}, nranks={nranks})",
        args.kind.name(),
        args.count
    )
}

fn describe_span(s: &Span) -> String {
    let buf = match s.buf {
        BufKind::Input => "input",
        BufKind::Output => "output",
        BufKind::Scratch => "scratch",
    };
    format!("{buf}[{}..{}]", s.offset, s.offset.saturating_add(s.len))
}

fn describe_op(op: &Op) -> String {
    match op {
        Op::Send { peer, src } => format!("send {} to rank {peer}", describe_span(src)),
        Op::Recv { peer, dst } => format!("recv {} from rank {peer}", describe_span(dst)),
        Op::RecvReduce { peer, src, dst } => format!(
            "recv_reduce from rank {peer}: {} = {} + incoming",
            describe_span(dst),
            describe_span(src)
        ),
        Op::Copy { src, dst } => {
            format!("copy {} to {}", describe_span(src), describe_span(dst))
        }
    }
}

/// `rank 2 step 3 op 1 (send input[0..4] to rank 3)`.
pub(super) fn locate(rank: usize, step: usize, i: usize, op: &Op) -> String {
    format!("rank {rank} step {step} op {i} ({})", describe_op(op))
}

/// The peer of a communication op, `None` for a copy.
pub(super) fn peer_of(op: &Op) -> Option<usize> {
    match *op {
        Op::Send { peer, .. } | Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => Some(peer),
        Op::Copy { .. } => None,
    }
}
