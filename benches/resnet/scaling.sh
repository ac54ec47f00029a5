#!/usr/bin/env bash
# Scaling study: data-parallel ResNet training on ferroccl (resnet_ddp under ferrorun) beside
# PyTorch DDP with the gloo backend (torch_ddp.py), same model, batch, data and threads.
#
#   benches/resnet/scaling.sh [options]
#
#   -n, --max-ranks N     run 1..N ranks (default: nproc; env MAX_RANKS)
#   --ranks LIST          exactly these rank counts, e.g. 1,2,4 (overrides --max-ranks)
#   --modes LIST          weak,strong (default both)
#   --impls LIST          ferroccl,torch (default both)
#   --arch A              resnet18 | resnet34 | resnet50 (default resnet18)
#   --image-size S        default 32 (<= 64 uses the small-image stem in both)
#   --weak-batch B        images per rank for weak scaling (default 32)
#   --strong-batch G      global batch for strong scaling (default 64; rank counts that do not
#                         divide it are skipped)
#   --steps S             timed steps per run, after the warm-up (default 30)
#   --warmup-steps W      untimed steps first (default 5)
#   --threads T           compute threads per rank (default 1)
#   --bucket-mb M         gradient bucket size, both implementations (default 25)
#   --malloc M            keep | system: what the C allocator does with freed memory, both
#                         implementations (default keep; resnet_ddp --help says more)
#   -r, --repeats R       run every configuration R times; the report shows medians (default 1)
#   --timeout SECS        stop a run after this long (default 1800)
#   -o, --out DIR         CSV, raw logs and plots (default docs/scaling); table: --md FILE
#                         (default docs/SCALING.md)
#   --no-build            use the binaries already in target/release
#   --report-only         only rebuild the table and plots from DIR/results.csv
#
# Every setting also reads an environment variable of the same name in capitals (MAX_RANKS,
# RANKS, MODES, IMPLS, ARCH, IMAGE_SIZE, WEAK_BATCH, STRONG_BATCH, STEPS, WARMUP_STEPS, THREADS,
# BUCKET_MB, MALLOC, REPEATS, RUN_TIMEOUT); flags win.
#
# Order: for each mode and rank count, the ferroccl and PyTorch runs of one configuration are
# adjacent (which goes first alternates between repeats), so load from elsewhere on the machine
# drifts between them as little as possible. Each run's output is kept in DIR/raw/; the
# `RESULT {json}` line that rank 0 prints is appended to DIR/results.csv (which starts empty);
# then benches/resnet/report.py writes the markdown table and DIR/{weak,strong,breakdown}.png.
#
# What it needs:
#   PYTHON (default /opt/ferroccl/torch-venv/bin/python) with torch, torchvision, matplotlib and
#   numpy; when torch is missing scripts/torch-env.sh installs them into that virtual environment
#   (unless SCALING_NO_INSTALL=1).
#   resnet_ddp links the same libtorch (tch, LIBTORCH_USE_PYTORCH=1): this script puts
#   PYTHON's directory first on PATH and torch's lib directory on LD_LIBRARY_PATH for both the
#   build and the runs. RESNET_DDP=/path/to/binary runs that binary instead of building one.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)

PYTHON=${PYTHON:-/opt/ferroccl/torch-venv/bin/python}
NCORES=$(nproc)
MAX_RANKS=${MAX_RANKS:-$NCORES}
RANKS=${RANKS:-}
MODES=${MODES:-weak,strong}
IMPLS=${IMPLS:-ferroccl,torch}
ARCH=${ARCH:-resnet18}
IMAGE_SIZE=${IMAGE_SIZE:-32}
WEAK_BATCH=${WEAK_BATCH:-32}
STRONG_BATCH=${STRONG_BATCH:-64}
STEPS=${STEPS:-30}
WARMUP_STEPS=${WARMUP_STEPS:-5}
THREADS=${THREADS:-1}
BUCKET_MB=${BUCKET_MB:-25}
MALLOC=${MALLOC:-keep}
REPEATS=${REPEATS:-1}
RUN_TIMEOUT=${RUN_TIMEOUT:-1800}
OUT=docs/scaling
MD=docs/SCALING.md
BUILD=yes
REPORT_ONLY=no
ARGS_SEEN=("$@")

