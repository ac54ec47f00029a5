//! Data: synthetic batches, CIFAR-10's binary format, a directory of images per class, the
//! distributed sampler, and a generator of small CIFAR-format data sets with a learnable
//! pattern per class (for tests and demonstrations; nothing is downloaded).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tch::{Device, Kind, Tensor};

/// Bytes of one CIFAR-10 record: a label byte, then 3 × 32 × 32 pixels, channel-major.
pub const CIFAR_RECORD: usize = 1 + 3 * 32 * 32;

/// Per-channel mean and standard deviation of CIFAR-10's training images (0..1 scale).
const CIFAR_MEAN: [f64; 3] = [0.4914, 0.4822, 0.4465];
const CIFAR_STD: [f64; 3] = [0.2470, 0.2435, 0.2616];

/// Images held in memory as bytes, `[n, 3, h, w]`, with their labels `[n]` (i64).
#[derive(Debug)]
pub struct Dataset {
    /// Pixels, u8, `[n, 3, h, w]`.
    pub images: Tensor,
    /// Class indices, i64, `[n]`.
    pub labels: Tensor,
    /// Number of classes.
    pub num_classes: i64,
}

impl Dataset {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.size()[0] as usize
    }

    /// True when there are no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The samples at `indices`, as normalised f32 images `[b, 3, h, w]` and labels `[b]`;
    /// `augment` adds a random horizontal flip and a random crop after 4-pixel zero padding.
    pub fn batch(&self, indices: &[usize], augment: Option<&mut SplitMix64>) -> (Tensor, Tensor) {
        let idx = index_tensor(indices);
        let mut xs = self.images.index_select(0, &idx).to_kind(Kind::Float) / 255.0;
        if let Some(rng) = augment {
            xs = augment_batch(&xs, rng);
        }
        let mean = Tensor::from_slice(&CIFAR_MEAN)
            .to_kind(Kind::Float)
            .view([1, 3, 1, 1]);
        let std = Tensor::from_slice(&CIFAR_STD)
            .to_kind(Kind::Float)
            .view([1, 3, 1, 1]);
        ((xs - mean) / std, self.labels.index_select(0, &idx))
    }

    /// Splits off the last `fraction` of a fixed shuffle (seed `seed`) as a held-out set.
    pub fn split_holdout(self, fraction: f64, seed: u64) -> (Dataset, Dataset) {
        let n = self.len();
        let held = ((n as f64) * fraction).round() as usize;
        let held = held.min(n.saturating_sub(1));
        let perm = permutation(n, seed);
        let (train, test) = perm.split_at(n - held);
        (self.subset(train), self.subset(test))
    }

    fn subset(&self, indices: &[usize]) -> Dataset {
        let idx = index_tensor(indices);
        Dataset {
            images: self.images.index_select(0, &idx),
            labels: self.labels.index_select(0, &idx),
            num_classes: self.num_classes,
        }
    }
}

fn index_tensor(indices: &[usize]) -> Tensor {
    let idx: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
    Tensor::from_slice(&idx)
}

fn augment_batch(xs: &Tensor, rng: &mut SplitMix64) -> Tensor {
    let size = xs.size();
    let (b, h, w) = (size[0], size[2], size[3]);
    let padded = xs.constant_pad_nd([4, 4, 4, 4]);
    let mut out = Vec::with_capacity(b as usize);
    for i in 0..b {
        let dy = rng.below(9) as i64;
        let dx = rng.below(9) as i64;
        let mut img = padded.get(i).narrow(1, dy, h).narrow(2, dx, w);
        if rng.below(2) == 1 {
            img = img.flip([2]);
        }
        out.push(img);
    }
    Tensor::stack(&out, 0)
}

