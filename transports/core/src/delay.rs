//! A connection wrapper that adds a fixed one-way delay to every message: test and benchmark
//! tooling for links slower than the machine's own (this kernel has no `netem` qdisc).
//!
//! [`Delayed`] wraps any [`Connection`]; both ends of a pair must be wrapped. In front of each
//! message the sender writes a stamp (a header-only message carrying its send time on the
//! monotonic clock). The receiver reads the stamp and starts reading the message itself only
//! once `send time + delay` has passed; until then its [`Connection::poll_fds`] is a timer
//! that fires at that moment. Delays therefore overlap: a burst of messages sent together is
//! delivered together one delay later, and bandwidth is limited only by what the inner
//! transport buffers while the receiver waits (as a real link's bandwidth-delay product).
//!
//! The stamps compare clocks of the two ends, so both must share the monotonic clock: ranks on
//! one machine (threads, processes, network namespaces), which is where this wrapper is meant
//! to run.

use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use crate::{Connection, Error, Header, PeerInfo, PollFd, Progress, Result};

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

/// Where the receiving side stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RxState {
    /// Reading the next stamp (into `Delayed::rx_stamp`).
    Stamp,
    /// Holding the next message until the monotonic clock reaches this many nanoseconds.
    Hold(u64),
    /// Reading the message itself.
    Message,
}

/// A connection whose messages arrive `delay` after they were sent (see the module docs).
pub struct Delayed<C> {
    inner: C,
    delay_ns: u64,
    tx: TxState,
    rx: RxState,
    /// The stamp being written and its progress.
    tx_stamp: (Header, Progress),
    /// The stamp being read and its progress.
    rx_stamp: (Header, Progress),
    timer: Timer,
}

impl<C: Connection> fmt::Debug for Delayed<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delayed")
            .field("inner", &self.inner)
            .field("delay_ns", &self.delay_ns)
            .field("tx", &self.tx)
            .field("rx", &self.rx)
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
            rx: RxState::Stamp,
            tx_stamp: (Header::default(), Progress::default()),
            rx_stamp: (Header::default(), Progress::default()),
            timer: Timer::new()?,
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
}

impl<C: Connection> Connection for Delayed<C> {
    fn peer(&self) -> &PeerInfo {
        self.inner.peer()
    }

