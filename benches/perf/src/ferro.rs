//! The perf tools on a real ferroccl [`Communicator`]: [`FerroComm`] implements
//! [`PerfComm`], and [`tool_main`] is the whole `main` of every `*_perf` binary.

use std::time::Duration;

use ferroccl::coll::CollKind;
use ferroccl::{bootstrap, Communicator, Config, DataType, Error, ReduceOp, Result};

use crate::{run_perf, Args, Coll, PerfComm, PerfOp};

/// One rank of a ferroccl communicator, as the perf driver sees it.
#[derive(Debug)]
pub struct FerroComm {
    comm: Communicator,
}

impl FerroComm {
    /// Wraps `comm`.
    pub fn new(comm: Communicator) -> Self {
        FerroComm { comm }
    }

    /// The communicator.
    pub fn comm(&self) -> &Communicator {
        &self.comm
    }
}

fn reduce_op(op: PerfOp, rank: usize) -> ReduceOp {
    match op {
        PerfOp::Sum => ReduceOp::Sum,
        PerfOp::Prod => ReduceOp::Prod,
        PerfOp::Max => ReduceOp::Max,
        PerfOp::Min => ReduceOp::Min,
        PerfOp::Avg => ReduceOp::Avg,
        PerfOp::PreMulSum => ReduceOp::PreMulSum(f64::from(PerfOp::premul_scalar(rank))),
    }
}

/// The scheduled collective behind `coll`; `None` for the point-to-point patterns (send/recv,
/// gather, scatter, hypercube), which are built from sends and receives.
fn scheduled_kind(coll: Coll, root: usize) -> Option<CollKind> {
    Some(match coll {
        Coll::AllReduce => CollKind::AllReduce,
        Coll::AllGather => CollKind::AllGather,
        Coll::Broadcast => CollKind::Broadcast { root },
        Coll::Reduce => CollKind::Reduce { root },
        Coll::ReduceScatter => CollKind::ReduceScatter,
        Coll::AllToAll => CollKind::AllToAll,
        Coll::SendRecv | Coll::Gather | Coll::Scatter | Coll::HyperCube => return None,
    })
}

impl PerfComm for FerroComm {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn nranks(&self) -> usize {
        self.comm.nranks()
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
        let c = &self.comm;
        let rop = reduce_op(op, c.rank());
        let bytes = count * dtype.size();
        match (scheduled_kind(coll, root), coll) {
            (Some(kind), _) => c.raw_collective(kind, send, recv, count, dtype, rop),
            (None, Coll::Gather) => self.gather(send, recv, bytes, root),
            (None, Coll::Scatter) => self.scatter(send, recv, bytes, root),
            (None, Coll::HyperCube) => self.hypercube(send, recv, bytes),
            // Only send/recv is left.
            (None, _) => self.send_recv(send, recv, bytes),
        }
    }

    fn algorithm(&self, coll: Coll, count: usize, dtype: DataType, root: usize) -> Option<String> {
        let Some(kind) = scheduled_kind(coll, root) else {
            return Some("p2p".to_string());
        };
        Some(
            self.comm
                .algorithm_for(kind, count, dtype)
                .name()
                .to_string(),
        )
    }

    fn barrier(&self) -> Result<()> {
        self.comm.barrier()
    }

    fn allreduce_f64(&self, v: f64, max: bool) -> Result<f64> {
        let mut b = [v];
        let op = if max { ReduceOp::Max } else { ReduceOp::Sum };
        self.comm.all_reduce_in_place(&mut b, op)?;
        Ok(b[0])
    }
}

impl FerroComm {
    /// Ring shift of `bytes` bytes.
    fn send_recv(&self, send: Option<&[u8]>, recv: &mut [u8], bytes: usize) -> Result<()> {
        let c = &self.comm;
        let (r, n) = (c.rank(), c.nranks());
        let own: Vec<u8>;
        let src: &[u8] = match send {
            Some(s) => s,
            None => {
                own = recv[..bytes].to_vec();
                &own
            }
        };
        let mut g = c.group();
        g.send(&src[..bytes], (r + 1) % n);
        g.recv(&mut recv[..bytes], (r + n - 1) % n);
        g.run()
    }

    /// The root receives every rank's block (`bytes` each) in rank order.
    fn gather(
        &self,
        send: Option<&[u8]>,
        recv: &mut [u8],
        bytes: usize,
        root: usize,
    ) -> Result<()> {
        let c = &self.comm;
        let (r, n) = (c.rank(), c.nranks());
        let mut g = c.group();
        if r == root {
            if let Some(s) = send {
                recv[r * bytes..(r + 1) * bytes].copy_from_slice(&s[..bytes]);
            }
            for (p, block) in recv[..n * bytes].chunks_mut(bytes.max(1)).enumerate() {
                if p != root && bytes > 0 {
                    g.recv(block, p);
                }
            }
        } else if bytes > 0 {
            // The root posts no receive for empty blocks, so nothing is sent for them.
            let src: &[u8] = match send {
                Some(s) => &s[..bytes],
                None => &recv[r * bytes..(r + 1) * bytes],
            };
            g.send(src, root);
        }
        g.run()
    }

