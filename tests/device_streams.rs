//! Stream-ordered collectives on device buffers (`*_device_on`) with the host stand-in
//! provider, whose streams run only when they are waited for: ranks as threads (1, 2, 3),
//! sends and receives in groups on a stream, ordering on one stream, one thread driving two ranks, failures, and the missing driver.

use std::time::{Duration, Instant};

use ferroccl::device::{Device, DeviceBuffer, DeviceStream, Provider, DRIVER_MISSING};
use ferroccl::{Communicator, Config, Element, ErrorKind, ReduceOp};

const COUNTS: [usize; 4] = [0, 1, 7, 1021];

fn host_device() -> Device {
    Device::new(Provider::Host, 0).expect("the host stand-in offers devices 0..4")
}

/// Rank `r`'s element `i`: distinct per element and per rank, exact in every tested type.
fn value(r: usize, i: usize) -> f64 {
    (i as f64) * 3.0 + (r as f64) * 5000.0 - 2000.0
}

fn values<T: Element>(r: usize, len: usize) -> Vec<T> {
    (0..len).map(|i| T::from_f64(value(r, i))).collect()
}

fn fold(op: ReduceOp, n: usize, i: usize) -> f64 {
    let all = (0..n).map(|r| value(r, i));
    match op {
        ReduceOp::Sum => all.sum(),
        ReduceOp::Max => all.fold(f64::MIN, f64::max),
        ReduceOp::Min => all.fold(f64::MAX, f64::min),
        _ => unreachable!("not used here"),
    }
}

fn floats<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// Every stream-ordered collective once on rank `c.rank()` of `n`, each checked after a
/// synchronize of the stream.
fn every_collective<T: Element>(c: &Communicator, s: &DeviceStream, count: usize, op: ReduceOp) {
    let (dev, r, n) = (s.device(), c.rank(), c.nranks());
    let what = |name: &str| format!("{name} {:?} {op:?} count {count} rank {r}/{n}", T::DTYPE);

    let send = DeviceBuffer::from_host(dev, &values::<T>(r, count)).unwrap();
    let mut recv = DeviceBuffer::<T>::new(dev, count).unwrap();
    c.all_reduce_device_on(&send, &mut recv, op, s).unwrap();
    s.synchronize().unwrap();
    let want: Vec<f64> = (0..count).map(|i| fold(op, n, i)).collect();
    assert_eq!(
        floats(&recv.to_vec().unwrap()),
        want,
        "{}",
        what("all_reduce")
    );

    let mut buf = DeviceBuffer::from_host(dev, &values::<T>(r, count)).unwrap();
    c.all_reduce_device_in_place_on(&mut buf, op, s).unwrap();
    s.synchronize().unwrap();
    assert_eq!(floats(&buf.to_vec().unwrap()), want, "{}", what("in place"));

    let root = n - 1;
    let mut buf = DeviceBuffer::from_host(dev, &values::<T>(r, count)).unwrap();
    c.broadcast_device_on(&mut buf, root, s).unwrap();
    s.synchronize().unwrap();
    let want: Vec<f64> = (0..count).map(|i| value(root, i)).collect();
    assert_eq!(
        floats(&buf.to_vec().unwrap()),
        want,
        "{}",
        what("broadcast")
    );

    let mut recv = DeviceBuffer::<T>::new(dev, count).unwrap();
    c.reduce_device_on(&send, &mut recv, op, 0, s).unwrap();
    s.synchronize().unwrap();
    if r == 0 {
        let want: Vec<f64> = (0..count).map(|i| fold(op, n, i)).collect();
        assert_eq!(floats(&recv.to_vec().unwrap()), want, "{}", what("reduce"));
    }

    let mut recv = DeviceBuffer::<T>::new(dev, n * count).unwrap();
    c.all_gather_device_on(&send, &mut recv, s).unwrap();
    s.synchronize().unwrap();
    let want: Vec<f64> = (0..n * count)
        .map(|k| value(k / count, k % count))
        .collect();
    assert_eq!(
        floats(&recv.to_vec().unwrap()),
        want,
        "{}",
        what("all_gather")
    );

    // Block j of rank r's input holds values(r, j * count ..); rank r receives block r of
    // every rank.
    let big = DeviceBuffer::from_host(dev, &values::<T>(r, n * count)).unwrap();
    let mut recv = DeviceBuffer::<T>::new(dev, n * count).unwrap();
    c.all_to_all_device_on(&big, &mut recv, s).unwrap();
    s.synchronize().unwrap();
    let want: Vec<f64> = (0..n * count)
        .map(|k| value(k / count.max(1), r * count + k % count.max(1)))
        .collect();
    assert_eq!(
        floats(&recv.to_vec().unwrap()),
        want,
        "{}",
        what("all_to_all")
    );

    let mut recv = DeviceBuffer::<T>::new(dev, count).unwrap();
    c.reduce_scatter_device_on(&big, &mut recv, op, s).unwrap();
    s.synchronize().unwrap();
    let want: Vec<f64> = (0..count).map(|i| fold(op, n, r * count + i)).collect();
    assert_eq!(
        floats(&recv.to_vec().unwrap()),
        want,
        "{}",
        what("reduce_scatter")
    );
}

