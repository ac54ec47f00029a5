//! `ferroccl-topo` as a command: help, a topology file, a captured sysfs tree, bad input.

use std::path::Path;
use std::process::Command;

const TOPO: &str = env!("CARGO_BIN_EXE_ferroccl-topo");

fn data(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/topo")
        .join(name)
        .display()
        .to_string()
}

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(TOPO)
        .args(args)
        .env_remove("FERRO_TOPO_FILE")
        .env_remove("NCCL_TOPO_FILE")
        .output()
        .expect("run ferroccl-topo");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn help_lists_the_flags() {
    let (code, out, _) = run(&["--help"]);
    assert_eq!(code, Some(0));
    for flag in ["--topology", "--sysfs", "--dump", "--graph", "--help"] {
        assert!(out.contains(flag), "{out}");
    }
}

#[test]
fn shows_a_machine_from_its_file() {
    let graph = std::env::temp_dir().join(format!("ferroccl-graph-{}.xml", std::process::id()));
    let (code, out, err) = run(&[
        "--topology",
        &data("dgx-h100.xml"),
        "--graph",
        graph.to_str().unwrap(),
    ]);
    let g = ferroccl::topo::xml::parse(&std::fs::read_to_string(&graph).unwrap()).unwrap();
    let _ = std::fs::remove_file(&graph);
    assert_eq!(g.children.len(), 2);
    let ring = &g.children[0];
    assert_eq!(ring.attr("pattern"), Some("4"));
    assert_eq!(ring.attr("nchannels"), Some("6"));
    assert_eq!(ring.attr("typeintra"), Some("NVL"));
    assert_eq!(ring.attr("typeinter"), Some("PIX"));
    // Each channel: its NIC, the 8 GPUs, the NIC again.
    for ch in &ring.children {
        assert_eq!(ch.children.len(), 10);
        assert_eq!(ch.children[0].name, "net");
        assert_eq!(ch.children[0].attr("dev"), ch.children[9].attr("dev"));
    }
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("8 GPU(s), 8 NIC port(s), NVSwitch"), "{out}");
    assert!(out.contains("NV18"), "{out}");
    assert!(out.contains("6 channel(s) of 60.0 GB/s"), "{out}");
    assert!(out.contains("Channel 00/06 : "), "{out}");
    assert!(
        out.contains("GPU3 (0000:5d:00.0) -> NIC mlx5_3 (PIX, 48.0 GB/s)"),
        "{out}"
    );
}

#[test]
fn shows_the_captured_vm_and_dumps_it() {
    let dump = std::env::temp_dir().join(format!("ferroccl-topo-cli-{}.xml", std::process::id()));
    let (code, out, err) = run(&[
        "--sysfs",
        &data("vm-sysfs"),
        "--dump",
        dump.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("1 CPU socket(s)/NUMA node(s)"), "{out}");
    assert!(out.contains("No GPUs"), "{out}");
    let (code, out2, err) = run(&["--topology", dump.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out2.contains("NIC0: eth0"), "{out2}");
    let _ = std::fs::remove_file(dump);
}

#[test]
fn bad_input_is_an_error_naming_it() {
    let (code, _, err) = run(&["--topology", "/nonexistent/topo.xml"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("/nonexistent/topo.xml"), "{err}");
    let (code, _, err) = run(&["--bogus", "1"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--bogus"), "{err}");
    let (code, _, err) = run(&["--topology"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("needs a value"), "{err}");
}

const SIM: &str = env!("CARGO_BIN_EXE_ferroccl-sim");

/// `ferroccl-sim --topology FILE --hosts 4` at 256 MiB: (header lines, time in us).
fn sim(file: &str) -> (String, f64) {
    let out = Command::new(SIM)
        .args([
            "--topology",
            &data(file),
            "--hosts",
            "4",
            "-b",
            "256M",
            "-e",
            "256M",
        ])
        .output()
        .expect("run ferroccl-sim");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = stdout
        .lines()
        .find(|l| !l.starts_with('#'))
        .expect("a result row");
    let time: f64 = row.split_whitespace().nth(6).unwrap().parse().unwrap();
    (stdout, time)
}

#[test]
fn the_simulator_predicts_per_machine_type() {
    let (h100, t_h100) = sim("dgx-h100.xml");
    assert!(
        h100.contains("32 ranks, 8 per host (4 hosts), intra nvlink: 2.0 us, 360.0 GB/s, inter rdma: 3.0 us, 50.0 GB/s"),
        "{h100}"
    );
    assert!(
        h100.contains("# machine ") && h100.contains("6 channel(s) of 60.0 GB/s"),
        "{h100}"
    );
    let (a100, t_a100) = sim("hgx-a100.xml");
    assert!(
        a100.contains("intra nvlink: 2.0 us, 240.0 GB/s, inter rdma: 3.0 us, 25.0 GB/s"),
        "{a100}"
    );
    let (pcie, t_pcie) = sim("pcie-4xa100-nvlink-pairs.xml");
    assert!(
        pcie.contains("16 ranks, 4 per host (4 hosts), intra shm: 1.0 us, 24.0 GB/s"),
        "{pcie}"
    );
    let (_, t_dual) = sim("dual-socket-8xv100-pcie.xml");
    // Faster links, shorter predictions: H100 < A100 < the PCIe boxes.
    assert!(
        t_h100 < t_a100 && t_a100 < t_pcie && t_a100 < t_dual,
        "{t_h100} {t_a100} {t_pcie} {t_dual}"
    );

    let bad = std::env::temp_dir().join(format!("ferroccl-sim-bad-{}.xml", std::process::id()));
    std::fs::write(
        &bad,
        "<system>\n<cpu>\n<pci busid=\"0000:01:00.0\">\n</cpu>\n</system>\n",
    )
    .unwrap();
    let out = Command::new(SIM)
        .args(["--topology", bad.to_str().unwrap(), "--hosts", "2"])
        .output()
        .expect("run ferroccl-sim");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("line 4") && err.contains("expected </pci>"),
        "{err}"
    );
    let _ = std::fs::remove_file(bad);
}
