#!/usr/bin/env bash
# Configures and builds kcache into DIR (default build/). Extra arguments go
# to cmake, e.g. scripts/build.sh build-asan -DKC_SANITIZE=ON.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
