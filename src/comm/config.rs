//! Settings of a communicator, read once from `FERRO_*` environment variables.

use std::path::PathBuf;
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
    /// `FERRO_SLICE_BYTES`: most bytes an algorithm moves in one step (pipelining grain); the
    /// tuner picks each call's slice up to this, smaller where pipelining pays (tree, chain).
    /// Default 4 MiB.
    pub slice_bytes: usize,
    /// `FERRO_DEVICE_SLICE_BYTES`: how device buffers of element-wise collectives (all_reduce,
    /// broadcast, reduce) are cut: one collective per slice, the copies of the other slices
    /// overlapping it where they are staged. Must be equal on every rank. `None` (unset):
    /// 4 MiB, or 64 MiB in a communicator whose ranks are all on one host and whose transport
    /// list has `p2p`, where calls can run straight on the device buffers and each slice costs
    /// host round trips of its own.
    pub device_slice_bytes: Option<usize>,
    /// `FERRO_DEVICE_DIRECT` (`1` default, `0`): device collectives run straight on the device
    /// buffers (the schedules' copies and reductions on the device, the transports moving
    /// device memory themselves) where every connection of the rank carries device memory
    /// (the GPU peer-to-peer transport); `0` stages them through pinned host memory always.
    /// Ranks may differ: the messages are the same either way.
    pub device_direct: bool,
    /// `FERRO_DEVICE_PEER` (`1` default, `0`): in a communicator whose ranks are all threads
    /// of one process and whose transport list has `p2p`, allreduce, broadcast, reduce,
    /// all_gather, reduce_scatter and all_to_all (out of place) on device buffers go straight
    /// between the ranks' buffers:
    /// each rank reduces or copies its share from the other ranks' inputs into their outputs,
    /// one kernel a call (docs/CUDA.md, "Between the ranks' buffers"), where every rank's
    /// buffers allow it. Must be equal on every rank (checked at init).
    pub device_peer: bool,
    /// `FERRO_DEVICE_SCRATCH_BYTES` (a size like `128M`; default `0`, off): where windows are
    /// exchanged (ranks that are processes of one host, `p2p` in the transport list), device
    /// collectives whose buffers lie in no window go between the ranks' GPUs through a
    /// scratch window of this many bytes per rank, registered by the communicator itself at
    /// its first device collective: each rank copies its input into its scratch and the others
    /// read it there (docs/CUDA.md, "Unregistered buffers through scratch windows"). Half
    /// holds the inputs, half the reduced chunks; a call needing more runs in pieces that
    /// fit. Ranks must all set it or all leave it at 0 (checked at init); the sizes may differ
    /// (the least counts).
    pub device_scratch_bytes: usize,
    /// `FERRO_P2P_DEVICE`: the CUDA device of this rank's receive slots of the GPU
    /// peer-to-peer transport, the GPU whose device buffers its collectives reduce straight
    /// from those slots (buffers of another GPU go through host staging). The C ABI sets it,
    /// where the variable is unset, to the communicator's device: the one current at
    /// `ncclCommInitRank`, or the `ncclCommInitAll` devlist entry; a split keeps its parent's.
    /// `None` (unset): the rank's place among the ranks of its host, modulo the GPUs the
    /// process sees.
    pub p2p_device: Option<u32>,
    /// `FERRO_SPIN_US`: microseconds a waiting rank spins (and yields) before it sleeps on the
    /// doorbell or in `poll`. Default 50.
    pub spin: Duration,
    /// `FERRO_DEBUG`: `WARN` (default), `INFO` or `DEBUG`: what ferroccl prints to stderr.
    pub debug: DebugLevel,
    /// `FERRO_TRANSPORTS` (e.g. `shm,tcp` or `tcp`): the transports to try for each peer pair,
    /// in order of preference; the first that can connect the pair wins (shared memory only
    /// between ranks of one host). `FERRO_SHM_DISABLE=1` removes `shm`. Default `shm,tcp`.
    pub transports: Vec<String>,
    /// `FERRO_ALGO`: force an algorithm (`ring`, `tree`, `rd`, `hier`, `binomial`, `chain`,
    /// `pairwise`) or give per-size rules (`allreduce=rd:0-8K;tree:8K-1M;ring:1M-max`); see
    /// [`crate::plan::Overrides`]. Default: the cost model picks per call.
    pub algo: Option<String>,
    /// `FERRO_SHM_RING_BYTES`: bytes of each shared-memory ring (rounded up to a power of two,
    /// at least 4 KiB). Default 4 MiB.
    pub shm_ring_bytes: usize,
    /// `FERRO_SHM_CMA` (`1` enables): large shared-memory messages are read straight from the
    /// sender's buffer (`process_vm_readv`) where the kernel allows it. Default off: on the
    /// machines measured, the ring's two copies beat the kernel's one (docs/PERFORMANCE.md).
    pub shm_cma: bool,
    /// `FERRO_SHM_CMA_MIN`: messages of at least this many bytes use cross-memory attach.
    /// Default 256 KiB.
    pub shm_cma_min: usize,
    /// `FERRO_SHM_MAPPED_MIN` (`off` disables): messages of at least this many bytes that lie
    /// in a shared buffer ([`crate::SharedBuf`]) are read by the receiver straight from it.
    /// Default 512 KiB.
    pub shm_mapped_min: usize,
    /// `FERRO_SHM_DIR`: where shared-memory segments are created. Default `/dev/shm`.
    pub shm_dir: PathBuf,
    /// `FERRO_SMALL_LANE_BYTES` (`0` disables): an allreduce of at most this many bytes on a
    /// communicator whose ranks all reach each other over shared memory runs as one exchange
    /// through the connections' small-message lanes (each rank writes its input straight into
    /// a box of every peer's segment and reduces the boxes in rank order), instead of an
    /// algorithm's steps. The ranks use the smallest value any of them sets, and never more
    /// than a lane holds (96 bytes). Default 96.
    pub small_lane_bytes: usize,
    /// `FERRO_CHECK_ROOT` (`0` disables): before a rooted collective (broadcast, reduce,
    /// gather, scatter) moves data, the ranks check that they name the same root, with one small
    /// allreduce, so that a mismatch fails every rank at once instead of hanging or returning
    /// wrong data. It costs one small-message round (about 0.6 µs on shared memory between two
    /// ranks here). Default on.
    pub check_root: bool,
    /// `FERRO_HOST_ID`: replaces the detected host identity (machine id, host name, network
    /// namespace); ranks with equal ids are on one host. Default: detected.
    pub host_id: Option<String>,
    /// `FERRO_TUNE`: `model` (default) uses the cost model's documented link constants;
    /// `measure` times a few ping-pongs per transport in use at init (rank 0 measures, every
    /// rank uses its numbers) and calibrates the model with them, after which the tuner picks
    /// every call's algorithm.
    pub tune_measure: bool,
    /// `FERRO_LINK_DELAY_US`: test and benchmark tooling, off (0) by default. Adds this
    /// one-way delay to every message between ranks of different hosts (TCP connections
    /// across host ids); delays of messages in flight overlap. Both ends must set it.
    pub link_delay: Duration,
    /// `FERRO_TOPO_FILE` (`NCCL_TOPO_FILE` through the C ABI): an NCCL topology XML file
    /// describing this host, used instead of detection. Default: none (detect).
    pub topo_file: Option<PathBuf>,
    /// `FERRO_TOPO_DUMP_FILE` (`NCCL_TOPO_DUMP_FILE`): rank 0 writes the topology it detected
    /// or loaded there at init, as NCCL topology XML. Default: none.
    pub topo_dump_file: Option<PathBuf>,
    /// `FERRO_GRAPH_DUMP_FILE` (`NCCL_GRAPH_DUMP_FILE`): rank 0 writes the channels found
    /// over the host's GPUs there at init, in NCCL's graph XML. Default: none.
    pub graph_dump_file: Option<PathBuf>,
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
            slice_bytes: crate::plan::DEFAULT_MAX_SLICE,
            device_slice_bytes: None,
            device_direct: true,
            device_peer: true,
            device_scratch_bytes: 0,
            p2p_device: None,
            spin: Duration::from_micros(50),
            debug: DebugLevel::Warn,
            transports: super::transports::defaults(),
            algo: None,
            shm_ring_bytes: 4 << 20,
            shm_cma: false,
            shm_cma_min: 256 << 10,
            shm_mapped_min: 512 << 10,
            shm_dir: PathBuf::from("/dev/shm"),
            small_lane_bytes: 96,
            check_root: true,
            host_id: None,
            tune_measure: false,
            link_delay: Duration::ZERO,
            topo_file: None,
            topo_dump_file: None,
            graph_dump_file: None,
        }
    }
}

