//! Hardware topology: the fixtures of tests/data/topo (real machines' layouts), loaded,
//! dumped and loaded again, searched, and compared with answers worked out by hand; detection
//! over sysfs trees built in a temporary directory, the captured tree of the VM the project
//! is built on, and this machine's own /sys.

use std::path::{Path, PathBuf};

use ferroccl::topo::model::{LinkKind, NodeKind};
use ferroccl::topo::paths::PathType;
use ferroccl::topo::search::{p2p_allowed, ring_bottleneck, sys_crossings};
use ferroccl::topo::{xml, Hardware};

fn fixture(name: &str) -> Hardware {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/topo")
        .join(name);
    Hardware::load(&p).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn counts(hw: &Hardware) -> [usize; 5] {
    [
        NodeKind::Cpu,
        NodeKind::Pci,
        NodeKind::Gpu,
        NodeKind::Nic,
        NodeKind::NvSwitch,
    ]
    .map(|k| hw.topo.count(k))
}

fn nvl_links(hw: &Hardware) -> usize {
    hw.topo
        .links
        .iter()
        .filter(|l| l.kind == LinkKind::Nvl)
        .count()
        / 2
}

fn sys_links(hw: &Hardware) -> usize {
    hw.topo
        .links
        .iter()
        .filter(|l| l.kind == LinkKind::Sys)
        .count()
        / 2
}

const FIXTURES: [&str; 4] = [
    "dgx-h100.xml",
    "hgx-a100.xml",
    "pcie-4xa100-nvlink-pairs.xml",
    "dual-socket-8xv100-pcie.xml",
];

#[test]
fn dump_then_load_round_trips_every_fixture() {
    let dir = tempdir("roundtrip");
    for name in FIXTURES {
        let hw = fixture(name);
        let out = dir.join(name);
        hw.dump(&out).unwrap();
        let back = Hardware::load(&out).unwrap();
        assert!(
            back.xml.same_as(&hw.xml),
            "{name}: tree differs after dump/load"
        );
        assert_eq!(back.topo, hw.topo, "{name}");
        assert_eq!(back.search(), hw.search(), "{name}");
    }
}

#[test]
fn dgx_h100() {
    let hw = fixture("dgx-h100.xml");
    // 2 sockets, 8 Gen5 switches, 8 GPUs, 8 NICs, the NVSwitch fabric as one node.
    assert_eq!(counts(&hw), [2, 8, 8, 8, 1]);
    assert_eq!(nvl_links(&hw), 8);
    assert_eq!(sys_links(&hw), 1);
    let gpus = hw.topo.gpus();
    for &a in &gpus {
        for &b in &gpus {
            if a != b {
                // Through the NVSwitch: 18 links x 20.6 GB/s.
                assert_eq!(hw.paths.kind(a, b), PathType::Nvl);
                assert!((hw.paths.gbps(a, b) - 370.8).abs() < 1e-6);
                assert!(p2p_allowed(&hw.paths, a, b));
            }
        }
    }
    let s = hw.search();
    // Every ring through the NVSwitch uses each GPU's 370.8 GB/s once each way; channels of
    // 60 GB/s: six fit (360), a seventh would need 420.
    assert_eq!(s.channels.len(), 6);
    for ch in &s.channels {
        assert_eq!(ch.gbps, 60.0);
        assert!((ring_bottleneck(&hw.topo, &hw.paths, &gpus, &ch.ring) - 370.8).abs() < 1e-6);
        assert_eq!(sys_crossings(&hw.topo, &hw.paths, &gpus, &ch.ring), 0);
    }
    // GPU i shares its Gen5 switch with mlx5_i: PIX at 48 GB/s.
    for (i, nic) in s.nic_of.iter().enumerate() {
        let nic = nic.expect("every GPU has a NIC");
        assert_eq!(hw.topo.nodes[nic].id, format!("mlx5_{i}"));
        assert_eq!(hw.paths.kind(gpus[i], nic), PathType::Pix);
        assert_eq!(hw.paths.gbps(gpus[i], nic), 48.0);
        assert_eq!(hw.topo.nodes[nic].speed_gbps, 50.0);
    }
    // Channels start at GPUs of different NICs.
    let heads: Vec<_> = s.channels.iter().map(|c| c.nic).collect();
    assert_eq!(
        heads.iter().collect::<std::collections::HashSet<_>>().len(),
        6
    );
    let m = hw.matrix();
    assert!(m.contains("NV18"), "{m}");
    assert!(
        m.lines()
            .any(|l| l.starts_with("GPU0") && l.contains("PIX") && l.contains("SYS")),
        "{m}"
    );
}

#[test]
fn hgx_a100() {
    let hw = fixture("hgx-a100.xml");
    // 4 top switches with 2 leaf switches each.
    assert_eq!(counts(&hw), [2, 12, 8, 8, 1]);
    assert_eq!(nvl_links(&hw), 8);
    let gpus = hw.topo.gpus();
    assert_eq!(hw.paths.gbps(gpus[0], gpus[7]), 240.0);
    let s = hw.search();
    assert_eq!(s.channels.len(), 4);
    assert!(s.channels.iter().all(|c| c.gbps == 60.0));
    let nics = hw.topo.nics();
    // GPU0 and mlx5_0 share a leaf switch (PIX); mlx5_1 is under the same top switch (PXB);
    // mlx5_2 is on the other complex of the socket (PHB over PCI) and mlx5_4 across sockets
    // (SYS over PCI): both are reached better through the NVLink peer on their switch (PXN,
    // bounded by the peer's Gen4 x16 link, 24 GB/s).
    assert_eq!(hw.paths.kind(gpus[0], nics[0]), PathType::Pix);
    assert_eq!(hw.paths.kind(gpus[0], nics[1]), PathType::Pxb);
    assert_eq!(
        hw.paths.direct(gpus[0], nics[2]).unwrap().kind,
        PathType::Phb
    );
    assert_eq!(
        hw.paths.direct(gpus[0], nics[4]).unwrap().kind,
        PathType::Sys
    );
    assert_eq!(hw.paths.kind(gpus[0], nics[4]), PathType::Pxn);
    assert_eq!(hw.paths.gbps(gpus[0], nics[4]), 24.0);
    for (i, nic) in s.nic_of.iter().enumerate() {
        assert_eq!(*nic, Some(nics[i]), "GPU{i}");
    }
}

#[test]
fn pcie_box_with_nvlink_pairs() {
    let hw = fixture("pcie-4xa100-nvlink-pairs.xml");
    assert_eq!(counts(&hw), [1, 0, 4, 1, 0]);
    assert_eq!(nvl_links(&hw), 2);
    let g = hw.topo.gpus();
    assert_eq!(hw.paths.kind(g[0], g[1]), PathType::Nvl);
    assert_eq!(hw.paths.gbps(g[0], g[1]), 240.0);
    assert_eq!(hw.paths.kind(g[1], g[2]), PathType::Phb);
    assert!(p2p_allowed(&hw.paths, g[0], g[1]));
    assert!(!p2p_allowed(&hw.paths, g[1], g[2]));
    let s = hw.search();
    // Each card's Gen4 x16 root port (24 GB/s) is crossed once each way by any ring: one
    // channel of 24 GB/s, and the NVLink pairs sit next to each other.
    assert_eq!(s.channels.len(), 1);
    assert_eq!(s.channels[0].gbps, 24.0);
    for ch in &s.channels {
        assert_eq!(ring_bottleneck(&hw.topo, &hw.paths, &g, &ch.ring), 24.0);
        for pair in [(0, 1), (2, 3)] {
            assert!(
                adjacent(&ch.ring, pair),
                "ring {:?} splits {pair:?}",
                ch.ring
            );
        }
    }
    // One NIC on the socket: every GPU reaches it through the host bridge.
    let nic = hw.topo.nics()[0];
    assert!(s.nic_of.iter().all(|n| *n == Some(nic)));
    assert_eq!(hw.paths.kind(g[3], nic), PathType::Phb);
    assert!(hw.matrix().contains("NV12"));
}

#[test]
fn dual_socket_box() {
    let hw = fixture("dual-socket-8xv100-pcie.xml");
    assert_eq!(counts(&hw), [2, 4, 8, 2, 0]);
    assert_eq!(nvl_links(&hw), 0);
    assert_eq!(sys_links(&hw), 1);
    let g = hw.topo.gpus();
    assert_eq!(hw.paths.kind(g[0], g[1]), PathType::Pix);
    assert_eq!(hw.paths.kind(g[0], g[2]), PathType::Phb);
    assert_eq!(hw.paths.kind(g[0], g[4]), PathType::Sys);
    // Cascade Lake UPI: 10 GB/s.
    assert_eq!(hw.paths.gbps(g[0], g[4]), 10.0);
    let s = hw.search();
    assert!(!s.channels.is_empty());
    for ch in &s.channels {
        // A ring crosses the interconnect once each way: 10 GB/s, the UPI; crossing it four
        // times would halve that.
        assert!(
            sys_crossings(&hw.topo, &hw.paths, &g, &ch.ring) <= 2,
            "{:?}",
            ch.ring
        );
        assert_eq!(ring_bottleneck(&hw.topo, &hw.paths, &g, &ch.ring), 10.0);
        assert_eq!(ch.gbps, 10.0);
    }
    assert_eq!(
        sys_crossings(&hw.topo, &hw.paths, &g, &[0, 4, 1, 5, 2, 6, 3, 7]),
        8
    );
    // GPUs 0, 1 share mlx5_0's switch and 4, 5 mlx5_1's: PIX; the others use their socket's NIC.
    let nics = hw.topo.nics();
    let want = [0, 0, 0, 0, 1, 1, 1, 1];
    for (i, nic) in s.nic_of.iter().enumerate() {
        assert_eq!(*nic, Some(nics[want[i]]), "GPU{i}");
        let kind = hw.paths.kind(g[i], nics[want[i]]);
        let expect = if i % 4 < 2 {
            PathType::Pix
        } else {
            PathType::Phb
        };
        assert_eq!(kind, expect, "GPU{i}");
    }
}

fn adjacent(ring: &[usize], (a, b): (usize, usize)) -> bool {
    let n = ring.len();
    (0..n).any(|i| {
        let (x, y) = (ring[i], ring[(i + 1) % n]);
        (x, y) == (a, b) || (x, y) == (b, a)
    })
}

#[test]
fn log_lines_follow_nccl() {
    let hw = fixture("pcie-4xa100-nvlink-pairs.xml");
    let s = hw.search();
    let ranks = [10, 11, 12, 13];
    let lines = s.channel_lines(&ranks);
    let ring = &s.channels[0].ring;
    let want: Vec<String> = ring.iter().map(|r| (r + 10).to_string()).collect();
    assert_eq!(lines, [format!("Channel 00/01 : {}", want.join(" "))]);
    let (head, next, last) = (ring[0], ring[1], ring[3]);
    assert_eq!(
        s.tree_line(head, &ranks),
        format!("Trees [0] {}/-1/-1->{}->-1", next + 10, head + 10)
    );
    assert_eq!(
        s.tree_line(last, &ranks),
        format!("Trees [0] -1/-1/-1->{}->{}", last + 10, ring[2] + 10)
    );
}

#[test]
fn malformed_files_name_file_and_line() {
    let dir = tempdir("malformed");
    let p = dir.join("bad.xml");
    std::fs::write(&p, "<system>\n  <cpu numaid=\"0\">\n    <pci busid=\"0000:01:00.0\" link_width=\"x16\"/>\n  </cpu>\n</system>\n").unwrap();
    let e = Hardware::load(&p).unwrap_err().to_string();
    assert!(
        e.contains("bad.xml") && e.contains("line 3") && e.contains("link_width"),
        "{e}"
    );
    std::fs::write(&p, "<system>\n  <cpu numaid=\"0\">\n</system>\n").unwrap();
    let e = Hardware::load(&p).unwrap_err().to_string();
    assert!(e.contains("line 3") && e.contains("expected </cpu>"), "{e}");
    let e = Hardware::load(&dir.join("missing.xml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing.xml"), "{e}");
}

// ---- detection ----

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ferroccl-topo-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn link(root: &Path, rel: &str, target: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(target, p).unwrap();
}

/// A two-socket machine: on node 1, a switch (0000:40:00.0, Gen4 x16) above a GPU and an
/// InfiniBand HCA; on node 0 an Ethernet NIC whose speed file is missing, a GPU whose link
/// speed says `Unknown`, a loopback interface; no /proc/cpuinfo.
fn fake_tree(root: &Path) {
    write(root, "sys/devices/system/node/node0/cpulist", "0-15\n");
    write(root, "sys/devices/system/node/node1/cpulist", "16-31\n");
    let dev = "sys/devices/pci0000:40";
    for (id, class, vendor, numa) in [
        ("0000:40:00.0", "0x060400", "0x1000", "1"),
        ("0000:40:00.0/0000:41:00.0", "0x030200", "0x10de", "1"),
        ("0000:40:00.0/0000:42:00.0", "0x020700", "0x15b3", "1"),
    ] {
        write(root, &format!("{dev}/{id}/class"), class);
        write(root, &format!("{dev}/{id}/vendor"), vendor);
        write(root, &format!("{dev}/{id}/numa_node"), numa);
        write(
            root,
            &format!("{dev}/{id}/current_link_speed"),
            "16.0 GT/s PCIe\n",
        );
        write(root, &format!("{dev}/{id}/current_link_width"), "16\n");
        let bus = id.rsplit('/').next().unwrap();
        link(
            root,
            &format!("sys/bus/pci/devices/{bus}"),
            &format!("../../../devices/pci0000:40/{id}"),
        );
    }
    write(
        root,
        "sys/devices/pci0000:00/0000:00:05.0/class",
        "0x030000",
    );
    write(root, "sys/devices/pci0000:00/0000:00:05.0/vendor", "0x10de");
    write(
        root,
        "sys/devices/pci0000:00/0000:00:05.0/current_link_speed",
        "Unknown",
    );
    link(
        root,
        "sys/bus/pci/devices/0000:00:05.0",
        "../../../devices/pci0000:00/0000:00:05.0",
    );
    write(
        root,
        "sys/devices/pci0000:00/0000:00:06.0/class",
        "0x020000",
    );
    write(root, "sys/devices/pci0000:00/0000:00:06.0/numa_node", "-1");
    link(
        root,
        "sys/bus/pci/devices/0000:00:06.0",
        "../../../devices/pci0000:00/0000:00:06.0",
    );
    link(
        root,
        "sys/class/net/enp0s6",
        "../../devices/pci0000:00/0000:00:06.0/net/enp0s6",
    );
    link(root, "sys/class/net/lo", "../../devices/virtual/net/lo");
    link(
        root,
        "sys/class/net/ib0",
        "../../devices/pci0000:40/0000:40:00.0/0000:42:00.0/net/ib0",
    );
    link(
        root,
        "sys/class/infiniband/mlx5_0",
        "../../devices/pci0000:40/0000:40:00.0/0000:42:00.0/infiniband/mlx5_0",
    );
    let port = "sys/devices/pci0000:40/0000:40:00.0/0000:42:00.0/infiniband/mlx5_0/ports/1";
    write(root, &format!("{port}/rate"), "200 Gb/sec (4X HDR)\n");
    write(root, &format!("{port}/link_layer"), "InfiniBand\n");
}

#[test]
fn detection_reads_a_fake_tree_with_missing_files() {
    let root = tempdir("sysfs");
    fake_tree(&root);
    let hw = Hardware::detect(&root).unwrap();
    assert_eq!(counts(&hw), [2, 1, 2, 2, 0], "{}", hw.xml.to_xml());
    let t = &hw.topo;
    let g = t.gpus();
    // GPUs by bus id: 0000:00:05.0 (dev 0, node 0), 0000:41:00.0 (dev 1, node 1).
    assert_eq!(t.nodes[g[0]].id, "0000:00:05.0");
    assert_eq!(t.nodes[t.nodes[g[0]].cpu].id, "numa0");
    assert_eq!(t.nodes[t.nodes[g[1]].cpu].id, "numa1");
    let ib = t
        .nics()
        .into_iter()
        .find(|&n| t.nodes[n].id == "mlx5_0")
        .unwrap();
    assert_eq!(t.nodes[ib].speed_gbps, 25.0);
    assert_eq!(t.nodes[ib].flavour, "IB");
    assert_eq!(hw.paths.kind(g[1], ib), PathType::Pix);
    assert_eq!(hw.paths.gbps(g[1], ib), 24.0);
    let eth = t
        .nics()
        .into_iter()
        .find(|&n| t.nodes[n].id == "enp0s6")
        .unwrap();
    assert_eq!(t.nodes[eth].speed_gbps, 0.0);
    assert_eq!(hw.paths.kind(g[0], eth), PathType::Phb);
    let s = hw.search();
    assert_eq!(s.nic_of, vec![Some(eth), Some(ib)]);
    // The dump of a detected tree loads back to the same model.
    let back = Hardware::parse(&hw.xml.to_xml(), "dump").unwrap();
    assert_eq!(back.topo, hw.topo);
    // An empty root: one NUMA node, nothing else, no error.
    let empty = tempdir("sysfs-empty");
    let hw = Hardware::detect(&empty).unwrap();
    assert_eq!(counts(&hw), [1, 0, 0, 0, 0]);
    assert!(hw.search().channels.is_empty());
}

#[test]
fn captured_vm_tree() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/topo/vm-sysfs");
    let hw = Hardware::detect(&root).unwrap();
    // One NUMA node with CPUs 0-1, no GPU, one virtio NIC (eth0); lo and ifb* are virtual.
    assert_eq!(counts(&hw), [1, 0, 0, 1, 0], "{}", hw.xml.to_xml());
    let cpu = hw.xml.find("cpu").unwrap();
    assert_eq!(cpu.attr("cpulist"), Some("0-1"));
    let nic = &hw.topo.nodes[hw.topo.nics()[0]];
    assert_eq!(nic.id, "eth0");
    let pci = cpu.find("pci").unwrap();
    assert_eq!(pci.attr("busid"), Some("0000:00:03.0"));
    assert_eq!(pci.attr("vendor"), Some("0x1af4"));
    let back = xml::parse(&hw.xml.to_xml()).unwrap();
    assert!(back.same_as(&hw.xml));
}

