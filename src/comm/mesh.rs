//! Connecting every pair of ranks.

use std::net::SocketAddr;
use std::time::Instant;

use ferroccl_transport_tcp::{connect, TcpConfig, TcpEndpoint};

use crate::exec::Conn;
use crate::Result;

/// Connects `rank` to every other rank over TCP: it connects to higher ranks (whose addresses
/// are in `addrs`) and accepts lower ones on `endpoint`. Rank order makes this deadlock-free:
/// the highest rank only accepts.
pub(crate) fn connect_all(
    rank: usize,
    nranks: usize,
    comm_id: u64,
    endpoint: &TcpEndpoint,
    addrs: &dyn Fn(usize) -> Result<SocketAddr>,
    cfg: &TcpConfig,
    deadline: Instant,
) -> Result<Vec<Option<Conn>>> {
    let mut conns: Vec<Option<Conn>> = (0..nranks).map(|_| None).collect();
    for (peer, slot) in conns.iter_mut().enumerate().skip(rank + 1) {
        let addr = addrs(peer)?;
        let c = connect(rank, comm_id, peer, addr, cfg, deadline)?;
        *slot = Some(Conn::Tcp(c));
    }
    let lower: Vec<usize> = (0..rank).collect();
    if !lower.is_empty() {
        for c in endpoint.accept(rank, comm_id, &lower, cfg, deadline)? {
            let p = c_rank(&c);
            conns[p] = Some(Conn::Tcp(c));
        }
    }
    Ok(conns)
}

fn c_rank(c: &ferroccl_transport_tcp::TcpConnection) -> usize {
    use ferroccl_transport::Connection;
    c.peer().rank
}
