//! The driver: warm-up, timed iterations, validation, rows on rank 0, summary.

use crate::args::{Args, Average, RootSel};
use crate::bw;
use crate::coll::{Coll, Layout, PerfOp};
use crate::data::{self, DataSpec, TestBuffers};
use crate::document::{json_document, open_json};
use crate::json;
use crate::report::{self, Measure, Row};
use crate::sizes;
use ferroccl::profile::{self, Phase, Profile};
use ferroccl::{DataType, Error, Result, SharedBuf};
use std::io::Write;
use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant};

/// Environment variable: how long each rank busy-waits before its first warm-up, in
/// milliseconds (default 10; 0: not at all).
pub const SETTLE_MS_ENV: &str = "FERRO_PERF_SETTLE_MS";

/// Busy-waits `FERRO_PERF_SETTLE_MS` (10 ms by default) before a run's first warm-up, as an MPI
/// rank ends its init busy-polling. Right after init the scheduler may still have two ranks on
/// one core, and a warm-up of collectives, whose waits yield and sleep, does not always make
/// the load balancer spread them. Measured (2 ranks unbound, 8 B): 8 of 24 first timed loops
/// were slow, at 0.4-1.9 µs instead of 0.15, without this wait, and 0 of 24 with it.
fn settle() {
    let ms = std::env::var(SETTLE_MS_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(10);
    let until = Instant::now() + Duration::from_millis(ms);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// What the perf driver needs from a communicator: one rank's view.
///
/// Buffers are bytes of `dtype` elements. Out of place, `send` holds
/// `layout.send_count` elements and `recv` `layout.recv_count` ([`Coll::layout`] from
/// `count`, see [`Layout::for_call`]). In place (`send == None`), `recv` is the one buffer of
/// `layout.inplace_count()` elements, with the input at element
/// `send_inplace_offset * rank` and the output at `recv_inplace_offset * rank` (NCCL's
/// in-place layout: all_gather's input is block `rank` of the output, reduce_scatter's
/// output is block `rank` of the input).
pub trait PerfComm {
    /// This rank.
    fn rank(&self) -> usize;

    /// Number of ranks.
    fn nranks(&self) -> usize;

    /// Runs one `coll` call and returns when this rank's part is complete. `count` has
    /// NCCL's meaning (per-rank block for all_gather, reduce_scatter, alltoall, gather,
    /// scatter, hypercube); `op` matters only for reducing collectives (for
    /// [`PerfOp::PreMulSum`] each rank scales its input by [`PerfOp::premul_scalar`]);
    /// `root` only for rooted ones.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        coll: Coll,
        send: Option<&[u8]>,
        recv: &mut [u8],
        count: usize,
        dtype: DataType,
        op: PerfOp,
        root: usize,
    ) -> Result<()>;

    /// The algorithm a `coll` call of `count` elements of `dtype` runs, shown in a last
    /// column of each row; `None` (the default): no such column.
    fn algorithm(&self, coll: Coll, count: usize, dtype: DataType, root: usize) -> Option<String> {
        let _ = (coll, count, dtype, root);
        None
    }

    /// Returns when every rank has called it.
    fn barrier(&self) -> Result<()>;

    /// Returns when every call made so far is complete on this rank: calls that return once
    /// queued on a stream (`-B 2`) are waited for. The default: calls complete when they
    /// return.
    fn finish(&self) -> Result<()> {
        Ok(())
    }

    /// The maximum (`max`) or the sum of `v` over ranks, on every rank.
    fn allreduce_f64(&self, v: f64, max: bool) -> Result<f64>;

    /// An in-place sum of host bytes on every rank (for [`gather_lines`]); the default is
    /// [`PerfComm::run`], which a device-buffer communicator must not use for host memory.
    fn sum_host_bytes(&self, buf: &mut [u8]) -> Result<()> {
        let n = buf.len();
        self.run(
            Coll::AllReduce,
            None,
            buf,
            n,
            DataType::Uint8,
            PerfOp::Sum,
            0,
        )
    }

    /// Device-buffer tools: copies the host inputs `data::prepare` wrote (the first bytes of
    /// the send and receive buffers) to the buffers [`PerfComm::run`] uses, before the calls
    /// that are checked. The default (host buffers): nothing to copy.
    fn load(&self, send: &[u8], recv: &[u8]) -> Result<()> {
        let _ = (send, recv);
        Ok(())
    }

    /// Device-buffer tools: copies the output back into the first `recv.len()` bytes of the
    /// host receive buffer before it is checked. The default: nothing to copy.
    fn fetch(&self, recv: &mut [u8]) -> Result<()> {
        let _ = recv;
        Ok(())
    }

    /// This rank's line under `# Using devices`
    /// (`#  Rank  0 Group  0 Pid   1234 on       host device  0 [cpu] host memory`).
    fn device_line(&self) -> String {
        report::device_line(
            self.rank(),
            0,
            std::process::id(),
            &hostname(),
            0,
            "[cpu] host memory",
        )
    }
}

/// The host name, from the kernel (falls back to `$HOSTNAME`, then `localhost`).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_string())
}

