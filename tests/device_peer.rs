//! Collectives straight between the ranks' device buffers: ranks that are threads of one
//! process, joined by the p2p transport, each reducing or copying its share of the other
//! ranks' buffers into theirs (docs/CUDA.md, "Between the ranks' buffers"). On the host stand-ins
//! (`FERRO_DEVICE_PROVIDER=host`, `FERRO_P2P_PROVIDER=host`), in a child process of its own
//! because both providers are chosen by the environment.
//!
//! Every case checks every element against the host reference, and says how many allreduces
//! took the path, so that a case that should take it and a case that must not are both
//! asserted: all ranks on device buffers (2, 3, 5 and 8 ranks); ranks on two devices that
//! reach each other (peer access), and on two that do not; the path turned off; one rank
//! staging through host memory; one rank on host buffers.

mod common;

use common::child::{self, expected_cases, field, standin_p2p_child as run_child};
use common::conformance::{all_ops, run_sweep_on, Mem, Sweep, ALL_COLLS};
use ferroccl::device::{Device, DeviceBuffer, Provider};
use ferroccl::{Communicator, Config, DataType, ReduceOp};

/// Every collective (all_to_all in place stays on the schedule), every dtype and op; counts of none
/// (no call), a few elements (lane-sized: the path is offered before the lanes, and one
/// rank's share holds them all), odd and prime, and large enough that the shares are uneven
/// and the 64 KiB device slices of these runs cut one call into several.
fn sweep(full: bool) -> Sweep {
    Sweep {
        dtypes: if full {
            DataType::ALL.to_vec()
        } else {
            vec![DataType::Float32, DataType::Float16, DataType::Uint8]
        },
        ops: if full {
            all_ops()
        } else {
            vec![ReduceOp::Sum, ReduceOp::Avg, ReduceOp::PreMulSum(0.0)]
        },
        counts: vec![0, 1, 7, 64, 257, 1031, 65537],
        // Every collective but send_recv, which the path does not take.
        colls: ALL_COLLS[..6].to_vec(),
    }
}

/// A child: `FERRO_TEST_RANKS` thread ranks on stand-in device 0; `FERRO_TEST_CASE` says
/// which rank is different (`staged`: rank 0 stages, `host`: rank 0 uses host buffers;
/// `devices`: rank `r` on device `r % 2`, its p2p slots there too).
#[test]
fn child_peer() {
    if !child::is_role("peer") {
        return;
    }
    let n: usize = child::env_var("FERRO_TEST_RANKS");
    let case: String = child::env_var("FERRO_TEST_CASE");
    let full = case == "all" && n <= 3;
    let base = Config::from_env().expect("config");
    let ordinal = |r: usize| if case == "devices" { r as u32 % 2 } else { 0 };
    let configs: Vec<Config> = (0..n)
        .map(|r| {
            let mut c = base.clone();
            c.device_direct = !(case == "staged" && r == 0);
            c.p2p_device = Some(ordinal(r));
            c
        })
        .collect();
    let comms = Communicator::local_group_with(configs).expect("local_group");
    let want = expected_cases(&sweep(full));
    std::thread::scope(|s| {
        for c in &comms {
            let case = case.as_str();
            let dev = Device::new(Provider::Host, ordinal(c.rank())).expect("stand-in device");
            s.spawn(move || {
                c.set_device(dev).unwrap();
                let mem = if case == "host" && c.rank() == 0 {
                    Mem::Host
                } else {
                    Mem::Device(dev)
                };
                let cases = run_sweep_on(c, mem, &sweep(full), 11 * n as u64)
                    .unwrap_or_else(|e| panic!("rank {}: {e}", c.rank()));
                assert_eq!(cases, want);
                if case == "all" || case == "devices" {
                    same_factor(c, dev, n);
                }
                println!(
                    "PEER rank={} cases={cases} direct={} peer={}",
                    c.rank(),
                    c.device_direct(),
                    c.device_peer_calls()
                );
            });
        }
    });
}

/// Runs `f` on each rank of a fresh communicator of two thread ranks, each on its own thread
/// and bound to stand-in device 0.
fn on_two_ranks(f: impl Fn(&Communicator, Device) + Sync) {
    let comms = Communicator::local_group(2, Config::from_env().expect("config")).unwrap();
    let dev = Device::new(Provider::Host, 0).unwrap();
    std::thread::scope(|s| {
        for c in &comms {
            let f = &f;
            s.spawn(move || {
                c.set_device(dev).unwrap();
                f(c, dev);
            });
        }
    });
}

