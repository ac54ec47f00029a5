//! C programs built against the NCCL header (ours, and NVIDIA's when a copy is at hand) and
//! linked with `libnccl.so.2` (feature `capi`), run as 1 to 4 processes: every collective,
//! streams and device buffers on the host stand-in, stream-ordered completion, calls recorded
//! into graphs, `NCCL_COMM_ID` and `ncclCommInitAll`, the functions NCCL 2.27 .. 2.32 added
//! with a shrink after a death, and the C example.
//!
//! Run with `cargo test -p ferroccl --features capi --test capi_programs`; the library and
//! NVIDIA's header are found as `tests/capi.rs` says.
#![cfg(feature = "capi")]

mod common;

use common::capi::{gcc, nvidia_flags, nvidia_include, our_include, out_dir, run_c, ROOT};

#[test]
fn c_program_runs_every_collective_on_1_2_3_processes() {
    let exe = gcc("collectives.c", "collectives", &[&our_include()], true);
    for n in ["1", "2", "3"] {
        run_c(&exe, &[n], &[]);
    }
}

/// `tests/c/streams.c` on the host stand-in: device buffers with a non-NULL stream on 1-3
/// processes, one thread driving 3 communicators through groups, and the no-driver errors.
/// `ferroccl.h`'s shared memory: buffers from `ferrocclMemAllocShared`, read by the other
/// processes straight from the sender's block (4 MiB messages over shm), on 1-3 processes.
#[test]
fn c_program_runs_collectives_on_shared_memory_buffers() {
    let exe = gcc(
        "collectives.c",
        "collectives_shared",
        &[&our_include()],
        true,
    );
    for n in ["1", "2", "3"] {
        run_c(&exe, &[n, "shared"], &[("FERRO_TRANSPORTS", "shm")]);
    }
}

#[test]
fn c_program_runs_collectives_on_streams_and_device_buffers() {
    let exe = gcc("streams.c", "streams", &[&our_include()], true);
    let host = [("FERRO_DEVICE_PROVIDER", "host")];
    for n in ["1", "2", "3"] {
        run_c(&exe, &[n], &host);
    }
    run_c(&exe, &["3", "all"], &host);
    // The blocking form (FERRO_STREAM_WAITS=0) over shared memory: host copies of device sends
    // and receives in one group.
    run_c(
        &exe,
        &["3"],
        &[
            ("FERRO_DEVICE_PROVIDER", "host"),
            ("FERRO_TRANSPORTS", "shm"),
            ("FERRO_STREAM_WAITS", "0"),
        ],
    );
    // Calls cut into 256-byte slices (sends and receives into 64 KiB pieces), stream-ordered
    // (a stream job cuts its staged collectives as the blocking form does) and blocking, then
    // both in one run (even ranks stream-ordered, odd ones blocking).
    for waits in ["0", "1"] {
        run_c(
            &exe,
            &["3"],
            &[
                ("FERRO_DEVICE_PROVIDER", "host"),
                ("FERRO_DEVICE_SLICE_BYTES", "256"),
                ("FERRO_STREAM_WAITS", waits),
            ],
        );
    }
    run_c(
        &exe,
        &["3", "mixed"],
        &[
            ("FERRO_DEVICE_PROVIDER", "host"),
            ("FERRO_DEVICE_SLICE_BYTES", "256"),
        ],
    );
    // Over the p2p transport alone: blocking calls run straight on the device buffers,
    // stream-ordered ones stage through their stream's arena.
    for waits in ["0", "1"] {
        run_c(
            &exe,
            &["2"],
            &[
                ("FERRO_DEVICE_PROVIDER", "host"),
                ("FERRO_TRANSPORTS", "p2p"),
                ("FERRO_P2P_PROVIDER", "host"),
                ("FERRO_STREAM_WAITS", waits),
            ],
        );
    }
    run_c(
        &exe,
        &["1", "nodriver"],
        &[
            ("FERRO_DEVICE_PROVIDER", "cuda"),
            ("FERROCCL_CUDA_DRIVER", "/nonexistent/libcuda.so.1"),
        ],
    );
    let Some(inc) = nvidia_include() else {
        eprintln!("NVIDIA's nccl.h not found: skipping the build against it");
        return;
    };
    let flags = nvidia_flags(&inc);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let exe = gcc("streams.c", "streams_nvidia", &flags, true);
    run_c(&exe, &["2"], &host);
    run_c(&exe, &["2", "all"], &host);
}

