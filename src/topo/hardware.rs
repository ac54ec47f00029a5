//! One host's hardware, as ferroccl uses it: the NCCL-format tree (loaded from
//! `FERRO_TOPO_FILE` or detected), the [`Topo`] model built from it and its [`Paths`].
#![forbid(unsafe_code)]

use std::path::Path;

use super::model::{nvlink_gbps, NodeKind, Topo};
use super::paths::{PathType, Paths};
use super::search::{search, Search};
use super::xml::{self, Elem};
use crate::comm::{Config, DebugLevel};
use crate::{Error, Result};

/// A host's hardware: tree, model and paths.
#[derive(Debug, Clone, PartialEq)]
pub struct Hardware {
    /// The NCCL-format tree it was built from (what a dump writes).
    pub xml: Elem,
    /// The model.
    pub topo: Topo,
    /// Paths between every pair of nodes.
    pub paths: Paths,
}

impl Hardware {
    /// Builds the model of a `<system>` tree; `what` names the source in errors.
    pub fn from_xml(xml: Elem, what: &str) -> Result<Hardware> {
        let topo = Topo::from_xml(&xml)
            .map_err(|e| Error::invalid_argument(format!("topology {what}: {e}")))?;
        let paths = Paths::compute(&topo);
        Ok(Hardware { xml, topo, paths })
    }

    /// Parses NCCL topology XML text; `what` names the source in errors.
    pub fn parse(text: &str, what: &str) -> Result<Hardware> {
        let tree = xml::parse(text)
            .map_err(|e| Error::invalid_argument(format!("topology {what}: {e}")))?;
        Self::from_xml(tree, what)
    }

