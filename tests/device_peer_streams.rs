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
use ferroccl::device::{Device, DeviceBuffer, DeviceStream, Provider};
use ferroccl::{Communicator, Config, ReduceOp};

/// Element `i` of rank `r`'s data: distinct per element and rank, small enough that sums of
/// a few stay exact in f32.
fn value(r: usize, i: usize) -> f32 {
    ((i * 31 + r * 977) % 65_521) as f32
}

/// The calls of one round between the buffers.
const CALLS: u64 = 8;

/// The sum over the `n` ranks of their data's element `i`.
fn total_of_values(n: usize, i: usize) -> f32 {
    (0..n).map(|k| value(k, i)).sum()
}

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
#[allow(clippy::too_many_arguments)]
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
    fn e(what: &'static str, r: usize) -> impl Fn(ferroccl::Error) -> String {
        move |err| format!("{what} on rank {r}: {err}")
    }
    let src: Vec<f32> = (0..count).map(|i| value(r, i)).collect();
    let src_d = DeviceBuffer::from_host(dev, &src).map_err(e("upload", r))?;
    let mut x = DeviceBuffer::<f32>::new(dev, count).map_err(e("alloc", r))?;
    let mut out = DeviceBuffer::<f32>::new(dev, count).map_err(e("alloc", r))?;
    let mut gathered = DeviceBuffer::<f32>::new(dev, count * n).map_err(e("alloc", r))?;
    let mut scattered = DeviceBuffer::<f32>::new(dev, count).map_err(e("alloc", r))?;
    let mut reduced = DeviceBuffer::<f32>::new(dev, count).map_err(e("alloc", r))?;
    let mut exchanged = DeviceBuffer::<f32>::new(dev, count * n).map_err(e("alloc", r))?;
    let mut averaged = DeviceBuffer::<f32>::new(dev, count).map_err(e("alloc", r))?;
    let sum = ReduceOp::Sum;
    if blocking {
        local
            .all_reduce_device(&src_d, &mut x, sum)
            .map_err(e("copy", r))?;
        c.all_reduce_device(&x, &mut out, sum)
            .map_err(e("all_reduce", r))?;
        c.all_reduce_device_in_place(&mut out, sum)
            .map_err(e("in place", r))?;
        c.broadcast_device(&mut x, 1).map_err(e("broadcast", r))?;
        c.all_gather_device(&src_d, &mut gathered)
            .map_err(e("all_gather", r))?;
        c.reduce_scatter_device(&gathered, &mut scattered, sum)
            .map_err(e("reduce_scatter", r))?;
        c.reduce_device(&x, &mut reduced, sum, 0)
            .map_err(e("reduce", r))?;
        c.all_to_all_device(&gathered, &mut exchanged)
            .map_err(e("all_to_all", r))?;
        c.all_reduce_device(&scattered, &mut averaged, ReduceOp::Avg)
            .map_err(e("avg", r))?;
    } else {
        // The input of the first call, written on the stream: not there until the stream
        // gets to it.
        local
            .all_reduce_device_on(&src_d, &mut x, sum, stream)
            .map_err(e("copy", r))?;
        c.all_reduce_device_on(&x, &mut out, sum, stream)
            .map_err(e("all_reduce", r))?;
        c.all_reduce_device_in_place_on(&mut out, sum, stream)
            .map_err(e("in place", r))?;
        c.broadcast_device_on(&mut x, 1, stream)
            .map_err(e("broadcast", r))?;
        c.all_gather_device_on(&src_d, &mut gathered, stream)
            .map_err(e("all_gather", r))?;
        c.reduce_scatter_device_on(&gathered, &mut scattered, sum, stream)
            .map_err(e("reduce_scatter", r))?;
        c.reduce_device_on(&x, &mut reduced, sum, 0, stream)
            .map_err(e("reduce", r))?;
        c.all_to_all_device_on(&gathered, &mut exchanged, stream)
            .map_err(e("all_to_all", r))?;
        c.all_reduce_device_on(&scattered, &mut averaged, ReduceOp::Avg, stream)
            .map_err(e("avg", r))?;
        // A rank that took no part in the pair's allreduce runs its stream first: its shares
        // must wait for the pair's streams to get to their ready marks.
        if r >= 2 {
            stream.synchronize().map_err(e("synchronize", r))?;
        } else {
            std::thread::sleep(std::time::Duration::from_millis(20));
            if sync_first {
                stream.synchronize().map_err(e("synchronize", r))?;
            }
        }
    }
    let total = |i: usize| (0..n).map(|k| first(k, i)).sum::<f32>();
    let check = |what: &str, got: Vec<f32>, want: &dyn Fn(usize) -> f32| match (0..got.len())
        .find(|&i| got[i] != want(i))
    {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what} on rank {r}, {count} elements: element {i} is {}, want {}",
            got[i],
            want(i)
        )),
    };
    let read = |b: &DeviceBuffer<f32>| b.to_vec().map_err(e("read back", r));
    check("all_reduce then in place", read(&out)?, &|i| {
        n as f32 * total(i)
    })?;
    check("broadcast from 1", read(&x)?, &|i| first(1, i))?;
    check("all_gather", read(&gathered)?, &|i| {
        value(i / count, i % count)
    })?;
    check("reduce_scatter", read(&scattered)?, &|i| {
        n as f32 * value(r, i)
    })?;
    if r == 0 {
        check("reduce to 0", read(&reduced)?, &|i| n as f32 * first(1, i))?;
    }
    check("all_to_all", read(&exchanged)?, &|i| value(r, i % count))?;
    // The average of every rank's n x data: each rank's sum, divided by n, exactly.
    check("avg", read(&averaged)?, &|i| total_of_values(n, i))?;
    Ok(())
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
