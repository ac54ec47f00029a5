//! Hierarchical algorithms: inside each host first, then across hosts among the ranks with the
//! same local rank, then inside each host again; only one rank per host and part crosses the
//! network for each piece of data.
//!
//! * all_reduce: ring reduce-scatter inside each host (local rank `j` ends with part `j` of
//!   the host's sum), ring all_reduce of part `j` across hosts among local ranks `j`, ring
//!   all_gather inside each host. With uneven hosts, `K` is the smallest host's size and a
//!   rank with local rank `l >= K` first folds its input into local rank `l mod K` and gets the
//!   result back at the end.
//! * all_gather (equal hosts): ring all_gather across hosts among local ranks `j`, then ring
//!   all_gather inside each host, local rank `j` forwarding the blocks it gathered.
//! * reduce_scatter (equal hosts): ring reduce-scatter inside each host, local rank `j`
//!   reducing the blocks of every host's local rank `j`, then ring reduce-scatter of those
//!   blocks across hosts.
//! * broadcast / reduce: a pipelined chain that visits the hosts one after another, so the
//!   data crosses the network once per host.
#![forbid(unsafe_code)]

use super::builder::{part, Builder};
use super::{BufKind, Schedule, Span, Topology};

/// Pieces `(base, len)` of `count` elements of at most `slice` elements.
fn pieces(count: usize, slice: usize) -> impl Iterator<Item = (usize, usize)> {
    let slice = slice.max(1);
    (0..count.div_ceil(slice)).map(move |k| (k * slice, slice.min(count - k * slice)))
}

/// Where `rank` sits: (host index, local rank).
fn locate(hosts: &[Vec<usize>], rank: usize) -> (usize, usize) {
    for (h, rs) in hosts.iter().enumerate() {
        if let Some(l) = rs.iter().position(|&r| r == rank) {
            return (h, l);
        }
    }
    (0, 0)
}

/// The chain order of hierarchical broadcast from `root`: the root, the rest of its host, then
/// the other hosts in order, each host's ranks in order.
fn host_chain(hosts: &[Vec<usize>], root: usize) -> Vec<usize> {
    let (rh, rl) = locate(hosts, root);
    let mut order = Vec::new();
    let first = &hosts[rh];
    order.extend(first[rl..].iter().chain(first[..rl].iter()));
    for k in 1..hosts.len() {
        order.extend(&hosts[(rh + k) % hosts.len()]);
    }
    order
}

fn slice_span(buf: BufKind, count: usize, slice: usize, k: usize) -> Span {
    let off = k * slice;
    Span::new(buf, off, slice.min(count - off))
}

/// Pipelined chain broadcast along `order` (`order[0]` is the root).
fn chain_broadcast(
    count: usize,
    in_place: bool,
    rank: usize,
    order: &[usize],
    slice: usize,
) -> Schedule {
    let n = order.len();
    let pos = order.iter().position(|&r| r == rank).unwrap_or(0);
    let slice = slice.max(1);
    let m = count.div_ceil(slice);
    let mut b = Builder::new(rank, n);
    if pos == 0 {
        if !in_place {
            b.copy(
                Span::new(BufKind::Input, 0, count),
                Span::new(BufKind::Output, 0, count),
            );
        }
        for k in 0..m {
            b.send(order[1], slice_span(BufKind::Input, count, slice, k));
            b.end_step();
        }
    } else {
        for t in pos - 1..pos + m {
            if t + 1 - pos < m {
                let s = slice_span(BufKind::Output, count, slice, t + 1 - pos);
                b.recv(order[pos - 1], s);
            }
            if pos < n - 1 && t >= pos {
                b.send(
                    order[pos + 1],
                    slice_span(BufKind::Output, count, slice, t - pos),
                );
            }
            b.end_step();
        }
    }
    b.finish(0)
}

