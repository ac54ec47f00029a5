//! The RDMA transport's setup: open the provider, create each peer's queue pairs and control
//! buffers at `listen`, publish their numbers and keys in the connect handle, move the queue
//! pairs to RTR/RTS towards the peer's at `attach`, hand out connections at `connect`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ferroccl_transport::{
    Connection, Decline, Error, Link, PeerInfo, Properties, Result, SetupCtx, Spaces, Transport,
    WaitKind,
};

use crate::conn::{ConnSettings, Ctrl, Endpoint, RdmaConnection, RemoteCtrl};
use crate::proto::{CTS_LEN, DEPTH, SLOT_HEAD};
use crate::soft::SoftDevice;
use crate::verbs::{PortAddr, QpEndpoint, Verbs, VerbsError};
use crate::{Provider, RdmaConfig};

const HANDLE_MAGIC: &[u8; 4] = b"rdm1";

/// RDMA between ranks (see the crate docs).
pub struct RdmaTransport {
    cfg: std::result::Result<RdmaConfig, String>,
    /// The opened provider, or why there is none.
    dev: std::result::Result<Arc<SoftDevice>, String>,
    pending: BTreeMap<usize, Endpoint<SoftDevice>>,
    remotes: BTreeMap<usize, (PeerInfo, RemoteCtrl)>,
}

impl std::fmt::Debug for RdmaTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaTransport")
            .field("cfg", &self.cfg)
            .field("dev", &self.dev)
            .field("pending", &self.pending.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl RdmaTransport {
    /// A transport with the settings of the environment (`FERRO_IB_*`); `verbose` logs which
    /// provider runs and why none does.
    pub fn from_env(verbose: bool) -> RdmaTransport {
        RdmaTransport::new(RdmaConfig::from_env(), verbose)
    }

    /// A transport with `cfg` (or the reason the settings are unusable).
    pub fn new(cfg: std::result::Result<RdmaConfig, String>, verbose: bool) -> RdmaTransport {
        let dev = match &cfg {
            Err(e) => Err(e.clone()),
            Ok(c) => open(c),
        };
        if verbose {
            match &dev {
                Ok(d) => crate::log(format_args!(
                    "using the software verbs provider {} port {} (test tooling, not a network)",
                    d.device(),
                    d.port()
                )),
                Err(why) => crate::log(format_args!("rdma is not offered: {why}")),
            }
        }
        RdmaTransport {
            cfg,
            dev,
            pending: BTreeMap::new(),
            remotes: BTreeMap::new(),
        }
    }

    fn settings(&self) -> Option<ConnSettings> {
        let c = self.cfg.as_ref().ok()?;
        Some(ConnSettings {
            nqps: c.qps_per_conn,
            chunk: c.chunk,
            eager: c.eager,
            attrs: c.qp_attrs(),
            keepalive: Duration::from_millis(c.keepalive_ms),
        })
    }
}

/// Opens the provider `cfg` asks for, or says why none can run.
fn open(cfg: &RdmaConfig) -> std::result::Result<Arc<SoftDevice>, String> {
    match cfg.provider {
        Provider::Verbs => Err(crate::real::probe().why_not()),
        Provider::Soft => {
            let d = SoftDevice::shared().map_err(|e| format!("software verbs provider: {e}"))?;
            if !cfg.hca.accepts(d.device(), d.port()) {
                return Err(format!(
                    "FERRO_IB_HCA excludes {} port {}, the only port there is",
                    d.device(),
                    d.port()
                ));
            }
            Ok(d)
        }
    }
}

fn build_endpoint(
    dev: &SoftDevice,
    s: &ConnSettings,
) -> std::result::Result<Endpoint<SoftDevice>, VerbsError> {
    let a = s.attrs;
    let depth = s.nqps * (a.max_send_wr + a.max_recv_wr) as usize + 16;
    let cq = dev.create_cq(depth)?;
    let mut qps = Vec::with_capacity(s.nqps);
    for q in 0..s.nqps {
        let mut qp = dev.create_qp(&cq, &a)?;
        for _ in 0..a.max_recv_wr {
            dev.post_recv(&mut qp, q as u64)?;
        }
        qps.push(qp);
    }
    let slot = SLOT_HEAD + s.eager;
    Ok(Endpoint {
        qps,
        cq,
        hdr_ring: Ctrl::new(dev, DEPTH * slot)?,
        cts_fifo: Ctrl::new(dev, DEPTH * CTS_LEN)?,
        hdr_tx: Ctrl::new(dev, DEPTH * slot)?,
        cts_tx: Ctrl::new(dev, DEPTH * CTS_LEN)?,
    })
}

/// A little-endian reader over a handle.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
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
}

/// What a peer's handle says to this rank.
struct PeerHandle {
    device: String,
    port: u8,
    addr: PortAddr,
    pid: u32,
    nqps: usize,
    eager: usize,
    psn: u32,
    qpns: Vec<u32>,
    remote: RemoteCtrl,
}

