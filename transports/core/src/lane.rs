//! The small-message lane: a side channel some connections offer beside their ordered stream,
//! for messages of a few dozen bytes that every rank of a communicator sends to every other in
//! the same call (a tiny allreduce).
//!
//! A lane holds two boxes per direction. Message number `n` goes to box `n % 2` and is valid
//! once the box's stamp reads `n + 1` (written last, with Release). No acknowledgement is
//! needed when every lane message is part of an exchange in which each rank waits for every
//! peer's message `n` before it sends `n + 1`: a sender reaches message `n + 2` only after the
//! receiver sent `n + 1`, which it did only after reading `n`, the box's previous occupant.
//! The executor keeps to that rule; a lane used any other way may overwrite unread messages.
//!
//! | call | moves | may block |
//! |---|---|---|
//! | [`SmallLane::put`] | message `n` into the peer's box | no |
//! | [`SmallLane::take`] | message `n` out of this rank's box, if it arrived | no |

use crate::Result;

/// What [`SmallLane::take`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneTake {
    /// Message `n` arrived with this tag; its bytes are in the output buffer.
    Arrived([u64; 3]),
    /// Nothing yet, and the stream is quiet.
    Empty,
    /// Nothing in the lane, but the peer's stream holds a message: the peer is not in this
    /// exchange (another operation, a failure notice).
    Stream,
}

/// A connection's lane for tiny messages (see the module docs).
pub trait SmallLane {
    /// The most payload bytes one lane message carries.
    fn capacity(&self) -> usize;

    /// Writes message `n` (`data.len() <= capacity()`, `tag` is the caller's check words) into
    /// the peer's box and wakes the peer. Fails if the connection is closed or the peer gone.
    fn put(&mut self, n: u64, tag: [u64; 3], data: &[u8]) -> Result<()>;

    /// Reads message `n` into `out` (`out.len() <= capacity()`) if it has arrived. Fails if the
    /// peer closed the connection or its process is gone and nothing arrived.
    fn take(&mut self, n: u64, out: &mut [u8]) -> Result<LaneTake>;
}
