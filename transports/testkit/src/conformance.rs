//! The transport conformance suite: what every [`Connection`] must do, checked the same way
//! for each transport.
//!
//! A transport's tests call [`run`] with [`Options`] and a factory returning a connected pair
//! of fresh connections; every case takes a pair of its own. Cases may also be run one by one
//! through [`CASES`]. Every wait is bounded ([`WAIT_LIMIT`]) and names what it waited for, so a
//! transport that hangs fails instead of stalling the test run.
//!
//! | case | what it checks |
//! |---|---|
//! | `ordered_both_ways` | whole messages in order each way, and both ways at once |
//! | `partial_progress` | a message larger than any buffer moves in pieces; prefixes are usable |
//! | `zero_length` | empty messages among others |
//! | `very_large` | one message of [`Options::large_bytes`], every byte checked |
//! | `header_and_lengths` | header fields round-trip; a wrong payload or buffer length is an error |
//! | `shutdown_names_peer` | after the peer's shutdown, data sent before it still arrives, then send and recv fail naming the peer |
//! | `dropped_peer` | a peer dropped without shutdown: send and recv fail, no hang |
//! | `idle_wakes` | an end waiting on its doorbell or descriptors wakes when the peer sends |
//! | `registration` | regions stay valid while held, [`RegCache`] releases them; posted lengths are enforced by one-sided transports |
//! | `lent_receive` | where a connection lends received bytes: pieces in order, whole elements, every byte once, mixed with plain receives; a sink's error ends the call; elsewhere `recv_lent` is an error, not a panic |

use ferroccl_transport::{
    Connection, Error, Header, MemRef, Payload, PayloadMut, Progress, RegCache,
};

use crate::drive::{
    assert_same, exchange, exchange_threaded, header, pattern, patterns, send_all, wait_for,
    wait_for_error, WAIT_LIMIT,
};

/// A connected pair: the first end's peer is the second end's rank and the other way round.
pub type Pair = (Box<dyn Connection>, Box<dyn Connection>);

/// What the suite needs to know about a transport.
#[derive(Debug, Clone)]
pub struct Options {
    /// The transport's name, in failure messages.
    pub name: &'static str,
    /// Whether one-way transfers drive the two ends from two threads (`false`: alternating
    /// non-blocking calls on one thread, which every transport must also support).
    pub threads: bool,
    /// Bytes of the `partial_progress` message: more than the transport buffers between its
    /// ends, so that its first send call cannot hand it all over.
    pub partial_bytes: usize,
    /// Bytes of the `very_large` message.
    pub large_bytes: usize,
    /// Whether the transport is one-sided ([`ferroccl_transport::Properties::one_sided`]): it
    /// refuses a message whose length differs from the destination the receiver posted.
    pub one_sided: bool,
}

impl Options {
    /// Options for `name`: alternating calls, an 8 MiB partial message, a 64 MiB large one,
    /// not one-sided.
    pub fn new(name: &'static str) -> Options {
        Options {
            name,
            threads: false,
            partial_bytes: 8 << 20,
            large_bytes: 64 << 20,
            one_sided: false,
        }
    }
}

/// A case of the suite.
pub type Case = fn(&Options, &mut dyn FnMut() -> Pair);

/// Every case, by name, in the order [`run`] runs them.
pub const CASES: &[(&str, Case)] = &[
    ("ordered_both_ways", ordered_both_ways),
    ("partial_progress", partial_progress),
    ("zero_length", zero_length),
    ("very_large", very_large),
    ("header_and_lengths", header_and_lengths),
    ("shutdown_names_peer", shutdown_names_peer),
    ("dropped_peer", dropped_peer),
    ("idle_wakes", idle_wakes),
    ("registration", registration),
    ("lent_receive", lent_receive),
];

/// Runs every case of [`CASES`], each on a fresh pair from `factory`; panics at the first
/// failure, naming the transport and the case.
pub fn run(opts: &Options, mut factory: impl FnMut() -> Pair) {
    for (name, case) in CASES {
        let start = std::time::Instant::now();
        case(opts, &mut factory);
        eprintln!(
            "conformance {}: {name} ok ({:.2} s)",
            opts.name,
            start.elapsed().as_secs_f64()
        );
    }
}

