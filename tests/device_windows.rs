//! Collectives straight between the device buffers of ranks that are processes of one host,
//! through windows (`Communicator::register_window`, `ncclCommWindowRegister`; docs/CUDA.md,
//! "Across processes: windows"). On the host stand-ins (`FERRO_DEVICE_PROVIDER=host`,
//! `FERRO_P2P_PROVIDER=host`), whose device memory is a memory file per allocation that the
//! other processes map as CUDA IPC maps device memory.
//!
//! Every case checks every element against the host reference and says how many calls took
//! the path, so that calls that must take it and calls that must not are both asserted:
//! buffers in windows (every collective, in and out of place, counts 1 to 65,537); buffers in
//! no window; one rank's buffer in host memory; ranks on two stand-in devices that reach each
//! other and two that do not; windows deregistered, freed and made again.

mod common;

use std::time::Duration;

use common::child::{self, ferrorun_self, field};
use ferroccl::device::{Device, DeviceBuffer, Provider, PROVIDER_ENV};
use ferroccl::{Communicator, ReduceOp};

/// Element `i` of rank `r`'s input: distinct in every element and rank, a multiple of `n` (so
/// that an average is exact), small enough that sums of f32 are exact.
fn value(r: usize, i: usize, n: usize) -> f32 {
    (n * ((r + 1) * 100_000 + i % 65_521)) as f32
}

fn input(r: usize, len: usize, n: usize) -> Vec<f32> {
    (0..len).map(|i| value(r, i, n)).collect()
}

/// Registers `buf` as a window of `comm` (this test keeps every buffer until it deregisters).
fn window(comm: &Communicator, buf: &DeviceBuffer<f32>) -> ferroccl::comm::Window {
    // SAFETY: every window is deregistered before its buffer is dropped.
    unsafe { comm.register_window(buf.addr(), buf.bytes()) }.expect("register_window")
}

/// One round: every collective on buffers of `count` (all_gather, all_to_all: `n × count`)
/// elements, in windows where `windowed`; returns the calls that took the path. Every element
/// is checked.
fn round(
    comm: &Communicator,
    dev: Device,
    count: usize,
    windowed: bool,
    host_rank: Option<usize>,
) -> u64 {
    let (r, n) = (comm.rank(), comm.nranks());
    let big = count * n;
    let mut send = DeviceBuffer::from_host(dev, &input(r, big, n)).unwrap();
    let mut recv = DeviceBuffer::<f32>::new(dev, big).unwrap();
    let wins = windowed.then(|| [window(comm, &send), window(comm, &recv)]);
    let before = comm.device_peer_calls();
    let sum = |i: usize| (0..n).map(|k| value(k, i, n)).sum::<f32>();
    let check = |what: &str, got: &[f32], want: &dyn Fn(usize) -> f32| {
        let wrong: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want(i)).collect();
        assert!(
            wrong.is_empty(),
            "rank {r} of {n}, {what}, {count} elements: {} wrong, first {} got {} want {}",
            wrong.len(),
            wrong[0],
            got[wrong[0]],
            want(wrong[0])
        );
    };
    if host_rank == Some(r) {
        // This rank's buffers are host memory (registered too): every call runs the schedule.
        let mine = input(r, count, n);
        let mut out = vec![0f32; count];
        // SAFETY: both vectors outlive their windows, deregistered below.
        let host_wins = windowed.then(|| unsafe {
            [
                comm.register_window(mine.as_ptr() as u64, count * 4)
                    .unwrap(),
                comm.register_window(out.as_ptr() as u64, count * 4)
                    .unwrap(),
            ]
        });
        comm.all_reduce(&mine, &mut out, ReduceOp::Sum).unwrap();
        check("all_reduce (host)", &out, &sum);
        let after = comm.device_peer_calls();
        for w in host_wins.into_iter().chain(wins).flatten() {
            comm.deregister_window(w).unwrap();
        }
        return after - before;
    }
    let mut small_send = DeviceBuffer::from_host(dev, &input(r, count, n)).unwrap();
    let mut small_recv = DeviceBuffer::<f32>::new(dev, count).unwrap();
    let small_wins = windowed.then(|| [window(comm, &small_send), window(comm, &small_recv)]);
    comm.all_reduce_device(&small_send, &mut small_recv, ReduceOp::Sum)
        .unwrap();
    check("all_reduce", &small_recv.to_vec().unwrap(), &sum);
    if host_rank.is_some() {
        // The host rank makes one call; so do the others.
        let after = comm.device_peer_calls();
        for w in small_wins.into_iter().chain(wins).flatten() {
            comm.deregister_window(w).unwrap();
        }
        return after - before;
    }
    comm.all_reduce_device(&small_send, &mut small_recv, ReduceOp::Avg)
        .unwrap();
    check("all_reduce avg", &small_recv.to_vec().unwrap(), &|i| {
        sum(i) / n as f32
    });
    comm.all_reduce_device(&small_send, &mut small_recv, ReduceOp::Max)
        .unwrap();
    check("all_reduce max", &small_recv.to_vec().unwrap(), &|i| {
        value(n - 1, i, n)
    });
    comm.all_reduce_device_in_place(&mut small_send, ReduceOp::Sum)
        .unwrap();
    check("all_reduce in place", &small_send.to_vec().unwrap(), &sum);
    small_send.copy_from_host(&input(r, count, n)).unwrap();
    let root = 1 % n;
    comm.broadcast_device(&mut small_send, root).unwrap();
    check("broadcast", &small_send.to_vec().unwrap(), &|i| {
        value(root, i, n)
    });
    small_send.copy_from_host(&input(r, count, n)).unwrap();
    comm.reduce_device(&small_send, &mut small_recv, ReduceOp::Sum, n - 1)
        .unwrap();
    if r == n - 1 {
        check("reduce", &small_recv.to_vec().unwrap(), &sum);
    }
    comm.all_gather_device(&small_send, &mut recv).unwrap();
    check("all_gather", &recv.to_vec().unwrap(), &|i| {
        value(i / count, i % count, n)
    });
    comm.reduce_scatter_device(&send, &mut small_recv, ReduceOp::Sum)
        .unwrap();
    check("reduce_scatter", &small_recv.to_vec().unwrap(), &|i| {
        sum(r * count + i)
    });
    comm.all_to_all_device(&send, &mut recv).unwrap();
    check("all_to_all", &recv.to_vec().unwrap(), &|i| {
        value(i / count, r * count + i % count, n)
    });
    send.copy_from_host(&input(r, big, n)).unwrap();
    let after = comm.device_peer_calls();
    for w in small_wins.into_iter().chain(wins).flatten() {
        comm.deregister_window(w).unwrap();
    }
    after - before
}

