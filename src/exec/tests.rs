//! The step driver over an in-memory connection, on a simulated clock: no sockets, no sleeping.

use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferroccl_kernels::{as_bytes, as_bytes_mut, DataType, ElemOp};
use ferroccl_transport::{
    Connection, Doorbell, ErrorKind, Header, Link, Payload, PayloadMut, PeerInfo, PollFd, Progress,
    Properties, Result, Spaces, WaitKind, HEADER_LEN,
};

use super::step::{self, OpContext, OpState, RawOp, StepEnv};
use super::wait::{SpinPolicy, SysWaiter, WaitBuffers, Waiter, Waiting};
use super::{Conn, WaitPolicy};
use crate::reduce::HostReducer;
use crate::wire::{kind, op};

/// Bytes in flight one way.
type Pipe = Arc<Mutex<VecDeque<u8>>>;

/// One end of an in-memory connection: unbounded pipes each way; a receive takes at most
/// `chunk` payload bytes per call, so that messages arrive in pieces.
#[derive(Debug)]
struct MemConn {
    peer: PeerInfo,
    tx: Pipe,
    rx: Pipe,
    chunk: usize,
}

/// Both ends of a connection between ranks `a` and `b`: (a's end, b's end).
fn mem_pair(a: usize, b: usize, chunk: usize) -> (MemConn, MemConn) {
    let (ab, ba) = (Pipe::default(), Pipe::default());
    let end = |peer: usize, tx: &Pipe, rx: &Pipe| MemConn {
        peer: PeerInfo {
            rank: peer,
            addr: format!("mem:{peer}"),
        },
        tx: Arc::clone(tx),
        rx: Arc::clone(rx),
        chunk,
    };
    (end(b, &ab, &ba), end(a, &ba, &ab))
}

impl Connection for MemConn {
    fn peer(&self) -> &PeerInfo {
        &self.peer
    }

    fn send(&mut self, h: &Header, payload: Payload<'_>, p: &mut Progress) -> Result<bool> {
        let payload = payload.host("mem")?;
        let mut tx = self.tx.lock().unwrap();
        tx.extend(h.encode());
        tx.extend(payload);
        p.header_pos = HEADER_LEN;
        p.started = true;
        p.nparts = 1;
        p.parts[0].end = payload.len();
        p.parts[0].pos = payload.len();
        Ok(true)
    }

    fn recv(&mut self, h: &mut Header, payload: PayloadMut<'_>, p: &mut Progress) -> Result<bool> {
        let payload = payload.host("mem")?;
        let mut rx = self.rx.lock().unwrap();
        if !p.header_done() {
            if rx.len() < HEADER_LEN {
                return Ok(false);
            }
            let mut b = [0u8; HEADER_LEN];
            for (d, s) in b.iter_mut().zip(rx.drain(..HEADER_LEN)) {
                *d = s;
            }
            *h = Header::decode(&b).expect("a header");
            p.header_pos = HEADER_LEN;
            return Ok(false);
        }
        if !p.started {
            p.started = true;
            p.nparts = 1;
            p.parts[0].end = payload.len();
        }
        let part = &mut p.parts[0];
        let n = (part.end - part.pos).min(rx.len()).min(self.chunk);
        for (d, s) in payload[part.pos..part.pos + n]
            .iter_mut()
            .zip(rx.drain(..n))
        {
            *d = s;
        }
        part.pos += n;
        Ok(part.pos == part.end)
    }

    fn poll_fds(&self, _sending: bool, _receiving: bool, _out: &mut Vec<PollFd>) {}

    fn shutdown(&mut self) {}
}

fn conn(c: MemConn) -> Conn {
    Conn::new(
        Box::new(c),
        Properties {
            link: Link::Shm,
            spaces: Spaces::HOST,
            one_sided: false,
            registration: false,
            wait: WaitKind::Descriptors,
            latency_us: 1.0,
            bandwidth_gbps: 1.0,
        },
    )
}

