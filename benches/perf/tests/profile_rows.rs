//! `FERRO_PERF_PROFILE=1` follows each row with every rank's time per phase where the tool was
//! built with the `profile` feature, and prints nothing more without it: host buffers, and
//! device buffers (the host stand-in) straight on the device over p2p, as gpu-check's 8g runs.

use std::process::Command;

const PHASES: [&str; 9] = [
    "enter", "plan", "drive", "send", "recv", "reduce", "wait", "leave", "stage",
];

/// all_reduce_perf on 2 thread ranks, 8 B .. 8 KiB, 5 timed calls a row, with `env`.
fn run(env: &[(&str, &str)], extra: &[&str]) -> String {
    let mut c = Command::new(env!("CARGO_BIN_EXE_all_reduce_perf"));
    for (k, _) in std::env::vars() {
        if k.starts_with("FERRO_") || ["RANK", "WORLD_SIZE", "LOCAL_RANK"].contains(&k.as_str()) {
            c.env_remove(k);
        }
    }
    let out = c
        .env("FERRO_PERF_PROFILE", "1")
        .envs(env.iter().copied())
        .args([
            "-b", "8", "-e", "8K", "-f", "32", "-t", "2", "-n", "5", "-w", "1",
        ])
        .args(extra)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// Checks the rows and, in a profiled build, one line per row and rank with every phase.
fn check(text: &str) {
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && l.split_whitespace().count() > 8)
        .collect();
    assert_eq!(rows.len(), 3, "8 B, 256 B and 8 KiB rows: {text}");
    let profiles: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("#  profile (us/call) "))
        .collect();
    if !cfg!(feature = "profile") {
        assert!(profiles.is_empty(), "{text}");
        return;
    }
    assert_eq!(profiles.len(), 6, "one line per row and rank: {text}");
    for (i, bytes) in ["8", "256", "8192"].iter().enumerate() {
        for r in 0..2 {
            let l = profiles[i * 2 + r];
            let head = format!("#  profile (us/call) {bytes} B rank {r}: out of place ");
            assert!(l.starts_with(&head), "{l}");
            let (out_of_place, in_place) = l.split_once("; in place ").expect(l);
            for half in [out_of_place, in_place] {
                for phase in PHASES {
                    let v = half
                        .split_once(&format!("{phase} "))
                        .and_then(|(_, rest)| rest.split_whitespace().next())
                        .and_then(|v| v.parse::<f64>().ok());
                    assert!(v.is_some_and(|v| v >= 0.0), "{phase} in {half}");
                }
                // Every timed call counted, on the device path too.
                assert!(half.contains("(5 calls)"), "{half}");
            }
        }
    }
}

#[test]
fn rows_are_followed_by_each_ranks_phases_only_in_a_profiled_build() {
    check(&run(&[], &[]));
}

#[test]
fn device_calls_straight_on_the_device_are_profiled_too() {
    let env = [
        ("FERRO_DEVICE_PROVIDER", "host"),
        ("FERRO_P2P_PROVIDER", "host"),
        ("FERRO_TRANSPORTS", "p2p"),
    ];
    check(&run(&env, &["-B", "1"]));
}
