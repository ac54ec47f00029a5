use super::client::quote;
use super::*;
use proptest::strategy::Strategy as _;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Instant;

use crate::bootstrap::Store;
use crate::ErrorKind;

fn local0() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)
}

fn pair() -> (TcpStoreServer, TcpStore) {
    let server = TcpStoreServer::bind(local0()).unwrap();
    let client = TcpStore::connect(server.local_addr(), Duration::from_secs(5)).unwrap();
    (server, client)
}

#[test]
fn wire_round_trips() {
    let reqs = [
        Request::Set {
            key: "k/1",
            value: b"v\x00\xff",
        },
        Request::Set {
            key: "",
            value: b"",
        },
        Request::Get {
            key: "rank7",
            wait_ms: 12345,
        },
        Request::Add {
            key: "ctr",
            delta: -42,
        },
    ];
    for r in &reqs {
        let f = wire::encode_request(r);
        let len = wire::frame_len([f[0], f[1], f[2], f[3]]).unwrap();
        assert_eq!(len, f.len() - 4);
        assert_eq!(&wire::decode_request(&f[4..]).unwrap(), r);
    }
    assert!(wire::decode_request(&[9, 1, 2]).is_err());
    assert!(wire::decode_request(&[1, 200, 0, 0, 0, b'a']).is_err());
    assert!(wire::decode_request(&[]).is_err());
    assert_eq!(wire::frame_len(u32::MAX.to_le_bytes()), None);
    let resps = [
        Response::Done(b"xyz".to_vec()),
        Response::TimedOut,
        Response::Failed {
            bad_argument: true,
            message: "why".into(),
        },
        Response::Closing,
    ];
    for r in resps {
        let f = wire::encode_response(&r);
        assert_eq!(wire::decode_response(f[4..].to_vec()).unwrap(), r);
    }
    let h = wire::hello(0xdead_beef);
    assert_eq!(wire::parse_hello(&h), Some((PROTOCOL_VERSION, 0xdead_beef)));
    assert_eq!(wire::parse_hello(b"GET / HTTP/1.1\r\nHost"), None);
}

#[test]
fn set_get_add() {
    let (_server, s) = pair();
    s.set("rank0/addr", b"10.0.0.1:5000").unwrap();
    s.set("rank1/addr", b"10.0.0.2:5001").unwrap();
    assert_eq!(
        s.get("rank0/addr", Duration::ZERO).unwrap(),
        b"10.0.0.1:5000"
    );
    assert_eq!(
        s.get("rank1/addr", Duration::ZERO).unwrap(),
        b"10.0.0.2:5001"
    );
    let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    s.set("big", &big).unwrap();
    assert_eq!(s.get("big", Duration::ZERO).unwrap(), big);
    assert_eq!(s.add("n", 10).unwrap(), 10);
    assert_eq!(s.add("n", -3).unwrap(), 7);
    assert_eq!(s.get("n", Duration::ZERO).unwrap(), b"7");
    let e = s.add("rank0/addr", 1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidUsage);
    // The connection is still usable after a failed request.
    assert_eq!(s.add("n", 1).unwrap(), 8);
    let e = s.set(&"k".repeat(MAX_KEY_LEN + 1), b"").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn get_waits_for_another_clients_set() {
    let (server, s) = pair();
    let addr = server.local_addr();
    let t = thread::spawn(move || {
        let w = TcpStore::connect(addr, Duration::from_secs(5)).unwrap();
        thread::sleep(Duration::from_millis(50));
        w.set("late", b"late-value").unwrap();
    });
    assert_eq!(
        s.get("late", Duration::from_secs(10)).unwrap(),
        b"late-value"
    );
    t.join().unwrap();
}

#[test]
fn one_client_shared_by_threads_does_not_deadlock() {
    fn assert_sync<T: Send + Sync>() {}
    assert_sync::<TcpStore>();
    let (_server, s) = pair();
    let s = Arc::new(s);
    let setter = {
        let s = Arc::clone(&s);
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(50));
            // Runs while the other thread waits in get on the same client.
            s.set("x", b"from-setter").unwrap();
            s.add("n", 2).unwrap()
        })
    };
    assert_eq!(s.get("x", Duration::from_secs(10)).unwrap(), b"from-setter");
    assert_eq!(setter.join().unwrap(), 2);
    assert_eq!(s.add("n", 1).unwrap(), 3);
}