/// A clock that moves only when the driver waits: a pause costs a microsecond, a sleep its
/// whole limit.
struct SimWaiter {
    start: Instant,
    elapsed: Duration,
    sleeps: usize,
    /// Peers the driver waited on in its sleeps.
    awaited: Vec<usize>,
    /// How long each wait that ended in progress lasted, as the driver reported it.
    resumed: Vec<Duration>,
    /// The spin-or-yield state machine, fed as the real waiter feeds it.
    policy: SpinPolicy,
    /// Pauses that yielded.
    yields: usize,
    /// How long a yield takes (from 1 µs: another task, the peer, ran meanwhile).
    yield_takes: Duration,
    /// Something another rank does once the clock reaches the given time.
    at: Option<(Duration, Box<dyn FnOnce()>)>,
}

impl std::fmt::Debug for SimWaiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimWaiter")
            .field("elapsed", &self.elapsed)
            .finish_non_exhaustive()
    }
}

impl SimWaiter {
    fn new() -> Self {
        SimWaiter {
            start: Instant::now(),
            elapsed: Duration::ZERO,
            sleeps: 0,
            awaited: Vec::new(),
            resumed: Vec::new(),
            policy: SpinPolicy::default(),
            yields: 0,
            yield_takes: Duration::from_micros(2),
            at: None,
        }
    }

    /// Runs what is due at the current time.
    fn tick(&mut self) {
        if self.at.as_ref().is_some_and(|(t, _)| self.elapsed >= *t) {
            if let Some((_, f)) = self.at.take() {
                f();
            }
        }
    }
}

impl Waiter for SimWaiter {
    fn now(&self) -> Instant {
        self.start + self.elapsed
    }

    fn arm(&mut self) {}

    fn pause(&mut self, idle_for: Duration) {
        if !self.policy.spins(idle_for) {
            self.yields += 1;
            self.policy.yielded(self.yield_takes);
        }
        self.elapsed += Duration::from_micros(1);
        self.tick();
    }

    fn resumed(&mut self, idle_for: Duration) {
        self.resumed.push(idle_for);
        self.policy.resumed(idle_for);
    }

    fn sleep(&mut self, waiting: &Waiting<'_>, limit: Duration) {
        self.policy.slept();
        self.sleeps += 1;
        for (c, _) in waiting.each() {
            self.awaited.push(c.peer().rank);
        }
        self.elapsed += limit;
        self.tick();
    }
}

fn ctx(rank: usize, seq: u64) -> OpContext {
    OpContext {
        name: "all_reduce",
        seq,
        rank,
        kind: kind::ALL_REDUCE,
        dtype: DataType::Float32,
        op: op::SUM,
        count: 5,
        root: u32::MAX,
    }
}

/// One rank's engine state, minus the engine: connections, staging and per-op state.
struct Rank {
    conns: Vec<Option<Conn>>,
    staging: Vec<Vec<u8>>,
    states: Vec<OpState>,
    tx_dirty: Vec<bool>,
    rx_dirty: Vec<bool>,
    regs: ferroccl_transport::RegCache,
    abort: AtomicBool,
    wait: WaitPolicy,
}

impl Rank {
    fn new(conns: Vec<Option<Conn>>, timeout: Duration) -> Rank {
        let n = conns.len();
        Rank {
            conns,
            staging: vec![Vec::new(); 2],
            states: Vec::new(),
            tx_dirty: vec![false; n],
            rx_dirty: vec![false; n],
            regs: ferroccl_transport::RegCache::new(8),
            abort: AtomicBool::new(false),
            wait: WaitPolicy {
                spin: Duration::from_micros(20),
                timeout,
            },
        }
    }

    fn step(&mut self, w: &mut SimWaiter, ops: &[RawOp], ctx: &OpContext) -> Result<()> {
        let env = StepEnv {
            conns: &mut self.conns,
            staging: &mut self.staging,
            states: &mut self.states,
            reducer: &HostReducer,
            wait: self.wait,
            abort: &self.abort,
            tx_dirty: &mut self.tx_dirty,
            rx_dirty: &mut self.rx_dirty,
            regs: Some(&mut self.regs),
        };
        step::run(env, w, ops, DataType::Float32, ElemOp::Sum, ctx)
    }
}

/// Ranks 0 and 1, connected in memory; rank 1 receives in `chunk`-byte pieces.
fn two_ranks(chunk: usize, timeout: Duration) -> (Rank, Rank) {
    let (a, b) = mem_pair(0, 1, chunk);
    (
        Rank::new(vec![None, Some(conn(a))], timeout),
        Rank::new(vec![Some(conn(b)), None], timeout),
    )
}

