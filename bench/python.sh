#!/usr/bin/env bash
# bench/python.sh - the kcache Python package against the C API it wraps, side
# by side in one run: a get of a 4 KiB artifact from a local Store (time per
# get; goal: Python at most 2x C) and a 64 MiB get from kcached (bytes/s; goal:
# Python at least 0.8x C). C and Python rounds alternate, so load on the machine
# falls on both; the medians of ROUNDS rounds are compared.
#
#   bench/python.sh [BUILD_DIR]     (ROUNDS=5, N4K=10000 gets, N64M=4 gets a round)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
[[ $BUILD = /* ]] || BUILD=$ROOT/$BUILD
ROUNDS=${ROUNDS:-5} N4K=${N4K:-10000} N64M=${N64M:-4}
PY=/usr/bin/python3
export PYTHONPATH=$BUILD/python
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
for f in "$BUILD/bench/bench_capi" "$BUILD/server/kcached" "$BUILD/python/kcache/__init__.py"; do
    [[ -e $f ]] || { echo "python.sh: $f missing (build $BUILD first)" >&2; exit 1; }
done

"$BUILD/server/kcached" --listen 127.0.0.1:0 --data "$T/srv" --port-file "$T/port" \
    --log-level error >"$T/kcached.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 500); do [[ -s $T/port ]] && break; sleep 0.01; done
URL=http://127.0.0.1:$(cat "$T/port")

# the artifacts: 4 KiB (half random, half compressible, like a small kernel)
# in a local store, 64 MiB of random bytes on the server
read -r K4 K64 < <($PY - "$T/store" "$URL" <<'EOF'
import os, sys, kcache
small = kcache.Store(sys.argv[1]).put(os.urandom(2048) + bytes(2048), kind="cpu-so")
big = kcache.Remote(sys.argv[2], connect_timeout_ms=60000).put(os.urandom(64 << 20), kind="blob")
print(small, big)
EOF
)

py_round() { # store|remote -> the same figure bench_capi prints
    $PY - "$1" "$T/store" "$URL" "$K4" "$K64" "$N4K" "$N64M" <<'EOF'
import sys, time, kcache
mode, store, url, k4, k64, n4k, n64m = sys.argv[1:]
if mode == "store":
    s = kcache.Store(store)
    s.get(k4)
    n = int(n4k)
    t0 = time.perf_counter()
    for _ in range(n):
        s.get(k4)
    print("ns_per_get %.1f" % ((time.perf_counter() - t0) / n * 1e9))
else:
    r = kcache.Remote(url)
    n, total = int(n64m), 0
    t0 = time.perf_counter()
    for _ in range(n):
        total += len(r.get(k64))
    print("bytes_per_s %.0f" % (total / (time.perf_counter() - t0)))
EOF
}

c4=() p4=() c64=() p64=()
for _ in $(seq 1 "$ROUNDS"); do
    c4+=("$("$BUILD/bench/bench_capi" store "$T/store" "$K4" "$N4K" | cut -d' ' -f2)")
    p4+=("$(py_round store | cut -d' ' -f2)")
    c64+=("$("$BUILD/bench/bench_capi" remote "$URL" "$K64" "$N64M" | cut -d' ' -f2)")
    p64+=("$(py_round remote | cut -d' ' -f2)")
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
m_c4=$(median "${c4[@]}") m_p4=$(median "${p4[@]}")
m_c64=$(median "${c64[@]}") m_p64=$(median "${p64[@]}")
mib() { python3 -c "import sys; print(f'{float(sys.argv[1]) / 2**20:.0f}')" "$1"; }
us() { python3 -c "import sys; print(f'{float(sys.argv[1]) / 1000:.2f}')" "$1"; }

echo "kcache Python package vs the C API, medians of $ROUNDS alternating rounds"
echo "(load average $(cut -d' ' -f1-3 /proc/loadavg); per round: $N4K gets of 4 KiB, $N64M gets of 64 MiB)"
echo
echo "| benchmark | python | C API | ratio | goal |"
echo "| --- | --- | --- | --- | --- |"
echo "| Store.get 4 KiB, µs per get (python / C) | $(us "$m_p4") | $(us "$m_c4") | $(ratio "$m_p4" "$m_c4") | <= 2.0 |"
echo "| Remote.get 64 MiB from kcached, MiB/s (python / C) | $(mib "$m_p64") | $(mib "$m_c64") | $(ratio "$m_p64" "$m_c64") | >= 0.8 |"
echo
echo "rounds, C 4 KiB ns: ${c4[*]}"
echo "rounds, Python 4 KiB ns: ${p4[*]}"
echo "rounds, C 64 MiB B/s: ${c64[*]}"
echo "rounds, Python 64 MiB B/s: ${p64[*]}"
