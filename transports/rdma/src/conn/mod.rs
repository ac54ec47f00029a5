//! One peer pair over RDMA: a few reliable-connected queue pairs sharing one completion queue,
//! carrying both directions.
//!
//! Sending message n: the sender writes its header slot into the receiver's header ring
//! (WRITE_WITH_IMM `Header(n)`), with the payload inline when it is small and the receiver has
//! not advertised a destination yet. Otherwise it waits for the clear-to-send of message n in
//! its FIFO (written by the receiver with WRITE_WITH_IMM `Cts(n)`: address, rkey, length),
//! checks the length, and writes the payload straight into the destination, one stripe per
//! queue pair in pieces of `chunk` bytes, each a WRITE_WITH_IMM `Data(n)`, so the receiver
//! sees each stripe's prefix land. The receiver advertises a destination when it is posted
//! ([`Connection::post_recv`]) or, for a receive nobody posted, once the header is read and the
//! buffer offered. Header slots come back as credits (`Credit(k)`); FIFO slots are free once
//! the next header arrives. Every work request is signalled and counted against its queue's
//! depth, so neither the send queue nor the completion queue can overflow.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferroccl_transport::{
    Connection, Doorbell, Error, Header, MemRef, MemSpace, Payload, PayloadMut, PeerInfo, PollFd,
    Progress, RegCache, Region, Result,
};

use crate::ctrl::CtrlBuf;

mod rx;
mod tx;
use crate::proto::{
    header_allowed, widen, wr_id, wr_parts, Cts, Imm, WrKind, DEPTH, FLAG_CLOSE, SLOT_HEAD,
};
use crate::verbs::{MemoryRegion, QpAttrs, Verbs, VerbsError, Wc, WcOpcode, WcStatus, WriteWr};

/// Settings of one connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnSettings {
    pub nqps: usize,
    pub chunk: usize,
    pub eager: usize,
    pub attrs: QpAttrs,
    pub keepalive: Duration,
    /// Whether registrations this connection makes itself (sources, unposted destinations)
    /// are cached by address. Only where a registration cannot go stale: a real HCA pins the
    /// pages a region had when registered, so a buffer freed and reallocated at the same
    /// address would be read from its old pages; the software provider copies from the
    /// address as it is now.
    pub cache_regs: bool,
}

/// Work requests of each send queue kept free for control writes (headers, clear-to-sends,
/// credits, probes), so a long payload never starves them.
const CONTROL_RESERVE: usize = 4;

/// Payload writes in flight per queue pair (NCCL keeps a few requests per connection in
/// flight too): a message moves in windows, so the receiver sees stripes grow and a dead
/// peer stops the sender after a window, not after the whole message.
const DATA_WINDOW: usize = 4;

/// What a [`Region`] of this transport holds: the memory region, deregistered with the last
/// clone.
pub(crate) struct MrKeep<M: MemoryRegion>(pub Arc<M>);

/// A registered control buffer and its region.
pub(crate) struct Ctrl<V: Verbs> {
    pub buf: CtrlBuf,
    pub mr: V::Mr,
}

impl<V: Verbs> Ctrl<V> {
    pub(crate) fn new(dev: &V, len: usize) -> std::result::Result<Ctrl<V>, VerbsError> {
        let buf = CtrlBuf::new(len);
        let mr = dev.reg_mr(buf.addr(), buf.len())?;
        Ok(Ctrl { buf, mr })
    }
}

/// Where the peer's control buffers are.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RemoteCtrl {
    pub hdr_addr: u64,
    pub hdr_rkey: u32,
    pub cts_addr: u64,
    pub cts_rkey: u32,
}

/// The parts of a connection that setup builds before the peer is known.
pub(crate) struct Endpoint<V: Verbs> {
    /// Destroyed before the completion queue (declaration order).
    pub qps: Vec<V::Qp>,
    pub cq: V::Cq,
    /// Header ring this side receives into: DEPTH slots of `SLOT_HEAD + eager` bytes.
    pub hdr_ring: Ctrl<V>,
    /// Clear-to-send FIFO this side receives into.
    pub cts_fifo: Ctrl<V>,
    /// Staging of this side's outgoing header slots.
    pub hdr_tx: Ctrl<V>,
    /// Staging of this side's outgoing clear-to-sends.
    pub cts_tx: Ctrl<V>,
}

