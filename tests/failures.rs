//! Failures across processes: a rank killed mid-collective, mismatched calls, a process of
//! another job and a stranger on the rendezvous port, and a rank that panics under `ferrorun`.
//!
//! The test binary runs itself as the ranks (see `common::child`). Where `ferrorun` would stop
//! the job at the first failure, the tests start the rank processes themselves with the
//! `FERRO_*` environment. Every wait is bounded.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::child::{
    self, ferrorun_self, field, free_port, now_ms, self_command, serial, Finished, Running,
};
use ferroccl::{Communicator, ReduceOp, SharedBuf};

/// The `FERRO_*` environment of rank `rank` of a hand-started job.
fn rank_env(
    rank: usize,
    nranks: usize,
    store: SocketAddr,
    job: &str,
    timeout_s: u32,
) -> Vec<(&'static str, String)> {
    let mut v = child::rank_env(rank, nranks, store, timeout_s);
    v.push(("FERRO_JOB_ID", job.to_string()));
    v
}

/// A job id no other test (or earlier run) uses.
fn job_id(what: &str) -> String {
    format!("{what}-{}-{}", std::process::id(), now_ms())
}

/// Waits until something accepts connections at `addr` (the store rank 0 hosts), at most `limit`.
fn wait_for_listener(addr: SocketAddr, limit: Duration) {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            // A plain connect-and-close: the store must shrug it off like any stranger.
            drop(s);
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nothing listens at {addr} after {limit:?}");
}

// ---------------------------------------------------------------------------------------------
// A rank killed in the middle of a large allreduce.

/// Elements of the 64 MiB f32 allreduce.
const BIG: usize = 16 << 20;

/// Ranks 0 and 1 loop over a 64 MiB allreduce until it fails and print the error; rank 2 takes
/// part in a few, starts one more and kills itself with SIGKILL while it is in flight.
#[test]
fn child_dies_mid_allreduce() {
    if !child::is_role("dies") {
        return;
    }
    let comm = Communicator::from_env().expect("from_env");
    let r = comm.rank();
    let data: Vec<f32> = (0..BIG).map(|i| ((i % 4096) * (r + 1)) as f32).collect();
    // SHARED_BUFFERS=1: the buffers are in shared memory, so peers read rank 2's messages
    // straight from its buffer when it dies.
    let shared = std::env::var("SHARED_BUFFERS").is_ok_and(|v| v == "1");
    type Buf = Box<dyn std::ops::DerefMut<Target = [f32]>>;
    let (send, mut recv): (Buf, Buf) = if shared {
        (
            Box::new(SharedBuf::from_slice(&data).expect("shared buffer")),
            Box::new(SharedBuf::<f32>::zeroed(BIG).expect("shared buffer")),
        )
    } else {
        (Box::new(data.clone()), Box::new(vec![0f32; BIG]))
    };
    let (send, recv): (&[f32], &mut [f32]) = (&send, &mut recv);
    for k in 0..3 {
        comm.all_reduce(send, &mut *recv, ReduceOp::Sum)
            .unwrap_or_else(|e| panic!("rank {r}, warm-up {k}: {e}"));
        for i in [0, 1, 4095, 4097, BIG - 1] {
            assert_eq!(recv[i], ((i % 4096) * 6) as f32, "rank {r}, element {i}");
        }
    }
    if r == 2 {
        if shared {
            // Blocking, from the shared buffers, on a thread, so the peers are reading this
            // process's buffer when it dies.
            std::thread::scope(|sc| {
                sc.spawn(|| {
                    let _ = comm.all_reduce(send, &mut *recv, ReduceOp::Sum);
                });
                std::thread::sleep(Duration::from_millis(30));
                kill_self(r);
            });
        }
        let _work = comm
            .all_reduce_async(data.clone(), ReduceOp::Sum)
            .expect("issue");
        std::thread::sleep(Duration::from_millis(30));
        kill_self(r);
    }
    for iter in 0..1000 {
        let t = Instant::now();
        if let Err(e) = comm.all_reduce(send, &mut *recv, ReduceOp::Sum) {
            println!(
                "FAILED rank={r} iter={iter} call_ms={} at_ms={} error={e}",
                t.elapsed().as_millis(),
                now_ms()
            );
            // The communicator stays failed with the same error.
            let again = comm
                .barrier()
                .expect_err("a failed communicator must stay failed");
            assert_eq!(again, e, "rank {r}");
            return;
        }
    }
    panic!("rank {r}: 1000 allreduces succeeded although rank 2 was killed");
}

