//! Connecting every pair of ranks, choosing the transport per pair.
//!
//! Per pair, the first transport of [`Config::transports`](super::Config::transports) that can
//! connect it wins: shared memory between ranks of one host (equal host ids) whose segments both
//! sides mapped, TCP otherwise. Both ranks of a pair decide from the same facts (host ids and
//! what each side published about its mappings), so they always agree.
//!
//! Shared memory is set up in three steps with an exchange between each, which the caller runs
//! through the store (init) or the parent communicator (split):
//! 1. [`create_segment`]: this rank's segment, if it prefers shared memory and has local peers;
//!    publish its name.
//! 2. [`map_segments`]: map the segments local peers published; publish which were mapped.
//! 3. [`connect_all`]: shared-memory connections where both sides mapped, TCP for the rest
//!    (connect to higher ranks, accept lower ones: deadlock-free); unlink this rank's segment,
//!    which every peer has mapped by now.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Instant;

use ferroccl_transport::Connection;
use ferroccl_transport_shm::{
    segment_name, OwnSegment, PeerSegment, PeerWatch, ShmConfig, ShmConnection,
};
use ferroccl_transport_tcp::{connect, TcpConfig, TcpEndpoint};

use super::config::{DebugLevel, Transport};
use crate::exec::Conn;
use crate::{Error, Result};

/// What connecting a rank needs to know.
#[derive(Debug)]
pub(crate) struct MeshConfig<'a> {
    pub rank: usize,
    pub nranks: usize,
    pub comm_id: u64,
    /// Host id of every rank.
    pub hosts: &'a [u64],
    pub transports: &'a [Transport],
    pub tcp: TcpConfig,
    pub shm: ShmConfig,
    pub debug: DebugLevel,
    pub deadline: Instant,
    /// One-way delay added to TCP connections across hosts (`FERRO_LINK_DELAY_US`).
    pub link_delay: std::time::Duration,
}

impl MeshConfig<'_> {
    /// Whether this rank would pick shared memory where it can (it comes before TCP).
    fn prefers_shm(&self) -> bool {
        let pos = |t| self.transports.iter().position(|&x| x == t);
        match (pos(Transport::Shm), pos(Transport::Tcp)) {
            (Some(s), Some(t)) => s < t,
            (Some(_), None) => true,
            _ => false,
        }
    }

    /// The other ranks on this rank's host, in rank order.
    fn local_peers(&self) -> Vec<usize> {
        let me = self.hosts[self.rank];
        (0..self.nranks)
            .filter(|&p| p != self.rank && self.hosts[p] == me)
            .collect()
    }
}

/// This rank's position on its host: (local rank, local nranks).
pub(crate) fn local_position(rank: usize, hosts: &[u64]) -> (usize, usize) {
    let me = hosts.get(rank).copied().unwrap_or(0);
    let local_rank = hosts[..rank.min(hosts.len())]
        .iter()
        .filter(|&&h| h == me)
        .count();
    let local_nranks = hosts.iter().filter(|&&h| h == me).count();
    (local_rank, local_nranks)
}

fn warn(rank: usize, what: impl std::fmt::Display) {
    ferroccl_transport::log_line!("ferroccl rank {rank} WARN: {what}");
}

/// Step 1: creates this rank's segment when it prefers shared memory and has peers on its host.
/// A failure (a full `/dev/shm`, say) is reported once and means TCP for this rank's local peers.
pub(crate) fn create_segment(mc: &MeshConfig) -> Option<OwnSegment> {
    if !mc.prefers_shm() {
        return None;
    }
    let peers = mc.local_peers();
    if peers.is_empty() {
        return None;
    }
    let name = segment_name(mc.comm_id, mc.rank);
    match OwnSegment::create(
        &mc.shm.dir,
        &name,
        mc.comm_id,
        mc.rank,
        &peers,
        mc.shm.ring_bytes,
    ) {
        Ok(s) => {
            if s.swept() > 0 && mc.debug >= DebugLevel::Info {
                ferroccl_transport::log_line!(
                    "ferroccl rank {} SHM: removed {} segment(s) of processes that are gone from {}",
                    mc.rank,
                    s.swept(),
                    mc.shm.dir.display()
                );
            }
            Some(s)
        }
        Err(e) => {
            warn(
                mc.rank,
                format_args!(
                    "shared memory is unavailable, falling back to TCP for the {} peer(s) on this host: {e}",
                    peers.len()
                ),
            );
            None
        }
    }
}

