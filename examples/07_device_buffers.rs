//! Device buffers: gradients that live on a GPU are averaged across ranks, staged through
//! pinned host memory over the shared-memory or TCP transport; one call is stream-ordered
//! (it returns at once, and the stream waits for its result).
//!
//! Run it with `cargo run --example 07_device_buffers`. It uses the provider that
//! `FERRO_DEVICE_PROVIDER` names (`cuda` by default); on a machine without an NVIDIA driver it
//! says so and runs on the host stand-in (`FERRO_DEVICE_PROVIDER=host`), whose "device memory"
//! is heap memory, so the same code runs everywhere.

use ferroccl::device::{Device, DeviceBuffer, DeviceStream, Provider};
use ferroccl::{Communicator, Config, ReduceOp};

const NRANKS: usize = 2;
const LEN: usize = 1 << 16;

fn rank_main(comm: &Communicator, dev: Device) -> ferroccl::Result<()> {
    let rank = comm.rank();
    comm.set_device(dev)?;

    // Each rank's gradients on the device; after the allreduce every rank holds the mean.
    let grads: Vec<f32> = (0..LEN).map(|i| (i % 100) as f32 + rank as f32).collect();
    let mut d_grads = DeviceBuffer::from_host(dev, &grads)?;
    comm.all_reduce_device_in_place(&mut d_grads, ReduceOp::Avg)?;
    let mean = d_grads.to_vec()?;
    let offset = (0..NRANKS).sum::<usize>() as f32 / NRANKS as f32;
    assert!(mean
        .iter()
        .enumerate()
        .all(|(i, &m)| m == (i % 100) as f32 + offset));

    // Out of place, and a gather of one value per rank.
    let mine = DeviceBuffer::from_host(dev, &[rank as u64 * 10])?;
    let mut all = DeviceBuffer::<u64>::new(dev, NRANKS)?;
    comm.all_gather_device(&mine, &mut all)?;
    assert_eq!(
        all.to_vec()?,
        (0..NRANKS as u64).map(|r| r * 10).collect::<Vec<_>>()
    );

    // Stream-ordered: the call returns once queued; the stream (and `to_vec`) wait for it.
    let stream = DeviceStream::new(dev)?;
    let mut ones = DeviceBuffer::from_host(dev, &[1u32; 8])?;
    comm.all_reduce_device_in_place_on(&mut ones, ReduceOp::Sum, &stream)?;
    stream.synchronize()?;
    assert_eq!(ones.to_vec()?, [NRANKS as u32; 8]);

    // A buffer on a device other than the communicator's is refused before anything runs.
    if dev.provider() == Provider::Host {
        let elsewhere = DeviceBuffer::<f32>::new(Device::new(Provider::Host, 1)?, LEN)?;
        let mut out = DeviceBuffer::<f32>::new(dev, LEN)?;
        let e = comm.all_reduce_device(&elsewhere, &mut out, ReduceOp::Sum);
        assert!(e.is_err());
    }
    Ok(())
}

fn main() -> ferroccl::Result<()> {
    let dev = match Device::from_env(0) {
        Ok(d) => d,
        Err(e) => {
            println!("no usable device ({e}); running on the host stand-in");
            Device::new(Provider::Host, 0)?
        }
    };
    let comms = Communicator::local_group(NRANKS, Config::default())?;
    let results: Vec<ferroccl::Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|c| s.spawn(move || rank_main(c, dev)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in results {
        r?;
    }
    println!(
        "device buffers on {dev}, {NRANKS} ranks: {LEN} f32 averaged in place, one u64 per rank \
         gathered, one sum ordered on a stream"
    );
    Ok(())
}
