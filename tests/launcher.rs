//! The `ferrorun` launcher, run as a program: environment, output, failure handling, signals,
//! and ranks placed in network namespaces.

#[path = "common/netns.rs"]
mod netns;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const FERRORUN: &str = env!("CARGO_BIN_EXE_ferrorun");

fn ferrorun(args: &[&str]) -> Output {
    Command::new(FERRORUN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run ferrorun")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Splits `[RANK] rest` into the rank and the rest.
fn split_prefix(line: &str) -> (usize, &str) {
    let rest = line
        .strip_prefix('[')
        .unwrap_or_else(|| panic!("line without prefix: {line:?}"));
    let (rank, rest) = rest
        .split_once("] ")
        .unwrap_or_else(|| panic!("line without prefix: {line:?}"));
    (rank.parse().expect("rank in prefix"), rest)
}

#[test]
fn every_rank_gets_its_environment_and_prefixed_lines() {
    let out = ferrorun(&[
        "-n",
        "3",
        "--",
        "sh",
        "-c",
        "echo rank=$FERRO_RANK of $FERRO_NRANKS local=$FERRO_LOCAL_RANK/$FERRO_LOCAL_NRANKS \
         store=$FERRO_STORE_ADDR job=$FERRO_JOB_ID host=${FERRO_HOST-none}; \
         echo warn-$FERRO_RANK >&2; printf tail-$FERRO_RANK",
    ]);
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(
        out.status.success(),
        "status {:?}\n{stdout}\n{stderr}",
        out.status
    );

    let mut ranks = BTreeSet::new();
    let mut stores = BTreeSet::new();
    let mut jobs = BTreeSet::new();
    let mut tails = BTreeSet::new();
    for line in stdout.lines() {
        let (rank, rest) = split_prefix(line);
        if let Some(tail) = rest.strip_prefix("tail-") {
            assert_eq!(tail, rank.to_string(), "{line}");
            tails.insert(rank);
            continue;
        }
        let words: Vec<&str> = rest.split(' ').collect();
        assert_eq!(words[0], format!("rank={rank}"), "{line}");
        assert_eq!(words[1..3], ["of", "3"], "{line}");
        assert_eq!(words[3], format!("local={rank}/3"), "{line}");
        let store: SocketAddr = words[4]
            .strip_prefix("store=")
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad store address in {line}"));
        assert!(store.ip().is_loopback() && store.port() != 0, "{line}");
        stores.insert(store);
        jobs.insert(words[5].to_string());
        assert_eq!(words[6], "host=none", "{line}");
        assert!(ranks.insert(rank), "rank {rank} printed twice:\n{stdout}");
    }
    assert_eq!(ranks, BTreeSet::from([0, 1, 2]), "{stdout}");
    assert_eq!(
        tails, ranks,
        "unterminated last lines must still come out:\n{stdout}"
    );
    assert_eq!(stores.len(), 1, "ranks disagree on the store: {stores:?}");
    assert_eq!(jobs.len(), 1, "ranks disagree on the job id: {jobs:?}");

    let warnings: BTreeSet<String> = stderr.lines().map(str::to_string).collect();
    let want: BTreeSet<String> = (0..3).map(|r| format!("[{r}] warn-{r}")).collect();
    assert_eq!(warnings, want, "stderr:\n{stderr}");
}

#[test]
fn job_ids_differ_between_launches() {
    let id = || {
        text(
            &ferrorun(&[
                "-n",
                "1",
                "--no-prefix",
                "--",
                "sh",
                "-c",
                "echo $FERRO_JOB_ID",
            ])
            .stdout,
        )
    };
    let (a, b) = (id(), id());
    assert!(!a.trim().is_empty());
    assert_ne!(a, b);
}

/// The CPUs of a `Cpus_allowed_list` value such as `0-3,6`.
fn cpu_list(text: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',') {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<usize>().unwrap()..=b.parse().unwrap()),
            None => cpus.push(part.parse().unwrap()),
        }
    }
    cpus
}

