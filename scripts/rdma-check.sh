#!/usr/bin/env bash
# The RDMA check for the first machine with an HCA (InfiniBand or RoCE):
#   scripts/rdma-check.sh                 # devices and ports, then 2 ranks on this host over rdma
#   scripts/rdma-check.sh HOST_A HOST_B   # ... and 1 rank on each of two hosts (ssh, same path)
#   SOFT=1 scripts/rdma-check.sh          # the same runs over the software provider (test tooling)
# Runs sendrecv_perf and all_reduce_perf over FERRO_TRANSPORTS=rdma and, where perftest's
# ib_write_bw exists, the link's limit beside them. Targets (docs/RDMA.md): sendrecv_perf at
# 64 MiB >= 90 % of ib_write_bw; all_reduce_perf busbw >= 85 % of it across two hosts.
# Settings pass through: FERRO_IB_HCA, FERRO_IB_GID_INDEX, FERRO_IB_QPS_PER_CONN, ...
# Two hosts need this checkout at the same path on both (a shared file system) and ssh between
# them without a password; HOST_A runs rank 0 and the rendezvous store.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SIZES=(-b 8 -e 64M -f 4)
export FERRO_TRANSPORTS=rdma FERRO_DEBUG="${FERRO_DEBUG:-INFO}"
if [ "${SOFT:-0}" = 1 ]; then export FERRO_IB_PROVIDER=soft; fi

echo "== RDMA devices and ports"
if command -v ibv_devinfo >/dev/null; then
    ibv_devinfo | grep -E "hca_id|port:|state|active_mtu|link_layer|active_speed|active_width" || true
elif [ -d /sys/class/infiniband ] && [ -n "$(ls -A /sys/class/infiniband)" ]; then
    for p in /sys/class/infiniband/*/ports/*; do
        dev=$(basename "$(dirname "$(dirname "$p")")")
        echo "$dev port $(basename "$p"): $(cat "$p/state") $(cat "$p/link_layer") $(cat "$p/rate")"
    done
else
    echo "no RDMA device here (no ibv_devinfo, empty /sys/class/infiniband)"
    [ "${SOFT:-0}" = 1 ] || { echo "set SOFT=1 to run the software provider instead"; exit 1; }
fi

cargo build --release --quiet --bin ferrorun -p ferroccl
cargo build --release --quiet -p ferroccl-perf --bin sendrecv_perf --bin all_reduce_perf
BIN=$ROOT/target/release

echo "== one host, two processes over rdma (loopback through the HCA)"
for tool in sendrecv_perf all_reduce_perf; do
    "$BIN/ferrorun" -n 2 --timeout 600 -- "$BIN/$tool" "${SIZES[@]}"
done
if command -v ib_write_bw >/dev/null; then
    echo "== ib_write_bw, loopback, 64 MiB"
    ib_write_bw -s 67108864 -n 200 ${FERRO_IB_GID_INDEX:+-x $FERRO_IB_GID_INDEX} >/tmp/ibwb-server.$$ 2>&1 &
    sleep 1
    ib_write_bw -s 67108864 -n 200 ${FERRO_IB_GID_INDEX:+-x $FERRO_IB_GID_INDEX} localhost | tail -n 3
    wait || true
else
    echo "(perftest's ib_write_bw not found: apt-get install perftest for the link's limit)"
fi

[ $# -ge 2 ] || exit 0
A=$1 B=$2
PORT=$((20000 + RANDOM % 20000))
pass_env() {
    env | grep -E '^(FERRO_|RUST_LOG)' | sed "s/'/'\\\\''/g; s/=\\(.*\\)/='\\1'/" | tr '\n' ' '
}
echo "== two hosts: $A (rank 0, store $A:$PORT) and $B (rank 1)"
for tool in sendrecv_perf all_reduce_perf; do
    common="$(pass_env) FERRO_NRANKS=2 FERRO_STORE_ADDR=$A:$PORT FERRO_TIMEOUT=120"
    ssh "$B" "cd $ROOT && env $common FERRO_RANK=1 $BIN/$tool ${SIZES[*]}" >/tmp/rdma-check-$B.$$ 2>&1 &
    ssh "$A" "cd $ROOT && env $common FERRO_RANK=0 $BIN/$tool ${SIZES[*]}"
    wait || { echo "rank 1 on $B failed:"; cat /tmp/rdma-check-$B.$$; exit 1; }
    PORT=$((PORT + 1))
done
if ssh "$A" command -v ib_write_bw >/dev/null && ssh "$B" command -v ib_write_bw >/dev/null; then
    echo "== ib_write_bw $A -> $B, 64 MiB"
    ssh "$B" "ib_write_bw -s 67108864 -n 200 ${FERRO_IB_GID_INDEX:+-x $FERRO_IB_GID_INDEX}" >/dev/null 2>&1 &
    sleep 2
    ssh "$A" "ib_write_bw -s 67108864 -n 200 ${FERRO_IB_GID_INDEX:+-x $FERRO_IB_GID_INDEX} $B" | tail -n 3
    wait || true
fi
