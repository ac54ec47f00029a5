#!/usr/bin/env bash
# Builds the ferroccl wheel with maturin, installs it into the PyTorch virtual environment and
# runs the Python tests: the operation sweep, bad input, DDP/FSDP2 against gloo, and PyTorch's
# own distributed suite.
#
#     python/tests/run.sh        # PYTHON names the interpreter (default: scripts/torch-env.sh's)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
if [ -z "${PYTHON:-}" ]; then
  eval "$("$root/scripts/torch-env.sh")"
fi
bin=$(dirname "$PYTHON")

echo "== python: cargo fmt --check, clippy, unit tests (python/ crate)"
(cd "$root/python" && cargo fmt --check &&
  PYO3_PYTHON="$PYTHON" cargo clippy --all-targets --quiet -- -D warnings &&
  PYO3_PYTHON="$PYTHON" cargo test --quiet)

echo "== python: maturin build, pip install"
rm -rf "$root/python/target/wheels"
(cd "$root/python" && "$bin/maturin" build --release --quiet -o target/wheels -i "$PYTHON")
"$PYTHON" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps \
  "$root"/python/target/wheels/ferroccl-*.whl

# From tests/, so that `import ferroccl` finds the installed package, not the source folder.
cd "$here"
export PYTHONWARNINGS=ignore
echo "== python: operations x dtypes x counts, world sizes 2 and 3"
"$PYTHON" test_ops.py
echo "== python: bad input"
"$PYTHON" test_errors.py
echo "== python: the device path (CUDA tensors' path) on the host stand-in provider"
"$PYTHON" test_device.py
echo "== python: the device path again on eager stand-in streams (copies run as early as a GPU could)"
FERRO_STANDIN_EAGER=1 "$PYTHON" test_device.py
echo "== python: the device path over the p2p transport's stand-in, through scratch windows (CUDA tensors of DDP between processes' GPUs)"
FERRO_TRANSPORTS=p2p FERRO_P2P_PROVIDER=host FERRO_DEVICE_SCRATCH_BYTES=4M "$PYTHON" test_device.py
echo "== python: small operations on the calling thread: futures, errors, issue order"
"$PYTHON" test_inline.py
echo "== python: DDP and FSDP2 against gloo"
"$PYTHON" test_train.py
# PyTorch's suite: all of it at world size 2, the CI subset at 3 (FERRO_TORCH_SUITE=full: all
# of it at both).
mkdir -p "$root/target"
for w in 2 3; do
  if [ "$w" = 2 ] || [ "${FERRO_TORCH_SUITE:-ci}" = full ]; then sel=(); what="all tests"; else sel=(--subset ci); what="CI subset"; fi
  echo "== python: PyTorch's distributed_test.py on ferroccl, world size $w, $what"
  log="$root/target/torch-suite-$w.log"
  if ! BACKEND=ferroccl WORLD_SIZE=$w "$PYTHON" torch_suite.py "${sel[@]}" > "$log" 2>&1; then
    grep -a -E "^(SUMMARY|FAILED)" "$log" || tail -n 40 "$log"
    exit 1
  fi
  grep -a -E "^SUMMARY" "$log"
done
