#!/usr/bin/env bash
# The driver calls a collective makes per rank and call, over softcuda (the model counts its
# entry points: SOFTCUDA_COUNTS), not counting context switches (cuCtxSetCurrent,
# cuCtxGetCurrent: a thread-local store in the driver) nor polls (cuEventQuery, cuStreamQuery,
# whose number depends on timing). Each call is host work on the path of a small collective
# (the 8-byte target of docs/CUDA.md), so a change that adds one shows here. A count, not a
# time.
#
#   scripts/driver-calls.sh BOUND RANKS CMD...
#
# CMD is an nccl-tests-style tool run whose iteration count is the word NITER (as `-n NITER`),
# or another program that makes NITER calls per rank and says `OK` at the start of a line
# (PER_ITERATION=1: tests/c/streams.c's mode repeat); it runs with 20 and with 120, and the
# difference is divided by 100 iterations of PER_ITERATION calls (default 2: a tool's out of
# place and in place) of RANKS ranks. Exit status 0 when the run checked its results right
# (a tool: `-c 1`) and the count is at most BOUND; the environment must load softcuda
# (scripts/softcuda-check.sh sets it). ONLY=NAME counts that entry point alone (context
# switches and polls included).
set -uo pipefail
[ $# -ge 3 ] || { sed -n 2,19p "$0"; exit 2; }
bound=$1 ranks=$2
shift 2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for n in 20 120; do
    out=$(SOFTCUDA_COUNTS=$dir/counts.$n "${@//NITER/$n}" 2>&1) ||
        { printf '%s\n' "$out" | tail -20; exit 1; }
    grep -qE "# Out of bounds values : 0 OK|^OK " <<<"$out" ||
        { printf '%s\n' "$out" | tail -20; exit 1; }
done
python3 - "$dir/counts.20" "$dir/counts.120" "$bound" "$ranks" "${PER_ITERATION:-2}" "${ONLY:-}" <<'PY'
import collections
import sys


def load(path):
    calls = collections.Counter()
    for line in open(path):
        _, name, n = line.split()
        calls[name] += int(n)
    return calls


a, b = load(sys.argv[1]), load(sys.argv[2])
skip = {"cuCtxSetCurrent", "cuCtxGetCurrent", "cuEventQuery", "cuStreamQuery"}
only = sys.argv[6]
per = {k: (b[k] - a[k]) / (100 * int(sys.argv[5]) * int(sys.argv[4]))
       for k in b if (k == only if only else k not in skip) and b[k] != a[k]}
total = sum(per.values())
print(f"{total:.2f} {only or 'driver'} calls per rank and call (at most {sys.argv[3]}): "
      + ", ".join(f"{k} {v:g}" for k, v in sorted(per.items(), key=lambda x: -x[1])))
sys.exit(0 if total <= float(sys.argv[3]) + 1e-9 else 1)
PY
