//! The symbolic execution of all ranks' schedules: rendezvous progress (5.) and the values
//! every element holds (6.).

use std::collections::VecDeque;

use super::layout::Layout;
use super::messages::Partners;
use super::{locate, peer_of};
use crate::coll::{CollArgs, CollKind, Op, Schedule};

/// What one element holds: the ranks whose input element `idx` it is the reduction of (a
/// single rank for data that is only moved). An empty set means uninitialized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Val {
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
pub(super) struct Sim<'a> {
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
    pub(super) fn new(
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

    pub(super) fn run(&mut self) -> Result<(), String> {
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

    pub(super) fn check_results(&self) -> Result<(), String> {
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
