//! A store served over TCP by one rank (usually rank 0) and used by every rank.
//!
//! # Protocol
//!
//! All integers are little-endian.
//!
//! 1. The client opens with a 20-byte hello: the 8 bytes `FRCLSTOR`, the protocol version
//!    (`u16`, [`PROTOCOL_VERSION`]), two zero bytes and the job magic (`u64`, 0 for "any job").
//!    A server sees the wrong 8 bytes (an HTTP client, a port scanner, garbage) and closes the
//!    connection without answering; other connections are not affected.
//! 2. The server answers 12 bytes: `FRCLSTOR`, its version (`u16`) and a status (`u16`: 0
//!    accepted, 1 version mismatch, 2 the job magic differs from the server's; a magic of 0 on
//!    either side matches any). On a non-zero status it closes the connection.
//! 3. Then requests and responses alternate, each a frame: a `u32` length and that many bytes.
//!    A request starts with an opcode: `1` SET (`u32` key length, key, value), `2` GET (`u64`
//!    wait in milliseconds, key), `3` ADD (`i64` delta, key). A response starts with a status:
//!    `0` done (GET: the value; ADD: the new `i64`), `1` GET waited its time, `2` failed
//!    (a kind byte, then a UTF-8 message), `3` the server is shutting down.
//!
//! Keys have at most [`MAX_KEY_LEN`] bytes and values at most [`MAX_VALUE_LEN`]; a frame
//! announcing more is a protocol violation and the server drops that connection.
//!
//! The server runs one thread per connection, so any number of clients may wait in GET at once.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::memory::{Table, WaitError};
use super::Store;
use crate::{Error, ErrorKind, Result};

/// The version of the wire protocol described in the module docs.
pub const PROTOCOL_VERSION: u16 = 1;
/// The longest key, in bytes.
pub const MAX_KEY_LEN: usize = 4096;
/// The longest value, in bytes.
pub const MAX_VALUE_LEN: usize = 64 << 20;

/// How long a new connection may take to send its hello.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long SET and ADD may take, and how long a write may block.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How much longer than a GET's own wait the client waits for the server's answer.
const GET_GRACE: Duration = Duration::from_secs(5);
/// How long a client tries to open another connection (after one was lost, or while all are
/// busy).
const RECONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The most connections a server serves at once; more are closed at once.
const MAX_CONNECTIONS: usize = 16384;
/// Stack size of a connection thread (it holds no large buffers on the stack).
const CONNECTION_STACK: usize = 256 << 10;

/// Encoding and decoding of hellos and frames: no I/O.
mod wire {
    use super::{MAX_KEY_LEN, MAX_VALUE_LEN, PROTOCOL_VERSION};

    pub(super) const MAGIC: [u8; 8] = *b"FRCLSTOR";
    pub(super) const HELLO_LEN: usize = 20;
    pub(super) const REPLY_LEN: usize = 12;
    /// The largest frame body either side accepts.
    pub(super) const MAX_FRAME: usize = MAX_VALUE_LEN + MAX_KEY_LEN + 16;

    pub(super) const HELLO_OK: u16 = 0;
    pub(super) const HELLO_BAD_VERSION: u16 = 1;
    pub(super) const HELLO_BAD_MAGIC: u16 = 2;

    const OP_SET: u8 = 1;
    const OP_GET: u8 = 2;
    const OP_ADD: u8 = 3;

    const ST_OK: u8 = 0;
    const ST_TIMED_OUT: u8 = 1;
    const ST_FAILED: u8 = 2;
    const ST_CLOSING: u8 = 3;

    pub(super) fn hello(job_magic: u64) -> [u8; HELLO_LEN] {
        let mut h = [0u8; HELLO_LEN];
        h[..8].copy_from_slice(&MAGIC);
        h[8..10].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        h[12..20].copy_from_slice(&job_magic.to_le_bytes());
        h
    }

    /// `(version, job magic)` of a hello, `None` when it is not a ferroccl store hello.
    pub(super) fn parse_hello(h: &[u8; HELLO_LEN]) -> Option<(u16, u64)> {
        if h[..8] != MAGIC || h[10..12] != [0, 0] {
            return None;
        }
        Some((u16_at(h, 8), u64_at(h, 12)))
    }

    pub(super) fn reply(status: u16) -> [u8; REPLY_LEN] {
        let mut r = [0u8; REPLY_LEN];
        r[..8].copy_from_slice(&MAGIC);
        r[8..10].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        r[10..12].copy_from_slice(&status.to_le_bytes());
        r
    }

    /// `(version, status)` of a server's reply, `None` when it is not from a ferroccl store.
    pub(super) fn parse_reply(r: &[u8; REPLY_LEN]) -> Option<(u16, u16)> {
        (r[..8] == MAGIC).then(|| (u16_at(r, 8), u16_at(r, 10)))
    }

