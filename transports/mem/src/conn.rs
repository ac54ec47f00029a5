//! One peer pair: a bounded byte queue per direction behind one mutex, and a doorbell per rank.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use ferroccl_transport::{
    Connection, Doorbell, Error, Header, MemRef, MemSpace, Part, Payload, PayloadMut, PeerInfo,
    PollFd, Progress, Region, Result, HEADER_LEN,
};

use crate::bell::Bell;
use crate::queue::ByteQueue;
use crate::{MemConfig, MIN_QUEUE_BYTES};

/// One direction of a pair, written by one side and read by the other.
#[derive(Debug)]
struct Lane {
    /// Encoded headers and payloads, in order.
    queue: ByteQueue,
    /// Destination lengths the reader posted, as (message number, bytes), oldest first. A post
    /// is for the `k`-th message whose header the reader has not read, `k` counting from the
    /// oldest outstanding post.
    posted: VecDeque<(u64, usize)>,
    /// Messages whose header the writer has queued.
    sent: u64,
    /// Messages whose header the reader has taken.
    read: u64,
}

/// Whether a side still uses the pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// In use.
    Open,
    /// Closed by [`Connection::shutdown`].
    Shut,
    /// Dropped without a shutdown (its rank failed).
    Dropped,
}

/// What both sides of a pair share.
#[derive(Debug)]
struct State {
    /// `lanes[s]` is written by side `s` and read by the other side.
    lanes: [Lane; 2],
    /// Each side's state.
    ends: [End; 2],
}

/// The shared half of a pair: side 0 is the lower rank.
#[derive(Debug)]
pub(crate) struct Pair {
    state: Mutex<State>,
    /// Each side's rank.
    ranks: [usize; 2],
    /// Each side's doorbell, rung by the other side.
    bells: [Arc<Bell>; 2],
    /// Bytes each queue holds.
    queue_bytes: usize,
}

impl Pair {
    /// A pair between `ranks` (lower first) with the ranks' doorbells, in that order.
    pub(crate) fn new(ranks: [usize; 2], bells: [Arc<Bell>; 2], cfg: &MemConfig) -> Arc<Pair> {
        let cap = cfg.queue_bytes.max(MIN_QUEUE_BYTES);
        let lane = || Lane {
            queue: ByteQueue::new(cap),
            posted: VecDeque::new(),
            sent: 0,
            read: 0,
        };
        Arc::new(Pair {
            state: Mutex::new(State {
                lanes: [lane(), lane()],
                ends: [End::Open, End::Open],
            }),
            ranks,
            bells,
            queue_bytes: cap,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks `side` as gone and wakes the other side.
    pub(crate) fn set_end(&self, side: usize, end: End) {
        self.lock().ends[side] = end;
        self.bells[1 - side].ring();
    }
}

/// Connections of this process, numbered so that a region names the one that registered it.
static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// What a [`Region`] of this transport holds: the connection that registered it and its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemRegistration {
    /// The registering connection's number in this process.
    pub connection: u64,
    /// The region's key on that connection.
    pub key: u64,
}

/// One end of an in-memory pair (see the crate docs).
pub struct MemConnection {
    peer: PeerInfo,
    /// This end's rank.
    rank: usize,
    /// This end's side of the pair (0: the lower rank).
    side: usize,
    pair: Arc<Pair>,
    /// This connection's number, for its regions.
    id: u64,
    /// The key of the last region registered.
    last_key: u64,
    closed: bool,
}

impl fmt::Debug for MemConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemConnection")
            .field("peer", &self.peer)
            .field("rank", &self.rank)
            .field("closed", &self.closed)
            .finish()
    }
}

