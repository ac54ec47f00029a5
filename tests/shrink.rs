//! Shrinking after a failure, across processes: one rank of 4 or 8 is killed (SIGKILL) in the
//! middle of a loop of allreduces, or hangs until the deadline declares it dead; the survivors
//! see the failure, call `Communicator::shrink` with the lost rank and check collectives of
//! several counts and types on the smaller communicator, over shared memory, over TCP, and
//! across network-namespace hosts (skipped, with the reason, where namespaces cannot be built).
//!
//! The test binary runs itself as the ranks (see `common::child`), started by hand with the
//! `FERRO_*` environment (a launcher would stop the job at the first death).

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use common::child::{self, field, free_port, now_ms, self_command, serial, Finished, Running};
use common::netns::{netns_available, NetnsHosts};
use ferroccl::{Communicator, ReduceOp};

/// Checks allreduces of several counts and two types on `comm`, with a distinct value in
/// every element of every rank; `tag` is added to the values so rounds differ.
fn check_allreduces(comm: &Communicator, tag: u64) {
    let (r, n) = (comm.rank() as u64, comm.nranks() as u64);
    for count in [0usize, 1, 2, 1009, 70_001] {
        let send: Vec<i64> = (0..count as u64)
            .map(|i| (tag * 1_000_000 + r * 100_000 + i) as i64)
            .collect();
        let mut recv = vec![0i64; count];
        comm.all_reduce(&send, &mut recv, ReduceOp::Sum)
            .unwrap_or_else(|e| panic!("rank {r}, count {count}: {e}"));
        for (i, v) in recv.iter().enumerate() {
            let want = n * (tag * 1_000_000 + i as u64) + 100_000 * n * (n - 1) / 2;
            assert_eq!(
                *v, want as i64,
                "rank {r} of {n}, count {count}, element {i}"
            );
        }
        let send: Vec<f32> = (0..count)
            .map(|i| (r as usize * 7 + i % 101) as f32)
            .collect();
        let mut recv = vec![0f32; count];
        comm.all_reduce(&send, &mut recv, ReduceOp::Max)
            .unwrap_or_else(|e| panic!("rank {r}, f32 count {count}: {e}"));
        for (i, v) in recv.iter().enumerate() {
            assert_eq!(
                *v,
                ((n as usize - 1) * 7 + i % 101) as f32,
                "rank {r}, element {i}"
            );
        }
    }
}

/// A training-style loop: the victim dies (or hangs) at step 3; the survivors shrink and
/// finish their steps on the smaller communicator.
#[test]
fn child_shrink() {
    if !child::is_role("shrink") {
        return;
    }
    let comm = Communicator::from_env().expect("from_env");
    let victim: usize = child::env_var("SHRINK_VICTIM");
    let hang: bool = child::env_var::<u8>("SHRINK_HANG") == 1;
    let r = comm.rank();
    let mut current = comm;
    let mut shrunk = false;
    for step in 0..6u64 {
        if step == 3 && r == victim && !shrunk {
            println!("LEAVING rank={r} at_ms={}", now_ms());
            let _ = std::io::stdout().flush();
            if hang {
                // Alive but silent: the others' deadline declares it dead.
                std::thread::sleep(Duration::from_secs(25));
                std::process::exit(0);
            }
            // SAFETY: kill(2) on this process; no memory is involved. It does not return.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            unreachable!("SIGKILL did not end the process");
        }
        let mut grad = vec![(r + 1) as f32; 4096];
        let g = grad.clone();
        match current.all_reduce(&g, &mut grad, ReduceOp::Sum) {
            Ok(()) => {
                let n = current.nranks();
                let want: f32 = if shrunk {
                    (1..=n + 1).filter(|&k| k != victim + 1).sum::<usize>() as f32
                } else {
                    (n * (n + 1) / 2) as f32
                };
                assert_eq!(grad[0], want, "rank {r}, step {step}");
                check_allreduces(&current, step);
            }
            Err(e) => {
                assert!(
                    !shrunk,
                    "rank {r}: the shrunk communicator failed at step {step}: {e}"
                );
                println!("FAILED rank={r} step={step} at_ms={} error={e}", now_ms());
                let small = current
                    .shrink(&[victim])
                    .unwrap_or_else(|e| panic!("rank {r}: shrink: {e}"));
                let want_rank = if r > victim { r - 1 } else { r };
                assert_eq!(small.rank(), want_rank, "rank {r}");
                assert_eq!(small.nranks(), current.nranks() - 1);
                println!(
                    "SHRUNK rank={r} new_rank={} nranks={} at_ms={}",
                    small.rank(),
                    small.nranks(),
                    now_ms()
                );
                current = small;
                shrunk = true;
                // The failed step again, on the survivors.
                check_allreduces(&current, step + 100);
            }
        }
    }
    assert!(shrunk, "rank {r}: never saw the victim fail");
    println!("DONE rank={r}");
}

