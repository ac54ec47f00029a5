//! ferroccl's in-memory transport, for ranks that are threads of one process.
//!
//! | item | what it is |
//! |---|---|
//! | [`MemConnection`] | one peer pair: a bounded byte queue per direction, a condvar doorbell per rank |
//! | [`MemTransport`] | setup: a process-global registry of endpoints, tokens as connect handles |
//! | [`MemConfig`] | queue size |
//! | [`Bell`] | the rank's doorbell: a counter, a mutex and a condvar |
//!
//! The transport has the protocol shape of a one-sided one (RDMA) without its hardware: it
//! asks for registration ([`Connection::register`] returns a [`Region`] with a key) and a
//! receiver may post the length of its next destination ([`Connection::post_recv`], RDMA's
//! clear-to-send), which the sender checks before it writes a byte. A receiver that posts
//! nothing still receives (pull-style), so the executor may use it either way. Everything is
//! safe Rust.
//!
//! [`Region`]: ferroccl_transport::Region
//! [`Connection::register`]: ferroccl_transport::Connection::register
//! [`Connection::post_recv`]: ferroccl_transport::Connection::post_recv
//!
//! # Example
//!
//! 1. Two connected ends, one message from rank 0 to rank 1, driven by alternating calls:
//!
//! ```
//! use ferroccl_transport::{Connection, Header, Payload, PayloadMut, Progress};
//! use ferroccl_transport_mem::{MemConfig, MemConnection};
//!
//! let (mut a, mut b) = MemConnection::pair(0, 1, &MemConfig::default());
//! let msg = vec![7u8; 100_000];
//! let h = Header { len: msg.len() as u64, ..Header::default() };
//! let (mut sp, mut rp) = (Progress::default(), Progress::default());
//! let (mut rh, mut got) = (Header::default(), vec![0u8; msg.len()]);
//! let (mut sent, mut recvd) = (false, false);
//! while !(sent && recvd) {
//!     if !sent {
//!         sent = a.send(&h, Payload::Host(&msg), &mut sp).unwrap();
//!     }
//!     if !recvd {
//!         recvd = b.recv(&mut rh, PayloadMut::Host(&mut got), &mut rp).unwrap();
//!     }
//! }
//! assert_eq!((rh, got), (h, msg));
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod bell;
mod conn;
mod queue;
mod setup;

pub use bell::Bell;
pub use conn::{MemConnection, MemRegistration};
pub use setup::MemTransport;

/// Settings of the in-memory transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemConfig {
    /// Bytes each direction's queue holds; a larger message moves in pieces (at least
    /// [`MIN_QUEUE_BYTES`]).
    pub queue_bytes: usize,
}

/// The smallest queue: a header and some payload.
pub const MIN_QUEUE_BYTES: usize = 64;

impl Default for MemConfig {
    fn default() -> Self {
        MemConfig {
            queue_bytes: 1 << 20,
        }
    }
}

#[cfg(test)]
mod tests;
