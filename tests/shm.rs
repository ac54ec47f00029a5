//! The shared-memory transport inside the communicator: the conformance suite over shared
//! memory (threads and processes), transport selection per peer pair (host ids, overrides,
//! fallback when shared memory cannot be set up), split, and oversubscription (8 ranks on this
//! 2-core machine through a 64 MiB allreduce sweep).
//!
//! The test binary runs itself as the ranks of the process tests (see `common::child`).

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::child::{self, expected_cases, ferrorun_self, field, sweep_named};
use common::conformance::{run_sweep, Sweep};
use common::threads::{self, on_all};
use ferroccl::bootstrap::{MemoryStore, Store};
use ferroccl::{Communicator, Config, ReduceOp};

/// Process jobs of this file run one at a time (2 cores; up to 8 ranks share them).
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

const JOB_LIMIT: Duration = Duration::from_secs(300);

fn config(transports: &[&str]) -> Config {
    Config {
        timeout: Duration::from_secs(60),
        transports: transports.iter().map(|t| t.to_string()).collect(),
        ..Config::default()
    }
}

fn group(configs: Vec<Config>) -> Vec<Communicator> {
    threads::group(configs, 0x5348_4d00 << 24)
}

fn sweep_ok(comms: &[Communicator], sw: &Sweep, seed: u64) {
    for (r, res) in on_all(comms, |c| run_sweep(c, sw, seed))
        .into_iter()
        .enumerate()
    {
        if let Err(e) = res {
            panic!("{} ranks, rank {r}: {e}", comms.len());
        }
    }
}

/// Files of this process's segments left in /dev/shm (there must be none after setup).
fn own_segments() -> Vec<String> {
    let tag = format!("-p{}-", std::process::id());
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("ferroccl-") && n.contains(&tag))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn conformance_over_shared_memory_threads() {
    for n in [2, 3, 5, 8] {
        let comms = group(vec![config(&["shm"]); n]);
        for c in &comms {
            assert_eq!(c.local_nranks(), n);
            assert_eq!(c.local_rank(), c.rank());
            assert_eq!(c.host_id(), comms[0].host_id());
            for p in 0..n {
                let want = (p != c.rank()).then_some("shm");
                assert_eq!(c.transport(p), want, "rank {} peer {p}", c.rank());
            }
        }
        sweep_ok(&comms, &Sweep::full_small(), 300 + n as u64);
        sweep_ok(&comms, &Sweep::large(), 400 + n as u64);
    }
}

#[test]
fn conformance_over_small_rings_without_cma() {
    // A 4 KiB ring and no cross-memory attach: every large message wraps the ring many times.
    let cfg = Config {
        shm_ring_bytes: 4096,
        shm_cma: false,
        slice_bytes: 64 << 10,
        ..config(&["shm"])
    };
    let comms = group(vec![cfg; 3]);
    let mut sw = Sweep::large();
    sw.counts = vec![100_003];
    sweep_ok(&comms, &sw, 77);
}

#[test]
fn conformance_with_cma_for_every_message() {
    // Cross-memory attach from 1 byte up: every payload is read from the sender's buffer.
    let cfg = Config {
        shm_cma: true,
        shm_cma_min: 1,
        ..config(&["shm"])
    };
    let comms = group(vec![cfg; 4]);
    let mut sw = Sweep::full_small();
    sw.counts = vec![1, 7, 1000, 100_003];
    sweep_ok(&comms, &sw, 91);
}

#[test]
fn tcp_only_when_asked() {
    let comms = group(vec![config(&["tcp"]); 3]);
    for c in &comms {
        for p in (0..3).filter(|&p| p != c.rank()) {
            assert_eq!(c.transport(p), Some("tcp"));
        }
        assert_eq!(c.local_nranks(), 3);
    }
    sweep_ok(&comms, &Sweep::large(), 5);
    // A preference list with tcp first also means TCP everywhere.
    let comms = group(vec![config(&["tcp", "shm"]); 2]);
    assert_eq!(comms[0].transport(1), Some("tcp"));
}

