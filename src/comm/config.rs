//! Settings of a communicator, read once from `FERRO_*` environment variables.

use std::time::Duration;

use crate::{Error, Result};

/// Settings of a communicator. [`Config::from_env`] reads them from the environment; every field
/// documents its variable and default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `FERRO_TIMEOUT` (seconds, fractions allowed): a wait during which no byte moves for this
    /// long fails with an error naming the operation and the peer. Also bounds connection setup.
    /// Default 600 s, like PyTorch's process-group default.
    pub timeout: Duration,
    /// `FERRO_NSOCKS_PERPEER`: TCP sockets per peer pair (1..=8); large messages are striped
    /// over them. Default 2.
    pub nstreams: usize,
    /// `FERRO_SOCKET_IFNAME`: which interface to listen on, by name prefix (`eth`, `=eth0`
    /// exact, `^docker` to exclude), as `NCCL_SOCKET_IFNAME`. Default: the interface that
    /// reaches the rendezvous store.
    pub socket_ifname: Option<String>,
    /// `FERRO_SLICE_BYTES`: most bytes an algorithm moves in one step (pipelining grain).
    /// Default 4 MiB.
    pub slice_bytes: usize,
    /// `FERRO_SPIN_US`: microseconds a waiting rank spins before sleeping in `poll`. Default 50.
    pub spin: Duration,
    /// `FERRO_DEBUG`: `WARN` (default), `INFO` or `DEBUG`: what ferroccl prints to stderr.
    pub debug: DebugLevel,
}

/// How much ferroccl logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DebugLevel {
    /// Only warnings.
    Warn,
    /// Setup and connection choices.
    Info,
    /// Every decision.
    Debug,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: Duration::from_secs(600),
            nstreams: 2,
            socket_ifname: None,
            slice_bytes: 4 << 20,
            spin: Duration::from_micros(50),
            debug: DebugLevel::Warn,
        }
    }
}

impl Config {
    /// Defaults overridden by the `FERRO_*` variables that are set.
    pub fn from_env() -> Result<Config> {
        Self::from_lookup(&|k| std::env::var(k).ok())
    }

    /// As [`Config::from_env`], reading variables through `var`.
    pub fn from_lookup(var: &dyn Fn(&str) -> Option<String>) -> Result<Config> {
        let mut c = Config::default();
        if let Some(v) = var("FERRO_TIMEOUT") {
            let s: f64 = parse(&v, "FERRO_TIMEOUT")?;
            if !(s > 0.0 && s.is_finite()) {
                return Err(bad("FERRO_TIMEOUT", &v, "a positive number of seconds"));
            }
            c.timeout = Duration::from_secs_f64(s);
        }
        if let Some(v) = var("FERRO_NSOCKS_PERPEER") {
            let n: usize = parse(&v, "FERRO_NSOCKS_PERPEER")?;
            if !(1..=8).contains(&n) {
                return Err(bad("FERRO_NSOCKS_PERPEER", &v, "1 to 8"));
            }
            c.nstreams = n;
        }
        if let Some(v) = var("FERRO_SOCKET_IFNAME") {
            if !v.is_empty() {
                c.socket_ifname = Some(v);
            }
        }
        if let Some(v) = var("FERRO_SLICE_BYTES") {
            let n = parse_size(&v).ok_or_else(|| bad("FERRO_SLICE_BYTES", &v, "a size like 4M"))?;
            if n < 64 {
                return Err(bad("FERRO_SLICE_BYTES", &v, "at least 64 bytes"));
            }
            c.slice_bytes = n;
        }
        if let Some(v) = var("FERRO_SPIN_US") {
            c.spin = Duration::from_micros(parse(&v, "FERRO_SPIN_US")?);
        }
        if let Some(v) = var("FERRO_DEBUG") {
            c.debug = match v.to_ascii_uppercase().as_str() {
                "" | "WARN" | "VERSION" => DebugLevel::Warn,
                "INFO" => DebugLevel::Info,
                "DEBUG" | "TRACE" => DebugLevel::Debug,
                _ => return Err(bad("FERRO_DEBUG", &v, "WARN, INFO or DEBUG")),
            };
        }
        Ok(c)
    }
}

fn bad(var: &str, value: &str, want: &str) -> Error {
    Error::invalid_argument(format!("{var}={value:?}: expected {want}"))
}

fn parse<T: std::str::FromStr>(v: &str, var: &str) -> Result<T> {
    v.trim().parse().map_err(|_| bad(var, v, "a number"))
}

/// Parses `4096`, `64K`, `4M`, `1G` (1024-based).
pub fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mul) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1usize << 10),
        'm' | 'M' => (&s[..s.len() - 1], 1 << 20),
        'g' | 'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.trim().parse::<usize>().ok()?.checked_mul(mul)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(vars: &[(&str, &str)]) -> Result<Config> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(&|k| m.get(k).cloned())
    }

    #[test]
    fn defaults_and_overrides() {
        assert_eq!(with(&[]).unwrap(), Config::default());
        let c = with(&[
            ("FERRO_TIMEOUT", "2.5"),
            ("FERRO_NSOCKS_PERPEER", "4"),
            ("FERRO_SLICE_BYTES", "1M"),
            ("FERRO_DEBUG", "info"),
        ])
        .unwrap();
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(c.nstreams, 4);
        assert_eq!(c.slice_bytes, 1 << 20);
        assert_eq!(c.debug, DebugLevel::Info);
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = with(&[("FERRO_NSOCKS_PERPEER", "9")]).unwrap_err();
        assert!(e.message().contains("FERRO_NSOCKS_PERPEER=\"9\""), "{e}");
        let e = with(&[("FERRO_TIMEOUT", "-1")]).unwrap_err();
        assert!(e.message().contains("FERRO_TIMEOUT"), "{e}");
        assert_eq!(parse_size("64K"), Some(65536));
        assert_eq!(parse_size("x"), None);
    }
}
