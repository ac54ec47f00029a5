//! Unregistered buffers of ranks that are processes of one host, through scratch windows.
//!
//! A buffer in no window lives in an address space the other processes cannot reach. Where
//! `FERRO_DEVICE_SCRATCH_BYTES` is set, the communicator registers a window of its own on every
//! rank at its first device collective (the same exchange as `register_window`, the shared
//! marks with it): half of it holds a rank's inputs, half the chunks it reduced. A call whose
//! buffers lie in no window then runs in three steps, each on the call's stream (a blocking
//! call: the reducer's own, waited for):
//!
//! 1. **In.** Before the offer, the rank copies the part of its input the others read into the
//!    inputs half of its scratch; its ready mark, recorded at the offer, comes after the copy.
//! 2. **Share.** After the others' ready marks, the rank reduces (or copies) its share: its own
//!    input read where it lies, the others' from their scratch; a reduced chunk the others
//!    need goes into the chunks half of its scratch too. Then its done mark.
//! 3. **Out.** After the others' done marks, the rank copies the chunks the others reduced from
//!    their scratch into its output (allreduce; reduce, on the root).
//!
//! A call larger than half the least rank's scratch runs in [`pieces`] that fit, the three
//! steps once a piece: a later piece's copies in go after the round before, and the ranks
//! exchange its ready marks before its share.
//!
//! Every access to another rank's scratch is a read. Reuse is ordered by the marks: a rank
//! writes its inputs half only after the last call's waits for the others' done marks (on its
//! stream), and its chunks half only in its share, after the others' ready marks, which they
//! record after the copies out of their last call. A rank whose next such call goes on another
//! stream first waits on the host for its last calls' settle points (recorded after their
//! copies out).
//!
//! Traffic of a two-rank allreduce of S bytes: each rank copies S/2 in (read and write), reads
//! S/2 twice and writes S/2 twice in its share, and copies S/2 out: 4 × S a rank, 8 × S in all,
//! against the 9 × S of the ring through the p2p slots and the 4 × S of buffers in windows; in
//! launches and waits on the host, three copies and a kernel a call instead of a copy, a flag
//! and a kernel per slot and step.

use std::sync::Arc;

use ferroccl_kernels::{DataType, ElemOp};
use ferroccl_transport::{Error, MemRef, MemSpace, Result};

use super::super::windows::{Scratch, Window, Windows};
use super::super::{DeviceArena, Engine, Mapper, Memory, Offered, OpContext};
use super::shares::{apart, chunk, Share};
use super::Round;
use crate::coll::{CollArgs, CollKind};
use crate::device::ipc::Mapping;
use crate::reduce::{Mark, MarkUse, Reducer, NO_MARK};

/// Bytes of each half of the scratch a call of `kind` with `count` elements of `es` bytes on
/// `n` ranks needs: the inputs the others read (the chunks half needs no more).
pub(super) fn needs(kind: CollKind, count: usize, n: usize, es: usize) -> usize {
    let (i, _) = kind.buffer_lens(count, n);
    i.saturating_mul(es)
}

/// The pieces of a call of `count` elements (of each rank's block, for the collectives of
/// blocks) whose scratch needs fit `half` bytes: each as many elements as fit, a multiple of
/// 64 bytes where that fits, the last one short. Empty where not one element fits.
pub(super) fn pieces(
    kind: CollKind,
    count: usize,
    n: usize,
    es: usize,
    half: usize,
) -> Vec<std::ops::Range<usize>> {
    let per_elem = needs(kind, 1, n, es).max(1);
    let mut most = half / per_elem;
    let align = (64 / es.max(1)).max(1);
    if most >= align {
        most -= most % align;
    }
    if most == 0 {
        return Vec::new();
    }
    (0..count.div_ceil(most))
        .map(|k| k * most..((k + 1) * most).min(count))
        .collect()
}

/// What a rank does in a call through the scratch windows: copies into its scratch before the
/// offer, its share, and copies out after the others' done marks. Each entry names the rank
/// whose memory it is and an address there (this process's view).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Plan {
    pub copy_in: Vec<Share>,
    pub share: Vec<Share>,
    pub copy_out: Vec<Share>,
}

