//! The round of eight stream-ordered device calls that the tests of calls between the ranks'
//! buffers make (`device_peer_streams.rs`: threads; `device_windows_streams.rs`: processes
//! through windows): its data and the check of every buffer it wrote.

use ferroccl::device::{Device, DeviceBuffer, DeviceStream};
use ferroccl::{Communicator, ReduceOp};

/// Element `i` of rank `r`'s data: distinct per element and rank, small enough that sums of
/// a few stay exact in f32.
pub fn value(r: usize, i: usize) -> f32 {
    ((i * 31 + r * 977) % 65_521) as f32
}

/// The calls of one round between the buffers.
pub const CALLS: u64 = 8;

/// A rank's buffers of a round of `count` elements: `src` (its data), `x` (the first input,
/// then a broadcast from rank 1), `out` (an allreduce of `x`, then in place), `gathered` (an
/// all_gather of `src`), `scattered` (its reduce_scatter), `reduced` (a reduce of `x` to rank
/// 0), `exchanged` (an all_to_all of `gathered`), `averaged` (an `Avg` allreduce of
/// `scattered`).
pub struct Bufs {
    pub src: DeviceBuffer<f32>,
    pub x: DeviceBuffer<f32>,
    pub out: DeviceBuffer<f32>,
    pub gathered: DeviceBuffer<f32>,
    pub scattered: DeviceBuffer<f32>,
    pub reduced: DeviceBuffer<f32>,
    pub exchanged: DeviceBuffer<f32>,
    pub averaged: DeviceBuffer<f32>,
    r: usize,
    n: usize,
    count: usize,
}

/// An error of rank `r`'s round, naming what failed.
fn e(what: &'static str, r: usize) -> impl Fn(ferroccl::Error) -> String {
    move |err| format!("{what} on rank {r}: {err}")
}

impl Bufs {
    /// Rank `r` of `n`'s buffers on `dev`, `src` holding its data.
    pub fn new(dev: Device, r: usize, n: usize, count: usize) -> Result<Bufs, String> {
        let src: Vec<f32> = (0..count).map(|i| value(r, i)).collect();
        let alloc = |len: usize| DeviceBuffer::<f32>::new(dev, len).map_err(e("alloc", r));
        Ok(Bufs {
            src: DeviceBuffer::from_host(dev, &src).map_err(e("upload", r))?,
            x: alloc(count)?,
            out: alloc(count)?,
            gathered: alloc(count * n)?,
            scattered: alloc(count)?,
            reduced: alloc(count)?,
            exchanged: alloc(count * n)?,
            averaged: alloc(count)?,
            r,
            n,
            count,
        })
    }

    /// Every buffer.
    pub fn all(&self) -> [&DeviceBuffer<f32>; 8] {
        [
            &self.src,
            &self.x,
            &self.out,
            &self.gathered,
            &self.scattered,
            &self.reduced,
            &self.exchanged,
            &self.averaged,
        ]
    }

    /// Writes the first input `x` through `local`'s allreduce of `src` (a copy on a one-rank
    /// communicator): on `stream` where given (not there until the stream gets to it).
    pub fn write_first(
        &mut self,
        local: &Communicator,
        stream: Option<&DeviceStream>,
    ) -> Result<(), String> {
        let r = match stream {
            Some(s) => local.all_reduce_device_on(&self.src, &mut self.x, ReduceOp::Sum, s),
            None => local.all_reduce_device(&self.src, &mut self.x, ReduceOp::Sum),
        };
        r.map_err(e("copy", self.r))
    }

    /// The round's [`CALLS`] calls on `c`, each reading what the one before wrote: on `stream`
    /// where given, else blocking.
    pub fn calls(&mut self, c: &Communicator, stream: Option<&DeviceStream>) -> Result<(), String> {
        let (r, sum) = (self.r, ReduceOp::Sum);
        let b = self;
        match stream {
            None => {
                c.all_reduce_device(&b.x, &mut b.out, sum)
                    .map_err(e("all_reduce", r))?;
                c.all_reduce_device_in_place(&mut b.out, sum)
                    .map_err(e("in place", r))?;
                c.broadcast_device(&mut b.x, 1).map_err(e("broadcast", r))?;
                c.all_gather_device(&b.src, &mut b.gathered)
                    .map_err(e("all_gather", r))?;
                c.reduce_scatter_device(&b.gathered, &mut b.scattered, sum)
                    .map_err(e("reduce_scatter", r))?;
                c.reduce_device(&b.x, &mut b.reduced, sum, 0)
                    .map_err(e("reduce", r))?;
                c.all_to_all_device(&b.gathered, &mut b.exchanged)
                    .map_err(e("all_to_all", r))?;
                c.all_reduce_device(&b.scattered, &mut b.averaged, ReduceOp::Avg)
                    .map_err(e("avg", r))
            }
            Some(s) => {
                c.all_reduce_device_on(&b.x, &mut b.out, sum, s)
                    .map_err(e("all_reduce", r))?;
                c.all_reduce_device_in_place_on(&mut b.out, sum, s)
                    .map_err(e("in place", r))?;
                c.broadcast_device_on(&mut b.x, 1, s)
                    .map_err(e("broadcast", r))?;
                c.all_gather_device_on(&b.src, &mut b.gathered, s)
                    .map_err(e("all_gather", r))?;
                c.reduce_scatter_device_on(&b.gathered, &mut b.scattered, sum, s)
                    .map_err(e("reduce_scatter", r))?;
                c.reduce_device_on(&b.x, &mut b.reduced, sum, 0, s)
                    .map_err(e("reduce", r))?;
                c.all_to_all_device_on(&b.gathered, &mut b.exchanged, s)
                    .map_err(e("all_to_all", r))?;
                c.all_reduce_device_on(&b.scattered, &mut b.averaged, ReduceOp::Avg, s)
                    .map_err(e("avg", r))
            }
        }
    }

    /// Checks every element the round wrote, where `first(k, i)` is element `i` of rank `k`'s
    /// first input. Host access waits until the stream has let the buffers go.
    pub fn check(&self, first: &dyn Fn(usize, usize) -> f32) -> Result<(), String> {
        let (r, n, count) = (self.r, self.n, self.count);
        let total = |i: usize| (0..n).map(|k| first(k, i)).sum::<f32>();
        let check = |what: &str, got: Vec<f32>, want: &dyn Fn(usize) -> f32| match (0..got.len())
            .find(|&i| got[i] != want(i))
        {
            None => Ok(()),
            Some(i) => Err(format!(
                "{what} on rank {r}, {count} elements: element {i} is {}, want {}",
                got[i],
                want(i)
            )),
        };
        let read = |b: &DeviceBuffer<f32>| b.to_vec().map_err(e("read back", r));
        check("all_reduce then in place", read(&self.out)?, &|i| {
            n as f32 * total(i)
        })?;
        check("broadcast from 1", read(&self.x)?, &|i| first(1, i))?;
        check("all_gather", read(&self.gathered)?, &|i| {
            value(i / count, i % count)
        })?;
        check("reduce_scatter", read(&self.scattered)?, &|i| {
            n as f32 * value(r, i)
        })?;
        if r == 0 {
            check("reduce to 0", read(&self.reduced)?, &|i| {
                n as f32 * first(1, i)
            })?;
        }
        check("all_to_all", read(&self.exchanged)?, &|i| {
            value(r, i % count)
        })?;
        // The average of every rank's n x data: each rank's sum, divided by n, exactly.
        check("avg", read(&self.averaged)?, &|i| {
            (0..n).map(|k| value(k, i)).sum::<f32>()
        })
    }
}
