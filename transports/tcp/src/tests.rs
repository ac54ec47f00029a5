use super::*;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use ferroccl_transport::{Connection, ErrorKind, Header, PayloadMut, Progress, HEADER_LEN};

use crate::conn::STASH;
use crate::handshake::{ack_bytes, Hello, HELLO_LEN, MAX_UNIDENTIFIED};

use ferroccl_transport_testkit::conformance::{self, Options};
use ferroccl_transport_testkit::drive::exchange;

fn pair(cfg: TcpConfig, comm_id: u64) -> (TcpConnection, TcpConnection) {
    let ep = TcpEndpoint::listen(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
    let addr = ep.addr();
    let deadline = Instant::now() + Duration::from_secs(10);
    let t = std::thread::spawn(move || connect(0, comm_id, 1, addr, &cfg, deadline).unwrap());
    let mut acc = ep.accept(1, comm_id, &[0], &cfg, deadline).unwrap();
    (t.join().unwrap(), acc.remove(0))
}

#[test]
fn conformance_over_loopback() {
    for nstreams in [1, 2] {
        let cfg = TcpConfig {
            nstreams,
            ..TcpConfig::default()
        };
        let mut id = 100;
        conformance::run(&Options::new("tcp"), || {
            id += 1;
            let (a, b) = pair(cfg, id);
            (Box::new(a), Box::new(b))
        });
    }
}

#[test]
fn messages_arrive_whole_and_in_order() {
    for nstreams in [1, 2, 3] {
        let cfg = TcpConfig {
            nstreams,
            stripe_min: 10_000,
            max_io: 4096,
            ..TcpConfig::default()
        };
        let (mut a, mut b) = pair(cfg, 42);
        assert_eq!(a.nstreams(), nstreams);
        let msgs: Vec<Vec<u8>> = [0usize, 1, 9_999, 10_000, 1 << 20, 3_000_017, 5]
            .iter()
            .enumerate()
            .map(|(k, &n)| (0..n).map(|i| (i * 7 + k * 13 + i / 251) as u8).collect())
            .collect();
        let got = exchange(&mut a, &mut b, &msgs);
        assert_eq!(got, msgs);
        // And the other way.
        let got = exchange(&mut b, &mut a, &msgs);
        assert_eq!(got, msgs);
    }
}

#[test]
fn large_messages_are_striped() {
    let cfg = TcpConfig {
        nstreams: 3,
        stripe_min: 1000,
        ..TcpConfig::default()
    };
    let (a, _b) = pair(cfg, 1);
    let mut p = Progress::default();
    a.layout(100_000, &mut p);
    assert_eq!(p.nparts, 3);
    assert_eq!(p.parts[0].start, 0);
    assert_eq!(p.parts[2].end, 100_000);
    assert!(p.parts[..2].iter().all(|x| (x.end - x.start) % 4096 == 0));
    let mut q = Progress::default();
    a.layout(999, &mut q);
    assert_eq!(q.nparts, 1);
}

#[test]
fn strangers_and_other_jobs_are_rejected_without_harm() {
    let cfg = TcpConfig::default();
    let ep = TcpEndpoint::listen(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
    let addr = ep.addr();
    let deadline = Instant::now() + Duration::from_secs(20);
    let t = std::thread::spawn(move || {
        // A stranger sends garbage, another job uses the wrong id, then the real peer connects.
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET / HTTP/1.0\r\n\r\n and then some more bytes")
            .unwrap();
        let wrong = connect(
            0,
            999,
            1,
            addr,
            &cfg,
            Instant::now() + Duration::from_secs(5),
        );
        let err = wrong.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Remote);
        assert!(
            err.message()
                .contains("closed the connection during the handshake"),
            "{err}"
        );
        assert!(err.message().contains("0x00000000000003e7"), "{err}");
        connect(0, 7, 1, addr, &cfg, deadline).unwrap()
    });
    let mut acc = ep.accept(1, 7, &[0], &cfg, deadline).unwrap();
    let mut a = t.join().unwrap();
    let got = exchange(&mut a, &mut acc[0], &[vec![1, 2, 3]]);
    assert_eq!(got, vec![vec![1, 2, 3]]);
}

#[test]
fn accept_times_out_naming_the_missing_rank() {
    let ep = TcpEndpoint::listen(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
    let err = ep
        .accept(
            0,
            1,
            &[3],
            &TcpConfig::default(),
            Instant::now() + Duration::from_millis(100),
        )
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(err.message().contains("rank(s) 3"), "{err}");
}

#[test]
fn a_closed_peer_is_an_error_naming_it() {
    let (mut a, mut b) = pair(TcpConfig::default(), 5);
    b.shutdown();
    drop(b);
    let mut h = Header::default();
    let mut p = Progress::default();
    let start = Instant::now();
    let err = loop {
        match a.recv(&mut h, PayloadMut::Host(&mut []), &mut p) {
            Ok(_) => assert!(start.elapsed() < Duration::from_secs(5)),
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind(), ErrorKind::Remote);
    assert!(err.message().contains("rank 1"), "{err}");
    assert!(err.message().contains("closed the connection"), "{err}");
}

fn localhost() -> TcpEndpoint {
    TcpEndpoint::listen(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap()
}

/// `k` sockets connected to `addr` that never send a byte.
fn silent(addr: SocketAddr, k: usize) -> Vec<TcpStream> {
    (0..k).map(|_| TcpStream::connect(addr).unwrap()).collect()
}

/// A socket that sends `bytes` (all or part of a handshake) and then waits.
fn raw(addr: SocketAddr, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(bytes).unwrap();
    s
}

/// What the acceptor answers on `s` before it closes it: the 8-byte acknowledgement, or
/// nothing. Panics when it neither answers nor closes within 3 s (less than the acceptor's
/// patience with silent sockets, so a close here is a decision, not a timeout).
fn answer(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut b = [0u8; 8];
    let mut got = 0;
    while got < b.len() {
        match s.read(&mut b[got..]) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("no answer and no close after {got} bytes: {e}"),
        }
    }
    b[..got].to_vec()
}

/// Ranks 1 and 2 connect (2 streams each, from threads) while rank 0 accepts them at `ep`.
/// Returns how long the accept took, after checking that both connections carry a message.
fn accept_two_peers(ep: &TcpEndpoint, comm_id: u64) -> Duration {
    let cfg = TcpConfig::default();
    assert_eq!(cfg.nstreams, 2);
    let addr = ep.addr();
    let deadline = Instant::now() + Duration::from_secs(20);
    let start = Instant::now();
    let peers: Vec<_> = [1, 2]
        .into_iter()
        .map(|r| std::thread::spawn(move || connect(r, comm_id, 0, addr, &cfg, deadline).unwrap()))
        .collect();
    let mut acc = ep.accept(0, comm_id, &[1, 2], &cfg, deadline).unwrap();
    let took = start.elapsed();
    for (c, t) in acc.iter_mut().zip(peers) {
        let mut a = t.join().unwrap();
        assert_eq!(c.nstreams(), 2);
        let m = vec![c.peer().rank as u8; 3];
        assert_eq!(exchange(&mut a, c, std::slice::from_ref(&m)), vec![m]);
    }
    assert_eq!(acc[0].peer().rank, 1);
    assert_eq!(acc[1].peer().rank, 2);
    took
}

#[test]
fn silent_sockets_do_not_delay_accept() {
    // Before, each silent socket held accept up to 5 s.
    for k in [3, 50] {
        let ep = localhost();
        let _strangers = silent(ep.addr(), k);
        let took = accept_two_peers(&ep, 11);
        eprintln!("{k} silent sockets: accept took {took:?}");
        assert!(
            took < Duration::from_secs(2),
            "{k} silent sockets: {took:?}"
        );
    }
}

#[test]
fn a_half_sent_handshake_does_not_delay_accept() {
    let ep = localhost();
    let h = Hello {
        comm_id: 12,
        from: 1,
        to: 0,
        stream: 0,
        nstreams: 2,
    }
    .encode();
    // Half of a peer's own handshake, and all but its last byte: both then stall.
    let _half = raw(ep.addr(), &h[..HELLO_LEN / 2]);
    let _most = raw(ep.addr(), &h[..HELLO_LEN - 1]);
    let took = accept_two_peers(&ep, 12);
    eprintln!("half-sent handshakes: accept took {took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
}

#[test]
fn wrong_handshakes_are_rejected_while_accept_waits_for_the_right_peers() {
    let cfg = TcpConfig::default();
    let ep = localhost();
    let addr = ep.addr();
    let deadline = Instant::now() + Duration::from_secs(30);
    let acc = std::thread::spawn(move || ep.accept(0, 7, &[1, 2], &cfg, deadline));
    let good = Hello {
        comm_id: 7,
        from: 1,
        to: 0,
        stream: 0,
        nstreams: 2,
    };
    let mut version = good.encode();
    version[4] = 9;
    let wrong: [(&str, [u8; HELLO_LEN]); 7] = [
        (
            "foreign communicator id",
            Hello { comm_id: 8, ..good }.encode(),
        ),
        ("wrong target rank", Hello { to: 3, ..good }.encode()),
        ("unexpected rank", Hello { from: 5, ..good }.encode()),
        (
            "nstreams mismatch",
            Hello {
                nstreams: 3,
                ..good
            }
            .encode(),
        ),
        ("stream out of range", Hello { stream: 2, ..good }.encode()),
        ("protocol version", version),
        ("bad magic", *b"GET / HTTP/1.0\r\n\r\nHost: xy\r\n\r\n\r\n"),
    ];
    // Each is closed unanswered while accept still waits (no peer has come yet).
    for (what, bytes) in wrong {
        let mut s = raw(addr, &bytes);
        assert_eq!(answer(&mut s), Vec::<u8>::new(), "{what} was acknowledged");
    }
    // Rank 1 by hand: stream 0 is acknowledged, the same stream again is a duplicate.
    let mut s0 = raw(addr, &good.encode());
    assert_eq!(answer(&mut s0), ack_bytes().to_vec());
    let mut dup = raw(addr, &good.encode());
    assert_eq!(answer(&mut dup), Vec::<u8>::new(), "duplicate acknowledged");
    let mut s1 = raw(addr, &Hello { stream: 1, ..good }.encode());
    assert_eq!(answer(&mut s1), ack_bytes().to_vec());
    // Rank 2 through `connect`.
    let mut c2 = connect(2, 7, 0, addr, &cfg, deadline).unwrap();
    let mut got = acc.join().unwrap().unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!((got[0].peer().rank, got[0].nstreams()), (1, 2));
    assert_eq!((got[1].peer().rank, got[1].nstreams()), (2, 2));
    let m = vec![vec![9u8; 5]];
    assert_eq!(exchange(&mut c2, &mut got[1], &m), m);
}

#[test]
fn a_flood_beyond_the_waiting_list_does_not_fail_accept() {
    let ep = localhost();
    let addr = ep.addr();
    let over = 20;
    let flood = silent(addr, MAX_UNIDENTIFIED + over);
    let deadline = Instant::now() + Duration::from_secs(30);
    let cfg = TcpConfig::default();
    let acc = std::thread::spawn(move || {
        let r = ep.accept(0, 13, &[1, 2], &cfg, deadline);
        (r, Instant::now())
    });
    // The oldest sockets are dropped at once (well before the 5 s patience), the newest wait.
    for (k, s) in flood.iter().enumerate().take(over) {
        let mut s = s.try_clone().unwrap();
        assert_eq!(answer(&mut s), Vec::<u8>::new(), "flood socket {k}");
    }
    let mut kept = flood[over].try_clone().unwrap();
    kept.set_nonblocking(true).unwrap();
    let e = kept.read(&mut [0u8; 8]).unwrap_err();
    assert_eq!(
        e.kind(),
        std::io::ErrorKind::WouldBlock,
        "socket {over}: {e}"
    );
    let start = Instant::now();
    let peers: Vec<_> = [1, 2]
        .into_iter()
        .map(|r| std::thread::spawn(move || connect(r, 13, 0, addr, &cfg, deadline).unwrap()))
        .collect();
    let (got, done) = acc.join().unwrap();
    let got = got.unwrap();
    let took = done - start;
    eprintln!(
        "flood of {}: accept done {took:?} after the peers began",
        flood.len()
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(got.len(), 2);
    for t in peers {
        t.join().unwrap();
    }
}

#[test]
fn the_deadline_names_the_missing_ranks_despite_strangers() {
    let cfg = TcpConfig::default();
    let ep = localhost();
    let addr = ep.addr();
    let _strangers = silent(addr, 3);
    let mut foreign = raw(
        addr,
        &Hello {
            comm_id: 99,
            from: 1,
            to: 0,
            stream: 0,
            nstreams: 2,
        }
        .encode(),
    );
    let start = Instant::now();
    let deadline = start + Duration::from_secs(1);
    // Rank 1 gets in; rank 2 never comes; rank 3 sends one of its two streams.
    let t = std::thread::spawn(move || connect(1, 14, 0, addr, &cfg, deadline).unwrap());
    let mut half = raw(
        addr,
        &Hello {
            comm_id: 14,
            from: 3,
            to: 0,
            stream: 1,
            nstreams: 2,
        }
        .encode(),
    );
    let err = ep.accept(0, 14, &[1, 2, 3], &cfg, deadline).unwrap_err();
    let took = start.elapsed();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    let msg = err.message();
    assert!(
        msg.contains("no connection from rank(s) 2, 3 (1 of 2 streams) at"),
        "{err}"
    );
    assert!(msg.contains("before the deadline"), "{err}");
    assert!(msg.contains("1 other connection(s) dropped"), "{err}");
    // Before, the silent sockets held accept 5 s each past the deadline.
    assert!(took < Duration::from_secs(3), "{took:?}");
    t.join().unwrap();
    assert_eq!(answer(&mut foreign), Vec::<u8>::new());
    assert_eq!(answer(&mut half), ack_bytes().to_vec());
}

#[test]
fn connect_says_whether_the_peer_kept_silent_or_closed() {
    let cfg = TcpConfig::default();
    // A listener that never accepts: the kernel completes the connection, nobody answers.
    let mute = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let addr = mute.local_addr().unwrap();
    let start = Instant::now();
    let err = connect(4, 1, 2, addr, &cfg, start + Duration::from_millis(300)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Remote);
    let msg = err.message();
    assert!(
        msg.starts_with(&format!(
            "rank 4: rank 2 ({addr}) accepted the connection but did not acknowledge"
        )),
        "{err}"
    );
    assert!(
        msg.contains("s (is another job or communicator listening on that address"),
        "{err}"
    );
    assert!(start.elapsed() < Duration::from_secs(3));
    // A listener that reads the handshake and closes.
    let shut = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let addr = shut.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = shut.accept().unwrap();
        s.read_exact(&mut [0u8; HELLO_LEN]).unwrap();
    });
    let err = connect(
        4,
        1,
        2,
        addr,
        &cfg,
        Instant::now() + Duration::from_secs(10),
    )
    .unwrap_err();
    t.join().unwrap();
    assert_eq!(err.kind(), ErrorKind::Remote);
    assert!(
        err.message()
            .contains("closed the connection during the handshake"),
        "{err}"
    );
    assert!(err.message().contains("0x0000000000000001"), "{err}");
}

#[test]
fn a_small_message_is_read_with_its_header_and_the_read_ahead_is_kept_in_order() {
    use ferroccl_transport_testkit::drive::{header, send_all};
    let cfg = TcpConfig {
        nstreams: 1,
        ..TcpConfig::default()
    };
    let (mut a, mut b) = pair(cfg, 7);
    // Queued before any receive, so that header reads take several messages at once; the
    // second one ends 20 bytes into the next header, across the read-ahead's end.
    let sizes = [8usize, STASH - 2 * HEADER_LEN - 8 - 20, 0, 5, 100_003, 4, 1];
    let msgs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(k, &n)| (0..n).map(|i| (i * 31 + k * 7 + i / 253) as u8).collect())
        .collect();
    std::thread::scope(|s| {
        s.spawn(|| {
            for (k, m) in msgs.iter().enumerate() {
                send_all(&mut a, m, k as u64);
            }
        });
        // Let everything reach the socket buffer.
        std::thread::sleep(Duration::from_millis(50));
        for (k, m) in msgs.iter().enumerate() {
            let mut h = Header::default();
            let mut p = Progress::default();
            let mut buf = vec![0u8; m.len()];
            let deadline = Instant::now() + Duration::from_secs(10);
            while !b.recv(&mut h, PayloadMut::Host(&mut buf), &mut p).unwrap() {
                if k == 0 && p.header_done() && !p.started {
                    // The header read brought the 8-byte payload with it.
                    assert!(b.stashed() >= 8, "read ahead: {}", b.stashed());
                }
                assert!(Instant::now() < deadline, "message #{k} did not arrive");
            }
            assert_eq!(h, header(m.len(), k as u64), "header of message #{k}");
            assert_eq!(&buf, m, "payload of message #{k}");
        }
    });
}
