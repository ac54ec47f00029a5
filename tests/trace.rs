//! The timeline (`FERRO_TRACE_FILE`): three rank processes run known collectives with
//! tracing on; every file must be valid Chrome trace event JSON whose events match the calls
//! (name, sequence number, bytes, algorithm, per-peer waits and transports), and
//! `ferroccl-trace merge` must join them into one valid file with a row per rank.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::child::{self, free_port, now_ms, self_command, serial, Running};
use ferroccl::{Communicator, ReduceOp};
use serde_json::Value;

/// The calls every rank makes: (trace name, bytes). The first is small enough for the
/// shared-memory lane, which this job does not use: rank 2 reaches the others over TCP.
const CALLS: [(&str, usize); 5] = [
    ("all_reduce", 2 * 4),
    ("all_reduce", 1000 * 4),
    ("all_reduce", 65_536 * 4),
    ("broadcast", 77 * 8),
    ("all_gather", 33 * 4),
];

#[test]
fn child_traced() {
    if !child::is_role("traced") {
        return;
    }
    let comm = Communicator::from_env().expect("from_env");
    let r = comm.rank() as f32;
    let mut tiny = [r, 1.0];
    comm.all_reduce_in_place(&mut tiny, ReduceOp::Sum).unwrap();
    assert_eq!(tiny[1], comm.nranks() as f32);
    let mut a = vec![r; 1000];
    comm.all_reduce_in_place(&mut a, ReduceOp::Sum).unwrap();
    let mut b = vec![r; 65_536];
    comm.all_reduce_in_place(&mut b, ReduceOp::Max).unwrap();
    let mut c = vec![comm.rank() as i64; 77];
    comm.broadcast(&mut c, 1).unwrap();
    assert_eq!(c[76], 1);
    let mut d = vec![0f32; 33 * comm.nranks()];
    comm.all_gather(&[r; 33], &mut d).unwrap();
    drop(comm);
    println!("TRACED");
}

fn events(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}\n{text}"));
    v.as_array().expect("a JSON array of events").clone()
}

/// Checks the fields every Chrome trace event of ours carries.
fn check_event(e: &Value, n: usize) {
    let ph = e["ph"].as_str().expect("ph");
    assert!(ph == "X" || ph == "M", "{e}");
    assert!(e["pid"].as_u64().is_some_and(|p| (p as usize) < n), "{e}");
    assert!(e["name"].as_str().is_some(), "{e}");
    if ph == "X" {
        assert!(
            e["ts"].as_f64().is_some_and(|t| t > 1.0e15),
            "ts in Unix microseconds: {e}"
        );
        assert!(e["dur"].as_f64().is_some_and(|d| d >= 0.0), "{e}");
        let a = &e["args"];
        assert!(
            a["seq"].as_u64().is_some() && a["bytes"].as_u64().is_some(),
            "{e}"
        );
        let algorithm = a["algorithm"].as_str().unwrap_or("");
        assert!(!algorithm.is_empty() && algorithm != "lane", "{e}");
        let waits = a["wait_us"].as_object().expect("wait_us");
        let links = a["transport"].as_object().expect("transport");
        assert_eq!(waits.len(), links.len(), "{e}");
        for (peer, us) in waits {
            let p: u64 = peer.parse().expect("peer number");
            assert!(
                p as usize != e["pid"].as_u64().unwrap() as usize && (p as usize) < n,
                "{e}"
            );
            assert!(us.as_f64().is_some_and(|u| u > 0.0), "{e}");
            assert!(matches!(links[peer].as_str(), Some("shm" | "tcp")), "{e}");
        }
    }
}

#[test]
fn traces_are_valid_and_match_the_calls_and_merge() {
    let _serial = serial();
    let n = 3;
    let dir: PathBuf =
        std::env::temp_dir().join(format!("ferro-trace-{}-{}", std::process::id(), now_ms()));
    std::fs::create_dir_all(&dir).unwrap();
    let pattern = dir.join("trace-%r.json").display().to_string();
    let store = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let ranks: Vec<Running> = (0..n)
        .map(|r| {
            let mut env = child::rank_env(r, n, store, 30);
            env.push(("FERRO_TRACE_FILE", pattern.clone()));
            // Rank 2 talks TCP, the others shared memory among themselves.
            if r == 2 {
                env.push(("FERRO_TRANSPORTS", "tcp".into()));
            }
            Running::spawn(self_command("child_traced", "traced", &env))
        })
        .collect();
    for (r, p) in ranks.into_iter().enumerate() {
        let out = p.finish(Duration::from_secs(120));
        assert!(
            out.success() && out.tagged("TRACED").len() == 1,
            "rank {r}: {}",
            out.dump()
        );
    }
    let files: Vec<PathBuf> = (0..n)
        .map(|r| dir.join(format!("trace-{r}.json")))
        .collect();
    let mut first_seq = None;
    for (r, f) in files.iter().enumerate() {
        let evs = events(f);
        for e in &evs {
            check_event(e, n);
            assert_eq!(e["pid"].as_u64(), Some(r as u64));
        }
        let colls: Vec<&Value> = evs.iter().filter(|e| e["ph"] == "X").collect();
        // Every call appears, in order, with its bytes; a rooted call's root check shows as an
        // extra small event with the same sequence number.
        let mut at = 0;
        let mut last_seq = 0;
        for (name, bytes) in CALLS {
            let i = colls[at..]
                .iter()
                .position(|e| {
                    e["name"] == name && e["args"]["bytes"].as_u64() == Some(bytes as u64)
                })
                .unwrap_or_else(|| {
                    panic!("rank {r}: no {name} of {bytes} bytes after event {at}: {colls:?}")
                });
            let e = colls[at + i];
            let seq = e["args"]["seq"].as_u64().unwrap();
            assert!(
                seq > last_seq,
                "rank {r}: sequence numbers increase: {colls:?}"
            );
            last_seq = seq;
            // Rank 2 reaches its peers over TCP.
            let links = e["args"]["transport"].as_object().unwrap();
            if r == 2 {
                assert!(links.values().all(|l| l == "tcp"), "{e}");
            }
            assert!(
                !links.is_empty(),
                "a collective of 3 ranks waits for a peer: {e}"
            );
            at += i + 1;
        }
        let s = colls[0]["args"]["seq"].as_u64();
        assert!(
            first_seq.is_none() || first_seq == Some(s),
            "ranks number calls alike"
        );
        first_seq = Some(s);
    }
    // Merge.
    let merged = dir.join("all.json");
    let status = Command::new(env!("CARGO_BIN_EXE_ferroccl-trace"))
        .arg("merge")
        .args(&files)
        .arg("-o")
        .arg(&merged)
        .status()
        .expect("ferroccl-trace");
    assert!(status.success());
    let all = events(&merged);
    let per_file: usize = files.iter().map(|f| events(f).len()).sum();
    assert_eq!(all.len(), per_file);
    let pids: std::collections::BTreeSet<u64> =
        all.iter().filter_map(|e| e["pid"].as_u64()).collect();
    assert_eq!(pids.len(), n);
    for e in &all {
        check_event(e, n);
    }
    let help = Command::new(env!("CARGO_BIN_EXE_ferroccl-trace"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(help.status.success() && String::from_utf8_lossy(&help.stdout).contains("merge FILE"));
    std::fs::remove_dir_all(&dir).unwrap();
}