#[test]
fn get_timeout_names_key_and_address() {
    let (server, s) = pair();
    let start = Instant::now();
    let e = s.get("absent", Duration::from_millis(80)).unwrap_err();
    assert!(start.elapsed() >= Duration::from_millis(80));
    assert!(start.elapsed() < Duration::from_secs(4));
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert!(e.message().contains("'absent'"), "{e}");
    assert!(
        e.message().contains(&server.local_addr().to_string()),
        "{e}"
    );
    // Still usable afterwards.
    s.set("absent", b"now").unwrap();
    assert_eq!(s.get("absent", Duration::ZERO).unwrap(), b"now");
}

#[test]
fn many_clients_wait_at_once() {
    const N: usize = 24;
    let server = TcpStoreServer::bind(local0()).unwrap();
    let addr = server.local_addr();
    let threads: Vec<_> = (0..N)
        .map(|r| {
            thread::spawn(move || {
                let s = TcpStore::connect(addr, Duration::from_secs(10)).unwrap();
                // Everyone waits for the key of the next rank, set after a delay by it.
                s.set(&format!("rank{r}"), format!("addr-of-{r}").as_bytes())
                    .unwrap();
                let mut seen = Vec::new();
                for p in 0..N {
                    let v = s.get(&format!("rank{p}"), Duration::from_secs(20)).unwrap();
                    seen.push(String::from_utf8(v).unwrap());
                }
                let arrived = s.add("arrived", 1).unwrap();
                (seen, arrived)
            })
        })
        .collect();
    let mut arrivals = Vec::new();
    for t in threads {
        let (seen, arrived) = t.join().unwrap();
        let want: Vec<String> = (0..N).map(|p| format!("addr-of-{p}")).collect();
        assert_eq!(seen, want);
        arrivals.push(arrived);
    }
    arrivals.sort_unstable();
    assert_eq!(arrivals, (1..=N as i64).collect::<Vec<_>>());
}

#[test]
fn strangers_are_rejected_without_disturbing_clients() {
    let (server, s) = pair();
    let addr = server.local_addr();
    s.set("before", b"1").unwrap();
    // A client waits through the whole episode.
    let waiter = thread::spawn(move || {
        let w = TcpStore::connect(addr, Duration::from_secs(5)).unwrap();
        w.get("after", Duration::from_secs(20)).unwrap()
    });
    // An HTTP client: closed without an answer.
    let mut http = TcpStream::connect(addr).unwrap();
    http.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut buf = Vec::new();
    assert_eq!(
        http.read_to_end(&mut buf).map(|_| buf.len()).unwrap_or(0),
        0
    );
    // Garbage bytes.
    let mut junk = TcpStream::connect(addr).unwrap();
    let garbage: Vec<u8> = (0..5000u32).map(|i| (i * 7919 % 256) as u8).collect();
    let _ = junk.write_all(&garbage);
    // A right hello followed by an absurd frame length.
    let mut liar = TcpStream::connect(addr).unwrap();
    liar.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    liar.write_all(&wire::hello(0)).unwrap();
    let mut reply = [0u8; wire::REPLY_LEN];
    liar.read_exact(&mut reply).unwrap();
    assert_eq!(wire::parse_reply(&reply), Some((PROTOCOL_VERSION, 0)));
    liar.write_all(&u32::MAX.to_le_bytes()).unwrap();
    let mut rest = Vec::new();
    assert_eq!(
        liar.read_to_end(&mut rest).map(|_| rest.len()).unwrap_or(0),
        0
    );
    // A right hello then an unknown opcode.
    let mut odd = TcpStream::connect(addr).unwrap();
    odd.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    odd.write_all(&wire::hello(0)).unwrap();
    odd.read_exact(&mut reply).unwrap();
    odd.write_all(&[1, 0, 0, 0, 99]).unwrap();
    let mut rest = Vec::new();
    assert_eq!(
        odd.read_to_end(&mut rest).map(|_| rest.len()).unwrap_or(0),
        0
    );
    // A silent stranger stays connected; it must not block anyone either.
    let _silent = TcpStream::connect(addr).unwrap();
    // The real clients carry on.
    assert_eq!(s.get("before", Duration::ZERO).unwrap(), b"1");
    s.set("after", b"2").unwrap();
    assert_eq!(waiter.join().unwrap(), b"2");
    assert_eq!(s.add("c", 5).unwrap(), 5);
}