/// A fixed random batch with fixed labels: the standard throughput benchmark's input, generated
/// once per rank and used for every step, so no data loading is timed.
pub fn synthetic_batch(
    batch: usize,
    image_size: i64,
    num_classes: i64,
    seed: u64,
) -> (Tensor, Tensor) {
    tch::manual_seed(seed as i64);
    let xs = Tensor::randn(
        [batch as i64, 3, image_size, image_size],
        (Kind::Float, Device::Cpu),
    );
    let ys = Tensor::randint(num_classes, [batch as i64], (Kind::Int64, Device::Cpu));
    (xs, ys)
}

/// Reads CIFAR-10 binary files (`data_batch_*.bin`, or one file): returns the training set and,
/// when `test_batch.bin` is there, the test set.
pub fn load_cifar(path: &Path) -> Result<(Dataset, Option<Dataset>)> {
    if path.is_file() {
        return Ok((read_cifar_files(&[path.to_path_buf()])?, None));
    }
    let mut train: Vec<PathBuf> = fs::read_dir(path)
        .with_context(|| format!("cifar10: cannot read directory {}", path.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("data_batch") && n.ends_with(".bin"))
        })
        .collect();
    train.sort();
    if train.is_empty() {
        bail!("cifar10: no data_batch_*.bin in {}", path.display());
    }
    let test_path = path.join("test_batch.bin");
    let test = if test_path.exists() {
        Some(read_cifar_files(&[test_path])?)
    } else {
        None
    };
    Ok((read_cifar_files(&train)?, test))
}

fn read_cifar_files(files: &[PathBuf]) -> Result<Dataset> {
    let mut pixels = Vec::new();
    let mut labels = Vec::new();
    for f in files {
        let bytes = fs::read(f).with_context(|| format!("cifar10: cannot read {}", f.display()))?;
        if bytes.is_empty() || bytes.len() % CIFAR_RECORD != 0 {
            bail!(
                "cifar10: {} holds {} bytes, not a multiple of the {CIFAR_RECORD}-byte record",
                f.display(),
                bytes.len()
            );
        }
        for rec in bytes.chunks_exact(CIFAR_RECORD) {
            if rec[0] > 9 {
                bail!(
                    "cifar10: {}: label {} is not a class 0..9",
                    f.display(),
                    rec[0]
                );
            }
            labels.push(i64::from(rec[0]));
            pixels.extend_from_slice(&rec[1..]);
        }
    }
    let n = labels.len() as i64;
    Ok(Dataset {
        images: Tensor::from_slice(&pixels).view([n, 3, 32, 32]),
        labels: Tensor::from_slice(&labels),
        num_classes: 10,
    })
}

