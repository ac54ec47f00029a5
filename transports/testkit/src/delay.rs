//! A connection wrapper that adds a fixed one-way delay to every message: test and benchmark
//! tooling for links slower than the machine's own (this kernel has no `netem` qdisc).
//!
//! [`Delayed`] wraps any [`Connection`]; both ends of a pair must be wrapped. In front of each
//! message the sender writes a stamp (a header-only message carrying its send time on the
//! monotonic clock). The receiver reads stamps and messages as soon as the inner transport has
//! them, ahead of the caller (up to [`READ_AHEAD_BYTES`] beyond the message the caller waits
//! for), into its own buffers, and hands a message to the caller only `delay` after its last
//! byte came in; until then its [`Connection::poll_fds`] adds a timer that fires at that moment.
//! A message therefore costs its transfer on the inner (rate-shaped) link *plus* the delay, as on
//! a real long link, and delays overlap: a burst of messages sent together is delivered one
//! delay after each one's bytes are in, not one delay per message after the previous one.
//!
//! Bytes that reach the receiver while nobody reads the connection (its rank is busy elsewhere)
//! are charged no more delay than a real link would have: a message whose stamp is read `L`
//! after it could first have been on the wire (its send time, or the previous message's last
//! byte, whichever is later) is held `delay - L` (at least 0) after its last byte. Reading at
//! once also keeps the inner socket drained, so a waiting receiver never delays TCP's ACKs.
//!
//! The stamps compare clocks of the two ends, so both must share the monotonic clock: ranks on
//! one machine (threads, processes, network namespaces), which is where this wrapper is meant
//! to run.

use std::collections::VecDeque;
use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use ferroccl_transport::{
    Connection, Error, Header, Part, Payload, PayloadMut, PeerInfo, PollFd, Progress, Result,
    HEADER_LEN,
};

/// Header kind of a stamp (no collective uses it).
pub const STAMP_KIND: u8 = 0xfd;

/// Nanoseconds on `CLOCK_MONOTONIC`, the clock every process of a machine shares.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// A one-shot timer on the monotonic clock whose descriptor becomes readable when it fires.
#[derive(Debug)]
struct Timer {
    fd: OwnedFd,
}

impl Timer {
    fn new() -> Result<Timer> {
        // SAFETY: timerfd_create has no memory arguments; the result is checked below.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(Error::internal(format!(
                "link delay: timerfd_create failed: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: `fd` is a descriptor just returned to us and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Timer { fd })
    }

    /// Arms the timer to fire at `at_ns` on the monotonic clock (at once if that has passed);
    /// 0 disarms it.
    fn arm(&self, at_ns: u64) {
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (at_ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (at_ns % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: `spec` is a valid itimerspec, the old value is not asked for (null), and
        // the descriptor is a timerfd owned by `self`.
        unsafe {
            libc::timerfd_settime(
                self.fd.as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &spec,
                std::ptr::null_mut(),
            )
        };
    }

    /// Consumes a pending expiry, so that the descriptor is no longer readable.
    fn clear(&self) {
        let mut ticks = [0u8; 8];
        // SAFETY: reads at most 8 bytes into the 8-byte buffer; the descriptor is
        // non-blocking, so this returns EAGAIN at once when the timer has not fired.
        unsafe { libc::read(self.fd.as_raw_fd(), ticks.as_mut_ptr().cast(), 8) };
    }
}

/// Bytes of complete messages the receiver buffers beyond the one the caller waits for; past
/// this it stops reading, and the inner transport's flow control holds the sender back.
pub const READ_AHEAD_BYTES: usize = 16 << 20;

/// Where the sending side stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxState {
    /// Between messages.
    Idle,
    /// Writing the stamp of the next message (`Delayed::tx_stamp`).
    Stamp,
    /// Writing the message itself.
    Message,
}

/// When a message read at `done_ns` may reach the caller: `delay_ns` after its last byte, less
/// the time `L` by which the receiver was late to read it, where `L` runs from the moment the
/// message could first be on the wire (`sent_ns`, or `prev_in_ns`, when the previous message's
/// last byte on this connection came in, whichever is later) to `stamp_read_ns`, and is at most
/// the delay.
fn release_ns(
    sent_ns: u64,
    prev_in_ns: u64,
    stamp_read_ns: u64,
    done_ns: u64,
    delay_ns: u64,
) -> u64 {
    let on_wire = sent_ns.max(prev_in_ns);
    let late = stamp_read_ns.saturating_sub(on_wire).min(delay_ns);
    done_ns.saturating_add(delay_ns - late)
}

/// A message read from the inner transport, complete or still arriving.
#[derive(Debug)]
struct Inbound {
    header: Header,
    payload: Vec<u8>,
    /// The inner transport's progress on it.
    progress: Progress,
    /// Send time from its stamp and when the stamp was read (monotonic ns).
    sent_ns: u64,
    stamp_read_ns: u64,
    /// When the caller may have it; set once its last byte is in.
    release_ns: Option<u64>,
}

/// A connection whose messages arrive `delay` after their last byte came in (see the module
/// docs).
pub struct Delayed<C> {
    inner: C,
    delay_ns: u64,
    tx: TxState,
    /// The stamp being written and its progress.
    tx_stamp: (Header, Progress),
    /// The stamp being read and its progress; `None` while a message is being read.
    rx_stamp: Option<(Header, Progress)>,
    /// Messages read (the last one possibly still arriving), oldest first.
    inbox: VecDeque<Inbound>,
    /// Payload bytes of complete messages in `inbox`.
    buffered: usize,
    /// When the previous message's last byte came in, as a receiver reading all along would
    /// have seen it (its release less the delay).
    prev_in_ns: u64,
    /// An inner error met while reading ahead, reported once the messages before it are out.
    rx_error: Option<Error>,
    timer: Timer,
    /// The time the timer is armed for (0: disarmed).
    armed_ns: u64,
}

impl<C: Connection> fmt::Debug for Delayed<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delayed")
            .field("inner", &self.inner)
            .field("delay_ns", &self.delay_ns)
            .field("tx", &self.tx)
            .field("inbox", &self.inbox.len())
            .field("buffered", &self.buffered)
            .finish()
    }
}

