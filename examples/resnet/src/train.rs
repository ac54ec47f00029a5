//! The training program: options, the data-parallel step, evaluation, reports.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use ferroccl::{Communicator, ReduceOp};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tch::{nn, Device, Kind, Tensor};

use crate::checkpoint::{self, Progress};
use crate::data::{self, Dataset, DistributedSampler, SplitMix64};
use crate::ddp::{broadcast_tensors, GradReducer, Wire};
use crate::model::{stage_of, Arch, ModelConfig, ResNet};
use crate::optim::{Decay, LrSchedule, Sgd};

/// Where the images come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DataKind {
    /// Random images and fixed labels, generated once: the throughput benchmark.
    Synthetic,
    /// CIFAR-10's binary format (`data_batch_*.bin`, `test_batch.bin`) in `--data-dir`.
    Cifar10,
    /// `--data-dir/<class>/<image>`, one directory per class.
    Folder,
}

/// Batch-norm behaviour while training.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BatchNormMode {
    /// Normalise with each rank's batch statistics (as PyTorch DDP without SyncBatchNorm).
    Train,
    /// Normalise with the running statistics and never update them: every rank computes the
    /// same function, so N ranks with batch B/N equal one rank with batch B.
    Frozen,
}

/// What the C allocator does with freed memory (libtorch allocates every activation and
/// gradient of a step anew through it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MallocMode {
    /// Keep it for the next step: blocks up to 1 GiB come from the heap and the heap is not
    /// trimmed below 1 GiB of free memory (glibc's `mallopt`; elsewhere the same as `system`).
    Keep,
    /// The C library's defaults: glibc maps blocks above a threshold it adapts (at most 32 MiB)
    /// and unmaps them when freed, so each step faults their pages in again.
    System,
}

/// Learning-rate decay after the warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DecayKind {
    /// Multiply by `--decay-factor` at each epoch of `--milestones`.
    Step,
    /// Cosine to zero at the last epoch.
    Cosine,
    /// Keep the peak rate.
    Constant,
}

