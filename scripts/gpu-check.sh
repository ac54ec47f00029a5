#!/usr/bin/env bash
# Proves ferroccl's CUDA parts on a machine with an NVIDIA GPU. Runs from the folder that
# scripts/gpu-bundle.sh builds (copy it over, then `./gpu-check.sh`), or from a checkout after
# building that folder (`scripts/gpu-check.sh target/gpu-bundle`). Needs the NVIDIA driver, not
# the CUDA toolkit, NVRTC or Rust.
#
# Exits 0 when every part that is built passed, 1 on any wrong element or failed part, 2 when
# there is no usable GPU. Parts not built yet are listed as such and do not count as passed.
#
#     ./gpu-check.sh [--device N] [--bw-mib M] [--iters N]
#
# FERRO_GPU_STEPS picks steps or parts of steps, e.g. "8 2b 2c 4c" (default: all). A part is
# its step's number and letter; a step's number picks all its parts. A check run with a
# selection says so in its last line: it proves only what it ran. The word "targets" in it
# stands for the steps whose figures scripts/gpu-targets.sh compares with the speed targets
# (1 5 6a 8b 8i 8k 8l 8n): on a machine lent for a short while, run those first.
# Every step runs under a deadline (FERRO_GPU_STEP_TIMEOUT seconds, default 300): a step that
# hangs is reported as such and fails the check, and the later steps still run.
#
# The whole output also goes to a log (FERRO_GPU_CHECK_LOG, default a new file under /tmp), from
# which scripts/gpu-targets.sh prints the speed targets against this run's own figures after
# the verdict; the verdict line is then printed again, last.
set -uo pipefail
if [ -z "${FERRO_GPU_CHECK_TEE:-}" ]; then
    log=${FERRO_GPU_CHECK_LOG:-$(mktemp "${TMPDIR:-/tmp}/gpu-check.XXXXXX")}
    FERRO_GPU_CHECK_TEE=1 bash "$0" "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    targets="$(cd "$(dirname "$0")" && pwd)/gpu-targets.sh"
    echo
    if [ -x "$targets" ]; then
        "$targets" "$log"
    else
        echo "-- no gpu-targets.sh beside gpu-check.sh: the targets are not summed up"
    fi
    echo "-- the whole output: $log"
    tail -n 1 "$log"
    exit "$rc"
fi
step_timeout=${FERRO_GPU_STEP_TIMEOUT:-300}

# Runs one step's command under the deadline (`deadline=S step ...` sets another for one
# step); exit 124 means it ran past it. Prints the wall time it took. `part=ID step ...` names
# the part, which runs only when FERRO_GPU_STEPS selects it.
step() {
    if [ -n "${part:-}" ] && ! want "$part"; then
        echo "-- part $part not selected (FERRO_GPU_STEPS)"
        skipped=1
        return 0
    fi
    skipped=0
    local t=${deadline:-$step_timeout} start=$SECONDS
    timeout -k 10 "$t" "$@"
    local rc=$?
    [ "$rc" -eq 124 ] && echo "-- ran past its ${t} s deadline (FERRO_GPU_STEP_TIMEOUT)"
    echo "-- $(basename "$1"): $((SECONDS - start)) s"
    return "$rc"
}

steps=${FERRO_GPU_STEPS:-}
# The named selection "targets" (above).
steps=$(printf '%s\n' "${steps//,/ }" | sed -E 's/(^| )targets( |$)/\1 1 5 6a 8b 8i 8k 8l 8n \2/g')
read -r -a picked <<< "$steps"
steps="${picked[*]:-}"
# want ID: whether step or part ID ("2", "2b") is selected; a step is wanted when any of its
# parts is.
want() {
    [ -z "$steps" ] && return 0
    local t
    for t in ${steps//,/ }; do
        case $1 in "$t" | "$t"[a-z]) return 0 ;; esac
        [ "${t%%[a-z]*}" = "$1" ] && return 0
    done
    return 1
}

here=$(cd "$(dirname "$0")" && pwd)
bundle=$here
if [ $# -gt 0 ] && [ -d "$1" ]; then
    bundle=$(cd "$1" && pwd)
    shift
fi
if [ ! -x "$bundle/bin/ferro-gpu-check" ]; then
    echo "gpu-check: no bundle at $bundle (build one with scripts/gpu-bundle.sh)" >&2
    exit 2
fi
head -3 "$bundle/MANIFEST" 2>/dev/null
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total --format=csv
export FERROCCL_KERNEL_CACHE=$bundle/kernel-cache
export LD_LIBRARY_PATH=$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

failed=0
# The device for the steps after the first (step 1 takes every option itself).
device_args=()
prev=
for a in "$@"; do
    [ "$prev" = "--device" ] && device_args=(--device "$a")
    prev=$a
done
# The GPUs this machine shows, and one of them for the parts whose targets are for ranks on one
# GPU (5, 8b, 8i): all_reduce_perf -t N gives each rank the device of its local rank, so on a
# machine with several GPUs its ranks would spread over them. The --device one, else the first
# of CUDA_VISIBLE_DEVICES, else 0.
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
ngpu=${ngpu:-0}
visible=${CUDA_VISIBLE_DEVICES:-0}
one_gpu=${device_args[1]:-${visible%%,*}}
if want 1; then
echo
echo "== 1. reduction kernels vs the CPU reference (every dtype x op, awkward counts and offsets), bandwidth vs device copy"
part=1 step "$bundle/bin/ferro-gpu-check" "$@"
rc=$?
case $rc in
    0) echo "-- kernels: PASS" ;;
    2) echo "-- kernels: no usable GPU (see above)"; exit 2 ;;
    *) echo "-- kernels: FAIL (exit $rc)"; failed=1 ;;
