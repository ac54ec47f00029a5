//! Asynchronous calls: `all_reduce_async` queues an allreduce on the communicator's progress
//! thread and returns a `Work` at once; the caller computes meanwhile and waits for the
//! result later, as data-parallel training overlaps gradient buckets with backward.
//!
//! Run it with `cargo run --example 03_async_overlap`. The two ranks are threads of this
//! process (`Communicator::local_group`); under `ferrorun -n 2` each rank would call
//! `Communicator::from_env()` instead and run the same per-rank code.

use ferroccl::{Communicator, Config, ReduceOp};

const NRANKS: usize = 2;
const BUCKETS: usize = 4;
const COUNT: usize = 1 << 18;

fn rank_main(comm: &Communicator) -> ferroccl::Result<usize> {
    let r = comm.rank() as f32;
    // Start one allreduce per bucket; each Work owns its buffer until it is waited for.
    // Calls run in the order they were issued, so every rank issues them in the same order.
    let mut pending = Vec::new();
    for b in 0..BUCKETS {
        let bucket = vec![r + b as f32; COUNT];
        pending.push(comm.all_reduce_async(bucket, ReduceOp::Sum)?);
    }

    // Work done while the buckets are in flight.
    let local: f64 = (0..1_000_000).map(|i| (i as f64).sqrt()).sum();
    assert!(local > 0.0);

    // `test` never blocks; `wait` returns the buffer with the result.
    let finished_early = pending
        .iter_mut()
        .map(|w| w.test())
        .filter(|&done| done)
        .count();
    for (b, work) in pending.into_iter().enumerate() {
        let bucket = work.wait()?;
        // Sum over ranks of (r + b): 0 + 1 + 2 b.
        assert!(bucket.iter().all(|&x| x == 1.0 + 2.0 * b as f32));
    }
    Ok(finished_early)
}

fn main() -> ferroccl::Result<()> {
    let comms = Communicator::local_group(NRANKS, Config::default())?;
    let results: Vec<ferroccl::Result<usize>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms.iter().map(|c| s.spawn(|| rank_main(c))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, r) in results.into_iter().enumerate() {
        let early = r?;
        println!("rank {rank}: {BUCKETS} async allreduces of {COUNT} f32 correct ({early} done before the local work ended)");
    }
    Ok(())
}
