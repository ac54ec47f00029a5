//! Detection from sysfs: NUMA nodes (`/sys/devices/system/node`), PCI devices and the bridges
//! above them (`/sys/bus/pci/devices`: `class`, `vendor`, `device`, `numa_node`,
//! `current_link_speed`, `current_link_width`, the parent chain from the device's link),
//! network ports (`/sys/class/infiniband`, `/sys/class/net`) and the CPU's vendor and model
//! (`/proc/cpuinfo`), all read under a root directory so that tests can build a tree.
//!
//! Missing or unreadable files are normal (VMs, containers): a missing value leaves its
//! attribute out, a missing NUMA directory gives one node, and nothing here is an error.
//! The result is the NCCL-format tree that a topology file holds. NVLink state is not read
//! from sysfs (NVML has it); GPUs found here have no `<nvlink>` children and no `sm`.

use std::fs;
use std::path::{Path, PathBuf};

use super::xml::Elem;

/// Detects the hardware under `root` (`/` for this machine) as a `<system>` tree.
pub fn detect(root: &Path) -> Elem {
    let mut system = Elem::new("system").with("version", "1");
    let cpuinfo = read(&root.join("proc/cpuinfo")).unwrap_or_default();
    let field = |key: &str| -> Option<String> {
        cpuinfo.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
    };
    for numa in numa_nodes(root) {
        let mut cpu = Elem::new("cpu").with("numaid", numa.to_string());
        if let Some(list) = read(&root.join(format!("sys/devices/system/node/node{numa}/cpulist")))
        {
            cpu.set("cpulist", list);
        }
        cpu.set("arch", std::env::consts::ARCH);
        if let Some(v) = field("vendor_id") {
            cpu.set("vendor", v);
        }
        if let Some(v) = field("cpu family") {
            cpu.set("familyid", v);
        }
        if let Some(v) = field("model") {
            cpu.set("modelid", v);
        }
        system.children.push(cpu);
    }
    let pci = root.join("sys/bus/pci/devices");
    let mut gpus: Vec<String> = list_dir(&pci)
        .into_iter()
        .filter(|id| {
            let class = hex(&pci.join(id).join("class")).unwrap_or(0);
            let vendor = hex(&pci.join(id).join("vendor")).unwrap_or(0);
            class >> 16 == 0x03 && vendor == 0x10de
        })
        .collect();
    gpus.sort();
    for (dev, id) in gpus.iter().enumerate() {
        let gpu = Elem::new("gpu").with("dev", dev.to_string());
        attach(root, &mut system, id, gpu);
    }
    let mut seen: Vec<String> = Vec::new();
    let mut ndev = 0;
    for (name, dir, ib) in ports(root) {
        let Some(id) = busid_of(&dir) else {
            // Virtual interfaces (loopback, bridges, ifb) have no PCI device: not NICs.
            continue;
        };
        if seen.contains(&id) && !ib {
            continue;
        }
        seen.push(id.clone());
        let mut net = Elem::new("net").with("name", name.as_str());
        net.set("dev", ndev.to_string());
        ndev += 1;
        if ib {
            let port = root.join(format!("sys/class/infiniband/{name}/ports/1"));
            if let Some(rate) = read(&port.join("rate")) {
                if let Some(g) = rate
                    .split_whitespace()
                    .next()
                    .and_then(|g| g.parse::<f64>().ok())
                {
                    net.set("speed", ((g * 1000.0) as u64).to_string());
                }
            }
            net.set("port", "1");
            if let Some(l) = read(&port.join("link_layer")) {
                net.set("link_layer", l);
            }
        } else {
            let speed = read(&root.join(format!("sys/class/net/{name}/speed")));
            if let Some(s) = speed.and_then(|s| s.parse::<i64>().ok()).filter(|&s| s > 0) {
                net.set("speed", s.to_string());
            }
            net.set("link_layer", "Ethernet");
        }
        let nic = Elem::new("nic").child(net);
        attach(root, &mut system, &id, nic);
    }
    system
}