/// Calls of one [`round`] on device buffers.
const CALLS: u64 = 9;

/// A child rank: `FERRO_TEST_CASE` `same` (every rank on stand-in device 0), `devices`
/// (rank `r` on device `r % 2`), `host` (rank 0 on host buffers).
#[test]
fn child_windows() {
    if !child::is_role("windows") {
        return;
    }
    let case: String = child::env_var("FERRO_TEST_CASE");
    let comm = Communicator::from_env().expect("from_env");
    let r = comm.rank();
    let ordinal = if case == "devices" { r as u32 % 2 } else { 0 };
    let dev = Device::new(Provider::Host, ordinal).unwrap();
    comm.set_device(dev).unwrap();
    assert!(
        comm.exchanges_windows(),
        "processes of one host with p2p exchange windows"
    );
    // A call queued on a stream just before a registration takes its turn first on every rank
    // (the stand-in runs it as a stream job, which takes its turn when its worker runs it).
    {
        let n = comm.nranks();
        let stream = ferroccl::device::DeviceStream::new(dev).unwrap();
        let a = DeviceBuffer::from_host(dev, &input(r, 4099, n)).unwrap();
        let mut b = DeviceBuffer::<f32>::new(dev, 4099).unwrap();
        comm.all_reduce_device_on(&a, &mut b, ReduceOp::Sum, &stream)
            .unwrap();
        let w = comm
            .register_device_window(DeviceBuffer::<f32>::new(dev, 64).unwrap())
            .unwrap();
        comm.deregister_device_window(w).unwrap();
        stream.synchronize().unwrap();
        let got = b.to_vec().unwrap();
        let sum = |i: usize| (0..n).map(|k| value(k, i, n)).sum::<f32>();
        assert!(
            (0..4099).all(|i| got[i] == sum(i)),
            "rank {r}: the queued allreduce"
        );
    }
    let host_rank = (case == "host").then_some(0);
    let mut taken = 0;
    let mut unwindowed = 0;
    // A rank with host buffers runs a call whole where the device ranks cut it into slices
    // (64 KiB here): the host case stays below one slice.
    let counts: &[usize] = if case == "host" {
        &[1, 7, 1031]
    } else {
        &[1, 7, 1031, 65537]
    };
    for &count in counts {
        taken += round(&comm, dev, count, true, host_rank);
        unwindowed += round(&comm, dev, count, false, host_rank);
    }
    // The safe form owns its buffer: an allreduce in place on it, the buffer given back.
    let n = comm.nranks();
    let before = comm.device_peer_calls();
    let buf = DeviceBuffer::from_host(dev, &input(r, 4099, n)).unwrap();
    let mut w = comm.register_device_window(buf).unwrap();
    comm.all_reduce_device_in_place(&mut w, ReduceOp::Sum)
        .unwrap();
    let back = comm.deregister_device_window(w).unwrap();
    let got = back.to_vec().unwrap();
    let sum = |i: usize| (0..n).map(|k| value(k, i, n)).sum::<f32>();
    assert!(
        (0..4099).all(|i| got[i] == sum(i)),
        "rank {r}: the device window's allreduce"
    );
    let owned = comm.device_peer_calls() - before;
    // Dropped while registered: kept (with a warning), never freed under another process.
    let kept = comm.register_device_window(back).unwrap();
    drop(kept);
    println!("WINDOWS rank={r} taken={taken} unwindowed={unwindowed} owned={owned}");
}

