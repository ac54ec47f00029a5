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
