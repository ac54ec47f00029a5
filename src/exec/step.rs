//! One step: concurrent sends and receives, driven without blocking until all are done.
//!
//! The driver is a state machine: each pass ([`advance`]) moves what every op may move now
//! (ops to one peer in one direction run in order), checks headers as they arrive, reduces
//! received bytes as they land and reports whether anything moved. It neither reads a clock
//! nor waits: a [`Waiter`] tells the time and spends it when nothing moved (spin, yield,
//! doorbell, poll(2)), so tests run a step on a simulated clock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ferroccl_kernels::{DataType, ElemOp};
use ferroccl_transport::{
    Error, ErrorKind, Header, MemRef, Payload, PayloadMut, Progress, RegCache, Result, MAX_PARTS,
};

use super::reducing::{reduce_piece, reduce_range, With};
use super::wait::{Waiter, Waiting};
use super::{Conn, WaitPolicy};
use crate::profile::{self, Phase};
use crate::reduce::Reducer;
use crate::wire::{kind, op as op_code};

/// What an operation is, for headers and error messages.
#[derive(Debug, Clone)]
pub(crate) struct OpContext {
    /// Operation name (`all_reduce`, `send`, ...).
    pub name: &'static str,
    /// Sequence number (collectives count from 1 per communicator).
    pub seq: u64,
    /// This rank.
    pub rank: usize,
    /// Header kind.
    pub kind: u8,
    /// Element type.
    pub dtype: DataType,
    /// Reduction code ([`crate::wire::op`]); [`crate::wire::op::NONE`] when none.
    pub op: u8,
    /// Element count as the caller gave it.
    pub count: u64,
    /// Root, or `u32::MAX`.
    pub root: u32,
}

impl OpContext {
    /// `all_reduce #17 on rank 0`
    pub fn label(&self) -> String {
        format!("{} #{} on rank {}", self.name, self.seq, self.rank)
    }

    /// The header of a message of `len` bytes of this operation.
    pub fn header(&self, len: usize) -> Header {
        Header {
            kind: self.kind,
            dtype: self.dtype as u8,
            op: self.op,
            seq: self.seq,
            count: self.count,
            root: self.root,
            len: len as u64,
        }
    }
}

/// A communication op with its memory resolved.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RawOp {
    /// Send `len` bytes at `ptr`.
    Send {
        peer: usize,
        ptr: *const u8,
        len: usize,
        header: Header,
    },
    /// Receive `len` bytes into `ptr`.
    Recv {
        peer: usize,
        ptr: *mut u8,
        len: usize,
        header: Header,
    },
    /// Send the bytes of `mem`, memory the CPU may not read (device memory), through a
    /// transport whose spaces include `mem.space`.
    SendDevice {
        peer: usize,
        mem: MemRef,
        header: Header,
    },
    /// Receive into `mem` (device memory), through a transport whose spaces include its space.
    RecvDevice {
        peer: usize,
        mem: MemRef,
        header: Header,
    },
    /// Receive `src.len` bytes into `stage` and store `src (op) incoming` at `dst`, all in
    /// device memory (`src` may equal `dst`), through a transport whose spaces include it.
    RecvReduceDevice {
        peer: usize,
        src: MemRef,
        dst: MemRef,
        stage: MemRef,
        header: Header,
    },
    /// Receive `len` bytes and store `src (op) incoming` at `dst` (`src` may equal `dst`).
    RecvReduce {
        peer: usize,
        src: *const u8,
        dst: *mut u8,
        len: usize,
        header: Header,
    },
}

impl RawOp {
    pub(crate) fn peer(&self) -> usize {
        match *self {
            RawOp::Send { peer, .. }
            | RawOp::Recv { peer, .. }
            | RawOp::SendDevice { peer, .. }
            | RawOp::RecvDevice { peer, .. }
            | RawOp::RecvReduceDevice { peer, .. }
            | RawOp::RecvReduce { peer, .. } => peer,
        }
    }

    pub(crate) fn is_send(&self) -> bool {
        matches!(self, RawOp::Send { .. } | RawOp::SendDevice { .. })
    }