/// Says when, then ends this process with SIGKILL.
fn kill_self(r: usize) -> ! {
    println!("KILLING rank={r} at_ms={}", now_ms());
    let _ = std::io::stdout().flush();
    // SAFETY: kill(2) on this process; no memory is involved. It does not return.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    unreachable!("SIGKILL did not end the process");
}

/// FERRO_TIMEOUT of the kill tests' ranks.
const KILL_TIMEOUT_S: u32 = 20;

/// One survivor's report: its error text and how long after the kill it came.
#[derive(Debug)]
struct Survivor {
    error: String,
    after_ms: u128,
}

/// Starts the 3 ranks of [`child_dies_mid_allreduce`] by hand (`ferrorun` would stop the
/// survivors at the first death) and collects the survivors' reports.
fn kill_job() -> Vec<Survivor> {
    let store = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let job = job_id("dies");
    let ranks: Vec<Running> = (0..3)
        .map(|r| {
            Running::spawn(self_command(
                "child_dies_mid_allreduce",
                "dies",
                &rank_env(r, 3, store, &job, KILL_TIMEOUT_S),
            ))
        })
        .collect();
    let outs: Vec<Finished> = ranks
        .into_iter()
        .map(|p| p.finish(Duration::from_secs(120)))
        .collect();
    let all = || common::child::dump_all("rank", &outs);

    let killed = outs[2].tagged("KILLING ");
    assert_eq!(killed.len(), 1, "{}", all());
    assert!(
        outs[2]
            .status
            .is_some_and(|s| std::os::unix::process::ExitStatusExt::signal(&s) == Some(9)),
        "rank 2 must die of SIGKILL: {}",
        all()
    );
    let died_at: u128 = field(&killed[0], "at_ms");
    outs.iter()
        .take(2)
        .enumerate()
        .map(|(r, out)| {
            assert!(out.success(), "survivor {r}: {}", all());
            let failed = out.tagged("FAILED ");
            assert_eq!(failed.len(), 1, "survivor {r}: {}", all());
            let line = &failed[0];
            let error = line.split_once("error=").map_or("", |(_, e)| e);
            assert!(error.contains("all_reduce #"), "{line}");
            let after_ms = field::<u128>(line, "at_ms").saturating_sub(died_at);
            println!("survivor {r}: {after_ms} ms after the kill: {error}");
            Survivor {
                error: error.to_string(),
                after_ms,
            }
        })
        .collect()
}

#[test]
fn killed_rank_fails_every_survivor_promptly() {
    let _serial = serial();
    let survivors = kill_job();
    for (r, s) in survivors.iter().enumerate() {
        // A dead process closes its sockets: the error comes long before FERRO_TIMEOUT.
        assert!(
            s.after_ms < u128::from(KILL_TIMEOUT_S) * 1000 / 4,
            "survivor {r} noticed the death after {} ms (FERRO_TIMEOUT {KILL_TIMEOUT_S} s): {}",
            s.after_ms,
            s.error
        );
        // It names the dead rank, or the survivor whose failure reached it first.
        let other = 1 - r;
        assert!(
            s.error.contains("rank 2 (") || s.error.contains(&format!("rank {other} (")),
            "survivor {r}: {}",
            s.error
        );
    }
    assert!(
        survivors.iter().any(|s| s.error.contains("rank 2 (")),
        "no survivor named the dead rank: {survivors:?}"
    );
}

