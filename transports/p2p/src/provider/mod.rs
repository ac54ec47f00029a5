//! Where the receive slots live and how bytes get into and out of them: a closed set of two
//! providers.
//!
//! | provider | slots | handle to the peer | copies |
//! |---|---|---|---|
//! | `cuda` | `cuMemAlloc` device memory | `cuIpcGetMemHandle` (or the pointer, same process) | `cuMemcpyAsync` on a stream, events |
//! | `host` (test stand-in) | a `/dev/shm` file | the file name | `memcpy` |
//!
//! Each rank allocates one area holding every incoming peer's ring (at an offset per peer).

mod cuda;
mod host;

use std::path::Path;
use std::sync::Arc;

use ferroccl_transport::{Error, Payload, PayloadMut, Result, Spaces};

use cuda::{CudaDev, DevAlloc, DevCopier, DevPeer, DevSlots};
use host::HostMap;

/// Which provider runs the transport (`FERRO_P2P_PROVIDER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    /// GPU memory through the CUDA driver (the default).
    Cuda,
    /// Host memory in `/dev/shm` standing in for GPU memory: test tooling.
    Host,
}

impl ProviderKind {
    /// Bytes per slot unless `FERRO_P2P_SLOT_BYTES` says otherwise. cuda: 4 MiB, a 32 MiB ring
    /// per peer. Every slot costs a round of host calls (a queued copy, an event polled, a flag,
    /// a kernel launch and its wait): on an H100, 2 thread ranks' 128 MiB allreduce on the
    /// device took 5.8 ms with 512 KiB slots and 2.5 ms with 4 MiB (16 MiB: 2.3 ms). host (the
    /// test stand-in): 512 KiB, a 4 MiB ring, NCCL's default buffer.
    pub fn default_slot_bytes(self) -> usize {
        match self {
            ProviderKind::Cuda => 4 << 20,
            ProviderKind::Host => 512 << 10,
        }
    }

    /// The name in logs, handles and `FERRO_P2P_PROVIDER`.
    pub fn name(self) -> &'static str {
        match self {
            ProviderKind::Cuda => "cuda",
            ProviderKind::Host => "host",
        }
    }
}

/// Whether this process's "device memory" is ferroccl's host stand-in
/// (`FERRO_DEVICE_PROVIDER=host`): heap memory of the process, which the host provider may then
/// copy as host memory. Test tooling only, like the host provider itself.
pub(crate) fn stand_in_device() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("FERRO_DEVICE_PROVIDER").is_ok_and(|v| v.trim() == "host"))
}

/// An opened provider.
#[derive(Debug)]
pub(crate) enum Provider {
    Host,
    Cuda(Arc<CudaDev>),
}

impl Provider {
    /// Opens `kind` (the cuda provider on device `ordinal`, or `local_rank` modulo the
    /// devices seen); `Err` says why it cannot run.
    pub fn open(
        kind: ProviderKind,
        ordinal: Option<u32>,
        local_rank: u32,
    ) -> std::result::Result<Provider, String> {
        match kind {
            ProviderKind::Host => Ok(Provider::Host),
            ProviderKind::Cuda => Ok(Provider::Cuda(Arc::new(CudaDev::open(
                ordinal, local_rank,
            )?))),
        }
    }

    pub fn kind(&self) -> ProviderKind {
        match self {
            Provider::Host => ProviderKind::Host,
            Provider::Cuda(_) => ProviderKind::Cuda,
        }
    }

    /// What it reads and writes directly: the cuda provider copies with unified addressing, so
    /// host buffers work too, and carries the memory of its own GPU (where its receive slots
    /// live, which a reduction straight from a slot runs on; another GPU's buffers go through
    /// host staging); the host provider reaches host memory, and the device memory of
    /// ferroccl's host stand-in device provider when that is the one in use
    /// ([`stand_in_device`]).
    pub fn spaces(&self) -> Spaces {
        match self {
            Provider::Host if stand_in_device() => Spaces {
                host: true,
                cuda: true,
                cuda_device: None,
            },
            Provider::Host => Spaces::HOST,
            Provider::Cuda(dev) => Spaces {
                host: true,
                cuda: true,
                cuda_device: Some(dev.ordinal),
            },
        }
    }

    /// The memory this rank's slots live in, as peers compare it: `host`, or the GPU's PCI
    /// bus id.
    pub fn device_id(&self) -> String {
        match self {
            Provider::Host => "host".to_string(),
            Provider::Cuda(d) => d.bus_id.clone(),
        }
    }

    /// A description for logs.
    pub fn describe(&self) -> String {
        match self {
            Provider::Host => "host memory in /dev/shm (test stand-in for GPU memory)".to_string(),
            Provider::Cuda(d) => format!("cuda device {} ({})", d.ordinal, d.bus_id),
        }
    }

    /// Whether this rank's memory can reach a peer's whose [`Provider::device_id`] is `peer`.
    pub fn can_reach(&self, peer: &str) -> std::result::Result<(), String> {
        match self {
            Provider::Host if peer == "host" => Ok(()),
            Provider::Host => Err(format!(
                "the peer's slots are on GPU {peer}, this rank's in host memory"
            )),
            Provider::Cuda(d) => d.can_reach(peer),
        }
    }