/// Pipelined chain reduce along `order` (the last rank of `order` is the root).
fn chain_reduce(count: usize, rank: usize, order: &[usize], slice: usize) -> Schedule {
    let n = order.len();
    let pos = order.iter().position(|&r| r == rank).unwrap_or(0);
    let is_root = pos == n - 1;
    let slice = slice.max(1);
    let piece = slice.min(count);
    let m = count.div_ceil(slice);
    let slot = |k: usize| {
        let s = slice_span(BufKind::Scratch, count, slice, k);
        Span::new(BufKind::Scratch, (k % 2) * piece, s.len)
    };
    let mut b = Builder::new(rank, n);
    let mut scratch = 0;
    if pos == 0 {
        for k in 0..m {
            b.send(order[1], slice_span(BufKind::Input, count, slice, k));
            b.end_step();
        }
    } else {
        for t in pos - 1..pos + m {
            let k = t + 1 - pos;
            if k < m {
                let own = slice_span(BufKind::Input, count, slice, k);
                let dst = if is_root {
                    slice_span(BufKind::Output, count, slice, k)
                } else {
                    slot(k)
                };
                b.recv_reduce(order[pos - 1], own, dst);
            }
            if !is_root && t >= pos {
                b.send(order[pos + 1], slot(t - pos));
            }
            b.end_step();
        }
        if !is_root {
            scratch = m.min(2) * piece;
        }
    }
    b.finish(scratch)
}

/// Hierarchical broadcast: a chain over the hosts (see the module docs).
pub(crate) fn broadcast(
    count: usize,
    in_place: bool,
    rank: usize,
    root: usize,
    topo: &Topology,
    slice: usize,
) -> Schedule {
    let order = host_chain(&topo.hosts(), root);
    chain_broadcast(count, in_place, rank, &order, slice)
}

/// Hierarchical reduce: a chain over the hosts ending at the root.
pub(crate) fn reduce(
    count: usize,
    rank: usize,
    root: usize,
    topo: &Topology,
    slice: usize,
) -> Schedule {
    let mut order = host_chain(&topo.hosts(), root);
    order.reverse();
    chain_reduce(count, rank, &order, slice)
}

/// Ring reduce-scatter of `region` (`base`, `len`) among `group` (my index `me`): member `i`
/// ends with part `i` of the group's sum in the output. Local operands come from `cur`.
fn ring_reduce_scatter(
    b: &mut Builder,
    group: &[usize],
    me: usize,
    (base, len): (usize, usize),
    cur: BufKind,
) {
    let g = group.len();
    if g < 2 {
        return;
    }
    let next = group[(me + 1) % g];
    let prev = group[(me + g - 1) % g];
    let span = |buf: BufKind, c: usize| {
        let (off, l) = part(len, g, c);
        Span::new(buf, base + off, l)
    };
    for s in 0..g - 1 {
        let sc = (me + 2 * g - s - 1) % g;
        let rc = (me + 2 * g - s - 2) % g;
        let src = if s == 0 { cur } else { BufKind::Output };
        b.send(next, span(src, sc));
        b.recv_reduce(prev, span(cur, rc), span(BufKind::Output, rc));
        b.end_step();
    }
}

/// Ring all-gather of `region` among `group`: member `i` holds part `i` in the output.
fn ring_all_gather(b: &mut Builder, group: &[usize], me: usize, (base, len): (usize, usize)) {
    let g = group.len();
    if g < 2 {
        return;
    }
    let next = group[(me + 1) % g];
    let prev = group[(me + g - 1) % g];
    let span = |c: usize| {
        let (off, l) = part(len, g, c);
        Span::new(BufKind::Output, base + off, l)
    };
    for s in 0..g - 1 {
        b.send(next, span((me + g - s) % g));
        b.recv(prev, span((me + 2 * g - s - 1) % g));
        b.end_step();
    }
}