    /// A client's request.
    #[derive(Debug, PartialEq, Eq)]
    pub(super) enum Request<'a> {
        Set { key: &'a str, value: &'a [u8] },
        Get { key: &'a str, wait_ms: u64 },
        Add { key: &'a str, delta: i64 },
    }

    /// A server's response.
    #[derive(Debug, PartialEq, Eq)]
    pub(super) enum Response {
        /// Done; the value (GET), the new count (ADD, 8 bytes) or nothing (SET).
        Done(Vec<u8>),
        TimedOut,
        /// The request failed: whether the cause is a bad argument (else bad usage), why.
        Failed {
            bad_argument: bool,
            message: String,
        },
        Closing,
    }

    /// The request as a frame, length prefix included.
    pub(super) fn encode_request(req: &Request<'_>) -> Vec<u8> {
        let mut body = Vec::new();
        match *req {
            Request::Set { key, value } => {
                body.push(OP_SET);
                body.extend_from_slice(&len_u32(key.len()).to_le_bytes());
                body.extend_from_slice(key.as_bytes());
                body.extend_from_slice(value);
            }
            Request::Get { key, wait_ms } => {
                body.push(OP_GET);
                body.extend_from_slice(&wait_ms.to_le_bytes());
                body.extend_from_slice(key.as_bytes());
            }
            Request::Add { key, delta } => {
                body.push(OP_ADD);
                body.extend_from_slice(&delta.to_le_bytes());
                body.extend_from_slice(key.as_bytes());
            }
        }
        frame(body)
    }

    /// Decodes a request frame's body; the error says what is wrong with it.
    pub(super) fn decode_request(body: &[u8]) -> Result<Request<'_>, String> {
        fn key(b: &[u8]) -> Result<&str, String> {
            if b.len() > MAX_KEY_LEN {
                return Err(format!("key of {} bytes (at most {MAX_KEY_LEN})", b.len()));
            }
            std::str::from_utf8(b).map_err(|_| "key is not UTF-8".to_string())
        }
        let (&op, rest) = body.split_first().ok_or("empty request")?;
        match op {
            OP_SET => {
                let klen = u32_prefix(rest).ok_or("short SET")? as usize;
                let rest = &rest[4..];
                if klen > rest.len() {
                    return Err(format!("SET key length {klen} past the frame end"));
                }
                let (k, value) = rest.split_at(klen);
                Ok(Request::Set {
                    key: key(k)?,
                    value,
                })
            }
            OP_GET if rest.len() >= 8 => Ok(Request::Get {
                wait_ms: u64_at(rest, 0),
                key: key(&rest[8..])?,
            }),
            OP_ADD if rest.len() >= 8 => Ok(Request::Add {
                delta: u64_at(rest, 0) as i64,
                key: key(&rest[8..])?,
            }),
            OP_GET | OP_ADD => Err("short request".into()),
            _ => Err(format!("unknown opcode {op}")),
        }
    }

    /// The response as a frame, length prefix included.
    pub(super) fn encode_response(resp: &Response) -> Vec<u8> {
        let body = match resp {
            Response::Done(payload) => {
                let mut b = Vec::with_capacity(1 + payload.len());
                b.push(ST_OK);
                b.extend_from_slice(payload);
                b
            }
            Response::TimedOut => vec![ST_TIMED_OUT],
            Response::Failed {
                bad_argument,
                message,
            } => {
                let mut b = vec![ST_FAILED, u8::from(*bad_argument)];
                b.extend_from_slice(message.as_bytes());
                b
            }
            Response::Closing => vec![ST_CLOSING],
        };
        frame(body)
    }

    pub(super) fn decode_response(mut body: Vec<u8>) -> Result<Response, String> {
        match body.first().copied() {
            Some(ST_OK) => {
                body.remove(0);
                Ok(Response::Done(body))
            }
            Some(ST_TIMED_OUT) => Ok(Response::TimedOut),
            Some(ST_FAILED) if body.len() >= 2 => Ok(Response::Failed {
                bad_argument: body[1] != 0,
                message: String::from_utf8_lossy(&body[2..]).into_owned(),
            }),
            Some(ST_CLOSING) => Ok(Response::Closing),
            Some(s) => Err(format!("unknown response status {s}")),
            None => Err("empty response".into()),
        }
    }

    /// The length a frame header announces, `None` if more than [`MAX_FRAME`].
    pub(super) fn frame_len(header: [u8; 4]) -> Option<usize> {
        let n = u32::from_le_bytes(header) as usize;
        (n <= MAX_FRAME).then_some(n)
    }

