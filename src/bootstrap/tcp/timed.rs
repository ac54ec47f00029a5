//! Reads and writes bounded in time, and the framing of requests and responses.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::*;

/// A byte source whose reads can be bounded in time: a socket (or, in tests, a slice).
pub(super) trait TimedRead: Read {
    /// Bounds each following read to `wait` (`None`: no bound).
    fn set_wait(&mut self, wait: Option<Duration>) -> io::Result<()>;
}

impl TimedRead for TcpStream {
    fn set_wait(&mut self, wait: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(wait)
    }
}

/// The instant `d` from now; `None` (no deadline) when that is too far to represent.
pub(super) fn after(d: Duration) -> Option<Instant> {
    Instant::now().checked_add(d)
}

/// The time left until `by` (`None`: unbounded); a `TimedOut` error once it has passed.
pub(super) fn time_left(by: Option<Instant>) -> io::Result<Option<Duration>> {
    let Some(by) = by else { return Ok(None) };
    let left = by.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::ErrorKind::TimedOut.into());
    }
    Ok(Some(left))
}

/// One read into `buf` that ends by `by`: the bytes read, 0 at the end of the stream, a
/// `TimedOut` error when nothing came in time.
pub(super) fn read_by<R: TimedRead>(
    r: &mut R,
    buf: &mut [u8],
    by: Option<Instant>,
) -> io::Result<usize> {
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
pub(super) fn read_exact_by<R: TimedRead>(
    r: &mut R,
    buf: &mut [u8],
    by: Option<Instant>,
) -> io::Result<()> {
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
pub(super) fn read_body<R: TimedRead>(
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
pub(super) enum FrameDeadline {
    /// Whole by this instant (`None`: no bound): a client waiting for its response.
    By(Option<Instant>),
    /// Its first byte whenever it comes, all of it within this long of that: a server
    /// between requests.
    After(Duration),
}

/// Reads one frame body; `Ok(None)` on a clean end of stream before the frame.
pub(super) fn read_frame<R: TimedRead>(
    r: &mut R,
    deadline: FrameDeadline,
) -> io::Result<Option<Vec<u8>>> {
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
pub(super) fn write_all_by(
    stream: &mut TcpStream,
    bytes: &[u8],
    by: Option<Instant>,
) -> io::Result<()> {
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
