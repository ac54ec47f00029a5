//! `latency_parts` runs, checks its result and reports every rank; bad arguments are named.

use std::process::Command;

fn tool() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_latency_parts"));
    // Two ranks as threads of one process: no launcher environment.
    for (k, _) in std::env::vars() {
        if k.starts_with("FERRO_")
            || k.starts_with("OMPI_")
            || k.starts_with("SLURM_")
            || [
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                "MASTER_ADDR",
                "MASTER_PORT",
            ]
            .contains(&k.as_str())
        {
            c.env_remove(k);
        }
    }
    c
}

#[test]
fn reports_each_rank_per_call() {
    for bytes in ["8", "36"] {
        let out = tool()
            .args(["-n", "200", "-w", "20", "-b", bytes])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for r in 0..2 {
            let line = text
                .lines()
                .find(|l| l.starts_with(&format!("rank {r} of 2: {bytes} B allreduce, 200 calls:")))
                .unwrap_or_else(|| panic!("no line for rank {r}: {text}"));
            assert!(line.contains(" us/call"), "{line}");
            assert!(
                line.contains("enter ") || line.contains("--features profile"),
                "{line}"
            );
        }
    }
}

#[test]
fn bad_arguments_are_named() {
    let out = tool().args(["-b", "6"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("-b 6") && err.contains("multiple of 4"),
        "{err}"
    );
    let out = tool().args(["-x"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("unknown argument \"-x\""),
        "{err}"
    );
}
