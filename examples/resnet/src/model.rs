//! ResNet-18/34/50 as a list of stages, so that backward can run stage by stage and gradient
//! buckets can leave for the allreduce while earlier stages are still differentiating.
//!
//! The layers and variable names are those of `tch::vision::resnet` (and torchvision): `conv1`,
//! `bn1`, `layer1.0.conv1`, ..., `fc`, so weights saved by either load here. Two additions:
//! a base width other than 64 (small models for tests) and the small-image stem used for 32×32
//! inputs (CIFAR): a 3×3 stride-1 `conv1` and no max-pool.

use std::fmt;

use tch::nn::{self, ModuleT};
use tch::Tensor;

/// Network depth and block type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Basic blocks, [2, 2, 2, 2].
    ResNet18,
    /// Basic blocks, [3, 4, 6, 3].
    ResNet34,
    /// Bottleneck blocks (expansion 4), [3, 4, 6, 3].
    ResNet50,
}

impl Arch {
    /// Parses `resnet18`, `resnet34` or `resnet50`.
    pub fn parse(s: &str) -> Option<Arch> {
        match s.to_ascii_lowercase().as_str() {
            "resnet18" => Some(Arch::ResNet18),
            "resnet34" => Some(Arch::ResNet34),
            "resnet50" => Some(Arch::ResNet50),
            _ => None,
        }
    }

    fn blocks(self) -> [i64; 4] {
        match self {
            Arch::ResNet18 => [2, 2, 2, 2],
            Arch::ResNet34 | Arch::ResNet50 => [3, 4, 6, 3],
        }
    }

    fn expansion(self) -> i64 {
        match self {
            Arch::ResNet50 => 4,
            _ => 1,
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Arch::ResNet18 => "resnet18",
            Arch::ResNet34 => "resnet34",
            Arch::ResNet50 => "resnet50",
        })
    }
}

/// What network to build.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelConfig {
    /// Depth and block type.
    pub arch: Arch,
    /// Output classes.
    pub num_classes: i64,
    /// Channels of the first stage (64 in the papers); stages double it.
    pub width: i64,
    /// The 3×3 stride-1 stem without max-pool, for inputs of 64×64 or less.
    pub small_stem: bool,
}

impl ModelConfig {
    /// The standard network for `image_size`: the small stem below 64×64 pixels and up to it.
    pub fn for_images(arch: Arch, num_classes: i64, width: i64, image_size: i64) -> ModelConfig {
        ModelConfig {
            arch,
            num_classes,
            width,
            small_stem: image_size <= 64,
        }
    }
}

/// A ResNet split into stages: stem, `layer1` .. `layer4`, head (pool and `fc`).
pub struct ResNet {
    stages: Vec<nn::FuncT<'static>>,
}

impl fmt::Debug for ResNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ResNet({} stages)", self.stages.len())
    }
}

/// Variable-name prefixes of each stage, in forward order.
pub const STAGE_PREFIXES: [&[&str]; 6] = [
    &["conv1.", "bn1."],
    &["layer1."],
    &["layer2."],
    &["layer3."],
    &["layer4."],
    &["fc."],
];

/// The stage a variable called `name` belongs to.
pub fn stage_of(name: &str) -> Option<usize> {
    STAGE_PREFIXES
        .iter()
        .position(|prefixes| prefixes.iter().any(|p| name.starts_with(p)))
}

fn conv(p: nn::Path, c_in: i64, c_out: i64, ksize: i64, padding: i64, stride: i64) -> nn::Conv2D {
    let cfg = nn::ConvConfig {
        stride,
        padding,
        bias: false,
        ..Default::default()
    };
    nn::conv2d(p, c_in, c_out, ksize, cfg)
}

fn bn(p: nn::Path, c: i64) -> nn::BatchNorm {
    nn::batch_norm2d(p, c, Default::default())
}

fn downsample(p: nn::Path, c_in: i64, c_out: i64, stride: i64) -> nn::SequentialT {
    if stride != 1 || c_in != c_out {
        nn::seq_t()
            .add(conv(&p / "0", c_in, c_out, 1, 0, stride))
            .add(bn(&p / "1", c_out))
    } else {
        nn::seq_t()
    }
}

fn basic_block(p: nn::Path, c_in: i64, c_out: i64, stride: i64) -> nn::FuncT<'static> {
    let conv1 = conv(&p / "conv1", c_in, c_out, 3, 1, stride);
    let bn1 = bn(&p / "bn1", c_out);
    let conv2 = conv(&p / "conv2", c_out, c_out, 3, 1, 1);
    let bn2 = bn(&p / "bn2", c_out);
    let down = downsample(&p / "downsample", c_in, c_out, stride);
    nn::func_t(move |xs, train| {
        let mut ys = xs.apply(&conv1).apply_t(&bn1, train);
        let _ = ys.relu_();
        let mut ys = ys.apply(&conv2).apply_t(&bn2, train);
        ys += xs.apply_t(&down, train);
        let _ = ys.relu_();
        ys
    })
}