fn job(n: usize, case: &str, extra: &[(&str, &str)]) -> Vec<(u64, u64)> {
    let _serial = child::serial();
    let mut env = vec![
        (PROVIDER_ENV, "host".to_string()),
        ("FERRO_P2P_PROVIDER", "host".to_string()),
        ("FERRO_TRANSPORTS", "p2p".to_string()),
        // 65537 f32 run as five slices: the whole call is offered at the first.
        ("FERRO_DEVICE_SLICE_BYTES", "64K".to_string()),
        ("FERRO_TIMEOUT", "60".to_string()),
        ("FERRO_TEST_CASE", case.to_string()),
        // Two devices: a rank's p2p slots (local rank mod devices) on its buffers' device.
        ("FERRO_STANDIN_DEVICES", "2".to_string()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    let out = ferrorun_self(
        n,
        None,
        "child_windows",
        "windows",
        &env,
        Duration::from_secs(120),
    );
    assert!(out.success(), "{}", out.dump());
    let lines = out.tagged("WINDOWS ");
    assert_eq!(lines.len(), n, "{}", out.dump());
    let usable = extra.is_empty();
    for l in &lines {
        assert_eq!(field::<u64>(l, "owned"), u64::from(usable), "{l}");
    }
    assert_eq!(
        out.dump()
            .matches("was dropped while still registered")
            .count(),
        n,
        "{}",
        out.dump()
    );
    lines
        .iter()
        .map(|l| (field(l, "taken"), field(l, "unwindowed")))
        .collect()
}

#[test]
fn collectives_in_windows_go_between_the_buffers_of_2_processes() {
    for (taken, unwindowed) in job(2, "same", &[]) {
        assert_eq!((taken, unwindowed), (4 * CALLS, 0));
    }
}

#[test]
fn collectives_in_windows_go_between_the_buffers_of_3_processes_on_two_devices() {
    for (taken, unwindowed) in job(3, "devices", &[]) {
        assert_eq!((taken, unwindowed), (4 * CALLS, 0));
    }
}

/// Devices that do not reach each other: the other device's buffers cannot be mapped, the
/// windows are kept unusable on every rank, and every call runs the schedule.
#[test]
fn windows_of_devices_that_do_not_reach_each_other_carry_no_call() {
    for (taken, unwindowed) in job(2, "devices", &[("FERRO_STANDIN_PEER_ACCESS", "0")]) {
        assert_eq!((taken, unwindowed), (0, 0));
    }
}

/// A rank whose buffer is host memory registers it too; no call takes the path.
#[test]
fn a_window_of_host_memory_carries_no_call() {
    for (taken, unwindowed) in job(3, "host", &[]) {
        assert_eq!((taken, unwindowed), (0, 0));
    }
}

/// The path off (`FERRO_DEVICE_PEER=0`): windows are not exchanged.
#[test]
fn without_the_path_windows_are_not_exchanged() {
    let _serial = child::serial();
    let env = vec![
        (PROVIDER_ENV, "host".to_string()),
        ("FERRO_P2P_PROVIDER", "host".to_string()),
        ("FERRO_TRANSPORTS", "p2p".to_string()),
        ("FERRO_DEVICE_PEER", "0".to_string()),
        ("FERRO_TEST_CASE", "same".to_string()),
    ];
    let out = ferrorun_self(
        2,
        None,
        "child_windows",
        "windows",
        &env,
        Duration::from_secs(60),
    );
    assert!(
        !out.success(),
        "the child asserts that windows are exchanged"
    );
    assert!(out.dump().contains("exchange windows"), "{}", out.dump());
}

/// Where windows are not exchanged (ranks that are threads of one process), registering is
/// local: a rank that registers alone takes no turn, so the next collective still matches;
/// and a window given to another communicator is refused.
#[test]
fn windows_that_are_not_exchanged_take_no_turn_and_belong_to_their_communicator() {
    let cfg = ferroccl::Config::default();
    let a = Communicator::local_group(2, cfg.clone()).unwrap();
    let b = Communicator::local_group(2, cfg).unwrap();
    assert!(!a[0].exchanges_windows());
    let buf = vec![0u8; 256];
    // SAFETY: `buf` outlives the window, deregistered below.
    let w = unsafe { a[0].register_window(buf.as_ptr() as u64, buf.len()) }.unwrap();
    std::thread::scope(|s| {
        for c in &a {
            s.spawn(move || {
                let x = [c.rank() as u32 + 1; 7];
                let mut y = [0u32; 7];
                c.all_reduce(&x, &mut y, ReduceOp::Sum).unwrap();
                assert_eq!(y, [3; 7]);
            });
        }
    });
    let e = b[0].deregister_window(w).unwrap_err();
    assert!(e.to_string().contains("another communicator"), "{e}");
    // SAFETY: as above.
    let w = unsafe { a[0].register_window(buf.as_ptr() as u64, buf.len()) }.unwrap();
    a[0].deregister_window(w).unwrap();
}
