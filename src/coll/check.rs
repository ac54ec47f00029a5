//! The schedule checker: runs the schedules of all ranks symbolically and proves them right.
//!
//! Every element is represented by what it holds: a set of ranks (a `u64` bitmask) and an
//! input index. Rank `r`'s input element `i` starts as `({r}, i)`; a reduction of two values
//! with the same index unions their sets. At the end, element `i` of a reduction's output must
//! hold `(all ranks, i)`, and element `i` of a broadcast, all_gather or all_to_all output the
//! `({source rank}, source index)` it was copied from.
//!
//! [`check_schedules`] verifies, in order:
//!
//! 1. shape: one schedule per rank, with matching `rank` and `nranks`;
//! 2. every span lies inside its buffer (input and output lengths from
//!    [`CollKind::buffer_lens`], scratch from [`Schedule::scratch`]), peers are valid, the two
//!    spans of a copy or a receive-reduce have equal lengths and are either the same memory or
//!    disjoint, and nothing writes a buffer it must not (the input out of place; the output of
//!    a reduce on a rank other than the root);
//! 3. within a step, no communication op writes memory another one reads or writes;
//! 4. the `k`-th send from `a` to `b` and the `k`-th receive at `b` from `a` have the same
//!    length, and every message has both ends;
//! 5. the ranks progress without deadlock when a send completes only together with its
//!    receive (rendezvous), each rank finishing a step once all its communication ops have met
//!    their peers' ops in the peers' current steps;
//! 6. no op reads uninitialized memory, no reduction combines different elements or counts a
//!    rank twice, the outputs hold the expected values (on the root only for reduce) and, out
//!    of place, the inputs are unchanged.
//!
//! In-place calls have one buffer per rank holding input and output at
//! [`CollKind::in_place_offsets`]; spans are compared by the memory they name, not by buffer
//! kind. Ranks other than the root hold no meaningful input in a broadcast: reading it counts
//! as reading uninitialized memory.
//!
//! The symbolic memory takes 16 bytes per element of every buffer of every rank; a
//! [`Checker`] keeps it between calls.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::ops::Range;

use super::{build, AlgoOptions, BufKind, CollArgs, CollKind, Op, Schedule, Span};

/// The most ranks the checker handles (contributions are a `u64` bitmask).
pub const MAX_RANKS: usize = 64;

/// Checks that `args` and `nranks` describe a call the algorithms can build: `1 <= nranks <=`
/// [`MAX_RANKS`] for the checker, a root below `nranks`, and buffer lengths that fit `usize`.
pub fn validate(args: &CollArgs, nranks: usize) -> Result<(), String> {
    let name = args.kind.name();
    if nranks == 0 || nranks > MAX_RANKS {
        return Err(format!(
            "{name}: nranks {nranks} out of range (the checker handles 1..={MAX_RANKS})"
        ));
    }
    if let Some(root) = args.kind.root() {
        if root >= nranks {
            return Err(format!(
                "{name}: invalid root {root} (root must be 0..{})",
                nranks - 1
            ));
        }
    }
    if args.count.checked_mul(nranks).is_none() {
        return Err(format!(
            "{name}: count {} times nranks {nranks} overflows",
            args.count
        ));
    }
    Ok(())
}

/// Builds the schedules of all `nranks` ranks with [`build`] and checks them with
/// [`check_schedules`].
pub fn check(args: &CollArgs, nranks: usize, opts: &AlgoOptions) -> Result<(), String> {
    Checker::new().check(args, nranks, opts)
}

/// Checks explicit schedules (`schedules[r]` for rank `r`) of one collective call; see the
/// module docs for what is verified. The error names the collective, the rank, the step, the
/// op and the offending value.
pub fn check_schedules(
    args: &CollArgs,
    nranks: usize,
    schedules: &[Schedule],
) -> Result<(), String> {
    Checker::new().check_schedules(args, nranks, schedules)
}