esac
fi

if want 2; then
echo
echo "== 2. collectives on device buffers (pinned host staging; 1, 2 and 4 ranks as threads on one GPU) vs the same calls on host buffers"
if [ -x "$bundle/bin/ferroccl-device-check" ]; then
    FERRO_DEVICE_PROVIDER=cuda part=2a step "$bundle/bin/ferroccl-device-check" "${device_args[@]}"
    rc=$?
    [ "$skipped" = 1 ] || case $rc in
        0) echo "-- device buffers: PASS" ;;
        2) echo "-- device buffers: no usable GPU (see above)"; failed=1 ;;
        *) echo "-- device buffers: FAIL (exit $rc)"; failed=1 ;;
    esac
    # 2b: the stream-ordered calls in stream order for every size (FERRO_STREAM_WAITS=1; by
    # default calls staging more than 256 MiB block, and ferroccl-device-check's are smaller,
    # so 2a runs them in stream order too). One rank runs
    # them in stream order; 2 ranks as threads share the GPU, so their calls block (several
    # communicators of a process on one GPU never queue flag waits: see 2c).
    echo "-- 2b: stream-ordered (FERRO_STREAM_WAITS=1), 1 and 2 ranks"
    FERRO_DEVICE_PROVIDER=cuda FERRO_STREAM_WAITS=1 deadline=60 \
        part=2b step "$bundle/bin/ferroccl-device-check" "${device_args[@]}" --ranks 1,2
    rc=$?
    if [ "$skipped" = 1 ]; then :
    elif [ "$rc" -eq 0 ]; then echo "-- device buffers, stream order: PASS"; else echo "-- device buffers, stream order: FAIL (exit $rc)"; failed=1; fi
    # 2d: one rank in stream order with 64 KiB slices: element-wise calls become one stream
    # job per slice, copies in and back overlapping the other slices (not run on a GPU before).
    echo "-- 2d: stream-ordered, FERRO_DEVICE_SLICE_BYTES=64K (a stream job per slice), 1 rank"
    FERRO_DEVICE_PROVIDER=cuda FERRO_STREAM_WAITS=1 FERRO_DEVICE_SLICE_BYTES=64K deadline=60 \
        part=2d step "$bundle/bin/ferroccl-device-check" "${device_args[@]}" --ranks 1
    rc=$?
    if [ "$skipped" = 1 ]; then :
    elif [ "$rc" -eq 0 ]; then echo "-- device buffers, stream order in slices: PASS"; else echo "-- device buffers, stream order in slices: FAIL (exit $rc)"; failed=1; fi
    # 2c, a diagnostic that does not fail the check: 4 ranks in one process with
    # FERRO_STREAM_WAITS=1. Before, this did not finish in 50 s: each rank's stream waited on
    # a flag in host memory, and with more streams than hardware queues
    # (CUDA_DEVICE_MAX_CONNECTIONS) one rank's wait could hold back another's copies. Now
    # communicators that share a GPU in one process block instead, so this must finish.
    echo "-- 2c (diagnostic): FERRO_STREAM_WAITS=1, 4 ranks on one GPU (they block), CUDA_DEVICE_MAX_CONNECTIONS=32"
    CUDA_DEVICE_MAX_CONNECTIONS=32 FERRO_DEVICE_PROVIDER=cuda FERRO_STREAM_WAITS=1 deadline=60 \
        part=2c step "$bundle/bin/ferroccl-device-check" "${device_args[@]}" --ranks 4
    rc=$?
    if [ "$skipped" = 1 ]; then :
    elif [ "$rc" -eq 0 ]; then echo "-- 2c: PASS"; else echo "-- 2c: FAIL (exit $rc; diagnostic only)"; fi
else
    echo "-- device buffers: FAIL (bin/ferroccl-device-check missing from the bundle)"
    failed=1
fi
fi