/// The send half's state for the message under way.
#[derive(Debug, Default)]
struct Tx {
    /// Message number.
    n: u64,
    inline: bool,
    cts: Option<Cts>,
    /// The source's registration, while its writes are outstanding.
    region: Option<Region>,
    /// Data writes posted and not yet completed.
    outstanding: usize,
    /// The same, per queue pair.
    inflight: [usize; ferroccl_transport::MAX_PARTS],
}

/// A destination posted before its header came.
#[derive(Debug, Clone)]
struct Post {
    n: u64,
    dst: MemRef,
    rkey: u32,
    advertised: bool,
    /// The registration this connection made for it (none when the caller passed one).
    _keep: Option<Region>,
}

/// The receive half's state for the message under way.
#[derive(Debug, Default)]
struct Rx {
    n: u64,
    inline: bool,
    posted: Option<Post>,
    /// Registration of an unposted destination, until the message is in.
    region: Option<Region>,
    /// The clear-to-send of an unposted destination, until the queue has room for it.
    cts_due: Option<(MemRef, u32)>,
}

/// One end of an RDMA connection (see the module docs).
pub struct RdmaConnection<V: Verbs> {
    dev: Arc<V>,
    peer: PeerInfo,
    rank: usize,
    set: ConnSettings,
    ep: Endpoint<V>,
    qpns: Vec<u32>,
    remote: RemoteCtrl,
    sq_used: Vec<usize>,
    /// Completions read by the last poll.
    wcs: Vec<Wc>,

    // Send half.
    tx: Tx,
    /// Messages begun (the next one's number).
    tx_next: u64,
    /// Header slots the receiver has freed.
    credit: u64,
    /// Per header staging slot: its write is outstanding.
    hdr_busy: [bool; DEPTH],
    /// Per FIFO slot: the message number whose clear-to-send arrived there.
    cts_seen: [Option<u64>; DEPTH],
    /// Clear-to-sends seen (for widening their numbers).
    cts_max: u64,

    // Receive half.
    rx: Rx,
    posts: VecDeque<Post>,
    /// Header slots that have arrived.
    hdr_arrived: u64,
    /// Headers read.
    hdr_taken: u64,
    /// Header slots freed (messages started).
    freed: u64,
    /// The last freed count sent as a credit.
    credit_sent: u64,
    /// Per clear-to-send staging slot: its write is outstanding.
    cts_busy: [bool; DEPTH],
    /// Per queue pair: payload pieces landed and not yet counted, as (message, bytes).
    landed: Vec<VecDeque<(u32, u32)>>,
    /// The message number of the peer's close, once its slot arrived.
    peer_closed: Option<u64>,

    /// Sources and unposted destinations registered by this connection.
    regs: RegCache,
    failed: Option<Error>,
    closed: bool,
    last_activity: Instant,
    /// Completion of the last keep-alive probe outstanding.
    probing: bool,
}

impl<V: Verbs> fmt::Debug for RdmaConnection<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaConnection")
            .field("peer", &self.peer)
            .field("rank", &self.rank)
            .field("device", &self.dev.device())
            .field("qpns", &self.qpns)
            .finish()
    }
}

impl<V: Verbs> RdmaConnection<V> {
    /// A connection over `ep`, whose queue pairs are connected to the peer's.
    pub(crate) fn new(
        dev: Arc<V>,
        rank: usize,
        peer: PeerInfo,
        set: ConnSettings,
        ep: Endpoint<V>,
        remote: RemoteCtrl,
    ) -> RdmaConnection<V> {
        let qpns = ep.qps.iter().map(|q| dev.qp_num(q)).collect();
        let nqps = ep.qps.len();
        RdmaConnection {
            dev,
            peer,
            rank,
            set,
            ep,
            qpns,
            remote,
            sq_used: vec![0; nqps],
            wcs: Vec::with_capacity(64),
            tx: Tx::default(),
            tx_next: 0,
            credit: 0,
            hdr_busy: [false; DEPTH],
            cts_seen: [None; DEPTH],
            cts_max: 0,
            rx: Rx::default(),
            posts: VecDeque::new(),
            hdr_arrived: 0,
            hdr_taken: 0,
            freed: 0,
            credit_sent: 0,
            cts_busy: [false; DEPTH],
            landed: vec![VecDeque::new(); nqps],
            peer_closed: None,
            regs: RegCache::new(64),
            failed: None,
            closed: false,
            last_activity: Instant::now(),
            probing: false,
        }
    }

