//! `scripts/gpu-targets.sh`, which prints the CUDA speed targets against the figures of one
//! `scripts/gpu-check.sh` run, and gpu-check's own use of it: the script must read the rows
//! the perf tools really print (checked here on the host stand-in's device buffers), and
//! gpu-check must sum up its run and keep its exit status (checked on a bundle of stand-in
//! programs that print what the GPU tools print).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A fresh folder under the system's temporary folder.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferroccl-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating a scratch folder");
    dir
}

/// Runs `gpu-targets.sh` on `log` and returns what it printed.
fn targets(log: &str) -> String {
    // A folder of each call's own: the tests of this file run at once.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let k = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = scratch(&format!("gpu-targets-log-{k}"));
    let path = dir.join("gpu-check.log");
    std::fs::write(&path, log).expect("writing the log");
    let out = Command::new("bash")
        .arg(root().join("scripts/gpu-targets.sh"))
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .expect("running gpu-targets.sh");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "gpu-targets.sh exit {}: {}{text}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
    text
}

/// The line of `text` that starts with `prefix`.
fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix:?} in:\n{text}"))
}

/// The perf tool's row for `size` bytes, split into fields.
fn row(table: &str, size: u64) -> Vec<f64> {
    table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() >= 13 && f[0] == size.to_string())
        .unwrap_or_else(|| panic!("no row of {size} bytes in:\n{table}"))
        .iter()
        .map(|f| f.parse().unwrap_or(f64::NAN))
        .collect()
}

/// The numbers of `line` after the first `from`.
fn numbers_after(line: &str, from: &str) -> Vec<f64> {
    let at = line.find(from).map_or(0, |i| i + from.len());
    line[at..]
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|w| w.trim_matches('.').parse().ok())
        .collect()
}

/// Asserts `got` holds `want`, each as printed (to 1 decimal or to a whole number).
fn close(got: &[f64], want: &[f64], line: &str) {
    assert_eq!(
        got.len(),
        want.len(),
        "{got:?} against {want:?} in {line:?}"
    );
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= 0.51, "{g} against {w} in {line:?}");
    }
}

/// What `all_reduce_perf` prints for sizes `b` to `e` by x8 on 2 thread ranks of stand-in
/// device buffers, blocking, with `env` added; it must pass.
fn all_reduce_perf(b: &str, e: &str, env: &[(&str, &str)]) -> String {
    all_reduce_perf_b(b, e, "1", env)
}

/// [`all_reduce_perf`] with `-B device_buffers` (`2`: calls ordered on a stream).
fn all_reduce_perf_b(b: &str, e: &str, device_buffers: &str, env: &[(&str, &str)]) -> String {
    let out = Command::new("timeout")
        .arg("120")
        .arg(env!("CARGO_BIN_EXE_all_reduce_perf"))
        .args([
            "-b",
            b,
            "-e",
            e,
            "-f",
            "8",
            "-n",
            "2",
            "-t",
            "2",
            "-B",
            device_buffers,
        ])
        .env("FERRO_DEVICE_PROVIDER", "host")
        .env("FERRO_TIMEOUT", "30")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("running all_reduce_perf");
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "all_reduce_perf: {}\n{table}",
        out.status
    );
    table
}

