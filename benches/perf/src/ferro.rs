//! The perf tools on a real ferroccl [`Communicator`]: [`FerroComm`] implements
//! [`PerfComm`], and [`tool_main`] is the whole `main` of every `*_perf` binary.
//!
//! With `-B 1` (`--device_buffers 1`) the send and receive buffers live on a device of
//! `FERRO_DEVICE_PROVIDER` (default `cuda`; `host` is the test stand-in): the driver's host
//! buffers are copied there before each checked call and the output copied back before the
//! check, outside the timed loop, and the calls are ferroccl's device collectives. With `-B 2`
//! the collectives are ordered on a stream of that device (`raw_collective_device_on`): each
//! returns once queued, and a timed block ends when the stream has run them all.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use ferroccl::coll::CollKind;
use ferroccl::comm::DeviceWindow;
use ferroccl::device::{Device, DeviceBuffer, DeviceStream, Provider, RawDeviceP2p};
use ferroccl::{bootstrap, Communicator, Config, DataType, Error, ReduceOp, Result};

use crate::{report, run::hostname, run_perf, Args, Coll, PerfComm, PerfOp};

/// A device buffer of `-B`, registered as a window with `-R 1|2`.
#[derive(Debug)]
enum Buf {
    Plain(DeviceBuffer<u8>),
    Window(DeviceWindow<u8>),
}

impl std::ops::Deref for Buf {
    type Target = DeviceBuffer<u8>;
    fn deref(&self) -> &DeviceBuffer<u8> {
        match self {
            Buf::Plain(b) => b,
            Buf::Window(w) => w,
        }
    }
}

impl std::ops::DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut DeviceBuffer<u8> {
        match self {
            Buf::Plain(b) => b,
            Buf::Window(w) => w,
        }
    }
}

impl Buf {
    /// Gives the buffer back (a window deregistered: collective).
    fn release(self, comm: &Communicator) -> Result<()> {
        match self {
            Buf::Plain(_) => Ok(()),
            Buf::Window(w) => comm.deregister_device_window(w).map(drop),
        }
    }
}

/// The device buffers of a rank run with `-B 1`, grown to the largest call seen.
#[derive(Debug)]
struct DeviceBufs {
    device: Device,
    send: Buf,
    recv: Buf,
    /// `-B 2`: the stream the collectives are ordered on.
    stream: Option<DeviceStream>,
    /// `-R 1` or `-R 2` with `-B`: both buffers are windows of the communicator
    /// (`Communicator::register_device_window`, as nccl-tests registers its buffers),
    /// registered again whenever they grow.
    register: bool,
}

impl DeviceBufs {
    /// Makes both buffers hold at least `send` and `recv` bytes (a grown buffer is new: its
    /// contents are gone). With windows, growing is collective: every rank grows at the same
    /// calls (the same sizes), deregistering the old buffers first.
    fn reserve(&mut self, comm: &Communicator, send: usize, recv: usize) -> Result<()> {
        if self.send.len() < send {
            self.send = self.fresh(comm, send, true)?;
        }
        if self.recv.len() < recv {
            self.recv = self.fresh(comm, recv, false)?;
        }
        Ok(())
    }

    /// A new buffer of `len` bytes in place of the send (`send`) or receive buffer, whose
    /// window is deregistered first.
    fn fresh(&mut self, comm: &Communicator, len: usize, send: bool) -> Result<Buf> {
        let slot = if send { &mut self.send } else { &mut self.recv };
        std::mem::replace(slot, Buf::Plain(DeviceBuffer::new(self.device, 0)?)).release(comm)?;
        let b = DeviceBuffer::new(self.device, len)?;
        Ok(match self.register {
            true => Buf::Window(comm.register_device_window(b)?),
            false => Buf::Plain(b),
        })
    }
}

/// One rank of a ferroccl communicator, as the perf driver sees it.
#[derive(Debug)]
pub struct FerroComm {
    comm: Communicator,
    /// `-B 1`: the device buffers.
    device: Option<Mutex<DeviceBufs>>,
    /// `-u`: where the buffers start within the device allocations.
    unalign: usize,
    /// The communicator's calls between the ranks' buffers when the last row was labelled
    /// ([`PerfComm::algorithm`]): a row whose calls added to them took that path.
    peer_seen: std::sync::atomic::AtomicU64,
}

impl FerroComm {
    /// Wraps `comm` (host buffers).
    pub fn new(comm: Communicator) -> Self {
        FerroComm {
            comm,
            device: None,
            unalign: 0,
            peer_seen: Default::default(),
        }
    }

