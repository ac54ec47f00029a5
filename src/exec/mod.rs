//! The progress engine: runs a rank's schedule over its connections.
//!
//! One [`Engine`] per communicator owns the connections, the scratch and staging memory and the
//! plan cache, so that the data path allocates nothing once a size has been seen. Whoever runs an
//! operation (the caller's thread or the communicator's progress thread) holds the engine.
//!
//! Waiting: an op with nothing to move spins for `spin` (cheap hand-offs between ranks on
//! different cores; after the first few microseconds it yields the core between checks, so that
//! ranks sharing a core still progress), then sleeps: on the rank's shared-memory doorbell (a
//! futex) when it waits only for shared-memory peers, in `poll(2)` on the sockets when it waits
//! only for TCP peers, and in `poll(2)` with a 1 ms limit when it waits for both. An idle rank
//! burns no CPU. Every wait has a deadline: no bytes moved for `timeout` is an error naming the
//! operation, this rank and the peer. The step driver (`step`) holds the progress logic only;
//! time and waiting come from a `wait::Waiter`, and every element-wise step (reductions,
//! pre-multiplied scaling, copies) from the engine's [`Reducer`].

mod conn;
mod lane;
mod layout;
mod peer;
mod reducing;
mod space;
mod step;
#[cfg(test)]
mod tests;
mod tuning;
mod wait;
mod windows;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use ferroccl_kernels::{DataType, ElemOp};
use ferroccl_transport::{
    Doorbell, Error, Header, MemRef, MemSpace, Payload, PayloadMut, Progress, RegCache, Region,
    Result,
};

use crate::coll::{self, CollArgs, Op, Schedule};
use crate::reduce::{HostReducer, Reducer};

// Header kinds, for code that names them through the executor (their home is `crate::wire`).
pub(crate) use crate::wire::kind;
pub(crate) use conn::Conn;
use layout::Layout;
use space::Run;
pub(crate) use space::{ArenaUse, DeviceArena, ScratchAlloc};
pub(crate) use step::{OpContext, RawOp};
use step::{OpState, StepEnv};
pub(crate) use tuning::Tuning;
use wait::{SysWaiter, WaitBuffers};
pub(crate) use windows::{Mapper, Offered, Owned};

/// How long a failing rank spends, at most, telling its peers why (see
/// [`Engine::notify_failure`]).
const NOTICE_BUDGET: Duration = Duration::from_millis(50);
/// How long a rank whose connection to a peer broke looks for that peer's failure notice.
const NOTICE_LATE: Duration = Duration::from_millis(20);

/// Registered regions an engine keeps, over all its connections.
const REG_CACHE_ENTRIES: usize = 256;

/// Waiting and deadline settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WaitPolicy {
    /// Busy-wait this long before sleeping in poll.
    pub spin: Duration,
    /// No progress for this long is an error.
    pub timeout: Duration,
}

/// Where a collective's buffers are. Raw pointers: the communicator checked the lengths and
/// holds the borrows for the whole call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Memory {
    /// Input buffer (ignored when `in_place`).
    pub input: *const u8,
    /// Its length in bytes.
    pub input_len: usize,
    /// Output buffer; in place, the one buffer.
    pub output: *mut u8,
    /// Its length in bytes.
    pub output_len: usize,
    /// Whether input and output are one buffer (`output`).
    pub in_place: bool,
    /// Where the buffers are: host memory, or device memory (the addresses are then device
    /// addresses, never dereferenced on the host; see [`DeviceArena`]).
    pub space: MemSpace,
}

impl Memory {
    /// Host buffers.
    pub(crate) fn host(input: Option<&[u8]>, output: &mut [u8]) -> Memory {
        Memory {
            input: input.map_or(output.as_ptr(), <[u8]>::as_ptr),
            input_len: input.map_or(0, <[u8]>::len),
            output: output.as_mut_ptr(),
            output_len: output.len(),
            in_place: input.is_none(),
            space: MemSpace::Host,
        }
    }
}

