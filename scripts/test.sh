#!/usr/bin/env bash
# README command (2): set up, build, and run the whole test suite twice: a
# normal -Werror build, then an AddressSanitizer + UBSan build. Between them,
# the packagers' builds (Release, Debian's hardening flags) are built, not run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash tests/s3/install.sh
bash scripts/check-format.sh
bash scripts/check-standalone.sh
bash docs/check-index.sh
bash scripts/build.sh build
# every header and library the build used comes from a package setup.sh installs
bash scripts/check-deps.sh build
bash scripts/check-deps.sh --self-test build
# the builds packagers make, -Werror on, so neither breaks again (about 2 min of CPU)
bash scripts/build-packagers.sh build-pkg
(cd build && ctest --output-on-failure -j2)
# ONNX conformance (docs/CONFORMANCE.md has the last full report): every
# libonnx-testdata model through `kcache run --data`, one shared cache in the
# build directory so repeated kernels hit (measured: 4m49s cold on a loaded
# 2-core VM, 56 s warm); fails when fewer pytorch-* models pass than the floor
# recorded in the script.
timeout 900 /usr/bin/python3 tests/onnx/conformance.py --kcache build/client/kcache \
  --cache-dir build/onnx-conformance-cache --out build/CONFORMANCE.md --jobs 2
bash deploy/check.sh build
bash docs/check-guide.sh build
if [ "${KC_SKIP_SANITIZE:-0}" != 1 ]; then
  bash scripts/build.sh build-asan -DKC_SANITIZE=ON
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  (cd build-asan && ctest --output-on-failure -j2)
fi
[ "${KC_SKIP_FUZZ:-0}" = 1 ] || bash scripts/fuzz.sh
