//! Pairwise-exchange all_to_all.
#![forbid(unsafe_code)]

use super::builder::Builder;
use super::{BufKind, Schedule, Span};

/// Pairwise all_to_all of `count` elements per peer for `rank` of `nranks` (at least 2).
///
/// Exchange `k` (1 ..= nranks - 1) sends block `r + k` to rank `r + k` and receives block
/// `r - k` from rank `r - k`, in pieces of at most `slice` elements, one piece per step. The
/// own block is copied in the first step. In place, the input is first copied to scratch and
/// sent from there, since the receives overwrite blocks not yet sent.
pub(crate) fn all_to_all(
    count: usize,
    in_place: bool,
    rank: usize,
    nranks: usize,
    slice: usize,
) -> Schedule {
    let n = nranks;
    let slice = slice.max(1);
    let mut b = Builder::new(rank, n);
    let (from_buf, scratch) = if in_place {
        b.copy(
            Span::new(BufKind::Input, 0, count * n),
            Span::new(BufKind::Scratch, 0, count * n),
        );
        (BufKind::Scratch, count * n)
    } else {
        b.copy(
            Span::new(BufKind::Input, rank * count, count),
            Span::new(BufKind::Output, rank * count, count),
        );
        (BufKind::Input, 0)
    };
    for k in 1..n {
        let to = (rank + k) % n;
        let from = (rank + n - k) % n;
        let mut base = 0;
        while base < count {
            let len = slice.min(count - base);
            b.send(to, Span::new(from_buf, to * count + base, len));
            b.recv(from, Span::new(BufKind::Output, from * count + base, len));
            b.end_step();
            base += len;
        }
    }
    b.finish(scratch)
}
