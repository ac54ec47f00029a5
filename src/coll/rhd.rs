//! Rabenseifner all_reduce for mid sizes: a reduce-scatter by recursive halving, then an
//! all_gather by recursive doubling, correct for any number of ranks.
//!
//! With `p` the largest power of two not above `nranks` and `rem = nranks - p`, ranks `2i`
//! (`i < rem`) first fold their input into rank `2i + 1` (as in [`super::rd`]); the `p`
//! remaining ranks, numbered `v = 0..p`, then run `log2 p` halving steps: in the step with
//! mask `m = 1, 2, 4, ...` rank `v` and its partner `v ^ m` split the range they both hold in
//! two, each sends the half it gives up and reduces the partner's copy of the half it keeps
//! (the lower half stays with the rank whose bit `m` is clear). The largest messages go to the
//! nearest partners, which are on the same host when ranks are numbered host by host. The
//! doubling steps replay the halving steps backwards, each rank sending the range it holds
//! and receiving its partner's, and the folded ranks get the result back last.
//!
//! Bytes moved per rank: `2 S (p - 1) / p` (+`2 S` for folded pairs) in `2 log2 p` steps (+2).
//! Every message is cut into pieces of at most the slice, sent in the same step.
//!
//! The algorithm numbers the ranks host by host (the ranks of host 0 in rank order, then host
//! 1, ...), whatever the placement, so that the nearest partners share a host.
#![forbid(unsafe_code)]

use super::builder::{part, Builder};
// Folding of the ranks beyond a power of two is recursive doubling's.
use super::rd::{real, vrank};
use super::{BufKind, Schedule, Span, Topology};

/// Element range `[start, end)` of the blocks `lo..hi` when `count` is cut into `p` blocks.
fn blocks(count: usize, p: usize, lo: usize, hi: usize) -> (usize, usize) {
    let start = part(count, p, lo).0;
    let (last, len) = part(count, p, hi - 1);
    (start, last + len)
}

/// Calls `f(offset, len)` for each piece of at most `slice` elements of `[start, end)`.
fn pieces(start: usize, end: usize, slice: usize, mut f: impl FnMut(usize, usize)) {
    let mut at = start;
    while at < end {
        let len = slice.min(end - at);
        f(at, len);
        at += len;
    }
}

/// One halving step as seen by one rank: the partner, the blocks kept and the blocks given.
#[derive(Debug, Clone, Copy)]
struct Halving {
    peer: usize,
    keep: (usize, usize),
    give: (usize, usize),
}

/// The halving steps of exchanging position `v` of `p` (a power of two), mask 1 first; the
/// partner is a position in the host-by-host order.
fn halvings(v: usize, p: usize, rem: usize) -> Vec<Halving> {
    let (mut lo, mut hi) = (0, p);
    let mut out = Vec::new();
    let mut mask = 1;
    while mask < p {
        let mid = lo + (hi - lo) / 2;
        let (keep, give) = if v & mask == 0 {
            ((lo, mid), (mid, hi))
        } else {
            ((mid, hi), (lo, mid))
        };
        out.push(Halving {
            peer: real(v ^ mask, rem),
            keep,
            give,
        });
        (lo, hi) = keep;
        mask <<= 1;
    }
    out
}

/// Rabenseifner all_reduce of `count` elements for `rank` of the ranks of `topo` (at least
/// 2). Needs no scratch: partial sums live in the output (in place, in the one buffer), and
/// the first reduction reads the input.
pub(crate) fn all_reduce(count: usize, rank: usize, topo: &Topology, slice: usize) -> Schedule {
    let order = host_order(topo);
    let me = order.iter().position(|&r| r == rank).unwrap_or(rank);
    schedule(count, me, &order, slice)
}

/// [`all_reduce`] for every rank, `[r]` for rank `r` (the host order is computed once).
pub(crate) fn all_reduce_all(count: usize, topo: &Topology, slice: usize) -> Vec<Schedule> {
    let order = host_order(topo);
    let mut pos = vec![0; order.len()];
    for (i, &r) in order.iter().enumerate() {
        pos[r] = i;
    }
    (0..order.len())
        .map(|r| schedule(count, pos[r], &order, slice))
        .collect()
}

/// The ranks host by host: position `i` of the order is rank `order[i]`.
fn host_order(topo: &Topology) -> Vec<usize> {
    topo.hosts().into_iter().flatten().collect()
}

/// The schedule of the rank at position `me` of `order`.
fn schedule(count: usize, me: usize, order: &[usize], slice: usize) -> Schedule {
    let rank = order[me];
    let n = order.len();
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let rem = n - p;
    let slice = slice.max(1);
    let mut b = Builder::new(rank, n);
    let input = |off, len| Span::new(BufKind::Input, off, len);
    let output = |off, len| Span::new(BufKind::Output, off, len);
    let Some(v) = vrank(me, rem) else {
        // Folded: hand the input to the odd neighbour, get the result back at the end.
        let peer = order[me + 1];
        pieces(0, count, slice, |o, l| b.send(peer, input(o, l)));
        b.end_step();
        pieces(0, count, slice, |o, l| b.recv(peer, output(o, l)));
        return b.finish(0);
    };
    let folds = me < 2 * rem;
    // Where this rank's running partial sums are: the input until the first reduction.
    let mut cur = BufKind::Input;
    if folds {
        let peer = order[me - 1];
        pieces(0, count, slice, |o, l| {
            b.recv_reduce(peer, input(o, l), output(o, l))
        });
        b.end_step();
        cur = BufKind::Output;
    }
    let steps = halvings(v, p, rem);
    for h in &steps {
        let peer = order[h.peer];
        let (gs, ge) = blocks(count, p, h.give.0, h.give.1);
        let (ks, ke) = blocks(count, p, h.keep.0, h.keep.1);
        pieces(gs, ge, slice, |o, l| b.send(peer, Span::new(cur, o, l)));
        pieces(ks, ke, slice, |o, l| {
            b.recv_reduce(peer, Span::new(cur, o, l), output(o, l))
        });
        b.end_step();
        // Blocks outside `keep` are never read again, so the output holds everything needed.
        cur = BufKind::Output;
    }
    for h in steps.iter().rev() {
        let peer = order[h.peer];
        let (ks, ke) = blocks(count, p, h.keep.0, h.keep.1);
        let (gs, ge) = blocks(count, p, h.give.0, h.give.1);
        pieces(ks, ke, slice, |o, l| b.send(peer, output(o, l)));
        pieces(gs, ge, slice, |o, l| b.recv(peer, output(o, l)));
        b.end_step();
    }
    if folds {
        pieces(0, count, slice, |o, l| b.send(order[me - 1], output(o, l)));
        b.end_step();
    }
    b.finish(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halvings_end_on_distinct_blocks() {
        for p in [2, 4, 8, 16, 64] {
            let mut owned: Vec<usize> = (0..p)
                .map(|v| {
                    let h = halvings(v, p, 0);
                    assert_eq!(h.len(), p.trailing_zeros() as usize);
                    let last = h.last().unwrap().keep;
                    assert_eq!(last.1 - last.0, 1);
                    last.0
                })
                .collect();
            owned.sort_unstable();
            assert_eq!(owned, (0..p).collect::<Vec<_>>());
        }
    }
}