    /// Loads an NCCL topology file (`FERRO_TOPO_FILE`, `NCCL_TOPO_FILE`).
    pub fn load(path: &Path) -> Result<Hardware> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("reading topology file {}", path.display()), &e))?;
        Self::parse(&text, &format!("file {}", path.display()))
    }

    /// Detects the hardware under sysfs root `root` (`/` for this machine). On this machine
    /// (`/`), GPUs found are completed with NVML's NVLinks and compute capability where the
    /// library is present; without it the topology is the PCI tree.
    pub fn detect(root: &Path) -> Result<Hardware> {
        let mut tree = super::sysfs::detect(root);
        if root == Path::new("/") {
            let gpus = gpu_busids(&tree);
            if !gpus.is_empty() {
                if let Ok(found) = super::nvml::query(&gpus) {
                    super::nvml::complete(&mut tree, &found);
                }
            }
        }
        Self::from_xml(tree, "detected from sysfs")
    }

    /// Loads an NCCL topology file and completes it with what detection finds under `root`
    /// (`/` for this machine): the file's tree stands, detected GPUs and NICs are added, as
    /// NCCL does with `NCCL_TOPO_FILE`. This is what init does with `FERRO_TOPO_FILE`.
    pub fn load_completed(path: &Path, root: &Path) -> Result<Hardware> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("reading topology file {}", path.display()), &e))?;
        let what = format!("file {}", path.display());
        let mut tree = xml::parse(&text)
            .map_err(|e| Error::invalid_argument(format!("topology {what}: {e}")))?;
        // The file alone must make sense: its errors name its lines.
        Topo::from_xml(&tree)
            .map_err(|e| Error::invalid_argument(format!("topology {what}: {e}")))?;
        let detected = Self::detect(root)?;
        super::merge::complete(&mut tree, &detected.xml);
        Self::from_xml(tree, &format!("{what} completed by detection"))
    }

    /// Writes the tree as NCCL topology XML (`FERRO_TOPO_DUMP_FILE`).
    pub fn dump(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.xml.to_xml())
            .map_err(|e| Error::io(format!("writing topology file {}", path.display()), &e))
    }

    /// Rings, trees and NICs for this host's GPUs.
    pub fn search(&self) -> Search {
        search(&self.topo, &self.paths)
    }

    /// The matrix of `nvidia-smi topo -m`: for every GPU and NIC, the path to every other
    /// (`NV<n>`: n NVLinks, else NCCL's path type), then each GPU's NUMA node, then a legend.
    pub fn matrix(&self) -> String {
        let t = &self.topo;
        let gpus = t.gpus();
        let nics = t.nics();
        let mut labels: Vec<String> = (0..gpus.len()).map(|i| format!("GPU{i}")).collect();
        labels.extend((0..nics.len()).map(|i| format!("NIC{i}")));
        let nodes: Vec<usize> = gpus.iter().chain(&nics).copied().collect();
        let w = labels.iter().map(String::len).max().unwrap_or(4).max(5) + 2;
        let mut out = format!("{:w$}", "");
        for l in &labels {
            out.push_str(&format!("{l:<w$}"));
        }
        out.push_str("NUMA\n");
        for (i, &a) in nodes.iter().enumerate() {
            out.push_str(&format!("{:<w$}", labels[i]));
            for &b in &nodes {
                let cell = if a == b {
                    "X".to_string()
                } else {
                    self.cell(a, b)
                };
                out.push_str(&format!("{cell:<w$}"));
            }
            out.push_str(&format!("{}\n", t.nodes[t.nodes[a].cpu].dev));
        }
        out.push_str("\nLegend:\n  X    = self\n  NV#  = NVLink, # links (through NVSwitch or direct)\n  NVB  = NVLink through another GPU\n  PIX  = at most one PCIe switch\n  PXB  = several PCIe switches, no CPU\n  PHB  = through a CPU host bridge (same NUMA node)\n  SYS  = across the CPU interconnect\n");
        if !nics.is_empty() {
            out.push_str("\nNIC Legend:\n");
            for (i, &n) in nics.iter().enumerate() {
                let node = &t.nodes[n];
                let speed = if node.speed_gbps > 0.0 {
                    format!("{:.1} GB/s", node.speed_gbps)
                } else {
                    "speed unknown".to_string()
                };
                out.push_str(&format!(
                    "  NIC{i}: {} ({}, {speed})\n",
                    node.id, node.flavour
                ));
            }
        }
        out
    }

    fn cell(&self, a: usize, b: usize) -> String {
        let Some(p) = self.paths.direct(a, b) else {
            return "-".to_string();
        };
        if p.kind == PathType::Nvl {
            let na = &self.topo.nodes[a];
            if na.kind == NodeKind::Gpu {
                let per = nvlink_gbps(na.sm);
                return format!("NV{}", (p.gbps / per).round() as u64);
            }
        }
        p.kind.name().to_string()
    }

    /// The search as NCCL's graph XML (`NCCL_GRAPH_DUMP_FILE`'s format): a ring graph
    /// (pattern 4) and a tree graph (pattern 3) with the channels, each `<channel>` listing
    /// its NIC, its GPUs in ring order and the NIC again; speeds in GB/s, the intra type the
    /// worst path between ring neighbours, the inter type the worst GPU-to-NIC path.
    pub fn graph_xml(&self, s: &Search) -> Elem {
        let worst = |pairs: &mut dyn Iterator<Item = (usize, usize)>| {
            pairs
                .map(|(a, b)| self.paths.kind(a, b))
                .max()
                .unwrap_or(PathType::Loc)
        };
        let intra = worst(&mut s.channels.iter().flat_map(|c| {
            (0..c.ring.len())
                .map(move |i| (s.gpus[c.ring[i]], s.gpus[c.ring[(i + 1) % c.ring.len()]]))
        }));
        let inter = worst(
            &mut s
                .channels
                .iter()
                .filter_map(|c| Some((s.gpus[*c.ring.first()?], c.nic?))),
        );
        let speed = s.channels.first().map_or(0.0, |c| c.gbps);
        let nic_dev = |c: &super::search::Channel| c.nic.map(|n| self.topo.nodes[n].dev);
        let mut graphs = Elem::new("graphs").with("version", "1");
        for (id, pattern) in [(0, "4"), (1, "3")] {
            let mut g = Elem::new("graph")
                .with("id", id.to_string())
                .with("pattern", pattern)
                .with("crossnic", "0")
                .with("nchannels", s.channels.len().to_string())
                .with("speedintra", format!("{speed}"))
                .with("speedinter", format!("{speed}"))
                .with("latencyinter", "0")
                .with("typeintra", intra.name())
                .with("typeinter", inter.name())
                .with("samechannels", "0");
            for c in &s.channels {
                let mut ch = Elem::new("channel");
                if let Some(d) = nic_dev(c) {
                    ch.children
                        .push(Elem::new("net").with("dev", d.to_string()));
                }
                for &r in &c.ring {
                    let dev = self.topo.nodes[s.gpus[r]].dev;
                    ch.children
                        .push(Elem::new("gpu").with("dev", dev.to_string()));
                }
                if let Some(d) = nic_dev(c) {
                    ch.children
                        .push(Elem::new("net").with("dev", d.to_string()));
                }
                g.children.push(ch);
            }
            graphs.children.push(g);
        }
        graphs
    }

    /// A few lines saying what the host has: counts of CPUs, GPUs, NICs, NVSwitch.
    pub fn summary(&self) -> String {
        let t = &self.topo;
        format!(
            "{} CPU socket(s)/NUMA node(s), {} PCI switch(es)/bridge(s), {} GPU(s), {} NIC port(s){}",
            t.count(NodeKind::Cpu),
            t.count(NodeKind::Pci),
            t.count(NodeKind::Gpu),
            t.count(NodeKind::Nic),
            if t.count(NodeKind::NvSwitch) > 0 {
                ", NVSwitch"
            } else {
                ""
            }
        )
    }

    /// The channel and tree lines and each GPU's NIC, as `ferroccl-topo` and the `INFO` log
    /// print them.
    pub fn plan_lines(&self, s: &Search) -> Vec<String> {
        let mut out = s.channel_lines(&[]);
        for me in 0..s.gpus.len() {
            out.push(format!("rank {me}: {}", s.tree_line(me, &[])));
        }
        for (i, nic) in s.nic_of.iter().enumerate() {
            let g = s.gpus[i];
            let line = match nic {
                Some(n) => {
                    let node = &self.topo.nodes[*n];
                    format!(
                        "GPU{i} ({}) -> NIC {} ({}, {:.1} GB/s)",
                        self.topo.nodes[g].id,
                        node.id,
                        self.paths.kind(g, *n),
                        self.paths.gbps(g, *n)
                    )
                }
                None => format!("GPU{i} ({}) -> no NIC", self.topo.nodes[g].id),
            };
            out.push(line);
        }
        out
    }
}