if want 3; then
echo
echo "== 3. peer-to-peer transport, cuda provider on device 0: conformance suite (two ranks as threads), two processes over CUDA IPC"
if [ -x "$bundle/bin/p2p-tests" ]; then
    FERRO_P2P_GPU_CHECK=1 part=3 step "$bundle/bin/p2p-tests" --test-threads 1 \
        conformance_cuda_provider_on_a_gpu two_processes_exchange_through_the_provider
    rc=$?
    if [ "$rc" -eq 0 ]; then echo "-- p2p: PASS"; else echo "-- p2p: FAIL (exit $rc)"; failed=1; fi
else
    echo "-- p2p: bin/p2p-tests is not in this bundle: FAIL"
    failed=1
fi
fi

if want 4; then
echo
echo "== 4. C ABI with streams: tests/c/streams.c, 2 processes on one GPU, ncclMemAlloc'd buffers, a cuStreamCreate'd stream, every data-moving collective, send/recv, gather, scatter, a group, host pointers refused; 4e: tests/c/vmm.c, memory mapped piece by piece; 4g: tests/c/graphs.c, calls recorded into graphs"
if [ -x "$bundle/bin/streams" ]; then
    rc=0
    # 4a: the blocking form: a call with a stream waits for the stream, runs, then returns;
    # the program reads its results with a synchronous cuMemcpyDtoH.
    echo "-- 4a: blocking (FERRO_STREAM_WAITS=0)"
    FERRO_DEVICE_PROVIDER=cuda FERRO_TIMEOUT=60 FERROCCL_TEST_TRACE=1 FERRO_STREAM_WAITS=0 \
        part=4a step "$bundle/bin/streams" 2 || rc=1
    # 4b: FERRO_STREAM_WAITS=1: calls return at once and complete in stream order
    # (cuStreamWaitValue32 on a host-mapped flag); the program synchronizes its stream before
    # each read, as NCCL's examples do.
    echo "-- 4b: stream-ordered (FERRO_STREAM_WAITS=1), cuStreamSynchronize before each read"
    FERRO_DEVICE_PROVIDER=cuda FERRO_TIMEOUT=60 FERROCCL_TEST_TRACE=1 FERRO_DEBUG=DEBUG \
        FERRO_STREAM_WAITS=1 FERROCCL_TEST_SYNC_FIRST=1 part=4b step "$bundle/bin/streams" 2 || rc=1
    # 4c: stream-ordered (the default for calls of this size), results read with a
    # synchronous cuMemcpyDtoH right after the call (legacy stream): the job must make no
    # driver call while that copy waits for it.
    echo "-- 4c: stream-ordered (the default), cuMemcpyDtoH right after each call"
    FERRO_DEVICE_PROVIDER=cuda FERRO_TIMEOUT=60 FERROCCL_TEST_TRACE=1 FERRO_DEBUG=DEBUG \
        deadline=60 part=4c step "$bundle/bin/streams" 2 || rc=1
    # 4d: stream-ordered with 256-byte slices (FERRO_DEVICE_SLICE_BYTES): the stream jobs cut
    # their collectives into the slices the blocking form uses (not run on a GPU before).
    echo "-- 4d: stream-ordered, FERRO_DEVICE_SLICE_BYTES=256 (calls cut into slices)"
    FERRO_DEVICE_PROVIDER=cuda FERRO_TIMEOUT=60 FERROCCL_TEST_TRACE=1 FERRO_DEVICE_SLICE_BYTES=256 \
        FERRO_STREAM_WAITS=1 FERROCCL_TEST_SYNC_FIRST=1 deadline=60 part=4d step "$bundle/bin/streams" 2 || rc=1
    # 4f: the same slices, rank 0 stream-ordered and rank 1 blocking (streams.c's mixed mode):
    # both forms must exchange the same messages, sends and receives in 64 KiB pieces included
    # (not run on a GPU before).
    echo "-- 4f: FERRO_DEVICE_SLICE_BYTES=256, rank 0 stream-ordered, rank 1 blocking"
    FERRO_DEVICE_PROVIDER=cuda FERRO_TIMEOUT=60 FERROCCL_TEST_TRACE=1 FERRO_DEVICE_SLICE_BYTES=256 \
        FERROCCL_TEST_SYNC_FIRST=1 deadline=60 part=4f step "$bundle/bin/streams" 2 mixed || rc=1
    # 4e: device memory mapped piece by piece into one reserved range (cuMemMap, as PyTorch's
    # expandable segments): buffers spanning two pieces work, one running past the mapped
    # pieces is refused (tests/c/vmm.c, one rank; not run on a GPU before). Exit 77: skipped.
    if [ -x "$bundle/bin/vmm" ]; then
        echo "-- 4e: memory mapped piece by piece (tests/c/vmm.c)"
        FERRO_DEVICE_PROVIDER=cuda FERRO_TIMEOUT=60 deadline=60 part=4e step "$bundle/bin/vmm" || rc=1
    else
        echo "-- 4e: bin/vmm missing from the bundle"
        rc=1
    fi
    # 4g: calls recorded into a CUDA graph (cuStreamBeginCapture in the global mode): nothing
    # runs at capture, three launches with new inputs each run every collective and a group
    # of sends and receives, beside ordinary calls on the same stream; refusals leave the
    # capture intact; a launch whose peer is gone leaves ones and an asynchronous error; the
    # p2p transport refuses; a destroyed graph gives its calls' memory back (tests/c/graphs.c;
    # not run on a GPU before).
    if [ -x "$bundle/bin/graphs" ]; then
        echo "-- 4g: calls recorded into graphs (tests/c/graphs.c)"
        FERRO_DEVICE_PROVIDER=cuda FERRO_TIMEOUT=60 deadline=60 part=4g step "$bundle/bin/graphs" 2 || rc=1
        FERRO_DEVICE_PROVIDER=cuda FERRO_TIMEOUT=60 FERRO_DEVICE_SLICE_BYTES=1024 deadline=60 \
            part=4g step "$bundle/bin/graphs" 3 mixed || rc=1
        FERRO_DEVICE_PROVIDER=cuda FERRO_TIMEOUT=60 FERRO_DEVICE_SLICE_BYTES=128 deadline=60 \
            part=4g step "$bundle/bin/graphs" 3 mixed || rc=1
        FERRO_DEVICE_PROVIDER=cuda FERRO_TIMEOUT=60 FERRO_DEVICE_SLICE_BYTES=256 deadline=60 \
            part=4g step "$bundle/bin/graphs" 2 limits || rc=1
        FERRO_DEVICE_PROVIDER=cuda FERRO_TIMEOUT=60 deadline=60 part=4g step "$bundle/bin/graphs" 2 fail || rc=1
        FERRO_DEVICE_PROVIDER=cuda FERRO_TIMEOUT=60 FERRO_TRANSPORTS=p2p deadline=60 \
            part=4g step "$bundle/bin/graphs" 2 refuse || rc=1
        # A recorded call's memory lives as long as its graph (cuUserObjectCreate,
        # cuGraphRetainUserObject; not run on a GPU before).
        FERRO_DEVICE_PROVIDER=cuda FERRO_TIMEOUT=60 deadline=60 part=4g step "$bundle/bin/graphs" 2 lifetime || rc=1
    else
        echo "-- 4g: bin/graphs missing from the bundle"
        rc=1
    fi
    if [ "$rc" -eq 0 ]; then echo "-- C ABI streams: PASS"; else echo "-- C ABI streams: FAIL"; failed=1; fi