#[test]
fn receive_reduce_reduces_bytes_as_they_arrive() {
    let (mut r0, mut r1) = two_ranks(6, Duration::from_secs(1));
    let sent = [1.0f32, 2.0, 3.0, 4.0, 5.0];
    let mut mine = [10.0f32, 20.0, 30.0, 40.0, 50.0];
    let len = std::mem::size_of_val(&sent);
    let c0 = ctx(0, 1);
    let send = RawOp::Send {
        peer: 1,
        ptr: as_bytes(&sent).as_ptr(),
        len,
        header: c0.header(len),
    };
    r0.step(&mut SimWaiter::new(), &[send], &c0).unwrap();
    let c1 = ctx(1, 1);
    let dst = as_bytes_mut(&mut mine).as_mut_ptr();
    let recv = RawOp::RecvReduce {
        peer: 0,
        src: dst,
        dst,
        len,
        header: c1.header(len),
    };
    let mut w = SimWaiter::new();
    r1.step(&mut w, &[recv], &c1).unwrap();
    assert_eq!(mine, [11.0, 22.0, 33.0, 44.0, 55.0]);
    assert_eq!(w.sleeps, 0, "every piece was there to take");
}

#[test]
fn timeout_fires_at_the_simulated_deadline_and_names_the_peer() {
    let timeout = Duration::from_secs(3);
    let (_r0, mut r1) = two_ranks(64, timeout);
    let mut buf = [0u8; 20];
    let c1 = ctx(1, 7);
    let recv = RawOp::Recv {
        peer: 0,
        ptr: buf.as_mut_ptr(),
        len: buf.len(),
        header: c1.header(buf.len()),
    };
    let wall = Instant::now();
    let mut w = SimWaiter::new();
    let e = r1.step(&mut w, &[recv], &c1).unwrap_err();
    assert!(wall.elapsed() < Duration::from_secs(1), "the test slept");
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert_eq!(w.elapsed, timeout, "fired at the deadline");
    assert!(
        w.sleeps >= 30,
        "slept in pieces of at most 100 ms: {}",
        w.sleeps
    );
    assert!(w.awaited.iter().all(|&p| p == 0) && !w.awaited.is_empty());
    let msg = e.to_string();
    assert!(
        msg.contains("all_reduce #7 on rank 1")
            && msg.contains("receiving from rank 0 (mem:0) (0 of 20 bytes moved)")
            && msg.contains("3.0 s"),
        "{msg}"
    );
}

#[test]
fn a_mismatched_header_names_both_ranks_at_once() {
    let (mut r0, mut r1) = two_ranks(64, Duration::from_secs(1));
    let data = [0u8; 20];
    let c0 = ctx(0, 4);
    let send = RawOp::Send {
        peer: 1,
        ptr: data.as_ptr(),
        len: 20,
        header: c0.header(20),
    };
    r0.step(&mut SimWaiter::new(), &[send], &c0).unwrap();
    let mut buf = [0u8; 20];
    let c1 = ctx(1, 5);
    let recv = RawOp::Recv {
        peer: 0,
        ptr: buf.as_mut_ptr(),
        len: 20,
        header: c1.header(20),
    };
    let mut w = SimWaiter::new();
    let e = r1.step(&mut w, &[recv], &c1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote);
    assert!(
        e.to_string()
            .contains("rank 0 is in all_reduce #4, rank 1 in all_reduce #5"),
        "{e}"
    );
    assert_eq!(w.elapsed, Duration::ZERO);
}

#[test]
fn abort_ends_a_waiting_step() {
    let (_r0, mut r1) = two_ranks(64, Duration::from_secs(10));
    r1.abort.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut buf = [0u8; 4];
    let c1 = ctx(1, 2);
    let recv = RawOp::Recv {
        peer: 0,
        ptr: buf.as_mut_ptr(),
        len: 4,
        header: c1.header(4),
    };
    let e = r1.step(&mut SimWaiter::new(), &[recv], &c1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Aborted, "{e}");
}

/// A doorbell handle over a shared word: `identity` is the word's address.
#[derive(Debug)]
struct Handle(Arc<std::sync::atomic::AtomicU32>);