#[test]
fn the_targets_are_read_from_the_rows_all_reduce_perf_prints() {
    let table = all_reduce_perf("8", "32K", &[]);
    let copy = 100.0;
    let log = format!(
        "== 1. kernels\n# bandwidth 256 MiB: device-to-device copy {copy:.1} GB/s (read + written)\n\
         -- ferro-gpu-check: 3 s\n== 8. straight on the device\n\
         -- 8b. threads, FERRO_DEVICE_DIRECT=1\n{table}-- all_reduce_perf: 1 s\n\
         -- 8b. threads, FERRO_DEVICE_DIRECT=0\n"
    );
    let got = targets(&log);
    assert!(got.contains("-- copy rate: 100 GB/s"), "{got}");

    // The largest size of the sweep stands for 256 MiB, said so; 9 x S bytes in the faster
    // of out of place and in place.
    let big = row(&table, 32768);
    let t = if big[9] > 0.0 && big[9] < big[5] {
        big[9]
    } else {
        big[5]
    };
    let traffic = 9.0 * 32768.0 / (t * 1e3);
    let p2p = line(
        &got,
        "-- p2p allreduce, 2 ranks on one GPU, 32 KiB (8b, direct, ring): ",
    );
    assert!(p2p.contains("(the target is set at 256 MiB)"), "{p2p}");
    // Out of place, in place, 9, the faster, its traffic, 256, % of copy, 60.
    let want = [
        big[5],
        big[9],
        9.0,
        t,
        traffic,
        256.0,
        100.0 * traffic / copy,
        60.0,
    ];
    close(&numbers_after(p2p, "): "), &want, p2p);
    let met = 100.0 * traffic / copy >= 60.0;
    assert_eq!(p2p.ends_with(": met"), met, "{p2p}");

    let small = row(&table, 8);
    let eight = line(
        &got,
        "-- 8 B allreduce on device buffers, 2 ranks on one GPU (8b, p2p, direct): ",
    );
    close(
        &numbers_after(eight, "): "),
        &[small[5], small[9], 20.0],
        eight,
    );
    assert_eq!(eight.ends_with(": met"), small[5] <= 20.0, "{eight}");
    // Rows under a part that holds no target are not read as one.
    assert!(!got.contains("8b, p2p, staged"), "{got}");
    assert!(
        line(&got, "-- shm staged").contains("not measured"),
        "{got}"
    );
}

/// Thread ranks joined by p2p (the stand-ins of both providers): all_reduce_perf says how many
/// allreduces went straight between the ranks' buffers, and the targets then count 4 x S of
/// traffic for them; part 8i's two paths are printed side by side.
#[test]
fn allreduces_between_the_ranks_buffers_count_their_own_traffic() {
    let perf = |peer: &str| {
        all_reduce_perf(
            "1K",
            "64K",
            &[
                // One stand-in device, as on a one-GPU machine: both ranks on it.
                ("FERRO_STANDIN_DEVICES", "1"),
                ("FERRO_P2P_PROVIDER", "host"),
                ("FERRO_TRANSPORTS", "p2p"),
                ("FERRO_DEVICE_PEER", peer),
            ],
        )
    };
    let (peer, ring) = (perf("1"), perf("0"));
    // Warm-up and timed calls of every size, out of place and in place, on rank 0.
    let calls: u64 = line(&peer, "# Calls between the ranks' buffers : ")
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(calls >= 3 * 2 * 2, "{peer}");
    assert!(!ring.contains("# Calls between"), "{ring}");
    // Each row's last column names the path its calls took.
    let label = |table: &str| {
        let l = table
            .lines()
            .find(|l| l.trim_start().starts_with("65536 "))
            .unwrap_or_else(|| panic!("no 64 KiB row in:\n{table}"));
        l.split_whitespace().last().unwrap_or("").to_string()
    };
    assert_eq!(label(&peer), "peer", "{peer}");
    assert_ne!(label(&ring), "peer", "{ring}");
    let copy = 100.0;
    let log = format!(
        "== 1. kernels\n# bandwidth 256 MiB: device-to-device copy {copy:.1} GB/s (read + written)\n\
         == 8. straight on the device\n-- 8b. threads, FERRO_DEVICE_DIRECT=1\n{peer}\
         -- all_reduce_perf: 1 s\n-- 8i: FERRO_DEVICE_PEER=0, threads, direct\n{ring}\
         -- 8i: FERRO_DEVICE_PEER=1, threads, direct\n{peer}"
    );
    let got = targets(&log);
    let big = row(&peer, 65536);
    let t = if big[9] > 0.0 && big[9] < big[5] {
        big[9]
    } else {
        big[5]
    };
    let p2p = line(
        &got,
        "-- p2p allreduce, 2 ranks on one GPU, 64 KiB (8b, direct, between the buffers of the ranks): ",
    );
    let traffic = 4.0 * 65536.0 / (t * 1e3);
    close(
        &numbers_after(p2p, "ranks): "),
        &[
            big[5],
            big[9],
            4.0,
            t,
            traffic,
            256.0,
            100.0 * traffic / copy,
            60.0,
        ],
        p2p,
    );
    let mine = line(&got, "-- 8i, between the buffers of the ranks, 64 KiB: ");
    close(
        &numbers_after(mine, "KiB: "),
        &[big[5], big[9], 4.0, traffic, 100.0 * traffic / copy],
        mine,
    );
    let r = row(&ring, 65536);
    let tr = if r[9] > 0.0 && r[9] < r[5] {
        r[9]
    } else {
        r[5]
    };
    let theirs = line(&got, "-- 8i, ring (FERRO_DEVICE_PEER=0), 64 KiB: ");
    let traffic = 9.0 * 65536.0 / (tr * 1e3);
    close(
        &numbers_after(theirs, "KiB: "),
        &[r[5], r[9], 9.0, traffic, 100.0 * traffic / copy],
        theirs,
    );
}

