//! Driving connections in tests: headers, distinct payloads, bounded waits, and exchanges of
//! whole messages between two ends (alternating calls on one thread, or one thread per end).

use std::fmt;
use std::time::{Duration, Instant};

use ferroccl_transport::{Connection, Header, Payload, PayloadMut, Progress, Result};

/// The longest any wait of the test tooling lasts before it fails, naming what it waited for.
pub const WAIT_LIMIT: Duration = Duration::from_secs(20);

/// The header of test message `seq` with a `len`-byte payload.
pub fn header(len: usize, seq: u64) -> Header {
    Header {
        kind: 1,
        dtype: 7,
        op: 0,
        seq,
        count: len as u64 / 4,
        root: u32::MAX,
        len: len as u64,
    }
}

/// `len` bytes for message `k`, where a byte's value depends on its message, its position and
/// the block of 256 it sits in: a misplaced or shifted chunk shows as a wrong value.
pub fn pattern(len: usize, k: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i.wrapping_mul(31) ^ (i >> 8).wrapping_mul(7) ^ (i >> 16) ^ k.wrapping_mul(13)) as u8
        })
        .collect()
}

/// One [`pattern`] per size, message `k` of `sizes[k]` bytes.
pub fn patterns(sizes: &[usize]) -> Vec<Vec<u8>> {
    sizes
        .iter()
        .enumerate()
        .map(|(k, &n)| pattern(n, k))
        .collect()
}

/// Panics unless `got` equals `want`, naming the first differing byte (not printing both).
pub fn assert_same(what: impl fmt::Display, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{what}: length differs");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "{what}: byte {i} of {} is {}, expected {}",
            want.len(),
            got[i],
            want[i]
        );
    }
}

/// Calls `f` until it returns `Some`, yielding between calls; panics after [`WAIT_LIMIT`],
/// naming `what`.
pub fn wait_for<T>(what: impl fmt::Display, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < WAIT_LIMIT,
            "waited {WAIT_LIMIT:?} for {what}"
        );
        std::thread::yield_now();
    }
}

/// Calls `f` until it fails, yielding between calls, and returns the error; panics after
/// [`WAIT_LIMIT`], naming `what`.
pub fn wait_for_error<T>(
    what: impl fmt::Display,
    mut f: impl FnMut() -> Result<T>,
) -> ferroccl_transport::Error {
    wait_for(what, || f().err())
}

/// Sends `msg` as message `seq` on `c` until it is all handed over (bounded).
pub fn send_all<C: Connection + ?Sized>(c: &mut C, msg: &[u8], seq: u64) {
    let h = header(msg.len(), seq);
    let mut p = Progress::default();
    let what = format!("send #{seq} ({} bytes) to {}", msg.len(), c.peer());
    wait_for(what, || {
        c.send(&h, Payload::Host(msg), &mut p)
            .unwrap_or_else(|e| panic!("send #{seq}: {e}"))
            .then_some(())
    });
}

/// Receives message `seq` of `len` bytes on `c` (bounded), checking its header against
/// [`header`]`(len, seq)`.
pub fn recv_all<C: Connection + ?Sized>(c: &mut C, len: usize, seq: u64) -> Vec<u8> {
    let mut got = vec![0u8; len];
    let mut h = Header::default();
    let mut p = Progress::default();
    let what = format!("recv #{seq} ({len} bytes) from {}", c.peer());
    wait_for(what, || {
        let done = c
            .recv(&mut h, PayloadMut::Host(&mut got), &mut p)
            .unwrap_or_else(|e| panic!("recv #{seq}: {e}"));
        if p.header_done() && !p.started {
            assert_eq!(h, header(len, seq), "header of message #{seq}");
        }
        done.then_some(())
    });
    got
}

/// Sends `msgs` from `a` to `b`, driving both ends by alternating non-blocking calls on this
/// thread, and returns what `b` received. Headers are checked on the way.
pub fn exchange<A, B>(a: &mut A, b: &mut B, msgs: &[Vec<u8>]) -> Vec<Vec<u8>>
where
    A: Connection + ?Sized,
    B: Connection + ?Sized,
{
    let mut out = Vec::with_capacity(msgs.len());
    for (k, m) in msgs.iter().enumerate() {
        let h = header(m.len(), k as u64);
        let (mut sp, mut rp) = (Progress::default(), Progress::default());
        let mut rh = Header::default();
        let mut buf = vec![0u8; m.len()];
        let (mut sent, mut recvd) = (false, false);
        // `a`'s peer is `b`'s rank and the other way round.
        let what = format!(
            "message #{k} ({} bytes) from {} to {}",
            m.len(),
            b.peer(),
            a.peer()
        );
        wait_for(what, || {
            if !sent {
                sent = a
                    .send(&h, Payload::Host(m), &mut sp)
                    .unwrap_or_else(|e| panic!("send #{k}: {e}"));
            }
            if !recvd {
                recvd = b
                    .recv(&mut rh, PayloadMut::Host(&mut buf), &mut rp)
                    .unwrap_or_else(|e| panic!("recv #{k}: {e}"));
                if rp.header_done() && !rp.started {
                    assert_eq!(rh, h, "header of message #{k}");
                }
            }
            (sent && recvd).then_some(())
        });
        out.push(buf);
    }
    out
}

/// Sends `msgs` from `a` to `b` with one thread per end, and returns what `b` received.
/// Headers are checked on the way.
pub fn exchange_threaded<A, B>(a: &mut A, b: &mut B, msgs: &[Vec<u8>]) -> Vec<Vec<u8>>
where
    A: Connection + Send + ?Sized,
    B: Connection + ?Sized,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            for (k, m) in msgs.iter().enumerate() {
                send_all(a, m, k as u64);
            }
        });
        msgs.iter()
            .enumerate()
            .map(|(k, m)| recv_all(b, m.len(), k as u64))
            .collect()
    })
}