/// The ranks of the two ends of a pair.
fn ranks(p: &Pair) -> (usize, usize) {
    (p.1.peer().rank, p.0.peer().rank)
}

/// Whether `e`'s message names rank `r` ("rank 1", not "rank 12").
fn names_rank(e: &Error, r: usize) -> bool {
    let pat = format!("rank {r}");
    let m = e.message();
    m.match_indices(&pat).any(|(i, _)| {
        !m[i + pat.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    })
}

fn transfer(
    opts: &Options,
    a: &mut Box<dyn Connection>,
    b: &mut Box<dyn Connection>,
    msgs: &[Vec<u8>],
) -> Vec<Vec<u8>> {
    if opts.threads {
        exchange_threaded(a, b, msgs)
    } else {
        exchange(a, b, msgs)
    }
}

fn check_all(opts: &Options, what: &str, got: &[Vec<u8>], want: &[Vec<u8>]) {
    assert_eq!(
        got.len(),
        want.len(),
        "{}: {what}: message count",
        opts.name
    );
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert_same(format_args!("{}: {what}: message #{k}", opts.name), g, w);
    }
}

/// Moves one message with header `h` from `a` to `b` by alternating calls; returns the
/// received header and payload.
fn one_message(
    a: &mut dyn Connection,
    b: &mut dyn Connection,
    h: &Header,
    msg: &[u8],
) -> (Header, Vec<u8>) {
    let (mut sp, mut rp) = (Progress::default(), Progress::default());
    let mut rh = Header::default();
    let mut buf = vec![0u8; msg.len()];
    let (mut sent, mut recvd) = (false, false);
    wait_for(format_args!("a message of {} bytes", msg.len()), || {
        if !sent {
            sent = a
                .send(h, Payload::Host(msg), &mut sp)
                .unwrap_or_else(|e| panic!("send: {e}"));
        }
        if !recvd {
            recvd = b
                .recv(&mut rh, PayloadMut::Host(&mut buf), &mut rp)
                .unwrap_or_else(|e| panic!("recv: {e}"));
        }
        (sent && recvd).then_some(())
    });
    (rh, buf)
}

/// Whole messages arrive in order each way, and both ways at once.
pub fn ordered_both_ways(opts: &Options, factory: &mut dyn FnMut() -> Pair) {
    let (mut a, mut b) = factory();
    let sizes = [0, 1, 7, 40, 4095, 4096, 4097, 100_003, 3, 0, 1 << 20, 5];
    let msgs = patterns(&sizes);
    let got = transfer(opts, &mut a, &mut b, &msgs);
    check_all(opts, "first to second", &got, &msgs);
    let got = transfer(opts, &mut b, &mut a, &msgs);
    check_all(opts, "second to first", &got, &msgs);
    // Both directions at once, alternating calls on one thread: neither end may wait for the
    // other to drain first.
    let (ma, mb) = (pattern(3 << 20, 1), pattern(3 << 20, 2));
    let (ha, hb) = (header(ma.len(), 100), header(mb.len(), 200));
    let mut ps = [
        Progress::default(),
        Progress::default(),
        Progress::default(),
        Progress::default(),
    ];
    let (mut rha, mut rhb) = (Header::default(), Header::default());
    let (mut ga, mut gb) = (vec![0u8; mb.len()], vec![0u8; ma.len()]);
    let mut done = [false; 4];
    wait_for(format!("{}: 3 MiB each way at once", opts.name), || {
        if !done[0] {
            done[0] = a.send(&ha, Payload::Host(&ma), &mut ps[0]).unwrap();
        }
        if !done[1] {
            done[1] = b.send(&hb, Payload::Host(&mb), &mut ps[1]).unwrap();
        }
        if !done[2] {
            done[2] = a
                .recv(&mut rha, PayloadMut::Host(&mut ga), &mut ps[2])
                .unwrap();
        }
        if !done[3] {
            done[3] = b
                .recv(&mut rhb, PayloadMut::Host(&mut gb), &mut ps[3])
                .unwrap();
        }
        done.iter().all(|d| *d).then_some(())
    });
    assert_eq!((rha, rhb), (hb, ha), "{}: headers both ways", opts.name);
    assert_same(
        format_args!("{}: second to first, at once", opts.name),
        &ga,
        &mb,
    );
    assert_same(
        format_args!("{}: first to second, at once", opts.name),
        &gb,
        &ma,
    );
}

