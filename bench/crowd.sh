#!/usr/bin/env bash
# bench/crowd.sh - a crowd of CI machines against one kcached, beside nginx
# serving the same bytes as a file, same concurrency, same run: CONNS (64)
# concurrent GET /v1/bundle streams of the model-zoo bundle (bench_crowd:
# aggregate bytes/s, p99 time to first byte, failures) and PULLS (16)
# concurrent `kcache pull` into fresh cache directories (against PULLS
# concurrent curl downloads of the file), with kcached's peak RSS. The zoo is
# compiled once by `kcache prewarm examples/manifest.json --push`. Prints a
# Markdown table; asserts nothing.
#
#   bench/crowd.sh [BUILD_DIR]        (default: build)
#   env: CONNS (64), PULLS (16), DURATION (10 s per side), ROUNDS (3 pull
#        rounds, median), THREADS (kcached threads = nginx workers, default nproc)
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$SRC/build}
KCACHED=$BUILD/server/kcached
KCACHE=$BUILD/client/kcache
CROWD=$BUILD/bench/bench_crowd
CONNS=${CONNS:-64}
PULLS=${PULLS:-16}
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-$(nproc)}
for b in "$KCACHED" "$KCACHE" "$CROWD"; do [[ -x $b ]] || { echo "missing $b (build it first)" >&2; exit 1; }; done

T=$(mktemp -d /tmp/kccrowd.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    rm -rf "$T"
}
trap cleanup EXIT

"$KCACHED" --listen 127.0.0.1:0 --data "$T/server" --port-file "$T/kport" --threads "$THREADS" \
    --log-level warn >"$T/kcached.out" 2>"$T/kcached.err" &
KPID=$!
PIDS+=("$KPID")
for _ in $(seq 1 3000); do [[ -s $T/kport ]] && break; kill -0 "$KPID" || { cat "$T/kcached.err" >&2; exit 1; }; sleep 0.01; done
KURL=http://127.0.0.1:$(cat "$T/kport")

echo "compiling the model zoo (kcache prewarm --push)..." >&2
"$KCACHE" --cache-dir "$T/build-host" --remote "$KURL" -q prewarm "$SRC/examples/manifest.json" --push >&2
mkdir -p "$T/www"
curl -sf -o "$T/www/bundle" "$KURL/v1/bundle"
size=$(stat -c %s "$T/www/bundle")
chmod 755 "$T" && chmod -R a+rX "$T/www"

# shellcheck source=bench/nginx.sh
source "$SRC/bench/nginx.sh"
start_nginx
NURL=http://127.0.0.1:$NPORT
cmp <(curl -s "$KURL/v1/bundle") "$T/www/bundle" >/dev/null 2>&1 ||
    echo "note: the bundle stream differs between requests (order), sizes compared" >&2

# field NAME LINE -> value of NAME=... in a bench_crowd line
field() { tr ' ' '\n' <<<"$2" | sed -n "s/^$1=//p"; }

echo "$CONNS concurrent GET /v1/bundle streams, ${DURATION} s each side..." >&2
k=$("$CROWD" "$KURL/v1/bundle" "$CONNS" "$DURATION")
n=$("$CROWD" "$NURL/bundle" "$CONNS" "$DURATION" "$size")

# PULLS concurrent pulls into fresh directories vs PULLS concurrent curls.
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
pull_fail=0 curl_fail=0 kt=() nt=()
for r in $(seq 1 "$ROUNDS"); do
    t0=$(date +%s.%N)
    pids=()
    for i in $(seq 1 "$PULLS"); do
        "$KCACHE" --cache-dir "$T/pull-$r-$i" --remote "$KURL" -q pull --device all >/dev/null 2>"$T/pull-$r-$i.err" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || pull_fail=$((pull_fail + 1)); done
    t1=$(date +%s.%N)
    kt+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')")
    t0=$(date +%s.%N)
    pids=()
    for i in $(seq 1 "$PULLS"); do
        curl -sf -o "$T/dl-$r-$i" "$NURL/bundle" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || curl_fail=$((curl_fail + 1)); done
    t1=$(date +%s.%N)
    nt+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')")
    rm -rf "$T"/pull-"$r"-* "$T"/dl-"$r"-*
done
kpull=$(printf '%s\n' "${kt[@]}" | median)
npull=$(printf '%s\n' "${nt[@]}" | median)
peak=$(awk '/VmHWM/ {printf "%.1f", $2/1024}' "/proc/$KPID/status")
rss=$(awk '/VmRSS/ {printf "%.1f", $2/1024}' "/proc/$KPID/status")

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
mib() { awk -v a="$1" 'BEGIN { printf "%.1f", a / 1048576 }'; }
kb=$(field bytes_per_s "$k") nb=$(field bytes_per_s "$n")
cat <<TABLE

| crowd benchmark | kcached | anchor (nginx, the bundle as a file) | ratio | goal |
| --- | --- | --- | --- | --- |
| $CONNS concurrent GET /v1/bundle, aggregate MiB/s | $(mib "$kb") | $(mib "$nb") | $(ratio "$kb" "$nb") | >= 0.8 |
| transfers in ${DURATION} s (failures) | $(field transfers "$k") ($(field failures "$k")) | $(field transfers "$n") ($(field failures "$n")) | - | 0 failures |
| time to first byte p50 / p99, ms | $(field ttfb_p50_ms "$k") / $(field ttfb_p99_ms "$k") | $(field ttfb_p50_ms "$n") / $(field ttfb_p99_ms "$n") | - | - |
| whole transfer p99, ms | $(field total_p99_ms "$k") | $(field total_p99_ms "$n") | - | - |
| $PULLS concurrent \`kcache pull\` into fresh dirs vs $PULLS curl -o, s (median of $ROUNDS) | $kpull | $npull | $(ratio "$npull" "$kpull") | - |
| failed pulls / curls | $pull_fail | $curl_fail | - | 0 |
| kcached peak RSS (VmHWM) / RSS at the end, MiB | $peak / $rss | - | - | < 256 |

Bundle: the model zoo (examples/manifest.json, every graph x target) compiled by \`kcache prewarm --push\`, $size bytes; $THREADS kcached threads, $THREADS nginx workers; $(nproc) CPUs. The pull ratio is curl's time over kcache's (pull also verifies and stores every artifact).
TABLE
