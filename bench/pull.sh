#!/usr/bin/env bash
# pull.sh - the pull benchmark with the model zoo: bench_pull's synthetic
# bundle (pull vs plain curl), then the "fresh machine" case on every graph of
# examples/ (cold compile vs pull + warm compile) and the zoo's own bundle.
# Usage: bench/pull.sh [BUILD_DIR] [bench_pull options, e.g. --artifacts 2000]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
shift || true
graphs=()
for g in "$ROOT"/examples/*.json; do
  case "$(basename "$g")" in manifest*.json) continue ;; esac
  graphs+=(--graph "$g")
done
exec "$BUILD/bench/bench_pull" --kcached "$BUILD/server/kcached" --kcache "$BUILD/client/kcache" \
  "${graphs[@]}" "$@"