    fn slot_len(&self) -> usize {
        SLOT_HEAD + self.set.eager
    }

    /// "soft0 port 1": this side's device and port, for errors.
    fn here(&self) -> String {
        format!("{} port {}", self.dev.device(), self.dev.port())
    }

    /// The error for a verbs call that failed outright.
    fn verbs_error(&self, what: &str, e: VerbsError) -> Error {
        Error::remote(format!("{what} {} over {}: {e}", self.peer, self.here()))
            .with_peer(self.peer.rank)
    }

    /// Records the first failure and returns it.
    fn fail(&mut self, e: Error) -> Error {
        if self.failed.is_none() {
            self.failed = Some(e.clone());
            for q in &mut self.ep.qps {
                self.dev.set_error(q);
            }
        }
        self.failed.clone().unwrap_or(e)
    }

    fn check(&self, what: &str) -> Result<()> {
        if self.closed {
            return Err(Error::invalid_usage(format!(
                "{what} {}: rank {} already closed this connection",
                self.peer, self.rank
            ))
            .with_peer(self.peer.rank));
        }
        match &self.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Posts one write on queue pair `q`.
    fn post(&mut self, q: usize, wr: WriteWr) -> Result<()> {
        if let Err(e) = self.dev.post_write(&mut self.ep.qps[q], &wr) {
            let e = self.verbs_error("RDMA write to", e);
            return Err(self.fail(e));
        }
        self.sq_used[q] += 1;
        Ok(())
    }

    fn room(&self, q: usize, reserve: usize) -> bool {
        self.sq_used[q] + reserve < self.set.attrs.max_send_wr as usize
    }

    /// Polls the completion queue and applies what it reports. Errors name the peer, both
    /// ports and the verbs status in words.
    fn progress(&mut self) -> Result<bool> {
        let mut wcs = std::mem::take(&mut self.wcs);
        let mut first: Option<Error> = None;
        let mut moved = false;
        // A failed completion may come just before the peer's close (a clear-to-send it no
        // longer needed, written as it left): read what else arrived before judging it.
        for round in 0..2 {
            wcs.clear();
            if let Err(e) = self.dev.poll_cq(&mut self.ep.cq, 64 << round, &mut wcs) {
                self.wcs = wcs;
                let e = self.verbs_error("completions from", e);
                return Err(self.fail(e));
            }
            moved |= !wcs.is_empty();
            for wc in &wcs {
                if let Err(e) = self.apply(wc) {
                    first.get_or_insert(e);
                }
            }
            if first.is_none() {
                break;
            }
        }
        self.wcs = wcs;
        if let Some(e) = first {
            // Once the peer has closed, its refusals are expected; what this side still
            // wants from it fails on the close itself (recv) or at once (send).
            if self.peer_closed.is_none() {
                return Err(self.fail(e));
            }
        }
        if moved {
            self.last_activity = Instant::now();
        }
        Ok(moved)
    }

    fn apply(&mut self, wc: &Wc) -> Result<()> {
        if wc.status != WcStatus::Success {
            return Err(self.wc_error(wc));
        }
        match wc.opcode {
            WcOpcode::Write => {
                let (kind, q, n) = wr_parts(wc.wr_id);
                if let Some(u) = self.sq_used.get_mut(q) {
                    *u = u.saturating_sub(1);
                }
                match kind {
                    Some(WrKind::Header) => self.hdr_busy[n as usize % DEPTH] = false,
                    Some(WrKind::Cts) => self.cts_busy[n as usize % DEPTH] = false,
                    Some(WrKind::Data) => {
                        self.tx.outstanding = self.tx.outstanding.saturating_sub(1);
                        if let Some(f) = self.tx.inflight.get_mut(q) {
                            *f = f.saturating_sub(1);
                        }
                    }
                    Some(WrKind::Probe) => self.probing = false,
                    _ => {}
                }
            }
            WcOpcode::RecvImm => {
                let q = self.qpns.iter().position(|&n| n == wc.qpn).unwrap_or(0);
                if let Err(e) = self.dev.post_recv(&mut self.ep.qps[q], q as u64) {
                    let e = self.verbs_error("receive from", e);
                    return Err(self.fail(e));
                }
                match Imm::decode(wc.imm) {
                    Imm::Credit(k) => self.credit = self.credit.max(widen(self.credit, k)),
                    Imm::Header(_) => {
                        let n = self.hdr_arrived;
                        self.hdr_arrived += 1;
                        let (_, flags, _) = self.slot_head(n);
                        if flags & FLAG_CLOSE != 0 && self.peer_closed.is_none() {
                            self.peer_closed = Some(n);
                        }
                    }
                    Imm::Cts(k) => {
                        let n = widen(self.cts_max.saturating_sub(DEPTH as u64), k);
                        self.cts_max = self.cts_max.max(n);
                        self.cts_seen[n as usize % DEPTH] = Some(n);
                    }
                    Imm::Data(k) => self.landed[q].push_back((k, wc.byte_len)),
                }
            }
        }
        Ok(())
    }

    /// The error a failed completion stands for.
    fn wc_error(&self, wc: &Wc) -> Error {
        let what = match wc.opcode {
            WcOpcode::RecvImm => "a receive".to_string(),
            WcOpcode::Write => match wr_parts(wc.wr_id).0 {
                Some(WrKind::Data) => "an RDMA write of payload".to_string(),
                Some(WrKind::Header) => "an RDMA write of a header".to_string(),
                Some(WrKind::Cts) => "an RDMA write of a clear-to-send".to_string(),
                Some(WrKind::Probe) => "a keep-alive probe".to_string(),
                _ => "an RDMA write".to_string(),
            },
        };
        Error::remote(format!(
            "{}: {} ({what} on queue pair {:#x} of {})",
            self.peer,
            wc.status.words(),
            wc.qpn,
            self.here()
        ))
        .with_peer(self.peer.rank)
    }

    /// The registration covering `mem`, registering it now if none is cached.
    fn region_for(&mut self, mem: MemRef, what: &str) -> Result<Region> {
        if !self.set.cache_regs {
            return self.register_now(mem, what);
        }
        if let Some(r) = self.regs.get(0, &mem) {
            return Ok(r.clone());
        }
        let r = self.register_now(mem, what)?;
        self.regs.insert(0, r.clone());
        Ok(r)
    }

    fn register_now(&mut self, mem: MemRef, what: &str) -> Result<Region> {
        if mem.space != MemSpace::Host {
            Payload::Device(mem).host("rdma")?;
        }
        let mr = self.dev.reg_mr(mem.addr, mem.len.max(1)).map_err(|e| {
            Error::new(
                ferroccl_transport::ErrorKind::System,
                format!(
                    "{what} {}: registering {} bytes at {:#x} with {}: {e}",
                    self.peer,
                    mem.len,
                    mem.addr,
                    self.here()
                ),
            )
            .with_peer(self.peer.rank)
        })?;
        let key = u64::from(mr.rkey());
        Ok(Region::new(mem, key, MrKeep(Arc::new(mr))))
    }

    /// While waiting with nothing arriving, probes the peer now and then: a zero-byte write
    /// that fails (retry count exceeded) when the peer or the link is gone.
    fn keepalive(&mut self, moved: bool) -> Result<()> {
        if moved || self.probing || self.last_activity.elapsed() < self.set.keepalive {
            return Ok(());
        }
        if !self.room(0, 0) {
            return Ok(());
        }
        self.probing = true;
        self.last_activity = Instant::now();
        let wr = WriteWr {
            wr_id: wr_id(WrKind::Probe, 0, 0),
            local_addr: self.ep.hdr_tx.buf.addr(),
            len: 0,
            lkey: self.ep.hdr_tx.mr.lkey(),
            remote_addr: self.remote.hdr_addr,
            rkey: self.remote.hdr_rkey,
            imm: None,
            signaled: true,
        };
        self.post(0, wr)
    }

    fn peer_closed_error(&self) -> Error {
        Error::remote(format!("{} closed the connection", self.peer)).with_peer(self.peer.rank)
    }

    /// Closes this end: tells the peer in a last header slot (when the ring has room), then
    /// fails the queue pairs so that later writes from the peer are refused.
    fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        if self.failed.is_none() {
            let _ = self.progress();
            let n = self.tx_next;
            if header_allowed(n, self.credit)
                && !self.hdr_busy[n as usize % DEPTH]
                && self.room(0, 0)
            {
                let _ = self.post_header(&Header::default(), FLAG_CLOSE, &[], n);
                // Give the close slot a moment to leave before the queue pairs fail.
                let start = Instant::now();
                while self.hdr_busy[n as usize % DEPTH]
                    && start.elapsed() < Duration::from_millis(100)
                {
                    if self.progress().is_err() {
                        break;
                    }
                }
            }
        }
        for q in &mut self.ep.qps {
            self.dev.set_error(q);
        }
    }
}