/// A message larger than anything the transport buffers moves in pieces across alternating
/// calls: the first send call cannot finish it, the receiver sees its bytes before the sender
/// is done, and the prefix the receiver's [`Progress`] reports is already correct.
pub fn partial_progress(opts: &Options, factory: &mut dyn FnMut() -> Pair) {
    let (mut a, mut b) = factory();
    let len = opts.partial_bytes;
    let msg = pattern(len, 9);
    let h = header(len, 0);
    let (mut sp, mut rp) = (Progress::default(), Progress::default());
    let mut rh = Header::default();
    let mut buf = vec![0u8; len];
    let first = a.send(&h, Payload::Host(&msg), &mut sp).unwrap();
    assert!(
        !first,
        "{}: a {len}-byte message went out in one call (raise Options::partial_bytes above \
         what the transport buffers)",
        opts.name
    );
    let (mut sent, mut recvd) = (false, false);
    let (mut early, mut calls, mut last_moved) = (0usize, 0usize, 0usize);
    wait_for(
        format!("{}: a {len}-byte message in pieces", opts.name),
        || {
            if !sent {
                sent = a.send(&h, Payload::Host(&msg), &mut sp).unwrap();
                calls += 1;
            }
            if !recvd {
                recvd = b
                    .recv(&mut rh, PayloadMut::Host(&mut buf), &mut rp)
                    .unwrap();
                if rp.header_done() && !rp.started {
                    assert_eq!(rh, h, "{}: header", opts.name);
                }
                let moved = rp.moved();
                assert!(moved >= last_moved, "{}: progress went back", opts.name);
                if moved > last_moved && !sent {
                    early += 1;
                    for p in rp.parts() {
                        assert!(p.start <= p.pos && p.pos <= p.end && p.end <= len);
                        assert_same(
                            format_args!("{}: received prefix {}..{}", opts.name, p.start, p.pos),
                            &buf[p.start..p.pos],
                            &msg[p.start..p.pos],
                        );
                    }
                }
                last_moved = moved;
            }
            (sent && recvd).then_some(())
        },
    );
    assert!(calls > 1, "{}: the message went out in one call", opts.name);
    assert!(
        early > 0,
        "{}: the receiver saw no byte before the sender finished",
        opts.name
    );
    let covered: usize = sp.parts().iter().map(|p| p.end - p.start).sum();
    assert_eq!(
        covered, len,
        "{}: the sender's parts cover the payload",
        opts.name
    );
    assert_same(format_args!("{}: partial message", opts.name), &buf, &msg);
}

/// Empty messages, alone and among others, both ways.
pub fn zero_length(opts: &Options, factory: &mut dyn FnMut() -> Pair) {
    let (mut a, mut b) = factory();
    let msgs = patterns(&[0, 0, 1, 0, 2, 0]);
    let got = exchange(&mut a, &mut b, &msgs);
    check_all(opts, "empty messages", &got, &msgs);
    let got = exchange(&mut b, &mut a, &msgs);
    check_all(opts, "empty messages back", &got, &msgs);
}

/// One message of [`Options::large_bytes`], every byte checked, then a small one (the stream
/// is still in step).
pub fn very_large(opts: &Options, factory: &mut dyn FnMut() -> Pair) {
    let (mut a, mut b) = factory();
    let msgs = vec![pattern(opts.large_bytes, 3), pattern(17, 4)];
    let got = transfer(opts, &mut a, &mut b, &msgs);
    check_all(opts, "very large message", &got, &msgs);
}