/// Part 8j: thread ranks on two devices (two stand-in devices, rank r on device r, which reach
/// each other) go between the buffers too, and the targets print both paths' times and busbw,
/// with no target.
#[test]
fn two_devices_go_between_the_buffers_and_part_8j_is_printed_without_a_target() {
    let perf = |peer: &str| {
        all_reduce_perf(
            "1K",
            "64K",
            &[
                ("FERRO_STANDIN_DEVICES", "2"),
                ("FERRO_P2P_PROVIDER", "host"),
                ("FERRO_TRANSPORTS", "p2p"),
                ("FERRO_DEVICE_PEER", peer),
            ],
        )
    };
    let (peer, ring) = (perf("1"), perf("0"));
    assert!(
        peer.contains("# Calls between the ranks' buffers : "),
        "{peer}"
    );
    assert!(!ring.contains("# Calls between"), "{ring}");
    let log = format!(
        "== 8. straight on the device\n-- 8j: FERRO_DEVICE_PEER=0, threads on two GPUs, direct\n\
         {ring}-- all_reduce_perf: 1 s\n-- 8j: FERRO_DEVICE_PEER=1, threads on two GPUs, direct\n{peer}"
    );
    let got = targets(&log);
    for (table, name) in [
        (&peer, "between the buffers of the ranks"),
        (&ring, "ring (FERRO_DEVICE_PEER=0)"),
    ] {
        let r = row(table, 65536);
        let l = line(&got, &format!("-- 8j, two GPUs, {name}, 64 KiB: "));
        close(&numbers_after(l, "KiB: "), &[r[5], r[9], r[7], r[11]], l);
        assert!(l.ends_with("(no target)"), "{l}");
    }
    // Nothing of 8j is taken for the one-GPU targets.
    assert!(
        got.contains("p2p allreduce, 2 ranks on one GPU: not measured"),
        "{got}"
    );
}

/// Part 8k: thread ranks on one device over p2p go between the buffers with calls ordered on
/// a stream (`-B 2`) as with blocking ones (`-B 1`), every row checked by the tool; the
/// targets print both, with the 8 B figures beside the others.
#[test]
fn calls_on_a_stream_go_between_the_buffers_and_part_8k_is_printed() {
    let env = [("FERRO_P2P_PROVIDER", "host"), ("FERRO_TRANSPORTS", "p2p")];
    let (blocking, stream) = (
        all_reduce_perf_b("8", "32K", "1", &env),
        all_reduce_perf_b("8", "32K", "2", &env),
    );
    for t in [&blocking, &stream] {
        assert!(t.contains("# Calls between the ranks' buffers : "), "{t}");
        assert!(t.contains("# Out of bounds values : 0 OK"), "{t}");
    }
    let log = format!(
        "== 1. kernels\n# bandwidth 256 MiB: device-to-device copy 100.0 GB/s (read + written)\n\
         -- ferro-gpu-check: 3 s\n== 8. straight on the device\n\
         -- 8k: -B 1, threads, between the buffers\n{blocking}-- all_reduce_perf: 1 s\n\
         -- 8k: -B 2, threads, between the buffers\n{stream}"
    );
    let got = targets(&log);
    for (table, name, short) in [
        (&blocking, "blocking calls (-B 1)", "blocking calls"),
        (&stream, "calls on a stream (-B 2)", "calls on a stream"),
    ] {
        let r = row(table, 32768);
        let l = line(
            &got,
            &format!("-- 8k, between the buffers of the ranks, {name}, 32 KiB: "),
        );
        close(&numbers_after(l, "KiB: ")[..2], &[r[5], r[9]], l);
        let r8 = row(table, 8);
        let l = line(
            &got,
            &format!("-- 8 B allreduce on device buffers, 2 ranks on one GPU (8k, between the buffers, {short}): "),
        );
        close(&numbers_after(l, "): ")[..2], &[r8[5], r8[9]], l);
    }
}

