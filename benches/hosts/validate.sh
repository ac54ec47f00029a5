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
#
# Environment: NRANKS_SHM="2 4" ITERS=20

set -euo pipefail
cd "$(dirname "$0")/../.."
HOSTS_DIR=${1:-target/bench-hosts}
NRANKS_SHM=${NRANKS_SHM:-2 4}
ITERS=${ITERS:-20}

cargo build --release --quiet -p ferroccl-perf --bin all_reduce_perf
cargo build --release --quiet -p ferroccl --bin ferrorun --bin ferroccl-sim
BIN=target/release

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
    python3 benches/hosts/validate.py "$BIN/ferroccl-sim" "$OUT" "$n" "$n" \
        host-major "1 host x $n processes, shm" ring rd rhd
    echo
done
if [ -d "$HOSTS_DIR" ]; then
    cat "$HOSTS_DIR/setup.txt"
    python3 benches/hosts/validate.py "$BIN/ferroccl-sim" "$HOSTS_DIR" 8 2 round-robin \
        "4 netns hosts x 2, tbf 2gbit, 200 us delay" ring tree rd rhd hier
fi
