//! The small-message lane: tiny allreduces over shared memory as one exchange through boxes in
//! the peers' segments. The ranks' agreement on the lane's size, results when lane calls and
//! stream calls alternate, every kind of mismatch named as clearly as on the stream, and a
//! peer that dies while the others wait in the lane.
//!
//! The counts, dtypes and ops of the conformance sweeps that fit a lane (counts 1 and 7 of
//! `Sweep::full_small`, on 2 to 8 ranks) already run through it in `tests/shm.rs` and
//! `tests/threads.rs`; this file checks what is particular to the lane.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::child::{self, free_port, self_command, serial, Running};
use common::threads::{self, on_all};
use ferroccl::{Communicator, Config, Error, ReduceOp};

fn config() -> Config {
    Config {
        timeout: Duration::from_secs(60),
        ..Config::default()
    }
}

fn group(configs: Vec<Config>) -> Vec<Communicator> {
    threads::group(configs, 0x4c41_4e45 << 24)
}

#[test]
fn the_ranks_agree_on_the_lane_and_any_rank_can_narrow_or_close_it() {
    let cases: [(&str, [usize; 3], usize); 3] = [
        ("defaults", [96, 96, 96], 96),
        ("one rank narrows it", [96, 40, 96], 40),
        ("one rank turns it off", [96, 96, 0], 0),
    ];
    for (what, limits, want) in cases {
        let comms = group(
            limits
                .iter()
                .map(|&b| Config {
                    small_lane_bytes: b,
                    ..config()
                })
                .collect(),
        );
        let got = on_all(&comms, |c| {
            let mut v = [c.rank() as f32 + 0.5, 2.0];
            c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
            (c.small_lane_bytes(), v)
        });
        for (r, (bytes, v)) in got.into_iter().enumerate() {
            assert_eq!(bytes, want, "{what}: rank {r}");
            assert_eq!(v, [4.5, 6.0], "{what}: rank {r}");
        }
    }
    // Without shared memory between every pair there is no lane.
    let comms = group(vec![
        Config {
            transports: vec!["tcp".into()],
            ..config()
        };
        2
    ]);
    for c in &comms {
        assert_eq!(c.small_lane_bytes(), 0, "rank {} over tcp", c.rank());
    }
}

/// Lane calls of every fitting size, in and out of place, between broadcasts and allreduces
/// too large for the lane, thousands of times: a box is reused every other lane call, and a
/// peer's stream message may arrive while its lane message is still unread.
#[test]
fn lane_calls_between_stream_calls_stay_right() {
    for n in [2, 3, 5] {
        let comms = group(vec![config(); n]);
        let rounds = 1500;
        let bad = on_all(&comms, |c| {
            let (r, n) = (c.rank(), c.nranks());
            for i in 0..rounds {
                let count = 1 + i % 12;
                match i % 4 {
                    0 => {
                        let send: Vec<f64> =
                            (0..count).map(|e| (r * 1000 + i + e) as f64).collect();
                        let mut out = vec![0f64; count];
                        c.all_reduce(&send, &mut out, ReduceOp::Sum).unwrap();
                        for (e, v) in out.iter().enumerate() {
                            let want: usize = (0..n).map(|q| q * 1000 + i + e).sum();
                            if *v != want as f64 {
                                return Some(format!("round {i} element {e}: {v} != {want}"));
                            }
                        }
                    }
                    1 => {
                        let root = i % n;
                        let mut b: Vec<u32> = if r == root {
                            (0..5).map(|e| (i * 7 + e) as u32).collect()
                        } else {
                            vec![0; 5]
                        };
                        c.broadcast(&mut b, root).unwrap();
                        if b != (0..5).map(|e| (i * 7 + e) as u32).collect::<Vec<_>>() {
                            return Some(format!("round {i}: broadcast {b:?}"));
                        }
                    }
                    2 => {
                        // 160 bytes: too large for a lane.
                        let mut v = vec![(r + i) as f32; 40];
                        c.all_reduce_in_place(&mut v, ReduceOp::Max).unwrap();
                        if v.iter().any(|&x| x != (n - 1 + i) as f32) {
                            return Some(format!("round {i}: max {v:?}"));
                        }
                    }
                    _ => {
                        let mut v: Vec<i32> =
                            (0..count).map(|e| (r * 31 + e) as i32 - 50).collect();
                        c.all_reduce_in_place(&mut v, ReduceOp::Min).unwrap();
                        for (e, x) in v.iter().enumerate() {
                            if *x != e as i32 - 50 {
                                return Some(format!("round {i} element {e}: min {x}"));
                            }
                        }
                    }
                }
            }
            None
        });
        for (r, b) in bad.into_iter().enumerate() {
            assert!(
                b.is_none(),
                "{n} ranks, rank {r}: {}",
                b.unwrap_or_default()
            );
        }
        assert!(comms.iter().all(|c| c.small_lane_bytes() == 96));
    }
}

