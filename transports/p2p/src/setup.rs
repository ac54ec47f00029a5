//! The p2p transport's setup: at `listen` every rank allocates its receive slots (one ring per
//! accepted peer) and its control segment and puts both handles in its connect handle; at
//! `attach` a peer checks that its memory can reach them (the same GPU, or peer access) and
//! maps them; at `connect` the names go and connections are built.
//!
//! Connect handle (little endian): `p2p1`, provider (1 byte), slots (u32), slot bytes (u64),
//! pid (u32), device id (u8 length + bytes: `host` or the GPU's PCI bus id), control segment
//! name (u16 length + bytes), slots handle (u16 length + bytes: the host provider's file name,
//! or pid + address + length + `CUipcMemHandle`), then per peer its rank (u32) and the offset
//! of its ring (u64).

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use ferroccl_transport::{
    Connection, Decline, Error, ErrorKind, Link, PeerInfo, Properties, Result, SetupCtx, Spaces,
    Transport, WaitKind,
};
use ferroccl_transport_shm::PeerWatch;

use crate::conn::{P2pConnection, Parts};
use crate::proto::Layout;
use crate::provider::{Copier, OwnArea, PeerArea, Provider, ProviderKind};
use crate::segment::{self, OwnCtl, PeerCtl};
use crate::{file_name, P2pConfig};

const MAGIC: &[u8; 4] = b"p2p1";

/// What `listen` made.
#[derive(Debug)]
struct Listening {
    ctl: OwnCtl,
    area: OwnArea,
}

/// What `attach` mapped of one peer.
#[derive(Debug)]
struct Attached {
    ctl: PeerCtl,
    area: PeerArea,
    base: usize,
    pid: u32,
    device: String,
}

/// GPU peer-to-peer between ranks of one host (see the crate docs).
#[derive(Debug)]
pub struct P2pTransport {
    cfg: std::result::Result<P2pConfig, String>,
    verbose: bool,
    provider: OnceLock<std::result::Result<Provider, String>>,
    listening: Option<Listening>,
    attached: BTreeMap<usize, Attached>,
}

impl P2pTransport {
    /// A transport with the settings of the environment (`FERRO_P2P_*`); `verbose` logs the
    /// provider, or why there is none.
    pub fn from_env(verbose: bool) -> P2pTransport {
        P2pTransport::new(P2pConfig::from_env(), verbose)
    }

    /// A transport with `cfg` (or the reason the settings are unusable).
    pub fn new(cfg: std::result::Result<P2pConfig, String>, verbose: bool) -> P2pTransport {
        P2pTransport {
            cfg,
            verbose,
            provider: OnceLock::new(),
            listening: None,
            attached: BTreeMap::new(),
        }
    }

    /// The provider, opened on first use (the cuda provider picks its device by local rank).
    fn provider(&self, ctx: &SetupCtx) -> std::result::Result<&Provider, String> {
        self.provider
            .get_or_init(|| {
                let cfg = self.cfg.as_ref().map_err(Clone::clone)?;
                let local = (0..ctx.rank).filter(|&r| ctx.same_host(r)).count() as u32;
                let p = Provider::open(cfg.provider, cfg.device, local);
                if self.verbose {
                    match &p {
                        Ok(p) => crate::log(format_args!(
                            "rank {}: provider {}: {}",
                            ctx.rank,
                            p.kind().name(),
                            p.describe()
                        )),
                        Err(why) => {
                            crate::log(format_args!("rank {}: p2p is not offered: {why}", ctx.rank))
                        }
                    }
                }
                p
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    fn cfg(&self) -> Result<&P2pConfig> {
        self.cfg
            .as_ref()
            .map_err(|e| Error::new(ErrorKind::InvalidArgument, e.clone()))
    }
}

fn put_bytes(h: &mut Vec<u8>, b: &[u8], wide: bool) {
    if wide {
        h.extend_from_slice(&(b.len() as u16).to_le_bytes());
    } else {
        h.push(b.len() as u8);
    }
    h.extend_from_slice(b);
}

/// A little-endian reader over a handle.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Option<u64> {
        let mut w = [0u8; 8];
        w.copy_from_slice(self.take(8)?);
        Some(u64::from_le_bytes(w))
    }
    fn text(&mut self, wide: bool) -> Option<&'a [u8]> {
        let n = if wide {
            self.u16()? as usize
        } else {
            self.u8()? as usize
        };
        self.take(n)
    }
}

