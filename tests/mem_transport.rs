//! The in-memory transport inside the communicator: ranks as threads of one process connect
//! through `mem` alone and run collectives with a distinct value in every element; ranks on
//! different hosts cannot use it, and init says why.

mod common;

use std::time::Duration;

use common::threads::{self, on_all};
use ferroccl::{Communicator, Config, ReduceOp};

fn config(host: Option<String>) -> Config {
    Config {
        timeout: Duration::from_secs(60),
        transports: vec!["mem".into()],
        host_id: host,
        ..Config::default()
    }
}

fn init_all(configs: Vec<Config>, tag: u64) -> Vec<ferroccl::Result<Communicator>> {
    threads::init_all(configs, 0x4d45_4d00 << 24 ^ tag << 8)
}

/// The value rank `r` contributes at element `i`: distinct per rank and element, exact in f64.
fn value(r: usize, i: usize) -> f64 {
    (r * 1_000_003 + i * 7 + 1) as f64
}

#[test]
fn threads_connect_through_mem_and_run_collectives() {
    for n in [3, 5] {
        let comms: Vec<Communicator> = init_all((0..n).map(|_| config(None)).collect(), 1)
            .into_iter()
            .map(|c| c.expect("init"))
            .collect();
        for c in &comms {
            for p in (0..n).filter(|&p| p != c.rank()) {
                assert_eq!(c.transport(p), Some("mem"), "rank {} to {p}", c.rank());
            }
        }
        for count in [0usize, 1, 100, 10_000, 300_001] {
            on_all(&comms, |c| {
                let r = c.rank();
                // All-reduce: every element is the sum of the ranks' distinct values.
                let send: Vec<f64> = (0..count).map(|i| value(r, i)).collect();
                let mut sum = vec![0f64; count];
                c.all_reduce(&send, &mut sum, ReduceOp::Sum).unwrap();
                for (i, &x) in sum.iter().enumerate() {
                    let want: f64 = (0..n).map(|q| value(q, i)).sum();
                    assert_eq!(
                        x, want,
                        "{n} ranks, all_reduce of {count}: element {i} on rank {r}"
                    );
                }
                // Broadcast from the last rank.
                let root = n - 1;
                let mut b: Vec<f64> = if r == root {
                    (0..count).map(|i| value(root, i)).collect()
                } else {
                    vec![-1.0; count]
                };
                c.broadcast(&mut b, root).unwrap();
                for (i, &x) in b.iter().enumerate() {
                    assert_eq!(
                        x,
                        value(root, i),
                        "{n} ranks, broadcast of {count}: element {i} on rank {r}"
                    );
                }
                // All-gather: rank q's block holds rank q's values.
                let mut all = vec![0f64; count * n];
                c.all_gather(&send, &mut all).unwrap();
                for (j, &x) in all.iter().enumerate() {
                    let (q, i) = (j / count.max(1), j % count.max(1));
                    assert_eq!(
                        x,
                        value(q, i),
                        "{n} ranks, all_gather of {count}: element {j} on rank {r}"
                    );
                }
            });
        }
    }
}

#[test]
fn mem_across_hosts_fails_init_with_its_reason() {
    let results = init_all(
        vec![config(Some("host-a".into())), config(Some("host-b".into()))],
        2,
    );
    for (r, res) in results.into_iter().enumerate() {
        let e = res.expect_err("mem cannot join ranks on two hosts");
        let msg = e.to_string();
        assert!(msg.contains("mem: rank"), "rank {r}: {msg}");
        assert!(
            msg.contains("runs on another host (mem joins threads of one process)"),
            "rank {r}: {msg}"
        );
    }
}
