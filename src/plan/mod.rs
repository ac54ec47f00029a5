//! The tuner: an alpha-beta cost model per (algorithm, link) that picks, for every call, the
//! cheapest algorithm and slice for its size, rank count and topology. Pure code: no I/O, no
//! environment reading, no clock. The caller logs [`Choice`] (its `Display`) at debug level.
//!
//! A message of `b` bytes over a link costs `alpha + b / beta`; an algorithm's cost is the sum
//! over its steps on the slowest link each step uses (see [`CostModel::cost`] and
//! docs/ALGORITHMS.md for every formula). Where the algorithms were timed on the machine
//! (`FERRO_TUNE=measure`), each formula is scaled by its measured [`Correction`].
//!
//! ```
//! use ferroccl::coll::{Algorithm, CollKind, Topology};
//! use ferroccl::plan::{CostModel, Overrides};
//!
//! let model = CostModel::default();
//! let topo = Topology::uniform(64, 8);
//! let small = model.choose(CollKind::AllReduce, 1024, &topo, &Overrides::default());
//! let large = model.choose(CollKind::AllReduce, 256 << 20, &topo, &Overrides::default());
//! assert_ne!(small.algo, Algorithm::Ring);
//! assert!(matches!(large.algo, Algorithm::Hierarchical | Algorithm::Rabenseifner));
//! ```
#![forbid(unsafe_code)]

mod rules;

use std::fmt;

pub use rules::{Overrides, Rule};

use crate::coll::{Algorithm, CollKind, Topology};

pub use ferroccl_transport::Link;

/// Latency and bandwidth of one link kind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkCost {
    /// Per-message latency in microseconds.
    pub alpha_us: f64,
    /// Bandwidth in GB/s (10^9 bytes per second) of one flow.
    pub beta_gbps: f64,
}

impl LinkCost {
    /// Microseconds to move `bytes` in one message.
    pub fn time_us(&self, bytes: f64) -> f64 {
        self.alpha_us + bytes / (self.beta_gbps * 1e3)
    }
}

/// The default link table. Shared memory: two copies through a ring (~1 µs, ~10 GB/s per
/// flow on a current server). TCP: 10 GbE (~25 µs through the kernel, 1.25 GB/s). RDMA:
/// 100 Gb/s InfiniBand or RoCE (~3 µs, 12 GB/s). NVLink: ~2 µs, 100 GB/s per direction.
pub const DEFAULT_LINKS: [LinkCost; 4] = [
    LinkCost {
        alpha_us: 1.0,
        beta_gbps: 10.0,
    },
    LinkCost {
        alpha_us: 25.0,
        beta_gbps: 1.25,
    },
    LinkCost {
        alpha_us: 3.0,
        beta_gbps: 12.0,
    },
    LinkCost {
        alpha_us: 2.0,
        beta_gbps: 100.0,
    },
];

/// Slices the tuner tries, in bytes (those above [`CostModel::max_slice`] are skipped).
pub const SLICE_CANDIDATES: [usize; 5] = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20];

/// The default [`CostModel::max_slice`], the default of `FERRO_SLICE_BYTES`: 4 MiB.
pub const DEFAULT_MAX_SLICE: usize = 4 << 20;

/// The cost model: a link table, which link joins ranks of one host and of different hosts,
/// and the NIC every host's inter-host traffic shares.
#[derive(Debug, Clone, PartialEq)]
pub struct CostModel {
    /// `links[Link::index]`: see [`DEFAULT_LINKS`].
    pub links: [LinkCost; 4],
    /// Link between ranks of one host. Default shm.
    pub intra: Link,
    /// Link between hosts. Default tcp.
    pub inter: Link,
    /// Bandwidth of a host's NIC in GB/s, shared by the host's ranks that talk across hosts at
    /// the same time; `None`: the inter link's bandwidth.
    pub nic_gbps: Option<f64>,
    /// Measured corrections of the formulas (`FERRO_TUNE=measure` times the algorithms at a
    /// few sizes): empty by default. See [`Correction`].
    pub corrections: Vec<Correction>,
    /// Largest message an algorithm may send in one step (`FERRO_SLICE_BYTES`), in bytes: the
    /// tuner picks each call's slice from the [`SLICE_CANDIDATES`] up to this and this itself.
    /// Algorithms that pipeline (tree, chain) gain from smaller ones; the others cost least
    /// with the largest. Default [`DEFAULT_MAX_SLICE`].
    pub max_slice: usize,
}