/// Every header field round-trips; a payload whose length differs from the header's is refused
/// by `send` without harm to the stream; a receive buffer of the wrong length is an error that
/// leaves the buffer untouched.
pub fn header_and_lengths(opts: &Options, factory: &mut dyn FnMut() -> Pair) {
    let n = opts.name;
    let (mut a, mut b) = factory();
    let e = a
        .send(
            &header(10, 0),
            Payload::Host(&[0u8; 9]),
            &mut Progress::default(),
        )
        .expect_err("a payload shorter than its header says must be refused");
    eprintln!("{n}: mismatched send: {e}");
    let odd = [
        Header {
            kind: 255,
            dtype: 254,
            op: 253,
            seq: u64::MAX,
            count: u64::MAX - 1,
            root: u32::MAX - 2,
            len: 5,
        },
        Header {
            kind: 0,
            dtype: 0,
            op: 0,
            seq: 0,
            count: 0,
            root: 0,
            len: 0,
        },
        Header {
            kind: 0x5a,
            dtype: 0xa5,
            op: 1,
            seq: 0x0102_0304_0506_0708,
            count: 1 << 40,
            root: 7,
            len: 3,
        },
    ];
    for h in odd {
        let msg = pattern(h.len as usize, 6);
        let (rh, got) = one_message(&mut *a, &mut *b, &h, &msg);
        assert_eq!(rh, h, "{n}: header round trip");
        assert_same(format_args!("{n}: payload after odd header"), &got, &msg);
    }
    wrong_buffer(opts, &mut *a, &mut *b, 99);
    let (mut a, mut b) = factory();
    wrong_buffer(opts, &mut *a, &mut *b, 101);
}

/// Sends 100 bytes from `a`; `b` reads the header, then offers a `wrong`-byte buffer, which
/// must be an error that leaves the buffer untouched.
fn wrong_buffer(opts: &Options, a: &mut dyn Connection, b: &mut dyn Connection, wrong: usize) {
    let n = opts.name;
    let msg = pattern(100, 8);
    send_all(a, &msg, 1);
    let mut rh = Header::default();
    let mut rp = Progress::default();
    let mut exact = vec![0u8; 100];
    wait_for(format!("{n}: the header of a 100-byte message"), || {
        b.recv(&mut rh, PayloadMut::Host(&mut exact), &mut rp)
            .unwrap();
        rp.header_done().then_some(())
    });
    assert_eq!(rh.len, 100);
    let mut buf = vec![0xeeu8; wrong];
    let e = b
        .recv(&mut rh, PayloadMut::Host(&mut buf), &mut rp)
        .expect_err("a receive buffer of the wrong length must be an error");
    assert!(
        buf.iter().all(|&x| x == 0xee),
        "{n}: a {wrong}-byte buffer was written"
    );
    eprintln!("{n}: {wrong}-byte buffer for 100 bytes: {e}");
}

/// Sends 64 KiB messages on `c` until a call fails; returns the error (bounded).
fn send_until_error(c: &mut dyn Connection, what: String) -> Error {
    let msg = pattern(64 << 10, 1);
    let h = header(msg.len(), 0);
    let mut p = Progress::default();
    wait_for_error(what, || {
        if c.send(&h, Payload::Host(&msg), &mut p)? {
            p = Progress::default();
        }
        Ok(())
    })
}

/// Receives on `c` until a call fails; returns the error (bounded).
fn recv_until_error(c: &mut dyn Connection, what: String) -> Error {
    let mut h = Header::default();
    let mut p = Progress::default();
    let mut buf = Vec::new();
    wait_for_error(what, || {
        if p.header_done() && !p.started {
            buf = vec![0u8; h.len as usize];
        }
        if c.recv(&mut h, PayloadMut::Host(&mut buf), &mut p)? {
            p = Progress::default();
        }
        Ok(())
    })
}

fn check_names(opts: &Options, e: &Error, rank: usize, what: &str) {
    eprintln!("{}: {what}: {e}", opts.name);
    assert!(
        names_rank(e, rank),
        "{}: {what}: the error does not name rank {rank}: {e}",
        opts.name
    );
}

