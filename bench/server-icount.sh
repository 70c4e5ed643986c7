#!/usr/bin/env bash
# bench/server-icount.sh - instructions kcached executes per request
# (valgrind's callgrind), for comparing builds on a machine too busy for
# wall-clock figures: one kcached thread, a warm-up, then the counters are
# zeroed (callgrind_control -z), N requests of one kind are sent over one
# kept-alive connection and the counters dumped (callgrind_control -d).
# Prints a Markdown table with one column per build; no assertions.
#
#   bench/server-icount.sh [BUILD_DIR...]      (default: build)
#   env: N (requests per kind, default 2000), WARM (200)
# With two builds (a base, then a candidate) a last column gives
# candidate / base.
# Kinds: HTTP GET of a 4 KiB artifact from the memory cache, from the store
# (--memory-cache 0), as its stored zstd frame; Redis GET and SET of 4 KiB.
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
N=${N:-2000}
WARM=${WARM:-200}
BUILDS=("$@")
[[ ${#BUILDS[@]} -gt 0 ]] || BUILDS=("$SRC/build")
# shellcheck source=bench/lib.sh
. "$SRC/bench/lib.sh"
bench_need valgrind callgrind_control curl redis-benchmark redis-cli
for b in "${BUILDS[@]}"; do
    [[ -x $b/server/kcached && -x $b/bench/bench_server ]] ||
        { echo "missing $b/server/kcached or $b/bench/bench_server (build them first)" >&2; exit 1; }
done

# One store of 4 KiB artifacts, copied for every run (same bytes everywhere).
mkdir -p "$T/www"
"${BUILDS[0]}/bench/bench_server" populate "$T/store" "$T/www" 16 4096 >"$T/keys"
KEY=$(head -1 "$T/keys")

# start_kcached BUILD MEMCACHE -> KPID KPORT RPORT (kcached under callgrind)
start_kcached() {
    rm -rf "$T/run" "$T/kport" "$T/rport" "$T"/callgrind.*
    cp -r "$T/store" "$T/run"
    valgrind --tool=callgrind --callgrind-out-file="$T/callgrind.%p" --dump-instr=no \
        "$1/server/kcached" --listen 127.0.0.1:0 --data "$T/run" --port-file "$T/kport" \
        --redis-listen 127.0.0.1:0 --redis-port-file "$T/rport" --threads 1 \
        --log-level warn --memory-cache "$2" >"$T/kcached.out" 2>"$T/kcached.err" &
    KPID=$!
    PIDS+=("$KPID")
    for _ in $(seq 1 6000); do [[ -s $T/kport ]] && break; sleep 0.01; done
    [[ -s $T/kport ]] || { cat "$T/kcached.err" >&2; exit 1; }
    KPORT=$(cat "$T/kport")
    RPORT=$(cat "$T/rport")
}

stop_kcached() { kill "$KPID"; wait "$KPID" 2>/dev/null || true; }

# http_gets COUNT [HEADER]: COUNT GETs of $KEY on one connection
http_gets() {
    local cfg=$T/curl.cfg
    : >"$cfg"
    for _ in $(seq 1 "$1"); do
        printf 'url = "http://127.0.0.1:%s/v1/artifacts/%s"\noutput = /dev/null\n' "$KPORT" "$KEY"
    done >>"$cfg"
    curl -sf ${2:+-H "$2"} -K "$cfg"
}

redis_run() { # COUNT get|set
    redis-benchmark -p "$RPORT" -c 1 -n "$1" -t "$2" -d 4096 -r 16 -q >/dev/null
}

# measure WHAT: the instructions of the requests sent by "$@" alone, per request
measure() {
    callgrind_control -z "$KPID" >/dev/null 2>&1
    "$@"
    callgrind_control -d "$KPID" >/dev/null 2>&1
    local f
    f=$(ls -t "$T"/callgrind."$KPID".* | head -1)
    awk -v n="$N" '/^summary:/ {printf "%.0f", $2 / n}' "$f"
}

declare -A IR
for b in "${BUILDS[@]}"; do
    start_kcached "$b" 64M
    redis_run "$WARM" set
    http_gets "$WARM"
    IR[$b,mem]=$(measure http_gets "$N")
    IR[$b,zstd]=$(measure http_gets "$N" "Accept-Encoding: zstd")
    IR[$b,rget]=$(measure redis_run "$N" get)
    IR[$b,rset]=$(measure redis_run "$N" set)
    stop_kcached
    start_kcached "$b" 0
    http_gets "$WARM"
    IR[$b,store]=$(measure http_gets "$N")
    stop_kcached
done

printf '| request (instructions per request, %s each, load %s) |' "$N" "$(cut -d' ' -f1-3 /proc/loadavg)"
for b in "${BUILDS[@]}"; do printf ' %s |' "$b"; done
[[ ${#BUILDS[@]} -eq 2 ]] && printf ' 2nd / 1st |'
printf '\n| --- |'
for _ in "${BUILDS[@]}"; do printf ' ---: |'; done
[[ ${#BUILDS[@]} -eq 2 ]] && printf ' ---: |'
printf '\n'
for k in mem:"HTTP GET 4 KiB, memory cache" store:"HTTP GET 4 KiB, store (--memory-cache 0)" \
    zstd:"HTTP GET 4 KiB, Accept-Encoding: zstd" rget:"Redis GET 4 KiB" rset:"Redis SET 4 KiB"; do
    printf '| %s |' "${k#*:}"
    for b in "${BUILDS[@]}"; do printf ' %s |' "${IR[$b,${k%%:*}]}"; done
    [[ ${#BUILDS[@]} -eq 2 ]] && printf ' %s |' "$(ratio "${IR[${BUILDS[1]},${k%%:*}]}" "${IR[${BUILDS[0]},${k%%:*}]}")"
    printf '\n'
done
