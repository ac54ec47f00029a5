//! The protocol's arithmetic, without I/O: what immediates and work-request ids carry, the
//! wire form of a header slot and a clear-to-send entry, how a payload is striped across the
//! queue pairs, and the flow-control windows. After NCCL's net_ib: the receiver advertises each
//! destination in a FIFO it writes into the sender; the sender writes the payload and ends
//! each piece with an immediate.

use ferroccl_transport::{Header, Part, HEADER_LEN, MAX_PARTS};

/// Slots of the header ring and of the clear-to-send FIFO: messages in flight per direction.
pub(crate) const DEPTH: usize = 64;
/// Bytes of a header slot in front of its inline payload.
pub(crate) const SLOT_HEAD: usize = 64;
/// Bytes of a clear-to-send entry.
pub(crate) const CTS_LEN: usize = 32;
/// Low bits of an immediate that carry a message number (the top two carry the kind).
const IDX_BITS: u32 = 30;
const IDX_MASK: u32 = (1 << IDX_BITS) - 1;

/// What an immediate announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Imm {
    /// The receiver freed header slots: the count (mod 2^30).
    Credit(u32),
    /// Header slot of message n (mod 2^30) written.
    Header(u32),
    /// Clear-to-send of message n written.
    Cts(u32),
    /// A piece of message n's payload landed.
    Data(u32),
}

impl Imm {
    pub(crate) fn encode(self) -> u32 {
        let (k, v) = match self {
            Imm::Credit(v) => (0, v),
            Imm::Header(v) => (1, v),
            Imm::Cts(v) => (2, v),
            Imm::Data(v) => (3, v),
        };
        (k << IDX_BITS) | (v & IDX_MASK)
    }

    pub(crate) fn decode(w: u32) -> Imm {
        let v = w & IDX_MASK;
        match w >> IDX_BITS {
            0 => Imm::Credit(v),
            1 => Imm::Header(v),
            2 => Imm::Cts(v),
            _ => Imm::Data(v),
        }
    }
}

/// A message number as an immediate carries it.
pub(crate) fn short(n: u64) -> u32 {
    (n as u32) & IDX_MASK
}

/// The full count that `short` stands for, given that it is at least `known`.
pub(crate) fn widen(known: u64, short: u32) -> u64 {
    known + u64::from(short.wrapping_sub(self::short(known)) & IDX_MASK)
}

/// Kinds of this side's own writes, in their work-request ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WrKind {
    Header = 1,
    Cts = 2,
    Credit = 3,
    Data = 4,
    Probe = 5,
}

/// A work-request id: kind, queue pair, staging slot or message number.
pub(crate) fn wr_id(kind: WrKind, qp: usize, n: u64) -> u64 {
    ((kind as u64) << 56) | ((qp as u64 & 0xff) << 48) | (n & 0xffff_ffff_ffff)
}

/// The kind, queue pair and number of a work-request id.
pub(crate) fn wr_parts(id: u64) -> (Option<WrKind>, usize, u64) {
    let kind = match id >> 56 {
        1 => Some(WrKind::Header),
        2 => Some(WrKind::Cts),
        3 => Some(WrKind::Credit),
        4 => Some(WrKind::Data),
        5 => Some(WrKind::Probe),
        _ => None,
    };
    (kind, ((id >> 48) & 0xff) as usize, id & 0xffff_ffff_ffff)
}

/// Flags of a header slot.
pub(crate) const FLAG_INLINE: u64 = 1;
/// The sender closed the connection; the slot carries no message.
pub(crate) const FLAG_CLOSE: u64 = 2;

/// A header slot: the header, flags, the message number; the inline payload follows.
pub(crate) fn encode_slot_head(h: &Header, flags: u64, n: u64) -> [u8; SLOT_HEAD] {
    let mut b = [0u8; SLOT_HEAD];
    b[..HEADER_LEN].copy_from_slice(&h.encode());
    b[40..48].copy_from_slice(&flags.to_le_bytes());
    b[48..56].copy_from_slice(&n.to_le_bytes());
    b
}

/// The header (if its magic is right), flags and message number of a slot.
pub(crate) fn decode_slot_head(b: &[u8; SLOT_HEAD]) -> (Option<Header>, u64, u64) {
    let mut h = [0u8; HEADER_LEN];
    h.copy_from_slice(&b[..HEADER_LEN]);
    let u = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[i..i + 8]);
        u64::from_le_bytes(w)
    };
    (Header::decode(&h), u(40), u(48))
}

/// A clear-to-send entry: where message `n` lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cts {
    pub addr: u64,
    pub rkey: u32,
    pub len: u64,
    /// The message number plus one (0: an empty slot).
    pub stamp: u64,
}

