//! The hardware model: CPUs (one per NUMA node), PCI bridges and switches, GPUs, NICs and
//! NVSwitches joined by links of known kind and bandwidth, built from NCCL's topology tree
//! ([`super::xml::Elem`], loaded or detected). [`super::paths`] computes the paths between
//! nodes from it.
//!
//! Bandwidths are GB/s each way, the effective figures NCCL's graph code works with:
//! a PCIe link moves `GT/s x lanes x 3/32` (12 GB/s for Gen3 x16, 24 for Gen4, 48 for Gen5);
//! an NVLink moves 18 (Pascal), 20 (Volta, Ampere), 20.6 (Hopper) or 40 (Blackwell) GB/s per
//! link; the CPU interconnect 6 (Broadwell QPI), 10 (Skylake UPI), 22 (Sapphire Rapids), 16
//! (AMD) GB/s; a NIC its port speed.
#![forbid(unsafe_code)]

use std::fmt;

use super::xml::Elem;

/// PCI class of a GPU target of an NVLink (`tclass`) and of an NVSwitch.
const CLASS_NVSWITCH: u32 = 0x068000;

/// Bandwidth assumed for a PCI link whose speed or width is unknown (VMs, partial files): Gen3 x16.
pub const DEFAULT_PCI_GBPS: f64 = 12.0;

/// What a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NodeKind {
    /// A CPU socket / NUMA node with its host bridge.
    Cpu,
    /// A PCI bridge or switch.
    Pci,
    /// A GPU.
    Gpu,
    /// One port of a network adapter.
    Nic,
    /// The NVSwitch fabric of the host (all NVSwitches as one node, as NCCL does).
    NvSwitch,
}

/// What a link is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkKind {
    /// NVLink (GPU to GPU, GPU to NVSwitch).
    Nvl,
    /// PCIe between a device and its upstream bridge or CPU.
    Pci,
    /// The CPU interconnect between sockets (QPI, UPI, Infinity Fabric).
    Sys,
}

/// A node of the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Kind.
    pub kind: NodeKind,
    /// PCI bus id (`0000:18:00.0`), `numa0` for a CPU, the port's name (`mlx5_0`) for a NIC,
    /// `nvswitch` for the NVSwitch node.
    pub id: String,
    /// Index of the CPU node (NUMA node) the node hangs under; a CPU's own index.
    pub cpu: usize,
    /// GPU: CUDA device index (`dev`); NIC: the `dev` of its `<net>`; else 0.
    pub dev: u32,
    /// GPU: communicator rank (`rank` attribute), when the file gives one.
    pub rank: Option<u32>,
    /// GPU: compute capability as NCCL writes it (`90` for 9.0).
    pub sm: u32,
    /// GPU, NIC: GPUDirect RDMA possible (`gdr="1"`).
    pub gdr: bool,
    /// NIC: port speed in GB/s; else 0.
    pub speed_gbps: f64,
    /// NIC: `IB`, `RoCE` or `Ethernet`; CPU: its vendor; else empty.
    pub flavour: String,
}

/// A directed link; [`Topo::links`] holds both directions of every physical link.
#[derive(Debug, Clone, PartialEq)]
pub struct Link {
    /// Source node index.
    pub from: usize,
    /// Destination node index.
    pub to: usize,
    /// Kind.
    pub kind: LinkKind,
    /// GB/s in this direction.
    pub gbps: f64,
}

/// The model of one host.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Topo {
    /// Nodes: CPUs first, then the others in file order.
    pub nodes: Vec<Node>,
    /// Directed links.
    pub links: Vec<Link>,
}

/// A file or tree that does not describe a usable topology: the line and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelError {
    /// Line of the offending element (0 for detected trees).
    pub line: usize,
    /// What was expected.
    pub msg: String,
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.msg)
    }
}

impl std::error::Error for ModelError {}

fn bad(e: &Elem, msg: impl Into<String>) -> ModelError {
    ModelError {
        line: e.line,
        msg: msg.into(),
    }
}