    fn send(&mut self, header: &Header, payload: &[u8], progress: &mut Progress) -> Result<bool> {
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
            if !self.inner.send(stamp, &[], p)? {
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
        payload: &mut [u8],
        progress: &mut Progress,
    ) -> Result<bool> {
        if self.rx == RxState::Stamp {
            let (stamp, p) = &mut self.rx_stamp;
            // Header first (the inner transport stops there), then the empty payload.
            while !self.inner.recv(stamp, &mut [], p)? {
                if !p.header_done() {
                    return Ok(false);
                }
                if stamp.kind != STAMP_KIND || stamp.len != 0 {
                    return Err(Error::internal(format!(
                        "link delay: expected a send-time stamp from {}, got a message of kind \
                         {} with {} bytes (set FERRO_LINK_DELAY_US alike on every rank)",
                        self.inner.peer(),
                        stamp.kind,
                        stamp.len
                    )));
                }
            }
            let release = stamp.seq.saturating_add(self.delay_ns);
            self.rx = RxState::Hold(release);
            self.timer.arm(release.max(1));
        }
        if let RxState::Hold(release) = self.rx {
            if monotonic_ns() < release {
                return Ok(false);
            }
            self.timer.arm(0);
            self.timer.clear();
            self.rx = RxState::Message;
        }
        let done = self.inner.recv(header, payload, progress)?;
        if done {
            self.rx = RxState::Stamp;
            self.rx_stamp = (Header::default(), Progress::default());
        }
        Ok(done)
    }

    fn poll_fds(&self, sending: bool, receiving: bool, out: &mut Vec<PollFd>) {
        let holding = matches!(self.rx, RxState::Hold(_));
        if receiving && holding {
            out.push(PollFd {
                fd: self.timer.fd.as_raw_fd(),
                read: true,
                write: false,
            });
        }
        self.inner.poll_fds(sending, receiving && !holding, out);
    }

    fn shutdown(&mut self) {
        self.inner.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    use super::*;

    type Queue = Arc<Mutex<VecDeque<(Header, Vec<u8>)>>>;

    /// One end of an in-memory connection: whole messages, delivered at once. The header is
    /// handed out on one call and the payload on the next, like the TCP transport.
    #[derive(Debug)]
    struct Mem {
        peer: PeerInfo,
        out: Queue,
        inbox: Queue,
    }

    fn pair() -> (Mem, Mem) {
        let (a, b): (Queue, Queue) = (Arc::default(), Arc::default());
        let end = |rank, out: &Queue, inbox: &Queue| Mem {
            peer: PeerInfo {
                rank,
                addr: format!("mem{rank}"),
            },
            out: Arc::clone(out),
            inbox: Arc::clone(inbox),
        };
        (end(1, &a, &b), end(0, &b, &a))
    }

    impl Connection for Mem {
        fn peer(&self) -> &PeerInfo {
            &self.peer
        }

        fn send(&mut self, h: &Header, payload: &[u8], p: &mut Progress) -> Result<bool> {
            assert_eq!(h.len, payload.len() as u64);
            self.out.lock().unwrap().push_back((*h, payload.to_vec()));
            p.header_pos = crate::HEADER_LEN;
            p.started = true;
            Ok(true)
        }

        fn recv(&mut self, h: &mut Header, payload: &mut [u8], p: &mut Progress) -> Result<bool> {
            let mut q = self.inbox.lock().unwrap();
            let Some((head, body)) = q.front() else {
                return Ok(false);
            };
            if !p.header_done() {
                *h = *head;
                p.header_pos = crate::HEADER_LEN;
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
            if c.recv(h, buf, &mut p).unwrap() {
                return calls;
            }
            std::thread::yield_now();
        }
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
            assert!(a.send(&h, &body, &mut Progress::default()).unwrap());
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
                .send(&header(i, 4), &[7; 4], &mut Progress::default())
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
            while !b.recv(&mut h, &mut buf, &mut p).unwrap() {
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
            .send(&header(9, 1), &[1], &mut Progress::default())
            .unwrap());
        let (mut h, mut buf, mut p) = (Header::default(), [0u8; 1], Progress::default());
        if b.recv(&mut h, &mut buf, &mut p).unwrap() {
            // Only possible when this thread was descheduled for the whole delay.
            assert!(sent.elapsed() >= delay);
            return;
        }
        let mut fds = Vec::new();
        b.poll_fds(false, true, &mut fds);
        assert_eq!(fds.len(), 1, "{fds:?}");
        let mut pfd = libc::pollfd {
            fd: fds[0].fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; the limit only bounds a broken timer.
        let n = unsafe { libc::poll(&mut pfd, 1, 10_000) };
        assert_eq!(n, 1, "the timer never fired");
        assert!(sent.elapsed() >= delay);
        assert_eq!(recv_all(&mut b, &mut h, &mut buf), 2);
        assert_eq!((h.seq, buf), (9, [1]));
        // Released: the timer no longer asks for attention.
        fds.clear();
        b.poll_fds(false, true, &mut fds);
        assert!(fds.is_empty(), "{fds:?}");
    }

    #[test]
    fn an_unwrapped_peer_is_an_error_naming_it() {
        let (mut a, b) = pair();
        let mut b = Delayed::new(b, Duration::from_micros(200)).unwrap();
        assert!(a
            .send(&header(1, 2), &[1, 2], &mut Progress::default())
            .unwrap());
        let (mut h, mut buf, mut p) = (Header::default(), [0u8; 2], Progress::default());
        let e = loop {
            match b.recv(&mut h, &mut buf, &mut p) {
                Ok(false) => continue,
                Ok(true) => panic!("a message without a stamp was accepted"),
                Err(e) => break e,
            }
        };
        let msg = e.to_string();
        assert!(msg.contains("rank 0") && msg.contains("stamp"), "{msg}");
    }
}