impl<C: Connection> Delayed<C> {
    /// Wraps `inner`, adding `delay` to every message in both directions. The peer must wrap
    /// its end too (with any delay: the receiving end's delay is the one applied).
    pub fn new(inner: C, delay: Duration) -> Result<Delayed<C>> {
        Ok(Delayed {
            inner,
            delay_ns: u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX),
            tx: TxState::Idle,
            tx_stamp: (Header::default(), Progress::default()),
            rx_stamp: Some((Header::default(), Progress::default())),
            inbox: VecDeque::new(),
            buffered: 0,
            prev_in_ns: 0,
            rx_error: None,
            timer: Timer::new()?,
            armed_ns: 0,
        })
    }

    /// The added one-way delay.
    pub fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_ns)
    }

    /// The wrapped connection.
    pub fn inner(&self) -> &C {
        &self.inner
    }

    /// Whether the receiver may read more from the inner transport now.
    fn may_read(&self) -> bool {
        self.rx_error.is_none() && self.buffered <= READ_AHEAD_BYTES
    }

    /// Reads stamps and messages from the inner transport until it has nothing more or the
    /// read-ahead limit is reached.
    fn read_ahead(&mut self) -> Result<()> {
        while self.may_read() {
            if let Some((stamp, p)) = &mut self.rx_stamp {
                // Header first (the inner transport stops there), then the empty payload.
                if !self.inner.recv(stamp, PayloadMut::Host(&mut []), p)? {
                    if !p.header_done() {
                        return Ok(());
                    }
                    if stamp.kind != STAMP_KIND || stamp.len != 0 {
                        return Err(Error::internal(format!(
                            "link delay: expected a send-time stamp from {}, got a message of \
                             kind {} with {} bytes (set FERRO_LINK_DELAY_US alike on every rank)",
                            self.inner.peer(),
                            stamp.kind,
                            stamp.len
                        )));
                    }
                    continue;
                }
                self.inbox.push_back(Inbound {
                    header: Header::default(),
                    payload: Vec::new(),
                    progress: Progress::default(),
                    sent_ns: stamp.seq,
                    stamp_read_ns: monotonic_ns(),
                    release_ns: None,
                });
                self.rx_stamp = None;
            }
            let m = self.inbox.back_mut().expect("a message follows its stamp");
            let header_was_done = m.progress.header_done();
            let done = self.inner.recv(
                &mut m.header,
                PayloadMut::Host(&mut m.payload),
                &mut m.progress,
            )?;
            if !done {
                if header_was_done || !m.progress.header_done() {
                    return Ok(());
                }
                // The header is in: make room for the payload, then go on reading.
                let len = usize::try_from(m.header.len).unwrap_or(usize::MAX);
                m.payload.try_reserve_exact(len).map_err(|_| {
                    Error::internal(format!(
                        "link delay: no memory for a {}-byte message from {}",
                        m.header.len,
                        self.inner.peer()
                    ))
                })?;
                m.payload.resize(len, 0);
                continue;
            }
            let release = release_ns(
                m.sent_ns,
                self.prev_in_ns,
                m.stamp_read_ns,
                monotonic_ns(),
                self.delay_ns,
            );
            m.release_ns = Some(release);
            self.prev_in_ns = release.saturating_sub(self.delay_ns);
            self.buffered += m.payload.len();
            self.rx_stamp = Some((Header::default(), Progress::default()));
        }
        Ok(())
    }

    /// Arms the timer for the release of the oldest complete message, or disarms it.
    fn arm_for_next_release(&mut self, now: u64) {
        let want = match self.inbox.front().and_then(|m| m.release_ns) {
            Some(at) if at > now => at,
            _ => 0,
        };
        if want != self.armed_ns {
            // Consume a stale expiry first, then arm: clearing after arming would swallow an
            // expiry that came at once (a release a few microseconds away), and the caller
            // would sleep with nothing left to wake it.
            self.timer.clear();
            self.timer.arm(want);
            self.armed_ns = want;
        }
    }
}

