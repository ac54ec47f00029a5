//! One peer pair over the p2p transport: the ring this rank writes into (the peer's slots, its
//! flags in the peer's control segment) and the ring it reads from (its own), driven by the
//! sans-IO sides of `proto.rs`.
//!
//! Closing and dead peers as in the shared-memory transport: `shutdown` sets `SENDER_CLOSED`
//! in the block this rank writes and `RECEIVER_CLOSED` in the block it reads, then rings the
//! peer; a side that cannot move checks those flags and whether the peer's process still exists
//! (a pidfd, every few milliseconds, or at once when the rank's watch thread saw an exit).

#![forbid(unsafe_code)]

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferroccl_transport::{
    Connection, Doorbell, Error, Fence, Header, LaneTake, LentSink, Payload, PayloadMut, PeerInfo,
    PollFd, Progress, Result, SmallLane, HEADER_LEN,
};
use ferroccl_transport_shm::{Bell, PeerWatch, LANE_BYTES};

use crate::proto::{Flags, Layout, Mover, RecvSide, SendSide, LINE_WORDS};
use crate::provider::Copier;
use crate::segment::{Block, RECEIVER_CLOSED, SENDER_CLOSED};

/// How often an idle side checks whether the peer process still exists.
const LIVENESS_EVERY: Duration = Duration::from_millis(5);

impl Flags for Block {
    fn flag(&self, slot: usize) -> u64 {
        // Acquire: pairs with the sender's Release store of the flag; its line and the slot's
        // bytes (copied before the flag was written) are visible.
        self.line(slot, 0).load(Ordering::Acquire)
    }

    fn line(&self, slot: usize) -> [u64; LINE_WORDS - 1] {
        // Relaxed: read after the Acquire load of the flag, which ordered the writes.
        std::array::from_fn(|i| Block::line(self, slot, i + 1).load(Ordering::Relaxed))
    }

    fn publish(&self, slot: usize, line: [u64; LINE_WORDS - 1], flag: u64) {
        for (i, w) in line.iter().enumerate() {
            // Relaxed: published by the Release store of the flag below.
            Block::line(self, slot, i + 1).store(*w, Ordering::Relaxed);
        }
        // Release: the line and the slot's bytes before it are visible to the receiver.
        Block::line(self, slot, 0).store(flag, Ordering::Release);
    }

    fn tail(&self) -> u64 {
        // Acquire: the receiver's copies out of the slots it handed back are finished.
        Block::tail(self).load(Ordering::Acquire)
    }

    fn set_tail(&self, tail: u64) {
        // Release: this side's copies out of the slots happen before the sender reuses them.
        Block::tail(self).store(tail, Ordering::Release);
    }
}

struct TxMover<'a> {
    c: &'a mut Copier,
    payload: Payload<'a>,
    slot_bytes: usize,
}

impl Mover for TxMover<'_> {
    fn start(&mut self, slot: usize, off: usize, n: usize) -> Result<()> {
        self.c
            .put(slot, slot * self.slot_bytes, &self.payload, off, n)
    }
    fn done(&mut self, slot: usize) -> Result<bool> {
        self.c.done(slot)
    }
}

struct RxMover<'a, 'b> {
    c: &'a mut Copier,
    payload: &'a mut PayloadMut<'b>,
    slot_bytes: usize,
}

impl Mover for RxMover<'_, '_> {
    fn start(&mut self, slot: usize, off: usize, n: usize) -> Result<()> {
        self.c
            .get(slot, slot * self.slot_bytes, self.payload, off, n)
    }
    fn done(&mut self, slot: usize) -> Result<bool> {
        self.c.done(slot)
    }
}

/// Hands each slot's bytes to a sink where they lie, instead of copying them out: done when
/// the sink returns, or, where it returns a fence (work still reading the slot), once the
/// fence is.
struct LentMover<'a, 'b> {
    c: &'a Copier,
    sink: &'a mut LentSink<'b>,
    fences: &'a mut [Option<Box<dyn Fence>>],
    slot_bytes: usize,
}

