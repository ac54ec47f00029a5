#!/usr/bin/env bash
# The CUDA code paths over softcuda (kernels/cuda/soft/), a software model of the
# CUDA driver API built as a shared library and loaded in place of libcuda.so.1: the CUDA
# provider and reducer, stream-ordered calls, the p2p transport's cuda provider, CUDA IPC of
# buffers and of events, windows, and the C ABI on streams, on a machine without a GPU. The
# parts mirror scripts/gpu-check.sh (2 .. 8, small sizes; the kernels' element logic is checked
# on the host by the CPU suite; not 9, PyTorch on CUDA). This is a model: nothing here says how a GPU behaves or how fast it
# is, and what passes here still has to pass there. Part 0 checks the model itself (its stream
# capture and graphs).
#
#   scripts/softcuda-check.sh            build what is missing, run every part
#   SOFTCUDA_PARTS="2 8a 8l" scripts/softcuda-check.sh
#
# Exit status 0 when every part passed.
set -uo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/nvrtc-env.sh)"
target=${CARGO_TARGET_DIR:-target}
bin=$target/debug
mkdir -p "$target/softcuda"
soft=$(cd "$target/softcuda" && pwd)
gcc -std=gnu11 -O2 -fPIC -shared -pthread -Wall -Wextra -Werror -ffp-contract=off \
    -fno-strict-aliasing -Ikernels/cuda -o "$soft/libcuda.so.1" kernels/cuda/soft/softcuda.c \
    kernels/cuda/soft/memory.c kernels/cuda/soft/vmm.c kernels/cuda/soft/graph.c ||
    { echo "softcuda: FAIL (the model did not build)"; exit 1; }
cargo build -q -p ferroccl --bin ferroccl-device-check --bin ferrorun || exit 1
cargo build -q -p ferroccl-perf --bins || exit 1
lib=$(realpath "$(scripts/build-capi.sh)") || exit 1
gcc -std=gnu11 -Wall -Wextra -Werror -O1 -Iinclude tests/c/streams.c "$lib" -ldl \
    -o "$soft/streams" || exit 1
gcc -std=gnu11 -Wall -Wextra -Werror -O1 -Iinclude tests/c/vmm.c "$lib" -ldl -o "$soft/vmm" ||
    exit 1
gcc -std=gnu11 -Wall -Wextra -Werror -O1 -Iinclude tests/c/graphs.c "$lib" -ldl -o "$soft/graphs" ||
    exit 1
gcc -std=gnu11 -Wall -Wextra -Werror -O1 tests/c/softcuda_graphs.c -ldl -pthread \
    -o "$soft/softcuda_graphs" || exit 1

# Every process loads the model: ferroccl by path, the C program by name.
export FERROCCL_CUDA_DRIVER=$soft/libcuda.so.1
export LD_LIBRARY_PATH=$soft:$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export FERRO_DEVICE_PROVIDER=cuda FERRO_TIMEOUT=60 SOFTCUDA_DEVICES=1
unset FERRO_P2P_PROVIDER FERRO_STANDIN_DEVICES

failed=0
want() { [ -z "${SOFTCUDA_PARTS:-}" ] || [[ " $SOFTCUDA_PARTS " == *" $1 "* ]]; }
# step PART CHECK CMD...: runs CMD (at most 300 s); CHECK is a command its output must pass.
step() {
    local part=$1 check=$2
    shift 2
    want "$part" || return 0
    local out t0=$SECONDS env="" v
    for v in FERRO_TRANSPORTS FERRO_STREAM_WAITS FERRO_DEVICE_SLICE_BYTES FERRO_DEVICE_DIRECT \
        FERRO_DEVICE_PEER FERRO_DEVICE_SCRATCH_BYTES FERRO_P2P_QUEUED_REDUCE FERROCCL_TEST_SYNC_FIRST SOFTCUDA_DELAY_US \
        SOFTCUDA_POINTER_ATTRIBUTES; do
        [ -n "${!v:-}" ] && env+="$v=${!v} "
    done
    [ "$SOFTCUDA_DEVICES" = 1 ] || env+="SOFTCUDA_DEVICES=$SOFTCUDA_DEVICES "
    out=$(timeout 300 "$@" 2>&1)
    local rc=$?
    if [ "$rc" -eq 0 ] && $check "$out"; then
        echo "-- $part: PASS ($((SECONDS - t0)) s): $env$*"
    else
        echo "-- $part: FAIL (exit $rc, $((SECONDS - t0)) s): $env$*"
        printf '%s\n' "$out" | tail -40
        failed=1
    fi
}
any() { true; }
# Every row of all_reduce_perf checked, none wrong; `peer`: every row between the buffers.
rows_ok() { grep -q "# Out of bounds values : 0 OK" <<<"$1"; }
rows_peer() {
    rows_ok "$1" || return 1
    local rows
    rows=$(grep -E '^(\[0\] )? +[0-9]+ +[0-9]+ ' <<<"$1")
    [ -n "$rows" ] && ! grep -qvE 'peer$' <<<"$rows"
}
# ... and no warning (through windows: marks not shared or not opened send calls on a stream
# down the blocking path, whose rows say `peer` too).
rows_peer_quiet() { rows_peer "$1" && ! grep -q "WARN" <<<"$1"; }
between() { grep -qE "[1-9][0-9]* calls between the ranks' buffers" <<<"$1"; }
c_ok() { grep -q "^OK " <<<"$1"; }
counted() { grep " calls per rank and call" <<<"$1"; }

