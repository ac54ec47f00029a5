//! Collectives on device buffers through pinned host staging, with the host stand-in provider
//! (`FERRO_DEVICE_PROVIDER=host`): every path except the CUDA calls themselves.
//!
//! Ranks as threads (1, 2, 3, 5), ranks as processes over shm and over TCP, the argument checks
//! (memory space, device, lengths), and the missing-driver error of the cuda provider.

mod common;

use std::time::Duration;

use common::child::{self, expected_cases, ferrorun_self, field, self_command, Running};
use common::conformance::{all_ops, run_sweep_on, Mem, Sweep};
use ferroccl::coll::CollKind;
use ferroccl::device::{Device, DeviceBuffer, Provider, DRIVER_MISSING, PROVIDER_ENV};
use ferroccl::{BufMut, BufRef, Communicator, Config, DataType, ErrorKind, ReduceOp};

const COUNTS: [usize; 5] = [0, 1, 7, 1021, 65537];

fn host_device(ordinal: u32) -> Device {
    Device::new(Provider::Host, ordinal).expect("the host stand-in offers devices 0..4")
}

/// Runs `sweep` on device buffers over `n` thread ranks, each bound to stand-in device 0.
fn sweep_threads(n: usize, sweep: &Sweep) {
    sweep_threads_with(n, sweep, Config::default());
}

fn sweep_threads_with(n: usize, sweep: &Sweep, config: Config) {
    let comms = Communicator::local_group(n, config).expect("local_group");
    let dev = host_device(0);
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                c.set_device(dev).unwrap();
                let cases = run_sweep_on(c, Mem::Device(dev), sweep, 7 * n as u64)
                    .unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(cases, expected_cases(sweep));
            });
        }
    });
}

fn all_reduce_sweep() -> Sweep {
    Sweep {
        dtypes: DataType::ALL.to_vec(),
        ops: all_ops(),
        counts: COUNTS.to_vec(),
        colls: vec!["all_reduce"],
    }
}

/// Data movement and the other reductions: fewer dtypes and ops (the element logic is the
/// host executor's, swept by the conformance suite); every count.
fn other_sweep() -> Sweep {
    Sweep {
        dtypes: vec![DataType::Float32, DataType::Int8, DataType::Bfloat16],
        ops: vec![ReduceOp::Sum, ReduceOp::Avg, ReduceOp::PreMulSum(0.0)],
        counts: COUNTS.to_vec(),
        colls: vec![
            "broadcast",
            "all_gather",
            "reduce_scatter",
            "reduce",
            "all_to_all",
        ],
    }
}

#[test]
fn all_reduce_every_dtype_and_op_on_1_2_3_5_thread_ranks() {
    for n in [1, 2, 3, 5] {
        sweep_threads(n, &all_reduce_sweep());
    }
}

#[test]
fn broadcast_all_gather_reduce_scatter_on_1_2_3_5_thread_ranks() {
    for n in [1, 2, 3, 5] {
        sweep_threads(n, &other_sweep());
    }
}

/// Small device slices: all_reduce, broadcast and reduce run as many pipelined slices (1021
/// f32 in 256-byte slices: 16; 65537: 1025); so do the blocked layouts, by the bytes of their
/// larger buffer (all_gather of 1021 f32 on 3 ranks: 48 slices), each slice's blocks staged
/// one after another.
#[test]
fn pipelined_slices_on_2_and_3_thread_ranks() {
    let config = Config {
        device_slice_bytes: Some(256),
        ..Config::default()
    };
    let sweep = Sweep {
        dtypes: vec![DataType::Float32, DataType::Float64, DataType::Int8],
        ops: vec![ReduceOp::Sum, ReduceOp::Avg, ReduceOp::PreMulSum(0.0)],
        counts: vec![0, 1, 63, 64, 65, 1021, 65537],
        colls: vec![
            "all_reduce",
            "broadcast",
            "reduce",
            "all_gather",
            "reduce_scatter",
            "all_to_all",
        ],
    };
    for n in [1, 2, 3] {
        sweep_threads_with(n, &sweep, config.clone());
    }
}

/// Ranks that would cut device collectives into different slices (their calls would not
/// match) fail at init, every one of them, naming both settings, instead of mid-call.
#[test]
fn ranks_that_would_cut_device_calls_differently_fail_at_init() {
    let store: std::sync::Arc<dyn ferroccl::bootstrap::Store> =
        std::sync::Arc::new(ferroccl::bootstrap::MemoryStore::new());
    let hs: Vec<_> = (0..3)
        .map(|r| {
            let cfg = Config {
                device_slice_bytes: (r == 2).then_some(64 << 10),
                timeout: Duration::from_secs(20),
                ..Config::default()
            };
            let store = std::sync::Arc::clone(&store);
            std::thread::spawn(move || Communicator::init(store, r, 3, 41, cfg))
        })
        .collect();
    for (r, h) in hs.into_iter().enumerate() {
        let e = h.join().expect("init thread").expect_err("the cuts differ");
        assert_eq!(e.kind(), ErrorKind::InvalidUsage, "rank {r}: {e}");
        let m = e.message();
        assert!(m.contains(&format!("init on rank {r}")), "{e}");
        assert!(m.contains("FERRO_DEVICE_SLICE_BYTES=65536"), "{e}");
        assert!(m.contains("FERRO_DEVICE_SLICE_BYTES=unset"), "{e}");
    }
}

