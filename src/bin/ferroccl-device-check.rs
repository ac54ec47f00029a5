//! ferroccl-device-check: collectives on device buffers against the same collectives on host
//! buffers, ranks as threads of this process, all on one device. Part of the GPU check bundle
//! (`scripts/gpu-check.sh`); with `FERRO_DEVICE_PROVIDER=host` it runs anywhere.
//!
//!   ferroccl-device-check [--device N] [--ranks N,N,..] [--max-count N]
//!
//! Exit status: 0 every case matched, 1 a wrong element or a failed call, 2 no usable device.

use std::process::ExitCode;

use ferroccl::coll::CollKind;
use ferroccl::device::{Device, DeviceBuffer, DeviceStream, Provider};
use ferroccl::{BufMut, BufRef, Communicator, Config, DataType, Element, ReduceOp};
use ferroccl_kernels::{ElemOp, Fp8E4M3, Fp8E5M2};
use half::{bf16, f16};

const USAGE: &str = "\
usage: ferroccl-device-check [--device N] [--ranks N,N,..] [--max-count N]

Runs stream-ordered all_reduce (all_reduce_device_on, out of place and in place, f32 and
bf16, queued back to back on one stream per rank) and a ring of sends and receives in one
group on the stream (Group::run_on), then all_reduce (every dtype and op),
broadcast, all_gather, reduce_scatter, reduce and all_to_all on device buffers of device N
(default 0) of the provider FERRO_DEVICE_PROVIDER names (cuda, the default, or host), ranks
as threads (default 1,2,4), counts 0, 1, 7, 1021, 65537 and 2^20 (those up to --max-count),
and compares every byte with the same call on host buffers. Exit 0: all matched; 1: a
mismatch or error; 2: no device.";

const COUNTS: [usize; 6] = [0, 1, 7, 1021, 65537, 1 << 20];
const OPS: [ReduceOp; 6] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Avg,
    ReduceOp::PreMulSum(2.0),
];

/// A distinct small value per (rank, element), exact in every dtype's range after wrapping.
fn input<T: Element>(rank: usize, len: usize, salt: usize) -> Vec<T> {
    (0..len)
        .map(|i| T::from_f64((((i * 7 + rank * 13 + salt) % 29) as f64) - 14.0))
        .collect()
}

/// One case: `kind` on device buffers and on host buffers; Err describes a mismatch.
fn case<T: Element>(
    c: &Communicator,
    dev: Device,
    kind: CollKind,
    count: usize,
    op: ReduceOp,
) -> Result<(), String> {
    let n = c.nranks();
    let (in_len, out_len) = kind.buffer_lens(count, n);
    let send: Vec<T> = input(c.rank(), in_len, count);
    let mut want: Vec<T> = input(c.rank() + 100, out_len, count);
    let label = format!(
        "{} {} {} count {count} nranks {n} rank {}",
        kind.name(),
        T::DTYPE,
        op.name(),
        c.rank()
    );
    let err = |e: ferroccl::Error| format!("{label}: {e}");
    let d_send = DeviceBuffer::from_host(dev, &send).map_err(err)?;
    let mut d_recv = DeviceBuffer::from_host(dev, &want).map_err(err)?;
    c.collective(kind, Some(BufRef::Host(&send)), BufMut::Host(&mut want), op)
        .map_err(err)?;
    let peer_before = c.device_peer_calls();
    c.collective(
        kind,
        Some(BufRef::Device(&d_send)),
        BufMut::Device(&mut d_recv),
        op,
    )
    .map_err(err)?;
    if c.device_peer_calls() != peer_before {
        // Straight between the ranks' buffers, every element is reduced in rank order, where
        // the host schedule's order depends on the element's place in the ring (copies are
        // the same bits either way).
        let r = c.rank();
        match kind {
            CollKind::AllReduce => want = rank_order(n, op, |k| input(k, count, count)),
            CollKind::Reduce { root } if root == r => {
                want = rank_order(n, op, |k| input(k, count, count));
            }
            CollKind::ReduceScatter => {
                want = rank_order(n, op, |k| {
                    input::<T>(k, in_len, count)[r * count..(r + 1) * count].to_vec()
                });
            }
            _ => {}
        }
    }
    let got = d_recv.to_vec().map_err(err)?;
    let (g, w) = (
        ferroccl_kernels::as_bytes(&got),
        ferroccl_kernels::as_bytes(&want),
    );
    if g != w {
        let es = T::DTYPE.size();
        let k = (0..got.len()).find(|&k| g[k * es..(k + 1) * es] != w[k * es..(k + 1) * es]);
        return Err(format!(
            "{label}: element {k:?} differs from the host result"
        ));
    }
    Ok(())
}

