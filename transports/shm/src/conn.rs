//! A connection between two ranks of one host over their shared-memory rings.
//!
//! Each direction is the ring that the receiver owns (in its segment) and the sender produces
//! into. A message is a 64-byte frame — mode, the 40-byte [`Header`], and for cross-memory
//! attach the payload's address and length — followed, in inline mode, by the payload. Frames
//! are written whole (the ring always has room for one when it is empty), so a receiver sees a
//! header all at once.
//!
//! Large payloads (at least `cma_min` bytes, where the receiver proved at setup that it can read
//! the sender's memory) are not copied through the ring: the receiver reads them with
//! `process_vm_readv` straight into its destination and acknowledges every piece through
//! `cma_acked`; the send completes once all of it is acknowledged, so the sender's buffer stays
//! untouched until then. If the kernel refuses the read, the receiver sets `CMA_DENIED` and the
//! sender streams the rest through the ring instead.
//!
//! A small inline message (payload of at most [`SMALL_PAYLOAD`] bytes) is written with its
//! frame in one ring write: one publication of `head` and one doorbell ring. The receiver reads
//! what the ring holds, up to [`READ_AHEAD`] bytes, into a per-connection read-ahead buffer in one
//! read (one `tail` publication, one ring), and takes frames and small payloads from there; the
//! bytes in the ring are the same either way.
//!
//! Large payloads (at least `mapped_min` bytes) that lie in a [`SharedMem`](crate::SharedMem)
//! are not copied through the ring either: the frame names the buffer, and the receiver copies
//! or reduces straight from its own mapping of it (`conn/mapped.rs`), acknowledging through
//! `cma_acked` as for cross-memory attach. If the receiver cannot map it, it sets
//! `MAPPED_DENIED` and the sender streams the rest through the ring.
//!
//! Flags in each ring's control block (all Release stores / Acquire loads):
//! `PRODUCER_CLOSED` / `CONSUMER_CLOSED` — that side shut the connection down;
//! `CMA_OK` — set by the consumer at setup when it can read the producer's memory;
//! `CMA_DENIED` — set by the consumer when a read was refused;
//! `MAPPED_DENIED` — set by the consumer when it could not map a shared buffer.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferroccl_transport::{
    Connection, Doorbell, Error, Header, LaneTake, Part, Payload, PayloadMut, PeerInfo, PollFd,
    Progress, Result, SmallLane, HEADER_LEN,
};

mod lent;
mod mapped;

use crate::bell::Bell;
use crate::cma::{self, CmaError};
use crate::lane::{LaneBox, LANE_BYTES};
use crate::ring::{Consumer, Producer, RawStorage, RingCtl};
use crate::segment::{Mapping, OwnSegment, PeerSegment};
use crate::shared::{self, PeerMaps};
use crate::sync::Ordering;
use crate::watch::{pidfd_open, PeerWatch};
use crate::ShmConfig;

const PRODUCER_CLOSED: usize = 0;
const CONSUMER_CLOSED: usize = 1;
const CMA_OK: usize = 2;
const CMA_DENIED: usize = 3;
const MAPPED_DENIED: usize = 4;

const FRAME_LEN: usize = 64;
const FRAME_MAGIC: u32 = 0x4d53_5246; // "FRSM"
const MODE_INLINE: u32 = 1;
const MODE_CMA: u32 = 2;
const MODE_MAPPED: u32 = 3;

/// The largest payload written together with its frame in one ring write.
const SMALL_PAYLOAD: usize = 448;
/// Bytes the receiver takes from the ring at once while it looks for a frame.
const READ_AHEAD: usize = 1024;

/// How often an idle side checks whether the peer process still exists.
const LIVENESS_EVERY: Duration = Duration::from_millis(5);
/// Liveness checks per clock read ([`LIVENESS_EVERY`] is measured only on these). A rank
/// that polls spinning makes this many checks in a few microseconds; one that sleeps checks
/// once per wake-up, and the peer watch wakes it when a peer exits.
const CLOCK_EVERY: u32 = 16;