/// A checker that keeps its symbolic memory between calls: sweeps over many calls run several
/// times faster than with the free functions, which start from fresh memory each time.
#[derive(Debug, Default)]
pub struct Checker {
    /// The symbolic memory of all ranks, one after another.
    mem: Vec<Val>,
}

impl Checker {
    /// A checker with no memory yet.
    pub fn new() -> Self {
        Checker::default()
    }

    /// Like [`check`].
    pub fn check(
        &mut self,
        args: &CollArgs,
        nranks: usize,
        opts: &AlgoOptions,
    ) -> Result<(), String> {
        validate(args, nranks)?;
        let scheds: Vec<Schedule> = (0..nranks)
            .map(|rank| build(args, rank, nranks, opts))
            .collect();
        self.check_schedules(args, nranks, &scheds)
    }

    /// Like [`check_schedules`].
    pub fn check_schedules(
        &mut self,
        args: &CollArgs,
        nranks: usize,
        schedules: &[Schedule],
    ) -> Result<(), String> {
        let what = describe_call(args, nranks);
        check_inner(&mut self.mem, args, nranks, schedules).map_err(|e| format!("{what}: {e}"))
    }
}

fn check_inner(
    mem: &mut Vec<Val>,
    args: &CollArgs,
    nranks: usize,
    scheds: &[Schedule],
) -> Result<(), String> {
    validate(args, nranks)?;
    if scheds.len() != nranks {
        return Err(format!("{} schedules for {nranks} ranks", scheds.len()));
    }
    for (r, s) in scheds.iter().enumerate() {
        if s.rank != r || s.nranks != nranks {
            return Err(format!(
                "schedule {r} is for rank {} of {} ranks",
                s.rank, s.nranks
            ));
        }
    }
    let mut origin = 0;
    let mut layouts = Vec::with_capacity(nranks);
    for s in scheds {
        let lay = Layout::new(args, s.rank, nranks, s.scratch, origin);
        origin = lay.end();
        check_ops(args, nranks, s, &lay)?;
        layouts.push(lay);
    }
    let partners = match_messages(nranks, scheds)?;
    let mut sim = Sim::new(mem, args, nranks, scheds, &layouts, partners);
    sim.run()?;
    sim.check_results()
}

/// `all_reduce(count=10, in place, nranks=4)`.
fn describe_call(args: &CollArgs, nranks: usize) -> String {
    let root = match args.kind.root() {
        Some(root) => format!("root={root}, "),
        None => String::new(),
    };
    let place = if args.in_place {
        "in place"
    } else {
        "out of place"
    };
    format!(
        "{}({root}count={}, {place}, nranks={nranks})",
        args.kind.name(),
        args.count
    )
}

fn describe_span(s: &Span) -> String {
    let buf = match s.buf {
        BufKind::Input => "input",
        BufKind::Output => "output",
        BufKind::Scratch => "scratch",
    };
    format!("{buf}[{}..{}]", s.offset, s.offset.saturating_add(s.len))
}

fn describe_op(op: &Op) -> String {
    match op {
        Op::Send { peer, src } => format!("send {} to rank {peer}", describe_span(src)),
        Op::Recv { peer, dst } => format!("recv {} from rank {peer}", describe_span(dst)),
        Op::RecvReduce { peer, src, dst } => format!(
            "recv_reduce from rank {peer}: {} = {} + incoming",
            describe_span(dst),
            describe_span(src)
        ),
        Op::Copy { src, dst } => {
            format!("copy {} to {}", describe_span(src), describe_span(dst))
        }
    }
}

/// `rank 2 step 3 op 1 (send input[0..4] to rank 3)`.
fn locate(rank: usize, step: usize, i: usize, op: &Op) -> String {
    format!("rank {rank} step {step} op {i} ({})", describe_op(op))
}

/// The peer of a communication op, `None` for a copy.
fn peer_of(op: &Op) -> Option<usize> {
    match *op {
        Op::Send { peer, .. } | Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => Some(peer),
        Op::Copy { .. } => None,
    }
}

