//! Tests of the group's plans: cuts, which batches are alone, which block, and joins.

use super::*;
use crate::coll::CollKind;
use crate::{Config, DataType, ReduceOp};

#[test]
fn staged_device_collectives_are_cut_as_the_blocking_form_cuts_them() {
    let config = Config {
        device_slice_bytes: Some(16),
        ..Config::default()
    };
    let comm = Communicator::local_group(1, config).unwrap().remove(0);
    let (send, recv) = (0x1000 as *const u8, 0x9000 as *mut u8);
    let coll = |kind, send, count| Op::Coll {
        api: "ncclAllReduce",
        kind,
        send,
        recv,
        count,
        dtype: DataType::Float32,
        red: Reduction::Op(ReduceOp::Sum),
        on: None,
    };
    let ops = vec![
        coll(CollKind::AllReduce, send, 10),
        coll(CollKind::AllReduce, send, 10),
        coll(CollKind::Reduce { root: 0 }, std::ptr::null(), 9),
        coll(CollKind::AllGather, send, 10),
    ];
    // Ops 0, 2 and 3 were staged device collectives; op 1 a host one.
    let out = slice_colls(&comm, ops, &[0, 2, 3]);
    let got: Vec<(usize, usize, usize)> = out
        .iter()
        .map(|o| match o {
            Op::Coll {
                send, recv, count, ..
            } => (*send as usize, *recv as usize, *count),
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(
        got,
        [
            // 10 floats in slices of 4 (16 bytes): 4, 4, 2, each range of both buffers.
            (0x1000, 0x9000, 4),
            (0x1010, 0x9010, 4),
            (0x1020, 0x9020, 2),
            // The host collective stays whole.
            (0x1000, 0x9000, 10),
            // An unused (NULL) send buffer stays NULL; 9 floats make 3 slices of 3.
            (0, 0x9000, 3),
            (0, 0x900c, 3),
            (0, 0x9018, 3),
            // Not element-wise: whole.
            (0x1000, 0x9000, 10),
        ]
    );
}

#[test]
fn a_batch_is_alone_where_no_other_batch_uses_its_streams() {
    // One communicator per GPU, a stream each (ncclCommInitAll driven from one thread).
    let own = [vec![0x10, 0x10], vec![0x20], vec![], vec![0x30, 0x31]];
    assert!((0..own.len()).all(|i| alone(&own, i)));
    // Communicators sharing a stream (several on one device): those two are not.
    let shared = [vec![0x10], vec![0x20, 0x10], vec![0x30]];
    let got: Vec<bool> = (0..shared.len()).map(|i| alone(&shared, i)).collect();
    assert_eq!(got, [false, false, true]);
    assert!(alone(&[vec![0x10]], 0), "the group's only batch");
}

#[test]
fn one_blocking_batch_with_streams_makes_every_stream_batch_block() {
    let kinds = |plans: &[Plan]| -> Vec<&str> {
        plans
            .iter()
            .map(|p| match p {
                Plan::Host => "host",
                Plan::Block => "block",
                Plan::Job(..) => "job",
                Plan::Pieces(..) => "pieces",
                Plan::Capture(..) => "capture",
            })
            .collect()
    };
    let dev = Device::new(crate::device::Provider::Host, 0).unwrap();
    let mut plans = vec![
        Plan::Job(dev, Vec::new()),
        Plan::Host,
        Plan::Job(dev, Vec::new()),
    ];
    all_or_none(&mut plans);
    assert_eq!(
        kinds(&plans),
        ["job", "host", "job"],
        "nothing blocks: jobs stay"
    );
    plans.push(Plan::Block);
    all_or_none(&mut plans);
    assert_eq!(kinds(&plans), ["block", "host", "block", "block"]);
}