fn decode_handle(h: &[u8], me: usize) -> Option<std::result::Result<PeerHandle, String>> {
    let mut r = Reader(h);
    if r.take(4)? != HANDLE_MAGIC {
        return None;
    }
    let nqps = r.u8()? as usize;
    let eager = r.u32()? as usize;
    let port = r.u8()?;
    let lid = r.u16()?;
    let mut gid = [0u8; 16];
    gid.copy_from_slice(r.take(16)?);
    let pid = r.u32()?;
    let nlen = r.u8()? as usize;
    let device = String::from_utf8_lossy(r.take(nlen)?).into_owned();
    let count = r.u32()?;
    for _ in 0..count {
        let rank = r.u32()? as usize;
        let psn = r.u32()?;
        let qpns = (0..nqps).map(|_| r.u32()).collect::<Option<Vec<u32>>>()?;
        let remote = RemoteCtrl {
            hdr_addr: r.u64()?,
            hdr_rkey: r.u32()?,
            cts_addr: r.u64()?,
            cts_rkey: r.u32()?,
        };
        if rank == me {
            return Some(Ok(PeerHandle {
                device,
                port,
                addr: PortAddr { lid, gid },
                pid,
                nqps,
                eager,
                psn,
                qpns,
                remote,
            }));
        }
    }
    Some(Err(
        "its handle has no queue pairs for this rank".to_string()
    ))
}

impl Transport for RdmaTransport {
    fn name(&self) -> &'static str {
        "rdma"
    }

    fn properties(&self) -> Properties {
        Properties {
            link: Link::Rdma,
            spaces: Spaces::HOST,
            one_sided: true,
            registration: true,
            wait: WaitKind::Doorbell,
            latency_us: 2.0,
            bandwidth_gbps: 12.0,
        }
    }

    fn can_connect(&self, ctx: &SetupCtx, peer: usize) -> std::result::Result<(), Decline> {
        self.dev.as_ref().map_err(Clone::clone)?;
        if !ctx.same_host(peer) {
            return Err(format!(
                "rank {peer} runs on another host (the software verbs provider joins ranks of \
                 one host)"
            ));
        }
        Ok(())
    }

    fn listen(&mut self, ctx: &SetupCtx, peers: &[usize]) -> Result<Vec<u8>> {
        self.pending.clear();
        self.remotes.clear();
        let dev = self
            .dev
            .clone()
            .map_err(|why| Error::new(ferroccl_transport::ErrorKind::Unsupported, why))?;
        let s = self
            .settings()
            .ok_or_else(|| Error::internal("rdma settings missing"))?;
        let addr = dev.port_addr();
        let mut h = Vec::new();
        h.extend_from_slice(HANDLE_MAGIC);
        h.push(s.nqps as u8);
        h.extend_from_slice(&(s.eager as u32).to_le_bytes());
        h.push(dev.port());
        h.extend_from_slice(&addr.lid.to_le_bytes());
        h.extend_from_slice(&addr.gid);
        h.extend_from_slice(&std::process::id().to_le_bytes());
        let name = dev.device().as_bytes();
        h.push(name.len() as u8);
        h.extend_from_slice(name);
        h.extend_from_slice(&(peers.len() as u32).to_le_bytes());
        for &p in peers {
            let ep = build_endpoint(&dev, &s).map_err(|e| {
                Error::new(
                    ferroccl_transport::ErrorKind::System,
                    format!(
                        "rdma setup on rank {} for rank {p} ({} port {}): {e}",
                        ctx.rank,
                        dev.device(),
                        dev.port()
                    ),
                )
            })?;
            h.extend_from_slice(&(p as u32).to_le_bytes());
            h.extend_from_slice(&psn(ctx.rank, p).to_le_bytes());
            for q in &ep.qps {
                h.extend_from_slice(&dev.qp_num(q).to_le_bytes());
            }
            h.extend_from_slice(&(ep.hdr_ring.buf.addr() as u64).to_le_bytes());
            h.extend_from_slice(&crate::verbs::MemoryRegion::rkey(&ep.hdr_ring.mr).to_le_bytes());
            h.extend_from_slice(&(ep.cts_fifo.buf.addr() as u64).to_le_bytes());
            h.extend_from_slice(&crate::verbs::MemoryRegion::rkey(&ep.cts_fifo.mr).to_le_bytes());
            self.pending.insert(p, ep);
        }
        Ok(h)
    }

    fn attach(
        &mut self,
        ctx: &SetupCtx,
        peer: usize,
        handle: &[u8],
    ) -> std::result::Result<(), Decline> {
        let dev = self.dev.clone()?;
        let s = self.settings().ok_or("rdma settings missing")?;
        let ph = decode_handle(handle, ctx.rank)
            .ok_or_else(|| format!("rank {peer} offers a bad rdma handle"))?
            .map_err(|e| format!("rank {peer}: {e}"))?;
        if ph.nqps != s.nqps || ph.eager != s.eager {
            return Err(format!(
                "rank {peer} uses {} queue pairs per connection and {}-byte inline messages, \
                 this rank {} and {} (FERRO_IB_QPS_PER_CONN must agree)",
                ph.nqps, ph.eager, s.nqps, s.eager
            ));
        }
        let ep = self
            .pending
            .get_mut(&peer)
            .ok_or_else(|| format!("this rank made no queue pairs for rank {peer}"))?;
        let attrs = s.attrs;
        for (q, qp) in ep.qps.iter_mut().enumerate() {
            let remote = QpEndpoint {
                port: ph.addr,
                qpn: ph.qpns[q],
                psn: ph.psn,
                mtu: 4096,
            };
            dev.connect_qp(qp, &remote, psn(ctx.rank, peer), &attrs)
                .map_err(|e| {
                    format!(
                        "cannot connect to rank {peer} ({} port {}): {e}",
                        ph.device, ph.port
                    )
                })?;
        }
        let info = PeerInfo {
            rank: peer,
            addr: format!("{} port {}, pid {}", ph.device, ph.port, ph.pid),
        };
        self.remotes.insert(peer, (info, ph.remote));
        Ok(())
    }

    fn connect(&mut self, ctx: &SetupCtx, peers: &[usize]) -> Result<Vec<Box<dyn Connection>>> {
        let mut out: Vec<Box<dyn Connection>> = Vec::with_capacity(peers.len());
        if let (Ok(dev), Some(s)) = (self.dev.clone(), self.settings()) {
            for &p in peers {
                let (ep, (info, remote)) = self
                    .pending
                    .remove(&p)
                    .zip(self.remotes.remove(&p))
                    .ok_or_else(|| {
                        Error::internal(format!(
                            "rdma setup on rank {}: rank {p} was not attached",
                            ctx.rank
                        ))
                    })?;
                out.push(Box::new(RdmaConnection::new(
                    Arc::clone(&dev),
                    ctx.rank,
                    info,
                    s,
                    ep,
                    remote,
                )));
            }
        }
        self.pending.clear();
        self.remotes.clear();
        Ok(out)
    }
}