/// Where the buffers of one rank lie in the flat symbolic memory: from `user`, out of place
/// `[input | output | scratch]`, in place `[user buffer | scratch]`.
#[derive(Debug, Clone)]
struct Layout {
    user: usize,
    in_base: usize,
    in_len: usize,
    out_base: usize,
    out_len: usize,
    scratch_base: usize,
    scratch_len: usize,
}

impl Layout {
    fn new(args: &CollArgs, rank: usize, nranks: usize, scratch: usize, user: usize) -> Self {
        let (in_len, out_len) = args.kind.buffer_lens(args.count, nranks);
        let (in_off, out_off, user_len) = if args.in_place {
            let (i, o) = args.kind.in_place_offsets(args.count, rank);
            (i, o, (i + in_len).max(o + out_len))
        } else {
            (0, in_len, in_len + out_len)
        };
        Layout {
            user,
            in_base: user + in_off,
            in_len,
            out_base: user + out_off,
            out_len,
            scratch_base: user + user_len,
            scratch_len: scratch,
        }
    }

    /// One past this rank's last element.
    fn end(&self) -> usize {
        self.scratch_base + self.scratch_len
    }

    fn base_len(&self, buf: BufKind) -> (usize, usize) {
        match buf {
            BufKind::Input => (self.in_base, self.in_len),
            BufKind::Output => (self.out_base, self.out_len),
            BufKind::Scratch => (self.scratch_base, self.scratch_len),
        }
    }

    /// The flat range of an in-bounds span.
    fn flat(&self, s: &Span) -> Range<usize> {
        let start = self.base_len(s.buf).0 + s.offset;
        start..start + s.len
    }

    fn in_bounds(&self, s: &Span) -> bool {
        s.offset
            .checked_add(s.len)
            .is_some_and(|end| end <= self.base_len(s.buf).1)
    }
}