impl Mover for LentMover<'_, '_> {
    fn start(&mut self, slot: usize, off: usize, n: usize) -> Result<()> {
        let piece = self.c.lend(slot * self.slot_bytes, n)?;
        self.fences[slot] = (self.sink)(off, piece)?;
        Ok(())
    }
    fn done(&mut self, slot: usize) -> Result<bool> {
        let Some(f) = &mut self.fences[slot] else {
            return Ok(true);
        };
        if !f.done()? {
            return Ok(false);
        }
        self.fences[slot] = None;
        Ok(true)
    }
}

/// Where a receive's bytes go: copied into a buffer, or lent to a sink (a message of `len`
/// bytes).
enum Rx<'a, 'b> {
    Copy(&'a mut PayloadMut<'b>),
    Lend {
        len: usize,
        sink: &'a mut LentSink<'b>,
    },
}

impl Rx<'_, '_> {
    fn len(&self) -> usize {
        match self {
            Rx::Copy(p) => p.len(),
            Rx::Lend { len, .. } => *len,
        }
    }
}

/// What setup hands a connection.
#[derive(Debug)]
pub(crate) struct Parts {
    pub peer: PeerInfo,
    pub layout: Layout,
    /// The block this rank writes (in the peer's segment) and the one it reads (its own).
    pub tx: Block,
    pub rx: Block,
    pub tx_copier: Copier,
    pub rx_copier: Copier,
    pub my_bell: Arc<Bell>,
    pub peer_bell: Arc<Bell>,
    pub peer_pid: u32,
    pub same_process: bool,
    pub describe: String,
}

/// One peer pair over the p2p transport.
#[derive(Debug)]
pub struct P2pConnection {
    p: Parts,
    send: SendSide,
    recv: RecvSide,
    /// Per slot of the ring this rank reads, the fence of work still reading it where it was
    /// lent ([`Connection::recv_lent_device`]).
    lent: Vec<Option<Box<dyn Fence>>>,
    pidfd: Option<OwnedFd>,
    last_liveness: Instant,
    watch: Option<Arc<PeerWatch>>,
    closed: bool,
}

impl P2pConnection {
    pub(crate) fn new(p: Parts) -> P2pConnection {
        let lent = (0..p.layout.nslots).map(|_| None).collect();
        let pidfd = if p.same_process {
            None
        } else {
            crate::alive::pidfd(p.peer_pid)
        };
        P2pConnection {
            p,
            send: SendSide::default(),
            recv: RecvSide::default(),
            lent,
            pidfd,
            last_liveness: Instant::now(),
            watch: None,
            closed: false,
        }
    }

    /// The peer's process id.
    pub fn peer_pid(&self) -> u32 {
        self.p.peer_pid
    }

    pub(crate) fn set_watch(&mut self, w: Arc<PeerWatch>) {
        self.watch = Some(w);
    }

    fn closed_error(&self) -> Error {
        Error::remote(format!("{} closed the connection", self.p.peer)).with_peer(self.p.peer.rank)
    }

    /// With nothing to move: fails if the peer closed or its process is gone.
    fn check_peer(&mut self) -> Result<()> {
        if self.p.tx.flag(RECEIVER_CLOSED) || self.p.rx.flag(SENDER_CLOSED) {
            return Err(self.closed_error());
        }
        if let Some(fd) = &self.pidfd {
            let now = Instant::now();
            let told = self.watch.as_ref().is_some_and(|w| w.exited());
            if told || now.duration_since(self.last_liveness) >= LIVENESS_EVERY {
                self.last_liveness = now;
                if crate::alive::exited(fd) {
                    return Err(Error::remote(format!(
                        "{} exited (process {} is gone) without closing the connection",
                        self.p.peer, self.p.peer_pid
                    )));
                }
            }
        }
        Ok(())
    }

