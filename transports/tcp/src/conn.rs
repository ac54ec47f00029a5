//! One peer pair's sockets: messages as a header on stream 0 and a payload striped over the
//! streams, non-blocking, with a read-ahead for small messages.

use std::net::TcpStream;
use std::os::fd::AsRawFd;

use ferroccl_transport::{
    Connection, Error, Header, Part, Payload, PayloadMut, PeerInfo, PollFd, Progress, Result,
    HEADER_LEN,
};

use crate::TcpConfig;

/// Bytes a header read may take from stream 0 in one call: the header and what follows it
/// (a small message's payload, perhaps the next message's header).
pub(crate) const STASH: usize = 4096;

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
    pub(crate) fn new(peer: PeerInfo, streams: Vec<TcpStream>, cfg: TcpConfig) -> Self {
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

    /// Bytes read ahead and not yet delivered.
    #[cfg(test)]
    pub(crate) fn stashed(&self) -> usize {
        self.stash_end - self.stash_pos
    }

    pub(crate) fn layout(&self, len: usize, p: &mut Progress) {
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
pub(crate) enum Io {
    Moved(usize),
    WouldBlock,
    Closed,
}

pub(crate) fn send_some(fd: i32, bufs: &[&[u8]]) -> std::io::Result<Io> {
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

pub(crate) fn recv_some(fd: i32, buf: &mut [u8]) -> std::io::Result<Io> {
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
        header.check_send_len(&self.peer, payload.len())?;
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
            header.check_recv_len(&self.peer, payload.len())?;
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
