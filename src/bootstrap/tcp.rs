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

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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

    /// Whether the first bytes of an answer may still be a ferroccl store's reply.
    pub(super) fn could_be_reply(start: &[u8]) -> bool {
        let n = start.len().min(MAGIC.len());
        start[..n] == MAGIC[..n]
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

/// A byte source whose reads can be bounded in time: a socket (or, in tests, a slice).
trait TimedRead: Read {
    /// Bounds each following read to `wait` (`None`: no bound).
    fn set_wait(&mut self, wait: Option<Duration>) -> io::Result<()>;
}

impl TimedRead for TcpStream {
    fn set_wait(&mut self, wait: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(wait)
    }
}

/// The instant `d` from now; `None` (no deadline) when that is too far to represent.
fn after(d: Duration) -> Option<Instant> {
    Instant::now().checked_add(d)
}

/// The time left until `by` (`None`: unbounded); a `TimedOut` error once it has passed.
fn time_left(by: Option<Instant>) -> io::Result<Option<Duration>> {
    let Some(by) = by else { return Ok(None) };
    let left = by.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::ErrorKind::TimedOut.into());
    }
    Ok(Some(left))
}

/// One read into `buf` that ends by `by`: the bytes read, 0 at the end of the stream, a
/// `TimedOut` error when nothing came in time.
fn read_by<R: TimedRead>(r: &mut R, buf: &mut [u8], by: Option<Instant>) -> io::Result<usize> {
    loop {
        r.set_wait(time_left(by)?)?;
        match r.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // What a socket read timeout looks like on Unix.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(io::ErrorKind::TimedOut.into())
            }
            other => return other,
        }
    }
}

/// Fills `buf` by `by`; a stream that ends first is an `UnexpectedEof` error.
fn read_exact_by<R: TimedRead>(r: &mut R, buf: &mut [u8], by: Option<Instant>) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match read_by(r, &mut buf[got..], by)? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => got += n,
        }
    }
    Ok(())
}