/// One rank's state for running schedules.
#[derive(Debug)]
pub(crate) struct Engine {
    pub rank: usize,
    pub nranks: usize,
    /// Connection to each peer (None for self).
    pub conns: Vec<Option<Conn>>,
    pub wait: WaitPolicy,
    pub abort: Arc<AtomicBool>,
    /// The doorbell shared-memory peers ring (None without shared-memory connections).
    bell: Option<Arc<dyn Doorbell>>,
    /// Bytes of the largest message an algorithm may put in one step.
    pub slice_bytes: usize,
    scratch: Vec<u8>,
    /// A scaled copy of the input, for pre-multiplied sums.
    premul: Vec<u8>,
    staging: Vec<Vec<u8>>,
    plans: HashMap<(CollArgs, usize), Arc<Schedule>>,
    /// Picks the algorithm of each call.
    tuning: Tuning,
    /// Sequence numbers of point-to-point messages per peer, each direction.
    pub p2p_sent: Vec<u64>,
    pub p2p_recvd: Vec<u64>,
    /// The last collective's sequence number (collectives count from 1).
    seq: u64,
    /// Descriptor lists for sleeping in poll(2), kept between steps.
    waits: WaitBuffers,
    /// Per peer: a send was left half-way, so nothing more may be written on the connection.
    tx_dirty: Vec<bool>,
    /// Per peer: a receive was left half-way, so the next bytes read are not a header.
    rx_dirty: Vec<bool>,
    /// Runs every element-wise step (reductions, pre-multiplied scaling, copies).
    reducer: Arc<dyn Reducer>,
    /// A step's resolved ops; empty between calls (the storage is kept).
    raw: RawOps,
    /// Progress of each op of the running step; the storage is kept between steps.
    states: Vec<OpState>,
    /// Registered regions per connection (transports whose properties ask for registration).
    regs: RegCache,
    /// Whether any connection is one-sided (receives are posted before each step).
    one_sided: bool,
    /// The timeline of this rank's collectives (`FERRO_TRACE_FILE`), when asked for.
    trace: Option<Box<crate::trace::Tracer>>,
    /// Tiny allreduces through the connections' small-message lanes.
    lanes: lane::Lanes,
    /// Collectives straight between the buffers of ranks of one process (`peer`).
    peer: peer::Peer,
}

/// The doorbell to sleep on: one wakes this rank only when every doorbell-driven connection
/// rings the same one (handles compared by [`Doorbell::identity`]); with several (transports of
/// different kinds), `None`, and sleeps are short polls.
fn common_doorbell(
    mut bells: impl Iterator<Item = Arc<dyn Doorbell>>,
) -> Option<Arc<dyn Doorbell>> {
    let first = bells.next()?;
    let id = first.identity();
    bells.all(|b| b.identity() == id).then_some(first)
}

/// Storage for a step's resolved ops, reused from call to call.
#[derive(Debug, Default)]
struct RawOps(Vec<RawOp>);

// SAFETY: the pointers in a `RawOp` point into buffers that the caller of `run_collective`
// holds for the call, and the ops are only used by the thread running that call (which holds
// the engine mutably). `run_collective` clears the vector before returning, so a moved engine
// carries no pointer to another thread; only the allocation travels.
unsafe impl Send for RawOps {}

impl Engine {
    pub(crate) fn new(
        rank: usize,
        nranks: usize,
        conns: Vec<Option<Conn>>,
        wait: WaitPolicy,
        abort: Arc<AtomicBool>,
        slice_bytes: usize,
        tuning: Tuning,
    ) -> Engine {
        let bell = common_doorbell(conns.iter().flatten().filter_map(Conn::doorbell));
        let one_sided = conns.iter().flatten().any(|c| c.props.one_sided);
        // Room for every connection's descriptors in both directions, counted once here.
        let mut fds = Vec::new();
        for c in conns.iter().flatten() {
            c.poll_fds(true, true, &mut fds);
        }
        Engine {
            rank,
            nranks,
            bell,
            conns,
            wait,
            abort,
            slice_bytes: slice_bytes.max(64),
            scratch: Vec::new(),
            premul: Vec::new(),
            staging: Vec::new(),
            plans: HashMap::new(),
            tuning,
            p2p_sent: vec![0; nranks],
            p2p_recvd: vec![0; nranks],
            seq: 0,
            waits: WaitBuffers::with_capacity(2 * fds.len().max(1)),
            tx_dirty: vec![false; nranks],
            rx_dirty: vec![false; nranks],
            reducer: Arc::new(HostReducer),
            raw: RawOps::default(),
            states: Vec::new(),
            regs: RegCache::new(REG_CACHE_ENTRIES),
            one_sided,
            trace: crate::trace::Tracer::from_env(rank),
            lanes: lane::Lanes::default(),
            peer: peer::Peer::default(),
        }
    }

