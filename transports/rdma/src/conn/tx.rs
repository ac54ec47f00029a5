//! The send half of a connection: header slots (inline payloads), the wait for the
//! clear-to-send, striped payload writes.

use ferroccl_transport::{Error, Header, MemRef, Part, Progress, Result, HEADER_LEN};

use super::{MrKeep, RdmaConnection, Tx, CONTROL_RESERVE, DATA_WINDOW};
use crate::proto::{
    encode_slot_head, header_allowed, short, stripes, wr_id, Cts, Imm, WrKind, CTS_LEN, DEPTH,
    FLAG_INLINE, SLOT_HEAD,
};
use crate::verbs::{MemoryRegion, Verbs, WriteWr};

impl<V: Verbs> RdmaConnection<V> {
    /// Writes header slot `n` (with `inline` bytes after it) into the peer's ring.
    pub(super) fn post_header(
        &mut self,
        h: &Header,
        flags: u64,
        inline: &[u8],
        n: u64,
    ) -> Result<()> {
        let slot = n as usize % DEPTH;
        let off = slot * self.slot_len();
        self.ep
            .hdr_tx
            .buf
            .write(off, &encode_slot_head(h, flags, n));
        self.ep.hdr_tx.buf.write(off + SLOT_HEAD, inline);
        self.hdr_busy[slot] = true;
        let wr = WriteWr {
            wr_id: wr_id(WrKind::Header, 0, n),
            local_addr: self.ep.hdr_tx.buf.addr() + off,
            len: SLOT_HEAD + inline.len(),
            lkey: self.ep.hdr_tx.mr.lkey(),
            remote_addr: self.remote.hdr_addr + off as u64,
            rkey: self.remote.hdr_rkey,
            imm: Some(Imm::Header(short(n)).encode()),
            signaled: true,
        };
        self.post(0, wr)
    }

    /// The send half: begins message `self.tx_next` (header slot, inline where it fits).
    pub(super) fn begin_send(
        &mut self,
        h: &Header,
        payload: &[u8],
        p: &mut Progress,
    ) -> Result<bool> {
        let n = self.tx_next;
        if !header_allowed(n, self.credit) || self.hdr_busy[n as usize % DEPTH] || !self.room(0, 0)
        {
            return Ok(false);
        }
        let cts_here = self.cts_seen[n as usize % DEPTH] == Some(n);
        let inline = payload.len() <= self.set.eager && !cts_here;
        if inline {
            self.post_header(h, FLAG_INLINE, payload, n)?;
        } else {
            self.post_header(h, 0, &[], n)?;
        }
        self.tx = Tx {
            n,
            inline,
            ..Tx::default()
        };
        self.tx_next += 1;
        p.header_pos = HEADER_LEN;
        if inline {
            p.started = true;
            p.nparts = 1;
            p.parts[0] = Part {
                start: 0,
                pos: payload.len(),
                end: payload.len(),
            };
        }
        Ok(true)
    }

    /// The send half: writes what the queues have room for.
    pub(super) fn push_payload(&mut self, payload: &[u8], p: &mut Progress) -> Result<()> {
        if !p.started {
            let n = self.tx.n;
            if self.cts_seen[n as usize % DEPTH] != Some(n) {
                return Ok(());
            }
            let mut b = [0u8; CTS_LEN];
            self.ep
                .cts_fifo
                .buf
                .read((n as usize % DEPTH) * CTS_LEN, &mut b);
            let c = Cts::decode(&b);
            if c.stamp != n + 1 {
                let e = Error::internal(format!(
                    "send to {}: clear-to-send slot of message #{n} holds #{} (the FIFO is out \
                     of step)",
                    self.peer,
                    c.stamp.wrapping_sub(1)
                ));
                return Err(self.fail(e));
            }
            if c.len != payload.len() as u64 {
                return Err(Error::invalid_argument(format!(
                    "send to {}: the receiver posted a {}-byte destination for message #{n}, \
                     this message has {} bytes",
                    self.peer,
                    c.len,
                    payload.len()
                ))
                .with_peer(self.peer.rank));
            }
            let mem = MemRef::host(payload.as_ptr(), payload.len());
            self.tx.region = Some(self.region_for(mem, "send to")?);
            self.tx.cts = Some(c);
            p.nparts = stripes(payload.len(), self.ep.qps.len(), &mut p.parts);
            p.started = true;
        }
        let (Some(c), Some(region)) = (self.tx.cts, self.tx.region.clone()) else {
            return Ok(());
        };
        let lkey = region
            .resources::<MrKeep<V::Mr>>()
            .map_or(0, |m| m.0.lkey());
        let base = payload.as_ptr() as usize;
        for q in 0..p.nparts {
            let reserve = if q == 0 { CONTROL_RESERVE } else { 0 };
            while p.parts[q].pos < p.parts[q].end
                && self.room(q, reserve)
                && self.tx.inflight[q] < DATA_WINDOW
            {
                let part = p.parts[q];
                let len = (part.end - part.pos).min(self.set.chunk);
                let wr = WriteWr {
                    wr_id: wr_id(WrKind::Data, q, self.tx.n),
                    local_addr: base + part.pos,
                    len,
                    lkey,
                    remote_addr: c.addr + part.pos as u64,
                    rkey: c.rkey,
                    imm: Some(Imm::Data(short(self.tx.n)).encode()),
                    signaled: true,
                };
                self.post(q, wr)?;
                self.tx.outstanding += 1;
                self.tx.inflight[q] += 1;
                p.parts[q].pos += len;
            }
        }
        Ok(())
    }
}
