#!/usr/bin/env bash
# Allreduce across network-namespace hosts joined by shaped links: the tuner's choice against
# every forced algorithm, measured in one run.
#
#   benches/hosts/run.sh [-o OUT_DIR]
#
# Builds HOSTS namespaces with scripts/netns.sh (tbf at RATE on every host link, both
# directions), places PER_HOST ranks on each host (ferrorun --netns: rank r on host
# r % HOSTS; the algorithms follow the hosts, not the numbering), adds
# DELAY_US one-way delay to every message between hosts (FERRO_LINK_DELAY_US), and runs
# all_reduce_perf (float sum) under ferrorun once per algorithm: `auto` is the tuner after
# FERRO_TUNE=measure, the others are FERRO_ALGO=<name>. Two sweeps per algorithm, the
# algorithms interleaved within each: small (8 B .. 8 KiB, x2, SMALL_ITERS iterations, ROUNDS
# rounds, the fastest round per size counted) and large (16 KiB .. 64 MiB, x4, LARGE_ITERS
# iterations, LARGE_ROUNDS rounds likewise); the auto runs calibrate anew each round. Raw
# tables go to OUT_DIR (default
# target/bench-hosts); the summary (benches/hosts/summary.py) is printed and written to
# OUT_DIR/summary.txt.
#
# Environment: HOSTS=4 PER_HOST=2 RATE=2gbit DELAY_US=200 ALGOS="auto ring tree rd rhd hier"
#              SMALL_ITERS=200 LARGE_ITERS=5 ROUNDS=2 LARGE_ROUNDS=3 LARGE_MIN=16K LARGE_MAX=64M
#              QUICKACK=1 (the hosts ACK every TCP segment at once, see scripts/netns.sh and
#              docs/HOSTS.md; 0: the kernel's delayed ACKs) SHAPER=tbf (or htb: see
#              scripts/netns.sh) BURST=512kb with tbf (its bucket; smaller ones cannot hold 2
#              Gbit/s here: 64kb gave 0.08 GB/s), none with htb (htb's default)
# Needs root (network namespaces) and iproute2's tc. Holds /tmp/ferroccl-netns.lock, the lock
# the integration tests take, so that neither tears down the other's hosts.

set -euo pipefail
cd "$(dirname "$0")/../.."

HOSTS=${HOSTS:-4}
PER_HOST=${PER_HOST:-2}
RATE=${RATE:-2gbit}
DELAY_US=${DELAY_US:-200}
ALGOS=${ALGOS:-auto ring tree rd rhd hier}
SMALL_ITERS=${SMALL_ITERS:-200}
LARGE_ITERS=${LARGE_ITERS:-5}
ROUNDS=${ROUNDS:-2}
LARGE_ROUNDS=${LARGE_ROUNDS:-3}
LARGE_MIN=${LARGE_MIN:-16K}
LARGE_MAX=${LARGE_MAX:-64M}
QUICKACK=${QUICKACK:-1}
SHAPER=${SHAPER:-tbf}
if [ "$SHAPER" = tbf ]; then BURST=${BURST:-512kb}; else BURST=${BURST:-}; fi
OUT=target/bench-hosts
while [ $# -gt 0 ]; do
    case "$1" in
    -o) OUT=$2; shift 2 ;;
    -h | --help) sed -n '2,20s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "run.sh: needs root for network namespaces" >&2; exit 1; }

cargo build --release --quiet -p ferroccl-perf --bin all_reduce_perf
cargo build --release --quiet -p ferroccl --bin ferrorun
BIN=target/release
mkdir -p "$OUT"

exec 9>/tmp/ferroccl-netns.lock
flock 9
RATE=$RATE SHAPER=$SHAPER BURST=$BURST QUICKACK=$QUICKACK scripts/netns.sh up "$HOSTS" >&2
trap 'scripts/netns.sh down' EXIT

NRANKS=$((HOSTS * PER_HOST))
LIST=$(seq -s, -f 'ferro%g' 0 $((HOSTS - 1)))

{
    echo "# $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(nproc) cores, load average: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# $HOSTS hosts x $PER_HOST ranks, $SHAPER $RATE burst ${BURST:-default} per host link, FERRO_LINK_DELAY_US=$DELAY_US, quickack $QUICKACK"
} > "$OUT/setup.txt"

run() {
    local algo=$1 name=$2
    shift 2
    local env=(FERRO_LINK_DELAY_US="$DELAY_US")
    if [ "$algo" = auto ]; then
        env+=(FERRO_TUNE=measure FERRO_DEBUG=INFO)
    else
        env+=(FERRO_ALGO="$algo")
    fi
    echo "== $name $algo" >&2
    env "${env[@]}" "$BIN/ferrorun" -n "$NRANKS" --netns "$LIST" --no-prefix --timeout 900 -- \
        "$BIN/all_reduce_perf" "$@" > "$OUT/$name-$algo.txt" 2> "$OUT/$name-$algo.err"
}

for ((round = 1; round <= ROUNDS; round++)); do
    for algo in $ALGOS; do
        run "$algo" "small-r$round" -b 8 -e 8K -f 2 -n "$SMALL_ITERS" -w 20
    done
done
for ((round = 1; round <= LARGE_ROUNDS; round++)); do
    for algo in $ALGOS; do
        run "$algo" "large-r$round" -b "$LARGE_MIN" -e "$LARGE_MAX" -f 4 -n "$LARGE_ITERS" -w 2
    done
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/setup.txt"

python3 benches/hosts/summary.py "$OUT" "$NRANKS" $ALGOS | tee "$OUT/summary.txt"
