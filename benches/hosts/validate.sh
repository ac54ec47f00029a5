#!/usr/bin/env bash
# ferroccl-sim against measurement on this machine (docs/HOSTS.md, "Simulator validation").
#
#   benches/hosts/validate.sh [HOSTS_DIR]
#
# 1. One host, shared memory: N processes under ferrorun (no namespaces) for each N of
#    NRANKS_SHM, each of ring, rd and rhd forced, FERRO_TUNE=measure logging the ping-pong
#    calibration; raw tables in target/bench-shm-N.
# 2. Network-namespace hosts: the tables benches/hosts/run.sh left in HOSTS_DIR (default
#    target/bench-hosts; run it first).
# For each, benches/hosts/validate.py turns the logged calibration into a ferroccl-sim
# topology file, simulates the same algorithms and sizes and prints measured vs predicted.
# Ranks beyond the cores share them: the simulator gets the configuration's ranks per core
# (ranks / nproc) and the cost of waking a rank, measured first as the shared-memory latency
# FERRO_TUNE=measure logs for 2 ranks pinned to one core minus that for 2 ranks on two
# (medians of WAKE_RUNS runs each).
#
# Environment: NRANKS_SHM="2 4" ITERS=20 WAKE_RUNS=3

set -euo pipefail
cd "$(dirname "$0")/../.."
HOSTS_DIR=${1:-target/bench-hosts}
NRANKS_SHM=${NRANKS_SHM:-2 4}
ITERS=${ITERS:-20}
WAKE_RUNS=${WAKE_RUNS:-3}

cargo build --release --quiet -p ferroccl-perf --bin all_reduce_perf
cargo build --release --quiet -p ferroccl --bin ferrorun --bin ferroccl-sim
BIN=target/release
CORES=$(nproc)

# The median shm latency (us) FERRO_TUNE=measure logs for 2 ranks on the CPUs $1.
shm_latency() {
    local i
    for ((i = 0; i < WAKE_RUNS; i++)); do
        FERRO_TUNE=measure FERRO_DEBUG=INFO taskset -c "$1" "$BIN/ferrorun" -n 2 --no-prefix \
            --timeout 120 -- "$BIN/all_reduce_perf" -b 8 -e 8 -n 1 -w 0 2>&1 >/dev/null \
            | grep -o 'calibrated shm [0-9.]* us' | awk '{print $3}'
    done | sort -g | awk '{v[NR] = $1} END {if (NR) print v[int((NR + 1) / 2)]}'
}
ONE=$(shm_latency 0)
TWO=$(shm_latency 0,1)
[ -n "$ONE" ] && [ -n "$TWO" ] || { echo "validate.sh: no calibration line from the wake-up probe" >&2; exit 1; }
WAKE=$(python3 -c "print(round(max(0.0, $ONE - $TWO), 1))")
echo "# wake-up: shm latency $ONE us with 2 ranks on one core, $TWO us on two: $WAKE us"
# ferroccl-sim options for N ranks on this machine.
cpu_args() {
    python3 -c "print(f'--ranks-per-core {max(1.0, $1 / $CORES):g} --wake-us $WAKE')"
}

for n in $NRANKS_SHM; do
    OUT=target/bench-shm-$n
    mkdir -p "$OUT"
    echo "# $(date -u '+%Y-%m-%d %H:%M:%S UTC'), load average: $(cut -d' ' -f1-3 /proc/loadavg)" > "$OUT/setup.txt"
    for algo in ring rd rhd; do
        FERRO_ALGO=$algo FERRO_TUNE=measure FERRO_DEBUG=INFO \
            "$BIN/ferrorun" -n "$n" --no-prefix --timeout 600 -- \
            "$BIN/all_reduce_perf" -b 8 -e 64M -f 4 -n "$ITERS" -w 5 \
            > "$OUT/large-$algo.txt" 2> "$OUT/large-$algo.err"
    done
    echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/setup.txt"
    cat "$OUT/setup.txt"
    SIM_ARGS=$(cpu_args "$n") python3 benches/hosts/validate.py "$BIN/ferroccl-sim" "$OUT" "$n" "$n" \
        host-major "1 host x $n processes, shm" ring rd rhd
    echo
done
if [ -d "$HOSTS_DIR" ]; then
    cat "$HOSTS_DIR/setup.txt"
    SIM_ARGS=$(cpu_args 8) python3 benches/hosts/validate.py "$BIN/ferroccl-sim" "$HOSTS_DIR" 8 2 round-robin \
        "4 netns hosts x 2, tbf 2gbit, 200 us delay" ring tree rd rhd hier
fi