    /// Wraps `comm` with buffers on the device of `FERRO_DEVICE_PROVIDER` numbered by the
    /// local rank (modulo the devices this process sees, so several ranks may share one),
    /// offset by `unalign` bytes as `-u` asks; with `stream_ordered` the collectives are
    /// ordered on a stream of it (`-B 2`).
    pub fn with_device_buffers(
        comm: Communicator,
        unalign: usize,
        stream_ordered: bool,
        register: bool,
    ) -> Result<Self> {
        let provider = Provider::from_env()?;
        let count = provider.device_count()?.max(1);
        let device = Device::new(provider, comm.local_rank() as u32 % count)?;
        comm.set_device(device)?;
        let bufs = DeviceBufs {
            device,
            send: Buf::Plain(DeviceBuffer::new(device, 0)?),
            recv: Buf::Plain(DeviceBuffer::new(device, 0)?),
            stream: if stream_ordered {
                Some(DeviceStream::new(device)?)
            } else {
                None
            },
            register,
        };
        Ok(FerroComm {
            comm,
            device: Some(Mutex::new(bufs)),
            unalign,
            peer_seen: Default::default(),
        })
    }

    /// Deregisters the buffers' windows (`-R` with `-B`): collective, at the end of the run on
    /// every rank, so that no process frees a buffer another still maps.
    pub fn release_windows(&self) -> Result<()> {
        let Some(mut bufs) = self.device_bufs() else {
            return Ok(());
        };
        let b = &mut *bufs;
        for slot in [&mut b.send, &mut b.recv] {
            std::mem::replace(slot, Buf::Plain(DeviceBuffer::new(b.device, 0)?))
                .release(&self.comm)?;
        }
        Ok(())
    }

    fn device_bufs(&self) -> Option<MutexGuard<'_, DeviceBufs>> {
        self.device
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A call on the device buffers: the same lengths as the host slices the driver passes,
    /// at the same offset.
    #[allow(clippy::too_many_arguments)]
    fn run_device(
        &self,
        bufs: &mut DeviceBufs,
        coll: Coll,
        send: Option<usize>,
        recv: usize,
        bytes: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let off = self.unalign;
        let Some(kind) = scheduled_kind(coll, root) else {
            return self.p2p_device(bufs, coll, send, recv, bytes, root);
        };
        bufs.reserve(&self.comm, off + send.unwrap_or(0), off + recv)?;
        let DeviceBufs {
            send: ds,
            recv: dr,
            stream,
            ..
        } = bufs;
        let send = send.map(|len| (&**ds, off..off + len));
        let recv = (&mut **dr, off..off + recv);
        match stream {
            Some(s) => self
                .comm
                .raw_collective_device_on(kind, send, recv, dtype, op, s),
            None => self.comm.raw_collective_device(kind, send, recv, dtype, op),
        }
    }

    /// The point-to-point patterns (send/recv, gather, scatter, hypercube) on the device
    /// buffers: the same messages as the host forms below, as groups of byte ranges
    /// (`Communicator::raw_group_device`); a rank's own block is a send to itself. In-place
    /// send/recv sends what the receive buffer held, copied to the send buffer first.
    fn p2p_device(
        &self,
        bufs: &mut DeviceBufs,
        coll: Coll,
        send: Option<usize>,
        recv: usize,
        bytes: usize,
        root: usize,
    ) -> Result<()> {
        let c = &self.comm;
        let (r, n) = (c.rank(), c.nranks());
        let off = self.unalign;
        if coll == Coll::SendRecv && send.is_none() {
            // In place: the bytes to send are the receive buffer's, copied aside first, device
            // to device, so that the time of the call holds no copy through the host.
            bufs.reserve(&self.comm, off + recv, off + recv)?;
            let DeviceBufs { send, recv: r, .. } = &mut *bufs;
            send.copy_from_device(off, r, off..off + recv)?;
        }
        bufs.reserve(&self.comm, off + send.unwrap_or(recv), off + recv)?;
        let DeviceBufs {
            send: ds, recv: dr, ..
        } = bufs;
        let block = |p: usize| off + p * bytes..off + (p + 1) * bytes;
        let first = off..off + bytes;
        let mut ops = Vec::new();
        match coll {
            Coll::SendRecv => {
                ops.push(RawDeviceP2p::send((r + 1) % n, false, off..off + recv));
                ops.push(RawDeviceP2p::recv((r + n - 1) % n, off..off + recv));
            }
            Coll::Gather if bytes == 0 => {}
            Coll::Gather if r == root => {
                if send.is_some() {
                    ops.push(RawDeviceP2p::send(r, false, first));
                    ops.push(RawDeviceP2p::recv(r, block(r)));
                }
                ops.extend(
                    (0..n)
                        .filter(|&p| p != root)
                        .map(|p| RawDeviceP2p::recv(p, block(p))),
                );
            }
            Coll::Gather => ops.push(match send {
                Some(_) => RawDeviceP2p::send(root, false, first),
                None => RawDeviceP2p::send(root, true, block(r)),
            }),
            Coll::Scatter if bytes == 0 => {}
            Coll::Scatter if r == root => {
                let in_recv = send.is_none();
                ops.extend(
                    (0..n)
                        .filter(|&p| p != root)
                        .map(|p| RawDeviceP2p::send(p, in_recv, block(p))),
                );
                if !in_recv {
                    ops.push(RawDeviceP2p::send(r, false, block(r)));
                    ops.push(RawDeviceP2p::recv(r, first));
                }
            }
            Coll::Scatter => ops.push(match send {
                Some(_) => RawDeviceP2p::recv(root, first),
                None => RawDeviceP2p::recv(root, block(r)),
            }),
            Coll::HyperCube => {
                if !n.is_power_of_two() {
                    return Err(Error::invalid_argument(format!(
                        "hypercube on rank {r}: nranks {n} is not a power of two"
                    )));
                }
                if send.is_some() {
                    let own = [
                        RawDeviceP2p::send(r, false, first),
                        RawDeviceP2p::recv(r, block(r)),
                    ];
                    c.raw_group_device(ds, dr, &own)?;
                }
                let mut width = 1;
                while width < n {
                    let partner = r ^ width;
                    let (mine, theirs) = (r & !(width - 1), partner & !(width - 1));
                    let span = |from: usize| off + from * bytes..off + (from + width) * bytes;
                    let step = [
                        RawDeviceP2p::send(partner, true, span(mine)),
                        RawDeviceP2p::recv(partner, span(theirs)),
                    ];
                    c.raw_group_device(ds, dr, &step)?;
                    width *= 2;
                }
                return Ok(());
            }
            _ => {
                return Err(Error::internal(format!(
                    "{}: not a point-to-point pattern",
                    coll.program_name()
                )))
            }
        }
        if ops.is_empty() {
            return Ok(());
        }
        c.raw_group_device(ds, dr, &ops)
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
        if let Some(mut bufs) = self.device_bufs() {
            let send = send.map(<[u8]>::len);
            let bytes = count * dtype.size();
            return self.run_device(&mut bufs, coll, send, recv.len(), bytes, dtype, rop, root);
        }
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
        // Called after each row's calls: where they went straight between the ranks' buffers
        // (device buffers of threads of one process), that is the row's path, not the
        // schedule the model would pick.
        let now = self.comm.device_peer_calls();
        let before = self
            .peer_seen
            .swap(now, std::sync::atomic::Ordering::Relaxed);
        if now > before {
            return Some("peer".to_string());
        }
        let Some(kind) = scheduled_kind(coll, root) else {
            return Some("p2p".to_string());
        };
        Some(self.comm.route_for(kind, count, dtype).to_string())
    }