    /// Lets allreduces of at most `bytes` run through the small-message lanes (a limit every
    /// rank agreed on at setup; 0: none).
    pub(crate) fn set_lane_bytes(&mut self, bytes: usize) {
        self.lanes.bytes = bytes;
        if bytes > 0 {
            self.lanes.reserve();
        }
        // A lane exchange that sleeps lists the awaited peers here; room for all of them now.
        self.raw.0.reserve(self.nranks);
        self.states.reserve(self.nranks);
    }

    /// The largest allreduce that runs through the small-message lanes (0: none).
    pub(crate) fn lane_bytes(&self) -> usize {
        self.lanes.bytes
    }

    /// The engine's empty op list, to fill with one step's ops (send/recv groups); hand it
    /// back with [`Engine::return_ops`] so that its storage serves the next call.
    pub(crate) fn take_ops(&mut self) -> Vec<RawOp> {
        std::mem::take(&mut self.raw.0)
    }

    /// Returns the list of [`Engine::take_ops`], emptied.
    pub(crate) fn return_ops(&mut self, mut ops: Vec<RawOp>) {
        ops.clear();
        self.raw.0 = ops;
    }

    /// The reducer that runs this engine's element-wise steps.
    pub(crate) fn reducer(&self) -> &dyn Reducer {
        &*self.reducer
    }

    /// The reducer, shared (to use it without holding the engine).
    pub(crate) fn shared_reducer(&self) -> Arc<dyn Reducer> {
        Arc::clone(&self.reducer)
    }

    /// Tells every peer why this rank is failing, where the connection allows it, in at most
    /// [`NOTICE_BUDGET`] (never blocking on a peer that does not read): a failure notice names
    /// the rank where the failure began (`e`'s origin, or the peer whose connection broke, or
    /// this rank) and carries its reason, so that peers report the first cause rather than
    /// this rank closing. Call [`Engine::shutdown_all`] after it.
    pub(crate) fn notify_failure(&mut self, e: &ferroccl_transport::Error, seq: u64) {
        // A failed communicator's end waits only briefly for shares through windows, which
        // may wait for a rank that is gone (`windows.rs`).
        self.windows_failed();
        let (origin, why) = match (e.origin(), e.peer()) {
            (Some((o, why)), _) => (o, why.to_string()),
            (None, Some(p)) if e.kind() == ferroccl_transport::ErrorKind::Remote => {
                (p, e.message().to_string())
            }
            _ => (self.rank, e.message().to_string()),
        };
        let mut end = why.len().min(step::NOTICE_MAX);
        while !why.is_char_boundary(end) {
            end -= 1;
        }
        let why = &why.as_bytes()[..end];
        let header = Header {
            kind: kind::NOTICE,
            dtype: 0,
            op: crate::wire::op::NONE,
            seq,
            count: 0,
            root: u32::try_from(origin).unwrap_or(u32::MAX),
            len: why.len() as u64,
        };
        let until = std::time::Instant::now() + NOTICE_BUDGET;
        for (p, c) in self.conns.iter_mut().enumerate() {
            let Some(c) = c else { continue };
            if self.tx_dirty[p] || p == origin {
                continue;
            }
            let mut progress = Progress::default();
            loop {
                match c.send(&header, Payload::Host(why), &mut progress) {
                    Ok(false) if std::time::Instant::now() < until => std::thread::yield_now(),
                    _ => break,
                }
            }
            if !progress.done() {
                self.tx_dirty[p] = true;
            }
        }
    }

