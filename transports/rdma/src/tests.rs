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

/// Registrations made per message and dropped after it, as with the real provider.
#[test]
fn conformance_without_cached_registrations() {
    let cfg = RdmaConfig::default();
    conformance::run(&options(false), || {
        let dev = crate::SoftDevice::shared().expect("soft device");
        let (a, b) = crate::setup::soft_pair_with(dev, 0, 1, &cfg, false).expect("pair");
        (
            Box::new(a) as Box<dyn Connection>,
            Box::new(b) as Box<dyn Connection>,
        )
    });
}

#[test]
fn conformance_one_queue_pair() {
    let cfg = RdmaConfig {
        qps_per_conn: 1,
        ..RdmaConfig::default()
    };
    conformance::run(&options(false), || pair(&cfg));
}

/// A provider that cannot run declines every peer with the reason; FERRO_IB_HCA can exclude
/// the software device; both ends of a pair decline the same way.
#[test]
fn declines_say_why() {
    use ferroccl_transport::{RankDesc, SetupCtx, Transport};
    let ranks = [RankDesc { host: 1, pid: 10 }, RankDesc { host: 2, pid: 11 }];
    let ctx = SetupCtx {
        rank: 0,
        nranks: 2,
        comm_id: 7,
        ranks: &ranks,
        deadline: std::time::Instant::now(),
    };
    let excluded = RdmaConfig {
        hca: crate::HcaFilter::parse("^soft0").unwrap(),
        ..RdmaConfig::default()
    };
    let t = crate::RdmaTransport::new(Ok(excluded), false);
    let why = t.can_connect(&ctx, 1).unwrap_err();
    assert!(why.contains("FERRO_IB_HCA excludes soft0 port 1"), "{why}");
    let t = crate::RdmaTransport::new(Ok(RdmaConfig::default()), false);
    let why = t.can_connect(&ctx, 1).unwrap_err();
    assert!(why.contains("another host"), "{why}");
    let bad = crate::RdmaTransport::new(
        Err("FERRO_IB_QPS_PER_CONN=9 is not a number in 1..=8".into()),
        false,
    );
    assert!(bad
        .can_connect(&ctx, 1)
        .unwrap_err()
        .contains("FERRO_IB_QPS_PER_CONN"));
}