    fn barrier(&self) -> Result<()> {
        self.comm.barrier()
    }

    fn finish(&self) -> Result<()> {
        match self.device_bufs() {
            Some(b) => b.stream.as_ref().map_or(Ok(()), DeviceStream::synchronize),
            None => Ok(()),
        }
    }

    fn sum_host_bytes(&self, buf: &mut [u8]) -> Result<()> {
        let n = buf.len();
        self.comm.raw_collective(
            CollKind::AllReduce,
            None,
            buf,
            n,
            DataType::Uint8,
            ReduceOp::Sum,
        )
    }

    fn load(&self, send: &[u8], recv: &[u8]) -> Result<()> {
        let Some(mut bufs) = self.device_bufs() else {
            return Ok(());
        };
        bufs.reserve(&self.comm, send.len(), recv.len())?;
        bufs.send.write_at(0, send)?;
        bufs.recv.write_at(0, recv)
    }

    fn fetch(&self, recv: &mut [u8]) -> Result<()> {
        match self.device_bufs() {
            Some(bufs) => bufs.recv.read_at(0, recv),
            None => Ok(()),
        }
    }

    fn device_line(&self) -> String {
        let pid = std::process::id();
        let (rank, host) = (self.comm.rank(), hostname());
        let Some(bufs) = self.device_bufs() else {
            return report::device_line(rank, 0, pid, &host, 0, "[cpu] host memory");
        };
        let d = bufs.device;
        let bus = d
            .pci_bus_id()
            .unwrap_or_else(|e| format!("bus id unknown: {e}"));
        let name = d.name().unwrap_or_else(|e| format!("name unknown: {e}"));
        report::device_line(
            rank,
            0,
            pid,
            &host,
            d.ordinal() as usize,
            &format!("[{bus}] {name}"),
        )
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
                    let fc = if args.device_buffers {
                        FerroComm::with_device_buffers(
                            c,
                            args.unalign,
                            args.stream_ordered,
                            args.local_register > 0,
                        )?
                    } else {
                        FerroComm::new(c)
                    };
                    let rank = fc.rank();
                    let summary = if rank == 0 {
                        let summary = run_perf(&fc, coll, args, &mut std::io::stdout())?;
                        // Which path the device collectives took, for readers of the figures
                        // (the traffic of a call straight between the ranks' buffers is not
                        // the ring's): said only where some did.
                        let peer = fc.comm().device_peer_calls();
                        if peer > 0 {
                            println!("# Calls between the ranks' buffers : {peer}");
                        }
                        summary
                    } else {
                        run_perf(&fc, coll, args, &mut std::io::sink())?
                    };
                    fc.release_windows()?;
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
