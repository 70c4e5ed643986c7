#!/usr/bin/env bash
# README command (1): the main job, end to end on one machine.
#   a build host runs kcached on loopback and cold-compiles the model zoo
#   with --remote (pushing every artifact); then a fresh CI machine (an empty
#   cache directory) pulls one bundle and compiles warm with zero compiler
#   runs, and checks the results against the reference implementation. The
#   zoo is joined by a GPT-2-small-shaped ONNX model (DEMO_ONNX=0: zoo only).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bash scripts/setup.sh
# only what the job runs; scripts/test.sh builds the rest
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target kcache kcached

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
# and a GPT-2-small-shaped ONNX model (12 layers, d=768, seq 128, random
# weights, ~500 MB) through the same server; DEMO_ONNX=0 leaves it out
if [ "${DEMO_ONNX:-1}" = 1 ]; then
  echo "== writing a GPT-2-small-shaped ONNX model (examples/gen_onnx_models.py)"
  /usr/bin/python3 examples/gen_onnx_models.py "$work/onnx" | sed 's/^/   /'
  graphs+=("$work/onnx/gpt2_small.onnx")
fi

# Compiles every graph into cache dir $1 in one kcache process (extra
# arguments go to compile), writing one --json summary per graph to file $2.
compile_all() {
  local dir=$1 out=$2; shift 2
  "$KCACHE" --cache-dir "$dir" --json compile "${graphs[@]}" --device cpu "$@" >"$out"
}
now() { date +%s.%N; }
elapsed() { python3 -c "print(f'{$2 - $1:.3f}')"; }

echo "== build host: cold compile of ${#graphs[@]} graphs, pushing to the server"
t0=$(now); compile_all "$work/host" "$work/cold.jsonl" --remote "$remote"; t1=$(now)
cold=$(elapsed "$t0" "$t1")

echo "== fresh CI machine: kcache pull"
t0=$(now); "$KCACHE" --cache-dir "$work/ci" --remote "$remote" pull; t1=$(now)
pull=$(elapsed "$t0" "$t1")

echo "== fresh CI machine: warm compile (offline: the local cache must have it all)"
t0=$(now); compile_all "$work/ci" "$work/warm.jsonl" --offline --require-hit; t1=$(now)
warm=$(elapsed "$t0" "$t1")

echo "== fresh CI machine: kcache run --check on every graph of the zoo"
# (the ONNX model's extended ops have no reference implementation: ONNX ops
# are checked against ONNX test data by tests/onnx/conformance.py)
for g in "${graphs[@]}"; do
  case $g in *.onnx) continue ;; esac
  "$KCACHE" --cache-dir "$work/ci" -q run "$g" --check --offline
done

python3 - "$cold" "$pull" "$warm" "$work/cold.jsonl" "$work/warm.jsonl" <<'PY'
import json, sys
cold, pull, warm = map(float, sys.argv[1:4])
def totals(path):
    runs = [json.loads(line) for line in open(path)]
    return (sum(r["kernels"] for r in runs), sum(r["hits"] for r in runs),
            sum(r["compiled"] for r in runs))
ck, _, cc = totals(sys.argv[4])
wk, wh, wc = totals(sys.argv[5])
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
