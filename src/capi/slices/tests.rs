//! Which batches are queued piece by piece, and how.

use super::*;
use crate::capi::stream::OnStream;
use crate::device::Provider;
use crate::Config;

/// Three thread ranks whose device calls are cut into 64 KiB slices and pieces, and a
/// stand-in device.
fn three_ranks() -> (Vec<Communicator>, Device) {
    let config = Config {
        device_slice_bytes: Some(64 << 10),
        ..Config::default()
    };
    let comms = Communicator::local_group(3, config).unwrap();
    (comms, Device::new(Provider::Host, 0).unwrap())
}

/// Stream `stream` of `device`.
fn on(device: Device, stream: usize) -> Option<OnStream> {
    Some(OnStream {
        device,
        stream,
        captured: false,
    })
}

/// The collectives of `p`, in order.
fn colls(p: &Pieces) -> Vec<&Lone> {
    p.parts
        .iter()
        .filter_map(|p| match p {
            Part::Coll(l) => Some(l),
            Part::Rooted { .. } => None,
        })
        .collect()
}

#[test]
fn long_sends_and_receives_on_one_stream_are_queued_in_rounds() {
    let (comms, dev) = three_ranks();
    let comm = &comms[1];
    let on = |stream| on(dev, stream);
    let long = (1 << 20) / 4 + 6; // f32: 17 pieces of 64 KiB
    let send = |at: usize, count, peer, stream| Op::Send {
        buf: at as *const u8,
        count,
        dtype: DataType::Float32,
        peer,
        on: on(stream),
    };
    let recv = |at: usize, count, peer, stream| Op::Recv {
        buf: at as *mut u8,
        count,
        dtype: DataType::Float32,
        peer,
        on: on(stream),
    };
    let plan = |ops: &[Op]| pieces(comm, dev, &[0x77], ops, true).map(|p| p.and_then(|p| p.rounds));
    let long_send = || send(0x10_0000, long, 2, 0x77);
    let group = [
        long_send(),
        send(0x90_0000, 6, 0, 0x77),
        recv(0x200_0000, long, 0, 0x77),
        recv(0x300_0000, 0, 2, 0x77),
    ];
    let r = plan(&group).unwrap().expect("in rounds");
    assert_eq!(r.rounds(), 17);
    assert_eq!(r.ops().len(), 4);
    assert_eq!((r.ops()[0].send, r.ops()[0].peer), (true, 2));
    assert_eq!((r.ops()[2].addr, r.ops()[2].len), (0x200_0000, long * 4));
    // Bytes on the wire, as the C ABI's blocking and host paths send them.
    assert!(r.ops().iter().all(|o| o.dtype == DataType::Uint8));
    // Places for the rounds in flight: 3 pieces of at most 64 KiB each (and an empty one),
    // not the 2 MiB of the buffers.
    let arena = r.arena_bytes();
    assert!(arena <= 4 * (3 * (64 << 10) + 1024), "{arena}");

    // Every message one piece: one job is one round trip, not one per piece.
    assert!(plan(&[send(0x1000, 6, 0, 0x77), recv(0x2000, 6, 2, 0x77)])
        .unwrap()
        .is_none());
    // An operation on a stream that is not the batch's, or on another device: one job.
    assert!(plan(&[long_send(), send(0x9000, 6, 0, 0x78)])
        .unwrap()
        .is_none());
    // Over the batch's two streams: queued on the first (`group` joins them).
    let two = [long_send(), send(0x9000, 6, 0, 0x78)];
    let p = pieces(comm, dev, &[0x77, 0x78], &two, true)
        .unwrap()
        .expect("in pieces");
    assert_eq!(p.stream, 0x77);
    assert_eq!(p.rounds.expect("rounds").ops().len(), 2);
    let other = Device::new(Provider::Host, 1).unwrap();
    assert!(pieces(comm, other, &[0x77], &[long_send()], true)
        .unwrap()
        .is_none());
    // A receive overlapping another buffer of the group is refused, naming both.
    let e = plan(&[long_send(), recv(0x10_0000 + 4096, 8, 0, 0x77)])
        .map(|_| ())
        .unwrap_err();
    assert!(e.to_string().contains("overlap"), "{e}");
    assert!(e.to_string().contains("0x101000"), "{e}");
}

