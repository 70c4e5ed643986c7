#!/usr/bin/env bash
# fuzz.sh - builds kcache's libFuzzer targets (clang-14, -fsanitize=fuzzer,
# address,undefined) in build-fuzz/ and runs each for a bounded time from the
# seed corpus in tests/fuzz/corpus/<target>/. Exits non-zero on any crash,
# leak, timeout or sanitizer report; crash inputs land in build-fuzz/fuzz-crashes/.
#
# Environment: FUZZ_SECONDS (per target, default 30; 0 = only replay the
# seeds), FUZZ_TARGETS (space-separated subset), FUZZ_JOBS (targets run at
# once, default nproc), FUZZ_BUILD_DIR (default build-fuzz), FUZZ_CC.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-30}
jobs=${FUZZ_JOBS:-$(nproc)}
dir=${FUZZ_BUILD_DIR:-build-fuzz}
cc=${FUZZ_CC:-clang-14}

# -Werror stays with the gcc builds; clang-only warnings in other modules
# must not hide fuzz results.
cmake -S . -B "$dir" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKC_FUZZ=ON -DKC_TESTS=ON -DKC_WERROR=OFF >/dev/null
cmake --build "$dir" -j"$jobs" --target ${FUZZ_TARGETS:-kc_fuzz} >"$dir/fuzz-build.log" 2>&1 || {
  tail -n 40 "$dir/fuzz-build.log"
  echo "fuzz: build failed (log: $dir/fuzz-build.log)" >&2
  exit 1
}

mapfile -t all < <(grep -v '^$' "$dir/tests/fuzz/fuzz_targets.txt")
targets=(${FUZZ_TARGETS:-${all[@]}})
mkdir -p "$dir/fuzz-logs" "$dir/fuzz-crashes" "$dir/fuzz-corpus"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# Scratch stores and files go to tmpfs when there is one: on a disk with
# online discard every deleted file costs milliseconds.
scratch=$(mktemp -d /dev/shm/kcfuzz.XXXXXX 2>/dev/null || mktemp -d "$PWD/$dir/fuzz-tmp.XXXXXX")
export TMPDIR=$scratch
trap 'rm -rf "$scratch"' EXIT

run_one() {
  local t=$1 bin=$dir/tests/fuzz/$1 seeds=tests/fuzz/corpus/$1 work=$dir/fuzz-corpus/$1
  mkdir -p "$work" "$seeds"
  local args=(-timeout=25 -rss_limit_mb=2048 -dict=tests/fuzz/fuzz.dict -print_final_stats=1
    -artifact_prefix="$dir/fuzz-crashes/$t-")
  if [ "$secs" = 0 ]; then
    "$bin" "${args[@]}" -runs=0 "$seeds" >"$dir/fuzz-logs/$t.log" 2>&1
  else
    "$bin" "${args[@]}" -max_total_time="$secs" "$work" "$seeds" >"$dir/fuzz-logs/$t.log" 2>&1
  fi
}

declare -A pid_of
for t in "${targets[@]}"; do
  [ -x "$dir/tests/fuzz/$t" ] || { echo "fuzz: no target $t" >&2; exit 1; }
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  run_one "$t" &
  pid_of[$t]=$!
done

failed=0
printf '%-16s %-8s %12s %10s\n' target result execs corpus
for t in "${targets[@]}"; do
  rc=0
  wait "${pid_of[$t]}" || rc=$?
  log=$dir/fuzz-logs/$t.log
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
  units=$(ls "$dir/fuzz-corpus/$t" 2>/dev/null | wc -l)
  if [ "$rc" = 0 ]; then
    printf '%-16s %-8s %12s %10s\n' "$t" ok "${execs:-?}" "$units"
  else
    printf '%-16s %-8s %12s %10s\n' "$t" "FAIL($rc)" "${execs:-?}" "$units"
    failed=1
  fi
done
if [ "$failed" != 0 ]; then
  for t in "${targets[@]}"; do
    log=$dir/fuzz-logs/$t.log
    if grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|property broken|SUMMARY:' "$log"; then
      echo "---- $t ($log) ----" >&2
      grep -nE 'ERROR:|runtime error:|property broken|SUMMARY:|Test unit written|#[0-9]+ 0x' "$log" | head -n 30 >&2
    fi
  done
  echo "fuzz: FAILED; crash inputs: $(ls "$dir"/fuzz-crashes | tr '\n' ' ')" >&2
  exit 1
fi
echo "fuzz: all ${#targets[@]} targets clean (${secs}s each)"