impl<C: Connection> Connection for Delayed<C> {
    fn peer(&self) -> &PeerInfo {
        self.inner.peer()
    }

    fn send(
        &mut self,
        header: &Header,
        payload: Payload<'_>,
        progress: &mut Progress,
    ) -> Result<bool> {
        if self.tx == TxState::Idle {
            let stamp = Header {
                kind: STAMP_KIND,
                seq: monotonic_ns(),
                ..Header::default()
            };
            self.tx_stamp = (stamp, Progress::default());
            self.tx = TxState::Stamp;
        }
        if self.tx == TxState::Stamp {
            let (stamp, p) = &mut self.tx_stamp;
            if !self.inner.send(stamp, Payload::Host(&[]), p)? {
                return Ok(false);
            }
            self.tx = TxState::Message;
        }
        let done = self.inner.send(header, payload, progress)?;
        if done {
            self.tx = TxState::Idle;
        }
        Ok(done)
    }

    fn recv(
        &mut self,
        header: &mut Header,
        payload: PayloadMut<'_>,
        progress: &mut Progress,
    ) -> Result<bool> {
        let payload = payload.host("delayed")?;
        if let Err(e) = self.read_ahead() {
            // Messages already in are still delivered; the error comes after them.
            self.rx_error = Some(e);
        }
        let now = monotonic_ns();
        self.arm_for_next_release(now);
        let released = matches!(
            self.inbox.front(),
            Some(Inbound { release_ns: Some(at), .. }) if *at <= now
        );
        if !released {
            return match self.rx_error.take() {
                Some(e) if self.inbox.front().is_none_or(|m| m.release_ns.is_none()) => Err(e),
                e => {
                    self.rx_error = e;
                    Ok(false)
                }
            };
        }
        let m = self.inbox.front().expect("checked above");
        if !progress.header_done() {
            // The caller checks the header before asking for the payload.
            *header = m.header;
            progress.header_pos = HEADER_LEN;
            return Ok(false);
        }
        if payload.len() != m.payload.len() {
            return Err(Error::internal(format!(
                "recv from {}: header says {} bytes, buffer has {}",
                self.inner.peer(),
                m.payload.len(),
                payload.len()
            )));
        }
        payload.copy_from_slice(&m.payload);
        progress.parts[0] = Part {
            start: 0,
            pos: payload.len(),
            end: payload.len(),
        };
        progress.nparts = 1;
        progress.started = true;
        self.buffered -= payload.len();
        self.inbox.pop_front();
        self.arm_for_next_release(now);
        Ok(true)
    }

    fn poll_fds(&self, sending: bool, receiving: bool, out: &mut Vec<PollFd>) {
        if receiving && self.armed_ns != 0 {
            out.push(PollFd {
                fd: self.timer.fd.as_raw_fd(),
                read: true,
                write: false,
            });
        }
        self.inner
            .poll_fds(sending, receiving && self.may_read(), out);
    }