/// Runs `f` on every rank of 1, 2 and 3 thread ranks, each bound to the stand-in device with
/// a stream of its own; then checks no rank has an asynchronous error.
fn on_1_2_3_thread_ranks(f: impl Fn(&Communicator, &DeviceStream) + Sync) {
    on_1_2_3_thread_ranks_with(Config::default(), f)
}

fn on_1_2_3_thread_ranks_with(config: Config, f: impl Fn(&Communicator, &DeviceStream) + Sync) {
    let dev = host_device();
    for n in [1, 2, 3] {
        let comms = Communicator::local_group(n, config.clone()).unwrap();
        std::thread::scope(|sc| {
            for c in &comms {
                let f = &f;
                sc.spawn(move || {
                    c.set_device(dev).unwrap();
                    let s = DeviceStream::new(dev).unwrap();
                    f(c, &s);
                    assert!(c.async_error().is_none());
                });
            }
        });
    }
}

#[test]
fn every_stream_collective_on_1_2_3_thread_ranks() {
    on_1_2_3_thread_ranks(|c, s| {
        for count in COUNTS {
            for op in [ReduceOp::Sum, ReduceOp::Max] {
                every_collective::<f32>(c, s, count, op);
                every_collective::<i32>(c, s, count, op);
            }
            every_collective::<f64>(c, s, count, ReduceOp::Min);
        }
    });
}

/// Element-wise calls cut into many slices (`FERRO_DEVICE_SLICE_BYTES` of 64 bytes: 1021
/// floats make 64 stream jobs), copied in and back slice by slice on the stream.
#[test]
fn every_stream_collective_in_slices_on_1_2_3_thread_ranks() {
    let config = Config {
        device_slice_bytes: Some(64),
        ..Config::default()
    };
    on_1_2_3_thread_ranks_with(config, |c, s| {
        for count in COUNTS {
            every_collective::<f32>(c, s, count, ReduceOp::Sum);
            every_collective::<f64>(c, s, count, ReduceOp::Max);
        }
    });
}