    fn frame(body: Vec<u8>) -> Vec<u8> {
        let mut f = Vec::with_capacity(4 + body.len());
        f.extend_from_slice(&len_u32(body.len()).to_le_bytes());
        f.extend_from_slice(&body);
        f
    }

    /// `n` as `u32`. Callers keep frames within [`MAX_FRAME`], far below `u32::MAX`.
    fn len_u32(n: usize) -> u32 {
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    fn u32_prefix(b: &[u8]) -> Option<u32> {
        b.get(..4)
            .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    fn u16_at(b: &[u8], i: usize) -> u16 {
        u16::from_le_bytes([b[i], b[i + 1]])
    }

    fn u64_at(b: &[u8], i: usize) -> u64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[i..i + 8]);
        u64::from_le_bytes(a)
    }
}

use wire::{Request, Response};

/// Reads one frame body; `Ok(None)` on a clean end of stream before the frame.
fn read_frame(stream: &mut TcpStream) -> io::Result<Option<Vec<u8>>> {
    let mut header = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match stream.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = wire::frame_len(header).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "frame of {} bytes (at most {})",
                u32::from_le_bytes(header),
                wire::MAX_FRAME
            ),
        )
    })?;
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body)?;
    Ok(Some(body))
}

/// Locks `m`; the guarded data stay consistent across a panic (stated at each use).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The server's open connections, so that dropping the server can shut them down.
#[derive(Debug, Default)]
struct Connections {
    /// Once true, no connection is registered any more.
    stopping: bool,
    next_id: u64,
    streams: HashMap<u64, TcpStream>,
}

#[derive(Debug)]
struct Shared {
    table: Table,
    /// Clients must present this magic in their hello (0: any).
    job_magic: u64,
    stop: AtomicBool,
    /// Each entry is a single insert or remove, so a panic cannot leave it half-updated.
    connections: Mutex<Connections>,
}

/// A TCP store server; it serves on background threads until dropped.
///
/// Dropping it closes every connection (waiting clients get a `Remote` error) and joins its
/// threads.
pub struct TcpStoreServer {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for TcpStoreServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpStoreServer")
            .field("local_addr", &self.local_addr)
            .field(
                "job_magic",
                &format_args!("{:#018x}", self.shared.job_magic),
            )
            .finish()
    }
}

impl TcpStoreServer {
    /// Starts a server listening on `addr` (port 0: any free port, see
    /// [`local_addr`](Self::local_addr)) that accepts clients of any job.
    pub fn bind(addr: SocketAddr) -> Result<TcpStoreServer> {
        Self::bind_with_magic(addr, 0)
    }

    /// Starts a server that turns away clients presenting a job magic other than `job_magic`
    /// (0: accept any), so that a rank of another job that reaches this port by mistake (with
    /// a stale [`UniqueId`](super::UniqueId)) fails at once. Clients presenting magic 0 are
    /// accepted.
    pub fn bind_with_magic(addr: SocketAddr, job_magic: u64) -> Result<TcpStoreServer> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| Error::io(format_args!("store server: binding {addr}"), &e))?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| Error::io(format_args!("store server: local address of {addr}"), &e))?;
        let shared = Arc::new(Shared {
            table: Table::default(),
            job_magic,
            stop: AtomicBool::new(false),
            connections: Mutex::new(Connections::default()),
        });
        let accept_thread = thread::Builder::new()
            .name("ferro-store-accept".into())
            .spawn({
                let shared = Arc::clone(&shared);
                move || accept_loop(&listener, &shared)
            })
            .map_err(|e| {
                Error::io(
                    format_args!("store server {local_addr}: spawning thread"),
                    &e,
                )
            })?;
        Ok(TcpStoreServer {
            local_addr,
            shared,
            accept_thread: Some(accept_thread),
        })
    }

    /// The address the server listens on (with the actual port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The job magic clients must present (0: any).
    pub fn job_magic(&self) -> u64 {
        self.shared.job_magic
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let mut conns = lock(&self.shared.connections);
            conns.stopping = true;
            for s in conns.streams.values() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        self.shared.table.close();
        // Wake the accept thread out of accept() with a connection of our own.
        let wake = SocketAddr::new(reachable_ip(self.local_addr.ip()), self.local_addr.port());
        let woke = TcpStream::connect_timeout(&wake, Duration::from_secs(1)).is_ok();
        if let Some(t) = self.accept_thread.take() {
            // Without the wake-up the thread may sit in accept() for good: leave it detached,
            // it exits at its next connection.
            if woke {
                let _ = t.join();
            }
        }
    }
}

