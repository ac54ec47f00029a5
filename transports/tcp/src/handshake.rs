//! Accepting and opening sockets: the handshake that names the communicator, the ranks and the
//! stream, and the acknowledgement that admits a socket.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use ferroccl_transport::{Error, ErrorKind, PeerInfo, Result, MAX_PARTS};

use crate::conn::{recv_some, send_some, Io, TcpConnection};
use crate::{set_options, sys, TcpConfig};

const HELLO_MAGIC: u32 = 0x5348_5246; // "FRHS"
const HELLO_VERSION: u16 = 1;
pub(crate) const HELLO_LEN: usize = 32;
const ACK_OK: u32 = 0x4b4f_5246; // "FROK"
/// How long an accepted socket may take to send its handshake before it is dropped.
const STRANGER_PATIENCE: Duration = Duration::from_secs(5);

/// The first bytes on every socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hello {
    pub(crate) comm_id: u64,
    pub(crate) from: u32,
    pub(crate) to: u32,
    pub(crate) stream: u16,
    pub(crate) nstreams: u16,
}

impl Hello {
    pub(crate) fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&HELLO_VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&self.nstreams.to_le_bytes());
        b[8..16].copy_from_slice(&self.comm_id.to_le_bytes());
        b[16..20].copy_from_slice(&self.from.to_le_bytes());
        b[20..24].copy_from_slice(&self.to.to_le_bytes());
        b[24..26].copy_from_slice(&self.stream.to_le_bytes());
        b
    }

    fn decode(b: &[u8; HELLO_LEN]) -> std::result::Result<Hello, String> {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if u32_at(0) != HELLO_MAGIC {
            return Err(format!("bad magic {:#010x}", u32_at(0)));
        }
        if u16_at(4) != HELLO_VERSION {
            return Err(format!(
                "protocol version {} (expected {HELLO_VERSION})",
                u16_at(4)
            ));
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&b[8..16]);
        Ok(Hello {
            nstreams: u16_at(6),
            comm_id: u64::from_le_bytes(id),
            from: u32_at(16),
            to: u32_at(20),
            stream: u16_at(24),
        })
    }
}

/// A listening socket that peers connect to.
#[derive(Debug)]
pub struct TcpEndpoint {
    listener: TcpListener,
    addr: SocketAddr,
}