/// After the peer's shutdown, a message it sent before still arrives whole; then this end's
/// `recv` and `send` fail with errors naming the peer, and the closed end's own calls fail.
pub fn shutdown_names_peer(opts: &Options, factory: &mut dyn FnMut() -> Pair) {
    let pair = factory();
    let (ra, _) = ranks(&pair);
    let (mut a, mut b) = pair;
    let msg = pattern(1000, 2);
    send_all(&mut *a, &msg, 0);
    a.shutdown();
    let got = crate::drive::recv_all(&mut *b, msg.len(), 0);
    assert_same(
        format_args!("{}: the message sent before shutdown", opts.name),
        &got,
        &msg,
    );
    let e = recv_until_error(
        &mut *b,
        format!("{}: recv to fail after rank {ra}'s shutdown", opts.name),
    );
    check_names(opts, &e, ra, "recv after the peer's shutdown");
    let e = send_until_error(
        &mut *b,
        format!("{}: send to fail after rank {ra}'s shutdown", opts.name),
    );
    check_names(opts, &e, ra, "send after the peer's shutdown");
    recv_until_error(
        &mut *a,
        format!("{}: recv on the closed end to fail", opts.name),
    );
    send_until_error(
        &mut *a,
        format!("{}: send on the closed end to fail", opts.name),
    );
    a.shutdown(); // Idempotent.
}

/// A peer dropped without shutdown (its rank failed): this end's `recv` and `send` fail,
/// naming it, within the wait limit.
pub fn dropped_peer(opts: &Options, factory: &mut dyn FnMut() -> Pair) {
    let pair = factory();
    let (ra, _) = ranks(&pair);
    let (a, mut b) = pair;
    drop(a);
    let e = recv_until_error(
        &mut *b,
        format!("{}: recv to fail after rank {ra} was dropped", opts.name),
    );
    check_names(opts, &e, ra, "recv from a dropped peer");
    let e = send_until_error(
        &mut *b,
        format!("{}: send to fail after rank {ra} was dropped", opts.name),
    );
    check_names(opts, &e, ra, "send to a dropped peer");
}

/// An end with nothing to receive has something to sleep on (its doorbell, or descriptors
/// once a receive is under way); with a doorbell, a sleeper wakes when the peer sends.
pub fn idle_wakes(opts: &Options, factory: &mut dyn FnMut() -> Pair) {
    let (mut a, mut b) = factory();
    let mut h = Header::default();
    let mut p = Progress::default();
    let mut buf = vec![0u8; 8];
    let bell = b.doorbell();
    let seen = bell.as_ref().map(|bell| bell.seq());
    assert!(!b.recv(&mut h, PayloadMut::Host(&mut buf), &mut p).unwrap());
    let Some(bell) = bell else {
        let mut fds = Vec::new();
        b.poll_fds(false, true, &mut fds);
        assert!(
            !fds.is_empty(),
            "{}: a waiting receiver has neither doorbell nor descriptors",
            opts.name
        );
        return;
    };
    let seen = seen.expect("read with the bell");
    let msg = pattern(8, 1);
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(30));
            send_all(&mut *a, &msg, 0);
        });
        let start = std::time::Instant::now();
        while bell.seq() == seen {
            assert!(
                start.elapsed() < WAIT_LIMIT,
                "{}: the doorbell never rang",
                opts.name
            );
            bell.wait(seen, WAIT_LIMIT);
        }
    });
    wait_for(
        format!("{}: the message that rang the bell", opts.name),
        || {
            b.recv(&mut h, PayloadMut::Host(&mut buf), &mut p)
                .unwrap()
                .then_some(())
        },
    );
    assert_same(
        format_args!("{}: message after wake-up", opts.name),
        &buf,
        &msg,
    );
}

