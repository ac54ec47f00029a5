//! Data parallelism over ferroccl: the same start on every rank, and gradients averaged in
//! fused buckets that leave for the allreduce as soon as backward has produced them.
//!
//! | piece | what it does |
//! |---|---|
//! | [`broadcast_tensors`] | rank 0's values of a list of tensors (parameters, batch-norm statistics, momentum) to every rank, in one message |
//! | [`GradReducer`] | gradients in buckets of `bucket_bytes`, ordered as backward produces them; [`GradReducer::stage_done`] starts every bucket the finished stage completed on the communicator's progress thread; [`GradReducer::finish`] waits and writes the averages back |
//! | [`Wire`] | the element type on the wire: f32, or bf16 / f16 halves the bytes (each rank's gradient is rounded once, partial sums are added in f32 and rounded at each hop) |

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ferroccl::{Communicator, ReduceOp, Work};
use half::{bf16, f16};
use tch::{Device, Kind, Tensor};

/// Element type of gradients on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// 4 bytes an element, exact.
    F32,
    /// bfloat16: 2 bytes, f32's range, 8 bits of mantissa.
    Bf16,
    /// IEEE half: 2 bytes, 11 bits of mantissa, range up to 65504.
    F16,
}

impl Wire {
    /// Parses `none` / `f32`, `bf16` or `f16`.
    pub fn parse(s: &str) -> Option<Wire> {
        match s {
            "none" | "f32" => Some(Wire::F32),
            "bf16" => Some(Wire::Bf16),
            "f16" | "fp16" => Some(Wire::F16),
            _ => None,
        }
    }

    fn kind(self) -> Kind {
        match self {
            Wire::F32 => Kind::Float,
            Wire::Bf16 => Kind::BFloat16,
            Wire::F16 => Kind::Half,
        }
    }
}

/// A flat host buffer in the wire's element type.
#[derive(Debug)]
enum Buf {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
}

impl Buf {
    fn new(wire: Wire, len: usize) -> Buf {
        match wire {
            Wire::F32 => Buf::F32(vec![0.0; len]),
            Wire::Bf16 => Buf::Bf16(vec![bf16::ZERO; len]),
            Wire::F16 => Buf::F16(vec![f16::ZERO; len]),
        }
    }

    fn len(&self) -> usize {
        match self {
            Buf::F32(v) => v.len(),
            Buf::Bf16(v) => v.len(),
            Buf::F16(v) => v.len(),
        }
    }

    fn wire(&self) -> Wire {
        match self {
            Buf::F32(_) => Wire::F32,
            Buf::Bf16(_) => Wire::Bf16,
            Buf::F16(_) => Wire::F16,
        }
    }

    fn ptr(&mut self) -> *mut u8 {
        match self {
            Buf::F32(v) => v.as_mut_ptr().cast(),
            Buf::Bf16(v) => v.as_mut_ptr().cast(),
            Buf::F16(v) => v.as_mut_ptr().cast(),
        }
    }

    /// A tensor viewing elements `offset .. offset + numel` of this buffer.
    ///
    /// The view borrows the buffer's memory: it must be dropped before the buffer is moved into
    /// a collective or freed. Every caller here uses it for one `copy_` and drops it.
    fn view(&mut self, offset: usize, numel: usize) -> Tensor {
        assert!(
            offset + numel <= self.len(),
            "view {offset}+{numel} of a buffer of {}",
            self.len()
        );
        let kind = self.wire().kind();
        let elem = kind.elt_size_in_bytes();
        // SAFETY: the range lies inside the buffer (asserted above); the buffer is a live Vec
        // of the element type `kind` describes, and the view is dropped before the Vec moves or
        // is freed (see above), so libtorch never reads or writes outside it.
        unsafe {
            Tensor::from_blob(
                self.ptr().add(offset * elem),
                &[numel as i64],
                &[],
                kind,
                Device::Cpu,
            )
        }
    }

