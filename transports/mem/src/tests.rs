//! The conformance suite over in-memory pairs, setup through the registry on threads, the
//! doorbell, and the clear-to-send check.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferroccl_transport::{
    Connection, Doorbell, Header, MemRef, Payload, PayloadMut, Progress, RankDesc, SetupCtx,
    Transport,
};
use ferroccl_transport_testkit::conformance::{self, Options, Pair};
use ferroccl_transport_testkit::drive::{exchange, header, patterns};

use crate::{Bell, MemConfig, MemConnection, MemTransport};

fn boxed(cfg: &MemConfig, a: usize, b: usize) -> Pair {
    let (x, y) = MemConnection::pair(a, b, cfg);
    (Box::new(x), Box::new(y))
}

#[test]
fn conformance_alternating_calls() {
    let cfg = MemConfig {
        queue_bytes: 64 << 10,
    };
    let opts = Options {
        one_sided: true,
        ..Options::new("mem")
    };
    conformance::run(&opts, || boxed(&cfg, 0, 1));
}

#[test]
fn conformance_two_threads_and_reversed_ranks() {
    let cfg = MemConfig { queue_bytes: 4096 };
    let opts = Options {
        one_sided: true,
        threads: true,
        partial_bytes: 1 << 20,
        large_bytes: 16 << 20,
        ..Options::new("mem")
    };
    // The first end is the higher rank.
    conformance::run(&opts, || boxed(&cfg, 5, 2));
}