/// Rank `r`'s plan for collective `kind` of `count` elements of `es` bytes on `n` ranks: its
/// input and output start at `mine` (in place: blocks of one buffer, `in_place`), and rank
/// `k`'s scratch at `scratch[k]`, whose chunks half starts `half` bytes in. A piece of a
/// collective of blocks (all_gather, reduce_scatter, all_to_all) takes `count` elements of
/// each block, the blocks of a rank's buffer `stride` bytes apart (a whole call:
/// `count × es`); in the scratch its blocks lie `count × es` apart.
#[allow(clippy::too_many_arguments)]
pub(super) fn plan(
    kind: CollKind,
    count: usize,
    n: usize,
    r: usize,
    es: usize,
    mine: (usize, usize),
    in_place: bool,
    scratch: &[usize],
    half: usize,
    stride: usize,
) -> Plan {
    let (input, output) = mine;
    let copy = |src: (usize, usize), dst: (usize, usize), bytes: usize| Share {
        srcs: vec![src],
        dsts: vec![dst],
        bytes,
    };
    // Copies of `[from, to)` of the input into the inputs half at the same offsets, around
    // `[skip_from, skip_to)` (the part this rank reads itself): at most two copies.
    let around = |total: usize, skip: std::ops::Range<usize>| {
        [(0, skip.start), (skip.end, total)]
            .into_iter()
            .filter(|(a, b)| b > a)
            .map(|(a, b)| copy((r, input + a), (r, scratch[r] + a), b - a))
            .collect::<Vec<_>>()
    };
    // Copies of every block of the input but this rank's own (block `j` at `j × stride`) into
    // the inputs half (block `j` at `j × block`): one copy around it where they are packed.
    let blocks_around = |block: usize| match stride == block {
        true => around(n * block, r * block..(r + 1) * block),
        false => (0..n)
            .filter(|&j| j != r)
            .map(|j| copy((r, input + j * stride), (r, scratch[r] + j * block), block))
            .collect(),
    };
    // Source `k` of a reduction at byte `off`: this rank's own input, the others' scratch.
    let source = |k: usize, off: usize| match k == r {
        true => (r, input + off),
        false => (k, scratch[k] + off),
    };
    let mut p = Plan::default();
    match kind {
        CollKind::AllReduce | CollKind::Reduce { .. } => {
            let c = |k: usize| chunk(count, n, k, es);
            let total = count * es;
            let mine = c(r);
            let (off, bytes) = (mine.start * es, mine.len() * es);
            p.copy_in = around(total, off..off + bytes);
            let root = kind.root();
            let srcs = (0..n).map(|k| source(k, off)).collect();
            let dsts = match root {
                None => vec![(r, output + off), (r, scratch[r] + half + off)],
                Some(t) if t == r => vec![(r, output + off)],
                Some(_) => vec![(r, scratch[r] + half + off)],
            };
            if bytes > 0 {
                p.share.push(Share { srcs, dsts, bytes });
            }
            if root.is_none_or(|t| t == r) {
                for j in (0..n).filter(|&j| j != r) {
                    let cj = c(j);
                    let (o, b) = (cj.start * es, cj.len() * es);
                    if b > 0 {
                        p.copy_out
                            .push(copy((j, scratch[j] + half + o), (r, output + o), b));
                    }
                }
            }
        }
        CollKind::Broadcast { root } => {
            let total = count * es;
            if r == root {
                p.copy_in = around(total, 0..0);
                if !in_place && total > 0 {
                    p.share.push(copy((r, input), (r, output), total));
                }
            } else if total > 0 {
                p.share
                    .push(copy((root, scratch[root]), (r, output), total));
            }
        }
        CollKind::AllGather => {
            let block = count * es;
            if block > 0 {
                p.copy_in = around(block, 0..0);
                for (j, &theirs) in scratch.iter().enumerate().take(n) {
                    let to = (r, output + j * stride);
                    match j == r {
                        true if !in_place => p.share.push(copy((r, input), to, block)),
                        true => {}
                        false => p.share.push(copy((j, theirs), to, block)),
                    }
                }
            }
        }
        CollKind::ReduceScatter => {
            let block = count * es;
            if block > 0 {
                p.copy_in = blocks_around(block);
                let src = |k: usize| match k == r {
                    true => (r, input + r * stride),
                    false => (k, scratch[k] + r * block),
                };
                p.share.push(Share {
                    srcs: (0..n).map(src).collect(),
                    dsts: vec![(r, output)],
                    bytes: block,
                });
            }
        }
        CollKind::AllToAll => {
            let block = count * es;
            if block > 0 {
                p.copy_in = blocks_around(block);
                let (mine_in, off) = (input + r * stride, r * block);
                for (j, &theirs) in scratch.iter().enumerate().take(n) {
                    let to = (r, output + j * stride);
                    match j == r {
                        true if !in_place => p.share.push(copy((r, mine_in), to, block)),
                        true => {}
                        false => p.share.push(copy((j, theirs + off), to, block)),
                    }
                }
            }
        }
    }
    p
}