/// The init error of two ranks whose configs `differ(rank)` makes; it must be invalid usage.
fn init_error_of(differ: impl Fn(usize) -> Config) -> ferroccl::Error {
    let configs: Vec<Config> = (0..2)
        .map(|r| Config {
            timeout: Duration::from_secs(20),
            ..differ(r)
        })
        .collect();
    let e = Communicator::local_group_with(configs).expect_err("the offers differ");
    assert_eq!(e.kind(), ErrorKind::InvalidUsage, "{e}");
    e
}

#[test]
fn ranks_that_would_offer_allreduces_differently_fail_at_init() {
    let e = init_error_of(|r| Config {
        device_peer: r == 0,
        ..Config::default()
    });
    let m = e.message();
    assert!(
        m.contains("FERRO_DEVICE_PEER=1") && m.contains("FERRO_DEVICE_PEER=0"),
        "{e}"
    );
}

#[test]
fn ranks_that_would_offer_scratch_windows_differently_fail_at_init() {
    let e = init_error_of(|r| Config {
        device_scratch_bytes: if r == 1 { 1 << 20 } else { 0 },
        ..Config::default()
    });
    let m = e.message();
    assert!(m.contains("FERRO_DEVICE_SCRATCH_BYTES"), "{e}");
    assert!(m.contains("0 or unset"), "{e}");
    assert!(m.contains("it set") || m.contains("BYTES set"), "{e}");
    // Sizes may differ.
    let configs: Vec<Config> = (0..2)
        .map(|r| Config {
            device_scratch_bytes: (r + 1) << 20,
            ..Config::default()
        })
        .collect();
    Communicator::local_group_with(configs).expect("sizes that differ");
}

#[test]
fn staging_is_cached_per_communicator() {
    let comms = Communicator::local_group(2, Config::default()).unwrap();
    let dev = host_device(0);
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                c.set_device(dev).unwrap();
                let mut buf = DeviceBuffer::from_host(dev, &[c.rank() as u32 + 1; 1000]).unwrap();
                c.all_reduce_device_in_place(&mut buf, ReduceOp::Sum)
                    .unwrap();
                let first = c.staging_allocations();
                assert!(first >= 1);
                for _ in 0..5 {
                    c.all_reduce_device_in_place(&mut buf, ReduceOp::Sum)
                        .unwrap();
                }
                let small = DeviceBuffer::from_host(dev, &[1u32; 10]).unwrap();
                let mut out = DeviceBuffer::<u32>::new(dev, 10).unwrap();
                c.all_reduce_device(&small, &mut out, ReduceOp::Sum)
                    .unwrap();
                // In place stages through the output buffer only; out of place adds an input
                // buffer once.
                assert!(
                    c.staging_allocations() <= first + 1,
                    "{}",
                    c.staging_allocations()
                );
                let after = c.staging_allocations();
                c.all_reduce_device(&small, &mut out, ReduceOp::Sum)
                    .unwrap();
                assert_eq!(c.staging_allocations(), after, "no allocation per call");
                // 1 + 2, then doubled by each of the five repeats.
                let got = buf.to_vec().unwrap();
                assert!(got.iter().all(|&x| x == 3 << 5), "{:?}", &got[..4]);
                assert_eq!(out.to_vec().unwrap(), [2; 10]);
            });
        }
    });
}

#[test]
fn send_and_recv_device_buffers() {
    let comms = Communicator::local_group(2, Config::default()).unwrap();
    let dev = host_device(0);
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                c.set_device(dev).unwrap();
                let data: Vec<i64> = (0..777).map(|i| i * 3 + 1).collect();
                if c.rank() == 0 {
                    let buf = DeviceBuffer::from_host(dev, &data).unwrap();
                    c.send_device(&buf, 1).unwrap();
                } else {
                    let mut buf = DeviceBuffer::<i64>::new(dev, 777).unwrap();
                    c.recv_device(&mut buf, 0).unwrap();
                    assert_eq!(buf.to_vec().unwrap(), data);
                }
            });
        }
    });
}

#[test]
fn groups_stage_through_the_cached_pinned_staging() {
    let comms = Communicator::local_group(2, Config::default()).unwrap();
    let dev = host_device(0);
    let value = |r: usize, b: usize, i: usize| (r * 10_000 + b * 1_000 + i) as i32;
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                c.set_device(dev).unwrap();
                let (r, peer) = (c.rank(), 1 - c.rank());
                let sizes = [13usize, 1031, 0, 64];
                let mut allocations = None;
                for round in 0..3 {
                    let sends: Vec<DeviceBuffer<i32>> = sizes
                        .iter()
                        .enumerate()
                        .map(|(b, &n)| {
                            let v: Vec<i32> = (0..n).map(|i| value(r, b, i + round)).collect();
                            DeviceBuffer::from_host(dev, &v).unwrap()
                        })
                        .collect();
                    let mut recvs: Vec<DeviceBuffer<i32>> = sizes
                        .iter()
                        .map(|&n| DeviceBuffer::new(dev, n).unwrap())
                        .collect();
                    let mut to_self = DeviceBuffer::<i32>::new(dev, 13).unwrap();
                    let mut g = c.group();
                    for b in &sends {
                        g.send_device(b, peer);
                    }
                    g.send_device(&sends[0], r);
                    for b in recvs.iter_mut() {
                        g.recv_device(b, peer);
                    }
                    g.recv_device(&mut to_self, r);
                    g.run().unwrap();
                    for (b, buf) in recvs.iter().enumerate() {
                        let want: Vec<i32> =
                            (0..sizes[b]).map(|i| value(peer, b, i + round)).collect();
                        assert_eq!(buf.to_vec().unwrap(), want, "rank {r} round {round} #{b}");
                    }
                    assert_eq!(to_self.to_vec().unwrap(), sends[0].to_vec().unwrap());
                    let now = c.staging_allocations();
                    assert!(
                        (1..=2).contains(&now),
                        "one input and one output buffer: {now}"
                    );
                    if let Some(first) = allocations {
                        assert_eq!(now, first, "no pinned allocation after the first group");
                    }
                    allocations = Some(now);
                }
            });
        }
    });
}

