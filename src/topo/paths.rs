//! Paths between the nodes of a [`Topo`]: for every pair, the best route (the least path type,
//! then the widest bottleneck), its type in NCCL's terms and the links it crosses.
#![forbid(unsafe_code)]

use std::fmt;

use super::model::{LinkKind, NodeKind, Topo};

/// The kind of a path, best first, as NCCL names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathType {
    /// The same node.
    Loc,
    /// NVLink, directly or through NVSwitches.
    Nvl,
    /// NVLink through an intermediate GPU.
    Nvb,
    /// PCIe through at most one switch.
    Pix,
    /// PCIe through several switches, not through a CPU.
    Pxb,
    /// A GPU reaches a NIC through an NVLink peer that is close to that NIC.
    Pxn,
    /// Through a CPU's host bridge (same NUMA node).
    Phb,
    /// Across the interconnect between CPU sockets.
    Sys,
    /// Across the network (another host).
    Net,
}

impl PathType {
    /// The short name (`NVL`, `PIX`, ...).
    pub fn name(self) -> &'static str {
        match self {
            PathType::Loc => "LOC",
            PathType::Nvl => "NVL",
            PathType::Nvb => "NVB",
            PathType::Pix => "PIX",
            PathType::Pxb => "PXB",
            PathType::Pxn => "PXN",
            PathType::Phb => "PHB",
            PathType::Sys => "SYS",
            PathType::Net => "NET",
        }
    }
}

impl fmt::Display for PathType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The best path from one node to another.
#[derive(Debug, Clone, PartialEq)]
pub struct Path {
    /// Its type.
    pub kind: PathType,
    /// Bottleneck bandwidth, GB/s (infinite for [`PathType::Loc`]).
    pub gbps: f64,
    /// Indices into [`Topo::links`], in order (for PXN: the NVLink hop, then the peer's path).
    pub links: Vec<usize>,
}

/// Paths between every pair of nodes; `None` where no route exists.
#[derive(Debug, Clone, PartialEq)]
pub struct Paths {
    n: usize,
    table: Vec<Option<Path>>,
    /// The PCI paths that a PXN route replaced: (from, to, path).
    replaced: Vec<(usize, usize, Path)>,
}

impl Paths {
    /// Computes every path of `topo`.
    pub fn compute(topo: &Topo) -> Paths {
        let n = topo.nodes.len();
        let mut table = Vec::with_capacity(n * n);
        for src in 0..n {
            table.extend(from_source(topo, src));
        }
        let mut paths = Paths {
            n,
            table,
            replaced: Vec::new(),
        };
        paths.add_pxn(topo);
        paths
    }

    /// The path from `a` to `b`.
    pub fn get(&self, a: usize, b: usize) -> Option<&Path> {
        if a >= self.n || b >= self.n {
            return None;
        }
        self.table[a * self.n + b].as_ref()
    }

    /// The path from `a` to `b` without NVLink peers on the way (what `nvidia-smi topo -m`
    /// shows): the same as [`Paths::get`] except where a PXN route replaced it.
    pub fn direct(&self, a: usize, b: usize) -> Option<&Path> {
        self.replaced
            .iter()
            .find(|(x, y, _)| (*x, *y) == (a, b))
            .map(|(_, _, p)| p)
            .or_else(|| self.get(a, b))
    }

    /// The type of the path from `a` to `b` (`SYS` when there is none).
    pub fn kind(&self, a: usize, b: usize) -> PathType {
        self.get(a, b).map_or(PathType::Sys, |p| p.kind)
    }

    /// The bottleneck of the path from `a` to `b` (0 when there is none).
    pub fn gbps(&self, a: usize, b: usize) -> f64 {
        self.get(a, b).map_or(0.0, |p| p.gbps)
    }

