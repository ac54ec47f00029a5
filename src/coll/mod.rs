//! Collective algorithms as schedules: pure functions from (collective, rank, nranks, count)
//! to a [`Schedule`]. No I/O and no `unsafe` here.
#![forbid(unsafe_code)]

mod algorithm;
mod binomial;
mod builder;
mod chain;
pub mod check;
mod hier;
mod pairwise;
mod rd;
mod rhd;
mod ring;
pub mod schedule;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_algo;
mod tree;

/// The algorithms' view of where ranks live; defined in [`crate::topo`].
pub use crate::topo::Topology;
pub use algorithm::{build_all, build_with, Algorithm};
pub use check::{check, check_schedules, Checker};
pub use schedule::{BufKind, Op, Schedule, Span, Step};

/// Which collective, with its root where it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollKind {
    /// Every rank ends with the reduction of all inputs.
    AllReduce,
    /// Every rank ends with the root's input.
    Broadcast {
        /// The rank whose data is sent.
        root: usize,
    },
    /// The root ends with the reduction of all inputs.
    Reduce {
        /// The rank that receives the result.
        root: usize,
    },
    /// Every rank ends with every rank's input, concatenated in rank order.
    AllGather,
    /// Rank r ends with block r of the reduction of all inputs.
    ReduceScatter,
    /// Rank r sends block p of its input to rank p, and receives rank p's block r into block p.
    AllToAll,
}

impl CollKind {
    /// Name as used in error messages and logs (`all_reduce`, `broadcast`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            CollKind::AllReduce => "all_reduce",
            CollKind::Broadcast { .. } => "broadcast",
            CollKind::Reduce { .. } => "reduce",
            CollKind::AllGather => "all_gather",
            CollKind::ReduceScatter => "reduce_scatter",
            CollKind::AllToAll => "all_to_all",
        }
    }

    /// The root, for rooted collectives.
    pub const fn root(self) -> Option<usize> {
        match self {
            CollKind::Broadcast { root } | CollKind::Reduce { root } => Some(root),
            _ => None,
        }
    }

    /// Whether the collective reduces.
    pub const fn reduces(self) -> bool {
        matches!(
            self,
            CollKind::AllReduce | CollKind::Reduce { .. } | CollKind::ReduceScatter
        )
    }

    /// Whether the collective is element-wise: its buffers all hold `count` elements, and
    /// element `i` of the output depends on element `i` of the inputs only.
    pub const fn is_elementwise(self) -> bool {
        matches!(
            self,
            CollKind::AllReduce | CollKind::Broadcast { .. } | CollKind::Reduce { .. }
        )
    }

    /// Elements in the input and the output buffer for `count` (NCCL's meaning of count:
    /// all_gather counts what each rank sends, reduce_scatter what each rank receives,
    /// all_to_all what goes to each peer).
    pub const fn buffer_lens(self, count: usize, nranks: usize) -> (usize, usize) {
        match self {
            CollKind::AllReduce | CollKind::Broadcast { .. } | CollKind::Reduce { .. } => {
                (count, count)
            }
            CollKind::AllGather => (count, count * nranks),
            CollKind::ReduceScatter => (count * nranks, count),
            CollKind::AllToAll => (count * nranks, count * nranks),
        }
    }

    /// For in-place calls (one buffer), where the input and the output start in that buffer,
    /// following NCCL: all_gather's input is block `rank` of the output; reduce_scatter's
    /// output is block `rank` of the input.
    pub const fn in_place_offsets(self, count: usize, rank: usize) -> (usize, usize) {
        match self {
            CollKind::AllGather => (rank * count, 0),
            CollKind::ReduceScatter => (0, rank * count),
            _ => (0, 0),
        }
    }
}

/// One collective call as the algorithms see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CollArgs {
    /// Which collective.
    pub kind: CollKind,
    /// Elements, in NCCL's meaning for `kind` (see [`CollKind::buffer_lens`]).
    pub count: usize,
    /// Whether input and output are one buffer (see [`CollKind::in_place_offsets`]).
    pub in_place: bool,
}

/// Tunables of the algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AlgoOptions {
    /// Largest piece, in elements, that a pipelined algorithm moves in one step.
    pub slice: usize,
}

/// The schedule of `rank` (of `nranks`) for one collective call.
///
/// | collective       | algorithm                                               |
/// |------------------|---------------------------------------------------------|
/// | `all_reduce`     | ring: reduce-scatter then all-gather, in rounds         |
/// | `reduce_scatter` | ring, partial results in scratch (in the input in place)|
/// | `all_gather`     | ring                                                    |
/// | `broadcast`      | pipelined chain from the root                           |
/// | `reduce`         | pipelined chain ending at the root                      |
/// | `all_to_all`     | pairwise exchange                                       |
///
/// No message is longer than `opts.slice` elements (a slice of 0 counts as 1). With one rank
/// the schedule is a single copy out of place and empty in place.
///
/// Preconditions, checked by the caller (see [`check::validate`]): `rank < nranks` and a root
/// `< nranks`. The result is the same pure function of the arguments on every rank.
pub fn build(args: &CollArgs, rank: usize, nranks: usize, opts: &AlgoOptions) -> Schedule {
    let CollArgs {
        kind,
        count,
        in_place,
    } = *args;
    let slice = opts.slice;
    if nranks < 2 {
        let mut sched = Schedule {
            rank,
            nranks,
            ..Schedule::default()
        };
        let (in_len, out_len) = kind.buffer_lens(count, nranks);
        let len = in_len.min(out_len);
        if !in_place && len > 0 {
            sched.steps.push(Step {
                ops: vec![Op::Copy {
                    src: Span::new(BufKind::Input, 0, len),
                    dst: Span::new(BufKind::Output, 0, len),
                }],
            });
        }
        return sched;
    }
    match kind {
        CollKind::AllReduce => ring::all_reduce(count, rank, nranks, slice),
        CollKind::ReduceScatter => ring::reduce_scatter(count, in_place, rank, nranks, slice),
        CollKind::AllGather => ring::all_gather(count, in_place, rank, nranks, slice),
        CollKind::Broadcast { root } => {
            chain::broadcast(count, in_place, rank, nranks, root, slice)
        }
        CollKind::Reduce { root } => chain::reduce(count, rank, nranks, root, slice),
        CollKind::AllToAll => pairwise::all_to_all(count, in_place, rank, nranks, slice),
    }
}
