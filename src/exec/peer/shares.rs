//! Where each rank's share of a collective between the buffers lies: the chunks of the
//! elements, the bytes each rank's buffers use, whether the buffers are apart, the reduce-copies
//! of a rank's share, and the buffers named by window words. Plain arithmetic on addresses,
//! the same on every rank for the same offer.

use std::ops::Range;

use ferroccl_transport::MemSpace;

use crate::coll::CollKind;
use crate::exec::windows::Windows;
use crate::reduce::Reducer;

/// A chunk starts at a multiple of this many bytes of its buffers, so that buffers aligned
/// alike keep the kernel on 16-byte vectors.
const CHUNK_ALIGN: usize = 64;

/// Every rank's buffers named by the offer's words through windows (`word(k, 0)` the input's,
/// `word(k, 1)` the output's; `lens[k]` the bytes each uses: a buffer it does not use is
/// not looked up): where they lie here, where in their owners' processes, every rank's memory
/// here and its process. `None` where some rank's word names no usable window or runs past
/// its buffer in it; every rank gets the same answer from the same list.
#[allow(clippy::type_complexity)]
pub(super) fn resolve_all(
    ws: &Windows,
    lens: &[(usize, usize)],
    word: impl Fn(usize, usize) -> u64,
) -> Option<(
    Vec<(usize, usize)>,
    Vec<(usize, usize)>,
    Vec<MemSpace>,
    Vec<u64>,
)> {
    let n = lens.len();
    let (mut here, mut own) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut spaces, mut processes) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for (k, &(il, ol)) in lens.iter().enumerate() {
        let look = |w: usize, len: usize| match len {
            0 => Some(None),
            _ => ws.resolve(k, word(k, w), len).map(Some),
        };
        let (i, o) = (look(0, il)?, look(1, ol)?);
        let (space, process) = match (i, o) {
            (Some(a), Some(b)) if a.2 != b.2 || a.3 != b.3 => return None,
            (Some(a), _) | (None, Some(a)) => (a.2, a.3),
            (None, None) => return None,
        };
        let at = |r: Option<(u64, u64, MemSpace, u64)>| {
            r.map_or((0, 0), |r| (r.0 as usize, r.1 as usize))
        };
        let (i, o) = (at(i), at(o));
        own.push((i.0, o.0));
        here.push((i.1, o.1));
        spaces.push(space);
        processes.push(process);
    }
    Some((here, own, spaces, processes))
}

/// Elements of `count` that rank `r` of `n` reduces: equal shares, each starting on a multiple
/// of [`CHUNK_ALIGN`] bytes of `es`-byte elements; the last ones may be short or empty.
pub(super) fn chunk(count: usize, n: usize, r: usize, es: usize) -> Range<usize> {
    let align = (CHUNK_ALIGN / es.max(1)).max(1);
    let per = count.div_ceil(n.max(1)).div_ceil(align) * align;
    let start = (r * per).min(count);
    start..(start + per).min(count)
}

/// Bytes of its input and of its output that rank `r` of `n` uses in collective `kind` of
/// `count` elements of `es` bytes (a broadcast reads only the root's input, a reduce writes
/// only the root's output).
pub(super) fn used(kind: CollKind, count: usize, n: usize, r: usize, es: usize) -> (usize, usize) {
    let (i, o) = kind.buffer_lens(count, n);
    match kind {
        CollKind::Broadcast { root } if root != r => (0, o * es),
        CollKind::Reduce { root } if root != r => (i * es, 0),
        _ => (i * es, o * es),
    }
}

/// Whether the ranks' buffers, `(input, output)` starts with the bytes each uses
/// (`lens[k]`), are apart: no rank's input or output overlaps another rank's of the same
/// address space (`spaces[k]`: ranks of two processes never overlap), and a rank's input
/// overlaps its output only in place (one buffer: `in_place[k]`).
pub(super) fn apart(
    bufs: &[(usize, usize)],
    lens: &[(usize, usize)],
    in_place: &[bool],
    spaces: &[u64],
) -> bool {
    let overlap = |a: usize, al: usize, b: usize, bl: usize| {
        al > 0 && bl > 0 && a < b.saturating_add(bl) && b < a.saturating_add(al)
    };
    let regions = |k: usize| [(bufs[k].0, lens[k].0), (bufs[k].1, lens[k].1)];
    (0..bufs.len()).all(|k| {
        let [(i, il), (o, ol)] = regions(k);
        (in_place[k] || !overlap(i, il, o, ol))
            && (k + 1..bufs.len()).all(|j| {
                spaces[j] != spaces[k]
                    || regions(k)
                        .iter()
                        .all(|&(a, al)| regions(j).iter().all(|&(b, bl)| !overlap(a, al, b, bl)))
            })
    })
}

