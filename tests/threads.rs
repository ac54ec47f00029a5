//! The conformance suite with ranks as threads of one process (in-memory rendezvous, TCP over
//! loopback), plus API-level behaviour: errors, async work, split, groups.

mod common;

use std::time::{Duration, Instant};

use common::conformance::{run_sweep, Sweep};
use ferroccl::{Communicator, Config, ErrorKind, ReduceOp};

fn config() -> Config {
    Config {
        timeout: Duration::from_secs(60),
        ..Config::default()
    }
}

/// Runs `f` on every rank of a fresh `n`-rank thread group; returns the results in rank order.
fn on_ranks<R: Send>(n: usize, cfg: Config, f: impl Fn(&Communicator) -> R + Sync) -> Vec<R> {
    let comms = Communicator::local_group(n, cfg).expect("init");
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

fn sweep(n: usize, sw: &Sweep) {
    let res = on_ranks(n, config(), |c| run_sweep(c, sw, 1000 * n as u64));
    for (r, x) in res.iter().enumerate() {
        if let Err(e) = x {
            panic!("nranks {n}, rank {r}: {e}");
        }
    }
}

#[test]
fn conformance_small_counts_all_dtypes_and_ops() {
    for n in [1, 2, 3, 4, 5, 7, 8] {
        sweep(n, &Sweep::full_small());
    }
}

#[test]
fn conformance_large_count() {
    for n in [1, 2, 3, 5, 8] {
        sweep(n, &Sweep::large());
    }
}

#[test]
fn conformance_with_small_slices_and_one_stream() {
    // Many pipelined steps per call, and every message on one socket.
    let cfg = Config {
        slice_bytes: 4096,
        nstreams: 1,
        ..config()
    };
    let mut sw = Sweep::large();
    sw.counts = vec![100_003];
    for n in [2, 3, 4] {
        let res = on_ranks(n, cfg.clone(), |c| run_sweep(c, &sw, 7));
        for x in res {
            x.unwrap();
        }
    }
}

#[test]
fn mismatched_counts_fail_with_a_clear_error() {
    let res = on_ranks(3, config(), |c| {
        let count = if c.rank() == 2 { 4096 } else { 1024 };
        let mut buf = vec![1.0f32; count];
        let r = c.all_reduce_in_place(&mut buf, ReduceOp::Sum);
        // The communicator stays failed: a later call returns the same error.
        let again = c.all_reduce_in_place(&mut [0f32; 4], ReduceOp::Sum);
        (r, again)
    });
    let mut named = false;
    for (rank, (r, again)) in res.into_iter().enumerate() {
        let e = r.expect_err("a mismatched allreduce must fail on every rank");
        assert!(matches!(e.kind(), ErrorKind::Remote), "rank {rank}: {e}");
        assert!(e.message().starts_with("all_reduce #1"), "rank {rank}: {e}");
        if e.message().contains("4096 x f32") && e.message().contains("1024 x f32") {
            named = true;
        }
        assert_eq!(again.unwrap_err(), e);
    }
    assert!(named, "some rank must name both counts");
}

#[test]
fn mismatched_dtypes_and_collectives_fail() {
    let res = on_ranks(2, config(), |c| {
        if c.rank() == 0 {
            let mut b = vec![0f32; 64];
            c.all_reduce_in_place(&mut b, ReduceOp::Sum)
        } else {
            let mut b = vec![0i32; 64];
            c.all_reduce_in_place(&mut b, ReduceOp::Sum)
        }
    });
    let msgs: Vec<String> = res
        .into_iter()
        .map(|r| r.unwrap_err().to_string())
        .collect();
    assert!(
        msgs.iter()
            .any(|m| m.contains("64 x i32") && m.contains("64 x f32")),
        "{msgs:?}"
    );

    let res = on_ranks(2, config(), |c| {
        let mut b = vec![0f32; 64];
        if c.rank() == 0 {
            c.all_reduce_in_place(&mut b, ReduceOp::Sum)
        } else {
            c.broadcast(&mut b, 0)
        }
    });
    let msgs: Vec<String> = res
        .into_iter()
        .map(|r| r.unwrap_err().to_string())
        .collect();
    assert!(
        msgs.iter()
            .any(|m| m.contains("broadcast #1") && m.contains("all_reduce #1")),
        "{msgs:?}"
    );
}

#[test]
fn bad_arguments_name_the_operation_and_value() {
    let res = on_ranks(2, config(), |c| {
        let mut b = vec![0f32; 8];
        let root = c.broadcast(&mut b, 9).unwrap_err();
        let short = c
            .all_reduce(&[1f32; 8], &mut [0f32; 7], ReduceOp::Sum)
            .unwrap_err();
        let peer = c.send(&[1u8], 5).unwrap_err();
        // Bad arguments do not fail the communicator.
        c.all_reduce_in_place(&mut b, ReduceOp::Sum).unwrap();
        (root, short, peer)
    });
    for (root, short, peer) in res {
        assert_eq!(root.kind(), ErrorKind::InvalidArgument);
        assert!(
            root.message().contains("broadcast") && root.message().contains("invalid root 9"),
            "{root}"
        );
        assert!(
            short.message().contains("receive buffer has 7 elements"),
            "{short}"
        );
        assert!(peer.message().contains("invalid peer 5"), "{peer}");
    }
}

#[test]
fn async_work_completes_in_issue_order() {
    let res = on_ranks(3, config(), |c| {
        let r = c.rank() as i64;
        let works: Vec<_> = (0..20)
            .map(|k| {
                c.all_reduce_async::<i64, _>(vec![r * 100 + k; 1000 + k as usize], ReduceOp::Sum)
                    .unwrap()
            })
            .collect();
        // A blocking call issued after them runs after them.
        let mut b = vec![r; 10];
        c.all_reduce_in_place(&mut b, ReduceOp::Max).unwrap();
        let outs: Vec<Vec<i64>> = works.into_iter().map(|w| w.wait().unwrap()).collect();
        (outs, b)
    });
    for (outs, b) in res {
        assert_eq!(b, vec![2; 10]);
        for (k, o) in outs.iter().enumerate() {
            let k = k as i64;
            assert_eq!(o.len(), 1000 + k as usize);
            assert!(o.iter().all(|&x| x == 300 + 3 * k), "work {k}");
        }
    }
}

#[test]
fn async_all_gather_and_test() {
    let res = on_ranks(4, config(), |c| {
        let mut w = c
            .all_gather_async(vec![c.rank() as u32; 3], vec![0u32; 12])
            .unwrap();
        let start = Instant::now();
        while !w.test() {
            assert!(start.elapsed() < Duration::from_secs(30));
            std::thread::yield_now();
        }
        w.wait().unwrap().1
    });
    for out in res {
        assert_eq!(out, vec![0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]);
    }
}

#[test]
fn split_by_parity_with_reversed_keys() {
    let res = on_ranks(5, config(), |c| {
        let color = if c.rank() == 4 {
            None
        } else {
            Some((c.rank() % 2) as u32)
        };
        let sub = c.split(color, -(c.rank() as i64)).unwrap();
        sub.map(|s| {
            let mut v = vec![c.rank() as u32; 3];
            s.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
            let mut ids = vec![0u32; s.nranks()];
            s.all_gather(&[c.rank() as u32], &mut ids).unwrap();
            (s.rank(), s.nranks(), v[0], ids)
        })
    });
    assert_eq!(res[4], None);
    // Evens {0, 2} ordered by key -rank: 2 first.
    assert_eq!(res[0], Some((1, 2, 2, vec![2, 0])));
    assert_eq!(res[2], Some((0, 2, 2, vec![2, 0])));
    assert_eq!(res[1], Some((1, 2, 4, vec![3, 1])));
    assert_eq!(res[3], Some((0, 2, 4, vec![3, 1])));
}

#[test]
fn groups_match_sends_in_order_and_handle_self() {
    let res = on_ranks(3, config(), |c| {
        let (r, n) = (c.rank(), c.nranks());
        let a = vec![r as u64 * 10 + 1; 5];
        let b = vec![r as u64 * 10 + 2; 70_000];
        let mut got_a = vec![0u64; 5];
        let mut got_b = vec![0u64; 70_000];
        let mut me = vec![0u64; 5];
        let mut g = c.group();
        for p in 0..n {
            if p != r {
                g.send(&a, p).send(&b, p);
            }
        }
        g.send(&a, r).recv(&mut me, r);
        let peer = (r + 1) % n;
        g.recv(&mut got_a, peer).recv(&mut got_b, peer);
        // The other peer's messages are received too, into scratch.
        let other = (r + 2) % n;
        let mut o1 = vec![0u64; 5];
        let mut o2 = vec![0u64; 70_000];
        g.recv(&mut o1, other).recv(&mut o2, other);
        g.run().unwrap();
        (got_a[0], got_b[69_999], me[0], o1[0], o2[0])
    });
    for (r, (a, b, me, o1, o2)) in res.into_iter().enumerate() {
        let p = (r + 1) % 3;
        let o = (r + 2) % 3;
        assert_eq!((a, b), (p as u64 * 10 + 1, p as u64 * 10 + 2));
        assert_eq!(me, r as u64 * 10 + 1);
        assert_eq!((o1, o2), (o as u64 * 10 + 1, o as u64 * 10 + 2));
    }
}

#[test]
fn p2p_size_mismatch_is_an_error_not_a_hang() {
    let res = on_ranks(2, config(), |c| {
        if c.rank() == 0 {
            c.send(&[1f32; 100], 1)
        } else {
            c.recv(&mut [0f32; 50], 0)
        }
    });
    let e = res[1].clone().unwrap_err();
    assert!(
        e.message()
            .contains("rank 0 sent 100 x f32, rank 1 expected 50 x f32"),
        "{e}"
    );
}

#[test]
fn timeout_names_the_peer() {
    let cfg = Config {
        timeout: Duration::from_millis(500),
        ..Config::default()
    };
    let res = on_ranks(2, cfg, |c| {
        if c.rank() == 0 {
            let start = Instant::now();
            let e = c
                .all_reduce_in_place(&mut [1f32; 16], ReduceOp::Sum)
                .unwrap_err();
            (Some(e), start.elapsed())
        } else {
            // Rank 1 never joins the allreduce; it only waits out rank 0's deadline.
            std::thread::sleep(Duration::from_millis(1500));
            (None, Duration::ZERO)
        }
    });
    let (e, took) = (res[0].0.clone().unwrap(), res[0].1);
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert!(e.message().contains("all_reduce #1 on rank 0"), "{e}");
    assert!(e.message().contains("rank 1 ("), "{e}");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn abort_returns_promptly_and_fails_later_calls() {
    let comms = Communicator::local_group(2, config()).unwrap();
    let c0 = &comms[0];
    std::thread::scope(|s| {
        let h = s.spawn(|| c0.all_reduce_in_place(&mut vec![1f32; 1 << 20], ReduceOp::Sum));
        std::thread::sleep(Duration::from_millis(200));
        let t = Instant::now();
        c0.abort();
        assert!(t.elapsed() < Duration::from_secs(1));
        let e = h.join().unwrap().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Aborted, "{e}");
    });
    let e = c0.barrier().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Aborted);
    // The peer sees the closed connection instead of hanging.
    let e = comms[1].barrier().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote, "{e}");
}

