//! Tests of raw device memory: views, ranges and raw calls over the stand-in.

use super::*;

#[test]
fn views_share_the_pending_count_and_give_it_back_when_dropped() {
    let dev = Device::new(Provider::Host, 0).unwrap();
    let buf = DeviceBuffer::from_host(dev, &[7u8; 32]).unwrap();
    let part = buf.typed_part::<u32>(&(8..32));
    assert_eq!((part.len(), part.addr), (6, buf.addr + 8));
    let hold = part.hold();
    assert_eq!(buf.pending.count(), 1, "a job on the view holds the buffer");
    assert_eq!(buf.pending.shares(), 3);
    drop(part);
    assert_eq!(
        buf.pending.shares(),
        2,
        "the dropped view gave its share back"
    );
    drop(hold);
    assert_eq!((buf.pending.shares(), buf.pending.count()), (1, 0));
    // A view of raw memory frees nothing when dropped: the buffer still reads.
    // SAFETY: the buffer's own memory, only read while the view lives.
    let v = unsafe { DeviceBuffer::<u8>::view(dev, buf.addr, 32) }.unwrap();
    assert_eq!(v.to_vec().unwrap(), [7u8; 32]);
    drop(v);
    assert_eq!(buf.to_vec().unwrap(), [7u8; 32]);
    // Nor does the buffer inside a view, moved out of it and dropped.
    // SAFETY: as above.
    let mut v = unsafe { DeviceBuffer::<u8>::view(dev, buf.addr, 32) }.unwrap();
    let other = DeviceBuffer::<u8>::new(dev, 8).unwrap();
    drop(std::mem::replace(&mut *v, other));
    drop(v);
    assert_eq!(buf.to_vec().unwrap(), [7u8; 32]);
}

#[test]
fn device_to_device_copies_move_the_range_and_refuse_bad_ones() {
    let dev = Device::new(Provider::Host, 0).unwrap();
    let src = DeviceBuffer::from_host(dev, &[1u32, 2, 3, 4, 5]).unwrap();
    let mut dst = DeviceBuffer::from_host(dev, &[0u32; 4]).unwrap();
    dst.copy_from_device(1, &src, 2..5).unwrap();
    assert_eq!(dst.to_vec().unwrap(), [0, 3, 4, 5]);
    dst.copy_from_device(4, &src, 0..0).unwrap();
    let e = dst.copy_from_device(2, &src, 0..3).unwrap_err();
    assert!(e.to_string().contains("elements 2..5 are outside"), "{e}");
    let e = dst.copy_from_device(0, &src, 3..6).unwrap_err();
    assert!(e.to_string().contains("(source)"), "{e}");
    let other = DeviceBuffer::from_host(Device::new(Provider::Host, 1).unwrap(), &[9u32]).unwrap();
    let e = dst.copy_from_device(0, &other, 0..1).unwrap_err();
    assert!(e.to_string().contains("the source is on"), "{e}");
    assert_eq!(
        dst.to_vec().unwrap(),
        [0, 3, 4, 5],
        "a refused copy changes nothing"
    );
}

#[test]
fn raw_memory_round_trips_through_views_on_the_stand_in() {
    let dev = Device::new(Provider::Host, 2).unwrap();
    let addr = dev.alloc_raw(16).unwrap();
    assert_eq!(Provider::Host.locate(addr, 16), Some(2));
    {
        // SAFETY: 16 live bytes of the stand-in device 2, used by this view alone.
        let mut v = unsafe { DeviceBuffer::<u32>::view(dev, addr, 4) }.unwrap();
        v.copy_from_host(&[1, 2, 3, 4]).unwrap();
    }
    let mut b = [0u8; 4];
    // SAFETY: the first 4 bytes of the allocation, live.
    unsafe { dev.read_raw(addr + 4, &mut b) }.unwrap();
    assert_eq!(u32::from_ne_bytes(b), 2);
    // SAFETY: stand-in streams need no live handle.
    unsafe { dev.sync_stream(std::ptr::without_provenance_mut(1)) }.unwrap();
    assert_eq!(
        Provider::Host.locate(addr, 16),
        Some(2),
        "a view frees nothing"
    );
    // SAFETY: allocated above, freed once, nothing uses it.
    unsafe { dev.free_raw(addr) }.unwrap();
    assert_eq!(Provider::Host.locate(addr, 16), None);
    assert_eq!(dev.name().unwrap(), "host stand-in device 2");
}

#[test]
fn byte_ranges_of_device_buffers_run_collectives() {
    let dev = Device::new(Provider::Host, 0).unwrap();
    let comms = Communicator::local_group(2, crate::Config::default()).unwrap();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                c.set_device(dev).unwrap();
                let r = c.rank() as u32;
                let mut send = DeviceBuffer::<u8>::new(dev, 64).unwrap();
                let mut recv = DeviceBuffer::<u8>::new(dev, 64).unwrap();
                let vals: Vec<u8> = (0..4u32).flat_map(|i| (r * 10 + i).to_ne_bytes()).collect();
                send.write_at(4, &vals).unwrap();
                c.raw_collective_device(
                    CollKind::AllReduce,
                    Some((&send, 4..20)),
                    (&mut recv, 8..24),
                    DataType::Uint32,
                    ReduceOp::Sum,
                )
                .unwrap();
                let mut out = [0u8; 16];
                recv.read_at(8, &mut out).unwrap();
                let got: Vec<u32> = out
                    .chunks(4)
                    .map(|b| u32::from_ne_bytes(b.try_into().unwrap()))
                    .collect();
                assert_eq!(got, [10, 12, 14, 16]);
                let e = c
                    .raw_collective_device(
                        CollKind::AllReduce,
                        None,
                        (&mut recv, 8..23),
                        DataType::Uint32,
                        ReduceOp::Sum,
                    )
                    .unwrap_err();
                assert!(e.to_string().contains("not whole elements"), "{e}");
                assert!(recv.read_at(60, &mut out).is_err());
            });
        }
    });
}