/// `ncclCommInitAll` on three stand-in devices joined by the p2p transport, one thread driving
/// them through a group, calls in the blocking form (`FERRO_STREAM_WAITS=0`) and in stream
/// order (`1`: each call's shares queued on the stream, read by the program after its
/// synchronize): the allreduce and the broadcast go straight between the communicators'
/// buffers across the devices (every rank's trace labels both `peer`), and their elements are
/// right (the program checks them).
#[test]
fn c_program_communicators_of_one_thread_on_three_devices_go_between_their_buffers() {
    for waits in ["0", "1"] {
        let peer = peer_calls_in_traces(&["3", "all"], 3, waits);
        for (r, (calls, t)) in peer.iter().enumerate() {
            assert_eq!(
                *calls, 2,
                "FERRO_STREAM_WAITS={waits}, rank {r}: {calls} calls between the buffers in its \
                 trace:\n{t}"
            );
        }
    }
}

/// `tests/c/streams.c NRANKS windows`: ranks that are processes on stand-in devices of their
/// own, their send and receive buffers registered as windows (`ncclCommWindowRegister`), over
/// the p2p transport: the 6 allreduces (whole buffers and ranges inside them) and the
/// broadcast go straight between the processes' buffers (every rank's trace labels all 7
/// `peer`), with every element checked by the program: blocking calls
/// (`FERRO_STREAM_WAITS=0`), and calls on the stream, queued in stream order through the
/// ranks' shared marks (`FERRO_STREAM_WAITS=1`; the registration binds the communicator's
/// device first, which no call has bound yet, so that the marks are shared).
#[test]
fn c_program_windows_of_processes_go_between_their_buffers() {
    for waits in ["0", "1"] {
        for n in [2usize, 3] {
            let peer = peer_calls_in_traces(&[&n.to_string(), "windows"], n, waits);
            for (r, (calls, t)) in peer.iter().enumerate() {
                assert_eq!(
                    *calls, 7,
                    "{n} ranks, FERRO_STREAM_WAITS={waits}, rank {r}: {calls} calls between \
                     the buffers:\n{t}"
                );
            }
        }
    }
}

/// `tests/c/streams.c NRANKS` (processes, buffers from `ncclMemAlloc` and `cudaMalloc`-like
/// allocations, none registered) with the communicators' scratch windows
/// (`FERRO_DEVICE_SCRATCH_BYTES`): the collectives after the first go between the processes'
/// GPUs through them (labelled `peer` in the traces), blocking and on the stream, every
/// element checked by the program; without the scratch windows none does.
#[test]
fn c_program_buffers_in_no_window_go_through_the_scratch_windows() {
    for waits in ["0", "1"] {
        for n in [2usize, 3] {
            let scratch = [("FERRO_DEVICE_SCRATCH_BYTES", "4M")];
            let peer = peer_calls_in_traces_with(&[&n.to_string()], n, waits, &scratch);
            for (r, (calls, t)) in peer.iter().enumerate() {
                assert_eq!(
                    *calls, PIPE_PEER_CALLS,
                    "{n} ranks, FERRO_STREAM_WAITS={waits}, rank {r}: {calls} calls through the \
                     scratch windows:\n{t}"
                );
            }
        }
    }
    let peer = peer_calls_in_traces(&["2"], 2, "1");
    assert!(peer.iter().all(|(calls, _)| *calls == 0), "{:?}", peer[0]);
}

/// Collectives of `streams.c`'s default mode that go through the scratch windows on every
/// rank (the others: the first, which makes them, and those of host buffers, of a NULL
/// stream's, of a group of sends and receives).
const PIPE_PEER_CALLS: usize = 13;

/// Runs `tests/c/streams.c` with `args` over stand-in p2p (`FERRO_STREAM_WAITS=waits`), each of
/// its `ranks` ranks writing a trace; returns each rank's count of calls labelled `peer` (made
/// between the ranks' buffers) and its trace.
fn peer_calls_in_traces(args: &[&str], ranks: usize, waits: &str) -> Vec<(usize, String)> {
    peer_calls_in_traces_with(args, ranks, waits, &[])
}