/// Regions from `register` stay valid while held, [`RegCache`] releases the ones it drops
/// ([`ferroccl_transport::Region::holders`] falls back), a posted destination is used, and a
/// one-sided transport refuses a message whose length differs from the posted one. Transports
/// without registration (`register` returns `None`) check only that posting is harmless.
pub fn registration(opts: &Options, factory: &mut dyn FnMut() -> Pair) {
    let n = opts.name;
    let (mut a, mut b) = factory();
    let mut buf = vec![0u8; 4096];
    let dst = MemRef::host(buf.as_ptr(), buf.len());
    let msg = pattern(4096, 5);
    let Some(region) = b.register(dst).unwrap() else {
        b.post_recv(dst, None).unwrap();
        let (_, got) = one_message(&mut *a, &mut *b, &header(4096, 0), &msg);
        assert_same(format_args!("{n}: after a post"), &got, &msg);
        return;
    };
    assert!(
        region.mem().contains(&dst),
        "{n}: the region covers the buffer"
    );
    assert_eq!(region.holders(), 1, "{n}: a fresh region");
    let mut cache = RegCache::new(1);
    cache.insert(0, region.clone());
    assert_eq!(region.holders(), 2);
    assert_eq!(cache.get(0, &dst).map(|r| r.key()), Some(region.key()));
    for round in 0..2u64 {
        b.post_recv(dst, Some(&region)).unwrap();
        let h = header(4096, round);
        let (mut sp, mut rp) = (Progress::default(), Progress::default());
        let mut rh = Header::default();
        let (mut sent, mut recvd) = (false, false);
        wait_for(format!("{n}: a message into a posted region"), || {
            if !sent {
                sent = a.send(&h, Payload::Host(&msg), &mut sp).unwrap();
            }
            if !recvd {
                recvd = b
                    .recv(&mut rh, PayloadMut::Host(&mut buf), &mut rp)
                    .unwrap();
            }
            (sent && recvd).then_some(())
        });
        assert_same(format_args!("{n}: posted message {round}"), &buf, &msg);
    }
    // A second buffer's region pushes the first out of the one-entry cache.
    let other = vec![0u8; 512];
    let other_ref = MemRef::host(other.as_ptr(), other.len());
    let second = b.register(other_ref).unwrap().expect("registration is on");
    cache.insert(0, second.clone());
    assert_eq!(
        region.holders(),
        1,
        "{n}: the cache released the region it dropped"
    );
    assert_eq!(second.holders(), 2);
    cache.forget(&other_ref);
    assert!(cache.is_empty());
    assert_eq!(second.holders(), 1);
    if !opts.one_sided {
        return;
    }
    // A destination outside the region is refused.
    let outside = MemRef::host(other.as_ptr(), other.len());
    let e = b
        .post_recv(outside, Some(&region))
        .expect_err("a destination outside its region");
    eprintln!("{n}: post outside the region: {e}");
    // The posted length binds the sender.
    b.post_recv(dst, Some(&region)).unwrap();
    let short = pattern(4095, 6);
    let h = header(short.len(), 9);
    let (mut sp, mut rp) = (Progress::default(), Progress::default());
    let mut rh = Header::default();
    let e = wait_for(
        format!("{n}: a message shorter than the posted destination to fail"),
        || {
            if let Err(e) = a.send(&h, Payload::Host(&short), &mut sp) {
                return Some(e);
            }
            if rp.header_done() && !rp.started {
                return b
                    .recv(&mut rh, PayloadMut::Host(&mut buf[..4095]), &mut rp)
                    .err();
            }
            b.recv(&mut rh, PayloadMut::Host(&mut buf), &mut rp).err()
        },
    );
    eprintln!("{n}: length differs from the post: {e}");
    assert!(
        e.message().contains("4096")
            && e.message().contains("4095")
            && e.message().contains("rank"),
        "{n}: the error names the peer and both sizes: {e}"
    );
}

