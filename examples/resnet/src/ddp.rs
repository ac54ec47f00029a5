//! Data parallelism over ferroccl: the same start on every rank, and gradients averaged in
//! fused buckets that leave for the allreduce as soon as backward has produced them.
//!
//! | piece | what it does |
//! |---|---|
//! | [`broadcast_tensors`] | rank 0's values of a list of tensors (parameters, batch-norm statistics, momentum) to every rank, in one message |
//! | [`GradReducer`] | gradients in buckets of `bucket_bytes`, ordered as backward produces them; [`GradReducer::stage_done`] starts every bucket the finished stage completed on the communicator's progress thread; [`GradReducer::finish`] waits for the averages. With f32 on the wire the buckets *are* the gradients (each parameter's `.grad` is a view into its bucket), so nothing is copied; compressed wires copy in and out |
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

/// A flat, contiguous f32 CPU tensor that collectives read and write in place. Views of it
/// (parameter gradients) share its storage, which libtorch keeps alive while any view does.
#[derive(Debug)]
struct Flat(Tensor);

impl Flat {
    fn zeros(len: usize) -> Flat {
        Flat(Tensor::zeros([len as i64], (Kind::Float, Device::Cpu)))
    }
}

impl AsMut<[f32]> for Flat {
    fn as_mut(&mut self) -> &mut [f32] {
        let n = self.0.numel();
        if n == 0 {
            return &mut [];
        }
        // SAFETY: `Flat::zeros` made a contiguous 1-D f32 CPU tensor of `n` elements, so its
        // data pointer addresses `n` f32s for as long as the tensor lives (borrowed here).
        // Other handles to that memory (the gradient views of `GradReducer`) are not touched
        // while a collective holds this slice: a bucket is reduced only once backward has
        // finished its gradients, and read again only after its allreduce is waited for.
        unsafe { std::slice::from_raw_parts_mut(self.0.data_ptr().cast::<f32>(), n) }
    }
}

/// A flat host buffer in the wire's element type.
#[derive(Debug)]
enum Buf {
    F32(Flat),
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
}

impl Buf {
    fn new(wire: Wire, len: usize) -> Buf {
        match wire {
            Wire::F32 => Buf::F32(Flat::zeros(len)),
            Wire::Bf16 => Buf::Bf16(vec![bf16::ZERO; len]),
            Wire::F16 => Buf::F16(vec![f16::ZERO; len]),
        }
    }