    /// A GPU whose best path to a NIC crosses a host bridge or the CPU interconnect may use
    /// an NVLink peer that sits on the NIC's PCI switch (NCCL's PXN): when that route is
    /// available its type is PXN and its bandwidth the lesser of the two halves.
    fn add_pxn(&mut self, topo: &Topo) {
        let gpus = topo.gpus();
        for &g in &gpus {
            for &nic in &topo.nics() {
                if self.kind(g, nic) <= PathType::Pxb {
                    continue;
                }
                let mut best: Option<Path> = None;
                for &peer in &gpus {
                    let (Some(hop), Some(rest)) = (self.get(g, peer), self.get(peer, nic)) else {
                        continue;
                    };
                    if peer == g || hop.kind != PathType::Nvl || rest.kind > PathType::Pxb {
                        continue;
                    }
                    let gbps = hop.gbps.min(rest.gbps);
                    if best.as_ref().is_none_or(|b| gbps > b.gbps) {
                        let mut links = hop.links.clone();
                        links.extend(&rest.links);
                        best = Some(Path {
                            kind: PathType::Pxn,
                            gbps,
                            links,
                        });
                    }
                }
                if let Some(p) = best {
                    if let Some(old) = self.table[g * self.n + nic].replace(p) {
                        self.replaced.push((g, nic, old));
                    }
                }
            }
        }
    }
}

/// A route being explored: its type, bottleneck, PCI switches crossed and links.
#[derive(Clone)]
struct Label {
    kind: PathType,
    gbps: f64,
    switches: usize,
    links: Vec<usize>,
}

impl Label {
    /// Whether `self` is a better route than `other`: lesser type, then wider, then shorter.
    fn better(&self, other: &Label) -> bool {
        (self.kind, other.gbps, self.links.len()) < (other.kind, self.gbps, other.links.len())
    }
}

/// Best routes from `src` to every node: a label-setting search in which a route's type is
/// the worst of its hops and its bandwidth the least of its links. A GPU is crossed only
/// from NVLink to NVLink (type NVB); a NIC is never crossed; crossing a CPU makes the route
/// PHB, crossing two PCI switches PXB.
fn from_source(topo: &Topo, src: usize) -> Vec<Option<Path>> {
    let n = topo.nodes.len();
    let mut best: Vec<Option<Label>> = vec![None; n];
    let mut done = vec![false; n];
    best[src] = Some(Label {
        kind: PathType::Loc,
        gbps: f64::INFINITY,
        switches: 0,
        links: Vec::new(),
    });
    loop {
        let mut pick: Option<usize> = None;
        for v in 0..n {
            if done[v] {
                continue;
            }
            if let Some(l) = &best[v] {
                if pick.is_none_or(|p| best[p].as_ref().is_some_and(|b| l.better(b))) {
                    pick = Some(v);
                }
            }
        }
        let Some(u) = pick else { break };
        done[u] = true;
        let Some(here) = best[u].clone() else { break };
        let node = &topo.nodes[u];
        if u != src {
            match node.kind {
                NodeKind::Nic => continue,
                NodeKind::Gpu if here.kind > PathType::Nvb => continue,
                _ => {}
            }
        }
        for (li, link) in topo.links_from(u) {
            let v = link.to;
            if done[v] {
                continue;
            }
            let mut kind = here.kind;
            let mut switches = here.switches;
            if u != src {
                kind = kind.max(match node.kind {
                    NodeKind::Gpu => PathType::Nvb,
                    NodeKind::Cpu => PathType::Phb,
                    NodeKind::Pci => {
                        switches += 1;
                        if switches > 1 {
                            PathType::Pxb
                        } else {
                            PathType::Pix
                        }
                    }
                    NodeKind::NvSwitch | NodeKind::Nic => PathType::Nvl,
                });
            }
            if node.kind == NodeKind::Gpu && u != src && link.kind != LinkKind::Nvl {
                continue;
            }
            kind = kind.max(match link.kind {
                LinkKind::Nvl => PathType::Nvl,
                LinkKind::Pci => PathType::Pix,
                LinkKind::Sys => PathType::Sys,
            });
            let mut links = here.links.clone();
            links.push(li);
            let cand = Label {
                kind,
                gbps: here.gbps.min(link.gbps),
                switches,
                links,
            };
            if best[v].as_ref().is_none_or(|b| cand.better(b)) {
                best[v] = Some(cand);
            }
        }
    }
    best.into_iter()
        .map(|l| {
            l.map(|l| Path {
                kind: l.kind,
                gbps: l.gbps,
                links: l.links,
            })
        })
        .collect()
}
