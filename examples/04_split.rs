//! Split: `split(color, key)` makes sub-communicators from a parent, one per color; ranks are
//! ordered by key within each. Here six ranks form two groups of three (even and odd ranks,
//! as a two-dimensional data x model layout would), and each group sums on its own.
//!
//! Run it with `cargo run --example 04_split`. The six ranks are threads of this process
//! (`Communicator::local_group`); under `ferrorun -n 6` each rank would call
//! `Communicator::from_env()` instead and run the same per-rank code.

use ferroccl::{Communicator, Config, ReduceOp};

const NRANKS: usize = 6;

/// Returns (rank in the group, group size, group sum of parent ranks, members in group order).
fn rank_main(comm: &Communicator) -> ferroccl::Result<(usize, usize, u32, Vec<u32>)> {
    let parent = comm.rank();
    // Color: parity of the parent rank. Key: the parent rank, so group order follows it.
    // A rank that passes `None` as its color takes part in the split but joins no group.
    let sub = comm
        .split(Some((parent % 2) as u32), parent as i64)?
        .expect("every rank passed a color");

    let mut sum = [parent as u32];
    sub.all_reduce_in_place(&mut sum, ReduceOp::Sum)?;
    let mut members = vec![0u32; sub.nranks()];
    sub.all_gather(&[parent as u32], &mut members)?;
    let out = (sub.rank(), sub.nranks(), sum[0], members);
    sub.destroy()?;
    Ok(out)
}

fn main() -> ferroccl::Result<()> {
    let comms = Communicator::local_group(NRANKS, Config::default())?;
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = comms.iter().map(|c| s.spawn(|| rank_main(c))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (parent, r) in results.into_iter().enumerate() {
        let (rank, size, sum, members) = r?;
        let expected: Vec<u32> = (0..NRANKS as u32)
            .filter(|p| p % 2 == parent as u32 % 2)
            .collect();
        assert_eq!((rank, size), (parent / 2, NRANKS / 2));
        assert_eq!(sum, expected.iter().sum::<u32>());
        assert_eq!(members, expected);
        println!(
            "parent rank {parent}: rank {rank} of {size} in group {members:?}, group sum {sum}"
        );
    }
    println!("split of {NRANKS} ranks into even and odd groups: ranks, sizes and sums checked");
    Ok(())
}
