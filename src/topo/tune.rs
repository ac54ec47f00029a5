//! The tuner's link table from the hardware: where the model knows a host's GPUs and NICs,
//! the cost model's intra-host and inter-host links take their bandwidth from the search and
//! the NICs instead of the documented constants. Where it does not (ranks without GPUs, NICs
//! of unknown speed, as on a VM), the cost model is left as it was.
#![forbid(unsafe_code)]

use super::model::LinkKind;
use super::search::Search;
use super::Hardware;
use crate::plan::{CostModel, Link};

/// What [`apply`] changed, for logs and tests.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    /// The intra-host link and its bandwidth, GB/s, when set from the GPUs' channels.
    pub intra: Option<(Link, f64)>,
    /// The inter-host link and one NIC's bandwidth, GB/s, when set from the NICs.
    pub inter: Option<(Link, f64)>,
    /// A host's total NIC bandwidth, GB/s (the NICs its GPUs use).
    pub nic_gbps: Option<f64>,
}

/// Sets `model`'s links from `hw` and its search `s`: GPUs that all reach each other over
/// NVLink make the intra-host link NVLink; the intra link's bandwidth becomes the channels'
/// total (what one GPU's ring moves); InfiniBand or RoCE NICs make the inter-host link RDMA
/// with a NIC's port speed; the NICs the GPUs use give the host's NIC bandwidth. Latencies
/// stay the link table's, which the model does not know better.
pub fn apply(model: &mut CostModel, hw: &Hardware, s: &Search) -> Applied {
    let mut out = Applied {
        intra: None,
        inter: None,
        nic_gbps: None,
    };
    let t = &hw.topo;
    if s.gpus.len() > 1 && s.total_gbps().is_finite() && s.total_gbps() > 0.0 {
        let all_nvl = s.gpus.iter().all(|&a| {
            s.gpus.iter().all(|&b| {
                a == b
                    || hw
                        .paths
                        .get(a, b)
                        .is_some_and(|p| p.links.iter().all(|&l| t.links[l].kind == LinkKind::Nvl))
            })
        });
        let link = if all_nvl { Link::Nvlink } else { model.intra };
        model.intra = link;
        model.links[link.index()].beta_gbps = s.total_gbps();
        out.intra = Some((link, s.total_gbps()));
    }
    let mut used: Vec<usize> = s.nic_of.iter().flatten().copied().collect();
    used.sort_unstable();
    used.dedup();
    let known: Vec<usize> = used
        .into_iter()
        .filter(|&n| t.nodes[n].speed_gbps > 0.0)
        .collect();
    if let Some(&first) = known.first() {
        let node = &t.nodes[first];
        let link = if node.flavour == "IB" || node.flavour == "RoCE" {
            Link::Rdma
        } else {
            model.inter
        };
        let port = known
            .iter()
            .map(|&n| t.nodes[n].speed_gbps)
            .fold(0.0, f64::max);
        model.inter = link;
        model.links[link.index()].beta_gbps = port;
        let total: f64 = known.iter().map(|&n| t.nodes[n].speed_gbps).sum();
        model.nic_gbps = Some(total);
        out.inter = Some((link, port));
        out.nic_gbps = Some(total);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(name: &str) -> Hardware {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/topo")
            .join(name);
        Hardware::load(&p).unwrap()
    }

    #[test]
    fn links_follow_the_hardware() {
        let hw = load("dgx-h100.xml");
        let mut m = CostModel::default();
        let a = apply(&mut m, &hw, &hw.search());
        // Six channels of 60 GB/s over NVSwitch; eight 400 Gb/s ports.
        assert_eq!(a.intra, Some((Link::Nvlink, 360.0)));
        assert_eq!(a.inter, Some((Link::Rdma, 50.0)));
        assert_eq!(a.nic_gbps, Some(400.0));
        assert_eq!(m.intra, Link::Nvlink);
        assert_eq!(m.inter, Link::Rdma);
        assert_eq!(m.links[Link::Nvlink.index()].beta_gbps, 360.0);
        assert_eq!(
            m.links[Link::Rdma.index()].alpha_us,
            CostModel::default().links[2].alpha_us
        );

        // PCIe box: the pairs' NVLink does not join every GPU: the intra link stays shm,
        // at the ring's 24 GB/s; its NIC is a ConnectX on Ethernet (RoCE, 100 Gb/s).
        let hw = load("pcie-4xa100-nvlink-pairs.xml");
        let mut m = CostModel::default();
        let a = apply(&mut m, &hw, &hw.search());
        assert_eq!(a.intra, Some((Link::Shm, 24.0)));
        assert_eq!(a.inter, Some((Link::Rdma, 12.5)));
        assert_eq!(m.nic_gbps, Some(12.5));
    }

    #[test]
    fn a_host_without_gpus_or_nic_speeds_keeps_the_constants() {
        let root =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/topo/vm-sysfs");
        let hw = Hardware::detect(&root).unwrap();
        let mut m = CostModel::default();
        let a = apply(&mut m, &hw, &Search::cpu_ring(2));
        assert_eq!(
            a,
            Applied {
                intra: None,
                inter: None,
                nic_gbps: None
            }
        );
        assert_eq!(m, CostModel::default());
    }
}