#[test]
fn bind_core_pins_rank_i_to_the_ith_allowed_cpu() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let allowed = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(cpu_list)
        .expect("Cpus_allowed_list in /proc/self/status");
    let n = allowed.len() + 1;
    let out = ferrorun(&[
        "-n",
        &n.to_string(),
        "--bind",
        "core",
        "--",
        "sh",
        "-c",
        "grep Cpus_allowed_list: /proc/self/status",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let mut seen = 0;
    for line in stdout.lines() {
        let (rank, rest) = split_prefix(line);
        let list = rest.strip_prefix("Cpus_allowed_list:").expect(line);
        // One more rank than CPUs: the last one wraps around to the first CPU.
        assert_eq!(
            cpu_list(list),
            vec![allowed[rank % allowed.len()]],
            "{line}"
        );
        seen += 1;
    }
    assert_eq!(seen, n, "{stdout}");
    // Without --bind the ranks keep the launcher's whole mask.
    let out = ferrorun(&[
        "-n",
        "2",
        "--",
        "grep",
        "Cpus_allowed_list:",
        "/proc/self/status",
    ]);
    for line in text(&out.stdout).lines() {
        let (_, rest) = split_prefix(line);
        assert_eq!(
            cpu_list(rest.strip_prefix("Cpus_allowed_list:").unwrap()),
            allowed
        );
    }
}

#[test]
fn no_prefix_passes_lines_through() {
    let out = ferrorun(&[
        "-n",
        "2",
        "--no-prefix",
        "--",
        "sh",
        "-c",
        "echo plain-$FERRO_RANK",
    ]);
    assert!(out.status.success());
    let lines: BTreeSet<String> = text(&out.stdout).lines().map(str::to_string).collect();
    assert_eq!(
        lines,
        BTreeSet::from(["plain-0".to_string(), "plain-1".to_string()])
    );
}

#[test]
fn lines_from_busy_ranks_are_never_mixed() {
    // Four ranks each write 3000 lines of 500 copies of their own digit as fast as they can.
    let out = ferrorun(&[
        "-n",
        "4",
        "--",
        "sh",
        "-c",
        "yes \"$(printf '%0500d' 0 | tr 0 $FERRO_RANK)\" | head -n 3000",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let mut counts = [0usize; 4];
    for line in stdout.lines() {
        let (rank, rest) = split_prefix(line);
        let digit = char::from(b'0' + rank as u8);
        assert!(
            rest.len() == 500 && rest.chars().all(|c| c == digit),
            "mixed or cut line from rank {rank}: {rest:?}"
        );
        counts[rank] += 1;
    }
    assert_eq!(counts, [3000; 4]);
}

#[test]
fn a_failing_rank_stops_the_others() {
    let start = Instant::now();
    let out = ferrorun(&[
        "-n",
        "4",
        "--",
        "sh",
        "-c",
        "if [ $FERRO_RANK = 1 ]; then exit 3; fi; sleep 30",
    ]);
    let elapsed = start.elapsed();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "stderr:\n{stderr}");
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    assert!(
        stderr.contains("ferrorun: rank 1 exited with status 3; stopping the other 3 ranks"),
        "stderr:\n{stderr}"
    );
}

#[test]
fn a_rank_killed_by_a_signal_is_reported() {
    let out = ferrorun(&[
        "-n",
        "3",
        "--",
        "sh",
        "-c",
        "if [ $FERRO_RANK = 2 ]; then kill -KILL $$; fi; sleep 30",
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + 9), "stderr:\n{stderr}");
    assert!(
        stderr.contains("rank 2 was killed by signal 9 (SIGKILL); stopping the other 2 ranks"),
        "stderr:\n{stderr}"
    );
}

#[test]
fn ranks_ignoring_sigterm_get_sigkill() {
    let start = Instant::now();
    let out = ferrorun(&[
        "-n",
        "2",
        "--",
        "sh",
        "-c",
        "trap '' TERM; if [ $FERRO_RANK = 0 ]; then sleep 0.3; exit 4; fi; sleep 30",
    ]);
    let elapsed = start.elapsed();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "stderr:\n{stderr}");
    assert!(
        elapsed >= Duration::from_millis(3200) && elapsed < Duration::from_secs(10),
        "took {elapsed:?}"
    );
    assert!(stderr.contains("sending SIGKILL"), "stderr:\n{stderr}");
}

#[test]
fn timeout_stops_everything_with_124() {
    let start = Instant::now();
    let out = ferrorun(&["-n", "2", "--timeout", "0.5", "--", "sleep", "30"]);
    let elapsed = start.elapsed();
    assert_eq!(out.status.code(), Some(124), "{}", text(&out.stderr));
    assert!(
        elapsed >= Duration::from_millis(500) && elapsed < Duration::from_secs(5),
        "took {elapsed:?}"
    );
    assert!(
        text(&out.stderr).contains("timeout"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn bad_command_lines_exit_2_with_usage() {
    for args in [
        &["-n", "0", "--", "true"][..],
        &["--frobnicate", "-n", "2", "--", "true"],
        &["-n", "2"],
        &["-n", "2", "--"],
        &["--", "true"],
        &["-n", "2", "--timeout", "never", "--", "true"],
    ] {
        let out = ferrorun(args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("usage: ferrorun"), "{args:?}: {stderr}");
    }
    let help = ferrorun(&["--help"]);
    assert!(help.status.success());
    assert!(text(&help.stdout).contains("FERRO_LOCAL_RANK"));
}

#[test]
fn missing_program_is_a_clear_error() {
    let out = ferrorun(&["-n", "2", "--", "ferro-no-such-program-x"]);
    assert_eq!(out.status.code(), Some(127));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("program 'ferro-no-such-program-x' not found in PATH"),
        "{stderr}"
    );
}

/// Starts ferrorun with piped stdout and waits until `n` lines starting with `ready` came out;
/// returns the child, the reader, and those lines.
fn start_until_ready(
    args: &[&str],
    n: usize,
) -> (
    std::process::Child,
    BufReader<std::process::ChildStdout>,
    Vec<String>,
) {
    let mut child = Command::new(FERRORUN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ferrorun");
    let mut reader = BufReader::new(child.stdout.take().expect("stdout"));
    let mut ready = Vec::new();
    while ready.len() < n {
        let mut line = String::new();
        assert_ne!(
            reader.read_line(&mut line).expect("read"),
            0,
            "ferrorun ended early"
        );
        if split_prefix(line.trim_end()).1.starts_with("ready") {
            ready.push(line.trim_end().to_string());
        }
    }
    (child, reader, ready)
}

#[test]
fn sigterm_to_the_launcher_reaches_every_rank() {
    let (mut child, mut reader, _) = start_until_ready(
        &[
            "-n",
            "3",
            "--",
            "sh",
            "-c",
            "trap 'echo stopped-$FERRO_RANK; exit 5' TERM; echo ready; \
             while :; do sleep 0.05; done",
        ],
        3,
    );
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill with a pid of our own child.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    // Bounded: if the launcher ignored the signal, kill it so the test fails instead of hanging.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watchdog = {
        let done = std::sync::Arc::clone(&done);
        std::thread::spawn(move || {
            for _ in 0..300 {
                if done.load(std::sync::atomic::Ordering::SeqCst) {
                    return false;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            // SAFETY: our child is not reaped until `done` is set, so the pid is still ours.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            true
        })
    };
    let mut rest = String::new();
    let _ = reader.read_to_string(&mut rest);
    let status = child.wait().expect("wait");
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(
        !watchdog.join().expect("watchdog"),
        "ferrorun ignored SIGTERM:\n{rest}"
    );
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{rest}");
    let stopped: BTreeSet<&str> = rest.lines().map(|l| split_prefix(l).1).collect();
    assert_eq!(
        stopped,
        BTreeSet::from(["stopped-0", "stopped-1", "stopped-2"]),
        "output after SIGTERM:\n{rest}"
    );
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet).
fn is_dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn ranks_die_with_the_launcher() {
    let (mut child, _reader, ready) = start_until_ready(
        &["-n", "2", "--", "sh", "-c", "echo ready $$; exec sleep 60"],
        2,
    );
    let pids: Vec<i32> = ready
        .iter()
        .map(|l| {
            l.rsplit(' ')
                .next()
                .and_then(|p| p.parse().ok())
                .expect("pid")
        })
        .collect();
    assert!(
        pids.iter().all(|&p| !is_dead(p)),
        "ranks should be running: {pids:?}"
    );
    child.kill().expect("SIGKILL ferrorun");
    child.wait().expect("wait");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !pids.iter().all(|&p| is_dead(p)) {
        assert!(
            Instant::now() < deadline,
            "ranks {pids:?} outlived the launcher"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The hosts, or `None` (after printing why) when namespaces cannot be built here.
fn hosts_or_skip(test: &str, n: usize, rate: Option<&str>) -> Option<netns::NetnsHosts> {
    if let Err(why) = netns::netns_available() {
        println!("skipped: {test}: network namespaces unavailable: {why}");
        return None;
    }
    let hosts = match rate {
        None => netns::NetnsHosts::up(n),
        Some(rate) => netns::NetnsHosts::up_with_rate(n, rate),
    };
    Some(hosts.unwrap_or_else(|e| panic!("{test}: {e}")))
}

#[test]
fn netns_ranks_are_placed_round_robin() {
    let Some(hosts) = hosts_or_skip("netns_ranks_are_placed_round_robin", 2, None) else {
        return;
    };
    let out = ferrorun(&[
        "-n",
        "4",
        "--netns",
        &hosts.netns_arg(),
        "--",
        "sh",
        "-c",
        "ip -4 -o addr show; \
         echo rank=$FERRO_RANK local=$FERRO_LOCAL_RANK/$FERRO_LOCAL_NRANKS host=$FERRO_HOST \
         store=$FERRO_STORE_ADDR",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));

    let mut seen = BTreeSet::new();
    for rank in 0..4 {
        let host = rank % 2;
        let lines: Vec<&str> = stdout
            .lines()
            .filter(|l| split_prefix(l).0 == rank)
            .map(|l| split_prefix(l).1)
            .collect();
        let own = format!("inet {}/24", hosts.addr(host));
        let other = format!("inet {}/24", hosts.addr(1 - host));
        assert!(
            lines.iter().any(|l| l.contains(&own)),
            "rank {rank}: {lines:?}"
        );
        assert!(
            !lines.iter().any(|l| l.contains(&other)),
            "rank {rank}: {lines:?}"
        );
        let summary = lines
            .iter()
            .find(|l| l.starts_with("rank="))
            .unwrap_or_else(|| panic!("rank {rank} printed no summary: {lines:?}"));
        let store = format!("{}:", hosts.addr(0));
        assert!(
            summary.starts_with(&format!(
                "rank={rank} local={}/2 host=ferro{host} store={store}",
                rank / 2
            )),
            "{summary}"
        );
        seen.insert(rank);
    }
    assert_eq!(seen.len(), 4);
}

#[test]
fn netns_hosts_reach_each_other_but_not_the_root_namespace() {
    let Some(hosts) = hosts_or_skip("netns_hosts_reach_each_other", 3, None) else {
        return;
    };
    // Host 0 listens; ranks on every host connect with bash's /dev/tcp.
    let listener = hosts
        .run_in(0, || TcpListener::bind((hosts.addr(0), 0)))
        .expect("enter ferro0")
        .expect("bind in ferro0");
    let port = listener.local_addr().expect("addr").port();
    let acceptor = std::thread::spawn(move || {
        let mut got = BTreeSet::new();
        for _ in 0..3 {
            let (mut stream, _) = listener.accept().expect("accept");
            let mut s = String::new();
            stream.read_to_string(&mut s).expect("read");
            got.insert(s.trim().to_string());
        }
        got
    });
    let script = format!(
        "echo hello-$FERRO_RANK-$FERRO_HOST > /dev/tcp/{}/{port}",
        hosts.addr(0)
    );
    let out = ferrorun(&[
        "-n",
        "3",
        "--netns",
        &hosts.netns_arg(),
        "--",
        "bash",
        "-c",
        &script,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let got = acceptor.join().expect("acceptor");
    let want: BTreeSet<String> = (0..3).map(|r| format!("hello-{r}-ferro{r}")).collect();
    assert_eq!(got, want);

    // Host 2 to host 1, from Rust sockets.
    let listener = hosts
        .run_in(1, || TcpListener::bind((hosts.addr(1), 0)))
        .expect("enter ferro1")
        .expect("bind in ferro1");
    let target = listener.local_addr().expect("addr");
    hosts
        .run_in(2, || {
            let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(5))?;
            s.write_all(b"from-2")
        })
        .expect("enter ferro2")
        .expect("connect ferro2 -> ferro1");
    let (mut stream, peer) = listener.accept().expect("accept");
    let mut s = String::new();
    stream.read_to_string(&mut s).expect("read");
    assert_eq!(
        (s.as_str(), peer.ip()),
        ("from-2", std::net::IpAddr::V4(hosts.addr(2)))
    );

    // Nothing was added to the namespace the tests run in.
    let root = Command::new("ip")
        .args(["-o", "addr", "show"])
        .output()
        .expect("ip");
    assert!(
        !text(&root.stdout).contains("10.231.0."),
        "{}",
        text(&root.stdout)
    );
}

#[test]
fn netns_rate_limit_slows_transfers() {
    let Some(hosts) = hosts_or_skip("netns_rate_limit_slows_transfers", 2, Some("20mbit")) else {
        return;
    };
    // 2.5 MB at 20 Mbit/s takes about a second; unlimited it takes milliseconds.
    const BYTES: usize = 2_500_000;
    let listener = hosts
        .run_in(0, || TcpListener::bind((hosts.addr(0), 0)))
        .expect("enter ferro0")
        .expect("bind");
    let target = listener.local_addr().expect("addr");
    let receiver = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        let mut buf = Vec::new();
        stream.read_to_end(&mut buf).expect("read");
        buf
    });
    let start = Instant::now();
    let payload: Vec<u8> = (0..BYTES).map(|i| (i % 251) as u8).collect();
    hosts
        .run_in(1, || -> std::io::Result<()> {
            let mut s = TcpStream::connect(target)?;
            s.write_all(&payload)
        })
        .expect("enter ferro1")
        .expect("send");
    let got = receiver.join().expect("receiver");
    let elapsed = start.elapsed();
    assert!(
        got == payload,
        "payload corrupted ({} bytes came)",
        got.len()
    );
    assert!(
        elapsed >= Duration::from_millis(600),
        "2.5 MB at 20mbit took only {elapsed:?}"
    );
}
