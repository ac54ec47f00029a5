#!/bin/sh
# Runs a command pinned to the core numbered like its rank, so that each rank of
# `ferrorun -n 2 -- benches/compare/pin_rank.sh all_reduce_perf ...` has a core of its own.
exec taskset -c "${FERRO_RANK:?pin_rank.sh: FERRO_RANK is not set (run it under ferrorun)}" "$@"
