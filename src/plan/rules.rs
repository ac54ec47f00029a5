//! Overrides of the tuner: `FERRO_ALGO=ring` (one algorithm wherever it applies) or per-size
//! rules such as `allreduce=rd:0-8K;tree:8K-1M;ring:1M-max,broadcast=binomial:0-64K`.
//!
//! A rule string is a comma-separated list of clauses `collective=ranges`; ranges are
//! `;`-separated `algorithm:low-high` with sizes in bytes of count x element size, half open
//! (`low <= bytes < high`), written as numbers with an optional `K`, `M` or `G` (powers of
//! 1024) or `max`. Collectives: `allreduce`, `broadcast`, `reduce`, `allgather`,
//! `reducescatter`, `alltoall` (underscores allowed).
#![forbid(unsafe_code)]

use crate::coll::{Algorithm, CollKind};

/// One size range of one collective.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// [`CollKind::name`] without underscores (`allreduce`).
    pub collective: String,
    /// The algorithm for the range.
    pub algo: Algorithm,
    /// First size (bytes) of the range.
    pub low: usize,
    /// One past the last size; `usize::MAX` for `max`.
    pub high: usize,
}

/// Everything that can force the tuner's hand.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `FERRO_ALGO` naming one algorithm: used for every collective it implements.
    pub algo: Option<Algorithm>,
    /// Per-size rules, first match wins.
    pub rules: Vec<Rule>,
}

const COLLECTIVES: [&str; 6] = [
    "allreduce",
    "broadcast",
    "reduce",
    "allgather",
    "reducescatter",
    "alltoall",
];

fn collective_key(kind: CollKind) -> String {
    kind.name().replace('_', "")
}

/// Parses `8K`, `1M`, `4096`, `max`.
fn parse_size(tok: &str, clause: &str) -> Result<usize, String> {
    let t = tok.trim();
    if t.eq_ignore_ascii_case("max") {
        return Ok(usize::MAX);
    }
    let (digits, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1usize << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|v| v.checked_mul(mult))
        .ok_or_else(|| {
            format!("bad size '{tok}' in '{clause}' (expected a number with K, M or G, or max)")
        })
}

impl Overrides {
    /// Parses the value of `FERRO_ALGO`: an algorithm name, or rules (anything with `=`).
    /// An empty value means no override. Errors name the token that failed.
    pub fn parse(value: &str) -> Result<Overrides, String> {
        let v = value.trim();
        if v.is_empty() {
            return Ok(Overrides::default());
        }
        if !v.contains('=') {
            return Ok(Overrides {
                algo: Some(v.parse()?),
                rules: Vec::new(),
            });
        }
        let mut rules = Vec::new();
        for clause in v.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            let (coll, ranges) = clause
                .split_once('=')
                .ok_or_else(|| format!("bad clause '{clause}' (expected collective=ranges)"))?;
            let collective = coll.trim().to_ascii_lowercase().replace('_', "");
            if !COLLECTIVES.contains(&collective.as_str()) {
                return Err(format!(
                    "unknown collective '{}' in '{clause}' (expected one of {})",
                    coll.trim(),
                    COLLECTIVES.join(", ")
                ));
            }
            for range in ranges.split(';').map(str::trim).filter(|r| !r.is_empty()) {
                let (name, span) = range.split_once(':').ok_or_else(|| {
                    format!("bad range '{range}' in '{clause}' (expected algorithm:low-high)")
                })?;
                let algo: Algorithm = name.parse().map_err(|e| format!("{e} in '{clause}'"))?;
                let (lo, hi) = span.split_once('-').ok_or_else(|| {
                    format!("bad range '{span}' in '{clause}' (expected low-high)")
                })?;
                let (low, high) = (parse_size(lo, clause)?, parse_size(hi, clause)?);
                if low >= high {
                    return Err(format!("empty range '{span}' in '{clause}'"));
                }
                let probe = match collective.as_str() {
                    "allreduce" => CollKind::AllReduce,
                    "broadcast" => CollKind::Broadcast { root: 0 },
                    "reduce" => CollKind::Reduce { root: 0 },
                    "allgather" => CollKind::AllGather,
                    "reducescatter" => CollKind::ReduceScatter,
                    _ => CollKind::AllToAll,
                };
                if !algo.supports(probe) {
                    return Err(format!(
                        "algorithm '{algo}' does not implement {} in '{clause}'",
                        probe.name()
                    ));
                }
                rules.push(Rule {
                    collective: collective.clone(),
                    algo,
                    low,
                    high,
                });
            }
        }
        Ok(Overrides { algo: None, rules })
    }

    /// The forced algorithm for `kind` at `bytes`, with the reason to log.
    pub fn forced(&self, kind: CollKind, bytes: usize) -> Option<(Algorithm, String)> {
        if let Some(a) = self.algo.filter(|a| a.supports(kind)) {
            return Some((a, format!("FERRO_ALGO={a}")));
        }
        let key = collective_key(kind);
        self.rules
            .iter()
            .find(|r| r.collective == key && r.low <= bytes && bytes < r.high)
            .map(|r| {
                let high = if r.high == usize::MAX {
                    "max".to_string()
                } else {
                    r.high.to_string()
                };
                (r.algo, format!("rule {key}={}:{}-{high}", r.algo, r.low))
            })
    }
}