/// A group whose device messages are many pieces long (64 KiB pieces: `device_slice_bytes`)
/// runs in rounds through a few pieces of pinned memory, beside host-buffer messages of
/// other lengths and a message to itself, on 3 thread ranks; every element checked.
#[test]
fn groups_of_long_device_messages_stage_a_few_pieces_at_a_time() {
    let config = Config {
        device_slice_bytes: Some(64 << 10),
        ..Config::default()
    };
    let comms = Communicator::local_group(3, config).unwrap();
    let dev = host_device(1);
    let value = |r: usize, b: usize, i: usize| (r * 100_000_007 + b * 1_000_003 + i) as i64;
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                c.set_device(dev).unwrap();
                let (r, n) = (c.rank(), c.nranks());
                let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
                // 17 pieces to the next rank, 5 (host) to the previous one, 3 to itself.
                let (long, host, own) = ((1 << 17) + 3, 40_961, 16_389);
                let fill = |b: usize, len: usize| -> Vec<i64> {
                    (0..len).map(|i| value(r, b, i)).collect()
                };
                let long_out = DeviceBuffer::from_host(dev, &fill(0, long)).unwrap();
                let host_out: Vec<i64> = fill(1, host);
                let own_out = DeviceBuffer::from_host(dev, &fill(2, own)).unwrap();
                let mut long_in = DeviceBuffer::<i64>::new(dev, long).unwrap();
                let mut host_in = vec![0i64; host];
                let mut own_in = DeviceBuffer::<i64>::new(dev, own).unwrap();
                let mut g = c.group();
                g.send_device(&long_out, next)
                    .send(&host_out, prev)
                    .send_device(&own_out, r)
                    .recv_device(&mut long_in, prev)
                    .recv(&mut host_in, next)
                    .recv_device(&mut own_in, r);
                g.run().unwrap();
                let long_in = long_in.to_vec().unwrap();
                for (i, &v) in long_in.iter().enumerate() {
                    assert_eq!(v, value(prev, 0, i), "rank {r}: element {i} from {prev}");
                }
                for (i, &v) in host_in.iter().enumerate() {
                    assert_eq!(
                        v,
                        value(next, 1, i),
                        "rank {r}: host element {i} from {next}"
                    );
                }
                assert_eq!(
                    own_in.to_vec().unwrap(),
                    fill(2, own),
                    "rank {r}: to itself"
                );
                // Staged whole, the device sends alone would take 2 MiB of pinned memory
                // (1 MiB + 152 bytes, rounded up to a power of two) and the receives as much.
                let held = c.staging_bytes();
                assert!(held > 0 && held <= 1 << 20, "rank {r}: {held} pinned bytes");
            });
        }
    });
}

/// Device messages to the rank itself are copied on the device, not staged through pinned
/// memory: two pairs to itself (one of 5 pieces), a device message to the other rank and a
/// host message back, every element checked, and no pinned staging used for the pairs.
#[test]
fn device_messages_to_self_are_copied_on_the_device() {
    let config = Config {
        device_slice_bytes: Some(64 << 10),
        ..Config::default()
    };
    let comms = Communicator::local_group(2, config).unwrap();
    let dev = host_device(1);
    let value = |r: usize, b: usize, i: usize| (r * 100_000_007 + b * 1_000_003 + i) as u32;
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                c.set_device(dev).unwrap();
                let (r, peer) = (c.rank(), 1 - c.rank());
                let fill = |b: usize, len: usize| -> Vec<u32> {
                    (0..len).map(|i| value(r, b, i)).collect()
                };
                let (long, short) = ((1 << 16) + 5, 33);
                let a = DeviceBuffer::from_host(dev, &fill(0, long)).unwrap();
                let b = DeviceBuffer::from_host(dev, &fill(1, short)).unwrap();
                let mut a_in = DeviceBuffer::<u32>::new(dev, long).unwrap();
                let mut b_in = DeviceBuffer::<u32>::new(dev, short).unwrap();
                let out = fill(2, short);
                let mut back = vec![0u32; short];
                let mut g = c.group();
                g.send_device(&a, r)
                    .send_device(&b, r)
                    .recv_device(&mut a_in, r)
                    .recv_device(&mut b_in, r);
                g.send(&out, peer).recv(&mut back, peer);
                g.run().unwrap();
                assert!(a_in.to_vec().unwrap() == fill(0, long), "rank {r}: long");
                assert_eq!(b_in.to_vec().unwrap(), fill(1, short), "rank {r}: short");
                let want: Vec<u32> = (0..short).map(|i| value(peer, 2, i)).collect();
                assert_eq!(back, want, "rank {r}: host message");
                assert_eq!(c.staging_bytes(), 0, "rank {r}: pinned staging used");
            });
        }
    });
}

