//! Double binary tree all_reduce over hosts, with a chain inside each host, pipelined in
//! chunks (the shape NCCL builds).
//!
//! Hosts form two binary trees: tree 0 is the in-order tree on positions `1..=H` in which
//! position `p` with lowest set bit `b` has children `p - b/2` and `p + b/2` (odd positions are
//! leaves); tree 1 is tree 0 mirrored (even `H`) or shifted by one (odd `H`), so a host that is
//! a leaf in one tree is interior in the other. Inside a host the ranks form a chain: in tree 0
//! the first local rank talks to the other hosts and the chain runs down the local ranks; in
//! tree 1 the last local rank does, and the chain runs up. Each tree reduces and then
//! broadcasts half of the vector, in chunks of at most the slice.
//!
//! Every transfer (a chunk going up or down one edge) gets a global time slot: the first slot
//! in which its data is ready, the sender sends nothing else and the receiver receives nothing
//! else. Each rank's steps are its slots in order, so all ranks agree on the order of their
//! messages and no rendezvous can deadlock.
#![forbid(unsafe_code)]

use super::builder::Builder;
use super::{BufKind, Schedule, Span, Topology};

/// Children of 1-based position `p` in the in-order tree on `1..=h`.
fn host_children(p: usize, h: usize) -> Vec<usize> {
    let b = p & p.wrapping_neg();
    let mut out = Vec::new();
    if b > 1 {
        out.push(p - b / 2);
        let mut half = b / 2;
        while half >= 1 {
            if p + half <= h {
                out.push(p + half);
                break;
            }
            half /= 2;
        }
    }
    out
}

/// Parent of every host (by index) in tree 0 and tree 1; the root has none.
pub(crate) fn host_trees(h: usize) -> [Vec<Option<usize>>; 2] {
    let mut parent0 = vec![None; h];
    if h > 0 {
        let root = 1usize << (usize::BITS - 1 - h.leading_zeros());
        let mut stack = vec![root];
        while let Some(p) = stack.pop() {
            for c in host_children(p, h) {
                parent0[c - 1] = Some(p - 1);
                stack.push(c);
            }
        }
    }
    // Tree 1 places host i at position pos(i) of tree 0's shape.
    let pos = |i: usize| {
        if h.is_multiple_of(2) {
            h - 1 - i
        } else {
            (i + 1) % h
        }
    };
    let mut at_pos = vec![0; h];
    for i in 0..h {
        at_pos[pos(i)] = i;
    }
    let parent1 = (0..h).map(|i| parent0[pos(i)].map(|q| at_pos[q])).collect();
    [parent0, parent1]
}

/// A rank-level tree: parent and children of every rank.
struct RankTree {
    parent: Vec<Option<usize>>,
    children: Vec<Vec<usize>>,
    /// Ranks, parents before children.
    order: Vec<usize>,
}

fn rank_tree(hosts: &[Vec<usize>], host_parent: &[Option<usize>], reversed: bool) -> RankTree {
    let n: usize = hosts.iter().map(Vec::len).sum();
    let chain = |h: usize| -> Vec<usize> {
        let mut c = hosts[h].clone();
        if reversed {
            c.reverse();
        }
        c
    };
    let mut parent = vec![None; n];
    let mut children = vec![Vec::new(); n];
    for (h, hp) in host_parent.iter().enumerate() {
        let c = chain(h);
        for w in c.windows(2) {
            parent[w[1]] = Some(w[0]);
        }
        if let Some(ph) = hp {
            parent[c[0]] = Some(chain(*ph)[0]);
        }
    }
    let mut root = 0;
    for (r, p) in parent.iter().enumerate() {
        match p {
            Some(p) => children[*p].push(r),
            None => root = r,
        }
    }
    let mut order = Vec::with_capacity(n);
    let mut stack = vec![root];
    while let Some(r) = stack.pop() {
        order.push(r);
        stack.extend(children[r].iter().rev());
    }
    RankTree {
        parent,
        children,
        order,
    }
}

/// Slots taken, one bit per slot.
#[derive(Default, Clone)]
struct Slots(Vec<u64>);

impl Slots {
    fn is_free(&self, t: usize) -> bool {
        self.0.get(t / 64).is_none_or(|w| w >> (t % 64) & 1 == 0)
    }

    fn next_free(&self, mut t: usize) -> usize {
        while let Some(&w) = self.0.get(t / 64) {
            let free = !w >> (t % 64);
            if free != 0 {
                return t + free.trailing_zeros() as usize;
            }
            t = (t / 64 + 1) * 64;
        }
        t
    }

    fn take(&mut self, t: usize) {
        if self.0.len() <= t / 64 {
            self.0.resize(t / 64 + 1, 0);
        }
        self.0[t / 64] |= 1 << (t % 64);
    }
}