#[test]
fn collectives_beside_long_messages_are_queued_in_slices_then_rounds() {
    let (comms, dev) = three_ranks();
    let comm = &comms[1];
    let on = |stream| on(dev, stream);
    let long = (1 << 20) / 4 + 6; // f32: 17 pieces, or slices, of 64 KiB
    let send = |at: usize, count| Op::Send {
        buf: at as *const u8,
        count,
        dtype: DataType::Float32,
        peer: 2,
        on: on(0x77),
    };
    let recv = |at: usize, count| Op::Recv {
        buf: at as *mut u8,
        count,
        dtype: DataType::Float32,
        peer: 0,
        on: on(0x77),
    };
    let coll = |at: usize, count, red, stream| Op::Coll {
        api: "ncclAllReduce",
        kind: CollKind::AllReduce,
        send: at as *const u8,
        recv: at as *mut u8,
        count,
        dtype: DataType::Float32,
        red,
        on: on(stream),
    };
    let sum = Reduction::Op(ReduceOp::Sum);
    let plan = |ops: &[Op]| pieces(comm, dev, &[0x77], ops, true);

    // A long message beside a short collective: the collective (one slice), then 17
    // rounds; the arena holds the larger part, not the buffers.
    let p = plan(&[
        send(0x10_0000, long),
        coll(0x900_0000, 10, sum, 0x77),
        recv(0x200_0000, long),
    ])
    .unwrap()
    .expect("in pieces");
    assert_eq!(colls(&p).len(), 1);
    assert_eq!(colls(&p)[0].call.cut.slices, 1);
    let r = p.rounds.as_ref().expect("rounds");
    assert_eq!(
        (p.device, p.stream, r.rounds(), r.ops().len()),
        (dev, 0x77, 17, 2)
    );
    assert_eq!(
        p.arena_bytes(),
        r.arena_bytes().max(p.parts[0].arena_bytes())
    );
    assert!(p.arena_bytes() < 1 << 20, "{}", p.arena_bytes());

    // A long collective beside short messages: its slices, then one round. Collectives
    // keep their issue order (a sum of no element dropped, as every path skips it).
    let p = plan(&[
        coll(0x900_0000, long, sum, 0x77),
        send(0x10_0000, 6),
        coll(0x800_0000, 0, sum, 0x77),
        coll(0xa00_0000, 12, sum, 0x77),
        recv(0x200_0000, 6),
    ])
    .unwrap()
    .expect("in pieces");
    let got: Vec<(u64, usize)> = colls(&p)
        .iter()
        .map(|l| (l.call.recv.0, l.call.cut.slices))
        .collect();
    assert_eq!(got, [(0x900_0000, 17), (0xa00_0000, 1)]);
    assert_eq!(p.rounds.as_ref().map(P2pRounds::rounds), Some(1));

    // Collectives alone, and messages alone, as before.
    let alone = plan(&[coll(0x900_0000, long, sum, 0x77)]).unwrap().unwrap();
    assert!(alone.rounds.is_none() && colls(&alone).len() == 1);
    let alone = plan(&[send(0x10_0000, long)]).unwrap().unwrap();
    assert!(alone.parts.is_empty() && alone.rounds.is_some());

    // One job, not pieces: nothing longer than a slice or piece; a collective on another
    // stream; a scalar read when the call runs.
    let short = [send(0x10_0000, 6), coll(0x900_0000, 10, sum, 0x77)];
    assert!(plan(&short).unwrap().is_none());
    let elsewhere = [send(0x10_0000, long), coll(0x900_0000, 10, sum, 0x78)];
    assert!(plan(&elsewhere).unwrap().is_none());
    let scalar = Reduction::ScalarAt(0x40 as *const u8, DataType::Float32);
    let read_later = [send(0x10_0000, long), coll(0x900_0000, 10, scalar, 0x77)];
    assert!(plan(&read_later).unwrap().is_none());

    // A receive overlapping a send of the group is refused, as on every path.
    let e = plan(&[
        send(0x10_0000, long),
        coll(0x900_0000, 10, sum, 0x77),
        recv(0x10_0000 + 64, 8),
    ])
    .map(|_| ())
    .unwrap_err();
    assert!(e.to_string().contains("overlap"), "{e}");
}