/// Two long messages to one peer in one group, of one length: a rank that stages device
/// buffers (in rounds) and a rank with host buffers (in one step) put their pieces on the
/// channel in the same order, so each lands in its own buffer.
#[test]
fn pieces_of_two_messages_to_one_peer_keep_their_order_between_staged_and_host_ranks() {
    let config = Config {
        device_slice_bytes: Some(64 << 10),
        ..Config::default()
    };
    let comms = Communicator::local_group(2, config).unwrap();
    let dev = host_device(2);
    let n = 3 * (64 << 10) / 4 + 5; // f32: 4 pieces each
    let value = |r: usize, b: usize, i: usize| (r * 10_000_000 + b * 1_000_000 + i) as f32;
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let (r, peer) = (c.rank(), 1 - c.rank());
                let mine = |b: usize| -> Vec<f32> { (0..n).map(|i| value(r, b, i)).collect() };
                let theirs = |b: usize| -> Vec<f32> { (0..n).map(|i| value(peer, b, i)).collect() };
                if r == 0 {
                    c.set_device(dev).unwrap();
                    let a = DeviceBuffer::from_host(dev, &mine(0)).unwrap();
                    let b = DeviceBuffer::from_host(dev, &mine(1)).unwrap();
                    let mut x = DeviceBuffer::<f32>::new(dev, n).unwrap();
                    let mut y = DeviceBuffer::<f32>::new(dev, n).unwrap();
                    let mut g = c.group();
                    g.send_device(&a, peer)
                        .send_device(&b, peer)
                        .recv_device(&mut x, peer)
                        .recv_device(&mut y, peer);
                    g.run().unwrap();
                    assert!(x.to_vec().unwrap() == theirs(0), "rank 0: first message");
                    assert!(y.to_vec().unwrap() == theirs(1), "rank 0: second message");
                } else {
                    let (a, b) = (mine(0), mine(1));
                    let (mut x, mut y) = (vec![0f32; n], vec![0f32; n]);
                    let mut g = c.group();
                    g.send(&a, peer)
                        .send(&b, peer)
                        .recv(&mut x, peer)
                        .recv(&mut y, peer);
                    g.run().unwrap();
                    assert!(x == theirs(0), "rank 1: first message");
                    assert!(y == theirs(1), "rank 1: second message");
                }
            });
        }
    });
}

// ----- argument checks: before anything runs -----

fn one_rank() -> Communicator {
    let mut comms = Communicator::local_group(1, Config::default()).unwrap();
    comms.pop().unwrap()
}

#[test]
fn host_buffer_where_a_device_buffer_is_expected_and_the_reverse() {
    let c = one_rank();
    let dev = host_device(0);
    c.set_device(dev).unwrap();
    let host = vec![1f32; 8];
    let mut host_out = vec![0f32; 8];
    let d_in = DeviceBuffer::from_host(dev, &host).unwrap();
    let mut d_out = DeviceBuffer::<f32>::new(dev, 8).unwrap();
    let e = c
        .collective(
            CollKind::AllReduce,
            Some(BufRef::Host(&host)),
            BufMut::Device(&mut d_out),
            ReduceOp::Sum,
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let m = e.to_string();
    assert!(m.contains("all_reduce on rank 0"), "{m}");
    assert!(
        m.contains("send buffer is host memory but the receive buffer is host stand-in device 0"),
        "{m}"
    );
    let e = c
        .collective(
            CollKind::AllReduce,
            Some(BufRef::Device(&d_in)),
            BufMut::Host(&mut host_out),
            ReduceOp::Sum,
        )
        .unwrap_err();
    assert!(
        e.to_string().contains(
            "send buffer is host stand-in device 0 but the receive buffer is host memory"
        ),
        "{e}"
    );
    assert_eq!(d_out.to_vec().unwrap(), [0.0; 8], "nothing ran");
    // A raw address: host memory is not device memory; a device buffer's is, until freed.
    assert_eq!(Provider::Host.locate(host.as_ptr() as u64, 32), None);
    assert_eq!(Provider::Host.locate(d_in.addr(), 32), Some(0));
    assert_eq!(Provider::Host.locate(d_in.addr(), 33), None, "past its end");
    let addr = d_in.addr();
    drop(d_in);
    assert_eq!(Provider::Host.locate(addr, 32), None, "freed");
    // The generic entry still runs host buffers.
    c.collective(
        CollKind::AllReduce,
        Some(BufRef::Host(&host)),
        BufMut::Host(&mut host_out),
        ReduceOp::Sum,
    )
    .unwrap();
    assert_eq!(host_out, host);
}

#[test]
fn a_buffer_of_another_device_or_no_device_bound_is_an_error() {
    let comms = Communicator::local_group(2, Config::default()).unwrap();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let mut other = DeviceBuffer::<u32>::new(host_device(1), 4).unwrap();
                let e = c
                    .all_reduce_device_in_place(&mut other, ReduceOp::Max)
                    .unwrap_err();
                assert_eq!(e.kind(), ErrorKind::InvalidUsage);
                assert!(e.to_string().contains("no device is bound"), "{e}");
                c.set_device(host_device(0)).unwrap();
                let e = c
                    .all_reduce_device_in_place(&mut other, ReduceOp::Max)
                    .unwrap_err();
                let want = format!(
                    "all_reduce on rank {}: the receive buffer is on host stand-in device 1; \
                     this communicator uses host stand-in device 0",
                    c.rank()
                );
                assert!(e.to_string().contains(&want), "{e}");
                let mine = DeviceBuffer::<u32>::new(host_device(0), 4).unwrap();
                let mut other_out = DeviceBuffer::<u32>::new(host_device(1), 8).unwrap();
                let e = c.all_gather_device(&mine, &mut other_out).unwrap_err();
                assert!(e
                    .to_string()
                    .contains("receive buffer is on host stand-in device 1"));
                // The communicator is still usable: nothing ran.
                let mut ok = DeviceBuffer::from_host(host_device(0), &[2u32; 4]).unwrap();
                c.all_reduce_device_in_place(&mut ok, ReduceOp::Sum)
                    .unwrap();
                assert_eq!(ok.to_vec().unwrap(), [4; 4]);
            });
        }
    });
}