/// The initial packet sequence number of rank `a`'s queue pairs towards `b` (24 bits).
fn psn(a: usize, b: usize) -> u32 {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&(a as u64).to_le_bytes());
    k[8..].copy_from_slice(&(b as u64).to_le_bytes());
    (ferroccl_transport::hash64(&[&k]) & 0xff_ffff) as u32
}

/// A connected pair over the software provider, each end with `cfg`: what setup builds,
/// without a communicator (tests, benchmarks).
pub fn soft_pair(
    a: usize,
    b: usize,
    cfg: &RdmaConfig,
) -> std::result::Result<(RdmaConnection<SoftDevice>, RdmaConnection<SoftDevice>), VerbsError> {
    let dev = SoftDevice::shared()?;
    soft_pair_on(dev, a, b, cfg)
}

/// [`soft_pair`] on a given device (one with faults of its own).
pub fn soft_pair_on(
    dev: Arc<SoftDevice>,
    a: usize,
    b: usize,
    cfg: &RdmaConfig,
) -> std::result::Result<(RdmaConnection<SoftDevice>, RdmaConnection<SoftDevice>), VerbsError> {
    let s = ConnSettings {
        nqps: cfg.qps_per_conn,
        chunk: cfg.chunk,
        eager: cfg.eager,
        attrs: cfg.qp_attrs(),
        keepalive: Duration::from_millis(cfg.keepalive_ms),
    };
    let mut ea = build_endpoint(&dev, &s)?;
    let mut eb = build_endpoint(&dev, &s)?;
    let addr = dev.port_addr();
    let ends = |e: &Endpoint<SoftDevice>| -> Vec<QpEndpoint> {
        e.qps
            .iter()
            .map(|q| QpEndpoint {
                port: addr,
                qpn: dev.qp_num(q),
                psn: 0,
                mtu: 4096,
            })
            .collect()
    };
    let (qa, qb) = (ends(&ea), ends(&eb));
    for (qp, r) in ea.qps.iter_mut().zip(&qb) {
        dev.connect_qp(qp, r, 0, &s.attrs)?;
    }
    for (qp, r) in eb.qps.iter_mut().zip(&qa) {
        dev.connect_qp(qp, r, 0, &s.attrs)?;
    }
    let ctrl = |e: &Endpoint<SoftDevice>| RemoteCtrl {
        hdr_addr: e.hdr_ring.buf.addr() as u64,
        hdr_rkey: crate::verbs::MemoryRegion::rkey(&e.hdr_ring.mr),
        cts_addr: e.cts_fifo.buf.addr() as u64,
        cts_rkey: crate::verbs::MemoryRegion::rkey(&e.cts_fifo.mr),
    };
    let (ra, rb) = (ctrl(&ea), ctrl(&eb));
    let pid = std::process::id();
    let info = |r: usize| PeerInfo {
        rank: r,
        addr: format!("soft0 port 1, pid {pid}"),
    };
    Ok((
        RdmaConnection::new(Arc::clone(&dev), a, info(b), s, ea, rb),
        RdmaConnection::new(dev, b, info(a), s, eb, ra),
    ))
}
