#!/usr/bin/env bash
# ferroccl-sim against measurement on this machine (docs/HOSTS.md, "Simulator validation").
#
#   benches/hosts/validate.sh [HOSTS_DIR]
#
# 1. One host, shared memory: N processes under ferrorun (no namespaces) for each N of
#    NRANKS_SHM, each of ring, rd and rhd forced, FERRO_TUNE=measure logging the ping-pong
#    calibration, in ROUNDS rounds (the algorithms interleaved; the fastest round counts, the
#    spread between rounds is printed beside it); raw tables in target/bench-shm-N.
# 2. Network-namespace hosts: the tables benches/hosts/run.sh left in HOSTS_DIR (default
#    target/bench-hosts; run it first).
# For each, benches/hosts/validate.py turns the logged calibration into a ferroccl-sim
# topology file, simulates the same algorithms and sizes and prints measured vs predicted.
# Ranks beyond the cores share them: the simulator gets the configuration's ranks per core
# (ranks / nproc) and the cost of waking a rank, measured first as the shared-memory latency
# FERRO_TUNE=measure logs for 2 ranks pinned to one core minus that for 2 ranks on two
# (medians of WAKE_RUNS runs each). Calls whose buffers reach the last-level cache are
# memory-bound: the simulator gets the cache size (a quarter of it for each of the 4
# namespace hosts, which share it) and, as each rank's rate of moving data then, the
# out-of-place algbw of sendrecv_perf at MEM_BYTES with the configuration's number of ranks
# on one host (median of WAKE_RUNS runs).
# The simulator predicts the time per call of back-to-back calls, as all_reduce_perf loops
# (SIM_CALLS, default 4, see validate.py), and gives the hosts' NICs the tbf bucket run.sh
# recorded in HOSTS_DIR/setup.txt (--nic-burst).
# With PIN=1 (the default) every one-host rank runs pinned to CPU (rank mod nproc)
# (`ferrorun --bind core`, as `mpirun --bind-to core`): left to the kernel, two ranks that keep waking each other
# sometimes share one core, and the same 2-process 8-byte all_reduce took 1.8 us in one run
# and 26 us in the next (the calibration's latency likewise 0.9 or 13.5 us).
#
# Environment: NRANKS_SHM="2 4" ITERS=20 ROUNDS=3 WAKE_RUNS=3 MEM_BYTES=64M PIN=1

set -euo pipefail
cd "$(dirname "$0")/../.."
HOSTS_DIR=${1:-target/bench-hosts}
NRANKS_SHM=${NRANKS_SHM:-2 4}
ITERS=${ITERS:-20}
ROUNDS=${ROUNDS:-3}
WAKE_RUNS=${WAKE_RUNS:-3}
MEM_BYTES=${MEM_BYTES:-64M}
PIN=${PIN:-1}

cargo build --release --quiet -p ferroccl-perf --bin all_reduce_perf --bin sendrecv_perf
cargo build --release --quiet -p ferroccl --bin ferrorun --bin ferroccl-sim
BIN=target/release
CORES=$(nproc)
if [ "$PIN" = 1 ]; then BIND=(--bind core); else BIND=(--bind none); fi

# The median shm latency (us) FERRO_TUNE=measure logs for 2 ranks: on CPU 0 with "one", on
# a CPU each with "two".
shm_latency() {
    local i launch=(taskset -c 0 "$BIN/ferrorun")
    [ "$1" = one ] || launch=("$BIN/ferrorun" --bind core)
    for ((i = 0; i < WAKE_RUNS; i++)); do
        FERRO_TUNE=measure FERRO_DEBUG=INFO "${launch[@]}" -n 2 --no-prefix --timeout 120 -- \
            "$BIN/all_reduce_perf" -b 8 -e 8 -n 1 -w 0 2>&1 >/dev/null \
            | grep -o 'calibrated shm [0-9.]* us' | awk '{print $3}'
    done | sort -g | awk '{v[NR] = $1} END {if (NR) print v[int((NR + 1) / 2)]}'
}
ONE=$(shm_latency one)
TWO=$(shm_latency two)
[ -n "$ONE" ] && [ -n "$TWO" ] || { echo "validate.sh: no calibration line from the wake-up probe" >&2; exit 1; }
WAKE=$(python3 -c "print(round(max(0.0, $ONE - $TWO), 1))")
echo "# wake-up: shm latency $ONE us with 2 ranks on one core, $TWO us on two: $WAKE us"
# The largest cache of CPU 0, in bytes (0 where sysfs does not say).
CACHE=$(python3 - <<'PY'
import glob, re
best = 0
for f in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
    m = re.fullmatch(r"(\d+)([KMG]?)", open(f).read().strip())
    if m:
        best = max(best, int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)])