/// A call going through the scratch windows: what its pieces' plans need, its pieces, and the
/// first piece's plan until its round runs.
pub(super) struct Staged {
    kind: CollKind,
    es: usize,
    mine: (usize, usize),
    in_place: bool,
    here: Vec<usize>,
    half: usize,
    stride: usize,
    pieces: Vec<std::ops::Range<usize>>,
    first: Option<Plan>,
}

/// Queues step 1 of `plan`, the copies into this rank's scratch, on `on` (`None`: the
/// reducer's own stream, waited for).
fn copy_in(
    reducer: &dyn Reducer,
    on: Option<usize>,
    (dtype, op): (DataType, ElemOp),
    plan: &Plan,
    spaces: &[MemSpace],
) -> Result<()> {
    queue_shares(reducer, on, (dtype, op, None), &plan.copy_in, spaces)?;
    match on.is_none() && !plan.copy_in.is_empty() {
        true => reducer.synchronize(None),
        false => Ok(()),
    }
}

/// A collective offered through the scratch windows, as this rank sees it.
pub(super) struct Call<'a> {
    pub args: &'a CollArgs,
    pub dtype: DataType,
    pub op: ElemOp,
    pub mem: &'a Memory,
    /// Where this rank's input and output start (in place: blocks of one buffer).
    pub mine: (usize, usize),
    /// The bytes of its input and of its output it uses.
    pub used: (usize, usize),
    /// The caller's stream (`None`: blocking).
    pub on: Option<usize>,
}

/// Queues `shares` on stream `on` (`None`: the reducer's own), each one reduce-copy of
/// `dtype` with `op` (one source: a copy) pre-multiplied by the factor where given; rank `k`'s
/// memory is `spaces[k]`. Returns at the first that fails to queue.
pub(super) fn queue_shares(
    reducer: &dyn Reducer,
    on: Option<usize>,
    (dtype, op, premul): (DataType, ElemOp, Option<f64>),
    shares: &[Share],
    spaces: &[MemSpace],
) -> Result<()> {
    for t in shares.iter().filter(|t| t.bytes > 0) {
        let at = |&(rank, addr): &(usize, usize)| MemRef {
            space: spaces[rank],
            addr,
            len: t.bytes,
        };
        let srcs: Vec<MemRef> = t.srcs.iter().map(at).collect();
        let dsts: Vec<MemRef> = t.dsts.iter().map(at).collect();
        reducer.queue_many(on, dtype, op, &dsts, &srcs, premul)?;
    }
    Ok(())
}

/// Stands in for a mapper where this rank has no scratch to offer: it maps nothing.
struct NoMapper;