/// Rank 2 only sends to rank 0, which fails because rank 1 aborted: rank 0's failure notice
/// to rank 2 waits on a connection rank 2 never receives from, so rank 2 reads it once its
/// send finds rank 0 closed, and names rank 1 as where the failure began.
#[test]
fn a_rank_that_only_sends_to_a_failed_peer_names_where_the_failure_began() {
    let comms = Communicator::local_group(3, config()).unwrap();
    let errors: Vec<Option<ferroccl::Error>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || match c.rank() {
                    0 => c.recv(&mut [0f32; 4], 1).err(),
                    1 => {
                        std::thread::sleep(Duration::from_millis(100));
                        c.abort();
                        None
                    }
                    // Far more than the connection holds: the send waits for rank 0.
                    _ => c.send(&vec![2f32; 8 << 20], 0).err(),
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in [0, 2] {
        let e = errors[r]
            .as_ref()
            .unwrap_or_else(|| panic!("rank {r} did not fail"));
        assert_eq!(e.kind(), ErrorKind::Remote, "rank {r}: {e}");
        assert_eq!(
            e.origin().map(|(o, _)| o),
            Some(1),
            "rank {r} does not name rank 1 as the origin: {e}"
        );
    }
}

#[test]
fn conformance_large_count_every_dtype_and_op_all_reduce() {
    // The large count through every dtype × op, on an odd number of ranks (uneven chunks).
    let sw = Sweep {
        colls: vec!["all_reduce"],
        ..Sweep {
            counts: vec![(1 << 20) + 3],
            ..Sweep::full_small()
        }
    };
    sweep(3, &sw);
}

/// `n` ranks as threads, `per_host` consecutive ranks on each pretend host (`FERRO_HOST_ID`),
/// so that hierarchical and tree algorithms see several hosts (TCP between them, shared memory
/// inside).
fn on_hosts<R: Send>(
    n: usize,
    per_host: usize,
    cfg: Config,
    f: impl Fn(&Communicator) -> R + Sync,
) -> Vec<R> {
    let store: std::sync::Arc<dyn ferroccl::bootstrap::Store> =
        std::sync::Arc::new(ferroccl::bootstrap::MemoryStore::new());
    let id = 0x5eed_0000 + (n * 100 + per_host) as u64 + std::process::id() as u64 * 1_000_000;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (store, f, mut cfg) = (store.clone(), &f, cfg.clone());
                cfg.host_id = Some(format!("host{}", r / per_host));
                s.spawn(move || {
                    let comm = Communicator::init(store, r, n, id, cfg).expect("init");
                    f(&comm)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

#[test]
fn conformance_with_every_algorithm_on_several_hosts() {
    let sw = Sweep {
        dtypes: vec![
            ferroccl::DataType::Float32,
            ferroccl::DataType::Int32,
            ferroccl::DataType::Bfloat16,
            ferroccl::DataType::Uint8,
            ferroccl::DataType::Float64,
        ],
        counts: vec![0, 1, 7, 1000, 20_011],
        ..Sweep::full_small()
    };
    for algo in [
        "ring", "tree", "rd", "rhd", "hier", "binomial", "chain", "pairwise",
    ] {
        for (n, per_host) in [(3, 1), (4, 2), (5, 2), (8, 4)] {
            let cfg = Config {
                algo: Some(algo.to_string()),
                slice_bytes: 16 << 10,
                ..config()
            };
            let res = on_hosts(n, per_host, cfg, |c| run_sweep(c, &sw, 31 * n as u64));
            for (r, x) in res.into_iter().enumerate() {
                if let Err(e) = x {
                    panic!("FERRO_ALGO={algo}, nranks {n}, {per_host} per host, rank {r}: {e}");
                }
            }
        }
    }
}

/// `FERRO_TUNE=measure`: every rank ends init with the same measured model (shared memory
/// inside the pretend hosts, TCP between them), and the tuner, now choosing for every size,
/// still gives exact results everywhere.
#[test]
fn measured_tuning_agrees_on_every_rank_and_stays_correct() {
    let cfg = Config {
        tune_measure: true,
        slice_bytes: 64 << 10,
        ..config()
    };
    let sw = Sweep {
        dtypes: vec![ferroccl::DataType::Float32, ferroccl::DataType::Int8],
        ops: vec![ReduceOp::Sum, ReduceOp::Max],
        counts: vec![0, 1, 97, 300_007],
        ..Sweep::full_small()
    };
    let res = on_hosts(4, 2, cfg, |c| {
        let model = c.calibrated_model();
        let split = c.split(Some(0), 0).expect("split").expect("member");
        let inherited = split.calibrated_model();
        (model, inherited, run_sweep(c, &sw, 77))
    });
    let first = res[0].0.clone().expect("rank 0 calibrated");
    for (r, (model, inherited, sweep)) in res.into_iter().enumerate() {
        assert_eq!(model.as_ref(), Some(&first), "rank {r}");
        assert_eq!(inherited.as_ref(), Some(&first), "rank {r}'s split");
        if let Err(e) = sweep {
            panic!("rank {r}: {e}");
        }
    }
    // FERRO_SLICE_BYTES caps the slices the tuner picks.
    assert_eq!(first.max_slice, 64 << 10);
    let defaults = ferroccl::plan::CostModel::default();
    for link in [ferroccl::plan::Link::Shm, ferroccl::plan::Link::Tcp] {
        let (m, d) = (first.link(link), defaults.link(link));
        assert_ne!(m, d, "{} was not measured", link.name());
        assert!(m.alpha_us > 0.0 && m.beta_gbps > 0.0, "{m:?}");
    }
    // Links this job does not use keep their defaults.
    let rdma = ferroccl::plan::Link::Rdma;
    assert_eq!(first.link(rdma), defaults.link(rdma));
    // Every all_reduce algorithm was timed at the smallest probe and corrects the model there.
    use ferroccl::coll::Algorithm::*;
    for algo in [Ring, Tree, RecursiveDoubling, Rabenseifner, Hierarchical] {
        let c = first
            .corrections
            .iter()
            .find(|c| c.algo == algo && c.collective == "all_reduce")
            .unwrap_or_else(|| panic!("{algo} was not timed: {:?}", first.corrections));
        assert_eq!(c.points.first().map(|p| p.0), Some(8 << 10), "{c:?}");
        assert!(
            c.points.iter().all(|p| p.1.is_finite() && p.1 > 0.0),
            "{c:?}"
        );
    }
}
