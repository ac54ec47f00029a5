//! The simulator: runs the real schedules of a collective on a modelled cluster and predicts
//! its time. Pure code: no I/O; `ferroccl-sim` prints the results.
//!
//! Model: a rank starts step `t` when it finished step `t - 1` (its copies take
//! `bytes / copy_gbps`). A message takes `alpha + bytes / beta` of its link, times the
//! slowdown of the slower host, from when its sender is in the step that holds it: its first
//! [`Cluster::eager_bytes`] fit the transport's buffers (a socket write or a shared-memory
//! ring slot does not wait for the reader). Bytes beyond those wait for the receiver to be
//! in its step, and then for one `alpha` (a window update) before they move; with
//! `eager_bytes` 0 every message is a rendezvous, starting when both ends are in their steps.
//! A step ends when its last message does: for a receiver, when the message has arrived and
//! the receiver is in the step (and has reduced it: see below); for the sender of a message
//! that fits the buffers, when its bytes are through the link. Messages between the same two
//! ranks run in order: a later one's bytes start when the earlier one's are through (its
//! latency overlaps them).
//!
//! NICs: between hosts, each host's NIC is a queue in each direction. A message's bytes
//! hold the sender's outgoing side for `bytes / nic_gbps` (times the slowdown) in its first
//! free interval from when they could move, then the receiver's incoming side for as long in
//! its first free interval from then ([`Calendar`]); the bytes move from the start of the
//! second, at `min(beta, nic_gbps)`. Ranks of one host that cross at once thus take turns on
//! the NIC, and ranks that cross at different times (the two trees of the double binary
//! tree) each get all of it. Ranks enter their steps in time order, so a NIC serves messages
//! in about the order they become ready. A NIC with a token bucket of `B` bytes
//! ([`Cluster::nic_burst_bytes`]) lets bytes through up to `B / nic_gbps` earlier than that
//! queue would (a token-bucket shaper's output is a constant-rate server's shifted by the
//! bucket), but no earlier than a copy of them from when they could move.
//!
//! Reduction: a message that lands in a receive-and-reduce op ([`Op::RecvReduce`]) holds its
//! receiver `bytes / reduce_gbps` longer, times the same slowdown as the message: the
//! receiver's step ends no earlier than the message's end plus that time, the sender's no
//! earlier than the message's end. The link is free again at the message's end. A
//! non-positive or infinite `reduce_gbps` makes reductions free (pure alpha-beta).
//!
//! Memory: a call whose buffers on a host reach its cache ([`Cluster::cache_bytes`]: every
//! rank's send and receive buffers) moves its data through memory, not the cache: its copies
//! and shared-memory transfers run at no more than [`Cluster::mem_gbps`] each. Reductions
//! keep their rate: the executor reduces each piece of a message as it lands, while it is
//! still in the cache.
//!
//! Two modes:
//! * full: every rank's schedule is built and run (exact for the model);
//! * symmetric: on equal hosts with consecutive ranks (`rank / K` is the host), algorithms that
//!   look the same from every host (ring, hierarchical all_reduce / all_gather /
//!   reduce_scatter, pairwise) run only the schedules of host 0; a peer on another host is
//!   taken to behave like the rank of host 0 with the same local rank, shifted. Stragglers
//!   then slow every host by the worst factor (an upper bound).
#![forbid(unsafe_code)]

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use crate::coll::{
    build_all, build_with, AlgoOptions, Algorithm, CollArgs, CollKind, Op, Schedule, Topology,
};
use crate::plan::LinkCost;