impl MemConnection {
    /// Side `side` of `pair`.
    pub(crate) fn new(pair: Arc<Pair>, side: usize) -> MemConnection {
        let peer = PeerInfo {
            rank: pair.ranks[1 - side],
            addr: format!("mem, pid {}", std::process::id()),
        };
        MemConnection {
            peer,
            rank: pair.ranks[side],
            side,
            pair,
            id: NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed),
            last_key: 0,
            closed: false,
        }
    }

    /// Two connected ends, for ranks `a` and `b` (distinct), each with a doorbell of its own:
    /// what setup builds, without the registry (tests, benchmarks).
    pub fn pair(a: usize, b: usize, cfg: &MemConfig) -> (MemConnection, MemConnection) {
        assert_ne!(a, b, "a pair joins two ranks");
        let (lo, hi) = (a.min(b), a.max(b));
        let pair = Pair::new(
            [lo, hi],
            [Arc::new(Bell::new()), Arc::new(Bell::new())],
            cfg,
        );
        let (ea, eb) = (
            MemConnection::new(Arc::clone(&pair), 0),
            MemConnection::new(pair, 1),
        );
        if a < b {
            (ea, eb)
        } else {
            (eb, ea)
        }
    }

    /// Bytes each direction's queue holds.
    pub fn queue_bytes(&self) -> usize {
        self.pair.queue_bytes
    }

    fn other(&self) -> usize {
        1 - self.side
    }

    /// The error for a call on an end already closed here.
    fn closed_here(&self, what: &str) -> Error {
        Error::invalid_usage(format!(
            "{what} {}: rank {} already closed this connection",
            self.peer, self.rank
        ))
        .with_peer(self.peer.rank)
    }

    /// The error for a peer that is gone.
    fn gone(&self, end: End) -> Error {
        let why = match end {
            End::Dropped => "dropped its end of the connection without closing it",
            _ => "closed the connection",
        };
        Error::remote(format!("{} {why}", self.peer)).with_peer(self.peer.rank)
    }

    fn ring_peer(&self) {
        self.pair.bells[self.other()].ring();
    }
}

/// One part covering the whole payload.
fn layout(len: usize, p: &mut Progress) {
    p.started = true;
    p.nparts = 1;
    p.parts[0] = Part {
        start: 0,
        pos: 0,
        end: len,
    };
}

impl Connection for MemConnection {
    fn peer(&self) -> &PeerInfo {
        &self.peer
    }

    fn send(&mut self, header: &Header, payload: Payload<'_>, p: &mut Progress) -> Result<bool> {
        let payload = payload.host("mem")?;
        if self.closed {
            return Err(self.closed_here("send to"));
        }
        header.check_send_len(&self.peer, payload.len())?;
        let other = self.other();
        let mut st = self.pair.lock();
        if st.ends[other] != End::Open {
            let end = st.ends[other];
            drop(st);
            return Err(self.gone(end));
        }
        let lane = &mut st.lanes[self.side];
        let mut moved = false;
        if !p.header_done() {
            // Clear-to-send: a receiver that posted a destination for this message gets
            // exactly that many bytes, or nothing.
            let number = lane.sent;
            if let Some(&(_, want)) = lane.posted.iter().find(|(k, _)| *k == number) {
                if want != payload.len() {
                    return Err(Error::invalid_argument(format!(
                        "send to {}: the receiver posted a {want}-byte destination for message \
                         #{number}, this message has {} bytes",
                        self.peer,
                        payload.len()
                    )));
                }
            }
            if lane.queue.free() < HEADER_LEN {
                return Ok(false);
            }
            lane.queue.push(&header.encode());
            lane.sent += 1;
            p.header_pos = HEADER_LEN;
            layout(payload.len(), p);
            moved = true;
        }
        let part = &mut p.parts[0];
        let n = lane.queue.push(&payload[part.pos..part.end]);
        part.pos += n;
        drop(st);
        if moved || n > 0 {
            self.ring_peer();
        }
        Ok(p.done())
    }

