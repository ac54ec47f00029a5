//! SGD with momentum and weight decay (PyTorch's update rule), and the large-batch learning-rate
//! recipe of Goyal et al.: the rate scaled linearly with the global batch, a gradual warm-up, then
//! step or cosine decay.

use tch::{Device, Kind, Tensor};

/// SGD with momentum, weight decay and optional Nesterov momentum, as `torch.optim.SGD` with
/// dampening 0: `d = g + wd·p; v = μ·v + d; p -= lr · (nesterov ? d + μ·v : v)`.
///
/// The momentum buffers are plain tensors owned here, so checkpoints can save and restore them.
#[derive(Debug)]
pub struct Sgd {
    params: Vec<Tensor>,
    momentum_buffers: Vec<Tensor>,
    /// Momentum μ.
    pub momentum: f64,
    /// Weight decay (L2 penalty) applied to every parameter.
    pub weight_decay: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
}

impl Sgd {
    /// An optimizer over `params` with zero momentum buffers.
    pub fn new(params: Vec<Tensor>, momentum: f64, weight_decay: f64, nesterov: bool) -> Sgd {
        let momentum_buffers = params.iter().map(Tensor::zeros_like).collect();
        Sgd {
            params,
            momentum_buffers,
            momentum,
            weight_decay,
            nesterov,
        }
    }

    /// The momentum buffers, one per parameter, in the order given to [`Sgd::new`].
    pub fn momentum_buffers(&self) -> &[Tensor] {
        &self.momentum_buffers
    }

    /// One update with learning rate `lr` from the parameters' current gradients.
    ///
    /// Contiguous f32 CPU parameters (every parameter of the models here) take one fused pass
    /// over memory each, reading `p`, `g` and `v` and writing `v` and `p` ([`sgd_fused`]);
    /// any other parameter takes [`Sgd::step_tensors`]'s libtorch operations. Both round every
    /// operation to f32 in the same order, so they give the same bits.
    pub fn step(&mut self, lr: f64) {
        self.update(lr, true);
    }

    /// [`Sgd::step`] through libtorch's tensor operations for every parameter (the reference
    /// the fused pass is tested against).
    pub fn step_tensors(&mut self, lr: f64) {
        self.update(lr, false);
    }

    fn update(&mut self, lr: f64, fuse: bool) {
        let h = Hyper {
            lr,
            momentum: self.momentum,
            weight_decay: self.weight_decay,
            nesterov: self.nesterov,
        };
        for (p, v) in self.params.iter().zip(self.momentum_buffers.iter_mut()) {
            let g = p.grad();
            if !g.defined() {
                continue;
            }
            if !(fuse && step_fused(p, &g, v, h)) {
                step_tensors(p, &g, v, h);
            }
        }
    }

    /// Sets every gradient to zero.
    pub fn zero_grad(&mut self) {
        for p in &mut self.params {
            p.zero_grad();
        }
    }
}

/// The settings of one update.
#[derive(Debug, Clone, Copy)]
struct Hyper {
    lr: f64,
    momentum: f64,
    weight_decay: f64,
    nesterov: bool,
}

/// `d = g + wd·p; v = μ·v + d; p -= lr · (nesterov ? d + μ·v : v)` with libtorch operations.
fn step_tensors(p: &Tensor, g: &Tensor, v: &mut Tensor, h: Hyper) {
    let Hyper {
        lr,
        momentum,
        weight_decay,
        nesterov,
    } = h;
    tch::no_grad(|| {
        let d = if weight_decay != 0.0 {
            g + p * weight_decay
        } else {
            g.shallow_clone()
        };
        let _ = v.g_mul_scalar_(momentum).g_add_(&d);
        let update = if nesterov {
            d + &*v * momentum
        } else {
            v.shallow_clone()
        };
        let mut p = p.shallow_clone();
        let _ = p.g_sub_(&(update * lr));
    });
}

/// [`sgd_fused`] on the elements of `p`, `g` and `v` when all three are contiguous f32 CPU
/// tensors of one length; returns false (and changes nothing) otherwise.
fn step_fused(p: &Tensor, g: &Tensor, v: &mut Tensor, h: Hyper) -> bool {
    let (Some((pp, n)), Some((gp, gn)), Some((vp, vn))) =
        (f32_parts(p), f32_parts(g), f32_parts(v))
    else {
        return false;
    };
    if n != gn || n != vn {
        return false;
    }
    let disjoint =
        |a: *mut f32, b: *mut f32| (a as usize).abs_diff(b as usize) >= n * size_of::<f32>();
    assert!(
        disjoint(pp, gp) && disjoint(pp, vp) && disjoint(gp, vp),
        "a parameter, its gradient and its momentum buffer overlap in memory"
    );
    // SAFETY: each pointer starts `n` consecutive, initialised, aligned f32 values of a
    // contiguous CPU tensor (`f32_parts`) that lives through this call; the three ranges are
    // disjoint (asserted above), and nothing else touches them now: the bucket allreduces were
    // waited for before the step, and no autograd graph holds these tensors.
    let (ps, gs, vs) = unsafe {
        (
            std::slice::from_raw_parts_mut(pp, n),
            std::slice::from_raw_parts(gp, n),
            std::slice::from_raw_parts_mut(vp, n),
        )
    };
    let f = |x: f64| x as f32;
    sgd_fused(
        ps,
        gs,
        vs,
        f(h.lr),
        f(h.momentum),
        f(h.weight_decay),
        h.nesterov,
    );
    true
}

