//! Shrink after a failure: a training-style loop of gradient allreduces on 4 ranks, where
//! rank 2 dies at step 3. The other ranks see the failure as an error, build a 3-rank
//! communicator without it (`Communicator::shrink`, no new rendezvous through a launcher)
//! and finish their steps on it, averaging over the ranks that are left.
//!
//! Run it with `cargo run --example 06_shrink`. The ranks are threads of this process
//! (`Communicator::local_group`), and "dying" is an abort followed by the thread's exit; the
//! same loop runs unchanged in processes under a launcher, where a rank is killed for real
//! (see `tests/shrink.rs`, which kills one with SIGKILL).

use ferroccl::{Communicator, Config, ReduceOp};

const STEPS: usize = 6;
const DIES: usize = 2;
const AT_STEP: usize = 3;

fn train(comm: Communicator) -> ferroccl::Result<Option<Vec<f32>>> {
    let me = comm.rank();
    let mut comm = comm;
    let mut weights = vec![0.0f32; 1000];
    for step in 0..STEPS {
        if me == DIES && step == AT_STEP {
            println!("rank {me}: dying at step {step}");
            comm.abort();
            return Ok(None);
        }
        // This rank's gradient: the same on every step so the result is easy to check.
        let grad: Vec<f32> = (0..weights.len())
            .map(|i| (me + 1) as f32 + i as f32)
            .collect();
        let mut avg = vec![0.0f32; grad.len()];
        if let Err(e) = comm.all_reduce(&grad, &mut avg, ReduceOp::Avg) {
            println!("rank {me}: step {step} failed: {e}");
            let smaller = comm.shrink(&[DIES])?;
            println!(
                "rank {me}: continuing as rank {} of {}",
                smaller.rank(),
                smaller.nranks()
            );
            comm = smaller;
            // Redo the step on the survivors.
            comm.all_reduce(&grad, &mut avg, ReduceOp::Avg)?;
        }
        for (w, g) in weights.iter_mut().zip(&avg) {
            *w -= 0.1 * g;
        }
    }
    Ok(Some(weights))
}

fn main() -> ferroccl::Result<()> {
    let comms = Communicator::local_group(4, Config::default())?;
    let results: Vec<ferroccl::Result<Option<Vec<f32>>>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| s.spawn(move || train(c)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Steps before the death average ranks 1..=4 (mean 2.5), after it ranks 1, 2 and 4
    // (mean 7/3), each plus the element index.
    let before = 2.5f32;
    let after = 7.0f32 / 3.0;
    let mut survivors = 0;
    for (rank, r) in results.into_iter().enumerate() {
        let Some(w) = r? else { continue };
        survivors += 1;
        for (i, v) in w.iter().enumerate() {
            let want = -0.1
                * ((before + i as f32) * AT_STEP as f32
                    + (after + i as f32) * (STEPS - AT_STEP) as f32);
            assert!(
                (v - want).abs() <= 1e-3 * want.abs().max(1.0),
                "rank {rank}, weight {i}: {v} vs {want}"
            );
        }
    }
    assert_eq!(survivors, 3);
    println!("3 survivors finished {STEPS} steps; their weights agree with the expected values");
    Ok(())
}
