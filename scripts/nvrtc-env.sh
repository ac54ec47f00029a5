#!/usr/bin/env bash
# Makes sure NVRTC (NVIDIA's run-time CUDA compiler) is installed for the kernel compile tests
# and prints where it is, as a shell `export` line:
#
#     eval "$(scripts/nvrtc-env.sh)"
#
# NVRTC comes from PyPI's wheels, no GPU, driver or CUDA toolkit needed: CUDA 12 from
# `nvidia-cuda-nvrtc-cu12`, CUDA 13 from `nvidia-cuda-nvrtc` (13.x), both in one virtual
# environment. FERROCCL_NVRTC_LIBS lists the libraries found (colon separated); the compile test
# (`cargo test -p ferroccl-cuda --test nvrtc`) compiles every kernel with each of them. Set
# FERRO_NVRTC_VENV to use another environment; progress goes to stderr.
set -euo pipefail

CU12_VERSION=12.9.86
CU13_VERSION=13.5.37
VENV=${FERRO_NVRTC_VENV:-/opt/ferroccl/nvrtc-venv}
PY=$VENV/bin/python

libs() {
    [ -x "$PY" ] || return 1
    "$PY" - <<'PYEOF'
import glob, os, sysconfig
site = sysconfig.get_paths()["purelib"]
found = []
for pat in ("nvidia/cuda_nvrtc/lib/libnvrtc.so.12", "nvidia/cu13/lib/libnvrtc.so.13"):
    hits = glob.glob(os.path.join(site, pat))
    if not hits:
        raise SystemExit(1)
    found.append(hits[0])
print(":".join(found))
PYEOF
}

if ! libs >/dev/null 2>&1; then
    echo "nvrtc-env: installing nvidia-cuda-nvrtc-cu12==$CU12_VERSION nvidia-cuda-nvrtc==$CU13_VERSION into $VENV" >&2
    mkdir -p "$(dirname "$VENV")"
    [ -x "$PY" ] || python3 -m venv "$VENV"
    "$PY" -m pip install --quiet --disable-pip-version-check --no-deps \
        "nvidia-cuda-nvrtc-cu12==$CU12_VERSION" "nvidia-cuda-nvrtc==$CU13_VERSION" >&2
    libs >/dev/null || { echo "nvrtc-env: libnvrtc not found in $VENV after install" >&2; exit 1; }
fi

echo "export FERROCCL_NVRTC_LIBS=$(libs)"