    /// Rank `p` receives block `p` (`bytes`) of the root's buffer.
    fn scatter(
        &self,
        send: Option<&[u8]>,
        recv: &mut [u8],
        bytes: usize,
        root: usize,
    ) -> Result<()> {
        let c = &self.comm;
        let (r, n) = (c.rank(), c.nranks());
        match send {
            Some(s) => {
                let mut g = c.group();
                if r == root {
                    for (p, block) in s[..n * bytes].chunks(bytes.max(1)).enumerate() {
                        if p != root && bytes > 0 {
                            g.send(block, p);
                        }
                    }
                }
                let (mine, _) = recv.split_at_mut(bytes);
                if r == root {
                    mine.copy_from_slice(&s[r * bytes..(r + 1) * bytes]);
                } else if bytes > 0 {
                    // The root sends nothing for empty blocks.
                    g.recv(mine, root);
                }
                g.run()
            }
            None => {
                // In place: one buffer of n blocks; the result is block `r`.
                let mut g = c.group();
                if r == root {
                    for (p, block) in recv[..n * bytes].chunks(bytes.max(1)).enumerate() {
                        if p != root && bytes > 0 {
                            g.send(block, p);
                        }
                    }
                } else if bytes > 0 {
                    g.recv(&mut recv[r * bytes..(r + 1) * bytes], root);
                }
                g.run()
            }
        }
    }

    /// All-gather by log2(n) pairwise exchanges (n must be a power of two).
    fn hypercube(&self, send: Option<&[u8]>, recv: &mut [u8], bytes: usize) -> Result<()> {
        let c = &self.comm;
        let (r, n) = (c.rank(), c.nranks());
        if !n.is_power_of_two() {
            return Err(Error::invalid_argument(format!(
                "hypercube on rank {r}: nranks {n} is not a power of two"
            )));
        }
        if let Some(s) = send {
            recv[r * bytes..(r + 1) * bytes].copy_from_slice(&s[..bytes]);
        }
        let mut width = 1;
        while width < n {
            let partner = r ^ width;
            let mine = r & !(width - 1);
            let theirs = partner & !(width - 1);
            let (lo, hi) = recv.split_at_mut(mine.max(theirs) * bytes);
            let (src, dst): (&[u8], &mut [u8]) = if mine < theirs {
                (
                    &lo[mine * bytes..(mine + width) * bytes],
                    &mut hi[..width * bytes],
                )
            } else {
                (
                    &hi[..width * bytes],
                    &mut lo[theirs * bytes..(theirs + width) * bytes],
                )
            };
            let mut g = c.group();
            g.send(src, partner);
            g.recv(dst, partner);
            g.run()?;
            width *= 2;
        }
        Ok(())
    }
}

/// The `main` of a perf tool for `coll`: parses the flags, joins the job the launcher started
/// (`ferrorun`, `mpirun`, `srun`, `torchrun`; a single process without one), runs `-t` ranks
/// per process on threads, prints the table on rank 0 and exits non-zero on any wrong result.
pub fn tool_main(coll: Coll) -> ! {
    let program = coll.program_name();
    let mut args = match Args::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprint!("{}", e.report(&program));
            std::process::exit(e.exit_code());
        }
    };
    if args.min_busbw.is_none() {
        args.min_busbw = crate::args::min_bw_from_env();
    }
    match run_tool(coll, &args) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("{program}: {e}");
            std::process::exit(1);
        }
    }
}

fn run_tool(coll: Coll, args: &Args) -> Result<i32> {
    let mut config = Config::from_env()?;
    if args.timeout_s > 0 {
        config.timeout = Duration::from_secs(args.timeout_s);
    }
    let threads = args.nthreads.max(1);
    let comms = match bootstrap::env::detect()? {
        Some(env) => Communicator::from_launch_env_threads(&env, config, threads)?,
        None => Communicator::local_group(threads, config)?,
    };
    let results: Vec<Result<i32>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    let fc = FerroComm::new(c);
                    let rank = fc.rank();
                    let summary = if rank == 0 {
                        run_perf(&fc, coll, args, &mut std::io::stdout())?
                    } else {
                        run_perf(&fc, coll, args, &mut std::io::sink())?
                    };
                    Ok(summary.exit_code())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::internal("a rank thread panicked")))
            })
            .collect()
    });
    let mut code = 0;
    for r in results {
        code = code.max(r?);
    }
    Ok(code)
}