/// Runs `f` on a fresh group of `n` ranks; every rank must fail (no hang: the deadline is
/// 60 s and the call returns well before it), and some rank's error must contain every one of
/// `named`.
fn every_rank_fails(
    what: &str,
    n: usize,
    named: &[&str],
    f: impl Fn(&Communicator) -> Result<(), Error> + Sync,
) {
    let comms = group(vec![config(); n]);
    let start = Instant::now();
    let res = on_all(&comms, |c| f(c));
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{what}: took {:?}",
        start.elapsed()
    );
    let msgs: Vec<String> = res
        .into_iter()
        .enumerate()
        .map(|(r, x)| match x {
            Ok(()) => panic!("{what}: rank {r} succeeded"),
            Err(e) => e.to_string(),
        })
        .collect();
    assert!(
        msgs.iter().any(|m| named.iter().all(|w| m.contains(w))),
        "{what}: no error names {named:?}: {msgs:#?}"
    );
}

#[test]
fn mismatches_in_the_lane_are_named_as_on_the_stream() {
    every_rank_fails("counts", 2, &["2 x f32", "3 x f32"], |c| {
        let mut v = vec![1f32; 2 + c.rank()];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum)
    });
    every_rank_fails("dtypes", 2, &["2 x f32", "2 x i32"], |c| {
        if c.rank() == 0 {
            c.all_reduce_in_place(&mut [1f32; 2], ReduceOp::Sum)
        } else {
            c.all_reduce_in_place(&mut [1i32; 2], ReduceOp::Sum)
        }
    });
    every_rank_fails("ops", 2, &["reduces with"], |c| {
        let op = if c.rank() == 0 {
            ReduceOp::Sum
        } else {
            ReduceOp::Max
        };
        c.all_reduce_in_place(&mut [1f32; 2], op)
    });
    // One rank's count is too large for the lane: it sends through the stream.
    every_rank_fails("lane against stream", 3, &["2 x f32", "1000 x f32"], |c| {
        let mut v = vec![1f32; if c.rank() == 2 { 1000 } else { 2 }];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum)
    });
    every_rank_fails("allreduce against broadcast", 2, &["broadcast #1"], |c| {
        let mut v = [1f32; 2];
        if c.rank() == 0 {
            c.all_reduce_in_place(&mut v, ReduceOp::Sum)
        } else {
            c.broadcast(&mut v, 1)
        }
    });
}

/// A rank of the dead-peer job: 50 lane allreduces, then rank 1 exits while the others start
/// the 51st; each survivor prints how long its failing call took and its error.
#[test]
fn child_lane_death() {
    if !child::is_role("lane-death") {
        return;
    }
    let comm = Communicator::from_env().expect("from_env");
    let r = comm.rank();
    for _ in 0..50 {
        let mut v = [r as f64; 2];
        comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
    }
    if r == 1 {
        std::process::exit(3);
    }
    let start = Instant::now();
    let mut v = [r as f64; 2];
    let e = comm
        .all_reduce_in_place(&mut v, ReduceOp::Sum)
        .expect_err("an allreduce with a dead peer fails");
    println!(
        "LANE rank={r} lane={} ms={} error={e}",
        comm.small_lane_bytes(),
        start.elapsed().as_millis()
    );
}

#[test]
fn a_peer_that_dies_while_the_others_wait_in_the_lane_is_named_before_the_deadline() {
    let _serial = serial();
    // Ranks started by hand, so that the one that exits does not stop the others as a
    // launcher would.
    let store = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let ranks: Vec<Running> = (0..3)
        .map(|r| {
            let env = child::rank_env(r, 3, store, 60);
            Running::spawn(self_command("child_lane_death", "lane-death", &env))
        })
        .collect();
    let outs: Vec<_> = ranks
        .into_iter()
        .map(|p| p.finish(Duration::from_secs(120)))
        .collect();
    let dump = child::dump_all("rank", &outs);
    let lines: Vec<String> = outs.iter().flat_map(|o| o.tagged("LANE ")).collect();
    assert_eq!(lines.len(), 2, "{dump}");
    for l in &lines {
        println!("{l}");
        assert!(l.contains("lane=96"), "the lane was in use: {l}");
        let ms: u64 = child::field(l, "ms");
        assert!(ms < 20_000, "detected after {ms} ms: {l}");
        assert!(
            l.contains("all_reduce #51 on rank") && l.contains("rank 1 (shm"),
            "the error names the operation and the dead rank: {l}"
        );
    }
}