/// The reduction under `op` of every rank's source (`source(k)` for rank `k`), combined in
/// rank order, as the path between the ranks' buffers combines them.
fn rank_order<T: Element>(n: usize, op: ReduceOp, source: impl Fn(usize) -> Vec<T>) -> Vec<T> {
    let dtype = T::DTYPE;
    let elem = match op {
        ReduceOp::Prod => ElemOp::Prod,
        ReduceOp::Max => ElemOp::Max,
        ReduceOp::Min => ElemOp::Min,
        _ => ElemOp::Sum,
    };
    let scaled = |r: usize| {
        let mut x = source(r);
        if let ReduceOp::PreMulSum(f) = op {
            let src = x.clone();
            let (dst, src) = (
                ferroccl_kernels::as_bytes_mut(&mut x),
                ferroccl_kernels::as_bytes(&src),
            );
            ferroccl_kernels::scale_into(dtype, dst, src, f);
        }
        x
    };
    let mut acc = scaled(0);
    for r in 1..n {
        let x = scaled(r);
        ferroccl_kernels::reduce_inplace(
            dtype,
            elem,
            ferroccl_kernels::as_bytes_mut(&mut acc),
            ferroccl_kernels::as_bytes(&x),
        );
    }
    if op == ReduceOp::Avg {
        ferroccl_kernels::divide(dtype, ferroccl_kernels::as_bytes_mut(&mut acc), n as u64);
    }
    acc
}

fn kinds(count: usize, n: usize) -> Vec<(CollKind, usize)> {
    let root = count % n;
    vec![
        (CollKind::AllReduce, count),
        (CollKind::Broadcast { root }, count),
        (CollKind::Reduce { root }, count),
        (CollKind::AllGather, count),
        (CollKind::ReduceScatter, count),
        (CollKind::AllToAll, count),
    ]
}

/// Every case of dtype `T` on this rank; returns how many ran.
fn rank_cases<T: Element>(c: &Communicator, dev: Device, max: usize) -> Result<usize, String> {
    let mut cases = 0;
    for count in COUNTS.into_iter().filter(|&k| k <= max) {
        for (kind, count) in kinds(count, c.nranks()) {
            let ops: &[ReduceOp] = if matches!(kind, CollKind::AllReduce) {
                &OPS
            } else if kind.reduces() {
                &OPS[..1]
            } else {
                &[ReduceOp::Sum]
            };
            for &op in ops {
                case::<T>(c, dev, kind, count, op)?;
                cases += 1;
            }
        }
    }
    Ok(cases)
}

/// Stream-ordered calls (`*_device_on`) of dtype `T`: per count, an out-of-place and an
/// in-place sum queued back to back on one stream of this rank, then one synchronize, both
/// results compared with the host result; then a ring of sends and receives in a group on the
/// stream against the host ring; returns how many calls ran.
fn stream_cases<T: Element>(c: &Communicator, dev: Device, max: usize) -> Result<usize, String> {
    let stream = DeviceStream::new(dev).map_err(|e| format!("DeviceStream::new: {e}"))?;
    let mut calls = 0;
    for count in COUNTS.into_iter().filter(|&k| k <= max) {
        let label = format!(
            "all_reduce_device_on {} count {count} rank {}",
            T::DTYPE,
            c.rank()
        );
        let err = |e: ferroccl::Error| format!("{label}: {e}");
        let send: Vec<T> = input(c.rank(), count, count + 1);
        let mut want = vec![T::from_f64(0.0); count];
        c.all_reduce(&send, &mut want, ReduceOp::Sum).map_err(err)?;
        let mut d_send = DeviceBuffer::from_host(dev, &send).map_err(err)?;
        let mut d_recv = DeviceBuffer::<T>::new(dev, count).map_err(err)?;
        c.all_reduce_device_on(&d_send, &mut d_recv, ReduceOp::Sum, &stream)
            .map_err(err)?;
        c.all_reduce_device_in_place_on(&mut d_send, ReduceOp::Sum, &stream)
            .map_err(err)?;
        stream.synchronize().map_err(err)?;
        for (what, b) in [("out of place", &d_recv), ("in place", &d_send)] {
            let got = b.to_vec().map_err(err)?;
            if ferroccl_kernels::as_bytes(&got) != ferroccl_kernels::as_bytes(&want) {
                return Err(format!("{label} ({what}): differs from the host result"));
            }
        }
        calls += 2;

        // A ring of sends and receives in one group queued on the stream (Group::run_on),
        // against the same ring on host buffers.
        let label = format!("send/recv group on a stream {} count {count}", T::DTYPE);
        let err = |e: ferroccl::Error| format!("{label} rank {}: {e}", c.rank());
        let n = c.nranks();
        let (right, left) = ((c.rank() + 1) % n, (c.rank() + n - 1) % n);
        let mut want = vec![T::from_f64(0.0); count];
        let mut g = c.group();
        g.send(&send, right).recv(&mut want, left);
        g.run().map_err(err)?;
        let d_send = DeviceBuffer::from_host(dev, &send).map_err(err)?;
        let mut d_recv = DeviceBuffer::<T>::new(dev, count).map_err(err)?;
        let mut g = c.group();
        g.send_device(&d_send, right).recv_device(&mut d_recv, left);
        g.run_on(&stream).map_err(err)?;
        stream.synchronize().map_err(err)?;
        let got = d_recv.to_vec().map_err(err)?;
        if ferroccl_kernels::as_bytes(&got) != ferroccl_kernels::as_bytes(&want) {
            return Err(format!(
                "{label} rank {}: differs from the host result",
                c.rank()
            ));
        }
        calls += 1;
    }
    Ok(calls)
}

