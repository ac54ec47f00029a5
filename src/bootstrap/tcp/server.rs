//! The store's server: the listener, one thread per connection, the limits.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crate::bootstrap::memory::{Table, WaitError};
use crate::{Error, ErrorKind, Result};

use super::*;

/// Locks `m`; the guarded data stay consistent across a panic (stated at each use).
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The server's open connections, so that dropping the server can shut them down.
#[derive(Debug, Default)]
pub(super) struct Connections {
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
pub(super) struct Shared {
    pub(super) table: Table,
    /// Clients must present exactly this magic in their hello (0: any).
    pub(super) job_magic: u64,
    pub(super) limits: Limits,
    pub(super) stop: AtomicBool,
    /// Each change is a single insert, remove or count step, so a panic cannot leave it
    /// half-updated.
    pub(super) connections: Mutex<Connections>,
    /// Connection threads that panicked (each ended only its own connection).
    pub(super) panics: AtomicUsize,
}

/// A TCP store server; it serves on background threads until dropped.
///
/// Dropping it closes every connection (waiting clients get a `Remote` error) and joins its
/// threads. See the module docs for the bounds it enforces.
pub struct TcpStoreServer {
    pub(super) local_addr: SocketAddr,
    pub(super) shared: Arc<Shared>,
    pub(super) accept_thread: Option<JoinHandle<()>>,
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
    /// [`UniqueId::create`](crate::bootstrap::UniqueId::create) does).
    pub fn bind(addr: SocketAddr) -> Result<TcpStoreServer> {
        Self::bind_with_magic(addr, 0)
    }

    /// Starts a server that serves only clients presenting exactly `job_magic` (0: any, as
    /// [`bind`](Self::bind)). Others, a rank of another job that reaches this port by mistake
    /// (with a stale [`UniqueId`](crate::bootstrap::UniqueId)) or a client presenting 0, are told that
    /// the store belongs to another job and fail at once.
    pub fn bind_with_magic(addr: SocketAddr, job_magic: u64) -> Result<TcpStoreServer> {
        Self::start(addr, job_magic, Limits::DEFAULT)
    }

    pub(super) fn start(
        addr: SocketAddr,
        job_magic: u64,
        limits: Limits,
    ) -> Result<TcpStoreServer> {
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
pub(super) fn reachable_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        other => other,
    }
}

pub(super) fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
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
pub(super) struct Slot<'a> {
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

pub(super) fn serve_connection(
    mut stream: TcpStream,
    shared: &Shared,
    slot: &mut Slot<'_>,
) -> io::Result<()> {
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
pub(super) fn respond(table: &Table, request: Request<'_>) -> Response {
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

#[cfg(test)]
impl TcpStoreServer {
    /// Bytes of keys and values the server holds.
    pub(super) fn held_bytes(&self) -> usize {
        self.shared.table.held()
    }

    /// Connections (waiting for their hello, served).
    pub(super) fn connection_counts(&self) -> (usize, usize) {
        let conns = lock(&self.shared.connections);
        (conns.pending, conns.served)
    }

    /// Connection threads that panicked.
    pub(super) fn panics(&self) -> usize {
        self.shared.panics.load(Ordering::Relaxed)
    }
}