    fn len(&self) -> usize {
        match *self {
            RawOp::Send { len, .. } | RawOp::Recv { len, .. } | RawOp::RecvReduce { len, .. } => {
                len
            }
            RawOp::SendDevice { mem, .. } | RawOp::RecvDevice { mem, .. } => mem.len,
            RawOp::RecvReduceDevice { src, .. } => src.len,
        }
    }
}

/// Where one op of a step stands.
#[derive(Debug, Default)]
pub(crate) struct OpState {
    progress: Progress,
    header: Header,
    done: bool,
    /// RecvReduce: bytes of each part already reduced into `dst`.
    reduced: [usize; MAX_PARTS],
    /// RecvReduce: which staging buffer.
    stage: usize,
    /// The op before this one on the same peer and direction, which must finish first.
    after: Option<usize>,
}

impl OpState {
    /// Whether the op has finished.
    pub(crate) fn is_done(&self) -> bool {
        self.done
    }

    /// Calls `reduce(from, to)` on the received bytes of a receive-reduce not yet reduced:
    /// whole elements of `es` bytes, at least `batch` bytes at once unless a part is complete.
    fn reduce_landed(
        &mut self,
        es: usize,
        batch: usize,
        mut reduce: impl FnMut(usize, usize) -> Result<()>,
    ) -> Result<()> {
        for (j, part) in self.progress.parts().iter().enumerate() {
            let from = self.reduced[j].max(part.start);
            let avail = part.pos - part.pos % es;
            if avail > from && (avail - from >= batch || part.pos == part.end) {
                reduce(from, avail)?;
                self.reduced[j] = avail;
            }
        }
        Ok(())
    }
}

fn dtype_name(code: u8) -> String {
    DataType::from_nccl(i64::from(code))
        .map(|d| d.to_string())
        .unwrap_or_else(|| format!("dtype {code}"))
}

/// Compares a received header with the one this rank expects.
pub(super) fn check_header(
    ctx: &OpContext,
    peer: usize,
    got: &Header,
    want: &Header,
) -> Result<()> {
    if got == want {
        return Ok(());
    }
    let me = ctx.rank;
    let what = if got.kind != want.kind || got.seq != want.seq {
        format!(
            "rank {peer} is in {} #{}, rank {me} in {} #{}",
            kind::name(got.kind),
            got.seq,
            kind::name(want.kind),
            want.seq
        )
    } else if got.dtype != want.dtype || got.count != want.count {
        format!(
            "rank {peer} sent {} x {}, rank {me} expected {} x {}",
            got.count,
            dtype_name(got.dtype),
            want.count,
            dtype_name(want.dtype)
        )
    } else if got.op != want.op {
        format!(
            "rank {peer} reduces with {}, rank {me} with {}",
            op_code::name(got.op),
            op_code::name(want.op)
        )
    } else if got.root != want.root {
        format!(
            "rank {peer} has root {}, rank {me} has root {}",
            got.root, want.root
        )
    } else {
        format!(
            "rank {peer} sent {} bytes, rank {me} expected {} bytes",
            got.len, want.len
        )
    };
    Err(Error::remote(format!("{}: {what}", ctx.label())))
}

fn conn_of<'a>(
    conns: &'a mut [Option<Conn>],
    peer: usize,
    ctx: &OpContext,
) -> Result<&'a mut Conn> {
    conns
        .get_mut(peer)
        .and_then(Option::as_mut)
        .ok_or_else(|| Error::internal(format!("{}: no connection to rank {peer}", ctx.label())))
}

/// Fewest landed bytes a receive-reduce on device memory reduces at once (besides a part's
/// last bytes): a device reduction is a kernel launch and a wait, some microseconds each.
const DEVICE_REDUCE_BATCH: usize = 1 << 20;

/// What a step borrows from its engine.
pub(crate) struct StepEnv<'a> {
    /// Connection to each peer (None for self).
    pub conns: &'a mut [Option<Conn>],
    /// One buffer per receive-reduce op of the step (grown to its length here).
    pub staging: &'a mut [Vec<u8>],
    /// Per-op state, reused from step to step.
    pub states: &'a mut Vec<OpState>,
    /// Runs the reductions of received bytes.
    pub reducer: &'a dyn Reducer,
    pub wait: WaitPolicy,
    pub abort: &'a AtomicBool,
    /// Per peer: set when a send is left half-way (see [`run`]).
    pub tx_dirty: &'a mut [bool],
    /// Per peer: a receive was left half-way (set here when the step fails).
    pub rx_dirty: &'a mut [bool],
    /// Registered regions, per connection; `None` when no connection is one-sided (nothing
    /// is posted or registered then).
    pub regs: Option<&'a mut RegCache>,
}

