//! Test binaries that re-invoke themselves as rank processes.
//!
//! A child test function returns at once unless [`ROLE_VAR`] names its role; the parent test
//! starts copies of the current test binary that run only that function, either under
//! `ferrorun` ([`ferrorun_self`]) or one by one with a hand-made `FERRO_*` environment
//! ([`self_command`] + [`Running`]). Every wait is bounded: a child still running at its limit
//! is stopped (SIGTERM, then SIGKILL) and the result says it timed out.

#![allow(dead_code)]

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferroccl::{DataType, ReduceOp};

use super::conformance::{Sweep, ALL_COLLS};

/// Environment variable naming the role a child process plays.
pub const ROLE_VAR: &str = "FERRO_TEST_CHILD";
/// Environment variable naming the sweep a conformance child runs (see [`sweep_named`]).
pub const SWEEP_VAR: &str = "FERRO_TEST_SWEEP";

/// The `ferrorun` binary built with these tests.
pub const FERRORUN: &str = env!("CARGO_BIN_EXE_ferrorun");

/// How long a stopped child gets between SIGTERM and SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(5);

/// True in a child started with role `name`.
pub fn is_role(name: &str) -> bool {
    std::env::var(ROLE_VAR).is_ok_and(|r| r == name)
}

/// A required environment variable of a child, parsed.
pub fn env_var<T: std::str::FromStr>(name: &str) -> T {
    let v = std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    v.parse()
        .unwrap_or_else(|_| panic!("{name}={v:?} does not parse"))
}

/// The sweeps a conformance child can be asked to run, by name.
pub fn sweep_named(name: &str) -> Sweep {
    match name {
        "small" => Sweep::full_small(),
        "large" => Sweep::large(),
        // Every collective over a few dtypes and ops of each family, with one count large
        // enough to be pipelined in many slices.
        "reduced" => Sweep {
            dtypes: vec![
                DataType::Float32,
                DataType::Int8,
                DataType::Bfloat16,
                DataType::Uint64,
            ],
            ops: vec![
                ReduceOp::Sum,
                ReduceOp::Max,
                ReduceOp::Avg,
                ReduceOp::PreMulSum(0.0),
            ],
            counts: vec![0, 1, 7, 1000, 100_003],
            colls: ALL_COLLS.to_vec(),
        },
        other => {
            if let Some(algo) = other.strip_prefix("algo-") {
                algo_sweep(algo)
            } else if let Some(algo) = other.strip_prefix("delay-") {
                // Over delayed links every message costs a delay: few, but one pipelined.
                Sweep {
                    dtypes: vec![DataType::Float32],
                    ops: vec![ReduceOp::Sum, ReduceOp::Avg],
                    counts: vec![1, 100_003],
                    colls: algo_colls(algo),
                }
            } else {
                panic!("unknown sweep {other:?}")
            }
        }
    }
}

/// Every algorithm by its `FERRO_ALGO` name.
pub const ALGOS: [&str; 8] = [
    "ring", "chain", "pairwise", "tree", "rd", "rhd", "hier", "binomial",
];

/// The collectives (conformance names) that `algo` implements; the others would run the
/// default algorithm and add nothing to its test.
pub fn algo_colls(algo: &str) -> Vec<&'static str> {
    match algo {
        "ring" => vec!["all_reduce", "all_gather", "reduce_scatter"],
        "chain" | "binomial" => vec!["broadcast", "reduce"],
        "pairwise" => vec!["all_to_all"],
        "tree" | "rd" | "rhd" => vec!["all_reduce"],
        "hier" => vec![
            "all_reduce",
            "all_gather",
            "reduce_scatter",
            "broadcast",
            "reduce",
        ],
        other => panic!("unknown algorithm {other:?}"),
    }
}

/// The sweep `algo-NAME` runs under `FERRO_ALGO=NAME`: the collectives it implements over a
/// float, a narrow integer and a half-width float, three ops, and counts 0, 1, a prime and a
/// large prime (many slices with `FERRO_SLICE_BYTES=64K`).
pub fn algo_sweep(algo: &str) -> Sweep {
    Sweep {
        dtypes: vec![DataType::Float32, DataType::Int8, DataType::Bfloat16],
        ops: vec![ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg],
        counts: vec![0, 1, 97, 100_003],
        colls: algo_colls(algo),
    }
}

/// The environment of a per-algorithm conformance job: the algorithm forced, small slices.
pub fn algo_env(algo: &str) -> Vec<(&'static str, String)> {
    vec![
        (SWEEP_VAR, format!("algo-{algo}")),
        ("FERRO_ALGO", algo.to_string()),
        ("FERRO_SLICE_BYTES", "64K".to_string()),
        ("FERRO_TIMEOUT", "60".to_string()),
        ("FERRO_DEBUG", "DEBUG".to_string()),
    ]
}

