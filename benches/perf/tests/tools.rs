//! Every perf tool binary, end to end: a short sweep with 1, 2 and 3 ranks (hypercube: 1, 2
//! and 4), both as `-t N` threads in one process and as N processes joined through the
//! environment a launcher sets (`FERRO_*`, torchrun's, Open MPI's). Each run must exit 0,
//! report `# Out of bounds values : 0 OK`, print the expected number of rows and a `0` in
//! every `#wrong` column. Thread runs use the default transports (shared memory between
//! ranks of one host, then TCP); process runs set `FERRO_TRANSPORTS=tcp`.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// `-b 8 -e 64K -f 8`: 8, 64, 512, 4096, 32768 bytes.
const SWEEP: &[&str] = &["-b", "8", "-e", "64K", "-f", "8", "-n", "2", "-w", "1"];
const SIZES: usize = 5;
/// Longest a single run may take before the test kills it and fails.
const RUN_LIMIT: Duration = Duration::from_secs(60);

/// Variables of every launcher ferroccl understands: removed from the children so that only
/// what a test sets is seen.
const LAUNCH_PREFIXES: &[&str] = &["FERRO_", "SLURM_", "OMPI_", "PMIX_"];
const LAUNCH_VARS: &[&str] = &[
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
];

/// One tool and the flags its runs take.
struct Tool {
    bin: &'static str,
    /// Extra flags for thread runs and for process runs (data type, op, root).
    thread_flags: &'static [&'static str],
    process_flags: &'static [&'static str],
    rank_counts: &'static [usize],
}

/// Rows a run with `flags` prints: sizes × ops (`-o all`: 6) × roots (`-r all`: every rank).
fn rows(flags: &[&str], nranks: usize) -> usize {
    let has = |flag: &str, value: &str| flags.windows(2).any(|w| w == [flag, value]);
    let ops = if has("-o", "all") { 6 } else { 1 };
    let roots = if has("-r", "all") { nranks } else { 1 };
    SIZES * ops * roots
}