while [ $# -gt 0 ]; do
    case "$1" in
    -n | --max-ranks) MAX_RANKS=$2; shift 2 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --modes) MODES=$2; shift 2 ;;
    --impls) IMPLS=$2; shift 2 ;;
    --arch) ARCH=$2; shift 2 ;;
    --image-size) IMAGE_SIZE=$2; shift 2 ;;
    --weak-batch) WEAK_BATCH=$2; shift 2 ;;
    --strong-batch) STRONG_BATCH=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --warmup-steps) WARMUP_STEPS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --bucket-mb) BUCKET_MB=$2; shift 2 ;;
    --malloc) MALLOC=$2; shift 2 ;;
    -r | --repeats) REPEATS=$2; shift 2 ;;
    --timeout) RUN_TIMEOUT=$2; shift 2 ;;
    -o | --out) OUT=$2; shift 2 ;;
    --md) MD=$2; shift 2 ;;
    --no-build) BUILD=no; shift ;;
    --report-only) REPORT_ONLY=yes; shift ;;
    -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "scaling.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ -n "$RANKS" ] || RANKS=$(seq -s, 1 "$MAX_RANKS")

say() { echo "== $*" >&2; }
has() { case ",$1," in *",$2,"*) return 0 ;; *) return 1 ;; esac; }

CSV=$OUT/results.csv
RAW=$OUT/raw
mkdir -p "$OUT" "$RAW"

# --- Python with torch ------------------------------------------------------------------------
# scripts/torch-env.sh installs torch, torchvision, matplotlib and numpy when they are missing and
# prints LIBTORCH_USE_PYTORCH, PATH and LD_LIBRARY_PATH for building and running resnet_ddp.
if [ "${SCALING_NO_INSTALL:-0}" = 1 ] && ! "$PYTHON" -c 'import torch, torchvision, matplotlib, numpy' 2>/dev/null; then
    echo "scaling.sh: $PYTHON cannot import torch, torchvision, matplotlib and numpy" \
        "(set PYTHON, or unset SCALING_NO_INSTALL to install them)" >&2
    exit 1
fi
eval "$(FERRO_TORCH_VENV="$(dirname "$(dirname "$PYTHON")")" scripts/torch-env.sh)"

# The header lines of the report, written when the runs start and kept beside the CSV, so
# that --report-only describes the runs that made it.
META=$OUT/meta.txt
write_meta() {
    {
        echo "machine=$NCORES cores ($(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)), load average $(cut -d' ' -f1-3 /proc/loadavg) when the runs started"
        echo "software=torch $("$PYTHON" -c 'import torch; print(torch.__version__)'), ferroccl $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
        echo "settings=$ARCH at ${IMAGE_SIZE}x$IMAGE_SIZE, synthetic data, $THREADS thread(s) per rank, $STEPS timed steps after $WARMUP_STEPS warm-up, ${BUCKET_MB} MB buckets, malloc $MALLOC in both, weak scaling $WEAK_BATCH images per rank, strong scaling $STRONG_BATCH images in all, median of $REPEATS run(s)"
        echo "command=\`benches/resnet/scaling.sh${ARGS_SEEN[*]:+ ${ARGS_SEEN[*]}}\`"
    } >"$META"
}
report() {
    local meta=()
    if [ -f "$META" ]; then
        while IFS= read -r line; do meta+=(--meta "$line"); done <"$META"
    fi
    "$PYTHON" benches/resnet/report.py table "$CSV" --md "$MD" --plots "$OUT" "${meta[@]}"
}
if [ "$REPORT_ONLY" = yes ]; then
    report
    exit 0
fi

# --- binaries ---------------------------------------------------------------------------------
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release
FERRORUN=$BIN/ferrorun
if has "$IMPLS" ferroccl; then
    if [ "$BUILD" = yes ]; then
        say "building ferroccl's binaries (release)"
        cargo build --release --quiet -p ferroccl --bins
    fi
    if [ -n "${RESNET_DDP:-}" ]; then
        say "using RESNET_DDP=$RESNET_DDP"
    else
        RESNET_DDP=$BIN/resnet_ddp
        if [ "$BUILD" = yes ]; then
            say "building resnet_ddp (release, libtorch of $PYTHON's torch)"
            cargo build --release --quiet -p ferroccl-resnet --bin resnet_ddp
        fi
    fi
    for b in "$FERRORUN" "$RESNET_DDP"; do
        [ -x "$b" ] || { echo "scaling.sh: $b not found (build it, or drop --no-build)" >&2; exit 1; }
    done