fn rank_all(c: &Communicator, dev: Device, max: usize) -> Result<usize, String> {
    c.set_device(dev).map_err(|e| e.to_string())?;
    let mut cases = stream_cases::<f32>(c, dev, max)? + stream_cases::<bf16>(c, dev, max)?;
    for d in DataType::ALL {
        cases += match d {
            DataType::Int8 => rank_cases::<i8>(c, dev, max)?,
            DataType::Uint8 => rank_cases::<u8>(c, dev, max)?,
            DataType::Int32 => rank_cases::<i32>(c, dev, max)?,
            DataType::Uint32 => rank_cases::<u32>(c, dev, max)?,
            DataType::Int64 => rank_cases::<i64>(c, dev, max)?,
            DataType::Uint64 => rank_cases::<u64>(c, dev, max)?,
            DataType::Float16 => rank_cases::<f16>(c, dev, max)?,
            DataType::Bfloat16 => rank_cases::<bf16>(c, dev, max)?,
            DataType::Float32 => rank_cases::<f32>(c, dev, max)?,
            DataType::Float64 => rank_cases::<f64>(c, dev, max)?,
            DataType::Float8E4M3 => rank_cases::<Fp8E4M3>(c, dev, max)?,
            DataType::Float8E5M2 => rank_cases::<Fp8E5M2>(c, dev, max)?,
        };
    }
    Ok(cases)
}

fn run(args: &[String]) -> Result<ExitCode, String> {
    let mut ordinal = 0u32;
    let mut ranks = vec![1usize, 2, 4];
    let mut max = usize::MAX;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().cloned().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(ExitCode::SUCCESS);
            }
            "--device" => {
                let v = value("--device")?;
                ordinal = v
                    .parse()
                    .map_err(|_| format!("--device {v:?}: not a number"))?;
            }
            "--ranks" => {
                let v = value("--ranks")?;
                ranks = v
                    .split(',')
                    .map(|r| r.parse().ok().filter(|&r: &usize| r >= 1))
                    .collect::<Option<_>>()
                    .ok_or(format!(
                        "--ranks {v:?}: expected numbers >= 1, comma separated"
                    ))?;
            }
            "--max-count" => {
                let v = value("--max-count")?;
                max = v
                    .parse()
                    .map_err(|_| format!("--max-count {v:?}: not a number"))?;
            }
            other => return Err(format!("unknown argument {other:?}\n\n{USAGE}")),
        }
    }
    let provider = Provider::from_env().map_err(|e| e.to_string())?;
    let dev = match Device::new(provider, ordinal) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("ferroccl-device-check: no usable device: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    println!("ferroccl-device-check: {dev}");
    let mut failed = false;
    for n in ranks {
        // The environment's settings (FERRO_TRANSPORTS=p2p: the ranks join over the GPU
        // peer-to-peer transport and the collectives run straight on the device buffers).
        let config = Config::from_env().map_err(|e| e.to_string())?;
        let comms = Communicator::local_group(n, config).map_err(|e| e.to_string())?;
        // Which path the blocking calls take: straight on the device buffers, or staged.
        let path = comms
            .first()
            .map_or("staged through pinned host memory", |c| {
                let _ = c.set_device(dev);
                if c.device_direct() {
                    "straight on the device buffers"
                } else {
                    "staged through pinned host memory"
                }
            });
        let results: Vec<Result<usize, String>> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .map(|c| {
                    s.spawn(move || {
                        let r = rank_all(c, dev, max);
                        if r.is_err() {
                            // The other ranks fail promptly instead of waiting for this one.
                            c.abort();
                        }
                        r
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("rank panicked".to_string()))
                })
                .collect()
        });
        // Calls that went straight between the ranks' buffers (threads of one process).
        let peer = comms.first().map_or(0, Communicator::device_peer_calls);
        match results.iter().find_map(|r| r.as_ref().err()) {
            None => println!(
                "  {n} ranks: {} cases per rank matched the host results (stream-ordered calls \
                 included; blocking calls {path}; {peer} calls between the ranks' buffers)",
                results[0].as_ref().map_or(0, |c| *c)
            ),
            Some(e) => {
                println!("  {n} ranks: FAIL {e}");
                failed = true;
            }
        }
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ferroccl-device-check: {e}");
            ExitCode::from(1)
        }
    }
}