/// Step 2: maps the segment of every local peer that published one (`name_of(peer)`, `None`
/// when it offers none). Returns, per rank, the mapped segment. Mapping failures are warnings.
pub(crate) fn map_segments(
    mc: &MeshConfig,
    own: Option<&OwnSegment>,
    name_of: &dyn Fn(usize) -> Result<Option<String>>,
) -> Result<Vec<Option<PeerSegment>>> {
    let mut out: Vec<Option<PeerSegment>> = (0..mc.nranks).map(|_| None).collect();
    if own.is_none() {
        return Ok(out);
    }
    for p in mc.local_peers() {
        let Some(name) = name_of(p)? else { continue };
        if name.is_empty() || name.contains('/') {
            continue;
        }
        match PeerSegment::open(Path::new(&mc.shm.dir), &name, mc.comm_id, p, mc.rank) {
            Ok(s) => {
                if mc.shm.cma {
                    if let Some(own) = own {
                        ShmConnection::offer_cma(own, &s);
                    }
                }
                out[p] = Some(s)
            }
            Err(e) => warn(
                mc.rank,
                format_args!("cannot map rank {p}'s shared memory, using TCP with it: {e}"),
            ),
        }
    }
    Ok(out)
}

/// The ranks whose segments `mapped` holds (what this rank publishes after step 2).
pub(crate) fn mapped_ranks(mapped: &[Option<PeerSegment>]) -> Vec<usize> {
    mapped
        .iter()
        .enumerate()
        .filter_map(|(p, s)| s.as_ref().map(|_| p))
        .collect()
}

/// The connections of one rank and the transport chosen for each peer.
#[derive(Debug)]
pub(crate) struct Mesh {
    pub conns: Vec<Option<Conn>>,
    pub transports: Vec<Option<Transport>>,
}