/// Tells one-sided transports where each receive of the step will land, in op order per peer
/// (registering the destination first where the transport needs it), before any header comes.
fn post_receives(
    conns: &mut [Option<Conn>],
    staging: &[Vec<u8>],
    regs: &mut RegCache,
    ops: &[RawOp],
    st: &[OpState],
    ctx: &OpContext,
) -> Result<()> {
    for (o, s) in ops.iter().zip(st) {
        let dst = match *o {
            RawOp::Send { .. } | RawOp::SendDevice { .. } => continue,
            RawOp::Recv { ptr, len, .. } => MemRef::host(ptr, len),
            RawOp::RecvDevice { mem, .. } => mem,
            RawOp::RecvReduceDevice { stage, .. } => stage,
            RawOp::RecvReduce { len, .. } => MemRef::host(staging[s.stage].as_ptr(), len),
        };
        let peer = o.peer();
        let conn = conn_of(conns, peer, ctx)?;
        if !conn.props.one_sided {
            continue;
        }
        let label = |e: Error| e.context(ctx.label());
        if conn.props.registration && regs.get(peer, &dst).is_none() {
            if let Some(region) = conn.register(dst).map_err(label)? {
                regs.insert(peer, region);
            }
        }
        conn.post_recv(dst, regs.get(peer, &dst)).map_err(label)?;
    }
    Ok(())
}

/// Drives `ops` to completion. Ops to the same peer in the same direction run in order.
pub(crate) fn run<W: Waiter>(
    env: StepEnv<'_>,
    waiter: &mut W,
    ops: &[RawOp],
    dtype: DataType,
    op: ElemOp,
    ctx: &OpContext,
) -> Result<()> {
    let StepEnv {
        conns,
        staging,
        states,
        reducer,
        wait,
        abort,
        tx_dirty,
        rx_dirty,
        mut regs,
    } = env;
    states.clear();
    states.resize_with(ops.len(), OpState::default);
    let st = &mut states[..];
    let mut nstage = 0;
    for (i, o) in ops.iter().enumerate() {
        // Found once per step, not on every pass: a message cut into many pieces is many ops
        // on one channel, one after another.
        st[i].after = ops[..i]
            .iter()
            .rposition(|e| e.peer() == o.peer() && e.is_send() == o.is_send());
        if let RawOp::RecvReduce { len, .. } = *o {
            st[i].stage = nstage;
            if staging[nstage].len() < len {
                // The old buffer goes away: so do its registrations.
                if let Some(regs) = regs.as_deref_mut() {
                    let old = &staging[nstage];
                    regs.forget(&MemRef::host(old.as_ptr(), old.capacity()));
                }
                staging[nstage].resize(len, 0);
            }
            nstage += 1;
        }
    }
    if let Some(regs) = regs {
        post_receives(conns, staging, regs, ops, st, ctx)?;
    }
    let mut pass = Pass {
        conns,
        staging,
        reducer,
        ops,
        dtype,
        op,
        ctx,
    };
    let r = drive(&mut pass, st, waiter, &wait, abort);
    if r.is_err() {
        // A send left half-way leaves its connection mid-message: nothing more may be written
        // on it (a failure notice there would land inside the payload).
        // A receive left half-way: the next bytes from that peer are not a header.
        for (o, s) in ops.iter().zip(st.iter()) {
            if !s.done && s.progress.header_pos > 0 {
                let dirty = if o.is_send() {
                    &mut *tx_dirty
                } else {
                    &mut *rx_dirty
                };
                if let Some(d) = dirty.get_mut(o.peer()) {
                    *d = true;
                }
            }
        }
    }
    r
}

/// Everything one pass over a step's ops reads or writes, besides the ops' states.
struct Pass<'a, 'b> {
    conns: &'b mut [Option<Conn>],
    staging: &'b mut [Vec<u8>],
    reducer: &'a dyn Reducer,
    ops: &'b [RawOp],
    dtype: DataType,
    op: ElemOp,
    ctx: &'b OpContext,
}