    fn len(&self) -> usize {
        match self {
            Buf::F32(t) => t.0.numel(),
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

    /// A tensor viewing elements `offset .. offset + numel` of this buffer.
    ///
    /// For f16 and bf16 the view borrows the buffer's memory: it must be dropped before the
    /// buffer is moved into a collective or freed, and every caller uses it for one `copy_`.
    /// For f32 it shares the tensor's storage and may be kept.
    fn view(&mut self, offset: usize, numel: usize) -> Tensor {
        assert!(
            offset + numel <= self.len(),
            "view {offset}+{numel} of a buffer of {}",
            self.len()
        );
        let ptr: *mut u8 = match self {
            Buf::F32(t) => return t.0.narrow(0, offset as i64, numel as i64),
            Buf::Bf16(v) => v.as_mut_ptr().cast(),
            Buf::F16(v) => v.as_mut_ptr().cast(),
        };
        let kind = self.wire().kind();
        let elem = kind.elt_size_in_bytes();
        // SAFETY: the range lies inside the buffer (asserted above); the buffer is a live Vec
        // of the element type `kind` describes, and the view is dropped before the Vec moves or
        // is freed (see above), so libtorch never reads or writes outside it.
        unsafe {
            Tensor::from_blob(
                ptr.add(offset * elem),
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
    F32(Work<Flat>),
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
    let Buf::F32(flat) = &mut buf else {
        unreachable!("an f32 buffer")
    };
    comm.broadcast(flat.as_mut(), root)
        .with_context(|| format!("broadcast of {total} values from rank {root}"))?;
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

/// Makes every parameter's gradient a view into its (f32) bucket, so that backward accumulates
/// straight into the buffer the allreduce sends and the averages land where the optimizer
/// reads them. Returns whether every gradient now shares its bucket's memory; if libtorch did
/// not keep one of them, the reducer copies instead.
fn alias_gradients(params: &[(Tensor, usize)], buckets: &mut [Bucket]) -> bool {
    tch::no_grad(|| {
        let mut all = true;
        for b in buckets.iter_mut() {
            let buf = b.buf.as_mut().expect("buckets are at rest when built");
            for &(j, offset) in &b.members {
                let p = &params[j].0;
                let view = buf.view(offset, p.numel()).view(p.size().as_slice());
                let _ = p.grad().set_source_tensor_(&view);
                all &= p.grad().data_ptr() == view.data_ptr();
            }
        }
        all
    })
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
    /// Whether every parameter's gradient is a view into its bucket (f32 on the wire).
    aliased: bool,
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
        let aliased = wire == Wire::F32 && alias_gradients(&params, &mut buckets);
        Ok(GradReducer {
            comm,
            params,
            buckets,
            launched: 0,
            op: ReduceOp::Sum,
            aliased,
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
        if !self.aliased {
            tch::no_grad(|| {
                for &(j, offset) in &bucket.members {
                    let g = self.params[j].0.grad();
                    buf.view(offset, g.numel()).copy_(&g.reshape([-1]));
                }
            });
        }
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
        self.launched = 0;
        if self.aliased {
            // The buckets are the gradients: the averages are in place.
            return Ok(waited);
        }
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
        Ok(waited)
    }

    /// Time of one round of every bucket's allreduce with nothing to overlap: packs the current
    /// gradients, reduces them and throws the result away (every rank must call it together).
    /// The gradients are left as they were.
    pub fn time_exposed(&mut self) -> Result<Duration> {
        // Aliased buckets are the gradients: keep a copy to restore after the timed round.
        let saved: Vec<Tensor> = if self.aliased {
            self.buckets
                .iter_mut()
                .map(|b| match b.buf.as_mut() {
                    Some(Buf::F32(t)) => t.0.copy(),
                    _ => unreachable!("aliased buckets are f32 and at rest"),
                })
                .collect()
        } else {
            Vec::new()
        };
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
        let took = t0.elapsed();
        for (b, s) in self.buckets.iter_mut().zip(&saved) {
            if let Some(Buf::F32(t)) = b.buf.as_mut() {
                tch::no_grad(|| t.0.copy_(s));
            }
        }
        Ok(took)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroccl::Config;

    /// Two ranks with distinct gradients in every element; after `finish`, each rank's
    /// gradients are the weighted sum, whether they are views into the buckets (f32) or copied
    /// in and out (bf16, within its rounding).
    fn averages_on_two_ranks(wire: Wire) {
        let comms = Communicator::local_group(2, Config::default()).unwrap();
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                std::thread::spawn(move || {
                    let comm = Arc::new(comm);
                    // Two stages, three parameters; a small bucket size gives two buckets.
                    let shapes: [&[i64]; 3] = [&[3, 2], &[5], &[7]];
                    let params: Vec<(Tensor, usize)> = shapes
                        .iter()
                        .enumerate()
                        .map(|(i, s)| {
                            (
                                Tensor::zeros(*s, (Kind::Float, Device::Cpu))
                                    .set_requires_grad(true),
                                i.min(1),
                            )
                        })
                        .collect();
                    let mut r = GradReducer::new(comm, params, 48, wire).unwrap();
                    assert_eq!(r.num_buckets(), 2);
                    assert_eq!(r.aliased, wire == Wire::F32);
                    for step in 0..2 {
                        for (p, _) in &r.params {
                            let mut g = p.grad();
                            let _ = g.zero_();
                        }
                        // d/dp of sum(p * c) is c: a distinct value per element, rank and step.
                        let loss: Tensor = r
                            .params
                            .iter()
                            .enumerate()
                            .map(|(i, (p, _))| {
                                let n = p.numel() as i64;
                                let c = Tensor::arange(n, (Kind::Float, Device::Cpu))
                                    .view(p.size().as_slice())
                                    + (100 * i + 10 * rank + 1000 * step) as f64;
                                (p * c).sum(Kind::Float)
                            })
                            .fold(Tensor::zeros([], (Kind::Float, Device::Cpu)), |a, b| a + b);
                        loss.backward();
                        r.begin_step(0.5);
                        r.stage_done(1).unwrap();
                        r.finish().unwrap();
                        for (i, (p, _)) in r.params.iter().enumerate() {
                            let n = p.numel();
                            let got = Vec::<f32>::try_from(p.grad().reshape([-1])).unwrap();
                            for (e, v) in got.iter().enumerate() {
                                // Mean over ranks 0 and 1 of e + 100 i + 10 rank + 1000 step.
                                let want = (e + 100 * i + 1000 * step) as f32 + 5.0;
                                let tol = if wire == Wire::F32 {
                                    0.0
                                } else {
                                    want.abs() / 64.0
                                };
                                assert!(
                                    (v - want).abs() <= tol,
                                    "rank {rank} param {i}[{e}/{n}] step {step}: {v} vs {want}"
                                );
                            }
                        }
                    }
                    // The timed round leaves the gradients as they were.
                    let before: Vec<Tensor> =
                        r.params.iter().map(|(p, _)| p.grad().copy()).collect();
                    r.time_exposed().unwrap();
                    for ((p, _), b) in r.params.iter().zip(&before) {
                        assert!(p.grad().equal(b));
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn f32_buckets_are_the_gradients_and_hold_the_averages() {
        averages_on_two_ranks(Wire::F32);
    }

    #[test]
    fn compressed_buckets_copy_in_and_out() {
        averages_on_two_ranks(Wire::Bf16);
    }
}
