//! Collectives through windows in stream order (docs/CUDA.md, "Across processes: windows"):
//! ranks that are processes of one host register their device buffers as windows, which
//! also exchanges their reducers' shared marks (the stand-in's model of interprocess events),
//! then call the `*_device_on` forms on a stream of their own: each call is queued on the
//! stream and returns, each rank's share waits for the other processes' ready marks, and its
//! stream waits for their done marks.
//!
//! Each rank's first input is written on its stream just before the calls (a one-rank
//! communicator's stream-ordered allreduce), which the lazy stand-in stream runs only when
//! something waits for it: another process's share reads it right only by waiting for this
//! rank's ready mark, which asks this process to run its stream that far. Calls follow each
//! other without a wait (each reads what the one before wrote); the last rank synchronizes
//! first, the others after a pause. In the mixed case rank 0 makes blocking calls beside the
//! others' stream-ordered ones. Every case runs with lazy and with eager stand-in streams.

mod common;

use std::time::Duration;

use common::child::{self, ferrorun_self, field};
use ferroccl::device::{Device, DeviceBuffer, DeviceStream, Provider, PROVIDER_ENV};
use ferroccl::{Communicator, Config, ReduceOp};

/// Element `i` of rank `r`'s data: distinct per element and rank, small enough that sums of
/// a few stay exact in f32.
fn value(r: usize, i: usize) -> f32 {
    ((i * 31 + r * 977) % 65_521) as f32
}

/// The calls of one round between the buffers.
const CALLS: u64 = 8;

/// The counts of the rounds.
const COUNTS: [usize; 4] = [1, 7, 1031, 65_537];

