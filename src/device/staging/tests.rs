//! Tests of the pinned staging: copies in and out, buffer reuse and slicing.

use super::*;

#[test]
fn stages_in_and_out_and_reuses_buffers() {
    let dev = Device::new(Provider::Host, 0).unwrap();
    let mut st = Staging::new(dev).unwrap();
    let src = DeviceBuffer::from_host(dev, &[1u32, 2, 3]).unwrap();
    let mut dst = DeviceBuffer::<u32>::new(dev, 3).unwrap();
    st.reserve(12, 12).unwrap();
    assert_eq!(st.allocations(), 2);
    st.stage_in(Slot::Input, &src).unwrap();
    {
        let (i, o) = st.buffers::<u32>(3, 3).unwrap();
        assert_eq!(i, [1, 2, 3], "the copy completed before stage_in returned");
        for (o, i) in o.iter_mut().zip(i.iter()) {
            *o = *i * 10;
        }
    }
    st.stage_out(Slot::Output, &mut dst).unwrap();
    assert_eq!(dst.to_vec().unwrap(), [10, 20, 30]);
    st.reserve(4, 16).unwrap();
    assert_eq!(st.allocations(), 2, "large enough: kept");
    st.reserve(17, 0).unwrap();
    assert_eq!(st.allocations(), 3, "grown once");
    let e = st.buffers::<u32>(3, 100).unwrap_err();
    assert!(e.to_string().contains("not reserved"), "{e}");
    let other = DeviceBuffer::<u32>::new(Device::new(Provider::Host, 1).unwrap(), 3).unwrap();
    assert!(st.stage_in(Slot::Input, &other).is_err());
}