    fn describe(&self) -> String {
        format!("+{} us delay", self.delay_ns / 1000)
    }

    fn in_flight(&self) -> bool {
        self.inner.in_flight()
    }

    fn shutdown(&mut self) {
        self.inner.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    use super::*;

    /// Messages in flight on an in-memory link, each with the moment its last byte is in.
    type Queue = Arc<Mutex<VecDeque<(Header, Vec<u8>, Instant)>>>;

    /// One end of an in-memory connection. The header is handed out on one call and the
    /// payload on the next, like the TCP transport; a message's payload is in `transfer` after
    /// the previous one's (or after it was sent, if later), as on a link of limited rate.
    #[derive(Debug)]
    struct Mem {
        peer: PeerInfo,
        out: Queue,
        inbox: Queue,
        transfer: Duration,
        /// Set when the peer closed: once the inbox is empty, `recv` fails.
        closed: Arc<AtomicBool>,
    }

    fn pair_with(transfer: Duration) -> (Mem, Mem) {
        let (a, b): (Queue, Queue) = (Arc::default(), Arc::default());
        let closed = Arc::new(AtomicBool::new(false));
        let end = |rank, out: &Queue, inbox: &Queue| Mem {
            peer: PeerInfo {
                rank,
                addr: format!("mem{rank}"),
            },
            out: Arc::clone(out),
            inbox: Arc::clone(inbox),
            transfer,
            closed: Arc::clone(&closed),
        };
        (end(1, &a, &b), end(0, &b, &a))
    }

    fn pair() -> (Mem, Mem) {
        pair_with(Duration::ZERO)
    }

    impl Connection for Mem {
        fn peer(&self) -> &PeerInfo {
            &self.peer
        }

        fn send(&mut self, h: &Header, payload: Payload<'_>, p: &mut Progress) -> Result<bool> {
            let payload = payload.host("mem")?;
            assert_eq!(h.len, payload.len() as u64);
            let mut q = self.out.lock().unwrap();
            let start = q.back().map_or(Instant::now(), |m| m.2.max(Instant::now()));
            q.push_back((*h, payload.to_vec(), start + self.transfer));
            p.header_pos = HEADER_LEN;
            p.started = true;
            Ok(true)
        }

        fn recv(
            &mut self,
            h: &mut Header,
            payload: PayloadMut<'_>,
            p: &mut Progress,
        ) -> Result<bool> {
            let payload = payload.host("mem")?;
            let mut q = self.inbox.lock().unwrap();
            let Some((head, body, in_at)) = q.front() else {
                if self.closed.load(Ordering::SeqCst) {
                    return Err(Error::remote(format!("{} closed", self.peer)));
                }
                return Ok(false);
            };
            if !p.header_done() {
                *h = *head;
                p.header_pos = HEADER_LEN;
                return Ok(false);
            }
            if Instant::now() < *in_at {
                return Ok(false);
            }
            payload.copy_from_slice(body);
            p.started = true;
            q.pop_front();
            Ok(true)
        }

        fn poll_fds(&self, _: bool, _: bool, _: &mut Vec<PollFd>) {}

        fn shutdown(&mut self) {}
    }

    fn header(seq: u64, len: usize) -> Header {
        Header {
            kind: 1,
            seq,
            len: len as u64,
            ..Header::default()
        }
    }

    /// Receives one message, calling `recv` until it is in; returns the calls it took.
    fn recv_all(c: &mut Delayed<Mem>, h: &mut Header, buf: &mut [u8]) -> usize {
        let mut p = Progress::default();
        let mut calls = 0;
        loop {
            calls += 1;
            if c.recv(h, PayloadMut::Host(&mut *buf), &mut p).unwrap() {
                return calls;
            }
            std::thread::yield_now();
        }
    }

    /// Whether the one descriptor a receiving `c` offers (its timer) becomes readable within
    /// `limit_ms` (the limit only bounds a broken timer).
    fn timer_fires(c: &Delayed<Mem>, limit_ms: i32) -> bool {
        let mut fds = Vec::new();
        c.poll_fds(false, true, &mut fds);
        assert_eq!(fds.len(), 1, "{fds:?}");
        let mut pfd = libc::pollfd {
            fd: fds[0].fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, limit_ms) == 1 }
    }