/// A rank whose calls are stream-ordered and one whose calls block cut them alike, so they
/// exchange the same messages (the choice can differ between ranks: another communicator on
/// the GPU in one process, p2p connections on one host only, `FERRO_STREAM_WAITS`).
#[test]
fn a_stream_ordered_rank_and_a_blocking_rank_exchange_the_same_slices() {
    let dev = host_device();
    let config = Config {
        device_slice_bytes: Some(256),
        ..Config::default()
    };
    let comms = Communicator::local_group(2, config).unwrap();
    let count = 1021;
    let sum: Vec<f64> = (0..count).map(|i| fold(ReduceOp::Sum, 2, i)).collect();
    std::thread::scope(|sc| {
        for c in &comms {
            let sum = &sum;
            sc.spawn(move || {
                c.set_device(dev).unwrap();
                let r = c.rank();
                let s = DeviceStream::new(dev).unwrap();
                let send = DeviceBuffer::from_host(dev, &values::<f64>(r, count)).unwrap();
                let mut out = DeviceBuffer::<f64>::new(dev, count).unwrap();
                let mut buf = DeviceBuffer::from_host(dev, &values::<f64>(r, count)).unwrap();
                // The blocked layouts are cut too (by their larger buffer's bytes).
                let mut all = DeviceBuffer::<f64>::new(dev, 2 * count).unwrap();
                let both = DeviceBuffer::from_host(dev, &values::<f64>(r, 2 * count)).unwrap();
                let mut mine = DeviceBuffer::<f64>::new(dev, count).unwrap();
                if r == 0 {
                    c.all_reduce_device_on(&send, &mut out, ReduceOp::Sum, &s)
                        .unwrap();
                    c.broadcast_device_on(&mut buf, 1, &s).unwrap();
                    c.all_gather_device_on(&send, &mut all, &s).unwrap();
                    c.reduce_scatter_device_on(&both, &mut mine, ReduceOp::Sum, &s)
                        .unwrap();
                    s.synchronize().unwrap();
                } else {
                    c.all_reduce_device(&send, &mut out, ReduceOp::Sum).unwrap();
                    c.broadcast_device(&mut buf, 1).unwrap();
                    c.all_gather_device(&send, &mut all).unwrap();
                    c.reduce_scatter_device(&both, &mut mine, ReduceOp::Sum)
                        .unwrap();
                }
                let gathered: Vec<f64> = (0..2)
                    .flat_map(|p| (0..count).map(move |i| value(p, i)))
                    .collect();
                assert_eq!(
                    floats(&all.to_vec().unwrap()),
                    gathered,
                    "rank {r}: all_gather"
                );
                let scattered: Vec<f64> = (0..count)
                    .map(|i| value(0, r * count + i) + value(1, r * count + i))
                    .collect();
                assert_eq!(
                    floats(&mine.to_vec().unwrap()),
                    scattered,
                    "rank {r}: reduce_scatter"
                );
                assert_eq!(floats(&out.to_vec().unwrap()), *sum, "rank {r}: all_reduce");
                let root: Vec<f64> = (0..count).map(|i| value(1, i)).collect();
                assert_eq!(floats(&buf.to_vec().unwrap()), root, "rank {r}: broadcast");
                assert!(c.async_error().is_none());
            });
        }
    });
}

/// Groups of long messages (64 KiB pieces): ranks that queue them on a stream (in rounds)
/// and a rank that runs them blocking (staged in rounds) or on host buffers (one step)
/// exchange the same pieces in the same order, two messages to one peer included.
#[test]
fn stream_ordered_blocking_and_host_groups_of_long_messages_exchange_the_same_pieces() {
    let dev = host_device();
    let config = Config {
        device_slice_bytes: Some(64 << 10),
        ..Config::default()
    };
    let comms = Communicator::local_group(4, config).unwrap();
    let (long, short) = (5 * (64 << 10) / 8 + 3, 2 * (64 << 10) / 8 + 1); // i64: 6 and 3 pieces
    std::thread::scope(|sc| {
        for c in &comms {
            sc.spawn(move || {
                let (r, n) = (c.rank(), c.nranks());
                let (right, left) = ((r + 1) % n, (r + n - 1) % n);
                let second = |r: usize, to: usize| -> Vec<i64> {
                    message(r, to, short).iter().map(|v| -v).collect()
                };
                if r == 3 {
                    // Host buffers: the whole group in one step.
                    let (a, b) = (message(r, right, long), second(r, right));
                    let (mut x, mut y) = (vec![0i64; long], vec![0i64; short]);
                    let mut g = c.group();
                    g.send(&a, right).send(&b, right);
                    g.recv(&mut x, left).recv(&mut y, left);
                    g.run().unwrap();
                    assert!(x == message(left, r, long), "rank {r}: first message");
                    assert!(y == second(left, r), "rank {r}: second message");
                    return;
                }
                c.set_device(dev).unwrap();
                let a = DeviceBuffer::from_host(dev, &message(r, right, long)).unwrap();
                let b = DeviceBuffer::from_host(dev, &second(r, right)).unwrap();
                let mut x = DeviceBuffer::<i64>::new(dev, long).unwrap();
                let mut y = DeviceBuffer::<i64>::new(dev, short).unwrap();
                let mut g = c.group();
                g.send_device(&a, right).send_device(&b, right);
                g.recv_device(&mut x, left).recv_device(&mut y, left);
                if r == 1 {
                    g.run().unwrap();
                } else {
                    let s = DeviceStream::new(dev).unwrap();
                    g.run_on(&s).unwrap();
                    s.synchronize().unwrap();
                    assert!(c.async_error().is_none());
                }
                assert!(
                    x.to_vec().unwrap() == message(left, r, long),
                    "rank {r}: first"
                );
                assert!(y.to_vec().unwrap() == second(left, r), "rank {r}: second");
            });
        }
    });
}

