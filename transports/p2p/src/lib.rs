//! ferroccl's GPU peer-to-peer transport ("cuda-p2p": NVLink or PCIe through CUDA IPC), for
//! ranks of one host whose GPUs can reach each other, after NCCL's p2p transport.
//!
//! | item | what it is |
//! |---|---|
//! | [`P2pTransport`] | setup: receive slots and a control segment per rank, their handles in the connect handle |
//! | [`P2pConnection`] | one peer pair: the sender copies into the peer's slot, then raises the slot's flag |
//! | [`ProviderKind`] | where slots live: `cuda` (device memory, CUDA IPC) or `host` (**test stand-in**) |
//! | [`P2pConfig`] | `FERRO_P2P_*` settings |
//! | [`Layout`] | slots per ring and bytes per slot |
//!
//! The receiver owns a ring of slots in its (device) memory; a flag line per slot lives in its
//! control segment in `/dev/shm`. The sender copies a chunk straight into the peer's slot and,
//! once the copy is done, writes the slot's line (the message header rides in the first one,
//! so the receiver checks it before any byte lands) and raises its flag; the receiver copies
//! the slot out into the destination and hands the slot back (the tail). The protocol is in
//! `proto.rs`, without I/O; `docs/P2P.md` has the whole story.
//!
//! The `host` provider (`FERRO_P2P_PROVIDER=host`) keeps the slots in a `/dev/shm` file, so the
//! protocol runs — and the conformance suite passes — on machines without a GPU. It is test
//! tooling: logs and connection descriptions name it so. The `cuda` provider is built but has
//! not yet run on a GPU.
//!
//! # Example
//!
//! 1. A connected pair over the host provider, one message:
//!
//! ```
//! use ferroccl_transport::{Connection, Header, Payload, PayloadMut, Progress};
//! use ferroccl_transport_p2p::{host_pair, P2pConfig};
//!
//! let (mut a, mut b) = host_pair(&P2pConfig::host()).unwrap();
//! let msg = vec![7u8; 100_000];
//! let h = Header { len: msg.len() as u64, ..Header::default() };
//! let (mut sp, mut rp) = (Progress::default(), Progress::default());
//! let (mut rh, mut got) = (Header::default(), vec![0u8; msg.len()]);
//! let (mut sent, mut recvd) = (false, false);
//! while !(sent && recvd) {
//!     if !sent {
//!         sent = a.send(&h, Payload::Host(&msg), &mut sp).unwrap();
//!     }
//!     if !recvd {
//!         recvd = b.recv(&mut rh, PayloadMut::Host(&mut got), &mut rp).unwrap();
//!     }
//! }
//! assert_eq!((rh, got), (h, msg));
//! ```

#![warn(missing_docs)]

mod alive;
mod conn;
mod proto;
mod provider;
mod segment;
mod setup;

pub use conn::P2pConnection;
pub use proto::Layout;
pub use provider::ProviderKind;
pub use setup::P2pTransport;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ferroccl_transport::{Connection, RankDesc, Result, SetupCtx, Transport};

/// Settings of the p2p transport, each with its environment variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct P2pConfig {
    /// `FERRO_P2P_PROVIDER`: `cuda` (default) or `host` (test stand-in).
    pub provider: ProviderKind,
    /// `FERRO_P2P_SLOTS`: slots per ring, 1..=64 (default 8, as NCCL's steps).
    pub nslots: usize,
    /// `FERRO_P2P_SLOT_BYTES`: bytes per slot, 4 KiB..=64 MiB (default: the provider's,
    /// [`ProviderKind::default_slot_bytes`]: 4 MiB for cuda, 512 KiB for host).
    pub slot_bytes: usize,
    /// `FERRO_P2P_DEVICE`: the CUDA device of the rank's slots; default: its local rank modulo
    /// the devices the process sees.
    pub device: Option<u32>,
    /// Where control segments (and the host provider's slots) live: `FERRO_SHM_DIR`, default
    /// `/dev/shm`.
    pub dir: PathBuf,
}

impl Default for P2pConfig {
    fn default() -> Self {
        P2pConfig {
            provider: ProviderKind::Cuda,
            nslots: 8,
            slot_bytes: ProviderKind::Cuda.default_slot_bytes(),
            device: None,
            dir: PathBuf::from("/dev/shm"),
        }
    }
}

fn env_num(name: &str, lo: usize, hi: usize, default: usize) -> std::result::Result<usize, String> {
    let Ok(v) = std::env::var(name) else {
        return Ok(default);
    };
    let t = v.trim();
    let (digits, mult) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 1 << 10),
        Some((i, 'M' | 'm')) => (&t[..i], 1 << 20),
        _ => (t, 1),
    };
    match digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
    {
        Some(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(format!("{name}={v} is not a number in {lo}..={hi}")),
    }
}