fn overlap(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

/// Per-op checks of one rank's schedule (2.) and the conflict check within steps (3.).
fn check_ops(args: &CollArgs, nranks: usize, s: &Schedule, lay: &Layout) -> Result<(), String> {
    let r = s.rank;
    let non_root_reduce = matches!(args.kind, CollKind::Reduce { root } if root != r);
    let user = lay.user..lay.scratch_base;
    let mut accesses: Vec<Access> = Vec::new();
    for (t, step) in s.steps.iter().enumerate() {
        accesses.clear();
        for (i, op) in step.ops.iter().enumerate() {
            let at = || locate(r, t, i, op);
            let (src, dst) = match *op {
                Op::Send { src, .. } => (Some(src), None),
                Op::Recv { dst, .. } => (None, Some(dst)),
                Op::RecvReduce { src, dst, .. } | Op::Copy { src, dst } => (Some(src), Some(dst)),
            };
            for span in src.iter().chain(dst.iter()) {
                if !lay.in_bounds(span) {
                    let (_, len) = lay.base_len(span.buf);
                    return Err(format!(
                        "{}: span out of bounds (buffer has {len} elements)",
                        at()
                    ));
                }
            }
            if let Some(peer) = peer_of(op) {
                if peer >= nranks || peer == r {
                    return Err(format!("{}: invalid peer {peer}", at()));
                }
            }
            if let (Some(a), Some(b)) = (src, dst) {
                if a.len != b.len {
                    return Err(format!(
                        "{}: source has {} elements, destination {}",
                        at(),
                        a.len,
                        b.len
                    ));
                }
                let (fa, fb) = (lay.flat(&a), lay.flat(&b));
                if fa != fb && overlap(&fa, &fb) {
                    return Err(format!(
                        "{}: source and destination partially overlap",
                        at()
                    ));
                }
            }
            if matches!(op, Op::RecvReduce { .. }) && !args.kind.reduces() {
                return Err(format!(
                    "{}: reduction in a collective that does not reduce",
                    at()
                ));
            }
            if let Some(d) = dst {
                let fd = lay.flat(&d);
                if !args.in_place && d.buf == BufKind::Input {
                    return Err(format!("{}: writes the input buffer", at()));
                }
                if non_root_reduce && overlap(&fd, &user) {
                    return Err(format!(
                        "{}: a rank other than the root writes a user buffer",
                        at()
                    ));
                }
            }
            if peer_of(op).is_some() {
                if let Some(a) = src {
                    accesses.push(Access::new(lay.flat(&a), false, i));
                }
                if let Some(d) = dst {
                    let fd = lay.flat(&d);
                    if let Some(last) = accesses.last_mut() {
                        // A receive-reduce in place reads and writes the same memory.
                        if last.op == i && last.range == fd {
                            last.write = true;
                            continue;
                        }
                    }
                    accesses.push(Access::new(fd, true, i));
                }
            }
        }
        if let Some((a, b)) = find_conflict(&mut accesses) {
            return Err(format!(
                "{} conflicts with {}: same memory in one step",
                locate(r, t, a, &step.ops[a]),
                locate(r, t, b, &step.ops[b])
            ));
        }
    }
    Ok(())
}

/// One memory access of a communication op.
#[derive(Debug, Clone)]
struct Access {
    range: Range<usize>,
    write: bool,
    op: usize,
}

impl Access {
    fn new(range: Range<usize>, write: bool, op: usize) -> Self {
        Access { range, write, op }
    }
}

/// Furthest end reached by one op, and by the best other op: enough to tell whether some op
/// other than a given one reaches past a point.
#[derive(Debug, Clone, Copy, Default)]
struct TopTwo {
    first: Option<(usize, usize)>,
    second: Option<(usize, usize)>,
}

impl TopTwo {
    fn add(&mut self, op: usize, end: usize) {
        match (self.first, self.second) {
            (Some((o, e)), _) if o == op => self.first = Some((o, e.max(end))),
            (Some((_, e)), _) if end <= e => match self.second {
                Some((o2, e2)) if o2 == op => self.second = Some((o2, e2.max(end))),
                Some((_, e2)) if end <= e2 => {}
                _ => self.second = Some((op, end)),
            },
            (first, _) => {
                self.second = first;
                self.first = Some((op, end));
            }
        }
    }

    /// An op other than `op` whose accesses reach past `start`.
    fn other_past(&self, op: usize, start: usize) -> Option<usize> {
        [self.first, self.second]
            .into_iter()
            .flatten()
            .find(|&(o, _)| o != op)
            .filter(|&(_, e)| e > start)
            .map(|(o, _)| o)
    }
}

/// Two ops of a step that touch the same memory with at least one write, if any.
fn find_conflict(acc: &mut [Access]) -> Option<(usize, usize)> {
    acc.sort_unstable_by_key(|a| a.range.start);
    let mut any = TopTwo::default();
    let mut writes = TopTwo::default();
    for a in acc.iter().filter(|a| !a.range.is_empty()) {
        let seen = if a.write { &any } else { &writes };
        if let Some(other) = seen.other_past(a.op, a.range.start) {
            return Some((other.min(a.op), other.max(a.op)));
        }
        any.add(a.op, a.range.end);
        if a.write {
            writes.add(a.op, a.range.end);
        }
    }
    None
}

/// For every op of every rank, the rank and step of the op at the other end of its message
/// (unused for copies): `partners[rank][step][op]`.
type Partners = Vec<Vec<Vec<(usize, usize)>>>;

/// FIFO matching per ordered pair of ranks (4.).
fn match_messages(n: usize, scheds: &[Schedule]) -> Result<Partners, String> {
    // (step, op, len) of the sends from a to b at index a * n + b, and of the receives at b
    // from a at the same index.
    let mut sends: Vec<Vec<(usize, usize, usize)>> = vec![Vec::new(); n * n];
    let mut recvs: Vec<Vec<(usize, usize, usize)>> = vec![Vec::new(); n * n];
    let mut partners: Partners = Vec::with_capacity(n);
    for s in scheds {
        let r = s.rank;
        for (t, step) in s.steps.iter().enumerate() {
            for (i, op) in step.ops.iter().enumerate() {
                match *op {
                    Op::Send { peer, src } => sends[r * n + peer].push((t, i, src.len)),
                    Op::Recv { peer, dst } | Op::RecvReduce { peer, dst, .. } => {
                        recvs[peer * n + r].push((t, i, dst.len))
                    }
                    Op::Copy { .. } => {}
                }
            }
        }
        partners.push(
            s.steps
                .iter()
                .map(|st| vec![(usize::MAX, usize::MAX); st.ops.len()])
                .collect(),
        );
    }
    for a in 0..n {
        for b in 0..n {
            let (ss, rs) = (&sends[a * n + b], &recvs[a * n + b]);
            for (k, (&(st, si, sl), &(rt, ri, rl))) in ss.iter().zip(rs).enumerate() {
                if sl != rl {
                    return Err(format!(
                        "message {k} from rank {a} to rank {b}: {} sends {sl} elements but {} \
                         receives {rl}",
                        locate(a, st, si, &scheds[a].steps[st].ops[si]),
                        locate(b, rt, ri, &scheds[b].steps[rt].ops[ri])
                    ));
                }
                partners[a][st][si] = (b, rt);
                partners[b][rt][ri] = (a, st);
            }
            if ss.len() > rs.len() {
                let (t, i, _) = ss[rs.len()];
                return Err(format!(
                    "rank {a} sends {} messages to rank {b}, which receives {}; first unmatched: \
                     {}",
                    ss.len(),
                    rs.len(),
                    locate(a, t, i, &scheds[a].steps[t].ops[i])
                ));
            }
            if rs.len() > ss.len() {
                let (t, i, _) = rs[ss.len()];
                return Err(format!(
                    "rank {b} receives {} messages from rank {a}, which sends {}; first \
                     unmatched: {}",
                    rs.len(),
                    ss.len(),
                    locate(b, t, i, &scheds[b].steps[t].ops[i])
                ));
            }
        }
    }
    Ok(partners)
}

/// What one element holds: the ranks whose input element `idx` it is the reduction of (a
/// single rank for data that is only moved). An empty set means uninitialized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Val {
    mask: u64,
    idx: usize,
}