/// Receives message `seq` of `len` bytes from `b` with [`Connection::recv_lent`] in pieces of
/// `granule`, while `a` sends `msg`; checks the pieces' order and size and returns the bytes.
fn lent_message(
    opts: &Options,
    a: &mut dyn Connection,
    b: &mut dyn Connection,
    msg: &[u8],
    seq: u64,
    granule: usize,
) -> Vec<u8> {
    let h = header(msg.len(), seq);
    let (mut sp, mut rp) = (Progress::default(), Progress::default());
    let mut rh = Header::default();
    let mut got = Vec::with_capacity(msg.len());
    let (mut sent, mut recvd) = (false, false);
    let len = msg.len();
    wait_for(
        format_args!("{}: lent message #{seq} ({len} bytes)", opts.name),
        || {
            if !sent {
                sent = a
                    .send(&h, Payload::Host(msg), &mut sp)
                    .unwrap_or_else(|e| panic!("send #{seq}: {e}"));
            }
            if !recvd {
                let mut sink = |off: usize, bytes: &[u8]| {
                    assert_eq!(
                        off,
                        got.len(),
                        "{}: piece of #{seq} out of order",
                        opts.name
                    );
                    assert!(
                        off + bytes.len() == len || bytes.len().is_multiple_of(granule),
                        "{}: piece {off}+{} of #{seq} ({len} bytes) is not whole {granule}-byte \
                         elements",
                        opts.name,
                        bytes.len()
                    );
                    got.extend_from_slice(bytes);
                    Ok(())
                };
                recvd = b
                    .recv_lent(&mut rh, len, granule, &mut rp, &mut sink)
                    .unwrap_or_else(|e| panic!("{}: recv_lent #{seq}: {e}", opts.name));
                if rp.header_done() && !rp.started {
                    assert_eq!(rh, h, "header of lent message #{seq}");
                }
            }
            (sent && recvd).then_some(())
        },
    );
    got
}

/// Where a connection lends received bytes, they arrive in order, in whole elements, each
/// once, among plain receives (so that messages start at odd ring offsets and elements
/// straddle the ring's wrap); a sink's error ends the call with it. Elsewhere `recv_lent` is an
/// error.
pub fn lent_receive(opts: &Options, factory: &mut dyn FnMut() -> Pair) {
    let (mut a, mut b) = factory();
    if !b.lends() {
        let mut p = Progress::default();
        let mut h = Header::default();
        let r = b.recv_lent(&mut h, 8, 4, &mut p, &mut |_, _| Ok(()));
        assert!(
            r.is_err(),
            "{}: recv_lent on a connection that does not lend",
            opts.name
        );
        return;
    }
    let lens = [
        0,
        1,
        7,
        63,
        64,
        1000,
        4099,
        13,
        opts.partial_bytes + 5,
        3,
        65_537,
        9,
    ];
    let granules = [1, 2, 4, 8, 16];
    let mut seq = 0u64;
    for (k, &len) in lens.iter().enumerate() {
        let g = granules[k % granules.len()];
        let msg = pattern(len, k);
        let got = lent_message(opts, &mut *a, &mut *b, &msg, seq, g);
        assert_same(
            format_args!("{}: lent #{seq} ({len} bytes, granule {g})", opts.name),
            &got,
            &msg,
        );
        seq += 1;
        // A plain message of an odd length between lent ones.
        let odd = pattern(2 * k + 1, k + 100);
        let got = exchange(&mut *a, &mut *b, std::slice::from_ref(&odd));
        assert_same(
            format_args!("{}: plain message after lent #{}", opts.name, seq - 1),
            &got[0],
            &odd,
        );
        seq += 1;
    }
    // A sink that fails ends the call with its error.
    let msg = pattern(4096, 7);
    let h = header(msg.len(), 0);
    let (mut sp, mut rp) = (Progress::default(), Progress::default());
    let mut rh = Header::default();
    let mut sent = false;
    let err = wait_for(format_args!("{}: a failing sink", opts.name), || {
        if !sent {
            sent = a
                .send(&h, Payload::Host(&msg), &mut sp)
                .unwrap_or_else(|e| panic!("send: {e}"));
        }
        b.recv_lent(&mut rh, msg.len(), 4, &mut rp, &mut |_, _| {
            Err(Error::internal("the sink refuses"))
        })
        .err()
    });
    assert!(
        err.message().contains("the sink refuses"),
        "{}: a failing sink's error: {err}",
        opts.name
    );
}
