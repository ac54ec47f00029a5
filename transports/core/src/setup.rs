//! The setup half of the contract: how a transport decides whether it can join two ranks, what
//! it tells the peer, and how it turns the peer's answer into a [`Connection`].
//!
//! Setup runs once per communicator (init or split), driven by ferroccl's selection loop in
//! three rounds that every rank runs in step:
//!
//! 1. **Decide and listen.** For each peer, [`Transport::can_connect`] decides from the ranks'
//!    descriptions alone (both ends reach the same answer). [`Transport::listen`] then prepares
//!    for the peers it accepted and returns this rank's *connect handle*: opaque bytes every peer
//!    receives (a socket address, a shared-memory segment name, queue-pair numbers).
//! 2. **Attach.** [`Transport::attach`] reads a peer's handle and says whether this side can
//!    reach the peer through it (map its segment, say). Ranks then learn which peers attached
//!    them.
//! 3. **Connect.** Each pair takes the first transport, in the lower rank's order of
//!    preference, that both ends attached; [`Transport::connect`] makes those connections by
//!    the deadline. Transports connect in the same fixed order on every rank, so a transport
//!    whose connect waits for its peer (TCP's connect and accept) never waits on one that is
//!    still connecting another transport.
//!
//! Every decline carries a reason, which the selection loop logs (`FERRO_DEBUG=INFO`) and puts
//! in the error when no transport can join a pair.

use std::fmt;
use std::time::Instant;

use crate::memory::Spaces;
use crate::{Connection, Result};

/// A kind of link between two ranks, as the tuner's cost model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Link {
    /// Shared memory between ranks of one host.
    Shm,
    /// TCP sockets.
    Tcp,
    /// RDMA (InfiniBand / RoCE).
    Rdma,
    /// NVLink between GPUs of one host.
    Nvlink,
}

impl Link {
    /// Every link kind, in the order of the cost model's table.
    pub const ALL: [Link; 4] = [Link::Shm, Link::Tcp, Link::Rdma, Link::Nvlink];

    /// Name in logs and topology files.
    pub const fn name(self) -> &'static str {
        match self {
            Link::Shm => "shm",
            Link::Tcp => "tcp",
            Link::Rdma => "rdma",
            Link::Nvlink => "nvlink",
        }
    }

    /// Parses [`Link::name`].
    pub fn parse(s: &str) -> std::result::Result<Link, String> {
        Link::ALL
            .into_iter()
            .find(|l| l.name() == s.trim().to_ascii_lowercase())
            .ok_or_else(|| format!("unknown link '{s}' (expected shm, tcp, rdma or nvlink)"))
    }

    /// Position in [`Link::ALL`].
    pub const fn index(self) -> usize {
        match self {
            Link::Shm => 0,
            Link::Tcp => 1,
            Link::Rdma => 2,
            Link::Nvlink => 3,
        }
    }
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a rank with nothing to do waits for a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitKind {
    /// On the descriptors of [`Connection::poll_fds`] (`poll(2)`).
    Descriptors,
    /// On the rank's [`Doorbell`](crate::Doorbell) (a futex).
    Doorbell,
}

/// What a transport is, for the executor and the tuner.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Properties {
    /// The link the tuner's cost model charges for it.
    pub link: Link,
    /// Memory it reads and writes directly; anything else is staged through host memory.
    pub spaces: Spaces,
    /// Whether it writes payloads straight into the receiver's buffer (RDMA WRITE, CUDA IPC):
    /// the receiver posts the destination ([`Connection::post_recv`]) before the header comes.
    pub one_sided: bool,
    /// Whether buffers must be registered ([`Connection::register`]) before they move.
    pub registration: bool,
    /// How a rank waits on it.
    pub wait: WaitKind,
    /// Per-message latency, microseconds (a hint until the tuner measures it).
    pub latency_us: f64,
    /// Bandwidth, GB/s (a hint until the tuner measures it).
    pub bandwidth_gbps: f64,
}

/// What every rank tells the others about itself before any transport connects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RankDesc {
    /// Host id: ranks with equal ids share a host (memory, `/dev/shm`).
    pub host: u64,
    /// Process id on its host.
    pub pid: u32,
}

/// What a transport knows while it sets up one communicator.
#[derive(Debug, Clone, Copy)]
pub struct SetupCtx<'a> {
    /// This rank.
    pub rank: usize,
    /// Ranks in the communicator.
    pub nranks: usize,
    /// The communicator's id (every connection carries it).
    pub comm_id: u64,
    /// Every rank's description, by rank.
    pub ranks: &'a [RankDesc],
    /// When setup must be over.
    pub deadline: Instant,
}

impl SetupCtx<'_> {
    /// Whether `peer` runs on this rank's host.
    pub fn same_host(&self, peer: usize) -> bool {
        self.ranks[peer].host == self.ranks[self.rank].host
    }

    /// Whether `peer` runs in this rank's process.
    pub fn same_process(&self, peer: usize) -> bool {
        self.same_host(peer) && self.ranks[peer].pid == self.ranks[self.rank].pid
    }

    /// The ranks on this rank's host other than itself, in rank order.
    pub fn local_peers(&self) -> Vec<usize> {
        (0..self.nranks)
            .filter(|&p| p != self.rank && self.same_host(p))
            .collect()
    }
}

/// Why a transport will not join a pair.
pub type Decline = String;

/// One way of connecting ranks: its setup (the three rounds of the module docs) and its
/// properties. One value per communicator being set up.
pub trait Transport: Send + fmt::Debug {
    /// Name in `FERRO_TRANSPORTS` and logs.
    fn name(&self) -> &'static str;

    /// What it is, for the executor and the tuner.
    fn properties(&self) -> Properties;

    /// Whether it can join this rank and `peer`, from the descriptions alone. Both ends must
    /// reach the same answer.
    fn can_connect(&self, ctx: &SetupCtx, peer: usize) -> std::result::Result<(), Decline>;

    /// Prepares to connect `peers` (those [`Transport::can_connect`] accepted) and returns this
    /// rank's connect handle. An error declines every one of them.
    fn listen(&mut self, ctx: &SetupCtx, peers: &[usize]) -> Result<Vec<u8>>;

    /// Reads `peer`'s connect handle; `Ok` if this side can reach `peer` through it.
    fn attach(
        &mut self,
        ctx: &SetupCtx,
        peer: usize,
        handle: &[u8],
    ) -> std::result::Result<(), Decline>;

    /// Connects `peers` (both ends attached, and this transport is the pair's choice) by
    /// `ctx.deadline`, and releases what setup held (called on every rank that listened, with
    /// an empty list where no pair chose it). Returns one connection per peer.
    fn connect(&mut self, ctx: &SetupCtx, peers: &[usize]) -> Result<Vec<Box<dyn Connection>>>;
}
