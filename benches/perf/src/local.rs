//! A reference [`PerfComm`]: `nranks` ranks as threads of one process, exchanging data
//! through shared memory and reducing element by element in plain arithmetic.
//!
//! It checks the tool itself (the driver, the data and the validation) without a network or
//! a real communicator, and gives communicators something to compare against.
//!
//! ```
//! use ferroccl_perf::{local::local_group, run_perf, Args, Coll};
//!
//! let args = Args::parse(["-b", "64", "-e", "256", "-f", "2", "-n", "2"]).unwrap();
//! let summaries: Vec<_> = std::thread::scope(|s| {
//!     let handles: Vec<_> = local_group(2)
//!         .into_iter()
//!         .map(|comm| {
//!             let args = &args;
//!             s.spawn(move || run_perf(&comm, Coll::AllReduce, args, &mut std::io::sink()))
//!         })
//!         .collect();
//!     handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
//! });
//! assert!(summaries.iter().all(|s| s.success() && s.rows.len() == 3));
//! ```

use crate::codec;
use crate::coll::{Coll, Layout, PerfOp};
use crate::run::PerfComm;
use ferroccl::{DataType, Error, Result};
use std::sync::{Arc, Barrier, Mutex, MutexGuard};

#[derive(Debug)]
struct Shared {
    nranks: usize,
    barrier: Barrier,
    inputs: Mutex<Vec<Vec<u8>>>,
    values: Mutex<Vec<f64>>,
}

impl Shared {
    fn inputs(&self) -> MutexGuard<'_, Vec<Vec<u8>>> {
        // A panicking rank leaves plain byte vectors behind: still usable.
        self.inputs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn values(&self) -> MutexGuard<'_, Vec<f64>> {
        self.values.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One rank of a [`local_group`]. Move each into its own thread.
#[derive(Debug)]
pub struct LocalComm {
    rank: usize,
    shared: Arc<Shared>,
}

/// `nranks` connected ranks, rank `i` at index `i`. Every rank must make the same calls
/// in the same order (a rank that stops calling leaves the others waiting).
pub fn local_group(nranks: usize) -> Vec<LocalComm> {
    let nranks = nranks.max(1);
    let shared = Arc::new(Shared {
        nranks,
        barrier: Barrier::new(nranks),
        inputs: Mutex::new(vec![Vec::new(); nranks]),
        values: Mutex::new(vec![0.0; nranks]),
    });
    (0..nranks)
        .map(|rank| LocalComm {
            rank,
            shared: Arc::clone(&shared),
        })
        .collect()
}

/// Reduces element `j` of every input with `op`, in rank order, and writes it to `out`.
fn reduce_into(dtype: DataType, op: PerfOp, inputs: &[&[u8]], out: &mut [u8]) {
    let es = dtype.size();
    let n = inputs.len();
    for (j, dst) in out.chunks_exact_mut(es).enumerate() {
        let elems = inputs.iter().map(|inp| &inp[j * es..(j + 1) * es]);
        if dtype.is_float() {
            let vals: Vec<f64> = elems.map(|e| codec::decode(dtype, e)).collect();
            let r = match op {
                PerfOp::Sum => vals.iter().sum(),
                PerfOp::Avg => vals.iter().sum::<f64>() / n as f64,
                PerfOp::PreMulSum => vals
                    .iter()
                    .enumerate()
                    .map(|(r, v)| v * f64::from(PerfOp::premul_scalar(r)))
                    .sum(),
                PerfOp::Prod => vals.iter().product(),
                PerfOp::Max => vals.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                PerfOp::Min => vals.iter().copied().fold(f64::INFINITY, f64::min),
            };
            if !codec::encode(dtype, r, dst) {
                // Not representable: poison with a NaN pattern (all ones in every format).
                dst.fill(0xFF);
            }
        } else {
            let vals: Vec<i128> = elems
                .map(|e| codec::decode_int(dtype, e).unwrap_or(0))
                .collect();
            let r = match op {
                PerfOp::Sum => vals.iter().fold(0i128, |a, v| a.wrapping_add(*v)),
                PerfOp::Avg => vals.iter().fold(0i128, |a, v| a.wrapping_add(*v)) / n as i128,
                PerfOp::PreMulSum => vals.iter().enumerate().fold(0i128, |a, (r, v)| {
                    a.wrapping_add(v.wrapping_mul(i128::from(PerfOp::premul_scalar(r))))
                }),
                PerfOp::Prod => vals.iter().fold(1i128, |a, v| a.wrapping_mul(*v)),
                PerfOp::Max => vals.iter().copied().max().unwrap_or(0),
                PerfOp::Min => vals.iter().copied().min().unwrap_or(0),
            };
            codec::encode_int(dtype, r, dst);
        }
    }
}

impl PerfComm for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn nranks(&self) -> usize {
        self.shared.nranks
    }

