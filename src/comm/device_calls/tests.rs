//! Tests of the device calls: cuts, slices, bindings and which jobs may drive a transport.

use super::*;

#[test]
fn blocked_layouts_are_cut_by_their_larger_buffer_and_no_slice_is_empty() {
    let config = Config {
        device_slice_bytes: Some(256),
        ..Config::default()
    };
    let comms = Communicator::local_group(3, config.clone()).unwrap();
    let inner = &comms[0].inner;
    // 1021 f32 per block, 3 blocks: 48 slices wanted, of 22 elements; 47 hold them all.
    let c = cut(inner, CollKind::AllGather, 1021, 4);
    assert_eq!((c.slices, c.in_blocks, c.out_blocks), (47, 1, 3));
    let c = cut(inner, CollKind::ReduceScatter, 1021, 4);
    assert_eq!((c.slices, c.in_blocks, c.out_blocks), (47, 3, 1));
    assert_eq!(cut(inner, CollKind::AllReduce, 1021, 4).slices, 16);
    for kind in [CollKind::AllGather, CollKind::AllToAll, CollKind::AllReduce] {
        for count in (0..200).chain([1021, 4099, 65537]) {
            let c = cut(inner, kind, count, 8);
            let total: usize = (0..c.slices).map(|k| c.range(k).len()).sum();
            assert_eq!(total, count, "{kind:?} {count}");
            assert!(
                count == 0 || (0..c.slices).all(|k| !c.range(k).is_empty()),
                "{kind:?} {count}: {c:?}"
            );
        }
    }
    // Whole where the p2p transport is tried, and on one rank.
    let p2p = Config {
        transports: vec!["p2p".into(), "shm".into()],
        ..config.clone()
    };
    assert!(cuts_blocks(&config) && !cuts_blocks(&p2p));
    // Many ranks: a slice's part of a block stays at least 1/64 of the slice bytes.
    let c = cut_for(&config, 80, true, CollKind::AllToAll, 1021, 4);
    assert_eq!(
        c.slices, 1021,
        "parts of 4 bytes, not 80 × 1021 × 4 / 256 slices"
    );
    let big = Config {
        device_slice_bytes: Some(4 << 20),
        ..config.clone()
    };
    let c = cut_for(&big, 80, false, CollKind::AllGather, 1 << 20, 4);
    assert_eq!(c.slices, 64, "80 blocks of 4 MiB: parts of 64 KiB");
    let one = Communicator::local_group(1, config).unwrap();
    assert_eq!(cut(&one[0].inner, CollKind::AllGather, 1021, 4).slices, 1);
}

#[test]
fn unset_device_slices_are_larger_on_one_host_with_p2p() {
    let unset = Config::default();
    let p2p = Config {
        transports: vec!["p2p".into(), "shm".into()],
        ..Config::default()
    };
    let count = 100 << 20; // 400 MiB of f32
    let slices =
        |c: &Config, one_host| cut_for(c, 2, one_host, CollKind::AllReduce, count, 4).slices;
    assert_eq!(slices(&unset, true), 100, "4 MiB slices without p2p");
    assert_eq!(slices(&p2p, false), 100, "4 MiB slices across hosts");
    assert_eq!(slices(&p2p, true), 7, "64 MiB slices on one host with p2p");
    let set = Config {
        device_slice_bytes: Some(1 << 20),
        ..p2p
    };
    assert_eq!(slices(&set, true), 400, "FERRO_DEVICE_SLICE_BYTES wins");
}

#[test]
fn large_slices_stage_fewer_at_once_and_stay_in_stream_order() {
    use crate::device::stream_queue::ORDER_MAX_BYTES;
    let p2p = Config {
        transports: vec!["p2p".into(), "shm".into()],
        ..Config::default()
    };
    let count = 256 << 20; // 1 GiB of f32
    let cut = |c: &Config, one_host| cut_for(c, 2, one_host, CollKind::AllReduce, count, 4);
    // Out of place a call stages its input and its output slices in flight.
    let staged = |c: Cut| 2 * c.staged(1, count) * 4;
    let (small, large) = (cut(&p2p, false), cut(&p2p, true));
    assert_eq!((small.in_flight(), staged(small)), (4, 32 << 20));
    assert_eq!(large.in_flight(), 2, "64 MiB slices: 2 in flight");
    assert!(
        staged(large) <= ORDER_MAX_BYTES,
        "{} bytes staged would leave stream order",
        staged(large)
    );
    // Never fewer than 2, so that copies overlap the transfer; never more than the slices.
    let huge = Config {
        device_slice_bytes: Some(512 << 20),
        ..p2p
    };
    assert_eq!(cut(&huge, true).in_flight(), 2);
    assert_eq!(
        cut_for(&huge, 2, true, CollKind::AllReduce, 5, 4).in_flight(),
        1
    );
}

#[test]
fn counts_follow_the_typed_calls() {
    assert_eq!(count_of(CollKind::AllReduce, Some(7), 7, 3), Some(7));
    assert_eq!(count_of(CollKind::AllGather, Some(2), 6, 3), Some(2));
    assert_eq!(count_of(CollKind::AllGather, None, 6, 3), Some(2));
    assert_eq!(count_of(CollKind::ReduceScatter, Some(6), 2, 3), Some(2));
    assert_eq!(count_of(CollKind::AllToAll, Some(6), 6, 3), Some(2));
    assert_eq!(count_of(CollKind::AllToAll, Some(7), 7, 3), None);
}

#[test]
fn bindings_count_the_communicators_of_a_device() {
    let d = Device::new(crate::device::Provider::Host, 3).unwrap();
    let before = Binding::count(d);
    let a = Binding::new(d);
    let b = Binding::new(d);
    assert_eq!(Binding::count(d), before + 2);
    drop(a);
    assert_eq!(Binding::count(d), before + 1);
    drop(b);
    assert_eq!(Binding::count(d), before);
}

#[test]
fn stream_jobs_never_drive_a_transport_that_calls_the_driver() {
    assert!(job_calls_driver(Provider::Cuda, true));
    assert!(!job_calls_driver(Provider::Cuda, false));
    assert!(!job_calls_driver(Provider::Host, true));
    assert!(!job_calls_driver(Provider::Host, false));
    assert_eq!(
        count_of(CollKind::Broadcast { root: 0 }, None, 5, 3),
        Some(5)
    );
    assert_eq!(
        count_of(CollKind::Reduce { root: 1 }, Some(5), 0, 3),
        Some(5)
    );
}
