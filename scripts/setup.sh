#!/usr/bin/env bash
# Installs what building and testing ferroccl needs on a fresh Debian 12 machine (as root),
# then checks the Rust toolchain. Safe to run again.
set -euo pipefail

need_pkgs=()
command -v ip >/dev/null 2>&1 || need_pkgs+=(iproute2)
command -v cc >/dev/null 2>&1 || need_pkgs+=(gcc)
command -v pkg-config >/dev/null 2>&1 || need_pkgs+=(pkg-config)
# A private one-node SLURM cluster for the srun test (scripts/slurm-local.sh).
{ command -v srun && PATH=$PATH:/usr/sbin command -v slurmd; } >/dev/null 2>&1 || need_pkgs+=(slurm-wlm)
PATH=$PATH:/usr/sbin command -v munged >/dev/null 2>&1 || need_pkgs+=(munge)
# python3 with venv: NVRTC and PyTorch come from PyPI wheels in virtual environments.
command -v python3 >/dev/null 2>&1 || need_pkgs+=(python3)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need_pkgs+=(python3-venv)
# libpython for the python/ crate's unit tests.
dpkg -s libpython3-dev >/dev/null 2>&1 || need_pkgs+=(libpython3-dev)
if [ "${#need_pkgs[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
  else
    echo "setup: please install: ${need_pkgs[*]} (needs root)" >&2
  fi
fi

if ! command -v cargo >/dev/null 2>&1; then
  [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install Rust (rustup) first" >&2
  exit 1
fi
if command -v rustup >/dev/null 2>&1; then
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt || true
fi
cargo --version
# NVRTC (CUDA 12 and 13, PyPI wheels; no GPU needed) for the kernel compile test.
"$(dirname "$0")/nvrtc-env.sh" >/dev/null