impl ferroccl_transport::Doorbell for Handle {
    fn seq(&self) -> u32 {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }
    fn wait(&self, _seen: u32, _timeout: Duration) {}
    fn identity(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }
}

#[test]
fn one_doorbell_behind_several_handles_is_slept_on() {
    use ferroccl_transport::Doorbell;
    let word = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let other = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let h = |w: &Arc<std::sync::atomic::AtomicU32>| -> Arc<dyn Doorbell> {
        Arc::new(Handle(Arc::clone(w)))
    };
    // Two handles (as a transport hands out per connection) of one word: one doorbell.
    let same = super::common_doorbell([h(&word), h(&word), h(&word)].into_iter());
    assert_eq!(
        same.map(|b| b.identity()),
        Some(Arc::as_ptr(&word) as usize)
    );
    // Two words (transports of different kinds): no single doorbell wakes every wait.
    assert!(super::common_doorbell([h(&word), h(&other)].into_iter()).is_none());
    assert!(super::common_doorbell(std::iter::empty()).is_none());
}

/// The in-memory transport is one-sided in shape: a step registers each receive destination
/// once (the engine's cache keeps it) and posts it before the header comes.
#[test]
fn a_one_sided_transport_gets_posted_and_registered_destinations() {
    use ferroccl_transport::Transport;
    use ferroccl_transport_mem::{MemConfig, MemConnection, MemTransport};
    let props = MemTransport::new().properties();
    assert!(props.one_sided && props.registration);
    let (a, b) = MemConnection::pair(0, 1, &MemConfig::default());
    let timeout = Duration::from_secs(1);
    let mut r0 = Rank::new(vec![None, Some(Conn::new(Box::new(a), props))], timeout);
    let mut r1 = Rank::new(vec![Some(Conn::new(Box::new(b), props)), None], timeout);
    let mut buf = [0u8; 24];
    for seq in 1..=3u64 {
        let data: Vec<u8> = (0..24).map(|i| (i as u64 * 7 + seq) as u8).collect();
        let c0 = ctx(0, seq);
        let send = RawOp::Send {
            peer: 1,
            ptr: data.as_ptr(),
            len: data.len(),
            header: c0.header(data.len()),
        };
        r0.step(&mut SimWaiter::new(), &[send], &c0).unwrap();
        let c1 = ctx(1, seq);
        let recv = RawOp::Recv {
            peer: 0,
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            header: c1.header(buf.len()),
        };
        r1.step(&mut SimWaiter::new(), &[recv], &c1).unwrap();
        assert_eq!(&buf[..], &data[..]);
        assert_eq!(r1.regs.len(), 1, "one registration for the reused buffer");
    }
    // A destination of another length is a new registration; the old one is kept until the
    // cache needs the room.
    let mut small = [0u8; 8];
    let c0 = ctx(0, 4);
    let data = [9u8; 8];
    let send = RawOp::Send {
        peer: 1,
        ptr: data.as_ptr(),
        len: 8,
        header: c0.header(8),
    };
    r0.step(&mut SimWaiter::new(), &[send], &c0).unwrap();
    let c1 = ctx(1, 4);
    let recv = RawOp::Recv {
        peer: 0,
        ptr: small.as_mut_ptr(),
        len: 8,
        header: c1.header(8),
    };
    r1.step(&mut SimWaiter::new(), &[recv], &c1).unwrap();
    assert_eq!(small, data);
    assert_eq!(r1.regs.len(), 2);
}

/// Receives one message that rank 0 sends `after` into the wait; returns the waiter.
fn wait_for_a_message(after: Duration, policy: SpinPolicy) -> SimWaiter {
    let (mut r0, mut r1) = two_ranks(64, Duration::from_secs(1));
    let c1 = ctx(1, 1);
    let mut buf = [0u8; 8];
    let recv = RawOp::Recv {
        peer: 0,
        ptr: buf.as_mut_ptr(),
        len: 8,
        header: c1.header(8),
    };
    let mut w = SimWaiter::new();
    w.policy = policy;
    w.at = Some((
        after,
        Box::new(move || {
            let data = [7u8; 8];
            let c0 = ctx(0, 1);
            let send = RawOp::Send {
                peer: 1,
                ptr: data.as_ptr(),
                len: 8,
                header: c0.header(8),
            };
            r0.step(&mut SimWaiter::new(), &[send], &c0).unwrap();
        }),
    ));
    r1.step(&mut w, &[recv], &c1).unwrap();
    assert_eq!(buf, [7u8; 8]);
    w
}

