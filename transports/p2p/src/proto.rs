//! The protocol of one direction, without I/O: which slot a message's bytes go through, what a
//! flag line says, when a slot may be written, copied out and handed back.
//!
//! The receiver owns `nslots` slots of `slot_bytes` in its (device) memory and a flag line per
//! slot in its control segment. Steps count slots ever used on the connection; step `s` uses
//! slot `s % nslots`. A message of `len` bytes takes `max(1, ceil(len / slot_bytes))` steps,
//! chunk `i` holding bytes `i × slot_bytes ..`; its first line also carries the 40-byte header.
//!
//! Sender, per step: waits for credit (`step - tail < nslots`), starts the copy of its chunk
//! straight into the peer's slot, and once the copy is done writes the line (header, bytes)
//! and then the line's flag `step + 1` (Release). Receiver: sees the flag (Acquire), reads the
//! line, copies the slot out into the destination, and once that copy is done stores
//! `tail = step + 1` (Release): the sender may reuse the slot. Copies may be asynchronous
//! (a GPU's copy engine); both sides finish steps in order.
//!
//! [`Flags`] and [`Mover`] are the two things the protocol touches, so the unit tests drive it
//! over plain memory with copies that finish late.

#![forbid(unsafe_code)]

use ferroccl_transport::{Error, Header, Part, Progress, Result, HEADER_LEN};

/// Words of one flag line: the flag, five of header, one of size and first-of-message.
pub(crate) const LINE_WORDS: usize = 8;

/// The ring's shape, the same on both ends (checked at setup).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Slots in the ring.
    pub nslots: usize,
    /// Bytes of one slot.
    pub slot_bytes: usize,
}

impl Layout {
    /// Steps a message of `len` bytes takes (at least one, which carries the header).
    pub fn steps_for(&self, len: usize) -> u64 {
        len.div_ceil(self.slot_bytes).max(1) as u64
    }

    /// Bytes `(offset, n)` of chunk `i` of a `len`-byte message.
    pub fn chunk(&self, len: usize, i: u64) -> (usize, usize) {
        let off = (i as usize).saturating_mul(self.slot_bytes).min(len);
        (off, (len - off).min(self.slot_bytes))
    }

    /// The slot of step `step`.
    pub fn slot(&self, step: u64) -> usize {
        (step % self.nslots as u64) as usize
    }
}

/// What a flag line says besides its flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Line {
    /// The message's header (meaningful on its first line).
    pub header: [u8; HEADER_LEN],
    /// Bytes in the slot.
    pub nbytes: u32,
    /// Whether the slot is a message's first.
    pub first: bool,
}

impl Line {
    /// Words 1.. of the line.
    pub fn encode(&self) -> [u64; LINE_WORDS - 1] {
        let mut w = [0u64; LINE_WORDS - 1];
        for (i, c) in self.header.chunks(8).enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            w[i] = u64::from_le_bytes(b);
        }
        w[5] = u64::from(self.nbytes) | (u64::from(self.first) << 32);
        w
    }

    /// The line from words 1...
    pub fn decode(w: &[u64; LINE_WORDS - 1]) -> Line {
        let mut header = [0u8; HEADER_LEN];
        for (i, c) in header.chunks_mut(8).enumerate() {
            c.copy_from_slice(&w[i].to_le_bytes());
        }
        Line {
            header,
            nbytes: w[5] as u32,
            first: (w[5] >> 32) & 1 == 1,
        }
    }
}

/// The flag words of one direction's ring (in the receiver's control segment).
pub(crate) trait Flags {
    /// Slot `slot`'s flag (Acquire).
    fn flag(&self, slot: usize) -> u64;
    /// Slot `slot`'s line (after its flag was seen).
    fn line(&self, slot: usize) -> [u64; LINE_WORDS - 1];
    /// Writes slot `slot`'s line, then its flag (Release).
    fn publish(&self, slot: usize, line: [u64; LINE_WORDS - 1], flag: u64);
    /// Slots the receiver has emptied, ever (Acquire).
    fn tail(&self) -> u64;
    /// Hands slots back (Release).
    fn set_tail(&self, tail: u64);
}