/// One direction's ring as seen from this rank.
#[derive(Debug)]
struct RingEnd {
    /// Keeps the ring's memory mapped.
    _map: Arc<Mapping>,
    ctl: *const RingCtl,
    /// The small-message lane's boxes of this direction.
    lane: *const [LaneBox; 2],
    data: RawStorage,
}

impl RingEnd {
    fn new(map: &Arc<Mapping>, slot: usize, ring_bytes: usize) -> RingEnd {
        let slot_ctl = map.slot_ctl(slot, ring_bytes);
        let ctl: *const RingCtl = &slot_ctl.ring;
        let lane: *const [LaneBox; 2] = &slot_ctl.lane;
        let data_off = map.slot_data(slot, ring_bytes);
        // SAFETY: `slot_ctl` checked that the slot's data lies inside the mapping, which `map`
        // keeps alive as long as this value; `ring_bytes` is a power of two (checked at
        // creation and open).
        let data = unsafe { RawStorage::new(map.at(data_off), ring_bytes) };
        RingEnd {
            _map: Arc::clone(map),
            ctl,
            lane,
            data,
        }
    }

    fn ctl(&self) -> &RingCtl {
        // SAFETY: points into `self._map`, alive and aligned; RingCtl is all atomics.
        unsafe { &*self.ctl }
    }

    fn lane_box(&self, n: u64) -> &LaneBox {
        // SAFETY: points into `self._map`, alive and aligned; LaneBox is all atomics.
        unsafe { &(*self.lane)[(n % 2) as usize] }
    }

    fn flag(&self, i: usize) -> bool {
        // Acquire: pairs with the Release store that set the flag.
        self.ctl().flags.0[i].load(Ordering::Acquire) != 0
    }

    fn set_flag(&self, i: usize) {
        // Release: what the setter did before (acknowledgements in particular) is visible to
        // whoever sees the flag.
        self.ctl().flags.0[i].store(1, Ordering::Release);
    }
}

/// One peer pair over shared memory.
#[derive(Debug)]
pub struct ShmConnection {
    peer: PeerInfo,
    /// Ring this rank produces into (in the peer's segment).
    tx: RingEnd,
    /// Ring this rank consumes from (in its own segment).
    rx: RingEnd,
    my_bell: Arc<Bell>,
    peer_bell: Arc<Bell>,
    peer_pid: u32,
    /// Becomes readable when the peer process exits (absent for a peer in this process).
    pidfd: Option<OwnedFd>,
    last_liveness: Instant,
    /// Liveness checks since the clock was last read for one.
    unclocked: u32,
    cfg: ShmConfig,
    tx_mode: u32,
    tx_cma_base: u64,
    rx_mode: u32,
    rx_addr: u64,
    rx_len: u64,
    rx_cma_warned: bool,
    rx_mapped_warned: bool,
    /// The sender's shared buffers this rank has mapped.
    rx_maps: PeerMaps,
    /// Bytes taken from the rx ring and not yet delivered: `ahead[ahead_pos..ahead_end]`.
    ahead: Box<[u8; READ_AHEAD]>,
    ahead_pos: usize,
    ahead_end: usize,
    closed: bool,
    watch: Option<Arc<PeerWatch>>,
}

// SAFETY: the raw pointers point into mappings held by the connection; shared state is reached
// only through atomics and the ring protocol, and one connection is used by one thread at a time.
unsafe impl Send for ShmConnection {}

impl ShmConnection {
    /// Probes whether this rank (the owner of `own`) can read the memory of `peer_seg`'s owner
    /// with cross-memory attach, and if so tells the peer, through the `CMA_OK` flag of the
    /// ring it produces into, that it may send large payloads that way. Call it after mapping,
    /// before the ranks tell each other that setup is done. Returns the probe's result.
    pub fn offer_cma(own: &OwnSegment, peer_seg: &PeerSegment) -> bool {
        let Some(slot) = own.slot_of(peer_seg.owner_rank) else {
            return false;
        };
        if !peer_seg.same_pid_ns {
            return false;
        }
        let (addr, value) = peer_seg.probe;
        let ok = cma::probe(peer_seg.owner_pid, addr, value);
        if ok {
            RingEnd::new(&own.map, slot, own.ring_bytes).set_flag(CMA_OK);
        }
        ok
    }