/// What a pass over the ops found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Moved {
    /// Every op is done.
    AllDone,
    /// Some op moved bytes or finished.
    Some,
    /// Nothing moved.
    Nothing,
}

/// Runs passes until the step is done, asking `waiter` for the time and to wait whenever a
/// pass moved nothing. No progress for `wait.timeout` is an error naming the awaited peers.
fn drive<W: Waiter>(
    pass: &mut Pass<'_, '_>,
    st: &mut [OpState],
    waiter: &mut W,
    wait: &WaitPolicy,
    abort: &AtomicBool,
) -> Result<()> {
    let mut last_progress = waiter.now();
    let mut idle_since = None;
    loop {
        // Before checking the connections: a change made after this point wakes the waiter.
        waiter.arm();
        let moved = advance(pass, st, waiter)?;
        if moved != Moved::Nothing {
            if let Some(idle) = idle_since.take() {
                profile::wait_end();
                let now = waiter.now();
                waiter.resumed(now.duration_since(idle));
            }
        }
        match moved {
            Moved::AllDone => return Ok(()),
            Moved::Some => {
                last_progress = waiter.now();
                continue;
            }
            Moved::Nothing => {}
        }
        if abort.load(Ordering::Relaxed) {
            return Err(Error::new(
                ErrorKind::Aborted,
                format!("{}: the communicator was aborted", pass.ctx.label()),
            ));
        }
        let now = waiter.now();
        let idle = *idle_since.get_or_insert_with(|| {
            profile::wait_begin();
            now
        });
        let idle_for = now.duration_since(idle);
        if idle_for < wait.spin {
            waiter.pause(idle_for);
            continue;
        }
        let quiet = now.duration_since(last_progress);
        if quiet >= wait.timeout {
            return Err(timeout_error(pass, st, wait.timeout));
        }
        let waiting = Waiting {
            conns: pass.conns,
            ops: pass.ops,
            st,
        };
        waiter.sleep(&waiting, wait.timeout.saturating_sub(quiet).min(MAX_SLEEP));
    }
}