/// One transfer as one end sees it.
#[derive(Debug, Clone, Copy)]
struct Ev {
    slot: usize,
    peer: usize,
    /// Element range of the chunk.
    off: usize,
    len: usize,
    send: bool,
    /// Down the tree (broadcast) rather than up (reduce).
    down: bool,
}

/// Plans every transfer of every rank.
fn plan(count: usize, topo: &Topology, slice: usize) -> Vec<Vec<Ev>> {
    let hosts = topo.hosts();
    let n = topo.nranks();
    let parents = host_trees(hosts.len());
    let trees = [
        rank_tree(&hosts, &parents[0], false),
        rank_tree(&hosts, &parents[1], true),
    ];
    let half = count / 2;
    let halves = [(0, half), (half, count - half)];
    let slice = slice.max(1);
    let chunks = |t: usize| halves[t].1.div_ceil(slice);
    let mut evs: Vec<Vec<Ev>> = vec![Vec::new(); n];
    let mut sends = vec![Slots::default(); n];
    let mut recvs = vec![Slots::default(); n];
    let mut ready = vec![0usize; n];
    let mut place = |from: usize, to: usize, at: usize, off: usize, len: usize, down: bool| {
        let mut t = at;
        loop {
            t = sends[from].next_free(t).max(recvs[to].next_free(t));
            if sends[from].is_free(t) && recvs[to].is_free(t) {
                break;
            }
        }
        sends[from].take(t);
        recvs[to].take(t);
        let ev = Ev {
            slot: t,
            peer: to,
            off,
            len,
            send: true,
            down,
        };
        evs[from].push(ev);
        evs[to].push(Ev {
            peer: from,
            send: false,
            ..ev
        });
        t
    };
    for c in 0..chunks(0).max(chunks(1)) {
        for (t, tree) in trees.iter().enumerate() {
            if c >= chunks(t) {
                continue;
            }
            let off = halves[t].0 + c * slice;
            let len = slice.min(halves[t].0 + halves[t].1 - off);
            // Up: children before parents; a rank is ready once all its children arrived.
            for &r in tree.order.iter() {
                ready[r] = 0;
            }
            for &r in tree.order.iter().rev() {
                if let Some(p) = tree.parent[r] {
                    let s = place(r, p, ready[r], off, len, false);
                    ready[p] = ready[p].max(s + 1);
                }
            }
            // Down: parents before children.
            for &r in tree.order.iter() {
                for &ch in &tree.children[r] {
                    let s = place(r, ch, ready[r], off, len, true);
                    ready[ch] = s + 1;
                }
            }
        }
    }
    for e in &mut evs {
        e.sort_by_key(|ev| (ev.slot, ev.send));
    }
    evs
}

/// The schedule of `rank` from its planned transfers. Going up, the first arrival of a chunk is
/// reduced with the rank's input into its output and later ones into the output in place; a
/// rank that received nothing for a chunk sends it from its input.
fn emit(rank: usize, n: usize, evs: &[Ev]) -> Schedule {
    let mut b = Builder::new(rank, n);
    // Chunks already holding a partial result in the output (by chunk offset).
    let mut partial = std::collections::HashSet::new();
    let mut i = 0;
    while i < evs.len() {
        let slot = evs[i].slot;
        while i < evs.len() && evs[i].slot == slot {
            let e = evs[i];
            let out = Span::new(BufKind::Output, e.off, e.len);
            let inp = Span::new(BufKind::Input, e.off, e.len);
            match (e.send, e.down) {
                (true, false) => {
                    b.send(e.peer, if partial.contains(&e.off) { out } else { inp });
                }
                (false, false) => {
                    let src = if partial.insert(e.off) { inp } else { out };
                    b.recv_reduce(e.peer, src, out);
                }
                // Going down, a rank sends what it reduced (the root) or received.
                (true, true) => b.send(e.peer, out),
                (false, true) => {
                    partial.insert(e.off);
                    b.recv(e.peer, out);
                }
            }
            i += 1;
        }
        b.end_step();
    }
    b.finish(0)
}

/// Tree all_reduce schedules of all ranks of `topo` (at least 2 ranks).
pub(crate) fn all_reduce_all(count: usize, topo: &Topology, slice: usize) -> Vec<Schedule> {
    let n = topo.nranks();
    plan(count, topo, slice)
        .iter()
        .enumerate()
        .map(|(r, evs)| emit(r, n, evs))
        .collect()
}

/// Tree all_reduce schedule of `rank` (plans the whole tree: use [`all_reduce_all`] for every
/// rank at once).
pub(crate) fn all_reduce(count: usize, rank: usize, topo: &Topology, slice: usize) -> Schedule {
    let n = topo.nranks();
    let evs = plan(count, topo, slice);
    emit(rank, n, &evs[rank])
}