/// One reduce-copy of a rank's share: sources and destinations, each the rank whose buffer
/// it is and an address, of `bytes` each.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Share {
    pub srcs: Vec<(usize, usize)>,
    pub dsts: Vec<(usize, usize)>,
    pub bytes: usize,
}

/// What rank `r` of `n` does in collective `kind` of `count` elements of `es` bytes, with
/// every rank's `(input, output)` starts in `bufs` (`any_in_place`: some rank is in place): a
/// collective of whole buffers (allreduce, broadcast, reduce) splits the elements into
/// [`chunk`]s, rank `r` reducing or copying chunk `r` of the sources (every input; the root's)
/// into the destinations (every output; the root's); all_gather copies rank `r`'s input into
/// block `r` of every output; reduce_scatter reduces block `r` of every input into rank `r`'s
/// output; all_to_all copies block `j` of rank `r`'s input into block `r` of rank `j`'s
/// output, one copy per rank. `None` where it does not run: an all_to_all with a rank in place
/// (a rank would overwrite a block its owner has yet to send). An empty share does nothing.
pub(super) fn share(
    kind: CollKind,
    count: usize,
    n: usize,
    r: usize,
    es: usize,
    bufs: &[(usize, usize)],
    any_in_place: bool,
) -> Option<Vec<Share>> {
    let input = |k: usize, off: usize| (k, bufs[k].0 + off);
    let output = |k: usize, off: usize| (k, bufs[k].1 + off);
    let ins = |off: usize| (0..n).map(|k| input(k, off)).collect::<Vec<_>>();
    let outs = |off: usize| (0..n).map(|k| output(k, off)).collect::<Vec<_>>();
    let c = chunk(count, n, r, es);
    let (off, bytes) = (c.start * es, c.len() * es);
    let (srcs, dsts, bytes) = match kind {
        CollKind::AllReduce => (ins(off), outs(off), bytes),
        CollKind::Broadcast { root } => (vec![input(root, off)], outs(off), bytes),
        CollKind::Reduce { root } => (ins(off), vec![output(root, off)], bytes),
        CollKind::AllGather => (vec![input(r, 0)], outs(r * count * es), count * es),
        CollKind::ReduceScatter => (ins(r * count * es), vec![output(r, 0)], count * es),
        CollKind::AllToAll if any_in_place => return None,
        CollKind::AllToAll => {
            let block = count * es;
            let copy = |j: usize| Share {
                srcs: vec![input(r, j * block)],
                dsts: vec![output(j, r * block)],
                bytes: block,
            };
            return Some((0..n).map(copy).collect());
        }
    };
    Some(vec![Share { srcs, dsts, bytes }])
}

/// Whether a reduce-copy on each of `spaces` may reach every other of them.
pub(super) fn reach_all(reducer: &dyn Reducer, spaces: &[MemSpace]) -> bool {
    spaces
        .iter()
        .all(|&a| spaces.iter().all(|&b| reducer.reaches(a, b)))
}

#[cfg(test)]
mod tests {
    use super::super::PEER_MAX_RANKS;
    use super::*;

    #[test]
    fn chunks_cover_every_element_once_and_start_aligned() {
        for es in [1usize, 2, 4, 8] {
            for n in 2..=PEER_MAX_RANKS {
                for count in [0usize, 1, 7, 63, 64, 65, 257, 1031, 4099, 1 << 16] {
                    let mut next = 0;
                    for r in 0..n {
                        let c = chunk(count, n, r, es);
                        assert_eq!(c.start, next.min(count), "{count} {n} {r} {es}");
                        if !c.is_empty() && c.end < count {
                            assert_eq!((c.start * es) % CHUNK_ALIGN, 0);
                        }
                        next = c.end;
                    }
                    assert_eq!(next, count, "{count} elements of {es} bytes over {n} ranks");
                }
            }
        }
        // Equal shares where the count allows: 2 ranks of 1 MiB of f32.
        assert_eq!(chunk(1 << 18, 2, 1, 4), (1 << 17)..(1 << 18));
    }