/// Checks that a job run with [`algo_env`] used `algo`: rank 0 logged choices forced to it
/// and none that fell back to another algorithm.
pub fn assert_algo_used(out: &Finished, algo: &str) {
    let tuning = out.tagged("TUNING: ");
    let forced = format!("algo={algo} ");
    let used = tuning
        .iter()
        .filter(|l| l.contains(&forced) && l.contains(&format!("(FERRO_ALGO={algo})")))
        .count();
    assert!(used > 0, "FERRO_ALGO={algo} was never used: {tuning:?}");
    let fallbacks: Vec<&String> = tuning.iter().filter(|l| l.contains("cannot")).collect();
    assert!(fallbacks.is_empty(), "FERRO_ALGO={algo}: {fallbacks:?}");
}

/// A rank of a conformance sweep job: checks that every peer is reached over `transport`,
/// runs the sweep named by [`SWEEP_VAR`] (seed `1000 * nranks + salt`) and prints
/// `CASES rank=R nranks=N cases=C`.
pub fn sweep_rank(transport: &str, salt: u64) {
    let comm = ferroccl::Communicator::from_env().expect("from_env");
    for p in (0..comm.nranks()).filter(|&p| p != comm.rank()) {
        assert_eq!(
            comm.transport(p),
            Some(transport),
            "rank {} to {p}",
            comm.rank()
        );
    }
    let sweep = sweep_named(&env_var::<String>(SWEEP_VAR));
    let seed = 1000 * comm.nranks() as u64 + salt;
    match super::conformance::run_sweep(&comm, &sweep, seed) {
        Ok(cases) => println!(
            "CASES rank={} nranks={} cases={cases}",
            comm.rank(),
            comm.nranks()
        ),
        Err(e) => panic!("nranks {}, rank {}: {e}", comm.nranks(), comm.rank()),
    }
    comm.destroy().expect("destroy");
}

/// Checks a job of [`sweep_rank`]s: it succeeded, and each of ranks `0..n` ran every case of
/// sweep `name`. Returns the cases per rank.
pub fn check_sweep_job(out: &Finished, n: usize, name: &str) -> usize {
    assert!(out.success(), "nranks {n}, sweep {name}: {}", out.dump());
    let want = expected_cases(&sweep_named(name));
    let lines = out.tagged("CASES ");
    let ranks: std::collections::BTreeSet<usize> = lines.iter().map(|l| field(l, "rank")).collect();
    assert_eq!(ranks, (0..n).collect(), "{}", out.dump());
    for l in &lines {
        assert_eq!(field::<usize>(l, "cases"), want, "{l}");
    }
    want
}

/// How many cases [`super::conformance::run_sweep`] runs for `sweep` (on every rank).
pub fn expected_cases(sweep: &Sweep) -> usize {
    sweep
        .colls
        .iter()
        .map(|&coll| {
            let reduces = matches!(coll, "all_reduce" | "reduce" | "reduce_scatter");
            let ops = if reduces { sweep.ops.len() } else { 1 };
            let modes = if coll == "send_recv" { 1 } else { 2 };
            sweep.dtypes.len() * ops * sweep.counts.len() * modes
        })
        .sum()
}

/// This test binary, running only the test `test` with its output shown.
pub fn self_args(test: &str) -> Vec<String> {
    let exe = std::env::current_exe().expect("current_exe");
    vec![
        exe.to_string_lossy().into_owned(),
        "--exact".into(),
        test.into(),
        "--nocapture".into(),
        "--test-threads".into(),
        "1".into(),
    ]
}

/// A command that runs this test binary's test `test` in role `role`, with `env` added.
pub fn self_command(test: &str, role: &str, env: &[(&str, String)]) -> Command {
    let args = self_args(test);
    let mut cmd = Command::new(&args[0]);
    cmd.args(&args[1..])
        .env(ROLE_VAR, role)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    cmd
}

/// A free TCP port on the loopback interface (free when this returns; good enough for tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port()
}

/// What a finished (or stopped) child produced.
#[derive(Debug)]
pub struct Finished {
    /// Exit status; `None` only when the child could not be reaped even after SIGKILL.
    pub status: Option<ExitStatus>,
    /// True when the child ran past its limit and was stopped.
    pub timed_out: bool,
    /// How long it ran.
    pub took: Duration,
    pub stdout: String,
    pub stderr: String,
}

/// Everything each child printed, one after another, for assertion messages; `label` names
/// what the children are (`rank`, `process`).
pub fn dump_all(label: &str, outs: &[Finished]) -> String {
    outs.iter()
        .enumerate()
        .map(|(i, o)| format!("=== {label} {i}: {}", o.dump()))
        .collect::<Vec<_>>()
        .join("\n")
}

impl Finished {
    /// True when it exited with status 0 in time.
    pub fn success(&self) -> bool {
        !self.timed_out && self.status.is_some_and(|s| s.success())
    }

    /// Everything it printed, for assertion messages.
    pub fn dump(&self) -> String {
        format!(
            "status {:?}, timed out {}, took {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status, self.timed_out, self.took, self.stdout, self.stderr
        )
    }

