//! Pairs of connections over segments in a private directory, on threads of this process.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ferroccl_transport::{Connection, ErrorKind, Header, Payload, PayloadMut, Progress};

use ferroccl_transport_testkit::conformance::{self, Options};
use ferroccl_transport_testkit::drive::{assert_same, exchange_threaded, header, patterns};

use super::*;

fn tmp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "ferroccl-shm-test-{tag}-{}-{}",
        std::process::id(),
        segment_name(0, 0)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Two connected ranks (0 and 1) and the directory their segments lived in.
fn pair(cfg: &ShmConfig) -> (ShmConnection, ShmConnection) {
    let id = 0x1234_5678;
    let n0 = segment_name(id, 0);
    let n1 = segment_name(id, 1);
    let mut s0 = OwnSegment::create(&cfg.dir, &n0, id, 0, &[1], cfg.ring_bytes).unwrap();
    let mut s1 = OwnSegment::create(&cfg.dir, &n1, id, 1, &[0], cfg.ring_bytes).unwrap();
    let p1 = PeerSegment::open(&cfg.dir, &n1, id, 1, 0).unwrap();
    let p0 = PeerSegment::open(&cfg.dir, &n0, id, 0, 1).unwrap();
    if cfg.cma {
        ShmConnection::offer_cma(&s0, &p1);
        ShmConnection::offer_cma(&s1, &p0);
    }
    s0.unlink();
    s1.unlink();
    let c0 = ShmConnection::new(&s0, &p1, cfg).unwrap();
    let c1 = ShmConnection::new(&s1, &p0, cfg).unwrap();
    (c0, c1)
}

/// Sends one message of each of `sizes` from `a` to `b` on two threads; checks every byte and
/// header.
fn exchange(a: &mut ShmConnection, b: &mut ShmConnection, sizes: &[usize]) {
    let msgs = patterns(sizes);
    let got = exchange_threaded(a, b, &msgs);
    for (k, (g, m)) in got.iter().zip(&msgs).enumerate() {
        assert_same(format_args!("message {k}"), g, m);
    }
}

