//! A send/recv group's device buffers through the staging, piece by piece.
//!
//! A group's messages are cut into pieces (`comm::group`); a group with staged device buffers
//! runs in rounds, round `k` moving piece `k` of every message. Round `k`'s pieces of the
//! staged sends lie one after another in place `k mod window` of the input buffer, those of
//! the staged receives in the same place of the output buffer, so a group takes `window`
//! pieces of each buffer, not its whole buffers, and the copies of the other rounds overlap
//! the round on the transports.

use std::ops::Range;

use super::{Slot, Staging, Stream};
use crate::Result;

/// A staged device range of a group: its device address and bytes, cut into pieces of
/// `piece` bytes (the last one shorter; one empty piece when `len` is 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub dev: u64,
    pub len: usize,
    pub piece: usize,
}

impl Span {
    /// Bytes of piece `k` within the range (empty past the last piece).
    pub(crate) fn range(&self, k: usize) -> Range<usize> {
        piece_range(self.len, self.piece, k)
    }

    /// Bytes it takes in each place: its largest piece, rounded up to 64.
    fn room(&self) -> usize {
        self.len.min(self.piece).next_multiple_of(64)
    }
}

/// Pieces of a `len`-byte message cut into `piece`-byte pieces: at least one.
pub(crate) fn pieces(len: usize, piece: usize) -> usize {
    len.div_ceil(piece.max(1)).max(1)
}

/// Bytes of piece `k` of a `len`-byte message (empty past the last piece).
pub(crate) fn piece_range(len: usize, piece: usize, k: usize) -> Range<usize> {
    let start = k.saturating_mul(piece).min(len);
    start..start.saturating_add(piece).min(len)
}

/// Bytes of one place for `spans`: their rooms one after another.
fn place_bytes(spans: &[Span]) -> usize {
    spans.iter().map(Span::room).sum()
}

/// The staged copies of round `k` handed to the round: sends' pieces (read) and receives'
/// pieces (written), in the order of their spans; empty for a span without piece `k`.
pub(crate) type RoundViews<'a> = (Vec<&'a [u8]>, Vec<&'a mut [u8]>);

impl Staging {
    /// Makes the buffers hold `window` places for `sends` and `recvs`.
    pub(crate) fn reserve_spans(
        &mut self,
        sends: &[Span],
        recvs: &[Span],
        window: usize,
    ) -> Result<()> {
        self.reserve(window * place_bytes(sends), window * place_bytes(recvs))
    }

