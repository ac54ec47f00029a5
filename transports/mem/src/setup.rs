//! The in-memory transport's setup: a process-global registry of endpoints, a token as the
//! connect handle; the first side of a pair to connect builds the shared queues and leaves
//! them in the registry for the other.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use ferroccl_transport::{
    Connection, Decline, Error, Link, Properties, Result, SetupCtx, Spaces, Transport, WaitKind,
};

use crate::bell::Bell;
use crate::conn::{End, MemConnection, Pair};
use crate::MemConfig;

/// The first bytes of a connect handle.
const HANDLE_MAGIC: &[u8; 4] = b"mem1";
/// Bytes of a connect handle: magic, process id, token.
const HANDLE_LEN: usize = 16;

/// A rank's endpoint, from `listen` to `connect`.
#[derive(Debug)]
struct Endpoint {
    comm_id: u64,
    rank: usize,
    bell: Arc<Bell>,
}

/// What the ranks of this process publish to each other.
#[derive(Debug)]
struct Registry {
    /// Listening endpoints by token.
    endpoints: BTreeMap<u64, Endpoint>,
    /// Pairs built by the side that connected first, by (lower rank's token, higher rank's
    /// token), until the other side takes them. Weak: a pair whose builder is gone is not kept.
    pairs: BTreeMap<(u64, u64), Weak<Pair>>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    endpoints: BTreeMap::new(),
    pairs: BTreeMap::new(),
});

/// Tokens handed out in this process (0 is never one).
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Queues in memory between ranks that are threads of one process.
#[derive(Debug)]
pub struct MemTransport {
    cfg: MemConfig,
    /// This rank's token and doorbell, once it listens.
    me: Option<(u64, Arc<Bell>)>,
    /// Each attached peer's token and doorbell, by rank.
    peers: Vec<Option<(u64, Arc<Bell>)>>,
}

impl MemTransport {
    /// A transport with the default [`MemConfig`].
    pub fn new() -> MemTransport {
        MemTransport::with_config(MemConfig::default())
    }

    /// A transport with `cfg`.
    pub fn with_config(cfg: MemConfig) -> MemTransport {
        MemTransport {
            cfg,
            me: None,
            peers: Vec::new(),
        }
    }

    fn release(&mut self) {
        if let Some((token, _)) = self.me.take() {
            registry().endpoints.remove(&token);
        }
        self.peers.clear();
    }
}

impl Default for MemTransport {
    fn default() -> Self {
        MemTransport::new()
    }
}

impl Drop for MemTransport {
    fn drop(&mut self) {
        self.release();
    }
}

fn encode_handle(token: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(HANDLE_LEN);
    h.extend_from_slice(HANDLE_MAGIC);
    h.extend_from_slice(&std::process::id().to_le_bytes());
    h.extend_from_slice(&token.to_le_bytes());
    h
}

/// The process id and token of a handle.
fn decode_handle(h: &[u8]) -> Option<(u32, u64)> {
    if h.len() != HANDLE_LEN || &h[..4] != HANDLE_MAGIC {
        return None;
    }
    let pid = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    let mut t = [0u8; 8];
    t.copy_from_slice(&h[8..16]);
    Some((pid, u64::from_le_bytes(t)))
}

impl Transport for MemTransport {
    fn name(&self) -> &'static str {
        "mem"
    }

    fn properties(&self) -> Properties {
        Properties {
            // The cost model has no row of its own for memory copies within a process; shared
            // memory is the nearest.
            link: Link::Shm,
            spaces: Spaces::HOST,
            one_sided: true,
            registration: true,
            wait: WaitKind::Doorbell,
            latency_us: 0.5,
            bandwidth_gbps: 10.0,
        }
    }

    fn can_connect(&self, ctx: &SetupCtx, peer: usize) -> std::result::Result<(), Decline> {
        if ctx.same_process(peer) {
            Ok(())
        } else if ctx.same_host(peer) {
            Err(format!(
                "rank {peer} runs in another process (mem joins threads of one process)"
            ))
        } else {
            Err(format!(
                "rank {peer} runs on another host (mem joins threads of one process)"
            ))
        }
    }

    fn listen(&mut self, ctx: &SetupCtx, _peers: &[usize]) -> Result<Vec<u8>> {
        self.release();
        let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
        let bell = Arc::new(Bell::new());
        registry().endpoints.insert(
            token,
            Endpoint {
                comm_id: ctx.comm_id,
                rank: ctx.rank,
                bell: Arc::clone(&bell),
            },
        );
        self.me = Some((token, bell));
        self.peers = vec![None; ctx.nranks];
        Ok(encode_handle(token))
    }

    fn attach(
        &mut self,
        ctx: &SetupCtx,
        peer: usize,
        handle: &[u8],
    ) -> std::result::Result<(), Decline> {
        if self.me.is_none() {
            return Err("this rank has no mem endpoint".to_string());
        }
        let (pid, token) =
            decode_handle(handle).ok_or_else(|| format!("rank {peer} offers a bad mem handle"))?;
        let here = std::process::id();
        if pid != here {
            return Err(format!(
                "rank {peer}'s mem endpoint is in process {pid}, not in this one ({here})"
            ));
        }
        let reg = registry();
        let ep = reg.endpoints.get(&token).ok_or_else(|| {
            format!("rank {peer}'s mem endpoint {token} is not registered in this process")
        })?;
        if ep.comm_id != ctx.comm_id || ep.rank != peer {
            return Err(format!(
                "mem endpoint {token} belongs to rank {} of communicator {:#018x}, not to rank \
                 {peer} of {:#018x}",
                ep.rank, ep.comm_id, ctx.comm_id
            ));
        }
        self.peers[peer] = Some((token, Arc::clone(&ep.bell)));
        Ok(())
    }

    fn connect(&mut self, ctx: &SetupCtx, peers: &[usize]) -> Result<Vec<Box<dyn Connection>>> {
        let Some((token, bell)) = self.me.clone() else {
            return Ok(Vec::new());
        };
        let mut out: Vec<Box<dyn Connection>> = Vec::with_capacity(peers.len());
        {
            // Entries whose builder is gone stay until the other side finds them (it then
            // sees its peer as failed); only a pair whose other side never connects leaves
            // one behind, a few bytes.
            let mut reg = registry();
            for &p in peers {
                let (peer_token, peer_bell) =
                    self.peers.get(p).cloned().flatten().ok_or_else(|| {
                        Error::internal(format!(
                            "mem setup on rank {}: rank {p} was not attached",
                            ctx.rank
                        ))
                    })?;
                let side = usize::from(ctx.rank > p);
                let (key, ranks, bells) = if side == 0 {
                    (
                        (token, peer_token),
                        [ctx.rank, p],
                        [Arc::clone(&bell), peer_bell],
                    )
                } else {
                    (
                        (peer_token, token),
                        [p, ctx.rank],
                        [peer_bell, Arc::clone(&bell)],
                    )
                };
                let pair = match reg.pairs.remove(&key) {
                    Some(w) => match w.upgrade() {
                        Some(pair) => pair,
                        None => {
                            // The peer built the pair and dropped its end before this side
                            // came: its rank failed.
                            let pair = Pair::new(ranks, bells, &self.cfg);
                            pair.set_end(1 - side, End::Dropped);
                            pair
                        }
                    },
                    None => {
                        let pair = Pair::new(ranks, bells, &self.cfg);
                        reg.pairs.insert(key, Arc::downgrade(&pair));
                        pair
                    }
                };
                out.push(Box::new(MemConnection::new(pair, side)));
            }
        }
        self.release();
        Ok(out)
    }
}
