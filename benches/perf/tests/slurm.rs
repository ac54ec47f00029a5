//! The perf tools under a real SLURM: a private one-node cluster (`scripts/slurm-local.sh`:
//! munged, slurmctld and slurmd with their own configuration, ports and state) and
//! `srun -n 3 all_reduce_perf`, with no address set, so the ranks meet through the job's file
//! store. Skipped, with a message, where Debian's `slurm-wlm` and `munge` are not installed
//! (`scripts/setup.sh` installs them).

use std::path::{Path, PathBuf};
use std::process::Command;

const LAUNCH_PREFIXES: &[&str] = &["FERRO_", "SLURM_", "OMPI_", "PMIX_"];

/// Stops the private cluster when the test ends, passed or not.
struct Cluster {
    script: PathBuf,
    dir: String,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(&self.script)
            .arg("stop")
            .env("FERRO_SLURM_DIR", &self.dir)
            .status();
    }
}

#[test]
fn all_reduce_perf_under_srun_on_one_node() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let script = root.join("scripts/slurm-local.sh");
    let dir = format!("/tmp/ferroccl-test-slurm-{}", std::process::id());
    let out = Command::new(&script)
        .arg("start")
        .env("FERRO_SLURM_DIR", &dir)
        .output()
        .expect("running scripts/slurm-local.sh");
    let cluster = Cluster { script, dir };
    if out.status.code() == Some(3) {
        eprintln!(
            "skipping the SLURM test: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return;
    }
    assert!(
        out.status.success(),
        "starting the one-node cluster failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let conf = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let mut cmd = Command::new("timeout");
    cmd.args(["120", "srun", "-n", "3"])
        .arg(env!("CARGO_BIN_EXE_all_reduce_perf"))
        .args([
            "-b", "8", "-e", "32K", "-f", "8", "-n", "2", "-w", "1", "-d", "int32", "-o", "sum",
        ]);
    for (k, _) in std::env::vars() {
        let launcher = LAUNCH_PREFIXES.iter().any(|p| k.starts_with(p))
            || [
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                "MASTER_ADDR",
                "MASTER_PORT",
            ]
            .contains(&k.as_str());
        if launcher {
            cmd.env_remove(&k);
        }
    }
    let out = cmd.env("SLURM_CONF", &conf).output().expect("srun");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "srun -n 3 all_reduce_perf failed:\n{text}"
    );
    for r in 0..3 {
        assert!(
            text.contains(&format!("#  Rank  {r} Group")),
            "rank {r} missing:\n{text}"
        );
    }
    assert!(text.contains("# Out of bounds values : 0 OK"), "{text}");
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert_eq!(rows.len(), 5, "{text}");
    for row in rows {
        let f: Vec<&str> = row.split_whitespace().collect();
        assert!(
            f.len() >= 13 && f[8] == "0" && f[12] == "0",
            "a wrong value: {row}"
        );
    }
    drop(cluster);
}
