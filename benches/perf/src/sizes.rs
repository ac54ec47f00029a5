//! The size sweep, as nccl-tests computes it.
//!
//! Sizes run from `-b` to `-e` inclusive, multiplying by `-f` when it is above 1 and adding
//! `-i` otherwise. Each size becomes `count = size / element size` elements, and the
//! collective's [`Coll::layout`] rounds per-rank blocks down (see there); the table then
//! shows `max(send, recv)` bytes and the collective's `count` argument.

use crate::args::Args;
use crate::coll::{Coll, Layout};

/// The byte sizes of the sweep, smallest first.
pub fn sweep(
    min_bytes: usize,
    max_bytes: usize,
    step_bytes: usize,
    step_factor: usize,
) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut size = min_bytes;
    while size <= max_bytes {
        sizes.push(size);
        let next = if step_factor > 1 {
            size.saturating_mul(step_factor)
        } else {
            size.saturating_add(step_bytes)
        };
        if next <= size {
            break;
        }
        size = next;
    }
    sizes
}

/// The sweep `args` asks for.
pub fn sweep_args(args: &Args) -> Vec<usize> {
    sweep(
        args.min_bytes,
        args.max_bytes,
        args.step_bytes,
        args.step_factor,
    )
}

/// One row of the sweep: the requested size and what the collective does with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizePoint {
    /// The size from the sweep, in bytes.
    pub requested: usize,
    /// Buffer lengths in elements.
    pub layout: Layout,
    /// The size column: `max(send, recv)` bytes.
    pub bytes: usize,
    /// The count column: the collective's `count` argument.
    pub count: usize,
}

/// The layout of every size of the sweep for `coll` with `elem_size`-byte elements.
pub fn points(coll: Coll, sizes: &[usize], elem_size: usize, nranks: usize) -> Vec<SizePoint> {
    sizes
        .iter()
        .map(|&requested| {
            let layout = coll.layout(requested / elem_size, elem_size, nranks);
            SizePoint {
                requested,
                layout,
                bytes: layout.reported_bytes(elem_size),
                count: layout.param_count,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factor_sweep() {
        let s = sweep(8, 128 << 20, 1 << 20, 2);
        assert_eq!(s.len(), 25);
        assert_eq!(s[0], 8);
        assert_eq!(s[1], 16);
        assert_eq!(*s.last().unwrap(), 128 << 20);
        // A maximum between two steps is not reached.
        assert_eq!(sweep(8, 100, 1, 2), vec![8, 16, 32, 64]);
    }

    #[test]
    fn step_sweep_and_defaults() {
        assert_eq!(sweep(32 << 20, 32 << 20, 1 << 20, 1), vec![32 << 20]);
        assert_eq!(sweep(1000, 4000, 1000, 1), vec![1000, 2000, 3000, 4000]);
        assert_eq!(sweep(1000, 4500, 1000, 0), vec![1000, 2000, 3000, 4000]);
        assert_eq!(sweep_args(&Args::default()), vec![32 << 20]);
        // Steps that cannot grow stop instead of looping.
        assert_eq!(sweep(0, 10, 1, 2), vec![0]);
        assert_eq!(sweep(5, 10, 0, 1), vec![5]);
        assert_eq!(
            sweep(usize::MAX - 1, usize::MAX, 4, 1),
            vec![usize::MAX - 1, usize::MAX]
        );
    }

    #[test]
    fn rows_of_all_reduce_and_all_gather() {
        let sizes = sweep(8, 1024, 0, 2);
        let ar = points(Coll::AllReduce, &sizes, 4, 8);
        assert_eq!(
            ar.iter().map(|p| (p.bytes, p.count)).collect::<Vec<_>>(),
            [
                (8, 2),
                (16, 4),
                (32, 8),
                (64, 16),
                (128, 32),
                (256, 64),
                (512, 128),
                (1024, 256)
            ]
        );
        // all_gather on 8 ranks with floats: blocks of 4 floats (16 bytes) at least, so the
        // first sizes are empty, then 128 bytes = 8 blocks of 4 floats.
        let ag = points(Coll::AllGather, &sizes, 4, 8);
        assert_eq!(
            ag.iter().map(|p| (p.bytes, p.count)).collect::<Vec<_>>(),
            [
                (0, 0),
                (0, 0),
                (0, 0),
                (0, 0),
                (128, 4),
                (256, 8),
                (512, 16),
                (1024, 32)
            ]
        );
        // 3 ranks: 1024 bytes = 256 floats -> 85 per rank -> 84 (multiple of 4) -> 1008 bytes.
        let ag3 = points(Coll::AllGather, &[1024], 4, 3);
        assert_eq!((ag3[0].bytes, ag3[0].count), (1008, 84));
        // Sizes that are not a multiple of the element size round down.
        let odd = points(Coll::AllReduce, &[10], 8, 2);
        assert_eq!((odd[0].bytes, odd[0].count), (8, 1));
        // alltoall with doubles, 4 ranks, 1000 bytes: 125 doubles -> 31 per peer -> 30.
        let a2a = points(Coll::AllToAll, &[1000], 8, 4);
        assert_eq!((a2a[0].bytes, a2a[0].count), (960, 30));
    }
}
