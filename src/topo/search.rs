//! Rings, trees and NICs that follow the hardware: per channel, a ring over the GPUs of a host
//! that carries the channel's bandwidth on every link it crosses, a chain (the intra-host part
//! of a tree) in the same order, and for every GPU the NIC nearest to it.
//!
//! As NCCL's search does, channels are found at a per-channel speed, fastest first: at each
//! speed from [`SPEEDS`] as many rings as the links' remaining bandwidth carries (up to
//! [`MAX_CHANNELS`]) are taken, and the speed whose channels carry most in total wins. A ring
//! uses a link once per hop that crosses it, so two hops over the same link halve what it
//! gives each; among rings of equal bandwidth the one of lesser path types (NVLink neighbours
//! adjacent) and then fewer crossings of the CPU interconnect wins. Up to 9 GPUs every ring
//! is tried; beyond, rings are built greedily.
#![forbid(unsafe_code)]

use super::model::{LinkKind, Topo};
use super::paths::{PathType, Paths};

/// Most channels a search returns.
pub const MAX_CHANNELS: usize = 16;

/// Per-channel speeds tried, GB/s, fastest first.
pub const SPEEDS: [f64; 19] = [
    60.0, 48.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 10.0, 8.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2, 0.6,
    0.3, 0.15,
];

/// Rings up to this many GPUs are searched exhaustively.
const EXHAUSTIVE_MAX: usize = 9;

/// One channel: the order of the host's GPUs (local ranks) around its ring, which is also its
/// tree's chain from the head (`ring[0]`, the GPU that talks to other hosts) down.
#[derive(Debug, Clone, PartialEq)]
pub struct Channel {
    /// Local ranks in ring order, starting at the head.
    pub ring: Vec<usize>,
    /// The channel's speed, GB/s.
    pub gbps: f64,
    /// The NIC (node index) the channel's traffic to other hosts uses.
    pub nic: Option<usize>,
}

/// What the search found for one host.
#[derive(Debug, Clone, PartialEq)]
pub struct Search {
    /// Node index of local rank `i`'s GPU (GPUs by CUDA device index).
    pub gpus: Vec<usize>,
    /// The channels.
    pub channels: Vec<Channel>,
    /// `nic_of[i]`: the NIC (node index) nearest local rank `i`'s GPU.
    pub nic_of: Vec<Option<usize>>,
}

impl Search {
    /// Total bandwidth of the channels, GB/s.
    pub fn total_gbps(&self) -> f64 {
        self.channels.iter().map(|c| c.gbps).sum()
    }

    /// NCCL's channel lines: `Channel 00/02 : 0 1 3 2`, one per channel; `ranks[i]` names
    /// local rank `i` (its own index where `ranks` is shorter).
    pub fn channel_lines(&self, ranks: &[usize]) -> Vec<String> {
        let n = self.channels.len();
        self.channels
            .iter()
            .enumerate()
            .map(|(c, ch)| {
                let order: Vec<String> = ch.ring.iter().map(|&i| name(ranks, i)).collect();
                format!("Channel {c:02}/{n:02} : {}", order.join(" "))
            })
            .collect()
    }

    /// NCCL's tree line of local rank `me`: `Trees [0] 1/-1/-1->0->-1 [1] ...`, per channel
    /// `child/-1/-1->me->parent` in the channel's chain (-1: none; the head's parent is the
    /// network, reached through the channel's NIC).
    pub fn tree_line(&self, me: usize, ranks: &[usize]) -> String {
        let mut line = "Trees".to_string();
        for (c, ch) in self.channels.iter().enumerate() {
            let Some(pos) = ch.ring.iter().position(|&r| r == me) else {
                continue;
            };
            let child = ch
                .ring
                .get(pos + 1)
                .map_or("-1".to_string(), |&r| name(ranks, r));
            let parent = match pos {
                0 => "-1".to_string(),
                p => name(ranks, ch.ring[p - 1]),
            };
            line.push_str(&format!(
                " [{c}] {child}/-1/-1->{}->{parent}",
                name(ranks, me)
            ));
        }
        line
    }

    /// One ring over `n` local ranks in rank order: what ranks without GPUs (CPU ranks) use.
    pub fn cpu_ring(n: usize) -> Search {
        Search {
            gpus: Vec::new(),
            channels: vec![Channel {
                ring: (0..n).collect(),
                gbps: 0.0,
                nic: None,
            }],
            nic_of: vec![None; n],
        }
    }
}

fn name(ranks: &[usize], i: usize) -> String {
    ranks.get(i).copied().unwrap_or(i).to_string()
}