#[test]
fn detection_on_this_machine() {
    let hw = Hardware::detect(Path::new("/")).unwrap();
    assert!(hw.topo.count(NodeKind::Cpu) >= 1);
    let _ = hw.search();
    let _ = hw.matrix();
}

// ---- at communicator init ----

fn init_all(
    configs: Vec<ferroccl::Config>,
    tag: u64,
) -> Vec<ferroccl::Result<ferroccl::Communicator>> {
    use std::sync::Arc;
    let n = configs.len();
    let store: Arc<dyn ferroccl::bootstrap::Store> =
        Arc::new(ferroccl::bootstrap::MemoryStore::new());
    let id = 0x7070_0000 ^ (std::process::id() as u64) << 16 ^ tag << 8 ^ n as u64;
    let hs: Vec<_> = configs
        .into_iter()
        .enumerate()
        .map(|(r, cfg)| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || ferroccl::Communicator::init(store, r, n, id, cfg))
        })
        .collect();
    hs.into_iter()
        .map(|h| h.join().expect("init thread"))
        .collect()
}

#[test]
fn init_loads_the_topology_file_and_dumps_it() {
    let dir = tempdir("init");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/topo/hgx-a100.xml");
    let dump = dir.join("dump.xml");
    let cfg = ferroccl::Config {
        topo_file: Some(src.clone()),
        topo_dump_file: Some(dump.clone()),
        graph_dump_file: Some(dir.join("graph.xml")),
        debug: ferroccl::comm::DebugLevel::Info,
        transports: vec!["tcp".into()],
        ..ferroccl::Config::default()
    };
    let comms = init_all(vec![cfg; 3], 1);
    for c in &comms {
        assert!(c.is_ok(), "{:?}", c.as_ref().err());
    }
    // The file completed by detection: its 8 GPUs and 8 NICs, plus the NICs (and GPUs) this
    // machine has that the file does not name.
    let back = Hardware::load(&dump).unwrap();
    let here = Hardware::detect(Path::new("/")).unwrap();
    let a100 = fixture("hgx-a100.xml");
    assert_eq!(
        back.topo.count(NodeKind::Gpu),
        8 + here.topo.count(NodeKind::Gpu)
    );
    assert_eq!(
        back.topo.count(NodeKind::Nic),
        8 + here.topo.count(NodeKind::Nic)
    );
    for n in &a100.topo.nodes {
        assert!(back.topo.nodes.contains(n), "{n:?} lost");
    }
    let graph = std::fs::read_to_string(dir.join("graph.xml")).unwrap();
    let graph = xml::parse(&graph).unwrap();
    assert_eq!(graph.name, "graphs");
    assert_eq!(graph.children[0].attr("nchannels"), Some("4"));
    drop(comms);

    let bad = dir.join("bad.xml");
    std::fs::write(&bad, "<system>\n<cpu>\n<pci/>\n</cpu>\n</system>\n").unwrap();
    let cfg = ferroccl::Config {
        topo_file: Some(bad),
        transports: vec!["tcp".into()],
        ..ferroccl::Config::default()
    };
    for (r, c) in init_all(vec![cfg; 2], 2).into_iter().enumerate() {
        let Err(e) = c else {
            panic!("rank {r}: a bad topology file must fail init")
        };
        let e = e.to_string();
        assert!(
            e.contains(&format!("rank {r}"))
                && e.contains("bad.xml")
                && e.contains("line 3")
                && e.contains("busid"),
            "{e}"
        );
    }
}