/// How far the formula of one (collective, algorithm) was off on this machine: at each
/// measured size, measured time / predicted time. Between measured sizes the factor is
/// interpolated on logarithmic scales, beyond them the nearest measured factor holds (and
/// above the largest, [`CostModel::corrected_cost`] adds a linear floor).
#[derive(Debug, Clone, PartialEq)]
pub struct Correction {
    /// The collective, as [`CollKind::name`] (`all_reduce`).
    pub collective: &'static str,
    /// The algorithm.
    pub algo: Algorithm,
    /// (bytes, measured / predicted), sorted by bytes, factors finite and positive.
    pub points: Vec<(usize, f64)>,
}

impl Correction {
    /// The factor at `bytes`.
    pub fn factor(&self, bytes: usize) -> f64 {
        let pts = &self.points;
        let (Some(first), Some(last)) = (pts.first(), pts.last()) else {
            return 1.0;
        };
        if bytes <= first.0 {
            return first.1;
        }
        if bytes >= last.0 {
            return last.1;
        }
        let i = pts.partition_point(|p| p.0 <= bytes);
        let (lo, hi) = (pts[i - 1], pts[i]);
        let x =
            ((bytes as f64).ln() - (lo.0 as f64).ln()) / ((hi.0 as f64).ln() - (lo.0 as f64).ln());
        (lo.1.ln() + x * (hi.1.ln() - lo.1.ln())).exp()
    }
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            links: DEFAULT_LINKS,
            intra: Link::Shm,
            inter: Link::Tcp,
            nic_gbps: None,
            corrections: Vec::new(),
            max_slice: DEFAULT_MAX_SLICE,
        }
    }
}

/// What the tuner picked for one call.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// The algorithm.
    pub algo: Algorithm,
    /// Largest message, in bytes (divide by the element size for [`AlgoOptions::slice`]).
    ///
    /// [`AlgoOptions::slice`]: crate::coll::AlgoOptions::slice
    pub slice_bytes: usize,
    /// Predicted time in microseconds.
    pub predicted_us: f64,
    /// Why: `model`, `FERRO_ALGO` or the rule that matched.
    pub reason: String,
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "algo={} slice={}B predicted={:.1}us ({})",
            self.algo, self.slice_bytes, self.predicted_us, self.reason
        )
    }
}

/// Shape of the ranks: hosts, ranks per host (largest host), total.
#[derive(Debug, Clone, Copy)]
struct Shape {
    n: f64,
    hosts: f64,
    per_host: f64,
    uniform: bool,
}

impl Shape {
    fn of(topo: &Topology) -> Shape {
        let hosts = topo.hosts();
        Shape {
            n: topo.nranks() as f64,
            hosts: hosts.len() as f64,
            per_host: hosts.iter().map(Vec::len).max().unwrap_or(1) as f64,
            uniform: topo.is_uniform(),
        }
    }
}

