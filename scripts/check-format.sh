#!/usr/bin/env bash
# Fails when a C source or header differs from what clang-format makes of it
# with the repository's .clang-format. Fix with: scripts/check-format.sh --fix
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.c' '*.h' 2>/dev/null ||
  find cachecore compiler_stub kernels client server tests bench examples -name '*.[ch]')
if [ "${1:-}" = --fix ]; then
  clang-format -i "${files[@]}"
else
  clang-format --dry-run --Werror "${files[@]}"
  echo "format: ${#files[@]} files match .clang-format"
fi