/// The outcome of [`run_perf`], the same on every rank.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Every row measured, in order.
    pub rows: Vec<Row>,
    /// Wrong elements over all rows, placements and ranks.
    pub wrong_elements: u64,
    /// Checks that found wrong data, counted per rank (nccl-tests' "Out of bounds values").
    pub errors: u64,
    /// Mean bus bandwidth over all measurements, GB/s (0 without any).
    pub avg_busbw: f64,
    /// Whether the average bus bandwidth met [`Args::min_busbw`] (`None` without minimum).
    pub bw_ok: Option<bool>,
}

impl Summary {
    /// Whether every check passed and the bandwidth minimum (if any) was met.
    pub fn success(&self) -> bool {
        self.errors == 0 && self.wrong_elements == 0 && self.bw_ok != Some(false)
    }

    /// The process exit code: 0 on success, 1 otherwise (as nccl-tests' `EXIT_FAILURE`).
    pub fn exit_code(&self) -> i32 {
        if self.success() {
            0
        } else {
            1
        }
    }
}

fn io_err(what: &str, e: &std::io::Error) -> Error {
    Error::io(format!("perf report: {what}"), e)
}

/// Writes on rank 0 only.
struct Printer<'a> {
    out: &'a mut dyn Write,
    main: bool,
}

impl Printer<'_> {
    fn text(&mut self, s: &str) -> Result<()> {
        if self.main {
            self.out
                .write_all(s.as_bytes())
                .and_then(|()| self.out.flush())
                .map_err(|e| io_err("writing the table", &e))?;
        }
        Ok(())
    }

    fn with(&mut self, f: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> Result<()> {
        if self.main {
            f(self.out)
                .and_then(|()| self.out.flush())
                .map_err(|e| io_err("writing the table", &e))?;
        }
        Ok(())
    }
}

/// Gathers one line of text from every rank, in rank order, on every rank. Uses only an
/// in-place all_reduce of bytes (each rank fills its own slot, the others are zero), so it
/// works with any communicator that can all_reduce.
pub fn gather_lines<C: PerfComm + ?Sized>(comm: &C, line: &str) -> Result<Vec<String>> {
    const MAX_LINE: usize = 2048;
    let n = comm.nranks();
    let mine = &line.as_bytes()[..line.len().min(MAX_LINE)];
    if n <= 1 {
        return Ok(vec![String::from_utf8_lossy(mine).into_owned()]);
    }
    let slot = comm.allreduce_f64(mine.len() as f64, true)? as usize;
    let slot = slot.clamp(1, MAX_LINE);
    let mut buf = vec![0u8; slot * n];
    let at = comm.rank() * slot;
    buf[at..at + mine.len()].copy_from_slice(mine);
    comm.sum_host_bytes(&mut buf)
        .map_err(|e| e.context("perf: gathering device lines"))?;
    Ok(buf
        .chunks(slot)
        .map(|c| {
            let end = c.iter().position(|b| *b == 0).unwrap_or(c.len());
            String::from_utf8_lossy(&c[..end]).into_owned()
        })
        .collect())
}

/// A send or receive buffer: ordinary memory, or shared memory (`-R 1`).
enum Bytes {
    Plain(Vec<u8>),
    Shared(SharedBuf<u8>),
}

impl Default for Bytes {
    fn default() -> Self {
        Bytes::Plain(Vec::new())
    }
}

impl Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Plain(v) => v,
            Bytes::Shared(b) => b,
        }
    }
}

impl DerefMut for Bytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Bytes::Plain(v) => v,
            Bytes::Shared(b) => b,
        }
    }
}

impl Bytes {
    /// At least `n` bytes (contents are not kept: every test fills its buffers).
    fn reserve(&mut self, n: usize, shared: bool) -> Result<()> {
        if self.len() >= n {
            return Ok(());
        }
        *self = if shared {
            Bytes::Shared(SharedBuf::zeroed(n)?)
        } else {
            Bytes::Plain(vec![0; n])
        };
        Ok(())
    }
}

