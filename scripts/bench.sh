#!/usr/bin/env bash
# The main job: a multi-rank allreduce bandwidth sweep on this machine, in nccl-tests' format.
#   scripts/bench.sh            # 2 ranks, 8 B .. 64 MiB
#   NRANKS=4 scripts/bench.sh -b 1M -e 256M -f 4
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >/dev/null
cargo build --release --quiet --bin ferrorun -p ferroccl
cargo build --release --quiet -p ferroccl-perf --bins
args=("$@")
[ "${#args[@]}" -gt 0 ] || args=(-b 8 -e 64M -f 2)
exec target/release/ferrorun -n "${NRANKS:-2}" -- target/release/all_reduce_perf "${args[@]}"
