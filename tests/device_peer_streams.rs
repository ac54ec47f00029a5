//! Collectives straight between the ranks' device buffers in stream order (docs/CUDA.md,
//! "In stream order"): ranks that are threads of one process, on two stand-in devices that
//! reach each other, call the `*_device_on` forms on streams of their own; each call is queued
//! and returns, and a stream never runs past a call before every rank's share is done.
//!
//! The first input of ranks 0 and 1 is written by work queued on their streams just before: an
//! allreduce between the two of them (a communicator of their own), which the lazy stand-in
//! streams run only when something waits for it. A third rank's stream took no part in that,
//! so its share is right only if it waits for their ready marks. (Other ranks' first input is
//! a one-rank communicator's stream-ordered copy.) Calls follow each other on the streams without a wait between them (each reads what
//! the one before wrote); results are read back after a stream synchronize, or straight away
//! (host access waits until the stream has let the buffers go); the third rank synchronizes
//! first. In the mixed case rank 0 makes
//! the blocking calls beside the others' stream-ordered ones.

mod common;

use common::child::{self, standin_p2p_child};
use common::stream_round::{value, Bufs, CALLS};
use ferroccl::device::{Device, DeviceStream, Provider};
use ferroccl::{Communicator, Config};

/// Element `i` of rank `r`'s first input: the sum of ranks 0 and 1's data on those two, the
/// rank's own data on the others.
fn first(r: usize, i: usize) -> f32 {
    if r < 2 {
        value(0, i) + value(1, i)
    } else {
        value(r, i)
    }
}

/// One rank's round of `count` elements: each call stream-ordered, or blocking (`blocking`);
/// `local` writes the first input (the pair of ranks 0 and 1, or a one-rank communicator).
fn round(
    c: &Communicator,
    local: &Communicator,
    dev: Device,
    stream: &DeviceStream,
    blocking: bool,
    count: usize,
    sync_first: bool,
) -> Result<(), String> {
    let (r, n) = (c.rank(), c.nranks());
    let mut b = Bufs::new(dev, r, n, count)?;
    let on = (!blocking).then_some(stream);
    b.write_first(local, on)?;
    b.calls(c, on)?;
    if !blocking {
        // A rank that took no part in the pair's allreduce runs its stream first: its shares
        // must wait for the pair's streams to get to their ready marks.
        let synced = if r >= 2 {
            stream.synchronize()
        } else {
            std::thread::sleep(std::time::Duration::from_millis(20));
            match sync_first {
                true => stream.synchronize(),
                false => Ok(()),
            }
        };
        synced.map_err(|err| format!("synchronize on rank {r}: {err}"))?;
    }
    b.check(&first)
}

/// A child: `FERRO_TEST_RANKS` thread ranks, rank `r` on stand-in device `r % 2` (its p2p
/// slots there), rounds of every count; `FERRO_TEST_CASE=mixed`: rank 0 blocks.
#[test]
fn child_peer_streams() {
    if !child::is_role("peer-streams") {
        return;
    }
    let n: usize = child::env_var("FERRO_TEST_RANKS");
    let mixed = child::env_var::<String>("FERRO_TEST_CASE") == "mixed";
    let base = Config::from_env().expect("config");
    let configs: Vec<Config> = (0..n)
        .map(|r| {
            let mut c = base.clone();
            c.p2p_device = Some(r as u32 % 2);
            c
        })
        .collect();
    let comms = Communicator::local_group_with(configs.clone()).expect("local_group");
    let mut pair = Communicator::local_group_with(configs[..2].to_vec()).expect("pair");
    let pairs: Vec<Option<Communicator>> =
        (0..n).map(|r| (r < 2).then(|| pair.remove(0))).collect();
    std::thread::scope(|s| {
        for (c, pair) in comms.iter().zip(pairs) {
            s.spawn(move || {
                let r = c.rank();
                let dev = Device::new(Provider::Host, r as u32 % 2).unwrap();
                c.set_device(dev).unwrap();
                let local = pair.unwrap_or_else(|| {
                    Communicator::local_group(1, Config::default())
                        .unwrap()
                        .remove(0)
                });
                local.set_device(dev).unwrap();
                let stream = DeviceStream::new(dev).unwrap();
                let blocking = mixed && r == 0;
                let before = c.device_peer_calls();
                let counts = [1usize, 7, 1031, 65_537];
                for (k, &count) in counts.iter().enumerate() {
                    let res = round(c, &local, dev, &stream, blocking, count, k % 2 == 0);
                    if let Err(msg) = res {
                        println!("WRONG rank={r} {msg}");
                        return;
                    }
                }
                stream.synchronize().unwrap();
                let calls = c.device_peer_calls() - before;
                println!("STREAMS rank={r} blocking={blocking} calls={calls}");
            });
        }
    });
}

fn run(n: usize, case: &str) {
    let env = [
        ("FERRO_TEST_RANKS", n.to_string()),
        ("FERRO_TEST_CASE", case.to_string()),
        // Calls of 65,537 elements are cut into slices and go whole.
        ("FERRO_DEVICE_SLICE_BYTES", "64K".to_string()),
        ("FERRO_TIMEOUT", "60".to_string()),
    ];
    let out = standin_p2p_child("child_peer_streams", "peer-streams", &env, 300);
    let lines = out.tagged("STREAMS ");
    assert_eq!(lines.len(), n, "{}", out.dump());
    for l in &lines {
        // Every call of every round went between the buffers, once each.
        assert!(
            l.ends_with(&format!("calls={}", 4 * CALLS)),
            "{l}\n{}",
            out.dump()
        );
    }
}

#[test]
fn stream_ordered_calls_of_2_and_3_ranks_go_between_the_buffers_in_stream_order() {
    run(2, "streams");
    run(3, "streams");
}

#[test]
fn a_blocking_rank_and_stream_ordered_ranks_go_between_the_buffers_together() {
    run(2, "mixed");
    run(3, "mixed");
}