#[test]
fn conformance_inline_rings() {
    let dir = tmp_dir("conformance");
    let cfg = ShmConfig {
        ring_bytes: 1 << 16,
        cma: false,
        dir: dir.clone(),
        ..ShmConfig::default()
    };
    conformance::run(&Options::new("shm"), || {
        let (a, b) = pair(&cfg);
        (Box::new(a), Box::new(b))
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn conformance_cross_memory_attach() {
    let dir = tmp_dir("conformance-cma");
    let cfg = ShmConfig {
        ring_bytes: 1 << 16,
        cma: true,
        cma_min: 1 << 14,
        max_io: 1 << 16,
        dir: dir.clone(),
        ..ShmConfig::default()
    };
    let opts = Options {
        threads: true,
        ..Options::new("shm+cma")
    };
    conformance::run(&opts, || {
        let (a, b) = pair(&cfg);
        (Box::new(a), Box::new(b))
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn messages_of_every_size_arrive_intact_both_ways() {
    let dir = tmp_dir("sizes");
    let cfg = ShmConfig {
        ring_bytes: 4096,
        cma: false,
        max_io: 1000,
        dir: dir.clone(),
        ..ShmConfig::default()
    };
    let (mut a, mut b) = pair(&cfg);
    // The segments were unlinked once both sides mapped them.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    let sizes = [0, 1, 7, 40, 4095, 4096, 4097, 100_003, 3, 0];
    exchange(&mut a, &mut b, &sizes);
    exchange(&mut b, &mut a, &sizes);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn large_messages_by_cross_memory_attach() {
    let dir = tmp_dir("cma");
    let cfg = ShmConfig {
        ring_bytes: 1 << 16,
        cma: true,
        cma_min: 10_000,
        max_io: 1 << 16,
        dir: dir.clone(),
        ..ShmConfig::default()
    };
    let (mut a, mut b) = pair(&cfg);
    if !a.cma_enabled() {
        println!("process_vm_readv is not allowed here; only the ring path is checked");
    }
    exchange(&mut a, &mut b, &[9_999, 10_000, 1 << 20, 5, 3_000_017]);
    exchange(&mut b, &mut a, &[1 << 20, 17]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn shutdown_is_seen_by_the_peer_after_the_data() {
    let dir = tmp_dir("close");
    let cfg = ShmConfig {
        ring_bytes: 4096,
        dir: dir.clone(),
        ..ShmConfig::default()
    };
    let (mut a, mut b) = pair(&cfg);
    let m = [5u8, 6, 7];
    let mut p = Progress::default();
    assert!(a.send(&header(3, 9), Payload::Host(&m), &mut p).unwrap());
    a.shutdown();
    // The message sent before the close still arrives whole.
    let mut got = [0u8; 3];
    let mut h = Header::default();
    let mut p = Progress::default();
    while !b.recv(&mut h, PayloadMut::Host(&mut got), &mut p).unwrap() {}
    assert_eq!(got, m);
    let mut p = Progress::default();
    let e = b
        .recv(&mut h, PayloadMut::Host(&mut got), &mut p)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote);
    assert_eq!(e.peer(), Some(0));
    assert!(e.to_string().contains("rank 0 (shm, pid"), "{e}");
    let e = a
        .send(&header(3, 10), Payload::Host(&m), &mut Progress::default())
        .unwrap_err();
    assert!(e.to_string().contains("rank 1"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn doorbell_wakes_a_sleeper_and_times_out_otherwise() {
    let dir = tmp_dir("bell");
    let cfg = ShmConfig {
        ring_bytes: 4096,
        dir: dir.clone(),
        ..ShmConfig::default()
    };
    let (mut a, b) = pair(&cfg);
    let bell = b.doorbell().unwrap();
    let seen = bell.seq();
    let t = Instant::now();
    bell.wait(seen, Duration::from_millis(30));
    assert!(
        t.elapsed() >= Duration::from_millis(25),
        "{:?}",
        t.elapsed()
    );
    let seen = bell.seq();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(20));
            let mut p = Progress::default();
            assert!(a.send(&header(1, 0), Payload::Host(&[1]), &mut p).unwrap());
        });
        let t = Instant::now();
        while bell.seq() == seen {
            bell.wait(seen, Duration::from_secs(10));
        }
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_full_directory_is_a_clear_unsupported_error() {
    // Asking for more than any tmpfs here holds (1 TiB of rings) must fail cleanly, not SIGBUS.
    let dir = tmp_dir("full");
    let shm = PathBuf::from("/dev/shm");
    let target = if shm.is_dir() { shm } else { dir.clone() };
    let name = segment_name(7, 0);
    let peers: Vec<usize> = (1..=256).collect();
    match OwnSegment::create(&target, &name, 7, 0, &peers, 4 << 30) {
        Ok(_) => println!("{} accepted 1 TiB; nothing to check", target.display()),
        Err(e) => {
            assert!(
                e.kind() == ErrorKind::Unsupported || e.kind() == ErrorKind::System,
                "{e}"
            );
            assert!(e.to_string().contains(&target.display().to_string()), "{e}");
        }
    }
    assert!(
        !target.join(&name).exists(),
        "a failed segment must not stay behind"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn mismatched_segments_are_refused() {
    let dir = tmp_dir("refuse");
    let name = segment_name(1, 0);
    let _s = OwnSegment::create(&dir, &name, 1, 0, &[1], 4096).unwrap();
    let e = PeerSegment::open(&dir, &name, 2, 0, 1).unwrap_err();
    assert!(e.to_string().contains("communicator"), "{e}");
    let e = PeerSegment::open(&dir, &name, 1, 0, 5).unwrap_err();
    assert!(e.to_string().contains("no ring for rank 5"), "{e}");
    assert!(OwnSegment::create(&dir, "x", 1, 0, &[1], 5000).is_err());
    drop(_s);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// One message from `a` to `b`, after which the sender (or, with `receiver_closes`, the
/// receiver) shuts down at once while the other side still polls: the close must never be
/// mistaken for a failure of a message delivered (or acknowledged) just before it, and the
/// message arrives whole.
fn send_then_close(cfg: &ShmConfig, len: usize, receiver_closes: bool) {
    let (mut a, mut b) = pair(cfg);
    let m: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let mut got = vec![0u8; len];
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut p = Progress::default();
            let t = Instant::now();
            while !a.send(&header(len, 1), Payload::Host(&m), &mut p).unwrap() {
                assert!(t.elapsed() < Duration::from_secs(20), "send stuck");
            }
            if !receiver_closes {
                a.shutdown();
            }
        });
        let mut h = Header::default();
        let mut p = Progress::default();
        let t = Instant::now();
        while !b.recv(&mut h, PayloadMut::Host(&mut got), &mut p).unwrap() {
            assert!(t.elapsed() < Duration::from_secs(20), "recv stuck");
        }
        if receiver_closes {
            b.shutdown();
        }
    });
    assert!(got == m, "{len} bytes: the message differs");
}

#[test]
fn a_peer_that_closes_right_after_its_last_message_is_no_error() {
    // The window between reading a ring's counter and seeing the peer's close flag is a few
    // instructions wide, so these tries, both sides spinning, check the close path rather
    // than reliably hitting that window (it took preempted ranks on shared cores to).
    let dir = tmp_dir("close-race");
    let inline = ShmConfig {
        ring_bytes: 4096,
        cma: false,
        dir: dir.clone(),
        ..ShmConfig::default()
    };
    for i in 0..400 {
        send_then_close(&inline, 1 + i % 64, false);
    }
    let cma = ShmConfig {
        ring_bytes: 1 << 16,
        cma: true,
        cma_min: 1 << 12,
        max_io: 1 << 16,
        dir: dir.clone(),
        ..ShmConfig::default()
    };
    for i in 0..400 {
        // The receiver acknowledges the last piece and closes; the sender, still waiting
        // for that acknowledgement, must complete rather than fail.
        send_then_close(&cma, (1 << 12) + i, true);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Many messages queued before the receiver reads any: small ones (frame and payload in one
/// ring write) around the small-payload limit, mixed with larger ones streamed through the ring
/// and with cross-memory-attach ones, so that the receiver's read-ahead holds several frames, a
/// payload split between read-ahead and ring, and frames that follow a CMA frame.
#[test]
fn queued_small_and_large_messages_arrive_whole_and_in_order() {
    let dir = tmp_dir("read-ahead");
    for cma in [false, true] {
        let cfg = ShmConfig {
            ring_bytes: 1 << 20,
            cma,
            cma_min: 1 << 13,
            max_io: 1 << 16,
            dir: dir.clone(),
            ..ShmConfig::default()
        };
        let (mut a, mut b) = pair(&cfg);
        let cycle = [0, 1, 7, 63, 64, 65, 447, 448, 449, 960, 1000, 5000, 9000];
        let sizes: Vec<usize> = (0..120).map(|i| cycle[i % cycle.len()]).collect();
        exchange(&mut a, &mut b, &sizes);
        // Send everything first (the ring holds it all when nothing is read through CMA),
        // then read.
        let inline: Vec<usize> = sizes.iter().copied().filter(|&n| n < (1 << 13)).collect();
        let msgs: Vec<(Header, Vec<u8>)> = patterns(&inline)
            .into_iter()
            .enumerate()
            .map(|(k, m)| (header(m.len(), k as u64), m))
            .collect();
        for (k, (h, m)) in msgs.iter().enumerate() {
            let mut p = Progress::default();
            assert!(
                a.send(h, Payload::Host(m), &mut p).unwrap(),
                "message {k} of {} bytes did not fit a ring with room",
                m.len()
            );
        }
        for (k, (h, m)) in msgs.iter().enumerate() {
            let mut got_h = Header::default();
            let mut got = vec![0u8; m.len()];
            let mut p = Progress::default();
            let t = Instant::now();
            while !b
                .recv(&mut got_h, PayloadMut::Host(&mut got), &mut p)
                .unwrap()
            {
                assert!(t.elapsed() < Duration::from_secs(20), "recv {k} stuck");
            }
            assert_eq!(&got_h, h, "message {k}: header");
            assert!(got == *m, "message {k} of {} bytes differs", m.len());
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Messages whose payload lies in a [`SharedMem`]: the receiver reads them from its mapping of
/// the sender's buffer (copied out, or lent to a sink), or, where it cannot map it, through the
/// ring; every byte arrives either way.
mod shared_buffers {
    use super::*;

    fn cfg(dir: &std::path::Path) -> ShmConfig {
        ShmConfig {
            ring_bytes: 1 << 16,
            mapped_min: 1 << 12,
            max_io: 1 << 16,
            dir: dir.to_path_buf(),
            ..ShmConfig::default()
        }
    }

    /// Sends `sizes` from one shared buffer, each message at its own offset; the receiver
    /// takes the odd ones with `recv` and the even ones with `recv_lent` (4-byte elements).
    fn send_from_shared(a: &mut ShmConnection, b: &mut ShmConnection, sizes: &[usize]) {
        let total: usize = sizes.iter().sum::<usize>() + 3;
        let mut buf = SharedMem::new(total).unwrap();
        for (i, x) in buf.as_mut_slice().iter_mut().enumerate() {
            *x = (i * 7 % 253) as u8;
        }
        let buf = &buf;
        std::thread::scope(|s| {
            s.spawn(move || {
                // Odd offsets too: a payload need not start where the buffer does.
                let mut off = 3;
                for (k, &n) in sizes.iter().enumerate() {
                    let m = &buf.as_slice()[off..off + n];
                    let mut p = Progress::default();
                    let t = Instant::now();
                    while !a
                        .send(&header(n, k as u64), Payload::Host(m), &mut p)
                        .unwrap()
                    {
                        assert!(t.elapsed() < Duration::from_secs(20), "send {k} stuck");
                    }
                    off += n;
                }
            });
            let mut off = 3;
            for (k, &n) in sizes.iter().enumerate() {
                let want = &buf.as_slice()[off..off + n];
                let mut got = vec![0u8; n];
                let mut h = Header::default();
                let mut p = Progress::default();
                let t = Instant::now();
                loop {
                    let done = if k % 2 == 1 {
                        b.recv(&mut h, PayloadMut::Host(&mut got), &mut p).unwrap()
                    } else {
                        let got = &mut got;
                        b.recv_lent(&mut h, n, 4, &mut p, &mut |at, bytes| {
                            assert!(at % 4 == 0 && (bytes.len() % 4 == 0 || at + bytes.len() == n));
                            got[at..at + bytes.len()].copy_from_slice(bytes);
                            Ok(())
                        })
                        .unwrap()
                    };
                    if done {
                        break;
                    }
                    assert!(t.elapsed() < Duration::from_secs(20), "recv {k} stuck");
                }
                assert_eq!(h.len, n as u64, "message {k}: header");
                assert!(got == want, "message {k} of {n} bytes differs");
                off += n;
            }
        });
    }

    const SIZES: [usize; 9] = [4095, 4096, 1 << 20, 5, 300_001, 4097, 1 << 16, 0, 70_000];

    #[test]
    fn are_read_straight_from_the_senders_buffer() {
        let dir = tmp_dir("mapped");
        let (mut a, mut b) = pair(&cfg(&dir));
        send_from_shared(&mut a, &mut b, &SIZES);
        assert_eq!(
            b.mapped_buffers(),
            1,
            "the receiver mapped the sender's buffer"
        );
        send_from_shared(&mut b, &mut a, &SIZES);
        // A second buffer after the first was freed: the first one's mapping goes.
        send_from_shared(&mut a, &mut b, &[1 << 17]);
        assert_eq!(b.mapped_buffers(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn go_through_the_ring_when_the_receiver_cannot_map_them() {
        let dir = tmp_dir("mapped-denied");
        let (mut a, mut b) = pair(&cfg(&dir));
        b.lose_peer_buffers_for_test();
        send_from_shared(&mut a, &mut b, &SIZES);
        assert_eq!(b.mapped_buffers(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn go_through_the_ring_when_turned_off() {
        let dir = tmp_dir("mapped-off");
        let c = ShmConfig {
            mapped_min: usize::MAX,
            ..cfg(&dir)
        };
        let (mut a, mut b) = pair(&c);
        send_from_shared(&mut a, &mut b, &SIZES);
        assert_eq!(b.mapped_buffers(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_receiver_that_closes_after_the_last_acknowledgement_is_no_error() {
        let dir = tmp_dir("mapped-close");
        for i in 0..200 {
            let (mut a, mut b) = pair(&cfg(&dir));
            let n = (1 << 12) + i * 37;
            let mut buf = SharedMem::new(n).unwrap();
            buf.as_mut_slice().fill(i as u8);
            let mut got = vec![0u8; n];
            std::thread::scope(|s| {
                s.spawn(|| {
                    let mut p = Progress::default();
                    let m = buf.as_slice();
                    while !a.send(&header(n, 1), Payload::Host(m), &mut p).unwrap() {}
                });
                let mut h = Header::default();
                let mut p = Progress::default();
                while !b.recv(&mut h, PayloadMut::Host(&mut got), &mut p).unwrap() {}
                b.shutdown();
            });
            assert!(got == buf.as_slice(), "{n} bytes differ");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