/// Whether GPUs `a` and `b` (node indices) should talk peer to peer: their path is NVLink or
/// stays below PCI switches (at most PXB); otherwise data is staged through host memory.
pub fn p2p_allowed(paths: &Paths, a: usize, b: usize) -> bool {
    paths.kind(a, b) <= PathType::Pxb
}

/// Searches rings, trees and NICs for the GPUs of `topo`.
pub fn search(topo: &Topo, paths: &Paths) -> Search {
    let gpus = topo.gpus();
    let nic_of = nearest_nics(topo, paths, &gpus);
    let n = gpus.len();
    let mut channels = Vec::new();
    if n == 1 {
        channels.push(Channel {
            ring: vec![0],
            gbps: f64::INFINITY,
            nic: nic_of[0],
        });
    } else if n > 1 {
        let cap: Vec<f64> = topo.links.iter().map(|l| l.gbps).collect();
        let mut best: (f64, Vec<Vec<usize>>, f64) = (0.0, Vec::new(), 0.0);
        for &speed in &SPEEDS {
            if speed * MAX_CHANNELS as f64 <= best.0 + 1e-9 {
                break;
            }
            let mut residual = cap.clone();
            let mut rings: Vec<Vec<usize>> = Vec::new();
            while rings.len() < MAX_CHANNELS {
                let reuse = rings
                    .last()
                    .filter(|r| ring_bw(topo, paths, &gpus, r, &residual) >= speed - 1e-9)
                    .cloned();
                let Some(ring) = reuse.or_else(|| best_ring(topo, paths, &gpus, &residual, speed))
                else {
                    break;
                };
                for (l, k) in loads(paths, &gpus, &ring) {
                    residual[l] -= speed * k as f64;
                }
                rings.push(ring);
            }
            let total = speed * rings.len() as f64;
            if total > best.0 + 1e-9 {
                best = (total, rings, speed);
            }
        }
        let mut used: Vec<usize> = Vec::new();
        for &nic in nic_of.iter().flatten() {
            if !used.contains(&nic) {
                used.push(nic);
            }
        }
        for (c, ring) in best.1.into_iter().enumerate() {
            let nic = used.get(c % used.len().max(1)).copied();
            let start = ring
                .iter()
                .position(|&g| nic.is_some() && nic_of[g] == nic)
                .unwrap_or(0);
            let mut ring = ring;
            ring.rotate_left(start);
            channels.push(Channel {
                ring,
                gbps: best.2,
                nic,
            });
        }
    }
    Search {
        gpus,
        channels,
        nic_of,
    }
}

/// For every GPU, the NIC of the best path (least type, then widest), ties going to the NIC
/// fewest GPUs use so far, then to the first.
fn nearest_nics(topo: &Topo, paths: &Paths, gpus: &[usize]) -> Vec<Option<usize>> {
    let nics = topo.nics();
    let mut users = vec![0usize; nics.len()];
    gpus.iter()
        .map(|&g| {
            let pick = (0..nics.len())
                .filter(|&k| paths.get(g, nics[k]).is_some())
                .min_by(|&a, &b| {
                    let ka = (paths.kind(g, nics[a]), users[a], a);
                    let kb = (paths.kind(g, nics[b]), users[b], b);
                    let (ga, gb) = (paths.gbps(g, nics[a]), paths.gbps(g, nics[b]));
                    ka.0.cmp(&kb.0)
                        .then(gb.total_cmp(&ga))
                        .then(ka.1.cmp(&kb.1))
                        .then(ka.2.cmp(&kb.2))
                })?;
            users[pick] += 1;
            Some(nics[pick])
        })
        .collect()
}

/// How many times each link is crossed by the hops of `ring` (local ranks; closes the ring).
pub fn loads(paths: &Paths, gpus: &[usize], ring: &[usize]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for i in 0..ring.len() {
        let (a, b) = (gpus[ring[i]], gpus[ring[(i + 1) % ring.len()]]);
        for &l in paths.get(a, b).map(|p| p.links.as_slice()).unwrap_or(&[]) {
            match out.iter_mut().find(|(x, _)| *x == l) {
                Some(e) => e.1 += 1,
                None => out.push((l, 1)),
            }
        }
    }
    out
}