#[test]
fn mismatched_lengths_are_errors_naming_the_operation_and_rank() {
    let c = one_rank();
    let dev = host_device(0);
    c.set_device(dev).unwrap();
    let send = DeviceBuffer::<f64>::new(dev, 4).unwrap();
    let mut recv = DeviceBuffer::<f64>::new(dev, 5).unwrap();
    let e = c
        .all_reduce_device(&send, &mut recv, ReduceOp::Sum)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(
        e.to_string()
            .contains("all_reduce on rank 0: receive buffer has 5 elements, 4 x f64 needed"),
        "{e}"
    );
    let mut small = DeviceBuffer::<f64>::new(dev, 3).unwrap();
    let e = c.all_gather_device(&send, &mut small).unwrap_err();
    assert!(e.to_string().contains("all_gather on rank 0"), "{e}");
    let e = c.broadcast_device(&mut recv, 3).unwrap_err();
    assert!(e.to_string().contains("invalid root 3"), "{e}");
    let mut h = [0f64; 4];
    let e = send.copy_to_host(&mut h[..3]).unwrap_err();
    assert!(e.to_string().contains("copy_to_host"), "{e}");
}

// ----- processes -----

/// Per-job limit; a job normally takes a few seconds.
const JOB_LIMIT: Duration = Duration::from_secs(120);

fn process_sweep() -> Sweep {
    Sweep {
        dtypes: vec![DataType::Float32, DataType::Uint8, DataType::Float16],
        ops: vec![ReduceOp::Sum, ReduceOp::Min, ReduceOp::Avg],
        counts: vec![0, 7, 65537],
        colls: vec!["all_reduce", "broadcast", "all_gather", "reduce_scatter"],
    }
}

/// Every collective on device buffers run straight on them (the p2p transport): the
/// schedules' own copies, scratch and receive stages, every reduction, in place and out of
/// place, with counts that cut into pipelined slices.
fn direct_sweep() -> Sweep {
    Sweep {
        dtypes: vec![
            DataType::Float32,
            DataType::Uint8,
            DataType::Float16,
            DataType::Bfloat16,
            DataType::Int64,
            DataType::Float8E4M3,
        ],
        ops: all_ops(),
        counts: vec![0, 1, 7, 65537],
        colls: vec![
            "all_reduce",
            "broadcast",
            "reduce",
            "all_gather",
            "reduce_scatter",
            "all_to_all",
        ],
    }
}

/// Messages of several MiB, uncut (a 16 MiB device slice), over slots the transport does not
/// lend: a receive-reduce on device memory reduces from its stage in batches of landed bytes
/// as they arrive, not only at the end.
fn direct_large_sweep() -> Sweep {
    Sweep {
        dtypes: vec![DataType::Float32, DataType::Bfloat16],
        ops: vec![ReduceOp::Sum, ReduceOp::Avg],
        counts: vec![(3 << 20) + 5],
        colls: vec!["all_reduce", "reduce_scatter", "reduce"],
    }
}

/// A device job's sweep by name (`FERRO_TEST_SWEEP`).
fn sweep_named(name: &str) -> Sweep {
    match name {
        "direct" => direct_sweep(),
        "direct-large" => direct_large_sweep(),
        _ => process_sweep(),
    }
}

/// The sweep a device job runs.
fn job_sweep() -> Sweep {
    sweep_named(&std::env::var("FERRO_TEST_SWEEP").unwrap_or_default())
}