    fn all_reduce(self, comm: &Communicator, op: ReduceOp) -> ferroccl::Result<InFlight> {
        Ok(match self {
            Buf::F32(v) => InFlight::F32(comm.all_reduce_async(v, op)?),
            Buf::Bf16(v) => InFlight::Bf16(comm.all_reduce_async(v, op)?),
            Buf::F16(v) => InFlight::F16(comm.all_reduce_async(v, op)?),
        })
    }
}

#[derive(Debug)]
enum InFlight {
    F32(Work<Vec<f32>>),
    Bf16(Work<Vec<bf16>>),
    F16(Work<Vec<f16>>),
}

impl InFlight {
    fn wait(self) -> ferroccl::Result<Buf> {
        Ok(match self {
            InFlight::F32(w) => Buf::F32(w.wait()?),
            InFlight::Bf16(w) => Buf::Bf16(w.wait()?),
            InFlight::F16(w) => Buf::F16(w.wait()?),
        })
    }
}

/// Copies rank `root`'s values of `tensors` (f32, contiguous) to every rank, in one broadcast.
pub fn broadcast_tensors(comm: &Communicator, tensors: &[Tensor], root: usize) -> Result<()> {
    let total: usize = tensors.iter().map(Tensor::numel).sum();
    let mut buf = Buf::new(Wire::F32, total);
    let mut offset = 0;
    if comm.rank() == root {
        for t in tensors {
            let n = t.numel();
            buf.view(offset, n).copy_(&t.detach().reshape([-1]));
            offset += n;
        }
    }
    let Buf::F32(mut flat) = buf else {
        unreachable!("an f32 buffer")
    };
    comm.broadcast(&mut flat, root)
        .with_context(|| format!("broadcast of {total} values from rank {root}"))?;
    let mut buf = Buf::F32(flat);
    let mut offset = 0;
    tch::no_grad(|| {
        for t in tensors {
            let n = t.numel();
            let mut dst = t.shallow_clone();
            dst.copy_(&buf.view(offset, n).view(t.size().as_slice()));
            offset += n;
        }
    });
    Ok(())
}

/// One bucket: consecutive parameters in backward order, and its buffer (absent while its
/// allreduce is in flight).
#[derive(Debug)]
struct Bucket {
    /// Indices into `GradReducer::params`, with each one's offset in the buffer.
    members: Vec<(usize, usize)>,
    /// The bucket is complete once backward has finished this stage (its lowest).
    ready_stage: usize,
    buf: Option<Buf>,
    work: Option<InFlight>,
}

/// Averages gradients across ranks in fused buckets, overlapping with backward.
///
/// Parameters are ordered as backward produces them (last stage first) and packed into
/// buckets of at most `bucket_bytes` (in f32 bytes; a larger parameter gets a bucket of its own).
/// Every rank builds the same buckets from the same model, so the allreduces match one to one.
#[derive(Debug)]
pub struct GradReducer {
    comm: Arc<Communicator>,
    params: Vec<(Tensor, usize)>,
    buckets: Vec<Bucket>,
    launched: usize,
    op: ReduceOp,
}

impl GradReducer {
    /// Buckets for `params`: each a trainable variable and the model stage it belongs to.
    pub fn new(
        comm: Arc<Communicator>,
        params: Vec<(Tensor, usize)>,
        bucket_bytes: usize,
        wire: Wire,
    ) -> Result<GradReducer> {
        if bucket_bytes == 0 {
            bail!("bucket size must be at least 1 byte");
        }
        // Every parameter gets a gradient tensor now, so that a rank with nothing to compute in a
        // step (a short last batch) still has zeros to send.
        let zero: Vec<Tensor> = params
            .iter()
            .map(|(p, _)| (p * 0.0).sum(Kind::Float))
            .collect();
        Tensor::stack(&zero, 0).sum(Kind::Float).backward();
        let mut order: Vec<usize> = (0..params.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(params[i].1));
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut fill = usize::MAX;
        for i in order {
            let n = params[i].0.numel();
            if fill.saturating_add(n * 4) > bucket_bytes && fill != 0 {
                buckets.push(Bucket {
                    members: Vec::new(),
                    ready_stage: usize::MAX,
                    buf: None,
                    work: None,
                });
                fill = 0;
            }
            let b = buckets.last_mut().expect("a bucket was pushed above");
            let offset = b
                .members
                .last()
                .map_or(0, |&(j, o)| o + params[j].0.numel());
            b.members.push((i, offset));
            b.ready_stage = b.ready_stage.min(params[i].1);
            fill += n * 4;
        }
        for b in &mut buckets {
            let len = b
                .members
                .last()
                .map_or(0, |&(j, o)| o + params[j].0.numel());
            b.buf = Some(Buf::new(wire, len));
        }
        Ok(GradReducer {
            comm,
            params,
            buckets,
            launched: 0,
            op: ReduceOp::Sum,
        })
    }

