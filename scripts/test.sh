#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests, doctests, and the multi-rank
# integration tests (threads, processes, network namespaces; the latter need root).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# libtorch for examples/resnet (PyPI torch in a virtual environment; installed on first use).
eval "$(scripts/torch-env.sh)"
# NVRTC for the CUDA kernel compile test (kernels/cuda/tests/nvrtc.rs), which must not skip here.
eval "$(scripts/nvrtc-env.sh)"
export FERROCCL_REQUIRE_NVRTC=1
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy --all-targets -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== cargo test (unit, integration and doctests)"
cargo test --workspace --no-fail-fast "$@"
echo "== device tests again on eager stand-in streams (copies run as early as a GPU could run them)"
FERRO_STANDIN_EAGER=1 cargo test -p ferroccl --lib --test device --test device_streams --test device_faults \
  --test device_peer_streams \
  --no-fail-fast
echo "== the perf tools built with the profile feature (each row's time per phase)"
cargo test -p ferroccl-perf --features profile --test profile_rows --test latency_parts --no-fail-fast
echo "== benches/resnet/scaling.sh smoke run (1 rank, 1 step, ferroccl and PyTorch DDP)"
benches/resnet/scaling.sh --ranks 1 --modes weak --steps 1 --warmup-steps 0 --weak-batch 4 \
  -o target/scaling-smoke --md target/scaling-smoke/SCALING.md
echo "== C ABI (feature capi): libnccl.so.2, include/nccl.h, C programs"
cargo clippy -p ferroccl --no-deps --features capi --all-targets --quiet -- -D warnings
FERROCCL_NVIDIA_INCLUDES="$(scripts/nvidia-headers.sh)" FERROCCL_REQUIRE_NVIDIA_HEADER=1 \
FERROCCL_CAPI_LIB_DIR="$(dirname "$(scripts/build-capi.sh)")" \
  cargo test -p ferroccl --features capi --lib --test capi --test capi_programs --test capi_inprocess \
    --test topo --no-fail-fast
FERRO_STANDIN_EAGER=1 FERROCCL_NVIDIA_INCLUDES="$(scripts/nvidia-headers.sh)" \
FERROCCL_CAPI_LIB_DIR="$(dirname "$(scripts/build-capi.sh)")" \
  cargo test -p ferroccl --features capi --lib --test capi_programs --no-fail-fast -- capi:: stream
echo "== the CUDA code paths over softcuda, a software model of the driver (no GPU; docs/CUDA.md)"
scripts/softcuda-check.sh
echo "== Python package (python/): maturin wheel, operation sweep, errors, DDP/FSDP2, PyTorch's suite"
python/tests/run.sh