impl P2pConfig {
    /// The default settings with the host provider (tests).
    pub fn host() -> P2pConfig {
        P2pConfig {
            provider: ProviderKind::Host,
            slot_bytes: ProviderKind::Host.default_slot_bytes(),
            ..P2pConfig::default()
        }
    }

    /// The settings of the environment; a bad value is an error naming the variable.
    pub fn from_env() -> std::result::Result<P2pConfig, String> {
        let d = P2pConfig::default();
        let provider = match std::env::var("FERRO_P2P_PROVIDER")
            .as_deref()
            .map(str::trim)
        {
            Err(_) | Ok("") | Ok("cuda") => ProviderKind::Cuda,
            Ok("host") => ProviderKind::Host,
            Ok(other) => {
                return Err(format!(
                    "FERRO_P2P_PROVIDER={other} is not a provider (cuda, or host: host memory \
                     standing in for GPU memory, for tests)"
                ))
            }
        };
        let device = match std::env::var("FERRO_P2P_DEVICE") {
            Err(_) => None,
            Ok(v) => Some(
                v.trim()
                    .parse()
                    .map_err(|_| format!("FERRO_P2P_DEVICE={v} is not a device ordinal"))?,
            ),
        };
        Ok(P2pConfig {
            provider,
            nslots: env_num("FERRO_P2P_SLOTS", 1, 64, d.nslots)?,
            slot_bytes: env_num(
                "FERRO_P2P_SLOT_BYTES",
                4096,
                64 << 20,
                provider.default_slot_bytes(),
            )?,
            device,
            dir: std::env::var_os("FERRO_SHM_DIR")
                .map(PathBuf::from)
                .unwrap_or(d.dir),
        })
    }

    /// The ring's shape.
    pub fn layout(&self) -> Layout {
        Layout {
            nslots: self.nslots,
            slot_bytes: self.slot_bytes,
        }
    }
}

/// How every file of the transport's begins.
pub const FILE_PREFIX: &str = "ferrop2p-";

/// A file name unique per process and call: `ferrop2p-<id>-r<rank>-p<pid>-<nonce>-<what>`.
pub(crate) fn file_name(comm_id: u64, rank: usize, what: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NONCE: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let n = NONCE.fetch_add(1, Ordering::Relaxed);
    let nonce = ferroccl_transport::hash64(&[&t.to_le_bytes(), &n.to_le_bytes()]) as u32;
    format!(
        "{FILE_PREFIX}{comm_id:016x}-r{rank}-p{}-{nonce:08x}-{what}",
        std::process::id()
    )
}

/// Writes a log line of the transport (subsystem P2P).
pub(crate) fn log(args: std::fmt::Arguments<'_>) {
    ferroccl_transport::log::write_line(format_args!(
        "ferroccl pid {} P2P: {args}",
        std::process::id()
    ));
}

/// A connected pair (ranks 0 and 1 of one process) built by two transports' setup with `cfg`:
/// what a communicator builds, without one (tests, examples).
pub fn host_pair(cfg: &P2pConfig) -> Result<(Box<dyn Connection>, Box<dyn Connection>)> {
    let desc = RankDesc {
        host: 1,
        pid: std::process::id(),
    };
    let ranks = [desc, desc];
    let id = ferroccl_transport::hash64(&[file_name(0, 0, "pair").as_bytes()]);
    let ctx = |rank| SetupCtx {
        rank,
        nranks: 2,
        comm_id: id,
        ranks: &ranks,
        deadline: Instant::now() + Duration::from_secs(30),
    };
    let mut t = [
        P2pTransport::new(Ok(cfg.clone()), false),
        P2pTransport::new(Ok(cfg.clone()), false),
    ];
    let mut handles = Vec::new();
    for (r, tr) in t.iter_mut().enumerate() {
        if let Err(why) = tr.can_connect(&ctx(r), 1 - r) {
            return Err(ferroccl_transport::Error::new(
                ferroccl_transport::ErrorKind::Unsupported,
                why,
            ));
        }
        handles.push(tr.listen(&ctx(r), &[1 - r])?);
    }
    for (r, tr) in t.iter_mut().enumerate() {
        tr.attach(&ctx(r), 1 - r, &handles[1 - r])
            .map_err(ferroccl_transport::Error::remote)?;
    }
    let mut a = t[0].connect(&ctx(0), &[1])?;
    let mut b = t[1].connect(&ctx(1), &[0])?;
    match (a.pop(), b.pop()) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(ferroccl_transport::Error::internal(
            "p2p pair: setup made no connection",
        )),
    }
}

#[cfg(test)]
mod tests;