/// A child in which the stand-in's reduce-copies of 64 bytes fail: an allreduce of 20 f32
/// over 2 ranks gives rank 0 a share of 16 elements (64 bytes) and rank 1 one of 4, so rank 0's
/// kernel fails. Both ranks return an error promptly (no hang), rank 1's naming rank 0, and
/// the communicator stays failed.
#[test]
fn child_peer_failure() {
    if !child::is_role("peer-failure") {
        return;
    }
    on_two_ranks(|c, dev| {
        let host: Vec<f32> = (0..20).map(|i| i as f32).collect();
        let mut buf = DeviceBuffer::from_host(dev, &host).unwrap();
        let e = c
            .all_reduce_device_in_place(&mut buf, ReduceOp::Sum)
            .expect_err("rank 0's share fails");
        println!("FAILED rank={} error={e}", c.rank());
        let again = c
            .all_reduce_device_in_place(&mut buf, ReduceOp::Sum)
            .expect_err("the communicator stays failed");
        println!("AGAIN rank={} error={again}", c.rank());
    });
}

#[test]
fn a_rank_whose_share_fails_is_named_by_every_rank() {
    let env = [
        ("FERRO_STANDIN_FAIL_MANY", "64".to_string()),
        ("FERRO_TIMEOUT", "60".to_string()),
    ];
    let out = run_child("child_peer_failure", "peer-failure", &env, 60);
    let lines = out.tagged("FAILED ");
    assert_eq!(lines.len(), 2, "{}", out.dump());
    for l in &lines {
        if l.starts_with("FAILED rank=1") {
            assert!(
                l.contains("rank 0 failed to queue its share of the all_reduce"),
                "{l}"
            );
        } else {
            assert!(l.contains("a reduce-copy of 64 bytes fails"), "{l}");
        }
    }
    assert_eq!(out.tagged("AGAIN ").len(), 2, "{}", out.dump());
}

/// A child whose two thread ranks make calls that do not match: an allreduce of 1031 f32
/// against one of 1030; of 1030 f32 against 1030 i32; a sum against a max; 49152 f32 against
/// 32768 (`sliced`: in 64 KiB slices both first slices hold 16384 elements, so the whole
/// call's offer goes under one header). Each on fresh communicators. No share may read or
/// write past another rank's buffer, and nothing may hang.
#[test]
fn child_peer_mismatch() {
    if !child::is_role("peer-mismatch") {
        return;
    }
    for case in ["count", "dtype", "op", "sliced"] {
        on_two_ranks(|c, dev| {
            let r = c.rank();
            let count = match (case, r) {
                ("count", 1) => 1030,
                ("sliced", 0) => 49152,
                ("sliced", _) => 32768,
                _ => 1031,
            };
            let op = if case == "op" && r == 1 {
                ReduceOp::Max
            } else {
                ReduceOp::Sum
            };
            let e = if case == "dtype" && r == 1 {
                let host: Vec<i32> = (0..count).collect();
                let mut buf = DeviceBuffer::from_host(dev, &host).unwrap();
                c.all_reduce_device_in_place(&mut buf, op).err()
            } else {
                let host: Vec<f32> = (0..count).map(|i| i as f32).collect();
                let mut buf = DeviceBuffer::from_host(dev, &host).unwrap();
                c.all_reduce_device_in_place(&mut buf, op).err()
            };
            println!(
                "MISMATCH case={case} rank={r} peer={} error={}",
                c.device_peer_calls(),
                e.map_or("none".to_string(), |e| e.to_string())
            );
        });
    }
}