/// A unique job name per run, so parallel tests never share a store or a file.
fn job_id(tag: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "perf-tools-{}-{tag}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

/// A command for `bin` with no launcher variables inherited and a short stall timeout.
fn command(bin: &str) -> Command {
    let mut cmd = Command::new(bin);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if LAUNCH_PREFIXES.iter().any(|p| k.starts_with(p)) || LAUNCH_VARS.contains(&k.as_str()) {
            cmd.env_remove(&k);
        }
    }
    cmd.env("FERRO_TIMEOUT", "30")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Waits for every child (killing all of them past [`RUN_LIMIT`]) and returns their outputs
/// in rank order.
fn wait_all(children: Vec<Child>, what: &str) -> Vec<Output> {
    let deadline = Instant::now() + RUN_LIMIT;
    let mut children: Vec<Option<Child>> = children.into_iter().map(Some).collect();
    loop {
        let mut running = 0;
        for c in children.iter_mut().flatten() {
            if c.try_wait().unwrap().is_none() {
                running += 1;
            }
        }
        if running == 0 {
            break;
        }
        if Instant::now() > deadline {
            for c in children.iter_mut().flatten() {
                let _ = c.kill();
            }
            let outs: Vec<String> = children
                .into_iter()
                .flatten()
                .map(|c| {
                    let o = c.wait_with_output().unwrap();
                    format!("{}{}", lossy(&o.stdout), lossy(&o.stderr))
                })
                .collect();
            panic!(
                "{what}: still running after {RUN_LIMIT:?}\n{}",
                outs.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    children
        .into_iter()
        .map(|c| c.unwrap().wait_with_output().unwrap())
        .collect()
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs `nranks` processes of `bin`; `env(rank)` gives each its launcher variables.
fn run_processes(
    bin: &str,
    args: &[&str],
    nranks: usize,
    env: &dyn Fn(usize) -> Vec<(String, String)>,
    what: &str,
) -> Vec<Output> {
    let children = (0..nranks)
        .map(|r| {
            let mut cmd = command(bin);
            cmd.args(args).envs(env(r));
            cmd.spawn()
                .unwrap_or_else(|e| panic!("{what}: starting {bin}: {e}"))
        })
        .collect();
    wait_all(children, what)
}

/// Every launch of `nranks` processes with the `FERRO_*` variables `ferrorun` sets.
fn ferro_env(nranks: usize, tag: &str) -> impl Fn(usize) -> Vec<(String, String)> {
    let store = format!("127.0.0.1:{}", free_port());
    let job = job_id(tag);
    move |r| {
        vec![
            ("FERRO_RANK".into(), r.to_string()),
            ("FERRO_NRANKS".into(), nranks.to_string()),
            ("FERRO_LOCAL_RANK".into(), r.to_string()),
            ("FERRO_LOCAL_NRANKS".into(), nranks.to_string()),
            ("FERRO_STORE_ADDR".into(), store.clone()),
            ("FERRO_JOB_ID".into(), job.clone()),
            // Thread runs take the default transports (shared memory first); process runs
            // go over TCP.
            ("FERRO_TRANSPORTS".into(), "tcp".into()),
        ]
    }
}

/// Checks rank 0's table: exit status 0 everywhere, the footer, `rows` rows, no wrong element.
/// Ranks other than 0 print nothing on stdout.
fn check_outputs(outs: &[Output], rows: usize, what: &str) -> String {
    let text = lossy(&outs[0].stdout);
    for (r, o) in outs.iter().enumerate() {
        assert!(
            o.status.success(),
            "{what}: rank {r} exited with {}\nstdout:\n{}\nstderr:\n{}",
            o.status,
            lossy(&o.stdout),
            lossy(&o.stderr)
        );
        if r > 0 {
            assert!(
                o.stdout.is_empty(),
                "{what}: rank {r} printed\n{}",
                lossy(&o.stdout)
            );
        }
    }
    check_table(&text, rows, what);
    text
}

fn check_table(text: &str, rows: usize, what: &str) {
    assert!(
        text.lines().any(|l| l == "# Out of bounds values : 0 OK"),
        "{what}: no '0 OK' footer\n{text}"
    );
    let data: Vec<Vec<&str>> = text
        .lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(data.len(), rows, "{what}: row count\n{text}");
    for row in &data {
        // size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong | algo
        assert_eq!(row.len(), 14, "{what}: row {row:?}");
        let names = [
            "p2p", "ring", "chain", "pairwise", "tree", "rd", "rhd", "hier", "binomial", "lane",
        ];
        assert!(
            names.contains(&row[13]),
            "{what}: algorithm column of {row:?}"
        );
        assert_eq!(row[8], "0", "{what}: out-of-place #wrong in {row:?}");
        assert_eq!(row[12], "0", "{what}: in-place #wrong in {row:?}");
        for col in [5, 6, 7, 9, 10, 11] {
            let v: f64 = row[col]
                .parse()
                .unwrap_or_else(|e| panic!("{what}: column {col} of {row:?}: {e}"));
            assert!(v >= 0.0 && v.is_finite(), "{what}: {row:?}");
        }
    }
}

fn exe(tool: &Tool) -> &'static str {
    match tool.bin {
        "all_reduce_perf" => env!("CARGO_BIN_EXE_all_reduce_perf"),
        "all_gather_perf" => env!("CARGO_BIN_EXE_all_gather_perf"),
        "broadcast_perf" => env!("CARGO_BIN_EXE_broadcast_perf"),
        "reduce_perf" => env!("CARGO_BIN_EXE_reduce_perf"),
        "reduce_scatter_perf" => env!("CARGO_BIN_EXE_reduce_scatter_perf"),
        "alltoall_perf" => env!("CARGO_BIN_EXE_alltoall_perf"),
        "sendrecv_perf" => env!("CARGO_BIN_EXE_sendrecv_perf"),
        "gather_perf" => env!("CARGO_BIN_EXE_gather_perf"),
        "scatter_perf" => env!("CARGO_BIN_EXE_scatter_perf"),
        "hypercube_perf" => env!("CARGO_BIN_EXE_hypercube_perf"),
        other => panic!("unknown tool {other}"),
    }
}

/// The thread runs and the process runs of `tool`, for each of its rank counts.
fn exercise(tool: &Tool) {
    let bin = exe(tool);
    for &n in tool.rank_counts {
        let what = format!("{} -t {n}", tool.bin);
        let nthreads = n.to_string();
        let mut args: Vec<&str> = SWEEP.to_vec();
        args.extend(["-t", nthreads.as_str()]);
        args.extend(tool.thread_flags);
        let outs = run_processes(bin, &args, 1, &|_| Vec::new(), &what);
        let text = check_outputs(&outs, rows(tool.thread_flags, n), &what);
        assert!(
            text.contains(&format!("# nThread {n} nGpus 1")),
            "{what}\n{text}"
        );

        let what = format!("{} as {n} processes", tool.bin);
        let mut args: Vec<&str> = SWEEP.to_vec();
        args.extend(tool.process_flags);
        let env = ferro_env(n, tool.bin);
        let outs = run_processes(bin, &args, n, &env, &what);
        let text = check_outputs(&outs, rows(tool.process_flags, n), &what);
        // One device line per rank, each from its own process.
        let pids: std::collections::BTreeSet<&str> = text
            .lines()
            .filter(|l| l.starts_with("#  Rank"))
            .filter_map(|l| l.split_whitespace().nth(6))
            .collect();
        assert_eq!(pids.len(), n, "{what}: pids\n{text}");
    }
}

const ONE_TO_THREE: &[usize] = &[1, 2, 3];

#[test]
fn all_reduce_perf() {
    exercise(&Tool {
        bin: "all_reduce_perf",
        thread_flags: &["-d", "float", "-o", "all"],
        process_flags: &["-d", "int64", "-o", "prod"],
        rank_counts: ONE_TO_THREE,
    });
}

#[test]
fn all_gather_perf() {
    exercise(&Tool {
        bin: "all_gather_perf",
        thread_flags: &["-d", "half"],
        process_flags: &["-d", "uint8"],
        rank_counts: ONE_TO_THREE,
    });
}

#[test]
fn broadcast_perf() {
    exercise(&Tool {
        bin: "broadcast_perf",
        thread_flags: &["-d", "double", "-r", "all"],
        process_flags: &["-d", "bfloat16", "-r", "all"],
        rank_counts: ONE_TO_THREE,
    });
}

#[test]
fn reduce_perf() {
    exercise(&Tool {
        bin: "reduce_perf",
        thread_flags: &["-d", "int32", "-o", "max", "-r", "all"],
        process_flags: &["-d", "bfloat16", "-o", "sum", "-r", "all"],
        rank_counts: ONE_TO_THREE,
    });
}

#[test]
fn reduce_scatter_perf() {
    exercise(&Tool {
        bin: "reduce_scatter_perf",
        thread_flags: &["-d", "half", "-o", "avg"],
        process_flags: &["-d", "uint64", "-o", "min"],
        rank_counts: ONE_TO_THREE,
    });
}

#[test]
fn alltoall_perf() {
    exercise(&Tool {
        bin: "alltoall_perf",
        thread_flags: &["-d", "int8"],
        process_flags: &["-d", "float"],
        rank_counts: ONE_TO_THREE,
    });
}

#[test]
fn sendrecv_perf() {
    exercise(&Tool {
        bin: "sendrecv_perf",
        thread_flags: &["-d", "uint32"],
        process_flags: &["-d", "double"],
        rank_counts: ONE_TO_THREE,
    });
}

#[test]
fn gather_perf() {
    exercise(&Tool {
        bin: "gather_perf",
        thread_flags: &["-d", "float", "-r", "all"],
        process_flags: &["-d", "int32", "-r", "all"],
        rank_counts: ONE_TO_THREE,
    });
}

#[test]
fn scatter_perf() {
    exercise(&Tool {
        bin: "scatter_perf",
        thread_flags: &["-d", "int64", "-r", "all"],
        process_flags: &["-d", "half", "-r", "all"],
        rank_counts: ONE_TO_THREE,
    });
}

#[test]
fn hypercube_perf() {
    exercise(&Tool {
        bin: "hypercube_perf",
        thread_flags: &["-d", "float"],
        process_flags: &["-d", "uint8"],
        rank_counts: &[1, 2, 4],
    });
}

#[test]
fn hypercube_perf_skips_three_ranks() {
    let bin = env!("CARGO_BIN_EXE_hypercube_perf");
    let mut args = SWEEP.to_vec();
    args.extend(["-t", "3"]);
    let outs = run_processes(bin, &args, 1, &|_| Vec::new(), "hypercube_perf -t 3");
    let text = lossy(&outs[0].stdout);
    assert!(outs[0].status.success(), "{text}");
    assert!(
        text.contains("nRanks 3 is not a power of 2, skipping"),
        "{text}"
    );
}

const ALL_REDUCE: &[&str] = &["-d", "int32", "-o", "sum"];

#[test]
fn all_reduce_perf_under_torchrun_env() {
    let bin = env!("CARGO_BIN_EXE_all_reduce_perf");
    // torchrun's own store is on MASTER_PORT; ferroccl's listens on MASTER_PORT + 1.
    let store_port = free_port();
    let master_port = (store_port - 1).to_string();
    let env = |r: usize| -> Vec<(String, String)> {
        [
            ("RANK", r.to_string()),
            ("WORLD_SIZE", "2".into()),
            ("LOCAL_RANK", r.to_string()),
            ("LOCAL_WORLD_SIZE", "2".into()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", master_port.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    };
    let mut args = SWEEP.to_vec();
    args.extend(ALL_REDUCE);
    let outs = run_processes(bin, &args, 2, &env, "all_reduce_perf under torchrun env");
    check_outputs(&outs, SIZES, "all_reduce_perf under torchrun env");
}

#[test]
fn all_reduce_perf_under_open_mpi_env() {
    let bin = env!("CARGO_BIN_EXE_all_reduce_perf");
    // Every rank on one host and no address: the ranks meet through a file store named
    // after the job.
    let job = job_id("ompi");
    let env = |r: usize| -> Vec<(String, String)> {
        [
            ("OMPI_COMM_WORLD_RANK", r.to_string()),
            ("OMPI_COMM_WORLD_SIZE", "2".into()),
            ("OMPI_COMM_WORLD_LOCAL_RANK", r.to_string()),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2".into()),
            ("PMIX_NAMESPACE", job.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    };
    let mut args = SWEEP.to_vec();
    args.extend(ALL_REDUCE);
    let outs = run_processes(bin, &args, 2, &env, "all_reduce_perf under Open MPI env");
    check_outputs(&outs, SIZES, "all_reduce_perf under Open MPI env");
}

#[test]
fn all_reduce_perf_under_one_node_slurm_env() {
    let bin = env!("CARGO_BIN_EXE_all_reduce_perf");
    // srun -n 3 on one node, no address: the ranks meet through a file store named after the
    // job and step, as under mpirun.
    let job = job_id("slurm");
    let env = |r: usize| -> Vec<(String, String)> {
        [
            ("SLURM_PROCID", r.to_string()),
            ("SLURM_NTASKS", "3".into()),
            ("SLURM_LOCALID", r.to_string()),
            ("SLURM_NODEID", "0".into()),
            ("SLURM_STEP_NUM_NODES", "1".into()),
            ("SLURM_STEP_TASKS_PER_NODE", "3".into()),
            ("SLURM_JOB_ID", job.clone()),
            ("SLURM_STEP_ID", "0".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    };
    let mut args = SWEEP.to_vec();
    args.extend(ALL_REDUCE);
    let outs = run_processes(
        bin,
        &args,
        3,
        &env,
        "all_reduce_perf under one-node SLURM env",
    );
    check_outputs(&outs, SIZES, "all_reduce_perf under one-node SLURM env");
    // The job's store directory is gone with its last rank.
    let dir = format!("/tmp/ferroccl-slurm-{job}.0");
    assert!(!Path::new(&dir).exists(), "{dir} was left behind");
}

#[test]
fn json_output_parses() {
    let bin = env!("CARGO_BIN_EXE_all_reduce_perf");
    let dir = std::env::temp_dir().join(job_id("json"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("out.json");
    let path_s = path.to_str().unwrap();
    let mut args = SWEEP.to_vec();
    args.extend(["-t", "2", "-J", path_s]);
    let outs = run_processes(bin, &args, 1, &|_| Vec::new(), "all_reduce_perf -J");
    let text = check_outputs(&outs, SIZES, "all_reduce_perf -J");
    let json = read_json(&path, &text);
    let results = json["results"].as_array().unwrap();
    assert_eq!(results.len(), SIZES, "{json}");
    let sizes: Vec<u64> = results
        .iter()
        .map(|r| r["size"].as_u64().unwrap_or_else(|| panic!("{r}")))
        .collect();
    assert_eq!(sizes, [8, 64, 512, 4096, 32768]);
    for r in results {
        assert_eq!(r["out_of_place"]["nwrong"].as_f64(), Some(0.0), "{r}");
        assert_eq!(r["in_place"]["nwrong"].as_f64(), Some(0.0), "{r}");
        assert!(r["out_of_place"]["bus_bw"].as_f64().is_some(), "{r}");
    }
    assert_eq!(json["out_of_bounds"]["count"].as_u64(), Some(0), "{json}");
    assert_eq!(json["config"]["nthreads"].as_u64(), Some(2), "{json}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn read_json(path: &Path, text: &str) -> serde_json::Value {
    let raw = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading {}: {e}\n{text}", path.display()));
    serde_json::from_str(&raw).unwrap_or_else(|e| panic!("{e}\n{raw}"))
}

#[test]
fn wrong_flag_exits_2() {
    let bin = env!("CARGO_BIN_EXE_all_reduce_perf");
    let outs = run_processes(bin, &["-d", "float128"], 1, &|_| Vec::new(), "bad flag");
    assert_eq!(outs[0].status.code(), Some(2), "{}", lossy(&outs[0].stderr));
    assert!(lossy(&outs[0].stderr).contains("invalid datatype 'float128'"));
}

/// `-R 1`: buffers in shared memory, ranks as processes over the shared-memory transport, so
/// every message of 512 KiB or more is read by the receiving process straight from the
/// sender's buffer (mapped through `/proc/<pid>/fd`). Sizes up to 4 MiB (beyond one ring),
/// misaligned buffers, 2 and 3 ranks; no rank may have fallen back to the ring.
#[test]
fn shared_buffers_across_processes() {
    let tools = [
        ("all_reduce_perf", &["-d", "float", "-o", "sum"][..]),
        ("all_reduce_perf", &["-d", "int64", "-o", "max"][..]),
        ("reduce_scatter_perf", &["-d", "float"][..]),
        ("all_gather_perf", &[][..]),
        ("broadcast_perf", &["-r", "all"][..]),
        ("alltoall_perf", &[][..]),
        ("sendrecv_perf", &[][..]),
    ];
    for (name, flags) in tools {
        for n in [2, 3] {
            let what = format!("{name} -R 1 as {n} processes");
            let mut args = vec![
                "-b", "8", "-e", "4M", "-f", "8", "-n", "2", "-w", "1", "-u", "4", "-R", "1",
            ];
            args.extend(flags);
            let store_env = ferro_env(n, name);
            let env = move |r| {
                let mut e = store_env(r);
                e.retain(|(k, _)| k != "FERRO_TRANSPORTS");
                e.push(("FERRO_TRANSPORTS".into(), "shm".into()));
                e
            };
            let tool = Tool {
                bin: name,
                thread_flags: &[],
                process_flags: &[],
                rank_counts: &[],
            };
            let outs = run_processes(exe(&tool), &args, n, &env, &what);
            // 8 B .. 2 MiB by 8: 7 sizes.
            check_outputs(&outs, 7 * rows(flags, n) / SIZES, &what);
            for (r, o) in outs.iter().enumerate() {
                let err = lossy(&o.stderr);
                assert!(!err.contains("cannot map"), "{what}: rank {r}\n{err}");
            }
        }
    }
}