/// One pass over the ops: moves what each may move now, checks headers as they arrive and
/// reduces received bytes as they land. Reads no clock and never waits (`waiter` only serves a
/// failure notice's tail, on the way to an error).
fn advance<W: Waiter>(
    pass: &mut Pass<'_, '_>,
    st: &mut [OpState],
    waiter: &mut W,
) -> Result<Moved> {
    let (ops, ctx) = (pass.ops, pass.ctx);
    let es = pass.dtype.size();
    let mut moved = false;
    let mut all_done = true;
    for i in 0..ops.len() {
        if st[i].done {
            continue;
        }
        all_done = false;
        // FIFO per peer and direction: wait for the earlier op on the same channel (ops of a
        // channel finish in order, so the one just before is the last to finish).
        let o = ops[i];
        if st[i].after.is_some_and(|p| !st[p].done) {
            continue;
        }
        let s = &mut st[i];
        let before = s.progress.header_pos + s.progress.moved() + usize::from(s.progress.started);
        let conn = conn_of(pass.conns, o.peer(), ctx)?;
        let done = match o {
            RawOp::Send {
                ptr, len, header, ..
            } => {
                // SAFETY: the communicator checked that `ptr..ptr+len` is readable for the
                // whole call, and no op of this step writes it (schedules are checked for that).
                let payload = unsafe { std::slice::from_raw_parts(ptr, len) };
                profile::phase(Phase::Send);
                let r = conn.send(&header, Payload::Host(payload), &mut s.progress);
                profile::phase(Phase::Drive);
                r
            }
            RawOp::Recv {
                ptr, len, header, ..
            } => {
                // SAFETY: the communicator checked that `ptr..ptr+len` is writable for the
                // whole call, and no other op of this step touches it.
                let payload = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
                profile::phase(Phase::Recv);
                let r = conn.recv(&mut s.header, PayloadMut::Host(payload), &mut s.progress);
                profile::phase(Phase::Drive);
                arrived(&r, conn, s, o.peer(), &header, ctx, waiter)?;
                r
            }
            RawOp::SendDevice { mem, header, .. } => {
                profile::phase(Phase::Send);
                let r = conn.send(&header, Payload::Device(mem), &mut s.progress);
                profile::phase(Phase::Drive);
                r
            }
            RawOp::RecvDevice { mem, header, .. } => {
                profile::phase(Phase::Recv);
                let r = conn.recv(&mut s.header, PayloadMut::Device(mem), &mut s.progress);
                profile::phase(Phase::Drive);
                arrived(&r, conn, s, o.peer(), &header, ctx, waiter)?;
                r
            }
            RawOp::RecvReduceDevice {
                src, dst, header, ..
            } if conn.lends_device() => {
                // Reduced straight from the transport's memory: no copy into a stage.
                let w = With {
                    reducer: pass.reducer,
                    dtype: pass.dtype,
                    op: pass.op,
                };
                profile::phase(Phase::Recv);
                let r = conn.recv_lent_device(
                    &mut s.header,
                    src.len,
                    &mut s.progress,
                    &mut |from, piece| reduce_piece(w, src, dst, from, piece, true),
                );
                profile::phase(Phase::Drive);
                arrived(&r, conn, s, o.peer(), &header, ctx, waiter)?;
                r
            }
            RawOp::RecvReduceDevice {
                src,
                dst,
                stage,
                header,
                ..
            } => {
                profile::phase(Phase::Recv);
                let r = conn.recv(&mut s.header, PayloadMut::Device(stage), &mut s.progress);
                profile::phase(Phase::Drive);
                arrived(&r, conn, s, o.peer(), &header, ctx, waiter)?;
                if r.is_ok() && s.progress.started {
                    // In batches: each device reduction is a kernel launch, worth it only for
                    // enough bytes.
                    s.reduce_landed(es, DEVICE_REDUCE_BATCH, |from, to| {
                        let piece = Payload::Device(stage.sub(from, to - from));
                        let w = With {
                            reducer: pass.reducer,
                            dtype: pass.dtype,
                            op: pass.op,
                        };
                        reduce_piece(w, src, dst, from, piece, false)
                            .map(drop)
                            .map_err(|e| e.context(ctx.label()))
                    })?;
                }
                r
            }
            RawOp::RecvReduce {
                src,
                dst,
                len,
                header,
                ..
            } if conn.lends() => {
                // Reduced straight from the transport's memory: no copy into staging.
                let (reducer, dtype, op) = (pass.reducer, pass.dtype, pass.op);
                profile::phase(Phase::Recv);
                let r = conn.recv_lent(
                    &mut s.header,
                    len,
                    es,
                    &mut s.progress,
                    &mut |from, bytes| reduce_range(reducer, dtype, op, src, dst, bytes, from),
                );
                profile::phase(Phase::Drive);
                arrived(&r, conn, s, o.peer(), &header, ctx, waiter)?;
                r
            }
            RawOp::RecvReduce {
                src,
                dst,
                len,
                header,
                ..
            } => {
                let stage = &mut pass.staging[s.stage][..len];
                profile::phase(Phase::Recv);
                let r = conn.recv(
                    &mut s.header,
                    PayloadMut::Host(&mut *stage),
                    &mut s.progress,
                );
                profile::phase(Phase::Drive);
                arrived(&r, conn, s, o.peer(), &header, ctx, waiter)?;
                if r.is_ok() && s.progress.started {
                    let (reducer, dtype, op) = (pass.reducer, pass.dtype, pass.op);
                    s.reduce_landed(es, 0, |from, to| {
                        reduce_range(reducer, dtype, op, src, dst, &stage[from..to], from)
                            .map_err(|e| e.context(ctx.label()))
                    })?;
                }
                r
            }
        }
        .map_err(|e| e.context(ctx.label()))?;
        let after = s.progress.header_pos + s.progress.moved() + usize::from(s.progress.started);
        if after != before || done {
            moved = true;
        }
        if done {
            s.done = true;
        }
    }
    Ok(if all_done {
        Moved::AllDone
    } else if moved {
        Moved::Some
    } else {
        Moved::Nothing
    })
}

/// After a receive call: a header that has just arrived is a failure notice (read, and the
/// step fails with its reason) or is checked against `want`.
fn arrived<W: Waiter>(
    r: &Result<bool>,
    conn: &mut Conn,
    s: &mut OpState,
    peer: usize,
    want: &Header,
    ctx: &OpContext,
    waiter: &mut W,
) -> Result<()> {
    if r.is_ok() && s.progress.header_done() && !s.progress.started {
        if s.header.kind == kind::NOTICE {
            return Err(read_notice(conn, s, peer, ctx, waiter));
        }
        check_header(ctx, peer, &s.header, want)?;
    }
    Ok(())
}

