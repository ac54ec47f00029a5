//! The RDMA transport inside the communicator, over the software verbs provider (test
//! tooling, `FERRO_IB_PROVIDER=soft`): ranks as processes started by `ferrorun` connect
//! through `rdma` alone (`FERRO_TRANSPORTS=rdma`) and run the collective conformance sweeps;
//! injected faults (a corrupted rkey, a failed registration, a lost completion, a peer that
//! dies) end the job with an error that names them, never a hang; forcing rdma where no
//! provider can run is an error that says what is missing.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::child::{self, ferrorun_self, free_port, self_command, serial, Running};
use common::threads;
use ferroccl::{Communicator, Config, ReduceOp};

const JOB_LIMIT: Duration = Duration::from_secs(240);

fn soft_env(extra: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("FERRO_TRANSPORTS", "rdma".to_string()),
        ("FERRO_IB_PROVIDER", "soft".to_string()),
        ("FERRO_IB_QPS_PER_CONN", "2".to_string()),
        ("FERRO_TIMEOUT", "60".to_string()),
    ];
    env.extend_from_slice(extra);
    env
}

/// A rank of a conformance job over rdma: checks that every peer is joined by rdma, runs the
/// sweep named by `FERRO_TEST_SWEEP`, prints `CASES rank=R nranks=N cases=C`.
#[test]
fn child_rdma_conformance() {
    if !child::is_role("rdma_conformance") {
        return;
    }
    child::sweep_rank("rdma", 29);
}

fn conformance(n: usize, name: &str) {
    let _serial = serial();
    let env = soft_env(&[(child::SWEEP_VAR, name.to_string())]);
    let out = ferrorun_self(
        n,
        None,
        "child_rdma_conformance",
        "rdma_conformance",
        &env,
        JOB_LIMIT,
    );
    let want = child::check_sweep_job(&out, n, name);
    println!(
        "rdma(soft) nranks {n}, sweep {name}: {want} cases per rank in {:.1} s",
        out.took.as_secs_f64()
    );
}

#[test]
fn rdma_conformance_small_2_processes() {
    conformance(2, "small");
}

#[test]
fn rdma_conformance_small_3_processes() {
    conformance(3, "small");
}

#[test]
fn rdma_conformance_small_5_processes() {
    conformance(5, "small");
}

#[test]
fn rdma_conformance_large_3_processes() {
    conformance(3, "large");
}

/// A rank of a fault job: applies `FERRO_TEST_FAULTS` to itself when its rank is
/// `FERRO_TEST_FAULT_RANK`, then runs all-reduces until one fails; prints
/// `OUTCOME rank=R ok` or `OUTCOME rank=R failed after=MS: <error>`.
#[test]
fn child_rdma_fault() {
    if !child::is_role("rdma_fault") {
        return;
    }
    let rank: usize = child::env_var("FERRO_RANK");
    let target: usize = child::env_var("FERRO_TEST_FAULT_RANK");
    if rank == target {
        let faults: String = child::env_var("FERRO_TEST_FAULTS");
        std::env::set_var("FERRO_IB_SOFT_FAULTS", faults);
    }
    let start = Instant::now();
    let comm = match Communicator::from_env() {
        Ok(c) => c,
        Err(e) => {
            println!("OUTCOME rank={rank} failed after=0: init: {e}");
            std::process::exit(1);
        }
    };
    let n = 100_003usize;
    let data: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 + rank as f32).collect();
    let mut out = vec![0f32; n];
    for _ in 0..20 {
        if let Err(e) = comm.all_reduce(&data, &mut out, ReduceOp::Sum) {
            println!(
                "OUTCOME rank={rank} failed after={}: {e}",
                start.elapsed().as_millis()
            );
            std::process::exit(1);
        }
    }
    println!("OUTCOME rank={rank} ok");
}

