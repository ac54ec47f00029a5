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
//! others' stream-ordered ones; in the threads' case each process holds two ranks. Every case
//! runs with lazy and with eager stand-in streams.

mod common;

use std::time::Duration;

use common::child::{self, ferrorun_self, field};
use common::stream_round::{value, Bufs, CALLS};
use ferroccl::device::{Device, DeviceBuffer, DeviceStream, Provider, PROVIDER_ENV};
use ferroccl::{Communicator, Config};

/// The counts of the rounds.
const COUNTS: [usize; 4] = [1, 7, 1031, 65_537];

/// One rank's round of `count` elements, every buffer in a window: each call stream-ordered,
/// or blocking (`blocking`); `local` writes the first input. First an allreduce of other
/// buffers on a second stream (`other`), which nothing orders with the round's stream. With
/// `early`, the windows are deregistered straight after the calls, before anything waits for
/// either stream (deregistration waits for this rank's shares on both).
#[allow(clippy::too_many_arguments)]
fn round(
    c: &Communicator,
    local: &Communicator,
    dev: Device,
    (stream, other): (&DeviceStream, &DeviceStream),
    blocking: bool,
    count: usize,
    early: bool,
    windowed: bool,
) -> Result<(), String> {
    let (r, n) = (c.rank(), c.nranks());
    let e = |what: &'static str| move |err: ferroccl::Error| format!("{what} on rank {r}: {err}");
    let mut b = Bufs::new(dev, r, n, count)?;
    let side = DeviceBuffer::from_host(dev, &vec![(r + 1) as f32; count]).map_err(e("upload"))?;
    let mut side_out = DeviceBuffer::<f32>::new(dev, count).map_err(e("alloc"))?;
    let mut windows = Vec::new();
    for buf in b
        .all()
        .into_iter()
        .chain([&side, &side_out])
        .filter(|_| windowed)
    {
        // SAFETY: every window is deregistered below, before its buffer is dropped.
        let w = unsafe { c.register_window(buf.addr(), buf.bytes()) }.map_err(e("register"))?;
        windows.push(w);
    }
    let sum = ferroccl::ReduceOp::Sum;
    match blocking {
        true => c.all_reduce_device(&side, &mut side_out, sum),
        false => c.all_reduce_device_on(&side, &mut side_out, sum, other),
    }
    .map_err(e("all_reduce on the second stream"))?;
    // The first input, written on the stream: not there until the stream gets to it.
    b.write_first(local, Some(stream))?;
    if blocking {
        stream.synchronize().map_err(e("synchronize"))?;
        b.calls(c, None)?;
    } else {
        b.calls(c, Some(stream))?;
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
    b.check(&value)?;
    let got = side_out.to_vec().map_err(e("read back"))?;
    let want = (n * (n + 1) / 2) as f32;
    if let Some(i) = (0..count).find(|&i| got[i] != want) {
        return Err(format!(
            "the second stream's allreduce on rank {r}, {count} elements: element {i} is {}, \
             want {want}",
            got[i]
        ));
    }
    for w in windows {
        c.deregister_window(w).map_err(e("deregister"))?;
    }
    Ok(())
}

/// A child process: one rank, or with `FERRO_TEST_CASE=threads` two ranks as threads.
#[test]
fn child_window_streams() {
    if !child::is_role("window-streams") {
        return;
    }
    let case = child::env_var::<String>("FERRO_TEST_CASE");
    if case == "scratch-end" {
        rank_scratch_end(Communicator::from_env().expect("from_env"));
        return;
    }
    if case == "scratch-finalized" {
        rank_scratch_finalized(Communicator::from_env().expect("from_env"));
        return;
    }
    if case != "threads" {
        let c = Communicator::from_env().expect("from_env");
        rank_window_streams(c, case.ends_with("mixed"), !case.starts_with("scratch"));
        return;
    }
    let env = ferroccl::bootstrap::env::detect()
        .expect("launch environment")
        .expect("under ferrorun");
    let config = Config::from_env().expect("config");
    let comms = Communicator::from_launch_env_threads(&env, config, 2).expect("two ranks");
    std::thread::scope(|s| {
        for c in comms {
            s.spawn(move || rank_window_streams(c, false, true));
        }
    });
}

/// Rank `r` on stand-in device `r % 2`; with `mixed`, rank 0 blocks; without `windowed`, no
/// buffer is registered (the scratch windows carry the calls).
fn rank_window_streams(c: Communicator, mixed: bool, windowed: bool) {
    let r = c.rank();
    let dev = Device::new(Provider::Host, r as u32 % 2).unwrap();
    c.set_device(dev).unwrap();
    let local = Communicator::local_group(1, Config::default())
        .unwrap()
        .remove(0);
    local.set_device(dev).unwrap();
    let stream = DeviceStream::new(dev).unwrap();
    let other = DeviceStream::new(dev).unwrap();
    let blocking = mixed && r == 0;
    let before = c.device_peer_calls();
    for (k, count) in COUNTS.into_iter().enumerate() {
        let streams = (&stream, &other);
        let early = k % 2 == 1;
        if let Err(msg) = round(&c, &local, dev, streams, blocking, count, early, windowed) {
            println!("WRONG rank={r} {msg}");
            return;
        }
    }
    stream.synchronize().unwrap();
    other.synchronize().unwrap();
    let calls = c.device_peer_calls() - before;
    println!("STREAMS rank={r} blocking={blocking} calls={calls}");
}

/// A rank's allreduce of 1,031 elements on a stream of its own, on stand-in device `r % 2`.
struct OneSum {
    stream: DeviceStream,
    input: DeviceBuffer<f32>,
    out: DeviceBuffer<f32>,
}

impl OneSum {
    fn new(c: &Communicator) -> OneSum {
        let r = c.rank();
        let dev = Device::new(Provider::Host, r as u32 % 2).unwrap();
        c.set_device(dev).unwrap();
        let src: Vec<f32> = (0..1031).map(|i| value(r, i)).collect();
        OneSum {
            stream: DeviceStream::new(dev).unwrap(),
            input: DeviceBuffer::from_host(dev, &src).unwrap(),
            out: DeviceBuffer::<f32>::new(dev, src.len()).unwrap(),
        }
    }

    /// Queues the allreduce on the stream.
    fn call(&mut self, c: &Communicator) {
        let sum = ferroccl::ReduceOp::Sum;
        c.all_reduce_device_on(&self.input, &mut self.out, sum, &self.stream)
            .unwrap();
    }

    /// The first wrong element of the result of `n` ranks, said.
    fn wrong(&self, n: usize) -> Option<String> {
        let got = self.out.to_vec().unwrap();
        let want = |i: usize| (0..n).map(|k| value(k, i)).sum::<f32>();
        let i = (0..got.len()).find(|&i| got[i] != want(i))?;
        Some(format!(
            "element {i} of {} is {}, want {}",
            got.len(),
            got[i],
            want(i)
        ))
    }
}

/// The communicator's end with the scratch windows: each rank's allreduce on a stream, then
/// every rank but the last ends its communicator at once (`finalize` on rank 0, `destroy` on
/// the others), while the last rank's stream still holds its copy out of rank 0's scratch
/// (a lazy stand-in stream runs only as far as another process's waits ask). The last rank
/// reads its result after a pause, then ends its communicator: a rank that freed its scratch
/// before every other had settled would have left the last one reading freed memory.
fn rank_scratch_end(c: Communicator) {
    let (r, n) = (c.rank(), c.nranks());
    let mut one = OneSum::new(&c);
    // The first call makes the scratch windows (and takes the schedule).
    one.call(&c);
    let before = c.device_peer_calls();
    one.call(&c);
    let last = r + 1 == n;
    let mut c = Some(c);
    let ended = match (last, r) {
        (true, _) => {
            std::thread::sleep(Duration::from_millis(300));
            None
        }
        (false, 0) => c.as_ref().map(|c| c.finalize()),
        (false, _) => c.take().map(|c| c.destroy()),
    };
    if let Some(msg) = one.wrong(n) {
        println!("WRONG rank={r} {msg}");
        return;
    }
    let result = match (ended, c) {
        (Some(res), _) => res.map(|()| 0),
        (None, Some(c)) => {
            let calls = c.device_peer_calls() - before;
            c.destroy().map(|()| calls)
        }
        (None, None) => unreachable!("only the last rank keeps its communicator"),
    };
    match result {
        Ok(calls) => println!("ENDED rank={r} calls={calls}"),
        Err(e) => println!("WRONG rank={r} ending: {e}"),
    }
}

/// Every rank finalizes after a call through the scratch windows, then makes another call:
/// it takes the schedule (the scratch windows are gone) and every element is right.
fn rank_scratch_finalized(c: Communicator) {
    let (r, n) = (c.rank(), c.nranks());
    let mut one = OneSum::new(&c);
    let before = c.device_peer_calls();
    for call in 0..3 {
        if call == 2 {
            c.finalize().unwrap();
        }
        one.call(&c);
        if let Some(msg) = one.wrong(n) {
            println!("WRONG rank={r} call {call}: {msg}");
            return;
        }
    }
    let calls = c.device_peer_calls() - before;
    match c.destroy() {
        Ok(()) => println!("FINALIZED rank={r} calls={calls}"),
        Err(e) => println!("WRONG rank={r} ending: {e}"),
    }
}

/// `n` processes of case `case` (`threads`: two ranks each), every rank's calls checked.
fn run(n: usize, case: &str, eager: bool) {
    let ranks = if case == "threads" { 2 * n } else { n };
    let (out, lines) = launch(n, ranks, case, eager, "STREAMS ");
    // Through the scratch windows, the first call makes them and takes the schedule.
    let first = u64::from(case.starts_with("scratch"));
    for l in &lines {
        let calls: u64 = field(l, "calls");
        // Every call of every round went between the buffers, once each.
        assert_eq!(
            calls,
            COUNTS.len() as u64 * (CALLS + 1) - first,
            "{l}\n{}",
            out.dump()
        );
    }
}

/// Runs `n` processes (`ranks` ranks) of case `case` under `ferrorun`; their lines tagged
/// `tag`, one a rank.
fn launch(
    n: usize,
    ranks: usize,
    case: &str,
    eager: bool,
    tag: &str,
) -> (child::Finished, Vec<String>) {
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
        // The scratch cases: 3 × 65,537 f32 of an all_to_all fit half of it.
        // (With "scratch-small", 65,537 elements fit no half of it: the calls go through it
        // piece by piece.)
        (
            "FERRO_DEVICE_SCRATCH_BYTES",
            match case {
                "scratch-small" => "160K",
                c if c.starts_with("scratch") => "2M",
                _ => "0",
            }
            .to_string(),
        ),
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
    let lines = out.tagged(tag);
    assert_eq!(lines.len(), ranks, "{}", out.dump());
    (out, lines)
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

/// Ranks that are threads of one process beside another process's (two of each): their
/// calls on a stream go between the buffers too, each rank waiting for the marks of the rank
/// beside it in its process as for another process's.
#[test]
fn stream_ordered_calls_of_threads_of_two_processes_go_through_windows() {
    for eager in [false, true] {
        run(2, "threads", eager);
    }
}

/// Buffers in no window, through the communicators' scratch windows
/// (`FERRO_DEVICE_SCRATCH_BYTES`): every call after the first (which makes them) goes between
/// the processes' GPUs, stream-ordered, and with a blocking process beside the others.
#[test]
fn calls_on_buffers_in_no_window_go_through_the_scratch_windows() {
    for eager in [true, false] {
        run(2, "scratch", eager);
        run(3, "scratch", eager);
        run(3, "scratch-mixed", eager);
    }
    run(2, "scratch-small", false);
}

/// Ranks that end their communicators while another process's copies out of their scratch
/// are still queued: each lets go of its scratch only once every rank has settled, and every
/// element of the last rank's result is right.
#[test]
fn ranks_free_their_scratch_windows_only_after_every_rank_has_settled() {
    for (n, eager) in [(2, false), (3, false), (2, true)] {
        let (out, lines) = launch(n, n, "scratch-end", eager, "ENDED ");
        // The last rank's second call went through the scratch windows.
        let last = lines
            .iter()
            .find(|l| field::<usize>(l, "rank") == n - 1)
            .unwrap_or_else(|| panic!("{}", out.dump()));
        assert_eq!(field::<u64>(last, "calls"), 1, "{}", out.dump());
    }
}

/// A call after `finalize` takes the schedule (the scratch windows went with it) and is right:
/// of the three calls, the first made the scratch windows and only the second went through.
#[test]
fn calls_after_finalize_take_the_schedule_without_the_scratch_windows() {
    let (out, lines) = launch(2, 2, "scratch-finalized", false, "FINALIZED ");
    for l in &lines {
        assert_eq!(field::<u64>(l, "calls"), 1, "{l}\n{}", out.dump());
    }
}