/// Hierarchical all_reduce (see the module docs) for `rank` of `topo` (at least 2 ranks).
pub(crate) fn all_reduce(count: usize, rank: usize, topo: &Topology, slice: usize) -> Schedule {
    let hosts = topo.hosts();
    let n = topo.nranks();
    let (h, l) = locate(&hosts, rank);
    let k = hosts.iter().map(Vec::len).min().unwrap_or(1);
    let mine = &hosts[h];
    let mut b = Builder::new(rank, n);
    let slice = slice.max(1);
    if l >= k {
        // Fold into local rank l mod k, get the result back at the end.
        let target = mine[l % k];
        for (base, len) in pieces(count, slice) {
            b.send(target, Span::new(BufKind::Input, base, len));
            b.end_step();
        }
        for (base, len) in pieces(count, slice) {
            b.recv(target, Span::new(BufKind::Output, base, len));
            b.end_step();
        }
        return b.finish(0);
    }
    let extras: Vec<usize> = (l + k..mine.len()).step_by(k).map(|e| mine[e]).collect();
    let mut cur = BufKind::Input;
    for &e in &extras {
        for (base, len) in pieces(count, slice) {
            let own = Span::new(cur, base, len);
            b.recv_reduce(e, own, Span::new(BufKind::Output, base, len));
            b.end_step();
        }
        cur = BufKind::Output;
    }
    let local: Vec<usize> = mine[..k].to_vec();
    let across: Vec<usize> = hosts.iter().map(|rs| rs[l]).collect();
    let rounds: Vec<(usize, usize)> = pieces(count, slice.saturating_mul(k)).collect();
    for &round in &rounds {
        ring_reduce_scatter(&mut b, &local, l, round, cur);
    }
    let after_local = if k >= 2 { BufKind::Output } else { cur };
    for &(base, len) in &rounds {
        let (off, plen) = part(len, k, l);
        let mine_part = (base + off, plen);
        ring_reduce_scatter(&mut b, &across, h, mine_part, after_local);
        ring_all_gather(&mut b, &across, h, mine_part);
    }
    for &round in &rounds {
        ring_all_gather(&mut b, &local, l, round);
    }
    // With one rank per host and one host nothing moved yet: impossible for n >= 2.
    for &e in &extras {
        for (base, len) in pieces(count, slice) {
            b.send(e, Span::new(BufKind::Output, base, len));
            b.end_step();
        }
    }
    b.finish(0)
}

/// Why hierarchical all_gather / reduce_scatter cannot run on `topo`, if so.
pub(crate) fn needs_equal_hosts(topo: &Topology, what: &str) -> Result<(), String> {
    if topo.is_uniform() {
        Ok(())
    } else {
        let sizes: Vec<usize> = topo.hosts().iter().map(Vec::len).collect();
        Err(format!(
            "{what}: hierarchical algorithm needs the same number of ranks on every host, \
             got {sizes:?}"
        ))
    }
}

/// Hierarchical all_gather for `rank` of `topo` (equal hosts, at least 2 ranks).
pub(crate) fn all_gather(
    count: usize,
    in_place: bool,
    rank: usize,
    topo: &Topology,
    slice: usize,
) -> Schedule {
    let hosts = topo.hosts();
    let n = topo.nranks();
    let (h, l) = locate(&hosts, rank);
    let (nh, k) = (hosts.len(), hosts[h].len());
    let mut b = Builder::new(rank, n);
    if !in_place {
        b.copy(
            Span::new(BufKind::Input, 0, count),
            Span::new(BufKind::Output, rank * count, count),
        );
    }
    let pcs: Vec<(usize, usize)> = pieces(count, slice).collect();
    let across: Vec<usize> = hosts.iter().map(|rs| rs[l]).collect();
    if nh >= 2 {
        let next = across[(h + 1) % nh];
        let prev = across[(h + nh - 1) % nh];
        for &(base, len) in &pcs {
            for s in 0..nh - 1 {
                let sm = (h + nh - s) % nh;
                let rm = (h + 2 * nh - s - 1) % nh;
                let src = if s == 0 {
                    Span::new(BufKind::Input, base, len)
                } else {
                    Span::new(BufKind::Output, across[sm] * count + base, len)
                };
                b.send(next, src);
                b.recv(
                    prev,
                    Span::new(BufKind::Output, across[rm] * count + base, len),
                );
                b.end_step();
            }
        }
    }
    if k >= 2 {
        let local = &hosts[h];
        let next = local[(l + 1) % k];
        let prev = local[(l + k - 1) % k];
        let blocks = |j: usize, base: usize, len: usize| {
            hosts
                .iter()
                .map(move |rs| Span::new(BufKind::Output, rs[j] * count + base, len))
        };
        for &(base, len) in &pcs {
            for s in 0..k - 1 {
                for sp in blocks((l + k - s) % k, base, len) {
                    b.send(next, sp);
                }
                for sp in blocks((l + 2 * k - s - 1) % k, base, len) {
                    b.recv(prev, sp);
                }
                b.end_step();
            }
        }
    }
    b.finish(0)
}