fn bottleneck_block(p: nn::Path, c_in: i64, c_mid: i64, stride: i64) -> nn::FuncT<'static> {
    let c_out = 4 * c_mid;
    let conv1 = conv(&p / "conv1", c_in, c_mid, 1, 0, 1);
    let bn1 = bn(&p / "bn1", c_mid);
    let conv2 = conv(&p / "conv2", c_mid, c_mid, 3, 1, stride);
    let bn2 = bn(&p / "bn2", c_mid);
    let conv3 = conv(&p / "conv3", c_mid, c_out, 1, 0, 1);
    let bn3 = bn(&p / "bn3", c_out);
    let down = downsample(&p / "downsample", c_in, c_out, stride);
    nn::func_t(move |xs, train| {
        let mut ys = xs.apply(&conv1).apply_t(&bn1, train);
        let _ = ys.relu_();
        let mut ys = ys.apply(&conv2).apply_t(&bn2, train);
        let _ = ys.relu_();
        let mut ys = ys.apply(&conv3).apply_t(&bn3, train);
        ys += xs.apply_t(&down, train);
        let _ = ys.relu_();
        ys
    })
}

fn layer(
    p: nn::Path,
    arch: Arch,
    c_in: i64,
    c_mid: i64,
    stride: i64,
    n: i64,
) -> nn::FuncT<'static> {
    let e = arch.expansion();
    let mut blocks = nn::seq_t();
    for i in 0..n {
        let (cin, s) = if i == 0 {
            (c_in, stride)
        } else {
            (c_mid * e, 1)
        };
        let bp = &p / i.to_string();
        blocks = if e == 1 {
            blocks.add(basic_block(bp, cin, c_mid, s))
        } else {
            blocks.add(bottleneck_block(bp, cin, c_mid, s))
        };
    }
    nn::func_t(move |xs, train| xs.apply_t(&blocks, train))
}

impl ResNet {
    /// Creates the variables under `p` (normally the var store's root).
    pub fn new(p: &nn::Path, cfg: ModelConfig) -> ResNet {
        let w = cfg.width;
        let e = cfg.arch.expansion();
        let blocks = cfg.arch.blocks();
        let small = cfg.small_stem;
        let conv1 = if small {
            conv(p / "conv1", 3, w, 3, 1, 1)
        } else {
            conv(p / "conv1", 3, w, 7, 3, 2)
        };
        let bn1 = bn(p / "bn1", w);
        let stem = nn::func_t(move |xs, train| {
            let mut ys = xs.apply(&conv1).apply_t(&bn1, train);
            let _ = ys.relu_();
            if small {
                ys
            } else {
                ys.max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false)
            }
        });
        let mut stages = vec![stem];
        let mut c_in = w;
        for (i, &n) in blocks.iter().enumerate() {
            let c_mid = w << i;
            let stride = if i == 0 { 1 } else { 2 };
            stages.push(layer(
                p / format!("layer{}", i + 1),
                cfg.arch,
                c_in,
                c_mid,
                stride,
                n,
            ));
            c_in = c_mid * e;
        }
        let fc = nn::linear(p / "fc", c_in, cfg.num_classes, Default::default());
        stages.push(nn::func_t(move |xs, _train| {
            xs.adaptive_avg_pool2d([1, 1]).flat_view().apply(&fc)
        }));
        ResNet { stages }
    }

    /// Number of stages (6).
    pub fn num_stages(&self) -> usize {
        self.stages.len()
    }

    /// Runs stage `i`. `train` selects batch statistics (and updates the running ones) in the
    /// batch-norm layers.
    pub fn stage(&self, i: usize, xs: &Tensor, train: bool) -> Tensor {
        self.stages[i].forward_t(xs, train)
    }

    /// The whole network, one autograd graph.
    pub fn forward(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut ys = xs.shallow_clone();
        for s in &self.stages {
            ys = s.forward_t(&ys, train);
        }
        ys
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn every_variable_belongs_to_a_stage_and_shapes_match_the_papers() {
        let vs = nn::VarStore::new(Device::Cpu);
        let cfg = ModelConfig::for_images(Arch::ResNet18, 10, 64, 224);
        let net = ResNet::new(&vs.root(), cfg);
        let vars = vs.variables();
        for name in vars.keys() {
            assert!(stage_of(name).is_some(), "{name} has no stage");
        }
        // torchvision's resnet18 with 10 classes has 11,181,642 parameters.
        let trainable: i64 = vs
            .trainable_variables()
            .iter()
            .map(|t| t.numel() as i64)
            .sum();
        assert_eq!(trainable, 11_181_642);
        let out = net.forward(
            &Tensor::zeros([2, 3, 64, 64], (Kind::Float, Device::Cpu)),
            false,
        );
        assert_eq!(out.size(), vec![2, 10]);
    }

    #[test]
    fn resnet50_and_small_stem_produce_logits() {
        let vs = nn::VarStore::new(Device::Cpu);
        let cfg = ModelConfig::for_images(Arch::ResNet50, 7, 8, 32);
        let net = ResNet::new(&vs.root(), cfg);
        assert_eq!(net.num_stages(), 6);
        let out = net.forward(
            &Tensor::zeros([3, 3, 32, 32], (Kind::Float, Device::Cpu)),
            true,
        );
        assert_eq!(out.size(), vec![3, 7]);
        assert!(vs.variables().contains_key("layer3.5.conv3.weight"));
    }

    #[test]
    fn arch_names_round_trip() {
        for a in [Arch::ResNet18, Arch::ResNet34, Arch::ResNet50] {
            assert_eq!(Arch::parse(&a.to_string()), Some(a));
        }
        assert_eq!(Arch::parse("resnet19"), None);
    }
}
