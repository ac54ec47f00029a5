//! `latency_parts`: one small f32 sum allreduce, broken into its parts.
//!
//! Runs `-w` warm-up and `-n` timed back-to-back allreduces of `-b` bytes (default 8) on every
//! rank and prints, per rank, the mean time per call and, when ferroccl was built with its
//! `profile` feature, the mean nanoseconds per call in each phase (enter, plan, drive, send,
//! recv, reduce, wait, leave; see `ferroccl::profile`).
//!
//! ```text
//! cargo build --release -p ferroccl-perf --features profile --bin latency_parts
//! ferrorun -n 2 -- target/release/latency_parts -n 20000 -w 2000
//! FERRO_TRANSPORTS=tcp ferrorun -n 2 -- target/release/latency_parts
//! ```
//!
//! Without a launcher environment it runs 2 ranks as threads of one process.

use std::time::Instant;

use ferroccl::profile::{self, Phase, Profile};
use ferroccl::{bootstrap, Communicator, Config, ReduceOp, Result};

fn main() {
    if let Err(e) = run() {
        eprintln!("latency_parts: {e}");
        std::process::exit(1);
    }
}

/// Reads `-n`, `-w`, `-b` (and their long forms) from the command line.
fn args() -> std::result::Result<(usize, usize, usize), String> {
    let (mut iters, mut warmup, mut bytes) = (10_000, 1_000, 8);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let slot = match a.as_str() {
            "-n" | "--iters" => &mut iters,
            "-w" | "--warmup_iters" => &mut warmup,
            "-b" | "--bytes" => &mut bytes,
            _ => {
                return Err(format!(
                    "unknown argument {a:?} (use -n ITERS -w WARMUP -b BYTES)"
                ))
            }
        };
        let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        *slot = v
            .parse()
            .map_err(|_| format!("{a}: {v:?} is not a number"))?;
    }
    if bytes == 0 || bytes % 4 != 0 {
        return Err(format!(
            "-b {bytes}: need a positive multiple of 4 (f32 elements)"
        ));
    }
    Ok((iters.max(1), warmup, bytes))
}

fn run() -> Result<()> {
    let (iters, warmup, bytes) = args().map_err(ferroccl::Error::internal)?;
    let config = Config::from_env()?;
    let comms = match bootstrap::env::detect()? {
        Some(env) => Communicator::from_launch_env_threads(&env, config, 1)?,
        None => Communicator::local_group(2, config)?,
    };
    let results: Vec<Result<String>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| s.spawn(move || one_rank(&c, iters, warmup, bytes)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank panicked"))
            .collect()
    });
    for r in results {
        println!("{}", r?);
    }
    Ok(())
}

/// Runs the calls on one rank and formats its line.
fn one_rank(c: &Communicator, iters: usize, warmup: usize, bytes: usize) -> Result<String> {
    let n = bytes / 4;
    let send: Vec<f32> = (0..n).map(|i| (c.rank() * n + i) as f32).collect();
    let mut recv = vec![0f32; n];
    for _ in 0..warmup {
        c.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
    }
    c.barrier()?;
    let _ = profile::take();
    let start = Instant::now();
    for _ in 0..iters {
        c.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
    }
    let total = start.elapsed();
    let p: Profile = profile::take();
    let nranks = c.nranks();
    let want: Vec<f32> = (0..n)
        .map(|i| (0..nranks).map(|r| (r * n + i) as f32).sum())
        .collect();
    if recv != want {
        return Err(ferroccl::Error::internal(format!(
            "latency_parts: rank {}: wrong result {recv:?}, expected {want:?}",
            c.rank()
        )));
    }
    let mut line = format!(
        "rank {} of {nranks}: {bytes} B allreduce, {iters} calls: {:.3} us/call",
        c.rank(),
        total.as_secs_f64() * 1e6 / iters as f64
    );
    if Profile::ENABLED {
        line.push_str(" | ns/call:");
        for ph in Phase::ALL {
            line.push_str(&format!(" {} {:.0}", ph.name(), p.mean_ns(ph)));
        }
        let sum: u64 = p.ns.iter().sum();
        line.push_str(&format!(
            " | sum {:.0} ({} calls counted)",
            sum as f64 / p.calls.max(1) as f64,
            p.calls
        ));
    } else {
        line.push_str(" (build with --features profile for the parts)");
    }
    Ok(line)
}