/// Rank `r`'s message to `to`: distinct per element, sender and receiver.
fn message(r: usize, to: usize, len: usize) -> Vec<i64> {
    (0..len)
        .map(|i| (r * 1_000_000 + to * 10_000 + i) as i64)
        .collect()
}

#[test]
fn stream_groups_and_sends_run_in_stream_order_on_1_2_3_thread_ranks() {
    on_1_2_3_thread_ranks(|c, s| {
        let (dev, r, n) = (s.device(), c.rank(), c.nranks());
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        for count in COUNTS {
            // A ring in one group: send right, receive from the left (to and from self on one
            // rank).
            let mine = DeviceBuffer::from_host(dev, &message(r, right, count)).unwrap();
            let mut got = DeviceBuffer::<i64>::new(dev, count).unwrap();
            let mut g = c.group();
            g.send_device(&mine, right);
            g.recv_device(&mut got, left);
            let t0 = Instant::now();
            g.run_on(s).unwrap();
            assert!(t0.elapsed() < Duration::from_secs(2), "returns once queued");
            // Queued behind the group on the same stream: sees its result.
            c.all_reduce_device_in_place_on(&mut got, ReduceOp::Sum, s)
                .unwrap();
            s.synchronize().unwrap();
            let want: Vec<i64> = (0..count)
                .map(|i| (0..n).map(|q| message(q, (q + 1) % n, count)[i]).sum())
                .collect();
            assert_eq!(
                got.to_vec().unwrap(),
                want,
                "ring, count {count} rank {r}/{n}"
            );

            // Single sends and receives, rank 0 to every other rank in turn.
            if r == 0 {
                for to in 1..n {
                    let b = DeviceBuffer::from_host(dev, &message(0, to, count)).unwrap();
                    c.send_device_on(&b, to, s).unwrap();
                }
                s.synchronize().unwrap();
            } else {
                let mut b = DeviceBuffer::<i64>::new(dev, count).unwrap();
                c.recv_device_on(&mut b, 0, s).unwrap();
                // The host read waits for the queued receive.
                assert_eq!(b.to_vec().unwrap(), message(0, r, count), "rank {r}");
                s.synchronize().unwrap();
            }
        }
    });
}

#[test]
fn a_stream_group_refuses_host_memory_overlaps_bad_peers_and_other_streams_at_once() {
    let dev = host_device();
    let c = Communicator::local_group(1, Config::default())
        .unwrap()
        .pop()
        .unwrap();
    c.set_device(dev).unwrap();
    let s = DeviceStream::new(dev).unwrap();
    let host = [1u32; 4];
    let buf = DeviceBuffer::from_host(dev, &[2u32; 8]).unwrap();
    let mut g = c.group();
    g.send_device(&buf, 0).send(&host, 0);
    let e = g.run_on(&s).unwrap_err();
    assert!(
        e.to_string().contains("operation 1 is on host memory"),
        "{e}"
    );
    let e = c.send_device_on(&buf, 1, &s).unwrap_err();
    assert!(e.to_string().contains("invalid peer 1"), "{e}");
    let other = DeviceStream::new(Device::new(Provider::Host, 1).unwrap()).unwrap();
    let e = c.send_device_on(&buf, 0, &other).unwrap_err();
    assert!(
        e.to_string()
            .contains("the stream is on host stand-in device 1"),
        "{e}"
    );
    // A receive into the upper half of the buffer that is sent.
    // SAFETY: the view lies in `buf`, and the group is refused before it touches either.
    let mut upper = unsafe { DeviceBuffer::<u32>::view(dev, buf.addr() + 16, 4) }.unwrap();
    let mut g = c.group();
    g.send_device(&buf, 0).recv_device(&mut upper, 0);
    let e = g.run_on(&s).unwrap_err();
    assert!(e.to_string().contains("overlap"), "{e}");
    let e = c
        .all_to_all_device_on(&buf, &mut DeviceBuffer::new(dev, 8).unwrap(), &s)
        .map(|_| ());
    assert!(e.is_ok(), "one rank: any length splits into one block");
    s.synchronize().unwrap();
    assert!(
        c.async_error().is_none(),
        "local errors are not the communicator's"
    );
}