else
    echo "-- C ABI streams: FAIL (bin/streams missing from the bundle)"
    failed=1
fi
fi

if want 5; then
echo
echo "== 5. all_reduce_perf on device buffers (-B 1), 8 B .. 1 GiB, 2 ranks as threads on one GPU, every result checked"
if [ -x "$bundle/bin/all_reduce_perf" ]; then
    CUDA_VISIBLE_DEVICES=$one_gpu FERRO_DEVICE_PROVIDER=cuda deadline=$((3 * step_timeout)) part=5 step "$bundle/bin/all_reduce_perf" -b 8 -e 1G -f 2 -t 2 -n 5 -w 2 -B 1
    rc=$?
    if [ "$rc" -eq 0 ]; then echo "-- all_reduce_perf -B 1: PASS"; else echo "-- all_reduce_perf -B 1: FAIL (exit $rc)"; failed=1; fi
else
    echo "-- all_reduce_perf -B 1: FAIL (bin/all_reduce_perf missing from the bundle)"
    failed=1
fi
fi

if want 6; then
echo
echo "== 6. host-staged device buffers against host buffers: 2 processes over shared memory (ferrorun), all_reduce_perf 8 B, then 1 MiB .. 64 MiB by x4, host then device buffers, twice (target: device >= 70 % of host busbw at 64 MiB). 6a: host (-B 0) and blocking device calls (-B 1); 6b: device calls ordered on a stream (-B 2, as NCCL programs call them), interleaved with host buffers, then 256 MiB .. 1 GiB on a stream (the arena holds 4 slices in flight, so these queue instead of blocking)"
if [ -x "$bundle/bin/ferrorun" ] && [ -x "$bundle/bin/all_reduce_perf" ]; then
    rc=0
    # rounds PART B...: two rounds of 8 B and 1 MiB .. 64 MiB, with each -B value in turn.
    rounds() {
        local p=$1 round b
        shift
        for round in 1 2; do
            for b in "$@"; do
                echo "-- $p round $round, -B $b"
                FERRO_DEVICE_PROVIDER=cuda part=$p step "$bundle/bin/ferrorun" -n 2 -- \
                    "$bundle/bin/all_reduce_perf" -b 8 -e 8 -n 1000 -w 100 -B "$b" || rc=1
                FERRO_DEVICE_PROVIDER=cuda part=$p step "$bundle/bin/ferrorun" -n 2 -- \
                    "$bundle/bin/all_reduce_perf" -b 1M -e 64M -f 4 -n 20 -w 5 -B "$b" || rc=1
            done
        done
    }
    rounds 6a 0 1
    rounds 6b 2 0
    echo "-- 6b: 256 MiB .. 1 GiB ordered on a stream"
    FERRO_DEVICE_PROVIDER=cuda FERRO_DEBUG=INFO part=6b step "$bundle/bin/ferrorun" -n 2 -- \
        "$bundle/bin/all_reduce_perf" -b 256M -e 1G -f 4 -n 3 -w 1 -B 2 || rc=1
    if [ "$rc" -eq 0 ]; then echo "-- shm staged: PASS"; else echo "-- shm staged: FAIL"; failed=1; fi