/// A rank of a device job: device 0 of the provider `FERRO_DEVICE_PROVIDER` names.
#[test]
fn child_device() {
    if !child::is_role("device") {
        return;
    }
    if std::env::var("FERRO_TEST_STAGE_RANK").ok() == std::env::var("FERRO_RANK").ok() {
        // This rank stages while its peers run on the device buffers themselves.
        std::env::set_var("FERRO_DEVICE_DIRECT", "0");
    }
    let comm = Communicator::from_env().expect("from_env");
    let dev = Device::from_env(0).expect("device 0");
    comm.set_device(dev).unwrap();
    let cases = run_sweep_on(&comm, Mem::Device(dev), &job_sweep(), 99)
        .unwrap_or_else(|e| panic!("rank {}: {e}", comm.rank()));
    let (r, n) = (comm.rank(), comm.nranks());
    if n > 1 {
        // A ring of blocking device sends and receives (even ranks send first).
        let value = |from: usize, i: usize| (from * 1_000_003 + i) as f32;
        let len = 100_003;
        let out: Vec<f32> = (0..len).map(|i| value(r, i)).collect();
        let out = DeviceBuffer::from_host(dev, &out).unwrap();
        let mut inb = DeviceBuffer::<f32>::new(dev, len).unwrap();
        let (to, from) = ((r + 1) % n, (r + n - 1) % n);
        if r % 2 == 0 {
            comm.send_device(&out, to).unwrap();
            comm.recv_device(&mut inb, from).unwrap();
        } else {
            comm.recv_device(&mut inb, from).unwrap();
            comm.send_device(&out, to).unwrap();
        }
        let got = inb.to_vec().unwrap();
        let wrong = (0..len).filter(|&i| got[i] != value(from, i)).count();
        assert_eq!(
            wrong, 0,
            "rank {r}: {wrong} wrong elements from rank {from}"
        );
    }
    let peer = (comm.rank() + 1) % comm.nranks();
    println!(
        "DEVICE rank={} cases={cases} transport={} direct={} staging={} arena={} lane={} peer={}",
        comm.rank(),
        comm.transport(peer).unwrap_or("self"),
        comm.device_direct(),
        comm.staging_allocations(),
        comm.device_arena_allocations(),
        comm.small_lane_bytes(),
        comm.device_peer_calls()
    );
    comm.destroy().expect("destroy");
}

/// Runs `sweep` (by [`job_sweep`]'s name) on device buffers of `n` processes over
/// `transport`; `direct`: whether the collectives must run on the device buffers themselves.
fn device_job(n: usize, transport: &str, sweep: &str, direct: bool) {
    device_job_staging_rank(n, transport, sweep, direct, None);
}

/// [`device_job`], with rank `stage` (if any) staging through host memory whatever `direct`.
fn device_job_staging_rank(
    n: usize,
    transport: &str,
    sweep: &str,
    direct: bool,
    stage: Option<usize>,
) {
    device_job_env(n, transport, sweep, direct, stage, &[]);
}

