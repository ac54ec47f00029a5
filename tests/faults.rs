//! The fault matrix: two jobs on one rendezvous address, two processes claiming one rank, a
//! stopped rank 0, a dead rank 0 over TCP, a rank 0 whose test host is cut off (network
//! namespaces; needs root, skipped with a message otherwise), and ranks that disagree on the root.
//!
//! The test binary runs itself as the ranks (see `common::child`), started by hand with the
//! `FERRO_*` environment where `ferrorun` would hide the fault. Every wait is bounded.

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::child::{self, field, free_port, now_ms, self_command, serial, Finished, Running};
use ferroccl::{Communicator, Config, ErrorKind, ReduceOp};

fn rank_env(
    rank: usize,
    nranks: usize,
    store: SocketAddr,
    timeout_s: u32,
    extra: &[(&'static str, String)],
) -> Vec<(&'static str, String)> {
    let mut v = child::rank_env(rank, nranks, store, timeout_s);
    v.extend_from_slice(extra);
    v
}

fn dump_all(outs: &[Finished]) -> String {
    child::dump_all("process", outs)
}

// ---------------------------------------------------------------------------------------------
// Two jobs, or two processes, that claim the same ranks.

/// A rank of a job tagged `FAULT_TAG`: 20 allreduces whose expected sums depend on the tag,
/// each checked element by element. Prints `INIT_FAILED`, `WRONG`, `CALL_FAILED` or `ALL_OK`.
#[test]
fn child_tagged_job() {
    if !child::is_role("tagged") {
        return;
    }
    let tag: u64 = child::env_var("FAULT_TAG");
    let comm = match Communicator::from_env() {
        Ok(c) => c,
        Err(e) => {
            println!("INIT_FAILED tag={tag} error={e}");
            return;
        }
    };
    let (r, n) = (comm.rank(), comm.nranks() as u64);
    let mut wrong = 0usize;
    for call in 0..20u64 {
        let send: Vec<u64> = (0..1024u64)
            .map(|i| tag * 1_000_000 + r as u64 * 1000 + i + call)
            .collect();
        let mut recv = vec![0u64; 1024];
        if let Err(e) = comm.all_reduce(&send, &mut recv, ReduceOp::Sum) {
            println!("CALL_FAILED tag={tag} rank={r} call={call} error={e}");
            return;
        }
        let ranks: u64 = (0..n).sum();
        wrong += (0..1024u64)
            .filter(|&i| recv[i as usize] != n * (tag * 1_000_000 + i + call) + ranks * 1000)
            .count();
    }
    if wrong > 0 {
        println!("WRONG tag={tag} rank={r} elements={wrong}");
    } else {
        println!("ALL_OK tag={tag} rank={r}");
    }
}

/// Starts `procs` (rank, tag) processes of [`child_tagged_job`] on one store address, with no
/// `FERRO_JOB_ID` (ranks started by hand): the one with rank 0 and the first tag first, so that
/// it hosts the store, then the others at once.
fn tagged_processes(nranks: usize, procs: &[(usize, u64)]) -> Vec<Finished> {
    let store = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let spawn = |(r, tag): (usize, u64)| {
        Running::spawn(self_command(
            "child_tagged_job",
            "tagged",
            &rank_env(r, nranks, store, 20, &[("FAULT_TAG", tag.to_string())]),
        ))
    };
    let first = spawn(procs[0]);
    let start = Instant::now();
    while std::net::TcpStream::connect(store).is_err() && start.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut running = vec![first];
    running.extend(procs[1..].iter().map(|&p| spawn(p)));
    running
        .into_iter()
        .map(|p| p.finish(Duration::from_secs(60)))
        .collect()
}

#[test]
fn two_jobs_on_one_address_and_id_fail_at_init_with_no_wrong_result() {
    let _serial = serial();
    // Job 1 and job 2, 4 ranks each, interleaved.
    let mut procs = vec![(0, 1)];
    for r in 1..4 {
        procs.push((r, 2));
        procs.push((r, 1));
    }
    procs.push((0, 2));
    let outs = tagged_processes(4, &procs);
    let all = dump_all(&outs);
    let mut failed_init = 0;
    for out in &outs {
        assert!(out.success(), "{all}");
        assert!(out.tagged("WRONG ").is_empty(), "wrong results: {all}");
        assert!(
            out.tagged("ALL_OK ").is_empty(),
            "a rank of a shared communicator ran to the end: {all}"
        );
        for l in out.tagged("INIT_FAILED ") {
            println!("{l}");
            failed_init += 1;
        }
    }
    // Every process fails at init: the second rank 0 cannot host the store, the second
    // claimant of a rank fails at once, and the first claimants fail at the confirmation.
    assert_eq!(failed_init, outs.len(), "{all}");
    let claimed: Vec<String> = outs
        .iter()
        .flat_map(|o| o.tagged("INIT_FAILED "))
        .filter(|l| l.contains("is claimed by two processes"))
        .collect();
    assert!(claimed.len() >= 3, "{all}");
    for l in &claimed {
        // Both processes are named by host and pid.
        assert_eq!(l.matches(" pid ").count(), 3, "{l}");
    }
}

#[test]
fn two_processes_claiming_one_rank_fail_at_init() {
    let _serial = serial();
    // Ranks 0, 1, 2 of one job and a second process that also says it is rank 1.
    let outs = tagged_processes(3, &[(0, 1), (1, 1), (2, 1), (1, 1)]);
    let all = dump_all(&outs);
    for out in &outs {
        assert!(out.success(), "{all}");
        assert!(out.tagged("WRONG ").is_empty(), "wrong results: {all}");
        assert!(out.tagged("ALL_OK ").is_empty(), "{all}");
        assert_eq!(out.tagged("INIT_FAILED ").len(), 1, "{all}");
    }
    let both: Vec<String> = outs
        .iter()
        .flat_map(|o| o.tagged("INIT_FAILED "))
        .filter(|l| l.contains("rank 1 is claimed by two processes"))
        .collect();
    assert_eq!(both.len(), 2, "both claimants name the duplicate: {all}");
}

// ---------------------------------------------------------------------------------------------
// A stopped rank 0, a dead rank 0.

/// A rank that loops over small allreduces; rank 0 stops (`FAULT=stop`) or kills
/// (`FAULT=kill`) itself after 20 calls. The others print `FAILED ... at_ms= error=`.
#[test]
fn child_rank0_fault() {
    if !child::is_role("rank0") {
        return;
    }
    let fault: String = child::env_var("FAULT");
    let comm = Communicator::from_env().expect("from_env");
    let r = comm.rank();
    let mut buf = [0f32; 16];
    for call in 0..100_000u64 {
        if r == 0 && call == 20 {
            println!("FAULT rank=0 at_ms={}", now_ms());
            let _ = std::io::stdout().flush();
            if fault == "partition" {
                // This rank runs in its own network namespace (a test host): cut its link.
                let st = std::process::Command::new("ip")
                    .args(["link", "set", "eth0", "down"])
                    .status()
                    .expect("run ip");
                assert!(st.success(), "ip link set eth0 down: {st}");
            } else {
                let sig = if fault == "stop" {
                    libc::SIGSTOP
                } else {
                    libc::SIGKILL
                };
                // SAFETY: kill(2) on this process; no memory is involved.
                unsafe { libc::kill(libc::getpid(), sig) };
            }
        }
        if let Err(e) = comm.all_reduce_in_place(&mut buf, ReduceOp::Sum) {
            println!("FAILED rank={r} call={call} at_ms={} error={e}", now_ms());
            return;
        }
    }
    panic!("rank {r}: 100000 allreduces succeeded although rank 0 stopped");
}

/// Runs `nranks` ranks of [`child_rank0_fault`]; returns rank 0's fault time and the others'
/// outputs (rank 0 is killed once the others are done).
fn rank0_fault(
    nranks: usize,
    fault: &str,
    timeout_s: u32,
    extra: &[(&'static str, String)],
) -> (u128, Vec<Finished>) {
    let store = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut env_extra = vec![("FAULT", fault.to_string())];
    env_extra.extend_from_slice(extra);
    let ranks: Vec<Running> = (0..nranks)
        .map(|r| {
            Running::spawn(self_command(
                "child_rank0_fault",
                "rank0",
                &rank_env(r, nranks, store, timeout_s, &env_extra),
            ))
        })
        .collect();
    let mut ranks = ranks.into_iter();
    let rank0 = ranks.next().expect("rank 0");
    let others: Vec<Finished> = ranks
        .map(|p| p.finish(Duration::from_secs(u64::from(timeout_s) + 60)))
        .collect();
    // A stopped rank 0 ends with SIGTERM/SIGKILL here.
    let r0 = rank0.finish(Duration::ZERO);
    let fault_at = r0
        .tagged("FAULT ")
        .first()
        .map(|l| field::<u128>(l, "at_ms"))
        .unwrap_or_else(|| panic!("rank 0 never faulted: {}", r0.dump()));
    (fault_at, others)
}

#[test]
fn a_stopped_rank0_fails_every_other_rank_soon_after_the_deadline() {
    let _serial = serial();
    const TIMEOUT_S: u32 = 10;
    let (stopped_at, others) = rank0_fault(4, "stop", TIMEOUT_S, &[]);
    let all = dump_all(&others);
    for out in &others {
        assert!(out.success(), "{all}");
        let failed = out.tagged("FAILED ");
        assert_eq!(failed.len(), 1, "{all}");
        let after = field::<u128>(&failed[0], "at_ms").saturating_sub(stopped_at);
        println!("{} ms after the stop: {}", after, failed[0]);
        // The deadline is 10 s of no progress; reporting the failure to a store whose host
        // is stopped must not add more than a few seconds.
        assert!(after < 15_000, "{after} ms: {}", failed[0]);
    }
}

#[test]
fn a_dead_rank0_over_tcp_is_named_by_all_eight_ranks_within_the_deadline() {
    let _serial = serial();
    const TIMEOUT_S: u32 = 20;
    let (killed_at, others) = rank0_fault(
        8,
        "kill",
        TIMEOUT_S,
        &[("FERRO_TRANSPORTS", "tcp".to_string())],
    );
    let all = dump_all(&others);
    for out in &others {
        assert!(out.success(), "{all}");
        let failed = out.tagged("FAILED ");
        assert_eq!(failed.len(), 1, "{all}");
        let line = &failed[0];
        let after = field::<u128>(line, "at_ms").saturating_sub(killed_at);
        println!("{after} ms after the kill: {line}");
        // A dead process's sockets close at once: no rank waits for the deadline, and no
        // rank adds seconds for the one before it.
        assert!(after < 5_000, "{after} ms: {line}");
        let error = line.split_once("error=").map_or("", |(_, e)| e);
        assert!(error.contains("rank 0"), "must name rank 0: {line}");
    }
}

#[test]
fn a_partitioned_rank0_host_fails_the_others_soon_after_the_deadline() {
    let _serial = serial();
    if let Err(why) = common::netns::netns_available() {
        println!("skipped: partition test: {why}");
        return;
    }
    let hosts = common::netns::NetnsHosts::up(3).expect("build namespace hosts");
    let out = child::ferrorun_self(
        3,
        Some(&hosts.netns_arg()),
        "child_rank0_fault",
        "rank0",
        &[
            ("FAULT", "partition".to_string()),
            ("FERRO_TIMEOUT", "10".to_string()),
        ],
        Duration::from_secs(90),
    );
    assert!(out.success(), "{}", out.dump());
    let cut_at: u128 = field(&out.tagged("FAULT ")[0], "at_ms");
    let failed = out.tagged("FAILED ");
    assert_eq!(failed.len(), 3, "{}", out.dump());
    for line in &failed {
        let after = field::<u128>(line, "at_ms").saturating_sub(cut_at);
        println!("{after} ms after the cut: {line}");
        // 10 s without progress, then at most a few seconds to report it. A silent rank is not
        // a dead one: each rank names the peer it was waiting for when its deadline passed.
        assert!(after < 15_000, "{after} ms: {line}");
        assert!(line.contains("no progress for 10.0 s"), "{line}");
    }
}

// ---------------------------------------------------------------------------------------------
// Ranks that disagree on the root.

fn local(n: usize) -> Vec<Communicator> {
    let cfg = Config {
        timeout: Duration::from_secs(20),
        ..Config::default()
    };
    Communicator::local_group(n, cfg).expect("local group")
}

/// Runs `call(comm, root)` on 3 thread ranks where rank 2 names root 1 and the others root 0;
/// every rank must fail, quickly, with a message about the root.
fn root_mismatch(what: &str, call: impl Fn(&Communicator, usize) -> ferroccl::Result<()> + Sync) {
    let comms = local(3);
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let call = &call;
                s.spawn(move || {
                    let root = if c.rank() == 2 { 1 } else { 0 };
                    let t = Instant::now();
                    let r = call(c, root);
                    (c.rank(), r, t.elapsed())
                })
            })
            .collect();
        let results: Vec<_> = hs.into_iter().map(|h| h.join().expect("rank")).collect();
        let mut named = 0;
        for (rank, r, took) in &results {
            let e = match r {
                Ok(()) => panic!("{what}: rank {rank} succeeded: {results:?}"),
                Err(e) => e,
            };
            // Not the deadline: found from the first messages.
            assert!(
                *took < Duration::from_secs(5),
                "{what}: rank {rank}: {took:?} {e}"
            );
            assert!(
                matches!(e.kind(), ErrorKind::Remote),
                "{what}: rank {rank}: {e}"
            );
            if e.message().contains("root") {
                named += 1;
            }
        }
        assert!(named >= 2, "{what}: {results:?}");
    });
}

