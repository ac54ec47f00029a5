//! ferroccl's transport contract: how bytes cross between two ranks.
//!
//! | item | what it is |
//! |---|---|
//! | [`Connection`] | one peer pair's link; non-blocking `send` / `recv` of whole messages |
//! | [`Header`] | the 40 bytes in front of every message, checked by the receiver |
//! | [`Progress`] | where one message stands between non-blocking calls |
//! | [`PeerInfo`] | the rank and address of the other end, for error messages |
//! | [`Doorbell`] | a word peers bump when they change what a rank may wait for (shared memory) |
//! | [`Transport`] | the setup half: can it join two ranks, connect handles, [`Properties`] |
//! | [`MemRef`], [`Payload`], [`Region`] | typed memory: space, address, length; registration |
//! | [`hash64`] | the project's one 64-bit hash |
//!
//! A transport never knows which collective it serves: the executor gives it a header and a
//! payload and asks it to move them, one message after another, in order. No call blocks; an
//! executor with nothing to do waits on the descriptors from [`Connection::poll_fds`], or, for
//! transports without descriptors (shared memory), on the [`Doorbell`] from
//! [`Connection::doorbell`]. How connections come to be is the [`setup`] module's story.

mod error;
mod hash;
pub mod lane;
pub mod log;
pub mod memory;
pub mod setup;

pub use error::{Error, ErrorKind, Result};
pub use hash::{fnv1a64, hash64};
pub use lane::{LaneTake, SmallLane};
pub use memory::{MemRef, MemSpace, Payload, PayloadMut, RegCache, Region, Spaces};
pub use setup::{Decline, Link, Properties, RankDesc, SetupCtx, Transport, WaitKind};

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Bytes of an encoded [`Header`].
pub const HEADER_LEN: usize = 40;

const HEADER_MAGIC: u32 = 0x4c43_5246; // "FRCL"

/// What every message carries in front of its payload, so that the receiver can check that the
/// sender runs the same operation (kind, dtype, op, root, count) at the same sequence number.
/// The fields' meaning belongs to the caller; transports only move them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Header {
    /// Operation kind.
    pub kind: u8,
    /// Data type.
    pub dtype: u8,
    /// Reduction op.
    pub op: u8,
    /// Sequence number of the operation.
    pub seq: u64,
    /// Element count of the operation.
    pub count: u64,
    /// Root rank, or `u32::MAX`.
    pub root: u32,
    /// Payload bytes that follow.
    pub len: u64,
}

impl Header {
    /// Fails unless this header announces a payload of `len` bytes, the payload `send` was
    /// given for `peer` (the contract's first check in every transport's `send`).
    pub fn check_send_len(&self, peer: &PeerInfo, len: usize) -> Result<()> {
        if self.len == len as u64 {
            return Ok(());
        }
        Err(Error::internal(format!(
            "send to {peer}: header says {} bytes, payload has {len}",
            self.len
        )))
    }

    /// Fails unless this header, received from `peer`, announces `len` bytes, the length of
    /// the buffer `recv` was given.
    pub fn check_recv_len(&self, peer: &PeerInfo, len: usize) -> Result<()> {
        if self.len == len as u64 {
            return Ok(());
        }
        Err(Error::internal(format!(
            "recv from {peer}: header says {} bytes, buffer has {len}",
            self.len
        )))
    }

    /// The 40-byte wire form (little endian).
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
        b[4] = self.kind;
        b[5] = self.dtype;
        b[6] = self.op;
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.count.to_le_bytes());
        b[24..28].copy_from_slice(&self.root.to_le_bytes());
        b[32..40].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes the wire form; `None` if the magic is wrong (the stream is out of step).
    pub fn decode(b: &[u8; HEADER_LEN]) -> Option<Header> {
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let mut m = [0u8; 4];
        m.copy_from_slice(&b[0..4]);
        if u32::from_le_bytes(m) != HEADER_MAGIC {
            return None;
        }
        let mut r = [0u8; 4];
        r.copy_from_slice(&b[24..28]);
        Some(Header {
            kind: b[4],
            dtype: b[5],
            op: b[6],
            seq: u64_at(8),
            count: u64_at(16),
            root: u32::from_le_bytes(r),
            len: u64_at(32),
        })
    }
}

/// The other end of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// The peer's rank in the communicator.
    pub rank: usize,
    /// The peer's address, as text (for error messages).
    pub addr: String,
}

impl fmt::Display for PeerInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {} ({})", self.rank, self.addr)
    }
}

