//! One step: concurrent sends and receives, driven without blocking until all are done.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ferroccl_kernels::{DataType, ElemOp};
use ferroccl_transport::{
    Doorbell, Error, ErrorKind, Header, Payload, PayloadMut, PollFd, Progress, Result, MAX_PARTS,
};

use super::{Conn, WaitPolicy};

/// Operation kinds as carried in message headers.
pub(crate) mod kind {
    pub const ALL_REDUCE: u8 = 1;
    pub const BROADCAST: u8 = 2;
    pub const REDUCE: u8 = 3;
    pub const ALL_GATHER: u8 = 4;
    pub const REDUCE_SCATTER: u8 = 5;
    pub const ALL_TO_ALL: u8 = 6;
    pub const SEND_RECV: u8 = 7;
    pub const SPLIT: u8 = 8;
    pub const BARRIER: u8 = 9;
    /// Gather and scatter, built from sends and receives (their root agreement carries it).
    pub const GATHER: u8 = 10;
    pub const SCATTER: u8 = 11;
    /// A failure notice: a failing rank's last message on a connection before it closes it.
    /// `root` names the rank where the failure began; the payload is that rank's reason.
    pub const NOTICE: u8 = 12;

    /// Name of a header kind.
    pub fn name(k: u8) -> &'static str {
        match k {
            ALL_REDUCE => "all_reduce",
            BROADCAST => "broadcast",
            REDUCE => "reduce",
            ALL_GATHER => "all_gather",
            REDUCE_SCATTER => "reduce_scatter",
            ALL_TO_ALL => "all_to_all",
            SEND_RECV => "send/recv",
            SPLIT => "split",
            BARRIER => "barrier",
            GATHER => "gather",
            SCATTER => "scatter",
            NOTICE => "failure notice",
            _ => "unknown operation",
        }
    }
}

/// Names of reduction codes carried in headers.
pub(crate) fn op_name(code: u8) -> &'static str {
    match code {
        0 => "sum",
        1 => "prod",
        2 => "max",
        3 => "min",
        4 => "avg",
        5 => "premulsum",
        _ => "none",
    }
}

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
    /// Reduction code (see [`op_name`]); 0xff when none.
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
    fn peer(&self) -> usize {
        match *self {
            RawOp::Send { peer, .. }
            | RawOp::Recv { peer, .. }
            | RawOp::RecvReduce { peer, .. } => peer,
        }
    }

    fn is_send(&self) -> bool {
        matches!(self, RawOp::Send { .. })
    }

    fn len(&self) -> usize {
        match *self {
            RawOp::Send { len, .. } | RawOp::Recv { len, .. } | RawOp::RecvReduce { len, .. } => {
                len
            }
        }
    }
}

#[derive(Debug, Default)]
struct OpState {
    progress: Progress,
    header: Header,
    done: bool,
    /// RecvReduce: bytes of each part already reduced into `dst`.
    reduced: [usize; MAX_PARTS],
    /// RecvReduce: which staging buffer.
    stage: usize,
}

fn dtype_name(code: u8) -> String {
    DataType::from_nccl(i64::from(code))
        .map(|d| d.to_string())
        .unwrap_or_else(|| format!("dtype {code}"))
}

/// Compares a received header with the one this rank expects.
fn check_header(ctx: &OpContext, peer: usize, got: &Header, want: &Header) -> Result<()> {
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
            op_name(got.op),
            op_name(want.op)
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

/// Drives `ops` to completion. Ops to the same peer in the same direction run in order.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    conns: &mut [Option<Conn>],
    staging: &mut [Vec<u8>],
    pollfds: &mut Vec<PollFd>,
    bell: Option<&dyn Doorbell>,
    wait: &WaitPolicy,
    abort: &AtomicBool,
    ops: &[RawOp],
    dtype: DataType,
    op: ElemOp,
    ctx: &OpContext,
    tx_dirty: &mut [bool],
) -> Result<()> {
    let mut st: Vec<OpState> = (0..ops.len()).map(|_| OpState::default()).collect();
    let mut nstage = 0;
    for (i, o) in ops.iter().enumerate() {
        if let RawOp::RecvReduce { len, .. } = *o {
            st[i].stage = nstage;
            if staging[nstage].len() < len {
                staging[nstage].resize(len, 0);
            }
            nstage += 1;
        }
    }
    let r = drive(
        conns, staging, pollfds, bell, wait, abort, ops, dtype, op, ctx, &mut st,
    );
    if r.is_err() {
        // A send left half-way leaves its connection mid-message: nothing more may be written
        // on it (a failure notice there would land inside the payload).
        for (o, s) in ops.iter().zip(&st) {
            if o.is_send() && !s.done && s.progress.header_pos > 0 {
                if let Some(d) = tx_dirty.get_mut(o.peer()) {
                    *d = true;
                }
            }
        }
    }
    r
}