impl Mapper for NoMapper {
    fn map(&self, _handle: &[u8; 64]) -> Result<Mapping> {
        Err(ferroccl_transport::Error::internal(
            "no scratch window on this rank",
        ))
    }
    fn space(&self, _addr: u64, _len: usize) -> Option<MemSpace> {
        None
    }
    fn reaches(&self, _from: MemSpace, _to: MemSpace) -> bool {
        false
    }
}

impl Windows {
    /// Whether calls are offered for the scratch window: it is wanted (and made at the first
    /// call where every rank can), or held and usable.
    pub(super) fn scratch_offered(&self) -> bool {
        match &self.scratch {
            Scratch::Off => false,
            Scratch::Wanted(_) => true,
            Scratch::Held(w) => w.usable,
        }
    }

    /// The scratch window, where it is held and usable, and the bytes of each of its halves
    /// (half the least rank's, a multiple of 64 bytes): the same on every rank.
    pub(super) fn scratch_window(&self) -> Option<(&Window, usize)> {
        match &self.scratch {
            Scratch::Held(w) if w.usable => {
                let least = w.ranks.iter().map(|k| k.len).min()?;
                Some((w, least / 2 / 64 * 64))
            }
            _ => None,
        }
    }
}

impl Engine {
    /// Asks for a scratch window of `bytes` a rank where windows are exchanged (0: none).
    pub(crate) fn set_peer_scratch(&mut self, bytes: usize) {
        if let Some(ws) = self.peer.windows.as_mut() {
            ws.scratch = match bytes {
                0 => Scratch::Off,
                b => Scratch::Wanted(b),
            };
        }
    }

    /// Whether the scratch window is wanted and not made yet.
    pub(super) fn scratch_wanted(&self) -> Option<usize> {
        match self.peer.windows.as_ref()?.scratch {
            Scratch::Wanted(b) => Some(b),
            _ => None,
        }
    }

    /// Where every rank's scratch window starts here, its memory here, and the bytes of each
    /// half ([`Windows::scratch_window`]), where it is usable.
    fn scratch_ranks(&self) -> Option<(Vec<usize>, Vec<MemSpace>, usize)> {
        let (w, half) = self.peer.windows.as_ref()?.scratch_window()?;
        Some((
            w.ranks.iter().map(|k| k.here as usize).collect(),
            w.ranks.iter().map(|k| k.space).collect(),
            half,
        ))
    }

    /// Where the scratch windows can carry `call`, on this rank's side (every rank learns in
    /// the offer whether all can): the call cut into [`pieces`] that fit half the least
    /// scratch, and step 1 (see the module) of the first, the copies into this rank's scratch,
    /// queued on the call's stream (a blocking call: the reducer's own, waited for, as it
    /// offers no ready mark); and every rank's memory of the scratch. Where the last call
    /// through the scratch went on another stream, its copies out and its waits for the
    /// others are waited for first (their settle points). `(None, None)` where it cannot: no
    /// usable scratch window on this call's device, a rank's input overlapping its output out
    /// of place, a copy that failed (logged).
    pub(super) fn stage_in(
        &mut self,
        call: &Call<'_>,
        reducer: &dyn Reducer,
        ctx: &OpContext,
    ) -> (Option<Vec<MemSpace>>, Option<Staged>) {
        let (n, me, es) = (self.nranks, self.rank, call.dtype.size());
        let (kind, count, mem) = (call.args.kind, call.args.count, call.mem);
        let Some((here, spaces, half)) = self.scratch_ranks() else {
            return (None, None);
        };
        let own_apart = apart(&[call.mine], &[call.used], &[mem.in_place], &[0]);
        let pieces = pieces(kind, count, n, es, half);
        if spaces[me] != mem.space || pieces.is_empty() || !own_apart {
            return (None, None);
        }
        let mut staged = Staged {
            kind,
            es,
            mine: call.mine,
            in_place: mem.in_place,
            here,
            half,
            stride: count * es,
            pieces,
            first: None,
        };
        let first = self.piece_plan(&staged, 0);
        let done = (|| {
            if self.peer.last_staged.is_some_and(|last| last != call.on) {
                if let Some(m) = self.peer_marks() {
                    m.reducer.settle_shared(self.wait.timeout)?;
                }
            }
            copy_in(reducer, call.on, (call.dtype, call.op), &first, &spaces)
        })();
        match done {
            Ok(()) => {
                staged.first = Some(first);
                (Some(spaces), Some(staged))
            }
            Err(e) => {
                ferroccl_transport::log_line!(
                    "ferroccl WARN P2P: {}: the copy into the scratch window failed ({e}); the \
                     call takes the schedule",
                    ctx.label()
                );
                (None, None)
            }
        }
    }

