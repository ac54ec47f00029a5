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
//! Messages are a 40-byte [`Header`] on stream 0 followed by the payload. A payload of at least
//! [`TcpConfig::stripe_min`] bytes is split into one part per stream (parts are multiples of
//! 4096 bytes except the last), so several sockets carry one large message at once.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use ferroccl_transport::{
    Connection, Error, ErrorKind, Header, Part, Payload, PayloadMut, PeerInfo, PollFd, Progress,
    Result, HEADER_LEN, MAX_PARTS,
};

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

const HELLO_MAGIC: u32 = 0x5348_5246; // "FRHS"
const HELLO_VERSION: u16 = 1;
const HELLO_LEN: usize = 32;
const ACK_OK: u32 = 0x4b4f_5246; // "FROK"
/// How long an accepted socket may take to send its handshake before it is dropped.
const STRANGER_PATIENCE: Duration = Duration::from_secs(5);

/// The first bytes on every socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hello {
    comm_id: u64,
    from: u32,
    to: u32,
    stream: u16,
    nstreams: u16,
}

impl Hello {
    fn encode(&self) -> [u8; HELLO_LEN] {
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
const MAX_UNIDENTIFIED: usize = 64;
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

fn ack_bytes() -> [u8; 8] {
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

/// Bytes a header read may take from stream 0 in one call: the header and what follows it
/// (a small message's payload, perhaps the next message's header).
const STASH: usize = 4096;

/// One peer pair over TCP: `nstreams` sockets, used without blocking.
#[derive(Debug)]
pub struct TcpConnection {
    peer: PeerInfo,
    streams: Vec<TcpStream>,
    cfg: TcpConfig,
    /// Header bytes of the incoming message being read.
    rx_header: [u8; HEADER_LEN],
    /// Streams with outgoing (bit i) bytes still to write in the current message.
    tx_pending: u32,
    /// Streams with incoming bytes still to read in the current message.
    rx_pending: u32,
    /// Bytes of stream 0 read ahead of the message being received: a header is read with
    /// room for what follows it, so that a small message costs one `recv` call, not two.
    /// `stash[stash_pos..stash_end]` is unread; the next message starts there.
    stash: Box<[u8]>,
    stash_pos: usize,
    stash_end: usize,
    closed: bool,
}

impl TcpConnection {
    fn new(peer: PeerInfo, streams: Vec<TcpStream>, cfg: TcpConfig) -> Self {
        TcpConnection {
            peer,
            streams,
            cfg,
            rx_header: [0; HEADER_LEN],
            tx_pending: 0,
            rx_pending: 0,
            stash: vec![0; STASH].into_boxed_slice(),
            stash_pos: 0,
            stash_end: 0,
            closed: false,
        }
    }

    /// Moves read-ahead bytes of stream 0 into `out`; returns how many.
    fn take_stash(&mut self, out: &mut [u8]) -> usize {
        let n = out.len().min(self.stash_end - self.stash_pos);
        out[..n].copy_from_slice(&self.stash[self.stash_pos..self.stash_pos + n]);
        self.stash_pos += n;
        n
    }

    /// With no read-ahead bytes left, reads what stream 0 has (up to the stash's size).
    fn fill_stash(&mut self) -> Result<Io> {
        debug_assert_eq!(self.stash_pos, self.stash_end);
        let fd = self.streams[0].as_raw_fd();
        let r = recv_some(fd, &mut self.stash).map_err(|e| self.io_error("receiving from", e))?;
        if let Io::Moved(n) = r {
            self.stash_pos = 0;
            self.stash_end = n;
        }
        Ok(r)
    }

    /// Sockets in use.
    pub fn nstreams(&self) -> usize {
        self.streams.len()
    }

    fn layout(&self, len: usize, p: &mut Progress) {
        let k = self.streams.len();
        p.started = true;
        if k <= 1 || len < self.cfg.stripe_min {
            p.nparts = 1;
            p.parts[0] = Part {
                start: 0,
                pos: 0,
                end: len,
            };
            return;
        }
        let per = len.div_ceil(k).div_ceil(4096) * 4096;
        p.nparts = 0;
        let mut start = 0;
        while start < len {
            let end = (start + per).min(len);
            p.parts[p.nparts] = Part {
                start,
                pos: start,
                end,
            };
            p.nparts += 1;
            start = end;
        }
    }

    fn io_error(&self, what: &str, e: std::io::Error) -> Error {
        Error::remote(format!("{what} {}: {e}", self.peer)).with_peer(self.peer.rank)
    }

    fn closed_error(&self) -> Error {
        Error::remote(format!("{} closed the connection", self.peer)).with_peer(self.peer.rank)
    }
}

/// Outcome of one non-blocking socket call.
enum Io {
    Moved(usize),
    WouldBlock,
    Closed,
}

fn send_some(fd: i32, bufs: &[&[u8]]) -> std::io::Result<Io> {
    // Callers pass a header and a payload at most; a longer list sends its first buffers now
    // (a short write, which callers handle) and the rest on the next call.
    const MAX_IOV: usize = 4;
    let empty = libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    };
    let mut iov = [empty; MAX_IOV];
    let mut n = 0;
    for b in bufs.iter().filter(|b| !b.is_empty()).take(MAX_IOV) {
        iov[n] = libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        };
        n += 1;
    }
    let iov = &iov[..n];
    if iov.is_empty() {
        return Ok(Io::Moved(0));
    }
    // SAFETY: a zeroed msghdr is valid (null name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: `iov` points at live slices that outlive the call; the kernel only reads them.
    let rc = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    if rc >= 0 {
        return Ok(Io::Moved(rc as usize));
    }
    let e = std::io::Error::last_os_error();
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(Io::WouldBlock),
        std::io::ErrorKind::BrokenPipe => Ok(Io::Closed),
        _ => Err(e),
    }
}

