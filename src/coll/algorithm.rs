//! Choosing an algorithm by name: [`Algorithm`], [`build_with`] and [`build_all`].
#![forbid(unsafe_code)]

use std::fmt;
use std::str::FromStr;

use super::{binomial, chain, hier, pairwise, rd, rhd, ring, tree};
use super::{build, AlgoOptions, CollArgs, CollKind, Schedule, Topology};

/// An algorithm that [`build_with`] can lay out as a schedule.
///
/// | algorithm | collectives |
/// |---|---|
/// | `ring` | all_reduce, reduce_scatter, all_gather |
/// | `chain` | broadcast, reduce |
/// | `pairwise` | all_to_all |
/// | `tree` (double binary tree over hosts, chain inside) | all_reduce |
/// | `rd` (recursive doubling) | all_reduce |
/// | `rhd` (Rabenseifner: recursive halving, then doubling) | all_reduce |
/// | `hier` (inside hosts, across, inside again) | all_reduce, broadcast, reduce; all_gather and reduce_scatter on equal hosts |
/// | `binomial` | broadcast, reduce |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    /// Ring: bandwidth-optimal, `2 (n - 1)` steps for all_reduce.
    Ring,
    /// Pipelined chain (broadcast, reduce).
    Chain,
    /// Pairwise exchange (all_to_all).
    Pairwise,
    /// Double binary tree across hosts, chain inside each host, pipelined.
    Tree,
    /// Recursive doubling: `log2 n` (+2 for non-powers of two) full-vector exchanges.
    RecursiveDoubling,
    /// Rabenseifner: reduce-scatter by recursive halving, all_gather by recursive doubling;
    /// `2 log2 n` (+2) steps moving `2 S (n - 1) / n` bytes per rank.
    Rabenseifner,
    /// Hierarchical: inside each host, across hosts among equal local ranks, inside again.
    Hierarchical,
    /// Binomial tree (broadcast, reduce): `ceil(log2 n)` steps.
    Binomial,
}

impl Algorithm {
    /// Every algorithm.
    pub const ALL: [Algorithm; 8] = [
        Algorithm::Ring,
        Algorithm::Chain,
        Algorithm::Pairwise,
        Algorithm::Tree,
        Algorithm::RecursiveDoubling,
        Algorithm::Rabenseifner,
        Algorithm::Hierarchical,
        Algorithm::Binomial,
    ];

    /// Name in `FERRO_ALGO`, rule strings and logs.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Chain => "chain",
            Algorithm::Pairwise => "pairwise",
            Algorithm::Tree => "tree",
            Algorithm::RecursiveDoubling => "rd",
            Algorithm::Rabenseifner => "rhd",
            Algorithm::Hierarchical => "hier",
            Algorithm::Binomial => "binomial",
        }
    }

    /// What [`build`] uses for `kind`.
    pub const fn default_for(kind: CollKind) -> Algorithm {
        match kind {
            CollKind::AllReduce | CollKind::ReduceScatter | CollKind::AllGather => Algorithm::Ring,
            CollKind::Broadcast { .. } | CollKind::Reduce { .. } => Algorithm::Chain,
            CollKind::AllToAll => Algorithm::Pairwise,
        }
    }

    /// Whether [`build_with`] has a schedule of this algorithm for `kind` (hierarchical
    /// all_gather and reduce_scatter also need equal hosts).
    pub const fn supports(self, kind: CollKind) -> bool {
        use CollKind::*;
        matches!(
            (self, kind),
            (Algorithm::Ring, AllReduce | ReduceScatter | AllGather)
                | (Algorithm::Chain, Broadcast { .. } | Reduce { .. })
                | (Algorithm::Pairwise, AllToAll)
                | (Algorithm::Tree, AllReduce)
                | (Algorithm::RecursiveDoubling, AllReduce)
                | (Algorithm::Rabenseifner, AllReduce)
                | (
                    Algorithm::Hierarchical,
                    AllReduce | AllGather | ReduceScatter | Broadcast { .. } | Reduce { .. }
                )
                | (Algorithm::Binomial, Broadcast { .. } | Reduce { .. })
        )
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = String;

    /// Parses a name of [`Algorithm::name`] (case-insensitive; `recursive_doubling`,
    /// `rabenseifner`, `halving_doubling`, `hierarchical` and `double_tree` are accepted too).
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        let alias = match t.as_str() {
            "recursive_doubling" | "recursive-doubling" => Some(Algorithm::RecursiveDoubling),
            "rabenseifner" | "halving_doubling" | "halving-doubling" => {
                Some(Algorithm::Rabenseifner)
            }
            "hierarchical" => Some(Algorithm::Hierarchical),
            "double_tree" | "doubletree" => Some(Algorithm::Tree),
            _ => None,
        };
        alias
            .or_else(|| Algorithm::ALL.into_iter().find(|a| a.name() == t))
            .ok_or_else(|| {
                let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
                format!(
                    "unknown algorithm '{s}' (expected one of {})",
                    names.join(", ")
                )
            })
    }
}