/// Hierarchical reduce_scatter for `rank` of `topo` (equal hosts, at least 2 ranks). Out of
/// place, partial sums live in scratch laid out like the input; in place, in the input.
pub(crate) fn reduce_scatter(
    count: usize,
    in_place: bool,
    rank: usize,
    topo: &Topology,
    slice: usize,
) -> Schedule {
    let hosts = topo.hosts();
    let n = topo.nranks();
    let (h, l) = locate(&hosts, rank);
    let (nh, k) = (hosts.len(), hosts[h].len());
    let acc = if in_place {
        BufKind::Input
    } else {
        BufKind::Scratch
    };
    let mut b = Builder::new(rank, n);
    let pcs: Vec<(usize, usize)> = pieces(count, slice).collect();
    let mut cur = BufKind::Input;
    if k >= 2 {
        let local = &hosts[h];
        let next = local[(l + 1) % k];
        let prev = local[(l + k - 1) % k];
        let blocks = |buf: BufKind, j: usize, base: usize, len: usize| {
            hosts
                .iter()
                .map(move |rs| Span::new(buf, rs[j] * count + base, len))
        };
        for &(base, len) in &pcs {
            for s in 0..k - 1 {
                let sc = (l + 2 * k - s - 1) % k;
                let rc = (l + 2 * k - s - 2) % k;
                let src = if s == 0 { BufKind::Input } else { acc };
                for sp in blocks(src, sc, base, len) {
                    b.send(next, sp);
                }
                for (own, dst) in
                    blocks(BufKind::Input, rc, base, len).zip(blocks(acc, rc, base, len))
                {
                    b.recv_reduce(prev, own, dst);
                }
                b.end_step();
            }
        }
        cur = acc;
    }
    let across: Vec<usize> = hosts.iter().map(|rs| rs[l]).collect();
    let out = |base: usize, len: usize| Span::new(BufKind::Output, base, len);
    if nh >= 2 {
        let next = across[(h + 1) % nh];
        let prev = across[(h + nh - 1) % nh];
        for &(base, len) in &pcs {
            let blk = |buf: BufKind, m: usize| Span::new(buf, across[m] * count + base, len);
            for s in 0..nh - 1 {
                let sm = (h + 2 * nh - s - 1) % nh;
                let rm = (h + 2 * nh - s - 2) % nh;
                let src = if s == 0 { cur } else { acc };
                b.send(next, blk(src, sm));
                let dst = if s == nh - 2 {
                    out(base, len)
                } else {
                    blk(acc, rm)
                };
                b.recv_reduce(prev, blk(cur, rm), dst);
                b.end_step();
            }
        }
    } else {
        for &(base, len) in &pcs {
            b.copy(Span::new(cur, rank * count + base, len), out(base, len));
        }
        b.end_step();
    }
    let scratch = if in_place { 0 } else { n * count };
    b.finish(scratch)
}