    #[test]
    fn messages_arrive_whole_in_order_and_not_before_the_delay() {
        let delay = Duration::from_millis(20);
        let (a, b) = pair();
        let (mut a, mut b) = (
            Delayed::new(a, delay).unwrap(),
            Delayed::new(b, delay).unwrap(),
        );
        let sent = Instant::now();
        for i in 0..3u8 {
            let body = vec![i; 5 + usize::from(i)];
            let h = header(u64::from(i), body.len());
            assert!(a
                .send(&h, Payload::Host(&body), &mut Progress::default())
                .unwrap());
        }
        for i in 0..3u8 {
            let mut h = Header::default();
            let mut buf = vec![0u8; 5 + usize::from(i)];
            recv_all(&mut b, &mut h, &mut buf);
            // A lower bound only: a busy machine makes it later, never earlier.
            assert!(
                sent.elapsed() >= delay,
                "message {i} after {:?}",
                sent.elapsed()
            );
            assert_eq!(h, header(u64::from(i), buf.len()));
            assert!(buf.iter().all(|&x| x == i), "{buf:?}");
        }
    }

    #[test]
    fn delays_overlap_instead_of_adding_up() {
        // Ten messages sent together; once one delay has passed since the last was sent,
        // every one of them is deliverable on the first call (a wrapper that waited a delay
        // per message would still be holding the second).
        let delay = Duration::from_millis(30);
        let (a, b) = pair();
        let (mut a, mut b) = (
            Delayed::new(a, delay).unwrap(),
            Delayed::new(b, delay).unwrap(),
        );
        for i in 0..10 {
            assert!(a
                .send(
                    &header(i, 4),
                    Payload::Host(&[7; 4]),
                    &mut Progress::default()
                )
                .unwrap());
        }
        let last_sent = Instant::now();
        std::thread::sleep(delay);
        while last_sent.elapsed() < delay {
            std::thread::sleep(Duration::from_millis(1));
        }
        for i in 0..10 {
            let (mut h, mut buf) = (Header::default(), [0u8; 4]);
            let mut p = Progress::default();
            // Stamp, then header, then payload: the in-memory transport needs two calls for a
            // message, none of them waits.
            let mut calls = 0;
            while !b.recv(&mut h, PayloadMut::Host(&mut buf), &mut p).unwrap() {
                calls += 1;
                assert!(calls < 4, "message {i} still held");
            }
            assert_eq!(h.seq, i);
        }
    }

    #[test]
    fn a_held_message_offers_a_timer_that_fires_at_release() {
        let delay = Duration::from_millis(40);
        let (a, b) = pair();
        let (mut a, mut b) = (
            Delayed::new(a, delay).unwrap(),
            Delayed::new(b, delay).unwrap(),
        );
        let sent = Instant::now();
        assert!(a
            .send(&header(9, 1), Payload::Host(&[1]), &mut Progress::default())
            .unwrap());
        let (mut h, mut buf, mut p) = (Header::default(), [0u8; 1], Progress::default());
        if b.recv(&mut h, PayloadMut::Host(&mut buf), &mut p).unwrap() {
            // Only possible when this thread was descheduled for the whole delay.
            assert!(sent.elapsed() >= delay);
            return;
        }
        assert!(timer_fires(&b, 10_000), "the timer never fired");
        assert!(sent.elapsed() >= delay);
        assert_eq!(recv_all(&mut b, &mut h, &mut buf), 2);
        assert_eq!((h.seq, buf), (9, [1]));
        // Released: the timer no longer asks for attention.
        let mut fds = Vec::new();
        b.poll_fds(false, true, &mut fds);
        assert!(fds.is_empty(), "{fds:?}");
    }

