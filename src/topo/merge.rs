//! A topology file completed by detection, as NCCL does with `NCCL_TOPO_FILE`: the file's
//! CPUs and PCI tree stand (cloud VMs hide the real switches behind a flat virtual bus, and
//! their providers publish files that restore them), and what detection found on the machine
//! (GPUs with their NVLinks, NICs with their ports and speeds) is added: under the file's
//! `<pci>` of the same bus id where there is one, else under the file's CPU of the device's
//! NUMA node, below the bridges detection saw.
#![forbid(unsafe_code)]

use super::xml::Elem;

/// Adds to `file` the devices of `detected` (both `<system>` trees).
pub fn complete(file: &mut Elem, detected: &Elem) {
    for cpu in detected.children.iter().filter(|c| c.name == "cpu") {
        let mut chain: Vec<&Elem> = Vec::new();
        walk(cpu, &mut chain, &mut |chain, dev| {
            place(file, cpu, chain, dev)
        });
    }
}

/// Calls `f(bridges above, device)` for every `<pci>` holding a `<gpu>` or `<nic>` under `e`.
fn walk<'a>(e: &'a Elem, chain: &mut Vec<&'a Elem>, f: &mut dyn FnMut(&[&Elem], &Elem)) {
    for c in e.children.iter().filter(|c| c.name == "pci") {
        if c.find("gpu").is_some() || c.find("nic").is_some() {
            f(chain, c);
        } else {
            chain.push(c);
            walk(c, chain, f);
            chain.pop();
        }
    }
}

fn busid(e: &Elem) -> String {
    e.attr("busid").unwrap_or("").to_ascii_lowercase()
}

fn find_mut<'a>(e: &'a mut Elem, id: &str) -> Option<&'a mut Elem> {
    if e.name == "pci" && busid(e) == id {
        return Some(e);
    }
    e.children.iter_mut().find_map(|c| find_mut(c, id))
}

fn place(file: &mut Elem, cpu: &Elem, chain: &[&Elem], dev: &Elem) {
    let id = busid(dev);
    if let Some(there) = find_mut(file, &id) {
        for (k, v) in &dev.attrs {
            if there.attr(k).is_none() {
                there.set(k, v.as_str());
            }
        }
        for c in dev
            .children
            .iter()
            .filter(|c| c.name == "gpu" || c.name == "nic")
        {
            if there.find(&c.name).is_none() {
                there.children.push(c.clone());
            }
        }
        return;
    }
    let numa = cpu.attr("numaid");
    let pos = file
        .children
        .iter()
        .position(|c| c.name == "cpu" && c.attr("numaid") == numa)
        .or_else(|| file.children.iter().position(|c| c.name == "cpu"));
    let Some(pos) = pos else {
        file.children
            .push(Elem::new("cpu").with("numaid", numa.unwrap_or("0")));
        return place(file, cpu, chain, dev);
    };
    let mut at = &mut file.children[pos];
    for bridge in chain {
        let b = busid(bridge);
        let i = match at
            .children
            .iter()
            .position(|c| c.name == "pci" && busid(c) == b)
        {
            Some(i) => i,
            None => {
                let mut copy = (*bridge).clone();
                copy.children.clear();
                at.children.push(copy);
                at.children.len() - 1
            }
        };
        at = &mut at.children[i];
    }
    at.children.push(dev.clone());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topo::model::NodeKind;
    use crate::topo::paths::PathType;
    use crate::topo::{xml, Hardware};

    #[test]
    fn a_partial_file_keeps_its_tree_and_gains_detected_devices() {
        // The file: a VM's real switch above GPU 0001:00:00.0 and NIC 0101:00:00.0, known by
        // class only.
        let file = "<system version=\"1\">\n<cpu numaid=\"0\" vendor=\"AuthenticAMD\">\n<pci busid=\"ffff:ff:01.0\" class=\"0x060400\" link_speed=\"16 GT/s\" link_width=\"16\">\n<pci busid=\"0001:00:00.0\" class=\"0x030200\" link_speed=\"16 GT/s\" link_width=\"16\"/>\n<pci busid=\"0101:00:00.0\" class=\"0x020700\" link_speed=\"16 GT/s\" link_width=\"16\"/>\n</pci>\n</cpu>\n</system>\n";
        let mut tree = xml::parse(file).unwrap();
        let alone = Hardware::from_xml(tree.clone(), "file").unwrap();
        assert_eq!(alone.topo.count(NodeKind::Gpu), 1);
        assert_eq!(alone.topo.count(NodeKind::Nic), 1);
        // Detection on the VM: a flat bus, the GPU with NVML's sm, the NIC with its port, and
        // a second GPU the file does not name.
        let detected = Elem::new("system").child(
            Elem::new("cpu")
                .with("numaid", "0")
                .child(
                    Elem::new("pci")
                        .with("busid", "0001:00:00.0")
                        .child(Elem::new("gpu").with("dev", "0").with("sm", "80")),
                )
                .child(
                    Elem::new("pci").with("busid", "0101:00:00.0").child(
                        Elem::new("nic").child(
                            Elem::new("net")
                                .with("name", "mlx5_ib0")
                                .with("speed", "200000")
                                .with("link_layer", "InfiniBand"),
                        ),
                    ),
                )
                .child(
                    Elem::new("pci")
                        .with("busid", "0002:00:00.0")
                        .child(Elem::new("gpu").with("dev", "1").with("sm", "80")),
                ),
        );
        complete(&mut tree, &detected);
        let hw = Hardware::from_xml(tree, "merged").unwrap();
        let t = &hw.topo;
        assert_eq!(t.count(NodeKind::Gpu), 2);
        assert_eq!(t.count(NodeKind::Pci), 1);
        let nic = t.nics()[0];
        assert_eq!(t.nodes[nic].id, "mlx5_ib0");
        assert_eq!(t.nodes[nic].speed_gbps, 25.0);
        let g = t.gpus();
        assert_eq!(t.nodes[g[0]].sm, 80);
        // The file's switch holds the GPU and the NIC: PIX; the other GPU hangs on the CPU.
        assert_eq!(hw.paths.kind(g[0], nic), PathType::Pix);
        assert_eq!(hw.paths.kind(g[1], nic), PathType::Phb);
    }
}
