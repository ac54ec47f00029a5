//! The collective conformance suite, shared by every harness (threads, processes, network
//! namespaces): every collective × dtype × op × count, in place and out of place, with a
//! distinct value in every element of every rank and exact expected results.

#![allow(dead_code)]

use ferroccl::coll::CollKind;
use ferroccl::device::{Device, DeviceBuffer};
use ferroccl::{BufMut, BufRef, Communicator, DataType, ReduceOp};
use ferroccl_kernels::{as_bytes, as_bytes_mut, Element, Fp8E4M3, Fp8E5M2};
use half::{bf16, f16};

/// What to sweep.
#[derive(Debug, Clone)]
pub struct Sweep {
    pub dtypes: Vec<DataType>,
    pub ops: Vec<ReduceOp>,
    pub counts: Vec<usize>,
    /// Which collectives (by name: all_reduce, broadcast, reduce, all_gather, reduce_scatter,
    /// all_to_all, send_recv).
    pub colls: Vec<&'static str>,
}

pub const ALL_COLLS: [&str; 7] = [
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "send_recv",
];

pub fn all_ops() -> Vec<ReduceOp> {
    vec![
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
        ReduceOp::PreMulSum(0.0), // scalar chosen per rank
    ]
}

impl Sweep {
    /// Every dtype and op on small counts.
    pub fn full_small() -> Sweep {
        Sweep {
            dtypes: DataType::ALL.to_vec(),
            ops: all_ops(),
            counts: vec![0, 1, 7, 1000],
            colls: ALL_COLLS.to_vec(),
        }
    }

    /// A few dtypes and ops on one large, odd count.
    pub fn large() -> Sweep {
        Sweep {
            dtypes: vec![DataType::Float32, DataType::Bfloat16, DataType::Int64],
            ops: vec![ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg],
            counts: vec![(1 << 20) + 3],
            colls: ALL_COLLS.to_vec(),
        }
    }
}

