//! Pairs over the host provider on threads of this process; the conformance suite.

use ferroccl_transport::{Connection, Header, Payload, PayloadMut, Progress};
use ferroccl_transport_testkit::conformance::{self, Options};
use ferroccl_transport_testkit::drive::{assert_same, exchange, patterns};

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use super::*;

fn small() -> P2pConfig {
    P2pConfig {
        nslots: 4,
        slot_bytes: 64 << 10,
        ..P2pConfig::host()
    }
}

/// A directory of its own for a test's files.
fn tmp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(file_name(0, 0, tag));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn files_in(d: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(d)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn conformance_host_provider() {
    conformance::run(&Options::new("p2p(host)"), || host_pair(&small()).unwrap());
}

#[test]
fn conformance_host_provider_threads_one_slot() {
    let cfg = P2pConfig {
        nslots: 1,
        slot_bytes: 4096,
        ..P2pConfig::host()
    };
    let opts = Options {
        threads: true,
        partial_bytes: 1 << 20,
        large_bytes: 8 << 20,
        ..Options::new("p2p(host, 1 slot)")
    };
    conformance::run(&opts, || host_pair(&cfg).unwrap());
}

#[test]
fn setup_leaves_no_files_and_sizes_cross_slot_edges() {
    let dir = tmp_dir("edges");
    let cfg = P2pConfig {
        nslots: 2,
        slot_bytes: 4096,
        dir: dir.clone(),
        ..P2pConfig::host()
    };
    let (mut a, mut b) = host_pair(&cfg).unwrap();
    assert!(files_in(&dir).is_empty(), "{:?}", files_in(&dir));
    let msgs = patterns(&[0, 1, 4095, 4096, 4097, 8192, 8193, 3 * 4096 + 5, 0]);
    for (k, (g, m)) in exchange(&mut a, &mut b, &msgs)
        .iter()
        .zip(&msgs)
        .enumerate()
    {
        assert_same(format_args!("message {k}"), g, m);
    }
    assert!(a.describe().contains("test stand-in"), "{}", a.describe());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn device_payloads_are_refused_by_the_host_provider() {
    let (mut a, mut b) = host_pair(&small()).unwrap();
    let m = ferroccl_transport::MemRef {
        space: ferroccl_transport::MemSpace::Cuda(0),
        addr: 4096,
        len: 8,
    };
    let h = Header {
        len: 8,
        ..Header::default()
    };
    let e = a
        .send(&h, Payload::Device(m), &mut Progress::default())
        .unwrap_err();
    assert!(
        e.message().contains("host provider") && e.message().contains("cuda device 0"),
        "{e}"
    );
    // A host message into a device destination: refused once the header is in.
    ferroccl_transport_testkit::drive::send_all(&mut *a, &[5u8; 8], 0);
    let (mut rh, mut rp) = (Header::default(), Progress::default());
    let e = ferroccl_transport_testkit::drive::wait_for_error("the device destination", || {
        b.recv(&mut rh, PayloadMut::Device(m), &mut rp)
    });
    assert!(
        e.message().contains("host provider") && e.message().contains("rank 0"),
        "{e}"
    );
}

#[test]
fn settings_come_from_the_environment_with_clear_errors() {
    // Only variables no other test of this binary reads.
    assert_eq!(env_num("FERRO_P2P_TEST_UNSET", 1, 9, 4), Ok(4));
    std::env::set_var("FERRO_P2P_TEST_K", "64K");
    assert_eq!(env_num("FERRO_P2P_TEST_K", 4096, 1 << 26, 1), Ok(65536));
    std::env::set_var("FERRO_P2P_TEST_BAD", "lots");
    let e = env_num("FERRO_P2P_TEST_BAD", 1, 64, 8).unwrap_err();
    assert!(
        e.contains("FERRO_P2P_TEST_BAD=lots") && e.contains("1..=64"),
        "{e}"
    );
}

#[test]
fn mismatched_rings_decline_with_the_reason() {
    let desc = RankDesc {
        host: 1,
        pid: std::process::id(),
    };
    let ranks = [desc, desc];
    let ctx = |rank| SetupCtx {
        rank,
        nranks: 2,
        comm_id: 0x77,
        ranks: &ranks,
        deadline: Instant::now() + Duration::from_secs(5),
    };
    let dir = tmp_dir("mismatch");
    let cfg = P2pConfig {
        dir: dir.clone(),
        ..small()
    };
    let mut t0 = P2pTransport::new(Ok(cfg.clone()), false);
    let mut t1 = P2pTransport::new(Ok(P2pConfig { nslots: 8, ..cfg }), false);
    let h0 = t0.listen(&ctx(0), &[1]).unwrap();
    let h1 = t1.listen(&ctx(1), &[0]).unwrap();
    let why = t0.attach(&ctx(0), 1, &h1).unwrap_err();
    assert!(
        why.contains("FERRO_P2P_SLOTS") && why.contains("rank 1"),
        "{why}"
    );
    let why = t1.attach(&ctx(1), 0, &h0[..10]).unwrap_err();
    assert!(why.contains("bad p2p handle"), "{why}");
    // Another host is never offered.
    let other = [desc, RankDesc { host: 2, ..desc }];
    let c = SetupCtx {
        ranks: &other,
        ..ctx(0)
    };
    assert!(t0.can_connect(&c, 1).unwrap_err().contains("another host"));
    t0.connect(&ctx(0), &[]).unwrap();
    t1.connect(&ctx(1), &[]).unwrap();
    assert!(files_in(&dir).is_empty(), "{:?}", files_in(&dir));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_cuda_provider_without_a_driver_is_not_offered() {
    if ferroccl_cuda::driver::driver().is_ok() {
        eprintln!("skipped: this machine has a CUDA driver");
        return;
    }
    let desc = RankDesc {
        host: 1,
        pid: std::process::id(),
    };
    let ranks = [desc, desc];
    let ctx = SetupCtx {
        rank: 0,
        nranks: 2,
        comm_id: 1,
        ranks: &ranks,
        deadline: Instant::now() + Duration::from_secs(5),
    };
    let t = P2pTransport::new(Ok(P2pConfig::default()), false);
    let why = t.can_connect(&ctx, 1).unwrap_err();
    assert!(why.contains("libcuda.so.1"), "{why}");
    let e = host_pair(&P2pConfig::default()).unwrap_err();
    assert!(e.message().contains("libcuda.so.1"), "{e}");
}

/// Set by `scripts/gpu-check.sh`: the tests below run the cuda provider (and fail without a
/// usable GPU) instead of the host one or skipping.
const GPU_CHECK: &str = "FERRO_P2P_GPU_CHECK";

fn gpu_check() -> bool {
    std::env::var_os(GPU_CHECK).is_some()
}

/// The conformance suite with the cuda provider (device slots, host buffers, ranks as threads
/// of one process): only under `FERRO_P2P_GPU_CHECK` (scripts/gpu-check.sh).
#[test]
fn conformance_cuda_provider_on_a_gpu() {
    if !gpu_check() {
        eprintln!("skipped: set {GPU_CHECK}=1 on a machine with a GPU");
        return;
    }
    let opts = Options {
        threads: true,
        // More than the default ring (8 slots of 4 MiB), so that the sender cannot finish
        // before the receiver hands slots back, however fast the copies run.
        partial_bytes: 40 << 20,
        ..Options::new("p2p(cuda)")
    };
    conformance::run(&opts, || {
        // Both ranks on device 0: several ranks on one GPU, which every GPU machine has.
        let cfg = P2pConfig {
            device: Some(0),
            ..P2pConfig::default()
        };
        host_pair(&cfg).unwrap_or_else(|e| panic!("cuda pair: {e}"))
    });
}

const ROLE: &str = "FERRO_P2P_TEST_ROLE";
const DIR: &str = "FERRO_P2P_TEST_DIR";

/// Waits (bounded) for `dir/name` and returns its bytes.
fn await_file(dir: &std::path::Path, name: &str) -> Vec<u8> {
    let start = Instant::now();
    loop {
        if let Ok(b) = std::fs::read(dir.join(name)) {
            return b;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "waited 30 s for {name} in {}",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Writes `dir/name` whole (a rename, so the reader never sees half of it).
fn put_file(dir: &std::path::Path, name: &str, bytes: &[u8]) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

/// One rank of a two-process job: setup through files in `dir` (handles, then "attached"),
/// then rank 0 sends messages of awkward sizes and rank 1 echoes each back.
fn process_rank(rank: usize, dir: &std::path::Path, cfg: &P2pConfig, pids: [u32; 2]) -> usize {
    let ranks = [
        RankDesc {
            host: 1,
            pid: pids[0],
        },
        RankDesc {
            host: 1,
            pid: pids[1],
        },
    ];
    let ctx = SetupCtx {
        rank,
        nranks: 2,
        comm_id: 0x5032_5031,
        ranks: &ranks,
        deadline: Instant::now() + Duration::from_secs(30),
    };
    let peer = 1 - rank;
    let mut t = P2pTransport::new(Ok(cfg.clone()), true);
    t.can_connect(&ctx, peer).unwrap();
    put_file(dir, &format!("h{rank}"), &t.listen(&ctx, &[peer]).unwrap());
    let h = await_file(dir, &format!("h{peer}"));
    t.attach(&ctx, peer, &h)
        .unwrap_or_else(|why| panic!("rank {rank}: {why}"));
    put_file(dir, &format!("a{rank}"), b"ok");
    await_file(dir, &format!("a{peer}"));
    let mut c = t.connect(&ctx, &[peer]).unwrap().pop().unwrap();
    let sizes = [0, 1, 4095, 4096, 4097, 100_003, 3 << 20, 7];
    let msgs = patterns(&sizes);
    for (k, m) in msgs.iter().enumerate() {
        if rank == 0 {
            ferroccl_transport_testkit::drive::send_all(&mut *c, m, k as u64);
            let back = ferroccl_transport_testkit::drive::recv_all(&mut *c, m.len(), k as u64);
            assert_same(format_args!("echo of message {k}"), &back, m);
        } else {
            let got = ferroccl_transport_testkit::drive::recv_all(&mut *c, m.len(), k as u64);
            assert_same(format_args!("message {k}"), &got, m);
            ferroccl_transport_testkit::drive::send_all(&mut *c, &got, k as u64);
        }
    }
    c.shutdown();
    msgs.len()
}

/// The child of [`two_processes_exchange_through_the_provider`].
#[test]
fn child_process_rank() {
    let Ok(rank) = std::env::var(ROLE) else {
        return;
    };
    let dir = PathBuf::from(std::env::var(DIR).unwrap());
    let pid0: u32 = std::str::from_utf8(&await_file(&dir, "pid0"))
        .unwrap()
        .parse()
        .unwrap();
    let cfg = P2pConfig {
        dir: dir.clone(),
        ..P2pConfig::from_env().unwrap()
    };
    let n = process_rank(
        rank.parse().unwrap(),
        &dir,
        &cfg,
        [pid0, std::process::id()],
    );
    println!("CHILD DONE messages={n}");
}

/// Two processes connected by the transport's own setup (handles exchanged through files)
/// echo messages of awkward sizes: the host provider here; the cuda provider (CUDA IPC across
/// processes, both on device 0) under `FERRO_P2P_GPU_CHECK`.
#[test]
fn two_processes_exchange_through_the_provider() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let dir = tmp_dir("procs");
    let provider = if gpu_check() { "cuda" } else { "host" };
    let cfg = P2pConfig {
        nslots: 4,
        slot_bytes: 64 << 10,
        dir: dir.clone(),
        ..if gpu_check() {
            P2pConfig {
                device: Some(0),
                ..P2pConfig::default()
            }
        } else {
            P2pConfig::host()
        }
    };
    put_file(&dir, "pid0", std::process::id().to_string().as_bytes());
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "tests::child_process_rank", "--nocapture"])
        .env(ROLE, "1")
        .env(DIR, &dir)
        .env("FERRO_P2P_PROVIDER", provider)
        .env("FERRO_P2P_SLOTS", "4")
        .env("FERRO_P2P_SLOT_BYTES", "64K")
        .env("FERRO_P2P_DEVICE", "0")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let child_pid = child.id();
    let run =
        std::panic::catch_unwind(|| process_rank(0, &dir, &cfg, [std::process::id(), child_pid]));
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let _ = std::fs::remove_dir_all(&dir);
    let n = run.unwrap_or_else(|_| panic!("rank 0 failed; child: {text}"));
    assert!(out.status.success(), "child failed: {text}");
    assert!(text.contains(&format!("CHILD DONE messages={n}")), "{text}");
}

/// A lent device receive hands every byte over once, in order, in whole 16-byte units but
/// for a message's last piece, straight from the slots; messages larger than the ring keep
/// flowing (each slot is handed back once its piece's sink has returned).
#[test]
fn lent_device_receives_hand_over_every_byte_once_in_whole_units() {
    let cfg = P2pConfig {
        nslots: 2,
        slot_bytes: 4096,
        ..P2pConfig::host()
    };
    let (mut a, mut b) = host_pair(&cfg).unwrap();
    assert!(b.lends_device());
    let msgs = patterns(&[0, 1, 16, 4096, 4097, 3 * 4096 + 5, 40_000]);
    std::thread::scope(|s| {
        let sent = &msgs;
        s.spawn(move || {
            for (k, m) in sent.iter().enumerate() {
                ferroccl_transport_testkit::drive::send_all(&mut *a, m, k as u64);
            }
        });
        for (k, m) in msgs.iter().enumerate() {
            let (mut h, mut p) = (Header::default(), Progress::default());
            let mut got = Vec::new();
            let mut pieces = Vec::new();
            let mut sink = |off: usize, piece: Payload<'_>| {
                let Payload::Host(bytes) = piece else {
                    panic!("the host provider lends host memory");
                };
                assert_eq!(
                    off,
                    got.len(),
                    "message {k}: pieces in order, each byte once"
                );
                got.extend_from_slice(bytes);
                pieces.push(bytes.len());
                Ok(None)
            };
            ferroccl_transport_testkit::drive::wait_for(format_args!("message {k}"), || {
                b.recv_lent_device(&mut h, m.len(), &mut p, &mut sink)
                    .unwrap_or_else(|e| panic!("message {k}: {e}"))
                    .then_some(())
            });
            assert_eq!(h.len as usize, m.len(), "message {k}: header");
            assert_same(format_args!("message {k}"), &got, m);
            let whole = pieces.len().saturating_sub(1);
            assert!(
                pieces[..whole].iter().all(|n| n % 16 == 0),
                "message {k}: pieces {pieces:?}"
            );
        }
    });
    // Slots that are not whole 16-byte units are not lent.
    let odd = P2pConfig {
        slot_bytes: 4104,
        ..cfg
    };
    let (_c, d) = host_pair(&odd).unwrap();
    assert!(!d.lends_device());
}

/// Work still reading a lent slot, done once its gate opens.
#[derive(Debug)]
struct GateFence {
    open: Arc<AtomicBool>,
    waited: Arc<AtomicUsize>,
}

impl ferroccl_transport::Fence for GateFence {
    fn done(&mut self) -> ferroccl_transport::Result<bool> {
        Ok(self.open.load(Ordering::SeqCst))
    }
    fn wait(&mut self) -> ferroccl_transport::Result<()> {
        self.waited.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// A lent slot whose sink returned a fence stays lent until the fence is done: the sender
/// stops when every slot is lent, the receive is not complete, the connection says work is in
/// flight (no doorbell rings when a fence is done); once the fences are done the message
/// completes whole; and a connection dropped with a fence pending waits for it.
#[test]
fn lent_slots_wait_for_their_fences() {
    let cfg = P2pConfig {
        nslots: 2,
        slot_bytes: 4096,
        ..P2pConfig::host()
    };
    let (mut a, mut b) = host_pair(&cfg).unwrap();
    let msg = &patterns(&[5 * 4096 + 7])[0];
    let (open, waited) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let h_out = ferroccl_transport_testkit::drive::header(msg.len(), 0);
    let (mut hs, mut ps) = (h_out, Progress::default());
    let (mut h, mut p) = (Header::default(), Progress::default());
    let got = std::cell::RefCell::new(Vec::new());
    let mut sink = |off: usize, piece: Payload<'_>| {
        let Payload::Host(bytes) = piece else {
            panic!("the host provider lends host memory");
        };
        let mut got = got.borrow_mut();
        assert_eq!(off, got.len(), "pieces in order, each byte once");
        got.extend_from_slice(bytes);
        let f: Box<dyn ferroccl_transport::Fence> = Box::new(GateFence {
            open: Arc::clone(&open),
            waited: Arc::clone(&waited),
        });
        Ok(Some(f))
    };
    let mut sent = false;
    let mut received = false;
    for _ in 0..200 {
        sent |= a.send(&hs, Payload::Host(msg), &mut ps).unwrap();
        received |= b
            .recv_lent_device(&mut h, msg.len(), &mut p, &mut sink)
            .unwrap();
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    assert!(
        !sent && !received,
        "nothing completes while the fences are pending"
    );
    assert_eq!(got.borrow().len(), 2 * 4096, "two slots lent, no more");
    assert!(b.in_flight(), "pending fences are work in flight");
    open.store(true, Ordering::SeqCst);
    ferroccl_transport_testkit::drive::wait_for("the message after the fences", || {
        sent |= a.send(&hs, Payload::Host(msg), &mut ps).unwrap();
        received |= b
            .recv_lent_device(&mut h, msg.len(), &mut p, &mut sink)
            .unwrap();
        (sent && received).then_some(())
    });
    assert_same("the message after the fences", &got.borrow(), msg);
    assert!(!b.in_flight());
    assert_eq!(
        waited.load(Ordering::SeqCst),
        0,
        "done fences are not waited for"
    );

    // A connection dropped with a lent slot's fence pending waits for it.
    open.store(false, Ordering::SeqCst);
    hs.seq += 1;
    let (mut h2, mut p2, mut ps2) = (Header::default(), Progress::default(), Progress::default());
    got.borrow_mut().clear();
    ferroccl_transport_testkit::drive::wait_for("a slot lent", || {
        let _ = a.send(&hs, Payload::Host(msg), &mut ps2).unwrap();
        let _ = b
            .recv_lent_device(&mut h2, msg.len(), &mut p2, &mut sink)
            .unwrap();
        (!got.borrow().is_empty()).then_some(())
    });
    drop(b);
    assert!(
        waited.load(Ordering::SeqCst) >= 1,
        "the pending fence was waited for"
    );
}

/// Sends `msg` from `a` to `b` through the ordered stream, both sides driven to the end.
fn stream_message(a: &mut dyn Connection, b: &mut dyn Connection, msg: &[u8]) -> Vec<u8> {
    let h = Header {
        len: msg.len() as u64,
        ..Header::default()
    };
    let (mut sp, mut rp) = (Progress::default(), Progress::default());
    let (mut rh, mut got) = (Header::default(), vec![0u8; msg.len()]);
    let (mut sent, mut recvd) = (false, false);
    while !(sent && recvd) {
        if !sent {
            sent = a.send(&h, Payload::Host(msg), &mut sp).unwrap();
        }
        if !recvd {
            recvd = b
                .recv(&mut rh, PayloadMut::Host(&mut got), &mut rp)
                .unwrap();
        }
    }
    assert_eq!(rh, h);
    got
}

#[test]
fn the_lane_carries_tiny_messages_beside_the_stream() {
    use ferroccl_transport::LaneTake;
    let (mut a, mut b) = host_pair(&small()).unwrap();
    let cap = a.small_lane().unwrap().capacity();
    assert_eq!(cap, ferroccl_transport_shm::LANE_BYTES);
    let mut out = vec![0u8; cap];
    // Each direction, messages 0, 1, 2 (boxes 0, 1, 0), every length edge.
    for n in 0..3u64 {
        for forward in [true, false] {
            let (from, to) = if forward {
                (&mut a, &mut b)
            } else {
                (&mut b, &mut a)
            };
            let len = [cap, 1, 0][n as usize];
            let data: Vec<u8> = (0..len).map(|i| (i as u64 * 31 + n) as u8).collect();
            let lane = to.small_lane().unwrap();
            assert_eq!(lane.take(n, &mut out[..len]).unwrap(), LaneTake::Empty);
            from.small_lane().unwrap().put(n, [n, 7, 9], &data).unwrap();
            let lane = to.small_lane().unwrap();
            assert_eq!(lane.take(n + 1, &mut out[..len]).unwrap(), LaneTake::Empty);
            assert_eq!(
                lane.take(n, &mut out[..len]).unwrap(),
                LaneTake::Arrived([n, 7, 9])
            );
            assert_eq!(out[..len], data[..], "message {n}");
        }
    }
    let too_big = vec![0u8; cap + 1];
    let e = a
        .small_lane()
        .unwrap()
        .put(3, [0; 3], &too_big)
        .unwrap_err();
    assert!(e.message().contains("at most"), "{e}");

    // A peer that went on to the stream instead: the lane says so, and the stream message is
    // read as usual.
    let msg: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    let h = Header {
        len: msg.len() as u64,
        ..Header::default()
    };
    let mut sp = Progress::default();
    while !a.send(&h, Payload::Host(&msg), &mut sp).unwrap() {
        if b.small_lane().unwrap().take(3, &mut out).unwrap() == LaneTake::Stream {
            break;
        }
    }
    assert_eq!(
        b.small_lane().unwrap().take(3, &mut out).unwrap(),
        LaneTake::Stream
    );
    let (mut rh, mut got, mut rp) = (Header::default(), vec![0u8; msg.len()], Progress::default());
    while !b
        .recv(&mut rh, PayloadMut::Host(&mut got), &mut rp)
        .unwrap()
    {
        a.send(&h, Payload::Host(&msg), &mut sp).unwrap();
    }
    assert_eq!(got, msg);
    assert_eq!(stream_message(&mut *b, &mut *a, &msg), msg);

    // A message written before the close still arrives; after it, the close is an error.
    a.small_lane().unwrap().put(3, [3, 3, 3], b"last").unwrap();
    a.shutdown();
    let lane = b.small_lane().unwrap();
    assert_eq!(
        lane.take(3, &mut out[..4]).unwrap(),
        LaneTake::Arrived([3, 3, 3])
    );
    assert!(lane.take(4, &mut out[..4]).is_err(), "the peer closed");
    assert!(
        a.small_lane().unwrap().put(4, [0; 3], b"x").is_err(),
        "closed here"
    );
}