/// `resnet_ddp`: data-parallel ResNet training on ferroccl.
///
/// Start it with a launcher (`ferrorun -n N -- resnet_ddp ...`, torchrun, srun or mpirun);
/// without one it trains on one rank.
#[derive(Debug, Clone, Parser)]
#[command(name = "resnet_ddp", version)]
pub struct Options {
    /// resnet18, resnet34 or resnet50.
    #[arg(long, default_value = "resnet18", value_parser = parse_arch)]
    pub arch: Arch,
    /// Image height and width; 64 or less selects the small-image stem (3×3 conv, no max-pool).
    #[arg(long, default_value_t = 32)]
    pub image_size: i64,
    /// Channels of the first stage (64 in the papers; smaller for quick experiments).
    #[arg(long, default_value_t = 64)]
    pub width: i64,
    /// Classes of the synthetic data (real data sets bring their own).
    #[arg(long, default_value_t = 10)]
    pub num_classes: i64,
    /// Data source.
    #[arg(long, value_enum, default_value = "synthetic")]
    pub data: DataKind,
    /// Directory of the data set (cifar10, folder).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Fraction held out for evaluation when the data set has no test split.
    #[arg(long, default_value_t = 0.1)]
    pub holdout: f64,
    /// Random crops and flips of the training images.
    #[arg(long)]
    pub augment: bool,
    /// Images per rank per step.
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    /// Images per step over all ranks (instead of --batch-size; divided among the ranks).
    #[arg(long)]
    pub global_batch: Option<usize>,
    /// Epochs to train.
    #[arg(long, default_value_t = 1)]
    pub epochs: usize,
    /// Steps per epoch: all of them for synthetic data (default 50), at most this many for real data.
    #[arg(long)]
    pub steps: Option<usize>,
    /// Steps at the start left out of the timings.
    #[arg(long, default_value_t = 3)]
    pub warmup_steps: usize,
    /// Learning rate for a global batch of --base-batch.
    #[arg(long, default_value_t = 0.1)]
    pub lr: f64,
    /// Global batch --lr is given for; the rate scales linearly with the real global batch.
    #[arg(long, default_value_t = 256)]
    pub base_batch: usize,
    /// Epochs of gradual warm-up from --lr to the scaled rate.
    #[arg(long, default_value_t = 0.0)]
    pub warmup_epochs: f64,
    /// Decay after the warm-up.
    #[arg(long, value_enum, default_value = "step")]
    pub decay: DecayKind,
    /// Epochs where step decay multiplies the rate by --decay-factor.
    #[arg(long, value_delimiter = ',', default_value = "30,60,80")]
    pub milestones: Vec<f64>,
    /// Factor of each step decay.
    #[arg(long, default_value_t = 0.1)]
    pub decay_factor: f64,
    /// SGD momentum.
    #[arg(long, default_value_t = 0.9)]
    pub momentum: f64,
    /// Weight decay.
    #[arg(long, default_value_t = 5e-4)]
    pub weight_decay: f64,
    /// Nesterov momentum.
    #[arg(long)]
    pub nesterov: bool,
    /// Batch-norm statistics while training.
    #[arg(long, value_enum, default_value = "train")]
    pub bn: BatchNormMode,
    /// Gradient bucket size in MiB.
    #[arg(long, default_value_t = 25.0)]
    pub bucket_mb: f64,
    /// Gradients on the wire: none (f32), bf16 or f16; sums are formed in f32.
    #[arg(long, default_value = "none", value_parser = parse_wire)]
    pub compress: Wire,
    /// Start the allreduces only after the whole backward (for measuring what overlap hides).
    #[arg(long)]
    pub no_overlap: bool,
    /// libtorch compute threads per rank.
    #[arg(long, default_value_t = 1)]
    pub threads: i32,
    /// Seed of the initial weights (rank 0's are used), the sampler and the synthetic data.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Rank 0 writes a checkpoint here after every epoch (`{epoch}` in the name is replaced).
    #[arg(long)]
    pub checkpoint: Option<String>,
    /// Resume from this checkpoint (written by any number of ranks).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Microseconds a waiting rank spins before sleeping (default: 20,000 when this host has no
    /// more ranks than cores, else ferroccl's FERRO_SPIN_US).
    #[arg(long)]
    pub spin_us: Option<u64>,
    /// Print the global training loss of every Nth step (0: only per epoch).
    #[arg(long, default_value_t = 0)]
    pub log_every: usize,
    /// Freed memory: keep it for the next step, or the C library's defaults.
    #[arg(long, value_enum, default_value = "keep")]
    pub malloc: MallocMode,
}

fn parse_arch(s: &str) -> Result<Arch, String> {
    Arch::parse(s)
        .ok_or_else(|| format!("unknown architecture {s:?} (resnet18, resnet34, resnet50)"))
}

fn parse_wire(s: &str) -> Result<Wire, String> {
    Wire::parse(s).ok_or_else(|| format!("unknown gradient compression {s:?} (none, bf16, f16)"))
}

/// Per-step time split, summed over the timed steps.
#[derive(Debug, Default, Clone, Copy)]
struct StepTimes {
    forward: Duration,
    backward: Duration,
    comm_wait: Duration,
    optimizer: Duration,
    total: Duration,
    steps: u32,
}

impl StepTimes {
    fn as_ms(&self) -> [f64; 5] {
        let n = f64::from(self.steps.max(1));
        [
            self.forward,
            self.backward,
            self.comm_wait,
            self.optimizer,
            self.total,
        ]
        .map(|d| d.as_secs_f64() * 1e3 / n)
    }
}

/// The model, its variables in a fixed order, the optimizer and the reducer.
struct Trainer {
    comm: Arc<Communicator>,
    net: ResNet,
    /// Every variable (parameters and batch-norm statistics), sorted by name.
    vars: Vec<(String, Tensor)>,
    /// Trainable variables, sorted by name.
    params: Vec<(String, Tensor)>,
    opt: Sgd,
    reducer: GradReducer,
    bn_train: bool,
    overlap: bool,
    /// Keeps the variables alive.
    _vs: nn::VarStore,
}