/// One rank's round of `count` elements, every buffer in a window: each call stream-ordered,
/// or blocking (`blocking`); `local` writes the first input. With `early`, the windows are
/// deregistered straight after the calls, before anything waits for the stream.
fn round(
    c: &Communicator,
    local: &Communicator,
    dev: Device,
    stream: &DeviceStream,
    blocking: bool,
    count: usize,
    early: bool,
) -> Result<(), String> {
    let (r, n) = (c.rank(), c.nranks());
    let e = |what: &'static str| move |err: ferroccl::Error| format!("{what} on rank {r}: {err}");
    let src: Vec<f32> = (0..count).map(|i| value(r, i)).collect();
    let src_d = DeviceBuffer::from_host(dev, &src).map_err(e("upload"))?;
    let alloc = |len: usize| DeviceBuffer::<f32>::new(dev, len).map_err(e("alloc"));
    let (mut x, mut out, mut gathered) = (alloc(count)?, alloc(count)?, alloc(count * n)?);
    let (mut scattered, mut reduced) = (alloc(count)?, alloc(count)?);
    let (mut exchanged, mut averaged) = (alloc(count * n)?, alloc(count)?);
    let mut windows = Vec::new();
    for b in [
        &src_d, &x, &out, &gathered, &scattered, &reduced, &exchanged, &averaged,
    ] {
        // SAFETY: every window is deregistered below, before its buffer is dropped.
        let w = unsafe { c.register_window(b.addr(), b.bytes()) }.map_err(e("register"))?;
        windows.push(w);
    }
    let sum = ReduceOp::Sum;
    // The input of the first call, written on the stream: not there until the stream gets
    // to it.
    local
        .all_reduce_device_on(&src_d, &mut x, sum, stream)
        .map_err(e("copy"))?;
    if blocking {
        stream.synchronize().map_err(e("synchronize"))?;
        c.all_reduce_device(&x, &mut out, sum)
            .map_err(e("all_reduce"))?;
        c.all_reduce_device_in_place(&mut out, sum)
            .map_err(e("in place"))?;
        c.broadcast_device(&mut x, 1).map_err(e("broadcast"))?;
        c.all_gather_device(&src_d, &mut gathered)
            .map_err(e("all_gather"))?;
        c.reduce_scatter_device(&gathered, &mut scattered, sum)
            .map_err(e("reduce_scatter"))?;
        c.reduce_device(&x, &mut reduced, sum, 0)
            .map_err(e("reduce"))?;
        c.all_to_all_device(&gathered, &mut exchanged)
            .map_err(e("all_to_all"))?;
        c.all_reduce_device(&scattered, &mut averaged, ReduceOp::Avg)
            .map_err(e("avg"))?;
    } else {
        c.all_reduce_device_on(&x, &mut out, sum, stream)
            .map_err(e("all_reduce"))?;
        c.all_reduce_device_in_place_on(&mut out, sum, stream)
            .map_err(e("in place"))?;
        c.broadcast_device_on(&mut x, 1, stream)
            .map_err(e("broadcast"))?;
        c.all_gather_device_on(&src_d, &mut gathered, stream)
            .map_err(e("all_gather"))?;
        c.reduce_scatter_device_on(&gathered, &mut scattered, sum, stream)
            .map_err(e("reduce_scatter"))?;
        c.reduce_device_on(&x, &mut reduced, sum, 0, stream)
            .map_err(e("reduce"))?;
        c.all_to_all_device_on(&gathered, &mut exchanged, stream)
            .map_err(e("all_to_all"))?;
        c.all_reduce_device_on(&scattered, &mut averaged, ReduceOp::Avg, stream)
            .map_err(e("avg"))?;
        // Deregistration waits for this rank's shares, which read the others' buffers
        // through the mappings it drops.
        if early {
            for w in windows.drain(..) {
                c.deregister_window(w).map_err(e("deregister early"))?;
            }
        }
        // The last rank runs its stream first: its shares wait for the others' ready marks,
        // which their processes' streams reach only when asked.
        if r + 1 == n {
            stream.synchronize().map_err(e("synchronize"))?;
        } else {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let total = |i: usize| (0..n).map(|k| value(k, i)).sum::<f32>();
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
    // Host access waits until the stream has let the buffers go.
    let read = |b: &DeviceBuffer<f32>| b.to_vec().map_err(e("read back"));
    check("all_reduce then in place", read(&out)?, &|i| {
        n as f32 * total(i)
    })?;
    check("broadcast from 1", read(&x)?, &|i| value(1, i))?;
    check("all_gather", read(&gathered)?, &|i| {
        value(i / count, i % count)
    })?;
    check("reduce_scatter", read(&scattered)?, &|i| {
        n as f32 * value(r, i)
    })?;
    if r == 0 {
        check("reduce to 0", read(&reduced)?, &|i| n as f32 * value(1, i))?;
    }
    check("all_to_all", read(&exchanged)?, &|i| value(r, i % count))?;
    check("avg", read(&averaged)?, &total)?;
    for w in windows {
        c.deregister_window(w).map_err(e("deregister"))?;
    }
    Ok(())
}

/// A child rank: rank `r` on stand-in device `r % 2`; `FERRO_TEST_CASE=mixed`: rank 0 blocks.
#[test]
fn child_window_streams() {
    if !child::is_role("window-streams") {
        return;
    }
    let mixed = child::env_var::<String>("FERRO_TEST_CASE") == "mixed";
    let c = Communicator::from_env().expect("from_env");
    let r = c.rank();
    let dev = Device::new(Provider::Host, r as u32 % 2).unwrap();
    c.set_device(dev).unwrap();
    let local = Communicator::local_group(1, Config::default())
        .unwrap()
        .remove(0);
    local.set_device(dev).unwrap();
    let stream = DeviceStream::new(dev).unwrap();
    let blocking = mixed && r == 0;
    let before = c.device_peer_calls();
    for (k, count) in COUNTS.into_iter().enumerate() {
        if let Err(msg) = round(&c, &local, dev, &stream, blocking, count, k % 2 == 1) {
            println!("WRONG rank={r} {msg}");
            return;
        }
    }
    stream.synchronize().unwrap();
    let calls = c.device_peer_calls() - before;
    println!("STREAMS rank={r} blocking={blocking} calls={calls}");
}

fn run(n: usize, case: &str, eager: bool) {
    let _serial = child::serial();
    let env = [
        (PROVIDER_ENV, "host".to_string()),
        ("FERRO_P2P_PROVIDER", "host".to_string()),
        ("FERRO_TRANSPORTS", "p2p".to_string()),
        ("FERRO_STANDIN_DEVICES", "2".to_string()),
        ("FERRO_STANDIN_EAGER", u8::from(eager).to_string()),
        ("FERRO_TEST_CASE", case.to_string()),
        // Calls of 65,537 elements are cut into slices and go whole.
        ("FERRO_DEVICE_SLICE_BYTES", "64K".to_string()),
        ("FERRO_TIMEOUT", "60".to_string()),
    ];
    let out = ferrorun_self(
        n,
        None,
        "child_window_streams",
        "window-streams",
        &env,
        Duration::from_secs(150),
    );
    assert!(out.success(), "{}", out.dump());
    let lines = out.tagged("STREAMS ");
    assert_eq!(lines.len(), n, "{}", out.dump());
    for l in &lines {
        // Every call of every round went between the buffers, once each.
        let calls: u64 = field(l, "calls");
        assert_eq!(calls, COUNTS.len() as u64 * CALLS, "{l}\n{}", out.dump());
    }
}

#[test]
fn stream_ordered_calls_through_windows_of_2_and_3_processes_go_between_the_buffers() {
    for eager in [false, true] {
        run(2, "streams", eager);
        run(3, "streams", eager);
    }
}

#[test]
fn a_blocking_process_and_stream_ordered_ones_go_through_windows_together() {
    for eager in [false, true] {
        run(2, "mixed", eager);
        run(3, "mixed", eager);
    }
}
