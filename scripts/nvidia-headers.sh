#!/usr/bin/env bash
# Fetches NVIDIA's official nccl.h and the CUDA headers it includes from PyPI (nvidia-nccl-cu12,
# nvidia-cuda-runtime-cu12, nvidia-cuda-nvcc-cu12 for crt/, nvidia-cuda-cccl-cu12 for nv/), keeps
# only their include folders, and prints those folders joined by ':' (for -I flags). Cached.
#   FERROCCL_NVIDIA_INCLUDES=$(scripts/nvidia-headers.sh) cargo test --features capi --test capi --test capi_programs
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${FERROCCL_NVIDIA_HEADERS_DIR:-${CARGO_TARGET_DIR:-target}/nvidia-headers}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
pkgs=(nvidia-nccl-cu12 nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12 nvidia-cuda-cccl-cu12)
incs=("$dir/nvidia/nccl/include" "$dir/nvidia/cuda_runtime/include" "$dir/nvidia/cuda_nvcc/include" "$dir/nvidia/cuda_cccl/include")
if [ ! -f "$dir/nvidia/nccl/include/nccl.h" ] || [ ! -d "$dir/nvidia/cuda_cccl/include/nv" ]; then
  mkdir -p "$dir/wheels"
  python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$dir/wheels" "${pkgs[@]}" >&2
  python3 - "$dir" "$dir"/wheels/*.whl <<'PY'
import sys, zipfile
out = sys.argv[1]
for wheel in sys.argv[2:]:
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if "/include/" in name:
                z.extract(name, out)
PY
  rm -rf "$dir/wheels"
fi
(IFS=:; echo "${incs[*]}")