    fn run(
        &self,
        coll: Coll,
        send: Option<&[u8]>,
        recv: &mut [u8],
        count: usize,
        dtype: DataType,
        op: PerfOp,
        root: usize,
    ) -> Result<()> {
        let n = self.shared.nranks;
        let rank = self.rank;
        let es = dtype.size();
        let layout = Layout::for_call(coll, count, n);
        let (send_len, recv_len) = (layout.send_count * es, layout.recv_count * es);
        let needed_recv = if send.is_some() {
            recv_len
        } else {
            layout.inplace_count() * es
        };
        if send.is_some_and(|s| s.len() < send_len) || recv.len() < needed_recv || root >= n {
            return Err(Error::invalid_argument(format!(
                "local {coll} rank {rank}: buffers of {} and {} bytes, root {root}, need {send_len} \
                 and {needed_recv} bytes and a root below {n}",
                send.map_or(0, <[u8]>::len),
                recv.len()
            )));
        }
        let input = match send {
            Some(s) => s[..send_len].to_vec(),
            None => {
                let at = layout.send_inplace_offset * rank * es;
                recv[at..at + send_len].to_vec()
            }
        };
        self.shared.inputs()[rank] = input;
        self.shared.barrier.wait();
        {
            let inputs = self.shared.inputs();
            let at = if send.is_some() {
                0
            } else {
                layout.recv_inplace_offset * rank * es
            };
            let out = &mut recv[at..at + recv_len];
            let block = count * es;
            let all: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
            match coll {
                Coll::AllReduce => reduce_into(dtype, op, &all, out),
                Coll::Reduce => {
                    if rank == root {
                        reduce_into(dtype, op, &all, out);
                    }
                }
                Coll::ReduceScatter => {
                    let mine: Vec<&[u8]> = all
                        .iter()
                        .map(|inp| &inp[rank * block..(rank + 1) * block])
                        .collect();
                    reduce_into(dtype, op, &mine, out);
                }
                Coll::Broadcast => out.copy_from_slice(&all[root][..recv_len]),
                Coll::SendRecv => out.copy_from_slice(&all[(rank + n - 1) % n][..recv_len]),
                Coll::AllGather | Coll::HyperCube | Coll::Gather => {
                    if coll != Coll::Gather || rank == root {
                        for (p, dst) in out.chunks_exact_mut(block.max(1)).enumerate() {
                            dst.copy_from_slice(&all[p][..block]);
                        }
                    }
                }
                Coll::Scatter => {
                    out.copy_from_slice(&all[root][rank * block..(rank + 1) * block]);
                }
                Coll::AllToAll => {
                    for (p, dst) in out.chunks_exact_mut(block.max(1)).enumerate() {
                        dst.copy_from_slice(&all[p][rank * block..(rank + 1) * block]);
                    }
                }
            }
        }
        self.shared.barrier.wait();
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        self.shared.barrier.wait();
        Ok(())
    }

    fn allreduce_f64(&self, v: f64, max: bool) -> Result<f64> {
        self.shared.values()[self.rank] = v;
        self.shared.barrier.wait();
        let r = {
            let vals = self.shared.values();
            if max {
                vals.iter().copied().fold(f64::NEG_INFINITY, f64::max)
            } else {
                vals.iter().sum()
            }
        };
        self.shared.barrier.wait();
        Ok(r)
    }
}
