//! The store's client: connecting (with the hello and its answers), requests, reconnecting.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread::{self};
use std::time::{Duration, Instant};

use crate::bootstrap::Store;
use crate::{Error, ErrorKind, Result};

use super::*;

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
    /// [`UniqueId`](crate::bootstrap::UniqueId)) to a server that checks it.
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
pub(super) fn millis(d: Duration) -> u64 {
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
pub(super) fn open(addr: SocketAddr, job_magic: u64, timeout: Duration) -> Result<TcpStream> {
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

pub(super) enum OpenError {
    /// Nobody listens yet, the store turned us away for now, or the connection broke: try
    /// again.
    Retry(io::Error),
    /// Something listens but is not a store we can use.
    Fatal(Error),
}

/// Why reading a store's hello reply stopped early.
pub(super) enum ReplyEnd {
    /// The other side closed the connection.
    Closed,
    /// The bytes so far are not the start of a store's reply.
    Foreign,
    /// Nothing more came in time.
    Silent,
}

pub(super) fn try_open(
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
pub(super) fn quote(bytes: &[u8]) -> String {
    let shown = &bytes[..bytes.len().min(QUOTE_LEN)];
    let more = if bytes.len() > shown.len() { "..." } else { "" };
    format!("\"{}\"{more}", shown.escape_ascii())
}

/// Something at `addr` answered the hello with `seen`, which is no store's reply.
pub(super) fn not_a_store(addr: SocketAddr, seen: &[u8]) -> Error {
    Error::remote(format!(
        "store at {addr}: {addr} answered, but not as a ferroccl store (it sent {}); \
         is this the ferroccl store's address and port?",
        quote(seen)
    ))
}

/// Something at `addr` accepted the connection and sent only `seen` within `wait`.
pub(super) fn silent_listener(addr: SocketAddr, wait: Duration, seen: &[u8]) -> Error {
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