#[test]
fn calls_back_to_back_then_one_synchronize_run_in_order() {
    let dev = host_device();
    let comms = Communicator::local_group(3, Config::default()).unwrap();
    std::thread::scope(|sc| {
        for c in &comms {
            sc.spawn(move || {
                c.set_device(dev).unwrap();
                let s = DeviceStream::new(dev).unwrap();
                let r = c.rank();
                let mut a = DeviceBuffer::from_host(dev, &values::<f64>(r, 7)).unwrap();
                let mut b = DeviceBuffer::<f64>::new(dev, 7).unwrap();
                // a = sum; b = sum of a (= 3 * sum); a = b broadcast from rank 2; b = sum of a.
                c.all_reduce_device_in_place_on(&mut a, ReduceOp::Sum, &s)
                    .unwrap();
                c.all_reduce_device_on(&a, &mut b, ReduceOp::Sum, &s)
                    .unwrap();
                let t0 = Instant::now();
                c.broadcast_device_on(&mut b, 2, &s).unwrap();
                c.all_reduce_device_on(&b, &mut a, ReduceOp::Sum, &s)
                    .unwrap();
                assert!(
                    t0.elapsed() < Duration::from_secs(2),
                    "calls return at once"
                );
                s.synchronize().unwrap();
                let want: Vec<f64> = (0..7).map(|i| 9.0 * fold(ReduceOp::Sum, 3, i)).collect();
                assert_eq!(a.to_vec().unwrap(), want);
                let want: Vec<f64> = (0..7).map(|i| 3.0 * fold(ReduceOp::Sum, 3, i)).collect();
                assert_eq!(b.to_vec().unwrap(), want);
            });
        }
    });
}

#[test]
fn to_vec_right_after_a_call_waits_for_the_result() {
    let dev = host_device();
    let comms = Communicator::local_group(2, Config::default()).unwrap();
    std::thread::scope(|sc| {
        for c in &comms {
            sc.spawn(move || {
                c.set_device(dev).unwrap();
                let s = DeviceStream::new(dev).unwrap();
                if c.rank() == 1 {
                    // Rank 0 reads its buffer long before this rank has joined the collective.
                    std::thread::sleep(Duration::from_millis(300));
                }
                let mut buf = DeviceBuffer::from_host(dev, &values::<f32>(c.rank(), 1021)).unwrap();
                c.all_reduce_device_in_place_on(&mut buf, ReduceOp::Sum, &s)
                    .unwrap();
                // No synchronize: the host read itself waits for the queued job.
                let want: Vec<f64> = (0..1021).map(|i| fold(ReduceOp::Sum, 2, i)).collect();
                assert_eq!(floats(&buf.to_vec().unwrap()), want, "rank {}", c.rank());
                s.synchronize().unwrap();
            });
        }
    });
}

#[test]
fn drop_waits_for_the_job_and_forget_only_leaks() {
    let dev = host_device();
    let comms = Communicator::local_group(2, Config::default()).unwrap();
    std::thread::scope(|sc| {
        for c in &comms {
            sc.spawn(move || {
                c.set_device(dev).unwrap();
                let s = DeviceStream::new(dev).unwrap();
                let late = Duration::from_millis(300);
                for round in 0..2 {
                    if c.rank() == 1 {
                        std::thread::sleep(late);
                    }
                    let mut buf = DeviceBuffer::from_host(dev, &values::<f64>(0, 7)).unwrap();
                    c.all_reduce_device_in_place_on(&mut buf, ReduceOp::Sum, &s)
                        .unwrap();
                    let t0 = Instant::now();
                    if round == 0 {
                        drop(buf);
                        if c.rank() == 0 {
                            // The memory is freed only once rank 1 has joined and the job ended.
                            assert!(t0.elapsed() >= late / 2, "{:?}", t0.elapsed());
                        }
                    } else {
                        // Leaked, never freed: the job may go on writing it.
                        std::mem::forget(buf);
                    }
                    s.synchronize().unwrap();
                }
                assert!(c.async_error().is_none());
            });
        }
    });
}

