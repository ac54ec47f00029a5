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

mod wire;

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
mod tests;