const UNINIT: Val = Val { mask: 0, idx: 0 };

impl Val {
    fn of(rank: usize, idx: usize) -> Self {
        Val {
            mask: 1 << rank,
            idx,
        }
    }

    fn is_init(self) -> bool {
        self.mask != 0
    }

    fn describe(self, nranks: usize) -> String {
        if !self.is_init() {
            return "uninitialized".to_string();
        }
        if self.mask == all_ranks(nranks) {
            return format!("input[{}] of all ranks", self.idx);
        }
        let ranks: Vec<String> = (0..64)
            .filter(|r| self.mask >> r & 1 == 1)
            .map(|r| r.to_string())
            .collect();
        format!("input[{}] of ranks {{{}}}", self.idx, ranks.join(","))
    }
}

fn all_ranks(nranks: usize) -> u64 {
    if nranks >= 64 {
        u64::MAX
    } else {
        (1 << nranks) - 1
    }
}

/// What rank `r`'s input element `j` holds before the call.
fn initial_input(args: &CollArgs, r: usize, j: usize) -> Val {
    match args.kind {
        // Only the root's input means anything in a broadcast.
        CollKind::Broadcast { root } if root != r => UNINIT,
        _ => Val::of(r, j),
    }
}

/// Rank not yet started.
const NOT_STARTED: usize = usize::MAX;

/// The lockstep symbolic execution (5. and 6.).
struct Sim<'a> {
    args: CollArgs,
    n: usize,
    scheds: &'a [Schedule],
    layouts: &'a [Layout],
    partners: Partners,
    /// The memory of all ranks, at the offsets of `layouts`.
    mem: &'a mut Vec<Val>,
    /// In-flight payloads from a to b at index a * n + b, in send order.
    queues: Vec<VecDeque<Vec<Val>>>,
    /// The step each rank is in (its step count when done).
    cur: Vec<usize>,
    /// Communication ops of the current step not yet met by their peer's op.
    pending: Vec<usize>,
    /// Ranks whose current step has all its ops met.
    ready: Vec<usize>,
}

