#!/usr/bin/env bash
# Small-message latency beside Open MPI: a 8 B f32 sum allreduce, interleaved round by round,
# each case run the same way for both libraries.
#
#   benches/compare/latency.sh [-r 5] [-n 20000] [-w 2000] [-p "2 4 8"] [--no-tcp] [-o DIR]
#
#   -r   rounds; every round runs every case once for each library, alternating (default 5)
#   -n   timed calls per run; 4 ranks and more run a quarter, at least 1000 (default 20000)
#   -w   warm-up calls per run, scaled the same way (default 2000)
#   -p   rank counts over shared memory (default "2 4 8")
#   --no-tcp   skip the 2-rank TCP loopback case
#   -o   also write raw.csv and table.md there
#
# Cases, each with the same placement for both libraries:
#   shm N bound     ferrorun --bind core (rank i on CPU i mod C), against mpirun
#                   --bind-to core:overload-allowed (the same round robin). mpirun binds 2
#                   ranks to cores by default, so this is the case its plain command runs.
#   shm N unbound   ferrorun's default (no binding), against mpirun --bind-to none.
#   tcp 2 bound     FERRO_TRANSPORTS=tcp, against --mca btl self,tcp.
# ferroccl's figure is all_reduce_perf's out-of-place and in-place times (each a mean over the
# timed loop, as nccl-tests); Open MPI's is benches/compare/mpi_allreduce.c's mean per call.
# Prints one row per case: the mean and median over rounds of each library's figures.
#
# Needs Open MPI (`apt-get install -y openmpi-bin libopenmpi-dev`) and a release build of the
# perf tools (built here when missing).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)

ROUNDS=5 N=20000 W=2000 RANKS="2 4 8" TCP=1 OUT=
while [ $# -gt 0 ]; do
    case "$1" in
    -r) ROUNDS=$2; shift 2 ;;
    -n) N=$2; shift 2 ;;
    -w) W=$2; shift 2 ;;
    -p) RANKS=$2; shift 2 ;;
    --no-tcp) TCP=0; shift ;;
    -o) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "latency.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

for tool in mpirun mpicc; do
    command -v "$tool" >/dev/null || { echo "latency.sh: $tool not found (apt-get install -y openmpi-bin libopenmpi-dev)" >&2; exit 1; }
done
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release
if [ ! -x "$BIN/all_reduce_perf" ] || [ ! -x "$BIN/ferrorun" ]; then
    cargo build --release -q -p ferroccl-perf --bin all_reduce_perf
    cargo build --release -q --bin ferrorun
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mpicc -O2 -o "$WORK/mpi_allreduce" benches/compare/mpi_allreduce.c

# Timed and warm-up calls for N ranks: oversubscribed runs are slower per call.
calls() { local n=$1 ranks=$2; if [ "$ranks" -gt 2 ]; then n=$((n / 4)); [ "$n" -ge 1000 ] || n=1000; fi; echo "$n"; }

ferro() { # transport ranks bind -> "oop ip"
    local n w
    n=$(calls "$N" "$2") w=$(calls "$W" "$2")
    FERRO_TRANSPORTS=$1 "$BIN/ferrorun" -n "$2" --bind "$3" -- "$BIN/all_reduce_perf" \
        -b 8 -e 8 -n "$n" -w "$w" > "$WORK/run.log" 2>&1 || true
    figure "$WORK/run.log" '$1 == "[0]" && $2 == "8" { print $7, $11; exit }'
}

figure() { # log awk-program: prints the figure, or the log's tail on stderr when there is none
    local got
    got=$(awk "$2" "$1")
    if [ -z "$got" ]; then
        echo "latency.sh: no figure from this run; its output ends:" >&2
        tail -n 15 "$1" >&2
    fi
    echo "$got"
}

mpi() { # btl ranks bind -> "mean"
    local n w
    n=$(calls "$N" "$2") w=$(calls "$W" "$2")
    mpirun --allow-run-as-root --oversubscribe --bind-to "$3" -np "$2" --mca pml ob1 \
        --mca btl "self,$1" "$WORK/mpi_allreduce" -b 8 -e 8 -n "$n" -w "$w" -c allreduce \
        > "$WORK/run.log" 2>&1 || true
    figure "$WORK/run.log" '$1 == "allreduce" { print $4; exit }'
}

CASES=()
for r in $RANKS; do CASES+=("shm $r bound" "shm $r unbound"); done
[ "$TCP" = 1 ] && CASES+=("tcp 2 bound")

RAW=$WORK/raw.csv
echo "round,case,library,us" > "$RAW"
for round in $(seq 1 "$ROUNDS"); do
    for c in "${CASES[@]}"; do
        read -r transport ranks placement <<<"$c"
        fbind=core mbind=core:overload-allowed
        [ "$placement" = unbound ] && fbind=none mbind=none
        btl=vader; [ "$transport" = tcp ] && btl=tcp
        # Alternate which library goes first, so neither always runs on a machine the other
        # has just warmed.
        for lib in $( [ $((round % 2)) = 1 ] && echo "ferro mpi" || echo "mpi ferro"); do
            if [ "$lib" = ferro ]; then
                read -r oop ip <<<"$(ferro "$transport" "$ranks" "$fbind")" || true
                echo "$round,$c,ferroccl out of place,${oop:-}" >> "$RAW"
                echo "$round,$c,ferroccl in place,${ip:-}" >> "$RAW"
            else
                echo "$round,$c,Open MPI,$(mpi "$btl" "$ranks" "$mbind")" >> "$RAW"
            fi
        done
    done
    echo "round $round of $ROUNDS done" >&2
done

python3 - "$RAW" <<'EOF' | tee "$WORK/table.md"
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
cases = list(dict.fromkeys(r["case"] for r in rows))
print("| case (8 B f32 sum allreduce, µs per call) | ferroccl mean / median | Open MPI mean / median | ferroccl mean ÷ Open MPI mean |")
print("|---|---:|---:|---:|")
bad = 0
for c in cases:
    def figs(pred):
        v = [r["us"] for r in rows if r["case"] == c and pred(r["library"])]
        bad_here = sum(1 for x in v if not x)
        return [float(x) for x in v if x], bad_here
    f, bf = figs(lambda l: l.startswith("ferroccl"))
    m, bm = figs(lambda l: l == "Open MPI")
    bad += bf + bm
    if not f or not m:
        print(f"| {c} | {len(f)} figures | {len(m)} figures | - |")
        continue
    fm, mm = statistics.mean(f), statistics.mean(m)
    print(f"| {c} | {fm:.2f} / {statistics.median(f):.2f} | {mm:.2f} / {statistics.median(m):.2f} | {fm / mm:.2f} |")
if bad:
    print(f"\n{bad} runs gave no figure (see raw.csv)")
EOF
if [ -n "$OUT" ]; then
    mkdir -p "$OUT"
    cp "$RAW" "$WORK/table.md" "$OUT/"
fi