#[test]
fn host_ids_pick_shared_memory_inside_hosts_and_tcp_between() {
    // Ranks 0, 2, 4 claim host "a", ranks 1, 3 host "b" (FERRO_HOST_ID).
    let configs: Vec<Config> = (0..5)
        .map(|r| Config {
            host_id: Some(if r % 2 == 0 { "a" } else { "b" }.to_string()),
            ..config(&["shm", "tcp"])
        })
        .collect();
    let comms = group(configs);
    for c in &comms {
        let r = c.rank();
        let mine = r % 2;
        assert_eq!(c.local_nranks(), if mine == 0 { 3 } else { 2 }, "rank {r}");
        assert_eq!(c.local_rank(), r / 2, "rank {r}");
        for p in (0..5).filter(|&p| p != r) {
            let want = if p % 2 == mine { "shm" } else { "tcp" };
            assert_eq!(c.transport(p), Some(want), "rank {r} peer {p}");
            assert_eq!(c.host_id() == comms[p].host_id(), p % 2 == mine);
        }
    }
    sweep_ok(&comms, &Sweep::full_small(), 17);
    sweep_ok(&comms, &Sweep::large(), 18);
    assert!(own_segments().is_empty(), "{:?}", own_segments());
}

#[test]
fn shm_only_across_hosts_is_a_clear_error() {
    let configs: Vec<Config> = (0..2)
        .map(|r| Config {
            host_id: Some(format!("host{r}")),
            timeout: Duration::from_secs(10),
            ..config(&["shm"])
        })
        .collect();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let hs: Vec<_> = configs
        .into_iter()
        .enumerate()
        .map(|(r, cfg)| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || Communicator::init(store, r, 2, 99, cfg))
        })
        .collect();
    for h in hs {
        let e = h
            .join()
            .expect("init thread")
            .expect_err("no transport reaches the peer");
        assert!(e.message().contains("FERRO_TRANSPORTS=shm"), "{e}");
        assert!(e.message().contains("on another host"), "{e}");
    }
}

#[test]
fn unusable_shm_directory_falls_back_to_tcp() {
    let cfg = Config {
        shm_dir: PathBuf::from("/nonexistent/ferroccl-shm"),
        ..config(&["shm", "tcp"])
    };
    let comms = group(vec![cfg; 3]);
    for c in &comms {
        for p in (0..3).filter(|&p| p != c.rank()) {
            assert_eq!(c.transport(p), Some("tcp"));
        }
    }
    sweep_ok(&comms, &Sweep::large(), 3);
}

/// A tmpfs of `size` mounted for the test (root only), unmounted on drop.
struct SmallTmpfs(PathBuf);

