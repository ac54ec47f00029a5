//! Broadcast: the root's buffer is copied to every rank, as when rank 0's initial weights are
//! shared before training.
//!
//! Run it with `cargo run --example 02_broadcast`. The three ranks are threads of this process
//! (`Communicator::local_group`); under `ferrorun -n 3` each rank would call
//! `Communicator::from_env()` instead and run the same per-rank code.

use ferroccl::{Communicator, Config};

const NRANKS: usize = 3;

fn rank_main(comm: &Communicator) -> ferroccl::Result<()> {
    let rank = comm.rank();

    // In place: only rank 0's contents matter; the others are overwritten.
    let mut weights = if rank == 0 {
        (0..100_000).map(|i| i as f32 * 0.5).collect()
    } else {
        vec![f32::NAN; 100_000]
    };
    comm.broadcast(&mut weights, 0)?;
    assert!(weights
        .iter()
        .enumerate()
        .all(|(i, &w)| w == i as f32 * 0.5));

    // Out of place, from the last rank: every rank passes a send buffer of the same length
    // (only the root's is read) and receives into its own buffer.
    let root = NRANKS - 1;
    let send = vec![rank as u32 + 100; 16];
    let mut recv = vec![0u32; 16];
    comm.broadcast_from(&send, &mut recv, root)?;
    assert!(recv.iter().all(|&x| x == root as u32 + 100));
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
    println!("broadcast on {NRANKS} ranks: 100000 f32 from rank 0 in place, 16 u32 from rank {} out of place: every rank holds the root's data", NRANKS - 1);
    Ok(())
}
