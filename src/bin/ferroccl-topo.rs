//! `ferroccl-topo`: shows the hardware ferroccl sees and what it would do with it: the path
//! matrix between GPUs and NICs (as `nvidia-smi topo -m` prints it), the channels (rings and
//! tree chains) of the host's GPUs and each GPU's NIC.
//!
//! ```text
//! ferroccl-topo [--topology FILE] [--sysfs ROOT] [--dump FILE] [--graph FILE] [-h|--help]
//! ```
//!
//! Without `--topology`, the file named by `FERRO_TOPO_FILE` (or `NCCL_TOPO_FILE`) is shown
//! if set, completed by what detection finds here (as init sees it), else what detection
//! finds on this machine. `--topology FILE` shows a machine you
//! do not have (an NCCL topology XML file, such as those published for cloud GPU VMs).
//! `--sysfs ROOT` detects from a captured sysfs tree instead of `/`. `--dump FILE` writes the
//! topology shown as NCCL topology XML, `--graph FILE` the channels as NCCL graph XML.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use ferroccl::topo::Hardware;

const HELP: &str =
    "ferroccl-topo: the hardware topology ferroccl sees, and its rings, trees and NICs

usage: ferroccl-topo [--topology FILE] [--sysfs ROOT] [--dump FILE] [--graph FILE] [-h|--help]

  --topology FILE  load an NCCL topology XML file instead of detecting (default:
                   FERRO_TOPO_FILE or NCCL_TOPO_FILE if set, else detection)
  --sysfs ROOT     detect from a sysfs tree under ROOT instead of / (e.g. a captured tree)
  --dump FILE      write the topology shown as NCCL topology XML
  --graph FILE     write the channels found as NCCL graph XML (rings and trees)
  -h, --help       print this help

Prints the path matrix between GPUs and NICs (NV#: NVLink, PIX/PXB: PCIe switches, PHB: host
bridge, SYS: CPU interconnect), the channels with their speed and rings, the tree chains, and
each GPU's NIC.
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut topology: Option<PathBuf> = None;
    let mut sysfs: Option<PathBuf> = None;
    let mut dump: Option<PathBuf> = None;
    let mut graph: Option<PathBuf> = None;
    let mut i = 0;
    while i < args.len() {
        let flag = args[i].as_str();
        if flag == "-h" || flag == "--help" {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        let Some(value) = args.get(i + 1) else {
            eprintln!("ferroccl-topo: option '{flag}' needs a value (see --help)");
            return ExitCode::from(2);
        };
        match flag {
            "--topology" => topology = Some(PathBuf::from(value)),
            "--sysfs" => sysfs = Some(PathBuf::from(value)),
            "--dump" => dump = Some(PathBuf::from(value)),
            "--graph" => graph = Some(PathBuf::from(value)),
            _ => {
                eprintln!("ferroccl-topo: unknown option '{flag}' (see --help)");
                return ExitCode::from(2);
            }
        }
        i += 2;
    }
    let env_file = ["FERRO_TOPO_FILE", "NCCL_TOPO_FILE"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()));
    let (hw, source) = match (topology, sysfs, env_file) {
        (Some(f), _, _) => (Hardware::load(&f), format!("file {}", f.display())),
        (None, Some(root), _) => (
            Hardware::detect(&root),
            format!("detected under {}", root.display()),
        ),
        (None, None, Some(f)) => (
            Hardware::load_completed(f.as_ref(), "/".as_ref()),
            format!("file {f} (from the environment), completed by detection"),
        ),
        (None, None, None) => (
            Hardware::detect("/".as_ref()),
            "detected on this machine".to_string(),
        ),
    };
    let hw = match hw {
        Ok(hw) => hw,
        Err(e) => {
            eprintln!("ferroccl-topo: {e}");
            return ExitCode::from(1);
        }
    };
    if let Some(out) = dump {
        if let Err(e) = hw.dump(&out) {
            eprintln!("ferroccl-topo: {e}");
            return ExitCode::from(1);
        }
    }
    let s = hw.search();
    if let Some(out) = graph {
        if let Err(e) = std::fs::write(&out, hw.graph_xml(&s).to_xml()) {
            eprintln!("ferroccl-topo: writing graph file {}: {e}", out.display());
            return ExitCode::from(1);
        }
    }
    println!("Topology: {source}");
    println!("{}\n", hw.summary());
    print!("{}", hw.matrix());
    println!();
    if s.gpus.is_empty() {
        println!("No GPUs: the ranks of this host form one ring in local-rank order.");
    } else {
        println!(
            "{} channel(s) of {:.1} GB/s, {:.1} GB/s in all",
            s.channels.len(),
            s.channels.first().map_or(0.0, |c| c.gbps),
            s.total_gbps()
        );
        for line in hw.plan_lines(&s) {
            println!("{line}");
        }
    }
    ExitCode::SUCCESS
}