impl Cts {
    pub(crate) fn encode(&self) -> [u8; CTS_LEN] {
        let mut b = [0u8; CTS_LEN];
        b[..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b[24..32].copy_from_slice(&self.stamp.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8; CTS_LEN]) -> Cts {
        let u = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        Cts {
            addr: u(0),
            rkey: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            len: u(16),
            stamp: u(24),
        }
    }
}

/// Stripe boundaries fall on multiples of this many bytes, so that every landed prefix holds
/// whole elements of any data type (the receiver reduces prefixes as they land).
pub(crate) const STRIPE_ALIGN: usize = 4096;

/// Lays a `len`-byte payload out as one contiguous stripe per queue pair (`nqps` at most
/// [`MAX_PARTS`]), each starting at a multiple of [`STRIPE_ALIGN`]; stripe `q` travels on
/// queue pair `q`, in order, so its prefix is what has landed. Short payloads leave the last
/// stripes empty.
pub(crate) fn stripes(len: usize, nqps: usize, parts: &mut [Part; MAX_PARTS]) -> usize {
    let n = nqps.clamp(1, MAX_PARTS);
    let blocks = len.div_ceil(STRIPE_ALIGN);
    for (q, part) in parts.iter_mut().enumerate().take(n) {
        let at = |q: usize| (blocks / n * q + (blocks % n).min(q)) * STRIPE_ALIGN;
        let (start, end) = (at(q).min(len), at(q + 1).min(len));
        *part = Part {
            start,
            pos: start,
            end,
        };
    }
    n
}

/// Whether the receiver may write the clear-to-send of message `j`, having seen `headers`
/// header slots arrive: seeing message m's header means the sender is done with messages
/// before m, so their FIFO slots are free again.
pub(crate) fn cts_allowed(j: u64, headers: u64) -> bool {
    j < headers.saturating_sub(1) + DEPTH as u64
}

/// Whether the sender may write the header slot of message `n`, the receiver having freed
/// `credit` slots.
pub(crate) fn header_allowed(n: u64, credit: u64) -> bool {
    n < credit + DEPTH as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn immediates_round_trip_and_wrap() {
        for imm in [
            Imm::Credit(0),
            Imm::Header(5),
            Imm::Cts(IDX_MASK),
            Imm::Data(77),
        ] {
            assert_eq!(Imm::decode(imm.encode()), imm);
        }
        assert_eq!(short(1 << 30), 0);
        assert_eq!(widen(5, 9), 9);
        assert_eq!(widen((1 << 30) - 2, 3), (1 << 30) + 3, "wraps forward");
        let id = wr_id(WrKind::Data, 3, 123_456);
        assert_eq!(wr_parts(id), (Some(WrKind::Data), 3, 123_456));
    }

    #[test]
    fn slots_round_trip() {
        let h = Header {
            kind: 2,
            seq: 9,
            len: 17,
            ..Header::default()
        };
        let b = encode_slot_head(&h, FLAG_INLINE, 41);
        assert_eq!(decode_slot_head(&b), (Some(h), FLAG_INLINE, 41));
        let c = Cts {
            addr: 0xdead_beef_0000,
            rkey: 0x1234,
            len: 1 << 33,
            stamp: 8,
        };
        assert_eq!(Cts::decode(&c.encode()), c);
    }

    #[test]
    fn stripes_cover_the_payload_once() {
        let mut parts = [Part::default(); MAX_PARTS];
        for len in [0usize, 1, 2, 3, 7, 4096, 4097, 12_288, 1_000_003] {
            for nqps in 1..=MAX_PARTS {
                let n = stripes(len, nqps, &mut parts);
                assert_eq!(n, nqps);
                let mut at = 0;
                for p in &parts[..n] {
                    assert_eq!(p.start, at, "len {len} nqps {nqps}");
                    assert!(p.start % STRIPE_ALIGN == 0 || p.start == len);
                    assert!(p.end >= p.start && p.pos == p.start);
                    at = p.end;
                }
                assert_eq!(at, len);
            }
        }
    }

    #[test]
    fn windows() {
        assert!(cts_allowed(DEPTH as u64 - 1, 0));
        assert!(!cts_allowed(DEPTH as u64, 0));
        assert!(!cts_allowed(DEPTH as u64, 1), "header 0 frees nothing yet");
        assert!(cts_allowed(DEPTH as u64, 2), "header 1 frees slot 0");
        assert!(header_allowed(63, 0) && !header_allowed(64, 0) && header_allowed(64, 1));
    }
}