#[allow(clippy::too_many_arguments)]
fn drive(
    conns: &mut [Option<Conn>],
    staging: &mut [Vec<u8>],
    pollfds: &mut Vec<PollFd>,
    bell: Option<&dyn Doorbell>,
    wait: &WaitPolicy,
    abort: &AtomicBool,
    ops: &[RawOp],
    dtype: DataType,
    op: ElemOp,
    ctx: &OpContext,
    st: &mut [OpState],
) -> Result<()> {
    let es = dtype.size();
    let mut last_progress = Instant::now();
    let mut idle_since: Option<Instant> = None;
    loop {
        // Read before checking the connections: a change made after this read bumps it, and
        // the doorbell wait below then returns at once.
        let seen = bell.map(|b| b.seq());
        let mut moved = false;
        let mut all_done = true;
        for i in 0..ops.len() {
            if st[i].done {
                continue;
            }
            all_done = false;
            // FIFO per peer and direction: wait for earlier ops on the same channel.
            let o = ops[i];
            let blocked = ops[..i]
                .iter()
                .zip(&st[..i])
                .any(|(e, s)| !s.done && e.peer() == o.peer() && e.is_send() == o.is_send());
            if blocked {
                continue;
            }
            let s = &mut st[i];
            let before =
                s.progress.header_pos + s.progress.moved() + usize::from(s.progress.started);
            let conn = conn_of(conns, o.peer(), ctx)?;
            let done = match o {
                RawOp::Send {
                    ptr, len, header, ..
                } => {
                    // SAFETY: the communicator checked that `ptr..ptr+len` is readable for the
                    // whole call, and no op of this step writes it (schedules are checked for that).
                    let payload = unsafe { std::slice::from_raw_parts(ptr, len) };
                    conn.send(&header, Payload::Host(payload), &mut s.progress)
                }
                RawOp::Recv {
                    ptr, len, header, ..
                } => {
                    // SAFETY: the communicator checked that `ptr..ptr+len` is writable for the
                    // whole call, and no other op of this step touches it.
                    let payload = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
                    let r = conn.recv(&mut s.header, PayloadMut::Host(payload), &mut s.progress);
                    if r.is_ok() && s.progress.header_done() && !s.progress.started {
                        if s.header.kind == kind::NOTICE {
                            return Err(read_notice(conn, s, o.peer(), ctx));
                        }
                        check_header(ctx, o.peer(), &s.header, &header)?;
                    }
                    r
                }
                RawOp::RecvReduce {
                    src,
                    dst,
                    len,
                    header,
                    ..
                } => {
                    let stage = &mut staging[s.stage][..len];
                    let r = conn.recv(
                        &mut s.header,
                        PayloadMut::Host(&mut *stage),
                        &mut s.progress,
                    );
                    if r.is_ok() && s.progress.header_done() && !s.progress.started {
                        if s.header.kind == kind::NOTICE {
                            return Err(read_notice(conn, s, o.peer(), ctx));
                        }
                        check_header(ctx, o.peer(), &s.header, &header)?;
                    }
                    if r.is_ok() && s.progress.started {
                        for (j, part) in s.progress.parts().iter().enumerate() {
                            let from = s.reduced[j].max(part.start);
                            let avail = part.pos - part.pos % es;
                            if avail > from {
                                reduce_range(dtype, op, src, dst, &stage[from..avail], from);
                                s.reduced[j] = avail;
                            }
                        }
                    }
                    r
                }
            }
            .map_err(|e| e.context(ctx.label()))?;
            let after =
                s.progress.header_pos + s.progress.moved() + usize::from(s.progress.started);
            if after != before {
                moved = true;
            }
            if done {
                s.done = true;
                moved = true;
            }
        }
        if all_done {
            return Ok(());
        }
        if moved {
            last_progress = Instant::now();
            idle_since = None;
            continue;
        }
        if abort.load(Ordering::Relaxed) {
            return Err(Error::new(
                ErrorKind::Aborted,
                format!("{}: the communicator was aborted", ctx.label()),
            ));
        }
        let now = Instant::now();
        let idle = *idle_since.get_or_insert(now);
        let idle_for = now.duration_since(idle);
        if idle_for < wait.spin {
            if idle_for < PURE_SPIN {
                std::hint::spin_loop();
            } else {
                // Brief spinning catches a peer on another core; beyond that, give the core to
                // a rank that shares it (more ranks than cores) before checking again.
                std::thread::yield_now();
            }
            continue;
        }
        if now.duration_since(last_progress) >= wait.timeout {
            return Err(timeout_error(conns, ops, st, wait.timeout, ctx));
        }
        pollfds.clear();
        let mut on_bell = false;
        for (o, s) in ops.iter().zip(st.iter()) {
            if !s.done {
                if let Some(Some(c)) = conns.get(o.peer()) {
                    on_bell |= c.uses_doorbell();
                    c.poll_fds(o.is_send(), !o.is_send(), pollfds);
                }
            }
        }
        let left = wait
            .timeout
            .saturating_sub(now.duration_since(last_progress))
            .min(MAX_SLEEP);
        match (on_bell, bell, seen) {
            (true, Some(b), Some(seen)) if pollfds.is_empty() => b.wait(seen, left),
            (true, _, _) => sleep_on(pollfds, left.min(MIXED_SLEEP)),
            _ => sleep_on(pollfds, left),
        }
    }
}

