#!/usr/bin/env bash
# Allreduce on this host, 2 ranks, f32 sum: ferroccl (TCP over loopback) beside Gloo (PyTorch's
# gloo backend on CPU tensors) and a plain 2-process TCP stream (iperf3) of the bytes each rank
# sends, all in one run.
#   PYTHON=/path/to/python-with-torch benches/compare/allreduce_vs.sh [-b 1M -e 256M -f 4]
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
args=("$@")
[ "${#args[@]}" -gt 0 ] || args=(-b 1M -e 256M -f 4)
cargo build --release --quiet --bin ferrorun -p ferroccl
cargo build --release --quiet -p ferroccl-perf --bin all_reduce_perf
echo "== ferroccl all_reduce_perf (2 ranks, TCP over loopback)"
target/release/ferrorun -n 2 --no-prefix -- target/release/all_reduce_perf "${args[@]}" -n 20 -w 5
echo
echo "== gloo (torch.distributed, 2 processes, 1 thread each)"
"$PYTHON" benches/compare/gloo_allreduce.py -n 2 "${args[@]}" --iters 20 --warmup 5
echo
if command -v iperf3 >/dev/null 2>&1; then
  echo "== plain TCP stream between 2 processes over loopback (iperf3, 1 stream, 64 MiB x 20)"
  iperf3 -s -1 -p 5301 >/dev/null 2>&1 &
  sleep 0.5
  iperf3 -c 127.0.0.1 -p 5301 -n 1280M -f g | grep -E "sender|receiver"
  wait
fi