    fn tx_progress(
        &mut self,
        header: &Header,
        payload: Payload<'_>,
        p: &mut Progress,
    ) -> Result<bool> {
        let mut m = TxMover {
            c: &mut self.p.tx_copier,
            payload,
            slot_bytes: self.p.layout.slot_bytes,
        };
        self.send
            .progress(&self.p.layout, &self.p.tx, &mut m, header, p)
    }

    fn rx_progress(&mut self, rx: &mut Rx<'_, '_>, len: usize, p: &mut Progress) -> Result<bool> {
        let slot_bytes = self.p.layout.slot_bytes;
        match rx {
            Rx::Copy(payload) => {
                let mut m = RxMover {
                    c: &mut self.p.rx_copier,
                    payload,
                    slot_bytes,
                };
                self.recv
                    .progress(&self.p.layout, &self.p.rx, &mut m, len, p)
            }
            Rx::Lend { sink, .. } => {
                let mut m = LentMover {
                    c: &self.p.rx_copier,
                    sink: &mut **sink,
                    fences: &mut self.lent,
                    slot_bytes,
                };
                self.recv
                    .progress(&self.p.layout, &self.p.rx, &mut m, len, p)
            }
        }
    }

    /// A receive, its bytes copied into a buffer or lent.
    fn receive(
        &mut self,
        header: &mut Header,
        mut rx: Rx<'_, '_>,
        p: &mut Progress,
    ) -> Result<bool> {
        if self.closed {
            return Err(self.closed_error());
        }
        let peer = self.p.peer.clone();
        let ctx = |e: Error| {
            e.context(format_args!("recv from {peer}"))
                .with_peer(peer.rank)
        };
        if !p.header_done() {
            let mut h = self.recv.header(&self.p.layout, &self.p.rx).map_err(ctx)?;
            if h.is_none() {
                if let Err(e) = self.check_peer() {
                    // A sender that published its last message and then closed is no error:
                    // the close flag's Acquire makes the message's flag visible now.
                    h = self.recv.header(&self.p.layout, &self.p.rx).map_err(ctx)?;
                    if h.is_none() {
                        return Err(e);
                    }
                }
            }
            if let Some(h) = h {
                *header = h;
                p.header_pos = HEADER_LEN;
            }
            // The caller checks the header before the payload moves.
            return Ok(false);
        }
        let len = rx.len();
        if !p.started {
            header.check_recv_len(&self.p.peer, len)?;
            self.recv.start(p, len);
        }
        let mut moved = self.rx_progress(&mut rx, len, p).map_err(ctx)?;
        if !moved && !self.recv.complete() {
            if let Err(e) = self.check_peer() {
                // As for the header: slots published just before the close still count, and
                // so do copies out of them still in flight (they finish whatever the sender
                // does; the next call hands their slots back). Asked before the retry: a copy
                // that ends between the two is handed back by the retry.
                let busy = self.p.rx_copier.in_flight() || self.lent.iter().any(Option::is_some);
                moved = self.rx_progress(&mut rx, len, p).map_err(ctx)?;
                if !moved && !busy {
                    return Err(e);
                }
            }
        }
        if moved {
            self.p.peer_bell.ring();
        }
        Ok(self.recv.complete())
    }
}

impl Connection for P2pConnection {
    fn peer(&self) -> &PeerInfo {
        &self.p.peer
    }

    fn send(&mut self, header: &Header, payload: Payload<'_>, p: &mut Progress) -> Result<bool> {
        if self.closed {
            return Err(self.closed_error());
        }
        header.check_send_len(&self.p.peer, payload.len())?;
        let moved = self
            .tx_progress(header, payload, p)
            .map_err(|e| e.context(format_args!("send to {}", self.p.peer)))?;
        if moved {
            self.p.peer_bell.ring();
        } else if !self.send.complete() {
            self.check_peer()?;
        }
        Ok(self.send.complete())
    }