/// The longest reason a failure notice carries, in bytes.
pub(crate) const NOTICE_MAX: usize = 2048;
/// How long a rank reads the rest of a failure notice whose header has arrived.
const NOTICE_READ: Duration = Duration::from_millis(200);

/// The error for a failure notice from `peer` whose header `s` has just read: the notice names
/// the rank where the failure began and carries that rank's reason.
fn read_notice<W: Waiter>(
    conn: &mut Conn,
    s: &mut OpState,
    peer: usize,
    ctx: &OpContext,
    waiter: &mut W,
) -> Error {
    let (origin, why) = notice_body(conn, s, waiter);
    let by = if origin == peer {
        String::new()
    } else {
        format!(" (passed on by rank {peer})")
    };
    Error::remote(format!("{}: rank {origin} failed: {why}{by}", ctx.label()))
        .with_peer(peer)
        .with_origin(origin, why)
}

/// A failure notice that `conn` holds unread, where its incoming direction stands between
/// messages (no receive was left half-way): `(origin, reason)`. Polls for at most `budget`;
/// `None` when nothing arrives or the next message is not a notice (its header is consumed:
/// only for a connection that is failing anyway).
pub(crate) fn pending_notice<W: Waiter>(
    conn: &mut Conn,
    waiter: &mut W,
    budget: Duration,
) -> Option<(usize, String)> {
    let mut s = OpState::default();
    let until = waiter.now() + budget;
    loop {
        match conn.recv(&mut s.header, PayloadMut::Host(&mut []), &mut s.progress) {
            Ok(_) if s.progress.header_done() => break,
            Ok(_) if waiter.now() < until => waiter.pause(Duration::MAX),
            _ => return None,
        }
    }
    (s.header.kind == kind::NOTICE).then(|| notice_body(conn, &mut s, waiter))
}

/// The origin and reason of the failure notice whose header `s` has just read (its reason
/// read within [`NOTICE_READ`]).
fn notice_body<W: Waiter>(conn: &mut Conn, s: &mut OpState, waiter: &mut W) -> (usize, String) {
    let origin = s.header.root as usize;
    let len = usize::try_from(s.header.len).unwrap_or(usize::MAX);
    let mut buf = [0u8; NOTICE_MAX];
    let mut why = None;
    if len <= NOTICE_MAX {
        let until = waiter.now() + NOTICE_READ;
        loop {
            match conn.recv(
                &mut s.header,
                PayloadMut::Host(&mut buf[..len]),
                &mut s.progress,
            ) {
                Ok(true) => {
                    why = Some(String::from_utf8_lossy(&buf[..len]).into_owned());
                    break;
                }
                Ok(false) if waiter.now() < until => waiter.pause(Duration::MAX),
                _ => break,
            }
        }
    }
    (
        origin,
        why.unwrap_or_else(|| "its reason did not arrive".to_string()),
    )
}

/// Longest single sleep (the abort flag and peers' liveness are checked between sleeps).
pub(crate) const MAX_SLEEP: Duration = Duration::from_millis(100);

fn timeout_error(pass: &Pass<'_, '_>, st: &[OpState], timeout: Duration) -> Error {
    let waiting: Vec<String> = pass
        .ops
        .iter()
        .zip(st)
        .filter(|(_, s)| !s.done)
        .map(|(o, s)| {
            let who = pass
                .conns
                .get(o.peer())
                .and_then(Option::as_ref)
                .map(|c| c.peer().to_string())
                .unwrap_or_else(|| format!("rank {}", o.peer()));
            let dir = if o.is_send() {
                "sending to"
            } else {
                "receiving from"
            };
            format!(
                "{dir} {who} ({} of {} bytes moved)",
                s.progress.moved(),
                o.len()
            )
        })
        .collect();
    Error::timeout(format!(
        "{}: no progress for {:.1} s while {} (FERRO_TIMEOUT sets the limit)",
        pass.ctx.label(),
        timeout.as_secs_f64(),
        waiting.join(", ")
    ))
}
