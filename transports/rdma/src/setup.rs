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
use crate::real::{RealDevice, RealPort};
use crate::soft::SoftDevice;
use crate::verbs::{MemoryRegion, PortAddr, QpEndpoint, Verbs, VerbsError};
use crate::{Provider, RdmaConfig};

const HANDLE_MAGIC: &[u8; 4] = b"rdm1";

/// One provider's setup state: its port, and the endpoints and peers between `listen` and
/// `connect`.
struct Setup<V: Verbs> {
    dev: Arc<V>,
    /// Whether the provider joins only ranks of one host (the software one).
    one_host: bool,
    /// Path MTU of the port, bytes.
    mtu: u32,
    pending: BTreeMap<usize, Endpoint<V>>,
    remotes: BTreeMap<usize, (PeerInfo, RemoteCtrl)>,
}

/// The provider in use, or why there is none.
enum State {
    Soft(Setup<SoftDevice>),
    Real(Setup<RealPort>),
    Off(String),
}

/// RDMA between ranks (see the crate docs).
pub struct RdmaTransport {
    cfg: std::result::Result<RdmaConfig, String>,
    state: State,
}

impl std::fmt::Debug for RdmaTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Soft(s) => format!("soft {}", s.dev.device()),
            State::Real(s) => format!("verbs {} port {}", s.dev.device(), s.dev.port()),
            State::Off(why) => format!("off: {why}"),
        };
        f.debug_struct("RdmaTransport")
            .field("cfg", &self.cfg)
            .field("state", &state)
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
        let state = match &cfg {
            Err(e) => State::Off(e.clone()),
            Ok(c) => open(c),
        };
        if verbose {
            match &state {
                State::Soft(s) => crate::log(format_args!(
                    "using the software verbs provider {} port {} (test tooling, not a network)",
                    s.dev.device(),
                    s.dev.port()
                )),
                State::Real(s) => crate::log(format_args!(
                    "using libibverbs: {} port {}, MTU {}",
                    s.dev.device(),
                    s.dev.port(),
                    s.mtu
                )),
                State::Off(why) => crate::log(format_args!("rdma is not offered: {why}")),
            }
        }
        RdmaTransport { cfg, state }
    }

    fn settings(&self) -> Option<ConnSettings> {
        let c = self.cfg.as_ref().ok()?;
        Some(ConnSettings {
            nqps: c.qps_per_conn,
            chunk: c.chunk,
            eager: c.eager,
            attrs: c.qp_attrs(),
            keepalive: Duration::from_millis(c.keepalive_ms),
            cache_regs: matches!(self.state, State::Soft(_)),
        })
    }
}

impl<V: Verbs> Setup<V> {
    fn new(dev: Arc<V>, one_host: bool, mtu: u32) -> Setup<V> {
        Setup {
            dev,
            one_host,
            mtu,
            pending: BTreeMap::new(),
            remotes: BTreeMap::new(),
        }
    }
}

/// Opens the provider `cfg` asks for, or says why none can run.
fn open(cfg: &RdmaConfig) -> State {
    match cfg.provider {
        Provider::Verbs => match RealDevice::open(&cfg.hca, cfg.gid_index) {
            Ok(d) => {
                let port = RealPort(Arc::new(d));
                let mtu = port.mtu_bytes();
                State::Real(Setup::new(Arc::new(port), false, mtu))
            }
            Err(why) => State::Off(why),
        },
        Provider::Soft => {
            let d = match SoftDevice::shared() {
                Ok(d) => d,
                Err(e) => return State::Off(format!("software verbs provider: {e}")),
            };
            if !cfg.hca.accepts(d.device(), d.port()) {
                return State::Off(format!(
                    "FERRO_IB_HCA excludes {} port {}, the only port there is",
                    d.device(),
                    d.port()
                ));
            }
            State::Soft(Setup::new(d, true, 4096))
        }
    }
}

fn build_endpoint<V: Verbs>(
    dev: &V,
    s: &ConnSettings,
) -> std::result::Result<Endpoint<V>, VerbsError> {
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
    mtu: u32,
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
    let mtu = r.u32()?;
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
                mtu,
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
        let one_host = match &self.state {
            State::Off(why) => return Err(why.clone()),
            State::Soft(s) => s.one_host,
            State::Real(s) => s.one_host,
        };
        if one_host && !ctx.same_host(peer) {
            return Err(format!(
                "rank {peer} runs on another host (the software verbs provider joins ranks of \
                 one host)"
            ));
        }
        Ok(())
    }

    fn listen(&mut self, ctx: &SetupCtx, peers: &[usize]) -> Result<Vec<u8>> {
        let s = self
            .settings()
            .ok_or_else(|| Error::internal("rdma settings missing"))?;
        match &mut self.state {
            State::Off(why) => Err(Error::new(
                ferroccl_transport::ErrorKind::Unsupported,
                why.clone(),
            )),
            State::Soft(st) => st.listen(ctx, peers, &s),
            State::Real(st) => st.listen(ctx, peers, &s),
        }
    }

    fn attach(
        &mut self,
        ctx: &SetupCtx,
        peer: usize,
        handle: &[u8],
    ) -> std::result::Result<(), Decline> {
        let s = self.settings().ok_or("rdma settings missing")?;
        match &mut self.state {
            State::Off(why) => Err(why.clone()),
            State::Soft(st) => st.attach(ctx, peer, handle, &s),
            State::Real(st) => st.attach(ctx, peer, handle, &s),
        }
    }

    fn connect(&mut self, ctx: &SetupCtx, peers: &[usize]) -> Result<Vec<Box<dyn Connection>>> {
        let Some(s) = self.settings() else {
            return Ok(Vec::new());
        };
        match &mut self.state {
            State::Off(_) => Ok(Vec::new()),
            State::Soft(st) => st.connect(ctx, peers, &s),
            State::Real(st) => st.connect(ctx, peers, &s),
        }
    }
}

