#!/usr/bin/env bash
# ferroccl beside Gloo and Open MPI: the same allreduce, allgather and broadcast sweeps
# (float32, 2 ranks on this machine, nccl-tests' sizes, timing and busbw), one table of busbw
# with ratios, a CSV and busbw-vs-size plots.
#
#   benches/compare/run.sh [-b 64] [-e 64M] [-f 4] [-n 20] [-w 5] [-r 3] [-o docs/perf] [--netns|--no-netns]
#
#   -b/-e/-f   sizes, as nccl-tests (default 64 .. 64M, x4)
#   -n/-w      timed and warm-up iterations per size (default 20, 5)
#   -r         repeats of every run; the table shows medians (default 3)
#   -o         output directory: results.csv, table.md, busbw_<coll>.png, limits.txt, raw/
#              (default docs/perf)
#   --netns    also run across two network-namespace hosts joined by a veth pair (needs root;
#              the default when root). The namespaces are fbench0/fbench1, 10.232.0.1-2, and are
#              removed on exit.
#
# Implementations (each skipped with a message when missing):
#   ferroccl-tcp  all_reduce_perf / all_gather_perf / broadcast_perf under ferrorun,
#                 FERRO_TRANSPORTS=tcp (TCP over loopback)
#   ferroccl-shm  the same with FERRO_TRANSPORTS=shm,tcp (shared memory between local ranks)
#   gloo       PyTorch's gloo backend on CPU tensors (gloo_allreduce.py), interpreter $PYTHON
#   mpi-tcp    Open MPI, mpi_allreduce.c, --mca pml ob1 --mca btl self,tcp
#   mpi-shm    Open MPI, mpi_allreduce.c, --mca pml ob1 --mca btl self,vader (shared memory)
#              (both with --mca mpi_yield_when_idle 1; COMPARE_MPI_ARGS adds mpirun arguments)
#
# What it needs, and installs when missing (set COMPARE_NO_INSTALL=1 to skip instead, e.g. in CI):
#   torch and matplotlib for $PYTHON:  $PYTHON -m pip install torch matplotlib
#   Open MPI (Debian/Ubuntu, root):    apt-get install -y openmpi-bin libopenmpi-dev
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)

PYTHON=${PYTHON:-python3}
B=64 E=64M F=4 N=20 W=5 REPEAT=3 OUT=docs/perf NETNS=auto
while [ $# -gt 0 ]; do
    case "$1" in
    -b) B=$2; shift 2 ;;
    -e) E=$2; shift 2 ;;
    -f) F=$2; shift 2 ;;
    -n) N=$2; shift 2 ;;
    -w) W=$2; shift 2 ;;
    -r) REPEAT=$2; shift 2 ;;
    -o) OUT=$2; shift 2 ;;
    --netns) NETNS=yes; shift ;;
    --no-netns) NETNS=no; shift ;;
    -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
