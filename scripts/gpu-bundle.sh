#!/usr/bin/env bash
# Builds, on a machine without a GPU, the self-contained folder that scripts/gpu-check.sh runs
# from on a GPU machine that may have no Rust toolchain, no NVRTC and no network:
#
#     scripts/gpu-bundle.sh [DIR]        (default target/gpu-bundle; must stay under 64 MiB)
#
# It holds stripped release binaries (bin/ferro-gpu-check, bin/ferroccl-device-check,
# bin/all_reduce_perf and the other collectives' perf tools, bin/sendrecv_perf,
# bin/all_reduce_perf_profile (all_reduce_perf with the profile feature), bin/ferrorun,
# bin/p2p-tests: the p2p transport's unit tests), bin/streams (the C ABI
# test tests/c/streams.c, built against include/nccl.h and linked to lib/libnccl.so.2), bin/vmm
# and bin/graphs (tests/c/vmm.c and tests/c/graphs.c, the same way),
# lib/libnccl.so.2, python/ (the PyTorch backend with its extension, and the tests of step 9),
# the kernel sources (kernels/), the kernels compiled with NVRTC for sm_70..sm_90 and as
# compute_70 PTX for newer GPUs (kernel-cache/, so the GPU machine needs no NVRTC), gpu-check.sh,
# gpu-targets.sh and a MANIFEST.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/gpu-bundle}
target=${CARGO_TARGET_DIR:-target}
limit=$((64 << 20))

eval "$(scripts/nvrtc-env.sh)"
echo "== building release binaries" >&2
cargo build --release --quiet -p ferroccl-cuda --bin ferro-gpu-check
cargo build --release --quiet -p ferroccl --bin ferroccl-device-check --bin ferrorun
perf_tools="all_reduce_perf sendrecv_perf all_gather_perf reduce_scatter_perf broadcast_perf reduce_perf alltoall_perf gather_perf scatter_perf"
# shellcheck disable=SC2046 # one --bin per tool
cargo build --release --quiet -p ferroccl-perf $(printf -- '--bin %s ' $perf_tools)
# all_reduce_perf with the profile feature (bin/all_reduce_perf_profile, part 8g): with
# FERRO_PERF_PROFILE=1 each row is followed by every rank's time per phase. Built in a target
# folder of its own, so that the other tools stay without the profile's clock reads.
CARGO_TARGET_DIR="$target/profiled" cargo build --release --quiet -p ferroccl-perf \
    --features profile --bin all_reduce_perf
# The p2p transport's unit tests (cuda provider under FERRO_P2P_GPU_CHECK=1), as bin/p2p-tests.
p2p_tests=$(cargo test --release --no-run -p ferroccl-transport-p2p --lib 2>&1 |
    sed -n 's/.*Executable unittests src\/lib.rs (\(.*\))$/\1/p' | tail -1)
[ -x "$p2p_tests" ] || { echo "gpu-bundle: the p2p test binary was not built" >&2; exit 1; }
lib=$(scripts/build-capi.sh)
# The PyTorch backend's extension (abi3: any CPython >= 3.9 loads it; it links no libpython).
echo "== building the Python extension" >&2
# Always in python/target (its own workspace; CARGO_TARGET_DIR would put it elsewhere).
(cd python && CARGO_TARGET_DIR="$PWD/target" PYO3_PYTHON=${PYO3_PYTHON:-python3} \
    cargo build --release --quiet --features extension-module)
pyext=python/target/release/lib_ferroccl.so
[ -f "$pyext" ] || { echo "gpu-bundle: the Python extension was not built" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/kernels" "$out/kernel-cache"
cp "$target/release/ferro-gpu-check" "$target/release/ferroccl-device-check" \
    "$target/release/ferrorun" "$out/bin/"
for t in $perf_tools; do cp "$target/release/$t" "$out/bin/"; done
cp "$target/profiled/release/all_reduce_perf" "$out/bin/all_reduce_perf_profile"
cp "$p2p_tests" "$out/bin/p2p-tests"
cp "$lib" "$out/lib/libnccl.so.2"
# The C ABI on streams: tests/c/streams.c, linked by path (its soname makes it load
# libnccl.so.2 from LD_LIBRARY_PATH at run time); it opens libcuda.so.1 itself at run time.
gcc -std=gnu11 -Wall -Wextra -Werror -O1 -Iinclude tests/c/streams.c "$lib" -ldl \
    -o "$out/bin/streams"
# Memory mapped piece by piece (cuMemMap, as PyTorch's expandable segments) through the C ABI.
gcc -std=gnu11 -Wall -Wextra -Werror -O1 -Iinclude tests/c/vmm.c "$lib" -ldl -o "$out/bin/vmm"
# Calls recorded into CUDA graphs through the C ABI.
gcc -std=gnu11 -Wall -Wextra -Werror -O1 -Iinclude tests/c/graphs.c "$lib" -ldl -o "$out/bin/graphs"
# The Python package and the tests step 9 runs (python/tests/test_cuda.py and what it imports).
mkdir -p "$out/python/ferroccl" "$out/python/tests"
cp python/ferroccl/*.py "$out/python/ferroccl/"
cp "$pyext" "$out/python/ferroccl/_ferroccl.abi3.so"
cp python/tests/harness.py python/tests/test_device.py python/tests/test_train.py \
    python/tests/test_cuda.py "$out/python/tests/"
strip "$out"/bin/* "$out/lib/libnccl.so.2" "$out/python/ferroccl/_ferroccl.abi3.so"
cp kernels/cuda/ferro_reduce.h kernels/cuda/ferro_reduce.cu "$out/kernels/"
cp scripts/gpu-check.sh scripts/gpu-targets.sh "$out/"
echo "== compiling the kernels for sm_70..sm_90 with NVRTC" >&2
"$out/bin/ferro-gpu-check" --build-cache "$out/kernel-cache" >&2

{
    echo "ferroccl GPU check bundle"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
    echo
    (cd "$out" && find . -type f ! -name MANIFEST | sort | xargs ls -l | awk '{print $5, $9}')
} >"$out/MANIFEST"

size=$(du -sb "$out" | cut -f1)
echo "gpu-bundle: $out, $((size >> 20)) MiB ($size bytes)" >&2
if [ "$size" -ge "$limit" ]; then
    echo "gpu-bundle: $out is over 64 MiB" >&2
    exit 1
fi
echo "$out"