/// [`device_job_staging_rank`] with `extra` variables in the ranks' environment.
fn device_job_env(
    n: usize,
    transport: &str,
    sweep: &str,
    direct: bool,
    stage: Option<usize>,
    extra: &[(&'static str, &str)],
) {
    let _serial = child::serial();
    let mut env = vec![
        (PROVIDER_ENV, "host".to_string()),
        ("FERRO_TRANSPORTS", transport.to_string()),
        // 65537 elements run as 5 (f32) or 3 (f16, u8) pipelined slices.
        (
            "FERRO_DEVICE_SLICE_BYTES",
            if sweep == "direct-large" {
                "16M"
            } else {
                "64K"
            }
            .to_string(),
        ),
        ("FERRO_TIMEOUT", "60".to_string()),
        ("FERRO_TEST_SWEEP", sweep.to_string()),
        (
            "FERRO_DEVICE_DIRECT",
            if direct { "1" } else { "0" }.to_string(),
        ),
        ("FERRO_P2P_PROVIDER", "host".to_string()),
        // The large sweep's slots are not whole 16-byte units, so the transport does not lend
        // them: received slices land in a device stage and are reduced in batches from there.
        // The other sweeps reduce straight from the slots.
        (
            "FERRO_P2P_SLOT_BYTES",
            if sweep == "direct-large" {
                "1000008"
            } else {
                "524288"
            }
            .to_string(),
        ),
        (
            "FERRO_TEST_STAGE_RANK",
            stage.map_or_else(|| "none".to_string(), |r| r.to_string()),
        ),
    ];
    env.extend(extra.iter().map(|&(k, v)| (k, v.to_string())));
    let out = ferrorun_self(n, None, "child_device", "device", &env, JOB_LIMIT);
    assert!(out.success(), "{}", out.dump());
    let lines = out.tagged("DEVICE ");
    assert_eq!(lines.len(), n, "{}", out.dump());
    let want = sweep_named(sweep);
    for l in &lines {
        assert_eq!(field::<usize>(l, "cases"), expected_cases(&want), "{l}");
        assert_eq!(field::<String>(l, "transport"), transport, "{l}");
        // Shared memory and the p2p transport (its control segments) have small-message
        // lanes: the tiny allreduces of the sweep went through them, on device buffers too
        // (copied over and back), beside ranks that stage.
        let lane = if transport == "tcp" { 0 } else { 96 };
        assert_eq!(field::<usize>(l, "lane"), lane, "{l}");
        // Ranks of several processes never reduce straight between their buffers (only
        // threads of one process share an address space: tests/device_peer.rs).
        assert_eq!(field::<u64>(l, "peer"), 0, "{l}");
        let direct = direct && stage != Some(field::<usize>(l, "rank"));
        assert_eq!(field::<bool>(l, "direct"), direct, "{l}");
        if direct {
            // Nothing went through host staging; the engine's device buffers were made.
            assert_eq!(field::<u64>(l, "staging"), 0, "{l}");
            assert!(field::<u64>(l, "arena") > 0, "{l}");
        } else {
            assert!(field::<u64>(l, "staging") > 0, "{l}");
            assert_eq!(field::<u64>(l, "arena"), 0, "{l}");
        }
    }
}

#[test]
fn device_buffers_over_shm_3_processes() {
    device_job(3, "shm", "process", false);
}

#[test]
fn device_buffers_over_tcp_2_processes() {
    device_job(2, "tcp", "process", false);
}

#[test]
fn device_collectives_straight_on_device_buffers_over_p2p_3_processes() {
    device_job(3, "p2p", "direct", true);
}

#[test]
fn device_collectives_straight_on_device_buffers_over_p2p_2_processes() {
    device_job(2, "p2p", "direct", true);
}

#[test]
fn large_device_collectives_straight_on_device_buffers_over_p2p_3_processes() {
    device_job(3, "p2p", "direct-large", true);
}

/// The messages are the same either way: one rank staging beside two running on the device
/// buffers gives the same results.
#[test]
fn device_collectives_with_one_rank_staged_and_two_direct_over_p2p() {
    device_job_staging_rank(3, "p2p", "direct", true, Some(1));
}

/// The direct sweep with the reductions straight from the slots queued and not waited for
/// (`FERRO_P2P_QUEUED_REDUCE=1`): on the stand-in each one runs only at its fence's second
/// poll, so a slot handed back, or a result read, before its reduction was done would show
/// as a wrong element.
#[test]
fn device_buffers_straight_over_p2p_with_queued_reductions_3_processes() {
    device_job_env(
        3,
        "p2p",
        "direct",
        true,
        None,
        &[("FERRO_P2P_QUEUED_REDUCE", "1")],
    );
}

#[test]
fn device_collectives_over_p2p_staged_when_direct_is_off() {
    device_job(2, "p2p", "process", false);
}

// ----- send/recv groups on device buffers -----

/// Element `i` of what rank `r` sends in message `k`: distinct in every element.
fn p2p_value(r: usize, k: usize, i: usize) -> f32 {
    (r * 1_000_003 + k * 10_007 + i) as f32
}

/// Counts of the messages of the device send/recv job (the 2^20 + 3 one is larger than a
/// p2p slot, so it takes several).
const P2P_COUNTS: [usize; 5] = [0, 1, 7, (1 << 20) + 3, 65537];

/// A rank of a device send/recv job: every message of [`P2P_COUNTS`] to the next rank in a
/// ring, from the previous one, and to itself, in one group each, every element checked.
#[test]
fn child_device_groups() {
    if !child::is_role("device-groups") {
        return;
    }
    let comm = Communicator::from_env().expect("from_env");
    let dev = Device::from_env(0).expect("device 0");
    comm.set_device(dev).unwrap();
    let (r, n) = (comm.rank(), comm.nranks());
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    for (k, &count) in P2P_COUNTS.iter().enumerate() {
        let mine: Vec<f32> = (0..count).map(|i| p2p_value(r, k, i)).collect();
        let send = DeviceBuffer::from_host(dev, &mine).unwrap();
        let mut from_prev = DeviceBuffer::<f32>::new(dev, count).unwrap();
        let mut from_self = DeviceBuffer::<f32>::new(dev, count).unwrap();
        let mut g = comm.group();
        g.send_device(&send, next)
            .recv_device(&mut from_prev, prev)
            .send_device(&send, r)
            .recv_device(&mut from_self, r);
        g.run()
            .unwrap_or_else(|e| panic!("rank {r}, {count} elements: {e}"));
        let got = from_prev.to_vec().unwrap();
        for (i, &v) in got.iter().enumerate() {
            assert_eq!(
                v,
                p2p_value(prev, k, i),
                "rank {r}, {count} elements, element {i}"
            );
        }
        assert_eq!(from_self.to_vec().unwrap(), mine, "rank {r}: to self");
    }
    // A receive of the wrong length is an error naming both lengths, not a wild write.
    if n == 2 {
        let send = DeviceBuffer::from_host(dev, &[1.0f32; 8]).unwrap();
        let mut short = DeviceBuffer::<f32>::new(dev, 4).unwrap();
        let mut g = comm.group();
        if r == 0 {
            g.send_device(&send, 1);
        } else {
            g.recv_device(&mut short, 0);
        }
        let e = g.run();
        if r == 1 {
            let e = e.expect_err("a short receive must fail");
            assert!(e.to_string().contains("32"), "{e}");
        }
        println!(
            "DEVICE-GROUPS rank={r} transport={} short=ok",
            comm.transport(1 - r).unwrap_or("self")
        );
        return;
    }
    println!(
        "DEVICE-GROUPS rank={r} transport={}",
        comm.transport(next).unwrap_or("self")
    );
    comm.destroy().expect("destroy");
}

fn device_groups_job(n: usize, transport: &str) {
    let _serial = child::serial();
    let env = [
        (PROVIDER_ENV, "host".to_string()),
        ("FERRO_TRANSPORTS", transport.to_string()),
        ("FERRO_P2P_PROVIDER", "host".to_string()),
        ("FERRO_TIMEOUT", "60".to_string()),
    ];
    let out = ferrorun_self(
        n,
        None,
        "child_device_groups",
        "device-groups",
        &env,
        JOB_LIMIT,
    );
    let lines = out.tagged("DEVICE-GROUPS ");
    if n == 2 {
        // The short receive fails rank 1 (and so the job), after the good messages.
        assert_eq!(lines.len(), 2, "{}", out.dump());
    } else {
        assert!(out.success(), "{}", out.dump());
        assert_eq!(lines.len(), n, "{}", out.dump());
    }
    for l in &lines {
        println!("{l}");
        assert_eq!(field::<String>(l, "transport"), transport, "{l}");
    }
}

/// Over the GPU peer-to-peer transport (its host provider, which reaches the stand-in's device
/// memory): the group hands the device buffers to the transport itself.
#[test]
fn device_send_recv_groups_over_p2p_3_processes() {
    device_groups_job(3, "p2p");
}

#[test]
fn device_send_recv_groups_over_p2p_2_processes_and_a_short_receive() {
    device_groups_job(2, "p2p");
}

/// Over shared memory, which reaches host memory only: through host copies.
#[test]
fn device_send_recv_groups_over_shm_3_processes() {
    device_groups_job(3, "shm");
}

// ----- no driver -----

/// A process without an NVIDIA driver and without the stand-in: allocating fails with the
/// driver's clear error.
#[test]
fn child_no_driver() {
    if !child::is_role("no-driver") {
        return;
    }
    assert_eq!(Provider::from_env().unwrap(), Provider::Cuda);
    let e = Device::from_env(0)
        .and_then(|d| DeviceBuffer::<f32>::new(d, 16))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    assert!(e.to_string().contains(DRIVER_MISSING), "{e}");
    let e = Provider::Cuda.device_count().unwrap_err();
    assert!(e.to_string().contains(DRIVER_MISSING), "{e}");
    assert_eq!(Provider::Cuda.locate(0x1000, 8), None);
    println!("NO-DRIVER ok: {e}");
}

#[test]
fn without_a_driver_allocating_returns_the_clear_error() {
    let mut cmd = self_command(
        "child_no_driver",
        "no-driver",
        &[(
            "FERROCCL_CUDA_DRIVER",
            "/nonexistent/ferroccl-test/libcuda.so.1".to_string(),
        )],
    );
    cmd.env_remove(PROVIDER_ENV);
    let out = Running::spawn(cmd).finish(Duration::from_secs(60));
    assert!(out.success(), "{}", out.dump());
    assert_eq!(out.tagged("NO-DRIVER ok").len(), 1, "{}", out.dump());
}

// ----- the GPU check bundle's device tool, on the stand-in -----

const DEVICE_CHECK: &str = env!("CARGO_BIN_EXE_ferroccl-device-check");

#[test]
fn device_check_tool_passes_on_the_host_stand_in_and_says_when_there_is_no_device() {
    let mut cmd = std::process::Command::new(DEVICE_CHECK);
    cmd.args(["--ranks", "1,3", "--max-count", "65537"])
        .env(PROVIDER_ENV, "host");
    let out = Running::spawn(cmd).finish(Duration::from_secs(120));
    assert!(out.success(), "{}", out.dump());
    let lines = out.tagged("cases per rank matched the host results");
    assert_eq!(lines.len(), 2, "{}", out.dump());
    assert!(
        lines[1].ends_with(
            "blocking calls staged through pinned host memory; 0 calls between the ranks' buffers)"
        ),
        "{}",
        out.dump()
    );

    // Thread ranks joined by the p2p transport: every case straight on the device buffers.
    let mut cmd = std::process::Command::new(DEVICE_CHECK);
    cmd.args(["--ranks", "2,3", "--max-count", "65537"])
        .env(PROVIDER_ENV, "host")
        .env("FERRO_TRANSPORTS", "p2p")
        .env("FERRO_P2P_PROVIDER", "host");
    let out = Running::spawn(cmd).finish(Duration::from_secs(120));
    assert!(out.success(), "{}", out.dump());
    let lines = out.tagged("cases per rank matched the host results");
    assert_eq!(lines.len(), 2, "{}", out.dump());
    for l in &lines {
        assert!(
            l.contains("blocking calls straight on the device buffers; "),
            "{}",
            out.dump()
        );
        // Thread ranks of one process: the allreduces of 256 bytes and more went straight
        // between the ranks' buffers.
        let peer: u64 = l
            .rsplit("; ")
            .next()
            .and_then(|t| t.split(' ').next())
            .and_then(|k| k.parse().ok())
            .unwrap_or(0);
        assert!(peer > 0, "{}", out.dump());
    }

    let mut cmd = std::process::Command::new(DEVICE_CHECK);
    cmd.env_remove(PROVIDER_ENV).env(
        "FERROCCL_CUDA_DRIVER",
        "/nonexistent/ferroccl-test/libcuda.so.1",
    );
    let out = Running::spawn(cmd).finish(Duration::from_secs(60));
    assert_eq!(out.status.and_then(|s| s.code()), Some(2), "{}", out.dump());
    assert!(out.stderr.contains(DRIVER_MISSING), "{}", out.dump());
}