    fn recv(
        &mut self,
        header: &mut Header,
        payload: PayloadMut<'_>,
        p: &mut Progress,
    ) -> Result<bool> {
        let payload = payload.host("mem")?;
        if self.closed {
            return Err(self.closed_here("recv from"));
        }
        let other = self.other();
        let mut st = self.pair.lock();
        let peer_end = st.ends[other];
        let lane = &mut st.lanes[other];
        if !p.header_done() {
            if lane.queue.len() < HEADER_LEN {
                drop(st);
                return match peer_end {
                    End::Open => Ok(false),
                    end => Err(self.gone(end)),
                };
            }
            let mut b = [0u8; HEADER_LEN];
            lane.queue.pop(&mut b);
            let number = lane.read;
            lane.read += 1;
            let posted = match lane.posted.front() {
                Some(&(k, want)) if k == number => {
                    lane.posted.pop_front();
                    Some(want)
                }
                _ => None,
            };
            drop(st);
            self.ring_peer();
            *header = Header::decode(&b).ok_or_else(|| {
                Error::internal(format!(
                    "garbled message header from {} (the queue is out of step)",
                    self.peer
                ))
            })?;
            p.header_pos = HEADER_LEN;
            if let Some(want) = posted.filter(|&w| w as u64 != header.len) {
                return Err(Error::invalid_argument(format!(
                    "recv from {}: this end posted a {want}-byte destination for message \
                     #{number}, the message has {} bytes",
                    self.peer, header.len
                )));
            }
            // The caller checks the header before the payload is read.
            return Ok(false);
        }
        if !p.started {
            header.check_recv_len(&self.peer, payload.len())?;
            layout(payload.len(), p);
        }
        let part = &mut p.parts[0];
        let n = lane.queue.pop(&mut payload[part.pos..part.end]);
        part.pos += n;
        drop(st);
        if n > 0 {
            self.ring_peer();
        } else if !p.done() && peer_end != End::Open {
            return Err(self.gone(peer_end));
        }
        Ok(p.done())
    }

    fn post_recv(&mut self, dst: MemRef, region: Option<&Region>) -> Result<()> {
        if dst.space != MemSpace::Host {
            Payload::Device(dst).host("mem")?;
        }
        if let Some(r) = region {
            let reg = r.resources::<MemRegistration>().ok_or_else(|| {
                Error::invalid_argument(format!(
                    "post_recv from {}: region {} was not registered by the mem transport",
                    self.peer,
                    r.key()
                ))
            })?;
            if reg.connection != self.id {
                return Err(Error::invalid_argument(format!(
                    "post_recv from {}: region {} belongs to another connection",
                    self.peer, reg.key
                )));
            }
            if !r.mem().contains(&dst) {
                return Err(Error::invalid_argument(format!(
                    "post_recv from {}: the {}-byte destination at {:#x} lies outside region {} \
                     ({} bytes at {:#x})",
                    self.peer,
                    dst.len,
                    dst.addr,
                    reg.key,
                    r.mem().len,
                    r.mem().addr
                )));
            }
        }
        let other = self.other();
        let mut st = self.pair.lock();
        let lane = &mut st.lanes[other];
        let number = lane.read + lane.posted.len() as u64;
        lane.posted.push_back((number, dst.len));
        Ok(())
    }

    fn register(&mut self, mem: MemRef) -> Result<Option<Region>> {
        if mem.space != MemSpace::Host {
            Payload::Device(mem).host("mem")?;
        }
        self.last_key += 1;
        let reg = MemRegistration {
            connection: self.id,
            key: self.last_key,
        };
        Ok(Some(Region::new(mem, reg.key, reg)))
    }

    fn describe(&self) -> String {
        format!("queue {} KiB", self.pair.queue_bytes / 1024)
    }

    fn poll_fds(&self, _sending: bool, _receiving: bool, _out: &mut Vec<PollFd>) {}

    fn doorbell(&self) -> Option<Arc<dyn Doorbell>> {
        Some(Arc::clone(&self.pair.bells[self.side]) as Arc<dyn Doorbell>)
    }

    fn shutdown(&mut self) {
        if !self.closed {
            self.closed = true;
            self.pair.set_end(self.side, End::Shut);
        }
    }
}

impl Drop for MemConnection {
    fn drop(&mut self) {
        if !self.closed {
            self.closed = true;
            self.pair.set_end(self.side, End::Dropped);
        }
    }
}