    #[test]
    fn buffers_apart_or_not() {
        let ap = |b: &[(usize, usize)], l: &[(usize, usize)], p: &[bool]| {
            apart(b, l, p, &[0; 8][..b.len()])
        };
        let b = 1024;
        let lens = [(b, b); 3];
        // Out of place, all apart.
        assert!(ap(&[(0, 4096), (8192, 12288)], &lens[..2], &[false; 2]));
        // In place: a rank's input is its output.
        assert!(ap(&[(0, 0), (4096, 4096)], &lens[..2], &[true; 2]));
        // ... but out of place that is an overlap.
        assert!(!ap(&[(0, 0), (4096, 4096)], &lens[..2], &[false, true]));
        // Two ranks on one buffer.
        assert!(!ap(&[(0, 0), (0, 0)], &lens[..2], &[true; 2]));
        // ... unless they are of two processes, each its own address space.
        assert!(apart(&[(0, 0), (0, 0)], &lens[..2], &[true; 2], &[1, 2]));
        assert!(!apart(
            &[(0, 0), (8192, 8192), (0, 0)],
            &lens,
            &[true; 3],
            &[1, 2, 1]
        ));
        // A rank's output overlaps another's input by one byte.
        assert!(!ap(
            &[(0, 4096), (4096 + b - 1, 8192)],
            &lens[..2],
            &[false; 2]
        ));
        // Touching is not overlapping.
        assert!(ap(
            &[(0, b), (2 * b, 3 * b), (4 * b, 5 * b)],
            &lens,
            &[false; 3]
        ));
        // What a rank does not use may be anywhere: a broadcast's non-roots read nothing.
        let bcast: Vec<(usize, usize)> = (0..3)
            .map(|r| used(CollKind::Broadcast { root: 1 }, 256, 3, r, 4))
            .collect();
        assert_eq!(bcast, vec![(0, b), (b, b), (0, b)]);
        assert!(ap(
            &[(4 * b, 0), (b, 2 * b), (4 * b, 4 * b)],
            &bcast,
            &[false; 3]
        ));
        assert!(!ap(
            &[(4 * b, 0), (0, 2 * b), (4 * b, 4 * b)],
            &bcast,
            &[false; 3]
        ));
    }

    #[test]
    fn shares_read_and_write_what_each_collective_asks() {
        let bufs = [(0x1000, 0x9000), (0x2000, 0xa000)];
        let (count, es) = (64, 4);
        let both = |off: usize| vec![(0, 0x1000 + off), (1, 0x2000 + off)];
        let outs = |off: usize| vec![(0, 0x9000 + off), (1, 0xa000 + off)];
        let s = |kind, r| {
            let mut v = share(kind, count, 2, r, es, &bufs, false).unwrap();
            assert_eq!(v.len(), 1);
            v.remove(0)
        };
        // Whole buffers: rank 1's chunk is the second half (32 elements, 128 bytes).
        assert_eq!(
            s(CollKind::AllReduce, 1),
            Share {
                srcs: both(128),
                dsts: outs(128),
                bytes: 128
            }
        );
        assert_eq!(
            s(CollKind::Broadcast { root: 1 }, 0),
            Share {
                srcs: vec![(1, 0x2000)],
                dsts: outs(0),
                bytes: 128
            }
        );
        assert_eq!(
            s(CollKind::Reduce { root: 0 }, 1),
            Share {
                srcs: both(128),
                dsts: vec![(0, 0x9000 + 128)],
                bytes: 128
            }
        );
        // Blocks: rank 1's block of every output, of every input.
        assert_eq!(
            s(CollKind::AllGather, 1),
            Share {
                srcs: vec![(1, 0x2000)],
                dsts: outs(256),
                bytes: 256
            }
        );
        assert_eq!(
            s(CollKind::ReduceScatter, 1),
            Share {
                srcs: both(256),
                dsts: vec![(1, 0xa000)],
                bytes: 256
            }
        );
        // all_to_all: block j of rank 1's input into block 1 of rank j's output, 256 bytes
        // each; not with a rank in place.
        assert_eq!(
            share(CollKind::AllToAll, count, 2, 1, es, &bufs, false).unwrap(),
            vec![
                Share {
                    srcs: vec![(1, 0x2000)],
                    dsts: vec![(0, 0x9000 + 256)],
                    bytes: 256
                },
                Share {
                    srcs: vec![(1, 0x2000 + 256)],
                    dsts: vec![(1, 0xa000 + 256)],
                    bytes: 256
                },
            ]
        );
        assert!(share(CollKind::AllToAll, count, 2, 0, es, &bufs, true).is_none());
    }

    #[test]
    fn every_device_must_reach_every_other() {
        let host = crate::reduce::HostReducer;
        let cuda = MemSpace::Cuda;
        assert!(reach_all(&host, &[cuda(0), cuda(0), cuda(0)]));
        assert!(!reach_all(&host, &[cuda(0), cuda(1)]));
        assert!(!reach_all(&host, &[cuda(2), cuda(2), cuda(1)]));
    }
}
