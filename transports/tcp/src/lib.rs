//! ferroccl's TCP transport.
//!
//! | item | what it is |
//! |---|---|
//! | [`TcpEndpoint`] | a listening socket; accepts peers after checking their handshake |
//! | [`TcpConnection`] | one peer pair: several sockets ("streams"); large messages are striped over them |
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
    Connection, Error, ErrorKind, Header, Part, PeerInfo, PollFd, Progress, Result, HEADER_LEN,
    MAX_PARTS,
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
    pub fn accept(
        &self,
        my_rank: usize,
        comm_id: u64,
        peers: &[usize],
        cfg: &TcpConfig,
        deadline: Instant,
    ) -> Result<Vec<TcpConnection>> {
        let n = cfg.nstreams;
        let mut slots: Vec<Vec<Option<TcpStream>>> = peers
            .iter()
            .map(|_| std::iter::repeat_with(|| None).take(n).collect())
            .collect();
        let mut addrs: Vec<String> = vec![String::new(); peers.len()];
        let mut missing = peers.len() * n;
        self.listener
            .set_nonblocking(true)
            .map_err(|e| sys("making the listener non-blocking", &e))?;
        while missing > 0 {
            let (mut stream, from_addr) = match self.listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let waiting: Vec<String> = peers
                            .iter()
                            .zip(&slots)
                            .filter(|(_, s)| s.iter().any(Option::is_none))
                            .map(|(p, _)| p.to_string())
                            .collect();
                        return Err(Error::timeout(format!(
                            "rank {my_rank}: no connection from rank(s) {} at {} before the deadline",
                            waiting.join(", "),
                            self.addr
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                Err(e) => return Err(sys(format_args!("accepting on {}", self.addr), &e)),
            };
            // A socket that does not identify itself in time, or wrongly, is dropped.
            let hello = match read_hello(&mut stream) {
                Ok(h) => h,
                Err(why) => {
                    log_reject(my_rank, &from_addr, &why);
                    continue;
                }
            };
            let idx = peers.iter().position(|&p| p == hello.from as usize);
            let why = if hello.comm_id != comm_id {
                Some(format!(
                    "communicator id {:#018x} is not ours ({comm_id:#018x})",
                    hello.comm_id
                ))
            } else if hello.to as usize != my_rank {
                Some(format!("it asked for rank {}", hello.to))
            } else if idx.is_none() {
                Some(format!("rank {} is not expected here", hello.from))
            } else if usize::from(hello.nstreams) != n || usize::from(hello.stream) >= n {
                Some(format!(
                    "stream {} of {} does not match {n} streams",
                    hello.stream, hello.nstreams
                ))
            } else {
                None
            };
            if let Some(why) = why {
                log_reject(my_rank, &from_addr, &why);
                continue;
            }
            let Some(i) = idx else { continue };
            let slot = &mut slots[i][usize::from(hello.stream)];
            if slot.is_some() {
                log_reject(my_rank, &from_addr, "duplicate stream");
                continue;
            }
            if stream.write_all(&ack_bytes()).is_err() {
                continue;
            }
            set_options(&stream, cfg)?;
            addrs[i] = from_addr.to_string();
            *slot = Some(stream);
            missing -= 1;
        }
        let mut out = Vec::with_capacity(peers.len());
        for ((&p, s), addr) in peers.iter().zip(slots).zip(addrs) {
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

fn ack_bytes() -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0..4].copy_from_slice(&ACK_OK.to_le_bytes());
    b
}

fn log_reject(my_rank: usize, from: &SocketAddr, why: &str) {
    if std::env::var_os("FERRO_DEBUG").is_some() {
        eprintln!("ferroccl rank {my_rank} NET: rejected a connection from {from}: {why}");
    }
}

fn read_hello(stream: &mut TcpStream) -> std::result::Result<Hello, String> {
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(STRANGER_PATIENCE))
        .map_err(|e| e.to_string())?;
    let mut b = [0u8; HELLO_LEN];
    stream
        .read_exact(&mut b)
        .map_err(|e| format!("no handshake: {e}"))?;
    stream.set_read_timeout(None).map_err(|e| e.to_string())?;
    Hello::decode(&b)
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
        let left = deadline.saturating_duration_since(Instant::now());
        s.set_read_timeout(Some(left.max(Duration::from_millis(10))))
            .map_err(|e| sys("setting a read timeout", &e))?;
        s.write_all(&hello.encode())
            .map_err(|e| Error::remote(format!("rank {my_rank}: handshake with {info}: {e}")))?;
        let mut ack = [0u8; 8];
        if let Err(e) = s.read_exact(&mut ack) {
            return Err(Error::remote(format!(
                "rank {my_rank}: {info} refused the handshake (another job or communicator on that address?): {e}"
            )));
        }
        if ack != ack_bytes() {
            return Err(Error::remote(format!(
                "rank {my_rank}: {info} answered the handshake with unexpected bytes"
            )));
        }
        s.set_read_timeout(None)
            .map_err(|e| sys("clearing a read timeout", &e))?;
        set_options(&s, cfg)?;
        streams.push(s);
    }
    Ok(TcpConnection::new(info, streams, *cfg))
}

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
            closed: false,
        }
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
    let iov: Vec<libc::iovec> = bufs
        .iter()
        .filter(|b| !b.is_empty())
        .map(|b| libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        })
        .collect();
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

    fn send(&mut self, header: &Header, payload: &[u8], p: &mut Progress) -> Result<bool> {
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

    fn recv(&mut self, header: &mut Header, payload: &mut [u8], p: &mut Progress) -> Result<bool> {
        if self.closed {
            return Err(self.closed_error());
        }
        if !p.header_done() {
            let fd = self.streams[0].as_raw_fd();
            let pos = p.header_pos;
            match recv_some(fd, &mut self.rx_header[pos..])
                .map_err(|e| self.io_error("receiving from", e))?
            {
                Io::Moved(n) => p.header_pos += n,
                Io::WouldBlock => {}
                Io::Closed => return Err(self.closed_error()),
            }
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

#[cfg(test)]
mod tests;