/// Appends `len` bytes read by `by` to `body`, growing it at most [`READ_PIECE`] bytes ahead
/// of the bytes that arrived, so a length announced but never sent holds no memory.
fn read_body<R: TimedRead>(
    r: &mut R,
    len: usize,
    body: &mut Vec<u8>,
    by: Option<Instant>,
) -> io::Result<()> {
    let end = body.len().saturating_add(len);
    while body.len() < end {
        let start = body.len();
        body.resize(start + (end - start).min(READ_PIECE), 0);
        let got = read_by(r, &mut body[start..], by);
        // Keep only what arrived, also when the read failed.
        body.truncate(start + got.as_ref().map_or(0, |&n| n));
        if got? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
}

/// When a frame must arrive.
#[derive(Debug, Clone, Copy)]
enum FrameDeadline {
    /// Whole by this instant (`None`: no bound): a client waiting for its response.
    By(Option<Instant>),
    /// Its first byte whenever it comes, all of it within this long of that: a server
    /// between requests.
    After(Duration),
}

/// Reads one frame body; `Ok(None)` on a clean end of stream before the frame.
fn read_frame<R: TimedRead>(r: &mut R, deadline: FrameDeadline) -> io::Result<Option<Vec<u8>>> {
    let mut header = [0u8; 4];
    let first_by = match deadline {
        FrameDeadline::By(by) => by,
        FrameDeadline::After(_) => None,
    };
    let got = read_by(r, &mut header, first_by)?;
    if got == 0 {
        return Ok(None);
    }
    let by = match deadline {
        FrameDeadline::By(by) => by,
        FrameDeadline::After(d) => after(d),
    };
    read_exact_by(r, &mut header[got..], by)?;
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
    let mut body = Vec::new();
    read_body(r, len, &mut body, by)?;
    Ok(Some(body))
}

/// Writes all of `bytes` by `by`; a `TimedOut` error when the peer does not take them in time.
fn write_all_by(stream: &mut TcpStream, bytes: &[u8], by: Option<Instant>) -> io::Result<()> {
    let mut done = 0;
    while done < bytes.len() {
        stream.set_write_timeout(time_left(by)?)?;
        match stream.write(&bytes[done..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(io::ErrorKind::TimedOut.into())
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
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
    /// Every open connection; each has its own thread.
    streams: HashMap<u64, TcpStream>,
    /// How many of `streams` have not completed their hello (at most
    /// `Limits::pending_hellos`).
    pending: usize,
    /// How many of `streams` completed it (at most `Limits::connections`).
    served: usize,
}

#[derive(Debug)]
struct Shared {
    table: Table,
    /// Clients must present exactly this magic in their hello (0: any).
    job_magic: u64,
    limits: Limits,
    stop: AtomicBool,
    /// Each change is a single insert, remove or count step, so a panic cannot leave it
    /// half-updated.
    connections: Mutex<Connections>,
    /// Connection threads that panicked (each ended only its own connection).
    panics: AtomicUsize,
}

/// A TCP store server; it serves on background threads until dropped.
///
/// Dropping it closes every connection (waiting clients get a `Remote` error) and joins its
/// threads. See the module docs for the bounds it enforces.
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
    /// [`local_addr`](Self::local_addr)) that serves clients presenting any job magic.
    ///
    /// Anyone who reaches the port may read and write its keys (within the bounds in the
    /// module docs): use it for tests and on trusted networks only. A job's store is bound
    /// with [`bind_with_magic`](Self::bind_with_magic) (as
    /// [`UniqueId::create`](super::UniqueId::create) does).
    pub fn bind(addr: SocketAddr) -> Result<TcpStoreServer> {
        Self::bind_with_magic(addr, 0)
    }

    /// Starts a server that serves only clients presenting exactly `job_magic` (0: any, as
    /// [`bind`](Self::bind)). Others, a rank of another job that reaches this port by mistake
    /// (with a stale [`UniqueId`](super::UniqueId)) or a client presenting 0, are told that
    /// the store belongs to another job and fail at once.
    pub fn bind_with_magic(addr: SocketAddr, job_magic: u64) -> Result<TcpStoreServer> {
        Self::start(addr, job_magic, Limits::DEFAULT)
    }

    fn start(addr: SocketAddr, job_magic: u64, limits: Limits) -> Result<TcpStoreServer> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| Error::io(format_args!("store server: binding {addr}"), &e))?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| Error::io(format_args!("store server: local address of {addr}"), &e))?;
        let shared = Arc::new(Shared {
            table: Table::with_limit(limits.store_bytes),
            job_magic,
            limits,
            stop: AtomicBool::new(false),
            connections: Mutex::new(Connections::default()),
            panics: AtomicUsize::new(0),
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
            // Strangers that never finish a hello hold at most this many threads, each for
            // at most the hello timeout; a rank closed here tries again.
            if conns.pending >= shared.limits.pending_hellos {
                continue;
            }
            let Ok(clone) = stream.try_clone() else {
                continue;
            };
            let id = conns.next_id;
            conns.next_id += 1;
            conns.streams.insert(id, clone);
            conns.pending += 1;
            id
        };
        let spawned = thread::Builder::new()
            .name("ferro-store-conn".into())
            .stack_size(CONNECTION_STACK)
            .spawn({
                let shared = Arc::clone(shared);
                move || {
                    let mut slot = Slot {
                        shared: &shared,
                        id,
                        served: false,
                    };
                    // Errors end this connection only; the client sees it closed.
                    let served = panic::catch_unwind(AssertUnwindSafe(|| {
                        serve_connection(stream, &shared, &mut slot)
                    }));
                    if served.is_err() {
                        shared.panics.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        match spawned {
            Ok(t) => threads.push(t),
            Err(_) => {
                let mut conns = lock(&shared.connections);
                conns.streams.remove(&id);
                conns.pending -= 1;
            }
        }
    }
    for t in threads {
        let _ = t.join();
    }
}

/// A connection's place in [`Connections`], given back when its thread drops it.
struct Slot<'a> {
    shared: &'a Shared,
    id: u64,
    /// Whether it counts as served (else as pending).
    served: bool,
}

impl Slot<'_> {
    /// Counts the connection as served instead of pending; false when the server already
    /// serves as many as it may.
    fn promote(&mut self) -> bool {
        let mut conns = lock(&self.shared.connections);
        if conns.served >= self.shared.limits.connections {
            return false;
        }
        conns.pending -= 1;
        conns.served += 1;
        self.served = true;
        true
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut conns = lock(&self.shared.connections);
        conns.streams.remove(&self.id);
        if self.served {
            conns.served -= 1;
        } else {
            conns.pending -= 1;
        }
    }
}

fn serve_connection(mut stream: TcpStream, shared: &Shared, slot: &mut Slot<'_>) -> io::Result<()> {
    let limits = shared.limits;
    stream.set_nodelay(true)?;
    let mut hello = [0u8; wire::HELLO_LEN];
    read_exact_by(&mut stream, &mut hello, after(limits.hello_timeout))?;
    let Some((version, magic)) = wire::parse_hello(&hello) else {
        // A stranger: close without a word.
        return Ok(());
    };
    let status = if version != PROTOCOL_VERSION {
        wire::HELLO_BAD_VERSION
    } else if shared.job_magic != 0 && magic != shared.job_magic {
        wire::HELLO_BAD_MAGIC
    } else {
        wire::HELLO_OK
    };
    if status == wire::HELLO_OK && !slot.promote() {
        // Serving as many connections as it may: close without a reply, the client retries.
        return Ok(());
    }
    write_all_by(
        &mut stream,
        &wire::reply(status),
        after(limits.frame_timeout),
    )?;
    if status != wire::HELLO_OK {
        return Ok(());
    }
    while let Some(body) = read_frame(&mut stream, FrameDeadline::After(limits.frame_timeout))? {
        let request = match wire::decode_request(&body) {
            Ok(r) => r,
            Err(why) => return Err(io::Error::new(io::ErrorKind::InvalidData, why)),
        };
        let response = respond(&shared.table, request);
        drop(body);
        write_all_by(
            &mut stream,
            &wire::encode_response(&response),
            after(limits.frame_timeout),
        )?;
    }
    Ok(())
}

/// The server's answer to one request.
fn respond(table: &Table, request: Request<'_>) -> Response {
    match request {
        Request::Set { key, value } => match table.set(key, value) {
            Ok(()) => Response::Done(Vec::new()),
            Err(full) => Response::Failed {
                bad_argument: false,
                message: format!("store set of key '{key}': {full}"),
            },
        },
        Request::Get { key, wait_ms } => {
            match table.wait_get(key, Duration::from_millis(wait_ms)) {
                Ok(v) => Response::Done(v),
                Err(WaitError::TimedOut) => Response::TimedOut,
                Err(WaitError::Closed) => Response::Closing,
            }
        }
        Request::Add { key, delta } => match table.add(key, delta) {
            Ok(n) => Response::Done(n.to_le_bytes().to_vec()),
            Err(e) => Response::Failed {
                bad_argument: e.kind() == ErrorKind::InvalidArgument,
                message: e.message().to_owned(),
            },
        },
    }
}

/// A client of a [`TcpStoreServer`], usable from many threads at once.
///
/// It keeps one connection per request in flight (usually one): a thread waiting in `get`
/// does not hold up another thread's `set`. A connection that fails or is abandoned (a
/// request that got no answer in time) is dropped and a later call opens a new one.
#[derive(Debug)]
pub struct TcpStore {
    addr: SocketAddr,
    job_magic: u64,
    /// The local address of the first connection (see [`Store::local_ip`]).
    local_ip: IpAddr,
    /// How long `set` and `add` wait, in milliseconds (at least 1).
    request_timeout_ms: AtomicU64,
    /// Connections not in use. A request takes one (or opens one when none is idle) and puts
    /// it back after a complete round trip. Each access is a single push or pop, so a panic
    /// cannot leave the list inconsistent.
    idle: Mutex<Vec<TcpStream>>,
}

impl TcpStore {
    /// Connects to the store at `addr`, retrying until `timeout` passes (the server may start
    /// later than this rank). Presents job magic 0, which only a server bound with
    /// [`TcpStoreServer::bind`] accepts.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStore> {
        Self::connect_with_magic(addr, 0, timeout)
    }

    /// As [`connect`](Self::connect), presenting `job_magic` (from a
    /// [`UniqueId`](super::UniqueId)) to a server that checks it.
    ///
    /// Connection refused (no server yet) is retried until `timeout`; something that listens
    /// but does not answer as a ferroccl store, or a store of another job, fails at once.
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
            request_timeout_ms: AtomicU64::new(millis(DEFAULT_REQUEST_TIMEOUT)),
            idle: Mutex::new(vec![stream]),
        })
    }

    /// The store's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Bounds how long [`set`](Store::set) and [`add`](Store::add) wait for the server,
    /// reconnecting included (default [`DEFAULT_REQUEST_TIMEOUT`]; rounded up to whole
    /// milliseconds). A communicator sets its own timeout here.
    pub fn set_request_timeout(&self, timeout: Duration) {
        self.request_timeout_ms
            .store(millis(timeout), Ordering::Relaxed);
    }

    /// How long [`set`](Store::set) and [`add`](Store::add) wait for the server.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms.load(Ordering::Relaxed))
    }

    /// Sends `req` and reads the response, all within `wait` (reconnecting included). `what`
    /// names the operation in errors ("set of key 'k'").
    fn round_trip(&self, what: &str, req: &[u8], wait: Duration) -> Result<Response> {
        let addr = self.addr;
        let by = after(wait);
        let idle = lock(&self.idle).pop();
        let mut stream = match idle {
            Some(s) => s,
            // Every connection is busy (another thread may be waiting in a GET for a key this
            // one is about to set) or was lost: open one more.
            None => {
                let reconnect = wait.min(RECONNECT_TIMEOUT);
                open(addr, self.job_magic, reconnect).map_err(|e| {
                    // Out of the request's own time: a timeout. Else the store is lost.
                    let kind = if e.kind() == ErrorKind::Timeout && reconnect == wait {
                        ErrorKind::Timeout
                    } else {
                        ErrorKind::Remote
                    };
                    Error::new(
                        kind,
                        format!("store {what} at {addr}: cannot connect: {}", e.message()),
                    )
                })?
            }
        };
        let result = write_all_by(&mut stream, req, by)
            .and_then(|()| read_frame(&mut stream, FrameDeadline::By(by)));
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

/// `d` in whole milliseconds, rounded up, at least 1.
fn millis(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX).max(1)
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.set_timeout(key, value, self.request_timeout())
    }

    fn set_timeout(&self, key: &str, value: &[u8], timeout: Duration) -> Result<()> {
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
        match self.round_trip(&what, &req, timeout)? {
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
        match self.round_trip(&what, &req, self.request_timeout())? {
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
/// `timeout` passes. Something that answers, but not as a ferroccl store, fails at once.
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
    /// Nobody listens yet, the store turned us away for now, or the connection broke: try
    /// again.
    Retry(io::Error),
    /// Something listens but is not a store we can use.
    Fatal(Error),
}

/// Why reading a store's hello reply stopped early.
enum ReplyEnd {
    /// The other side closed the connection.
    Closed,
    /// The bytes so far are not the start of a store's reply.
    Foreign,
    /// Nothing more came in time.
    Silent,
}

fn try_open(
    addr: SocketAddr,
    job_magic: u64,
    timeout: Duration,
) -> std::result::Result<TcpStream, OpenError> {
    let by = after(timeout);
    let mut stream = TcpStream::connect_timeout(&addr, timeout.min(Duration::from_secs(5)))
        .map_err(OpenError::Retry)?;
    stream
        .set_nodelay(true)
        .and_then(|()| write_all_by(&mut stream, &wire::hello(job_magic), by))
        .map_err(OpenError::Retry)?;
    // A store answers at once; give up on silence sooner when the caller's time is shorter.
    let wait = timeout.min(HELLO_REPLY_TIMEOUT);
    let reply_by = after(wait);
    let mut reply = [0u8; wire::REPLY_LEN];
    let mut got = 0;
    let ended = loop {
        if got == reply.len() {
            break None;
        }
        match read_by(&mut stream, &mut reply[got..], reply_by) {
            Ok(0) => break Some(ReplyEnd::Closed),
            Ok(n) => {
                got += n;
                if !wire::could_be_reply(&reply[..got]) {
                    break Some(ReplyEnd::Foreign);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::TimedOut => break Some(ReplyEnd::Silent),
            Err(e) => return Err(OpenError::Retry(e)),
        }
    };
    match ended {
        None => {}
        Some(ReplyEnd::Foreign) => {
            let mut seen = reply[..got].to_vec();
            // Quote a little more of what it says, if it says it at once.
            // (One byte past the quote, to tell whether there is more.)
            let _ = read_body(
                &mut stream,
                QUOTE_LEN + 1 - got,
                &mut seen,
                after(Duration::from_millis(50)),
            );
            return Err(OpenError::Fatal(not_a_store(addr, &seen)));
        }
        Some(ReplyEnd::Silent) if wait == HELLO_REPLY_TIMEOUT => {
            return Err(OpenError::Fatal(silent_listener(addr, wait, &reply[..got])));
        }
        // The caller's time ran out before the listener could be judged.
        Some(ReplyEnd::Silent) => {
            return Err(OpenError::Retry(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{addr} accepted the connection but sent no store reply within {wait:?}"),
            )));
        }
        // A store serving as many connections as it may closes new ones without a reply.
        Some(ReplyEnd::Closed) => {
            return Err(OpenError::Retry(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                format!(
                    "{addr} closed the connection after {got} bytes of the {}-byte store reply",
                    wire::REPLY_LEN
                ),
            )));
        }
    }
    match wire::parse_reply(&reply) {
        None => Err(OpenError::Fatal(not_a_store(addr, &reply))),
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

/// `bytes` as printable ASCII (escapes for the rest), at most [`QUOTE_LEN`] of them.
fn quote(bytes: &[u8]) -> String {
    let shown = &bytes[..bytes.len().min(QUOTE_LEN)];
    let more = if bytes.len() > shown.len() { "..." } else { "" };
    format!("\"{}\"{more}", shown.escape_ascii())
}

/// Something at `addr` answered the hello with `seen`, which is no store's reply.
fn not_a_store(addr: SocketAddr, seen: &[u8]) -> Error {
    Error::remote(format!(
        "store at {addr}: {addr} answered, but not as a ferroccl store (it sent {}); \
         is this the ferroccl store's address and port?",
        quote(seen)
    ))
}

/// Something at `addr` accepted the connection and sent only `seen` within `wait`.
fn silent_listener(addr: SocketAddr, wait: Duration, seen: &[u8]) -> Error {
    let sent = if seen.is_empty() {
        "no store reply".to_string()
    } else {
        format!("only {} of a store reply", quote(seen))
    };
    Error::remote(format!(
        "store at {addr}: {addr} accepted the connection but sent {sent} within {:.1} s; \
         is this the ferroccl store's address and port (and is the rank serving it running)?",
        wait.as_secs_f64()
    ))
}

#[cfg(test)]
impl TcpStoreServer {
    /// Bytes of keys and values the server holds.
    fn held_bytes(&self) -> usize {
        self.shared.table.held()
    }

    /// Connections (waiting for their hello, served).
    fn connection_counts(&self) -> (usize, usize) {
        let conns = lock(&self.shared.connections);
        (conns.pending, conns.served)
    }

    /// Connection threads that panicked.
    fn panics(&self) -> usize {
        self.shared.panics.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy as _;
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
        assert_eq!(good.get("k", Duration::ZERO).unwrap(), b"v");
        assert_eq!(good.local_ip(), Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        // Neither a client that does not know the magic (0) nor one with another magic gets in,
        // and both are told at once.
        for magic in [0, 7, 0x1234_5678_9abc_def1] {
            let start = Instant::now();
            let e = TcpStore::connect_with_magic(addr, magic, Duration::from_secs(10)).unwrap_err();
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "{:?}",
                start.elapsed()
            );
            assert_eq!(e.kind(), ErrorKind::InvalidUsage);
            assert!(e.message().contains("another job"), "{e}");
            assert!(e.message().contains(&addr.to_string()), "{e}");
            assert!(e.message().contains(&format!("{magic:#018x}")), "{e}");
        }
        let e = TcpStore::connect(addr, Duration::from_secs(5)).unwrap_err();
        assert!(e.message().contains("another job"), "{e}");
        // The refused ones left nothing behind: the good client alone is served.
        wait_until(Duration::from_secs(2), || {
            server.connection_counts() == (0, 1)
        });
        assert_eq!(good.get("k", Duration::ZERO).unwrap(), b"v");
    }

    #[test]
    fn an_open_server_serves_any_magic() {
        let (server, s) = pair();
        s.set("k", b"v").unwrap();
        for magic in [1, 7, u64::MAX] {
            let c =
                TcpStore::connect_with_magic(server.local_addr(), magic, Duration::from_secs(5))
                    .unwrap();
            assert_eq!(c.get("k", Duration::ZERO).unwrap(), b"v");
        }
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
            server.shared.table.set("ready", b"yes").unwrap();
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

    /// Polls `cond` until it holds; panics after `limit`.
    fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) {
        let start = Instant::now();
        while !cond() {
            assert!(
                start.elapsed() < limit,
                "condition still false after {limit:?}"
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Threads of this process (0 where `/proc` is missing).
    fn process_threads() -> usize {
        std::fs::read_dir("/proc/self/task").map_or(0, Iterator::count)
    }

    fn server_with(magic: u64, limits: Limits) -> TcpStoreServer {
        TcpStoreServer::start(local0(), magic, limits).unwrap()
    }

    /// A listener that accepts every connection and never says anything on it, except that it
    /// answers the first hello as a store would when `genuine_first`. Stops when dropped.
    struct SilentListener {
        addr: SocketAddr,
        stop: Arc<AtomicBool>,
        thread: Option<JoinHandle<()>>,
    }

    impl SilentListener {
        fn start(genuine_first: bool) -> SilentListener {
            let listener = TcpListener::bind(local0()).unwrap();
            let addr = listener.local_addr().unwrap();
            listener.set_nonblocking(true).unwrap();
            let stop = Arc::new(AtomicBool::new(false));
            let thread = thread::spawn({
                let stop = Arc::clone(&stop);
                move || {
                    let mut held = Vec::new();
                    while !stop.load(Ordering::SeqCst) {
                        let Ok((mut s, _)) = listener.accept() else {
                            thread::sleep(Duration::from_millis(5));
                            continue;
                        };
                        s.set_nonblocking(false).unwrap();
                        if genuine_first && held.is_empty() {
                            let mut hello = [0u8; wire::HELLO_LEN];
                            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                            s.read_exact(&mut hello).unwrap();
                            s.write_all(&wire::reply(wire::HELLO_OK)).unwrap();
                        }
                        held.push(s);
                    }
                }
            });
            SilentListener {
                addr,
                stop,
                thread: Some(thread),
            }
        }
    }

    impl Drop for SilentListener {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::SeqCst);
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    /// A reader over a slice, for the frame reader.
    impl TimedRead for &[u8] {
        fn set_wait(&mut self, _: Option<Duration>) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn frame_bodies_grow_with_the_bytes_that_arrive() {
        // A frame announcing 64 MiB followed by 10 bytes and the end of the stream.
        let mut bytes = (64u32 << 20).to_le_bytes().to_vec();
        bytes.extend_from_slice(b"0123456789");
        let mut r = &bytes[..];
        let e = read_frame(&mut r, FrameDeadline::By(None)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let mut body = Vec::new();
        let mut r = &bytes[4..];
        let e = read_body(&mut r, 64 << 20, &mut body, None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(body, b"0123456789");
        assert!(body.capacity() <= 2 * READ_PIECE, "{}", body.capacity());
        // A whole frame in many small reads.
        let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
        let mut framed = (payload.len() as u32).to_le_bytes().to_vec();
        framed.extend_from_slice(&payload);
        let mut r = &framed[..];
        assert_eq!(
            read_frame(&mut r, FrameDeadline::By(None)).unwrap(),
            Some(payload)
        );
        assert_eq!(read_frame(&mut r, FrameDeadline::By(None)).unwrap(), None);
        // A deadline that has passed stops the read.
        let mut r = &framed[..];
        let e = read_frame(&mut r, FrameDeadline::By(Some(Instant::now()))).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        #[test]
        fn decoders_take_any_bytes(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
            op in 0u8..5,
            hello in proptest::prelude::any::<[u8; wire::HELLO_LEN]>(),
            reply in proptest::prelude::any::<[u8; wire::REPLY_LEN]>(),
            header in proptest::prelude::any::<[u8; 4]>(),
        ) {
            // Random bytes, and random bytes behind each opcode (also the valid ones).
            let _ = wire::decode_request(&bytes);
            let mut with_op = vec![op];
            with_op.extend_from_slice(&bytes);
            if let Ok(req) = wire::decode_request(&with_op) {
                // Whatever decodes encodes back to the same bytes.
                let f = wire::encode_request(&req);
                proptest::prop_assert_eq!(&f[4..], &with_op[..]);
            }
            let _ = wire::decode_response(bytes.clone());
            let _ = wire::decode_response(with_op);
            if let Some((version, magic)) = wire::parse_hello(&hello) {
                let mut again = wire::hello(magic);
                again[8..10].copy_from_slice(&version.to_le_bytes());
                proptest::prop_assert_eq!(again, hello);
            }
            if wire::parse_reply(&reply).is_some() {
                proptest::prop_assert!(wire::could_be_reply(&reply));
            }
            match wire::frame_len(header) {
                Some(n) => proptest::prop_assert_eq!(n, u32::from_le_bytes(header) as usize),
                None => proptest::prop_assert!(u32::from_le_bytes(header) as usize > wire::MAX_FRAME),
            }
            // The frame reader on any stream: never more than it announced, nothing past the
            // end.
            let mut r = &bytes[..];
            if let Ok(Some(body)) = read_frame(&mut r, FrameDeadline::By(None)) {
                proptest::prop_assert_eq!(body.len() + 4, bytes.len() - r.len());
            }
        }

        #[test]
        fn requests_and_responses_round_trip(
            key in proptest::collection::vec(proptest::prelude::any::<char>(), 0..=MAX_KEY_LEN / 4)
                .prop_map(|c| c.into_iter().collect::<String>()),
            value in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
            wait_ms in proptest::prelude::any::<u64>(),
            delta in proptest::prelude::any::<i64>(),
            message in ".{0,80}",
            bad_argument in proptest::prelude::any::<bool>(),
        ) {
            proptest::prop_assert!(key.len() <= MAX_KEY_LEN);
            for req in [
                Request::Set { key: &key, value: &value },
                Request::Get { key: &key, wait_ms },
                Request::Add { key: &key, delta },
            ] {
                let f = wire::encode_request(&req);
                let len = wire::frame_len([f[0], f[1], f[2], f[3]]);
                proptest::prop_assert_eq!(len, Some(f.len() - 4));
                proptest::prop_assert_eq!(wire::decode_request(&f[4..]), Ok(req));
            }
            for resp in [
                Response::Done(value.clone()),
                Response::TimedOut,
                Response::Failed { bad_argument, message: message.clone() },
                Response::Closing,
            ] {
                let f = wire::encode_response(&resp);
                let mut r = &f[..];
                let body = read_frame(&mut r, FrameDeadline::By(None)).unwrap().unwrap();
                proptest::prop_assert_eq!(wire::decode_response(body), Ok(resp));
            }
        }
    }

    #[test]
    fn longest_key_round_trips_and_one_more_byte_does_not() {
        let key = "\u{1F600}".repeat(MAX_KEY_LEN / 4);
        assert_eq!(key.len(), MAX_KEY_LEN);
        let f = wire::encode_request(&Request::Get {
            key: &key,
            wait_ms: 1,
        });
        assert_eq!(
            wire::decode_request(&f[4..]),
            Ok(Request::Get {
                key: &key,
                wait_ms: 1
            })
        );
        let longer = format!("{key}x");
        let f = wire::encode_request(&Request::Get {
            key: &longer,
            wait_ms: 1,
        });
        assert!(wire::decode_request(&f[4..]).is_err());
    }

    #[test]
    fn random_strangers_never_disturb_a_client() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRunner};

        let server = TcpStoreServer::bind(local0()).unwrap();
        let addr = server.local_addr();
        let client = TcpStore::connect(addr, Duration::from_secs(5)).unwrap();
        // A stranger: a hello or not, some frames with a random opcode and body (so that
        // requests get decoded), then random bytes.
        let frames = proptest::collection::vec(
            (0u8..5, proptest::collection::vec(any::<u8>(), 0..40)),
            0..4,
        );
        let stranger = (
            any::<bool>(),
            frames,
            proptest::collection::vec(any::<u8>(), 0..64),
        );
        let case = std::cell::Cell::new(0i64);
        let mut runner = TestRunner::new(Config {
            cases: 32,
            failure_persistence: None,
            ..Config::default()
        });
        runner
            .run(&proptest::collection::vec(stranger, 1..4), |strangers| {
                let n = case.get() + 1;
                case.set(n);
                let mut socks = Vec::new();
                for (hello, frames, tail) in &strangers {
                    let mut bytes = Vec::new();
                    if *hello {
                        bytes.extend_from_slice(&wire::hello(0));
                    }
                    for (op, body) in frames {
                        bytes.extend_from_slice(&(body.len() as u32 + 1).to_le_bytes());
                        bytes.push(*op);
                        bytes.extend_from_slice(body);
                    }
                    bytes.extend_from_slice(tail);
                    let mut s = TcpStream::connect(addr).unwrap();
                    // The server may have closed it already: that is its right.
                    let _ = s.write_all(&bytes);
                    socks.push(s);
                }
                let key = format!("real/client/{n}");
                client.set(&key, n.to_string().as_bytes()).unwrap();
                prop_assert_eq!(
                    client.get(&key, Duration::ZERO).unwrap(),
                    n.to_string().into_bytes()
                );
                prop_assert_eq!(client.add("real/client/count", 1).unwrap(), n);
                Ok(())
            })
            .unwrap();
        assert_eq!(server.panics(), 0);
        assert!(!server.accept_thread.as_ref().unwrap().is_finished());
        // Every stranger is gone (they closed), and a new client is served.
        wait_until(Duration::from_secs(3), || server.connection_counts().0 == 0);
        let late = TcpStore::connect(addr, Duration::from_secs(5)).unwrap();
        assert_eq!(late.add("real/client/count", 0).unwrap(), case.get());
    }

    #[test]
    fn the_store_stops_growing_at_its_byte_limit() {
        const LIMIT: usize = 4 << 20;
        let server = server_with(
            0,
            Limits {
                store_bytes: LIMIT,
                ..Limits::DEFAULT
            },
        );
        let s = TcpStore::connect(server.local_addr(), Duration::from_secs(5)).unwrap();
        let value = vec![7u8; 1 << 20];
        let mut stored = 0;
        for i in 0..16 {
            match s.set(&format!("big{i:02}"), &value) {
                Ok(()) => stored += 1,
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::InvalidUsage);
                    assert!(e.message().contains(&format!("'big{i:02}'")), "{e}");
                    assert!(
                        e.message().contains(&format!(
                            "store full: {} bytes held, at most {LIMIT}",
                            3 * ((1 << 20) + 5)
                        )),
                        "{e}"
                    );
                }
            }
            assert!(server.held_bytes() <= LIMIT);
        }
        // 3 x (1 MiB + 5) fits in 4 MiB, a fourth does not.
        assert_eq!(stored, 3);
        assert_eq!(server.held_bytes(), 3 * ((1 << 20) + 5));
        // The connection is still usable; small things and replacements still fit.
        s.set("small", b"x").unwrap();
        assert_eq!(s.get("small", Duration::ZERO).unwrap(), b"x");
        assert_eq!(s.add("n", 2).unwrap(), 2);
        s.set("big00", &value).unwrap();
        assert_eq!(s.get("big00", Duration::ZERO).unwrap(), value);
        assert_eq!(server.held_bytes(), 3 * ((1 << 20) + 5) + 6 + 2);
        // The cap a real server uses.
        assert_eq!(Limits::DEFAULT.store_bytes, MAX_STORE_BYTES);
    }

    #[test]
    fn silent_strangers_hold_few_threads_and_clients_carry_on() {
        const CAP: usize = 16;
        const SILENT: usize = 200;
        // Other tests running at the same time may start threads too.
        const SLACK: usize = 80;
        let hello_timeout = Duration::from_millis(600);
        let server = server_with(
            0x77,
            Limits {
                pending_hellos: CAP,
                hello_timeout,
                ..Limits::DEFAULT
            },
        );
        let addr = server.local_addr();
        let client = TcpStore::connect_with_magic(addr, 0x77, Duration::from_secs(5)).unwrap();
        client.set("k", b"v").unwrap();
        let before = process_threads();
        let silent: Vec<TcpStream> = (0..SILENT)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        thread::sleep(Duration::from_millis(100));
        let (pending, served) = server.connection_counts();
        assert!(pending <= CAP, "{pending} pending hellos");
        assert_eq!(served, 1);
        let during = process_threads();
        assert!(
            during <= before + CAP + SLACK,
            "{before} threads before {SILENT} silent connections, {during} with them"
        );
        // The client is answered at once meanwhile.
        let start = Instant::now();
        client.set("k2", b"v2").unwrap();
        assert_eq!(client.get("k", Duration::ZERO).unwrap(), b"v");
        assert_eq!(client.add("n", 1).unwrap(), 1);
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
        // A new rank gets in, at the latest once the silent ones have run out of time.
        let start = Instant::now();
        let late = TcpStore::connect_with_magic(addr, 0x77, Duration::from_secs(5)).unwrap();
        assert!(
            start.elapsed() < hello_timeout + Duration::from_millis(1500),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(late.get("k2", Duration::ZERO).unwrap(), b"v2");
        // The server closed every silent connection (at once, or after the hello timeout).
        for mut s in silent {
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            match s.read(&mut [0u8; 16]) {
                Ok(0) => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
                other => panic!("a silent connection still open: {other:?}"),
            }
        }
        wait_until(Duration::from_secs(2), || {
            server.connection_counts() == (0, 2)
        });
    }

    #[test]
    fn a_frame_announced_but_not_sent_is_dropped_after_the_frame_timeout() {
        let frame_timeout = Duration::from_millis(300);
        let server = server_with(
            0,
            Limits {
                frame_timeout,
                ..Limits::DEFAULT
            },
        );
        let addr = server.local_addr();
        let client = TcpStore::connect(addr, Duration::from_secs(5)).unwrap();
        let greet = |s: &mut TcpStream| {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(&wire::hello(0)).unwrap();
            let mut reply = [0u8; wire::REPLY_LEN];
            s.read_exact(&mut reply).unwrap();
            assert_eq!(wire::parse_reply(&reply), Some((PROTOCOL_VERSION, 0)));
        };
        // A frame header announcing 64 MiB, and nothing more.
        let mut liar = TcpStream::connect(addr).unwrap();
        greet(&mut liar);
        let start = Instant::now();
        liar.write_all(&((64u32 << 20) + 1).to_le_bytes()).unwrap();
        let mut rest = Vec::new();
        let n = liar.read_to_end(&mut rest).map(|_| rest.len());
        let took = start.elapsed();
        assert!(matches!(n, Ok(0)) || n.is_err(), "{n:?}");
        assert!(
            took >= frame_timeout - Duration::from_millis(50),
            "{took:?}"
        );
        assert!(took < Duration::from_secs(2), "{took:?}");
        // A frame trickling in a byte at a time is dropped at the same deadline, although
        // bytes keep coming.
        let mut slow = TcpStream::connect(addr).unwrap();
        greet(&mut slow);
        let start = Instant::now();
        let mut frame = wire::encode_request(&Request::Set {
            key: "slow",
            value: &[1; 100],
        });
        let closed = loop {
            if frame.is_empty() {
                break false;
            }
            if slow.write_all(&frame[..1]).is_err() {
                break true;
            }
            frame.remove(0);
            thread::sleep(Duration::from_millis(40));
            slow.set_read_timeout(Some(Duration::from_millis(1)))
                .unwrap();
            match slow.read(&mut [0u8; 16]) {
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                _ => break true,
            }
        };
        let took = start.elapsed();
        assert!(closed, "the trickling frame was served");
        assert!(
            took >= frame_timeout - Duration::from_millis(50),
            "{took:?}"
        );
        assert!(took < Duration::from_secs(2), "{took:?}");
        // The real client, idle all along, is still connected and served.
        wait_until(Duration::from_secs(2), || {
            server.connection_counts() == (0, 1)
        });
        client.set("k", b"v").unwrap();
        assert_eq!(client.get("k", Duration::ZERO).unwrap(), b"v");
    }

    #[test]
    fn idle_connections_outlive_the_frame_timeout() {
        let server = server_with(
            0,
            Limits {
                frame_timeout: Duration::from_millis(100),
                ..Limits::DEFAULT
            },
        );
        let s = TcpStore::connect(server.local_addr(), Duration::from_secs(5)).unwrap();
        s.set("k", b"v").unwrap();
        thread::sleep(Duration::from_millis(400));
        assert_eq!(server.connection_counts(), (0, 1));
        // The same connection serves the next request (a lost one would fail it).
        assert_eq!(s.get("k", Duration::ZERO).unwrap(), b"v");
        assert_eq!(server.connection_counts(), (0, 1));
    }

    #[test]
    fn connections_past_the_cap_are_retried_until_a_place_frees() {
        let server = server_with(
            9,
            Limits {
                connections: 2,
                ..Limits::DEFAULT
            },
        );
        let addr = server.local_addr();
        let a = TcpStore::connect_with_magic(addr, 9, Duration::from_secs(5)).unwrap();
        let b = TcpStore::connect_with_magic(addr, 9, Duration::from_secs(5)).unwrap();
        let start = Instant::now();
        let e = TcpStore::connect_with_magic(addr, 9, Duration::from_millis(500)).unwrap_err();
        assert!(start.elapsed() >= Duration::from_millis(500));
        assert_eq!(e.kind(), ErrorKind::Timeout);
        assert!(
            e.message().contains("closed the connection after 0 bytes"),
            "{e}"
        );
        wait_until(Duration::from_secs(2), || {
            server.connection_counts() == (0, 2)
        });
        drop(a);
        let c = TcpStore::connect_with_magic(addr, 9, Duration::from_secs(5)).unwrap();
        c.set("k", b"c").unwrap();
        assert_eq!(b.get("k", Duration::ZERO).unwrap(), b"c");
    }

    #[test]
    fn set_timeout_gives_up_in_time_on_a_silent_store() {
        let fake = SilentListener::start(true);
        let s = TcpStore::connect(fake.addr, Duration::from_secs(5)).unwrap();
        assert_eq!(s.request_timeout(), DEFAULT_REQUEST_TIMEOUT);
        // On the open connection: the request goes out and no answer comes.
        let start = Instant::now();
        let e = s
            .set_timeout("failure/3", b"why", Duration::from_millis(400))
            .unwrap_err();
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(400), "{took:?}");
        assert!(took < Duration::from_millis(1400), "{took:?}");
        assert_eq!(e.kind(), ErrorKind::Timeout);
        assert!(e.message().contains("'failure/3'"), "{e}");
        assert!(e.message().contains(&fake.addr.to_string()), "{e}");
        // That connection is gone; set and add now reconnect within the request timeout
        // (the listener accepts, but never replies to the hello).
        s.set_request_timeout(Duration::from_millis(300));
        assert_eq!(s.request_timeout(), Duration::from_millis(300));
        for op in ["set", "add"] {
            let start = Instant::now();
            let e = if op == "set" {
                s.set("k", b"v").unwrap_err()
            } else {
                s.add("n", 1).unwrap_err()
            };
            let took = start.elapsed();
            assert!(took >= Duration::from_millis(300), "{op}: {took:?}");
            assert!(took < Duration::from_millis(1300), "{op}: {took:?}");
            assert_eq!(e.kind(), ErrorKind::Timeout, "{op}: {e}");
            assert!(e.message().contains("cannot connect"), "{e}");
        }
        // The trait's default, for local stores, just sets.
        let m = super::super::MemoryStore::new();
        m.set_timeout("k", b"v", Duration::ZERO).unwrap();
        assert_eq!(m.get("k", Duration::ZERO).unwrap(), b"v");
    }

    #[test]
    fn an_http_server_is_named_at_once() {
        let fake = TcpListener::bind(local0()).unwrap();
        let addr = fake.local_addr().unwrap();
        let t = thread::spawn(move || {
            let (mut s, _) = fake.accept().unwrap();
            let mut hello = [0u8; wire::HELLO_LEN];
            s.read_exact(&mut hello).unwrap();
            s.write_all(
                b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            )
            .unwrap();
            // Keep it open a while: the client must not wait for more.
            thread::sleep(Duration::from_millis(600));
        });
        let start = Instant::now();
        let e = TcpStore::connect(addr, Duration::from_secs(10)).unwrap_err();
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(e.kind(), ErrorKind::Remote);
        let m = e.message();
        assert!(
            m.starts_with(&format!(
                "store at {addr}: {addr} answered, but not as a ferroccl store (it sent \"HTTP/1.1 400 Bad Request\\r\\n"
            )),
            "{e}"
        );
        assert!(m.contains("...)"), "{e}");
        assert!(
            m.contains("is this the ferroccl store's address and port?"),
            "{e}"
        );
        t.join().unwrap();
        assert_eq!(quote(b"\x00\xffA"), "\"\\x00\\xffA\"");
        assert_eq!(
            quote(&[b'a'; QUOTE_LEN + 1]),
            format!("\"{}\"...", "a".repeat(QUOTE_LEN))
        );
    }

    #[test]
    fn a_silent_listener_is_named_after_the_reply_timeout() {
        let fake = SilentListener::start(false);
        let start = Instant::now();
        let e = TcpStore::connect(fake.addr, Duration::from_secs(10)).unwrap_err();
        let took = start.elapsed();
        // Not retried for the whole 10 s.
        assert!(took >= HELLO_REPLY_TIMEOUT, "{took:?}");
        assert!(
            took < HELLO_REPLY_TIMEOUT + Duration::from_secs(1),
            "{took:?}"
        );
        assert_eq!(e.kind(), ErrorKind::Remote);
        let addr = fake.addr;
        assert!(
            e.message().starts_with(&format!(
                "store at {addr}: {addr} accepted the connection but sent no store reply within 2.0 s; \
                 is this the ferroccl store's address and port"
            )),
            "{e}"
        );
        // Given less time than it takes to judge, it is a timeout, named as such.
        let e = TcpStore::connect(fake.addr, Duration::from_millis(200)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout);
        assert!(e.message().contains("sent no store reply"), "{e}");
    }
}