impl<'a> Sim<'a> {
    fn new(
        mem: &'a mut Vec<Val>,
        args: &CollArgs,
        n: usize,
        scheds: &'a [Schedule],
        layouts: &'a [Layout],
        partners: Partners,
    ) -> Self {
        mem.clear();
        mem.resize(layouts.last().map_or(0, Layout::end), UNINIT);
        for (r, lay) in layouts.iter().enumerate() {
            for j in 0..lay.in_len {
                mem[lay.in_base + j] = initial_input(args, r, j);
            }
        }
        Sim {
            args: *args,
            n,
            scheds,
            layouts,
            partners,
            mem,
            queues: vec![VecDeque::new(); n * n],
            cur: vec![NOT_STARTED; n],
            pending: vec![0; n],
            ready: Vec::new(),
        }
    }

    fn run(&mut self) -> Result<(), String> {
        for r in 0..self.n {
            self.enter(r, 0)?;
        }
        while let Some(r) = self.ready.pop() {
            self.complete(r)?;
        }
        self.check_deadlock()
    }

    /// Rank `r` starts step `t`: copies, payloads of its sends, then matching against the
    /// peers' current steps.
    fn enter(&mut self, r: usize, t: usize) -> Result<(), String> {
        self.cur[r] = t;
        let Some(step) = self.scheds[r].steps.get(t) else {
            return Ok(());
        };
        let lay = &self.layouts[r];
        let mem = &mut *self.mem;
        for (i, op) in step.ops.iter().enumerate() {
            match op {
                Op::Copy { src, dst } => {
                    let (fs, fd) = (lay.flat(src), lay.flat(dst));
                    if fs.start == fd.start {
                        continue;
                    }
                    if let Some(j) = mem[fs.clone()].iter().position(|v| !v.is_init()) {
                        return Err(format!(
                            "{}: reads uninitialized element {}",
                            locate(r, t, i, op),
                            src.offset + j
                        ));
                    }
                    mem.copy_within(fs, fd.start);
                }
                Op::Send { peer, src } => {
                    let payload = mem[lay.flat(src)].to_vec();
                    if let Some(j) = payload.iter().position(|v| !v.is_init()) {
                        return Err(format!(
                            "{}: sends uninitialized element {}",
                            locate(r, t, i, op),
                            src.offset + j
                        ));
                    }
                    self.queues[r * self.n + peer].push_back(payload);
                }
                Op::Recv { .. } | Op::RecvReduce { .. } => {}
            }
        }
        let mut pending = 0;
        for (i, op) in step.ops.iter().enumerate() {
            if peer_of(op).is_none() {
                continue;
            }
            let (p, ps) = self.partners[r][t][i];
            if self.cur[p] == ps {
                self.pending[p] -= 1;
                if self.pending[p] == 0 {
                    self.ready.push(p);
                }
            } else {
                pending += 1;
            }
        }
        self.pending[r] = pending;
        if pending == 0 {
            self.ready.push(r);
        }
        Ok(())
    }

