#!/usr/bin/env bash
# Builds ferroccl's NCCL-compatible C library: $TARGET/<profile>/libnccl.so.2 (soname
# libnccl.so.2) with a libnccl.so symlink; the header is include/nccl.h.
#   scripts/build-capi.sh            release build (target/release)
#   PROFILE=dev scripts/build-capi.sh   debug build (target/debug)
# Link C programs with: gcc -I include prog.c -L target/release -lnccl
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${PROFILE:-release}
target=${CARGO_TARGET_DIR:-target}
case "$profile" in
  dev) dir="$target/debug" ;;
  *) dir="$target/$profile" ;;
esac
# The soname makes programs linked against it load libnccl.so.2.
cargo rustc -p ferroccl --profile "$profile" --features capi --lib --crate-type cdylib --quiet \
  -- -C link-arg=-Wl,-soname,libnccl.so.2
cp -f "$dir/libferroccl.so" "$dir/libnccl.so.2"
ln -sfn libnccl.so.2 "$dir/libnccl.so"
echo "$dir/libnccl.so.2"