/// `16K`, `1M`, `3000`: powers of 1024 where they divide.
fn size_label(bytes: usize) -> String {
    for (unit, shift) in [("G", 30), ("M", 20), ("K", 10)] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

fn log2_ceil(x: f64) -> f64 {
    if x <= 1.0 {
        0.0
    } else {
        x.log2().ceil()
    }
}

impl CostModel {
    /// The cost of `link`.
    pub fn link(&self, link: Link) -> LinkCost {
        self.links[link.index()]
    }

    /// Replaces the constants of `link` by measured ones (for `FERRO_TUNE=measure`: the
    /// communicator times a small and a large message per transport at init and calls this).
    /// Non-finite or non-positive values are refused with an error naming them.
    pub fn calibrate(
        &mut self,
        link: Link,
        latency_us: f64,
        bandwidth_gbps: f64,
    ) -> Result<(), String> {
        if !(latency_us.is_finite() && latency_us >= 0.0) {
            return Err(format!(
                "calibrate {}: bad latency {latency_us} us",
                link.name()
            ));
        }
        if !(bandwidth_gbps.is_finite() && bandwidth_gbps > 0.0) {
            return Err(format!(
                "calibrate {}: bad bandwidth {bandwidth_gbps} GB/s",
                link.name()
            ));
        }
        self.links[link.index()] = LinkCost {
            alpha_us: latency_us,
            beta_gbps: bandwidth_gbps,
        };
        Ok(())
    }

    /// The cost of a step crossing hosts with `sharers` ranks of a host on the NIC at once.
    fn inter_cost(&self, sharers: f64) -> LinkCost {
        let l = self.link(self.inter);
        let nic = self.nic_gbps.unwrap_or(l.beta_gbps);
        LinkCost {
            alpha_us: l.alpha_us,
            beta_gbps: l.beta_gbps.min(nic / sharers.max(1.0)),
        }
    }

    /// The slowest link a step of a flat algorithm (one flow per host across) uses.
    fn flat_link(&self, s: Shape) -> LinkCost {
        let intra = self.link(self.intra);
        if s.hosts <= 1.0 {
            return intra;
        }
        let inter = self.inter_cost(1.0);
        LinkCost {
            alpha_us: intra.alpha_us.max(inter.alpha_us),
            beta_gbps: intra.beta_gbps.min(inter.beta_gbps),
        }
    }

    /// Predicted microseconds of `algo` for `kind` on `topo`, with `bytes` = count x element
    /// size (NCCL's count: per rank block for all_gather / reduce_scatter / all_to_all) and
    /// messages of at most `slice_bytes`. `f64::INFINITY` where `algo` cannot run the call.
    pub fn cost(
        &self,
        algo: Algorithm,
        kind: CollKind,
        bytes: usize,
        topo: &Topology,
        slice_bytes: usize,
    ) -> f64 {
        let s = Shape::of(topo);
        if !algo.supports(kind) {
            return f64::INFINITY;
        }
        if s.n <= 1.0 || bytes == 0 {
            return 0.0;
        }
        let (n, h, k) = (s.n, s.hosts, s.per_host);
        let b = bytes as f64;
        let slice = slice_bytes.max(1) as f64;
        let flat = self.flat_link(s);
        let intra = self.link(self.intra);
        // Steps of `len` bytes each, `len` cut into rounds of `per_round` bytes.
        let rounds = |len: f64, per_round: f64| (len / per_round).ceil().max(1.0);
        match (algo, kind) {
            (Algorithm::Ring, CollKind::AllReduce) => {
                let r = rounds(b, slice * n);
                2.0 * (n - 1.0) * (r * flat.alpha_us + b / n / (flat.beta_gbps * 1e3))
            }
            (Algorithm::Ring, _) => {
                let r = rounds(b, slice);
                (n - 1.0) * (r * flat.alpha_us + b / (flat.beta_gbps * 1e3))
            }
            (Algorithm::Chain, _) => {
                let m = rounds(b, slice);
                (m + n - 2.0) * flat.time_us(b / m)
            }
            (Algorithm::Pairwise, _) => {
                let r = rounds(b, slice);
                (n - 1.0) * (r * flat.alpha_us + b / (flat.beta_gbps * 1e3))
            }
            (Algorithm::Binomial, _) => {
                let r = rounds(b, slice);
                log2_ceil(n) * r * flat.time_us(b / r)
            }
            (Algorithm::RecursiveDoubling, _) => {
                let p = 2f64.powf(n.log2().floor());
                let steps = p.log2() + if p < n { 2.0 } else { 0.0 };
                let r = rounds(b, slice);
                // A host's ranks all cross the NIC at once in the steps across hosts.
                let across = if h > 1.0 { self.inter_cost(k) } else { intra };
                let link = LinkCost {
                    alpha_us: flat.alpha_us,
                    beta_gbps: flat.beta_gbps.min(across.beta_gbps),
                };
                steps * r * link.time_us(b / r)
            }
            (Algorithm::Rabenseifner, _) => {
                let p = 2f64.powf(n.log2().floor());
                let log = p.log2().round() as i32;
                // Halving step j moves S / 2^(j+1) with the partner at distance 2^j in the
                // host-by-host numbering: distances below K stay inside the host, the others
                // cross with all K ranks of the host on the NIC at once. Folding (n not a
                // power of two) adds a full-vector message before and after.
                let across = if h > 1.0 { self.inter_cost(k) } else { intra };
                let far = LinkCost {
                    alpha_us: flat.alpha_us,
                    beta_gbps: flat.beta_gbps.min(across.beta_gbps),
                };
                let folded = p < n;
                let mut t = 0.0;
                for j in 0..log {
                    let dist = 2f64.powi(j);
                    // Equal hosts of a power of two ranks, no folding: partners at distances
                    // below K share a host (the algorithm numbers ranks host by host).
                    let aligned = s.uniform && !folded && k.log2().fract() == 0.0;
                    let link = if h > 1.0 && (!aligned || dist >= k) {
                        far
                    } else {
                        intra
                    };
                    let len = b / 2f64.powi(j + 1);
                    t += 2.0 * (rounds(len, slice) * link.alpha_us + len / (link.beta_gbps * 1e3));
                }
                if folded {
                    t += 2.0 * (rounds(b, slice) * far.alpha_us + b / (far.beta_gbps * 1e3));
                }
                t
            }
            (Algorithm::Tree, _) => {
                // Each half goes up and down its tree in chunks; the pipeline is as deep as
                // the tree (host levels plus the chain) and a host's NIC moves every byte
                // once up and once down.
                let depth = log2_ceil(h + 1.0) + k - 1.0;
                let m = rounds(b / 2.0, slice);
                let chunk = b / 2.0 / m;
                let up_down = 2.0 * (depth + 2.0 * m - 1.0);
                let inter = if h > 1.0 { self.inter_cost(2.0) } else { intra };
                let link = LinkCost {
                    alpha_us: flat.alpha_us,
                    beta_gbps: intra.beta_gbps.min(inter.beta_gbps),
                };
                up_down * link.time_us(chunk)
            }
            (Algorithm::Hierarchical, CollKind::AllReduce) => {
                let across = self.inter_cost(k);
                let r = rounds(b, slice * k);
                let local =
                    2.0 * (k - 1.0) * (r * intra.alpha_us + b / k / (intra.beta_gbps * 1e3));
                let part = b / k;
                let net = if h > 1.0 {
                    2.0 * (h - 1.0) * (r * across.alpha_us + part / h / (across.beta_gbps * 1e3))
                } else {
                    0.0
                };
                local + net
            }
            (Algorithm::Hierarchical, CollKind::AllGather | CollKind::ReduceScatter) => {
                if !s.uniform {
                    return f64::INFINITY;
                }
                let across = self.inter_cost(k);
                let r = rounds(b, slice);
                let net = (h - 1.0) * (r * across.alpha_us + b / (across.beta_gbps * 1e3));
                let local = (k - 1.0) * (r * intra.alpha_us + h * b / (intra.beta_gbps * 1e3));
                net + local
            }
            (Algorithm::Hierarchical, _) => {
                let m = rounds(b, slice);
                (m + n - 2.0) * flat.time_us(b / m)
            }
        }
    }

    /// The measured factor of `algo` on `kind` at `bytes` (1 where nothing was measured).
    pub fn correction(&self, algo: Algorithm, kind: CollKind, bytes: usize) -> f64 {
        self.correction_of(algo, kind)
            .map_or(1.0, |c| c.factor(bytes))
    }

    /// What was measured for `algo` on `kind`, if anything.
    fn correction_of(&self, algo: Algorithm, kind: CollKind) -> Option<&Correction> {
        self.corrections
            .iter()
            .find(|c| c.algo == algo && c.collective == kind.name())
    }

    /// The time [`CostModel::choose`] compares: the formula's with its cheapest slice, times
    /// the measured correction, and that slice. Beyond the largest size measured for the
    /// algorithm (`P`, where it took `T`), when `P` is at least [`CostModel::max_slice`] (from
    /// there on every formula grows with the number of rounds, about linearly), the time is at
    /// least `T x bytes / P`: no algorithm is assumed to gain per byte on what was measured,
    /// since a formula whose slices grow with the message (the tree's pipeline) could
    /// otherwise overtake one that was measured faster at `P`.
    pub fn corrected_cost(
        &self,
        algo: Algorithm,
        kind: CollKind,
        bytes: usize,
        topo: &Topology,
    ) -> (f64, usize) {
        let (t, slice) = self.best_slice(algo, kind, bytes, topo);
        let Some(c) = self.correction_of(algo, kind) else {
            return (t, slice);
        };
        let corrected = t * c.factor(bytes);
        match c.points.last() {
            Some(&(p, f)) if bytes > p && p >= self.max_slice.max(1) => {
                let measured = self.best_slice(algo, kind, p, topo).0 * f;
                let linear = measured * (bytes as f64 / p as f64);
                (
                    if linear.is_finite() {
                        corrected.max(linear)
                    } else {
                        corrected
                    },
                    slice,
                )
            }
            _ => (corrected, slice),
        }
    }

    /// Records that `algo` on `kind` took `factor` times its formula's time at `bytes` (the
    /// formula's cheapest slice, as [`CostModel::choose`] compares). Replaces an earlier point
    /// at the same size. A non-finite or non-positive factor is refused with an error naming
    /// it.
    pub fn correct(
        &mut self,
        kind: CollKind,
        algo: Algorithm,
        bytes: usize,
        factor: f64,
    ) -> Result<(), String> {
        if !(factor.is_finite() && factor > 0.0) {
            return Err(format!(
                "correct {} {algo} at {bytes} B: bad factor {factor}",
                kind.name()
            ));
        }
        let collective = kind.name();
        let i = match self
            .corrections
            .iter()
            .position(|c| c.algo == algo && c.collective == collective)
        {
            Some(i) => i,
            None => {
                self.corrections.push(Correction {
                    collective,
                    algo,
                    points: Vec::new(),
                });
                self.corrections.len() - 1
            }
        };
        let pts = &mut self.corrections[i].points;
        pts.retain(|p| p.0 != bytes);
        let at = pts.partition_point(|p| p.0 < bytes);
        pts.insert(at, (bytes, factor));
        Ok(())
    }

    /// The formula's time of `algo` with its cheapest slice (no correction), and that slice:
    /// one of the [`SLICE_CANDIDATES`] below [`CostModel::max_slice`], or the cap itself; the
    /// larger slice where two cost the same.
    pub fn best_slice(
        &self,
        algo: Algorithm,
        kind: CollKind,
        bytes: usize,
        topo: &Topology,
    ) -> (f64, usize) {
        let cap = self.max_slice.max(1);
        let mut best = (self.cost(algo, kind, bytes, topo, cap), cap);
        for slice in SLICE_CANDIDATES.into_iter().rev().filter(|&s| s < cap) {
            let t = self.cost(algo, kind, bytes, topo, slice);
            if t < best.0 {
                best = (t, slice);
            }
        }
        best
    }

    /// What the model picks for `kind` from `from` bytes up to `to` at every power of two,
    /// written as rules for `FERRO_ALGO` (`allreduce=rd:0-16K;hier:16K-max`), so that a
    /// measured tuning can be pinned.
    pub fn as_rules(&self, kind: CollKind, topo: &Topology, from: usize, to: usize) -> String {
        let mut ranges: Vec<(Algorithm, usize)> = Vec::new();
        let mut bytes = from.max(1).next_power_of_two();
        while bytes <= to.max(1) {
            let algo = self.choose(kind, bytes, topo, &Overrides::default()).algo;
            if ranges.last().is_none_or(|r| r.0 != algo) {
                ranges.push((algo, bytes));
            }
            match bytes.checked_mul(2) {
                Some(b) => bytes = b,
                None => break,
            }
        }
        let mut out = format!("{}=", kind.name().replace('_', ""));
        for (i, &(algo, lo)) in ranges.iter().enumerate() {
            let lo = if i == 0 { 0 } else { lo };
            let hi = ranges
                .get(i + 1)
                .map_or("max".to_string(), |r| size_label(r.1));
            if i > 0 {
                out.push(';');
            }
            out.push_str(&format!("{algo}:{}-{hi}", size_label(lo)));
        }
        out
    }

    /// The cheapest (algorithm, slice) for `kind` with `bytes` (count x element size) on
    /// `topo`, unless `overrides` force one: `FERRO_ALGO` first (where the algorithm
    /// implements `kind`), then the first rule for `kind` whose size range holds `bytes`.
    /// Forced algorithms still get the cheapest slice.
    pub fn choose(
        &self,
        kind: CollKind,
        bytes: usize,
        topo: &Topology,
        overrides: &Overrides,
    ) -> Choice {
        let forced = overrides.forced(kind, bytes);
        let candidates: Vec<Algorithm> = match &forced {
            Some((algo, _)) => vec![*algo],
            None => Algorithm::ALL
                .into_iter()
                .filter(|a| a.supports(kind))
                .collect(),
        };
        let mut best: Option<Choice> = None;
        for algo in candidates {
            let (t, slice) = self.corrected_cost(algo, kind, bytes, topo);
            if best.as_ref().is_none_or(|b| t < b.predicted_us) {
                best = Some(Choice {
                    algo,
                    slice_bytes: slice,
                    predicted_us: t,
                    reason: String::new(),
                });
            }
        }
        let fallback = Algorithm::default_for(kind);
        let mut choice = best.unwrap_or(Choice {
            algo: fallback,
            slice_bytes: self.max_slice.max(1),
            predicted_us: f64::INFINITY,
            reason: String::new(),
        });
        if !choice.predicted_us.is_finite() {
            // Nothing the model can run (e.g. a forced hierarchical all_gather on uneven
            // hosts): the default algorithm always can.
            choice.algo = fallback;
            choice.reason = format!("{} cannot run here, default", choice.algo);
            choice.predicted_us = self.cost(fallback, kind, bytes, topo, choice.slice_bytes);
            return choice;
        }
        choice.reason = match forced {
            Some((_, why)) => why,
            None => "cost model".to_string(),
        };
        choice
    }
}

#[cfg(test)]
mod tests;