const TIMEOUT_S: u32 = 20;

fn shrink_job(nranks: usize, victim: usize, transport: &str, hang: bool) {
    shrink_job_on(None, nranks, victim, transport, hang);
}

/// [`shrink_job`], rank `r` on host `r % hosts` when `hosts` is given (the store on host 0).
fn shrink_job_on(
    hosts: Option<&NetnsHosts>,
    nranks: usize,
    victim: usize,
    transport: &str,
    hang: bool,
) {
    let _serial = serial();
    let ip = hosts.map_or([127, 0, 0, 1], |h| h.addr(0).octets());
    let store = SocketAddr::from((ip, free_port()));
    let job = format!("shrink-{}-{}", std::process::id(), now_ms());
    let timeout = if hang { 4 } else { TIMEOUT_S };
    let ranks: Vec<Running> = (0..nranks)
        .map(|r| {
            let mut env = child::rank_env(r, nranks, store, timeout);
            env.push(("FERRO_JOB_ID", job.clone()));
            env.push(("FERRO_TRANSPORTS", transport.to_string()));
            env.push(("SHRINK_VICTIM", victim.to_string()));
            env.push(("SHRINK_HANG", u8::from(hang).to_string()));
            let cmd = self_command("child_shrink", "shrink", &env);
            match hosts {
                None => Running::spawn(cmd),
                Some(h) => {
                    // The same command, inside host r % n's network namespace.
                    let mut wrapped = std::process::Command::new("ip");
                    wrapped
                        .args(["netns", "exec", &h.name(r % h.len())])
                        .arg(cmd.get_program())
                        .args(cmd.get_args());
                    for (k, v) in cmd.get_envs() {
                        if let Some(v) = v {
                            wrapped.env(k, v);
                        }
                    }
                    Running::spawn(wrapped)
                }
            }
        })
        .collect();
    let outs: Vec<Finished> = ranks
        .into_iter()
        .map(|p| p.finish(Duration::from_secs(150)))
        .collect();
    let all = || common::child::dump_all("rank", &outs);
    assert_eq!(outs[victim].tagged("LEAVING ").len(), 1, "{}", all());
    for (r, out) in outs.iter().enumerate().filter(|(r, _)| *r != victim) {
        assert!(out.success(), "survivor {r}: {}", all());
        let shrunk = out.tagged("SHRUNK ");
        assert_eq!(shrunk.len(), 1, "survivor {r}: {}", all());
        assert_eq!(field::<usize>(&shrunk[0], "nranks"), nranks - 1);
        assert_eq!(out.tagged("DONE ").len(), 1, "survivor {r}: {}", all());
        let failed = out.tagged("FAILED ");
        println!("survivor {r}: {} / {}", failed[0], shrunk[0]);
    }
}

#[test]
fn four_ranks_shrink_after_a_kill_over_shared_memory() {
    shrink_job(4, 2, "shm", false);
}

#[test]
fn four_ranks_shrink_after_a_kill_over_tcp() {
    shrink_job(4, 1, "tcp", false);
}

#[test]
fn eight_ranks_shrink_after_a_kill_over_shared_memory() {
    shrink_job(8, 5, "shm", false);
}

#[test]
fn eight_ranks_shrink_after_a_kill_over_tcp() {
    shrink_job(8, 7, "tcp", false);
}

#[test]
fn four_ranks_on_two_netns_hosts_shrink_after_a_kill() {
    if let Err(why) = netns_available() {
        println!("skipped: four_ranks_on_two_netns_hosts_shrink_after_a_kill: {why}");
        return;
    }
    let hosts = NetnsHosts::up(2).expect("build namespace hosts");
    // Ranks 0 and 2 on host 0 (shared memory between them), 1 and 3 on host 1; rank 3 dies.
    shrink_job_on(Some(&hosts), 4, 3, "shm,tcp", false);
}

#[test]
fn four_ranks_shrink_after_a_rank_is_declared_dead_by_the_deadline() {
    shrink_job(4, 3, "tcp", true);
}