/// The first element and length of a non-empty contiguous f32 CPU tensor, or `None` for any
/// other tensor.
fn f32_parts(t: &Tensor) -> Option<(*mut f32, usize)> {
    let n = t.numel();
    (n > 0 && t.kind() == Kind::Float && t.device() == Device::Cpu && t.is_contiguous())
        .then(|| (t.data_ptr().cast::<f32>(), n))
}

/// One SGD update in a single pass: `d = g + wd·p; v = μ·v + d; p -= lr · (nesterov ? d +
/// μ·v : v)`, each operation rounded to f32 as libtorch's element-wise kernels round them
/// (Rust does not contract `a * b + c` into a fused multiply-add), so the result equals
/// [`step_tensors`]'s bit for bit, in one pass over memory instead of six.
pub fn sgd_fused(
    p: &mut [f32],
    g: &[f32],
    v: &mut [f32],
    lr: f32,
    mu: f32,
    wd: f32,
    nesterov: bool,
) {
    for ((p, &g), v) in p.iter_mut().zip(g).zip(v.iter_mut()) {
        // No weight decay skips the term, as the tensor formulation does (`g + p·0` is not
        // always `g`: an infinite `p` would make it NaN).
        let d = if wd != 0.0 { g + *p * wd } else { g };
        *v = *v * mu + d;
        *p -= if nesterov { d + *v * mu } else { *v } * lr;
    }
}

/// How the rate decays after the warm-up.
#[derive(Debug, Clone, PartialEq)]
pub enum Decay {
    /// Multiply by `factor` at each of these epochs.
    Step {
        /// Epochs at which the rate drops.
        milestones: Vec<f64>,
        /// Factor of each drop.
        factor: f64,
    },
    /// Half a cosine from the peak rate down to zero at the last epoch.
    Cosine,
    /// Constant after the warm-up.
    Constant,
}

/// The learning rate as a function of (fractional) epoch.
#[derive(Debug, Clone, PartialEq)]
pub struct LrSchedule {
    /// Rate for a global batch of `base_batch`.
    pub base_lr: f64,
    /// Global batch the base rate is given for (256 in Goyal et al.).
    pub base_batch: usize,
    /// Global batch of this run.
    pub global_batch: usize,
    /// Epochs of linear warm-up from `base_lr` to the scaled rate.
    pub warmup_epochs: f64,
    /// Decay after the warm-up.
    pub decay: Decay,
    /// Epochs of the whole run (for cosine).
    pub total_epochs: f64,
}

impl LrSchedule {
    /// The peak rate: `base_lr · global_batch / base_batch` (the linear scaling rule).
    pub fn peak(&self) -> f64 {
        self.base_lr * self.global_batch as f64 / self.base_batch as f64
    }