fn recv_some(fd: i32, buf: &mut [u8]) -> std::io::Result<Io> {
    if buf.is_empty() {
        return Ok(Io::Moved(0));
    }
    // SAFETY: `buf` is a live, writable slice of `buf.len()` bytes.
    let rc = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    match rc {
        0 => Ok(Io::Closed),
        n if n > 0 => Ok(Io::Moved(n as usize)),
        _ => {
            let e = std::io::Error::last_os_error();
            match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => {
                    Ok(Io::WouldBlock)
                }
                _ => Err(e),
            }
        }
    }
}

impl Connection for TcpConnection {
    fn peer(&self) -> &PeerInfo {
        &self.peer
    }

    fn send(&mut self, header: &Header, payload: Payload<'_>, p: &mut Progress) -> Result<bool> {
        let payload = payload.host("tcp")?;
        if self.closed {
            return Err(self.closed_error());
        }
        if header.len != payload.len() as u64 {
            return Err(Error::internal(format!(
                "send to {}: header says {} bytes, payload has {}",
                self.peer,
                header.len,
                payload.len()
            )));
        }
        if !p.started {
            self.layout(payload.len(), p);
        }
        let max_io = self.cfg.max_io.max(4096);
        let hdr = header.encode();
        self.tx_pending = 0;
        for i in 0..p.nparts {
            let part = p.parts[i];
            let fd = self.streams[i].as_raw_fd();
            let body_end = part.end.min(part.pos + max_io);
            let body = &payload[part.pos..body_end];
            let head: &[u8] = if i == 0 { &hdr[p.header_pos..] } else { &[] };
            if head.is_empty() && body.is_empty() {
                continue;
            }
            match send_some(fd, &[head, body]).map_err(|e| self.io_error("sending to", e))? {
                Io::Moved(mut n) => {
                    if i == 0 {
                        let h = n.min(HEADER_LEN - p.header_pos);
                        p.header_pos += h;
                        n -= h;
                    }
                    p.parts[i].pos += n;
                }
                Io::WouldBlock => {}
                Io::Closed => return Err(self.closed_error()),
            }
            if p.parts[i].pos < part.end || (i == 0 && !p.header_done()) {
                self.tx_pending |= 1 << i;
            }
        }
        if p.nparts == 0 && !p.header_done() {
            // Defensive: a laid-out message always has part 0.
            return Err(Error::internal("send: message without parts"));
        }
        Ok(p.done())
    }

    fn recv(
        &mut self,
        header: &mut Header,
        payload: PayloadMut<'_>,
        p: &mut Progress,
    ) -> Result<bool> {
        let payload = payload.host("tcp")?;
        if self.closed {
            return Err(self.closed_error());
        }
        if !p.header_done() {
            if self.stash_pos == self.stash_end {
                // One call reads the header and, for a small message, its payload too.
                match self.fill_stash()? {
                    Io::Moved(_) | Io::WouldBlock => {}
                    Io::Closed => return Err(self.closed_error()),
                }
            }
            let pos = p.header_pos;
            let mut head = self.rx_header;
            p.header_pos += self.take_stash(&mut head[pos..]);
            self.rx_header = head;
            self.rx_pending = 1;
            if !p.header_done() {
                return Ok(false);
            }
            *header = Header::decode(&self.rx_header).ok_or_else(|| {
                Error::remote(format!(
                    "garbled message header from {} (the stream is out of step)",
                    self.peer
                ))
            })?;
            // The caller checks the header before the payload is read.
            return Ok(false);
        }
        if !p.started {
            if header.len != payload.len() as u64 {
                return Err(Error::internal(format!(
                    "recv from {}: header says {} bytes, buffer has {}",
                    self.peer,
                    header.len,
                    payload.len()
                )));
            }
            self.layout(payload.len(), p);
        }
        let max_io = self.cfg.max_io.max(4096);
        self.rx_pending = 0;
        for i in 0..p.nparts {
            let part = p.parts[i];
            if part.pos == part.end {
                continue;
            }
            if i == 0 && self.stash_pos < self.stash_end {
                // Read ahead with the header: no system call.
                p.parts[0].pos += self.take_stash(&mut payload[part.pos..part.end]);
            }
            let part = p.parts[i];
            if part.pos == part.end {
                continue;
            }
            let fd = self.streams[i].as_raw_fd();
            let end = part.end.min(part.pos + max_io);
            match recv_some(fd, &mut payload[part.pos..end])
                .map_err(|e| self.io_error("receiving from", e))?
            {
                Io::Moved(n) => p.parts[i].pos += n,
                Io::WouldBlock => {}
                Io::Closed => return Err(self.closed_error()),
            }
            if p.parts[i].pos < part.end {
                self.rx_pending |= 1 << i;
            }
        }
        Ok(p.done())
    }

    fn poll_fds(&self, sending: bool, receiving: bool, out: &mut Vec<PollFd>) {
        for (i, s) in self.streams.iter().enumerate() {
            let write = sending && self.tx_pending & (1 << i) != 0;
            let read = receiving && self.rx_pending & (1 << i) != 0;
            if read || write {
                out.push(PollFd {
                    fd: s.as_raw_fd(),
                    read,
                    write,
                });
            }
        }
    }

    fn shutdown(&mut self) {
        if !self.closed {
            self.closed = true;
            for s in &self.streams {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

mod setup;
pub use setup::TcpTransport;

#[cfg(test)]
mod tests;