/// A modelled cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    /// Hosts and ranks.
    pub topo: Topology,
    /// Link between ranks of one host.
    pub intra: LinkCost,
    /// Link between hosts (one flow).
    pub inter: LinkCost,
    /// NIC bandwidth of a host in GB/s, each way, which the host's messages across hosts
    /// queue for (see the module docs); `None`: the inter link's bandwidth.
    pub nic_gbps: Option<f64>,
    /// Bytes a NIC's token bucket holds (0: none, a NIC that never exceeds `nic_gbps`). A
    /// NIC idle long enough passes that many bytes at the copy bandwidth before falling back
    /// to `nic_gbps`, as a token-bucket shaper does (cloud instances' burst bandwidth, Linux
    /// `tbf`): see the module docs.
    pub nic_burst_bytes: usize,
    /// Local copy bandwidth in GB/s ([`DEFAULT_COPY_GBPS`] where a cluster is built from
    /// defaults).
    pub copy_gbps: f64,
    /// Reduction bandwidth in GB/s (10^9 B/s): bytes of received data a rank reduces into its
    /// destination per second. A message that lands in a receive-and-reduce op adds
    /// `bytes / reduce_gbps` to its receiver's step (see the module docs). A non-positive or
    /// infinite value makes reductions free (the pure alpha-beta model).
    /// [`DEFAULT_REDUCE_GBPS`] where a cluster is built from defaults.
    pub reduce_gbps: f64,
    /// Largest message, in bytes, that leaves its sender without waiting for the receiver
    /// (see the module docs); 0 makes every message a rendezvous. [`DEFAULT_EAGER_BYTES`]
    /// where a cluster is built from defaults.
    pub eager_bytes: usize,
    /// Ranks per core (1 or less: every rank has a core of its own). With `F` ranks per
    /// core a rank runs `1 / F` of the time: its copies, reductions and shared-memory
    /// transfers (copies by the CPU) take `F` times as long, and every message costs
    /// `(1 - 1 / F) * wake_us` more, the chance that its receiver is not running when it
    /// arrives times the time to get it running.
    pub ranks_per_core: f64,
    /// What a message costs beyond its link's latency when its receiver must first be given a
    /// core back (a wake-up and a context switch), in microseconds; used only with more
    /// than one rank per core.
    pub wake_us: f64,
    /// Bytes of a host's last-level cache (0: no memory term). A call whose send and receive
    /// buffers, summed over the ranks of the largest host, reach it is memory-bound: see
    /// [`Cluster::mem_gbps`].
    pub cache_bytes: usize,
    /// Rate in GB/s of each rank's copies and shared-memory transfers in a memory-bound
    /// call: its share of the host's memory bus with every rank of the host moving data, as
    /// a ring of shared-memory transfers of buffers larger than the cache measures it. The
    /// CPU rates above apply where they are lower. Reductions are not held to it: each
    /// piece of a message is reduced as it lands, from the cache. Non-positive: no memory
    /// term.
    pub mem_gbps: f64,
    /// Slowdown factor (>= 1) per host, in the order of [`Topology::hosts`]; missing hosts run
    /// at full speed.
    pub slowdown: Vec<f64>,
}

/// Default local copy bandwidth in GB/s: a memory-to-memory copy on a current CPU core.
pub const DEFAULT_COPY_GBPS: f64 = 10.0;

/// Default reduction bandwidth in GB/s: half of [`DEFAULT_COPY_GBPS`], since reducing a byte
/// reads it and the local contribution and writes the result (three memory streams where a
/// copy has two) and adds an arithmetic pass. Of the same order as a copy, so large reducing
/// collectives on one host are no longer priced as pure transfers.
pub const DEFAULT_REDUCE_GBPS: f64 = 5.0;

/// Default [`Cluster::eager_bytes`]: 64 KiB, what a fresh TCP connection's receive window
/// holds with Linux's default buffers (`tcp_rmem` 128 KiB); the shared-memory ring holds more
/// (4 MiB), sockets grow their buffers as they carry more.
pub const DEFAULT_EAGER_BYTES: usize = 64 << 10;

/// How the schedules were run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every rank.
    Full,
    /// Host 0's ranks standing in for every host.
    Symmetric,
}

/// The outcome of one simulated call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimResult {
    /// Predicted time in microseconds (the last rank to finish).
    pub time_us: f64,
    /// How the schedules were run.
    pub mode: Mode,
    /// Messages simulated (counting each once per simulated sender).
    pub messages: usize,
}

/// Most ops the full mode runs before refusing (memory and time).
pub const MAX_FULL_OPS: usize = 20_000_000;

/// Whether `algo` on `kind` looks the same from every host (see the module docs).
fn symmetric_algo(algo: Algorithm, kind: CollKind) -> bool {
    matches!(
        (algo, kind),
        (Algorithm::Ring, _)
            | (Algorithm::Pairwise, _)
            | (
                Algorithm::Hierarchical,
                CollKind::AllReduce | CollKind::AllGather | CollKind::ReduceScatter
            )
    )
}