impl<V: Verbs> Setup<V> {
    fn listen(&mut self, ctx: &SetupCtx, peers: &[usize], s: &ConnSettings) -> Result<Vec<u8>> {
        self.pending.clear();
        self.remotes.clear();
        let dev = Arc::clone(&self.dev);
        let addr = dev.port_addr();
        let mut h = Vec::new();
        h.extend_from_slice(HANDLE_MAGIC);
        h.push(s.nqps as u8);
        h.extend_from_slice(&(s.eager as u32).to_le_bytes());
        h.push(dev.port());
        h.extend_from_slice(&self.mtu.to_le_bytes());
        h.extend_from_slice(&addr.lid.to_le_bytes());
        h.extend_from_slice(&addr.gid);
        h.extend_from_slice(&std::process::id().to_le_bytes());
        let name = dev.device().as_bytes();
        h.push(name.len() as u8);
        h.extend_from_slice(name);
        h.extend_from_slice(&(peers.len() as u32).to_le_bytes());
        for &p in peers {
            let ep = build_endpoint(&*dev, s).map_err(|e| {
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
            h.extend_from_slice(&ep.hdr_ring.mr.rkey().to_le_bytes());
            h.extend_from_slice(&(ep.cts_fifo.buf.addr() as u64).to_le_bytes());
            h.extend_from_slice(&ep.cts_fifo.mr.rkey().to_le_bytes());
            self.pending.insert(p, ep);
        }
        Ok(h)
    }

    fn attach(
        &mut self,
        ctx: &SetupCtx,
        peer: usize,
        handle: &[u8],
        s: &ConnSettings,
    ) -> std::result::Result<(), Decline> {
        let ph = decode_handle(handle, ctx.rank)
            .ok_or_else(|| format!("rank {peer} offers a bad rdma handle"))?
            .map_err(|e| format!("rank {peer}: {e}"))?;
        if ph.nqps != s.nqps || ph.eager != s.eager {
            return Err(format!(
                "rank {peer} uses {} queue pairs per connection and {}-byte inline messages, \
                 this rank {} and {} (FERRO_IB_QPS_PER_CONN and FERRO_IB_EAGER must agree)",
                ph.nqps, ph.eager, s.nqps, s.eager
            ));
        }
        let ep = self
            .pending
            .get_mut(&peer)
            .ok_or_else(|| format!("this rank made no queue pairs for rank {peer}"))?;
        for (q, qp) in ep.qps.iter_mut().enumerate() {
            let remote = QpEndpoint {
                port: ph.addr,
                qpn: ph.qpns[q],
                psn: ph.psn,
                mtu: ph.mtu,
            };
            self.dev
                .connect_qp(qp, &remote, psn(ctx.rank, peer), &s.attrs)
                .map_err(|e| {
                    format!(
                        "cannot connect to rank {peer} ({} port {}): {e}",
                        ph.device, ph.port
                    )
                })?;
        }
        let whence = if self.one_host {
            format!("pid {}", ph.pid)
        } else if ph.addr.lid != 0 {
            format!("lid {}", ph.addr.lid)
        } else {
            format!("gid {}", gid_text(&ph.addr.gid))
        };
        let info = PeerInfo {
            rank: peer,
            addr: format!("{} port {}, {whence}", ph.device, ph.port),
        };
        self.remotes.insert(peer, (info, ph.remote));
        Ok(())
    }

    fn connect(
        &mut self,
        ctx: &SetupCtx,
        peers: &[usize],
        s: &ConnSettings,
    ) -> Result<Vec<Box<dyn Connection>>> {
        let mut out: Vec<Box<dyn Connection>> = Vec::with_capacity(peers.len());
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
                Arc::clone(&self.dev),
                ctx.rank,
                info,
                *s,
                ep,
                remote,
            )));
        }
        self.pending.clear();
        self.remotes.clear();
        Ok(out)
    }
}

/// A GID as eight groups of hex digits (IPv6 style).
fn gid_text(g: &[u8; 16]) -> String {
    g.chunks(2)
        .map(|c| format!("{:x}", u16::from_be_bytes([c[0], c[1]])))
        .collect::<Vec<_>>()
        .join(":")
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
    soft_pair_with(dev, a, b, cfg, true)
}

/// [`soft_pair_on`], choosing whether the connections cache their own registrations (the real
/// provider does not; tests run that path over the software one).
pub(crate) fn soft_pair_with(
    dev: Arc<SoftDevice>,
    a: usize,
    b: usize,
    cfg: &RdmaConfig,
    cache_regs: bool,
) -> std::result::Result<(RdmaConnection<SoftDevice>, RdmaConnection<SoftDevice>), VerbsError> {
    let s = ConnSettings {
        nqps: cfg.qps_per_conn,
        chunk: cfg.chunk,
        eager: cfg.eager,
        attrs: cfg.qp_attrs(),
        keepalive: Duration::from_millis(cfg.keepalive_ms),
        cache_regs,
    };
    let mut ea = build_endpoint(&*dev, &s)?;
    let mut eb = build_endpoint(&*dev, &s)?;
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
        hdr_rkey: e.hdr_ring.mr.rkey(),
        cts_addr: e.cts_fifo.buf.addr() as u64,
        cts_rkey: e.cts_fifo.mr.rkey(),
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