/// An address to reach a listener bound to `ip` from this host.
fn reachable_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        other => other,
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    let mut threads: Vec<JoinHandle<()>> = Vec::new();
    loop {
        let accepted = listener.accept();
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(_) => {
                // Out of descriptors or a connection reset before accept: try again shortly.
                thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        threads.retain(|t| !t.is_finished());
        let id = {
            let mut conns = lock(&shared.connections);
            if conns.stopping {
                break;
            }
            if conns.streams.len() >= MAX_CONNECTIONS {
                continue;
            }
            let Ok(clone) = stream.try_clone() else {
                continue;
            };
            let id = conns.next_id;
            conns.next_id += 1;
            conns.streams.insert(id, clone);
            id
        };
        let spawned = thread::Builder::new()
            .name("ferro-store-conn".into())
            .stack_size(CONNECTION_STACK)
            .spawn({
                let shared = Arc::clone(shared);
                move || {
                    // Errors end this connection only; the client sees it closed.
                    let _ = serve_connection(stream, &shared);
                    lock(&shared.connections).streams.remove(&id);
                }
            });
        match spawned {
            Ok(t) => threads.push(t),
            Err(_) => {
                lock(&shared.connections).streams.remove(&id);
            }
        }
    }
    for t in threads {
        let _ = t.join();
    }
}

fn serve_connection(mut stream: TcpStream, shared: &Shared) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let mut hello = [0u8; wire::HELLO_LEN];
    stream.read_exact(&mut hello)?;
    let Some((version, magic)) = wire::parse_hello(&hello) else {
        // A stranger: close without a word.
        return Ok(());
    };
    let status = if version != PROTOCOL_VERSION {
        wire::HELLO_BAD_VERSION
    } else if shared.job_magic != 0 && magic != 0 && magic != shared.job_magic {
        wire::HELLO_BAD_MAGIC
    } else {
        wire::HELLO_OK
    };
    stream.write_all(&wire::reply(status))?;
    if status != wire::HELLO_OK {
        return Ok(());
    }
    stream.set_read_timeout(None)?;
    while let Some(body) = read_frame(&mut stream)? {
        let request = match wire::decode_request(&body) {
            Ok(r) => r,
            Err(why) => return Err(io::Error::new(io::ErrorKind::InvalidData, why)),
        };
        let response = match request {
            Request::Set { key, value } => {
                shared.table.set(key, value);
                Response::Done(Vec::new())
            }
            Request::Get { key, wait_ms } => {
                match shared.table.wait_get(key, Duration::from_millis(wait_ms)) {
                    Ok(v) => Response::Done(v),
                    Err(WaitError::TimedOut) => Response::TimedOut,
                    Err(WaitError::Closed) => Response::Closing,
                }
            }
            Request::Add { key, delta } => match shared.table.add(key, delta) {
                Ok(n) => Response::Done(n.to_le_bytes().to_vec()),
                Err(e) => Response::Failed {
                    bad_argument: e.kind() == ErrorKind::InvalidArgument,
                    message: e.message().to_owned(),
                },
            },
        };
        stream.write_all(&wire::encode_response(&response))?;
    }
    Ok(())
}

/// A client of a [`TcpStoreServer`], usable from many threads at once.
///
/// It keeps one connection per request in flight (usually one): a thread waiting in `get`
/// does not hold up another thread's `set`. A connection that fails or is abandoned (a GET
/// that got no answer in time) is dropped and a later call opens a new one.
#[derive(Debug)]
pub struct TcpStore {
    addr: SocketAddr,
    job_magic: u64,
    /// The local address of the first connection (see [`Store::local_ip`]).
    local_ip: IpAddr,
    /// Connections not in use. A request takes one (or opens one when none is idle) and puts
    /// it back after a complete round trip. Each access is a single push or pop, so a panic
    /// cannot leave the list inconsistent.
    idle: Mutex<Vec<TcpStream>>,
}

impl TcpStore {
    /// Connects to the store at `addr`, retrying until `timeout` passes (the server may start
    /// later than this rank).
    pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStore> {
        Self::connect_with_magic(addr, 0, timeout)
    }

    /// As [`connect`](Self::connect), presenting `job_magic` (from a
    /// [`UniqueId`](super::UniqueId)) to a server that checks it.
    pub fn connect_with_magic(
        addr: SocketAddr,
        job_magic: u64,
        timeout: Duration,
    ) -> Result<TcpStore> {
        let stream = open(addr, job_magic, timeout)?;
        let local_ip = stream
            .local_addr()
            .map_err(|e| Error::io(format_args!("store at {addr}: local address"), &e))?
            .ip();
        Ok(TcpStore {
            addr,
            job_magic,
            local_ip,
            idle: Mutex::new(vec![stream]),
        })
    }