/// NUMA node numbers present (`node0`, `node1`, ...), or `[0]` when there are none.
fn numa_nodes(root: &Path) -> Vec<u64> {
    let mut nodes: Vec<u64> = list_dir(&root.join("sys/devices/system/node"))
        .iter()
        .filter_map(|n| n.strip_prefix("node")?.parse().ok())
        .collect();
    nodes.sort_unstable();
    if nodes.is_empty() {
        nodes.push(0);
    }
    nodes
}

/// Network ports: InfiniBand devices first, then network interfaces; (name, sysfs path, ib).
fn ports(root: &Path) -> Vec<(String, PathBuf, bool)> {
    let mut out = Vec::new();
    for (class, ib) in [("infiniband", true), ("net", false)] {
        let dir = root.join("sys/class").join(class);
        let mut names = list_dir(&dir);
        names.sort();
        for name in names {
            let p = dir.join(&name);
            out.push((name, p, ib));
        }
    }
    out
}

/// The PCI bus id a class entry belongs to: the last bus id in its link's target, or in its
/// `device` link's target.
fn busid_of(entry: &Path) -> Option<String> {
    let from = |p: &Path| fs::read_link(p).ok().and_then(|t| chain(&t).pop());
    from(entry).or_else(|| from(&entry.join("device")))
}

/// The PCI bus ids along a sysfs path, upstream first.
fn chain(target: &Path) -> Vec<String> {
    target
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .filter(|c| is_busid(c))
        .map(str::to_ascii_lowercase)
        .collect()
}

/// `0000:18:00.0`.
fn is_busid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && b.iter()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// Puts device `id` (with `leaf` inside its `<pci>`) under its CPU, below the bridges of its
/// chain, creating bridge elements as needed.
fn attach(root: &Path, system: &mut Elem, id: &str, leaf: Elem) {
    let pci = root.join("sys/bus/pci/devices");
    let mut ids = fs::read_link(pci.join(id))
        .map(|t| chain(&t))
        .unwrap_or_default();
    if ids.last().map(String::as_str) != Some(id) {
        ids = vec![id.to_string()];
    }
    let numa = read(&pci.join(id).join("numa_node"))
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|&v| v >= 0)
        .map(|v| v.to_string());
    let cpus = &mut system.children;
    let pos = numa
        .and_then(|n| {
            cpus.iter()
                .position(|c| c.attr("numaid") == Some(n.as_str()))
        })
        .unwrap_or(0);
    let Some(mut at) = cpus.get_mut(pos) else {
        return;
    };
    for (k, bus) in ids.iter().enumerate() {
        let i = match at
            .children
            .iter()
            .position(|c| c.name == "pci" && c.attr("busid") == Some(bus.as_str()))
        {
            Some(i) => i,
            None => {
                at.children.push(pci_elem(&pci.join(bus), bus));
                at.children.len() - 1
            }
        };
        at = &mut at.children[i];
        if k + 1 == ids.len() {
            at.children.push(leaf);
            return;
        }
    }
}

/// A `<pci>` element with the attributes sysfs has for `dir`.
fn pci_elem(dir: &Path, bus: &str) -> Elem {
    let mut e = Elem::new("pci").with("busid", bus);
    for (file, key) in [
        ("class", "class"),
        ("vendor", "vendor"),
        ("device", "device"),
        ("subsystem_vendor", "subsystem_vendor"),
        ("subsystem_device", "subsystem_device"),
        ("current_link_speed", "link_speed"),
        ("current_link_width", "link_width"),
    ] {
        if let Some(v) = read(&dir.join(file)).filter(|v| !v.is_empty() && v != "Unknown") {
            e.set(key, v);
        }
    }
    e
}

fn read(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

fn hex(p: &Path) -> Option<u64> {
    super::model::parse_int(&read(p)?)
}

fn list_dir(p: &Path) -> Vec<String> {
    fs::read_dir(p)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busids_and_chains() {
        assert!(is_busid("0000:18:00.0"));
        assert!(!is_busid("pci0000:00"));
        assert!(!is_busid("0000:1g:00.0"));
        let t = Path::new(
            "../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0",
        );
        assert_eq!(
            chain(t),
            [
                "0000:00:01.0",
                "0000:01:00.0",
                "0000:02:08.0",
                "0000:03:00.0"
            ]
        );
    }
}