/// Step 3: connects `rank` to every other rank. `mapped` comes from [`map_segments`];
/// `peer_mapped_me(p)` says whether local peer `p` published that it mapped this rank's segment
/// (it waits for the publication). TCP peers: connects to higher ranks (addresses from `addrs`)
/// and accepts lower ones on `endpoint`.
pub(crate) fn connect_all(
    mc: &MeshConfig,
    endpoint: &TcpEndpoint,
    addrs: &dyn Fn(usize) -> Result<SocketAddr>,
    own: Option<OwnSegment>,
    mapped: Vec<Option<PeerSegment>>,
    peer_mapped_me: &dyn Fn(usize) -> Result<bool>,
) -> Result<Mesh> {
    let (rank, nranks) = (mc.rank, mc.nranks);
    let mut own = own;
    // Whether each pair can use shared memory: both sides mapped the other's segment.
    let mut shm_ok = vec![false; nranks];
    if let Some(seg) = own.as_mut() {
        for p in mc.local_peers() {
            // Asked for every local peer: when all have answered, all have finished mapping.
            let theirs = peer_mapped_me(p)?;
            shm_ok[p] = theirs && mapped[p].is_some();
        }
        seg.unlink();
    }
    let mut choice: Vec<Option<Transport>> = vec![None; nranks];
    for (p, slot) in choice.iter_mut().enumerate() {
        if p == rank {
            continue;
        }
        let pick = mc.transports.iter().copied().find(|t| match t {
            Transport::Shm => shm_ok[p],
            Transport::Tcp => true,
        });
        match pick {
            Some(t) => *slot = Some(t),
            None => {
                let same = mc.hosts[p] == mc.hosts[rank];
                let names: Vec<&str> = mc.transports.iter().map(|t| t.name()).collect();
                return Err(Error::invalid_usage(format!(
                    "rank {rank}: no transport of FERRO_TRANSPORTS={} can reach rank {p} ({}); \
                     add tcp to the list",
                    names.join(","),
                    if same {
                        "on this host, but shared memory could not be set up"
                    } else {
                        "on another host"
                    }
                )));
            }
        }
    }
    let mut conns: Vec<Option<Conn>> = (0..nranks).map(|_| None).collect();
    if let Some(seg) = own.as_ref() {
        for (p, m) in mapped.iter().enumerate() {
            if let (Some(Transport::Shm), Some(peer_seg)) = (choice[p], m) {
                let c = ShmConnection::new(seg, peer_seg, &mc.shm)?;
                conns[p] = Some(Conn::Shm(c));
            }
        }
        // One thread per rank wakes it when a shared-memory peer's process exits.
        let pids: Vec<u32> = conns
            .iter()
            .filter_map(|c| match c {
                Some(Conn::Shm(c)) => Some(c.peer_pid()),
                _ => None,
            })
            .collect();
        if let Some(watch) = PeerWatch::start(rank, &pids, seg.bell()) {
            for c in conns.iter_mut() {
                if let Some(Conn::Shm(c)) = c {
                    c.set_watch(std::sync::Arc::clone(&watch));
                }
            }
        }
    }
    // The segments stay mapped through the connections; the names are gone.
    drop(mapped);
    drop(own);
    // Both ends of a pair see the same host ids, so both wrap or neither does.
    let tcp = |c: ferroccl_transport_tcp::TcpConnection| -> Result<Conn> {
        let p = c.peer().rank;
        if mc.link_delay.is_zero() || mc.hosts[p] == mc.hosts[rank] {
            return Ok(Conn::Tcp(c));
        }
        let d = ferroccl_transport::Delayed::new(c, mc.link_delay)?;
        Ok(Conn::DelayedTcp(Box::new(d)))
    };
    for p in rank + 1..nranks {
        if choice[p] == Some(Transport::Tcp) {
            let addr = addrs(p)?;
            let c = connect(rank, mc.comm_id, p, addr, &mc.tcp, mc.deadline)?;
            conns[p] = Some(tcp(c)?);
        }
    }
    let lower: Vec<usize> = (0..rank)
        .filter(|&p| choice[p] == Some(Transport::Tcp))
        .collect();
    if !lower.is_empty() {
        for c in endpoint.accept(rank, mc.comm_id, &lower, &mc.tcp, mc.deadline)? {
            let p = c.peer().rank;
            conns[p] = Some(tcp(c)?);
        }
    }
    if mc.debug >= DebugLevel::Info {
        let (lr, ln) = local_position(rank, mc.hosts);
        let list: Vec<String> = (0..nranks)
            .filter(|&p| p != rank)
            .map(|p| {
                let extra = match &conns[p] {
                    Some(Conn::Shm(c)) if c.cma_enabled() => " (+cma)".to_string(),
                    Some(Conn::DelayedTcp(c)) => format!(" (+{} us delay)", c.delay().as_micros()),
                    _ => String::new(),
                };
                format!("{p}:{}{extra}", choice[p].map_or("none", Transport::name))
            })
            .collect();
        ferroccl_transport::log_line!(
            "ferroccl rank {rank} TRANSPORT: local rank {lr} of {ln} on host {:016x}; peers {}",
            mc.hosts[rank],
            if list.is_empty() {
                "none".to_string()
            } else {
                list.join(", ")
            }
        );
    }
    Ok(Mesh {
        conns,
        transports: choice,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_positions_follow_rank_order_per_host() {
        let hosts = [7, 9, 7, 7, 9];
        assert_eq!(local_position(0, &hosts), (0, 3));
        assert_eq!(local_position(2, &hosts), (1, 3));
        assert_eq!(local_position(3, &hosts), (2, 3));
        assert_eq!(local_position(1, &hosts), (0, 2));
        assert_eq!(local_position(4, &hosts), (1, 2));
    }
}
