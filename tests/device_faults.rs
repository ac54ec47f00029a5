//! A rank that dies while device collectives run: the survivors name it long before the
//! deadline, on every device path, and a stream-ordered caller's stream is released rather
//! than left waiting. Ranks are processes on the host stand-in device
//! (`FERRO_DEVICE_PROVIDER=host`); `FERRO_TIMEOUT` is 60 s, the bound checked is 15 s.
//!
//! | path | transport | calls |
//! |---|---|---|
//! | staged, blocking | shm | `all_reduce_device` |
//! | staged, stream-ordered | shm | `all_reduce_device_on` queued 8 at a time, then a synchronize |
//! | straight on the device buffers | p2p (host provider) | `all_reduce_device` |

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::child::{self, dump_all, field, free_port, now_ms, self_command, serial, Running};
use ferroccl::device::{Device, DeviceBuffer, DeviceStream, PROVIDER_ENV};
use ferroccl::{Communicator, ReduceOp};

/// Elements of each all_reduce (1 MiB of f32: several slices and slots).
const COUNT: usize = 1 << 18;

/// A rank of the dead-peer job. The rank named by `FERRO_TEST_FAULT_RANK` ends its process
/// from another thread while its collectives run (`EXITING at_ms=`); the others print
/// `FAILED rank=R at_ms=T error: <error>` at their first error, `FINISHED` if none came.
#[test]
fn child_device_dead_peer() {
    if !child::is_role("device_dead_peer") {
        return;
    }
    let rank: usize = child::env_var("FERRO_RANK");
    let target: usize = child::env_var("FERRO_TEST_FAULT_RANK");
    let stream_ordered = std::env::var("FERRO_TEST_MODE").is_ok_and(|m| m == "stream");
    let comm = Communicator::from_env().expect("from_env");
    let dev = Device::from_env(0).expect("device 0");
    comm.set_device(dev).unwrap();
    if rank == target {
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            println!("EXITING at_ms={}", now_ms());
            std::process::exit(3);
        });
    }
    let host: Vec<f32> = (0..COUNT)
        .map(|i| (i % 1000) as f32 + rank as f32)
        .collect();
    let send = DeviceBuffer::from_host(dev, &host).unwrap();
    let mut recv = DeviceBuffer::<f32>::new(dev, COUNT).unwrap();
    let stream = DeviceStream::new(dev).unwrap();
    let failed = |e: &dyn std::fmt::Display| -> ! {
        println!("FAILED rank={rank} at_ms={} error: {e}", now_ms());
        std::process::exit(1);
    };
    for _ in 0..20_000 {
        if stream_ordered {
            for _ in 0..8 {
                if let Err(e) = comm.all_reduce_device_on(&send, &mut recv, ReduceOp::Sum, &stream)
                {
                    failed(&e);
                }
            }
            // The stream is released whether its calls succeed or fail; a failure is the
            // communicator's asynchronous error.
            if let Err(e) = stream.synchronize() {
                failed(&format!("the stream was not released: {e}"));
            }
            if let Some(e) = comm.async_error() {
                failed(&e);
            }
        } else if let Err(e) = comm.all_reduce_device(&send, &mut recv, ReduceOp::Sum) {
            failed(&e);
        }
    }
    println!("FINISHED rank={rank}");
}

/// Rank 1 of 3 ends mid-call: every survivor fails, naming rank 1, within seconds of the exit.
fn dead_peer_job(mode: &str, extra: &[(&'static str, &str)]) {
    let _serial = serial();
    let store = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let ranks: Vec<Running> = (0..3)
        .map(|r| {
            let mut env = child::rank_env(r, 3, store, 60);
            env.push((PROVIDER_ENV, "host".to_string()));
            env.push(("FERRO_TEST_FAULT_RANK", "1".to_string()));
            env.push(("FERRO_TEST_MODE", mode.to_string()));
            env.push(("FERRO_DEVICE_SLICE_BYTES", "256K".to_string()));
            env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
            Running::spawn(self_command(
                "child_device_dead_peer",
                "device_dead_peer",
                &env,
            ))
        })
        .collect();
    let outs: Vec<_> = ranks
        .into_iter()
        .map(|p| p.finish(Duration::from_secs(90)))
        .collect();
    let dump = dump_all("rank", &outs);
    assert!(outs.iter().all(|o| !o.timed_out), "a rank hung: {dump}");
    let exited: u128 = outs[1]
        .tagged("EXITING ")
        .first()
        .map(|l| field(l, "at_ms"))
        .unwrap_or_else(|| panic!("rank 1 did not exit as planned: {dump}"));
    for r in [0, 2] {
        let line = outs[r]
            .tagged("FAILED ")
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("rank {r} did not fail: {dump}"));
        let after = field::<u128>(&line, "at_ms").saturating_sub(exited);
        println!("{mode}: {after} ms after the exit: {line}");
        assert!(after < 15_000, "rank {r} noticed after {after} ms: {dump}");
        assert!(
            line.contains("rank 1"),
            "rank {r} does not name rank 1: {dump}"
        );
        assert!(
            !line.contains("was not released"),
            "rank {r}: its stream was left waiting: {dump}"
        );
    }
}

#[test]
fn a_dead_peer_fails_staged_device_calls_long_before_the_deadline() {
    dead_peer_job("blocking", &[("FERRO_TRANSPORTS", "shm")]);
}

#[test]
fn a_dead_peer_fails_stream_ordered_device_calls_and_releases_the_stream() {
    dead_peer_job("stream", &[("FERRO_TRANSPORTS", "shm")]);
}

#[test]
fn a_dead_peer_fails_device_calls_straight_on_device_buffers_over_p2p() {
    dead_peer_job(
        "blocking",
        &[
            ("FERRO_TRANSPORTS", "p2p"),
            ("FERRO_P2P_PROVIDER", "host"),
            ("FERRO_P2P_SLOT_BYTES", "64K"),
        ],
    );
}
