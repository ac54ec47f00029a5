#!/usr/bin/env bash
# Large-message allreduce beside the machine's limits, measured in one run, interleaved:
#
#   benches/compare/large.sh [-r ROUNDS] [-m MiB]      # defaults: 3 rounds, 64 MiB
#
# Each round measures, one after another:
#   limit-shm  two threads of one process summing two f32 buffers out of place with no
#              transport (allreduce_limit.c): the most a 2-rank shared-memory allreduce can do;
#   shm        ferroccl, 2 processes, FERRO_TRANSPORTS=shm, out-of-place busbw;
#   shared     the same with the buffers in shared memory (all_reduce_perf -R 1), which the
#              peer reads straight from instead of through the rings;
#   limit-tcp  two opposite single-stream iperf3 flows over loopback at once, per direction
#              (the mean of the two): a 2-rank allreduce sends and receives its buffer's size
#              on each rank, both ways at once;
#   tcp        ferroccl, 2 processes, FERRO_TRANSPORTS=tcp, out-of-place busbw.
# and prints each figure in GB/s with the ratio to its limit. Needs a C compiler, iperf3, and a
# release build (cargo build --release --bins).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=3
MIB=64
while [ $# -gt 0 ]; do
    case $1 in
    -r) ROUNDS=$2; shift 2 ;;
    -m) MIB=$2; shift 2 ;;
    *) echo "usage: $0 [-r ROUNDS] [-m MiB]" >&2; exit 2 ;;
    esac
done
BIN=target/release
for b in ferrorun all_reduce_perf; do
    [ -x $BIN/$b ] || { echo "$BIN/$b missing: cargo build --release --bins" >&2; exit 1; }
done
command -v iperf3 >/dev/null || { echo "iperf3 missing: apt-get install -y iperf3" >&2; exit 1; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cc -O3 -march=native -pthread -o "$WORK/limit" benches/compare/allreduce_limit.c

BYTES=$((MIB << 20))
ITERS=$((MIB >= 16 ? 20 : 200))

limit_shm() { "$WORK/limit" "$MIB" 20 | sed -n 's/.*median \([0-9.]*\) GB.*/\1/p'; }

# Out-of-place busbw (GB/s) of ferroccl's all_reduce_perf over transport $1 (more flags after).
ferro() {
    local transport=$1
    shift
    FERRO_TRANSPORTS=$transport $BIN/ferrorun -n 2 -- $BIN/all_reduce_perf -b "$BYTES" \
        -e "$BYTES" -n $ITERS -w 3 "$@" 2>&1 | awk -v b="$BYTES" '$1 == "[0]" && $2 == b { print $8 }'
}

# Two opposite iperf3 flows over loopback at once, 4 s each; prints the mean receiver rate of
# the two in GB/s.
limit_tcp() {
    local p1=$((5600 + RANDOM % 200)) p2
    p2=$((p1 + 200))
    iperf3 -s -1 -p $p1 >/dev/null 2>&1 &
    iperf3 -s -1 -p $p2 >/dev/null 2>&1 &
    sleep 0.5
    iperf3 -c 127.0.0.1 -p $p1 -t 4 -f g 2>/dev/null | awk '/receiver/ { print $(NF-2) }' >"$WORK/f1" &
    iperf3 -c 127.0.0.1 -p $p2 -R -t 4 -f g 2>/dev/null | awk '/receiver/ { print $(NF-2) }' >"$WORK/f2"
    wait
    awk '{ s += $1; n++ } END { if (n == 2) printf "%.2f\n", s / n / 8; else print "-" }' \
        "$WORK/f1" "$WORK/f2"
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 > 0 && a + 0 > 0) printf "%.0f %%", 100 * a / b; else print "-" }'; }

echo "# $(nproc) cores, load at start: $(cut -d' ' -f1-3 /proc/loadavg); $MIB MiB, f32 sum, 2 ranks, out of place"
printf '%-6s %10s %8s %8s %8s %8s %10s %8s %8s\n' round limit-shm shm ratio shared ratio \
    limit-tcp tcp ratio
for r in $(seq 1 "$ROUNDS"); do
    ls=$(limit_shm)
    s=$(ferro shm)
    sh=$(ferro shm -R 1)
    lt=$(limit_tcp)
    t=$(ferro tcp)
    printf '%-6s %10s %8s %8s %8s %8s %10s %8s %8s\n' "$r" "$ls" "$s" "$(ratio "$s" "$ls")" \
        "$sh" "$(ratio "$sh" "$ls")" "$lt" "$t" "$(ratio "$t" "$lt")"
done
echo "# GB/s; load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
