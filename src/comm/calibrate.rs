//! `FERRO_TUNE=measure`: a quick calibration of the cost model at init.
//!
//! For each kind of link the communicator uses (shared memory inside a host, TCP between
//! hosts, or TCP inside a host where shared memory is off), one pair of ranks times ping-pongs:
//! 8-byte messages for the latency (the median round trip), 1 MiB and 4 MiB messages for the
//! bandwidth: the slope between the fastest round trip of each, so a fixed cost per message,
//! or a token bucket's free burst, does not inflate it. The two sizes alternate, so a slow
//! spell of a shared machine (another process taking the core or the memory bus) slows both
//! or neither, and the fastest of several round trips is the one it did not touch (taken
//! from the medians of back-to-back runs of each size, the shared-memory bandwidth of two
//! ranks on a 2-core machine ranged over 2.8 - 7.4 GB/s from run to run).
//!
//! The pairs are the same on every rank, derived from the host ids: the first two
//! ranks of the first host with two ranks, and rank 0 with the first rank of another host.
//! The leader of each pair (its lower rank) reports the numbers in an all_reduce (max) that
//! every rank joins, so all ranks calibrate with the same figures and pick the same schedules.
//!
//! The formulas do not see everything that costs time on a real machine (reductions, wake-ups
//! of ranks sharing cores, how a shaped link queues bursts), so the calibration then times
//! every all_reduce algorithm that can run on the communicator at a few sizes
//! ([`PROBES`]) and records measured / predicted per algorithm and size in the model (see
//! [`crate::plan::Correction`]). Each probe runs once untimed, then is timed over a few calls
//! after a barrier; the slowest rank's time counts (an all_reduce max). From the second size
//! on, an algorithm whose corrected prediction is more than [`SKIP_RATIO`] times the best
//! one's is not timed again (its last factor holds), which keeps hopeless probes of large
//! messages out of the init time.

use std::time::Instant;

use super::config::DebugLevel;
use super::{lock, Communicator};
use crate::coll::{Algorithm, CollArgs, CollKind};
use crate::exec::Engine;
use crate::plan::Link;
use crate::{Error, Result};
use ferroccl_transport::{Payload, PayloadMut};

fn lock_engine(c: &Communicator) -> std::sync::MutexGuard<'_, Engine> {
    c.inner.engine.lock().unwrap_or_else(|p| p.into_inner())
}

/// Ping-pongs timed per size (after one untimed round).
const SMALL_ITERS: usize = 50;
const LARGE_ITERS: usize = 8;
const SMALL: usize = 8;
const MID: usize = 1 << 20;
const LARGE: usize = 4 << 20;

/// Values per measured link in the all_reduce: link code, latency (us), bandwidth (GB/s).
const FIELDS: usize = 3;

/// All_reduce sizes (bytes of f32) at which the algorithms are timed.
pub(crate) const PROBES: [usize; 6] = [8 << 10, 32 << 10, 128 << 10, 512 << 10, 2 << 20, 8 << 20];

/// Timed calls per probe (after one untimed): more for the small, cheap ones.
fn probe_iters(bytes: usize) -> usize {
    if bytes <= 128 << 10 {
        5
    } else if bytes <= 2 << 20 {
        3
    } else {
        2
    }
}

/// An algorithm predicted (after correction) more than this many times slower than the best
/// is not timed at the next size.
pub(crate) const SKIP_RATIO: f64 = 3.0;

/// Elements reduced to time the reduction kernel (4 MiB of f32).
const REDUCE_ELEMS: usize = 1 << 20;

/// A measured link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Measured {
    pub link: Link,
    pub latency_us: f64,
    pub bandwidth_gbps: f64,
    /// The pair that measured it.
    pub ranks: (usize, usize),
}

/// The pairs that measure: (lower rank, higher rank) joined by a link inside a host, and by a
/// link between hosts, where such pairs exist.
pub(crate) fn pairs(hosts: &[u64]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let intra = (0..hosts.len()).find_map(|a| {
        (a + 1..hosts.len())
            .find(|&b| hosts[b] == hosts[a])
            .map(|b| (a, b))
    });
    out.extend(intra);
    if let Some(b) = hosts.iter().position(|h| Some(h) != hosts.first()) {
        out.push((0, b));
    }
    out
}