#[test]
fn a_blocking_call_after_stream_calls_runs_after_them() {
    let dev = host_device();
    let comms = Communicator::local_group(2, Config::default()).unwrap();
    std::thread::scope(|sc| {
        for c in &comms {
            sc.spawn(move || {
                c.set_device(dev).unwrap();
                let s = DeviceStream::new(dev).unwrap();
                let mut a = DeviceBuffer::from_host(dev, &values::<f32>(c.rank(), 7)).unwrap();
                if c.rank() == 1 {
                    std::thread::sleep(Duration::from_millis(100));
                }
                c.all_reduce_device_in_place_on(&mut a, ReduceOp::Sum, &s)
                    .unwrap();
                if c.rank() == 0 {
                    // Rank 0's job starts first here; rank 1's blocking call would overtake its
                    // own job, were it not waiting for the queue.
                    std::thread::sleep(Duration::from_millis(50));
                }
                // Host and device blocking calls wait for the queued job first, on both ranks.
                let mut h = [c.rank() as f32; 3];
                c.all_reduce_in_place(&mut h, ReduceOp::Sum).unwrap();
                assert_eq!(h, [1.0; 3]);
                c.all_reduce_device_in_place(&mut a, ReduceOp::Max).unwrap();
                let want: Vec<f64> = (0..7).map(|i| fold(ReduceOp::Sum, 2, i)).collect();
                assert_eq!(floats(&a.to_vec().unwrap()), want);
                s.synchronize().unwrap();
            });
        }
    });
}

#[test]
fn one_thread_drives_both_ranks_without_blocking() {
    let dev = host_device();
    let comms = Communicator::local_group(2, Config::default()).unwrap();
    let streams: Vec<DeviceStream> = comms
        .iter()
        .map(|c| {
            c.set_device(dev).unwrap();
            DeviceStream::new(dev).unwrap()
        })
        .collect();
    let mut bufs: Vec<DeviceBuffer<i32>> = (0..2)
        .map(|r| DeviceBuffer::from_host(dev, &values::<i32>(r, 1021)).unwrap())
        .collect();
    let mut gathered: Vec<DeviceBuffer<i32>> = (0..2)
        .map(|_| DeviceBuffer::new(dev, 2 * 1021).unwrap())
        .collect();
    // Rank 0's calls, then rank 1's, from this one thread: a blocking call would never return.
    for (r, ((c, s), (b, g))) in comms
        .iter()
        .zip(&streams)
        .zip(bufs.iter_mut().zip(gathered.iter_mut()))
        .enumerate()
    {
        c.all_reduce_device_in_place_on(b, ReduceOp::Max, s)
            .unwrap();
        c.all_gather_device_on(b, g, s).unwrap();
        assert!(c.async_error().is_none(), "rank {r}");
    }
    for s in &streams {
        s.synchronize().unwrap();
    }
    let max: Vec<f64> = (0..1021).map(|i| fold(ReduceOp::Max, 2, i)).collect();
    for r in 0..2 {
        assert_eq!(floats(&bufs[r].to_vec().unwrap()), max, "rank {r}");
        let both: Vec<f64> = max.iter().chain(&max).copied().collect();
        assert_eq!(floats(&gathered[r].to_vec().unwrap()), both, "rank {r}");
    }
}

#[test]
fn a_count_mismatch_releases_the_stream_and_becomes_the_async_error() {
    let dev = host_device();
    let comms = Communicator::local_group(2, Config::default()).unwrap();
    std::thread::scope(|sc| {
        for c in &comms {
            sc.spawn(move || {
                c.set_device(dev).unwrap();
                let s = DeviceStream::new(dev).unwrap();
                // Each rank's call is valid on its own: only the peers can tell.
                let n = 4 + c.rank();
                let mut buf = DeviceBuffer::from_host(dev, &values::<f32>(c.rank(), n)).unwrap();
                c.all_reduce_device_in_place_on(&mut buf, ReduceOp::Sum, &s)
                    .unwrap();
                // The stream is released although the job failed.
                s.synchronize().unwrap();
                drop(buf.to_vec().unwrap());
                let e = c
                    .async_error()
                    .expect("the failed job is the communicator's error");
                assert_ne!(e.kind(), ErrorKind::Aborted, "{e}");
                let (me, peer) = (c.rank(), 1 - c.rank());
                for part in [
                    format!("all_reduce #1 on rank {me}"),
                    format!("rank {peer} sent {} x f32", 4 + peer),
                    format!("rank {me} expected {n} x f32"),
                ] {
                    assert!(e.to_string().contains(&part), "{part}: {e}");
                }
                // Later calls fail with it.
                let later = c
                    .all_reduce_device_in_place_on(&mut buf, ReduceOp::Sum, &s)
                    .unwrap_err();
                assert!(later.to_string().contains("all_reduce"), "{later}");
            });
        }
    });
}