#[test]
fn pipeline_runs_each_slice_after_its_copy_and_writes_every_slice_back() {
    let dev = Device::new(Provider::Host, 2).unwrap();
    let data: Vec<u32> = (0..10).collect();
    let src = DeviceBuffer::from_host(dev, &data).unwrap();
    let mut dst = DeviceBuffer::<u32>::new(dev, 10).unwrap();
    let mut st = Staging::new(dev).unwrap();
    st.reserve(40, 40).unwrap();
    let mut seen = Vec::new();
    st.pipeline(
        Some(&src),
        &mut dst,
        true,
        true,
        Cut::elementwise(10, 3),
        |count, input, output| {
            let input = input.expect("out of place");
            seen.push((count, input.to_vec()));
            for (o, i) in output.iter_mut().zip(input) {
                *o = i + 100;
            }
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(
        seen,
        [
            (4, vec![0, 1, 2, 3]),
            (4, vec![4, 5, 6, 7]),
            (2, vec![8, 9])
        ]
    );
    assert_eq!(dst.to_vec().unwrap(), (100..110).collect::<Vec<u32>>());

    // In place, one slice failing: the error comes back after the queue drained, and the
    // slices before it were written back.
    let mut k = 0;
    let e = st
        .pipeline(
            None,
            &mut dst,
            true,
            true,
            Cut::elementwise(10, 2),
            |_, input, output| {
                assert!(input.is_none());
                k += 1;
                if k == 2 {
                    return Err(Error::internal("slice 2 failed"));
                }
                output.iter_mut().for_each(|x| *x *= 2);
                Ok(())
            },
        )
        .unwrap_err();
    assert!(e.to_string().contains("slice 2 failed"));
    assert_eq!(
        dst.to_vec().unwrap(),
        [200, 202, 204, 206, 208, 105, 106, 107, 108, 109]
    );
    assert_eq!(st.allocations(), 2, "no allocation per call");

    // Not read, not written (a broadcast's or reduce's non-root buffers).
    let before = dst.to_vec().unwrap();
    st.pipeline(
        Some(&src),
        &mut dst,
        false,
        false,
        Cut::elementwise(10, 2),
        |_, input, output| {
            assert_eq!(input.map(<[u32]>::len), Some(0));
            output.iter_mut().for_each(|x| *x = 0);
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(dst.to_vec().unwrap(), before);
}

#[test]
fn a_call_of_many_slices_stages_only_the_slices_in_flight() {
    let dev = Device::new(Provider::Host, 3).unwrap();
    let (count, slices) = (37usize, 9usize);
    let data: Vec<u32> = (0..count as u32).map(|i| i * 7 + 1).collect();
    let src = DeviceBuffer::from_host(dev, &data).unwrap();
    let mut dst = DeviceBuffer::<u32>::new(dev, count).unwrap();
    let cut = Cut::elementwise(count, slices);
    let room = cut.staged(1, count) * 4;
    assert_eq!(
        room,
        SLICES_IN_FLIGHT * 5 * 4,
        "places of 5 elements, not 37"
    );
    assert_eq!(
        Cut::elementwise(count, 1).staged(1, count),
        count,
        "one slice"
    );
    assert_eq!(
        Cut::elementwise(8, 4).staged(1, 8),
        8,
        "clipped to the buffer"
    );
    let mut st = Staging::new(dev).unwrap();
    st.reserve(room, room).unwrap();
    let mut seen = Vec::new();
    st.pipeline(
        Some(&src),
        &mut dst,
        true,
        true,
        Cut::elementwise(count, slices),
        |n, input, output| {
            let input = input.expect("out of place");
            seen.extend_from_slice(input);
            assert_eq!(n, input.len());
            for (o, i) in output.iter_mut().zip(input) {
                *o = i * 3;
            }
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(seen, data, "every slice read its own elements, in order");
    let tripled: Vec<u32> = data.iter().map(|x| x * 3).collect();
    assert_eq!(dst.to_vec().unwrap(), tripled);
    // In place through the same room; a slice that reuses a place sees its own data.
    st.pipeline(
        None,
        &mut dst,
        true,
        true,
        Cut::elementwise(count, slices),
        |_, input, output| {
            assert!(input.is_none());
            output.iter_mut().for_each(|x| *x += 1);
            Ok(())
        },
    )
    .unwrap();
    let plus: Vec<u32> = tripled.iter().map(|x| x + 1).collect();
    assert_eq!(dst.to_vec().unwrap(), plus);
    assert_eq!(st.allocations(), 2, "the room reserved once");
    // Less room than the slices in flight need is an error before anything is copied.
    let mut small = Staging::new(dev).unwrap();
    small.reserve(room / 2, room / 2).unwrap();
    let e = small
        .pipeline(
            Some(&src),
            &mut dst,
            true,
            true,
            Cut::elementwise(count, slices),
            |_, _, _| Ok(()),
        )
        .unwrap_err();
    assert!(e.to_string().contains("not reserved"), "{e}");
}

/// A blocked layout cut into slices: reduce_scatter's input of 3 blocks of 11 and
/// all_gather's output of 3 blocks, 4 slices of at most 3 elements per block, each staged
/// as the slice's blocks one after another.
#[test]
fn blocked_layouts_stage_each_slice_as_its_blocks_one_after_another() {
    let dev = Device::new(Provider::Host, 1).unwrap();
    let (n, count, slices) = (3usize, 11usize, 4usize);
    let cut = Cut {
        count,
        slices,
        in_blocks: n,
        out_blocks: 1,
        window: 4,
    };
    assert_eq!(cut.parts(1, n, n * count), [(3, 3), (14, 3), (25, 3)]);
    assert_eq!(cut.parts(3, n, n * count), [(9, 2), (20, 2), (31, 2)]);
    assert_eq!(cut.place(2, n), 2 * n * 3);
    let data: Vec<u32> = (0..(n * count) as u32).collect();
    let src = DeviceBuffer::from_host(dev, &data).unwrap();
    let mut dst = DeviceBuffer::<u32>::new(dev, count).unwrap();
    let mut st = Staging::new(dev).unwrap();
    st.reserve(cut.staged(n, n * count) * 4, cut.staged(1, count) * 4)
        .unwrap();
    // "reduce_scatter" by hand: the sum of the blocks' elements.
    st.pipeline(Some(&src), &mut dst, true, true, cut, |c, input, output| {
        let input = input.expect("out of place");
        assert_eq!((input.len(), output.len()), (n * c, c));
        for (i, o) in output.iter_mut().enumerate() {
            *o = (0..n).map(|b| input[b * c + i]).sum();
        }
        Ok(())
    })
    .unwrap();
    let want: Vec<u32> = (0..count as u32).map(|i| 3 * i + 33).collect();
    assert_eq!(dst.to_vec().unwrap(), want);

    // "all_gather": each slice's input written to every output block, times the block.
    let gather = Cut {
        in_blocks: 1,
        out_blocks: n,
        ..cut
    };
    let mine = DeviceBuffer::from_host(dev, &want).unwrap();
    let mut all = DeviceBuffer::<u32>::new(dev, n * count).unwrap();
    let mut st = Staging::new(dev).unwrap();
    st.reserve(gather.staged(1, count) * 4, gather.staged(n, n * count) * 4)
        .unwrap();
    st.pipeline(
        Some(&mine),
        &mut all,
        true,
        true,
        gather,
        |c, input, output| {
            let input = input.expect("out of place");
            for b in 0..n {
                for i in 0..c {
                    output[b * c + i] = input[i] * (b as u32 + 1);
                }
            }
            Ok(())
        },
    )
    .unwrap();
    let got = all.to_vec().unwrap();
    for b in 0..n {
        let block: Vec<u32> = want.iter().map(|x| x * (b as u32 + 1)).collect();
        assert_eq!(got[b * count..(b + 1) * count], block[..], "block {b}");
    }
}