/// The stricter check: every survivor's error names the rank that died, even a survivor that was
/// waiting on the other survivor (a failing rank publishes its reason before it closes its
/// connections, and a peer that sees the close adds that reason).
#[test]
fn killed_rank_is_named_by_every_survivor() {
    let _serial = serial();
    for (r, s) in kill_job().iter().enumerate() {
        assert!(
            s.error.contains("rank 2 ("),
            "survivor {r} must name the dead peer: {}",
            s.error
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Mismatched counts across processes.

/// Every rank runs one good allreduce, then one where rank 2 passes 4096 elements and the
/// others 1024; each prints its error and exits 0.
#[test]
fn child_mismatched_counts() {
    if !child::is_role("mismatch") {
        return;
    }
    let comm = Communicator::from_env().expect("from_env");
    let r = comm.rank();
    let mut ok = vec![r as f32 + 1.0; 16];
    comm.all_reduce_in_place(&mut ok, ReduceOp::Sum)
        .expect("matched allreduce");
    assert_eq!(ok, vec![6.0; 16]);
    let count = if r == 2 { 4096 } else { 1024 };
    let mut buf: Vec<f32> = (0..count).map(|i| i as f32).collect();
    let t = Instant::now();
    let e = comm
        .all_reduce_in_place(&mut buf, ReduceOp::Sum)
        .expect_err("a mismatched allreduce must fail");
    println!(
        "MISMATCH rank={r} call_ms={} error={e}",
        t.elapsed().as_millis()
    );
    let again = comm.barrier().expect_err("the communicator stays failed");
    assert_eq!(again, e);
}

#[test]
fn mismatched_counts_across_processes_name_both_counts() {
    let _serial = serial();
    let out = ferrorun_self(
        3,
        None,
        "child_mismatched_counts",
        "mismatch",
        &[("FERRO_TIMEOUT", "20".to_string())],
        Duration::from_secs(60),
    );
    assert!(out.success(), "{}", out.dump());
    let lines = out.tagged("MISMATCH ");
    assert_eq!(lines.len(), 3, "{}", out.dump());
    let count_of = |rank: usize| if rank == 2 { 4096 } else { 1024 };
    let mut named = 0;
    for l in &lines {
        println!("{l}");
        let r: usize = field(l, "rank");
        let error = l.split_once("error=").map_or("", |(_, e)| e);
        assert!(
            error.contains(&format!("all_reduce #2 on rank {r}")),
            "rank {r}: {l}"
        );
        // Not a timeout: the mismatch is found from the message headers.
        assert!(field::<u128>(l, "call_ms") < 10_000, "{l}");
        for p in (0..3).filter(|&p| count_of(p) != count_of(r)) {
            let want = format!(
                "all_reduce #2 on rank {r}: rank {p} sent {} x f32, rank {r} expected {} x f32",
                count_of(p),
                count_of(r)
            );
            if error.contains(&want) {
                named += 1;
            }
        }
    }
    assert!(named >= 1, "some rank must name both counts: {lines:#?}");
}

// ---------------------------------------------------------------------------------------------
// A process of another job, and a stranger, on the rendezvous store's port.

/// A rank of a real job: an allreduce with distinct values, checked, then a broadcast.
#[test]
fn child_real_job() {
    if !child::is_role("real") {
        return;
    }
    let comm = Communicator::from_env().expect("from_env");
    let (r, n) = (comm.rank(), comm.nranks());
    let mut buf: Vec<u64> = (0..10_000)
        .map(|i| (r as u64 + 1) * 1_000_003 + i)
        .collect();
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)
        .expect("all_reduce");
    let ranks_sum: u64 = (1..=n as u64).sum();
    for (i, &x) in buf.iter().enumerate() {
        assert_eq!(
            x,
            ranks_sum * 1_000_003 + n as u64 * i as u64,
            "element {i}"
        );
    }
    let mut b: Vec<u32> = (0..777)
        .map(|i| if r == 0 { i * 7 + 1 } else { 0 })
        .collect();
    comm.broadcast(&mut b, 0).expect("broadcast");
    assert!(b.iter().enumerate().all(|(i, &x)| x == i as u32 * 7 + 1));
    println!("JOB_OK rank={r} nranks={n}");
    comm.destroy().expect("destroy");
}

/// A process of another job (its own `FERRO_JOB_ID`) pointed at the real job's store.
#[test]
fn child_intruder() {
    if !child::is_role("intruder") {
        return;
    }
    let t = Instant::now();
    match Communicator::from_env() {
        Ok(comm) => {
            let mut b = [1u32; 4];
            let r = comm.all_reduce_in_place(&mut b, ReduceOp::Sum);
            panic!("a process of another job joined a communicator ({r:?}, {b:?})");
        }
        Err(e) => println!(
            "REJECTED rank={} after_ms={} error={e}",
            child::env_var::<usize>("FERRO_RANK"),
            t.elapsed().as_millis()
        ),
    }
}

#[test]
fn another_jobs_process_does_not_disturb_the_job() {
    let _serial = serial();
    let store = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let job = job_id("real");
    let other = job_id("other");
    let real = |r| {
        Running::spawn(self_command(
            "child_real_job",
            "real",
            &rank_env(r, 2, store, &job, 30),
        ))
    };
    let rank0 = real(0);
    wait_for_listener(store, Duration::from_secs(30));
    // Rank 1 and rank 0 of another job, with the same store address; rank 1 of the real job
    // comes last, so the intruders are there while the real job is still in init.
    let intruders: Vec<Running> = [1, 0]
        .into_iter()
        .map(|r| {
            Running::spawn(self_command(
                "child_intruder",
                "intruder",
                &rank_env(r, 2, store, &other, 3),
            ))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let rank1 = real(1);

    let jobs = [
        rank0.finish(Duration::from_secs(60)),
        rank1.finish(Duration::from_secs(60)),
    ];
    let intruders: Vec<Finished> = intruders
        .into_iter()
        .map(|p| p.finish(Duration::from_secs(30)))
        .collect();
    let all = || {
        jobs.iter()
            .chain(&intruders)
            .map(Finished::dump)
            .collect::<Vec<_>>()
            .join("\n=====\n")
    };
    for (r, out) in jobs.iter().enumerate() {
        assert!(out.success(), "real rank {r}: {}", all());
        assert_eq!(out.tagged("JOB_OK ").len(), 1, "{}", all());
    }
    for out in &intruders {
        assert!(out.success(), "{}", all());
        let lines = out.tagged("REJECTED ");
        assert_eq!(lines.len(), 1, "{}", all());
        println!("{}", lines[0]);
    }
    // The intruding rank 0 cannot host a second store on the real job's port.
    let host = &intruders[1].tagged("REJECTED ")[0];
    assert!(
        host.contains("rendezvous store") && host.contains(&format!(":{}", store.port())),
        "{host}"
    );
    // The intruding rank 1 waits for a rank 0 of its own job that never comes.
    let waiter = &intruders[0].tagged("REJECTED ")[0];
    assert!(field::<u128>(waiter, "after_ms") < 20_000, "{waiter}");
}

/// Hellos and frames a stranger throws at the store port.
fn stranger_payloads() -> Vec<Vec<u8>> {
    let mut bad_version = b"FRCLSTOR".to_vec();
    bad_version.extend_from_slice(&99u16.to_le_bytes());
    bad_version.extend_from_slice(&[0; 10]);
    let mut huge_frame = b"FRCLSTOR".to_vec();
    huge_frame.extend_from_slice(&1u16.to_le_bytes());
    huge_frame.extend_from_slice(&[0; 10]);
    huge_frame.extend_from_slice(&u32::MAX.to_le_bytes());
    huge_frame.extend_from_slice(&[0xee; 64]);
    let mut bad_op = b"FRCLSTOR".to_vec();
    bad_op.extend_from_slice(&1u16.to_le_bytes());
    bad_op.extend_from_slice(&[0; 10]);
    bad_op.extend_from_slice(&5u32.to_le_bytes());
    bad_op.extend_from_slice(&[0x7f, 1, 2, 3, 4]);
    vec![
        b"GET / HTTP/1.1\r\nHost: ferroccl\r\n\r\n".to_vec(),
        (0..4096u32).map(|i| (i * 131 % 251) as u8).collect(),
        bad_version,
        huge_frame,
        bad_op,
        b"FRCL".to_vec(),
    ]
}

#[test]
fn stranger_on_the_store_port_does_not_disturb_init() {
    let _serial = serial();
    let store = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let job = job_id("stranger");
    let real = |r| {
        Running::spawn(self_command(
            "child_real_job",
            "real",
            &rank_env(r, 3, store, &job, 30),
        ))
    };
    let rank0 = real(0);
    wait_for_listener(store, Duration::from_secs(30));

    // A silent connection held through the whole init, and one of each kind of garbage.
    let silent = TcpStream::connect(store).expect("connect");
    let mut garbage: Vec<TcpStream> = stranger_payloads()
        .into_iter()
        .map(|p| {
            let mut s = TcpStream::connect(store).expect("connect");
            let _ = s.write_all(&p);
            s
        })
        .collect();
    // More garbage keeps arriving while the other ranks start.
    let done = AtomicBool::new(false);
    let (jobs, spam) = std::thread::scope(|scope| {
        let spammer = scope.spawn(|| {
            let mut sent = 0usize;
            let payloads = stranger_payloads();
            while !done.load(Ordering::SeqCst) {
                if let Ok(mut s) = TcpStream::connect_timeout(&store, Duration::from_secs(1)) {
                    let _ = s.write_all(&payloads[sent % payloads.len()]);
                    sent += 1;
                }
                std::thread::sleep(Duration::from_millis(15));
            }
            sent
        });
        std::thread::sleep(Duration::from_millis(200));
        let rank1 = real(1);
        let rank2 = real(2);
        let jobs = [
            rank0.finish(Duration::from_secs(60)),
            rank1.finish(Duration::from_secs(60)),
            rank2.finish(Duration::from_secs(60)),
        ];
        done.store(true, Ordering::SeqCst);
        (jobs, spammer.join().expect("spammer thread"))
    });
    let all = || {
        jobs.iter()
            .map(Finished::dump)
            .collect::<Vec<_>>()
            .join("\n=====\n")
    };
    for (r, out) in jobs.iter().enumerate() {
        assert!(out.success(), "rank {r}: {}", all());
        assert_eq!(out.tagged("JOB_OK ").len(), 1, "{}", all());
    }
    assert!(spam > 0, "the stranger never got through");

    // The server answered none of the garbage with data it should not have: a non-store
    // hello is closed without an answer; a wrong version gets the 12-byte refusal at most.
    let mut plain = garbage.remove(0);
    plain
        .set_read_timeout(Some(Duration::from_secs(15)))
        .expect("read timeout");
    let mut buf = [0u8; 64];
    match plain.read(&mut buf) {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!("the store answered an HTTP request with {:?}", &buf[..n]),
    }
    let _ = silent.shutdown(Shutdown::Both);
}

// ---------------------------------------------------------------------------------------------
// ferrorun when one rank panics.

/// Rank 1 panics after init; the others would idle for a long time unless stopped.
#[test]
fn child_panics() {
    if !child::is_role("panics") {
        return;
    }
    let comm = Communicator::from_env().expect("from_env");
    let r = comm.rank();
    println!("PID rank={r} pid={}", std::process::id());
    let _ = std::io::stdout().flush();
    comm.barrier().expect("barrier");
    if r == 1 {
        std::thread::sleep(Duration::from_millis(300));
        panic!("rank 1 panics on purpose");
    }
    // Idle (not inside a collective): only ferrorun can end this early.
    std::thread::sleep(Duration::from_secs(90));
    println!("IDLE_DONE rank={r}");
}

#[test]
fn ferrorun_stops_the_job_when_a_rank_panics() {
    let _serial = serial();
    let out = ferrorun_self(
        3,
        None,
        "child_panics",
        "panics",
        &[("FERRO_TIMEOUT", "60".to_string())],
        Duration::from_secs(120),
    );
    assert!(!out.timed_out, "{}", out.dump());
    let code = out.status.and_then(|s| s.code());
    assert!(
        code.is_some_and(|c| c != 0 && c != 124),
        "ferrorun must exit non-zero for the panic: {}",
        out.dump()
    );
    assert!(
        out.took < Duration::from_secs(30),
        "the others were not stopped promptly: {}",
        out.dump()
    );
    assert!(
        out.stderr.contains("rank 1 panics on purpose"),
        "{}",
        out.dump()
    );
    assert!(
        out.stderr.contains("ferrorun: rank 1 exited with status"),
        "{}",
        out.dump()
    );
    assert!(out.tagged("IDLE_DONE ").is_empty(), "{}", out.dump());
    let pids: Vec<u32> = out.tagged("PID ").iter().map(|l| field(l, "pid")).collect();
    assert_eq!(pids.len(), 3, "{}", out.dump());
    for pid in pids {
        assert!(
            !child::process_alive(pid),
            "rank process {pid} outlived ferrorun"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// A rank killed while shared-memory transfers are in flight.

/// Shared-memory segment files in /dev/shm created by process `pid`.
fn shm_files_of(pid: u32) -> Vec<String> {
    let tag = format!("-p{pid}-");
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("ferroccl-") && n.contains(&tag))
                .collect()
        })
        .unwrap_or_default()
}

/// The job of [`child_dies_mid_allreduce`] over shared memory (the three ranks share this host;
/// `FERRO_TRANSPORTS=shm` makes sure no TCP socket is involved): every survivor fails within the
/// deadline naming the dead rank, and no segment of the job is left in /dev/shm.
#[test]
fn killed_rank_over_shared_memory_fails_survivors_and_leaves_no_segments() {
    killed_rank_over_shared_memory(false);
}

/// The same with the buffers in shared memory ([`SharedBuf`]): the survivors are reading the
/// dead rank's buffer, mapped into their own address space, when it dies.
#[test]
fn killed_rank_with_shared_buffers_fails_survivors() {
    killed_rank_over_shared_memory(true);
}

fn killed_rank_over_shared_memory(shared: bool) {
    let _serial = serial();
    let store = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let job = job_id("dies-shm");
    let ranks: Vec<Running> = (0..3)
        .map(|r| {
            let mut env = rank_env(r, 3, store, &job, KILL_TIMEOUT_S);
            env.push(("FERRO_TRANSPORTS", "shm".to_string()));
            env.push(("SHARED_BUFFERS", if shared { "1" } else { "0" }.to_string()));
            Running::spawn(self_command("child_dies_mid_allreduce", "dies", &env))
        })
        .collect();
    let pids: Vec<u32> = ranks.iter().map(Running::id).collect();
    let outs: Vec<Finished> = ranks
        .into_iter()
        .map(|p| p.finish(Duration::from_secs(120)))
        .collect();
    let all = || common::child::dump_all("rank", &outs);
    let killed = outs[2].tagged("KILLING ");
    assert_eq!(killed.len(), 1, "{}", all());
    let died_at: u128 = field(&killed[0], "at_ms");
    for (r, out) in outs.iter().take(2).enumerate() {
        assert!(out.success(), "survivor {r}: {}", all());
        let failed = out.tagged("FAILED ");
        assert_eq!(failed.len(), 1, "survivor {r}: {}", all());
        let line = &failed[0];
        let after_ms = field::<u128>(line, "at_ms").saturating_sub(died_at);
        // Long before the deadline: a watcher thread wakes the rank when the peer's pidfd fires.
        assert!(
            after_ms < u128::from(KILL_TIMEOUT_S) * 1000 / 4,
            "survivor {r} noticed after {after_ms} ms: {line}"
        );
        assert!(line.contains("rank 2 (shm, pid"), "survivor {r}: {line}");
        println!("survivor {r}: {after_ms} ms after the kill: {line}");
    }
    for (r, &pid) in pids.iter().enumerate() {
        let left = shm_files_of(pid);
        assert!(left.is_empty(), "rank {r} (pid {pid}) left {left:?}");
    }
}