impl<V: Verbs> Connection for RdmaConnection<V> {
    fn peer(&self) -> &PeerInfo {
        &self.peer
    }

    fn send(&mut self, header: &Header, payload: Payload<'_>, p: &mut Progress) -> Result<bool> {
        let payload = payload.host("rdma")?;
        self.check("send to")?;
        header.check_send_len(&self.peer, payload.len())?;
        let moved = self.progress()?;
        if self.peer_closed.is_some() {
            return Err(self.peer_closed_error());
        }
        if !p.header_done() && !self.begin_send(header, payload, p)? {
            self.keepalive(moved)?;
            return Ok(false);
        }
        if self.tx.inline {
            return Ok(true);
        }
        self.push_payload(payload, p)?;
        if p.done() && self.tx.outstanding > 0 {
            self.progress()?;
        }
        if p.done() && self.tx.outstanding == 0 {
            self.tx.region = None;
            return Ok(true);
        }
        self.keepalive(moved)?;
        Ok(false)
    }

    fn recv(
        &mut self,
        header: &mut Header,
        payload: PayloadMut<'_>,
        p: &mut Progress,
    ) -> Result<bool> {
        let buf = payload.host("rdma")?;
        self.check("recv from")?;
        let moved = self.progress()?;
        self.advertise()?;
        if !p.header_done() {
            if self.hdr_arrived <= self.hdr_taken {
                self.keepalive(moved)?;
                return Ok(false);
            }
            self.take_header(header, p)?;
            // The caller checks the header before the payload is asked for.
            return Ok(false);
        }
        if !p.started {
            self.start_payload(header, buf, p)?;
        } else {
            self.send_due_cts()?;
        }
        self.count_landed(p)?;
        if p.done() {
            self.rx.region = None;
            self.advertise()?;
            return Ok(true);
        }
        self.keepalive(moved)?;
        Ok(false)
    }