#[test]
fn long_gathers_and_scatters_are_queued_in_rounds_after_the_agreement() {
    let (comms, dev) = three_ranks();
    let long = (1 << 20) / 4 + 6; // f32: 17 pieces of 64 KiB
    let rooted = |which, send: usize, recv: usize, count| Op::Rooted {
        api: "ncclGather",
        which,
        root: 0,
        send: send as *const u8,
        recv: recv as *mut u8,
        count,
        dtype: DataType::Float32,
        on: on(dev, 0x77),
    };
    let plan = |rank: usize, ops: &[Op]| pieces(&comms[rank], dev, &[0x77], ops, true).unwrap();
    // (send?, peer, address, bytes) of a part's rounds, with their count.
    let moves = |p: &Pieces| -> (usize, Vec<(bool, usize, u64, usize)>) {
        assert_eq!(p.parts.len(), 1);
        let Part::Rooted { rounds, .. } = &p.parts[0] else {
            panic!("a gather or scatter")
        };
        let ops = rounds.ops().iter();
        (
            rounds.rounds(),
            ops.map(|o| {
                assert_eq!(o.dtype, DataType::Uint8, "bytes, as every C ABI path sends");
                (o.send, o.peer, o.addr, o.len)
            })
            .collect(),
        )
    };
    let bytes = long * 4;
    let (send, recv) = (0x100_0000, 0x1000_0000);
    // The root of a gather, out of place: its own block to itself, then one from each
    // peer, in 17 rounds.
    let p = plan(0, &[rooted(Rooted::Gather, send, recv, long)]).expect("in pieces");
    assert!(p.rounds.is_none());
    let r = recv as u64;
    assert_eq!(
        moves(&p),
        (
            17,
            vec![
                (true, 0, send as u64, bytes),
                (false, 0, r, bytes),
                (false, 1, r + bytes as u64, bytes),
                (false, 2, r + 2 * bytes as u64, bytes),
            ]
        )
    );
    // In place at the root: its block is already there.
    let p = plan(0, &[rooted(Rooted::Gather, recv, recv, long)]).expect("in pieces");
    assert_eq!(moves(&p).1.len(), 2);
    // A scatter's other rank: one receive from the root.
    let p = plan(2, &[rooted(Rooted::Scatter, send, recv, long)]).expect("in pieces");
    assert_eq!(moves(&p), (17, vec![(false, 0, r, bytes)]));
    // Beside a long send, in issue order: the gather, then the send.
    let tail = Op::Send {
        buf: 0x4000_0000 as *const u8,
        count: long,
        dtype: DataType::Float32,
        peer: 0,
        on: on(dev, 0x77),
    };
    let p = plan(1, &[tail, rooted(Rooted::Gather, send, recv, long)]).expect("in pieces");
    assert_eq!(moves(&p), (17, vec![(true, 0, send as u64, bytes)]));
    assert_eq!(p.rounds.as_ref().map(|r| r.ops().len()), Some(1));
    // One piece each: one job, as before.
    assert!(plan(1, &[rooted(Rooted::Gather, send, recv, 6)]).is_none());
}