/// Most parts a transport may split one message into.
pub const MAX_PARTS: usize = 8;

/// One contiguous part of a message's payload, moved independently of the others.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Part {
    /// First payload byte of the part.
    pub start: usize,
    /// Bytes of the part already moved: `start..pos` is done.
    pub pos: usize,
    /// One past the part's last byte.
    pub end: usize,
}

/// Where one message stands between non-blocking calls. A fresh `Progress::default()` starts
/// the next message on the connection.
///
/// Payload bytes `part.start..part.pos` of every part have been moved; a receiver may use them
/// (reduce them, say) before the whole message is in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// Header bytes moved so far.
    pub header_pos: usize,
    /// Payload parts; set by the transport when the message starts.
    pub parts: [Part; MAX_PARTS],
    /// Number of valid entries in `parts`.
    pub nparts: usize,
    /// Whether the transport has laid out the parts.
    pub started: bool,
}

impl Progress {
    /// Whether the header has been moved.
    pub fn header_done(&self) -> bool {
        self.header_pos == HEADER_LEN
    }

    /// Whether header and payload have been moved.
    pub fn done(&self) -> bool {
        self.header_done()
            && self.started
            && self.parts[..self.nparts].iter().all(|p| p.pos == p.end)
    }

    /// Payload bytes moved so far.
    pub fn moved(&self) -> usize {
        self.parts[..self.nparts]
            .iter()
            .map(|p| p.pos - p.start)
            .sum()
    }

    /// The laid-out parts.
    pub fn parts(&self) -> &[Part] {
        &self.parts[..self.nparts]
    }
}

/// Readiness a waiting executor asks for on a descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollFd {
    /// The descriptor.
    pub fd: i32,
    /// Wake when readable.
    pub read: bool,
    /// Wake when writable.
    pub write: bool,
}

/// A word that other ranks' transports bump whenever they change something this rank may be
/// waiting for (bytes arrived, space freed, a peer closed), so that an idle executor can sleep
/// instead of polling memory.
///
/// The protocol is the one of a futex: read [`Doorbell::seq`] *before* checking the connections
/// for progress; if nothing moved, call [`Doorbell::wait`] with that value. A change made after
/// the read bumps the value, and `wait` then returns at once instead of sleeping.
pub trait Doorbell: Send + Sync + fmt::Debug {
    /// The current value (an Acquire load).
    fn seq(&self) -> u32;

    /// Sleeps until the value differs from `seen`, someone wakes this doorbell, or `timeout`
    /// passes. May return early for no reason; callers re-check and wait again.
    fn wait(&self, seen: u32, timeout: Duration);

    /// An address that two doorbells share exactly when they are one doorbell (the word they
    /// wait on), however many handles point at it.
    fn identity(&self) -> usize;
}

/// Work on memory a transport lent ([`Connection::recv_lent_device`]) that may still be running
/// when the sink returns: a device reduction queued on a stream and not waited for.
pub trait Fence: Send + fmt::Debug {
    /// Whether the work is done (never blocks).
    fn done(&mut self) -> Result<bool>;
    /// Blocks until the work is done.
    fn wait(&mut self) -> Result<()>;
}

/// The sink of [`Connection::recv_lent_device`]: `(offset, piece)` in, `None` where the piece
/// was read before it returned, else the [`Fence`] of the work still reading it.
pub type LentSink<'a> = dyn FnMut(usize, Payload<'_>) -> Result<Option<Box<dyn Fence>>> + 'a;

/// A connection to one peer. Messages in each direction are delivered whole and in order.
///
/// No method blocks. `send` and `recv` move what they can now and report whether the message is
/// complete; call them again with the same [`Progress`] until it is.
pub trait Connection: Send + fmt::Debug {
    /// The other end.
    fn peer(&self) -> &PeerInfo;

    /// Moves the next outgoing message: `header` (whose `len` must equal `payload.len()`)
    /// then `payload`. Returns `Ok(true)` once all of it is handed to the transport.
    /// The same `header` and `payload` must be passed on every call for one message.
    fn send(
        &mut self,
        header: &Header,
        payload: Payload<'_>,
        progress: &mut Progress,
    ) -> Result<bool>;

    /// Moves the next incoming message. The header arrives first: once
    /// `progress.header_done()`, `header` holds it and the caller must check it (its `len`
    /// against `payload.len()` in particular) before calling again; bytes then land in `payload`,
    /// which must be exactly `header.len` bytes. Returns `Ok(true)` once the message is in.
    fn recv(
        &mut self,
        header: &mut Header,
        payload: PayloadMut<'_>,
        progress: &mut Progress,
    ) -> Result<bool>;