/// [`peer_calls_in_traces`] with more variables set.
fn peer_calls_in_traces_with(
    args: &[&str],
    ranks: usize,
    waits: &str,
    more: &[(&str, &str)],
) -> Vec<(usize, String)> {
    let exe = gcc("streams.c", "streams", &[&our_include()], true);
    let dir = out_dir().join(format!(
        "peer-trace-{}-{}-{waits}",
        std::process::id(),
        args.join("-")
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("trace-%r.json");
    run_c(
        &exe,
        args,
        &[
            ("FERRO_DEVICE_PROVIDER", "host"),
            ("FERRO_TRANSPORTS", "p2p"),
            ("FERRO_P2P_PROVIDER", "host"),
            ("FERRO_STREAM_WAITS", waits),
            ("FERRO_TRACE_FILE", trace.to_str().unwrap()),
        ]
        .into_iter()
        .chain(more.iter().copied())
        .collect::<Vec<_>>(),
    );
    let counts = (0..ranks)
        .map(|r| {
            let t = std::fs::read_to_string(dir.join(format!("trace-{r}.json"))).unwrap();
            (t.matches("\"algorithm\":\"peer\"").count(), t)
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    counts
}

/// `tests/c/vmm.c` (memory mapped piece by piece, run by `gpu-check.sh` on a GPU) builds, and
/// without a driver says it skipped with exit status 77, which a check must not count as passed.
#[test]
fn c_program_on_memory_mapped_piece_by_piece_builds_and_skips_without_a_driver() {
    let exe = gcc("vmm.c", "vmm", &[&our_include()], true);
    let out = std::process::Command::new("timeout")
        .arg("60")
        .arg(&exe)
        .env("LD_LIBRARY_PATH", common::capi::lib_dir())
        .output()
        .expect("running vmm");
    let text = String::from_utf8_lossy(&out.stdout);
    if out.status.code() == Some(0) {
        // A machine with a driver and a GPU ran it whole.
        assert!(text.contains("OK memory mapped piece by piece"), "{text}");
        return;
    }
    assert_eq!(
        out.status.code(),
        Some(77),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.starts_with("SKIP: no CUDA driver"), "{text}");
}

/// `tests/c/async.c` on the host stand-in: calls with a stream return at once and complete in
/// stream order; several communicators driven from one thread without a group; a failing
/// queued collective releases its stream and is reported; abort and destroy. Built against
/// our header with the CUDA runtime stub (for `cudaStreamSynchronize`), and against NVIDIA's.
#[test]
fn c_program_completes_stream_calls_in_stream_order() {
    let stub = format!("-I{ROOT}/tests/c/cuda_stub");
    let exe = gcc("async.c", "async", &[&our_include(), &stub], true);
    let host = ("FERRO_DEVICE_PROVIDER", "host");
    // A blocking call would wait for the other communicators until FERRO_TIMEOUT and fail.
    run_c(&exe, &["3", "nogroup"], &[host, ("FERRO_TIMEOUT", "5")]);
    run_c(&exe, &["2", "nogroup"], &[host, ("FERRO_TIMEOUT", "5")]);
    run_c(&exe, &["2", "mismatch"], &[host, ("FERRO_TIMEOUT", "20")]);
    run_c(&exe, &["2", "abort"], &[host, ("FERRO_TIMEOUT", "20")]);
    run_c(&exe, &["2", "destroy"], &[host, ("FERRO_TIMEOUT", "20")]);
    // Long calls in groups of several communicators, each on its own stream: slice by slice
    // and round by round (256-byte slices, 64 KiB pieces).
    let slices = ("FERRO_DEVICE_SLICE_BYTES", "256");
    for n in ["2", "3"] {
        run_c(
            &exe,
            &[n, "pieces"],
            &[host, slices, ("FERRO_TIMEOUT", "20")],
        );
    }
    // Groups over two streams of one communicator: ordered after both streams' earlier work,
    // and both streams' later work after the group.
    for n in ["2", "3"] {
        run_c(
            &exe,
            &[n, "joined"],
            &[host, slices, ("FERRO_TIMEOUT", "20")],
        );
    }
    let Some(inc) = nvidia_include() else {
        eprintln!("NVIDIA's nccl.h not found: skipping the build against it");
        return;
    };
    let flags = nvidia_flags(&inc);
    if !flags.iter().any(|f| f.ends_with("tests/c/cuda_stub")) {
        eprintln!("real CUDA headers: async.c needs the stub's cudaStreamSynchronize; skipping");
        return;
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let exe = gcc("async.c", "async_nvidia", &flags, true);
    run_c(&exe, &["3", "nogroup"], &[host, ("FERRO_TIMEOUT", "5")]);
}

#[test]
fn c_program_with_nccl_comm_id_and_init_all() {
    let exe = gcc(
        "collectives.c",
        "collectives_commid",
        &[&our_include()],
        true,
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let id = format!("127.0.0.1:{port}");
    run_c(&exe, &["3", "commid"], &[("NCCL_COMM_ID", &id)]);
    run_c(&exe, &["3", "all"], &[]);
    run_c(&exe, &["2", "mismatch"], &[]);
    run_c(&exe, &["3", "mismatch"], &[]);
    run_c(&exe, &["3", "rootmismatch"], &[]);
    run_c(&exe, &["2", "timeout"], &[("FERRO_TIMEOUT", "2")]);
}

#[test]
fn c_program_calls_every_new_function_and_shrinks_after_a_death() {
    let exe = gcc("api232.c", "api232", &[&our_include()], true);
    run_c(&exe, &["3"], &[]);
    run_c(&exe, &["4"], &[("NCCL_SHM_DISABLE", "1")]);
    let Some(inc) = nvidia_include() else {
        eprintln!("NVIDIA's nccl.h not found: skipping the build against it");
        return;
    };
    let mut flags = nvidia_flags(&inc);
    flags.push("-DNCCL_OS_LINUX".into());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let exe = gcc("api232.c", "api232_nvidia", &flags, true);
    run_c(&exe, &["3"], &[]);
}

#[test]
fn c_example_links_ferroccl_in_place_of_nccl() {
    let exe = gcc(
        "examples/c/allreduce.c",
        "allreduce_example",
        &[&our_include()],
        true,
    );
    run_c(&exe, &["3"], &[]);
}

#[test]
fn c_program_built_against_nvidia_header() {
    let Some(inc) = nvidia_include() else {
        eprintln!("NVIDIA's nccl.h not found: skipping");
        return;
    };
    let flags = nvidia_flags(&inc);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let exe = gcc("collectives.c", "collectives_nvidia", &flags, true);
    run_c(&exe, &["2"], &[]);
    run_c(&exe, &["3"], &[]);
    run_c(&exe, &["2", "all"], &[]);
    run_c(&exe, &["3", "mismatch"], &[]);
}

/// `tests/c/graphs.c` on the host stand-in (its model of captures and graphs, through the
/// test hooks): calls on a stream being captured are recorded, not run, and run at each of
/// three launches with new inputs, beside ordinary calls on the same stream (one queued right
/// after a launch); on 1-3 processes; and with odd ranks making the same calls unrecorded, cut
/// into 1 KiB slices as the recorded ones are, and into 128-byte slices that cut the blocked
/// layouts too; and a recorded call's memory given back when
/// its graph is gone. The same on eager stand-in streams. Then what is refused, and a launch
/// that fails.
#[test]
fn c_program_records_calls_into_graphs_and_runs_them_at_each_launch() {
    let exe = gcc("graphs.c", "graphs", &[&our_include()], true);
    for eager in ["0", "1"] {
        let host = [
            ("FERRO_DEVICE_PROVIDER", "host"),
            ("FERRO_STANDIN_EAGER", eager),
        ];
        for n in ["1", "2", "3"] {
            run_c(&exe, &[n], &host);
        }
        let sliced = [host[0], host[1], ("FERRO_DEVICE_SLICE_BYTES", "1024")];
        run_c(&exe, &["3", "mixed"], &sliced);
        // The blocked layouts cut into slices of every block, recorded and not.
        let blocks = [host[0], host[1], ("FERRO_DEVICE_SLICE_BYTES", "128")];
        run_c(&exe, &["3"], &blocks);
        run_c(&exe, &["3", "mixed"], &blocks);
        // A recorded call's memory lives as long as its graph.
        run_c(&exe, &["3", "lifetime"], &host);
    }
    // What is refused (the capture intact), and a launch whose call fails (its peer gone):
    // the outputs all ones, the error the communicator's.
    let host = ("FERRO_DEVICE_PROVIDER", "host");
    run_c(
        &exe,
        &["2", "limits"],
        &[host, ("FERRO_DEVICE_SLICE_BYTES", "256")],
    );
    run_c(&exe, &["2", "fail"], &[host]);
}