#[test]
fn job_magic_and_wrong_servers_are_reported() {
    let server = TcpStoreServer::bind_with_magic(local0(), 0x1234_5678_9abc_def0).unwrap();
    let addr = server.local_addr();
    let good =
        TcpStore::connect_with_magic(addr, 0x1234_5678_9abc_def0, Duration::from_secs(5)).unwrap();
    good.set("k", b"v").unwrap();
    assert_eq!(good.get("k", Duration::ZERO).unwrap(), b"v");
    assert_eq!(good.local_ip(), Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    // Neither a client that does not know the magic (0) nor one with another magic gets in,
    // and both are told at once.
    for magic in [0, 7, 0x1234_5678_9abc_def1] {
        let start = Instant::now();
        let e = TcpStore::connect_with_magic(addr, magic, Duration::from_secs(10)).unwrap_err();
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(e.kind(), ErrorKind::InvalidUsage);
        assert!(e.message().contains("another job"), "{e}");
        assert!(e.message().contains(&addr.to_string()), "{e}");
        assert!(e.message().contains(&format!("{magic:#018x}")), "{e}");
    }
    let e = TcpStore::connect(addr, Duration::from_secs(5)).unwrap_err();
    assert!(e.message().contains("another job"), "{e}");
    // The refused ones left nothing behind: the good client alone is served.
    wait_until(Duration::from_secs(2), || {
        server.connection_counts() == (0, 1)
    });
    assert_eq!(good.get("k", Duration::ZERO).unwrap(), b"v");
}

#[test]
fn an_open_server_serves_any_magic() {
    let (server, s) = pair();
    s.set("k", b"v").unwrap();
    for magic in [1, 7, u64::MAX] {
        let c = TcpStore::connect_with_magic(server.local_addr(), magic, Duration::from_secs(5))
            .unwrap();
        assert_eq!(c.get("k", Duration::ZERO).unwrap(), b"v");
    }
}

#[test]
fn connect_waits_for_a_late_server() {
    // Find a free port, then start the server there only after the client began trying.
    let port = TcpListener::bind(local0())
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
    let t = thread::spawn(move || {
        thread::sleep(Duration::from_millis(150));
        let server = TcpStoreServer::bind(addr).unwrap();
        server.shared.table.set("ready", b"yes").unwrap();
        thread::sleep(Duration::from_secs(2));
        drop(server);
    });
    let s = TcpStore::connect(addr, Duration::from_secs(10)).unwrap();
    assert_eq!(s.get("ready", Duration::from_secs(5)).unwrap(), b"yes");
    t.join().unwrap();
}

#[test]
fn connect_times_out_when_nobody_listens() {
    let port = TcpListener::bind(local0())
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
    let start = Instant::now();
    let e = TcpStore::connect(addr, Duration::from_millis(200)).unwrap_err();
    assert!(start.elapsed() >= Duration::from_millis(200));
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert!(e.message().contains(&addr.to_string()), "{e}");
}

#[test]
fn dropping_the_server_is_prompt_and_fails_waiters() {
    let (server, s) = pair();
    let addr = server.local_addr();
    let waiter = thread::spawn(move || {
        let w = TcpStore::connect(addr, Duration::from_secs(5)).unwrap();
        w.get("never", Duration::from_secs(60))
    });
    let _silent = TcpStream::connect(addr).unwrap();
    thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    drop(server);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    let e = waiter.join().unwrap().unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(3));
    assert_eq!(e.kind(), ErrorKind::Remote);
    assert!(e.message().contains(&addr.to_string()), "{e}");
    // A later call reports the lost store by address.
    let e = s.set("k", b"v").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote);
    assert!(e.message().contains(&addr.to_string()), "{e}");
}

/// Polls `cond` until it holds; panics after `limit`.
fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < limit,
            "condition still false after {limit:?}"
        );
        thread::sleep(Duration::from_millis(10));
    }
}

