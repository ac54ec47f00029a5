//! Transport and planning costs, measured through ferroccl's public API.
//!
//! Per transport (`tcp`: sockets over loopback; `shm`: shared memory), between two ranks that
//! are threads of this process, with the transport chosen by `FERRO_TRANSPORTS`:
//!
//! * `pingpong/<transport>/<bytes>`: one round trip with `Communicator::send` / `recv`,
//!   8 B .. 64 KiB. The time is the round trip; one-way latency is half of it. Throughput
//!   counts the bytes of both legs.
//! * `stream/<transport>/<bytes>`: rank 0 sends messages of `bytes` back to back, rank 1
//!   receives them; one 1-byte acknowledgement per batch closes the timing. 64 KiB .. 64 MiB;
//!   throughput is the payload bytes per second.
//! * `schedule_build/all_reduce/<nranks>`: `ferroccl::coll::build` for one all_reduce of
//!   16 Mi elements with 1 Mi-element slices, rank 0 of 8, 64 and 1024 ranks.
//!
//! Run: `cargo bench -p ferroccl-perf --bench transport` (add a filter such as `stream/tcp`
//! to run one group).

use std::hint::black_box;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use ferroccl::coll::{build, AlgoOptions, CollArgs, CollKind};
use ferroccl::{Communicator, Config};

/// What the main thread (rank 0) asks rank 1 to do.
enum Cmd {
    /// Echo `iters` messages of `bytes` back.
    PingPong { bytes: usize, iters: u64 },
    /// Receive `iters` messages of `bytes`, then send a 1-byte acknowledgement.
    Stream { bytes: usize, iters: u64 },
}

/// Rank 1: obeys commands until the channel closes.
fn peer(comm: Communicator, cmds: mpsc::Receiver<Cmd>) {
    let mut buf: Vec<u8> = Vec::new();
    for cmd in cmds {
        match cmd {
            Cmd::PingPong { bytes, iters } => {
                buf.resize(bytes, 0);
                for _ in 0..iters {
                    comm.recv(&mut buf, 0).expect("pingpong recv on rank 1");
                    comm.send(&buf, 0).expect("pingpong send on rank 1");
                }
            }
            Cmd::Stream { bytes, iters } => {
                buf.resize(bytes, 0);
                for _ in 0..iters {
                    comm.recv(&mut buf, 0).expect("stream recv on rank 1");
                }
                comm.send(&[1u8], 0).expect("stream ack on rank 1");
            }
        }
    }
}

/// The groups of one transport (`tcp` or `shm`, as `FERRO_TRANSPORTS` names them).
fn transport(c: &mut Criterion, name: &str) {
    let config =
        Config::from_lookup(&|k: &str| (k == "FERRO_TRANSPORTS").then(|| name.to_string()))
            .expect("FERRO_TRANSPORTS names a transport");
    let mut comms = Communicator::local_group(2, config).expect("two local ranks");
    let rank1 = comms.pop().expect("rank 1");
    let rank0 = comms.pop().expect("rank 0");
    let (tx, rx) = mpsc::channel();
    let peer_thread = thread::spawn(move || peer(rank1, rx));

    let mut g = c.benchmark_group(format!("pingpong/{name}"));
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(800));
    for bytes in [8usize, 64, 512, 4 << 10, 64 << 10] {
        let mut buf: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
        g.throughput(Throughput::Bytes(2 * bytes as u64));
        g.bench_with_input(BenchmarkId::from_parameter(bytes), &bytes, |b, &bytes| {
            b.iter_custom(|iters| {
                tx.send(Cmd::PingPong { bytes, iters })
                    .expect("rank 1 is running");
                let t0 = Instant::now();
                for _ in 0..iters {
                    rank0.send(&buf, 1).expect("pingpong send on rank 0");
                    rank0.recv(&mut buf, 1).expect("pingpong recv on rank 0");
                }
                t0.elapsed()
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group(format!("stream/{name}"));
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_secs(1));
    for bytes in [64usize << 10, 1 << 20, 16 << 20, 64 << 20] {
        let buf: Vec<u8> = (0..bytes).map(|i| (i % 249) as u8).collect();
        let mut ack = [0u8; 1];
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_with_input(BenchmarkId::from_parameter(bytes), &bytes, |b, &bytes| {
            b.iter_custom(|iters| {
                tx.send(Cmd::Stream { bytes, iters })
                    .expect("rank 1 is running");
                let t0 = Instant::now();
                for _ in 0..iters {
                    rank0.send(&buf, 1).expect("stream send on rank 0");
                }
                rank0.recv(&mut ack, 1).expect("stream ack on rank 0");
                t0.elapsed()
            })
        });
    }
    g.finish();

    drop(tx);
    peer_thread.join().expect("rank 1 thread");
}

fn schedules(c: &mut Criterion) {
    let mut g = c.benchmark_group("schedule_build/all_reduce");
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(800));
    let args = CollArgs {
        kind: CollKind::AllReduce,
        count: 16 << 20,
        in_place: false,
    };
    let opts = AlgoOptions { slice: 1 << 20 };
    for nranks in [8usize, 64, 1024] {
        g.bench_with_input(BenchmarkId::from_parameter(nranks), &nranks, |b, &n| {
            b.iter(|| build(black_box(&args), 0, n, &opts))
        });
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    for name in ["tcp", "shm"] {
        transport(&mut c, name);
    }
    schedules(&mut c);
    c.final_summary();
}