impl TcpEndpoint {
    /// Listens on `ip` at a port the kernel picks.
    pub fn listen(ip: IpAddr) -> Result<TcpEndpoint> {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))
            .map_err(|e| sys(format_args!("binding a TCP listener on {ip}"), &e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| sys("reading the listener's address", &e))?;
        Ok(TcpEndpoint { listener, addr })
    }

    /// The address peers connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Accepts `cfg.nstreams` sockets from each rank in `peers`, checking every handshake against
    /// `comm_id` and `my_rank`. Sockets that fail the check are dropped and accepting goes on.
    /// Fails with a `Timeout` naming the missing ranks if `deadline` passes first.
    ///
    /// Accepted sockets wait, without blocking, in a list of at most 64 until their whole
    /// handshake is in, so a silent or slow stranger never delays a peer: each handshake is
    /// checked as soon as its last byte arrives. A socket is dropped when it sends a wrong
    /// handshake, when it has not sent all of it within 5 s, or when it is the oldest in a full
    /// list.
    pub fn accept(
        &self,
        my_rank: usize,
        comm_id: u64,
        peers: &[usize],
        cfg: &TcpConfig,
        deadline: Instant,
    ) -> Result<Vec<TcpConnection>> {
        let n = cfg.nstreams;
        self.listener
            .set_nonblocking(true)
            .map_err(|e| sys("making the listener non-blocking", &e))?;
        let mut acc = Accepting {
            my_rank,
            comm_id,
            peers,
            cfg,
            slots: peers
                .iter()
                .map(|_| std::iter::repeat_with(|| None).take(n).collect())
                .collect(),
            addrs: vec![String::new(); peers.len()],
            missing: peers.len() * n,
            dropped: 0,
        };
        let mut pending: Vec<Unidentified> = Vec::new();
        let mut pfds: Vec<libc::pollfd> = Vec::new();
        while acc.missing > 0 {
            // New sockets, a bounded number per round so that reading gets its turn in a flood.
            for _ in 0..MAX_UNIDENTIFIED {
                let (stream, from) = match self.listener.accept() {
                    Ok(x) => x,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::Interrupted
                        ) =>
                    {
                        continue
                    }
                    Err(e) => return Err(sys(format_args!("accepting on {}", self.addr), &e)),
                };
                if pending.len() >= MAX_UNIDENTIFIED {
                    let old = pending.remove(0);
                    acc.reject(
                        &old.from,
                        &format!(
                            "the oldest of more than {MAX_UNIDENTIFIED} connections waiting for \
                             a handshake ({} of {HELLO_LEN} bytes in after {} ms)",
                            old.got,
                            old.since.elapsed().as_millis()
                        ),
                    );
                }
                // Most peers' handshakes are in by now: read at once, before a flood can push
                // the socket out of the list.
                let mut u = Unidentified::new(stream, from);
                let heard = u.read();
                if let Some(u) = acc.heard(u, heard)? {
                    pending.push(u);
                }
            }
            // Sockets that poll found readable.
            let mut i = 0;
            while i < pending.len() {
                if !pending[i].readable {
                    i += 1;
                    continue;
                }
                pending[i].readable = false;
                let heard = pending[i].read();
                if matches!(heard, Heard::Waiting) {
                    i += 1;
                    continue;
                }
                let u = pending.remove(i);
                acc.heard(u, heard)?;
            }
            if acc.missing == 0 {
                break;
            }
            let now = Instant::now();
            pending.retain(|u| {
                let expired = now.duration_since(u.since) >= STRANGER_PATIENCE;
                if expired {
                    acc.reject(
                        &u.from,
                        &format!(
                            "only {} of {HELLO_LEN} handshake bytes in {} ms",
                            u.got,
                            STRANGER_PATIENCE.as_millis()
                        ),
                    );
                }
                !expired
            });
            if now >= deadline {
                return Err(acc.timeout(self.addr, pending.len()));
            }
            // Sleep until the listener or a waiting socket has something, a waiting socket runs
            // out of patience, or the deadline.
            let mut wake = deadline.min(now + ACCEPT_POLL_CAP);
            if let Some(first) = pending.iter().map(|u| u.since).min() {
                wake = wake.min(first + STRANGER_PATIENCE);
            }
            pfds.clear();
            pfds.push(libc::pollfd {
                fd: self.listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            pfds.extend(pending.iter().map(|u| libc::pollfd {
                fd: u.stream.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }));
            let ms = wake
                .saturating_duration_since(now)
                .as_micros()
                .div_ceil(1000);
            let ms = libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX);
            // SAFETY: `pfds` is a live, writable array of `pfds.len()` pollfd entries, each naming
            // a descriptor owned by the listener or by a socket in `pending`.
            let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
            if rc < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(sys(
                        format_args!("rank {my_rank}: waiting for connections on {}", self.addr),
                        &e,
                    ));
                }
            }
            for (u, p) in pending.iter_mut().zip(&pfds[1..]) {
                u.readable = p.revents != 0;
            }
        }
        let mut out = Vec::with_capacity(peers.len());
        for ((&p, s), addr) in peers.iter().zip(acc.slots).zip(acc.addrs) {
            let streams: Vec<TcpStream> = s.into_iter().flatten().collect();
            out.push(TcpConnection::new(
                PeerInfo { rank: p, addr },
                streams,
                *cfg,
            ));
        }
        Ok(out)
    }
}

/// Most accepted sockets that may wait at once to send their handshake; when one more comes, the
/// oldest is dropped, so a flood of connections cannot use up descriptors.
pub(crate) const MAX_UNIDENTIFIED: usize = 64;
/// Longest single sleep of [`TcpEndpoint::accept`] before it looks at the clock again.
const ACCEPT_POLL_CAP: Duration = Duration::from_millis(50);

/// What one [`TcpEndpoint::accept`] has so far.
struct Accepting<'a> {
    my_rank: usize,
    comm_id: u64,
    peers: &'a [usize],
    cfg: &'a TcpConfig,
    /// `slots[i][s]`: stream `s` of `peers[i]`, once its handshake has been acknowledged.
    slots: Vec<Vec<Option<TcpStream>>>,
    /// The address each peer's sockets came from.
    addrs: Vec<String>,
    /// Empty slots.
    missing: usize,
    /// Sockets dropped so far (wrong, incomplete or late handshakes).
    dropped: usize,
}

