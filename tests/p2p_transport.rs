//! The GPU peer-to-peer transport over its host provider (`FERRO_P2P_PROVIDER=host`, host
//! memory in `/dev/shm` standing in for GPU memory: test tooling): the transport conformance
//! suite on in-process pairs; ranks as processes started by `ferrorun` joined by `p2p` alone
//! (`FERRO_TRANSPORTS=p2p`) running the collective conformance sweeps; a rank that dies
//! mid-transfer is named by the survivors long before the deadline; forcing `p2p` where no
//! CUDA driver exists is an error naming libcuda.so.1.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::child::{
    self, dump_all, ferrorun_self, field, free_port, now_ms, self_command, serial, Running,
};
use common::threads;
use ferroccl::{Communicator, Config, ReduceOp};
use ferroccl_transport_p2p::{host_pair, P2pConfig};
use ferroccl_transport_testkit::conformance::{self, Options};

const JOB_LIMIT: Duration = Duration::from_secs(120);

fn host_env(extra: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("FERRO_TRANSPORTS", "p2p".to_string()),
        ("FERRO_P2P_PROVIDER", "host".to_string()),
        ("FERRO_P2P_SLOTS", "4".to_string()),
        ("FERRO_P2P_SLOT_BYTES", "64K".to_string()),
        ("FERRO_TIMEOUT", "60".to_string()),
    ];
    env.extend_from_slice(extra);
    env
}

/// The transport conformance suite on pairs of this process, the default ring (8 slots of
/// 512 KiB), one thread per end.
#[test]
fn conformance_suite_over_host_provider_pairs() {
    let opts = Options {
        threads: true,
        ..Options::new("p2p(host)")
    };
    conformance::run(&opts, || host_pair(&P2pConfig::host()).expect("host pair"));
}

/// A rank of a conformance job over p2p: checks that every peer is joined by p2p, runs the
/// sweep named by `FERRO_TEST_SWEEP`, prints `CASES rank=R nranks=N cases=C`.
#[test]
fn child_p2p_conformance() {
    if !child::is_role("p2p_conformance") {
        return;
    }
    // The transport the job forces (p2p; another one to compare timings by hand).
    let want: String = child::env_var("FERRO_TRANSPORTS");
    child::sweep_rank(&want, 41);
}

/// Runs sweep `name` on `n` processes; `ring` overrides the ring (`(slots, slot bytes)`) of
/// [`host_env`].
fn conformance_job(n: usize, name: &str, ring: Option<(usize, &str)>) {
    let _serial = serial();
    let mut env = host_env(&[(child::SWEEP_VAR, name.to_string())]);
    if let Some((slots, bytes)) = ring {
        env.retain(|(k, _)| !k.starts_with("FERRO_P2P_SLOT"));
        env.push(("FERRO_P2P_SLOTS", slots.to_string()));
        env.push(("FERRO_P2P_SLOT_BYTES", bytes.to_string()));
    }
    let out = ferrorun_self(
        n,
        None,
        "child_p2p_conformance",
        "p2p_conformance",
        &env,
        JOB_LIMIT,
    );
    let want = child::check_sweep_job(&out, n, name);
    println!(
        "p2p(host) nranks {n}, sweep {name}: {want} cases per rank in {:.1} s",
        out.took.as_secs_f64()
    );
}

#[test]
fn p2p_conformance_small_2_processes() {
    conformance_job(2, "small", None);
}

#[test]
fn p2p_conformance_reduced_3_processes() {
    conformance_job(3, "reduced", None);
}

#[test]
fn p2p_conformance_large_3_processes() {
    conformance_job(3, "large", Some((8, "512K")));
}

/// A rank of the dead-peer job: all-reduces of 1 MiB in a loop; the rank named by
/// `FERRO_TEST_FAULT_RANK` ends its process from another thread while its collectives run
/// (`EXITING at_ms=`); the others print `FAILED rank=R at_ms=T error: <error>` at their first error.
#[test]
fn child_p2p_dead_peer() {
    if !child::is_role("p2p_dead_peer") {
        return;
    }
    let rank: usize = child::env_var("FERRO_RANK");
    let target: usize = child::env_var("FERRO_TEST_FAULT_RANK");
    let comm = Communicator::from_env().expect("from_env");
    if rank == target {
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            println!("EXITING at_ms={}", now_ms());
            std::process::exit(3);
        });
    }
    let n = 1 << 18;
    let data: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 + rank as f32).collect();
    let mut out = vec![0f32; n];
    for _ in 0..100_000 {
        if let Err(e) = comm.all_reduce(&data, &mut out, ReduceOp::Sum) {
            println!("FAILED rank={rank} at_ms={} error: {e}", now_ms());
            std::process::exit(1);
        }
    }
    println!("FINISHED rank={rank}");
}

/// Rank 1 of 3 ends mid-transfer: every survivor fails, naming rank 1, within seconds of the
/// exit although `FERRO_TIMEOUT` is 60 s.
#[test]
fn a_dead_peer_is_named_long_before_the_deadline() {
    let _serial = serial();
    let store = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let ranks: Vec<Running> = (0..3)
        .map(|r| {
            let mut env = child::rank_env(r, 3, store, 60);
            env.extend(
                host_env(&[("FERRO_TEST_FAULT_RANK", "1".to_string())])
                    .into_iter()
                    .filter(|(k, _)| *k != "FERRO_TIMEOUT"),
            );
            Running::spawn(self_command("child_p2p_dead_peer", "p2p_dead_peer", &env))
        })
        .collect();
    let outs: Vec<_> = ranks
        .into_iter()
        .map(|p| p.finish(Duration::from_secs(90)))
        .collect();
    let dump = dump_all("rank", &outs);
    assert!(outs.iter().all(|o| !o.timed_out), "a rank hung: {dump}");
    let exited: u128 = outs[1]
        .tagged("EXITING ")
        .first()
        .map(|l| field(l, "at_ms"))
        .unwrap_or_else(|| panic!("rank 1 did not exit as planned: {dump}"));
    for r in [0, 2] {
        let line = outs[r]
            .tagged("FAILED ")
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("rank {r} did not fail: {dump}"));
        let after = field::<u128>(&line, "at_ms").saturating_sub(exited);
        println!("{after} ms after the exit: {line}");
        assert!(after < 15_000, "rank {r} noticed after {after} ms: {dump}");
        assert!(
            line.contains("rank 1"),
            "rank {r} does not name rank 1: {dump}"
        );
    }
}

/// Forcing p2p where no CUDA driver exists (and the host provider is not asked for) fails init
/// with an error that names the missing library.
#[test]
fn forced_p2p_without_libcuda_names_it() {
    if std::env::var_os("FERRO_P2P_PROVIDER").is_some() {
        return;
    }
    if ferroccl_cuda::driver::driver().is_ok() {
        println!("skipped: this machine has a CUDA driver");
        return;
    }
    let cfg = Config {
        timeout: Duration::from_secs(20),
        transports: vec!["p2p".into()],
        ..Config::default()
    };
    for r in threads::init_all(vec![cfg; 2], 0x5032_5000 << 24) {
        let e = r.expect_err("p2p cannot run without a driver");
        let m = e.to_string();
        println!("{m}");
        assert!(m.contains("p2p") && m.contains("libcuda.so.1"), "{m}");
    }
}