/// Runs a 3-rank fault job with `faults` on rank `target`, each rank started by hand (so that
/// a rank that dies does not stop the others, as a launcher would); returns every OUTCOME line
/// and the outputs.
fn fault_job(target: usize, faults: &str, timeout_s: u32) -> (Vec<String>, String) {
    let _serial = serial();
    let store = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let extra = soft_env(&[
        ("FERRO_TEST_FAULT_RANK", target.to_string()),
        ("FERRO_TEST_FAULTS", faults.to_string()),
    ]);
    let ranks: Vec<Running> = (0..3)
        .map(|r| {
            let mut env = child::rank_env(r, 3, store, timeout_s);
            env.extend(extra.iter().filter(|(k, _)| *k != "FERRO_TIMEOUT").cloned());
            Running::spawn(self_command("child_rdma_fault", "rdma_fault", &env))
        })
        .collect();
    let outs: Vec<_> = ranks
        .into_iter()
        .map(|p| p.finish(Duration::from_secs(u64::from(timeout_s) + 60)))
        .collect();
    let dump = outs
        .iter()
        .enumerate()
        .map(|(i, o)| format!("=== rank {i}: {}", o.dump()))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        outs.iter().all(|o| !o.timed_out),
        "{faults}: a rank hung: {dump}"
    );
    assert!(
        outs.iter().any(|o| !o.success()),
        "{faults}: no rank failed: {dump}"
    );
    let lines: Vec<String> = outs.iter().flat_map(|o| o.tagged("OUTCOME ")).collect();
    for l in &lines {
        println!("{faults}: {l}");
    }
    (lines, dump)
}

#[test]
fn corrupted_rkey_is_a_remote_access_error() {
    let (lines, dump) = fault_job(1, "corrupt_rkey=2", 60);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("remote access error") && l.contains("soft0 port 1")),
        "{dump}"
    );
}

#[test]
fn failed_registration_names_the_device() {
    // Setup registers 4 control buffers per peer (8 on 3 ranks); the 9th is a buffer of the
    // first all-reduce.
    let (lines, dump) = fault_job(0, "fail_reg=9", 60);
    assert!(
        lines.iter().any(|l| l.contains("rank=0 failed")
            && l.contains("registering")
            && l.contains("soft0")),
        "{dump}"
    );
}

#[test]
fn lost_completion_ends_at_the_deadline() {
    let (lines, dump) = fault_job(2, "drop_completion=5", 4);
    assert!(lines.iter().any(|l| l.contains("rank=2 failed")), "{dump}");
}

#[test]
fn dead_peer_is_detected_before_the_deadline() {
    // Rank 1 ends at its 6th write; the others must name it well within FERRO_TIMEOUT (60 s),
    // through a failed write or a keep-alive probe ("transport retry count exceeded").
    let (lines, dump) = fault_job(1, "exit_at=6", 60);
    let survivors: Vec<&String> = lines.iter().filter(|l| !l.contains("rank=1 ")).collect();
    assert!(!survivors.is_empty(), "{dump}");
    for l in survivors {
        assert!(l.contains("failed"), "{dump}");
        let after: u128 = l
            .split("after=")
            .nth(1)
            .and_then(|r| r.split(':').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(u128::MAX);
        assert!(after < 30_000, "detected after {after} ms: {dump}");
        assert!(
            l.contains("rank 1"),
            "the error names the dead rank: {dump}"
        );
    }
}

/// Forcing rdma where no provider can run (no libibverbs, no FERRO_IB_PROVIDER=soft) fails
/// init with an error that names what is missing.
#[test]
fn forced_rdma_without_a_provider_says_what_is_missing() {
    if std::env::var_os("FERRO_IB_PROVIDER").is_some() {
        return;
    }
    let cfg = Config {
        timeout: Duration::from_secs(20),
        transports: vec!["rdma".into()],
        ..Config::default()
    };
    for r in threads::init_all(vec![cfg; 2], 0x5244_4d41 << 24) {
        let e = r.expect_err("rdma cannot run here");
        let m = e.to_string();
        assert!(m.contains("rdma") && m.contains("libibverbs"), "{m}");
    }
}
