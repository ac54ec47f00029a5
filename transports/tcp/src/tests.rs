use super::*;
use std::net::Ipv4Addr;

fn pair(cfg: TcpConfig, comm_id: u64) -> (TcpConnection, TcpConnection) {
    let ep = TcpEndpoint::listen(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
    let addr = ep.addr();
    let deadline = Instant::now() + Duration::from_secs(10);
    let t = std::thread::spawn(move || connect(0, comm_id, 1, addr, &cfg, deadline).unwrap());
    let mut acc = ep.accept(1, comm_id, &[0], &cfg, deadline).unwrap();
    (t.join().unwrap(), acc.remove(0))
}

/// Sends `msgs` from `a` to `b` concurrently with receiving them, driving both by polling.
fn exchange(a: &mut TcpConnection, b: &mut TcpConnection, msgs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    for (k, m) in msgs.iter().enumerate() {
        let h = Header {
            kind: 1,
            dtype: 7,
            op: 0,
            seq: k as u64,
            count: m.len() as u64,
            root: u32::MAX,
            len: m.len() as u64,
        };
        let mut sp = Progress::default();
        let mut rp = Progress::default();
        let mut rh = Header::default();
        let mut buf = vec![0u8; m.len()];
        let (mut sent, mut recvd) = (false, false);
        let start = Instant::now();
        while !(sent && recvd) {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "exchange stalled"
            );
            if !sent {
                sent = a.send(&h, m, &mut sp).unwrap();
            }
            if !recvd {
                recvd = b.recv(&mut rh, &mut buf, &mut rp).unwrap();
                if rp.header_done() && !rp.started {
                    assert_eq!(rh, h);
                }
            }
        }
        got.push(buf);
    }
    got
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
        assert!(err.message().contains("refused the handshake"), "{err}");
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
        match a.recv(&mut h, &mut [], &mut p) {
            Ok(_) => assert!(start.elapsed() < Duration::from_secs(5)),
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind(), ErrorKind::Remote);
    assert!(err.message().contains("rank 1"), "{err}");
    assert!(err.message().contains("closed the connection"), "{err}");
}