    /// `e`, a lost connection to a peer, with the failure notice that peer sent before it
    /// closed, where one waits unread on the connection (a peer tells every rank why it fails,
    /// but a rank reads a connection only when its schedule receives there, and the peer's
    /// store entry may be gone with it): the error then names the rank where the failure
    /// began. Polls for at most [`NOTICE_LATE`].
    pub(crate) fn with_pending_notice(
        &mut self,
        e: ferroccl_transport::Error,
    ) -> ferroccl_transport::Error {
        let Some(peer) = e.peer() else {
            return e;
        };
        if e.kind() != ferroccl_transport::ErrorKind::Remote
            || e.origin().is_some()
            || self.rx_dirty.get(peer).copied().unwrap_or(true)
        {
            return e;
        }
        let Some(conn) = self.conns.get_mut(peer).and_then(Option::as_mut) else {
            return e;
        };
        let mut waiter = SysWaiter::new(self.bell.as_deref(), &mut self.waits);
        match step::pending_notice(conn, &mut waiter, NOTICE_LATE) {
            Some((origin, why)) => {
                let by = if origin == peer {
                    String::new()
                } else {
                    format!(" (passed on by rank {peer})")
                };
                e.append(format!("rank {origin} failed: {why}{by}"))
                    .with_origin(origin, why)
            }
            None => e,
        }
    }

    /// Whether the connection to `peer` reads and writes memory of `space` itself.
    pub(crate) fn accepts(&self, peer: usize, space: ferroccl_transport::MemSpace) -> bool {
        self.conns
            .get(peer)
            .and_then(Option::as_ref)
            .is_some_and(|c| c.props.spaces.accepts(space))
    }

    /// The cost model's link for the connection to `peer`.
    pub(crate) fn link_to(&self, peer: usize) -> Option<crate::plan::Link> {
        self.conns.get(peer)?.as_ref().map(|c| c.props.link)
    }

    /// Registers `mem` with every connection whose transport asks for registration; the
    /// regions keep the registrations alive (none for transports that need none).
    pub(crate) fn register_all(&mut self, mem: MemRef) -> Result<Vec<Region>> {
        let mut regions = Vec::new();
        for c in self.conns.iter_mut().flatten() {
            if let Some(r) = c.register(mem)? {
                regions.push(r);
            }
        }
        Ok(regions)
    }

    /// Closes every connection, so that peers blocked on this rank see it at once.
    pub(crate) fn shutdown_all(&mut self) {
        for c in self.conns.iter_mut().flatten() {
            c.shutdown();
        }
    }

    /// Runs one collective on this rank. `ctx` names it for headers and errors; `op` is the
    /// element-wise reduction for reducing collectives.
    pub(crate) fn run_collective(
        &mut self,
        args: &CollArgs,
        dtype: DataType,
        op: ElemOp,
        premul: Option<f64>,
        mem: Memory,
        ctx: &OpContext,
    ) -> Result<()> {
        self.run_collective_in(args, dtype, op, premul, mem, ctx, None)
    }

    /// [`Engine::run_collective`] on buffers in `mem.space`: buffers in device memory need
    /// `arena` (its reducer runs the element-wise steps, its buffers hold the engine's
    /// scratch), and every connection must carry that space itself.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) fn run_collective_in(
        &mut self,
        args: &CollArgs,
        dtype: DataType,
        op: ElemOp,
        premul: Option<f64>,
        mem: Memory,
        ctx: &OpContext,
        arena: Option<&mut (dyn DeviceArena + 'static)>,
    ) -> Result<()> {
        if self.trace.is_none() {
            return self.collective(args, dtype, op, premul, mem, ctx, arena, None);
        }
        let mut waits = vec![0u64; self.nranks];
        let lane = self.takes_lane(args, dtype.size(), premul, &mem, arena.is_some());
        let start = std::time::Instant::now();
        let peer_calls = self.peer_calls();
        let r = self.collective(args, dtype, op, premul, mem, ctx, arena, Some(&mut waits));
        let end = std::time::Instant::now();
        // The path between the ranks' buffers is offered before the lanes.
        let algorithm = if self.peer_calls() != peer_calls {
            "peer".to_string()
        } else if lane {
            "lane".to_string()
        } else {
            self.algorithm_for(args, dtype.size()).to_string()
        };
        let links: Vec<String> = (0..self.nranks)
            .map(|p| {
                self.link_to(p)
                    .map_or_else(String::new, |l| format!("{l:?}").to_lowercase())
            })
            .collect();
        let bytes = self.whole_count().unwrap_or(args.count) * dtype.size();
        if let Some(t) = self.trace.as_mut() {
            t.record(&crate::trace::Record {
                name: ctx.name,
                seq: ctx.seq,
                bytes,
                algorithm,
                start,
                end,
                wait_ns: &waits,
                links: &links,
            });
        }
        r
    }