impl Accepting<'_> {
    fn reject(&mut self, from: &SocketAddr, why: &str) {
        self.dropped += 1;
        log_reject(self.my_rank, from, why);
    }

    /// Acts on what a socket sent: returns it while its handshake is incomplete, drops it when
    /// the handshake is wrong, and acknowledges it and fills its slot when it is right.
    fn heard(&mut self, u: Unidentified, heard: Heard) -> Result<Option<Unidentified>> {
        let hello = match heard {
            Heard::Waiting => return Ok(Some(u)),
            Heard::Gone(why) => {
                self.reject(&u.from, &why);
                return Ok(None);
            }
            Heard::Hello(h) => h,
        };
        let (i, s) = match self.place(&hello) {
            Ok(x) => x,
            Err(why) => {
                self.reject(&u.from, &why);
                return Ok(None);
            }
        };
        if let Err(e) = send_small(u.stream.as_raw_fd(), &ack_bytes()) {
            self.reject(
                &u.from,
                &format!("sending the acknowledgement to rank {}: {e}", hello.from),
            );
            return Ok(None);
        }
        u.stream
            .set_nonblocking(false)
            .map_err(|e| sys("making an accepted socket blocking", &e))?;
        set_options(&u.stream, self.cfg)?;
        self.addrs[i] = u.from.to_string();
        self.slots[i][s] = Some(u.stream);
        self.missing -= 1;
        Ok(None)
    }

    /// The (peer index, stream) slot a handshake fills, or why it fills none.
    fn place(&self, hello: &Hello) -> std::result::Result<(usize, usize), String> {
        let n = self.cfg.nstreams;
        let idx = self.peers.iter().position(|&p| p == hello.from as usize);
        if hello.comm_id != self.comm_id {
            return Err(format!(
                "communicator id {:#018x} is not ours ({:#018x})",
                hello.comm_id, self.comm_id
            ));
        }
        if hello.to as usize != self.my_rank {
            return Err(format!("it asked for rank {}", hello.to));
        }
        let Some(i) = idx else {
            return Err(format!("rank {} is not expected here", hello.from));
        };
        if usize::from(hello.nstreams) != n || usize::from(hello.stream) >= n {
            return Err(format!(
                "stream {} of {} does not match {n} streams",
                hello.stream, hello.nstreams
            ));
        }
        let s = usize::from(hello.stream);
        if self.slots[i][s].is_some() {
            return Err(format!(
                "duplicate stream {s} from rank {} (already connected from {})",
                hello.from, self.addrs[i]
            ));
        }
        Ok((i, s))
    }

    fn timeout(&self, addr: SocketAddr, waiting: usize) -> Error {
        let n = self.cfg.nstreams;
        let missing: Vec<String> = self
            .peers
            .iter()
            .zip(&self.slots)
            .filter_map(|(p, s)| {
                let got = s.iter().filter(|x| x.is_some()).count();
                match got {
                    _ if got == n => None,
                    0 => Some(p.to_string()),
                    _ => Some(format!("{p} ({got} of {n} streams)")),
                }
            })
            .collect();
        let mut msg = format!(
            "rank {}: no connection from rank(s) {} at {addr} before the deadline",
            self.my_rank,
            missing.join(", ")
        );
        if self.dropped > 0 || waiting > 0 {
            msg.push_str(&format!(
                " ({} other connection(s) dropped for a wrong or missing handshake, {waiting} \
                 still without one; FERRO_DEBUG logs each)",
                self.dropped
            ));
        }
        Error::timeout(msg)
    }
}

/// An accepted socket whose handshake is not all in yet.
struct Unidentified {
    stream: TcpStream,
    from: SocketAddr,
    since: Instant,
    hello: [u8; HELLO_LEN],
    /// Handshake bytes in `hello`.
    got: usize,
    /// The last poll found it readable: `read` has something to do.
    readable: bool,
}

/// What an accepted socket has sent so far.
enum Heard {
    /// Part of the handshake, or nothing yet.
    Waiting,
    /// It closed, failed or sent bytes that are no handshake: the reason.
    Gone(String),
    /// A whole, well-formed handshake (not yet checked against this communicator).
    Hello(Hello),
}

impl Unidentified {
    fn new(stream: TcpStream, from: SocketAddr) -> Self {
        Unidentified {
            stream,
            from,
            since: Instant::now(),
            hello: [0; HELLO_LEN],
            got: 0,
            readable: false,
        }
    }

    /// Reads what has arrived of the handshake without blocking (`MSG_DONTWAIT`, whatever the
    /// socket's mode), never past its end, so that nothing a peer sends after it is lost.
    fn read(&mut self) -> Heard {
        let fd = self.stream.as_raw_fd();
        while self.got < HELLO_LEN {
            match recv_some(fd, &mut self.hello[self.got..]) {
                Ok(Io::Moved(k)) => self.got += k,
                Ok(Io::WouldBlock) => return Heard::Waiting,
                Ok(Io::Closed) => {
                    return Heard::Gone(format!(
                        "it closed after {} of {HELLO_LEN} handshake bytes",
                        self.got
                    ))
                }
                Err(e) => return Heard::Gone(format!("reading its handshake: {e}")),
            }
            // A stranger speaking another protocol is known by its first bytes.
            let k = self.got.min(4);
            if self.hello[..k] != HELLO_MAGIC.to_le_bytes()[..k] {
                return Heard::Gone(format!(
                    "bad magic: it began with {:02x?}",
                    &self.hello[..self.got]
                ));
            }
        }
        match Hello::decode(&self.hello) {
            Ok(h) => Heard::Hello(h),
            Err(why) => Heard::Gone(why),
        }
    }
}