/// Parses `0x1b`, `27` or an empty string (None).
pub fn parse_int(v: &str) -> Option<u64> {
    let v = v.trim();
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

fn int_attr(e: &Elem, key: &str) -> Result<Option<u64>, ModelError> {
    match e.attr(key) {
        None => Ok(None),
        Some(v) if v.trim().is_empty() => Ok(None),
        Some(v) => parse_int(v).map(Some).ok_or_else(|| {
            bad(
                e,
                format!("<{}> attribute {key}={v:?}: expected an integer", e.name),
            )
        }),
    }
}

/// GB/s of a PCIe link from sysfs-style `link_speed` (`16.0 GT/s PCIe`, `16 GT/s`) and
/// `link_width`; `None` when either is unknown.
pub fn pci_gbps(speed: Option<&str>, width: Option<u64>) -> Option<f64> {
    let gts: f64 = speed?.split_whitespace().next()?.parse().ok()?;
    let w = width.filter(|&w| w > 0)? as f64;
    (gts > 0.0).then_some(gts * w * 3.0 / 32.0)
}

/// GB/s of one NVLink of a GPU of compute capability `sm`.
pub fn nvlink_gbps(sm: u32) -> f64 {
    match sm {
        0..=69 => 18.0,
        70..=89 => 20.0,
        90..=99 => 20.6,
        _ => 40.0,
    }
}

/// GB/s of the interconnect between two sockets, from the `<cpu>` attributes.
pub fn sys_gbps(cpu: &Elem) -> f64 {
    let arch = cpu.attr("arch").unwrap_or("");
    let vendor = cpu.attr("vendor").unwrap_or("");
    let model = cpu.attr("modelid").and_then(parse_int).unwrap_or(0);
    if arch == "ppc64" {
        return 32.0;
    }
    if arch == "arm64" || arch == "aarch64" {
        return 6.0;
    }
    match vendor {
        "AuthenticAMD" => 16.0,
        "GenuineIntel" if model >= 0x8f => 22.0,
        "GenuineIntel" if model >= 0x55 => 10.0,
        "GenuineIntel" => 6.0,
        _ => 10.0,
    }
}

impl Topo {
    /// Builds the model from a `<system>` tree. Unknown elements and attributes are kept in
    /// the tree but do not enter the model.
    pub fn from_xml(root: &Elem) -> Result<Topo, ModelError> {
        if root.name != "system" {
            return Err(bad(
                root,
                format!("expected <system> as the root, found <{}>", root.name),
            ));
        }
        let mut t = Topo::default();
        let cpus: Vec<&Elem> = root.children.iter().filter(|c| c.name == "cpu").collect();
        for (i, cpu) in cpus.iter().enumerate() {
            let numa = int_attr(cpu, "numaid")?.unwrap_or(i as u64);
            t.add_node(Node {
                kind: NodeKind::Cpu,
                id: format!("numa{numa}"),
                cpu: i,
                dev: numa as u32,
                rank: None,
                sm: 0,
                gdr: false,
                speed_gbps: 0.0,
                flavour: cpu.attr("vendor").unwrap_or("").to_string(),
            });
        }
        for i in 0..cpus.len() {
            for j in i + 1..cpus.len() {
                let bw = sys_gbps(cpus[i]).min(sys_gbps(cpus[j]));
                t.connect(i, j, LinkKind::Sys, bw);
            }
        }
        let mut nvlinks = Vec::new();
        for (i, cpu) in cpus.iter().enumerate() {
            for c in &cpu.children {
                t.device(c, i, i, &mut nvlinks)?;
            }
        }
        t.add_nvlinks(&nvlinks)?;
        Ok(t)
    }

    fn add_node(&mut self, n: Node) -> usize {
        self.nodes.push(n);
        self.nodes.len() - 1
    }

    /// Adds both directions of a physical link.
    pub fn connect(&mut self, a: usize, b: usize, kind: LinkKind, gbps: f64) {
        for (from, to) in [(a, b), (b, a)] {
            self.links.push(Link {
                from,
                to,
                kind,
                gbps,
            });
        }
    }

    fn blank(kind: NodeKind, id: &str, cpu: usize) -> Node {
        Node {
            kind,
            id: id.to_string(),
            cpu,
            dev: 0,
            rank: None,
            sm: 0,
            gdr: false,
            speed_gbps: 0.0,
            flavour: String::new(),
        }
    }

    /// Adds the device `e` (a `<pci>` or a `<nic>`) below node `parent`.
    fn device(
        &mut self,
        e: &Elem,
        parent: usize,
        cpu: usize,
        nvlinks: &mut Vec<(usize, Elem)>,
    ) -> Result<(), ModelError> {
        match e.name.as_str() {
            "pci" => {}
            "nic" => {
                // A NIC without a PCI position (e.g. a virtual one): hangs on the CPU.
                return self.nets(e, parent, cpu, DEFAULT_PCI_GBPS);
            }
            _ => return Ok(()),
        }
        let busid = e
            .attr("busid")
            .filter(|b| !b.trim().is_empty())
            .ok_or_else(|| bad(e, "<pci> without busid: expected busid=\"0000:18:00.0\""))?;
        let width = int_attr(e, "link_width")?;
        let bw = pci_gbps(e.attr("link_speed"), width).unwrap_or(DEFAULT_PCI_GBPS);
        if let Some(g) = e.find("gpu") {
            let mut n = Self::blank(NodeKind::Gpu, &busid.to_ascii_lowercase(), cpu);
            n.dev = int_attr(g, "dev")?.unwrap_or(0) as u32;
            n.rank = int_attr(g, "rank")?.map(|r| r as u32);
            n.sm = int_attr(g, "sm")?.unwrap_or(0) as u32;
            n.gdr = int_attr(g, "gdr")? == Some(1);
            let id = self.add_node(n);
            self.connect(id, parent, LinkKind::Pci, bw);
            for l in g.children.iter().filter(|l| l.name == "nvlink") {
                nvlinks.push((id, l.clone()));
            }
            return Ok(());
        }
        if let Some(nic) = e.find("nic") {
            return self.nets(nic, parent, cpu, bw);
        }
        // A leaf `<pci>` of a GPU or network class, as the files published for cloud VMs
        // give them (detection fills in `<gpu>` / `<nic>` on the machine itself): the device
        // is known by its position and class only.
        let class = int_attr(e, "class")?.unwrap_or(0) >> 16;
        if e.children.is_empty() && (class == 0x03 || class == 0x02) {
            let kind = if class == 0x03 {
                NodeKind::Gpu
            } else {
                NodeKind::Nic
            };
            let mut n = Self::blank(kind, &busid.to_ascii_lowercase(), cpu);
            n.dev = self.count(kind) as u32;
            n.flavour = if class == 0x02 {
                "unknown".into()
            } else {
                String::new()
            };
            let id = self.add_node(n);
            self.connect(id, parent, LinkKind::Pci, bw);
            return Ok(());
        }
        let id = self.add_node(Self::blank(NodeKind::Pci, &busid.to_ascii_lowercase(), cpu));
        self.connect(id, parent, LinkKind::Pci, bw);
        for c in &e.children {
            self.device(c, id, cpu, nvlinks)?;
        }
        Ok(())
    }

    fn nets(&mut self, nic: &Elem, parent: usize, cpu: usize, bw: f64) -> Result<(), ModelError> {
        for net in nic.children.iter().filter(|c| c.name == "net") {
            let name = net
                .attr("name")
                .ok_or_else(|| bad(net, "<net> without name: expected name=\"mlx5_0\""))?;
            let mut n = Self::blank(NodeKind::Nic, name, cpu);
            n.dev = int_attr(net, "dev")?.unwrap_or(0) as u32;
            n.gdr = int_attr(net, "gdr")? == Some(1);
            // `speed` is in Mb/s, as NCCL writes it.
            n.speed_gbps = int_attr(net, "speed")?.unwrap_or(0) as f64 / 8000.0;
            n.flavour = net_flavour(net);
            let id = self.add_node(n);
            self.connect(id, parent, LinkKind::Pci, bw);
        }
        Ok(())
    }

    fn add_nvlinks(&mut self, nvlinks: &[(usize, Elem)]) -> Result<(), ModelError> {
        let mut nvswitch = None;
        for (gpu, l) in nvlinks {
            let count = int_attr(l, "count")?.unwrap_or(1).max(1) as f64;
            let bw = count * nvlink_gbps(self.nodes[*gpu].sm);
            let tclass = int_attr(l, "tclass")?.unwrap_or(0) as u32;
            let target = l.attr("target").unwrap_or("").to_ascii_lowercase();
            if tclass == CLASS_NVSWITCH {
                let sw = *nvswitch.get_or_insert_with(|| {
                    let cpu = self.nodes[*gpu].cpu;
                    self.add_node(Self::blank(NodeKind::NvSwitch, "nvswitch", cpu))
                });
                self.connect(*gpu, sw, LinkKind::Nvl, bw);
            } else if tclass >> 16 == 0x03 {
                let Some(peer) = self
                    .nodes
                    .iter()
                    .position(|n| n.kind == NodeKind::Gpu && n.id == target)
                else {
                    return Err(bad(
                        l,
                        format!(
                            "<nvlink> target={target:?}: expected the busid of a <gpu>'s <pci>"
                        ),
                    ));
                };
                // Each GPU lists the link; keep one physical link per pair.
                if *gpu < peer {
                    self.connect(*gpu, peer, LinkKind::Nvl, bw);
                }
            } else {
                // NVLink to a CPU (POWER9): a fast link to the GPU's own socket.
                let cpu = self.nodes[*gpu].cpu;
                self.connect(*gpu, cpu, LinkKind::Nvl, bw);
            }
        }
        Ok(())
    }

    /// Indices of the nodes of `kind`, in model order.
    pub fn of_kind(&self, kind: NodeKind) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].kind == kind)
            .collect()
    }

    /// GPUs, ordered by CUDA device index.
    pub fn gpus(&self) -> Vec<usize> {
        let mut g = self.of_kind(NodeKind::Gpu);
        g.sort_by_key(|&i| (self.nodes[i].dev, i));
        g
    }

    /// NIC ports in model order.
    pub fn nics(&self) -> Vec<usize> {
        self.of_kind(NodeKind::Nic)
    }

    /// Number of nodes of `kind`.
    pub fn count(&self, kind: NodeKind) -> usize {
        self.of_kind(kind).len()
    }

    /// Links leaving node `n`.
    pub fn links_from(&self, n: usize) -> impl Iterator<Item = (usize, &Link)> {
        self.links
            .iter()
            .enumerate()
            .filter(move |(_, l)| l.from == n)
    }

    /// The physical link of `kind` from `a` to `b`, if there is one.
    pub fn link(&self, a: usize, b: usize, kind: LinkKind) -> Option<&Link> {
        self.links
            .iter()
            .find(|l| l.from == a && l.to == b && l.kind == kind)
    }
}