    /// Connects this rank (the owner of `own`) with the owner of `peer_seg`, which this rank has
    /// mapped. Both sides build their connection from the same pair of segments.
    pub fn new(own: &OwnSegment, peer_seg: &PeerSegment, cfg: &ShmConfig) -> Result<ShmConnection> {
        let peer_rank = peer_seg.owner_rank;
        let rx_slot = own.slot_of(peer_rank).ok_or_else(|| {
            Error::internal(format!(
                "rank {}: own shared-memory segment has no ring for rank {peer_rank}",
                own.rank
            ))
        })?;
        let rx = RingEnd::new(&own.map, rx_slot, own.ring_bytes);
        let tx = RingEnd::new(&peer_seg.map, peer_seg.slot, peer_seg.ring_bytes);
        let same_process = peer_seg.owner_pid == std::process::id() && peer_seg.same_pid_ns;
        let pidfd = if peer_seg.same_pid_ns && !same_process {
            pidfd_open(peer_seg.owner_pid)
        } else {
            None
        };
        Ok(ShmConnection {
            peer: PeerInfo {
                rank: peer_rank,
                addr: format!("shm, pid {}", peer_seg.owner_pid),
            },
            my_bell: own.bell(),
            peer_bell: peer_seg.bell(),
            peer_pid: peer_seg.owner_pid,
            pidfd,
            last_liveness: Instant::now(),
            unclocked: 0,
            cfg: cfg.clone(),
            tx_mode: MODE_INLINE,
            tx_cma_base: 0,
            rx_mode: MODE_INLINE,
            rx_addr: 0,
            rx_len: 0,
            rx_cma_warned: false,
            rx_mapped_warned: false,
            rx_maps: PeerMaps::new(peer_seg.owner_pid),
            ahead: Box::new([0u8; READ_AHEAD]),
            ahead_pos: 0,
            ahead_end: 0,
            closed: false,
            watch: None,
            tx,
            rx,
        })
    }

    /// The peer's process id.
    pub fn peer_pid(&self) -> u32 {
        self.peer_pid
    }

    /// Attaches the watch that wakes this rank when a peer process exits.
    pub fn set_watch(&mut self, watch: Arc<PeerWatch>) {
        self.watch = Some(watch);
    }

    /// Whether this rank may send large payloads by cross-memory attach now: the receiver
    /// proved it can read this process, never refused, and the configuration allows it.
    pub fn cma_enabled(&self) -> bool {
        self.cfg.cma && self.tx.flag(CMA_OK) && !self.tx.flag(CMA_DENIED)
    }

