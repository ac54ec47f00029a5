//! The perf tools on device buffers (`-B 1`) with the host stand-in provider
//! (`FERRO_DEVICE_PROVIDER=host`), launched by `ferrorun` (built from the root package if the
//! target folder does not hold it yet): every row must have 0 wrong elements and the device
//! lines must name the stand-in. Without a driver, `-B 1` with the `cuda` provider must fail
//! with the driver's message, not a panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

const LAUNCH_PREFIXES: &[&str] = &["FERRO_", "SLURM_", "OMPI_", "PMIX_"];
const LAUNCH_VARS: &[&str] = &[
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
];

/// `target/<profile>/ferrorun`, built with cargo when missing.
fn ferrorun() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let tool = PathBuf::from(env!("CARGO_BIN_EXE_all_reduce_perf"));
        let path = tool.with_file_name("ferrorun");
        if !path.exists() {
            let cargo = option_env!("CARGO").unwrap_or("cargo");
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
            let out = Command::new(cargo)
                .current_dir(&root)
                .args(["build", "--quiet", "-p", "ferroccl", "--bin", "ferrorun"])
                .output()
                .expect("running cargo build for ferrorun");
            assert!(
                out.status.success(),
                "building ferrorun failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(path.exists(), "no ferrorun at {path:?}");
        path
    })
}