/// The bandwidth `ring` gets over links with `residual` GB/s left: the least, over the links
/// it crosses, of what is left divided by the times it crosses it (0 when a hop has no path).
pub fn ring_bw(
    topo: &Topo,
    paths: &Paths,
    gpus: &[usize],
    ring: &[usize],
    residual: &[f64],
) -> f64 {
    let _ = topo;
    for i in 0..ring.len() {
        if paths
            .get(gpus[ring[i]], gpus[ring[(i + 1) % ring.len()]])
            .is_none()
        {
            return 0.0;
        }
    }
    loads(paths, gpus, ring)
        .into_iter()
        .map(|(l, k)| residual[l] / k as f64)
        .fold(f64::INFINITY, f64::min)
}

/// The bottleneck of `ring` on the idle host, GB/s: what one ring alone gets.
pub fn ring_bottleneck(topo: &Topo, paths: &Paths, gpus: &[usize], ring: &[usize]) -> f64 {
    let cap: Vec<f64> = topo.links.iter().map(|l| l.gbps).collect();
    ring_bw(topo, paths, gpus, ring, &cap)
}

/// How many times the hops of `ring` cross the CPU interconnect.
pub fn sys_crossings(topo: &Topo, paths: &Paths, gpus: &[usize], ring: &[usize]) -> usize {
    loads(paths, gpus, ring)
        .into_iter()
        .filter(|&(l, _)| topo.links[l].kind == LinkKind::Sys)
        .map(|(_, k)| k)
        .sum()
}

/// Ranks a ring: bandwidth, then lesser path types, then fewer CPU-interconnect crossings.
fn score(
    topo: &Topo,
    paths: &Paths,
    gpus: &[usize],
    ring: &[usize],
    residual: &[f64],
) -> (f64, i64) {
    let bw = ring_bw(topo, paths, gpus, ring, residual);
    let types: i64 = (0..ring.len())
        .map(|i| paths.kind(gpus[ring[i]], gpus[ring[(i + 1) % ring.len()]]) as i64)
        .sum();
    let sys = sys_crossings(topo, paths, gpus, ring) as i64;
    (bw, -(types * 1000 + sys))
}

fn better(a: (f64, i64), b: (f64, i64)) -> bool {
    a.0 > b.0 + 1e-9 || ((a.0 - b.0).abs() <= 1e-9 && a.1 > b.1)
}

/// The best ring that carries at least `floor` GB/s on `residual`, or `None`.
fn best_ring(
    topo: &Topo,
    paths: &Paths,
    gpus: &[usize],
    residual: &[f64],
    floor: f64,
) -> Option<Vec<usize>> {
    let n = gpus.len();
    let mut best: Option<(Vec<usize>, (f64, i64))> = None;
    let mut consider = |ring: &[usize]| {
        let s = score(topo, paths, gpus, ring, residual);
        if s.0 >= floor - 1e-9 && best.as_ref().is_none_or(|b| better(s, b.1)) {
            best = Some((ring.to_vec(), s));
        }
    };
    if n <= EXHAUSTIVE_MAX {
        let mut ring: Vec<usize> = (0..n).collect();
        permute(&mut ring, 1, &mut |r| {
            // Each ring and its reverse are the same channel: keep one.
            if n < 3 || r[1] < r[n - 1] {
                consider(r);
            }
        });
    } else {
        // Greedy: from local rank 0, go to the unvisited GPU of the best path type, then widest.
        let mut ring = vec![0];
        let mut left: Vec<usize> = (1..n).collect();
        while !left.is_empty() {
            let last = gpus[*ring.last().unwrap_or(&0)];
            let k = (0..left.len())
                .min_by(|&a, &b| {
                    let (ga, gb) = (gpus[left[a]], gpus[left[b]]);
                    paths
                        .kind(last, ga)
                        .cmp(&paths.kind(last, gb))
                        .then(paths.gbps(last, gb).total_cmp(&paths.gbps(last, ga)))
                })
                .unwrap_or(0);
            ring.push(left.remove(k));
        }
        consider(&ring);
    }
    best.map(|b| b.0)
}

/// Calls `f` with every ordering of `v[k..]` (the prefix stays).
fn permute(v: &mut Vec<usize>, k: usize, f: &mut dyn FnMut(&[usize])) {
    if k + 1 >= v.len() {
        f(v);
        return;
    }
    for i in k..v.len() {
        v.swap(k, i);
        permute(v, k + 1, f);
        v.swap(k, i);
    }
}

/// Which PCI-level NIC flavour a path type gives GPUDirect RDMA: NCCL enables it up to PXB.
pub fn gdr_allowed(paths: &Paths, gpu: usize, nic: usize) -> bool {
    paths.kind(gpu, nic) <= PathType::Pxb
}
