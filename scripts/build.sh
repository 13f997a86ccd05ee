#!/usr/bin/env bash
# Configures and builds one flavour into build/<flavour>: release (default), asan or tsan.
set -euo pipefail
cd "$(dirname "$0")/.."
flavour=${1:-release}
jobs=$(nproc 2>/dev/null || echo 2)
case "$flavour" in
  release) cmake -S . -B build/release -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null ;;
  asan)    cmake -S . -B build/asan -DCMAKE_BUILD_TYPE=Debug -DMT_SANITIZE=ON \
                 -DMT_BUILD_BENCH=OFF >/dev/null ;;
  tsan)    cmake -S . -B build/tsan -DCMAKE_BUILD_TYPE=Debug -DMT_TSAN=ON \
                 -DMT_BUILD_BENCH=OFF >/dev/null ;;
  *) echo "usage: scripts/build.sh [release|asan|tsan]" >&2; exit 2 ;;
esac
cmake --build "build/$flavour" -j"$jobs"