if [ "$NETNS" = auto ]; then
    if [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null; then NETNS=yes; else NETNS=no; fi
fi

say() { echo "== $*" >&2; }
can_install() { [ "${COMPARE_NO_INSTALL:-0}" != 1 ]; }

RAW=$OUT/raw
mkdir -p "$RAW"
rm -f "$RAW"/*.txt
WORK=$(mktemp -d)
NS0=fbench0 NS1=fbench1 ADDR0=10.232.0.1 ADDR1=10.232.0.2
cleanup() {
    if [ "$NETNS" = yes ]; then
        ip netns del $NS0 2>/dev/null || true
        ip netns del $NS1 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

# --- ferroccl ---------------------------------------------------------------------------------
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
say "building ferrorun and the perf tools (release)"
cargo build --release --quiet -p ferroccl --bin ferrorun
cargo build --release --quiet -p ferroccl-perf --bin all_reduce_perf --bin all_gather_perf --bin broadcast_perf
BIN=$TARGET/release

# Runs the three tools under `ferrorun $*`; prints rows `coll size count time algbw busbw wrong`
# from the out-of-place columns.
ferro_sweep() {
    local tool coll
    for tool in all_reduce all_gather broadcast; do
        coll=${tool//_/}
        "$BIN/ferrorun" "$@" --no-prefix -- "$BIN/${tool}_perf" -b "$B" -e "$E" -f "$F" -n "$N" -w "$W" \
            | tee -a "$WORK/ferro.log" \
            | awk -v c="$coll" '/^#/ || NF < 13 { next } $2 > 0 { print c, $1, $2, $6, $7, $8, $9 }'
    done
}

# --- Open MPI ---------------------------------------------------------------------------------
MPI=no
if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
    if can_install && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
        say "installing Open MPI (apt-get install -y openmpi-bin libopenmpi-dev)"
        apt-get install -y openmpi-bin libopenmpi-dev >/dev/null
    fi
fi
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
    mpicc -O2 -o "$WORK/mpi_allreduce" benches/compare/mpi_allreduce.c
    MPI=yes
else
    say "Open MPI not found: skipping mpi-tcp and mpi-shm (apt-get install openmpi-bin libopenmpi-dev)"
fi
# pml ob1 so that the btl choice holds (no UCX); yield_when_idle because a rank that only spins
# loses whole scheduler slices whenever anything else runs on the machine (ferroccl's ranks also
# spin briefly, then sleep).
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1 --mca mpi_yield_when_idle 1)
mpi_sweep() { # $1: btl list; rest: extra mpirun arguments
    local btl=$1
    shift
    "${MPIRUN[@]}" --mca btl "$btl" "$@" ${COMPARE_MPI_ARGS:-} -np 2 "$WORK/mpi_allreduce" -b "$B" -e "$E" -f "$F" -n "$N" -w "$W" -c all
}

# --- Gloo -------------------------------------------------------------------------------------
GLOO=no
if ! "$PYTHON" -c 'import torch' 2>/dev/null && can_install; then
    say "installing torch for $PYTHON ($PYTHON -m pip install torch)"
    "$PYTHON" -m pip install --quiet torch || true
fi
if "$PYTHON" -c 'import torch' 2>/dev/null; then
    GLOO=yes
else
    say "torch not importable with $PYTHON: skipping gloo (set PYTHON, or pip install torch)"
fi
if ! "$PYTHON" -c 'import matplotlib' 2>/dev/null && can_install; then
    "$PYTHON" -m pip install --quiet matplotlib || true
fi
gloo_sweep() { "$PYTHON" benches/compare/gloo_allreduce.py -b "$B" -e "$E" -f "$F" --iters "$N" --warmup "$W" "$@"; }

# --- loopback ---------------------------------------------------------------------------------
ORDER=ferroccl-tcp,ferroccl-shm,gloo,mpi-tcp,mpi-shm
RATIOS=ferroccl-tcp/gloo,ferroccl-tcp/mpi-tcp,ferroccl-shm/mpi-shm
for rep in $(seq 1 "$REPEAT"); do
    say "repeat $rep/$REPEAT: ferroccl (2 ranks, TCP over loopback)"
    FERRO_TRANSPORTS=tcp ferro_sweep -n 2 >"$RAW/ferroccl-tcp.$rep.txt"
    say "repeat $rep/$REPEAT: ferroccl (2 ranks, shared memory)"
    FERRO_TRANSPORTS=shm,tcp ferro_sweep -n 2 >"$RAW/ferroccl-shm.$rep.txt"
    if [ $GLOO = yes ]; then
        say "repeat $rep/$REPEAT: gloo (2 processes, TCP over loopback)"
        gloo_sweep -n 2 --port $((29600 + rep)) >"$RAW/gloo.$rep.txt"
    fi
    if [ $MPI = yes ]; then
        say "repeat $rep/$REPEAT: Open MPI, TCP over loopback"
        mpi_sweep self,tcp --mca btl_tcp_if_include lo >"$RAW/mpi-tcp.$rep.txt"
        say "repeat $rep/$REPEAT: Open MPI, shared memory (vader)"
        mpi_sweep self,vader >"$RAW/mpi-shm.$rep.txt"
    fi
done

# --- two network-namespace hosts --------------------------------------------------------------
if [ "$NETNS" = yes ]; then
    say "creating hosts $NS0 ($ADDR0) and $NS1 ($ADDR1) joined by a veth pair"
    ip netns del $NS0 2>/dev/null || true
    ip netns del $NS1 2>/dev/null || true
    ip netns add $NS0
    ip netns add $NS1
    ip link add fb0 netns $NS0 type veth peer name fb1 netns $NS1
    ip -n $NS0 addr add $ADDR0/24 dev fb0
    ip -n $NS1 addr add $ADDR1/24 dev fb1
    for ns in $NS0 $NS1; do
        ip -n $ns link set lo up
    done
    ip -n $NS0 link set fb0 up
    ip -n $NS1 link set fb1 up
    printf '#!/bin/sh\nhost=$1; shift\nexec ip netns exec "$host" sh -c "$*"\n' >"$WORK/nsrsh"
    chmod +x "$WORK/nsrsh"
    printf '%s slots=1\n%s slots=1\n' $NS0 $NS1 >"$WORK/hosts"
    ORDER=$ORDER,ferroccl-veth,gloo-veth,mpi-tcp-veth
    RATIOS=$RATIOS,ferroccl-veth/gloo-veth,ferroccl-veth/mpi-tcp-veth
    for rep in $(seq 1 "$REPEAT"); do
        say "repeat $rep/$REPEAT: ferroccl across $NS0/$NS1"
        ferro_sweep -n 2 --netns $NS0,$NS1 >"$RAW/ferroccl-veth.$rep.txt"
        if [ $GLOO = yes ]; then
            say "repeat $rep/$REPEAT: gloo across $NS0/$NS1"
            port=$((29700 + rep))
            ip netns exec $NS1 env GLOO_SOCKET_IFNAME=fb1 "$PYTHON" benches/compare/gloo_allreduce.py \
                -n 2 --rank 1 --addr $ADDR0 --port $port -b "$B" -e "$E" -f "$F" --iters "$N" --warmup "$W" \
                >/dev/null &
            ip netns exec $NS0 env GLOO_SOCKET_IFNAME=fb0 "$PYTHON" benches/compare/gloo_allreduce.py \
                -n 2 --rank 0 --addr $ADDR0 --port $port -b "$B" -e "$E" -f "$F" --iters "$N" --warmup "$W" \
                >"$RAW/gloo-veth.$rep.txt"
            wait
        fi
        if [ $MPI = yes ]; then
            say "repeat $rep/$REPEAT: Open MPI (TCP) across $NS0/$NS1"
            # mpirun runs in the first host and starts one daemon per host through an
            # "rsh" that enters the namespace, so each rank lives in its own host.
            ip netns exec $NS0 "${MPIRUN[@]}" --mca plm_rsh_agent "$WORK/nsrsh" --hostfile "$WORK/hosts" \
                --mca oob_tcp_if_include 10.232.0.0/24 --mca btl self,tcp --mca btl_tcp_if_include 10.232.0.0/24 \
                -np 2 "$WORK/mpi_allreduce" -b "$B" -e "$E" -f "$F" -n "$N" -w "$W" -c all \
                >"$RAW/mpi-tcp-veth.$rep.txt" || say "Open MPI across namespaces failed (see above)"
        fi
    done
fi

# --- the machine's limits --------------------------------------------------------------------
say "machine limits (memcpy, TCP over loopback and veth): $OUT/limits.txt"
benches/compare/limits.sh -r "$REPEAT" | tee "$OUT/limits.txt" >&2

# --- the table, CSV and plots -----------------------------------------------------------------
cp "$WORK/ferro.log" "$RAW/ferroccl-tables.log"
say "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
"$PYTHON" benches/compare/report.py "$RAW" "$OUT" --order "$ORDER" --ratios "$RATIOS" \
    --title "2 ranks on $(hostname), $(nproc) cores; sizes $B..$E x$F, $N iters, median of $REPEAT"