    #[test]
    fn an_unwrapped_peer_is_an_error_naming_it() {
        let (mut a, b) = pair();
        let mut b = Delayed::new(b, Duration::from_micros(200)).unwrap();
        assert!(a
            .send(
                &header(1, 2),
                Payload::Host(&[1, 2]),
                &mut Progress::default()
            )
            .unwrap());
        let (mut h, mut buf, mut p) = (Header::default(), [0u8; 2], Progress::default());
        let e = loop {
            match b.recv(&mut h, PayloadMut::Host(&mut buf), &mut p) {
                Ok(false) => continue,
                Ok(true) => panic!("a message without a stamp was accepted"),
                Err(e) => break e,
            }
        };
        let msg = e.to_string();
        assert!(msg.contains("rank 0") && msg.contains("stamp"), "{msg}");
    }
    #[test]
    fn release_charges_the_delay_after_the_last_byte_less_the_receivers_lateness() {
        let d = 1_000;
        // A receiver waiting when the message is sent: delay after the last byte.
        assert_eq!(release_ns(100, 0, 100, 5_000, d), 6_000);
        // Stamp read 300 late: those 300 of the delay have passed already.
        assert_eq!(release_ns(100, 0, 400, 5_000, d), 5_700);
        // Later than the delay: at once.
        assert_eq!(release_ns(100, 0, 3_000, 5_000, d), 5_000);
        // Sent behind a message whose bytes came in until 4_000: on the wire from then, so a
        // stamp read at 4_000 was not late, although it was written at 100.
        assert_eq!(release_ns(100, 4_000, 4_000, 9_000, d), 10_000);
        assert_eq!(release_ns(100, 4_000, 4_600, 9_000, d), 9_400);
        // No delay configured.
        assert_eq!(release_ns(100, 0, 100, 5_000, 0), 5_000);
    }

    #[test]
    fn transfer_and_delay_add_up_and_back_to_back_messages_pipeline() {
        // Each payload takes `t` on the inner link; the second is queued behind the first.
        // Its last byte is in at 2t, so it may be out at 2t + d, not before (the old rule,
        // release at send time + d, would give max(d, 2t)).
        let (t, d) = (Duration::from_millis(25), Duration::from_millis(40));
        let (a, b) = pair_with(t);
        let (mut a, mut b) = (Delayed::new(a, d).unwrap(), Delayed::new(b, d).unwrap());
        let sent = Instant::now();
        for i in 0..2u8 {
            assert!(a
                .send(
                    &header(u64::from(i), 3),
                    Payload::Host(&[i; 3]),
                    &mut Progress::default()
                )
                .unwrap());
        }
        for i in 0..2u8 {
            let (mut h, mut buf) = (Header::default(), [9u8; 3]);
            recv_all(&mut b, &mut h, &mut buf);
            let want = t * (u32::from(i) + 1) + d;
            assert!(
                sent.elapsed() >= want,
                "message {i} after {:?}",
                sent.elapsed()
            );
            assert_eq!((h.seq, buf), (u64::from(i), [i; 3]));
        }
    }

    #[test]
    fn messages_in_before_the_peer_closed_are_delivered_then_the_error() {
        let (a, b) = pair();
        let closed = Arc::clone(&a.closed);
        let (mut a, mut b) = (
            Delayed::new(a, Duration::from_millis(5)).unwrap(),
            Delayed::new(b, Duration::from_millis(5)).unwrap(),
        );
        assert!(a
            .send(
                &header(4, 2),
                Payload::Host(&[4, 4]),
                &mut Progress::default()
            )
            .unwrap());
        closed.store(true, Ordering::SeqCst);
        let (mut h, mut buf) = (Header::default(), [0u8; 2]);
        recv_all(&mut b, &mut h, &mut buf);
        assert_eq!((h.seq, buf), (4, [4, 4]));
        let e = b
            .recv(&mut h, PayloadMut::Host(&mut buf), &mut Progress::default())
            .unwrap_err();
        assert!(e.to_string().contains("closed"), "{e}");
    }
    #[test]
    fn a_release_due_by_the_time_the_timer_is_armed_still_wakes_the_poller() {
        // The timer is armed for a release that has passed by the time the syscall runs (the
        // caller's `now` is older than the clock): it expires at once, and that expiry must
        // stay readable for poll(2) (clearing after arming would swallow it and leave the
        // caller asleep until its poll timeout).
        let (_, b) = pair();
        let mut b = Delayed::new(b, Duration::from_millis(1)).unwrap();
        let real_now = monotonic_ns();
        b.inbox.push_back(Inbound {
            header: header(1, 0),
            payload: Vec::new(),
            progress: Progress::default(),
            sent_ns: real_now - 2_000_000,
            stamp_read_ns: real_now - 2_000_000,
            release_ns: Some(real_now - 500_000),
        });
        b.arm_for_next_release(real_now - 1_000_000);
        assert!(
            timer_fires(&b, 1_000),
            "the expired timer did not wake poll"
        );
    }
}
