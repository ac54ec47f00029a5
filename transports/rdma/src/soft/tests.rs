//! The software provider keeps reliable-connected semantics: order, key and bounds checks,
//! error completions, flushes, queue limits, and the injected faults.

use super::*;

fn attrs(sq: u32) -> QpAttrs {
    QpAttrs {
        max_send_wr: sq,
        max_recv_wr: 16,
        gid_index: 0,
        traffic_class: 0,
        service_level: 0,
        timeout: 20,
        retry_cnt: 7,
    }
}

/// A device of its own with two connected queue pairs, each on its own completion queue.
struct Rig {
    dev: SoftDevice,
    cq: [SoftCq; 2],
    qp: [SoftQp; 2],
}

fn rig(sq: u32, cq_depth: usize) -> Rig {
    let dev = SoftDevice::new().expect("soft device");
    let cq = [
        dev.create_cq(cq_depth).unwrap(),
        dev.create_cq(cq_depth).unwrap(),
    ];
    let mut qp = [
        dev.create_qp(&cq[0], &attrs(sq)).unwrap(),
        dev.create_qp(&cq[1], &attrs(sq)).unwrap(),
    ];
    let ends: Vec<QpEndpoint> = qp
        .iter()
        .map(|q| QpEndpoint {
            port: dev.port_addr(),
            qpn: dev.qp_num(q),
            psn: 0,
            mtu: 4096,
        })
        .collect();
    dev.connect_qp(&mut qp[0], &ends[1], 0, &attrs(sq)).unwrap();
    dev.connect_qp(&mut qp[1], &ends[0], 0, &attrs(sq)).unwrap();
    Rig { dev, cq, qp }
}

fn write(src: &[u8], mr: &SoftMr, dst: u64, rkey: u32, imm: Option<u32>, id: u64) -> WriteWr {
    WriteWr {
        wr_id: id,
        local_addr: src.as_ptr() as usize,
        len: src.len(),
        lkey: mr.lkey(),
        remote_addr: dst,
        rkey,
        imm,
        signaled: true,
    }
}

fn poll(r: &mut Rig, side: usize) -> Vec<Wc> {
    let mut out = Vec::new();
    r.dev.poll_cq(&mut r.cq[side], 64, &mut out).unwrap();
    out
}

#[test]
fn writes_land_in_order_and_immediates_follow_their_bytes() {
    let mut r = rig(16, 64);
    let src: Vec<u8> = (0..64u8).collect();
    let mut dst = vec![0u8; 64];
    let smr = r.dev.reg_mr(src.as_ptr() as usize, src.len()).unwrap();
    let dmr = r.dev.reg_mr(dst.as_mut_ptr() as usize, dst.len()).unwrap();
    for _ in 0..3 {
        r.dev.post_recv(&mut r.qp[1], 7).unwrap();
    }
    let base = dst.as_ptr() as u64;
    for k in 0..3u64 {
        let piece = &src[(k * 16) as usize..(k * 16 + 16) as usize];
        let wr = write(
            piece,
            &smr,
            base + k * 16,
            dmr.rkey(),
            Some(100 + k as u32),
            k,
        );
        r.dev.post_write(&mut r.qp[0], &wr).unwrap();
    }
    let sent = poll(&mut r, 0);
    assert_eq!(sent.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [0, 1, 2]);
    assert!(sent.iter().all(|w| w.status == WcStatus::Success));
    let got = poll(&mut r, 1);
    assert_eq!(
        got.iter().map(|w| w.imm).collect::<Vec<_>>(),
        [100, 101, 102]
    );
    assert!(got
        .iter()
        .all(|w| w.byte_len == 16 && w.opcode == WcOpcode::RecvImm));
    assert_eq!(&dst[..48], &src[..48]);
    assert!(dst[48..].iter().all(|&b| b == 0));
}

#[test]
fn a_bad_rkey_or_bounds_is_a_remote_access_error_and_writes_nothing() {
    let mut r = rig(16, 64);
    let src = vec![9u8; 32];
    let mut dst = vec![0u8; 32];
    let smr = r.dev.reg_mr(src.as_ptr() as usize, src.len()).unwrap();
    let dmr = r.dev.reg_mr(dst.as_mut_ptr() as usize, dst.len()).unwrap();
    let base = dst.as_ptr() as u64;
    // One byte past the region's end.
    let wr = write(&src, &smr, base + 1, dmr.rkey(), None, 1);
    r.dev.post_write(&mut r.qp[0], &wr).unwrap();
    let wc = poll(&mut r, 0);
    assert_eq!(wc[0].status, WcStatus::RemoteAccess);
    assert!(dst.iter().all(|&b| b == 0), "nothing was written");
    // The queue pair is now in the error state: later work is flushed, not carried out.
    let wr = write(&src, &smr, base, dmr.rkey(), None, 2);
    r.dev.post_write(&mut r.qp[0], &wr).unwrap();
    assert_eq!(poll(&mut r, 0)[0].status, WcStatus::Flushed);
    assert!(dst.iter().all(|&b| b == 0));
    // The responder failed too: its posted receives are flushed.
    r.dev.post_recv(&mut r.qp[1], 5).unwrap();
    let wc = poll(&mut r, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (5, WcStatus::Flushed));

    let mut r = rig(16, 64);
    let smr = r.dev.reg_mr(src.as_ptr() as usize, src.len()).unwrap();
    let dmr = r.dev.reg_mr(dst.as_mut_ptr() as usize, dst.len()).unwrap();
    let wr = write(&src, &smr, base, dmr.rkey() ^ 0x1000, None, 3);
    r.dev.post_write(&mut r.qp[0], &wr).unwrap();
    assert_eq!(poll(&mut r, 0)[0].status, WcStatus::RemoteAccess);
    assert!(dst.iter().all(|&b| b == 0));
    drop(dmr);
}

