#!/usr/bin/env bash
# The limits of this machine that bound the comparison: single-core memcpy bandwidth, a
# 2-thread in-process allreduce (allreduce_limit.c), TCP over loopback (one stream, and two
# opposite streams at once), and TCP over a veth pair between two network namespaces (root
# only). benches/compare/large.sh measures the allreduce-shaped limits interleaved with
# ferroccl's 64 MiB allreduce.
#
#   benches/compare/limits.sh [-r 3]        # -r: repeats; medians are printed
#
# Needs a C compiler and iperf3 (apt-get install -y iperf3); the veth figure needs root and
# iproute2, and uses the namespaces fbench0/fbench1 (10.232.0.1-2), made and removed here
# unless they already exist.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPEAT=3
[ "${1:-}" = -r ] && REPEAT=$2
WORK=$(mktemp -d)
MADE_NS=no
cleanup() {
    if [ $MADE_NS = yes ]; then
        ip netns del fbench0 2>/dev/null || true
        ip netns del fbench1 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "-" }'; }

echo "# machine: $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), $(uname -r)"
echo "# cpu: $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)"
echo "# load at start: $(cut -d' ' -f1-3 /proc/loadavg)"

cc -O2 -o "$WORK/memcpy_bw" benches/compare/memcpy_bw.c
v=$(for _ in $(seq 1 "$REPEAT"); do
    "$WORK/memcpy_bw" 64 20 | sed -n 's/.*median \([0-9.]*\) GB.*/\1/p'
done | median)
echo "memcpy, 1 thread, 64 MiB: $v GB/s (bytes copied per second; median of $REPEAT runs of 20 copies)"

cc -O3 -march=native -pthread -o "$WORK/allreduce_limit" benches/compare/allreduce_limit.c
v=$(for _ in $(seq 1 "$REPEAT"); do
    "$WORK/allreduce_limit" 64 20 | sed -n 's/.*median \([0-9.]*\) GB.*/\1/p'
done | median)
echo "2-thread allreduce in one process, f32 sum out of place, 64 MiB: $v GB/s busbw (median of $REPEAT)"

# Prints iperf3's receiver rate in Gbit/s for one 4 GiB single-stream transfer.
# $1: command prefix for the server (may be empty), $2: for the client, $3: server address.
iperf_once() {
    local srv=$1 cli=$2 addr=$3 port=$((5400 + RANDOM % 200))
    $srv iperf3 -s -1 -p $port >/dev/null 2>&1 &
    local pid=$!
    sleep 0.5
    $cli iperf3 -c "$addr" -p $port -n 4G -f g 2>/dev/null | awk '/receiver/ { print $(NF-2) }'
    wait $pid 2>/dev/null || true
}

if command -v iperf3 >/dev/null; then
    v=$(for _ in $(seq 1 "$REPEAT"); do iperf_once "" "" 127.0.0.1; done | median)
    echo "TCP over loopback, 1 stream (iperf3): $v Gbit/s"
    two_flows() {
        local p1=$((5800 + RANDOM % 100)) p2
        p2=$((p1 + 100))
        iperf3 -s -1 -p $p1 >/dev/null 2>&1 &
        iperf3 -s -1 -p $p2 >/dev/null 2>&1 &
        sleep 0.5
        iperf3 -c 127.0.0.1 -p $p1 -t 4 -f g 2>/dev/null | awk '/receiver/ { print $(NF-2) }' >"$WORK/f1" &
        iperf3 -c 127.0.0.1 -p $p2 -R -t 4 -f g 2>/dev/null | awk '/receiver/ { print $(NF-2) }' >"$WORK/f2"
        wait
        cat "$WORK/f1" "$WORK/f2" | awk '{ s += $1; n++ } END { if (n == 2) printf "%.1f\n", s / n }'
    }
    v=$(for _ in $(seq 1 "$REPEAT"); do two_flows; done | median)
    echo "TCP over loopback, 2 opposite streams at once (iperf3), per direction: $v Gbit/s"
    if [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null; then
        if ! ip netns list | grep -q '^fbench0'; then
            ip netns add fbench0
            ip netns add fbench1
            ip link add fb0 netns fbench0 type veth peer name fb1 netns fbench1
            ip -n fbench0 addr add 10.232.0.1/24 dev fb0
            ip -n fbench1 addr add 10.232.0.2/24 dev fb1
            ip -n fbench0 link set lo up
            ip -n fbench1 link set lo up
            ip -n fbench0 link set fb0 up
            ip -n fbench1 link set fb1 up
            MADE_NS=yes
        fi
        v=$(for _ in $(seq 1 "$REPEAT"); do
            iperf_once "ip netns exec fbench0" "ip netns exec fbench1" 10.232.0.1
        done | median)
        echo "TCP over veth between two namespaces, 1 stream (iperf3), MTU 1500: $v Gbit/s"
    else
        echo "TCP veth: skipped (needs root)"
    fi
else
    echo "TCP: skipped (iperf3 not installed: apt-get install -y iperf3)"
fi
echo "# load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