impl Trainer {
    /// Runs forward, backward (starting bucket allreduces as stages finish) and waits for the
    /// averaged gradients. `weight` is this rank's share of the step's global batch. Returns
    /// this rank's loss (0 for an empty batch) and the forward, backward and wait times.
    fn step(
        &mut self,
        xs: Option<&Tensor>,
        ys: &Tensor,
        weight: f64,
    ) -> Result<(f64, [Duration; 3])> {
        self.opt.zero_grad();
        self.reducer.begin_step(weight);
        let t0 = Instant::now();
        let Some(xs) = xs else {
            // Nothing to compute: send zeros with zero weight so the other ranks' step completes.
            let t1 = Instant::now();
            let waited = self.reducer.finish()?;
            return Ok((0.0, [Duration::ZERO, t1 - t0, waited]));
        };
        if !self.overlap {
            let loss = self
                .net
                .forward(xs, self.bn_train)
                .cross_entropy_for_logits(ys);
            let t1 = Instant::now();
            loss.backward();
            let t2 = Instant::now();
            let waited = self.reducer.finish()?;
            return Ok((loss.double_value(&[]), [t1 - t0, t2 - t1, waited]));
        }
        // Each stage's input is the previous stage's output cut from its graph, so backward can
        // run one stage at a time and a bucket can leave as soon as its stages are done.
        let n = self.net.num_stages();
        let mut inputs = Vec::with_capacity(n);
        let mut outputs: Vec<Tensor> = Vec::with_capacity(n);
        for s in 0..n {
            let input = match outputs.last() {
                None => xs.shallow_clone(),
                Some(prev) => prev.detach().set_requires_grad(true),
            };
            outputs.push(self.net.stage(s, &input, self.bn_train));
            inputs.push(input);
        }
        let loss = outputs[n - 1].cross_entropy_for_logits(ys);
        let t1 = Instant::now();
        loss.backward();
        self.reducer.stage_done(n - 1)?;
        for s in (0..n - 1).rev() {
            let g = inputs[s + 1].grad();
            // d/d(out) of sum(out * g) is g: this runs stage s's backward with the incoming
            // gradient g and accumulates into its parameters.
            (&outputs[s] * &g).sum(Kind::Float).backward();
            self.reducer.stage_done(s)?;
        }
        let t2 = Instant::now();
        let waited = self.reducer.finish()?;
        Ok((loss.double_value(&[]), [t1 - t0, t2 - t1, waited]))
    }

    /// Mean loss and accuracy on `ds`, each rank evaluating every Nth sample.
    fn evaluate(&self, ds: &Dataset, batch: usize) -> Result<(f64, f64)> {
        let (rank, nranks) = (self.comm.rank(), self.comm.nranks());
        let mine: Vec<usize> = (rank..ds.len()).step_by(nranks).collect();
        let mut sums = [0.0f64; 3];
        tch::no_grad(|| {
            for chunk in mine.chunks(batch.max(1)) {
                let (xs, ys) = ds.batch(chunk, None);
                let logits = self.net.forward(&xs, false);
                let n = chunk.len() as f64;
                sums[0] += logits.cross_entropy_for_logits(&ys).double_value(&[]) * n;
                sums[1] += logits
                    .argmax(-1, false)
                    .eq_tensor(&ys)
                    .sum(Kind::Float)
                    .double_value(&[]);
                sums[2] += n;
            }
        });
        self.comm
            .all_reduce_in_place(&mut sums, ReduceOp::Sum)
            .context("evaluation totals")?;
        let n = sums[2].max(1.0);
        Ok((sums[0] / n, sums[1] / n))
    }

    fn momentum_named(&self) -> Vec<(String, Tensor)> {
        self.params
            .iter()
            .zip(self.opt.momentum_buffers())
            .map(|((n, _), m)| (n.clone(), m.shallow_clone()))
            .collect()
    }
}