print(best)
PY
)
# Median out-of-place algbw (GB/s) of sendrecv_perf at MEM_BYTES with $1 ranks on one host.
mem_rate() {
    local i
    for ((i = 0; i < WAKE_RUNS; i++)); do
        "$BIN/ferrorun" -n "$1" "${BIND[@]}" --no-prefix --timeout 300 -- \
            "$BIN/sendrecv_perf" -b "$MEM_BYTES" -e "$MEM_BYTES" -n 5 -w 2 2>/dev/null \
            | awk '!/^#/ && NF >= 7 {print $7}'
    done | sort -g | awk '{v[NR] = $1} END {if (NR) print v[int((NR + 1) / 2)]}'
}
# ferroccl-sim options for N ranks on this machine, in H hosts (default 1).
cpu_args() {
    local mem
    mem=$(mem_rate "$1")
    [ -n "$mem" ] || { echo "validate.sh: no result from sendrecv_perf with $1 ranks" >&2; exit 1; }
    echo "# memory: $1 ranks move $mem GB/s each beyond the $CACHE B cache" >&2
    python3 -c "print(f'--ranks-per-core {max(1.0, $1 / $CORES):g} --wake-us $WAKE --cache {$CACHE // ${2:-1}} --mem-gbps $mem')"
}

for n in $NRANKS_SHM; do
    OUT=target/bench-shm-$n
    mkdir -p "$OUT"
    echo "# $(date -u '+%Y-%m-%d %H:%M:%S UTC'), load average: $(cut -d' ' -f1-3 /proc/loadavg), PIN=$PIN" > "$OUT/setup.txt"
    rm -f "$OUT"/large-*.txt "$OUT"/large-*.err
    for ((round = 1; round <= ROUNDS; round++)); do
        for algo in ring rd rhd; do
            FERRO_ALGO=$algo FERRO_TUNE=measure FERRO_DEBUG=INFO \
                "$BIN/ferrorun" -n "$n" "${BIND[@]}" --no-prefix --timeout 600 -- \
                "$BIN/all_reduce_perf" -b 8 -e 64M -f 4 -n "$ITERS" -w 5 \
                > "$OUT/large-r$round-$algo.txt" 2> "$OUT/large-r$round-$algo.err"
        done
    done
    echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/setup.txt"
    cat "$OUT/setup.txt"
    ARGS=$(cpu_args "$n")
    SIM_ARGS=$ARGS python3 benches/hosts/validate.py "$BIN/ferroccl-sim" "$OUT" "$n" "$n" \
        host-major "1 host x $n processes, shm" ring rd rhd
    echo
done
if [ -d "$HOSTS_DIR" ]; then
    cat "$HOSTS_DIR/setup.txt"
    ARGS=$(cpu_args 8 4)
    # The shaper of the run, as run.sh recorded it ("tbf 2gbit burst 512kb per host link").
    LINK=$(sed -n 2p "$HOSTS_DIR/setup.txt" | grep -oE '(tbf|htb) [^,]*' || echo "tbf 2gbit")
    # A tbf bucket ("tbf 2gbit burst 512kb"; tc's kb are KiB) is the NICs' token bucket.
    BUCKET=$(echo "$LINK" | sed -nE 's/^tbf .*burst ([0-9]+)kb.*/\1K/p')
    [ -z "$BUCKET" ] || ARGS="$ARGS --nic-burst $BUCKET"
    SIM_ARGS=$ARGS python3 benches/hosts/validate.py "$BIN/ferroccl-sim" "$HOSTS_DIR" 8 2 round-robin \
        "4 netns hosts x 2, $LINK, 200 us delay" ring tree rd rhd hier
fi
