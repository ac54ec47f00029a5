//! How the engine picks each call's algorithm and schedule: the cost model (calibrated or
//! not), `FERRO_ALGO`, and the plan cache.

use std::sync::Arc;

use crate::coll::{self, AlgoOptions, CollArgs, Schedule};

use super::Engine;

/// Largest allreduce, in bytes, whose algorithm the uncalibrated cost model picks.
const AUTO_TUNED_MAX: usize = 8 << 10;

/// How the engine picks algorithms: the cost model, the ranks' hosts and `FERRO_ALGO`.
#[derive(Debug, Clone)]
pub(crate) struct Tuning {
    pub model: crate::plan::CostModel,
    pub topo: coll::Topology,
    pub overrides: crate::plan::Overrides,
    /// Log every choice (rank 0, `FERRO_DEBUG=DEBUG`).
    pub debug: bool,
    /// Whether the model's links were measured on this machine (`FERRO_TUNE=measure`); only
    /// then does it pick the algorithm of every call.
    pub calibrated: bool,
    /// An algorithm every call runs while `FERRO_TUNE=measure` times it (where it applies).
    pub probe: Option<coll::Algorithm>,
}

impl Engine {
    /// Replaces the cost model's constants of `link` by measured ones.
    pub(crate) fn calibrate(
        &mut self,
        link: crate::plan::Link,
        latency_us: f64,
        bandwidth_gbps: f64,
    ) -> std::result::Result<(), String> {
        self.tuning
            .model
            .calibrate(link, latency_us, bandwidth_gbps)
    }

    /// From now on the cost model picks every call's algorithm; plans made before are dropped.
    pub(crate) fn set_calibrated(&mut self) {
        self.tuning.calibrated = true;
        self.plans.clear();
    }

    /// Runs every later call with `algo` where it implements the call (None: the tuner
    /// again); plans made before are dropped.
    pub(crate) fn set_probe(&mut self, algo: Option<coll::Algorithm>) {
        self.tuning.probe = algo;
        self.plans.clear();
    }

    /// The tuner's cost model and topology.
    pub(crate) fn model(&self) -> (&crate::plan::CostModel, &coll::Topology) {
        (&self.tuning.model, &self.tuning.topo)
    }

    /// Records a measured correction of the cost model (see [`crate::plan::CostModel::correct`]).
    pub(crate) fn correct(
        &mut self,
        kind: coll::CollKind,
        algo: coll::Algorithm,
        bytes: usize,
        factor: f64,
    ) -> std::result::Result<(), String> {
        self.tuning.model.correct(kind, algo, bytes, factor)
    }

    /// The cost model, if it was calibrated.
    pub(crate) fn calibrated_model(&self) -> Option<&crate::plan::CostModel> {
        self.tuning.calibrated.then_some(&self.tuning.model)
    }

    /// Takes `parent`'s measured link costs, if it has any (a split communicator), and its
    /// measured algorithm corrections where the split has the same hosts and ranks (they were
    /// timed on that layout).
    pub(crate) fn inherit_calibration(&mut self, parent: &Engine) {
        if parent.tuning.calibrated {
            self.tuning.model.links = parent.tuning.model.links;
            if parent.tuning.topo == self.tuning.topo {
                self.tuning.model.corrections = parent.tuning.model.corrections.clone();
            }
            self.set_calibrated();
        }
    }

    /// What the tuner picks for `args` with elements of `esize` bytes (before checking that
    /// the algorithm can run the call on this topology).
    pub(super) fn choice(&self, args: &CollArgs, esize: usize) -> crate::plan::Choice {
        let t = &self.tuning;
        let bytes = args.count * esize;
        if let Some(algo) = t.probe.filter(|a| a.supports(args.kind)) {
            // The slice the tuner would give the algorithm, so that the timing measures what
            // the calls it corrects will run.
            return crate::plan::Choice {
                algo,
                slice_bytes: t.model.best_slice(algo, args.kind, bytes, &t.topo).1,
                predicted_us: f64::NAN,
                reason: "FERRO_TUNE=measure timing".to_string(),
            };
        }
        if t.overrides == crate::plan::Overrides::default()
            && !t.calibrated
            && !(matches!(args.kind, coll::CollKind::AllReduce) && bytes <= AUTO_TUNED_MAX)
        {
            // Until the cost model is calibrated on the machine (FERRO_TUNE=measure), it
            // chooses only small allreduces, where its pick was measured to win; elsewhere
            // the default algorithm (ring, chain, pairwise) measured best over TCP and shm.
            crate::plan::Choice {
                algo: coll::Algorithm::default_for(args.kind),
                slice_bytes: self.slice_bytes,
                predicted_us: f64::NAN,
                reason: "default".to_string(),
            }
        } else {
            t.model.choose(args.kind, bytes, &t.topo, &t.overrides)
        }
    }

    /// The algorithm a call of `args` with elements of `esize` bytes runs.
    pub(crate) fn algorithm_for(&self, args: &CollArgs, esize: usize) -> coll::Algorithm {
        let choice = self.choice(args, esize);
        let opts = self.options(&choice, esize);
        let t = &self.tuning;
        match coll::build_with(args, self.rank, self.nranks, &opts, choice.algo, &t.topo) {
            Ok(_) => choice.algo,
            Err(_) => coll::Algorithm::default_for(args.kind),
        }
    }

    /// What a call of `args` with `esize`-byte elements runs, by name: `lane` for an allreduce
    /// that takes the small-message lane, else [`Engine::algorithm_for`]'s name.
    pub(crate) fn route_for(&self, args: &CollArgs, esize: usize) -> &'static str {
        if self.lane_fits(args, esize, false) {
            "lane"
        } else {
            self.algorithm_for(args, esize).name()
        }
    }

    /// The schedule options of `choice` with elements of `esize` bytes: its slice, never more
    /// than `FERRO_SLICE_BYTES`.
    pub(super) fn options(&self, choice: &crate::plan::Choice, esize: usize) -> AlgoOptions {
        let bytes = choice.slice_bytes.min(self.slice_bytes);
        AlgoOptions {
            slice: (bytes / esize.max(1)).max(1),
        }
    }

    /// The cached schedule for `args` and element size `esize`, with the algorithm the tuner
    /// picks for the call's size (or `FERRO_ALGO` forces).
    pub(super) fn plan(&mut self, args: &CollArgs, esize: usize) -> Arc<Schedule> {
        let key = (*args, esize);
        if let Some(s) = self.plans.get(&key) {
            return Arc::clone(s);
        }
        let choice = self.choice(args, esize);
        let opts = self.options(&choice, esize);
        let t = &self.tuning;
        let built = coll::build_with(args, self.rank, self.nranks, &opts, choice.algo, &t.topo);
        let s = match built {
            Ok(s) => {
                if t.debug && self.rank == 0 {
                    ferroccl_transport::log_line!(
                        "ferroccl rank 0 TUNING: {} count {} ({} bytes): {choice}",
                        args.kind.name(),
                        args.count,
                        args.count * esize
                    );
                }
                s
            }
            Err(why) => {
                if t.debug && self.rank == 0 {
                    ferroccl_transport::log_line!(
                        "ferroccl rank 0 TUNING: {} count {}: {} cannot run ({why}); default algorithm",
                        args.kind.name(),
                        args.count,
                        choice.algo
                    );
                }
                coll::build(args, self.rank, self.nranks, &opts)
            }
        };
        let s = Arc::new(s);
        if self.plans.len() > 4096 {
            self.plans.clear();
        }
        self.plans.insert(key, Arc::clone(&s));
        s
    }
}