/// What init does with the topology: loads `FERRO_TOPO_FILE` (a bad file fails init, naming
/// it and the line) or, when `FERRO_DEBUG=INFO` or a dump asks for it, detects; rank 0 writes
/// `FERRO_TOPO_DUMP_FILE` and `FERRO_GRAPH_DUMP_FILE` (a failed write is a warning); at `INFO` the host's first rank logs the hardware and the channels
/// and every rank its tree line, as NCCL does. Nothing runs when none of these is set.
pub(crate) fn at_init(
    config: &Config,
    rank: usize,
    descs: &[ferroccl_transport::RankDesc],
) -> Result<()> {
    let info = config.debug >= DebugLevel::Info;
    if config.topo_file.is_none()
        && config.topo_dump_file.is_none()
        && config.graph_dump_file.is_none()
        && !info
    {
        return Ok(());
    }
    let hw = match &config.topo_file {
        Some(f) => Hardware::load_completed(f, Path::new("/")).map_err(|e| {
            Error::invalid_argument(format!(
                "init: rank {rank}: FERRO_TOPO_FILE: {}",
                e.message()
            ))
        })?,
        None => Hardware::detect(Path::new("/"))?,
    };
    let found = hw.search();
    // A dump that cannot be written is worth a warning, not a failed communicator.
    if let (Some(out), 0) = (&config.topo_dump_file, rank) {
        if let Err(e) = hw.dump(out) {
            ferroccl_transport::log_line!("ferroccl rank {rank} WARN FERRO_TOPO_DUMP_FILE: {e}");
        }
    }
    if let (Some(out), 0) = (&config.graph_dump_file, rank) {
        if let Err(e) = std::fs::write(out, hw.graph_xml(&found).to_xml()) {
            ferroccl_transport::log_line!(
                "ferroccl rank {rank} WARN FERRO_GRAPH_DUMP_FILE: writing {}: {e}",
                out.display()
            );
        }
    }
    if !info {
        return Ok(());
    }
    let host = descs.get(rank).map(|d| d.host);
    let local: Vec<usize> = (0..descs.len())
        .filter(|&r| Some(descs[r].host) == host)
        .collect();
    let me = local.iter().position(|&r| r == rank).unwrap_or(0);
    let s = if !found.gpus.is_empty() && found.gpus.len() == local.len() {
        found
    } else {
        Search::cpu_ring(local.len())
    };
    if me == 0 {
        ferroccl_transport::log_line!("ferroccl rank {rank} GRAPH: {}", hw.summary());
        for line in s.channel_lines(&local) {
            ferroccl_transport::log_line!("ferroccl rank {rank} GRAPH: {line}");
        }
    }
    ferroccl_transport::log_line!("ferroccl rank {rank} GRAPH: {}", s.tree_line(me, &local));
    Ok(())
}

/// Bus ids of the `<pci>` elements that hold a `<gpu>`.
fn gpu_busids(e: &Elem) -> Vec<String> {
    let mut out = Vec::new();
    if e.name == "pci" && e.find("gpu").is_some() {
        if let Some(b) = e.attr("busid") {
            out.push(b.to_ascii_lowercase());
        }
    }
    for c in &e.children {
        out.extend(gpu_busids(c));
    }
    out
}