/// Median of `v` (sorted in place); 0 when empty.
fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The smallest of `v`; infinite when empty.
fn fastest(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

/// Latency (us) and bandwidth (GB/s) from round trips (us) of `SMALL`, `MID` and `LARGE`
/// bytes: half the small round trip, and the slope between the two large sizes.
pub(crate) fn fit(rtt_small: f64, rtt_mid: f64, rtt_large: f64) -> (f64, f64) {
    let latency = rtt_small / 2.0;
    let slope_us = ((rtt_large - rtt_mid) / 2.0).max(1e-3);
    let bw = (LARGE - MID) as f64 / slope_us / 1e3;
    (latency, bw)
}

fn link_code(l: Link) -> f64 {
    (l.index() + 1) as f64
}

fn link_of_code(c: f64) -> Option<Link> {
    let i = usize::try_from(c.round() as i64).ok()?.checked_sub(1)?;
    Link::ALL.get(i).copied()
}

impl Communicator {
    /// The cost model's link for the connection to `peer` (its transport's).
    fn link_to(&self, peer: usize) -> Option<Link> {
        let engine = self.inner.engine.lock().unwrap_or_else(|p| p.into_inner());
        engine.link_to(peer)
    }

    /// Round trips (us) of ping-pongs with `peer`, one list per size of `sizes`: `iters`
    /// rounds of one ping-pong of each size in turn, after one untimed round. This rank leads
    /// when `lead` (sends first and times), else it echoes.
    fn ping_pongs(
        &self,
        peer: usize,
        sizes: &[usize],
        iters: usize,
        lead: bool,
    ) -> Result<Vec<Vec<f64>>> {
        let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
        let mut times = vec![Vec::with_capacity(iters); sizes.len()];
        for i in 0..=iters {
            for (buf, times) in bufs.iter_mut().zip(times.iter_mut()) {
                let t = Instant::now();
                if lead {
                    self.send(buf, peer)?;
                    self.recv(buf, peer)?;
                } else {
                    self.recv(buf, peer)?;
                    self.send(buf, peer)?;
                }
                if i > 0 {
                    times.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
        }
        Ok(times)
    }

    /// Measures the links, agrees on the figures with every rank and calibrates this rank's
    /// cost model with them. Returns what was measured.
    pub(crate) fn calibrate(&self) -> Result<Vec<Measured>> {
        let me = self.rank();
        let ctx = |e: Error| e.context(format!("FERRO_TUNE=measure on rank {me}"));
        let pairs = pairs(&self.inner.hosts);
        let mut report = vec![0.0f64; FIELDS * 2];
        for (slot, &(a, b)) in pairs.iter().enumerate() {
            if me != a && me != b {
                continue;
            }
            let (peer, lead) = if me == a { (b, true) } else { (a, false) };
            let mut small = self
                .ping_pongs(peer, &[SMALL], SMALL_ITERS, lead)
                .map_err(ctx)?;
            let big = self
                .ping_pongs(peer, &[MID, LARGE], LARGE_ITERS, lead)
                .map_err(ctx)?;
            if lead {
                let (lat, bw) = fit(median(&mut small[0]), fastest(&big[0]), fastest(&big[1]));
                let link = self.link_to(peer).unwrap_or(Link::Tcp);
                report[slot * FIELDS..(slot + 1) * FIELDS].copy_from_slice(&[
                    link_code(link),
                    lat,
                    bw,
                ]);
            }
        }
        // Only the leaders put non-zero figures in: the max is theirs, on every rank.
        self.all_reduce_in_place(&mut report, crate::ReduceOp::Max)
            .map_err(ctx)?;
        let mut out = Vec::new();
        for (slot, &ranks) in pairs.iter().enumerate() {
            let f = &report[slot * FIELDS..(slot + 1) * FIELDS];
            let Some(link) = link_of_code(f[0]) else {
                return Err(Error::internal(format!(
                    "FERRO_TUNE=measure on rank {me}: ranks {} and {} reported no link",
                    ranks.0, ranks.1
                )));
            };
            out.push(Measured {
                link,
                latency_us: f[1],
                bandwidth_gbps: f[2],
                ranks,
            });
        }
        {
            let mut engine = lock_engine(self);
            for m in &out {
                engine
                    .calibrate(m.link, m.latency_us, m.bandwidth_gbps)
                    .map_err(|e| {
                        Error::internal(format!("FERRO_TUNE=measure on rank {me}: {e}"))
                    })?;
            }
            engine.set_calibrated();
        }
        if me == 0 && self.inner.config.debug >= DebugLevel::Info {
            let list: Vec<String> = out
                .iter()
                .map(|m| {
                    format!(
                        "{} {:.1} us, {:.2} GB/s (ranks {} and {})",
                        m.link.name(),
                        m.latency_us,
                        m.bandwidth_gbps,
                        m.ranks.0,
                        m.ranks.1
                    )
                })
                .collect();
            ferroccl_transport::log_line!(
                "ferroccl rank 0 TUNING: calibrated {}",
                if list.is_empty() {
                    "nothing (one rank)".to_string()
                } else {
                    list.join("; ")
                }
            );
        }
        if self.nranks() > 1 {
            self.time_reduction().map_err(ctx)?;
            self.time_algorithms().map_err(ctx)?;
        }
        Ok(out)
    }

    /// Times the f32 sum kernel on 4 MiB and logs its rate on the slowest rank (for the
    /// simulator's reduction term; the tuner's corrections already hold it).
    fn time_reduction(&self) -> Result<()> {
        let reducer = lock(&self.inner.engine).shared_reducer();
        let src: Vec<f32> = (0..REDUCE_ELEMS).map(|i| i as f32).collect();
        let mut dst = vec![1.0f32; REDUCE_ELEMS];
        let mut best = f64::INFINITY;
        for _ in 0..4 {
            let t = Instant::now();
            reducer.reduce_inplace(
                ferroccl_kernels::DataType::Float32,
                ferroccl_kernels::ElemOp::Sum,
                PayloadMut::Host(ferroccl_kernels::as_bytes_mut(&mut dst)),
                Payload::Host(ferroccl_kernels::as_bytes(&src)),
            )?;
            best = best.min(t.elapsed().as_secs_f64());
            std::hint::black_box(&mut dst);
        }
        let mut worst = [best];
        self.all_reduce_in_place(&mut worst, crate::ReduceOp::Max)?;
        let gbps = (REDUCE_ELEMS * 4) as f64 / worst[0].max(1e-9) / 1e9;
        if self.rank() == 0 && self.inner.config.debug >= DebugLevel::Info {
            ferroccl_transport::log_line!(
                "ferroccl rank 0 TUNING: reduce {gbps:.2} GB/s (f32 sum of 4 MiB, slowest rank)"
            );
        }
        Ok(())
    }

    /// Times every all_reduce algorithm that runs here at [`PROBES`] and records how far the
    /// cost model was off (see the module docs). Skipped where `FERRO_ALGO` forces the choice.
    fn time_algorithms(&self) -> Result<()> {
        let me = self.rank();
        let kind = CollKind::AllReduce;
        let info = me == 0 && self.inner.config.debug >= DebugLevel::Info;
        if self.inner.config.algo.is_some() {
            if info {
                ferroccl_transport::log_line!(
                    "ferroccl rank 0 TUNING: FERRO_ALGO is set; algorithms not timed"
                );
            }
            return Ok(());
        }
        // The algorithms that build on this communicator (the same on every rank: they
        // depend on the hosts only).
        let algos: Vec<Algorithm> = {
            let mut engine = lock_engine(self);
            let args = CollArgs {
                kind,
                count: PROBES[0] / 4,
                in_place: true,
            };
            let ok = Algorithm::ALL
                .into_iter()
                .filter(|a| a.supports(kind))
                .filter(|&a| {
                    engine.set_probe(Some(a));
                    engine.algorithm_for(&args, 4) == a
                })
                .collect();
            engine.set_probe(None);
            ok
        };
        let result = self.time_algorithms_at(&algos, info);
        let mut engine = lock_engine(self);
        engine.set_probe(None);
        if result.is_ok() && info {
            let (model, topo) = engine.model();
            ferroccl_transport::log_line!(
                "ferroccl rank 0 TUNING: measured picks FERRO_ALGO={}",
                model.as_rules(kind, topo, 8, 1 << 30)
            );
        }
        result
    }

    fn time_algorithms_at(&self, algos: &[Algorithm], info: bool) -> Result<()> {
        let kind = CollKind::AllReduce;
        for (i, &bytes) in PROBES.iter().enumerate() {
            let count = bytes / 4;
            // The formula's time, and it corrected by what the smaller sizes measured.
            let (predicted, estimate): (Vec<f64>, Vec<f64>) = {
                let engine = lock_engine(self);
                let (model, topo) = engine.model();
                algos
                    .iter()
                    .map(|&a| {
                        let p = model.best_slice(a, kind, bytes, topo).0;
                        (p, model.corrected_cost(a, kind, bytes, topo).0)
                    })
                    .unzip()
            };
            let best = estimate.iter().copied().fold(f64::INFINITY, f64::min);
            let mut times = vec![0.0f64; algos.len()];
            let mut buf: Vec<f32> = (0..count).map(|j| (j % 1000) as f32).collect();
            for (slot, &algo) in algos.iter().enumerate() {
                if i > 0 && estimate[slot] > SKIP_RATIO * best {
                    continue;
                }
                lock_engine(self).set_probe(Some(algo));
                self.all_reduce_in_place(&mut buf, crate::ReduceOp::Max)?;
                self.barrier()?;
                let iters = probe_iters(bytes);
                let t = Instant::now();
                for _ in 0..iters {
                    self.all_reduce_in_place(&mut buf, crate::ReduceOp::Max)?;
                }
                times[slot] = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
                lock_engine(self).set_probe(None);
            }
            // The slowest rank's time counts; every rank records the same factors.
            self.all_reduce_in_place(&mut times, crate::ReduceOp::Max)?;
            let mut line = Vec::new();
            {
                let mut engine = lock_engine(self);
                for (slot, &algo) in algos.iter().enumerate() {
                    let (t, p) = (times[slot], predicted[slot]);
                    if t <= 0.0 || !p.is_finite() || p <= 0.0 {
                        continue;
                    }
                    engine
                        .correct(kind, algo, bytes, t / p)
                        .map_err(Error::internal)?;
                    line.push(format!("{algo} {t:.1} us (x{:.2})", t / p));
                }
            }
            if info {
                ferroccl_transport::log_line!(
                    "ferroccl rank 0 TUNING: all_reduce {bytes} B measured {}",
                    line.join(", ")
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_follow_the_hosts() {
        assert_eq!(pairs(&[7]), vec![]);
        assert_eq!(pairs(&[7, 7, 7]), vec![(0, 1)]);
        assert_eq!(pairs(&[7, 9, 7, 9]), vec![(0, 2), (0, 1)]);
        assert_eq!(pairs(&[7, 9, 9]), vec![(1, 2), (0, 1)]);
        assert_eq!(pairs(&[1, 2, 3]), vec![(0, 1)]);
    }

    #[test]
    fn fastest_is_the_smallest_round_trip() {
        assert_eq!(fastest(&[900.0, 350.5, 2400.0, 351.0]), 350.5);
        assert_eq!(fastest(&[]), f64::INFINITY);
        // A slow spell on one size's fastest round trip would shrink the slope: the fastest
        // of each size is what the fit gets.
        let (_, bw) = fit(2.0, fastest(&[400.0, 350.0]), fastest(&[1400.0, 1350.0]));
        assert!((bw - 3_145_728.0 / 500.0 / 1e3).abs() < 1e-9, "{bw}");
    }

    #[test]
    fn fit_takes_half_the_small_round_trip_and_the_large_slope() {
        // 20 us round trip at 8 B; 3 MiB more take 2 x 3000 us more: 1.048576 GB/s.
        let (lat, bw) = fit(20.0, 1000.0, 7000.0);
        assert_eq!(lat, 10.0);
        assert!((bw - 1.048_576).abs() < 1e-9, "{bw}");
        // A larger mid time than large time (noise) still gives a finite, positive figure.
        let (_, bw) = fit(20.0, 7000.0, 6000.0);
        assert!(bw.is_finite() && bw > 0.0);
    }
}