/// Every rank of `n` runs the three setup rounds on its own thread, as the selection loop
/// does, and returns its connections by peer.
fn setup(n: usize, comm_id: u64) -> Vec<Vec<Box<dyn Connection>>> {
    let descs = vec![
        RankDesc {
            host: 1,
            pid: std::process::id(),
        };
        n
    ];
    let handles: Vec<_> = {
        let mut ts: Vec<MemTransport> = (0..n).map(|_| MemTransport::new()).collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        let ctx = |r| SetupCtx {
            rank: r,
            nranks: n,
            comm_id,
            ranks: &descs,
            deadline,
        };
        let hs: Vec<Vec<u8>> = ts
            .iter_mut()
            .enumerate()
            .map(|(r, t)| {
                let peers: Vec<usize> = (0..n).filter(|&p| p != r).collect();
                t.listen(&ctx(r), &peers).unwrap()
            })
            .collect();
        for (r, t) in ts.iter_mut().enumerate() {
            for p in (0..n).filter(|&p| p != r) {
                t.attach(&ctx(r), p, &hs[p]).unwrap();
            }
        }
        // Connect from threads, in reverse rank order for half of them.
        let descs = &descs;
        std::thread::scope(|s| {
            let hs: Vec<_> = ts
                .into_iter()
                .enumerate()
                .map(|(r, mut t)| {
                    s.spawn(move || {
                        if r % 2 == 1 {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        let c = SetupCtx {
                            rank: r,
                            nranks: n,
                            comm_id,
                            ranks: descs,
                            deadline,
                        };
                        let peers: Vec<usize> = (0..n).filter(|&p| p != r).collect();
                        t.connect(&c, &peers).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    handles
}

#[test]
fn setup_joins_every_pair_of_threads() {
    let n = 4;
    let mut conns = setup(n, 0x6d65_6d00);
    for (r, cs) in conns.iter().enumerate() {
        let peers: Vec<usize> = cs.iter().map(|c| c.peer().rank).collect();
        let want: Vec<usize> = (0..n).filter(|&p| p != r).collect();
        assert_eq!(peers, want, "rank {r}");
        // All of a rank's connections share its doorbell.
        let bells: Vec<_> = cs.iter().map(|c| c.doorbell().unwrap()).collect();
        assert!(bells.windows(2).all(|w| Arc::ptr_eq(&w[0], &w[1])));
    }
    // Each pair's ends share queues: rank i sends to rank j what only rank j receives.
    for i in 0..n {
        for j in (0..n).filter(|&j| j != i) {
            let msgs = patterns(&[i * 10 + j, 100_000 + i]);
            let (lo, hi) = conns.split_at_mut(i.max(j));
            let (ci, cj) = if i < j {
                (&mut lo[i], &mut hi[0])
            } else {
                (&mut hi[0], &mut lo[j])
            };
            let a = ci.iter_mut().find(|c| c.peer().rank == j).unwrap();
            let b = cj.iter_mut().find(|c| c.peer().rank == i).unwrap();
            assert_eq!(exchange(a, b, &msgs), msgs, "{i} to {j}");
        }
    }
}

#[test]
fn setup_declines_other_processes_and_foreign_handles() {
    let descs = [
        RankDesc { host: 1, pid: 10 },
        RankDesc { host: 1, pid: 11 },
        RankDesc { host: 2, pid: 10 },
    ];
    let ctx = SetupCtx {
        rank: 0,
        nranks: 3,
        comm_id: 1,
        ranks: &descs,
        deadline: Instant::now(),
    };
    let t = MemTransport::new();
    assert!(t
        .can_connect(&ctx, 1)
        .unwrap_err()
        .contains("another process"));
    assert!(t.can_connect(&ctx, 2).unwrap_err().contains("another host"));
    let mut t = MemTransport::new();
    let me = [RankDesc {
        host: 1,
        pid: std::process::id(),
    }; 2];
    let ctx = SetupCtx {
        ranks: &me,
        nranks: 2,
        ..ctx
    };
    let mine = t.listen(&ctx, &[1]).unwrap();
    let mut other_pid = mine.clone();
    other_pid[4] ^= 1;
    assert!(t
        .attach(&ctx, 1, &other_pid)
        .unwrap_err()
        .contains("not in this one"));
    assert!(t
        .attach(&ctx, 1, b"junk")
        .unwrap_err()
        .contains("bad mem handle"));
    let mut unknown = mine.clone();
    unknown[15] ^= 0x80;
    assert!(t
        .attach(&ctx, 1, &unknown)
        .unwrap_err()
        .contains("not registered"));
    // Its own handle names rank 0, not rank 1.
    assert!(t
        .attach(&ctx, 1, &mine)
        .unwrap_err()
        .contains("belongs to rank 0"));
    assert!(t.connect(&ctx, &[]).unwrap().is_empty());
}

#[test]
fn a_sleeping_rank_wakes_on_the_doorbell() {
    let bell = Bell::new();
    let seen = bell.seq();
    let t = Instant::now();
    bell.wait(seen, Duration::from_millis(30));
    assert!(
        t.elapsed() >= Duration::from_millis(25),
        "{:?}",
        t.elapsed()
    );
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(20));
            bell.ring();
        });
        let t = Instant::now();
        while bell.seq() == seen {
            bell.wait(seen, Duration::from_secs(10));
        }
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    });
}

#[test]
fn posted_lengths_bind_only_their_own_message() {
    let (mut a, mut b) = MemConnection::pair(0, 1, &MemConfig::default());
    // Message 0 was sent before the receiver posted anything: the post is for message 0 all
    // the same (its header is unread), and the receiver catches the mismatch.
    let m = [1u8; 8];
    assert!(a
        .send(&header(8, 0), Payload::Host(&m), &mut Progress::default())
        .unwrap());
    let dst = [0u8; 16];
    b.post_recv(MemRef::host(dst.as_ptr(), 16), None).unwrap();
    let mut h = Header::default();
    let mut buf = [0u8; 8];
    let e = b
        .recv(&mut h, PayloadMut::Host(&mut buf), &mut Progress::default())
        .unwrap_err();
    assert!(
        e.message().contains("16-byte destination for message #0"),
        "{e}"
    );
    // The refused message's payload is still queued; a fresh pair shows that an unposted
    // message is pull-style and a post binds the sender before it writes a byte.
    let (mut a, mut b) = MemConnection::pair(0, 1, &MemConfig::default());
    let msgs = patterns(&[300]);
    let got = exchange(&mut a, &mut b, &msgs);
    assert_eq!(got, msgs);
    b.post_recv(MemRef::host(dst.as_ptr(), 16), None).unwrap();
    let e = a
        .send(&header(8, 2), Payload::Host(&m), &mut Progress::default())
        .unwrap_err();
    assert!(
        e.to_string().contains("rank 1") && e.to_string().contains("16-byte"),
        "{e}"
    );
}