/// Whether every rank moves the same number of messages: no part of any round is empty (an
/// empty part drops its messages on some ranks only, breaking the symmetry).
fn every_message_nonempty(
    args: &CollArgs,
    algo: Algorithm,
    n: usize,
    k: usize,
    opts: &AlgoOptions,
) -> bool {
    let count = args.count;
    if args.kind != CollKind::AllReduce {
        return count > 0;
    }
    let per_round = if algo == Algorithm::Hierarchical {
        k
    } else {
        n
    };
    let round = opts.slice.max(1).saturating_mul(per_round);
    count >= n && (count.is_multiple_of(round) || count % round >= n)
}

/// Ranks per host when `topo` is equal hosts of consecutive ranks.
fn host_major(topo: &Topology) -> Option<usize> {
    let hosts = topo.hosts();
    let k = hosts.first()?.len();
    let ok = hosts
        .iter()
        .enumerate()
        .all(|(h, rs)| rs.len() == k && rs.iter().enumerate().all(|(l, &r)| r == h * k + l));
    ok.then_some(k)
}

/// Simulates `args` with `algo` on `cluster`, elements of `elem_size` bytes. `symmetric`:
/// `Some(true)` forces the symmetric mode (an error where it does not apply), `Some(false)`
/// the full mode, `None` picks symmetric where it applies and more than 64 ranks run.
pub fn simulate(
    cluster: &Cluster,
    args: &CollArgs,
    elem_size: usize,
    algo: Algorithm,
    opts: &AlgoOptions,
    symmetric: Option<bool>,
) -> Result<SimResult, String> {
    simulate_calls(cluster, args, elem_size, algo, opts, symmetric, 1)
}

/// [`simulate`] for `calls` back-to-back calls, as a benchmark loop makes them: every rank
/// starts its next call when it finished the last one, and links, NICs and their token
/// buckets carry over. With more than one call the result is the time per call after the
/// first (which starts on idle links and full buckets); `calls` 0 counts as 1.
pub fn simulate_calls(
    cluster: &Cluster,
    args: &CollArgs,
    elem_size: usize,
    algo: Algorithm,
    opts: &AlgoOptions,
    symmetric: Option<bool>,
    calls: usize,
) -> Result<SimResult, String> {
    let topo = &cluster.topo;
    let n = topo.nranks();
    let k = host_major(topo).filter(|_| symmetric_algo(algo, args.kind));
    let use_sym = match symmetric {
        Some(true) => {
            if k.is_none() {
                return Err(format!(
                    "{}: symmetric simulation needs equal hosts of consecutive ranks and a \
                     ring, pairwise or hierarchical algorithm (got {algo})",
                    args.kind.name()
                ));
            }
            true
        }
        Some(false) => false,
        None => {
            k.is_some() && n > 64 && every_message_nonempty(args, algo, n, k.unwrap_or(1), opts)
        }
    };
    let how = How {
        use_sym,
        kk: k.unwrap_or(1),
        calls: calls.max(1),
    };
    run(cluster, args, elem_size, algo, opts, how)
}

/// How [`run`] runs: in the symmetric mode or not (`kk`: ranks per host for it), and how many
/// calls back to back.
#[derive(Debug, Clone, Copy)]
struct How {
    use_sym: bool,
    kk: usize,
    calls: usize,
}