/// Reads `root/<class>/<image>` (png, jpeg, bmp...), classes in name order, every image resized
/// to `size` × `size`.
pub fn load_image_folder(root: &Path, size: i64) -> Result<Dataset> {
    let mut classes: Vec<PathBuf> = fs::read_dir(root)
        .with_context(|| format!("folder: cannot read directory {}", root.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    classes.sort();
    if classes.is_empty() {
        bail!("folder: {} has no class directories", root.display());
    }
    let mut images = Vec::new();
    let mut labels = Vec::new();
    for (c, dir) in classes.iter().enumerate() {
        let mut files: Vec<PathBuf> = fs::read_dir(dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        files.sort();
        for f in files {
            let img = tch::vision::image::load_and_resize(&f, size, size)
                .with_context(|| format!("folder: cannot read image {}", f.display()))?;
            images.push(img);
            labels.push(c as i64);
        }
    }
    if images.is_empty() {
        bail!("folder: no images under {}", root.display());
    }
    Ok(Dataset {
        images: Tensor::stack(&images, 0),
        labels: Tensor::from_slice(&labels),
        num_classes: classes.len() as i64,
    })
}

/// SplitMix64: a small, fast generator whose sequence is the same on every rank and platform.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// A permutation of `0..n`, the same for the same seed on every rank (Fisher-Yates).
pub fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut rng = SplitMix64::new(seed);
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        p.swap(i, j);
    }
    p
}

/// Which samples each rank reads in each step of one epoch.
///
/// Every epoch shuffles the whole set with `seed + epoch` (the same permutation on every rank);
/// step `s` of the epoch takes positions `s·G .. (s+1)·G` of it (`G` the global batch), and rank
/// `r` of `N` reads the positions `≡ r (mod N)` among those. The union of a step's rank batches is
/// therefore exactly the batch one rank would read with batch `G`, which is what makes N ranks
/// equivalent to one. The last step of an epoch may be short; ranks whose share of it is empty
/// still take part in the step (with zero gradients and zero weight).
#[derive(Debug, Clone)]
pub struct DistributedSampler {
    len: usize,
    global_batch: usize,
    rank: usize,
    nranks: usize,
    seed: u64,
}

impl DistributedSampler {
    /// Sampler over `len` samples for `rank` of `nranks`.
    pub fn new(
        len: usize,
        global_batch: usize,
        rank: usize,
        nranks: usize,
        seed: u64,
    ) -> DistributedSampler {
        assert!(
            global_batch > 0 && rank < nranks,
            "sampler: global batch {global_batch}, rank {rank} of {nranks}"
        );
        DistributedSampler {
            len,
            global_batch,
            rank,
            nranks,
            seed,
        }
    }

    /// Steps in one epoch (the last may be short).
    pub fn steps_per_epoch(&self) -> usize {
        self.len.div_ceil(self.global_batch)
    }

    /// For each step of `epoch`: this rank's sample indices and the step's global batch size.
    pub fn epoch(&self, epoch: usize) -> Vec<(Vec<usize>, usize)> {
        let perm = permutation(self.len, self.seed.wrapping_add(epoch as u64));
        perm.chunks(self.global_batch)
            .map(|step| {
                let mine = step
                    .iter()
                    .skip(self.rank)
                    .step_by(self.nranks)
                    .copied()
                    .collect();
                (mine, step.len())
            })
            .collect()
    }
}

/// Writes a CIFAR-10 binary data set of 32×32 images whose class is drawn in them (a bright
/// bar whose position and colour depend on the class, on noise), so a network learns it within
/// a few epochs: `data_batch_1.bin` with `train` records and `test_batch.bin` with `test`.
pub fn write_pattern_dataset(dir: &Path, train: usize, test: usize, seed: u64) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut rng = SplitMix64::new(seed);
    for (name, n) in [("data_batch_1.bin", train), ("test_batch.bin", test)] {
        let mut out = Vec::with_capacity(n * CIFAR_RECORD);
        for _ in 0..n {
            let class = rng.below(10) as usize;
            out.push(class as u8);
            out.extend_from_slice(&pattern_image(class, &mut rng));
        }
        let path = dir.join(name);
        let mut f =
            fs::File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
        f.write_all(&out)?;
    }
    Ok(())
}

