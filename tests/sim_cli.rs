//! `ferroccl-sim` as a command: its exit status and messages.

use std::process::{Command, Stdio};

const SIM: &str = env!("CARGO_BIN_EXE_ferroccl-sim");

#[test]
fn a_reader_that_stops_early_is_not_a_failure() {
    // The reader closes the pipe before the table is written (as `| head` does once it has
    // its lines): the writes fail with EPIPE, which ends the run quietly.
    let mut child = Command::new(SIM)
        .args(["--ranks", "64", "--ranks-per-host", "8", "--algo", "all"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ferroccl-sim");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait for ferroccl-sim");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(stderr.is_empty(), "{stderr}");
}

#[test]
fn bad_options_name_themselves() {
    let out = Command::new(SIM)
        .args(["--ranks", "4", "--ranks-per-host", "2", "--slow", "9=2"])
        .output()
        .expect("run ferroccl-sim");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--slow 9=2: host must be < 2"), "{stderr}");
    let out = Command::new(SIM)
        .args(["--ranks", "4", "--calls", "0"])
        .output()
        .expect("run ferroccl-sim");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--calls"), "{stderr}");
}

#[test]
fn help_names_every_flag_and_version_prints_the_version() {
    for flag in ["--help", "-h"] {
        let out = Command::new(SIM)
            .arg(flag)
            .output()
            .expect("run ferroccl-sim");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{flag}: {:?}", out.status);
        for name in [
            "--ranks",
            "--ranks-per-host",
            "--op",
            "--algo",
            "--minbytes",
            "--maxbytes",
            "--stepfactor",
            "--intra",
            "--inter",
            "--nic-gbps",
            "--nic-burst",
            "--reduce-gbps",
            "--eager",
            "--slice",
            "--calls",
            "--ranks-per-core",
            "--wake-us",
            "--cache",
            "--mem-gbps",
            "--slow",
            "--placement",
            "--topology",
            "--version",
            "--help",
        ] {
            assert!(
                stdout.contains(name),
                "{flag} does not name {name}:\n{stdout}"
            );
        }
    }
    let out = Command::new(SIM)
        .arg("--version")
        .output()
        .expect("run ferroccl-sim");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{:?}", out.status);
    assert_eq!(
        stdout.trim(),
        format!("ferroccl-sim {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn the_header_prints_link_costs_readably() {
    let out = Command::new(SIM)
        .args(["--ranks", "4", "--ranks-per-host", "2", "-e", "8"])
        .output()
        .expect("run ferroccl-sim");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{:?}", out.status);
    let header = stdout.lines().next().unwrap_or("");
    assert!(
        header.contains("intra shm: ") && header.contains(" us, "),
        "{header}"
    );
    assert!(!header.contains("LinkCost"), "{header}");
}