/// One simulation.
fn run(
    cluster: &Cluster,
    args: &CollArgs,
    elem_size: usize,
    algo: Algorithm,
    opts: &AlgoOptions,
    how: How,
) -> Result<SimResult, String> {
    let How { use_sym, kk, calls } = how;
    let topo = &cluster.topo;
    let n = topo.nranks();
    let hosts = topo.hosts();
    let mut host_index = vec![0; n];
    for (h, rs) in hosts.iter().enumerate() {
        for &r in rs {
            host_index[r] = h;
        }
    }
    let (scheds, real): (Vec<Schedule>, Vec<usize>) = if use_sym {
        let s = (0..kk.min(n))
            .map(|r| build_with(args, r, n, opts, algo, topo))
            .collect::<Result<Vec<_>, _>>()?;
        (s, (0..kk.min(n)).collect())
    } else {
        // Estimate from a few ranks before building them all (the tree plans everything).
        let probe = if algo == Algorithm::Tree {
            0
        } else {
            [0, n / 2, n - 1]
                .into_iter()
                .map(|r| build_with(args, r, n, opts, algo, topo).map(|s| s.ops().count()))
                .collect::<Result<Vec<_>, _>>()?
                .into_iter()
                .max()
                .unwrap_or(0)
        };
        let estimate = probe.saturating_mul(n).saturating_mul(calls);
        if estimate > MAX_FULL_OPS {
            return Err(format!(
                "{}: about {estimate} ops to simulate with {algo} on {n} ranks (at most \
                 {MAX_FULL_OPS}); use a larger slice, a count of at least nranks or fewer calls",
                args.kind.name()
            ));
        }
        let s = build_all(args, n, opts, algo, topo)?;
        let ops = s
            .iter()
            .map(|s| s.ops().count())
            .sum::<usize>()
            .saturating_mul(calls);
        if ops > MAX_FULL_OPS {
            return Err(format!(
                "{}: {ops} ops to simulate with {algo} on {n} ranks (at most {MAX_FULL_OPS}); \
                 use a larger slice or fewer calls",
                args.kind.name()
            ));
        }
        (s, (0..n).collect())
    };
    // Sim index standing in for real rank p, and the shift from it to p.
    let rep = |p: usize| -> (usize, usize) {
        if use_sym {
            (p % kk, p - p % kk)
        } else {
            (p, 0)
        }
    };
    let slow = |h: usize| cluster.slowdown.get(h).copied().unwrap_or(1.0).max(1.0);
    let worst = (0..hosts.len()).map(slow).fold(1.0, f64::max);
    let nic = cluster.nic_gbps.unwrap_or(cluster.inter.beta_gbps);
    // Ranks sharing cores (see [`Cluster::ranks_per_core`]): CPU work takes `cpu` times as
    // long, and every message waits `wake` more.
    let cpu = if cluster.ranks_per_core > 1.0 {
        cluster.ranks_per_core
    } else {
        1.0
    };
    let wake = (1.0 - 1.0 / cpu) * cluster.wake_us.max(0.0);
    // A memory-bound call (see [`Cluster::cache_bytes`]): every rank's buffers on the largest
    // host reach the cache.
    let (send_len, recv_len) = args.kind.buffer_lens(args.count, n);
    let per_rank = if args.in_place {
        send_len.max(recv_len)
    } else {
        send_len + recv_len
    } * elem_size;
    let largest = hosts.iter().map(Vec::len).max().unwrap_or(1);
    let mem_bound = cluster.cache_bytes > 0
        && cluster.mem_gbps > 0.0
        && per_rank.saturating_mul(largest) >= cluster.cache_bytes;
    // The rate of CPU work that alone runs at `gbps`: shared with the other ranks of its core
    // and, in a memory-bound call, no faster than the memory bus lets each rank move data.
    let local = |gbps: f64| -> f64 {
        let r = gbps / cpu;
        if mem_bound {
            r.min(cluster.mem_gbps)
        } else {
            r
        }
    };
    let (intra_gbps, copy_gbps) = (local(cluster.intra.beta_gbps), local(cluster.copy_gbps));
    let reduce_gbps = cluster.reduce_gbps / cpu;
    // Slowdown of a message between real ranks `a` and `b`.
    let factor = |a: usize, b: usize| -> f64 {
        if use_sym {
            worst
        } else {
            slow(host_index[a]).max(slow(host_index[b]))
        }
    };
    let cost = |a: usize, b: usize, len: usize| -> f64 {
        let bytes = (len * elem_size) as f64;
        let (ha, hb) = (host_index[a], host_index[b]);
        let f = factor(a, b);
        let t = if ha == hb {
            cluster.intra.alpha_us + wake + bytes / (intra_gbps * 1e3)
        } else {
            cluster.inter.alpha_us + wake + bytes / (cluster.inter.beta_gbps.min(nic) * 1e3)
        };
        t * f
    };
    // The time a message of `len` elements keeps its link busy (its bytes, no latency): the
    // next message between the same two ranks cannot start moving bytes before that.
    let busy = |a: usize, b: usize, len: usize| -> f64 { cost(a, b, len) - cost(a, b, 0) };
    // How long a message of `len` elements from `a` to `b` holds the NICs (0 inside a host).
    let nic_time = |a: usize, b: usize, len: usize| -> f64 {
        if host_index[a] == host_index[b] {
            0.0
        } else {
            (len * elem_size) as f64 / (nic * 1e3) * factor(a, b)
        }
    };
    // Each host's NIC, outgoing and incoming side; in the symmetric mode host 0's stands for
    // every host's.
    let nics = if use_sym { 1 } else { hosts.len() };
    let mut nic_out = vec![Calendar::default(); nics];
    let mut nic_in = vec![Calendar::default(); nics];
    let nic_of = |p: usize| if use_sym { 0 } else { host_index[p] };
    // When the last byte of a message of `len` elements from `a` to `b`, free to move from
    // `t`, is through its link and, between hosts, through both NICs (booking them).
    let mut through = |a: usize, b: usize, len: usize, t: f64| -> f64 {
        let moving = busy(a, b, len);
        let d = nic_time(a, b, len);
        if d <= 0.0 {
            return t + moving;
        }
        let (out, inc) = (nic_of(a), nic_of(b));
        let s1 = nic_out[out].fit(t, d);
        nic_out[out].book(s1, d);
        let s2 = nic_in[inc].fit(s1, d);
        nic_in[inc].book(s2, d);
        if cluster.nic_burst_bytes == 0 {
            return s2 + moving;
        }
        let f = factor(a, b);
        let lead = cluster.nic_burst_bytes as f64 / (nic * 1e3) * f;
        let copy = (len * elem_size) as f64 / (copy_gbps * 1e3) * f;
        (s2 + moving - lead).max(t + copy)
    };
    // The time the receiver of a message of `len` elements from `a` to `b` spends reducing it
    // after it arrived, when it lands in a receive-and-reduce op.
    let reduce_free = !(cluster.reduce_gbps > 0.0 && cluster.reduce_gbps.is_finite());
    let reduce = |a: usize, b: usize, len: usize| -> f64 {
        if reduce_free {
            0.0
        } else {
            (len * elem_size) as f64 / (reduce_gbps * 1e3) * factor(a, b)
        }
    };
    let reduces = |op: &Op| matches!(op, Op::RecvReduce { .. });
    // When each (sender, receiver) pair's link is free again.
    let mut channel: HashMap<(usize, usize), f64> = HashMap::new();
    let partners = match_partners(&scheds, n, &rep)?;
    let copy_time = |s: &Schedule, t: usize| -> f64 {
        let bytes: usize = s.steps[t]
            .ops
            .iter()
            .map(|op| match *op {
                Op::Copy { src, dst } if src != dst => src.len * elem_size,
                _ => 0,
            })
            .sum();
        bytes as f64 / (copy_gbps * 1e3) * if use_sym { worst } else { 1.0 }
    };
    let m = scheds.len();
    // Steps of one call per simulated rank; step `t` of the run is step `t % len` of call
    // `t / len`.
    let lens: Vec<usize> = scheds.iter().map(|s| s.steps.len()).collect();
    // When the last rank finished each call.
    let mut call_end = vec![0.0f64; calls];
    let mut cur = vec![usize::MAX; m];
    let mut ready = vec![0.0f64; m];
    let mut finish = vec![0.0f64; m];
    let mut pending = vec![0usize; m];
    // Ranks whose step is settled, by the time they enter the next one (earliest first).
    let mut queue: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut messages = 0;
    let mut enter = |r: usize,
                     t: usize,
                     start: f64,
                     cur: &mut Vec<usize>,
                     ready: &mut Vec<f64>,
                     finish: &mut Vec<f64>,
                     pending: &mut Vec<usize>,
                     queue: &mut BinaryHeap<Reverse<(u64, usize)>>| {
        cur[r] = t;
        let s = &scheds[r];
        let len = lens[r];
        if t > 0 && t.is_multiple_of(len) {
            let c = &mut call_end[t / len - 1];
            *c = c.max(start);
        }
        if t >= len * calls {
            finish[r] = start;
            return;
        }
        let (call, t) = (t / len, t % len);
        ready[r] = start + copy_time(s, t);
        finish[r] = ready[r];
        let mut left = 0;
        for (i, op) in s.steps[t].ops.iter().enumerate() {
            let (peer, len, sends) = match *op {
                Op::Send { peer, src } => (peer, src.len, true),
                Op::Recv { peer, dst } | Op::RecvReduce { peer, dst, .. } => (peer, dst.len, false),
                Op::Copy { .. } => continue,
            };
            let (q, qs, j) = partners[r][t][i];
            // The partner's op is in the same call.
            let qs_run = call * lens[q] + qs;
            if q == r && qs == t {
                // The image of this rank on another host: matched within the step, once.
                if i < j {
                    let (a, b) = if sends {
                        (real[r], peer)
                    } else {
                        (peer, real[r])
                    };
                    let end = through(a, b, len, ready[r]) + cost(a, b, 0);
                    // This rank is both ends: it receives in op `j` when it sends in op `i`.
                    let recv = if sends { j } else { i };
                    let extra = if reduces(&s.steps[t].ops[recv]) {
                        reduce(a, b, len)
                    } else {
                        0.0
                    };
                    finish[r] = finish[r].max(end + extra);
                }
                if sends {
                    messages += 1;
                }
                continue;
            }
            if sends {
                messages += 1;
            }
            if cur[q] == qs_run {
                let (a, b) = if sends {
                    (real[r], peer)
                } else {
                    (peer, real[r])
                };
                // Messages between one pair run in order (as the executor runs them): a
                // later one's bytes follow the earlier one's, its latency overlaps them.
                let free = channel.get(&(a, b)).copied().unwrap_or(0.0);
                let (recv_op, sender, receiver) = if sends {
                    (&scheds[q].steps[qs].ops[j], r, q)
                } else {
                    (op, q, r)
                };
                // The first `eager_bytes` of a message fit the transport's buffers and move
                // as soon as the sender is in its step; the rest waits for the receiver, and
                // its first byte then for a round of latency (a window update). Then the
                // bytes wait for the NICs.
                let (lat, moving) = (cost(a, b, 0), busy(a, b, len));
                let bytes = len * elem_size;
                let mut start = ready[sender].max(free);
                if bytes > cluster.eager_bytes {
                    let early = cluster.eager_bytes as f64 / bytes as f64;
                    start = start.max(ready[receiver].max(free) - moving * early);
                }
                let end = through(a, b, len, start) + lat;
                channel.insert((a, b), end - lat);
                // The receiver reduces what landed in a receive-and-reduce op, once it is
                // there and in the step.
                let extra = if reduces(recv_op) {
                    reduce(a, b, len)
                } else {
                    0.0
                };
                let received = end.max(ready[receiver]) + extra;
                let sent = if bytes <= cluster.eager_bytes {
                    end - lat
                } else {
                    end
                };
                finish[sender] = finish[sender].max(sent);
                finish[receiver] = finish[receiver].max(received);
                pending[q] -= 1;
                if pending[q] == 0 {
                    queue.push(Reverse((key(finish[q]), q)));
                }
            } else {
                left += 1;
            }
        }
        pending[r] = left;
        if left == 0 {
            queue.push(Reverse((key(finish[r]), r)));
        }
    };
    for r in 0..m {
        enter(
            r,
            0,
            0.0,
            &mut cur,
            &mut ready,
            &mut finish,
            &mut pending,
            &mut queue,
        );
    }
    while let Some(Reverse((_, r))) = queue.pop() {
        let t = cur[r];
        if t >= lens[r] * calls {
            continue;
        }
        let start = finish[r];
        enter(
            r,
            t + 1,
            start,
            &mut cur,
            &mut ready,
            &mut finish,
            &mut pending,
            &mut queue,
        );
    }
    if let Some(r) = (0..m).find(|&r| cur[r] < lens[r] * calls) {
        return Err(format!(
            "{}: simulation stalled with rank {} at step {} of {} ({algo})",
            args.kind.name(),
            real[r],
            cur[r],
            lens[r] * calls
        ));
    }
    let last = finish.iter().copied().fold(0.0, f64::max);
    let time_us = if calls > 1 {
        (last - call_end[0]) / (calls - 1) as f64
    } else {
        last
    };
    Ok(SimResult {
        time_us,
        mode: if use_sym { Mode::Symmetric } else { Mode::Full },
        messages,
    })
}