fn pattern_image(class: usize, rng: &mut SplitMix64) -> Vec<u8> {
    let mut px = vec![0u8; 3 * 32 * 32];
    for p in px.iter_mut() {
        *p = rng.below(96) as u8;
    }
    // Classes 0..4 are horizontal bars, 5..9 vertical ones, at one of five positions; the
    // colour channel also depends on the class, with a little jitter in the position.
    let vertical = class >= 5;
    let pos = (class % 5) * 6 + 2 + rng.below(2) as usize;
    let channel = class % 3;
    for a in 0..32 {
        for t in pos..pos + 3 {
            let (y, x) = if vertical { (a, t) } else { (t, a) };
            for c in 0..3 {
                let v = if c == channel { 255 } else { 160 };
                px[c * 1024 + y * 32 + x] = v;
            }
        }
    }
    px
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampler_ranks_partition_each_global_batch() {
        for nranks in [1, 2, 3, 5] {
            for len in [0, 1, 7, 64, 101] {
                let g = 12;
                let one = DistributedSampler::new(len, g, 0, 1, 9).epoch(3);
                let parts: Vec<_> = (0..nranks)
                    .map(|r| DistributedSampler::new(len, g, r, nranks, 9).epoch(3))
                    .collect();
                assert_eq!(one.len(), len.div_ceil(g));
                for (s, (whole, gb)) in one.iter().enumerate() {
                    let mut union: Vec<usize> = parts.iter().flat_map(|p| p[s].0.clone()).collect();
                    let mut want = whole.clone();
                    union.sort();
                    want.sort();
                    assert_eq!(union, want, "nranks {nranks} len {len} step {s}");
                    assert!(parts.iter().all(|p| p[s].1 == *gb));
                }
            }
        }
    }

    #[test]
    fn epochs_reshuffle_and_cover_every_sample() {
        let s = DistributedSampler::new(50, 8, 0, 1, 1);
        let e0: Vec<usize> = s.epoch(0).into_iter().flat_map(|(v, _)| v).collect();
        let e1: Vec<usize> = s.epoch(1).into_iter().flat_map(|(v, _)| v).collect();
        assert_ne!(e0, e1);
        let mut sorted = e0.clone();
        sorted.sort();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
    }

    #[test]
    fn cifar_files_round_trip_and_bad_files_are_named() {
        let dir = std::env::temp_dir().join(format!("ferroccl-resnet-data-{}", std::process::id()));
        write_pattern_dataset(&dir, 30, 10, 5).unwrap();
        let (train, test) = load_cifar(&dir).unwrap();
        assert_eq!(train.len(), 30);
        assert_eq!(test.unwrap().len(), 10);
        let (xs, ys) = train.batch(&[0, 3, 29], None);
        assert_eq!(xs.size(), vec![3, 3, 32, 32]);
        assert_eq!(ys.size(), vec![3]);
        fs::write(dir.join("data_batch_2.bin"), [1u8; 100]).unwrap();
        let err = load_cifar(&dir).unwrap_err().to_string();
        assert!(
            err.contains("data_batch_2.bin") && err.contains("100 bytes"),
            "{err}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn image_folder_reads_classes_in_name_order_and_resizes() {
        let dir =
            std::env::temp_dir().join(format!("ferroccl-resnet-folder-{}", std::process::id()));
        for (class, shade) in [("cat", 10u8), ("dog", 200u8)] {
            fs::create_dir_all(dir.join(class)).unwrap();
            for i in 0..2 {
                let img = Tensor::full([3, 20, 30], i64::from(shade), (Kind::Uint8, Device::Cpu));
                tch::vision::image::save(&img, dir.join(class).join(format!("{i}.png"))).unwrap();
            }
        }
        let ds = load_image_folder(&dir, 16).unwrap();
        assert_eq!((ds.len(), ds.num_classes), (4, 2));
        assert_eq!(ds.images.size(), vec![4, 3, 16, 16]);
        assert_eq!(Vec::<i64>::try_from(&ds.labels).unwrap(), vec![0, 0, 1, 1]);
        // "dog" (class 1) images are the bright ones.
        assert!(
            ds.images
                .get(3)
                .to_kind(Kind::Float)
                .mean(Kind::Float)
                .double_value(&[])
                > 150.0
        );
        fs::write(dir.join("dog").join("2.png"), b"not an image").unwrap();
        let err = format!("{:#}", load_image_folder(&dir, 16).unwrap_err());
        assert!(err.contains("2.png"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn holdout_split_is_disjoint_and_sized() {
        let ds = Dataset {
            images: Tensor::zeros([20, 3, 2, 2], (Kind::Uint8, Device::Cpu)),
            labels: Tensor::arange(20, (Kind::Int64, Device::Cpu)),
            num_classes: 20,
        };
        let (a, b) = ds.split_holdout(0.25, 3);
        assert_eq!((a.len(), b.len()), (15, 5));
        let mut all: Vec<i64> = Vec::<i64>::try_from(&a.labels).unwrap();
        all.extend(Vec::<i64>::try_from(&b.labels).unwrap());
        all.sort();
        assert_eq!(all, (0..20).collect::<Vec<_>>());
    }
}
