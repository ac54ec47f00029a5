//! Binomial-tree broadcast and reduce for small messages: `ceil(log2 nranks)` steps.
//!
//! Ranks are numbered relative to the root (`v = rank - root mod nranks`). In broadcast round
//! `k` every rank `v < 2^k` that holds the data sends it to `v + 2^k`; reduce runs the rounds
//! backwards, rank `v + 2^k` sending its partial result to `v`. Vectors longer than the slice
//! go piece by piece, each piece through all rounds.
#![forbid(unsafe_code)]

use super::builder::Builder;
use super::{BufKind, Schedule, Span};

fn rounds(n: usize) -> usize {
    (usize::BITS - (n - 1).leading_zeros()) as usize
}

/// Binomial broadcast from `root` for `rank` of `nranks` (at least 2).
pub(crate) fn broadcast(
    count: usize,
    in_place: bool,
    rank: usize,
    nranks: usize,
    root: usize,
    slice: usize,
) -> Schedule {
    let n = nranks;
    let v = (rank + n - root) % n;
    let slice = slice.max(1);
    let mut b = Builder::new(rank, n);
    if v == 0 && !in_place {
        b.copy(
            Span::new(BufKind::Input, 0, count),
            Span::new(BufKind::Output, 0, count),
        );
    }
    let from = if v == 0 {
        BufKind::Input
    } else {
        BufKind::Output
    };
    let mut base = 0;
    while base < count {
        let len = slice.min(count - base);
        for k in 0..rounds(n) {
            let d = 1 << k;
            if v < d && v + d < n {
                b.send((rank + d) % n, Span::new(from, base, len));
            } else if v >= d && v < 2 * d {
                b.recv((rank + n - d) % n, Span::new(BufKind::Output, base, len));
            }
            b.end_step();
        }
        base += len;
    }
    b.finish(0)
}

/// Binomial reduce to `root` for `rank` of `nranks` (at least 2). Partial results of ranks
/// other than the root live in one piece of scratch; the root reduces into its output.
pub(crate) fn reduce(
    count: usize,
    rank: usize,
    nranks: usize,
    root: usize,
    slice: usize,
) -> Schedule {
    let n = nranks;
    let v = (rank + n - root) % n;
    let slice = slice.max(1);
    let piece = slice.min(count);
    let acc_buf = if v == 0 {
        BufKind::Output
    } else {
        BufKind::Scratch
    };
    let mut b = Builder::new(rank, n);
    let mut base = 0;
    let mut scratch = 0;
    while base < count {
        let len = slice.min(count - base);
        let own = Span::new(BufKind::Input, base, len);
        let acc = Span::new(acc_buf, if v == 0 { base } else { 0 }, len);
        let mut cur = own;
        for k in (0..rounds(n)).rev() {
            let d = 1 << k;
            if v < d && v + d < n {
                b.recv_reduce((rank + d) % n, cur, acc);
                cur = acc;
            } else if v >= d && v < 2 * d {
                b.send((rank + n - d) % n, cur);
            }
            b.end_step();
        }
        if v == 0 && cur != acc {
            b.copy(cur, acc);
            b.end_step();
        }
        if cur.buf == BufKind::Scratch {
            scratch = piece;
        }
        base += len;
    }
    b.finish(scratch)
}