/// A time as a key that orders as the time does (non-negative finite `f64`s order as their
/// bits; anything below zero counts as zero).
fn key(t: f64) -> u64 {
    (t.max(0.0) + 0.0).to_bits()
}

/// The busy intervals of one side of a NIC, disjoint, touching ones merged: start key -> end.
#[derive(Debug, Clone, Default)]
struct Calendar {
    busy: BTreeMap<u64, f64>,
}

impl Calendar {
    /// The earliest start at or after `t` of a free interval `d` long.
    fn fit(&self, t: f64, d: f64) -> f64 {
        let mut s = t.max(0.0);
        let from = self
            .busy
            .range(..=key(s))
            .next_back()
            .map_or(0, |(&k, _)| k);
        for (&start, &end) in self.busy.range(from..) {
            if f64::from_bits(start) >= s + d {
                break;
            }
            s = s.max(end);
        }
        s
    }

    /// Marks `[s, s + d)` busy; it must be free ([`Calendar::fit`]).
    fn book(&mut self, s: f64, d: f64) {
        let (mut s, mut e) = (s.max(0.0), s.max(0.0) + d);
        if let Some((&k, &end)) = self.busy.range(..=key(s)).next_back() {
            if end >= s {
                self.busy.remove(&k);
                s = f64::from_bits(k);
                e = e.max(end);
            }
        }
        if let Some((&k, &end)) = self.busy.range(key(s)..).next() {
            if f64::from_bits(k) <= e {
                self.busy.remove(&k);
                e = e.max(end);
            }
        }
        self.busy.insert(key(s), e);
    }
}