/// A peer's handle, as it concerns this rank.
struct PeerHandle<'a> {
    provider: u8,
    layout: Layout,
    pid: u32,
    device: String,
    ctl_name: String,
    export: &'a [u8],
    base: usize,
}

fn decode(h: &[u8], me: usize) -> Option<std::result::Result<PeerHandle<'_>, String>> {
    let mut r = Reader(h);
    if r.take(4)? != MAGIC {
        return None;
    }
    let provider = r.u8()?;
    let nslots = r.u32()? as usize;
    let slot_bytes = r.u64()? as usize;
    let pid = r.u32()?;
    let device = String::from_utf8_lossy(r.text(false)?).into_owned();
    let ctl_name = String::from_utf8_lossy(r.text(true)?).into_owned();
    let export = r.text(true)?;
    let count = r.u32()?;
    for _ in 0..count {
        let rank = r.u32()? as usize;
        let base = r.u64()? as usize;
        if rank == me {
            return Some(Ok(PeerHandle {
                provider,
                layout: Layout { nslots, slot_bytes },
                pid,
                device,
                ctl_name,
                export,
                base,
            }));
        }
    }
    Some(Err("its handle has no ring for this rank".to_string()))
}

fn provider_code(k: ProviderKind) -> u8 {
    match k {
        ProviderKind::Cuda => 1,
        ProviderKind::Host => 2,
    }
}