    fn producer(&self) -> Producer<'_, RawStorage> {
        // SAFETY: this connection is the only producer of its tx ring: the segment owner built
        // one slot per peer and only this rank writes the slot named after it.
        unsafe { Producer::new(self.tx.ctl(), &self.tx.data) }
    }

    fn consumer(&self) -> Consumer<'_, RawStorage> {
        // SAFETY: this connection is the only consumer of its rx ring (the slot of this peer in
        // this rank's own segment).
        unsafe { Consumer::new(self.rx.ctl(), &self.rx.data) }
    }

    fn closed_error(&self) -> Error {
        Error::remote(format!("{} closed the connection", self.peer)).with_peer(self.peer.rank)
    }

    /// The peer's process vanished without closing its connections (killed, crashed). The
    /// error is not attributed to the peer (`Error::peer`), since a process that died that way
    /// published no reason for the communicator to look up.
    fn exited_error(&self) -> Error {
        Error::remote(format!(
            "{} exited (process {} is gone) without closing the connection",
            self.peer, self.peer_pid
        ))
    }

    /// With nothing to move: fails if the peer closed or its process is gone.
    fn check_peer(&mut self) -> Result<()> {
        if self.tx.flag(CONSUMER_CLOSED) || self.rx.flag(PRODUCER_CLOSED) {
            return Err(self.closed_error());
        }
        if let Some(fd) = &self.pidfd {
            // The watch tells at once when it runs; the timed check is its fallback. Reading
            // the clock costs as much as the lane's hand-off, and a waiting rank checks once
            // per poll, so only every CLOCK_EVERY-th check reads it.
            let mut due = self.watch.as_ref().is_some_and(|w| w.exited());
            if !due {
                self.unclocked += 1;
                if self.unclocked >= CLOCK_EVERY {
                    self.unclocked = 0;
                    let now = Instant::now();
                    due = now.duration_since(self.last_liveness) >= LIVENESS_EVERY;
                    if due {
                        self.last_liveness = now;
                    }
                }
            }
            if due {
                let mut p = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one live pollfd; zero timeout.
                let rc = unsafe { libc::poll(&mut p, 1, 0) };
                if rc > 0 && p.revents != 0 {
                    return Err(self.exited_error());
                }
            }
        }
        Ok(())
    }

    /// Moves a cross-memory-attach send's position to what the receiver has acknowledged.
    fn take_acks(&self, len: usize, p: &mut Progress) {
        let acked = self.tx.ctl().cma_acked.0.load(Ordering::Acquire) - self.tx_cma_base;
        p.parts[0].pos = (acked as usize).min(len);
    }

    fn start(p: &mut Progress, len: usize) {
        p.header_pos = HEADER_LEN;
        p.started = true;
        p.nparts = 1;
        p.parts[0] = Part {
            start: 0,
            pos: 0,
            end: len,
        };
    }

    /// Sends a small inline message, frame and payload in one ring write, once the ring has
    /// room for both (false until then).
    fn send_small(&mut self, header: &Header, payload: &[u8], p: &mut Progress) -> Result<bool> {
        let total = FRAME_LEN + payload.len();
        if self.producer().free() < total {
            self.check_peer()?;
            return Ok(false);
        }
        let mut msg = [0u8; FRAME_LEN + SMALL_PAYLOAD];
        msg[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        msg[4..8].copy_from_slice(&MODE_INLINE.to_le_bytes());
        msg[8..48].copy_from_slice(&header.encode());
        msg[FRAME_LEN..total].copy_from_slice(payload);
        let n = self.producer().write(&msg[..total]);
        if n != total {
            return Err(Error::internal(format!(
                "send to {}: wrote {n} of {total} message bytes into a ring with room",
                self.peer
            )));
        }
        self.tx_mode = MODE_INLINE;
        Self::start(p, payload.len());
        p.parts[0].pos = payload.len();
        self.peer_bell.ring();
        Ok(true)
    }

    /// Bytes in the read-ahead buffer.
    fn ahead_len(&self) -> usize {
        self.ahead_end - self.ahead_pos
    }

    /// Moves what the rx ring holds into the read-ahead buffer (as much as fits); the bytes
    /// moved.
    fn read_ahead(&mut self) -> usize {
        if self.ahead_pos > 0 {
            self.ahead.copy_within(self.ahead_pos..self.ahead_end, 0);
            self.ahead_end -= self.ahead_pos;
            self.ahead_pos = 0;
        }
        let end = self.ahead_end;
        // SAFETY: as in `consumer`: this connection is the only consumer of its rx ring.
        let consumer = unsafe { Consumer::new(self.rx.ctl(), &self.rx.data) };
        let n = consumer.read(&mut self.ahead[end..]);
        if n > 0 {
            self.ahead_end += n;
            self.peer_bell.ring();
        }
        n
    }

    /// Reads the next message's frame into `header` once a whole one has arrived; always
    /// `Ok(false)`: the caller checks the header before the payload is read.
    fn read_frame(&mut self, header: &mut Header, p: &mut Progress) -> Result<bool> {
        if self.ahead_len() < FRAME_LEN {
            self.read_ahead();
        }
        if self.ahead_len() < FRAME_LEN {
            if let Err(e) = self.check_peer() {
                // A sender that wrote its last frame and then closed, after the count
                // above was read, is no error: the close flag's Acquire makes the frame
                // visible now.
                self.read_ahead();
                if self.ahead_len() < FRAME_LEN {
                    return Err(e);
                }
            } else {
                return Ok(false);
            }
        }
        let mut frame = [0u8; FRAME_LEN];
        frame.copy_from_slice(&self.ahead[self.ahead_pos..self.ahead_pos + FRAME_LEN]);
        self.ahead_pos += FRAME_LEN;
        let mut hb = [0u8; HEADER_LEN];
        hb.copy_from_slice(&frame[8..48]);
        let mode = u32_at(&frame, 4);
        let h = Header::decode(&hb)
            .filter(|_| u32_at(&frame, 0) == FRAME_MAGIC)
            .filter(|_| matches!(mode, MODE_INLINE | MODE_CMA | MODE_MAPPED))
            .ok_or_else(|| {
                Error::remote(format!(
                    "garbled message frame from {} (the ring is out of step)",
                    self.peer
                ))
                .with_peer(self.peer.rank)
            })?;
        self.rx_mode = mode;
        self.rx_addr = u64_at(&frame, 48);
        self.rx_len = u64_at(&frame, 56);
        *header = h;
        p.header_pos = HEADER_LEN;
        Ok(false)
    }

    fn send_inline(&mut self, payload: &[u8], p: &mut Progress) -> Result<()> {
        let pos = p.parts[0].pos;
        let end = payload.len().min(pos + self.cfg.max_io.max(4096));
        if pos == end {
            return Ok(());
        }
        let n = self.producer().write(&payload[pos..end]);
        if n > 0 {
            p.parts[0].pos += n;
            self.peer_bell.ring();
            Ok(())
        } else {
            self.check_peer()
        }
    }

    /// Acknowledges `n` bytes read from the sender's memory (cross-memory attach or a shared
    /// buffer); `last`: they end the message.
    fn acknowledge(&self, n: usize, last: bool) -> Result<()> {
        // A sender that closed before the last acknowledgement below gave up (and may have
        // reused its buffer) before we finished: what we read cannot be trusted. The flag is
        // read before that acknowledgement is published: once the sender sees it, its send is
        // complete and it may close (say, at the end of its last collective) while this rank
        // is still here, which is no error. The Release below keeps this load before it.
        let gave_up = last && self.rx.flag(PRODUCER_CLOSED);
        // Release: only this side writes `cma_acked`; the sender may reuse its buffer once it
        // sees the count.
        self.rx
            .ctl()
            .cma_acked
            .0
            .fetch_add(n as u64, Ordering::Release);
        self.peer_bell.ring();
        if gave_up {
            return Err(self.closed_error());
        }
        Ok(())
    }
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(w)
}