else
    echo "-- shm staged: FAIL (bin/ferrorun or bin/all_reduce_perf missing from the bundle)"
    failed=1
fi
fi

if want 7; then
echo
echo "== 7. send/recv of device buffers handed straight to the peer-to-peer transport (CUDA IPC), 2 processes on one GPU: sendrecv_perf -B 1, 8 B .. 256 MiB by x4, every result checked; then the same over shared memory (host copies) for comparison"
if [ -x "$bundle/bin/ferrorun" ] && [ -x "$bundle/bin/sendrecv_perf" ]; then
    rc=0
    for t in p2p shm; do
        echo "-- FERRO_TRANSPORTS=$t"
        FERRO_DEVICE_PROVIDER=cuda FERRO_TRANSPORTS=$t part=7 step "$bundle/bin/ferrorun" -n 2 -- \
            "$bundle/bin/sendrecv_perf" -b 8 -e 256M -f 4 -n 10 -w 3 -B 1 || rc=1
    done
    if [ "$rc" -eq 0 ]; then echo "-- device send/recv: PASS"; else echo "-- device send/recv: FAIL"; failed=1; fi
else
    echo "-- device send/recv: FAIL (bin/ferrorun or bin/sendrecv_perf missing from the bundle)"
    failed=1
fi
fi