#[test]
fn a_local_error_is_returned_at_once_with_the_blocking_message() {
    let dev = host_device();
    let c = Communicator::local_group(1, Config::default())
        .unwrap()
        .pop()
        .unwrap();
    let s = DeviceStream::new(dev).unwrap();
    let send = DeviceBuffer::<f64>::new(dev, 4).unwrap();
    let mut recv = DeviceBuffer::<f64>::new(dev, 5).unwrap();
    let e = c
        .all_reduce_device_on(&send, &mut recv, ReduceOp::Sum, &s)
        .unwrap_err();
    assert!(e.to_string().contains("no device is bound"), "{e}");
    c.set_device(dev).unwrap();
    let e = c
        .all_reduce_device_on(&send, &mut recv, ReduceOp::Sum, &s)
        .unwrap_err();
    let sync = c
        .all_reduce_device(&send, &mut recv, ReduceOp::Sum)
        .unwrap_err();
    assert_eq!(e.to_string(), sync.to_string());
    assert!(
        e.to_string()
            .contains("all_reduce on rank 0: receive buffer has 5 elements"),
        "{e}"
    );
    let other = DeviceStream::new(Device::new(Provider::Host, 1).unwrap()).unwrap();
    let mut ok = DeviceBuffer::<f64>::new(dev, 4).unwrap();
    let e = c
        .all_reduce_device_on(&send, &mut ok, ReduceOp::Sum, &other)
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("the stream is on host stand-in device 1"),
        "{e}"
    );
    assert!(
        c.async_error().is_none(),
        "local errors are not the communicator's"
    );
}

#[test]
fn abort_fails_queued_jobs_and_releases_the_stream() {
    abort_fails_queued_jobs_with(Config::default());
    // 7 floats in 16-byte slices: each call is two stream jobs.
    abort_fails_queued_jobs_with(Config {
        device_slice_bytes: Some(16),
        ..Config::default()
    });
}

fn abort_fails_queued_jobs_with(config: Config) {
    let dev = host_device();
    let comms = Communicator::local_group(2, config).unwrap();
    let c = &comms[0];
    c.set_device(dev).unwrap();
    let s = DeviceStream::new(dev).unwrap();
    let mut bufs: Vec<DeviceBuffer<f32>> =
        (0..3).map(|_| DeviceBuffer::new(dev, 7).unwrap()).collect();
    // Rank 1 never joins: the first job waits for it, the others queue behind it.
    for b in &mut bufs {
        c.all_reduce_device_in_place_on(b, ReduceOp::Sum, &s)
            .unwrap();
    }
    let t0 = Instant::now();
    c.abort();
    s.synchronize().unwrap();
    for b in &bufs {
        b.to_vec().unwrap();
    }
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    let e = c.async_error().unwrap();
    assert_eq!(e.kind(), ErrorKind::Aborted, "{e}");
    let e = c
        .all_reduce_device_in_place_on(&mut bufs[0], ReduceOp::Sum, &s)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Aborted, "{e}");
    comms[1].abort();
}

#[test]
fn without_a_driver_a_cuda_stream_is_the_clear_error() {
    if Provider::Cuda.device_count().is_ok() {
        eprintln!("an NVIDIA driver is present: this test is for machines without one");
        return;
    }
    let e = Device::new(Provider::Cuda, 0)
        .and_then(DeviceStream::new)
        .unwrap_err();
    assert!(e.to_string().contains(DRIVER_MISSING), "{e}");
}

