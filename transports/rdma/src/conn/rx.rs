//! The receive half of a connection: header slots, clear-to-sends (posted and unposted),
//! credits, landed stripes.

use ferroccl_transport::{Error, Header, MemRef, Part, Progress, Result, HEADER_LEN};

use super::{RdmaConnection, Rx};
use crate::proto::{
    cts_allowed, decode_slot_head, short, stripes, wr_id, Cts, Imm, WrKind, CTS_LEN, DEPTH,
    FLAG_INLINE, SLOT_HEAD,
};
use crate::verbs::{MemoryRegion, Verbs, WriteWr};

impl<V: Verbs> RdmaConnection<V> {
    /// The head of header slot `n`.
    pub(super) fn slot_head(&self, n: u64) -> (Option<Header>, u64, u64) {
        let mut b = [0u8; SLOT_HEAD];
        self.ep
            .hdr_ring
            .buf
            .read((n as usize % DEPTH) * self.slot_len(), &mut b);
        decode_slot_head(&b)
    }

    /// Sends a credit when enough header slots were freed since the last one.
    pub(super) fn maybe_credit(&mut self) -> Result<()> {
        if self.freed - self.credit_sent < (DEPTH / 4) as u64 || !self.room(0, 0) {
            return Ok(());
        }
        self.credit_sent = self.freed;
        let wr = WriteWr {
            wr_id: wr_id(WrKind::Credit, 0, self.freed),
            local_addr: self.ep.hdr_tx.buf.addr(),
            len: 0,
            lkey: self.ep.hdr_tx.mr.lkey(),
            remote_addr: self.remote.hdr_addr,
            rkey: self.remote.hdr_rkey,
            imm: Some(Imm::Credit(short(self.freed)).encode()),
            signaled: true,
        };
        self.post(0, wr)
    }

    /// Writes the clear-to-send of message `n`.
    pub(super) fn post_cts(&mut self, n: u64, dst: MemRef, rkey: u32) -> Result<()> {
        let slot = n as usize % DEPTH;
        let c = Cts {
            addr: dst.addr as u64,
            rkey,
            len: dst.len as u64,
            stamp: n + 1,
        };
        self.ep.cts_tx.buf.write(slot * CTS_LEN, &c.encode());
        self.cts_busy[slot] = true;
        let wr = WriteWr {
            wr_id: wr_id(WrKind::Cts, 0, n),
            local_addr: self.ep.cts_tx.buf.addr() + slot * CTS_LEN,
            len: CTS_LEN,
            lkey: self.ep.cts_tx.mr.lkey(),
            remote_addr: self.remote.cts_addr + (slot * CTS_LEN) as u64,
            rkey: self.remote.cts_rkey,
            imm: Some(Imm::Cts(short(n)).encode()),
            signaled: true,
        };
        self.post(0, wr)
    }

    /// Writes the clear-to-send of the unposted message under way, once its staging slot and
    /// the send queue have room.
    pub(super) fn send_due_cts(&mut self) -> Result<()> {
        let Some((dst, rkey)) = self.rx.cts_due else {
            return Ok(());
        };
        let n = self.rx.n;
        if self.cts_busy[n as usize % DEPTH] || !self.room(0, 0) {
            return Ok(());
        }
        self.rx.cts_due = None;
        self.post_cts(n, dst, rkey)
    }

    /// Advertises posted destinations the FIFO has room for.
    pub(super) fn advertise(&mut self) -> Result<()> {
        for i in 0..self.posts.len() {
            let p = &self.posts[i];
            let (n, dst, rkey) = (p.n, p.dst, p.rkey);
            if p.advertised {
                continue;
            }
            if n < self.hdr_arrived && self.slot_head(n).1 & FLAG_INLINE != 0 {
                // The message came inline before its destination was advertised.
                self.posts[i].advertised = true;
                continue;
            }
            if !cts_allowed(n, self.hdr_arrived)
                || self.cts_busy[n as usize % DEPTH]
                || !self.room(0, 0)
            {
                break;
            }
            self.post_cts(n, dst, rkey)?;
            self.posts[i].advertised = true;
        }
        Ok(())
    }