if want 8; then
echo
echo "== 8. collectives straight on device buffers over the peer-to-peer transport: reductions by the CUDA kernels inside the collectives, read straight from the transport's slots, no host copy. 8a: ferroccl-device-check, 2 and 4 ranks as threads of one process (one CUDA context) joined by p2p, every collective x dtype x op against host buffers; 8b: all_reduce_perf -t 2 -B 1 over p2p, 8 B .. 256 MiB by x2, direct then staged (FERRO_DEVICE_DIRECT=0); 8c: the same as 2 processes (CUDA IPC), 8 B .. 128 MiB by x4; 8d: every other collective tool, 2 processes, 8 B .. 16 MiB; 8e: the C ABI's streams.c over p2p; 8f, 8g and 8h: diagnostics, 4 MiB slices, the time per phase, and reductions from the slots queued (FERRO_P2P_QUEUED_REDUCE) off against on; 8i: allreduce straight between the threads' buffers (one kernel a rank, the default in 8a and 8b) against the lanes and the ring (FERRO_DEVICE_PEER=0), 8 B .. 256 MiB by x32 alternated (targets: 256 MiB allreduce traffic at >= 60 % of step 1's copy rate; 8 B <= 20 us); 8j: the same across two GPUs (needs two); 8k: between the threads' buffers, calls ordered on a stream (-B 2, as NCCL programs call) against blocking calls (-B 1), 8 B .. 256 MiB by x32 alternated (the same targets); 8l: 2 processes with their buffers registered as windows (-R 2, CUDA IPC; blocking calls and calls on a stream, -B 1 and -B 2) against unregistered ones (-R 0, the ring), alternated, then 2 processes of 2 threads on a stream (-t 2 -R 2 -B 2), and the C ABI's windows; 8n: 2 processes, unregistered buffers through scratch windows (FERRO_DEVICE_SCRATCH_BYTES=128M, -B 1 and -B 2) against the ring. 5, 8b, 8i, 8k, 8l and 8n run on one GPU ($one_gpu)"
if [ -x "$bundle/bin/ferrorun" ] && [ -x "$bundle/bin/all_reduce_perf" ]; then
    rc=0
    echo "-- 8a. ferroccl-device-check over p2p"
    FERRO_DEVICE_PROVIDER=cuda FERRO_TRANSPORTS=p2p \
        part=8a step "$bundle/bin/ferroccl-device-check" "${device_args[@]}" --ranks 2,4 || rc=1
    for direct in 1 0; do
        echo "-- 8b. threads, FERRO_DEVICE_DIRECT=$direct"
        CUDA_VISIBLE_DEVICES=$one_gpu FERRO_DEVICE_PROVIDER=cuda FERRO_TRANSPORTS=p2p FERRO_DEVICE_DIRECT=$direct \
            part=8b step "$bundle/bin/all_reduce_perf" -b 8 -e 256M -f 2 -t 2 -n 10 -w 3 -B 1 || rc=1
    done
    for direct in 1 0; do
        echo "-- 8c. processes, FERRO_DEVICE_DIRECT=$direct"
        FERRO_DEVICE_PROVIDER=cuda FERRO_TRANSPORTS=p2p FERRO_DEVICE_DIRECT=$direct \
            part=8c step "$bundle/bin/ferrorun" -n 2 -- \
            "$bundle/bin/all_reduce_perf" -b 8 -e 256M -f 4 -n 10 -w 3 -B 1 || rc=1
    done
    if [ -x "$bundle/bin/streams" ]; then
        echo "-- 8e. the C ABI over p2p (communicators with p2p connections block): tests/c/streams.c, 2 processes"
        FERRO_DEVICE_PROVIDER=cuda FERRO_TRANSPORTS=p2p FERRO_TIMEOUT=60 \
            part=8e step "$bundle/bin/streams" 2 || rc=1
    fi
    for t in all_gather_perf reduce_scatter_perf broadcast_perf reduce_perf alltoall_perf gather_perf scatter_perf; do
        if [ -x "$bundle/bin/$t" ]; then
            echo "-- 8d. $t"
            FERRO_DEVICE_PROVIDER=cuda FERRO_TRANSPORTS=p2p part=8d step "$bundle/bin/ferrorun" -n 2 -- \
                "$bundle/bin/$t" -b 8 -e 16M -f 8 -n 5 -w 2 -B 1 || rc=1
        else
            echo "-- $t missing from the bundle"
            rc=1
        fi
    done
    # 8f, a diagnostic that does not fail the check: where the direct path's time goes. A
    # direct call is cut into slices (64 MiB on one host with p2p, as in 8b), one collective
    # each, and each costs about what an 8 B call does; 4 MiB slices (the default elsewhere)
    # show how much of the large calls' time that is.
    echo "-- 8f (diagnostic): threads, direct, FERRO_DEVICE_SLICE_BYTES=4M"
    FERRO_DEVICE_PROVIDER=cuda FERRO_TRANSPORTS=p2p FERRO_DEVICE_SLICE_BYTES=4M \
        part=8f step "$bundle/bin/all_reduce_perf" -b 1M -e 256M -f 4 -t 2 -n 10 -w 3 -B 1 ||
        echo "-- 8f: FAIL (diagnostic only)"
    # 8g, a diagnostic that does not fail the check: where each rank's time goes, phase by
    # phase (bin/all_reduce_perf_profile, built with the profile feature): in transport sends
    # and receives (queueing copies, polling their events, publishing flags), in reductions (a
    # kernel launch and its wait each), in the driver's bookkeeping, or waiting for the peer.
    if [ -x "$bundle/bin/all_reduce_perf_profile" ]; then
        echo "-- 8g (diagnostic): threads, direct, the time of each call phase by phase"
        FERRO_DEVICE_PROVIDER=cuda FERRO_TRANSPORTS=p2p FERRO_PERF_PROFILE=1 \
            part=8g step "$bundle/bin/all_reduce_perf_profile" -b 8 -e 256M -f 32 -t 2 -n 10 -w 3 -B 1 ||
            echo "-- 8g: FAIL (diagnostic only)"
    else
        echo "-- 8g: bin/all_reduce_perf_profile missing from the bundle (diagnostic only)"
    fi
    # 8h, a diagnostic that does not fail the check (the path is off by default): reductions
    # straight from the slots queued and not waited for (FERRO_P2P_QUEUED_REDUCE=1), each slot
    # handed back when its kernel's event is done. Every collective against host buffers,
    # then off and on alternated twice, 1 MiB .. 256 MiB, elements checked.
    echo "-- 8h (diagnostic): FERRO_P2P_QUEUED_REDUCE=1, device-check over p2p, then off/on alternated"
    FERRO_DEVICE_PROVIDER=cuda FERRO_TRANSPORTS=p2p FERRO_P2P_QUEUED_REDUCE=1 \
        part=8h step "$bundle/bin/ferroccl-device-check" "${device_args[@]}" --ranks 2 ||
        echo "-- 8h: FAIL (diagnostic only: the queued path is off by default)"
    for q in 0 1 0 1; do
        echo "-- 8h: FERRO_P2P_QUEUED_REDUCE=$q, threads, direct"
        FERRO_DEVICE_PROVIDER=cuda FERRO_TRANSPORTS=p2p FERRO_P2P_QUEUED_REDUCE=$q \
            part=8h step "$bundle/bin/all_reduce_perf" -b 1M -e 256M -f 4 -t 2 -n 10 -w 3 -B 1 ||
            echo "-- 8h: FAIL (diagnostic only: the queued path is off by default)"
    done
    # 8i: allreduce straight between the ranks' buffers (threads of one process: one kernel a
    # rank reads both inputs and writes both outputs; the default, as in 8a and 8b) against
    # the ring through the slots (FERRO_DEVICE_PEER=0), alternated twice, elements checked.
    for peer in 0 1 0 1; do
        echo "-- 8i: FERRO_DEVICE_PEER=$peer, threads, direct"
        CUDA_VISIBLE_DEVICES=$one_gpu FERRO_DEVICE_PROVIDER=cuda FERRO_TRANSPORTS=p2p FERRO_DEVICE_PEER=$peer \
            part=8i step "$bundle/bin/all_reduce_perf" -b 8 -e 256M -f 32 -t 2 -n 10 -w 3 -B 1 || rc=1
    done
    # 8k: between the ranks' buffers on a stream (-B 2: each call queued, the kernels ordered by
    # events, nothing waited for on the host but the two exchanges) against blocking calls.
    for b in 1 2 1 2; do
        echo "-- 8k: -B $b, threads, between the buffers"
        CUDA_VISIBLE_DEVICES=$one_gpu FERRO_DEVICE_PROVIDER=cuda FERRO_TRANSPORTS=p2p \
            part=8k step "$bundle/bin/all_reduce_perf" -b 8 -e 256M -f 32 -t 2 -n 10 -w 3 -B "$b" || rc=1
    done
    # 8l: ranks that are processes, their buffers registered as windows (-R 2: exported
    # through CUDA IPC at registration, mapped by the other process; blocking calls, -B 1, and
    # calls on a stream, -B 2, ordered by interprocess events) against unregistered buffers
    # (-R 0: the ring through the slots), alternated twice; then the C ABI's windows
    # (tests/c/streams.c, mode windows). Processes on one GPU time-slice it (no MPS).
    for rb in "0 1" "2 1" "2 2" "0 1" "2 1" "2 2"; do
        set -- $rb
        echo "-- 8l: -R $1 -B $2, processes, windows"
        CUDA_VISIBLE_DEVICES=$one_gpu FERRO_DEVICE_PROVIDER=cuda FERRO_TRANSPORTS=p2p \
            part=8l step "$bundle/bin/ferrorun" -n 2 -- \
            "$bundle/bin/all_reduce_perf" -b 8 -e 256M -f 32 -n 10 -w 3 -B "$2" -R "$1" || rc=1
    done
    # Two processes of two threads each (4 ranks), calls on a stream through windows: the
    # ranks of one process wait for each other's interprocess events as they are. Correctness
    # and a first look, 8 B .. 16 MiB, not a target row.
    echo "-- 8l: threads of processes, -t 2 -R 2 -B 2"
    CUDA_VISIBLE_DEVICES=$one_gpu FERRO_DEVICE_PROVIDER=cuda FERRO_TRANSPORTS=p2p \
        part=8l step "$bundle/bin/ferrorun" -n 2 -- \
        "$bundle/bin/all_reduce_perf" -b 8 -e 16M -f 32 -t 2 -n 10 -w 3 -B 2 -R 2 || rc=1
    if [ -x "$bundle/bin/streams" ]; then
        echo "-- 8l: the C ABI's windows (tests/c/streams.c 2 windows)"
        CUDA_VISIBLE_DEVICES=$one_gpu FERRO_DEVICE_PROVIDER=cuda FERRO_TRANSPORTS=p2p FERRO_TIMEOUT=60 \
            part=8l step "$bundle/bin/streams" 2 windows || rc=1
        # Communicators one after another whose last window goes while their call may still
        # be queued: the interprocess events are destroyed only once no stream waits for them.
        echo "-- 8l: communicators one after another (tests/c/streams.c 2 comms 20)"
        CUDA_VISIBLE_DEVICES=$one_gpu FERRO_DEVICE_PROVIDER=cuda FERRO_TRANSPORTS=p2p FERRO_TIMEOUT=60 \
            part=8l step "$bundle/bin/streams" 2 comms 20 || rc=1
    fi
    # 8n: ranks that are processes, buffers in no window, through the communicators' own
    # scratch windows (FERRO_DEVICE_SCRATCH_BYTES: each rank copies its input into its scratch,
    # the others read it there; blocking calls and calls on a stream) against the ring without
    # them, alternated twice; then the C ABI's streams.c with scratch windows.
    if want 8n; then
        for sb in "0 1" "128M 1" "128M 2" "0 1" "128M 1" "128M 2"; do
            set -- $sb
            echo "-- 8n: scratch $1 -B $2, processes, no windows"
            CUDA_VISIBLE_DEVICES=$one_gpu FERRO_DEVICE_PROVIDER=cuda FERRO_TRANSPORTS=p2p FERRO_DEVICE_SCRATCH_BYTES=$1 \
                part=8n step "$bundle/bin/ferrorun" -n 2 -- \
                "$bundle/bin/all_reduce_perf" -b 8 -e 256M -f 32 -n 10 -w 3 -B "$2" || rc=1
        done
        if [ -x "$bundle/bin/streams" ]; then
            echo "-- 8n: the C ABI with scratch windows (tests/c/streams.c 2)"
            CUDA_VISIBLE_DEVICES=$one_gpu FERRO_DEVICE_PROVIDER=cuda FERRO_TRANSPORTS=p2p FERRO_DEVICE_SCRATCH_BYTES=128M FERRO_TIMEOUT=60 \
                part=8n step "$bundle/bin/streams" 2 || rc=1
        fi
    else
        echo "-- part 8n not selected (FERRO_GPU_STEPS)"
    fi
    # 8j: the same across two GPUs (rank r on GPU r), where every GPU reaches the other (peer
    # access): one kernel a rank reads both inputs over the link. Needs two GPUs; with fewer it
    # does not run, and does not pass by being skipped.
    if ! want 8j; then
        echo "-- part 8j not selected (FERRO_GPU_STEPS)"
    elif [ "$ngpu" -ge 2 ]; then
        for peer in 0 1 0 1; do
            echo "-- 8j: FERRO_DEVICE_PEER=$peer, threads on two GPUs, direct"
            CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1} FERRO_DEVICE_PROVIDER=cuda FERRO_TRANSPORTS=p2p FERRO_DEVICE_PEER=$peer \
                part=8j step "$bundle/bin/all_reduce_perf" -b 8 -e 256M -f 32 -t 2 -n 10 -w 3 -B 1 || rc=1
        done
    else
        echo "-- 8j: SKIPPED (this machine shows $ngpu GPU; two are needed; this part did not run)"
        unran=1
    fi
    if [ "$rc" -eq 0 ]; then echo "-- device-direct collectives: PASS"; else echo "-- device-direct collectives: FAIL"; failed=1; fi
