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
    for flag in ["--topology", "--sysfs", "--dump", "--help"] {
        assert!(out.contains(flag), "{out}");
    }
}

#[test]
fn shows_a_machine_from_its_file() {
    let (code, out, err) = run(&["--topology", &data("dgx-h100.xml")]);
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
