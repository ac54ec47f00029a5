//! ferroccl's shared-memory transport, for ranks on one host.
//!
//! | item | what it is |
//! |---|---|
//! | [`namespace_inode`] | this process's namespaces, which decide whether a peer's pid means anything here |
//! | [`OwnSegment`] | a rank's file in `/dev/shm`: its doorbell and one incoming ring per local peer |
//! | [`PeerSegment`] | a peer's segment, mapped by this rank to produce into its ring |
//! | [`ShmConnection`] | one peer pair: the two rings, doorbells, cross-memory attach for large payloads |
//! | [`ShmTransport`] | setup: segment names as connect handles, connections where both sides mapped |
//! | [`SharedMem`] | a host buffer that peers on the host read straight from when it is sent |
//! | [`ShmConfig`] | ring size, cross-memory attach and shared-buffer thresholds, directory |
//! | [`sweep_dead_segments`] | removes segments whose owner process is gone |
//!
//! Setup, per communicator: every rank that has peers on its host creates its segment and
//! publishes the name; maps each local peer's; tells the others which it mapped; and once both
//! sides of a pair have mapped each other's segment they build a [`ShmConnection`] and the
//! owner unlinks its file (nothing is left in `/dev/shm`, even after a later crash). A rank
//! killed before it unlinks leaves its file; the next rank that creates a segment in the same
//! directory removes it ([`sweep_dead_segments`]).
//!
//! The unsafe core — the single-producer/single-consumer ring (`ring.rs`) and the doorbell
//! handshake (`bell.rs`) — reaches its atomics through `sync.rs`, so the same protocol is
//! model-checked with loom: `RUSTFLAGS="--cfg loom" cargo test -p ferroccl-transport-shm
//! --release --lib`.

mod ring;
mod sync;

#[cfg(not(loom))]
mod bell;
#[cfg(not(loom))]
mod cma;
#[cfg(not(loom))]
mod conn;
#[cfg(not(loom))]
mod host;
#[cfg(not(loom))]
mod lane;
#[cfg(not(loom))]
mod segment;
#[cfg(not(loom))]
mod setup;
#[cfg(not(loom))]
mod shared;
#[cfg(not(loom))]
mod sweep;
#[cfg(not(loom))]
mod watch;

#[cfg(not(loom))]
pub use bell::Bell;
#[cfg(not(loom))]
pub use conn::ShmConnection;
#[cfg(not(loom))]
pub use host::namespace_inode;
#[cfg(not(loom))]
pub use lane::{LaneBox, LANE_BYTES};
#[cfg(not(loom))]
pub use segment::{segment_bytes, Mapping, OwnSegment, PeerSegment};
#[cfg(not(loom))]
pub use setup::ShmTransport;
#[cfg(not(loom))]
pub use shared::SharedMem;
#[cfg(not(loom))]
pub use sweep::sweep_dead_segments;
#[cfg(not(loom))]
pub use watch::PeerWatch;

use std::path::PathBuf;

/// Settings of the shared-memory transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmConfig {
    /// Bytes of each ring (a power of two, at least 4096). `FERRO_SHM_RING_BYTES`, default 4 MiB.
    pub ring_bytes: usize,
    /// Whether large payloads may be read straight from the sender's memory
    /// (`process_vm_readv`) where the kernel allows it. `FERRO_SHM_CMA`, default off.
    pub cma: bool,
    /// Payloads of at least this many bytes use cross-memory attach. `FERRO_SHM_CMA_MIN`,
    /// default 256 KiB.
    pub cma_min: usize,
    /// Payloads of at least this many bytes that lie in a [`SharedMem`] are read by the receiver
    /// straight from it instead of through the ring; `usize::MAX` turns that off.
    /// `FERRO_SHM_MAPPED_MIN`, default 512 KiB.
    pub mapped_min: usize,
    /// Most bytes one `send`/`recv` call moves, so that the executor can interleave work (reduce
    /// what arrived while it is in cache). Default 512 KiB.
    pub max_io: usize,
    /// Where segments live. `FERRO_SHM_DIR`, default `/dev/shm`.
    pub dir: PathBuf,
}

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig {
            ring_bytes: 4 << 20,
            cma: false,
            cma_min: 256 << 10,
            mapped_min: 512 << 10,
            max_io: 512 << 10,
            dir: PathBuf::from("/dev/shm"),
        }
    }
}

/// How every segment's file name begins.
pub const SEGMENT_PREFIX: &str = "ferroccl-";

/// The file name of rank `rank`'s segment for communicator `comm_id`, made unique per process
/// and call (`ferroccl-<id>-r<rank>-p<pid>-<nonce>`: 16 and 8 hex digits for id and nonce).
#[cfg(not(loom))]
pub fn segment_name(comm_id: u64, rank: usize) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NONCE: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let n = NONCE.fetch_add(1, Ordering::Relaxed);
    let nonce = ferroccl_transport::hash64(&[&t.to_le_bytes(), &n.to_le_bytes()]) as u32;
    format!(
        "{SEGMENT_PREFIX}{comm_id:016x}-r{rank}-p{}-{nonce:08x}",
        std::process::id()
    )
}

/// The owner's pid in a name made by [`segment_name`]; `None` for any other name.
#[cfg(not(loom))]
pub(crate) fn segment_owner_pid(name: &str) -> Option<u32> {
    fn hex(s: &str, digits: usize) -> bool {
        s.len() == digits && s.bytes().all(|b| b.is_ascii_hexdigit())
    }
    fn decimal(s: &str) -> bool {
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
    }
    let mut parts = name.strip_prefix(SEGMENT_PREFIX)?.split('-');
    let (id, rank, pid, nonce) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let rank = rank.strip_prefix('r')?;
    let pid = pid.strip_prefix('p')?;
    if parts.next().is_some() || !hex(id, 16) || !decimal(rank) || !decimal(pid) || !hex(nonce, 8) {
        return None;
    }
    pid.parse().ok()
}

#[cfg(all(test, not(loom)))]
mod tests;