    /// Lines of stdout and stderr that contain `tag`, from `tag` on.
    pub fn tagged(&self, tag: &str) -> Vec<String> {
        self.stdout
            .lines()
            .chain(self.stderr.lines())
            .filter_map(|l| l.find(tag).map(|i| l[i..].to_string()))
            .collect()
    }
}

/// A started child whose output is being collected.
#[derive(Debug)]
pub struct Running {
    child: Child,
    start: Instant,
    readers: Vec<(mpsc::Receiver<String>, JoinHandle<()>)>,
}

fn collect(mut from: impl Read + Send + 'static) -> (mpsc::Receiver<String>, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = from.read_to_end(&mut buf);
        let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
    });
    (rx, h)
}

impl Running {
    /// Starts `cmd` with stdin closed and stdout/stderr collected.
    pub fn spawn(mut cmd: Command) -> Running {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        let out = collect(child.stdout.take().expect("piped stdout"));
        let err = collect(child.stderr.take().expect("piped stderr"));
        Running {
            child,
            start: Instant::now(),
            readers: vec![out, err],
        }
    }

    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Waits until the child exits or `limit` (from its start) passes; then stops it: SIGTERM,
    /// and SIGKILL if it is still there after a grace period.
    pub fn finish(mut self, limit: Duration) -> Finished {
        let mut timed_out = false;
        let mut status = None;
        while status.is_none() {
            match self.child.try_wait() {
                Ok(Some(s)) => status = Some(s),
                Ok(None) if self.start.elapsed() >= limit => {
                    timed_out = true;
                    status = self.stop();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => panic!("waiting for child {}: {e}", self.child.id()),
            }
        }
        let took = self.start.elapsed();
        let mut texts = Vec::new();
        for (rx, h) in self.readers {
            // A grandchild that kept the pipe open must not hang the test either.
            texts.push(rx.recv_timeout(Duration::from_secs(10)).unwrap_or_default());
            drop(h);
        }
        Finished {
            status,
            timed_out,
            took,
            stdout: texts.remove(0),
            stderr: texts.remove(0),
        }
    }

    fn stop(&mut self) -> Option<ExitStatus> {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SIGTERM lets ferrorun stop its ranks before it exits.
            // SAFETY: kill(2) on the pid of our own unreaped child; no memory is involved.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let t = Instant::now();
        while t.elapsed() < TERM_GRACE {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        self.child.wait().ok()
    }
}

/// Runs `ferrorun -n N [--netns LIST] --timeout LIMIT -- <this binary> --exact TEST ...` in
/// role `role` with `env` added, waiting at most `limit` plus a grace period.
pub fn ferrorun_self(
    nranks: usize,
    netns: Option<&str>,
    test: &str,
    role: &str,
    env: &[(&str, String)],
    limit: Duration,
) -> Finished {
    let mut cmd = Command::new(FERRORUN);
    cmd.arg("-n").arg(nranks.to_string());
    if let Some(list) = netns {
        cmd.arg("--netns").arg(list);
    }
    cmd.arg("--timeout")
        .arg(limit.as_secs().max(1).to_string())
        .arg("--")
        .args(self_args(test))
        .env(ROLE_VAR, role)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    Running::spawn(cmd).finish(limit + Duration::from_secs(15))
}

/// The `key=value` word of `line`, parsed.
pub fn field<T: std::str::FromStr>(line: &str, key: &str) -> T {
    let prefix = format!("{key}=");
    let word = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"));
    word.parse()
        .unwrap_or_else(|_| panic!("{key}={word:?} does not parse in {line:?}"))
}

/// True while a process with this id exists (and is not a zombie).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Jobs of one test file run one at a time (2 cores; timing assertions need them): hold the
/// guard for the test's length.
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Milliseconds since the epoch: comparable across the processes of this machine.
pub fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// The `FERRO_*` environment of rank `rank` of a hand-started job meeting at `store`.
pub fn rank_env(
    rank: usize,
    nranks: usize,
    store: SocketAddr,
    timeout_s: u32,
) -> Vec<(&'static str, String)> {
    vec![
        ("FERRO_RANK", rank.to_string()),
        ("FERRO_NRANKS", nranks.to_string()),
        ("FERRO_STORE_ADDR", store.to_string()),
        ("FERRO_TIMEOUT", timeout_s.to_string()),
    ]
}

/// Runs child test `test` in role `role` with the host stand-ins of both the device and the
/// p2p providers, the p2p transport only, and `extra` settings; waits up to `secs` and asserts
/// it succeeded.
pub fn standin_p2p_child(test: &str, role: &str, extra: &[(&str, String)], secs: u64) -> Finished {
    let mut env = vec![
        (ferroccl::device::PROVIDER_ENV, "host".to_string()),
        ("FERRO_P2P_PROVIDER", "host".to_string()),
        ("FERRO_TRANSPORTS", "p2p".to_string()),
    ];
    env.extend(extra.iter().cloned());
    let out = Running::spawn(self_command(test, role, &env)).finish(Duration::from_secs(secs));
    assert!(out.success(), "{}", out.dump());
    out
}
