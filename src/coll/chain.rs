//! Pipelined chain algorithms: broadcast (a chain starting at the root) and reduce (a chain
//! ending at the root).
//!
//! The data moves in slices of at most [`AlgoOptions::slice`] elements; a rank forwards
//! slice `k` in the same step as it receives slice `k + 1`, so with `m` slices the chain
//! takes `m + nranks - 2` steps.
//!
//! [`AlgoOptions::slice`]: super::AlgoOptions::slice
#![forbid(unsafe_code)]

use super::builder::Builder;
use super::{BufKind, Schedule, Span};

/// Slice `k` of `count` elements cut into slices of `slice` elements, in `buf`.
fn slice_span(buf: BufKind, count: usize, slice: usize, k: usize) -> Span {
    let off = k * slice;
    Span::new(buf, off, slice.min(count - off))
}

/// Pipelined chain broadcast from `root` over `root, root + 1, ...` (mod nranks, at least 2).
///
/// The root sends slice `k` from its input in step `k` (and out of place copies its input to
/// its output in the first step); the rank at distance `d` receives slice `k` into its output
/// in its step `k + d - 1` and forwards it from there one step later.
pub(crate) fn broadcast(
    count: usize,
    in_place: bool,
    rank: usize,
    nranks: usize,
    root: usize,
    slice: usize,
) -> Schedule {
    let n = nranks;
    let next = (rank + 1) % n;
    let prev = (rank + n - 1) % n;
    let slice = slice.max(1);
    let m = count.div_ceil(slice);
    let pos = (rank + n - root % n) % n;
    let mut b = Builder::new(rank, n);
    if pos == 0 {
        if !in_place {
            b.copy(
                Span::new(BufKind::Input, 0, count),
                Span::new(BufKind::Output, 0, count),
            );
        }
        for k in 0..m {
            b.send(next, slice_span(BufKind::Input, count, slice, k));
            b.end_step();
        }
    } else {
        // Step t: receive slice t + 1 - pos, forward slice t - pos (ranks before the last).
        for t in pos - 1..pos + m {
            if t + 1 - pos < m {
                b.recv(prev, slice_span(BufKind::Output, count, slice, t + 1 - pos));
            }
            if pos < n - 1 && t >= pos {
                b.send(next, slice_span(BufKind::Output, count, slice, t - pos));
            }
            b.end_step();
        }
    }
    b.finish(0)
}

/// Pipelined chain reduce over `root + 1, root + 2, ..., root` (mod nranks, at least 2).
///
/// The first rank of the chain sends slice `k` of its input in step `k`; the rank at distance
/// `d` from it reduces slice `k` with its own input in step `k + d - 1` and forwards the partial
/// result one step later. Partial results on ranks other than the root alternate between two
/// scratch slots, so no rank but the root writes its output and no rank writes its input.
pub(crate) fn reduce(
    count: usize,
    rank: usize,
    nranks: usize,
    root: usize,
    slice: usize,
) -> Schedule {
    let n = nranks;
    let next = (rank + 1) % n;
    let prev = (rank + n - 1) % n;
    let slice = slice.max(1);
    let piece = slice.min(count);
    let m = count.div_ceil(slice);
    let pos = (rank + 2 * n - root % n - 1) % n;
    let is_root = pos == n - 1;
    let slot = |k: usize| {
        let s = slice_span(BufKind::Scratch, count, slice, k);
        Span::new(BufKind::Scratch, (k % 2) * piece, s.len)
    };
    let mut b = Builder::new(rank, n);
    let mut scratch = 0;
    if pos == 0 {
        for k in 0..m {
            b.send(next, slice_span(BufKind::Input, count, slice, k));
            b.end_step();
        }
    } else {
        // Step t: reduce slice t + 1 - pos, forward slice t - pos (ranks before the root).
        for t in pos - 1..pos + m {
            let k = t + 1 - pos;
            if k < m {
                let own = slice_span(BufKind::Input, count, slice, k);
                let dst = if is_root {
                    slice_span(BufKind::Output, count, slice, k)
                } else {
                    slot(k)
                };
                b.recv_reduce(prev, own, dst);
            }
            if !is_root && t >= pos {
                b.send(next, slot(t - pos));
            }
            b.end_step();
        }
        if !is_root {
            scratch = m.min(2) * piece;
        }
    }
    b.finish(scratch)
}