/// Copies between a message buffer and the slots: into the peer's slots on the sending side,
/// out of this rank's slots on the receiving side. One copy per slot at a time.
pub(crate) trait Mover {
    /// Starts copying message bytes `off..off + n` into (or out of) slot `slot`.
    fn start(&mut self, slot: usize, off: usize, n: usize) -> Result<()>;
    /// Whether the copy last started on `slot` is done.
    fn done(&mut self, slot: usize) -> Result<bool>;
}

fn start_parts(p: &mut Progress, len: usize) {
    p.header_pos = HEADER_LEN;
    p.started = true;
    p.nparts = 1;
    p.parts[0] = Part {
        start: 0,
        pos: 0,
        end: len,
    };
}

/// The sending side of one direction.
#[derive(Debug, Default)]
pub(crate) struct SendSide {
    /// Next step to start.
    next: u64,
    /// Steps whose flags are out.
    published: u64,
    /// The current message's first step and step count.
    first: u64,
    steps: u64,
}

impl SendSide {
    /// Moves what it can of the message (`header`, `len` bytes) on; returns whether anything
    /// moved. The message is out when [`SendSide::complete`].
    pub fn progress(
        &mut self,
        l: &Layout,
        flags: &dyn Flags,
        mover: &mut dyn Mover,
        header: &Header,
        p: &mut Progress,
    ) -> Result<bool> {
        let len = header.len as usize;
        if !p.started {
            self.first = self.next;
            self.steps = l.steps_for(len);
            start_parts(p, len);
        }
        let mut moved = self.publish(l, flags, mover, header, p)?;
        let end = self.first + self.steps;
        while self.next < end && self.next - flags.tail() < l.nslots as u64 {
            let (off, n) = l.chunk(len, self.next - self.first);
            mover.start(l.slot(self.next), off, n)?;
            self.next += 1;
            moved = true;
        }
        moved |= self.publish(l, flags, mover, header, p)?;
        Ok(moved)
    }

    fn publish(
        &mut self,
        l: &Layout,
        flags: &dyn Flags,
        mover: &mut dyn Mover,
        header: &Header,
        p: &mut Progress,
    ) -> Result<bool> {
        let mut moved = false;
        while self.published < self.next && mover.done(l.slot(self.published))? {
            let i = self.published - self.first;
            let (_, n) = l.chunk(header.len as usize, i);
            let line = Line {
                header: if i == 0 {
                    header.encode()
                } else {
                    [0; HEADER_LEN]
                },
                nbytes: n as u32,
                first: i == 0,
            };
            flags.publish(l.slot(self.published), line.encode(), self.published + 1);
            self.published += 1;
            p.parts[0].pos += n;
            moved = true;
        }
        Ok(moved)
    }

    /// Whether every step of the current message is published.
    pub fn complete(&self) -> bool {
        self.published == self.first + self.steps
    }
}

/// The receiving side of one direction.
#[derive(Debug, Default)]
pub(crate) struct RecvSide {
    /// Next step to start copying out.
    next: u64,
    /// Steps copied out and handed back (the tail this side published).
    consumed: u64,
    first: u64,
    steps: u64,
}

impl RecvSide {
    /// The next message's header, once its first flag is out; `Ok(None)` before. A line that
    /// is not a message's first, or a header that does not decode, means the ring is out of
    /// step.
    pub fn header(&mut self, l: &Layout, flags: &dyn Flags) -> Result<Option<Header>> {
        let slot = l.slot(self.next);
        if flags.flag(slot) != self.next + 1 {
            return Ok(None);
        }
        let line = Line::decode(&flags.line(slot));
        let h = Header::decode(&line.header)
            .filter(|_| line.first)
            .ok_or_else(|| Error::internal("garbled flag line (the ring is out of step)"))?;
        self.first = self.next;
        self.steps = l.steps_for(h.len as usize);
        Ok(Some(h))
    }