    fn post_recv(&mut self, dst: MemRef, region: Option<&Region>) -> Result<()> {
        self.check("post_recv from")?;
        if dst.space != MemSpace::Host {
            Payload::Device(dst).host("rdma")?;
        }
        let mut keep = None;
        let rkey = match region {
            Some(r) => {
                let mr = r.resources::<MrKeep<V::Mr>>().ok_or_else(|| {
                    Error::invalid_argument(format!(
                        "post_recv from {}: region {} was not registered by the rdma transport",
                        self.peer,
                        r.key()
                    ))
                })?;
                if !r.mem().contains(&dst) {
                    return Err(Error::invalid_argument(format!(
                        "post_recv from {}: the {}-byte destination at {:#x} lies outside \
                         region {:#x} ({} bytes at {:#x})",
                        self.peer,
                        dst.len,
                        dst.addr,
                        r.key(),
                        r.mem().len,
                        r.mem().addr
                    )));
                }
                mr.0.rkey()
            }
            None => {
                let r = self.region_for(dst, "post_recv from")?;
                keep = Some(r.clone());
                r.key() as u32
            }
        };
        let n = self.hdr_taken + self.posts.len() as u64;
        self.posts.push_back(Post {
            n,
            dst,
            rkey,
            advertised: false,
            _keep: keep,
        });
        self.progress()?;
        self.advertise()
    }

    fn register(&mut self, mem: MemRef) -> Result<Option<Region>> {
        self.check("register for")?;
        self.register_now(mem, "register for").map(Some)
    }

    fn describe(&self) -> String {
        let note = if self.dev.device().starts_with("soft") {
            " (software verbs: test tooling)"
        } else {
            ""
        };
        format!(
            "{}{note}, {} queue pairs, chunk {} KiB",
            self.here(),
            self.ep.qps.len(),
            self.set.chunk / 1024
        )
    }

    fn poll_fds(&self, _sending: bool, _receiving: bool, _out: &mut Vec<PollFd>) {}

    fn doorbell(&self) -> Option<Arc<dyn Doorbell>> {
        self.dev.doorbell()
    }

    fn shutdown(&mut self) {
        self.close();
    }
}

impl<V: Verbs> Drop for RdmaConnection<V> {
    fn drop(&mut self) {
        self.close();
    }
}