/// Reusable buffers of one rank.
#[derive(Default)]
struct Buffers {
    /// Send and receive buffers in shared memory (`-R`).
    shared: bool,
    send: Bytes,
    recv: Bytes,
    expected: Vec<u8>,
}

impl Buffers {
    fn reserve(&mut self, send: usize, recv: usize, expected: usize) -> Result<()> {
        self.send.reserve(send, self.shared)?;
        self.recv.reserve(recv, self.shared)?;
        if self.expected.len() < expected {
            self.expected.resize(expected, 0);
        }
        Ok(())
    }
}

/// One (dtype, op, root) test: the settings shared by its rows.
#[derive(Debug, Clone, Copy)]
struct TestCase {
    coll: Coll,
    dtype: DataType,
    op: PerfOp,
    root: usize,
}

struct Driver<'a, C: PerfComm + ?Sized> {
    comm: &'a C,
    args: &'a Args,
    bufs: Buffers,
    /// The next warm-up is the run's first (see [`settle`]).
    first_warmup: bool,
    /// Validation passes so far (seeds the data).
    rep: u64,
    local_errors: u64,
    wrong_total: u64,
    bw_sum: f64,
    bw_count: u64,
    /// Whether each row is followed by every rank's time per phase ([`profiling`]).
    profiling: bool,
    /// The phases of the timed calls of the last [`Driver::bench`].
    last_profile: Profile,
}

/// Whether the tool prints where the time of each row's calls went, phase by phase: built with
/// the `profile` feature and run with `FERRO_PERF_PROFILE=1` (every rank alike).
fn profiling() -> bool {
    Profile::ENABLED && std::env::var("FERRO_PERF_PROFILE").is_ok_and(|v| v.trim() == "1")
}

/// `p`'s mean microseconds per call, phase by phase, on one line.
fn profile_cells(p: &Profile) -> String {
    let mut s = String::new();
    for ph in Phase::ALL {
        s.push_str(&format!("{} {:.1} ", ph.name(), p.mean_ns(ph) / 1e3));
    }
    s.push_str(&format!("({} calls)", p.calls));
    s
}

