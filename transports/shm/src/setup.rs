//! The shared-memory transport's setup: a segment per rank with one ring per local peer, its
//! name as the connect handle; a peer attaches by mapping it; connections are built where both
//! sides mapped each other's segment, after which the owner unlinks its file.

use std::sync::Arc;

use ferroccl_transport::{
    log_line, Connection, Decline, Link, Properties, Result, SetupCtx, Spaces, Transport, WaitKind,
};

use crate::{segment_name, OwnSegment, PeerSegment, PeerWatch, ShmConfig, ShmConnection};

/// Shared memory between ranks of one host.
#[derive(Debug)]
pub struct ShmTransport {
    cfg: ShmConfig,
    verbose: bool,
    own: Option<OwnSegment>,
    mapped: Vec<Option<PeerSegment>>,
}

impl ShmTransport {
    /// A transport with `cfg`; `verbose` logs what setup swept from the segment directory.
    pub fn new(cfg: ShmConfig, verbose: bool) -> ShmTransport {
        ShmTransport {
            cfg,
            verbose,
            own: None,
            mapped: Vec::new(),
        }
    }
}

impl Transport for ShmTransport {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn properties(&self) -> Properties {
        Properties {
            link: Link::Shm,
            spaces: Spaces::HOST,
            one_sided: false,
            registration: false,
            wait: WaitKind::Doorbell,
            latency_us: 1.0,
            bandwidth_gbps: 6.0,
        }
    }

    fn can_connect(&self, ctx: &SetupCtx, peer: usize) -> std::result::Result<(), Decline> {
        if ctx.same_host(peer) {
            Ok(())
        } else {
            Err("on another host".to_string())
        }
    }

    fn listen(&mut self, ctx: &SetupCtx, peers: &[usize]) -> Result<Vec<u8>> {
        let name = segment_name(ctx.comm_id, ctx.rank);
        let own = OwnSegment::create(
            &self.cfg.dir,
            &name,
            ctx.comm_id,
            ctx.rank,
            peers,
            self.cfg.ring_bytes,
        )?;
        if own.swept() > 0 && self.verbose {
            log_line!(
                "ferroccl rank {} SHM: removed {} segment(s) of processes that are gone from {}",
                ctx.rank,
                own.swept(),
                self.cfg.dir.display()
            );
        }
        self.own = Some(own);
        self.mapped = (0..ctx.nranks).map(|_| None).collect();
        Ok(name.into_bytes())
    }

    fn attach(
        &mut self,
        ctx: &SetupCtx,
        peer: usize,
        handle: &[u8],
    ) -> std::result::Result<(), Decline> {
        let Some(own) = &self.own else {
            return Err("this rank has no segment".to_string());
        };
        let name = String::from_utf8_lossy(handle);
        if name.is_empty() || name.contains('/') {
            return Err(format!("rank {peer} offers a bad segment name {name:?}"));
        }
        let seg = PeerSegment::open(&self.cfg.dir, &name, ctx.comm_id, peer, ctx.rank)
            .map_err(|e| format!("cannot map rank {peer}'s segment: {e}"))?;
        if self.cfg.cma {
            ShmConnection::offer_cma(own, &seg);
        }
        self.mapped[peer] = Some(seg);
        Ok(())
    }

    fn connect(&mut self, ctx: &SetupCtx, peers: &[usize]) -> Result<Vec<Box<dyn Connection>>> {
        let Some(mut own) = self.own.take() else {
            return Ok(Vec::new());
        };
        // Every local peer has mapped this segment by now (attach ended before connect): the
        // name can go; the mappings stay alive through the connections.
        own.unlink();
        let mut conns = Vec::with_capacity(peers.len());
        for &p in peers {
            let seg = self.mapped[p].as_ref().ok_or_else(|| {
                ferroccl_transport::Error::internal(format!(
                    "shm: rank {} did not map rank {p}'s segment",
                    ctx.rank
                ))
            })?;
            conns.push(ShmConnection::new(&own, seg, &self.cfg)?);
        }
        // One thread per rank wakes it when a shared-memory peer's process exits.
        let pids: Vec<u32> = conns.iter().map(ShmConnection::peer_pid).collect();
        if let Some(watch) = PeerWatch::start(ctx.rank, &pids, own.bell()) {
            for c in &mut conns {
                c.set_watch(Arc::clone(&watch));
            }
        }
        self.mapped.clear();
        Ok(conns
            .into_iter()
            .map(|c| Box::new(c) as Box<dyn Connection>)
            .collect())
    }
}
