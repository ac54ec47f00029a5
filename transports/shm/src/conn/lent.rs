//! Receiving without a copy: the payload is handed to the caller's sink straight from the
//! ring ([`Connection::recv_lent`](ferroccl_transport::Connection::recv_lent)), so a
//! receive-reduce reads each byte once, where it landed, instead of copying it out first.
//!
//! A payload left in a shared buffer is lent from the receiver's mapping of that buffer instead
//! (`mapped.rs`).
//!
//! Pieces are whole elements (`granule` bytes): where an element straddles the ring's wrap, or
//! the producer has written only part of one, the bytes go through the read-ahead buffer, which
//! joins them. Bytes already in the read-ahead buffer (taken with a frame) are handed from
//! there first.

use ferroccl_transport::{Error, Header, Progress, Result};

use super::{ShmConnection, MODE_CMA, MODE_MAPPED};

/// Most bytes handed to the sink at once, so that the sender may refill the ring behind a
/// reduction in progress (a multiple of every element size).
pub(super) const PIECE: usize = 64 << 10;

impl ShmConnection {
    /// [`Connection::recv_lent`](ferroccl_transport::Connection::recv_lent) for this
    /// connection (see the module docs).
    pub(super) fn receive_lent(
        &mut self,
        header: &mut Header,
        len: usize,
        granule: usize,
        p: &mut Progress,
        sink: &mut dyn FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<bool> {
        if self.closed {
            return Err(self.closed_error());
        }
        if !p.header_done() {
            return self.read_frame(header, p);
        }
        if !p.started {
            if header.len != len as u64 || self.rx_mode == MODE_CMA {
                return Err(Error::internal(format!(
                    "recv from {}: header says {} bytes ({}), the lent receive has {len}",
                    self.peer,
                    header.len,
                    if self.rx_mode == MODE_CMA {
                        "by cross-memory attach, which lends nothing"
                    } else {
                        "through the ring"
                    }
                )));
            }
            Self::start(p, len);
        }
        if self.rx_mode == MODE_MAPPED && self.lend_mapped(len, granule, p, sink)? {
            return Ok(p.done());
        }
        let g = granule.max(1);
        let start = p.parts[0].pos;
        let budget = start.saturating_add(self.cfg.max_io.max(4096));
        let mut pos = start;
        let mut released = false;
        while pos < len && pos < budget {
            let ahead = self.ahead_len();
            if ahead > 0 {
                let n = whole(ahead.min(len - pos), pos, len, g);
                if n > 0 {
                    let from = self.ahead_pos;
                    sink(pos, &self.ahead[from..from + n])?;
                    self.ahead_pos += n;
                    pos += n;
                    continue;
                }
                // Part of an element: join it with what follows in the ring.
                if self.read_ahead() == 0 {
                    break;
                }
                continue;
            }
            let consumer = self.consumer();
            // SAFETY: the view is used only by `sink` below, before `release` hands its bytes
            // back; this connection is the ring's only consumer.
            let view = unsafe { consumer.filled((len - pos).min(PIECE)) };
            if view.is_empty() {
                break;
            }
            let n = whole(view.len(), pos, len, g);
            if n == 0 {
                // The ring wraps inside an element, or only part of one is written yet.
                if self.read_ahead() == 0 {
                    break;
                }
                continue;
            }
            let r = sink(pos, &view[..n]);
            consumer.release(n);
            released = true;
            r?;
            pos += n;
        }
        if released {
            self.peer_bell.ring();
        }
        if pos == start {
            if let Err(e) = self.check_peer() {
                // Bytes written just before the close still count: the close flag's Acquire
                // makes them visible to the next call, which the caller makes.
                if self.ahead_len() == 0 && !self.consumer().has_data() {
                    return Err(e);
                }
            }
        }
        p.parts[0].pos = pos;
        Ok(p.done())
    }
}

/// How many of `avail` bytes at payload offset `pos` (of `len`) may go out as one piece: a
/// whole number of `granule`-byte elements, or everything up to the end of the message.
pub(super) fn whole(avail: usize, pos: usize, len: usize, granule: usize) -> usize {
    if pos + avail == len {
        avail
    } else {
        avail - avail % granule
    }
}

#[cfg(test)]
mod tests {
    use super::whole;

    #[test]
    fn pieces_are_whole_elements_except_the_last() {
        assert_eq!(whole(10, 0, 100, 4), 8);
        assert_eq!(whole(3, 0, 100, 4), 0);
        assert_eq!(whole(3, 97, 100, 4), 3);
        assert_eq!(whole(16, 4, 100, 8), 16);
        assert_eq!(whole(7, 0, 100, 1), 7);
    }
}
