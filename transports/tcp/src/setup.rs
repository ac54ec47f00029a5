//! The TCP transport's setup: a listening socket per communicator, its address as the connect
//! handle, then connect to higher ranks and accept lower ones (deadlock-free).

use std::net::{IpAddr, SocketAddr};

use ferroccl_transport::{
    Connection, Decline, Link, Properties, Result, SetupCtx, Spaces, Transport, WaitKind,
};

use crate::{connect, TcpConfig, TcpEndpoint};

/// TCP between any two ranks that can reach each other's address.
#[derive(Debug)]
pub struct TcpTransport {
    cfg: TcpConfig,
    ip: IpAddr,
    endpoint: Option<TcpEndpoint>,
    addrs: Vec<Option<SocketAddr>>,
}

impl TcpTransport {
    /// Listens on `ip` (the address peers reach this rank at) with `cfg`.
    pub fn new(cfg: TcpConfig, ip: IpAddr) -> TcpTransport {
        TcpTransport {
            cfg,
            ip,
            endpoint: None,
            addrs: Vec::new(),
        }
    }

    /// The address this rank listens on, once it listens.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.endpoint.as_ref().map(TcpEndpoint::addr)
    }
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn properties(&self) -> Properties {
        Properties {
            link: Link::Tcp,
            spaces: Spaces::HOST,
            one_sided: false,
            registration: false,
            wait: WaitKind::Descriptors,
            latency_us: 20.0,
            bandwidth_gbps: 2.0,
        }
    }

    fn can_connect(&self, _ctx: &SetupCtx, _peer: usize) -> std::result::Result<(), Decline> {
        Ok(())
    }

    fn listen(&mut self, ctx: &SetupCtx, _peers: &[usize]) -> Result<Vec<u8>> {
        let ep = TcpEndpoint::listen(self.ip)?;
        let handle = ep.addr().to_string().into_bytes();
        self.endpoint = Some(ep);
        self.addrs = vec![None; ctx.nranks];
        Ok(handle)
    }

    fn attach(
        &mut self,
        _ctx: &SetupCtx,
        peer: usize,
        handle: &[u8],
    ) -> std::result::Result<(), Decline> {
        let text = String::from_utf8_lossy(handle);
        let addr: SocketAddr = text
            .parse()
            .map_err(|_| format!("rank {peer} published a bad address {text:?}"))?;
        self.addrs[peer] = Some(addr);
        Ok(())
    }

    fn connect(&mut self, ctx: &SetupCtx, peers: &[usize]) -> Result<Vec<Box<dyn Connection>>> {
        let mut out: Vec<Box<dyn Connection>> = Vec::with_capacity(peers.len());
        let Some(ep) = self.endpoint.take() else {
            return Ok(out);
        };
        for &p in peers.iter().filter(|&&p| p > ctx.rank) {
            let addr = self.addrs[p].ok_or_else(|| {
                ferroccl_transport::Error::internal(format!("tcp: no address for rank {p}"))
            })?;
            let c = connect(ctx.rank, ctx.comm_id, p, addr, &self.cfg, ctx.deadline)?;
            out.push(Box::new(c));
        }
        let lower: Vec<usize> = peers.iter().copied().filter(|&p| p < ctx.rank).collect();
        if !lower.is_empty() {
            for c in ep.accept(ctx.rank, ctx.comm_id, &lower, &self.cfg, ctx.deadline)? {
                out.push(Box::new(c));
            }
        }
        Ok(out)
    }
}