echo "== 0. the model's graph capture (tests/c/softcuda_graphs.c)"
step 0 c_ok "$soft/softcuda_graphs"
echo "== 2. device buffers, 1 and 2 ranks as threads, staged through pinned memory, against host buffers"
step 2 any "$bin/ferroccl-device-check" --ranks 1,2
# Slow streams: the stream-ordered calls' gates and flags (cuStreamWaitValue32 and
# cuStreamWriteValue32) must hold the work that follows them (one rank: ranks of one process
# on one GPU block instead). With the model's waits on flags left out, wrong elements.
SOFTCUDA_DELAY_US=100 step 2 any "$bin/ferroccl-device-check" --ranks 1
echo "== 3. the p2p transport's cuda provider: conformance (two ranks as threads), two processes over CUDA IPC"
if want 3; then
    FERRO_P2P_GPU_CHECK=1 step 3 any cargo test -q -p ferroccl-transport-p2p -- --test-threads 1 \
        conformance_cuda_provider_on_a_gpu two_processes_exchange_through_the_provider
fi
echo "== 4. the C ABI on streams (tests/c/streams.c, 2 processes): blocking, stream-ordered, slices, mixed; 4g: calls recorded into graphs (tests/c/graphs.c)"
FERRO_STREAM_WAITS=0 step 4a c_ok "$soft/streams" 2
step 4c c_ok "$soft/streams" 2
# Slow streams, each by its own random amount: a missing wait shows as a wrong element.
SOFTCUDA_DELAY_US=300 step 4c c_ok "$soft/streams" 2
FERRO_DEVICE_SLICE_BYTES=256 FERRO_STREAM_WAITS=1 FERROCCL_TEST_SYNC_FIRST=1 step 4d c_ok "$soft/streams" 2
FERRO_DEVICE_SLICE_BYTES=256 FERROCCL_TEST_SYNC_FIRST=1 step 4f c_ok "$soft/streams" 2 mixed
# Calls recorded into a CUDA graph (cuStreamBeginCapture) run at each launch, not at capture;
# slow streams show a host function that runs before its copies in or after its copies back.
for n in 2 3; do
    step 4g c_ok "$soft/graphs" "$n"
done
SOFTCUDA_DELAY_US=300 step 4g c_ok "$soft/graphs" 3
# Odd ranks make the same calls unrecorded, cut into 1 KiB slices as the recorded ones are.
FERRO_DEVICE_SLICE_BYTES=1024 step 4g c_ok "$soft/graphs" 3 mixed
# The blocked layouts cut into slices of every block (128-byte slices, 3 ranks), recorded and
# beside ordinary calls.
FERRO_DEVICE_SLICE_BYTES=128 step 4g c_ok "$soft/graphs" 3
FERRO_DEVICE_SLICE_BYTES=128 SOFTCUDA_DELAY_US=300 step 4g c_ok "$soft/graphs" 3 mixed
# What is refused, the capture intact; a launch that fails leaves ones and an asynchronous
# error; where nothing can be recorded (the p2p transport calls the driver), refused.
FERRO_DEVICE_SLICE_BYTES=256 step 4g c_ok "$soft/graphs" 2 limits
step 4g c_ok "$soft/graphs" 2 fail
FERRO_TRANSPORTS=p2p step 4g c_ok "$soft/graphs" 2 refuse
# A recorded call's memory lives as long as its graph (a user object the graph owns), on
# slow streams too: a destroyed executable graph's launches still queued keep it.
step 4g c_ok "$soft/graphs" 3 lifetime
SOFTCUDA_DELAY_US=300 step 4g c_ok "$soft/graphs" 2 lifetime
# Memory mapped piece by piece into one reserved range (cuMemMap, PyTorch's expandable
# segments): buffers across pieces work, one running into an unmapped piece is refused.
step 4e c_ok "$soft/vmm"
# A driver that refuses cuPointerGetAttributes: the pointer checks ask one attribute at a time.
SOFTCUDA_POINTER_ATTRIBUTES=0 step 4e c_ok "$soft/vmm"
echo "== 5, 6, 7. all_reduce_perf staged (2 threads; 2 processes over shm, blocking and on a stream), sendrecv_perf over p2p and shm"
step 5 rows_ok "$bin/all_reduce_perf" -b 8 -e 4M -f 8 -t 2 -n 3 -w 1 -B 1
for b in 1 2; do
    step 6 rows_ok "$bin/ferrorun" -n 2 -- "$bin/all_reduce_perf" -b 8 -e 4M -f 8 -n 3 -w 1 -B "$b"