/// Threads of this process (0 where `/proc` is missing).
fn process_threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, Iterator::count)
}

fn server_with(magic: u64, limits: Limits) -> TcpStoreServer {
    TcpStoreServer::start(local0(), magic, limits).unwrap()
}

/// A listener that accepts every connection and never says anything on it, except that it
/// answers the first hello as a store would when `genuine_first`. Stops when dropped.
struct SilentListener {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl SilentListener {
    fn start(genuine_first: bool) -> SilentListener {
        let listener = TcpListener::bind(local0()).unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = thread::spawn({
            let stop = Arc::clone(&stop);
            move || {
                let mut held = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let Ok((mut s, _)) = listener.accept() else {
                        thread::sleep(Duration::from_millis(5));
                        continue;
                    };
                    s.set_nonblocking(false).unwrap();
                    if genuine_first && held.is_empty() {
                        let mut hello = [0u8; wire::HELLO_LEN];
                        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                        s.read_exact(&mut hello).unwrap();
                        s.write_all(&wire::reply(wire::HELLO_OK)).unwrap();
                    }
                    held.push(s);
                }
            }
        });
        SilentListener {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for SilentListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A reader over a slice, for the frame reader.
impl TimedRead for &[u8] {
    fn set_wait(&mut self, _: Option<Duration>) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn frame_bodies_grow_with_the_bytes_that_arrive() {
    // A frame announcing 64 MiB followed by 10 bytes and the end of the stream.
    let mut bytes = (64u32 << 20).to_le_bytes().to_vec();
    bytes.extend_from_slice(b"0123456789");
    let mut r = &bytes[..];
    let e = read_frame(&mut r, FrameDeadline::By(None)).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    let mut body = Vec::new();
    let mut r = &bytes[4..];
    let e = read_body(&mut r, 64 << 20, &mut body, None).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    assert_eq!(body, b"0123456789");
    assert!(body.capacity() <= 2 * READ_PIECE, "{}", body.capacity());
    // A whole frame in many small reads.
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    let mut framed = (payload.len() as u32).to_le_bytes().to_vec();
    framed.extend_from_slice(&payload);
    let mut r = &framed[..];
    assert_eq!(
        read_frame(&mut r, FrameDeadline::By(None)).unwrap(),
        Some(payload)
    );
    assert_eq!(read_frame(&mut r, FrameDeadline::By(None)).unwrap(), None);
    // A deadline that has passed stops the read.
    let mut r = &framed[..];
    let e = read_frame(&mut r, FrameDeadline::By(Some(Instant::now()))).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::TimedOut);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

    #[test]
    fn decoders_take_any_bytes(
        bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
        op in 0u8..5,
        hello in proptest::prelude::any::<[u8; wire::HELLO_LEN]>(),
        reply in proptest::prelude::any::<[u8; wire::REPLY_LEN]>(),
        header in proptest::prelude::any::<[u8; 4]>(),
    ) {
        // Random bytes, and random bytes behind each opcode (also the valid ones).
        let _ = wire::decode_request(&bytes);
        let mut with_op = vec![op];
        with_op.extend_from_slice(&bytes);
        if let Ok(req) = wire::decode_request(&with_op) {
            // Whatever decodes encodes back to the same bytes.
            let f = wire::encode_request(&req);
            proptest::prop_assert_eq!(&f[4..], &with_op[..]);
        }
        let _ = wire::decode_response(bytes.clone());
        let _ = wire::decode_response(with_op);
        if let Some((version, magic)) = wire::parse_hello(&hello) {
            let mut again = wire::hello(magic);
            again[8..10].copy_from_slice(&version.to_le_bytes());
            proptest::prop_assert_eq!(again, hello);
        }
        if wire::parse_reply(&reply).is_some() {
            proptest::prop_assert!(wire::could_be_reply(&reply));
        }
        match wire::frame_len(header) {
            Some(n) => proptest::prop_assert_eq!(n, u32::from_le_bytes(header) as usize),
            None => proptest::prop_assert!(u32::from_le_bytes(header) as usize > wire::MAX_FRAME),
        }
        // The frame reader on any stream: never more than it announced, nothing past the
        // end.
        let mut r = &bytes[..];
        if let Ok(Some(body)) = read_frame(&mut r, FrameDeadline::By(None)) {
            proptest::prop_assert_eq!(body.len() + 4, bytes.len() - r.len());
        }
    }

    #[test]
    fn requests_and_responses_round_trip(
        key in proptest::collection::vec(proptest::prelude::any::<char>(), 0..=MAX_KEY_LEN / 4)
            .prop_map(|c| c.into_iter().collect::<String>()),
        value in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
        wait_ms in proptest::prelude::any::<u64>(),
        delta in proptest::prelude::any::<i64>(),
        message in ".{0,80}",
        bad_argument in proptest::prelude::any::<bool>(),
    ) {
        proptest::prop_assert!(key.len() <= MAX_KEY_LEN);
        for req in [
            Request::Set { key: &key, value: &value },
            Request::Get { key: &key, wait_ms },
            Request::Add { key: &key, delta },
        ] {
            let f = wire::encode_request(&req);
            let len = wire::frame_len([f[0], f[1], f[2], f[3]]);
            proptest::prop_assert_eq!(len, Some(f.len() - 4));
            proptest::prop_assert_eq!(wire::decode_request(&f[4..]), Ok(req));
        }
        for resp in [
            Response::Done(value.clone()),
            Response::TimedOut,
            Response::Failed { bad_argument, message: message.clone() },
            Response::Closing,
        ] {
            let f = wire::encode_response(&resp);
            let mut r = &f[..];
            let body = read_frame(&mut r, FrameDeadline::By(None)).unwrap().unwrap();
            proptest::prop_assert_eq!(wire::decode_response(body), Ok(resp));
        }
    }
}

#[test]
fn longest_key_round_trips_and_one_more_byte_does_not() {
    let key = "\u{1F600}".repeat(MAX_KEY_LEN / 4);
    assert_eq!(key.len(), MAX_KEY_LEN);
    let f = wire::encode_request(&Request::Get {
        key: &key,
        wait_ms: 1,
    });
    assert_eq!(
        wire::decode_request(&f[4..]),
        Ok(Request::Get {
            key: &key,
            wait_ms: 1
        })
    );
    let longer = format!("{key}x");
    let f = wire::encode_request(&Request::Get {
        key: &longer,
        wait_ms: 1,
    });
    assert!(wire::decode_request(&f[4..]).is_err());
}

#[test]
fn random_strangers_never_disturb_a_client() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    let server = TcpStoreServer::bind(local0()).unwrap();
    let addr = server.local_addr();
    let client = TcpStore::connect(addr, Duration::from_secs(5)).unwrap();
    // A stranger: a hello or not, some frames with a random opcode and body (so that
    // requests get decoded), then random bytes.
    let frames = proptest::collection::vec(
        (0u8..5, proptest::collection::vec(any::<u8>(), 0..40)),
        0..4,
    );
    let stranger = (
        any::<bool>(),
        frames,
        proptest::collection::vec(any::<u8>(), 0..64),
    );
    let case = std::cell::Cell::new(0i64);
    let mut runner = TestRunner::new(Config {
        cases: 32,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&proptest::collection::vec(stranger, 1..4), |strangers| {
            let n = case.get() + 1;
            case.set(n);
            let mut socks = Vec::new();
            for (hello, frames, tail) in &strangers {
                let mut bytes = Vec::new();
                if *hello {
                    bytes.extend_from_slice(&wire::hello(0));
                }
                for (op, body) in frames {
                    bytes.extend_from_slice(&(body.len() as u32 + 1).to_le_bytes());
                    bytes.push(*op);
                    bytes.extend_from_slice(body);
                }
                bytes.extend_from_slice(tail);
                let mut s = TcpStream::connect(addr).unwrap();
                // The server may have closed it already: that is its right.
                let _ = s.write_all(&bytes);
                socks.push(s);
            }
            let key = format!("real/client/{n}");
            client.set(&key, n.to_string().as_bytes()).unwrap();
            prop_assert_eq!(
                client.get(&key, Duration::ZERO).unwrap(),
                n.to_string().into_bytes()
            );
            prop_assert_eq!(client.add("real/client/count", 1).unwrap(), n);
            Ok(())
        })
        .unwrap();
    assert_eq!(server.panics(), 0);
    assert!(!server.accept_thread.as_ref().unwrap().is_finished());
    // Every stranger is gone (they closed), and a new client is served.
    wait_until(Duration::from_secs(3), || server.connection_counts().0 == 0);
    let late = TcpStore::connect(addr, Duration::from_secs(5)).unwrap();
    assert_eq!(late.add("real/client/count", 0).unwrap(), case.get());
}

#[test]
fn the_store_stops_growing_at_its_byte_limit() {
    const LIMIT: usize = 4 << 20;
    let server = server_with(
        0,
        Limits {
            store_bytes: LIMIT,
            ..Limits::DEFAULT
        },
    );
    let s = TcpStore::connect(server.local_addr(), Duration::from_secs(5)).unwrap();
    let value = vec![7u8; 1 << 20];
    let mut stored = 0;
    for i in 0..16 {
        match s.set(&format!("big{i:02}"), &value) {
            Ok(()) => stored += 1,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::InvalidUsage);
                assert!(e.message().contains(&format!("'big{i:02}'")), "{e}");
                assert!(
                    e.message().contains(&format!(
                        "store full: {} bytes held, at most {LIMIT}",
                        3 * ((1 << 20) + 5)
                    )),
                    "{e}"
                );
            }
        }
        assert!(server.held_bytes() <= LIMIT);
    }
    // 3 x (1 MiB + 5) fits in 4 MiB, a fourth does not.
    assert_eq!(stored, 3);
    assert_eq!(server.held_bytes(), 3 * ((1 << 20) + 5));
    // The connection is still usable; small things and replacements still fit.
    s.set("small", b"x").unwrap();
    assert_eq!(s.get("small", Duration::ZERO).unwrap(), b"x");
    assert_eq!(s.add("n", 2).unwrap(), 2);
    s.set("big00", &value).unwrap();
    assert_eq!(s.get("big00", Duration::ZERO).unwrap(), value);
    assert_eq!(server.held_bytes(), 3 * ((1 << 20) + 5) + 6 + 2);
    // The cap a real server uses.
    assert_eq!(Limits::DEFAULT.store_bytes, MAX_STORE_BYTES);
}

#[test]
fn silent_strangers_hold_few_threads_and_clients_carry_on() {
    const CAP: usize = 16;
    const SILENT: usize = 200;
    // Other tests running at the same time may start threads too.
    const SLACK: usize = 80;
    let hello_timeout = Duration::from_millis(600);
    let server = server_with(
        0x77,
        Limits {
            pending_hellos: CAP,
            hello_timeout,
            ..Limits::DEFAULT
        },
    );
    let addr = server.local_addr();
    let client = TcpStore::connect_with_magic(addr, 0x77, Duration::from_secs(5)).unwrap();
    client.set("k", b"v").unwrap();
    let before = process_threads();
    let silent: Vec<TcpStream> = (0..SILENT)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    thread::sleep(Duration::from_millis(100));
    let (pending, served) = server.connection_counts();
    assert!(pending <= CAP, "{pending} pending hellos");
    assert_eq!(served, 1);
    let during = process_threads();
    assert!(
        during <= before + CAP + SLACK,
        "{before} threads before {SILENT} silent connections, {during} with them"
    );
    // The client is answered at once meanwhile.
    let start = Instant::now();
    client.set("k2", b"v2").unwrap();
    assert_eq!(client.get("k", Duration::ZERO).unwrap(), b"v");
    assert_eq!(client.add("n", 1).unwrap(), 1);
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    // A new rank gets in, at the latest once the silent ones have run out of time.
    let start = Instant::now();
    let late = TcpStore::connect_with_magic(addr, 0x77, Duration::from_secs(5)).unwrap();
    assert!(
        start.elapsed() < hello_timeout + Duration::from_millis(1500),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(late.get("k2", Duration::ZERO).unwrap(), b"v2");
    // The server closed every silent connection (at once, or after the hello timeout).
    for mut s in silent {
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        match s.read(&mut [0u8; 16]) {
            Ok(0) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
            other => panic!("a silent connection still open: {other:?}"),
        }
    }
    wait_until(Duration::from_secs(2), || {
        server.connection_counts() == (0, 2)
    });
}

#[test]
fn a_frame_announced_but_not_sent_is_dropped_after_the_frame_timeout() {
    let frame_timeout = Duration::from_millis(300);
    let server = server_with(
        0,
        Limits {
            frame_timeout,
            ..Limits::DEFAULT
        },
    );
    let addr = server.local_addr();
    let client = TcpStore::connect(addr, Duration::from_secs(5)).unwrap();
    let greet = |s: &mut TcpStream| {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(&wire::hello(0)).unwrap();
        let mut reply = [0u8; wire::REPLY_LEN];
        s.read_exact(&mut reply).unwrap();
        assert_eq!(wire::parse_reply(&reply), Some((PROTOCOL_VERSION, 0)));
    };
    // A frame header announcing 64 MiB, and nothing more.
    let mut liar = TcpStream::connect(addr).unwrap();
    greet(&mut liar);
    let start = Instant::now();
    liar.write_all(&((64u32 << 20) + 1).to_le_bytes()).unwrap();
    let mut rest = Vec::new();
    let n = liar.read_to_end(&mut rest).map(|_| rest.len());
    let took = start.elapsed();
    assert!(matches!(n, Ok(0)) || n.is_err(), "{n:?}");
    assert!(
        took >= frame_timeout - Duration::from_millis(50),
        "{took:?}"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    // A frame trickling in a byte at a time is dropped at the same deadline, although
    // bytes keep coming.
    let mut slow = TcpStream::connect(addr).unwrap();
    greet(&mut slow);
    let start = Instant::now();
    let mut frame = wire::encode_request(&Request::Set {
        key: "slow",
        value: &[1; 100],
    });
    let closed = loop {
        if frame.is_empty() {
            break false;
        }
        if slow.write_all(&frame[..1]).is_err() {
            break true;
        }
        frame.remove(0);
        thread::sleep(Duration::from_millis(40));
        slow.set_read_timeout(Some(Duration::from_millis(1)))
            .unwrap();
        match slow.read(&mut [0u8; 16]) {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            _ => break true,
        }
    };
    let took = start.elapsed();
    assert!(closed, "the trickling frame was served");
    assert!(
        took >= frame_timeout - Duration::from_millis(50),
        "{took:?}"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    // The real client, idle all along, is still connected and served.
    wait_until(Duration::from_secs(2), || {
        server.connection_counts() == (0, 1)
    });
    client.set("k", b"v").unwrap();
    assert_eq!(client.get("k", Duration::ZERO).unwrap(), b"v");
}

#[test]
fn idle_connections_outlive_the_frame_timeout() {
    let server = server_with(
        0,
        Limits {
            frame_timeout: Duration::from_millis(100),
            ..Limits::DEFAULT
        },
    );
    let s = TcpStore::connect(server.local_addr(), Duration::from_secs(5)).unwrap();
    s.set("k", b"v").unwrap();
    thread::sleep(Duration::from_millis(400));
    assert_eq!(server.connection_counts(), (0, 1));
    // The same connection serves the next request (a lost one would fail it).
    assert_eq!(s.get("k", Duration::ZERO).unwrap(), b"v");
    assert_eq!(server.connection_counts(), (0, 1));
}

#[test]
fn connections_past_the_cap_are_retried_until_a_place_frees() {
    let server = server_with(
        9,
        Limits {
            connections: 2,
            ..Limits::DEFAULT
        },
    );
    let addr = server.local_addr();
    let a = TcpStore::connect_with_magic(addr, 9, Duration::from_secs(5)).unwrap();
    let b = TcpStore::connect_with_magic(addr, 9, Duration::from_secs(5)).unwrap();
    let start = Instant::now();
    let e = TcpStore::connect_with_magic(addr, 9, Duration::from_millis(500)).unwrap_err();
    assert!(start.elapsed() >= Duration::from_millis(500));
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert!(
        e.message().contains("closed the connection after 0 bytes"),
        "{e}"
    );
    wait_until(Duration::from_secs(2), || {
        server.connection_counts() == (0, 2)
    });
    drop(a);
    let c = TcpStore::connect_with_magic(addr, 9, Duration::from_secs(5)).unwrap();
    c.set("k", b"c").unwrap();
    assert_eq!(b.get("k", Duration::ZERO).unwrap(), b"c");
}

#[test]
fn set_timeout_gives_up_in_time_on_a_silent_store() {
    let fake = SilentListener::start(true);
    let s = TcpStore::connect(fake.addr, Duration::from_secs(5)).unwrap();
    assert_eq!(s.request_timeout(), DEFAULT_REQUEST_TIMEOUT);
    // On the open connection: the request goes out and no answer comes.
    let start = Instant::now();
    let e = s
        .set_timeout("failure/3", b"why", Duration::from_millis(400))
        .unwrap_err();
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(400), "{took:?}");
    assert!(took < Duration::from_millis(1400), "{took:?}");
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert!(e.message().contains("'failure/3'"), "{e}");
    assert!(e.message().contains(&fake.addr.to_string()), "{e}");
    // That connection is gone; set and add now reconnect within the request timeout
    // (the listener accepts, but never replies to the hello).
    s.set_request_timeout(Duration::from_millis(300));
    assert_eq!(s.request_timeout(), Duration::from_millis(300));
    for op in ["set", "add"] {
        let start = Instant::now();
        let e = if op == "set" {
            s.set("k", b"v").unwrap_err()
        } else {
            s.add("n", 1).unwrap_err()
        };
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(300), "{op}: {took:?}");
        assert!(took < Duration::from_millis(1300), "{op}: {took:?}");
        assert_eq!(e.kind(), ErrorKind::Timeout, "{op}: {e}");
        assert!(e.message().contains("cannot connect"), "{e}");
    }
    // The trait's default, for local stores, just sets.
    let m = super::super::MemoryStore::new();
    m.set_timeout("k", b"v", Duration::ZERO).unwrap();
    assert_eq!(m.get("k", Duration::ZERO).unwrap(), b"v");
}

#[test]
fn an_http_server_is_named_at_once() {
    let fake = TcpListener::bind(local0()).unwrap();
    let addr = fake.local_addr().unwrap();
    let t = thread::spawn(move || {
        let (mut s, _) = fake.accept().unwrap();
        let mut hello = [0u8; wire::HELLO_LEN];
        s.read_exact(&mut hello).unwrap();
        s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .unwrap();
        // Keep it open a while: the client must not wait for more.
        thread::sleep(Duration::from_millis(600));
    });
    let start = Instant::now();
    let e = TcpStore::connect(addr, Duration::from_secs(10)).unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(e.kind(), ErrorKind::Remote);
    let m = e.message();
    assert!(
        m.starts_with(&format!(
            "store at {addr}: {addr} answered, but not as a ferroccl store (it sent \"HTTP/1.1 400 Bad Request\\r\\n"
        )),
        "{e}"
    );
    assert!(m.contains("...)"), "{e}");
    assert!(
        m.contains("is this the ferroccl store's address and port?"),
        "{e}"
    );
    t.join().unwrap();
    assert_eq!(quote(b"\x00\xffA"), "\"\\x00\\xffA\"");
    assert_eq!(
        quote(&[b'a'; QUOTE_LEN + 1]),
        format!("\"{}\"...", "a".repeat(QUOTE_LEN))
    );
}

#[test]
fn a_silent_listener_is_named_after_the_reply_timeout() {
    let fake = SilentListener::start(false);
    let start = Instant::now();
    let e = TcpStore::connect(fake.addr, Duration::from_secs(10)).unwrap_err();
    let took = start.elapsed();
    // Not retried for the whole 10 s.
    assert!(took >= HELLO_REPLY_TIMEOUT, "{took:?}");
    assert!(
        took < HELLO_REPLY_TIMEOUT + Duration::from_secs(1),
        "{took:?}"
    );
    assert_eq!(e.kind(), ErrorKind::Remote);
    let addr = fake.addr;
    assert!(
        e.message().starts_with(&format!(
            "store at {addr}: {addr} accepted the connection but sent no store reply within 2.0 s; \
             is this the ferroccl store's address and port"
        )),
        "{e}"
    );
    // Given less time than it takes to judge, it is a timeout, named as such.
    let e = TcpStore::connect(fake.addr, Duration::from_millis(200)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert!(e.message().contains("sent no store reply"), "{e}");
}