else
    echo "-- device-direct collectives: FAIL (bin/ferrorun or bin/all_reduce_perf missing from the bundle)"
    failed=1
fi
fi

if want 9; then
echo
echo "== 9. the PyTorch backend on CUDA tensors (python/tests/test_cuda.py), 2 processes on one GPU: every collective x dtype x count, sends and receives, rooted exchanges and bad input on CUDA tensors in stream order; DDP and FSDP2 on CUDA tensors against gloo on CPU. Needs a Python with PyTorch built for CUDA (FERRO_PYTHON, default python3); without one the part is skipped, not passed"
py=${FERRO_PYTHON:-python3}
if [ ! -f "$bundle/python/ferroccl/_ferroccl.abi3.so" ]; then
    echo "-- PyTorch backend on CUDA: FAIL (python/ missing from the bundle)"
    failed=1
elif ! "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "-- PyTorch backend on CUDA: SKIPPED ($py has no PyTorch that sees a GPU; this part did not run)"
    unran=1
else
    "$py" -c 'import torch; print("-- torch", torch.__version__, "CUDA", torch.version.cuda)'
    # 1 KiB slices: DDP's 10 KB buckets and the sweep's larger calls run as several stream jobs.
    PYTHONPATH=$bundle/python FERRO_DEVICE_PROVIDER=cuda FERRO_DEVICE_SLICE_BYTES=1K \
        part=9 step "$py" "$bundle/python/tests/test_cuda.py"
    rc=$?
    # 9b: the same over p2p with scratch windows (CUDA tensors between the processes' GPUs,
    # unregistered, in stream order).
    if [ "$rc" -eq 0 ] && want 9b; then
        echo "-- 9b: test_cuda.py over p2p through scratch windows (FERRO_DEVICE_SCRATCH_BYTES=128M)"
        PYTHONPATH=$bundle/python FERRO_DEVICE_PROVIDER=cuda FERRO_TRANSPORTS=p2p,shm,tcp FERRO_DEVICE_SCRATCH_BYTES=128M \
            part=9b step "$py" "$bundle/python/tests/test_cuda.py"
        rc=$?
    fi
    if [ "$skipped" = 1 ]; then :
    elif [ "$rc" -eq 0 ]; then echo "-- PyTorch backend on CUDA: PASS"
    elif [ "$rc" -eq 77 ]; then echo "-- PyTorch backend on CUDA: SKIPPED (no CUDA device seen)"; unran=1
    else echo "-- PyTorch backend on CUDA: FAIL"; failed=1; fi
fi
fi

echo
echo "== not built yet (nothing to run; these do not pass by being skipped):"
echo "   - stream-ordered device collectives straight on the device (they stage through the stream's pinned arena); device collectives as one kernel per step (each reduction is a launch and a wait), except between ranks that are threads of one process (one kernel a call, part 8i) and ranks of processes through windows (8l) or scratch windows (8n, opt-in)"
echo "   - the stream-ordered form on communicators with p2p connections without windows or scratch windows (their calls block: the transport makes driver calls, which a stream job must not)"

if [ "$failed" -ne 0 ]; then
    echo "gpu-check: FAILED"
    exit 1
fi
if [ "${unran:-0}" = 1 ]; then
    echo "gpu-check: the built parts that ran passed; some were skipped (see above)"
elif [ -n "$steps" ]; then
    echo "gpu-check: the selected parts passed (FERRO_GPU_STEPS=$steps)"
else
    echo "gpu-check: the built parts passed"
fi