    /// Whether the next message's first flag is out: a message waits in the ring.
    pub fn waiting(&self, l: &Layout, flags: &dyn Flags) -> bool {
        flags.flag(l.slot(self.next)) == self.next + 1
    }

    /// Starts the payload of the message whose header [`RecvSide::header`] returned.
    pub fn start(&mut self, p: &mut Progress, len: usize) {
        start_parts(p, len);
    }

    /// Moves what it can of the payload (`len` bytes) on; returns whether anything moved.
    pub fn progress(
        &mut self,
        l: &Layout,
        flags: &dyn Flags,
        mover: &mut dyn Mover,
        len: usize,
        p: &mut Progress,
    ) -> Result<bool> {
        let mut moved = self.hand_back(l, flags, mover, len, p)?;
        let end = self.first + self.steps;
        while self.next < end
            && self.next - self.consumed < l.nslots as u64
            && flags.flag(l.slot(self.next)) == self.next + 1
        {
            let i = self.next - self.first;
            let (off, n) = l.chunk(len, i);
            let line = Line::decode(&flags.line(l.slot(self.next)));
            if line.nbytes as usize != n || line.first != (i == 0) {
                return Err(Error::internal(format!(
                    "flag line of step {} says {} bytes (first: {}), expected {n} (first: {}): \
                     the ring is out of step",
                    self.next,
                    line.nbytes,
                    line.first,
                    i == 0
                )));
            }
            mover.start(l.slot(self.next), off, n)?;
            self.next += 1;
            moved = true;
        }
        moved |= self.hand_back(l, flags, mover, len, p)?;
        Ok(moved)
    }

    fn hand_back(
        &mut self,
        l: &Layout,
        flags: &dyn Flags,
        mover: &mut dyn Mover,
        len: usize,
        p: &mut Progress,
    ) -> Result<bool> {
        let mut moved = false;
        while self.consumed < self.next && mover.done(l.slot(self.consumed))? {
            let (_, n) = l.chunk(len, self.consumed - self.first);
            self.consumed += 1;
            flags.set_tail(self.consumed);
            p.parts[0].pos += n;
            moved = true;
        }
        Ok(moved)
    }

    /// Whether every step of the current message is copied out and handed back.
    pub fn complete(&self) -> bool {
        self.consumed == self.first + self.steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};

    /// Flags in plain cells.
    struct Mem {
        lines: RefCell<Vec<[u64; LINE_WORDS]>>,
        tail: Cell<u64>,
    }

    impl Flags for Mem {
        fn flag(&self, slot: usize) -> u64 {
            self.lines.borrow()[slot][0]
        }
        fn line(&self, slot: usize) -> [u64; LINE_WORDS - 1] {
            let mut w = [0; LINE_WORDS - 1];
            w.copy_from_slice(&self.lines.borrow()[slot][1..]);
            w
        }
        fn publish(&self, slot: usize, line: [u64; LINE_WORDS - 1], flag: u64) {
            let mut l = self.lines.borrow_mut();
            l[slot][1..].copy_from_slice(&line);
            l[slot][0] = flag;
        }
        fn tail(&self) -> u64 {
            self.tail.get()
        }
        fn set_tail(&self, t: u64) {
            self.tail.set(t)
        }
    }