    /// Whether a connection's transport carries device memory itself.
    pub(crate) fn carries_device_memory(&self) -> bool {
        self.conns.iter().flatten().any(|c| c.props.spaces.cuda)
    }

    /// A CUDA device other than `n` that a connection's transport is tied to (its receive
    /// slots live there), if any.
    pub(crate) fn other_device(&self, n: u32) -> Option<u32> {
        self.conns
            .iter()
            .flatten()
            .find_map(|c| c.props.spaces.cuda_device.filter(|&d| d != n))
    }

    /// Whether every connection carries `space` itself (device collectives run straight on
    /// device buffers only then).
    pub(crate) fn accepts_all(&self, space: MemSpace) -> bool {
        self.conns
            .iter()
            .flatten()
            .all(|c| c.props.spaces.accepts(space))
    }

    #[allow(clippy::too_many_arguments)]
    fn collective(
        &mut self,
        args: &CollArgs,
        dtype: DataType,
        op: ElemOp,
        premul: Option<f64>,
        mem: Memory,
        ctx: &OpContext,
        mut arena: Option<&mut (dyn DeviceArena + 'static)>,
        waits: Option<&mut [u64]>,
    ) -> Result<()> {
        let es = dtype.size();
        let whole = self.take_whole();
        if self.peer_fits(args) {
            let a = arena.as_deref_mut();
            if self.peer_collective(args, dtype, op, premul, &mem, ctx, a, whole)? {
                return Ok(());
            }
        }
        // Past the path between the buffers, the call reads and writes them from the host's
        // side of the stream: a call ordered on a stream waits for it now.
        if let Some(a) = arena.as_deref_mut() {
            a.settle()?;
        }
        if self.takes_lane(args, es, premul, &mem, arena.is_some()) {
            crate::profile::phase(crate::profile::Phase::Drive);
            // Every rank takes the lane for this call whatever its buffers (the choice depends
            // only on what all agreed); device buffers come over and go back through the arena.
            let r = self.lane_all_reduce(args, dtype, op, &mem, ctx, waits, arena);
            crate::profile::phase(crate::profile::Phase::Leave);
            return r;
        }
        let reducer = match arena.as_deref() {
            Some(a) => a.reducer(),
            None => Arc::clone(&self.reducer),
        };
        if !reducer.serves(mem.space) {
            return Err(Error::internal(format!(
                "{}: the {} reducer cannot reach {} memory",
                ctx.label(),
                reducer.name(),
                mem.space
            )));
        }
        let device = mem.space != MemSpace::Host;
        if device && (arena.is_none() || !self.accepts_all(mem.space)) {
            return Err(Error::internal(format!(
                "{}: {} memory needs a device arena and connections that carry it",
                ctx.label(),
                mem.space
            )));
        }
        let (in_len, _) = args.kind.buffer_lens(args.count, self.nranks);
        let mut mem = mem;
        let mut args = *args;
        if let Some(factor) = premul {
            // Reduce a scaled copy of the input, out of place.
            let in_bytes = in_len * es;
            let (in_off, _) = args.kind.in_place_offsets(args.count, self.rank);
            let (src, avail) = if mem.in_place {
                (mem.output as *const u8, mem.output_len)
            } else {
                (mem.input, mem.input_len)
            };
            let off = if mem.in_place { in_off * es } else { 0 };
            if off + in_bytes > avail {
                return Err(Error::internal(format!(
                    "{}: input of {avail} bytes is too short",
                    ctx.label()
                )));
            }
            let src = src.wrapping_add(off);
            mem.input = match arena.as_deref_mut() {
                Some(a) => {
                    let dst = a.buffer(ArenaUse::PreMul, in_bytes)?.sub(0, in_bytes);
                    let src = MemRef {
                        space: mem.space,
                        addr: src as usize,
                        len: in_bytes,
                    };
                    reducer.scale_into(
                        dtype,
                        PayloadMut::Device(dst),
                        Payload::Device(src),
                        factor,
                    )?;
                    dst.addr as *const u8
                }
                None => {
                    if self.premul.len() < in_bytes {
                        self.premul.resize(in_bytes, 0);
                    }
                    // SAFETY: `src` holds `in_bytes` readable host bytes (checked by the
                    // caller and above), and `premul` is engine-owned memory that no one else
                    // references.
                    let src = unsafe { std::slice::from_raw_parts(src, in_bytes) };
                    reducer.scale_into(
                        dtype,
                        PayloadMut::Host(&mut self.premul[..in_bytes]),
                        Payload::Host(src),
                        factor,
                    )?;
                    self.premul.as_ptr()
                }
            };
            mem.input_len = in_bytes;
            if mem.in_place {
                mem.in_place = false;
                args.in_place = false;
                // In place, the output starts at the output offset inside the one buffer.
                let (_, out_off) = args.kind.in_place_offsets(args.count, self.rank);
                let out_bytes = (out_off * es).min(mem.output_len);
                mem.output = mem.output.wrapping_add(out_bytes);
                mem.output_len -= out_bytes;
            }
        }
        crate::profile::phase(crate::profile::Phase::Plan);
        let sched = self.plan(&args, es);
        crate::profile::phase(crate::profile::Phase::Drive);
        let need = sched.scratch * es;
        let scratch = match arena.as_deref_mut() {
            Some(a) if need > 0 => a.buffer(ArenaUse::Scratch, need)?.addr as *mut u8,
            Some(_) => std::ptr::null_mut(),
            None => {
                if self.scratch.len() < need {
                    self.scratch.resize(need, 0);
                }
                self.scratch.as_mut_ptr()
            }
        };
        let (in_off, out_off) = if args.in_place {
            args.kind.in_place_offsets(args.count, self.rank)
        } else {
            (0, 0)
        };
        let layout = Layout {
            es,
            scratch_len: need,
            in_off,
            out_off,
            mem,
            scratch,
        };
        let mut raw = std::mem::take(&mut self.raw.0);
        let mut run = Run {
            reducer: &*reducer,
            arena,
            dtype,
            op,
            ctx,
        };
        let r = self.run_steps(&sched, &layout, &mut raw, &mut run, waits);
        crate::profile::phase(crate::profile::Phase::Leave);
        raw.clear();
        self.raw.0 = raw;
        r
    }

    /// Runs the steps of `sched` over `layout`, resolving each step's ops into `raw`. With
    /// `waits`, each step's time is added to the peers it received from (or, for a step that
    /// only sends, sent to).
    fn run_steps(
        &mut self,
        sched: &Schedule,
        layout: &Layout,
        raw: &mut Vec<RawOp>,
        run: &mut Run<'_, '_>,
        mut waits: Option<&mut [u64]>,
    ) -> Result<()> {
        let ctx = run.ctx;
        for st in &sched.steps {
            raw.clear();
            let mut stages = 0;
            for o in &st.ops {
                if let Op::Copy { src, dst } = *o {
                    let (s, n) = layout.resolve(&src, ctx)?;
                    let (d, m) = layout.resolve(&dst, ctx)?;
                    debug_assert_eq!(n, m);
                    run.copy(layout.mem.space, s, d, n.min(m))?;
                    continue;
                }
                let mut r = layout.raw_op(o, ctx)?;
                if let RawOp::RecvReduceDevice {
                    peer,
                    ref mut stage,
                    ..
                } = r
                {
                    let lends = self.conns.get(peer).and_then(Option::as_ref);
                    if lends.is_some_and(Conn::lends_device) {
                        // Reduced straight from the transport's memory: no stage.
                        raw.push(r);
                        continue;
                    }
                    // A received slice lands in the arena, then is reduced from there.
                    let a = run.arena.as_deref_mut().ok_or_else(|| {
                        Error::internal(format!("{}: no device arena", ctx.label()))
                    })?;
                    *stage = a
                        .buffer(ArenaUse::Stage(stages), stage.len)?
                        .sub(0, stage.len);
                    stages += 1;
                }
                raw.push(r);
            }
            if raw.is_empty() {
                continue;
            }
            let t = waits.is_some().then(std::time::Instant::now);
            self.run_step_with(raw, run.dtype, run.op, ctx, Some(run.reducer))?;
            if let (Some(w), Some(t)) = (waits.as_deref_mut(), t) {
                let ns = t.elapsed().as_nanos() as u64;
                let receives = raw.iter().any(|o| !o.is_send());
                for o in raw.iter().filter(|o| o.is_send() != receives) {
                    w[o.peer()] += ns;
                }
            }
        }
        Ok(())
    }

    /// The next collective's sequence number. Taken in the collective's turn, so the numbers
    /// follow issue order, as every rank's do.
    pub(crate) fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Checks that every rank runs the rooted operation `ctx` with the same root: a tiny
    /// allreduce of `(root, !root)` under `ctx`'s header, so that a neighbour with another root
    /// fails the header check at once and any disagreement further away shows in the result.
    /// Every rank either learns of a mismatch here or sees a peer that did fail and close.
    pub(crate) fn agree_on_root(&mut self, root: usize, ctx: &OpContext) -> Result<()> {
        if self.nranks < 2 {
            return Ok(());
        }
        let mine = u32::try_from(root).unwrap_or(u32::MAX);
        let mut v = [mine, u32::MAX - mine];
        let args = CollArgs {
            kind: coll::CollKind::AllReduce,
            count: 2,
            in_place: true,
        };
        let mem = Memory::host(None, ferroccl_kernels::as_bytes_mut(&mut v));
        self.unoffered(|e| e.run_collective(&args, DataType::Uint32, ElemOp::Max, None, mem, ctx))?;
        let (highest, lowest) = (v[0], u32::MAX - v[1]);
        if highest != lowest || highest != mine {
            return Err(ferroccl_transport::Error::remote(format!(
                "{}: the ranks disagree on the root: rank {} has root {root}, other ranks have \
                 roots from {lowest} to {highest}",
                ctx.label(),
                self.rank
            )));
        }
        Ok(())
    }

    /// Runs communication ops concurrently until all are done.
    pub(crate) fn run_step(
        &mut self,
        ops: &[RawOp],
        dtype: DataType,
        op: ElemOp,
        ctx: &OpContext,
    ) -> Result<()> {
        self.run_step_with(ops, dtype, op, ctx, None)
    }

    /// [`Engine::run_step`] with received bytes reduced by `reducer` (`None`: the engine's).
    fn run_step_with(
        &mut self,
        ops: &[RawOp],
        dtype: DataType,
        op: ElemOp,
        ctx: &OpContext,
        reducer: Option<&dyn Reducer>,
    ) -> Result<()> {
        let nstage = ops
            .iter()
            .filter(|o| matches!(o, RawOp::RecvReduce { .. }))
            .count();
        if self.staging.len() < nstage {
            self.staging.resize_with(nstage, Vec::new);
        }
        let mut waiter = SysWaiter::new(self.bell.as_deref(), &mut self.waits);
        let env = StepEnv {
            conns: &mut self.conns,
            staging: &mut self.staging,
            states: &mut self.states,
            reducer: reducer.unwrap_or(&*self.reducer),
            wait: self.wait,
            abort: &self.abort,
            tx_dirty: &mut self.tx_dirty,
            rx_dirty: &mut self.rx_dirty,
            regs: self.one_sided.then_some(&mut self.regs),
        };
        step::run(env, &mut waiter, ops, dtype, op, ctx)
    }
}