    /// Runs `rounds` rounds of a group, `window` of them staged at once (reserved first with
    /// [`Staging::reserve_spans`]). Piece `k` of every send is copied into place `k mod window`
    /// of the input buffer, followed by a mark; round `k` waits for its mark, runs `round(k,
    /// sends' pieces, receives' pieces)`, then queues the copies of the receives' pieces to
    /// their device ranges and the copies in of round `k + window`, which takes the same
    /// place (the stream runs them in that order: the mark after them also says the place's
    /// receive pieces have left). Returns after every queued copy has completed, also when
    /// `round` fails (or panics).
    ///
    /// # Safety
    /// Each span is live device memory of this staging's device; the sends' are not written
    /// and the receives' not used by anything else until this returns.
    pub(crate) unsafe fn pipeline_spans(
        &mut self,
        sends: &[Span],
        recvs: &[Span],
        rounds: usize,
        window: usize,
        mut round: impl FnMut(usize, RoundViews<'_>) -> Result<()>,
    ) -> Result<()> {
        let window = window.max(1);
        let (in_place, out_place) = (place_bytes(sends), place_bytes(recvs));
        let in_ptr = self.checked(Slot::Input, window * in_place)?;
        let out_ptr = self.checked(Slot::Output, window * out_place)?;
        // Queues round `k`'s copies in, then its mark.
        let copy_in = |stream: &mut Stream, k: usize| -> Result<()> {
            let mut at = (k % window) * in_place;
            for s in sends {
                let r = s.range(k);
                if !r.is_empty() {
                    // SAFETY: `in_ptr + at` starts this span's room in round `k`'s place,
                    // reserved (checked above) and owned by `self`; the device range lies in
                    // the span (the caller vouches for it); every queued copy completes before
                    // this function returns (synchronize below, on every path).
                    unsafe { stream.download(in_ptr.add(at), s.dev + r.start as u64, r.len())? };
                }
                at += s.room();
            }
            stream.mark(k % window)
        };
        self.guarded(|stream| {
            for k in 0..window.min(rounds) {
                copy_in(stream, k)?;
            }
            for k in 0..rounds {
                stream.wait_mark(k % window)?;
                let (mut sent, mut recvd) = (Vec::new(), Vec::new());
                let mut at = (k % window) * in_place;
                for s in sends {
                    // SAFETY: round `k`'s place, reserved; its downloads have completed (its
                    // mark was waited for) and no queued copy writes it until round `k +
                    // window`'s, queued after this round.
                    sent.push(unsafe {
                        std::slice::from_raw_parts(in_ptr.add(at), s.range(k).len())
                    });
                    at += s.room();
                }
                let mut at = (k % window) * out_place;
                for s in recvs {
                    // SAFETY: as above, in the output buffer: the uploads of the round that
                    // used this place before have completed (queued before the mark waited
                    // for), and this round's are queued after `round` returns.
                    recvd.push(unsafe {
                        std::slice::from_raw_parts_mut(out_ptr.add(at), s.range(k).len())
                    });
                    at += s.room();
                }
                round(k, (sent, recvd))?;
                let mut at = (k % window) * out_place;
                for s in recvs {
                    let r = s.range(k);
                    if !r.is_empty() {
                        // SAFETY: the piece's room in this round's place, written by `round`
                        // and left untouched until this upload has run (the next copy into the
                        // place is queued after it); the device range lies in the span.
                        unsafe { stream.upload(s.dev + r.start as u64, out_ptr.add(at), r.len())? };
                    }
                    at += s.room();
                }
                if k + window < rounds {
                    copy_in(stream, k + window)?;
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Device, DeviceBuffer, Provider};

    #[test]
    fn pieces_cover_a_message_once() {
        assert_eq!(pieces(0, 64), 1);
        assert_eq!(piece_range(0, 64, 0), 0..0);
        assert_eq!(pieces(64, 64), 1);
        assert_eq!(pieces(65, 64), 2);
        assert_eq!(piece_range(65, 64, 1), 64..65);
        assert_eq!(piece_range(65, 64, 2), 65..65);
        for len in [1usize, 63, 64, 127, 1000, 4099] {
            let n = pieces(len, 64);
            let covered: usize = (0..n).map(|k| piece_range(len, 64, k).len()).sum();
            assert_eq!(covered, len);
            assert!((0..n).all(|k| !piece_range(len, 64, k).is_empty()));
        }
    }

    /// Every round sees exactly its pieces of the sends, and what it writes into the receives'
    /// pieces reaches the device, with places reused: a buffer of 8 pieces through 2 places.
    /// (The suite runs it with lazy and with eager stand-in streams.)
    #[test]
    fn rounds_see_their_pieces_and_write_back_through_few_places() {
        let dev = Device::new(Provider::Host, 3).unwrap();
        let a: Vec<u8> = (0..449u32).map(|i| (i * 7 % 251) as u8).collect();
        let b: Vec<u8> = (0..70u32).map(|i| (i * 3 + 1) as u8).collect();
        let src_a = DeviceBuffer::from_host(dev, &a).unwrap();
        let src_b = DeviceBuffer::from_host(dev, &b).unwrap();
        let dst_a = DeviceBuffer::<u8>::new(dev, a.len()).unwrap();
        let dst_b = DeviceBuffer::<u8>::new(dev, b.len()).unwrap();
        let span = |d: &DeviceBuffer<u8>| Span {
            dev: d.mem().addr as u64,
            len: d.len(),
            piece: 64,
        };
        let sends = [span(&src_a), span(&src_b)];
        let recvs = [span(&dst_a), span(&dst_b)];
        let rounds = sends.iter().map(|s| pieces(s.len, s.piece)).max().unwrap();
        assert_eq!(rounds, 8);
        let mut st = Staging::new(dev).unwrap();
        st.reserve_spans(&sends, &recvs, 2).unwrap();
        let before = st.allocations();
        // SAFETY: the spans are the live stand-in buffers above, borrowed for the call.
        unsafe {
            st.pipeline_spans(&sends, &recvs, rounds, 2, |k, (sent, mut recvd)| {
                for (j, (s, data)) in sends.iter().zip([&a, &b]).enumerate() {
                    assert_eq!(sent[j], &data[s.range(k)], "round {k}, send {j}");
                    recvd[j].copy_from_slice(sent[j]);
                    recvd[j].iter_mut().for_each(|x| *x = x.wrapping_add(1));
                }
                Ok(())
            })
        }
        .unwrap();
        assert_eq!(st.allocations(), before);
        let plus = |v: &[u8]| v.iter().map(|x| x.wrapping_add(1)).collect::<Vec<_>>();
        assert_eq!(dst_a.to_vec().unwrap(), plus(&a));
        assert_eq!(dst_b.to_vec().unwrap(), plus(&b));
        // SAFETY: as above.
        let e = unsafe { st.pipeline_spans(&sends, &recvs, rounds, 3, |_, _| Ok(())) };
        assert!(e.unwrap_err().to_string().contains("not reserved"));
        // SAFETY: as above.
        let e = unsafe {
            st.pipeline_spans(&sends, &recvs, rounds, 2, |k, _| {
                if k == 3 {
                    Err(crate::Error::internal("round 3 failed"))
                } else {
                    Ok(())
                }
            })
        };
        assert!(e.unwrap_err().to_string().contains("round 3 failed"));
    }
}