    /// Copies that finish only after `delay` more `done` polls.
    struct Copier<'a> {
        slots: &'a RefCell<Vec<Vec<u8>>>,
        msg: RefCell<Vec<u8>>,
        into_slots: bool,
        pending: Vec<Option<(usize, usize, u32)>>,
        delay: u32,
    }

    impl Mover for Copier<'_> {
        fn start(&mut self, slot: usize, off: usize, n: usize) -> Result<()> {
            assert!(self.pending[slot].is_none(), "slot {slot} reused mid-copy");
            self.pending[slot] = Some((off, n, self.delay));
            Ok(())
        }
        fn done(&mut self, slot: usize) -> Result<bool> {
            let Some((off, n, wait)) = self.pending[slot] else {
                return Ok(true);
            };
            if wait > 0 {
                self.pending[slot] = Some((off, n, wait - 1));
                return Ok(false);
            }
            let mut s = self.slots.borrow_mut();
            if self.into_slots {
                s[slot][..n].copy_from_slice(&self.msg.borrow()[off..off + n]);
            } else {
                self.msg.borrow_mut()[off..off + n].copy_from_slice(&s[slot][..n]);
            }
            self.pending[slot] = None;
            Ok(true)
        }
    }

    fn run(l: Layout, sizes: &[usize], delay: u32) {
        let flags = Mem {
            lines: RefCell::new(vec![[0; LINE_WORDS]; l.nslots]),
            tail: Cell::new(0),
        };
        let slots = RefCell::new(vec![vec![0u8; l.slot_bytes]; l.nslots]);
        let (mut tx, mut rx) = (SendSide::default(), RecvSide::default());
        for (k, &len) in sizes.iter().enumerate() {
            let msg: Vec<u8> = (0..len).map(|i| (i * 7 + k) as u8).collect();
            let h = Header {
                seq: k as u64,
                len: len as u64,
                ..Header::default()
            };
            let mut sm = Copier {
                slots: &slots,
                msg: RefCell::new(msg.clone()),
                into_slots: true,
                pending: vec![None; l.nslots],
                delay,
            };
            let mut rm = Copier {
                slots: &slots,
                msg: RefCell::new(vec![0; len]),
                into_slots: false,
                pending: vec![None; l.nslots],
                delay,
            };
            let (mut sp, mut rp) = (Progress::default(), Progress::default());
            let mut got = None;
            for _ in 0..100_000 {
                if !tx.complete() || !sp.started {
                    tx.progress(&l, &flags, &mut sm, &h, &mut sp).unwrap();
                }
                if got.is_none() {
                    got = rx.header(&l, &flags).unwrap();
                    if let Some(g) = got {
                        assert_eq!(g, h);
                        rx.start(&mut rp, len);
                    }
                } else if !rx.complete() {
                    rx.progress(&l, &flags, &mut rm, len, &mut rp).unwrap();
                    // The prefix the receiver reports is already in place.
                    let pos = rp.parts[0].pos;
                    assert_eq!(rm.msg.borrow()[..pos], msg[..pos]);
                }
                if tx.complete() && sp.started && got.is_some() && rx.complete() {
                    break;
                }
            }
            assert!(tx.complete() && rx.complete(), "message {k} of {len} bytes");
            assert!(sp.done() && rp.done());
            assert_eq!(*rm.msg.borrow(), msg, "message {k}");
        }
    }

    #[test]
    fn messages_cross_the_ring_in_order() {
        let sizes = [0, 1, 7, 64, 65, 1000, 0, 4096, 3];
        for delay in [0, 1, 3] {
            run(
                Layout {
                    nslots: 4,
                    slot_bytes: 64,
                },
                &sizes,
                delay,
            );
            run(
                Layout {
                    nslots: 1,
                    slot_bytes: 16,
                },
                &sizes,
                delay,
            );
        }
    }

    #[test]
    fn chunks_cover_the_message() {
        let l = Layout {
            nslots: 8,
            slot_bytes: 100,
        };
        assert_eq!(l.steps_for(0), 1);
        assert_eq!(l.steps_for(100), 1);
        assert_eq!(l.steps_for(101), 2);
        assert_eq!(l.chunk(0, 0), (0, 0));
        assert_eq!(l.chunk(250, 2), (200, 50));
        assert_eq!(l.slot(17), 1);
        let line = Line {
            header: [9; HEADER_LEN],
            nbytes: 77,
            first: true,
        };
        assert_eq!(Line::decode(&line.encode()), line);
    }
}
