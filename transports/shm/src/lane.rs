//! The boxes of the small-message lane (see `ferroccl_transport::lane`): two per ring, in the
//! ring's control page, written by the ring's producer and read by its owner.
//!
//! A box is two cache lines: the stamp, the three tag words and the first four payload words
//! share the first, so a message of up to 32 bytes arrives in one line transfer. Orderings: the
//! writer stores payload and tag `Relaxed`, then the stamp with `Release`; the reader loads the
//! stamp with `Acquire` before reading the rest. The lane's exchange rule (a box is rewritten
//! only after its reader has answered the message in it) keeps writes and reads of one box
//! apart; the words are atomics all the same, so a peer that breaks the rule can garble a
//! message but never cause undefined behaviour here.

use crate::sync::{AtomicU64, Ordering};

/// Payload words per box.
const WORDS: usize = 12;

/// The most payload bytes a lane message carries.
pub const LANE_BYTES: usize = WORDS * 8;

/// One box. All zeros (a fresh segment) reads as "no message yet" (stamps start at 1). Other
/// transports whose peers share host memory (the GPU peer-to-peer transport's control
/// segment) keep their lanes in boxes of this layout too.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct LaneBox {
    /// Message number plus one of the message in the box.
    stamp: AtomicU64,
    tag: [AtomicU64; 3],
    words: [AtomicU64; WORDS],
}

impl LaneBox {
    /// Stores message `n`: payload and tag, then the stamp that publishes them.
    pub fn put(&self, n: u64, tag: [u64; 3], data: &[u8]) {
        debug_assert!(data.len() <= LANE_BYTES);
        for (w, chunk) in self.words.iter().zip(data.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            // Relaxed: published by the stamp's Release store below.
            w.store(u64::from_ne_bytes(b), Ordering::Relaxed);
        }
        for (t, v) in self.tag.iter().zip(tag) {
            t.store(v, Ordering::Relaxed);
        }
        // Release: the payload and tag above are visible to a reader that sees this stamp.
        self.stamp.store(n + 1, Ordering::Release);
    }

    /// Message `n` into `out` (at most [`LANE_BYTES`]) and its tag, if it is in the box.
    pub fn take(&self, n: u64, out: &mut [u8]) -> Option<[u64; 3]> {
        // Acquire: pairs with the writer's Release store of the stamp.
        if self.stamp.load(Ordering::Acquire) != n + 1 {
            return None;
        }
        for (w, chunk) in self.words.iter().zip(out.chunks_mut(8)) {
            // Relaxed: ordered after the stamp's Acquire load above.
            let b = w.load(Ordering::Relaxed).to_ne_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
        Some(self.tag.each_ref().map(|t| t.load(Ordering::Relaxed)))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn zeroed() -> LaneBox {
        LaneBox {
            stamp: AtomicU64::new(0),
            tag: std::array::from_fn(|_| AtomicU64::new(0)),
            words: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    #[test]
    fn a_message_is_read_only_under_its_own_number() {
        let b = zeroed();
        let mut out = [0u8; 12];
        assert_eq!(b.take(0, &mut out), None, "a fresh box holds nothing");
        let data: Vec<u8> = (1..=12).collect();
        b.put(4, [7, 9, 11], &data);
        assert_eq!(b.take(2, &mut out), None);
        assert_eq!(b.take(6, &mut out), None);
        assert_eq!(b.take(4, &mut out), Some([7, 9, 11]));
        assert_eq!(&out[..], &data[..]);
    }

    #[test]
    fn every_length_up_to_the_capacity_round_trips() {
        let b = zeroed();
        for len in 0..=LANE_BYTES {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            b.put(len as u64, [len as u64, 1, 2], &data);
            let mut out = vec![0xeeu8; len];
            assert_eq!(b.take(len as u64, &mut out), Some([len as u64, 1, 2]));
            assert_eq!(out, data, "{len} bytes");
        }
    }

    #[test]
    fn a_box_fits_two_cache_lines() {
        assert_eq!(std::mem::size_of::<LaneBox>(), 128);
    }
}
