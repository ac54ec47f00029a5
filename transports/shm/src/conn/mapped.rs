//! Receiving a payload that the sender left in a shared buffer
//! ([`SharedMem`](crate::SharedMem)): the receiver maps the buffer (once; `PeerMaps` keeps it)
//! and copies, or hands to a lent receive's sink, straight from its mapping, acknowledging each
//! piece so the sender's send completes when the last one is read. If the buffer cannot be
//! mapped (another user, another pid namespace, a refused `/proc` open), the receiver sets
//! `MAPPED_DENIED` and takes the rest through the ring, where the sender then streams it.

use ferroccl_transport::{Progress, Result};

use super::lent::{whole, PIECE};
use super::{ShmConnection, MAPPED_DENIED, MODE_INLINE};
use crate::shared::Located;

impl ShmConnection {
    /// Where byte `pos` of the current message lies in the sender's shared buffer.
    fn mapped_at(&self, pos: usize) -> Located {
        let at = Located::decode(self.rx_addr, self.rx_len);
        Located {
            offset: at.offset + pos as u64,
            ..at
        }
    }

    /// The buffer could not be mapped: tells the sender to stream the rest through the ring.
    fn deny_mapped(&mut self, why: &str) {
        if !self.rx_mapped_warned {
            self.rx_mapped_warned = true;
            eprintln!(
                "ferroccl SHM: cannot map {}'s shared buffer ({why}); large messages from it go \
                 through the ring instead",
                self.peer
            );
        }
        self.rx.set_flag(MAPPED_DENIED);
        self.peer_bell.ring();
        self.rx_mode = MODE_INLINE;
    }

    /// Copies the next piece of a shared-buffer message into `payload`. False when the buffer
    /// could not be mapped and the rest comes through the ring.
    pub(super) fn recv_mapped(&mut self, payload: &mut [u8], p: &mut Progress) -> Result<bool> {
        let pos = p.parts[0].pos;
        let end = payload.len().min(pos + self.cfg.max_io.max(4096));
        if pos == end {
            return Ok(true);
        }
        let at = self.mapped_at(pos);
        match self.rx_maps.view(at, end - pos) {
            Ok(v) => payload[pos..end].copy_from_slice(v),
            Err(why) => {
                self.deny_mapped(&why);
                return Ok(false);
            }
        }
        p.parts[0].pos = end;
        self.acknowledge(end - pos, p.done())?;
        Ok(true)
    }

    /// Hands the next pieces of a shared-buffer message to `sink`, whole `granule`-byte
    /// elements at a time. False when the buffer could not be mapped and the rest comes
    /// through the ring.
    pub(super) fn lend_mapped(
        &mut self,
        len: usize,
        granule: usize,
        p: &mut Progress,
        sink: &mut dyn FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<bool> {
        let start = p.parts[0].pos;
        let budget = start.saturating_add(self.cfg.max_io.max(4096));
        let mut pos = start;
        while pos < len && pos < budget {
            let n = whole((len - pos).min(PIECE), pos, len, granule.max(1));
            let at = self.mapped_at(pos);
            let r = match self.rx_maps.view(at, n) {
                Ok(v) => sink(pos, v),
                Err(why) => {
                    p.parts[0].pos = pos;
                    self.deny_mapped(&why);
                    return Ok(false);
                }
            };
            pos += n;
            p.parts[0].pos = pos;
            self.acknowledge(n, pos == len)?;
            r?;
        }
        Ok(true)
    }

    /// Peer buffers this end has mapped now.
    #[cfg(test)]
    pub(crate) fn mapped_buffers(&self) -> usize {
        self.rx_maps.mapped()
    }

    /// Makes every later mapping fail, as it would for a peer whose `/proc` entries this
    /// process may not open.
    #[cfg(test)]
    pub(crate) fn lose_peer_buffers_for_test(&mut self) {
        self.rx_maps = crate::shared::PeerMaps::new(u32::MAX);
    }
}