#[test]
fn a_wait_that_needed_a_yield_makes_the_next_wait_yield_at_once() {
    // The peer answers only after this rank stopped spinning: it shares the core.
    let w = wait_for_a_message(Duration::from_micros(15), SpinPolicy::default());
    assert_eq!(
        w.resumed,
        [Duration::from_micros(15)],
        "one wait, its length"
    );
    assert!(w.policy.shared(), "{:?}", w.policy);
    // The next wait yields from its first pause; an answer within the spin would not tell.
    let w = wait_for_a_message(Duration::from_micros(3), w.policy);
    assert_eq!(w.yields, 3, "every pause yielded");
    assert!(w.policy.shared());
}

#[test]
fn a_wait_answered_while_spinning_keeps_spinning() {
    let w = wait_for_a_message(Duration::from_micros(3), SpinPolicy::default());
    assert_eq!(w.resumed, [Duration::from_micros(3)]);
    assert_eq!(w.yields, 0);
    assert!(!w.policy.shared());
    // A wait that outlasted spinning and yielding (a slow peer, not a shared core) says nothing.
    let w = wait_for_a_message(Duration::from_millis(5), SpinPolicy::default());
    assert!(w.sleeps > 0 && !w.policy.shared(), "{:?}", w.policy);
}

/// A doorbell that counts the sleeps asked of it and returns at once.
#[derive(Debug, Default)]
struct CountingBell(std::sync::atomic::AtomicUsize);

impl Doorbell for CountingBell {
    fn seq(&self) -> u32 {
        0
    }
    fn wait(&self, _seen: u32, _timeout: Duration) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn identity(&self) -> usize {
        self as *const CountingBell as usize
    }
}

/// A doorbell connection whose copies may be in flight: their end rings nothing.
#[derive(Debug)]
struct CopyingConn {
    c: MemConn,
    in_flight: bool,
}

impl Connection for CopyingConn {
    fn peer(&self) -> &PeerInfo {
        self.c.peer()
    }
    fn send(&mut self, h: &Header, payload: Payload<'_>, p: &mut Progress) -> Result<bool> {
        self.c.send(h, payload, p)
    }
    fn recv(&mut self, h: &mut Header, payload: PayloadMut<'_>, p: &mut Progress) -> Result<bool> {
        self.c.recv(h, payload, p)
    }
    fn poll_fds(&self, _sending: bool, _receiving: bool, _out: &mut Vec<PollFd>) {}
    fn in_flight(&self) -> bool {
        self.in_flight
    }
    fn shutdown(&mut self) {}
}

#[test]
fn a_wait_on_a_copy_in_flight_polls_instead_of_sleeping_on_the_doorbell() {
    // A GPU copy's end rings no doorbell: a sleep there lasted its whole limit (100 ms a step
    // on a GPU). With nothing in flight the waiter sleeps on the doorbell as before.
    for in_flight in [false, true] {
        let (a, _b) = mem_pair(0, 1, 64);
        let props = Properties {
            wait: WaitKind::Doorbell,
            ..conn(mem_pair(0, 1, 1).0).props
        };
        let conns = vec![
            None,
            Some(Conn::new(Box::new(CopyingConn { c: a, in_flight }), props)),
        ];
        let mut buf = [0u8; 8];
        let ops = [RawOp::Recv {
            peer: 1,
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            header: ctx(0, 1).header(buf.len()),
        }];
        let st = [OpState::default()];
        let bell = CountingBell::default();
        let mut bufs = WaitBuffers::default();
        let mut w = SysWaiter::new(Some(&bell), &mut bufs);
        w.arm();
        let waiting = Waiting {
            conns: &conns,
            ops: &ops,
            st: &st,
        };
        w.sleep(&waiting, Duration::from_secs(5));
        let sleeps = bell.0.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(sleeps, usize::from(!in_flight), "in flight: {in_flight}");
    }
}