impl Config {
    /// Whether `FERRO_TRANSPORTS` lists the GPU peer-to-peer transport (what decides, alike on
    /// every rank, how device calls are cut and whether they are offered between the buffers).
    pub(crate) fn tries_p2p(&self) -> bool {
        self.transports.iter().any(|t| t == "p2p")
    }

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
        if let Some(v) = var("FERRO_SMALL_LANE_BYTES") {
            c.small_lane_bytes = parse(&v, "FERRO_SMALL_LANE_BYTES")?;
        }
        if let Some(v) = var("FERRO_DEVICE_SLICE_BYTES") {
            let n = parse_size(&v)
                .ok_or_else(|| bad("FERRO_DEVICE_SLICE_BYTES", &v, "a size like 4M"))?;
            if n < 64 {
                return Err(bad("FERRO_DEVICE_SLICE_BYTES", &v, "at least 64 bytes"));
            }
            c.device_slice_bytes = Some(n);
        }
        if let Some(v) = var("FERRO_DEVICE_DIRECT") {
            c.device_direct = flag(&v, "FERRO_DEVICE_DIRECT")?;
        }
        if let Some(v) = var("FERRO_DEVICE_PEER") {
            c.device_peer = flag(&v, "FERRO_DEVICE_PEER")?;
        }
        if let Some(v) = var("FERRO_DEVICE_SCRATCH_BYTES") {
            let n = parse_size(&v)
                .ok_or_else(|| bad("FERRO_DEVICE_SCRATCH_BYTES", &v, "a size like 128M"))?;
            if n != 0 && n < 4096 {
                return Err(bad(
                    "FERRO_DEVICE_SCRATCH_BYTES",
                    &v,
                    "0 (off) or at least 4096 bytes",
                ));
            }
            c.device_scratch_bytes = n;
        }
        if let Some(v) = var("FERRO_P2P_DEVICE") {
            if !v.trim().is_empty() {
                c.p2p_device = Some(parse(&v, "FERRO_P2P_DEVICE")?);
            }
        }
        if let Some(v) = var("FERRO_SPIN_US") {
            c.spin = Duration::from_micros(parse(&v, "FERRO_SPIN_US")?);
        }
        if let Some(v) = var("FERRO_ALGO") {
            if !v.trim().is_empty() {
                crate::plan::Overrides::parse(&v)
                    .map_err(|e| Error::invalid_argument(format!("FERRO_ALGO={v:?}: {e}")))?;
                c.algo = Some(v);
            }
        }
        if let Some(v) = var("FERRO_DEBUG") {
            c.debug = match v.to_ascii_uppercase().as_str() {
                "" | "WARN" | "VERSION" => DebugLevel::Warn,
                "INFO" => DebugLevel::Info,
                "DEBUG" | "TRACE" => DebugLevel::Debug,
                _ => return Err(bad("FERRO_DEBUG", &v, "WARN, INFO or DEBUG")),
            };
        }
        if let Some(v) = var("FERRO_TRANSPORTS") {
            let mut list = Vec::new();
            let expected = format!("a list of {}", super::transports::names().join(", "));
            for word in v.split(',').map(str::trim).filter(|w| !w.is_empty()) {
                let t = super::transports::canonical(word)
                    .ok_or_else(|| bad("FERRO_TRANSPORTS", &v, &expected))?;
                if !list.iter().any(|x| x == t) {
                    list.push(t.to_string());
                }
            }
            if list.is_empty() {
                return Err(bad("FERRO_TRANSPORTS", &v, &expected));
            }
            c.transports = list;
        }
        if let Some(v) = var("FERRO_SHM_DISABLE") {
            if flag(&v, "FERRO_SHM_DISABLE")? {
                c.transports.retain(|t| t != "shm");
                if c.transports.is_empty() {
                    c.transports.push("tcp".to_string());
                }
            }
        }
        if let Some(v) = var("FERRO_SHM_RING_BYTES") {
            let n = parse_size(&v)
                .and_then(usize::checked_next_power_of_two)
                .filter(|&n| n <= 1 << 30)
                .ok_or_else(|| bad("FERRO_SHM_RING_BYTES", &v, "a size like 4M, at most 1G"))?;
            c.shm_ring_bytes = n.max(4096);
        }
        if let Some(v) = var("FERRO_SHM_CMA") {
            c.shm_cma = flag(&v, "FERRO_SHM_CMA")?;
        }
        if let Some(v) = var("FERRO_SHM_CMA_MIN") {
            c.shm_cma_min =
                parse_size(&v).ok_or_else(|| bad("FERRO_SHM_CMA_MIN", &v, "a size like 256K"))?;
        }
        if let Some(v) = var("FERRO_SHM_MAPPED_MIN") {
            c.shm_mapped_min = if v.trim().eq_ignore_ascii_case("off") {
                usize::MAX
            } else {
                parse_size(&v)
                    .ok_or_else(|| bad("FERRO_SHM_MAPPED_MIN", &v, "a size like 64K, or off"))?
            };
        }
        if let Some(v) = var("FERRO_CHECK_ROOT") {
            c.check_root = flag(&v, "FERRO_CHECK_ROOT")?;
        }
        if let Some(v) = var("FERRO_SHM_DIR") {
            if !v.is_empty() {
                c.shm_dir = PathBuf::from(v);
            }
        }
        if let Some(v) = var("FERRO_HOST_ID") {
            if !v.is_empty() {
                c.host_id = Some(v);
            }
        }
        if let Some(v) = var("FERRO_TUNE") {
            c.tune_measure = match v.trim().to_ascii_lowercase().as_str() {
                "" | "model" | "default" => false,
                "measure" => true,
                _ => return Err(bad("FERRO_TUNE", &v, "model or measure")),
            };
        }
        if let Some(v) = var("FERRO_LINK_DELAY_US") {
            let us: f64 = parse(&v, "FERRO_LINK_DELAY_US")?;
            if !(us.is_finite() && (0.0..=10_000_000.0).contains(&us)) {
                return Err(bad(
                    "FERRO_LINK_DELAY_US",
                    &v,
                    "microseconds from 0 to 10000000",
                ));
            }
            c.link_delay = Duration::from_secs_f64(us / 1e6);
        }
        c.topo_file = var("FERRO_TOPO_FILE")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        c.topo_dump_file = var("FERRO_TOPO_DUMP_FILE")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        c.graph_dump_file = var("FERRO_GRAPH_DUMP_FILE")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        Ok(c)
    }
}