fn net_flavour(net: &Elem) -> String {
    let name = net.attr("name").unwrap_or("");
    match net.attr("link_layer").or(net.attr("type")) {
        Some(l) if l.eq_ignore_ascii_case("ethernet") && name.starts_with("mlx") => "RoCE".into(),
        Some(l) if l.eq_ignore_ascii_case("infiniband") || l.eq_ignore_ascii_case("ib") => {
            "IB".into()
        }
        Some(l) if l.eq_ignore_ascii_case("roce") => "RoCE".into(),
        Some(_) => "Ethernet".into(),
        None if name.starts_with("mlx") || name.starts_with("ib") => "IB".into(),
        None => "Ethernet".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topo::xml::parse;

    #[test]
    fn bandwidth_figures() {
        assert_eq!(pci_gbps(Some("8.0 GT/s PCIe"), Some(16)), Some(12.0));
        assert_eq!(pci_gbps(Some("16 GT/s"), Some(16)), Some(24.0));
        assert_eq!(pci_gbps(Some("32.0 GT/s PCIe"), Some(16)), Some(48.0));
        assert_eq!(pci_gbps(Some("Unknown"), Some(16)), None);
        assert_eq!(pci_gbps(Some("16 GT/s"), Some(0)), None);
        assert_eq!(pci_gbps(None, Some(16)), None);
        assert_eq!(nvlink_gbps(80), 20.0);
        assert_eq!(nvlink_gbps(90), 20.6);
        assert_eq!(parse_int("0x1b"), Some(27));
        assert_eq!(parse_int("27"), Some(27));
        assert_eq!(parse_int("x"), None);
    }

    #[test]
    fn bad_trees_name_the_line() {
        let e = Topo::from_xml(
            &parse("<system>\n<cpu>\n<pci class=\"0x030200\"/>\n</cpu>\n</system>").unwrap(),
        )
        .unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.msg.contains("busid"), "{e}");
        let e = Topo::from_xml(&parse("<system>\n<cpu numaid=\"zero\"/>\n</system>").unwrap())
            .unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.msg.contains("numaid=\"zero\""), "{e}");
        let e = Topo::from_xml(&parse("<topology/>").unwrap()).unwrap_err();
        assert!(e.msg.contains("expected <system>"), "{e}");
        let text = "<system><cpu><pci busid=\"0000:01:00.0\"><gpu dev=\"0\" sm=\"80\">\n<nvlink target=\"0000:99:00.0\" count=\"2\" tclass=\"0x030200\"/></gpu></pci></cpu></system>";
        let e = Topo::from_xml(&parse(text).unwrap()).unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.msg.contains("0000:99:00.0"), "{e}");
    }
}