    /// Number of buckets.
    pub fn num_buckets(&self) -> usize {
        self.buckets.len()
    }

    /// Bytes each bucket sends per allreduce.
    pub fn bucket_bytes(&self) -> Vec<usize> {
        self.buckets
            .iter()
            .map(|b| {
                b.buf
                    .as_ref()
                    .map_or(0, |x| x.len() * x.wire().kind().elt_size_in_bytes())
            })
            .collect()
    }

    /// Starts a step: this rank's gradients count with `weight` in the sum (its share of the
    /// step's global batch, so that the result is the global batch's mean gradient).
    pub fn begin_step(&mut self, weight: f64) {
        debug_assert_eq!(self.launched, 0, "begin_step with buckets in flight");
        self.op = ReduceOp::PreMulSum(weight);
    }

    /// Backward has finished `stage` (and every later one): start every bucket now complete.
    pub fn stage_done(&mut self, stage: usize) -> Result<()> {
        while self.launched < self.buckets.len() && self.buckets[self.launched].ready_stage >= stage
        {
            self.launch(self.launched)?;
            self.launched += 1;
        }
        Ok(())
    }

    fn launch(&mut self, i: usize) -> Result<()> {
        let bucket = &mut self.buckets[i];
        let mut buf = bucket
            .buf
            .take()
            .expect("a bucket is launched once per step");
        tch::no_grad(|| {
            for &(j, offset) in &bucket.members {
                let g = self.params[j].0.grad();
                buf.view(offset, g.numel()).copy_(&g.reshape([-1]));
            }
        });
        let work = buf
            .all_reduce(&self.comm, self.op)
            .with_context(|| format!("gradient bucket {i}"))?;
        bucket.work = Some(work);
        Ok(())
    }

    /// Starts what is left, waits for every bucket and writes the averaged gradients back.
    /// Returns how long this rank waited.
    pub fn finish(&mut self) -> Result<Duration> {
        self.stage_done(0)?;
        let t0 = Instant::now();
        for (i, bucket) in self.buckets.iter_mut().enumerate() {
            let work = bucket.work.take().expect("every bucket was launched");
            let buf = work
                .wait()
                .with_context(|| format!("gradient bucket {i}"))?;
            bucket.buf = Some(buf);
        }
        let waited = t0.elapsed();
        tch::no_grad(|| {
            for bucket in &mut self.buckets {
                let buf = bucket.buf.as_mut().expect("returned above");
                for &(j, offset) in &bucket.members {
                    let mut g = self.params[j].0.grad();
                    let src = buf.view(offset, g.numel());
                    g.copy_(&src.view(g.size().as_slice()));
                }
            }
        });
        self.launched = 0;
        Ok(waited)
    }

    /// Time of one round of every bucket's allreduce with nothing to overlap: packs the current
    /// gradients, reduces them and throws the result away (every rank must call it together).
    pub fn time_exposed(&mut self) -> Result<Duration> {
        let t0 = Instant::now();
        self.op = ReduceOp::Sum;
        for i in 0..self.buckets.len() {
            self.launch(i)?;
        }
        for (i, bucket) in self.buckets.iter_mut().enumerate() {
            let work = bucket.work.take().expect("launched above");
            bucket.buf = Some(
                work.wait()
                    .with_context(|| format!("gradient bucket {i}"))?,
            );
        }
        Ok(t0.elapsed())
    }
}
