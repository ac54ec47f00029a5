//! The conformance suite over the software provider, in-process pairs.

use ferroccl_transport::Connection;
use ferroccl_transport_testkit::conformance::{self, Options, Pair};

use crate::{soft_pair, RdmaConfig};

fn pair(cfg: &RdmaConfig) -> Pair {
    let (a, b) = soft_pair(0, 1, cfg).expect("a software-verbs pair");
    (
        Box::new(a) as Box<dyn Connection>,
        Box::new(b) as Box<dyn Connection>,
    )
}

fn options(threads: bool) -> Options {
    Options {
        threads,
        one_sided: true,
        ..Options::new("rdma(soft)")
    }
}

#[test]
fn conformance_two_queue_pairs() {
    let cfg = RdmaConfig::default();
    conformance::run(&options(false), || pair(&cfg));
}

#[test]
fn conformance_threads_three_queue_pairs_small_chunks() {
    let cfg = RdmaConfig {
        qps_per_conn: 3,
        chunk: 64 << 10,
        eager: 2048,
        ..RdmaConfig::default()
    };
    conformance::run(&options(true), || pair(&cfg));
}

#[test]
fn conformance_one_queue_pair() {
    let cfg = RdmaConfig {
        qps_per_conn: 1,
        ..RdmaConfig::default()
    };
    conformance::run(&options(false), || pair(&cfg));
}