/// Joins the launcher's job, or runs alone without one.
///
/// `spin_us`: how long a waiting rank spins before it sleeps. `None` keeps ferroccl's setting
/// (`FERRO_SPIN_US`, 50 µs) when the host has more ranks than cores, and otherwise spins up to
/// 20 ms: a core that goes idle at every step's wait costs the next forward and backward more
/// than the spinning does (see docs/RESNET.md).
fn communicator(spin_us: Option<u64>) -> Result<Communicator> {
    let mut config = ferroccl::Config::from_env()?;
    let env = ferroccl::bootstrap::env::detect()?;
    let local = env
        .as_ref()
        .map_or(1, |e| e.local_nranks.unwrap_or(e.nranks));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let spin = match spin_us {
        Some(us) => Some(us),
        None if std::env::var_os("FERRO_SPIN_US").is_none() && local <= cores => Some(20_000),
        None => None,
    };
    if let Some(us) = spin {
        config.spin = Duration::from_micros(us);
    }
    match env {
        Some(env) => Ok(Communicator::from_launch_env(&env, config)?),
        None => Communicator::local_group(1, config)?
            .pop()
            .context("a one-rank communicator"),
    }
}

/// Applies `mode` to the C allocator. Returns whether the allocator took it (`system` always;
/// `keep` where glibc's `mallopt` accepted every setting).
///
/// Why: a ResNet step frees and allocates again its activations and gradients, blocks of
/// megabytes. glibc serves those above its mmap threshold with fresh mappings and gives them
/// back when freed, and freed memory at the top of the heap beyond its trim threshold too; the
/// next step then takes a page fault for every 4 KiB of them. ResNet-18 at 32x32, batch 32,
/// on one pinned core, 12 steps: 418,000 - 487,000 page faults with the defaults and 135,000
/// with `keep`, and 726 - 749 ms per step against 675 - 682 ms (`perf stat -e page-faults`,
/// two runs each).
pub fn configure_malloc(mode: MallocMode) -> bool {
    match mode {
        MallocMode::System => true,
        MallocMode::Keep => keep_freed_memory(),
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() -> bool {
    const KEEP: libc::c_int = 1 << 30;
    [
        libc::M_MMAP_THRESHOLD,
        libc::M_TRIM_THRESHOLD,
        libc::M_TOP_PAD,
    ]
    .into_iter()
    // SAFETY: `mallopt` only changes glibc's allocator parameters; these three take a
    // byte count, and the call is made before this program's threads allocate from it.
    .all(|param| unsafe { libc::mallopt(param, KEEP) } == 1)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() -> bool {
    false
}

/// Trains as `opts` says; rank 0 prints the reports and, last, one `RESULT {json}` line.
pub fn run(opts: &Options) -> Result<()> {
    if !configure_malloc(opts.malloc) {
        eprintln!(
            "resnet_ddp: --malloc {:?}: the C allocator did not take these settings; using its defaults",
            opts.malloc
        );
    }
    tch::set_num_interop_threads(1);
    tch::set_num_threads(opts.threads.max(1));
    let comm = Arc::new(communicator(opts.spin_us)?);
    let (rank, nranks) = (comm.rank(), comm.nranks());
    let lead = rank == 0;
    let global_batch = opts.global_batch.unwrap_or(opts.batch_size * nranks);
    if global_batch < nranks {
        bail!("global batch {global_batch} is smaller than the {nranks} ranks");
    }

    // Data.
    let (train_set, eval_set) = match opts.data {
        DataKind::Synthetic => (None, None),
        DataKind::Cifar10 | DataKind::Folder => {
            let dir = opts
                .data_dir
                .as_ref()
                .context("--data cifar10 and --data folder need --data-dir")?;
            let (train, test) = if opts.data == DataKind::Cifar10 {
                data::load_cifar(dir)?
            } else {
                (data::load_image_folder(dir, opts.image_size)?, None)
            };
            let (train, test) = match test {
                Some(t) => (train, t),
                None => train.split_holdout(opts.holdout, 0x5eed),
            };
            (Some(train), Some(test))
        }
    };
    let num_classes = train_set
        .as_ref()
        .map_or(opts.num_classes, |d| d.num_classes);
    let image_size = if opts.data == DataKind::Cifar10 {
        32
    } else {
        opts.image_size
    };

    // Model: every rank builds it, rank 0's values (or checkpoint) win.
    tch::manual_seed(opts.seed as i64);
    let vs = nn::VarStore::new(Device::Cpu);
    let cfg = ModelConfig::for_images(opts.arch, num_classes, opts.width, image_size);
    let net = ResNet::new(&vs.root(), cfg);
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    let params: Vec<(String, Tensor)> = vars
        .iter()
        .filter(|(_, t)| t.requires_grad())
        .map(|(n, t)| (n.clone(), t.shallow_clone()))
        .collect();
    let opt = Sgd::new(
        params.iter().map(|(_, t)| t.shallow_clone()).collect(),
        opts.momentum,
        opts.weight_decay,
        opts.nesterov,
    );
    let staged: Vec<(Tensor, usize)> = params
        .iter()
        .map(|(n, t)| {
            Ok((
                t.shallow_clone(),
                stage_of(n).with_context(|| format!("variable {n} has no stage"))?,
            ))
        })
        .collect::<Result<_>>()?;
    let bucket_bytes = (opts.bucket_mb * (1 << 20) as f64) as usize;
    let reducer = GradReducer::new(comm.clone(), staged, bucket_bytes, opts.compress)?;
    let mut tr = Trainer {
        comm: comm.clone(),
        net,
        vars,
        params,
        opt,
        reducer,
        bn_train: opts.bn == BatchNormMode::Train,
        overlap: !opts.no_overlap,
        _vs: vs,
    };

    let mut progress = Progress { epoch: 0, step: 0 };
    if lead {
        if let Some(path) = &opts.resume {
            progress = checkpoint::load(path, &tr.vars, &tr.momentum_named())?;
            println!(
                "resumed from {} at epoch {} (step {})",
                path.display(),
                progress.epoch + 1,
                progress.step
            );
        }
    }
    let mut state: Vec<Tensor> = tr.vars.iter().map(|(_, t)| t.shallow_clone()).collect();
    state.extend(tr.opt.momentum_buffers().iter().map(Tensor::shallow_clone));
    state.push(Tensor::from_slice(&[
        progress.epoch as f32,
        progress.step as f32,
    ]));
    broadcast_tensors(&comm, &state, 0).context("initial parameters from rank 0")?;
    let meta = state.last().expect("pushed above");
    progress = Progress {
        epoch: meta.double_value(&[0]) as usize,
        step: meta.double_value(&[1]) as usize,
    };

    let sampler = train_set
        .as_ref()
        .map(|d| DistributedSampler::new(d.len(), global_batch, rank, nranks, opts.seed));
    let steps_per_epoch = match &sampler {
        Some(s) => opts
            .steps
            .map_or(s.steps_per_epoch(), |cap| cap.min(s.steps_per_epoch())),
        None => opts.steps.unwrap_or(50),
    };
    let schedule = LrSchedule {
        base_lr: opts.lr,
        base_batch: opts.base_batch,
        global_batch,
        warmup_epochs: opts.warmup_epochs,
        decay: match opts.decay {
            DecayKind::Step => Decay::Step {
                milestones: opts.milestones.clone(),
                factor: opts.decay_factor,
            },
            DecayKind::Cosine => Decay::Cosine,
            DecayKind::Constant => Decay::Constant,
        },
        total_epochs: opts.epochs as f64,
    };
    let local_batch = global_batch / nranks + usize::from(rank < global_batch % nranks);
    let synthetic = (opts.data == DataKind::Synthetic).then(|| {
        data::synthetic_batch(
            local_batch,
            image_size,
            num_classes,
            opts.seed.wrapping_add(1 + rank as u64),
        )
    });
    if lead {
        let bytes = tr.reducer.bucket_bytes();
        println!(
            "{} ({} parameters) on {nranks} rank(s): global batch {global_batch}, {steps_per_epoch} steps per epoch, peak lr {:.4}, \
             {} gradient bucket(s) of {:?} bytes, wire {:?}, overlap {}, {} thread(s) per rank",
            opts.arch,
            tr.params.iter().map(|(_, t)| t.numel()).sum::<usize>(),
            schedule.peak(),
            bytes.len(),
            bytes,
            opts.compress,
            tr.overlap,
            opts.threads
        );
    }

    let mut times = StepTimes::default();
    let mut timed_wall = Duration::ZERO;
    let mut timed_images = 0usize;
    let mut steps_run = 0usize;
    let mut augment_rng = SplitMix64::new(opts.seed ^ (0xa0 + rank as u64));
    let mut last_eval = None;
    let mut last_loss = f64::NAN;
    let mut least_wait_ms = 0.0f64;
    for epoch in progress.epoch..opts.epochs {
        let plan = sampler.as_ref().map(|s| s.epoch(epoch));
        let bar = if lead {
            ProgressBar::new(steps_per_epoch as u64)
        } else {
            ProgressBar::hidden()
        };
        bar.set_draw_target(if lead {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        });
        bar.set_style(
            ProgressStyle::with_template(
                "epoch {prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed}<{eta})",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        bar.set_prefix(format!("{}/{}", epoch + 1, opts.epochs));
        let mut weighted_losses = Vec::with_capacity(steps_per_epoch);
        // This rank's wait of every timed step (NaN for untimed ones).
        let mut waits_ms = Vec::with_capacity(steps_per_epoch);
        for s in 0..steps_per_epoch {
            let t_step = Instant::now();
            let (xs, ys, n_local, n_global) = match (&plan, &synthetic, &train_set) {
                (Some(plan), _, Some(ds)) => {
                    let (idx, gb) = &plan[s];
                    if idx.is_empty() {
                        (None, Tensor::zeros([0], (Kind::Int64, Device::Cpu)), 0, *gb)
                    } else {
                        let rng = opts.augment.then_some(&mut augment_rng);
                        let (xs, ys) = ds.batch(idx, rng);
                        (Some(xs), ys, idx.len(), *gb)
                    }
                }
                (_, Some((xs, ys)), _) => (
                    Some(xs.shallow_clone()),
                    ys.shallow_clone(),
                    local_batch,
                    global_batch,
                ),
                _ => unreachable!("either a data set or synthetic data"),
            };
            let weight = n_local as f64 / n_global as f64;
            let (loss, [fwd, bwd, wait]) = tr.step(xs.as_ref(), &ys, weight)?;
            let lr = schedule.at(epoch as f64 + s as f64 / steps_per_epoch as f64);
            let t_opt = Instant::now();
            tr.opt.step(lr);
            let opt_time = t_opt.elapsed();
            let step_time = t_step.elapsed();
            weighted_losses.push(loss * weight);
            steps_run += 1;
            progress.step += 1;
            let timed = steps_run > opts.warmup_steps;
            waits_ms.push(if timed {
                wait.as_secs_f64() * 1e3
            } else {
                f64::NAN
            });
            if timed {
                times.forward += fwd;
                times.backward += bwd;
                times.comm_wait += wait;
                times.optimizer += opt_time;
                times.total += step_time;
                times.steps += 1;
                timed_wall += step_time;
                timed_images += n_global;
            }
            bar.inc(1);
            bar.set_message(format!("loss {loss:.4} lr {lr:.4}"));
            if opts.log_every > 0 && lead && progress.step.is_multiple_of(opts.log_every) {
                bar.suspend(|| println!("progress step {} rank-loss {loss:.6}", progress.step));
            }
        }
        bar.finish_and_clear();
        // Exact global losses of every step of the epoch: each rank's loss weighted by its share.
        comm.all_reduce_in_place(&mut weighted_losses, ReduceOp::Sum)
            .context("epoch losses")?;
        let first_step = progress.step - steps_per_epoch;
        if lead && opts.log_every > 0 {
            for (i, l) in weighted_losses.iter().enumerate() {
                if (first_step + i + 1).is_multiple_of(opts.log_every) {
                    println!("loss step {} {l:.6}", first_step + i + 1);
                }
            }
        }
        let train_loss = weighted_losses.iter().sum::<f64>() / weighted_losses.len().max(1) as f64;
        // In each step the rank that finished backward last waited only for what communication
        // left exposed; the others also waited for it to catch up.
        comm.all_reduce_in_place(&mut waits_ms, ReduceOp::Min)
            .context("epoch wait times")?;
        least_wait_ms += waits_ms.iter().filter(|w| !w.is_nan()).sum::<f64>();
        last_loss = train_loss;
        let eval = match &eval_set {
            Some(ds) => Some(tr.evaluate(ds, 2 * opts.batch_size)?),
            None => None,
        };
        last_eval = eval;
        progress.epoch = epoch + 1;
        if lead {
            let [f, b, w, o, t] = times.as_ms();
            let ips = timed_images as f64 / timed_wall.as_secs_f64().max(1e-9);
            let eval_text = eval.map_or(String::new(), |(l, a)| {
                format!(" eval_loss {l:.4} eval_acc {:.2}%", 100.0 * a)
            });
            println!(
                "epoch {}/{} train_loss {train_loss:.4}{eval_text} lr {:.4} | {ips:.1} images/s ({:.1} per rank) | step ms: forward {f:.1} backward {b:.1} comm_wait {w:.1} optimizer {o:.1} total {t:.1}",
                epoch + 1,
                opts.epochs,
                schedule.at(epoch as f64 + 1.0 - 1e-9),
                ips / nranks as f64
            );
            if let Some(pattern) = &opts.checkpoint {
                let path = PathBuf::from(pattern.replace("{epoch}", &(epoch + 1).to_string()));
                checkpoint::save(&path, &tr.vars, &tr.momentum_named(), progress)?;
                println!("checkpoint {}", path.display());
            }
        }
    }

    // What overlap hid: the same buckets' allreduces with nothing to overlap, every rank together.
    let exposed_ms = if nranks > 1 && times.steps > 0 {
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            best = best.min(tr.reducer.time_exposed()?.as_secs_f64() * 1e3);
        }
        Some(best)
    } else {
        None
    };
    // Step times averaged over the ranks; images/s from the slowest rank's wall time.
    let mut ms = times.as_ms().to_vec();
    comm.all_reduce_in_place(&mut ms, ReduceOp::Avg)
        .context("step times")?;
    let least_wait = least_wait_ms / f64::from(times.steps.max(1));
    let mut wall = [timed_wall.as_secs_f64()];
    comm.all_reduce_in_place(&mut wall, ReduceOp::Max)
        .context("wall time")?;
    if lead {
        let ips = timed_images as f64 / wall[0].max(1e-9);
        let hidden = exposed_ms.map(|e| (1.0 - least_wait / e).clamp(0.0, 1.0));
        let result = serde_json::json!({
            "impl": "ferroccl",
            "arch": opts.arch.to_string(),
            "image_size": image_size,
            "width": opts.width,
            "nranks": nranks,
            "batch_per_rank": global_batch as f64 / nranks as f64,
            "global_batch": global_batch,
            "steps": times.steps,
            "threads": opts.threads,
            "images_per_sec": ips,
            "images_per_sec_per_rank": ips / nranks as f64,
            "step_ms": {"forward": ms[0], "backward": ms[1], "comm_wait": ms[2], "optimizer": ms[3], "total": ms[4]},
            "comm_wait_least_ms": least_wait,
            "comm_exposed_ms": exposed_ms,
            "comm_hidden_fraction": hidden,
            "buckets": tr.reducer.num_buckets(),
            "bucket_mb": opts.bucket_mb,
            "wire": format!("{:?}", opts.compress).to_lowercase(),
            "malloc": format!("{:?}", opts.malloc).to_lowercase(),
            "overlap": tr.overlap,
            "train_loss": last_loss,
            "eval_loss": last_eval.map(|e| e.0),
            "eval_acc": last_eval.map(|e| e.1),
        });
        println!("RESULT {result}");
    }
    Ok(())
}