impl Connection for ShmConnection {
    fn peer(&self) -> &PeerInfo {
        &self.peer
    }

    fn send(&mut self, header: &Header, payload: Payload<'_>, p: &mut Progress) -> Result<bool> {
        let payload = payload.host("shm")?;
        if self.closed {
            return Err(self.closed_error());
        }
        header.check_send_len(&self.peer, payload.len())?;
        if !p.started {
            if self.producer().free() < FRAME_LEN {
                self.check_peer()?;
                return Ok(false);
            }
            let cma = payload.len() >= self.cfg.cma_min.max(1) && self.cma_enabled();
            let mapped = (!cma
                && payload.len() >= self.cfg.mapped_min.max(SMALL_PAYLOAD + 1)
                && !self.tx.flag(MAPPED_DENIED))
            .then(|| shared::locate(payload.as_ptr() as usize, payload.len()))
            .flatten();
            // The mode, and the two frame words that say where the receiver reads the payload.
            let (mode, words) = match mapped {
                _ if cma => (
                    MODE_CMA,
                    Some((payload.as_ptr() as u64, payload.len() as u64)),
                ),
                Some(at) => (MODE_MAPPED, Some(at.encode())),
                None if payload.len() <= SMALL_PAYLOAD => {
                    return self.send_small(header, payload, p)
                }
                None => (MODE_INLINE, None),
            };
            let mut frame = [0u8; FRAME_LEN];
            frame[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
            frame[4..8].copy_from_slice(&mode.to_le_bytes());
            frame[8..48].copy_from_slice(&header.encode());
            if let Some((a, b)) = words {
                frame[48..56].copy_from_slice(&a.to_le_bytes());
                frame[56..64].copy_from_slice(&b.to_le_bytes());
                // Acquire: the receiver's acknowledgements so far; read before the frame is
                // published, since the receiver may acknowledge this message right after.
                self.tx_cma_base = self.tx.ctl().cma_acked.0.load(Ordering::Acquire);
            }
            let n = self.producer().write(&frame);
            if n != FRAME_LEN {
                return Err(Error::internal(format!(
                    "send to {}: wrote {n} of {FRAME_LEN} frame bytes into a ring with room",
                    self.peer
                )));
            }
            self.tx_mode = mode;
            Self::start(p, payload.len());
            self.peer_bell.ring();
        }
        if self.tx_mode == MODE_CMA || self.tx_mode == MODE_MAPPED {
            // Denied is read before the acknowledgement count, which the receiver stored first.
            let denied = self.tx.flag(if self.tx_mode == MODE_CMA {
                CMA_DENIED
            } else {
                MAPPED_DENIED
            });
            let before = p.parts[0].pos;
            self.take_acks(payload.len(), p);
            if p.parts[0].pos < payload.len() {
                if denied {
                    self.tx_mode = MODE_INLINE;
                } else if p.parts[0].pos == before {
                    if let Err(e) = self.check_peer() {
                        // The receiver may have acknowledged the rest and closed after the
                        // count above was read: the close flag's Acquire makes those
                        // acknowledgements visible now.
                        self.take_acks(payload.len(), p);
                        if !p.done() {
                            return Err(e);
                        }
                    }
                }
            }
        }
        if self.tx_mode == MODE_INLINE {
            self.send_inline(payload, p)?;
        }
        Ok(p.done())
    }

    fn recv(
        &mut self,
        header: &mut Header,
        payload: PayloadMut<'_>,
        p: &mut Progress,
    ) -> Result<bool> {
        let payload = payload.host("shm")?;
        if self.closed {
            return Err(self.closed_error());
        }
        if !p.header_done() {
            return self.read_frame(header, p);
        }
        if !p.started {
            if header.len != payload.len() as u64
                || (self.rx_mode == MODE_CMA && self.rx_len != header.len)
            {
                return Err(Error::internal(format!(
                    "recv from {}: header says {} bytes, buffer has {}",
                    self.peer,
                    header.len,
                    payload.len()
                )));
            }
            Self::start(p, payload.len());
        }
        if self.rx_mode == MODE_MAPPED && self.recv_mapped(payload, p)? {
            return Ok(p.done());
        }
        let pos = p.parts[0].pos;
        let end = payload.len().min(pos + self.cfg.max_io.max(4096));
        if pos == end {
            return Ok(p.done());
        }
        if self.rx_mode == MODE_CMA {
            match cma::read(
                self.peer_pid,
                self.rx_addr + pos as u64,
                &mut payload[pos..end],
            ) {
                Ok(0) => self.check_peer()?,
                Ok(n) => {
                    p.parts[0].pos += n;
                    self.acknowledge(n, p.done())?;
                }
                Err(CmaError::Denied(errno)) => {
                    if !self.rx_cma_warned {
                        self.rx_cma_warned = true;
                        eprintln!(
                            "ferroccl SHM: process_vm_readv from {} refused (errno {errno}); \
                             large messages go through the ring instead",
                            self.peer
                        );
                    }
                    self.rx.set_flag(CMA_DENIED);
                    self.peer_bell.ring();
                    self.rx_mode = MODE_INLINE;
                }
                Err(CmaError::Gone) => return Err(self.exited_error()),
                Err(CmaError::Other(errno)) => {
                    self.check_peer()?;
                    return Err(Error::io(
                        format_args!(
                            "reading {} bytes of {}'s buffer at {:#x} (process_vm_readv)",
                            end - pos,
                            self.peer,
                            self.rx_addr + pos as u64
                        ),
                        &std::io::Error::from_raw_os_error(errno),
                    )
                    .with_peer(self.peer.rank));
                }
            }
            return Ok(p.done());
        }
        let taken = self.ahead_len().min(end - pos);
        if taken > 0 {
            let from = self.ahead_pos;
            payload[pos..pos + taken].copy_from_slice(&self.ahead[from..from + taken]);
            self.ahead_pos += taken;
            p.parts[0].pos += taken;
            return Ok(p.done());
        }
        let mut n = self.consumer().read(&mut payload[pos..end]);
        if n == 0 {
            if let Err(e) = self.check_peer() {
                // As for the frame above: bytes written just before the close still count.
                n = self.consumer().read(&mut payload[pos..end]);
                if n == 0 {
                    return Err(e);
                }
            }
        }
        if n > 0 {
            p.parts[0].pos += n;
            self.peer_bell.ring();
        }
        Ok(p.done())
    }

    fn lends(&self) -> bool {
        // A receiver that offered cross-memory attach may get payloads read from the sender's
        // memory, which it cannot lend.
        !self.cfg.cma
    }

    fn recv_lent(
        &mut self,
        header: &mut Header,
        len: usize,
        granule: usize,
        p: &mut Progress,
        sink: &mut dyn FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<bool> {
        if !self.lends() {
            return Err(Error::internal(format!(
                "recv from {}: this end offers cross-memory attach and lends nothing (use recv)",
                self.peer
            )));
        }
        self.receive_lent(header, len, granule, p, sink)
    }

    fn poll_fds(&self, _sending: bool, _receiving: bool, _out: &mut Vec<PollFd>) {}

    fn describe(&self) -> String {
        if self.cma_enabled() {
            "+cma".to_string()
        } else {
            String::new()
        }
    }

    fn doorbell(&self) -> Option<Arc<dyn Doorbell>> {
        Some(Arc::clone(&self.my_bell) as Arc<dyn Doorbell>)
    }

    fn small_lane(&mut self) -> Option<&mut dyn SmallLane> {
        Some(self)
    }

    fn shutdown(&mut self) {
        if !self.closed {
            self.closed = true;
            self.tx.set_flag(PRODUCER_CLOSED);
            self.rx.set_flag(CONSUMER_CLOSED);
            self.peer_bell.ring();
        }
    }
}

impl SmallLane for ShmConnection {
    fn capacity(&self) -> usize {
        LANE_BYTES
    }

    fn put(&mut self, n: u64, tag: [u64; 3], data: &[u8]) -> Result<()> {
        if data.len() > LANE_BYTES {
            return Err(Error::internal(format!(
                "lane message to {}: {} bytes, at most {LANE_BYTES} fit",
                self.peer,
                data.len()
            )));
        }
        if self.closed {
            return Err(self.closed_error());
        }
        self.tx.lane_box(n).put(n, tag, data);
        self.peer_bell.ring();
        Ok(())
    }

    fn take(&mut self, n: u64, out: &mut [u8]) -> Result<LaneTake> {
        if self.closed {
            return Err(self.closed_error());
        }
        if let Some(tag) = self.rx.lane_box(n).take(n, out) {
            return Ok(LaneTake::Arrived(tag));
        }
        if self.ahead_len() > 0 || self.consumer().has_data() {
            // The peer wrote lane messages before the stream bytes that follow them (Release,
            // then Release), and the Acquire that saw those bytes makes such a message visible
            // now: look once more before calling it a stray.
            if let Some(tag) = self.rx.lane_box(n).take(n, out) {
                return Ok(LaneTake::Arrived(tag));
            }
            return Ok(LaneTake::Stream);
        }
        if let Err(e) = self.check_peer() {
            // A message written just before the close counts (the close flag's Acquire makes
            // it visible).
            if let Some(tag) = self.rx.lane_box(n).take(n, out) {
                return Ok(LaneTake::Arrived(tag));
            }
            return Err(e);
        }
        Ok(LaneTake::Empty)
    }
}

impl Drop for ShmConnection {
    fn drop(&mut self) {
        self.shutdown();
    }
}
