#!/usr/bin/env bash
# Makes sure libtorch for the `tch` crate is installed and prints the environment that builds and
# runs examples/resnet, as shell `export` lines:
#
#     eval "$(scripts/torch-env.sh)"
#
# tch 0.26 binds libtorch 2.13.0, taken from PyPI's `torch==2.13.0` wheel in a virtual environment
# (LIBTORCH_USE_PYTORCH=1); torchvision 0.28.0 (its match) and matplotlib serve the PyTorch DDP
# baseline and the scaling plots; maturin builds the Python package (python/) and expecttest is
# what PyTorch's own distributed test suite imports (python/tests/torch_suite.py). Set
# FERRO_TORCH_VENV to use another environment; progress goes to stderr, so only the exports
# reach stdout.
set -euo pipefail

TORCH_VERSION=2.13.0
TORCHVISION_VERSION=0.28.0
VENV=${FERRO_TORCH_VENV:-/opt/ferroccl/torch-venv}
PY=$VENV/bin/python

have_torch() {
    [ -x "$PY" ] && "$PY" - <<EOF 2>/dev/null
import torch, torchvision, matplotlib, numpy, expecttest
assert torch.__version__.split("+")[0] == "$TORCH_VERSION", torch.__version__
EOF
    [ -x "$VENV/bin/maturin" ]
}

if ! have_torch; then
    echo "torch-env: installing torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION into $VENV" >&2
    mkdir -p "$(dirname "$VENV")"
    [ -x "$PY" ] || python3 -m venv "$VENV"
    "$PY" -m pip install --quiet --disable-pip-version-check \
        "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION" matplotlib numpy \
        "maturin>=1.5,<2" expecttest >&2
    have_torch || { echo "torch-env: torch $TORCH_VERSION is not importable from $PY" >&2; exit 1; }
fi

TORCH_LIB=$("$PY" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
echo "export LIBTORCH_USE_PYTORCH=1"
echo "export PYTHON=$PY"
echo "export PATH=$VENV/bin:\$PATH"
echo "export LD_LIBRARY_PATH=$TORCH_LIB\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