fi

# --- runs -------------------------------------------------------------------------------------
# resnet_ddp's --steps counts the warm-up steps too (it runs one epoch of that many steps and
# times those after the warm-up); torch_ddp.py's counts only the timed ones.
COMMON=(--arch "$ARCH" --image-size "$IMAGE_SIZE" --warmup-steps "$WARMUP_STEPS"
    --threads "$THREADS" --bucket-mb "$BUCKET_MB" --malloc "$MALLOC")
FERRO_STEPS=(--steps $((STEPS + WARMUP_STEPS)))
TORCH_STEPS=(--steps "$STEPS")
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
rm -f "$CSV" "$RAW"/*.log
write_meta
FAILED=0

run_one() { # impl mode nranks repeat batch-flag batch
    local impl=$1 mode=$2 n=$3 rep=$4 bflag=$5 batch=$6
    local log=$RAW/$mode-n$n-$impl-r$rep.log
    say "$mode n=$n $impl repeat $rep/$REPEATS ($bflag $batch)"
    local status=0
    case $impl in
    ferroccl)
        timeout -k 10 "$RUN_TIMEOUT" "$FERRORUN" -n "$n" -- "$RESNET_DDP" "${COMMON[@]}" "${FERRO_STEPS[@]}" \
            --data synthetic "$bflag" "$batch" </dev/null >"$log" 2>&1 || status=$?
        ;;
    torch)
        timeout -k 10 "$RUN_TIMEOUT" "$PYTHON" benches/resnet/torch_ddp.py --nranks "$n" "${COMMON[@]}" \
            "${TORCH_STEPS[@]}" "$bflag" "$batch" </dev/null >"$log" 2>&1 || status=$?
        ;;
    esac
    if [ $status -ne 0 ]; then
        say "$impl failed (status $status); the last lines of $log:"
        tail -n 15 "$log" >&2
        FAILED=$((FAILED + 1))
        return 0
    fi
    "$PYTHON" benches/resnet/report.py add "$CSV" "$log" --mode "$mode" --repeat "$rep" >&2 \
        || FAILED=$((FAILED + 1))
}

say "machine: $NCORES cores, load $(cut -d' ' -f1-3 /proc/loadavg); ranks $RANKS; modes $MODES; impls $IMPLS"
IFS=, read -ra RANK_LIST <<<"$RANKS"
IFS=, read -ra MODE_LIST <<<"$MODES"
IFS=, read -ra IMPL_LIST <<<"$IMPLS"
for mode in "${MODE_LIST[@]}"; do
    for n in "${RANK_LIST[@]}"; do
        if [ "$mode" = weak ]; then
            bflag=--batch-size batch=$WEAK_BATCH
        elif [ "$mode" = strong ]; then
            if [ $((STRONG_BATCH % n)) -ne 0 ]; then
                say "strong n=$n: global batch $STRONG_BATCH is not a multiple of $n ranks, skipped"
                continue
            fi
            bflag=--global-batch batch=$STRONG_BATCH
        else
            echo "scaling.sh: unknown mode '$mode' (weak, strong)" >&2
            exit 2
        fi
        for rep in $(seq 1 "$REPEATS"); do
            order=("${IMPL_LIST[@]}")
            if [ $((rep % 2)) -eq 0 ] && [ ${#order[@]} -eq 2 ]; then order=("${order[1]}" "${order[0]}"); fi
            for impl in "${order[@]}"; do
                case $impl in
                ferroccl | torch) run_one "$impl" "$mode" "$n" "$rep" "$bflag" "$batch" ;;
                *) echo "scaling.sh: unknown implementation '$impl' (ferroccl, torch)" >&2; exit 2 ;;
                esac
            done
        done
    done
done

# --- table and plots --------------------------------------------------------------------------
if [ -s "$CSV" ]; then
    report
else
    say "no results: nothing to report"
fi
if [ $FAILED -ne 0 ]; then
    say "$FAILED run(s) failed; see $RAW/"
    exit 1
fi