/// The longest reason a failure notice carries, in bytes.
pub(crate) const NOTICE_MAX: usize = 2048;
/// How long a rank reads the rest of a failure notice whose header has arrived.
const NOTICE_READ: Duration = Duration::from_millis(200);

/// The error for a failure notice from `peer` whose header `s` has just read: the notice names
/// the rank where the failure began and carries that rank's reason.
fn read_notice(conn: &mut Conn, s: &mut OpState, peer: usize, ctx: &OpContext) -> Error {
    let origin = s.header.root as usize;
    let len = usize::try_from(s.header.len).unwrap_or(usize::MAX);
    let mut buf = [0u8; NOTICE_MAX];
    let mut why = None;
    if len <= NOTICE_MAX {
        let until = Instant::now() + NOTICE_READ;
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
                Ok(false) if Instant::now() < until => std::thread::yield_now(),
                _ => break,
            }
        }
    }
    let why = why.unwrap_or_else(|| "its reason did not arrive".to_string());
    let by = if origin == peer {
        String::new()
    } else {
        format!(" (passed on by rank {peer})")
    };
    Error::remote(format!("{}: rank {origin} failed: {why}{by}", ctx.label()))
        .with_peer(peer)
        .with_origin(origin, why)
}

/// Pure busy-waiting before yielding between checks.
const PURE_SPIN: Duration = Duration::from_micros(10);
/// Longest single sleep (the abort flag and peers' liveness are checked between sleeps).
const MAX_SLEEP: Duration = Duration::from_millis(100);
/// Longest sleep in poll(2) while shared-memory peers, which cannot wake poll, are awaited too.
const MIXED_SLEEP: Duration = Duration::from_millis(1);

fn reduce_range(
    dtype: DataType,
    op: ElemOp,
    src: *const u8,
    dst: *mut u8,
    incoming: &[u8],
    from: usize,
) {
    let n = incoming.len();
    if std::ptr::eq(src, dst) {
        // SAFETY: `dst..dst+len` is writable for the call and used by no other op of the step;
        // `from + n <= len`.
        let d = unsafe { std::slice::from_raw_parts_mut(dst.add(from), n) };
        ferroccl_kernels::reduce_inplace(dtype, op, d, incoming);
    } else {
        // SAFETY: as above; `src` is a different, readable range of the same length that no op
        // of this step writes.
        let (d, s) = unsafe {
            (
                std::slice::from_raw_parts_mut(dst.add(from), n),
                std::slice::from_raw_parts(src.add(from), n),
            )
        };
        ferroccl_kernels::reduce(dtype, op, d, s, incoming);
    }
}

fn timeout_error(
    conns: &[Option<Conn>],
    ops: &[RawOp],
    st: &[OpState],
    timeout: Duration,
    ctx: &OpContext,
) -> Error {
    let waiting: Vec<String> = ops
        .iter()
        .zip(st)
        .filter(|(_, s)| !s.done)
        .map(|(o, s)| {
            let who = conns
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
        ctx.label(),
        timeout.as_secs_f64(),
        waiting.join(", ")
    ))
}

fn sleep_on(fds: &[PollFd], timeout: Duration) {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|f| libc::pollfd {
            fd: f.fd,
            events: (if f.read { libc::POLLIN } else { 0 })
                | (if f.write { libc::POLLOUT } else { 0 }),
            revents: 0,
        })
        .collect();
    let ms = libc::c_int::try_from(timeout.as_millis())
        .unwrap_or(100)
        .max(1);
    // SAFETY: `pfds` is a live array of `pfds.len()` pollfd structs.
    unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
}
