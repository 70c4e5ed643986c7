#!/usr/bin/env bash
# bench/server.sh - kcached against nginx (the anchor) on loopback, same wrk
# settings, same run: GET req/s for 4 KiB artifacts, GET bytes/s for 4 MiB
# artifacts (compressible and incompressible payloads; identity and
# Accept-Encoding: zstd clients; server RSS sampled throughout), PUT rate,
# and start-up time + RSS with ENTRIES (default 1M) entries. Prints a
# Markdown table. No assertions: the numbers are the result.
#
#   bench/server.sh [BUILD_DIR]       (default: build)
#   env: THREADS (server threads = nginx workers, default nproc), CONNS (64),
#        DURATION (5s), ROUNDS (3, median reported), WRK_THREADS (2), ENTRIES (1000000), N4K (2000), N4M (32),
#        MEMCACHE (256M), FILL_DIR (reuse a store filled by `bench_server fill FILL_DIR/store N > FILL_DIR/probe.txt`)
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$SRC/build}
KCACHED=$BUILD/server/kcached
BENCH=$BUILD/bench/bench_server
THREADS=${THREADS:-$(nproc)}
CONNS=${CONNS:-64}
DURATION=${DURATION:-5s}
ROUNDS=${ROUNDS:-3}
WRK_THREADS=${WRK_THREADS:-2}
ENTRIES=${ENTRIES:-1000000}
N4K=${N4K:-2000}
N4M=${N4M:-32}
MEMCACHE=${MEMCACHE:-256M} # kcached --memory-cache: holds the hot set, as the page cache does for nginx
for b in "$KCACHED" "$BENCH"; do [[ -x $b ]] || { echo "missing $b (build it first)" >&2; exit 1; }; done
command -v wrk >/dev/null || { echo "wrk not installed" >&2; exit 1; }

T=$(mktemp -d /tmp/kcbench.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    rm -rf "$T"
}
trap cleanup EXIT

wait_port_file() { # FILE PID
    for _ in $(seq 1 3000); do
        [[ -s $1 ]] && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.01
    done
    return 1
}

start_kcached() { # DATA_DIR -> sets KPORT KPID
    rm -f "$T/kport"
    "$KCACHED" --listen 127.0.0.1:0 --data "$1" --port-file "$T/kport" --threads "$THREADS" \
        --log-level warn --max-blob 64M --memory-cache "$MEMCACHE" >"$T/kcached.out" 2>"$T/kcached.err" &
    KPID=$!
    PIDS+=("$KPID")
    wait_port_file "$T/kport" "$KPID" || { cat "$T/kcached.err" >&2; exit 1; }
    KPORT=$(cat "$T/kport")
}

stop_kcached() { kill "$KPID"; wait "$KPID" || true; }

# shellcheck source=bench/nginx.sh
source "$SRC/bench/nginx.sh"