impl Transport for P2pTransport {
    fn name(&self) -> &'static str {
        "p2p"
    }

    fn properties(&self) -> Properties {
        let spaces = match self.provider.get() {
            Some(Ok(p)) => p.spaces(),
            _ => Spaces::HOST,
        };
        Properties {
            link: Link::Nvlink,
            spaces,
            one_sided: false,
            registration: false,
            wait: WaitKind::Doorbell,
            latency_us: 2.0,
            bandwidth_gbps: 100.0,
        }
    }

    fn can_connect(&self, ctx: &SetupCtx, peer: usize) -> std::result::Result<(), Decline> {
        if !ctx.same_host(peer) {
            return Err("on another host".to_string());
        }
        self.provider(ctx).map(|_| ())
    }

    fn listen(&mut self, ctx: &SetupCtx, peers: &[usize]) -> Result<Vec<u8>> {
        let cfg = self.cfg()?.clone();
        let provider = self
            .provider(ctx)
            .map_err(|why| Error::new(ErrorKind::Unsupported, why))?;
        let layout = cfg.layout();
        let ring = layout.nslots * layout.slot_bytes;
        let swept = segment::sweep(&cfg.dir);
        if swept > 0 && self.verbose {
            crate::log(format_args!(
                "rank {}: removed {swept} segment(s) of processes that are gone from {}",
                ctx.rank,
                cfg.dir.display()
            ));
        }
        let ctl_name = file_name(ctx.comm_id, ctx.rank, "ctl");
        let area_name = file_name(ctx.comm_id, ctx.rank, "slots");
        let ctl = OwnCtl::create(
            &cfg.dir,
            &ctl_name,
            ctx.comm_id,
            ctx.rank,
            peers,
            layout.nslots,
        )?;
        let area = provider.alloc(&cfg.dir, &area_name, ring * peers.len())?;
        let mut h = Vec::new();
        h.extend_from_slice(MAGIC);
        h.push(provider_code(provider.kind()));
        h.extend_from_slice(&(layout.nslots as u32).to_le_bytes());
        h.extend_from_slice(&(layout.slot_bytes as u64).to_le_bytes());
        h.extend_from_slice(&std::process::id().to_le_bytes());
        put_bytes(&mut h, provider.device_id().as_bytes(), false);
        put_bytes(&mut h, ctl_name.as_bytes(), true);
        put_bytes(&mut h, &area.export(&area_name), true);
        h.extend_from_slice(&(peers.len() as u32).to_le_bytes());
        for (i, &p) in peers.iter().enumerate() {
            h.extend_from_slice(&(p as u32).to_le_bytes());
            h.extend_from_slice(&((i * ring) as u64).to_le_bytes());
        }
        self.attached.clear();
        self.listening = Some(Listening { ctl, area });
        Ok(h)
    }

    fn attach(
        &mut self,
        ctx: &SetupCtx,
        peer: usize,
        handle: &[u8],
    ) -> std::result::Result<(), Decline> {
        let cfg = self.cfg.as_ref().map_err(Clone::clone)?.clone();
        let provider = self.provider(ctx)?;
        if self.listening.is_none() {
            return Err("this rank has no receive slots".to_string());
        }
        let ph = decode(handle, ctx.rank)
            .ok_or_else(|| format!("rank {peer} offers a bad p2p handle"))?
            .map_err(|e| format!("rank {peer}: {e}"))?;
        if ph.provider != provider_code(provider.kind()) || ph.layout != cfg.layout() {
            return Err(format!(
                "rank {peer} uses another provider or ring ({} slots of {} bytes; this rank \
                 {} of {}): FERRO_P2P_PROVIDER, FERRO_P2P_SLOTS and FERRO_P2P_SLOT_BYTES must agree",
                ph.layout.nslots,
                ph.layout.slot_bytes,
                cfg.nslots,
                cfg.slot_bytes
            ));
        }
        provider
            .can_reach(&ph.device)
            .map_err(|why| format!("rank {peer}: {why}"))?;
        if ph.ctl_name.is_empty() || ph.ctl_name.contains('/') {
            return Err(format!(
                "rank {peer} offers a bad control segment name {:?}",
                ph.ctl_name
            ));
        }
        let ring = ph.layout.nslots * ph.layout.slot_bytes;
        let ctl = PeerCtl::open(
            &cfg.dir,
            &ph.ctl_name,
            ctx.comm_id,
            peer,
            ctx.rank,
            ph.layout.nslots,
        )
        .map_err(|e| format!("cannot map rank {peer}'s control segment: {e}"))?;
        if ctl.owner_pid != ph.pid {
            return Err(format!(
                "rank {peer}'s control segment names process {}, its handle {}",
                ctl.owner_pid, ph.pid
            ));
        }
        let area = provider
            .open_peer(&cfg.dir, ph.export, ph.base + ring)
            .map_err(|e| format!("cannot map rank {peer}'s receive slots: {e}"))?;
        let (base, pid, device) = (ph.base, ph.pid, ph.device);
        self.attached.insert(
            peer,
            Attached {
                ctl,
                area,
                base,
                pid,
                device,
            },
        );
        Ok(())
    }

    fn connect(&mut self, ctx: &SetupCtx, peers: &[usize]) -> Result<Vec<Box<dyn Connection>>> {
        let Some(mut own) = self.listening.take() else {
            return Ok(Vec::new());
        };
        // Every peer has mapped both by now (attach ended before connect): the names can go.
        own.ctl.unlink();
        own.area.unlink();
        let mut attached = std::mem::take(&mut self.attached);
        let cfg = self.cfg()?.clone();
        let layout = cfg.layout();
        let ring = layout.nslots * layout.slot_bytes;
        let provider = self
            .provider(ctx)
            .map_err(|why| Error::new(ErrorKind::Unsupported, why))?;
        let my_bell = segment::bell(&own.ctl.shared);
        let mut conns = Vec::with_capacity(peers.len());
        for &p in peers {
            let missing = || {
                Error::internal(format!(
                    "p2p setup on rank {}: rank {p} was not attached",
                    ctx.rank
                ))
            };
            let a = attached.remove(&p).ok_or_else(missing)?;
            let slot = own
                .ctl
                .senders
                .iter()
                .position(|&s| s == p)
                .ok_or_else(missing)?;
            let rx = own.ctl.block(slot);
            let same_process = ctx.same_process(p);
            let describe = match provider.kind() {
                ProviderKind::Host => "host provider (test stand-in)".to_string(),
                ProviderKind::Cuda => format!("{} -> {}", provider.device_id(), a.device),
            };
            conns.push(P2pConnection::new(Parts {
                peer: PeerInfo {
                    rank: p,
                    addr: format!("p2p {}, pid {}", provider.kind().name(), a.pid),
                },
                layout,
                tx: a.ctl.block.clone(),
                rx,
                peer_bell: segment::bell(&a.ctl.shared),
                tx_copier: Copier::sending(a.area, a.base, layout.nslots)?,
                rx_copier: Copier::receiving(&own.area, slot * ring, layout.nslots, provider)?,
                my_bell: Arc::clone(&my_bell),
                peer_pid: a.pid,
                same_process,
                describe,
            }));
        }
        let pids: Vec<u32> = conns.iter().map(P2pConnection::peer_pid).collect();
        if let Some(watch) = PeerWatch::start(ctx.rank, &pids, Arc::clone(&my_bell)) {
            for c in &mut conns {
                c.set_watch(Arc::clone(&watch));
            }
        }
        Ok(conns
            .into_iter()
            .map(|c| Box::new(c) as Box<dyn Connection>)
            .collect())
    }
}