#[cfg(feature = "capi")]
#[test]
fn nccl_topo_variables_map_through_the_c_abi() {
    let vars = |k: &str| match k {
        "NCCL_TOPO_FILE" => Some("/etc/nccl/topo.xml".to_string()),
        "NCCL_TOPO_DUMP_FILE" => Some("/tmp/dump.xml".to_string()),
        _ => None,
    };
    let c = ferroccl::capi::env::config_from(&vars).unwrap();
    assert_eq!(
        c.topo_file.as_deref(),
        Some(Path::new("/etc/nccl/topo.xml"))
    );
    assert_eq!(
        c.topo_dump_file.as_deref(),
        Some(Path::new("/tmp/dump.xml"))
    );
    // FERRO_* wins.
    let vars = |k: &str| match k {
        "NCCL_TOPO_FILE" => Some("/a.xml".to_string()),
        "FERRO_TOPO_FILE" => Some("/b.xml".to_string()),
        _ => None,
    };
    let c = ferroccl::capi::env::config_from(&vars).unwrap();
    assert_eq!(c.topo_file.as_deref(), Some(Path::new("/b.xml")));
}

/// A DGX-2-like box: 16 GPUs with 6 NVLinks each into the NVSwitch fabric, on two sockets.
fn sixteen_gpus() -> String {
    let mut x = String::from("<system version=\"1\">\n");
    for s in 0..2 {
        x.push_str(&format!(
            "<cpu numaid=\"{s}\" vendor=\"GenuineIntel\" familyid=\"6\" modelid=\"85\">\n"
        ));
        for k in 0..8 {
            let i = s * 8 + k;
            x.push_str(&format!(
                "<pci busid=\"0000:{:02x}:00.0\" class=\"0x030200\" link_speed=\"8.0 GT/s PCIe\" link_width=\"16\">\n<gpu dev=\"{i}\" sm=\"70\">\n<nvlink target=\"ffffffff:ff:ff.0\" count=\"6\" tclass=\"0x068000\"/>\n</gpu>\n</pci>\n",
                0x10 + i
            ));
        }
        x.push_str("</cpu>\n");
    }
    x.push_str("</system>\n");
    x
}