    /// The plan of piece `p` of `st` ([`plan`]).
    fn piece_plan(&self, st: &Staged, p: usize) -> Plan {
        let r = &st.pieces[p];
        let at = (st.mine.0 + r.start * st.es, st.mine.1 + r.start * st.es);
        let (n, me) = (self.nranks, self.rank);
        plan(
            st.kind,
            r.len(),
            n,
            me,
            st.es,
            at,
            st.in_place,
            &st.here,
            st.half,
            st.stride,
        )
    }

    /// The rounds of a call through the scratch windows (every rank agreed in the offer), one
    /// a piece: the first piece's copies in were queued before the offer, which carried its
    /// ready marks (`ready`); each later piece's are queued after the round before (whose
    /// waits for the others' done marks come first on the stream: no rank still reads this
    /// rank's scratch), and the ranks exchange its ready marks (and whether every rank queued
    /// them) before its round.
    pub(super) fn scratch_rounds(
        &mut self,
        round: &Round<'_>,
        mut staged: Staged,
        mut ready: Vec<Mark>,
        ctx: &OpContext,
    ) -> Result<()> {
        let (n, me) = (self.nranks, self.rank);
        let (reducer, on) = (round.reducer, round.on);
        for p in 0..staged.pieces.len() {
            let plan = match staged.first.take() {
                Some(first) => first,
                None => {
                    let plan = self.piece_plan(&staged, p);
                    let (dtype, op, _) = round.ops;
                    let made =
                        copy_in(reducer, on, (dtype, op), &plan, round.spaces).and_then(|()| {
                            match on {
                                Some(_) => reducer
                                    .mark_shared(on, MarkUse::Ready)
                                    .map(|w| [super::SHARED, w]),
                                None => Ok(NO_MARK),
                            }
                        });
                    let mut words = vec![0u64; 1 + 2 * n];
                    match &made {
                        Ok(m) => words[1 + 2 * me..3 + 2 * me].copy_from_slice(m),
                        Err(_) => words[0] = me as u64 + 1,
                    }
                    self.max_words(&mut words, ctx)?;
                    made.map_err(|e| e.context(ctx.label()))?;
                    if words[0] != 0 {
                        return Err(Error::remote(format!(
                            "{}: rank {} failed to copy piece {p} of the {} into its scratch \
                             window; this rank's result is incomplete",
                            ctx.label(),
                            words[0] - 1,
                            round.kind.name()
                        )));
                    }
                    ready = (0..n)
                        .map(|k| [words[1 + 2 * k], words[2 + 2 * k]])
                        .collect();
                    plan
                }
            };
            self.share_round(round, &plan.share, &plan.copy_out, &ready, ctx)?;
            self.peer.last_staged = Some(on);
        }
        Ok(())
    }