impl SmallTmpfs {
    fn mount(size: &str) -> Option<SmallTmpfs> {
        let dir = std::env::temp_dir().join(format!("ferroccl-small-shm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            Some(SmallTmpfs(dir))
        } else {
            let _ = std::fs::remove_dir(&dir);
            None
        }
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn a_too_small_shm_falls_back_to_tcp() {
    let Some(fs) = SmallTmpfs::mount("1m") else {
        println!("skipped: cannot mount a small tmpfs here (not root?)");
        return;
    };
    // Two ranks, each needing one 4 MiB ring: /dev/shm of 1 MiB cannot hold it.
    let cfg = Config {
        shm_dir: fs.0.clone(),
        ..config(&["shm", "tcp"])
    };
    let comms = group(vec![cfg; 2]);
    assert_eq!(comms[0].transport(1), Some("tcp"));
    assert_eq!(comms[1].transport(0), Some("tcp"));
    sweep_ok(&comms, &Sweep::large(), 4);
    // Nothing was left in the small file system.
    let left: Vec<_> = std::fs::read_dir(&fs.0).unwrap().flatten().collect();
    assert!(left.is_empty(), "{left:?}");
    // Small rings fit: then shared memory is used.
    let cfg = Config {
        shm_dir: fs.0.clone(),
        shm_ring_bytes: 64 << 10,
        ..config(&["shm", "tcp"])
    };
    let comms = group(vec![cfg; 2]);
    assert_eq!(comms[0].transport(1), Some("shm"));
    sweep_ok(&comms, &Sweep::large(), 6);
    drop(comms);
    let left: Vec<_> = std::fs::read_dir(&fs.0).unwrap().flatten().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn split_keeps_shared_memory_within_hosts() {
    let configs: Vec<Config> = (0..6)
        .map(|r| Config {
            host_id: Some(if r < 3 { "x" } else { "y" }.to_string()),
            ..config(&["shm", "tcp"])
        })
        .collect();
    let comms = group(configs);
    // Colour by parity: {0, 2, 4} and {1, 3, 5}, each spanning both hosts.
    let subs = on_all(&comms, |c| {
        c.split(Some(c.rank() as u32 % 2), -(c.rank() as i64))
            .expect("split")
            .expect("member")
    });
    for (old, s) in subs.iter().enumerate() {
        assert_eq!(s.nranks(), 3);
        let members: Vec<usize> = (0..6).filter(|r| r % 2 == old % 2).rev().collect();
        assert_eq!(members[s.rank()], old);
        for p in (0..3).filter(|&p| p != s.rank()) {
            let same = (members[p] < 3) == (old < 3);
            let want = if same { "shm" } else { "tcp" };
            assert_eq!(s.transport(p), Some(want), "old rank {old}, new peer {p}");
        }
        assert_eq!(s.host_id(), comms[old].host_id());
    }
    sweep_ok(&subs, &Sweep::large(), 8);
    assert!(own_segments().is_empty(), "{:?}", own_segments());
}

#[test]
fn idle_rank_sleeps_and_wakes_for_the_next_message() {
    // Rank 1 waits 300 ms for rank 0; it must not burn a core meanwhile, and must wake promptly.
    let comms = group(vec![config(&["shm"]); 2]);
    let res = on_all(&comms, |c| {
        let mut buf = [0u64; 4];
        if c.rank() == 0 {
            std::thread::sleep(Duration::from_millis(300));
            buf = [1, 2, 3, 4];
            c.send(&buf, 1).expect("send");
            (Duration::ZERO, Duration::ZERO)
        } else {
            let cpu0 = thread_cpu();
            let t = Instant::now();
            c.recv(&mut buf, 0).expect("recv");
            assert_eq!(buf, [1, 2, 3, 4]);
            (t.elapsed(), thread_cpu() - cpu0)
        }
    });
    let (wall, cpu) = res[1];
    assert!(wall >= Duration::from_millis(250), "{wall:?}");
    assert!(wall < Duration::from_millis(1000), "woke late: {wall:?}");
    assert!(
        cpu < Duration::from_millis(60),
        "waiting used {cpu:?} of CPU in {wall:?}"
    );
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live timespec the call fills in.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

// ---------------------------------------------------------------------------------------------
// Processes.

/// A rank of a process job: prints its transports, runs the sweep named by `FERRO_TEST_SWEEP`.
#[test]
fn child_shm_conformance() {
    if !child::is_role("shm-conformance") {
        return;
    }
    let comm = Communicator::from_env().expect("from_env");
    let (r, n) = (comm.rank(), comm.nranks());
    let peers: Vec<String> = (0..n)
        .filter(|&p| p != r)
        .map(|p| format!("{p}:{}", comm.transport(p).unwrap_or("none")))
        .collect();
    println!(
        "PEERS rank={r} local={}/{} via={}",
        comm.local_rank(),
        comm.local_nranks(),
        peers.join(",")
    );
    let sweep = sweep_named(&child::env_var::<String>(child::SWEEP_VAR));
    match run_sweep(&comm, &sweep, 700 + n as u64) {
        Ok(cases) => println!("CASES rank={r} nranks={n} cases={cases}"),
        Err(e) => panic!("nranks {n}, rank {r}: {e}"),
    }
    comm.destroy().expect("destroy");
}

fn shm_processes(n: usize, sweep: &str, extra: &[(&str, String)]) -> child::Finished {
    let _serial = serial();
    let mut env = vec![
        (child::SWEEP_VAR, sweep.to_string()),
        ("FERRO_TIMEOUT", "60".to_string()),
        ("FERRO_DEBUG", "INFO".to_string()),
    ];
    env.extend(extra.iter().cloned());
    let out = ferrorun_self(
        n,
        None,
        "child_shm_conformance",
        "shm-conformance",
        &env,
        JOB_LIMIT,
    );
    assert!(out.success(), "{}", out.dump());
    let want = expected_cases(&sweep_named(sweep));
    let lines = out.tagged("CASES ");
    assert_eq!(lines.len(), n, "{}", out.dump());
    for l in &lines {
        assert_eq!(field::<usize>(l, "cases"), want, "{l}");
    }
    out
}

#[test]
fn conformance_over_shared_memory_processes() {
    for n in [2, 4] {
        let out = shm_processes(n, "reduced", &[]);
        let peers = out.tagged("PEERS ");
        assert_eq!(peers.len(), n, "{}", out.dump());
        let ranks: BTreeSet<usize> = peers.iter().map(|l| field(l, "rank")).collect();
        assert_eq!(ranks, (0..n).collect());
        for l in &peers {
            let r: usize = field(l, "rank");
            assert_eq!(field::<String>(l, "local"), format!("{r}/{n}"), "{l}");
            for pv in field::<String>(l, "via").split(',') {
                assert!(pv.ends_with(":shm"), "{l}");
            }
        }
        // The choice is logged per peer, with cross-memory attach where the kernel allows it.
        let logged = out.tagged("TRANSPORT: ");
        assert_eq!(logged.len(), n, "{}", out.dump());
        assert!(logged.iter().all(|l| !l.contains(":tcp")), "{logged:?}");
    }
    let out = shm_processes(3, "large", &[]);
    assert!(out.tagged("TRANSPORT: ").iter().all(|l| l.contains(":shm")));
}

#[test]
fn env_overrides_choose_tcp_for_processes() {
    for (var, val) in [("FERRO_TRANSPORTS", "tcp"), ("FERRO_SHM_DISABLE", "1")] {
        let out = shm_processes(2, "large", &[(var, val.to_string())]);
        for l in out.tagged("PEERS ") {
            assert!(field::<String>(&l, "via").ends_with(":tcp"), "{var}: {l}");
        }
    }
}

/// A rank of the oversubscription job: an allreduce sweep from 8 B to 64 MiB (x4 per size),
/// each result checked, then prints how long the slowest size took.
#[test]
fn child_allreduce_sweep() {
    if !child::is_role("allreduce-sweep") {
        return;
    }
    let comm = Communicator::from_env().expect("from_env");
    let (r, n) = (comm.rank(), comm.nranks());
    let max = 16usize << 20; // f32 elements: 64 MiB
    let send: Vec<f32> = (0..max).map(|i| ((i % 1021) * (r + 1)) as f32).collect();
    let mut recv = vec![0f32; max];
    let total = (n * (n + 1) / 2) as f32;
    let start = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut count = 2usize;
    while count <= max {
        let t = Instant::now();
        comm.all_reduce(&send[..count], &mut recv[..count], ReduceOp::Sum)
            .unwrap_or_else(|e| panic!("rank {r}, count {count}: {e}"));
        slowest = slowest.max(t.elapsed());
        for i in [0, 1, count / 2, count - 1] {
            assert_eq!(
                recv[i],
                (i % 1021) as f32 * total,
                "rank {r} count {count} [{i}]"
            );
        }
        count *= 4;
    }
    println!(
        "SWEPT rank={r} nranks={n} secs={:.2} slowest_ms={}",
        start.elapsed().as_secs_f64(),
        slowest.as_millis()
    );
    comm.destroy().expect("destroy");
}

#[test]
fn eight_ranks_on_two_cores_finish_a_64mib_allreduce_sweep() {
    let _serial = serial();
    let t = Instant::now();
    let out = ferrorun_self(
        8,
        None,
        "child_allreduce_sweep",
        "allreduce-sweep",
        &[
            ("FERRO_TIMEOUT", "30".to_string()),
            ("FERRO_DEBUG", "INFO".to_string()),
        ],
        Duration::from_secs(240),
    );
    assert!(out.success(), "{}", out.dump());
    let lines = out.tagged("SWEPT ");
    assert_eq!(lines.len(), 8, "{}", out.dump());
    assert!(
        out.tagged("TRANSPORT: ")
            .iter()
            .all(|l| !l.contains(":tcp")),
        "{}",
        out.dump()
    );
    // No stalls: even the 64 MiB allreduce over 8 ranks on 2 cores takes seconds, not the
    // 30 s deadline; the whole sweep fits in two minutes.
    for l in &lines {
        assert!(field::<u64>(l, "slowest_ms") < 20_000, "{l}");
    }
    println!(
        "8 ranks, 8 B..64 MiB allreduce sweep: {:.1} s; {}",
        t.elapsed().as_secs_f64(),
        lines.join(" | ")
    );
    assert!(t.elapsed() < Duration::from_secs(150), "{:?}", t.elapsed());
}