pub(crate) fn ack_bytes() -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0..4].copy_from_slice(&ACK_OK.to_le_bytes());
    b
}

/// Sends a few bytes that fit a fresh socket's buffer in one call, without raising SIGPIPE in a
/// host program that has not ignored it.
fn send_small(fd: i32, b: &[u8]) -> std::io::Result<()> {
    // A fresh socket's buffer takes these bytes at once; retries cover interrupted calls only.
    for _ in 0..100 {
        match send_some(fd, &[b])? {
            Io::Moved(k) if k == b.len() => return Ok(()),
            Io::Moved(k) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::WriteZero,
                    format!("only {k} of {} bytes went out", b.len()),
                ))
            }
            Io::Closed => return Err(std::io::ErrorKind::BrokenPipe.into()),
            Io::WouldBlock => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    Err(std::io::ErrorKind::WouldBlock.into())
}

fn log_reject(my_rank: usize, from: &SocketAddr, why: &str) {
    if std::env::var_os("FERRO_DEBUG").is_some() {
        // One write per line, so that lines of ranks sharing stderr do not interleave.
        let line =
            format!("ferroccl rank {my_rank} NET: rejected a connection from {from}: {why}\n");
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}

/// Connects to rank `peer` at `addr` with `cfg.nstreams` sockets, retrying refused connections
/// until `deadline` (the peer may not be listening yet).
pub fn connect(
    my_rank: usize,
    comm_id: u64,
    peer: usize,
    addr: SocketAddr,
    cfg: &TcpConfig,
    deadline: Instant,
) -> Result<TcpConnection> {
    let info = PeerInfo {
        rank: peer,
        addr: addr.to_string(),
    };
    let n = cfg.nstreams.clamp(1, MAX_PARTS);
    let mut streams = Vec::with_capacity(n);
    for i in 0..n {
        let mut s = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match TcpStream::connect_timeout(&addr, left.max(Duration::from_millis(10))) {
                Ok(s) => break s,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    return Err(Error::new(
                        ErrorKind::Remote,
                        format!("rank {my_rank}: cannot connect to {info}: {e}"),
                    ))
                }
            }
        };
        let hello = Hello {
            comm_id,
            from: my_rank as u32,
            to: peer as u32,
            stream: i as u16,
            nstreams: n as u16,
        };
        let asked = Instant::now();
        let left = deadline.saturating_duration_since(asked);
        s.set_read_timeout(Some(left.max(Duration::from_millis(10))))
            .map_err(|e| sys("setting a read timeout", &e))?;
        send_small(s.as_raw_fd(), &hello.encode()).map_err(|e| {
            Error::remote(format!(
                "rank {my_rank}: sending the handshake (stream {i} of {n}) to {info}: {e}"
            ))
        })?;
        let mut ack = [0u8; 8];
        if let Err(e) = s.read_exact(&mut ack) {
            return Err(no_ack(my_rank, comm_id, &info, (i, n), asked, &e));
        }
        if ack != ack_bytes() {
            return Err(Error::remote(format!(
                "rank {my_rank}: {info} answered the handshake (stream {i} of {n}) with unexpected \
                 bytes {ack:02x?} (is another program listening on that address?)"
            )));
        }
        s.set_read_timeout(None)
            .map_err(|e| sys("clearing a read timeout", &e))?;
        set_options(&s, cfg)?;
        streams.push(s);
    }
    Ok(TcpConnection::new(info, streams, *cfg))
}

/// The error of a `connect` whose handshake (stream `i` of `n`, sent at `asked`) was not
/// acknowledged: the peer kept silent until the deadline, or closed the connection.
fn no_ack(
    my_rank: usize,
    comm_id: u64,
    info: &PeerInfo,
    (i, n): (usize, usize),
    asked: Instant,
    e: &std::io::Error,
) -> Error {
    use std::io::ErrorKind as K;
    let waited = asked.elapsed().as_secs_f64();
    let msg = match e.kind() {
        K::WouldBlock | K::TimedOut => format!(
            "rank {my_rank}: {info} accepted the connection but did not acknowledge the handshake \
             (stream {i} of {n}) within {waited:.1} s (is another job or communicator listening \
             on that address, or is rank {} stuck before accepting?)",
            info.rank
        ),
        K::UnexpectedEof | K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe => format!(
            "rank {my_rank}: {info} closed the connection during the handshake (stream {i} of \
             {n}) after {waited:.1} s (it rejected communicator id {comm_id:#018x} or rank \
             {my_rank}: another job or communicator on that address? FERRO_DEBUG there logs \
             why): {e}"
        ),
        _ => format!(
            "rank {my_rank}: waiting {waited:.1} s for {info} to acknowledge the handshake \
             (stream {i} of {n}): {e}"
        ),
    };
    Error::remote(msg)
}
