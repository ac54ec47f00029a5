//! Failure handling: a call the ranks disagree on, and an abort, come back as errors the
//! program can handle; nothing hangs.
//!
//! 1. Three ranks call allreduce, but rank 2 with a different count. Every rank gets an
//!    `ErrorKind::Remote` error naming the operation and the counts, and the communicator
//!    stays failed: later calls return the same error.
//! 2. On a fresh pair of ranks, rank 0 aborts while rank 1 waits in a barrier; rank 1's wait
//!    ends with an error instead of blocking until `FERRO_TIMEOUT`.
//!
//! Run it with `cargo run --example 05_failure_handling`. The ranks are threads of this
//! process (`Communicator::local_group`); under `ferrorun` each rank would call
//! `Communicator::from_env()` instead and handle its errors the same way.

use std::time::{Duration, Instant};

use ferroccl::{Communicator, Config, ErrorKind, ReduceOp};

fn main() -> ferroccl::Result<()> {
    // 1. A mismatched count.
    let comms = Communicator::local_group(3, Config::default())?;
    let errors: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (comms.iter())
            .map(|c| {
                s.spawn(move || {
                    let count = if c.rank() == 2 { 4096 } else { 1024 };
                    let first = c.all_reduce_in_place(&mut vec![1.0f32; count], ReduceOp::Sum);
                    let later = c.barrier();
                    (first.unwrap_err(), later.unwrap_err())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, (first, later)) in errors.iter().enumerate() {
        assert_eq!(first.kind(), ErrorKind::Remote);
        assert_eq!(later, first, "the communicator stays failed");
        println!("rank {rank}: {first}");
    }

    // 2. An abort while a peer waits.
    let comms = Communicator::local_group(2, Config::default())?;
    let (c0, c1) = (&comms[0], &comms[1]);
    let waited = std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let t = Instant::now();
            (c1.barrier(), t.elapsed())
        });
        std::thread::sleep(Duration::from_millis(100));
        c0.abort();
        waiter.join().unwrap()
    });
    let (result, elapsed) = waited;
    let e = result.expect_err("the barrier cannot complete once rank 0 aborted");
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    assert_eq!(c0.barrier().unwrap_err().kind(), ErrorKind::Aborted);
    println!(
        "rank 1 after rank 0 aborted, {} ms: {e}",
        elapsed.as_millis()
    );
    println!("mismatch and abort both ended as errors on every rank, without a hang");
    Ok(())
}
