#!/usr/bin/env bash
# Configures and builds kcache into DIR (default build/) the developers' way:
# warnings are errors (-DKC_WERROR=ON; a plain cmake build leaves them warnings).
# Extra arguments go to cmake, e.g. scripts/build.sh build-asan -DKC_SANITIZE=ON.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKC_WERROR=ON "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