#[test]
fn calls_that_do_not_match_fail_and_no_share_runs_past_a_buffer() {
    let env = [
        ("FERRO_DEVICE_SLICE_BYTES", "64K".to_string()),
        ("FERRO_TIMEOUT", "5".to_string()),
    ];
    let out = run_child("child_peer_mismatch", "peer-mismatch", &env, 120);
    let lines = out.tagged("MISMATCH ");
    assert_eq!(lines.len(), 8, "{}", out.dump());
    // No share of a call that did not match ran (the stand-in refuses an operand past a live
    // allocation, which would fail the share).
    let dump = out.dump();
    assert!(
        !dump.contains("its share of the") && !dump.contains("not live memory"),
        "{dump}"
    );
    for l in &lines {
        if l.contains("case=sliced") {
            // The whole calls differ, so neither runs whole; their second slices match
            // (16384 elements each) and may go between the buffers; rank 0's third slice
            // finds no partner and fails at the deadline, rank 1 has returned.
            assert!(l.contains(" peer=0 ") || l.contains(" peer=1 "), "{l}");
            if l.contains("rank=0") {
                assert!(!l.contains("error=none"), "{l}");
            }
        } else {
            assert!(l.contains(" peer=0 "), "{l}");
            assert!(!l.contains("error=none"), "{l}");
        }
    }
    let case = |c: &str| {
        lines
            .iter()
            .filter(|l| l.contains(&format!("case={c} ")))
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(case("count").contains("1030 x f32"), "{}", case("count"));
    assert!(case("dtype").contains("i32"), "{}", case("dtype"));
}

/// A child of two thread ranks with a trace each: an allreduce of 2 f32 (lane-sized), one of
/// 65537 f32 (five 64 KiB device slices) and a broadcast of 3 f32 from rank 1 (whose root the
/// ranks agree on first).
#[test]
fn child_peer_trace() {
    if !child::is_role("peer-trace") {
        return;
    }
    on_two_ranks(|c, dev| {
        for count in [2usize, 65537] {
            let host: Vec<f32> = (0..count).map(|i| i as f32).collect();
            let mut buf = DeviceBuffer::from_host(dev, &host).unwrap();
            c.all_reduce_device_in_place(&mut buf, ReduceOp::Sum)
                .unwrap();
            assert_eq!(buf.to_vec().unwrap()[count - 1], 2.0 * (count - 1) as f32);
        }
        let host = [c.rank() as f32; 3];
        let mut buf = DeviceBuffer::from_host(dev, &host).unwrap();
        c.broadcast_device(&mut buf, 1).unwrap();
        assert_eq!(buf.to_vec().unwrap(), vec![1.0; 3]);
        println!("TRACED rank={} peer={}", c.rank(), c.device_peer_calls());
    });
}

/// Each rank's trace labels every call `peer` (the tiny one too, though it would fit the
/// lanes) with the bytes of the whole call (the sliced one ran whole); around each, one offer
/// (6 words) and one status word through the lanes, and the broadcast's root agreement (two
/// words of 4 bytes), which is not offered itself.
#[test]
fn the_trace_names_calls_between_the_buffers_with_their_whole_bytes() {
    let dir = std::env::temp_dir().join(format!("ferroccl-peer-trace-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let env = [
        ("FERRO_DEVICE_SLICE_BYTES", "64K".to_string()),
        ("FERRO_TIMEOUT", "30".to_string()),
        (
            "FERRO_TRACE_FILE",
            dir.join("trace-%r.json").display().to_string(),
        ),
    ];
    let out = run_child("child_peer_trace", "peer-trace", &env, 120);
    assert_eq!(out.tagged("TRACED ").len(), 2, "{}", out.dump());
    for r in 0..2 {
        let text = std::fs::read_to_string(dir.join(format!("trace-{r}.json"))).unwrap();
        let events: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
        let bytes = |algorithm: &str| {
            let mut b: Vec<u64> = events
                .iter()
                .filter(|e| e["args"]["algorithm"] == algorithm)
                .map(|e| e["args"]["bytes"].as_u64().unwrap())
                .collect();
            b.sort_unstable();
            b
        };
        assert_eq!(bytes("peer"), vec![8, 12, 65537 * 4], "rank {r}:\n{text}");
        assert_eq!(
            bytes("lane"),
            vec![8, 40, 40, 40, 80, 80, 80],
            "rank {r}:\n{text}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A pre-multiplied sum whose factor every rank shares takes the path (the sweep's factors
/// differ by rank, which it refuses): one call, in place, on every rank.
fn same_factor(c: &Communicator, dev: Device, n: usize) {
    let (r, count) = (c.rank(), 1031);
    let x = |rank: usize, i: usize| (rank * 4096 + i) as f32;
    let host: Vec<f32> = (0..count).map(|i| x(r, i)).collect();
    let mut buf = DeviceBuffer::from_host(dev, &host).unwrap();
    c.all_reduce_device_in_place(&mut buf, ReduceOp::PreMulSum(0.5))
        .unwrap();
    let got = buf.to_vec().unwrap();
    let wrong = (0..count)
        .filter(|&i| got[i] != (0..n).map(|k| 0.5 * x(k, i)).sum::<f32>())
        .count();
    assert_eq!(
        wrong, 0,
        "rank {r}: {wrong} wrong elements of a pre-multiplied sum"
    );
}

/// Runs the child with `n` ranks in case `case` (`FERRO_DEVICE_PEER=peer`); returns each
/// rank's count of allreduces that went straight between the buffers.
fn run(n: usize, case: &str, peer: bool) -> Vec<u64> {
    run_with(n, case, peer, true)
}

/// [`run`] where distinct stand-in devices reach each other or (`reach` false) do not.
fn run_with(n: usize, case: &str, peer: bool, reach: bool) -> Vec<u64> {
    run_env(n, case, peer, reach, &[])
}

/// [`run_with`] with `extra` settings.
fn run_env(n: usize, case: &str, peer: bool, reach: bool, extra: &[(&str, &str)]) -> Vec<u64> {
    // Device calls in slices of 64 KiB, except beside a rank with host buffers, whose calls
    // are never cut (the default 64 MiB slices of a one-host p2p communicator cut none here).
    let slices = if case == "host" { "64M" } else { "64K" };
    let env = [
        (
            "FERRO_STANDIN_PEER_ACCESS",
            if reach { "1" } else { "0" }.to_string(),
        ),
        ("FERRO_DEVICE_SLICE_BYTES", slices.to_string()),
        (
            "FERRO_DEVICE_PEER",
            if peer { "1" } else { "0" }.to_string(),
        ),
        ("FERRO_TIMEOUT", "60".to_string()),
        ("FERRO_TEST_RANKS", n.to_string()),
        ("FERRO_TEST_CASE", case.to_string()),
    ];
    let mut env = env.to_vec();
    env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    let out = run_child("child_peer", "peer", &env, 300);
    let lines = out.tagged("PEER ");
    assert_eq!(lines.len(), n, "{}", out.dump());
    let full = case == "all" && n <= 3;
    let mut calls = vec![0; n];
    for l in &lines {
        assert_eq!(
            field::<usize>(l, "cases"),
            expected_cases(&sweep(full)),
            "{l}"
        );
        calls[field::<usize>(l, "rank")] = field::<u64>(l, "peer");
    }
    calls
}

/// The calls of the path in the sweep (`full`: every dtype and op): every call with elements,
/// but in-place all_to_all and the pre-multiplied sums (whose factors differ by rank); each
/// once, whole: allreduce, broadcast and reduce, cut into device slices of 64 KiB, are
/// offered whole at their first slice (and all_gather, reduce_scatter and all_to_all are not
/// cut where p2p is tried).
fn path_calls(full: bool) -> u64 {
    let s = sweep(full);
    let ops = |coll: &str| {
        if matches!(coll, "all_reduce" | "reduce" | "reduce_scatter") {
            s.ops
                .iter()
                .filter(|o| !matches!(o, ReduceOp::PreMulSum(_)))
                .count() as u64
        } else {
            1
        }
    };
    let mut calls = 0;
    for &coll in &s.colls {
        for _ in &s.dtypes {
            for &count in &s.counts {
                // Out of place only for all_to_all: in place, a rank would overwrite a block
                // its owner has yet to send.
                let placements = if coll == "all_to_all" { 1 } else { 2 };
                calls += u64::from(count > 0) * ops(coll) * placements;
            }
        }
    }
    // And the one call of `same_factor`.
    calls + 1
}

#[test]
fn collectives_go_between_the_buffers_of_2_3_5_and_8_thread_ranks() {
    for n in [2, 3, 5, 8] {
        let calls = run(n, "all", true);
        let want = path_calls(n <= 3);
        assert!(want > 0);
        assert!(
            calls.iter().all(|&c| c == want),
            "{n} ranks: {calls:?}, want {want} each"
        );
    }
}

#[test]
fn ranks_on_two_devices_that_reach_each_other_go_between_the_buffers() {
    for n in [2, 3, 4] {
        let calls = run(n, "devices", true);
        let want = path_calls(false);
        assert!(
            calls.iter().all(|&c| c == want),
            "{n} ranks on two devices: {calls:?}, want {want} each"
        );
    }
}

#[test]
fn ranks_on_two_devices_without_peer_access_run_the_schedule() {
    assert_eq!(run_with(3, "devices", true, false), vec![0; 3]);
}

/// Buffers that peer access does not cover (a pool's, or mapped with `cuMemMap`: the
/// stand-in's `FERRO_STANDIN_PLAIN=0`) keep ranks on two devices on the schedule; on one
/// device they take the path.
#[test]
fn buffers_peer_access_does_not_cover_keep_two_devices_on_the_schedule() {
    let off = [("FERRO_STANDIN_PLAIN", "0")];
    assert_eq!(run_env(2, "devices", true, true, &off), vec![0; 2]);
    let calls = run_env(2, "all", true, true, &off);
    assert!(calls.iter().all(|&c| c == path_calls(true)), "{calls:?}");
}

#[test]
fn turned_off_every_allreduce_runs_the_schedule() {
    assert_eq!(run(3, "all", false), vec![0; 3]);
}

#[test]
fn a_rank_that_stages_or_has_host_buffers_keeps_every_rank_on_the_schedule() {
    assert_eq!(run(3, "staged", true), vec![0; 3]);
    assert_eq!(run(2, "host", true), vec![0; 2]);
}
