//! ferroccl's TCP transport.
//!
//! | item | what it is |
//! |---|---|
//! | [`TcpEndpoint`] | a listening socket; accepts peers after checking their handshake |
//! | [`TcpConnection`] | one peer pair: several sockets ("streams"); large messages are striped over them |
//! | [`TcpTransport`] | setup: the listening address as connect handle, connect up, accept down |
//! | [`TcpConfig`] | streams per peer, striping threshold, socket buffer size |
//!
//! Every socket opens with a handshake that names the communicator id, the sender's rank, the
//! rank it wants and the stream index; the acceptor answers only when all of it matches, and drops
//! anything else (a stranger, a job with another id) without disturbing its own communicator.
//!
//! Messages are a 40-byte [`Header`](ferroccl_transport::Header) on stream 0 followed by the payload. A payload of at least
//! [`TcpConfig::stripe_min`] bytes is split into one part per stream (parts are multiples of
//! 4096 bytes except the last), so several sockets carry one large message at once.

use std::net::TcpStream;
use std::os::fd::AsRawFd;

use ferroccl_transport::{Error, Result};

/// Settings of the TCP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpConfig {
    /// Sockets per peer pair (1..=8). `FERRO_NSOCKS_PERPEER`, default 2.
    pub nstreams: usize,
    /// Payloads of at least this many bytes are striped over all streams. Default 256 KiB.
    pub stripe_min: usize,
    /// `SO_SNDBUF`/`SO_RCVBUF` in bytes; 0 leaves the kernel's autotuning alone (the default).
    pub socket_buffer: usize,
    /// Most bytes one `send`/`recv` call moves per stream, so that the caller can interleave work
    /// (reduce what has arrived while it is still in cache). Default 512 KiB.
    pub max_io: usize,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            nstreams: 2,
            stripe_min: 256 << 10,
            socket_buffer: 0,
            max_io: 512 << 10,
        }
    }
}

fn sys(what: impl std::fmt::Display, e: &std::io::Error) -> Error {
    Error::io(what, e)
}

fn set_options(s: &TcpStream, cfg: &TcpConfig) -> Result<()> {
    s.set_nodelay(true)
        .map_err(|e| sys("setting TCP_NODELAY", &e))?;
    if cfg.socket_buffer > 0 {
        let v = libc::c_int::try_from(cfg.socket_buffer).unwrap_or(libc::c_int::MAX);
        for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
            // SAFETY: the fd is a live socket owned by `s`; `v` outlives the call and its size is passed.
            let rc = unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&v as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if rc != 0 {
                return Err(sys(
                    "setting socket buffer size",
                    &std::io::Error::last_os_error(),
                ));
            }
        }
    }
    Ok(())
}

mod conn;
mod handshake;
pub use conn::TcpConnection;
pub use handshake::{connect, TcpEndpoint};

mod setup;
pub use setup::TcpTransport;

#[cfg(test)]
mod tests;