/// (peer, sends) -> (step, op) of one rank's messages, in order.
type OpIndex = HashMap<(usize, bool), Vec<(usize, usize)>>;

/// For every op of every simulated rank: (simulated partner, its step, its op index).
type Partners = Vec<Vec<Vec<(usize, usize, usize)>>>;

/// FIFO matching of the simulated ranks' messages; a peer `p` is stood in for by `rep(p)`
/// shifted by `rep(p).1`.
fn match_partners(
    scheds: &[Schedule],
    n: usize,
    rep: &dyn Fn(usize) -> (usize, usize),
) -> Result<Partners, String> {
    // Per simulated rank: (peer, sends) -> (step, op) in order.
    let mut index: Vec<OpIndex> = Vec::with_capacity(scheds.len());
    for s in scheds {
        let mut m: HashMap<(usize, bool), Vec<(usize, usize)>> = HashMap::new();
        for (t, step) in s.steps.iter().enumerate() {
            for (i, op) in step.ops.iter().enumerate() {
                let key = match *op {
                    Op::Send { peer, .. } => (peer, true),
                    Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => (peer, false),
                    Op::Copy { .. } => continue,
                };
                m.entry(key).or_default().push((t, i));
            }
        }
        index.push(m);
    }
    let mut partners: Partners = Vec::with_capacity(scheds.len());
    for (pos, s) in scheds.iter().enumerate() {
        let scheds_pos = |_: &Schedule| pos;
        let mut seen: HashMap<(usize, bool), usize> = HashMap::new();
        let mut per_step = Vec::with_capacity(s.steps.len());
        for step in &s.steps {
            let mut per_op = Vec::with_capacity(step.ops.len());
            for op in &step.ops {
                let (peer, sends) = match *op {
                    Op::Send { peer, .. } => (peer, true),
                    Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => (peer, false),
                    Op::Copy { .. } => {
                        per_op.push((usize::MAX, usize::MAX, usize::MAX));
                        continue;
                    }
                };
                let k = seen.entry((peer, sends)).or_insert(0);
                let (q, shift) = rep(peer);
                let me = (s.rank + n - shift % n) % n;
                let found = index
                    .get(q)
                    .and_then(|m| m.get(&(me, !sends)))
                    .and_then(|v| v.get(*k));
                let mine = index[scheds_pos(s)].get(&(peer, sends)).map_or(0, Vec::len);
                let theirs = index
                    .get(q)
                    .and_then(|m| m.get(&(me, !sends)))
                    .map_or(0, Vec::len);
                if mine != theirs {
                    return Err(format!(
                        "rank {}: {mine} messages {} rank {peer}, which has {theirs}",
                        s.rank,
                        if sends { "to" } else { "from" }
                    ));
                }
                let Some(&(qs, j)) = found else {
                    return Err(format!(
                        "rank {}: message {k} {} rank {peer} has no other end",
                        s.rank,
                        if sends { "to" } else { "from" }
                    ));
                };
                *k += 1;
                per_op.push((q, qs, j));
            }
            per_step.push(per_op);
        }
        partners.push(per_step);
    }
    Ok(partners)
}

/// nccl-tests' bus bandwidth factor for `kind` on `n` ranks.
pub fn busbw_factor(kind: CollKind, n: usize) -> f64 {
    let n = n as f64;
    match kind {
        CollKind::AllReduce => 2.0 * (n - 1.0) / n,
        CollKind::AllGather | CollKind::ReduceScatter | CollKind::AllToAll => (n - 1.0) / n,
        CollKind::Broadcast { .. } | CollKind::Reduce { .. } => 1.0,
    }
}

#[cfg(test)]
mod tests;
