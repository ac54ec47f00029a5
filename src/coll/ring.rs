//! Ring algorithms: all_reduce (reduce-scatter then all-gather), reduce_scatter, all_gather.
//!
//! Rank `r` sends to `r + 1` and receives from `r - 1` (mod nranks) in every step. Large
//! counts are cut into rounds so that no message is longer than [`AlgoOptions::slice`]; the
//! rounds run one after another.
//!
//! [`AlgoOptions::slice`]: super::AlgoOptions::slice
#![forbid(unsafe_code)]

use super::builder::{part, Builder};
use super::{BufKind, Schedule, Span};

/// Ring all_reduce of `count` elements for `rank` of `nranks` (at least 2).
///
/// Round by round, each of `nranks` chunks goes around the ring twice: `nranks - 1` steps of
/// reduce-scatter (after which rank `r` holds the full reduction of chunk `r + 1`), then
/// `nranks - 1` steps of all-gather. Out of place, the first step sends straight from the
/// input and every reduction reads its local operand from the input, so the input is never
/// copied; partial results live in the output.
pub(crate) fn all_reduce(count: usize, rank: usize, nranks: usize, slice: usize) -> Schedule {
    let n = nranks;
    let next = (rank + 1) % n;
    let prev = (rank + n - 1) % n;
    let round = slice.max(1).saturating_mul(n);
    let mut b = Builder::new(rank, n);
    let mut base = 0;
    while base < count {
        let len = round.min(count - base);
        let chunk = |buf: BufKind, c: usize| {
            let (off, l) = part(len, n, c);
            Span::new(buf, base + off, l)
        };
        // Reduce-scatter: send chunk r - s, receive and reduce chunk r - s - 1.
        for s in 0..n - 1 {
            let sc = (rank + n - s) % n;
            let rc = (rank + 2 * n - s - 1) % n;
            let src = if s == 0 {
                BufKind::Input
            } else {
                BufKind::Output
            };
            b.send(next, chunk(src, sc));
            b.recv_reduce(prev, chunk(BufKind::Input, rc), chunk(BufKind::Output, rc));
            b.end_step();
        }
        // All-gather: send chunk r + 1 - s, receive chunk r - s.
        for s in 0..n - 1 {
            let sc = (rank + 1 + n - s) % n;
            let rc = (rank + n - s) % n;
            b.send(next, chunk(BufKind::Output, sc));
            b.recv(prev, chunk(BufKind::Output, rc));
            b.end_step();
        }
        base += len;
    }
    b.finish(0)
}

/// Ring reduce_scatter: rank `r` ends with block `r` (of `count` elements) of the reduction.
///
/// In each round (a piece of at most `slice` elements of every block), rank `r` sends the
/// partial result of block `r - s - 1` and reduces into block `r - s - 2` in step `s`, so the
/// last step completes block `r`, written straight to the output. Out of place, partial
/// results alternate between two scratch slots (the input is never written); in place, they
/// are kept in the input buffer itself.
pub(crate) fn reduce_scatter(
    count: usize,
    in_place: bool,
    rank: usize,
    nranks: usize,
    slice: usize,
) -> Schedule {
    let n = nranks;
    let next = (rank + 1) % n;
    let prev = (rank + n - 1) % n;
    let slice = slice.max(1);
    let piece = slice.min(count);
    let slot = |s: usize, len: usize| Span::new(BufKind::Scratch, (s % 2) * piece, len);
    let mut b = Builder::new(rank, n);
    let mut base = 0;
    while base < count {
        let len = slice.min(count - base);
        let block = |c: usize| Span::new(BufKind::Input, c * count + base, len);
        for s in 0..n - 1 {
            let sc = (rank + 2 * n - s - 1) % n;
            let rc = (rank + 2 * n - s - 2) % n;
            let src = if s == 0 || in_place {
                block(sc)
            } else {
                slot(s - 1, len)
            };
            let dst = if s == n - 2 {
                Span::new(BufKind::Output, base, len)
            } else if in_place {
                block(rc)
            } else {
                slot(s, len)
            };
            b.send(next, src);
            b.recv_reduce(prev, block(rc), dst);
            b.end_step();
        }
        base += len;
    }
    // Step s writes slot s % 2 for s < n - 2: no slot for 2 ranks, one for 3, two beyond.
    let scratch = if in_place { 0 } else { (n - 2).min(2) * piece };
    b.finish(scratch)
}

/// Ring all_gather: every rank ends with all inputs (`count` elements each) in rank order.
///
/// In step `s` rank `r` forwards block `r - s` and receives block `r - s - 1`, piece by piece
/// (pieces of at most `slice` elements). Out of place, the own block is copied into the
/// output in the first step while the first send goes straight from the input.
pub(crate) fn all_gather(
    count: usize,
    in_place: bool,
    rank: usize,
    nranks: usize,
    slice: usize,
) -> Schedule {
    let n = nranks;
    let next = (rank + 1) % n;
    let prev = (rank + n - 1) % n;
    let slice = slice.max(1);
    let mut b = Builder::new(rank, n);
    if !in_place {
        b.copy(
            Span::new(BufKind::Input, 0, count),
            Span::new(BufKind::Output, rank * count, count),
        );
    }
    let mut base = 0;
    while base < count {
        let len = slice.min(count - base);
        let block = |c: usize| Span::new(BufKind::Output, c * count + base, len);
        for s in 0..n - 1 {
            let sc = (rank + n - s) % n;
            let rc = (rank + 2 * n - s - 1) % n;
            let src = if s == 0 {
                Span::new(BufKind::Input, base, len)
            } else {
                block(sc)
            };
            b.send(next, src);
            b.recv(prev, block(rc));
            b.end_step();
        }
        base += len;
    }
    b.finish(0)
}