fn mix(a: u64) -> u64 {
    let mut z = a.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn h(case: u64, rank: usize, i: usize) -> u64 {
    mix(mix(case ^ (rank as u64) << 40) ^ i as u64)
}

/// Largest integer every value up to which the type holds exactly.
fn exact_limit(d: DataType) -> i64 {
    match d {
        DataType::Float64 => 1 << 53,
        DataType::Float32 => 1 << 24,
        DataType::Float16 => 1 << 11,
        DataType::Bfloat16 => 1 << 8,
        DataType::Float8E4M3 => 16,
        DataType::Float8E5M2 => 8,
        _ => i64::MAX,
    }
}

/// Per-rank scalar of the pre-multiplied sum.
pub fn premul_scalar(rank: usize) -> f64 {
    (rank % 3 + 1) as f64
}

fn int_bits(d: DataType) -> Option<(u32, bool)> {
    match d {
        DataType::Int8 => Some((8, true)),
        DataType::Uint8 => Some((8, false)),
        DataType::Int32 => Some((32, true)),
        DataType::Uint32 => Some((32, false)),
        DataType::Int64 => Some((64, true)),
        DataType::Uint64 => Some((64, false)),
        _ => None,
    }
}

/// Reinterprets the low `bits` of `v` as the typed integer (sign-extended when signed).
fn wrap(v: i128, bits: u32, signed: bool) -> i128 {
    let m = (v as u128) & ((1u128 << bits) - 1);
    if signed && (m >> (bits - 1)) & 1 == 1 {
        m as i128 - (1i128 << bits)
    } else {
        m as i128
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Val {
    I(i128),
    F(f64),
}

/// Value of element `i` of rank `rank` for a reducing case.
fn value(d: DataType, op: ReduceOp, case: u64, rank: usize, n: usize, i: usize) -> Val {
    let r = h(case, rank, i);
    if let Some((bits, signed)) = int_bits(d) {
        // Integer arithmetic wraps, so any values give exact, order-independent results.
        return Val::I(wrap(r as i128, bits, signed));
    }
    let lim = exact_limit(d);
    let n = n as i64;
    let pick = |m: i64| -> f64 {
        if m <= 0 {
            0.0
        } else {
            ((r % (2 * m as u64 + 1)) as i64 - m) as f64
        }
    };
    Val::F(match op {
        ReduceOp::Sum | ReduceOp::Avg => pick(lim / n),
        ReduceOp::PreMulSum(_) => pick(lim / (3 * n)),
        ReduceOp::Max | ReduceOp::Min => pick(lim),
        ReduceOp::Prod => {
            let mag = if rank < 8 && (r >> 8) & 1 == 1 {
                2.0
            } else {
                1.0
            };
            if (r >> 9) & 1 == 1 {
                -mag
            } else {
                mag
            }
        }
    })
}

fn encode(d: DataType, v: Val, out: &mut Vec<u8>) {
    fn put<T: Element>(x: T, out: &mut Vec<u8>) {
        out.extend_from_slice(as_bytes(&[x]));
    }
    match (d, v) {
        (_, Val::I(x)) => {
            let bytes = (x as u128).to_le_bytes();
            out.extend_from_slice(&bytes[..d.size()]);
        }
        (DataType::Float64, Val::F(x)) => put(x, out),
        (DataType::Float32, Val::F(x)) => put(x as f32, out),
        (DataType::Float16, Val::F(x)) => put(f16::from_f64(x), out),
        (DataType::Bfloat16, Val::F(x)) => put(bf16::from_f64(x), out),
        (DataType::Float8E4M3, Val::F(x)) => put(Fp8E4M3::from_f64(x), out),
        (DataType::Float8E5M2, Val::F(x)) => put(Fp8E5M2::from_f64(x), out),
        (other, Val::F(_)) => unreachable!("{other} is an integer type"),
    }
}

/// The reduction over `n` ranks of element `i`, as the library defines it.
fn reduced(d: DataType, op: ReduceOp, case: u64, n: usize, i: usize) -> Val {
    let val = |r: usize| value(d, op, case, r, n, i);
    if let Some((bits, signed)) = int_bits(d) {
        let x = |r: usize| match val(r) {
            Val::I(x) => x,
            Val::F(_) => unreachable!("integer dtype"),
        };
        let w = |v: i128| wrap(v, bits, signed);
        let sum = || (0..n).fold(0i128, |a, r| w(a.wrapping_add(x(r))));
        return Val::I(match op {
            ReduceOp::Sum => sum(),
            ReduceOp::Prod => (0..n).fold(1i128, |a, r| w(a.wrapping_mul(x(r)))),
            ReduceOp::Max => (0..n).map(x).max().unwrap_or(0),
            ReduceOp::Min => (0..n).map(x).min().unwrap_or(0),
            ReduceOp::Avg => sum() / n as i128,
            ReduceOp::PreMulSum(_) => (0..n).fold(0i128, |a, r| {
                w(a.wrapping_add(w(x(r).wrapping_mul(premul_scalar(r) as i128))))
            }),
        });
    }
    let x = |r: usize| match val(r) {
        Val::F(x) => x,
        Val::I(_) => unreachable!("float dtype"),
    };
    let sum = || (0..n).map(x).sum::<f64>();
    Val::F(match op {
        ReduceOp::Sum => sum(),
        ReduceOp::Prod => (0..n).map(x).product(),
        ReduceOp::Max => (0..n).map(x).fold(f64::MIN, f64::max),
        ReduceOp::Min => (0..n).map(x).fold(f64::MAX, f64::min),
        ReduceOp::Avg => {
            if d == DataType::Float64 {
                sum() / n as f64
            } else {
                f64::from(sum() as f32 / n as f32)
            }
        }
        ReduceOp::PreMulSum(_) => (0..n).map(|r| x(r) * premul_scalar(r)).sum(),
    })
}

fn fill_values(
    d: DataType,
    op: ReduceOp,
    case: u64,
    rank: usize,
    n: usize,
    range: std::ops::Range<usize>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(range.len() * d.size());
    for i in range {
        encode(d, value(d, op, case, rank, n, i), &mut out);
    }
    out
}

fn fill_reduced(
    d: DataType,
    op: ReduceOp,
    case: u64,
    n: usize,
    range: std::ops::Range<usize>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(range.len() * d.size());
    for i in range {
        encode(d, reduced(d, op, case, n, i), &mut out);
    }
    out
}

/// Raw distinct bytes for data-movement collectives (any bit pattern must survive).
fn fill_raw(case: u64, rank: usize, bytes: std::ops::Range<usize>) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = bytes.start;
    while i < bytes.end {
        let word = h(case, rank, i / 8).to_le_bytes();
        let k = i % 8;
        let take = (8 - k).min(bytes.end - i);
        out.extend_from_slice(&word[k..k + take]);
        i += take;
    }
    out
}

fn op_for(op: ReduceOp, rank: usize) -> ReduceOp {
    match op {
        ReduceOp::PreMulSum(_) => ReduceOp::PreMulSum(premul_scalar(rank)),
        o => o,
    }
}

fn first_diff(got: &[u8], want: &[u8], es: usize) -> String {
    if got.len() != want.len() {
        return format!("length {} != {}", got.len(), want.len());
    }
    let k = got
        .chunks(es)
        .zip(want.chunks(es))
        .position(|(a, b)| a != b)
        .unwrap_or(0);
    let wrong = got
        .chunks(es)
        .zip(want.chunks(es))
        .filter(|(a, b)| a != b)
        .count();
    format!(
        "{wrong} wrong elements, first at {k}: got {:?} want {:?}",
        &got[k * es..(k + 1) * es],
        &want[k * es..(k + 1) * es]
    )
}

/// Where a case's buffers live.
#[derive(Debug, Clone, Copy)]
pub enum Mem {
    /// Host slices (`raw_collective`).
    Host,
    /// Device buffers on this device (the generic `collective` on `DeviceBuffer`s), filled
    /// from and read back into the host bytes of the case.
    Device(Device),
}

/// `raw_collective` on host bytes, or the same call on device buffers holding them.
#[allow(clippy::too_many_arguments)]
fn raw(
    comm: &Communicator,
    mem: Mem,
    kind: CollKind,
    send: Option<&[u8]>,
    recv: &mut [u8],
    count: usize,
    d: DataType,
    op: ReduceOp,
) -> ferroccl::Result<()> {
    let dev = match mem {
        Mem::Host => return comm.raw_collective(kind, send, recv, count, d, op),
        Mem::Device(dev) => dev,
    };
    match d {
        DataType::Int8 => on_device::<i8>(comm, dev, kind, send, recv, op),
        DataType::Uint8 => on_device::<u8>(comm, dev, kind, send, recv, op),
        DataType::Int32 => on_device::<i32>(comm, dev, kind, send, recv, op),
        DataType::Uint32 => on_device::<u32>(comm, dev, kind, send, recv, op),
        DataType::Int64 => on_device::<i64>(comm, dev, kind, send, recv, op),
        DataType::Uint64 => on_device::<u64>(comm, dev, kind, send, recv, op),
        DataType::Float16 => on_device::<f16>(comm, dev, kind, send, recv, op),
        DataType::Bfloat16 => on_device::<bf16>(comm, dev, kind, send, recv, op),
        DataType::Float32 => on_device::<f32>(comm, dev, kind, send, recv, op),
        DataType::Float64 => on_device::<f64>(comm, dev, kind, send, recv, op),
        DataType::Float8E4M3 => on_device::<Fp8E4M3>(comm, dev, kind, send, recv, op),
        DataType::Float8E5M2 => on_device::<Fp8E5M2>(comm, dev, kind, send, recv, op),
    }
}

fn typed<T: Element>(b: &[u8]) -> Vec<T> {
    let mut v = vec![T::from_f64(0.0); b.len() / T::DTYPE.size()];
    as_bytes_mut(&mut v).copy_from_slice(b);
    v
}

fn on_device<T: Element>(
    comm: &Communicator,
    dev: Device,
    kind: CollKind,
    send: Option<&[u8]>,
    recv: &mut [u8],
    op: ReduceOp,
) -> ferroccl::Result<()> {
    let s = send
        .map(|b| DeviceBuffer::from_host(dev, &typed::<T>(b)))
        .transpose()?;
    let mut host = typed::<T>(recv);
    let mut r = DeviceBuffer::from_host(dev, &host)?;
    comm.collective(
        kind,
        s.as_ref().map(BufRef::Device),
        BufMut::Device(&mut r),
        op,
    )?;
    r.copy_to_host(&mut host)?;
    recv.copy_from_slice(as_bytes(&host));
    Ok(())
}

/// Runs one case on this rank; every rank must call it with the same arguments.
pub fn run_case(
    comm: &Communicator,
    coll: &str,
    d: DataType,
    op: ReduceOp,
    count: usize,
    in_place: bool,
    case: u64,
) -> Result<(), String> {
    run_case_on(comm, Mem::Host, coll, d, op, count, in_place, case)
}

/// [`run_case`] with the buffers in `mem`.
#[allow(clippy::too_many_arguments)]
pub fn run_case_on(
    comm: &Communicator,
    mem: Mem,
    coll: &str,
    d: DataType,
    op: ReduceOp,
    count: usize,
    in_place: bool,
    case: u64,
) -> Result<(), String> {
    let (r, n) = (comm.rank(), comm.nranks());
    let es = d.size();
    let myop = op_for(op, r);
    let root = (case as usize) % n;
    let label = format!(
        "{coll} {d} {} count {count} in_place {in_place} root {root} nranks {n} rank {r}",
        op.name()
    );
    let fail = |what: String| Err(format!("{label}: {what}"));
    let sentinel = 0xa5u8;
    match coll {
        "all_reduce" | "reduce" => {
            let input = fill_values(d, op, case, r, n, 0..count);
            let want = fill_reduced(d, op, case, n, 0..count);
            let kind = if coll == "reduce" {
                CollKind::Reduce { root }
            } else {
                CollKind::AllReduce
            };
            let mut out;
            let res = if in_place {
                out = input.clone();
                raw(comm, mem, kind, None, &mut out, count, d, myop)
            } else {
                out = vec![sentinel; count * es];
                raw(comm, mem, kind, Some(&input), &mut out, count, d, myop)
            };
            res.map_err(|e| format!("{label}: {e}"))?;
            let expect = if coll == "reduce" && r != root {
                if in_place {
                    input
                } else {
                    vec![sentinel; count * es]
                }
            } else {
                want
            };
            if out != expect {
                return fail(first_diff(&out, &expect, es));
            }
        }
        "broadcast" => {
            let input = fill_raw(case, r, 0..count * es);
            let want = fill_raw(case, root, 0..count * es);
            let mut out;
            let kind = CollKind::Broadcast { root };
            let res = if in_place {
                out = input.clone();
                raw(comm, mem, kind, None, &mut out, count, d, myop)
            } else {
                out = vec![sentinel; count * es];
                raw(comm, mem, kind, Some(&input), &mut out, count, d, myop)
            };
            res.map_err(|e| format!("{label}: {e}"))?;
            if out != want {
                return fail(first_diff(&out, &want, es));
            }
        }
        "all_gather" => {
            let input = fill_raw(case, r, 0..count * es);
            let want: Vec<u8> = (0..n)
                .flat_map(|p| fill_raw(case, p, 0..count * es))
                .collect();
            let mut out = vec![sentinel; count * n * es];
            let res = if in_place {
                out[r * count * es..(r + 1) * count * es].copy_from_slice(&input);
                raw(
                    comm,
                    mem,
                    CollKind::AllGather,
                    None,
                    &mut out,
                    count,
                    d,
                    myop,
                )
            } else {
                raw(
                    comm,
                    mem,
                    CollKind::AllGather,
                    Some(&input),
                    &mut out,
                    count,
                    d,
                    myop,
                )
            };
            res.map_err(|e| format!("{label}: {e}"))?;
            if out != want {
                return fail(first_diff(&out, &want, es));
            }
        }
        "reduce_scatter" => {
            let input = fill_values(d, op, case, r, n, 0..count * n);
            let want = fill_reduced(d, op, case, n, r * count..(r + 1) * count);
            let got = if in_place {
                let mut buf = input.clone();
                raw(
                    comm,
                    mem,
                    CollKind::ReduceScatter,
                    None,
                    &mut buf,
                    count,
                    d,
                    myop,
                )
                .map_err(|e| format!("{label}: {e}"))?;
                buf[r * count * es..(r + 1) * count * es].to_vec()
            } else {
                let mut out = vec![sentinel; count * es];
                raw(
                    comm,
                    mem,
                    CollKind::ReduceScatter,
                    Some(&input),
                    &mut out,
                    count,
                    d,
                    myop,
                )
                .map_err(|e| format!("{label}: {e}"))?;
                out
            };
            if got != want {
                return fail(first_diff(&got, &want, es));
            }
        }
        "all_to_all" => {
            // Block p of rank r's input is what r sends to p: distinct per (r, p, i).
            let input = fill_raw(case, r, 0..count * n * es);
            let want: Vec<u8> = (0..n)
                .flat_map(|p| fill_raw(case, p, r * count * es..(r + 1) * count * es))
                .collect();
            let mut out;
            let res = if in_place {
                out = input.clone();
                raw(
                    comm,
                    mem,
                    CollKind::AllToAll,
                    None,
                    &mut out,
                    count,
                    d,
                    myop,
                )
            } else {
                out = vec![sentinel; count * n * es];
                raw(
                    comm,
                    mem,
                    CollKind::AllToAll,
                    Some(&input),
                    &mut out,
                    count,
                    d,
                    myop,
                )
            };
            res.map_err(|e| format!("{label}: {e}"))?;
            if out != want {
                return fail(first_diff(&out, &want, es));
            }
        }
        "send_recv" => {
            // Everyone sends to the next rank and receives from the previous one, in a group;
            // plus, for in_place, a send to self.
            let next = (r + 1) % n;
            let prev = (r + n - 1) % n;
            let mine = fill_raw(case, r, 0..count * es);
            let want = fill_raw(case, prev, 0..count * es);
            let mut got = vec![sentinel; count * es];
            let mut g = comm.group();
            g.send(&mine[..], next);
            g.recv(&mut got[..], prev);
            g.run().map_err(|e| format!("{label}: {e}"))?;
            if got != want {
                return fail(first_diff(&got, &want, es));
            }
        }
        other => return Err(format!("unknown collective {other}")),
    }
    Ok(())
}

/// Runs the whole sweep; returns the number of cases run on this rank.
pub fn run_sweep(comm: &Communicator, sweep: &Sweep, seed: u64) -> Result<usize, String> {
    run_sweep_on(comm, Mem::Host, sweep, seed)
}

/// [`run_sweep`] with the buffers in `mem` (`send_recv` runs on host memory only).
pub fn run_sweep_on(
    comm: &Communicator,
    mem: Mem,
    sweep: &Sweep,
    seed: u64,
) -> Result<usize, String> {
    let mut cases = 0;
    let mut case = seed;
    for &coll in &sweep.colls {
        let reduces = matches!(coll, "all_reduce" | "reduce" | "reduce_scatter");
        for &d in &sweep.dtypes {
            let ops: Vec<ReduceOp> = if reduces {
                sweep.ops.clone()
            } else {
                vec![ReduceOp::Sum]
            };
            for &op in &ops {
                for &count in &sweep.counts {
                    for in_place in [false, true] {
                        if coll == "send_recv" && in_place {
                            continue;
                        }
                        case += 1;
                        run_case_on(comm, mem, coll, d, op, count, in_place, case)?;
                        cases += 1;
                    }
                }
            }
        }
    }
    Ok(cases)
}