done
SOFTCUDA_DELAY_US=100 step 6 rows_ok "$bin/ferrorun" -n 2 -- "$bin/all_reduce_perf" -b 8 -e 4M -f 8 -n 3 -w 1 -B 2
for t in p2p shm; do
    FERRO_TRANSPORTS=$t step 7 rows_ok "$bin/ferrorun" -n 2 -- "$bin/sendrecv_perf" -b 8 -e 4M -f 8 -n 3 -w 1 -B 1
done
echo "== 8. over p2p: device-check between the threads' buffers, all_reduce_perf between them (blocking, on a stream), processes through the slots and through windows"
FERRO_TRANSPORTS=p2p step 8a between "$bin/ferroccl-device-check" --ranks 2,3
for b in 1 2; do
    FERRO_TRANSPORTS=p2p step 8k rows_peer "$bin/all_reduce_perf" -b 8 -e 1M -f 32 -t 2 -n 3 -w 1 -B "$b"
done
# Slow streams: a blocking rank's share is done before the status exchange, a rank on a stream
# waits for the other's done mark (a missing wait shows as a wrong element).
for b in 1 2; do
    FERRO_TRANSPORTS=p2p SOFTCUDA_DELAY_US=300 step 8k rows_peer "$bin/all_reduce_perf" -b 8 -e 1M \
        -f 32 -t 2 -n 3 -w 1 -B "$b"
done
FERRO_TRANSPORTS=p2p SOFTCUDA_DEVICES=2 step 8j rows_peer "$bin/all_reduce_perf" -b 8 -e 1M -f 32 -t 2 -n 3 -w 1 -B 2
FERRO_TRANSPORTS=p2p FERRO_DEVICE_DIRECT=0 step 8b rows_ok "$bin/all_reduce_perf" -b 8 -e 4M -f 8 -t 2 -n 3 -w 1 -B 1
for t in all_gather_perf reduce_scatter_perf broadcast_perf reduce_perf alltoall_perf gather_perf scatter_perf; do
    FERRO_TRANSPORTS=p2p step 8d rows_ok "$bin/ferrorun" -n 2 -- "$bin/$t" -b 8 -e 1M -f 8 -n 3 -w 1 -B 1
done
# 8h: reductions straight from the slots queued (off by default until measured on a GPU).
FERRO_TRANSPORTS=p2p FERRO_P2P_QUEUED_REDUCE=1 step 8h between "$bin/ferroccl-device-check" --ranks 2
FERRO_TRANSPORTS=p2p FERRO_P2P_QUEUED_REDUCE=1 FERRO_DEVICE_PEER=0 step 8h rows_ok "$bin/all_reduce_perf" -b 8 -e 4M -f 8 -t 2 -n 3 -w 1 -B 1
FERRO_TRANSPORTS=p2p step 8c rows_ok "$bin/ferrorun" -n 2 -- "$bin/all_reduce_perf" -b 8 -e 1M -f 32 -n 3 -w 1 -B 1
for b in 1 2; do
    FERRO_TRANSPORTS=p2p step 8l rows_peer_quiet "$bin/ferrorun" -n 2 -- "$bin/all_reduce_perf" -b 8 -e 1M -f 32 -n 3 -w 1 -B "$b" -R 2
done
FERRO_TRANSPORTS=p2p step 8l rows_peer_quiet "$bin/ferrorun" -n 2 -- "$bin/all_reduce_perf" -b 8 -e 1M -f 32 -t 2 -n 3 -w 1 -B 2 -R 2
for w in 0 1; do
    FERRO_TRANSPORTS=p2p FERRO_STREAM_WAITS=$w step 8l c_ok "$soft/streams" 3 windows
done
# On a stream through windows with slow streams (the other processes' shares wait for each
# rank's upload through its shared ready mark; without that wait, wrong elements).
for n in 2 3; do
    FERRO_TRANSPORTS=p2p FERRO_STREAM_WAITS=1 SOFTCUDA_DELAY_US=300 step 8l c_ok "$soft/streams" "$n" windows