impl<C: PerfComm + ?Sized> Driver<'_, C> {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn nranks(&self) -> usize {
        self.comm.nranks()
    }

    /// Calls the collective on the current buffers.
    fn call(&mut self, t: &TestCase, layout: &Layout, in_place: bool) -> Result<()> {
        let es = t.dtype.size();
        let off = self.args.unalign;
        let recv_len = if in_place {
            layout.inplace_count() * es
        } else {
            layout.recv_count * es
        };
        let send = (!in_place).then(|| &self.bufs.send[off..off + layout.send_count * es]);
        let recv = &mut self.bufs.recv[off..off + recv_len];
        self.comm
            .run(
                t.coll,
                send,
                recv,
                layout.param_count,
                t.dtype,
                t.op,
                t.root,
            )
            .map_err(|e| {
                e.context(format!(
                    "{} count {} {} {} root {} ({})",
                    t.coll,
                    layout.param_count,
                    t.dtype.name(),
                    t.op,
                    t.root,
                    if in_place { "in place" } else { "out of place" }
                ))
            })
    }

    fn prepare(&mut self, t: &TestCase, layout: &Layout, in_place: bool, seed: u64) -> Result<()> {
        let es = t.dtype.size();
        let off = self.args.unalign;
        let spec = DataSpec::for_coll(t.coll, t.dtype, t.op, self.nranks()).with_seed(seed);
        let Buffers {
            send,
            recv,
            expected,
            ..
        } = &mut self.bufs;
        data::prepare(
            t.coll,
            &spec,
            layout,
            self.comm.rank(),
            t.root,
            in_place,
            TestBuffers {
                send: &mut send[off..],
                recv: &mut recv[off..],
                expected: &mut expected[..layout.recv_count * es],
            },
        );
        let send_end = if in_place {
            0
        } else {
            off + layout.send_count * es
        };
        let recv_end = off + layout.inplace_count() * es;
        self.comm.load(&send[..send_end], &recv[..recv_end])
    }

    fn combine_time(&self, sec: f64) -> Result<f64> {
        let n = self.nranks() as f64;
        match self.args.average {
            Average::Rank0 => {
                let mine = if self.rank() == 0 { sec } else { 0.0 };
                self.comm.allreduce_f64(mine, false)
            }
            Average::Mean => Ok(self.comm.allreduce_f64(sec, false)? / n),
            Average::Min => Ok(-self.comm.allreduce_f64(-sec, true)?),
            Average::Max => self.comm.allreduce_f64(sec, true),
        }
    }

    /// nccl-tests' `BenchTime`: one block of a row.
    fn bench(&mut self, t: &TestCase, layout: &Layout, in_place: bool) -> Result<Measure> {
        let args = self.args;
        if args.check > 0 {
            self.prepare(t, layout, in_place, 99)?;
        }
        // Synchronizing call.
        self.call(t, layout, in_place)?;
        self.comm.finish()?;
        self.comm.barrier()?;

        let mut excluded = Duration::ZERO;
        let _ = profile::take();
        let start = Instant::now();
        for _ in 0..args.iters {
            for _ in 0..args.agg_iters {
                self.call(t, layout, in_place)?;
                if args.blocking == 1 {
                    self.comm.finish()?;
                    self.comm.barrier()?;
                }
            }
            if args.blocking == 3 {
                let b = Instant::now();
                self.comm.finish()?;
                self.comm.barrier()?;
                excluded += b.elapsed();
            }
        }
        self.comm.finish()?;
        let elapsed = start.elapsed().saturating_sub(excluded);
        self.last_profile = profile::take();
        let sec = elapsed.as_secs_f64() / (args.iters * args.agg_iters) as f64;
        let sec = self.combine_time(sec)?;
        let es = t.dtype.size();
        let bw = bw::bandwidth(t.coll, layout.param_count, es, sec, self.nranks());
        self.comm.barrier()?;

        let mut wrong = None;
        for _ in 0..args.check {
            self.rep += 1;
            self.prepare(t, layout, in_place, self.rep)?;
            self.call(t, layout, in_place)?;
            let range = data::output_range(layout, es, self.rank(), in_place);
            let off = args.unalign;
            self.comm.fetch(&mut self.bufs.recv[..off + range.end])?;
            let got = &self.bufs.recv[off + range.start..off + range.end];
            let local = data::count_wrong(t.dtype, got, &self.bufs.expected[..range.len()]);
            if local > 0 {
                self.local_errors += 1;
            }
            let total = self.comm.allreduce_f64(local as f64, false)? as u64;
            wrong = Some(total);
            if total > 0 {
                break;
            }
        }
        self.wrong_total += wrong.unwrap_or(0);
        self.bw_sum += bw.busbw;
        self.bw_count += 1;
        Ok(Measure {
            time_us: sec * 1.0e6,
            algbw: bw.algbw,
            busbw: bw.busbw,
            wrong,
        })
    }

    /// nccl-tests' `TimeTest`: warm-up, then one row per size.
    fn time_test(&mut self, t: &TestCase, p: &mut Printer<'_>, rows: &mut Vec<Row>) -> Result<()> {
        let args = self.args;
        let es = t.dtype.size();
        let n = self.nranks();
        let sizes = sizes::sweep_args(args);
        let points = sizes::points(t.coll, &sizes, es, n);
        let warmup_layouts = [args.max_bytes, args.min_bytes].map(|b| t.coll.layout(b / es, es, n));
        let (mut send_max, mut recv_max) = (0, 0);
        for layout in points.iter().map(|pt| &pt.layout).chain(&warmup_layouts) {
            send_max = send_max.max(layout.send_count * es);
            recv_max = recv_max.max(layout.inplace_count() * es);
        }
        self.bufs
            .reserve(send_max + args.unalign, recv_max + args.unalign, recv_max)?;

        if std::mem::take(&mut self.first_warmup) {
            settle();
        }
        self.comm.barrier()?;
        for layout in &warmup_layouts {
            for _ in 0..args.warmup_iters {
                self.call(t, layout, false)?;
            }
        }

        let redop = if t.coll.reduces() {
            t.op.name()
        } else {
            "none"
        };
        let root = if t.coll.rooted() { t.root as i64 } else { -1 };
        let mut cycle = 0;
        loop {
            for pt in &points {
                p.text(&report::row_prefix(
                    pt.bytes,
                    pt.count,
                    t.dtype.name(),
                    redop,
                    root,
                ))?;
                let out_of_place = self.bench(t, &pt.layout, false)?;
                let out_profile = self.last_profile;
                p.text(&report::measure_cells(&out_of_place))?;
                let in_place = self.bench(t, &pt.layout, true)?;
                p.text(&report::measure_cells(&in_place))?;
                let algo = self.comm.algorithm(t.coll, pt.count, t.dtype, t.root);
                p.text(&report::algo_cell(algo.as_deref()))?;
                p.text("\n")?;
                if self.profiling {
                    let line = format!(
                        "rank {}: out of place {}; in place {}",
                        self.rank(),
                        profile_cells(&out_profile),
                        profile_cells(&self.last_profile)
                    );
                    for l in gather_lines(self.comm, &line)? {
                        p.text(&format!("#  profile (us/call) {} B {l}\n", pt.bytes))?;
                    }
                }
                rows.push(Row {
                    bytes: pt.bytes,
                    count: pt.count,
                    type_name: t.dtype.name(),
                    redop,
                    root,
                    out_of_place,
                    in_place,
                    algo,
                });
            }
            cycle += 1;
            if args.run_cycles != 0 && cycle >= args.run_cycles {
                break;
            }
        }
        Ok(())
    }
}

