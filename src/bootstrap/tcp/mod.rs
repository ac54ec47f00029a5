//! A store served over TCP by one rank (usually rank 0) and used by every rank.
//!
//! # Protocol
//!
//! All integers are little-endian.
//!
//! 1. The client opens with a 20-byte hello: the 8 bytes `FRCLSTOR`, the protocol version
//!    (`u16`, [`PROTOCOL_VERSION`]), two zero bytes and the job magic (`u64`).
//!    A server sees the wrong 8 bytes (an HTTP client, a port scanner, garbage) and closes the
//!    connection without answering; other connections are not affected.
//! 2. The server answers 12 bytes: `FRCLSTOR`, its version (`u16`) and a status (`u16`: 0
//!    accepted, 1 version mismatch, 2 the job magic differs from the server's). A server bound
//!    with a job magic accepts exactly that magic (a client's 0 is no wildcard); a server bound
//!    with magic 0 accepts any. On a non-zero status it closes the connection. A server that
//!    already serves as many connections as it may closes a new one without answering, and
//!    the client tries again.
//! 3. Then requests and responses alternate, each a frame: a `u32` length and that many bytes.
//!    A request starts with an opcode: `1` SET (`u32` key length, key, value), `2` GET (`u64`
//!    wait in milliseconds, key), `3` ADD (`i64` delta, key). A response starts with a status:
//!    `0` done (GET: the value; ADD: the new `i64`), `1` GET waited its time, `2` failed
//!    (a kind byte, then a UTF-8 message), `3` the server is shutting down.
//!
//! Keys have at most [`MAX_KEY_LEN`] bytes and values at most [`MAX_VALUE_LEN`]; a frame
//! announcing more is a protocol violation and the server drops that connection.
//!
//! # Limits
//!
//! A server bounds what any client, a stranger included, can make it hold:
//!
//! | bound | constant |
//! |---|---|
//! | bytes of keys and values held; a SET or ADD past it fails ("store full"), the connection stays usable | [`MAX_STORE_BYTES`] |
//! | connections that have not completed their hello; more are closed at once | [`MAX_PENDING_HELLOS`] |
//! | time a new connection has to send its whole hello | [`HELLO_TIMEOUT`] |
//! | connections served after their hello; more are closed without a reply | [`MAX_CONNECTIONS`] |
//! | time a frame has to arrive whole once its first byte has (else the connection is dropped) | [`FRAME_TIMEOUT`] |
//!
//! A connection may stay idle between frames for as long as it likes (clients keep idle
//! connections). A frame's body is read as its bytes arrive, never allocated at its announced
//! size, so a frame announced but not sent holds no memory. The server runs one thread per
//! connection, so any number of clients may wait in GET at once; the two connection bounds
//! bound its threads.
//!
//! # Who may connect
//!
//! The job magic is shared by a job's ranks (a [`UniqueId`](super::UniqueId) carries a random
//! one): a server bound with it ([`TcpStoreServer::bind_with_magic`]) turns away ranks of
//! other jobs and strangers that do not know it. It is no encryption: whoever can read the
//! network can read it. [`TcpStoreServer::bind`] (magic 0) serves anyone who reaches its port
//! and is meant for tests and trusted networks.
#![forbid(unsafe_code)]

use std::time::Duration;

/// The version of the wire protocol described in the module docs.
pub const PROTOCOL_VERSION: u16 = 1;
/// The longest key, in bytes.
pub const MAX_KEY_LEN: usize = 4096;
/// The longest value, in bytes.
pub const MAX_VALUE_LEN: usize = 64 << 20;

/// The most bytes of keys and values a server holds (256 MiB); a SET or ADD that would pass
/// it fails with "store full" and its connection stays usable.
pub const MAX_STORE_BYTES: usize = 256 << 20;
// A store holds a few of the largest values.
const _: () = assert!(MAX_STORE_BYTES >= 2 * (MAX_VALUE_LEN + MAX_KEY_LEN));
/// The most connections a server keeps that have not completed their hello; more are closed
/// at once (a rank turned away tries again).
pub const MAX_PENDING_HELLOS: usize = 64;
/// How long a new connection may take to send its whole hello before the server closes it.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// The most connections a server serves after their hello; more are closed without a reply
/// (the client tries again).
pub const MAX_CONNECTIONS: usize = 1024;
/// How long a frame may take to arrive whole once its first byte has, and how long a server
/// may take to send a response; a connection that takes longer is dropped.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(10);
/// How long SET and ADD wait for the server unless [`TcpStore::set_request_timeout`] says
/// otherwise.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a client waits for the server's hello reply before deciding that whatever
/// accepted the connection is not a ferroccl store (a store answers at once).
const HELLO_REPLY_TIMEOUT: Duration = Duration::from_secs(2);
/// How much longer than a GET's own wait the client waits for the server's answer.
const GET_GRACE: Duration = Duration::from_secs(5);
/// How long a client tries to open another connection (after one was lost, or while all are
/// busy), at most; never longer than the request's own wait.
const RECONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Stack size of a connection thread (it holds no large buffers on the stack).
const CONNECTION_STACK: usize = 256 << 10;
/// The most bytes a frame body grows by before they arrive.
const READ_PIECE: usize = 64 << 10;
/// The most bytes of a foreign answer quoted in an error.
const QUOTE_LEN: usize = 64;

/// The bounds a server enforces: the constants above, or shorter ones in tests.
#[derive(Debug, Clone, Copy)]
struct Limits {
    store_bytes: usize,
    pending_hellos: usize,
    hello_timeout: Duration,
    connections: usize,
    frame_timeout: Duration,
}

impl Limits {
    const DEFAULT: Limits = Limits {
        store_bytes: MAX_STORE_BYTES,
        pending_hellos: MAX_PENDING_HELLOS,
        hello_timeout: HELLO_TIMEOUT,
        connections: MAX_CONNECTIONS,
        frame_timeout: FRAME_TIMEOUT,
    };
}

mod wire;

use wire::{Request, Response};

mod client;
mod server;
mod timed;

pub use client::TcpStore;
pub use server::TcpStoreServer;
use server::*;
use timed::*;

#[cfg(test)]
mod tests;