    /// Makes and registers the scratch window on every rank (every rank agreed to in the
    /// offer): this rank's allocation from `arena`, exported; the exchange of
    /// `register_window`, the shared marks with it where `reducer` has none shared yet. A rank
    /// that cannot make or export it offers none: the window is then unusable on every rank
    /// (logged on that rank), and never asked for again.
    pub(super) fn make_scratch(
        &mut self,
        bytes: usize,
        arena: &mut dyn DeviceArena,
        reducer: Arc<dyn Reducer>,
        ctx: &OpContext,
    ) -> Result<()> {
        let (offered, mapper, owned) = match arena.scratch(bytes) {
            Ok(a) => (a.offered, a.mapper, Some(a.owned)),
            Err(e) => {
                ferroccl_transport::log_line!(
                    "ferroccl WARN P2P: {}: no scratch window of {bytes} bytes on this rank \
                     ({e}): device collectives on buffers in no window take the schedule",
                    ctx.label()
                );
                let none = Offered {
                    addr: 0,
                    len: 0,
                    export: None,
                };
                (none, Box::new(NoMapper) as Box<dyn Mapper>, None)
            }
        };
        let mut w = self.exchange_window(offered, mapper.as_ref(), Some(reducer), ctx)?;
        w.owned = owned;
        if let Some(ws) = self.peer.windows.as_mut() {
            ws.scratch = Scratch::Held(w);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element of every rank's output, after every rank ran its plan over byte arrays
    /// standing in for the buffers (addresses: rank k's input at 0x1000000·(k+1), output at
    /// 0x100000·(k+1), scratch at 0x10000000·(k+1)), against the collective's definition: in
    /// pieces of at most `most` elements where given (the scratch's half holds that many),
    /// one piece after the other.
    fn check(kind: CollKind, count: usize, n: usize, in_place: bool, most: Option<usize>) {
        use std::collections::HashMap;
        let es = 4;
        let (ilen, olen) = kind.buffer_lens(count, n);
        let half = match most {
            Some(m) => needs(kind, m, n, es),
            None => 2 * needs(kind, count, n, es),
        };
        let cuts = pieces(kind, count, n, es, half);
        assert_eq!(
            cuts.len(),
            most.map_or(1, |m| count.div_ceil(m)),
            "{cuts:?}"
        );
        let scratch: Vec<usize> = (0..n).map(|k| 0x1000_0000 * (k + 1)).collect();
        let out_base = |k: usize| 0x10_0000 * (k + 1);
        let mine = |k: usize| {
            if in_place {
                let (i, o) = kind.in_place_offsets(count, k);
                (out_base(k) + i * es, out_base(k) + o * es)
            } else {
                (0x100_0000 * (k + 1), out_base(k))
            }
        };
        // Memory: one word per element, keyed by address.
        let mut mem: HashMap<usize, i64> = HashMap::new();
        let value = |k: usize, i: usize| (k as i64 + 1) * 1000 + i as i64;
        for k in 0..n {
            let (i0, _) = mine(k);
            for i in 0..ilen {
                mem.insert(i0 + i * es, value(k, i));
            }
        }
        let stride = count * es;
        let plans = |piece: &std::ops::Range<usize>| -> Vec<Plan> {
            let at = |k: usize| (mine(k).0 + piece.start * es, mine(k).1 + piece.start * es);
            let c = piece.len();
            (0..n)
                .map(|k| plan(kind, c, n, k, es, at(k), in_place, &scratch, half, stride))
                .collect()
        };
        let run = |mem: &mut HashMap<usize, i64>, s: &Share| {
            let vals: Vec<i64> = (0..s.bytes / es)
                .map(|e| s.srcs.iter().map(|&(_, a)| mem[&(a + e * es)]).sum())
                .collect();
            for &(_, d) in &s.dsts {
                for (e, v) in vals.iter().enumerate() {
                    mem.insert(d + e * es, *v);
                }
            }
        };
        for (phase, piece) in cuts.iter().flat_map(|c| (0..3).map(move |ph| (ph, c))) {
            for (k, p) in plans(piece).iter().enumerate() {
                let list = [&p.copy_in, &p.share, &p.copy_out][phase];
                for s in list {
                    // Reads of another rank's memory are of its scratch only; writes are this
                    // rank's own.
                    assert!(s.dsts.iter().all(|&(o, _)| o == k), "{kind:?} {s:?}");
                    for &(o, a) in &s.srcs {
                        assert!(
                            o == k || a >= scratch[o],
                            "{kind:?} reads rank {o}'s buffer"
                        );
                    }
                    run(&mut mem, s);
                }
            }
        }
        for k in 0..n {
            let o0 = mine(k).1;
            let total = |i: usize| (0..n).map(|j| value(j, i)).sum::<i64>();
            let want = |i: usize| match kind {
                CollKind::AllReduce => Some(total(i)),
                CollKind::Reduce { root } => (k == root).then(|| total(i)),
                CollKind::Broadcast { root } => Some(value(root, i)),
                CollKind::AllGather => Some(value(i / count, i % count)),
                CollKind::ReduceScatter => Some(total(k * count + i)),
                CollKind::AllToAll => Some(value(i / count, k * count + i % count)),
            };
            for i in 0..olen {
                if let Some(w) = want(i) {
                    assert_eq!(
                        mem.get(&(o0 + i * es)),
                        Some(&w),
                        "{kind:?} count {count} n {n} in place {in_place}: rank {k} element {i}"
                    );
                }
            }
        }
    }

    #[test]
    fn plans_give_every_collective_its_result() {
        let kinds = [
            CollKind::AllReduce,
            CollKind::Reduce { root: 1 },
            CollKind::Broadcast { root: 1 },
            CollKind::AllGather,
            CollKind::ReduceScatter,
            CollKind::AllToAll,
        ];
        for kind in kinds {
            for n in [2, 3, 5, 8] {
                for count in [1, 7, 16, 33, 257] {
                    for in_place in [false, true] {
                        // Whole, and in pieces of 5 and of 32 elements (a multiple of 64
                        // bytes, as the pieces are cut where they can be).
                        for most in [None, Some(5), Some(32)] {
                            check(kind, count, n, in_place, most);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn an_allreduce_of_two_ranks_moves_four_times_its_bytes_a_rank() {
        let p = plan(
            CollKind::AllReduce,
            1024,
            2,
            0,
            4,
            (0x1000, 0x9000),
            false,
            &[0x10_0000, 0x20_0000],
            8192,
            4096,
        );
        // In: the half rank 1 reduces; share: both halves of the first chunk into the output
        // and the chunks half; out: rank 1's chunk from its chunks half.
        assert_eq!(
            p.copy_in,
            vec![Share {
                srcs: vec![(0, 0x1000 + 2048)],
                dsts: vec![(0, 0x10_0000 + 2048)],
                bytes: 2048
            }]
        );
        assert_eq!(
            p.share,
            vec![Share {
                srcs: vec![(0, 0x1000), (1, 0x20_0000)],
                dsts: vec![(0, 0x9000), (0, 0x10_0000 + 8192)],
                bytes: 2048
            }]
        );
        assert_eq!(
            p.copy_out,
            vec![Share {
                srcs: vec![(1, 0x20_0000 + 8192 + 2048)],
                dsts: vec![(0, 0x9000 + 2048)],
                bytes: 2048
            }]
        );
        let moved = |v: &[Share]| -> usize {
            v.iter()
                .map(|s| s.bytes * (s.srcs.len() + s.dsts.len()))
                .sum()
        };
        assert_eq!(
            moved(&p.copy_in) + moved(&p.share) + moved(&p.copy_out),
            4 * 4096
        );
    }

    #[test]
    fn pieces_fit_half_the_scratch_and_cover_the_call() {
        // 4-byte elements, 2 ranks: an allreduce needs 4 bytes an element, a reduce_scatter 8
        // (a block's element of each rank).
        assert_eq!(
            pieces(CollKind::AllReduce, 100, 2, 4, 400),
            vec![0..96, 96..100]
        );
        assert_eq!(
            pieces(CollKind::ReduceScatter, 100, 2, 4, 400),
            vec![0..48, 48..96, 96..100]
        );
        // Fewer than 64 bytes' worth fit: not rounded down to nothing.
        assert_eq!(pieces(CollKind::AllGather, 10, 3, 4, 20), vec![0..5, 5..10]);
        // Not one element fits.
        assert!(pieces(CollKind::AllToAll, 10, 8, 8, 32).is_empty());
        // A call that fits is one piece.
        assert_eq!(
            pieces(CollKind::Broadcast { root: 0 }, 7, 4, 2, 4096),
            vec![0..7]
        );
    }
}