/// Checks that `algo` can run `args` on `topo`.
fn validate(
    args: &CollArgs,
    nranks: usize,
    algo: Algorithm,
    topo: &Topology,
) -> Result<(), String> {
    let name = args.kind.name();
    topo.validate(nranks).map_err(|e| format!("{name}: {e}"))?;
    if !algo.supports(args.kind) {
        return Err(format!("{name}: algorithm '{algo}' does not implement it"));
    }
    if let Some(root) = args.kind.root() {
        if root >= nranks {
            return Err(format!(
                "{name}: invalid root {root} (root must be 0..{})",
                nranks.saturating_sub(1)
            ));
        }
    }
    if algo == Algorithm::Hierarchical
        && matches!(args.kind, CollKind::AllGather | CollKind::ReduceScatter)
        && nranks >= 2
    {
        hier::needs_equal_hosts(topo, name)?;
    }
    Ok(())
}

/// The schedule of `rank` (of `nranks`) for one call with algorithm `algo` on `topo`.
///
/// With one rank every algorithm gives [`build`]'s single copy. Errors: `algo` does not
/// implement the collective, `topo` does not describe `nranks` ranks, a root or rank out of
/// range, or a hierarchical all_gather / reduce_scatter on hosts of different sizes. The tree
/// plans every rank's transfers: use [`build_all`] when all schedules are needed.
pub fn build_with(
    args: &CollArgs,
    rank: usize,
    nranks: usize,
    opts: &AlgoOptions,
    algo: Algorithm,
    topo: &Topology,
) -> Result<Schedule, String> {
    validate(args, nranks, algo, topo)?;
    if rank >= nranks {
        return Err(format!(
            "{}: rank {rank} out of range for {nranks} ranks",
            args.kind.name()
        ));
    }
    Ok(build_one(args, rank, nranks, opts, algo, topo))
}

/// The schedules of every rank, `[r]` for rank `r`; same errors as [`build_with`].
pub fn build_all(
    args: &CollArgs,
    nranks: usize,
    opts: &AlgoOptions,
    algo: Algorithm,
    topo: &Topology,
) -> Result<Vec<Schedule>, String> {
    validate(args, nranks, algo, topo)?;
    if algo == Algorithm::Tree && nranks >= 2 {
        return Ok(tree::all_reduce_all(args.count, topo, opts.slice));
    }
    if algo == Algorithm::Rabenseifner && nranks >= 2 {
        return Ok(rhd::all_reduce_all(args.count, topo, opts.slice));
    }
    Ok((0..nranks)
        .map(|r| build_one(args, r, nranks, opts, algo, topo))
        .collect())
}

fn build_one(
    args: &CollArgs,
    rank: usize,
    nranks: usize,
    opts: &AlgoOptions,
    algo: Algorithm,
    topo: &Topology,
) -> Schedule {
    let CollArgs {
        kind,
        count,
        in_place,
    } = *args;
    let slice = opts.slice;
    if nranks < 2 {
        return build(args, rank, nranks, opts);
    }
    match (algo, kind) {
        (Algorithm::Ring, CollKind::AllReduce) => ring::all_reduce(count, rank, nranks, slice),
        (Algorithm::Ring, CollKind::ReduceScatter) => {
            ring::reduce_scatter(count, in_place, rank, nranks, slice)
        }
        (Algorithm::Ring, CollKind::AllGather) => {
            ring::all_gather(count, in_place, rank, nranks, slice)
        }
        (Algorithm::Chain, CollKind::Broadcast { root }) => {
            chain::broadcast(count, in_place, rank, nranks, root, slice)
        }
        (Algorithm::Chain, CollKind::Reduce { root }) => {
            chain::reduce(count, rank, nranks, root, slice)
        }
        (Algorithm::Pairwise, CollKind::AllToAll) => {
            pairwise::all_to_all(count, in_place, rank, nranks, slice)
        }
        (Algorithm::Tree, CollKind::AllReduce) => tree::all_reduce(count, rank, topo, slice),
        (Algorithm::RecursiveDoubling, CollKind::AllReduce) => {
            rd::all_reduce(count, in_place, rank, nranks, slice)
        }
        (Algorithm::Rabenseifner, CollKind::AllReduce) => rhd::all_reduce(count, rank, topo, slice),
        (Algorithm::Hierarchical, CollKind::AllReduce) => {
            hier::all_reduce(count, rank, topo, slice)
        }
        (Algorithm::Hierarchical, CollKind::AllGather) => {
            hier::all_gather(count, in_place, rank, topo, slice)
        }
        (Algorithm::Hierarchical, CollKind::ReduceScatter) => {
            hier::reduce_scatter(count, in_place, rank, topo, slice)
        }
        (Algorithm::Hierarchical, CollKind::Broadcast { root }) => {
            hier::broadcast(count, in_place, rank, root, topo, slice)
        }
        (Algorithm::Hierarchical, CollKind::Reduce { root }) => {
            hier::reduce(count, rank, root, topo, slice)
        }
        (Algorithm::Binomial, CollKind::Broadcast { root }) => {
            binomial::broadcast(count, in_place, rank, nranks, root, slice)
        }
        (Algorithm::Binomial, CollKind::Reduce { root }) => {
            binomial::reduce(count, rank, nranks, root, slice)
        }
        // validate() admitted only the pairs above.
        _ => build(args, rank, nranks, opts),
    }
}