    fn recv(
        &mut self,
        header: &mut Header,
        mut payload: PayloadMut<'_>,
        p: &mut Progress,
    ) -> Result<bool> {
        self.receive(header, Rx::Copy(&mut payload), p)
    }

    fn lends_device(&self) -> bool {
        // Every piece but a message's last must be whole 16-byte units (whole elements).
        self.p.layout.slot_bytes.is_multiple_of(16)
    }

    fn recv_lent_device(
        &mut self,
        header: &mut Header,
        len: usize,
        p: &mut Progress,
        sink: &mut LentSink<'_>,
    ) -> Result<bool> {
        self.receive(header, Rx::Lend { len, sink }, p)
    }

    fn describe(&self) -> String {
        self.p.describe.clone()
    }

    fn poll_fds(&self, _sending: bool, _receiving: bool, _out: &mut Vec<PollFd>) {}

    fn in_flight(&self) -> bool {
        // Lent slots whose work is not known done: no doorbell rings when it is.
        self.p.tx_copier.in_flight()
            || self.p.rx_copier.in_flight()
            || self.lent.iter().any(Option::is_some)
    }

    fn doorbell(&self) -> Option<Arc<dyn Doorbell>> {
        Some(Arc::clone(&self.p.my_bell) as Arc<dyn Doorbell>)
    }

    fn small_lane(&mut self) -> Option<&mut dyn SmallLane> {
        Some(self)
    }

    fn shutdown(&mut self) {
        if !self.closed {
            self.closed = true;
            self.p.tx.set_flag(SENDER_CLOSED);
            self.p.rx.set_flag(RECEIVER_CLOSED);
            self.p.peer_bell.ring();
        }
    }
}

/// The lane's boxes live in the control segments, in host shared memory, whatever the
/// provider: a lane message never touches the GPU.
impl SmallLane for P2pConnection {
    fn capacity(&self) -> usize {
        LANE_BYTES
    }

    fn put(&mut self, n: u64, tag: [u64; 3], data: &[u8]) -> Result<()> {
        if data.len() > LANE_BYTES {
            return Err(Error::internal(format!(
                "lane message to {}: {} bytes, at most {LANE_BYTES} fit",
                self.p.peer,
                data.len()
            )));
        }
        if self.closed {
            return Err(self.closed_error());
        }
        self.p.tx.lane_box(n).put(n, tag, data);
        self.p.peer_bell.ring();
        Ok(())
    }

    fn take(&mut self, n: u64, out: &mut [u8]) -> Result<LaneTake> {
        if self.closed {
            return Err(self.closed_error());
        }
        if let Some(tag) = self.p.rx.lane_box(n).take(n, out) {
            return Ok(LaneTake::Arrived(tag));
        }
        if self.recv.waiting(&self.p.layout, &self.p.rx) {
            // The peer wrote its lane messages before the flags of the stream messages that
            // follow them (Release, then Release), and the Acquire that saw that flag makes
            // such a message visible now: look once more before calling it a stray.
            if let Some(tag) = self.p.rx.lane_box(n).take(n, out) {
                return Ok(LaneTake::Arrived(tag));
            }
            return Ok(LaneTake::Stream);
        }
        if let Err(e) = self.check_peer() {
            // A message written just before the close counts (the close flag's Acquire makes
            // it visible).
            if let Some(tag) = self.p.rx.lane_box(n).take(n, out) {
                return Ok(LaneTake::Arrived(tag));
            }
            return Err(e);
        }
        Ok(LaneTake::Empty)
    }
}

impl Drop for P2pConnection {
    fn drop(&mut self) {
        self.shutdown();
        // Work still reading lent slots finishes before the slots go (an error leaves it
        // running: nothing more can be done for it).
        for f in self.lent.iter_mut().filter_map(Option::as_mut) {
            let _ = f.wait();
        }
    }
}