    /// Allocates this rank's slots: `len` bytes (`name` names the host provider's file in `dir`).
    pub fn alloc(&self, dir: &Path, name: &str, len: usize) -> Result<OwnArea> {
        match self {
            Provider::Host => Ok(OwnArea::Host(Arc::new(HostMap::create(dir, name, len)?))),
            Provider::Cuda(d) => Ok(OwnArea::Cuda(DevAlloc::new(d, len)?)),
        }
    }

    /// Maps a peer's slots from what its [`OwnArea::export`] wrote; `len` bytes at least.
    pub fn open_peer(&self, dir: &Path, export: &[u8], len: usize) -> Result<PeerArea> {
        match self {
            Provider::Host => {
                let name = std::str::from_utf8(export)
                    .ok()
                    .filter(|n| !n.is_empty() && !n.contains('/'))
                    .ok_or_else(|| Error::remote("a bad host-provider file name"))?;
                Ok(PeerArea::Host(Arc::new(HostMap::open(dir, name, len)?)))
            }
            Provider::Cuda(d) => {
                let p = DevPeer::open(d, export, len)?;
                Ok(PeerArea::Cuda(Arc::clone(d), p))
            }
        }
    }
}

/// This rank's slots.
#[derive(Debug, Clone)]
pub(crate) enum OwnArea {
    Host(Arc<HostMap>),
    Cuda(Arc<DevAlloc>),
}

impl OwnArea {
    /// The handle peers map it by.
    pub fn export(&self, name: &str) -> Vec<u8> {
        match self {
            OwnArea::Host(_) => name.as_bytes().to_vec(),
            OwnArea::Cuda(a) => a.export(),
        }
    }

    /// Removes the host provider's file name once every peer mapped it.
    pub fn unlink(&self) {
        if let OwnArea::Host(m) = self {
            m.unlink();
        }
    }
}

/// A peer's slots, mapped here.
#[derive(Debug)]
pub(crate) enum PeerArea {
    Host(Arc<HostMap>),
    Cuda(Arc<CudaDev>, DevPeer),
}

/// One direction's copies between message buffers and slots starting at byte `base` of an
/// area.
#[derive(Debug)]
pub(crate) enum Copier {
    Host { map: Arc<HostMap>, base: usize },
    Cuda { c: DevCopier, base: usize },
}

impl Copier {
    /// Copies into a peer's slots.
    pub fn sending(area: PeerArea, base: usize, nslots: usize) -> Result<Copier> {
        match area {
            PeerArea::Host(map) => Ok(Copier::Host { map, base }),
            PeerArea::Cuda(d, p) => Ok(Copier::Cuda {
                c: DevCopier::new(&d, DevSlots::Peer(p), nslots)?,
                base,
            }),
        }
    }

    /// Copies out of this rank's slots.
    pub fn receiving(
        area: &OwnArea,
        base: usize,
        nslots: usize,
        provider: &Provider,
    ) -> Result<Copier> {
        match (area, provider) {
            (OwnArea::Host(map), _) => Ok(Copier::Host {
                map: Arc::clone(map),
                base,
            }),
            (OwnArea::Cuda(a), Provider::Cuda(d)) => Ok(Copier::Cuda {
                c: DevCopier::new(d, DevSlots::Own(Arc::clone(a)), nslots)?,
                base,
            }),
            (OwnArea::Cuda(_), Provider::Host) => Err(Error::internal(
                "p2p: device slots without the cuda provider",
            )),
        }
    }

    /// Starts copying `src[off..off + n]` into byte `at` of the slots.
    pub fn put(
        &mut self,
        slot: usize,
        at: usize,
        src: &Payload<'_>,
        off: usize,
        n: usize,
    ) -> Result<()> {
        match self {
            Copier::Host { map, base } => host::put(map, *base + at, src, off, n),
            Copier::Cuda { c, base } => c.put(slot, *base + at, src, off, n),
        }
    }

    /// Starts copying `n` bytes at byte `at` of the slots into `dst[off..off + n]`.
    pub fn get(
        &mut self,
        slot: usize,
        at: usize,
        dst: &mut PayloadMut<'_>,
        off: usize,
        n: usize,
    ) -> Result<()> {
        match self {
            Copier::Host { map, base } => host::get(map, *base + at, dst, off, n),
            Copier::Cuda { c, base } => c.get(slot, *base + at, dst, off, n),
        }
    }

    /// The `n` bytes at byte `at` of this rank's slots, where they are (for a reduction
    /// straight from them; valid until the slot is handed back).
    pub fn lend(&self, at: usize, n: usize) -> Result<Payload<'_>> {
        match self {
            Copier::Host { map, base } => host::lend(map, *base + at, n),
            Copier::Cuda { c, base } => c.lend(*base + at, n),
        }
    }

    /// Whether a copy was started that [`Copier::done`] has not yet seen finish (the host
    /// provider copies at once).
    pub fn in_flight(&self) -> bool {
        match self {
            Copier::Host { .. } => false,
            Copier::Cuda { c, .. } => c.in_flight(),
        }
    }

    /// Whether the copy last started on `slot` is done.
    pub fn done(&mut self, slot: usize) -> Result<bool> {
        match self {
            Copier::Host { .. } => Ok(true),
            Copier::Cuda { c, .. } => c.done(slot),
        }
    }
}
