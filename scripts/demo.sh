#!/usr/bin/env bash
# README command (1): the main job, end to end on one machine.
#   a build host runs kcached on loopback and cold-compiles the model zoo
#   with --remote (pushing every artifact); then a fresh CI machine (an empty
#   cache directory) pulls one bundle and compiles warm with zero compiler
#   runs, and checks the results against the reference implementation.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bash scripts/setup.sh
bash scripts/build.sh build

KCACHE=$root/build/client/kcache
KCACHED=$root/build/server/kcached
work=$(mktemp -d /tmp/kcache-demo.XXXXXX)
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill -TERM "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "== starting kcached on 127.0.0.1 (ephemeral port), data in $work/server"
"$KCACHED" --listen 127.0.0.1:0 --port-file "$work/port" --data "$work/server" \
  --max-size 2G --log-level warn >"$work/kcached.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 100); do [ -s "$work/port" ] && break; sleep 0.05; done
[ -s "$work/port" ] || { echo "kcached did not start:"; cat "$work/kcached.log"; exit 1; }
remote="http://127.0.0.1:$(cat "$work/port")"
echo "   listening at $remote"

mapfile -t graphs < <(ls examples/*.json | grep -v manifest)
json_field() { python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }

# Sums one field of the --json summaries of a compile of every graph.
compile_all() {
  local dir=$1; shift
  local total_hits=0 total_kernels=0 total_compiled=0
  for g in "${graphs[@]}"; do
    out=$("$KCACHE" --cache-dir "$dir" --json compile "$g" --device cpu "$@")
    total_hits=$((total_hits + $(echo "$out" | json_field hits)))
    total_kernels=$((total_kernels + $(echo "$out" | json_field kernels)))
    total_compiled=$((total_compiled + $(echo "$out" | json_field compiled)))
  done
  echo "$total_kernels $total_hits $total_compiled"
}
now() { date +%s.%N; }
elapsed() { python3 -c "print(f'{$2 - $1:.3f}')"; }

echo "== build host: cold compile of ${#graphs[@]} graphs, pushing to the server"
t0=$(now); read -r cold_kernels _ cold_compiled < <(compile_all "$work/host" --remote "$remote"); t1=$(now)
cold=$(elapsed "$t0" "$t1")

echo "== fresh CI machine: kcache pull"
t0=$(now); "$KCACHE" --cache-dir "$work/ci" --remote "$remote" pull; t1=$(now)
pull=$(elapsed "$t0" "$t1")

echo "== fresh CI machine: warm compile (offline: the local cache must have it all)"
t0=$(now); read -r warm_kernels warm_hits warm_compiled < <(compile_all "$work/ci" --offline --require-hit); t1=$(now)
warm=$(elapsed "$t0" "$t1")

echo "== fresh CI machine: kcache run --check on every graph"
for g in "${graphs[@]}"; do "$KCACHE" --cache-dir "$work/ci" -q run "$g" --check --offline; done

python3 - "$cold" "$pull" "$warm" "$cold_kernels" "$cold_compiled" "$warm_kernels" "$warm_hits" "$warm_compiled" <<'PY'
import sys
cold, pull, warm = map(float, sys.argv[1:4])
ck, cc, wk, wh, wc = map(int, sys.argv[4:9])
print()
print(f"{'step':<34}{'seconds':>10}  notes")
print(f"{'cold compile (build host)':<34}{cold:>10.3f}  {ck} kernels, {cc} compiler runs")
print(f"{'kcache pull (fresh machine)':<34}{pull:>10.3f}")
print(f"{'warm compile (fresh machine)':<34}{warm:>10.3f}  {wh}/{wk} hits, {wc} compiler runs")
print(f"{'speed-up cold / warm':<34}{cold / max(warm, 1e-9):>10.1f}x")
print(f"{'speed-up cold / (pull + warm)':<34}{cold / max(pull + warm, 1e-9):>10.1f}x")
if wc != 0 or wh != wk:
    sys.exit("warm compile was not all hits")
PY