fn bad(var: &str, value: &str, want: &str) -> Error {
    Error::invalid_argument(format!("{var}={value:?}: expected {want}"))
}

fn flag(v: &str, var: &str) -> Result<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        _ => Err(bad(var, v, "0 or 1")),
    }
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
    fn device_slice_bytes() {
        assert_eq!(with(&[]).unwrap().device_slice_bytes, None);
        let c = with(&[("FERRO_DEVICE_SLICE_BYTES", "64K")]).unwrap();
        assert_eq!(c.device_slice_bytes, Some(64 << 10));
        assert!(with(&[]).unwrap().device_direct);
        assert!(!with(&[("FERRO_DEVICE_DIRECT", "0")]).unwrap().device_direct);
        assert!(with(&[]).unwrap().device_peer);
        assert!(!with(&[("FERRO_DEVICE_PEER", "0")]).unwrap().device_peer);
        assert!(with(&[("FERRO_DEVICE_PEER", "maybe")]).is_err());
        assert_eq!(with(&[]).unwrap().device_scratch_bytes, 0);
        let c = with(&[("FERRO_DEVICE_SCRATCH_BYTES", "128M")]).unwrap();
        assert_eq!(c.device_scratch_bytes, 128 << 20);
        assert!(with(&[("FERRO_DEVICE_SCRATCH_BYTES", "100")]).is_err());
        assert!(with(&[("FERRO_DEVICE_SCRATCH_BYTES", "lots")]).is_err());
        assert!(with(&[("FERRO_DEVICE_DIRECT", "maybe")]).is_err());
        assert_eq!(with(&[]).unwrap().p2p_device, None);
        assert_eq!(
            with(&[("FERRO_P2P_DEVICE", " 3 ")]).unwrap().p2p_device,
            Some(3)
        );
        let e = with(&[("FERRO_P2P_DEVICE", "gpu1")]).unwrap_err();
        assert!(e.to_string().contains("FERRO_P2P_DEVICE"), "{e}");
        let e = with(&[("FERRO_DEVICE_SLICE_BYTES", "8")]).unwrap_err();
        assert!(
            e.message().contains("FERRO_DEVICE_SLICE_BYTES=\"8\""),
            "{e}"
        );
    }

    #[test]
    fn tuning_and_delay_settings() {
        let c = with(&[("FERRO_TUNE", "measure"), ("FERRO_LINK_DELAY_US", "200")]).unwrap();
        assert!(c.tune_measure);
        assert_eq!(c.link_delay, Duration::from_micros(200));
        let c = with(&[("FERRO_TUNE", "model"), ("FERRO_LINK_DELAY_US", "0")]).unwrap();
        assert!(!c.tune_measure);
        assert_eq!(c.link_delay, Duration::ZERO);
        let e = with(&[("FERRO_TUNE", "guess")]).unwrap_err();
        assert!(e.message().contains("FERRO_TUNE=\"guess\""), "{e}");
        let e = with(&[("FERRO_LINK_DELAY_US", "-5")]).unwrap_err();
        assert!(e.message().contains("FERRO_LINK_DELAY_US=\"-5\""), "{e}");
    }

    #[test]
    fn transport_settings() {
        assert_eq!(with(&[]).unwrap().transports, ["shm", "tcp"]);
        let c = with(&[("FERRO_TRANSPORTS", "tcp")]).unwrap();
        assert_eq!(c.transports, ["tcp"]);
        let c = with(&[("FERRO_TRANSPORTS", "Socket, shm,tcp")]).unwrap();
        assert_eq!(c.transports, ["tcp", "shm"]);
        let c = with(&[("FERRO_SHM_DISABLE", "1")]).unwrap();
        assert_eq!(c.transports, ["tcp"]);
        let c = with(&[("FERRO_SHM_DISABLE", "1"), ("FERRO_TRANSPORTS", "shm")]).unwrap();
        assert_eq!(c.transports, ["tcp"]);
        let e = with(&[("FERRO_TRANSPORTS", "ib")]).unwrap_err();
        assert!(e.message().contains("a list of shm, tcp"), "{e}");
        let c = with(&[
            ("FERRO_SHM_RING_BYTES", "3M"),
            ("FERRO_SHM_CMA", "0"),
            ("FERRO_SHM_CMA_MIN", "1M"),
            ("FERRO_HOST_ID", "node7"),
        ])
        .unwrap();
        assert_eq!(c.shm_ring_bytes, 4 << 20);
        assert!(!c.shm_cma);
        assert_eq!(c.shm_cma_min, 1 << 20);
        assert_eq!(c.host_id.as_deref(), Some("node7"));
        let e = with(&[("FERRO_TRANSPORTS", "ib")]).unwrap_err();
        assert!(e.message().contains("FERRO_TRANSPORTS=\"ib\""), "{e}");
        assert!(with(&[("FERRO_SHM_CMA", "maybe")]).is_err());
        assert!(!Config::default().shm_cma);
        assert!(with(&[("FERRO_SHM_CMA", "1")]).unwrap().shm_cma);
        assert_eq!(Config::default().shm_mapped_min, 512 << 10);
        let off = with(&[("FERRO_SHM_MAPPED_MIN", "off")]).unwrap();
        assert_eq!(off.shm_mapped_min, usize::MAX);
        assert_eq!(
            with(&[("FERRO_SHM_MAPPED_MIN", "1M")])
                .unwrap()
                .shm_mapped_min,
            1 << 20
        );
        assert!(with(&[("FERRO_SHM_MAPPED_MIN", "soon")]).is_err());
        assert!(Config::default().check_root);
        assert!(!with(&[("FERRO_CHECK_ROOT", "0")]).unwrap().check_root);
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