/// A command with no launcher variables inherited.
fn command(bin: &Path) -> Command {
    let mut cmd = Command::new("timeout");
    cmd.arg("120").arg(bin);
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

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// What a `ferrorun` job printed, without the `[rank] ` that ferrorun puts before every line.
fn unprefixed(o: &Output) -> String {
    text(o)
        .lines()
        .map(|l| l.split_once("] ").map_or(l, |(_, rest)| rest))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn all_reduce_perf_on_stand_in_device_buffers_under_ferrorun() {
    let sweep = ["-b", "8", "-e", "1M", "-f", "2", "-n", "2", "-w", "1"];
    // Over p2p the collectives run on the device buffers themselves (no host staging).
    for (n, dtype, transports) in [
        ("2", "float", "shm"),
        ("3", "int64", "shm"),
        ("3", "float", "p2p"),
    ] {
        let out = command(ferrorun())
            .args(["-n", n, "--"])
            .arg(env!("CARGO_BIN_EXE_all_reduce_perf"))
            .args(sweep)
            .args(["-d", dtype, "-B", "1"])
            .env("FERRO_DEVICE_PROVIDER", "host")
            .env("FERRO_P2P_PROVIDER", "host")
            .env("FERRO_TRANSPORTS", transports)
            .output()
            .expect("running ferrorun");
        let t = unprefixed(&out);
        assert!(out.status.success(), "{n} ranks: exit {}\n{t}", out.status);
        assert!(
            t.lines().any(|l| l == "# Out of bounds values : 0 OK"),
            "{n} ranks: footer\n{t}"
        );
        let rows: Vec<Vec<&str>> = t
            .lines()
            .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
            .map(|l| l.split_whitespace().collect())
            .collect();
        // 8, 16, 32, ... 1M bytes: 18 sizes.
        assert_eq!(rows.len(), 18, "{n} ranks: rows\n{t}");
        for row in &rows {
            assert_eq!(row[8], "0", "{n} ranks: out-of-place #wrong in {row:?}");
            assert_eq!(row[12], "0", "{n} ranks: in-place #wrong in {row:?}");
        }
        let devices: Vec<&str> = t.lines().filter(|l| l.starts_with("#  Rank")).collect();
        assert_eq!(devices.len(), n.parse::<usize>().unwrap(), "{t}");
        for (r, l) in devices.iter().enumerate() {
            assert!(
                l.ends_with(&format!("device  {r} [stand-in] host stand-in device {r}")),
                "device line {l:?}"
            );
        }
    }
}

/// Every collective tool with `-B 1`, 3 ranks as threads, every root; all_reduce also with
/// every dtype and op and misaligned buffers (`-u 3`).
#[test]
fn every_collective_tool_on_stand_in_device_buffers() {
    let tools: [(&str, &str, &[&str]); 10] = [
        (
            "all_reduce_perf",
            env!("CARGO_BIN_EXE_all_reduce_perf"),
            &["-d", "all", "-o", "all", "-u", "3"],
        ),
        (
            "all_gather_perf",
            env!("CARGO_BIN_EXE_all_gather_perf"),
            &[],
        ),
        (
            "broadcast_perf",
            env!("CARGO_BIN_EXE_broadcast_perf"),
            &["-r", "all"],
        ),
        (
            "reduce_perf",
            env!("CARGO_BIN_EXE_reduce_perf"),
            &["-r", "all"],
        ),
        (
            "reduce_scatter_perf",
            env!("CARGO_BIN_EXE_reduce_scatter_perf"),
            &[],
        ),
        ("alltoall_perf", env!("CARGO_BIN_EXE_alltoall_perf"), &[]),
        (
            "sendrecv_perf",
            env!("CARGO_BIN_EXE_sendrecv_perf"),
            &["-u", "3"],
        ),
        (
            "gather_perf",
            env!("CARGO_BIN_EXE_gather_perf"),
            &["-r", "all", "-u", "3"],
        ),
        (
            "scatter_perf",
            env!("CARGO_BIN_EXE_scatter_perf"),
            &["-r", "all", "-u", "3"],
        ),
        // A power of two of ranks; the stand-in's devices 0..4 include the one checked below.
        (
            "hypercube_perf",
            env!("CARGO_BIN_EXE_hypercube_perf"),
            &["-t", "4", "-u", "3"],
        ),
    ];
    for (name, bin, extra) in tools {
        let t = passes_on_3_stand_in_ranks(name, bin, "1", extra, &[]);
        assert!(
            t.contains("[stand-in] host stand-in device 2"),
            "{name}\n{t}"
        );
    }
}

/// Runs perf tool `bin` on 3 thread ranks of the stand-in, 8 B .. 64 KiB, with `-B b`,
/// `extra` arguments and `env`; asserts it exits 0 with 0 wrong elements and returns its
/// output.
fn passes_on_3_stand_in_ranks(
    name: &str,
    bin: &str,
    b: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> String {
    let out = command(Path::new(bin))
        .args([
            "-b", "8", "-e", "64K", "-f", "8", "-n", "2", "-t", "3", "-B", b,
        ])
        .args(extra)
        .env("FERRO_DEVICE_PROVIDER", "host")
        .envs(env.iter().copied())
        .output()
        .expect("running a perf tool");
    let t = text(&out);
    assert!(out.status.success(), "{name}: exit {}\n{t}", out.status);
    assert!(
        t.lines().any(|l| l == "# Out of bounds values : 0 OK"),
        "{name}: footer\n{t}"
    );
    t
}

/// `-B 2`: the collective tools with their calls ordered on a stream (each returns once
/// queued; a timed block ends when the stream has run them), every result checked, in slices
/// of 256 bytes so that the larger calls cycle through the stream's arena many times.
#[test]
fn collective_tools_with_calls_ordered_on_a_stream() {
    let tools: [(&str, &str, &[&str]); 6] = [
        (
            "all_reduce_perf",
            env!("CARGO_BIN_EXE_all_reduce_perf"),
            &["-o", "all", "-u", "3"],
        ),
        (
            "broadcast_perf",
            env!("CARGO_BIN_EXE_broadcast_perf"),
            &["-r", "all"],
        ),
        (
            "reduce_perf",
            env!("CARGO_BIN_EXE_reduce_perf"),
            &["-r", "all"],
        ),
        (
            "all_gather_perf",
            env!("CARGO_BIN_EXE_all_gather_perf"),
            &[],
        ),
        (
            "reduce_scatter_perf",
            env!("CARGO_BIN_EXE_reduce_scatter_perf"),
            &[],
        ),
        ("alltoall_perf", env!("CARGO_BIN_EXE_alltoall_perf"), &[]),
    ];
    for (name, bin, extra) in tools {
        let slices = [("FERRO_DEVICE_SLICE_BYTES", "256")];
        passes_on_3_stand_in_ranks(name, bin, "2", extra, &slices);
    }
}

/// The point-to-point tools (send/recv, gather, scatter, hypercube) on device buffers as
/// processes: over shared memory (host copies) and over the GPU peer-to-peer transport's host
/// provider, which takes the stand-in's device memory itself.
#[test]
fn point_to_point_tools_on_device_buffers_over_shm_and_p2p() {
    let tools = [
        (
            "sendrecv_perf",
            env!("CARGO_BIN_EXE_sendrecv_perf"),
            "2",
            "0",
        ),
        (
            "sendrecv_perf",
            env!("CARGO_BIN_EXE_sendrecv_perf"),
            "3",
            "0",
        ),
        ("gather_perf", env!("CARGO_BIN_EXE_gather_perf"), "3", "1"),
        ("scatter_perf", env!("CARGO_BIN_EXE_scatter_perf"), "3", "2"),
        (
            "hypercube_perf",
            env!("CARGO_BIN_EXE_hypercube_perf"),
            "2",
            "0",
        ),
    ];
    for transport in ["shm", "p2p"] {
        for (name, bin, n, root) in tools {
            let out = command(ferrorun())
                .args(["-n", n, "--"])
                .arg(bin)
                .args([
                    "-b", "8", "-e", "4M", "-f", "8", "-n", "2", "-w", "1", "-B", "1",
                ])
                .args(["-u", "4", "-r", root])
                .env("FERRO_DEVICE_PROVIDER", "host")
                .env("FERRO_P2P_PROVIDER", "host")
                .env("FERRO_TRANSPORTS", transport)
                .output()
                .expect("running ferrorun");
            let t = text(&out);
            let what = format!("{name}, {transport}, {n} ranks");
            assert!(out.status.success(), "{what}: {}\n{t}", out.status);
            assert!(
                t.lines()
                    .any(|l| l.ends_with("# Out of bounds values : 0 OK")),
                "{what}\n{t}"
            );
        }
    }
}

#[test]
fn device_buffers_without_a_driver_are_a_clear_error() {
    let out = command(Path::new(env!("CARGO_BIN_EXE_all_reduce_perf")))
        .args(["-b", "8", "-e", "8", "-B", "1"])
        .env("FERRO_DEVICE_PROVIDER", "cuda")
        .env("FERROCCL_CUDA_DRIVER", "/nonexistent/libcuda.so.1")
        .output()
        .expect("running all_reduce_perf");
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains("device buffers need an NVIDIA driver (libcuda.so.1 not found)"),
        "{t}"
    );
    assert!(!t.contains("panicked"), "{t}");
}

/// Two processes of two threads each (`ferrorun -n 2 all_reduce_perf -t 2 -B 1 -R 2`): ranks
/// of one process are joined by address, of two through the windows' mappings; every row goes
/// between the buffers, with blocking calls and with calls on a stream (`-B 2`: the ranks of
/// one process wait for each other's shared marks as for another process's). On two stand-in
/// devices that do not reach each other
/// (`FERRO_STANDIN_PEER_ACCESS=0`) the windows are kept unusable, the ranks of one process
/// saying their devices do not reach each other, and every row runs the schedule, right.
#[test]
fn windows_of_processes_of_several_threads() {
    let run_on = |b: &str, extra: &[(&str, &str)]| {
        let out = command(ferrorun())
            .args(["-n", "2", "--"])
            .arg(env!("CARGO_BIN_EXE_all_reduce_perf"))
            .args(["-b", "8", "-e", "256K", "-f", "8", "-n", "2", "-w", "1"])
            .args(["-t", "2", "-B", b, "-R", "2"])
            .env("FERRO_DEVICE_PROVIDER", "host")
            .env("FERRO_P2P_PROVIDER", "host")
            .env("FERRO_TRANSPORTS", "p2p")
            .envs(extra.iter().copied())
            .output()
            .expect("running ferrorun");
        let t = unprefixed(&out);
        assert!(out.status.success(), "{}\n{t}", out.status);
        assert!(t.contains("# Out of bounds values : 0 OK"), "{t}");
        t
    };
    let run = |extra: &[(&str, &str)]| run_on("1", extra);
    for b in ["1", "2"] {
        let t = run_on(b, &[]);
        assert!(t.contains("# Calls between the ranks' buffers : "), "{t}");
        let rows: Vec<&str> = t
            .lines()
            .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
            .collect();
        assert!(
            rows.len() == 6 && rows.iter().all(|r| r.ends_with("peer")),
            "-B {b}\n{t}"
        );
    }
    let t = run(&[
        ("FERRO_STANDIN_DEVICES", "2"),
        ("FERRO_STANDIN_PEER_ACCESS", "0"),
    ]);
    assert!(!t.contains("# Calls between the ranks' buffers"), "{t}");
    assert!(
        t.contains("device does not reach this rank's (no peer access)"),
        "{t}"
    );
    // Said once per communicator, not at each of the tool's registrations (one a size).
    let said = t.matches("collectives on it take the schedule").count();
    assert!((1..=4).contains(&said), "{said} warnings\n{t}");
}

/// `all_reduce_perf -B 1 -R 2` under `ferrorun`, 2 and 3 processes over stand-in p2p: the
/// device buffers are registered as windows (again each time they grow), every row goes
/// straight between the processes' buffers (labelled `peer`, counted on the calls line) with
/// no wrong element, with blocking calls (`-B 1`) and calls on a stream (`-B 2`); with `-R 0`
/// none does. Part 8l of `gpu-check.sh` then reads all three through `gpu-targets.sh`; so does
/// part 8n: buffers in no window through scratch windows (every row `peer`, blocking and on a
/// stream) and without them (none), read from the tagged lines `ferrorun` prints.
#[test]
fn windows_of_processes_take_every_row_between_their_buffers_and_part_8l_is_printed() {
    let run_on = |n: &str, register: &str, b: &str| {
        let out = command(ferrorun())
            .args(["-n", n, "--"])
            .arg(env!("CARGO_BIN_EXE_all_reduce_perf"))
            .args(["-b", "8", "-e", "256K", "-f", "8", "-n", "2", "-w", "1"])
            .args(["-B", b, "-R", register])
            .env("FERRO_DEVICE_PROVIDER", "host")
            .env("FERRO_P2P_PROVIDER", "host")
            .env("FERRO_TRANSPORTS", "p2p")
            .output()
            .expect("running ferrorun");
        let t = unprefixed(&out);
        assert!(
            out.status.success(),
            "{n} ranks -R {register} -B {b}: {}\n{t}",
            out.status
        );
        assert!(t.contains("# Out of bounds values : 0 OK"), "{t}");
        t
    };
    let run = |n: &str, register: &str| run_on(n, register, "1");
    for n in ["2", "3"] {
        // Blocking calls, and calls ordered on a stream (queued through the shared marks).
        for t in [run(n, "2"), run_on(n, "2", "2")] {
            let rows: Vec<&str> = t
                .lines()
                .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
                .collect();
            // 8 B .. 256 KiB by x8: 6 sizes.
            assert_eq!(rows.len(), 6, "{t}");
            assert!(
                rows.iter().all(|r| r.ends_with("peer")),
                "{n} ranks: every row between the buffers\n{t}"
            );
            assert!(t.contains("# Calls between the ranks' buffers : "), "{t}");
        }
        let plain = run(n, "0");
        assert!(
            !plain.contains("# Calls between the ranks' buffers"),
            "{plain}"
        );
    }
    let (ring, windows, ordered) = (run("2", "0"), run("2", "2"), run_on("2", "2", "2"));
    // Part 8n: buffers in no window, through scratch windows, blocking and on a stream, and
    // without them; as gpu-check.sh logs them, every line tagged with its rank.
    let scratch = |bytes: &str, b: &str| {
        let out = command(ferrorun())
            .args(["-n", "2", "--"])
            .arg(env!("CARGO_BIN_EXE_all_reduce_perf"))
            .args([
                "-b", "8", "-e", "256K", "-f", "8", "-n", "2", "-w", "1", "-B", b,
            ])
            .env("FERRO_DEVICE_PROVIDER", "host")
            .env("FERRO_P2P_PROVIDER", "host")
            .env("FERRO_TRANSPORTS", "p2p")
            .env("FERRO_DEVICE_SCRATCH_BYTES", bytes)
            .output()
            .expect("running ferrorun");
        let t = text(&out);
        assert!(out.status.success(), "scratch {bytes} -B {b}: {t}");
        let rows = unprefixed(&out);
        let rows: Vec<&str> = rows
            .lines()
            .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
            .collect();
        assert_eq!(rows.len(), 6, "{t}");
        let peer = rows.iter().filter(|r| r.ends_with("peer")).count();
        assert_eq!(
            peer,
            if bytes == "0" { 0 } else { 6 },
            "scratch {bytes} -B {b}: {t}"
        );
        t
    };
    let (plain, through, on_stream) = (scratch("0", "1"), scratch("1M", "1"), scratch("1M", "2"));
    assert!(through.contains("[0] "), "{through}");
    let log = format!(
        "== 1. kernels\n# bandwidth 256 MiB: device-to-device copy 100.0 GB/s (read + written)\n\
         == 8. straight on the device\n-- 8l: -R 0 -B 1, processes, windows\n{ring}\
         -- ferrorun: 1 s\n-- 8l: -R 2 -B 1, processes, windows\n{windows}-- ferrorun: 1 s\n\
         -- 8l: -R 2 -B 2, processes, windows\n{ordered}-- ferrorun: 1 s\n\
         -- 8n: scratch 0 -B 1, processes, no windows\n{plain}-- ferrorun: 1 s\n\
         -- 8n: scratch 1M -B 1, processes, no windows\n{through}-- ferrorun: 1 s\n\
         -- 8n: scratch 1M -B 2, processes, no windows\n{on_stream}-- ferrorun: 1 s\n"
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/gpu-targets.sh");
    let mut child = Command::new("bash")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("running gpu-targets.sh");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(log.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let got = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{got}");
    for want in [
        "-- 8l, 2 processes, ring (-R 0), 256 KiB: ",
        "-- 8l, 2 processes, between the buffers through windows (-R 2), 256 KiB: ",
        "-- 8l, 2 processes, through windows, calls on a stream (-R 2 -B 2), 256 KiB: ",
        "-- 8 B allreduce on device buffers, 2 ranks on one GPU (8l, 2 processes, windows): ",
        "-- 8 B allreduce on device buffers, 2 ranks on one GPU (8l, 2 processes, windows, calls on a stream): ",
        "-- 8 B allreduce on device buffers, 2 ranks on one GPU (8l, 2 processes, -R 0): ",
        "-- 8n, 2 processes, ring (no scratch), 256 KiB: ",
        "-- 8n, 2 processes, through scratch windows (-B 1), 256 KiB: ",
        "-- 8n, 2 processes, through scratch windows, calls on a stream (-B 2), 256 KiB: ",
        "-- 8 B allreduce on device buffers, 2 ranks on one GPU (8n, 2 processes, scratch windows): ",
    ] {
        assert!(got.contains(want), "no {want:?} in\n{got}");
    }
    assert!(
        got.contains("(-R 2), 256 KiB: ") && got.contains("4 x S of traffic"),
        "{got}"
    );
    assert!(got.contains("8 x S of traffic"), "{got}");
}