/// Calls of every kind and awkward counts in 64-byte slices, queued back to back without a
/// synchronize between them, each rank taking the stream-ordered or the blocking form call by
/// call as a hash picks (so both forms meet on every kind): the arena's places are reused
/// within and across calls, and every result is checked at the end.
#[test]
fn stream_and_blocking_calls_mixed_back_to_back_in_small_slices() {
    let dev = host_device();
    let config = Config {
        device_slice_bytes: Some(64),
        ..Config::default()
    };
    let n = 3;
    let comms = Communicator::local_group(n, config).unwrap();
    let v = |call: usize, r: usize, i: usize| (i * 3 + r * 5000 + call * 7) as f32 - 2000.0;
    let kinds = [
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "broadcast",
    ];
    let counts = [1usize, 7, 63, 257, 1021];
    let plan: Vec<(&str, usize)> = (0..30)
        .map(|k| (kinds[(k * 7 + k / 5) % 5], counts[(k * 3 + 1) % 5]))
        .collect();
    std::thread::scope(|sc| {
        for c in &comms {
            let plan = &plan;
            sc.spawn(move || {
                c.set_device(dev).unwrap();
                let r = c.rank();
                let s = DeviceStream::new(dev).unwrap();
                let mut held = Vec::new();
                for (call, &(kind, count)) in plan.iter().enumerate() {
                    let on = (call * 31 + r * 17) % 3 != 0;
                    let input_len = match kind {
                        "reduce_scatter" | "all_to_all" => n * count,
                        _ => count,
                    };
                    let output_len = match kind {
                        "all_gather" | "all_to_all" => n * count,
                        _ => count,
                    };
                    let mine: Vec<f32> = (0..input_len).map(|i| v(call, r, i)).collect();
                    let send = DeviceBuffer::from_host(dev, &mine).unwrap();
                    let mut recv = DeviceBuffer::<f32>::new(dev, output_len).unwrap();
                    let sum = ReduceOp::Sum;
                    let rr = match (kind, on) {
                        ("all_reduce", true) => c.all_reduce_device_on(&send, &mut recv, sum, &s),
                        ("all_reduce", false) => c.all_reduce_device(&send, &mut recv, sum),
                        ("all_gather", true) => c.all_gather_device_on(&send, &mut recv, &s),
                        ("all_gather", false) => c.all_gather_device(&send, &mut recv),
                        ("reduce_scatter", true) => {
                            c.reduce_scatter_device_on(&send, &mut recv, sum, &s)
                        }
                        ("reduce_scatter", false) => c.reduce_scatter_device(&send, &mut recv, sum),
                        ("all_to_all", true) => c.all_to_all_device_on(&send, &mut recv, &s),
                        ("all_to_all", false) => c.all_to_all_device(&send, &mut recv),
                        (_, true) => {
                            recv = DeviceBuffer::from_host(dev, &mine).unwrap();
                            c.broadcast_device_on(&mut recv, call % n, &s)
                        }
                        (_, false) => {
                            recv = DeviceBuffer::from_host(dev, &mine).unwrap();
                            c.broadcast_device(&mut recv, call % n)
                        }
                    };
                    rr.unwrap_or_else(|e| panic!("rank {r} call {call} {kind} {count}: {e}"));
                    held.push((call, kind, count, send, recv));
                }
                s.synchronize().unwrap();
                for (call, kind, count, _, recv) in held {
                    let want: Vec<f32> = match kind {
                        "all_reduce" => (0..count)
                            .map(|i| (0..n).map(|p| v(call, p, i)).sum())
                            .collect(),
                        "all_gather" => (0..n * count)
                            .map(|k| v(call, k / count, k % count))
                            .collect(),
                        "reduce_scatter" => (0..count)
                            .map(|i| (0..n).map(|p| v(call, p, r * count + i)).sum())
                            .collect(),
                        "all_to_all" => (0..n * count)
                            .map(|k| v(call, k / count, r * count + k % count))
                            .collect(),
                        _ => (0..count).map(|i| v(call, call % n, i)).collect(),
                    };
                    let got = recv.to_vec().unwrap();
                    let bad = got.iter().zip(&want).position(|(g, w)| g != w);
                    assert!(
                        got.len() == want.len() && bad.is_none(),
                        "rank {r} call {call}: {kind} of {count}: element {bad:?} is {:?}, \
                         want {:?}",
                        bad.map(|i| got[i]),
                        bad.map(|i| want[i])
                    );
                }
                assert!(c.async_error().is_none());
            });
        }
    });
}
