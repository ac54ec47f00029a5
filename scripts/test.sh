#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests, doctests, and the multi-rank
# integration tests (threads, processes, network namespaces; the latter need root).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy --all-targets -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== cargo test (unit, integration and doctests)"
cargo test --workspace --no-fail-fast "$@"