    /// The receive half: counts landed pieces of the message under way into `p`.
    pub(super) fn count_landed(&mut self, p: &mut Progress) -> Result<()> {
        let want = short(self.rx.n);
        for q in 0..p.nparts.min(self.landed.len()) {
            while let Some(&(k, bytes)) = self.landed[q].front() {
                if k != want {
                    break;
                }
                self.landed[q].pop_front();
                let part = &mut p.parts[q];
                part.pos += bytes as usize;
                if part.pos > part.end {
                    let e = Error::internal(format!(
                        "recv from {}: message #{} overran stripe {q} ({} of {} bytes)",
                        self.peer,
                        self.rx.n,
                        part.pos - part.start,
                        part.end - part.start
                    ));
                    return Err(self.fail(e));
                }
            }
        }
        Ok(())
    }

    /// The receive half: reads the next header slot.
    pub(super) fn take_header(&mut self, header: &mut Header, p: &mut Progress) -> Result<()> {
        let n = self.hdr_taken;
        if self.peer_closed == Some(n) {
            return Err(self.peer_closed_error());
        }
        let (h, flags, stamp) = self.slot_head(n);
        let Some(h) = h.filter(|_| stamp == n) else {
            let e = Error::internal(format!(
                "garbled header slot from {} for message #{n} (the ring is out of step)",
                self.peer
            ));
            return Err(self.fail(e));
        };
        self.hdr_taken += 1;
        let posted = match self.posts.front() {
            Some(post) if post.n == n => self.posts.pop_front(),
            _ => None,
        };
        *header = h;
        p.header_pos = HEADER_LEN;
        self.rx = Rx {
            n,
            inline: flags & FLAG_INLINE != 0,
            posted,
            region: None,
            cts_due: None,
        };
        if let Some(post) = self
            .rx
            .posted
            .as_ref()
            .filter(|post| post.dst.len as u64 != h.len)
        {
            return Err(Error::invalid_argument(format!(
                "recv from {}: this end posted a {}-byte destination for message #{n}, the \
                 message has {} bytes",
                self.peer, post.dst.len, h.len
            ))
            .with_peer(self.peer.rank));
        }
        Ok(())
    }

    /// The receive half: starts the payload of a message whose header was read.
    pub(super) fn start_payload(
        &mut self,
        h: &Header,
        buf: &mut [u8],
        p: &mut Progress,
    ) -> Result<()> {
        h.check_recv_len(&self.peer, buf.len())?;
        let dst = MemRef::host(buf.as_ptr(), buf.len());
        if let Some(post) = &self.rx.posted {
            if post.dst.addr != dst.addr && !buf.is_empty() {
                return Err(Error::invalid_argument(format!(
                    "recv from {}: message #{} was posted to {:#x}, the receive offers {:#x}",
                    self.peer, self.rx.n, post.dst.addr, dst.addr
                )));
            }
        }
        if self.rx.inline {
            let off = (self.rx.n as usize % DEPTH) * self.slot_len() + SLOT_HEAD;
            self.ep.hdr_ring.buf.read(off, buf);
            p.nparts = 1;
            p.parts[0] = Part {
                start: 0,
                pos: buf.len(),
                end: buf.len(),
            };
        } else {
            if self.rx.posted.is_none() {
                let region = self.region_for(dst, "recv from")?;
                let rkey = region.key() as u32;
                self.rx.region = Some(region);
                self.rx.cts_due = Some((dst, rkey));
                self.send_due_cts()?;
            }
            p.nparts = stripes(buf.len(), self.ep.qps.len(), &mut p.parts);
        }
        p.started = true;
        self.freed += 1;
        self.maybe_credit()
    }
}
