//! Recursive-doubling all_reduce for small messages, correct for any number of ranks.
//!
//! With `p` the largest power of two not above `nranks` and `rem = nranks - p`, ranks `2i`
//! (`i < rem`) first fold their input into rank `2i + 1`; the `p` remaining ranks then exchange
//! and reduce their whole vector with the partner at distance 1, 2, 4, ... (`log2 p` steps);
//! finally ranks `2i + 1` send the result back to ranks `2i`. Vectors longer than the slice are
//! reduced piece by piece, one full exchange sequence per piece.
#![forbid(unsafe_code)]

use super::builder::Builder;
use super::{BufKind, Schedule, Span};

/// Position of `rank` among the `p` exchanging ranks, or `None` for a folded rank.
pub(super) fn vrank(rank: usize, rem: usize) -> Option<usize> {
    if rank < 2 * rem {
        (rank % 2 == 1).then_some(rank / 2)
    } else {
        Some(rank - rem)
    }
}

/// The real rank of exchanging position `v`.
pub(super) fn real(v: usize, rem: usize) -> usize {
    if v < rem {
        2 * v + 1
    } else {
        v + rem
    }
}

/// Recursive-doubling all_reduce of `count` elements for `rank` of `nranks` (at least 2).
///
/// Each exchange sends the current partial vector and reduces the partner's into the other of
/// two places (output and one piece of scratch), so no step reads memory it writes; the last
/// reduction lands in the output (or a final copy moves it there).
pub(crate) fn all_reduce(
    count: usize,
    in_place: bool,
    rank: usize,
    nranks: usize,
    slice: usize,
) -> Schedule {
    let n = nranks;
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let rem = n - p;
    let log = p.trailing_zeros() as usize;
    let slice = slice.max(1);
    let piece = slice.min(count);
    let mut b = Builder::new(rank, n);
    // Same memory: the input and the output are one buffer in place.
    let same = |a: BufKind, c: BufKind| {
        a == c || (in_place && a != BufKind::Scratch && c != BufKind::Scratch)
    };
    let mut base = 0;
    while base < count {
        let len = slice.min(count - base);
        let at = |buf: BufKind| {
            let off = if buf == BufKind::Scratch { 0 } else { base };
            Span::new(buf, off, len)
        };
        match vrank(rank, rem) {
            None => {
                b.send(rank + 1, at(BufKind::Input));
                b.end_step();
                b.recv(rank + 1, at(BufKind::Output));
                b.end_step();
            }
            Some(v) => {
                let folds = rank < 2 * rem;
                let reductions = log + usize::from(folds);
                let mut cur = BufKind::Input;
                let mut left = reductions;
                let mut reduce = |b: &mut Builder, peer: usize, sending: bool| {
                    left -= 1;
                    let mut dst = if left.is_multiple_of(2) {
                        BufKind::Output
                    } else {
                        BufKind::Scratch
                    };
                    if sending && same(dst, cur) {
                        dst = if dst == BufKind::Output {
                            BufKind::Scratch
                        } else {
                            BufKind::Output
                        };
                    }
                    if sending {
                        b.send(peer, at(cur));
                    }
                    b.recv_reduce(peer, at(cur), at(dst));
                    b.end_step();
                    cur = dst;
                };
                if folds {
                    reduce(&mut b, rank - 1, false);
                }
                for k in 0..log {
                    reduce(&mut b, real(v ^ (1 << k), rem), true);
                }
                if !same(cur, BufKind::Output) {
                    b.copy(at(cur), at(BufKind::Output));
                    b.end_step();
                }
                if folds {
                    b.send(rank - 1, at(BufKind::Output));
                    b.end_step();
                }
            }
        }
        base += len;
    }
    b.finish(piece)
}
