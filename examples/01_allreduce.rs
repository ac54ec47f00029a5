//! Allreduce: every rank contributes a vector and every rank ends with the element-wise sum
//! (and, with `ReduceOp::Avg`, the mean).
//!
//! Run it with `cargo run --example 01_allreduce`. The four ranks are threads of this process
//! (`Communicator::local_group`); started as processes under `ferrorun -n 4`, each rank would
//! call `Communicator::from_env()` instead and run the same per-rank code.

use ferroccl::{Communicator, Config, ReduceOp};

const NRANKS: usize = 4;
const COUNT: usize = 1 << 16;

fn rank_main(comm: &Communicator) -> ferroccl::Result<()> {
    let r = comm.rank() as f32;

    // Rank r holds r + i at index i; the sum over ranks is 6 + 4 i for four ranks.
    let mut buf: Vec<f32> = (0..COUNT).map(|i| r + i as f32).collect();
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
    let n = NRANKS as f32;
    let rank_sum = n * (n - 1.0) / 2.0;
    assert!(buf
        .iter()
        .enumerate()
        .all(|(i, &x)| x == rank_sum + n * i as f32));

    // Out of place, with the mean: the input stays as it was.
    let grads = vec![r * 2.0; COUNT];
    let mut mean = vec![0f32; COUNT];
    comm.all_reduce(&grads, &mut mean, ReduceOp::Avg)?;
    assert!(mean.iter().all(|&x| x == n - 1.0));
    assert!(grads.iter().all(|&x| x == r * 2.0));

    // Integers and other operations work the same way.
    let mut top = [comm.rank() as u64 * 7];
    comm.all_reduce_in_place(&mut top, ReduceOp::Max)?;
    assert_eq!(top[0], (NRANKS as u64 - 1) * 7);
    Ok(())
}

fn main() -> ferroccl::Result<()> {
    let comms = Communicator::local_group(NRANKS, Config::default())?;
    let results: Vec<ferroccl::Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms.iter().map(|c| s.spawn(|| rank_main(c))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in results {
        r?;
    }
    println!("allreduce on {NRANKS} ranks: sum of {COUNT} f32 in place, mean out of place, max of u64: all ranks agree");
    Ok(())
}