#[test]
fn staged_figures_are_compared_round_by_round_and_missing_steps_are_named() {
    let row = |oop: f64, ip: f64| {
        format!(
            "    67108864      16777216     float     sum      -1    20000   {oop:.2}   {oop:.2}       0    17000   {ip:.2}   {ip:.2}       0\n"
        )
    };
    let log = format!(
        "== 6. staged\n-- 6a round 1, -B 0\n{}-- ferrorun: 4 s\n-- 6a round 1, -B 1\n{}\
         -- 6a round 2, -B 0\n{}-- 6a round 2, -B 1\n{}-- 6b round 1, -B 2\n{}",
        row(4.0, 5.0),
        row(3.0, 4.0),
        row(4.0, 4.0),
        row(2.0, 3.0),
        row(40.0, 40.0),
    );
    let got = targets(&log);
    let first = line(&got, "-- shm staged, 2 processes, 64 MiB (6a round 1)");
    assert!(
        first.contains("75 % / 80 % of host (target >= 70 %): met"),
        "{first}"
    );
    let second = line(&got, "-- shm staged, 2 processes, 64 MiB (6a round 2)");
    assert!(
        second.contains("50 % / 75 % of host (target >= 70 %): NOT met"),
        "{second}"
    );
    for missing in [
        "-- copy rate",
        "-- kernels",
        "-- p2p allreduce",
        "-- 8 B allreduce",
    ] {
        assert!(
            line(&got, missing).contains("not measured in this run"),
            "{got}"
        );
    }
}

/// gpu-check on a bundle whose programs print what the GPU tools print: the targets follow
/// the verdict, the verdict is last again, and the exit status is the check's.
#[test]
fn gpu_check_sums_up_its_own_run_and_keeps_its_exit_status() {
    for (kernels_exit, want_exit) in [(0, 0), (1, 1), (2, 2)] {
        let dir = scratch(&format!("gpu-check-bundle-{kernels_exit}"));
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).expect("creating bin/");
        let stub = |name: &str, body: &str| {
            let path = bin.join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("writing a stub");
            let st = Command::new("chmod").arg("+x").arg(&path).status();
            assert!(st.is_ok_and(|s| s.success()), "chmod {path:?}");
        };
        stub(
            "ferro-gpu-check",
            &format!(
                "echo '# bandwidth 256 MiB: device-to-device copy 1000.0 GB/s (read + written)'\n\
                 echo '# bandwidth 256 MiB: f32 dst = a + b 950.0 GB/s (read + written), 95 % of copy (target >= 90 %)'\n\
                 exit {kernels_exit}"
            ),
        );
        stub(
            "all_reduce_perf",
            "echo '           8             2     float     sum      -1    25.00    0.00    0.00       0    16.00    0.00    0.00       0'",
        );
        let log = dir.join("check.log");
        let out = Command::new("bash")
            .arg(root().join("scripts/gpu-check.sh"))
            .arg(&dir)
            .env("FERRO_GPU_STEPS", "1 5")
            .env("FERRO_GPU_CHECK_LOG", &log)
            .env_remove("FERRO_GPU_CHECK_TEE")
            .stdin(Stdio::null())
            .output()
            .expect("running gpu-check.sh");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(out.status.code(), Some(want_exit), "{text}");
        let last = text.lines().last().unwrap_or_default();
        let verdict = match want_exit {
            0 => "gpu-check: the selected parts passed (FERRO_GPU_STEPS=1 5)",
            1 => "gpu-check: FAILED",
            _ => "-- kernels: no usable GPU (see above)",
        };
        assert_eq!(last, verdict, "{text}");
        assert!(text.contains("-- copy rate: 1000 GB/s (step 1)"), "{text}");
        if want_exit != 2 {
            let eight = line(
                &text,
                "-- 8 B allreduce on device buffers, 2 ranks on one GPU (5, shm, staged)",
            );
            assert!(
                eight.contains("25.0 / 16.0 us out of / in place (target <= 20 us): NOT met"),
                "{eight}"
            );
        }
        let saved = std::fs::read_to_string(&log).expect("the log gpu-check kept");
        assert!(saved.contains("== 1. reduction kernels"), "{saved}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