#[test]
fn a_destroyed_peer_is_retry_exceeded_and_a_bad_lkey_a_protection_error() {
    let mut r = rig(16, 64);
    let src = vec![1u8; 8];
    let mut dst = vec![0u8; 8];
    let smr = r.dev.reg_mr(src.as_ptr() as usize, src.len()).unwrap();
    let dmr = r.dev.reg_mr(dst.as_mut_ptr() as usize, dst.len()).unwrap();
    let mut bad = write(&src, &smr, dst.as_ptr() as u64, dmr.rkey(), None, 1);
    bad.lkey ^= 0x2000;
    r.dev.post_write(&mut r.qp[0], &bad).unwrap();
    assert_eq!(poll(&mut r, 0)[0].status, WcStatus::LocalProtection);

    let Rig { dev, mut cq, qp } = rig(16, 64);
    let [mut a, b] = qp;
    drop(b);
    let smr = dev.reg_mr(src.as_ptr() as usize, src.len()).unwrap();
    let wr = write(&[], &smr, 0, 0, None, 9);
    dev.post_write(&mut a, &wr).unwrap();
    let mut out = Vec::new();
    dev.poll_cq(&mut cq[0], 8, &mut out).unwrap();
    assert_eq!(out[0].status, WcStatus::RetryExceeded);
    assert!(out[0].status.words().contains("retry count exceeded"));
}

#[test]
fn a_full_send_queue_refuses_and_an_overflowing_cq_is_an_error() {
    let mut r = rig(2, 64);
    let src = vec![1u8; 8];
    let mut dst = vec![0u8; 8];
    let smr = r.dev.reg_mr(src.as_ptr() as usize, src.len()).unwrap();
    let dmr = r.dev.reg_mr(dst.as_mut_ptr() as usize, dst.len()).unwrap();
    let wr = write(&src, &smr, dst.as_ptr() as u64, dmr.rkey(), None, 1);
    r.dev.post_write(&mut r.qp[0], &wr).unwrap();
    r.dev.post_write(&mut r.qp[0], &wr).unwrap();
    let e = r.dev.post_write(&mut r.qp[0], &wr).unwrap_err();
    assert!(e.why.contains("full"), "{e}");
    assert_eq!(poll(&mut r, 0).len(), 2);
    r.dev.post_write(&mut r.qp[0], &wr).unwrap();

    let mut r = rig(16, 3);
    let smr = r.dev.reg_mr(src.as_ptr() as usize, src.len()).unwrap();
    let dmr = r.dev.reg_mr(dst.as_mut_ptr() as usize, dst.len()).unwrap();
    let wr = write(&src, &smr, dst.as_ptr() as u64, dmr.rkey(), None, 1);
    for _ in 0..4 {
        r.dev.post_write(&mut r.qp[0], &wr).unwrap();
    }
    let mut out = Vec::new();
    let e = r.dev.poll_cq(&mut r.cq[0], 8, &mut out).unwrap_err();
    assert!(e.why.contains("overflowed"), "{e}");
    // Its queue pairs failed, and it stays an error.
    r.dev.post_write(&mut r.qp[0], &wr).unwrap();
    assert!(r.dev.poll_cq(&mut r.cq[0], 8, &mut out).is_err());
}

#[test]
fn injected_faults() {
    let mut r = rig(16, 64);
    r.dev.set_faults(Faults {
        fail_reg: 2,
        ..Faults::default()
    });
    let src = vec![1u8; 8];
    let mut dst = vec![0u8; 8];
    let smr = r.dev.reg_mr(src.as_ptr() as usize, src.len()).unwrap();
    let e = r.dev.reg_mr(dst.as_mut_ptr() as usize, 8).unwrap_err();
    assert!(e.why.contains("injected"), "{e}");
    let dmr = r.dev.reg_mr(dst.as_mut_ptr() as usize, 8).unwrap();
    let wr = write(&src, &smr, dst.as_ptr() as u64, dmr.rkey(), None, 1);
    r.dev.set_faults(Faults {
        drop_completion: 1,
        ..Faults::default()
    });
    r.dev.post_write(&mut r.qp[0], &wr).unwrap();
    assert_eq!(
        poll(&mut r, 0).len(),
        0,
        "the first completion of the device is lost"
    );
    r.dev.set_faults(Faults {
        corrupt_rkey: 2,
        ..Faults::default()
    });
    dst.fill(0);
    r.dev.post_write(&mut r.qp[0], &wr).unwrap();
    assert_eq!(poll(&mut r, 0)[0].status, WcStatus::RemoteAccess);
    assert!(dst.iter().all(|&b| b == 0));
    assert_eq!(
        Faults::parse("drop_completion=3, exit_at=7").unwrap(),
        Faults {
            drop_completion: 3,
            exit_at: 7,
            ..Faults::default()
        }
    );
    assert!(Faults::parse("explode=1").unwrap_err().contains("explode"));
}