    /// The store's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sends `req` and reads the response, waiting at most `wait` for it. `what` names the
    /// operation in errors ("set of key 'k'").
    fn round_trip(&self, what: &str, req: &[u8], wait: Duration) -> Result<Response> {
        let addr = self.addr;
        let idle = lock(&self.idle).pop();
        let mut stream = match idle {
            Some(s) => s,
            // Every connection is busy (another thread may be waiting in a GET for a key this
            // one is about to set) or was lost: open one more.
            None => open(addr, self.job_magic, RECONNECT_TIMEOUT).map_err(|e| {
                Error::remote(format!(
                    "store {what} at {addr}: cannot connect: {}",
                    e.message()
                ))
            })?,
        };
        let result = stream
            .set_read_timeout(Some(wait.max(Duration::from_millis(1))))
            .and_then(|()| stream.write_all(req))
            .and_then(|()| read_frame(&mut stream));
        // On any failure the stream is dropped: it may hold a late or partial response.
        match result {
            Ok(Some(body)) => match wire::decode_response(body) {
                Ok(resp) => {
                    lock(&self.idle).push(stream);
                    Ok(resp)
                }
                Err(why) => Err(Error::remote(format!(
                    "store {what} at {addr}: malformed response ({why})"
                ))),
            },
            Ok(None) => Err(Error::remote(format!(
                "store {what} at {addr}: the store closed the connection"
            ))),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(Error::timeout(format!(
                    "store {what} at {addr}: no answer within {wait:?}"
                )))
            }
            Err(e) => Err(Error::remote(format!(
                "store {what} at {addr}: connection lost ({e})"
            ))),
        }
    }

    fn check_key(&self, op: &str, key: &str) -> Result<()> {
        if key.len() > MAX_KEY_LEN {
            return Err(Error::invalid_argument(format!(
                "store {op} at {}: key of {} bytes (at most {MAX_KEY_LEN})",
                self.addr,
                key.len()
            )));
        }
        Ok(())
    }

    fn unexpected(&self, what: &str, resp: &Response) -> Error {
        match resp {
            Response::Closing => Error::remote(format!(
                "store {what} at {}: the store is shutting down",
                self.addr
            )),
            Response::Failed {
                bad_argument,
                message,
            } => {
                let kind = if *bad_argument {
                    ErrorKind::InvalidArgument
                } else {
                    ErrorKind::InvalidUsage
                };
                Error::new(kind, format!("store at {}: {message}", self.addr))
            }
            other => Error::remote(format!(
                "store {what} at {}: unexpected response {other:?}",
                self.addr
            )),
        }
    }
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.check_key("set", key)?;
        if value.len() > MAX_VALUE_LEN {
            return Err(Error::invalid_argument(format!(
                "store set of key '{key}' at {}: value of {} bytes (at most {MAX_VALUE_LEN})",
                self.addr,
                value.len()
            )));
        }
        let what = format!("set of key '{key}'");
        let req = wire::encode_request(&Request::Set { key, value });
        match self.round_trip(&what, &req, REQUEST_TIMEOUT)? {
            Response::Done(_) => Ok(()),
            other => Err(self.unexpected(&what, &other)),
        }
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.check_key("get", key)?;
        let what = format!("get of key '{key}'");
        let wait_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let req = wire::encode_request(&Request::Get { key, wait_ms });
        match self.round_trip(&what, &req, timeout.saturating_add(GET_GRACE))? {
            Response::Done(v) => Ok(v),
            Response::TimedOut => Err(Error::timeout(format!(
                "store {what} at {}: nobody set it within {timeout:?}",
                self.addr
            ))),
            other => Err(self.unexpected(&what, &other)),
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.check_key("add", key)?;
        let what = format!("add to key '{key}'");
        let req = wire::encode_request(&Request::Add { key, delta });
        match self.round_trip(&what, &req, REQUEST_TIMEOUT)? {
            Response::Done(v) if v.len() == 8 => {
                let mut a = [0u8; 8];
                a.copy_from_slice(&v);
                Ok(i64::from_le_bytes(a))
            }
            other => Err(self.unexpected(&what, &other)),
        }
    }

    fn local_ip(&self) -> Option<IpAddr> {
        Some(self.local_ip)
    }
}

/// Connects to `addr` and completes the hello, retrying refused or dropped connections until
/// `timeout` passes.
fn open(addr: SocketAddr, job_magic: u64, timeout: Duration) -> Result<TcpStream> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(10);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let left = timeout.saturating_sub(start.elapsed());
        let last_error = match try_open(addr, job_magic, left.max(Duration::from_millis(10))) {
            Ok(stream) => return Ok(stream),
            Err(OpenError::Fatal(e)) => return Err(e),
            Err(OpenError::Retry(e)) => e,
        };
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(Error::timeout(format!(
                "connecting to store at {addr}: no store answered within {timeout:?} \
                 ({attempts} attempts, last: {last_error})"
            )));
        }
        thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