done
# Communicators one after another, each deregistering its windows while its call may still
# be queued: the shared marks go with the last window only once no stream waits for them
# (with the settle point before the waits for the other ranks, a wait left pending on a
# destroyed event faults in the model).
for n in 2 3; do
    FERRO_TRANSPORTS=p2p SOFTCUDA_DELAY_US=300 step 8l c_ok "$soft/streams" "$n" comms 10
done
FERRO_TRANSPORTS=p2p SOFTCUDA_POINTER_ATTRIBUTES=0 step 8l c_ok "$soft/streams" 3 windows
FERRO_TRANSPORTS=p2p step 8e c_ok "$soft/streams" 2
echo "== 8n. 2 processes, buffers in no window, through the communicators' scratch windows (FERRO_DEVICE_SCRATCH_BYTES): blocking, on a stream, slow streams, the C ABI"
for b in 1 2; do
    FERRO_TRANSPORTS=p2p FERRO_DEVICE_SCRATCH_BYTES=4M step 8n rows_peer_quiet "$bin/ferrorun" -n 2 -- \
        "$bin/all_reduce_perf" -b 8 -e 1M -f 32 -n 3 -w 1 -B "$b"
    FERRO_TRANSPORTS=p2p FERRO_DEVICE_SCRATCH_BYTES=4M SOFTCUDA_DELAY_US=300 step 8n rows_peer_quiet \
        "$bin/ferrorun" -n 2 -- "$bin/all_reduce_perf" -b 8 -e 1M -f 32 -n 3 -w 1 -B "$b"
done
# A scratch window smaller than the calls: they run in pieces, each piece's ready marks
# exchanged after its copies in (slow streams: a piece that waited for the wrong marks would
# read a stale scratch).
for b in 1 2; do
    FERRO_TRANSPORTS=p2p FERRO_DEVICE_SCRATCH_BYTES=64K SOFTCUDA_DELAY_US=300 step 8n rows_peer_quiet \
        "$bin/ferrorun" -n 2 -- "$bin/all_reduce_perf" -b 8 -e 1M -f 32 -n 3 -w 1 -B "$b"
done
for n in 2 3; do
    FERRO_TRANSPORTS=p2p FERRO_DEVICE_SCRATCH_BYTES=4M SOFTCUDA_DELAY_US=300 step 8n c_ok "$soft/streams" "$n"
done
echo "== 8m. driver calls of an 8-byte allreduce per rank and call: between the threads' buffers, through windows, staged; blocking and on a stream"
for b in 1 2; do
    bound=$([ "$b" = 1 ] && echo 3 || echo 7)
    FERRO_TRANSPORTS=p2p step 8m counted scripts/driver-calls.sh "$bound" 2 "$bin/all_reduce_perf" -b 8 -e 8 -t 2 \
        -n NITER -w 1 -c 1 -B "$b"
    bound=$([ "$b" = 1 ] && echo 3 || echo 8)
    FERRO_TRANSPORTS=p2p step 8m counted scripts/driver-calls.sh "$bound" 2 "$bin/ferrorun" -n 2 -- \
        "$bin/all_reduce_perf" -b 8 -e 8 -n NITER -w 1 -c 1 -B "$b" -R 2
    bound=$([ "$b" = 1 ] && echo 6.5 || echo 8.5)
    step 8m counted scripts/driver-calls.sh "$bound" 2 "$bin/ferrorun" -n 2 -- "$bin/all_reduce_perf" -b 8 -e 8 \
        -n NITER -w 1 -c 1 -B "$b"
    # Buffers in no window through the scratch windows (a copy in, the share, a copy out).
    bound=$([ "$b" = 1 ] && echo 5 || echo 9)
    FERRO_TRANSPORTS=p2p FERRO_DEVICE_SCRATCH_BYTES=4M step 8m counted scripts/driver-calls.sh "$bound" 2 \
        "$bin/ferrorun" -n 2 -- "$bin/all_reduce_perf" -b 8 -e 8 -n NITER -w 1 -c 1 -B "$b"
done
# The C ABI on a stream between buffers in windows (NCCL's programs' path).
FERRO_TRANSPORTS=p2p PER_ITERATION=1 step 8m counted scripts/driver-calls.sh 9.5 2 "$soft/streams" 2 \
    repeat NITER
# Communicators one after another, each with windows and a call on a stream through them: a
# communicator leaves no event behind (the shared marks go with the last window; the model
# also faults a wait left pending on another process's event that its owner destroyed).
for w in 0 1; do
    FERRO_TRANSPORTS=p2p FERRO_STREAM_WAITS=$w PER_ITERATION=1 ONLY=events_live step 8m counted \
        scripts/driver-calls.sh 0 2 "$soft/streams" 2 comms NITER
done

if [ "$failed" -eq 0 ]; then echo "== softcuda: PASS"; else echo "== softcuda: FAIL"; fi
exit "$failed"