/// Runs the whole tool for `coll` on one rank: prints (rank 0) what nccl-tests prints, and
/// returns the same [`Summary`] on every rank. Every rank of the communicator must call it
/// with the same `args`.
pub fn run_perf<C: PerfComm>(
    comm: &C,
    coll: Coll,
    args: &Args,
    out: &mut dyn Write,
) -> Result<Summary> {
    let rank = comm.rank();
    let nranks = comm.nranks();
    let main = rank == 0;
    let mut p = Printer { out, main };
    let start_time = json::now_utc();

    let mut json_file = None;
    if main {
        if let Some(path) = &args.json_path {
            match open_json(path) {
                Ok((f, used)) => {
                    p.text(&format!("# Writing JSON output to {}\n", used.display()))?;
                    json_file = Some(f);
                }
                Err(e) => {
                    p.text(&format!(
                        "# skipping json output; {} not accessible ({e})\n",
                        path.display()
                    ))?;
                }
            }
        }
    }
    p.with(|o| report::write_preamble(o, coll, args))?;
    let devices = gather_lines(comm, &comm.device_line())?;
    p.with(|o| report::write_devices(o, &devices))?;
    p.with(|o| report::write_column_header(o, args.report_cputime))?;

    let roots: Vec<usize> = if coll.rooted() {
        match args.root {
            RootSel::Rank(r) if r < nranks => vec![r],
            RootSel::Rank(r) => {
                return Err(Error::invalid_argument(format!(
                    "{}: invalid root {r} (root must be 0..{})",
                    coll.program_name(),
                    nranks.saturating_sub(1)
                )))
            }
            RootSel::All => (0..nranks).collect(),
        }
    } else {
        vec![0]
    };
    let ops: Vec<PerfOp> = if coll.reduces() {
        args.ops.clone()
    } else {
        vec![PerfOp::Sum]
    };

    let mut driver = Driver {
        comm,
        args,
        bufs: Buffers {
            shared: args.local_register > 0 && !args.device_buffers,
            ..Buffers::default()
        },
        first_warmup: true,
        rep: 0,
        local_errors: 0,
        wrong_total: 0,
        bw_sum: 0.0,
        bw_count: 0,
        profiling: profiling(),
        last_profile: Profile::default(),
    };
    let mut rows = Vec::new();
    if coll.supports_nranks(nranks) {
        for &dtype in &args.dtypes {
            for &op in &ops {
                for &root in &roots {
                    let t = TestCase {
                        coll,
                        dtype,
                        op,
                        root,
                    };
                    driver.time_test(&t, &mut p, &mut rows)?;
                }
            }
        }
    } else {
        p.text(&format!("nRanks {nranks} is not a power of 2, skipping\n"))?;
    }

    let errors = comm.allreduce_f64(driver.local_errors as f64, false)? as u64;
    let avg_busbw = if driver.bw_count > 0 {
        driver.bw_sum / driver.bw_count as f64
    } else {
        0.0
    };
    let bw_ok = args.min_busbw.map(|min| avg_busbw >= min * 0.9);
    p.with(|o| report::write_footer(o, errors, avg_busbw, args.min_busbw, coll))?;

    let summary = Summary {
        rows,
        wrong_elements: driver.wrong_total,
        errors,
        avg_busbw,
        bw_ok,
    };
    if let Some(mut f) = json_file {
        let doc = json_document(coll, args, &devices, &summary, &start_time);
        f.write_all(doc.render().as_bytes())
            .and_then(|()| f.write_all(b"\n"))
            .map_err(|e| io_err("writing the JSON file", &e))?;
    }
    Ok(summary)
}