#[test]
fn a_root_mismatch_fails_every_rank_of_a_broadcast() {
    for count in [1usize, 3072, 1 << 20] {
        root_mismatch(&format!("broadcast of {count}"), |c, root| {
            let mut buf = vec![c.rank() as u32; count];
            c.broadcast(&mut buf, root)
        });
    }
}

#[test]
fn a_root_mismatch_fails_every_rank_of_a_reduce() {
    for count in [1usize, 4099, 1 << 20] {
        root_mismatch(&format!("reduce of {count}"), |c, root| {
            let send = vec![1.0f32; count];
            let mut recv = vec![0.0f32; count];
            c.reduce(&send, &mut recv, ReduceOp::Sum, root)
        });
    }
}

#[test]
fn agreeing_roots_still_work_after_the_check() {
    let comms = local(3);
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                for root in 0..3 {
                    let mut buf: Vec<u32> = (0..1000)
                        .map(|i| {
                            if c.rank() == root {
                                i * 3 + root as u32
                            } else {
                                0
                            }
                        })
                        .collect();
                    c.broadcast(&mut buf, root).expect("broadcast");
                    assert!(buf
                        .iter()
                        .enumerate()
                        .all(|(i, &x)| x == i as u32 * 3 + root as u32));
                }
            });
        }
    });
}