enum OpenError {
    /// Nobody listens yet, or the connection broke: try again.
    Retry(io::Error),
    /// Something listens but is not a store we can use.
    Fatal(Error),
}

fn try_open(
    addr: SocketAddr,
    job_magic: u64,
    timeout: Duration,
) -> std::result::Result<TcpStream, OpenError> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout.min(Duration::from_secs(5)))
        .map_err(OpenError::Retry)?;
    let mut reply = [0u8; wire::REPLY_LEN];
    stream
        .set_nodelay(true)
        .and_then(|()| stream.set_read_timeout(Some(timeout.max(Duration::from_millis(10)))))
        .and_then(|()| stream.set_write_timeout(Some(REQUEST_TIMEOUT)))
        .and_then(|()| stream.write_all(&wire::hello(job_magic)))
        .and_then(|()| stream.read_exact(&mut reply))
        .map_err(OpenError::Retry)?;
    match wire::parse_reply(&reply) {
        None => Err(OpenError::Fatal(Error::remote(format!(
            "connecting to store at {addr}: it is not a ferroccl store (it answered {:?}); \
             check the address and port",
            String::from_utf8_lossy(&reply)
        )))),
        Some((_, wire::HELLO_OK)) => Ok(stream),
        Some((version, wire::HELLO_BAD_VERSION)) => {
            Err(OpenError::Fatal(Error::invalid_usage(format!(
                "connecting to store at {addr}: it speaks store protocol version {version}, \
                 this rank speaks {PROTOCOL_VERSION}; run the same ferroccl on every rank"
            ))))
        }
        Some((_, wire::HELLO_BAD_MAGIC)) => Err(OpenError::Fatal(Error::invalid_usage(format!(
            "connecting to store at {addr}: it belongs to another job (unique id magic \
             {job_magic:#018x} does not match)"
        )))),
        Some((_, status)) => Err(OpenError::Fatal(Error::remote(format!(
            "connecting to store at {addr}: unknown hello status {status}"
        )))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn local0() -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)
    }

    fn pair() -> (TcpStoreServer, TcpStore) {
        let server = TcpStoreServer::bind(local0()).unwrap();
        let client = TcpStore::connect(server.local_addr(), Duration::from_secs(5)).unwrap();
        (server, client)
    }

    #[test]
    fn wire_round_trips() {
        let reqs = [
            Request::Set {
                key: "k/1",
                value: b"v\x00\xff",
            },
            Request::Set {
                key: "",
                value: b"",
            },
            Request::Get {
                key: "rank7",
                wait_ms: 12345,
            },
            Request::Add {
                key: "ctr",
                delta: -42,
            },
        ];
        for r in &reqs {
            let f = wire::encode_request(r);
            let len = wire::frame_len([f[0], f[1], f[2], f[3]]).unwrap();
            assert_eq!(len, f.len() - 4);
            assert_eq!(&wire::decode_request(&f[4..]).unwrap(), r);
        }
        assert!(wire::decode_request(&[9, 1, 2]).is_err());
        assert!(wire::decode_request(&[1, 200, 0, 0, 0, b'a']).is_err());
        assert!(wire::decode_request(&[]).is_err());
        assert_eq!(wire::frame_len(u32::MAX.to_le_bytes()), None);
        let resps = [
            Response::Done(b"xyz".to_vec()),
            Response::TimedOut,
            Response::Failed {
                bad_argument: true,
                message: "why".into(),
            },
            Response::Closing,
        ];
        for r in resps {
            let f = wire::encode_response(&r);
            assert_eq!(wire::decode_response(f[4..].to_vec()).unwrap(), r);
        }
        let h = wire::hello(0xdead_beef);
        assert_eq!(wire::parse_hello(&h), Some((PROTOCOL_VERSION, 0xdead_beef)));
        assert_eq!(wire::parse_hello(b"GET / HTTP/1.1\r\nHost"), None);
    }

    #[test]
    fn set_get_add() {
        let (_server, s) = pair();
        s.set("rank0/addr", b"10.0.0.1:5000").unwrap();
        s.set("rank1/addr", b"10.0.0.2:5001").unwrap();
        assert_eq!(
            s.get("rank0/addr", Duration::ZERO).unwrap(),
            b"10.0.0.1:5000"
        );
        assert_eq!(
            s.get("rank1/addr", Duration::ZERO).unwrap(),
            b"10.0.0.2:5001"
        );
        let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        s.set("big", &big).unwrap();
        assert_eq!(s.get("big", Duration::ZERO).unwrap(), big);
        assert_eq!(s.add("n", 10).unwrap(), 10);
        assert_eq!(s.add("n", -3).unwrap(), 7);
        assert_eq!(s.get("n", Duration::ZERO).unwrap(), b"7");
        let e = s.add("rank0/addr", 1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUsage);
        // The connection is still usable after a failed request.
        assert_eq!(s.add("n", 1).unwrap(), 8);
        let e = s.set(&"k".repeat(MAX_KEY_LEN + 1), b"").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    }

    #[test]
    fn get_waits_for_another_clients_set() {
        let (server, s) = pair();
        let addr = server.local_addr();
        let t = thread::spawn(move || {
            let w = TcpStore::connect(addr, Duration::from_secs(5)).unwrap();
            thread::sleep(Duration::from_millis(50));
            w.set("late", b"late-value").unwrap();
        });
        assert_eq!(
            s.get("late", Duration::from_secs(10)).unwrap(),
            b"late-value"
        );
        t.join().unwrap();
    }

    #[test]
    fn one_client_shared_by_threads_does_not_deadlock() {
        fn assert_sync<T: Send + Sync>() {}
        assert_sync::<TcpStore>();
        let (_server, s) = pair();
        let s = Arc::new(s);
        let setter = {
            let s = Arc::clone(&s);
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(50));
                // Runs while the other thread waits in get on the same client.
                s.set("x", b"from-setter").unwrap();
                s.add("n", 2).unwrap()
            })
        };
        assert_eq!(s.get("x", Duration::from_secs(10)).unwrap(), b"from-setter");
        assert_eq!(setter.join().unwrap(), 2);
        assert_eq!(s.add("n", 1).unwrap(), 3);
    }

    #[test]
    fn get_timeout_names_key_and_address() {
        let (server, s) = pair();
        let start = Instant::now();
        let e = s.get("absent", Duration::from_millis(80)).unwrap_err();
        assert!(start.elapsed() >= Duration::from_millis(80));
        assert!(start.elapsed() < Duration::from_secs(4));
        assert_eq!(e.kind(), ErrorKind::Timeout);
        assert!(e.message().contains("'absent'"), "{e}");
        assert!(
            e.message().contains(&server.local_addr().to_string()),
            "{e}"
        );
        // Still usable afterwards.
        s.set("absent", b"now").unwrap();
        assert_eq!(s.get("absent", Duration::ZERO).unwrap(), b"now");
    }

    #[test]
    fn many_clients_wait_at_once() {
        const N: usize = 24;
        let server = TcpStoreServer::bind(local0()).unwrap();
        let addr = server.local_addr();
        let threads: Vec<_> = (0..N)
            .map(|r| {
                thread::spawn(move || {
                    let s = TcpStore::connect(addr, Duration::from_secs(10)).unwrap();
                    // Everyone waits for the key of the next rank, set after a delay by it.
                    s.set(&format!("rank{r}"), format!("addr-of-{r}").as_bytes())
                        .unwrap();
                    let mut seen = Vec::new();
                    for p in 0..N {
                        let v = s.get(&format!("rank{p}"), Duration::from_secs(20)).unwrap();
                        seen.push(String::from_utf8(v).unwrap());
                    }
                    let arrived = s.add("arrived", 1).unwrap();
                    (seen, arrived)
                })
            })
            .collect();
        let mut arrivals = Vec::new();
        for t in threads {
            let (seen, arrived) = t.join().unwrap();
            let want: Vec<String> = (0..N).map(|p| format!("addr-of-{p}")).collect();
            assert_eq!(seen, want);
            arrivals.push(arrived);
        }
        arrivals.sort_unstable();
        assert_eq!(arrivals, (1..=N as i64).collect::<Vec<_>>());
    }

    #[test]
    fn strangers_are_rejected_without_disturbing_clients() {
        let (server, s) = pair();
        let addr = server.local_addr();
        s.set("before", b"1").unwrap();
        // A client waits through the whole episode.
        let waiter = thread::spawn(move || {
            let w = TcpStore::connect(addr, Duration::from_secs(5)).unwrap();
            w.get("after", Duration::from_secs(20)).unwrap()
        });
        // An HTTP client: closed without an answer.
        let mut http = TcpStream::connect(addr).unwrap();
        http.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut buf = Vec::new();
        assert_eq!(
            http.read_to_end(&mut buf).map(|_| buf.len()).unwrap_or(0),
            0
        );
        // Garbage bytes.
        let mut junk = TcpStream::connect(addr).unwrap();
        let garbage: Vec<u8> = (0..5000u32).map(|i| (i * 7919 % 256) as u8).collect();
        let _ = junk.write_all(&garbage);
        // A right hello followed by an absurd frame length.
        let mut liar = TcpStream::connect(addr).unwrap();
        liar.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        liar.write_all(&wire::hello(0)).unwrap();
        let mut reply = [0u8; wire::REPLY_LEN];
        liar.read_exact(&mut reply).unwrap();
        assert_eq!(wire::parse_reply(&reply), Some((PROTOCOL_VERSION, 0)));
        liar.write_all(&u32::MAX.to_le_bytes()).unwrap();
        let mut rest = Vec::new();
        assert_eq!(
            liar.read_to_end(&mut rest).map(|_| rest.len()).unwrap_or(0),
            0
        );
        // A right hello then an unknown opcode.
        let mut odd = TcpStream::connect(addr).unwrap();
        odd.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        odd.write_all(&wire::hello(0)).unwrap();
        odd.read_exact(&mut reply).unwrap();
        odd.write_all(&[1, 0, 0, 0, 99]).unwrap();
        let mut rest = Vec::new();
        assert_eq!(
            odd.read_to_end(&mut rest).map(|_| rest.len()).unwrap_or(0),
            0
        );
        // A silent stranger stays connected; it must not block anyone either.
        let _silent = TcpStream::connect(addr).unwrap();
        // The real clients carry on.
        assert_eq!(s.get("before", Duration::ZERO).unwrap(), b"1");
        s.set("after", b"2").unwrap();
        assert_eq!(waiter.join().unwrap(), b"2");
        assert_eq!(s.add("c", 5).unwrap(), 5);
    }

    #[test]
    fn job_magic_and_wrong_servers_are_reported() {
        let server = TcpStoreServer::bind_with_magic(local0(), 0x1234_5678_9abc_def0).unwrap();
        let addr = server.local_addr();
        let good =
            TcpStore::connect_with_magic(addr, 0x1234_5678_9abc_def0, Duration::from_secs(5))
                .unwrap();
        good.set("k", b"v").unwrap();
        // A client that does not know the magic is let in.
        let anyone = TcpStore::connect(addr, Duration::from_secs(5)).unwrap();
        assert_eq!(anyone.get("k", Duration::ZERO).unwrap(), b"v");
        assert_eq!(anyone.local_ip(), Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        let e = TcpStore::connect_with_magic(addr, 7, Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUsage);
        assert!(e.message().contains("another job"), "{e}");
        // Something that is not a store answers with other bytes.
        let fake = TcpListener::bind(local0()).unwrap();
        let fake_addr = fake.local_addr().unwrap();
        let t = thread::spawn(move || {
            let (mut s, _) = fake.accept().unwrap();
            let mut hello = [0u8; wire::HELLO_LEN];
            s.read_exact(&mut hello).unwrap();
            s.write_all(b"HTTP/1.1 400").unwrap();
        });
        let e = TcpStore::connect(fake_addr, Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Remote);
        assert!(e.message().contains("not a ferroccl store"), "{e}");
        t.join().unwrap();
    }

    #[test]
    fn connect_waits_for_a_late_server() {
        // Find a free port, then start the server there only after the client began trying.
        let port = TcpListener::bind(local0())
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
        let t = thread::spawn(move || {
            thread::sleep(Duration::from_millis(150));
            let server = TcpStoreServer::bind(addr).unwrap();
            server.shared.table.set("ready", b"yes");
            thread::sleep(Duration::from_secs(2));
            drop(server);
        });
        let s = TcpStore::connect(addr, Duration::from_secs(10)).unwrap();
        assert_eq!(s.get("ready", Duration::from_secs(5)).unwrap(), b"yes");
        t.join().unwrap();
    }

    #[test]
    fn connect_times_out_when_nobody_listens() {
        let port = TcpListener::bind(local0())
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
        let start = Instant::now();
        let e = TcpStore::connect(addr, Duration::from_millis(200)).unwrap_err();
        assert!(start.elapsed() >= Duration::from_millis(200));
        assert_eq!(e.kind(), ErrorKind::Timeout);
        assert!(e.message().contains(&addr.to_string()), "{e}");
    }

    #[test]
    fn dropping_the_server_is_prompt_and_fails_waiters() {
        let (server, s) = pair();
        let addr = server.local_addr();
        let waiter = thread::spawn(move || {
            let w = TcpStore::connect(addr, Duration::from_secs(5)).unwrap();
            w.get("never", Duration::from_secs(60))
        });
        let _silent = TcpStream::connect(addr).unwrap();
        thread::sleep(Duration::from_millis(100));
        let start = Instant::now();
        drop(server);
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        let e = waiter.join().unwrap().unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(3));
        assert_eq!(e.kind(), ErrorKind::Remote);
        assert!(e.message().contains(&addr.to_string()), "{e}");
        // A later call reports the lost store by address.
        let e = s.set("k", b"v").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Remote);
        assert!(e.message().contains(&addr.to_string()), "{e}");
    }
}