    /// The rate at fractional epoch `epoch` (epoch 1.5 = halfway through the second epoch).
    pub fn at(&self, epoch: f64) -> f64 {
        let peak = self.peak();
        if epoch < self.warmup_epochs {
            // Goyal et al.: start at the unscaled rate, reach the scaled one after the warm-up.
            let start = self.base_lr.min(peak);
            return start + (peak - start) * epoch / self.warmup_epochs;
        }
        match &self.decay {
            Decay::Constant => peak,
            Decay::Step { milestones, factor } => {
                let drops = milestones.iter().filter(|&&m| epoch >= m).count();
                peak * factor.powi(drops as i32)
            }
            Decay::Cosine => {
                let span = (self.total_epochs - self.warmup_epochs).max(f64::MIN_POSITIVE);
                let t = ((epoch - self.warmup_epochs) / span).clamp(0.0, 1.0);
                0.5 * peak * (1.0 + (std::f64::consts::PI * t).cos())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    fn schedule(decay: Decay) -> LrSchedule {
        LrSchedule {
            base_lr: 0.1,
            base_batch: 256,
            global_batch: 1024,
            warmup_epochs: 5.0,
            decay,
            total_epochs: 90.0,
        }
    }

    #[test]
    fn warmup_rises_linearly_to_the_scaled_rate() {
        let s = schedule(Decay::Constant);
        assert!((s.peak() - 0.4).abs() < 1e-12);
        assert!((s.at(0.0) - 0.1).abs() < 1e-12);
        assert!((s.at(2.5) - 0.25).abs() < 1e-12);
        assert!((s.at(5.0) - 0.4).abs() < 1e-12);
        assert!((s.at(50.0) - 0.4).abs() < 1e-12);
    }

    #[test]
    fn step_and_cosine_decay() {
        let s = schedule(Decay::Step {
            milestones: vec![30.0, 60.0, 80.0],
            factor: 0.1,
        });
        assert!((s.at(29.9) - 0.4).abs() < 1e-12);
        assert!((s.at(30.0) - 0.04).abs() < 1e-12);
        assert!((s.at(85.0) - 0.0004).abs() < 1e-12);
        let c = schedule(Decay::Cosine);
        assert!((c.at(5.0) - 0.4).abs() < 1e-12);
        assert!((c.at(47.5) - 0.2).abs() < 1e-12);
        assert!(c.at(90.0).abs() < 1e-12);
    }

    #[test]
    fn sgd_matches_the_update_rule() {
        let p = Tensor::from_slice(&[1.0f32, -2.0]).set_requires_grad(true);
        let mut opt = Sgd::new(vec![p.shallow_clone()], 0.9, 0.1, false);
        // loss = sum(p^2): g = 2p.
        for _ in 0..2 {
            opt.zero_grad();
            (&p * &p).sum(Kind::Float).backward();
            opt.step(0.5);
        }
        // Step 1: d = 2p + 0.1p = 2.1p; v = d; p1 = p - 0.5·2.1p = -0.05p.
        // Step 2: d = 2.1·p1; v = 0.9·2.1p + 2.1·p1; p2 = p1 - 0.5·v.
        let want = |p0: f64| {
            let p1 = -0.05 * p0;
            let v = 0.9 * 2.1 * p0 + 2.1 * p1;
            p1 - 0.5 * v
        };
        let got: Vec<f32> = Vec::try_from(&p.detach().to_device(Device::Cpu)).unwrap();
        assert!((f64::from(got[0]) - want(1.0)).abs() < 1e-5, "{got:?}");
        assert!((f64::from(got[1]) - want(-2.0)).abs() < 1e-5, "{got:?}");
    }

    #[test]
    fn the_fused_step_gives_the_bits_of_the_tensor_operations() {
        tch::manual_seed(3);
        for (wd, nesterov) in [(5e-4, false), (0.0, false), (1e-2, true), (0.0, true)] {
            // Two parameters of awkward sizes, a 0-d one, and values spread over magnitudes.
            let shapes: [&[i64]; 3] = [&[7, 3, 3, 3], &[1001], &[]];
            let make = || -> Vec<Tensor> {
                shapes
                    .iter()
                    .map(|s| Tensor::randn(*s, (Kind::Float, Device::Cpu)) * 3.0)
                    .collect()
            };
            let start = make();
            let grads: Vec<Vec<Tensor>> = (0..3).map(|_| make()).collect();
            let run = |fused: bool| -> Vec<Tensor> {
                let params: Vec<Tensor> = start
                    .iter()
                    .map(|t| t.copy().set_requires_grad(true))
                    .collect();
                let mut opt = Sgd::new(
                    params.iter().map(Tensor::shallow_clone).collect(),
                    0.9,
                    wd,
                    nesterov,
                );
                for (k, gs) in grads.iter().enumerate() {
                    for (p, g) in params.iter().zip(gs) {
                        let mut grad = p.grad();
                        if grad.defined() {
                            grad.copy_(g);
                        } else {
                            // The first step defines the gradients (as backward would).
                            (p * g).sum(Kind::Float).backward();
                        }
                    }
                    let lr = 0.1 + 0.05 * k as f64;
                    if fused {
                        opt.step(lr)
                    } else {
                        opt.step_tensors(lr)
                    }
                }
                params.iter().map(|p| p.detach().copy()).collect()
            };
            let (a, b) = (run(true), run(false));
            for (x, y) in a.iter().zip(&b) {
                let (x, y): (Vec<f32>, Vec<f32>) = (
                    Vec::try_from(&x.flatten(0, -1)).unwrap(),
                    Vec::try_from(&y.flatten(0, -1)).unwrap(),
                );
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&x), bits(&y), "wd {wd} nesterov {nesterov}");
            }
            // The steps did move every parameter (the comparison is not of untouched ones).
            for (x, s0) in a.iter().zip(&start) {
                assert!(
                    !x.allclose(s0, 1e-3, 1e-3, false),
                    "wd {wd} nesterov {nesterov}"
                );
            }
        }
    }
}