    /// Rank `r` finishes its current step: the receives land, then it enters the next step.
    fn complete(&mut self, r: usize) -> Result<(), String> {
        let t = self.cur[r];
        let step = &self.scheds[r].steps[t];
        let lay = &self.layouts[r];
        let n = self.n;
        for (i, op) in step.ops.iter().enumerate() {
            let (peer, src, dst) = match *op {
                Op::Recv { peer, dst } => (peer, None, dst),
                Op::RecvReduce { peer, src, dst } => (peer, Some(src), dst),
                Op::Send { .. } | Op::Copy { .. } => continue,
            };
            let Some(payload) = self.queues[peer * n + r].pop_front() else {
                return Err(format!(
                    "{}: completed without a message (checker bug)",
                    locate(r, t, i, op)
                ));
            };
            let mem = &mut *self.mem;
            let fd = lay.flat(&dst);
            match src {
                None => mem[fd].copy_from_slice(&payload),
                Some(src) => {
                    let fs = lay.flat(&src);
                    let bad = mem[fs.clone()].iter().zip(&payload).position(|(own, inc)| {
                        !own.is_init() || own.idx != inc.idx || own.mask & inc.mask != 0
                    });
                    if let Some(j) = bad {
                        let (own, inc) = (mem[fs.start + j], payload[j]);
                        let what = if !own.is_init() {
                            "reads an uninitialized local element"
                        } else if own.idx != inc.idx {
                            "combines different elements"
                        } else {
                            "counts a rank twice"
                        };
                        return Err(format!(
                            "{}: message element {j} {what}: local {}, incoming {}",
                            locate(r, t, i, op),
                            own.describe(n),
                            inc.describe(n)
                        ));
                    }
                    if fs != fd {
                        mem.copy_within(fs, fd.start);
                    }
                    for (v, inc) in mem[fd].iter_mut().zip(&payload) {
                        v.mask |= inc.mask;
                    }
                }
            }
        }
        self.enter(r, t + 1)
    }

    fn check_deadlock(&self) -> Result<(), String> {
        let mut blocked = Vec::new();
        for (r, s) in self.scheds.iter().enumerate() {
            let t = self.cur[r];
            let Some(step) = s.steps.get(t) else {
                continue;
            };
            let waits = step.ops.iter().enumerate().find_map(|(i, op)| {
                peer_of(op)?;
                let (p, ps) = self.partners[r][t][i];
                (self.cur[p] != ps).then(|| {
                    let peer_at = if self.cur[p] >= self.scheds[p].steps.len() {
                        "done".to_string()
                    } else {
                        format!("at step {}", self.cur[p])
                    };
                    format!(
                        "{} waits for rank {p} step {ps} (rank {p} is {peer_at})",
                        locate(r, t, i, op)
                    )
                })
            });
            blocked.push(waits.unwrap_or_else(|| format!("rank {r} step {t}")));
        }
        if blocked.is_empty() {
            return Ok(());
        }
        let shown = blocked.len().min(4);
        Err(format!(
            "deadlock with rendezvous sends, {} ranks blocked: {}{}",
            blocked.len(),
            blocked[..shown].join("; "),
            if blocked.len() > shown { "; ..." } else { "" }
        ))
    }

    /// The expected value of output element `i` on rank `r`.
    fn expected(&self, r: usize, i: usize) -> Val {
        let count = self.args.count;
        let all = all_ranks(self.n);
        match self.args.kind {
            CollKind::AllReduce | CollKind::Reduce { .. } => Val { mask: all, idx: i },
            CollKind::ReduceScatter => Val {
                mask: all,
                idx: r * count + i,
            },
            CollKind::Broadcast { root } => Val::of(root, i),
            CollKind::AllGather => Val::of(i / count, i % count),
            CollKind::AllToAll => Val::of(i / count, r * count + i % count),
        }
    }

    fn check_results(&self) -> Result<(), String> {
        let mem = &*self.mem;
        for (r, lay) in self.layouts.iter().enumerate() {
            if !self.args.in_place {
                let input = &mem[lay.in_base..lay.in_base + lay.in_len];
                if let Some(j) =
                    (0..input.len()).find(|&j| input[j] != initial_input(&self.args, r, j))
                {
                    return Err(format!(
                        "rank {r}: input[{j}] changed to {}",
                        input[j].describe(self.n)
                    ));
                }
            }
            if matches!(self.args.kind, CollKind::Reduce { root } if root != r) {
                continue;
            }
            let out = &mem[lay.out_base..lay.out_base + lay.out_len];
            for (i, &got) in out.iter().enumerate() {
                let want = self.expected(r, i);
                if got != want {
                    return Err(format!(
                        "rank {r}: output[{i}] holds {}, expected {}",
                        got.describe(self.n),
                        want.describe(self.n)
                    ));
                }
            }
        }
        Ok(())
    }
}