#[test]
fn calls_alone_in_their_group_are_cut_and_the_rest_is_not() {
    let config = Config {
        device_slice_bytes: Some(16),
        ..Config::default()
    };
    let comms = Communicator::local_group(2, config).unwrap();
    let comm = &comms[1];
    let dev = Device::new(Provider::Host, 0).unwrap();
    let on = Some(OnStream {
        device: dev,
        stream: 0x77,
        captured: false,
    });
    let (send, recv) = (0x1000 as *const u8, 0x9000 as *mut u8);
    let coll = |kind, send, count, red| Op::Coll {
        api: "ncclAllReduce",
        kind,
        send,
        recv,
        count,
        dtype: DataType::Float32,
        red,
        on,
    };
    let sum = Reduction::Op(ReduceOp::Sum);
    let cuts = |ops: &[Op]| -> Option<Vec<Lone>> {
        let p = pieces(comm, dev, &[0x77], ops, true).unwrap()?;
        assert!(p.rounds.is_none());
        let lones = p.parts.into_iter().map(|p| match p {
            Part::Coll(l) => l,
            Part::Rooted { .. } => unreachable!("no gather"),
        });
        Some(lones.collect())
    };
    let cut = |ops: &[Op]| cuts(ops).map(|mut v| v.remove(0));

    // 10 floats in 16-byte slices: 3 slices, 3 places of 16 input and 16 output bytes.
    let l = cut(&[coll(CollKind::AllReduce, send, 10, sum)]).expect("cut");
    assert_eq!((l.call.cut.slices, l.call.handle), (3, 0x77));
    assert_eq!(l.call.read, Some((0x1000, 10)));
    assert_eq!(l.call.recv, (0x9000, 10));
    assert!(!l.call.in_place && l.call.written);
    assert!(l.call.arena_bytes() <= 3 * 512, "{}", l.call.arena_bytes());
    // In place.
    let l = cut(&[coll(CollKind::AllReduce, recv, 10, sum)]).expect("cut");
    assert!(l.call.in_place && l.call.read.is_none());
    // A reduce's non-root (rank 1, root 0) writes nothing back.
    let l = cut(&[coll(CollKind::Reduce { root: 0 }, send, 10, sum)]).expect("cut");
    assert!(!l.call.written);
    // A broadcast's non-root reads nothing.
    let l = cut(&[coll(CollKind::Broadcast { root: 0 }, send, 10, sum)]).expect("cut");
    assert!(l.call.read.is_none() && !l.call.in_place);

    // all_gather: 10 floats per rank into 2 blocks, cut by the larger buffer's bytes (80
    // in 16-byte slices: 5 slices of 2 elements per block).
    let l = cut(&[coll(CollKind::AllGather, send, 10, sum)]).expect("cut");
    assert_eq!((l.call.cut.in_blocks, l.call.cut.out_blocks), (1, 2));
    assert_eq!((l.call.cut.slices, l.call.recv), (5, (0x9000, 20)));
    // In place: block 1 of the output is the input.
    let l = cut(&[coll(CollKind::AllGather, recv.wrapping_add(40), 10, sum)]).expect("cut");
    assert!(l.call.in_place && l.call.recv == (0x9000, 20));

    // Several collectives: each cut on its own; one of no element dropped.
    let three = [
        coll(CollKind::AllReduce, send, 10, sum),
        coll(CollKind::AllReduce, send, 0, sum),
        coll(CollKind::AllToAll, send, 10, sum),
    ];
    let all = cuts(&three).expect("cut");
    assert_eq!(all.len(), 2);
    assert_eq!(
        (all[1].call.cut.in_blocks, all[1].call.cut.out_blocks),
        (2, 2)
    );
    assert!(cuts(&[coll(CollKind::AllReduce, send, 0, sum)])
        .expect("cut")
        .is_empty());
    // Several of one slice each: one job is one round trip, not one per call.
    let small = [
        coll(CollKind::AllReduce, send, 4, sum),
        coll(CollKind::AllReduce, send, 3, sum),
    ];
    assert!(cuts(&small).is_none());
    assert!(
        cuts(&small[..1]).is_some(),
        "alone, it is queued as any call"
    );
    // Over two streams: cut on the first (`group` joins the two before and after).
    let mut other_stream = coll(CollKind::AllReduce, send, 10, sum);
    if let Op::Coll { on, .. } = &mut other_stream {
        *on = Some(OnStream {
            device: dev,
            stream: 0x78,
            captured: false,
        });
    }
    let two_streams = [coll(CollKind::AllReduce, send, 10, sum), other_stream];
    assert!(
        cuts(&two_streams).is_none(),
        "0x78 is not the batch's stream"
    );
    let p = pieces(comm, dev, &[0x77, 0x78], &two_streams, true)
        .unwrap()
        .expect("in pieces");
    assert_eq!(p.stream, 0x77);
    assert_eq!(p.parts.len(), 2);
    assert!(p.parts.iter().all(|p| match p {
        Part::Coll(l) => l.call.handle == 0x77,
        Part::Rooted { .. } => false,
    }));

    // Not cut here: a scalar read when it runs (alone or among others), another device.
    let scalar = Reduction::ScalarAt(0x40 as *const u8, DataType::Float32);
    let other = Device::new(Provider::Host, 1).unwrap();
    assert!(cuts(&[coll(CollKind::AllReduce, send, 10, scalar)]).is_none());
    let two = [
        coll(CollKind::AllReduce, send, 10, sum),
        coll(CollKind::AllReduce, send, 10, scalar),
    ];
    assert!(cuts(&two).is_none());
    let ops = [coll(CollKind::AllReduce, send, 10, sum)];
    assert!(pieces(comm, other, &[0x77], &ops, true).unwrap().is_none());
}
