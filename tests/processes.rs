//! The conformance suite with ranks as real processes started by `ferrorun`, meeting through
//! the TCP rendezvous store that rank 0 hosts (`Communicator::from_env`).
//!
//! The test binary runs itself as the ranks: a `child_*` test returns at once unless
//! `FERRO_TEST_CHILD` names its role (see `common::child`).

mod common;

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::child::{self, algo_env, expected_cases, ferrorun_self, field, sweep_named, ALGOS};
use common::conformance::run_sweep;
use ferroccl::Communicator;

/// Jobs of this file run one at a time: the machine has 2 cores, and up to 8 ranks share them.
static SERIAL: Mutex<()> = Mutex::new(());

/// Per-job limit (ferrorun's `--timeout`); generous, since a job normally takes seconds.
const JOB_LIMIT: Duration = Duration::from_secs(240);

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A rank of a conformance job: runs the sweep named by `FERRO_TEST_SWEEP` and prints
/// `CASES rank=R nranks=N cases=C`.
#[test]
fn child_conformance() {
    if !child::is_role("conformance") {
        return;
    }
    let comm = Communicator::from_env().expect("from_env");
    let sweep = sweep_named(&child::env_var::<String>(child::SWEEP_VAR));
    let seed = 1000 * comm.nranks() as u64 + 17;
    let start = Instant::now();
    match run_sweep(&comm, &sweep, seed) {
        Ok(cases) => println!(
            "CASES rank={} nranks={} cases={cases} secs={:.1}",
            comm.rank(),
            comm.nranks(),
            start.elapsed().as_secs_f64()
        ),
        Err(e) => panic!("nranks {}, rank {}: {e}", comm.nranks(), comm.rank()),
    }
    comm.destroy().expect("destroy");
}

/// Runs the sweep `name` over `n` processes and checks that every rank ran every case.
fn conformance(n: usize, name: &str) {
    conformance_with(
        n,
        name,
        &[
            (child::SWEEP_VAR, name.to_string()),
            ("FERRO_TIMEOUT", "60".to_string()),
        ],
    );
}

/// [`conformance`] with the job's environment `env` (which names the sweep).
fn conformance_with(n: usize, name: &str, env: &[(&str, String)]) {
    let _serial = serial();
    let out = ferrorun_self(n, None, "child_conformance", "conformance", env, JOB_LIMIT);
    assert!(out.success(), "nranks {n}, sweep {name}: {}", out.dump());
    if let Some((_, algo)) = env.iter().find(|(k, _)| *k == "FERRO_ALGO") {
        child::assert_algo_used(&out, algo);
    }
    let want = expected_cases(&sweep_named(name));
    let lines = out.tagged("CASES ");
    let ranks: BTreeSet<usize> = lines.iter().map(|l| field(l, "rank")).collect();
    assert_eq!(ranks, (0..n).collect(), "{}", out.dump());
    for l in &lines {
        assert_eq!(field::<usize>(l, "nranks"), n, "{l}");
        assert_eq!(field::<usize>(l, "cases"), want, "{l}");
    }
    println!(
        "nranks {n}, sweep {name}: {want} cases per rank in {:.1} s",
        out.took.as_secs_f64()
    );
}

#[test]
fn conformance_small_1_process() {
    conformance(1, "small");
}

#[test]
fn conformance_small_2_processes() {
    conformance(2, "small");
}

#[test]
fn conformance_small_3_processes() {
    conformance(3, "small");
}

#[test]
fn conformance_small_5_processes() {
    conformance(5, "small");
}

#[test]
fn conformance_small_8_processes() {
    conformance(8, "small");
}

#[test]
fn conformance_large_2_processes() {
    conformance(2, "large");
}

#[test]
fn conformance_large_3_processes() {
    conformance(3, "large");
}

/// Every algorithm forced in turn (`FERRO_ALGO`), through the collectives it implements, on 5
/// processes (not a power of two: recursive doubling and Rabenseifner fold two ranks).
#[test]
fn conformance_every_algorithm_5_processes() {
    for algo in ALGOS {
        conformance_with(5, &format!("algo-{algo}"), &algo_env(algo));
    }
}

/// A rank that all-gathers the process ids and prints its own and the gathered ones.
#[test]
fn child_pids() {
    if !child::is_role("pids") {
        return;
    }
    let comm = Communicator::from_env().expect("from_env");
    let me = std::process::id();
    let mut all = vec![0u32; comm.nranks()];
    comm.all_gather(&[me], &mut all).expect("all_gather");
    let list: Vec<String> = all.iter().map(u32::to_string).collect();
    println!(
        "PIDS rank={} pid={me} ppid={} all={}",
        comm.rank(),
        std::os::unix::process::parent_id(),
        list.join(",")
    );
    comm.destroy().expect("destroy");
}

#[test]
fn ranks_are_distinct_processes() {
    let _serial = serial();
    let n = 4;
    let out = ferrorun_self(
        n,
        None,
        "child_pids",
        "pids",
        &[("FERRO_TIMEOUT", "60".to_string())],
        JOB_LIMIT,
    );
    assert!(out.success(), "{}", out.dump());
    let lines = out.tagged("PIDS ");
    assert_eq!(lines.len(), n, "{}", out.dump());
    let mut own = vec![0u32; n];
    let mut gathered = BTreeSet::new();
    let mut parents = BTreeSet::new();
    for l in &lines {
        let rank: usize = field(l, "rank");
        own[rank] = field(l, "pid");
        parents.insert(field::<u32>(l, "ppid"));
        gathered.insert(field::<String>(l, "all"));
    }
    // Every rank gathered the same list, and entry r is what rank r says its pid is.
    assert_eq!(gathered.len(), 1, "{lines:?}");
    let all: Vec<u32> = gathered
        .iter()
        .next()
        .map(|s| s.split(',').map(|p| p.parse().expect("pid")).collect())
        .unwrap_or_default();
    assert_eq!(all, own, "{lines:?}");
    let distinct: BTreeSet<u32> = own.iter().copied().collect();
    assert_eq!(distinct.len(), n, "pids must differ: {own:?}");
    assert!(!own.contains(&std::process::id()), "{own:?}");
    // All started by the one launcher, which is not this test process.
    assert_eq!(parents.len(), 1, "{lines:?}");
    assert!(!parents.contains(&std::process::id()), "{lines:?}");
}