    /// Whether [`Connection::recv_lent`] works on this connection: the transport holds
    /// received bytes in memory it can lend to the caller (a shared-memory ring). `false` (the
    /// default): use [`Connection::recv`].
    fn lends(&self) -> bool {
        false
    }

    /// Moves the next incoming message as [`Connection::recv`] does, but hands the payload to
    /// `sink` where the transport holds it instead of copying it into a buffer: `sink(off,
    /// bytes)` gets payload bytes `off..off + bytes.len()`, in order, each byte once, and the
    /// transport reuses that memory once `sink` returns. Every piece but the message's last is
    /// a whole number of `granule` bytes (an element never straddles two pieces), so a caller
    /// can reduce straight from the transport's memory. The header comes first, as with `recv`,
    /// and must be checked (`len` the message's length) before calling again. An error from
    /// `sink` ends the call with that error. Only for connections that [`lend`](Self::lends).
    fn recv_lent(
        &mut self,
        header: &mut Header,
        len: usize,
        granule: usize,
        progress: &mut Progress,
        sink: &mut dyn FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<bool> {
        let _ = (header, len, granule, progress, sink);
        Err(Error::internal(format!(
            "the connection to {} does not lend received bytes (use recv)",
            self.peer()
        )))
    }

    /// Whether [`Connection::recv_lent_device`] works on this connection: the transport
    /// receives into memory of a device (or host memory standing in for it) that it can lend
    /// to a device reducer. `false` (the default): receive into a buffer.
    fn lends_device(&self) -> bool {
        false
    }

    /// [`Connection::recv_lent`] for device reductions: `sink(off, piece)` gets payload bytes
    /// `off..off + piece.len()` where the transport holds them (its device memory, as a
    /// `Payload::Device`; host memory as a `Payload::Host`), in order, each byte once. Where
    /// `sink` returns `None` it has finished reading the piece and the transport may reuse
    /// that memory at once; where it returns a [`Fence`] (a device reduction queued on a
    /// stream, not waited for), the transport reuses the memory, and counts the piece as
    /// received, only once the fence is done, and waits for it before the memory goes. Every
    /// piece but the last is a whole number of 16 bytes. Only for connections that
    /// [`lend device memory`](Self::lends_device).
    fn recv_lent_device(
        &mut self,
        header: &mut Header,
        len: usize,
        progress: &mut Progress,
        sink: &mut LentSink<'_>,
    ) -> Result<bool> {
        let _ = (header, len, progress, sink);
        Err(Error::internal(format!(
            "the connection to {} does not lend received device memory (use recv)",
            self.peer()
        )))
    }

    /// Announces where the next incoming message will land, before its header arrives: a
    /// one-sided transport tells the sender (RDMA's clear-to-send) so that the payload is
    /// written straight there. `region` is `dst`'s registration where the transport needs one.
    /// Pull-style transports (TCP, shared memory) ignore it (the default).
    fn post_recv(&mut self, dst: MemRef, region: Option<&Region>) -> Result<()> {
        let _ = (dst, region);
        Ok(())
    }

    /// Registers `mem` for direct transfers, for transports whose [`Properties::registration`]
    /// is set; `None` (the default) where no registration is needed. The caller caches the
    /// region ([`RegCache`]) and keeps it as long as it uses the buffer.
    fn register(&mut self, mem: MemRef) -> Result<Option<Region>> {
        let _ = mem;
        Ok(None)
    }

    /// Details for the connection log line (`+cma`, a delay); empty by default.
    fn describe(&self) -> String {
        String::new()
    }

    /// Descriptors to poll while waiting for the send (`sending`) or receive (`receiving`) side.
    fn poll_fds(&self, sending: bool, receiving: bool, out: &mut Vec<PollFd>);

    /// The doorbell that the peer rings when it changes this connection's state, for transports
    /// that have no descriptors to poll (shared memory). All connections of one rank that have a
    /// doorbell share the same one. `None` (the default): wait on [`Connection::poll_fds`].
    fn doorbell(&self) -> Option<Arc<dyn Doorbell>> {
        None
    }

    /// Whether work this connection started will finish without ringing a doorbell or making a
    /// descriptor ready (a copy queued on a GPU stream, which only polling sees done): a waiting
    /// executor then keeps polling instead of sleeping until woken. `false` by default.
    fn in_flight(&self) -> bool {
        false
    }

    /// The connection's lane for tiny messages, where it has one (see [`lane`]). `None` (the
    /// default): every message travels through `send` and `recv`.
    fn small_lane(&mut self) -> Option<&mut dyn SmallLane> {
        None
    }

    /// Closes the connection so that the peer sees it closed at once. Idempotent.
    fn shutdown(&mut self);
}

impl<C: Connection + ?Sized> Connection for Box<C> {
    fn peer(&self) -> &PeerInfo {
        (**self).peer()
    }
    fn send(&mut self, h: &Header, payload: Payload<'_>, p: &mut Progress) -> Result<bool> {
        (**self).send(h, payload, p)
    }
    fn recv(&mut self, h: &mut Header, payload: PayloadMut<'_>, p: &mut Progress) -> Result<bool> {
        (**self).recv(h, payload, p)
    }
    fn lends(&self) -> bool {
        (**self).lends()
    }
    fn recv_lent(
        &mut self,
        h: &mut Header,
        len: usize,
        granule: usize,
        p: &mut Progress,
        sink: &mut dyn FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<bool> {
        (**self).recv_lent(h, len, granule, p, sink)
    }
    fn lends_device(&self) -> bool {
        (**self).lends_device()
    }
    fn recv_lent_device(
        &mut self,
        h: &mut Header,
        len: usize,
        p: &mut Progress,
        sink: &mut LentSink<'_>,
    ) -> Result<bool> {
        (**self).recv_lent_device(h, len, p, sink)
    }
    fn post_recv(&mut self, dst: MemRef, region: Option<&Region>) -> Result<()> {
        (**self).post_recv(dst, region)
    }
    fn register(&mut self, mem: MemRef) -> Result<Option<Region>> {
        (**self).register(mem)
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn poll_fds(&self, sending: bool, receiving: bool, out: &mut Vec<PollFd>) {
        (**self).poll_fds(sending, receiving, out)
    }
    fn doorbell(&self) -> Option<Arc<dyn Doorbell>> {
        (**self).doorbell()
    }
    fn in_flight(&self) -> bool {
        (**self).in_flight()
    }
    fn small_lane(&mut self) -> Option<&mut dyn SmallLane> {
        (**self).small_lane()
    }
    fn shutdown(&mut self) {
        (**self).shutdown()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = Header {
            kind: 3,
            dtype: 7,
            op: 2,
            seq: 0x0102_0304_0506_0708,
            count: 1_000_003,
            root: 5,
            len: 4_000_012,
        };
        assert_eq!(Header::decode(&h.encode()), Some(h));
        let mut bad = h.encode();
        bad[0] ^= 1;
        assert_eq!(Header::decode(&bad), None);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// Any 40 bytes decode without panicking; what decodes encodes back to the same bytes
        /// (the padding bytes aside), and the magic is the only thing that makes bytes a header.
        #[test]
        fn header_decoder_takes_any_bytes(bytes in proptest::array::uniform32(0u8..), tail in proptest::array::uniform8(0u8..)) {
            let mut b = [0u8; HEADER_LEN];
            b[..32].copy_from_slice(&bytes);
            b[32..].copy_from_slice(&tail);
            match Header::decode(&b) {
                None => proptest::prop_assert_ne!(&b[0..4], &HEADER_MAGIC.to_le_bytes()[..]),
                Some(h) => {
                    let again = h.encode();
                    let mut want = b;
                    want[7] = 0;
                    want[28..32].copy_from_slice(&[0; 4]);
                    proptest::prop_assert_eq!(again, want);
                    proptest::prop_assert_eq!(Header::decode(&again), Some(h));
                }
            }
        }

        /// Every header survives its wire form.
        #[test]
        fn header_round_trips(kind: u8, dtype: u8, op: u8, seq: u64, count: u64, root: u32, len: u64) {
            let h = Header { kind, dtype, op, seq, count, root, len };
            proptest::prop_assert_eq!(Header::decode(&h.encode()), Some(h));
        }
    }

    #[test]
    fn progress_counts_parts() {
        let mut p = Progress::default();
        assert!(!p.done());
        p.header_pos = HEADER_LEN;
        p.started = true;
        p.nparts = 2;
        p.parts[0] = Part {
            start: 0,
            pos: 10,
            end: 10,
        };
        p.parts[1] = Part {
            start: 10,
            pos: 15,
            end: 20,
        };
        assert_eq!(p.moved(), 15);
        assert!(!p.done());
        p.parts[1].pos = 20;
        assert!(p.done());
    }
}