#[test]
fn sixteen_gpus_are_ringed_greedily() {
    let hw = Hardware::parse(&sixteen_gpus(), "dgx2").unwrap();
    let s = hw.search();
    // 6 x 20 = 120 GB/s per GPU into the fabric: two channels of 60.
    assert_eq!(s.channels.len(), 2);
    for ch in &s.channels {
        assert_eq!(ch.gbps, 60.0);
        let mut r = ch.ring.clone();
        r.sort_unstable();
        assert_eq!(r, (0..16).collect::<Vec<_>>());
        assert_eq!(
            ring_bottleneck(&hw.topo, &hw.paths, &s.gpus, &ch.ring),
            120.0
        );
    }
}

#[test]
fn every_channel_is_a_ring_and_a_chain_of_every_local_rank() {
    let mut cases: Vec<ferroccl::topo::search::Search> =
        FIXTURES.iter().map(|f| fixture(f).search()).collect();
    cases.push(Hardware::parse(&sixteen_gpus(), "dgx2").unwrap().search());
    for n in [1, 2, 3, 5, 7, 13] {
        cases.push(ferroccl::topo::search::Search::cpu_ring(n));
    }
    for s in cases {
        let n = s.nic_of.len();
        for ch in &s.channels {
            let mut r = ch.ring.clone();
            r.sort_unstable();
            assert_eq!(r, (0..n).collect::<Vec<_>>());
        }
        // Tree lines: one head (parent -1) per channel, and every other rank's parent is the
        // rank before it in the ring.
        let ranks: Vec<usize> = (100..100 + n).collect();
        let heads = (0..n)
            .map(|me| s.tree_line(me, &ranks))
            .map(|l| l.matches("->-1").count())
            .sum::<usize>();
        assert_eq!(heads, s.channels.len(), "n = {n}");
    }
}