# wrk over a list of paths (one per line), round robin.
cat >"$T/paths.lua" <<'LUA'
local paths = {}
for line in io.lines(os.getenv("KC_PATHS")) do paths[#paths + 1] = line end
local ae = os.getenv("KC_AE")
if ae and ae ~= "" then wrk.headers["Accept-Encoding"] = ae end
-- as the kcache client: pack ranges go out with sendfile or from a mapping
wrk.headers["User-Agent"] = "kcache/bench"
local i = math.random(#paths)
request = function()
    i = i % #paths + 1
    return wrk.format("GET", paths[i])
end
LUA
cat >"$T/put.lua" <<'LUA'
local counter = 0
function setup(thread)
    counter = counter + 1
    thread:set("tid", counter)
end
local n = 0
local body = string.rep("x", 4000)
request = function()
    n = n + 1
    local id = tostring(tid) .. "-" .. tostring(n)
    return wrk.format("PUT", "/ccache/bench/" .. id, nil, string.format("%-96s", id) .. body)
end
LUA

# run_wrk URL PATHS_FILE -> "req/s bytes/s" (KC_AE: an Accept-Encoding header)
run_wrk() {
    local out
    out=$(KC_AE="${KC_AE:-}" KC_PATHS="$2" wrk -t"$WRK_THREADS" -c"$CONNS" -d"$DURATION" --latency -s "$T/paths.lua" "$1" 2>&1)
    local rps bps non2xx
    rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
    bps=$(awk '/Transfer\/sec/ {v=$2; u=substr(v,length(v)-1); n=v+0;
        if (u=="KB") n*=1024; else if (u=="MB") n*=1048576; else if (u=="GB") n*=1073741824; print n}' <<<"$out")
    non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
    [[ -z $non2xx ]] || echo "warning: $non2xx non-2xx responses" >&2
    echo "$rps $bps"
}

mkdir -p "$T/www" "$T/store"
echo "populating: $N4K x 4 KiB, $N4M x 4 MiB (store API + files for nginx)..." >&2
"$BENCH" populate "$T/store" "$T/www" "$N4K" 4096 >"$T/keys4k"
"$BENCH" populate "$T/store" "$T/www" "$N4M" 4194304 >"$T/keys4m"
sed 's|^|/v1/artifacts/|' "$T/keys4k" >"$T/k4k"
sed 's|^|/|' "$T/keys4k" >"$T/n4k"
sed 's|^|/v1/artifacts/|' "$T/keys4m" >"$T/k4m"
sed 's|^|/|' "$T/keys4m" >"$T/n4m"
"$BENCH" populate "$T/store" "$T/www" "$N4M" 4194304 random >"$T/keys4r"
sed 's|^|/v1/artifacts/|' "$T/keys4r" >"$T/k4r"
sed 's|^|/|' "$T/keys4r" >"$T/n4r"
env4m=$(stat -c %s "$T/www/$(head -1 "$T/keys4m")")

chmod 755 "$T" && chmod -R a+rX "$T/www" # nginx workers may run as another user
start_kcached "$T/store"
start_nginx
# Sanity: both serve identical bytes.
k1=$(head -1 "$T/keys4k")
cmp <(curl -s "http://127.0.0.1:$KPORT/v1/artifacts/$k1") <(curl -s "http://127.0.0.1:$NPORT/$k1") ||
    { echo "kcached and nginx disagree on $k1" >&2; exit 1; }

echo "wrk -t$WRK_THREADS -c$CONNS -d$DURATION, $THREADS server threads / nginx workers" >&2
# Warm both, then alternate so background load hits both alike.
run_wrk "http://127.0.0.1:$KPORT" "$T/k4k" >/dev/null
run_wrk "http://127.0.0.1:$NPORT" "$T/n4k" >/dev/null
# ROUNDS interleaved runs each; the median counts (the load on a shared
# machine moves between runs).
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
measure() { # KPATHS NPATHS -> sets k_rps k_bps n_rps n_bps (medians)
    local kr=() kb=() nr=() nb=() r b
    for _ in $(seq 1 "$ROUNDS"); do
        read -r r b < <(run_wrk "http://127.0.0.1:$KPORT" "$1"); kr+=("$r"); kb+=("$b")
        read -r r b < <(run_wrk "http://127.0.0.1:$NPORT" "$2"); nr+=("$r"); nb+=("$b")
    done
    k_rps=$(printf '%s\n' "${kr[@]}" | median); k_bps=$(printf '%s\n' "${kb[@]}" | median)
    n_rps=$(printf '%s\n' "${nr[@]}" | median); n_bps=$(printf '%s\n' "${nb[@]}" | median)
    echo "  kcached req/s: ${kr[*]}; nginx req/s: ${nr[*]}" >&2
}
measure "$T/k4k" "$T/n4k"
k4_rps=$k_rps n4_rps=$n_rps
# Server memory sampled every 0.2 s while the 4 MiB runs go: RssAnon (its
# own memory; flat = no payload-sized buffers per request) and VmRSS, which
# also counts shared pages it has mapped: the memory cache's memfds and the
# pack ranges mapped while they are sent to local clients.
rss_sampler() { while kill -0 "$KPID" 2>/dev/null; do awk '/VmRSS|RssAnon/ {printf "%s ", $2} END {print ""}' "/proc/$KPID/status" 2>/dev/null; sleep 0.2; done >"$T/rss4m"; }
anon_kib() { awk '/RssAnon/ {print $2}' "/proc/$KPID/status"; }
mib_range() { # COLUMN: min-max of the samples, MiB
    awk -v c="$1" 'NF >= 2 {print $c}' "$T/rss4m" | sort -n | awk 'NR==1 {lo=$1} {hi=$1} END {printf "%.1f-%.1f", lo/1024, hi/1024}'
}
run_wrk "http://127.0.0.1:$KPORT" "$T/k4m" >/dev/null # warm-up: fills the memory cache
run_wrk "http://127.0.0.1:$NPORT" "$T/n4m" >/dev/null
rss_sampler & RSSPID=$!
PIDS+=("$RSSPID")
rss_before=$(anon_kib)
measure "$T/k4m" "$T/n4m"
k4m_bps=$k_bps n4m_bps=$n_bps
# Accept-Encoding: zstd: kcached sends the stored frame (about half the
# bytes here), nginx the file; compared on envelope bytes delivered per
# second (req/s x envelope size), wire bytes reported beside.
export KC_AE=zstd
measure "$T/k4m" "$T/n4m"
k4mz_rps=$k_rps k4mz_wire=$k_bps n4mz_bps=$n_bps
unset KC_AE
# Incompressible payloads (stored raw): both encodings get the envelope
# straight from the pack file.
run_wrk "http://127.0.0.1:$KPORT" "$T/k4r" >/dev/null
run_wrk "http://127.0.0.1:$NPORT" "$T/n4r" >/dev/null
measure "$T/k4r" "$T/n4r"
k4r_bps=$k_bps n4r_bps=$n_bps
export KC_AE=zstd
measure "$T/k4r" "$T/n4r"
k4rz_bps=$k_bps n4rz_bps=$n_bps
unset KC_AE
rss_after=$(anon_kib)
kill "$RSSPID" 2>/dev/null; wait "$RSSPID" 2>/dev/null || true
vmrss_range=$(mib_range 1)
rss_range=$(mib_range 2)

put_out=$(wrk -t"$WRK_THREADS" -c"$CONNS" -d"$DURATION" -s "$T/put.lua" "http://127.0.0.1:$KPORT" 2>&1)
put_rps=$(awk '/Requests\/sec/ {print $2}' <<<"$put_out")
put_non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$put_out")
rss_loaded=$(anon_kib)
memcache=$(curl -s "http://127.0.0.1:$KPORT/metrics" | awk '/^kcached_memory_cache_bytes/ {print $2}')
stop_kcached

if [[ -n ${FILL_DIR:-} && -s $FILL_DIR/probe.txt && -d $FILL_DIR/store ]]; then
    BIG=$FILL_DIR/store
    probe=$(head -1 "$FILL_DIR/probe.txt")
    fill_note="store reused from $FILL_DIR (filled earlier by: bench_server fill DIR/store N > DIR/probe.txt)"
else
    echo "filling a store with $ENTRIES entries through the store API..." >&2
    BIG=$T/big
    fill_t0=$(date +%s.%N)
    probe=$("$BENCH" fill "$BIG" "$ENTRIES" | head -1)
    fill_t1=$(date +%s.%N)
    fill_note="$ENTRIES-entry fill through kc_store_put took $(awk -v a="$fill_t0" -v b="$fill_t1" 'BEGIN{printf "%.0f", b-a}') s"
fi
sync
t0=$(date +%s.%N)
start_kcached "$BIG"
t1=$(date +%s.%N)
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$KPORT/v1/artifacts/$probe")
t2=$(date +%s.%N)
rss_start=$(awk '/VmRSS/ {print $2}' "/proc/$KPID/status")
ENTRIES=$(curl -s "http://127.0.0.1:$KPORT/v1/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["store"]["entries"])')
stop_kcached

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
mib() { awk -v a="$1" 'BEGIN { printf "%.0f", a / 1048576 }'; }
cat <<TABLE

| benchmark | kcached | anchor (nginx static files) | ratio | goal |
| --- | --- | --- | --- | --- |
| GET 4 KiB artifacts, req/s | $k4_rps | $n4_rps | $(ratio "$k4_rps" "$n4_rps") | >= 1.0 |
| GET 4 MiB artifacts, MiB/s | $(mib "$k4m_bps") | $(mib "$n4m_bps") | $(ratio "$k4m_bps" "$n4m_bps") | >= 1.0 |
| GET 4 MiB, Accept-Encoding: zstd, envelope MiB/s (wire MiB/s) | $(mib "$(awk -v r="$k4mz_rps" -v s="$env4m" 'BEGIN{print r*s}')") ($(mib "$k4mz_wire")) | $(mib "$n4mz_bps") | $(ratio "$(awk -v r="$k4mz_rps" -v s="$env4m" 'BEGIN{print r*s}')" "$n4mz_bps") | >= 1.0 |
| GET 4 MiB incompressible (stored raw), MiB/s | $(mib "$k4r_bps") | $(mib "$n4r_bps") | $(ratio "$k4r_bps" "$n4r_bps") | >= 1.0 |
| GET 4 MiB incompressible, Accept-Encoding: zstd, MiB/s | $(mib "$k4rz_bps") | $(mib "$n4rz_bps") | $(ratio "$k4rz_bps" "$n4rz_bps") | >= 1.0 |
| server RssAnon during the 4 MiB runs, MiB (min-max of 0.2 s samples; before / after) | $rss_range ($(awk -v k="$rss_before" 'BEGIN{printf "%.1f", k/1024}') / $(awk -v k="$rss_after" 'BEGIN{printf "%.1f", k/1024}')) | - | - | flat |
| server VmRSS during the 4 MiB runs, MiB (min-max; adds mapped shared pages: memory cache, pack ranges in flight) | $vmrss_range | - | - | - |
| PUT 4 KiB blobs (/ccache), req/s | $put_rps${put_non2xx:+ ($put_non2xx non-2xx)} | - | - | - |
| RssAnon after the runs above, MiB (+ memory cache, MiB: its bodies from 256 KiB sit in memfds, outside RssAnon) | $(awk -v k="$rss_loaded" 'BEGIN{printf "%.1f", k/1024}') (+ $(mib "${memcache:-0}")) | - | - | bounded |
| start-up with $ENTRIES entries, s (exec to listening) | $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b-a}') | - | - | < 1 |
| first GET after start-up (HTTP $code), s | $(awk -v a="$t1" -v b="$t2" 'BEGIN{printf "%.3f", b-a}') | - | - | - |
| RSS after start-up with $ENTRIES entries, MiB | $(awk -v k="$rss_start" 'BEGIN{printf "%.1f", k/1024}') | - | - | bounded |

wrk -t$WRK_THREADS -c$CONNS -d$DURATION, median of $ROUNDS interleaved runs; $THREADS kcached threads, $THREADS nginx workers; $(nproc) CPUs.
($fill_note.)
TABLE
