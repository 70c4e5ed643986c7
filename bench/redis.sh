#!/usr/bin/env bash
# bench/redis.sh - kcached's Redis protocol (--redis-listen) against real
# redis-servers on loopback, same redis-benchmark settings, same run: GET and
# SET of 4 KiB and 1 MiB values, without and with pipelining (-P 16), against
# an in-memory redis-server (persisting nothing); SET 4 KiB also against a
# redis-server with `appendfsync always` (the goal's anchor) and against the
# redis-server of the same durability: `appendfsync everysec` for kcached (an
# answered write survives a crash of the server at once, and a power loss
# once synced: within about a second in both), `appendfsync always` for
# `kcached --durable` (an answered write is on disk); and one connection
# pipelining SET k, GET k pairs (each GET reads the SET just before it)
# through `redis-cli --pipe`, timed; and one connection pipelining SETs of
# 4 KiB values that are all different (compressible text), timed.
# The 4 KiB runs go in ROUNDS rounds, each server in turn (the order reversed
# every other round, the servers kept running): a single run swings by 15%
# or more on a shared 2-core machine, more than the gaps measured. Their rows
# give the median of each server's figures and the median of the per-round
# ratios, and each ratio's rounds are listed under the table.
# Prints a Markdown table; no assertions.
#
#   bench/redis.sh [BUILD_DIR]       (default: build)
#   env: THREADS (kcached threads, default nproc), CONNS (50), N4K (50000),
#        N1M (1000), KEYS4K (1000), KEYS1M (32), PIPE (16), NMIX (5000 pairs),
#        NDIST (20000 SETs of new values), ROUNDS (5 rounds of the 4 KiB runs)
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$SRC/build}
KCACHED=$BUILD/server/kcached
THREADS=${THREADS:-$(nproc)}
CONNS=${CONNS:-50}
N4K=${N4K:-50000}
N1M=${N1M:-1000}
KEYS4K=${KEYS4K:-1000}
KEYS1M=${KEYS1M:-32}
PIPE=${PIPE:-16}
NMIX=${NMIX:-5000}
NDIST=${NDIST:-20000}
ROUNDS=${ROUNDS:-5}
[[ -x $KCACHED ]] || { echo "missing $KCACHED (build it first)" >&2; exit 1; }
# shellcheck source=bench/lib.sh
. "$SRC/bench/lib.sh"
bench_need redis-benchmark redis-server redis-cli curl
wait_ping() { # PORT PID
    for _ in $(seq 1 1000); do
        redis-cli -p "$1" ping >/dev/null 2>&1 && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.01
    done
    return 1
}

# start_kcached NAME [OPTIONS...]: a kcached with its own store, its ports in $T/NAME.{k,r}port
start_kcached() {
    local name=$1
    shift
    "$KCACHED" --listen 127.0.0.1:0 --data "$T/$name" --port-file "$T/$name.kport" \
        --redis-listen 127.0.0.1:0 --redis-port-file "$T/$name.rport" --threads "$THREADS" \
        --log-level warn --max-blob 64M --memory-cache 512M "$@" >"$T/$name.out" 2>"$T/$name.err" &
    PIDS+=($!)
    local pid=$!
    for _ in $(seq 1 3000); do [[ -s $T/$name.rport ]] && break; sleep 0.01; done
    wait_ping "$(cat "$T/$name.rport")" "$pid" || { cat "$T/$name.err" >&2; exit 1; }
}
start_kcached kcached
start_kcached durable --durable
KPORT=$(cat "$T/kcached.rport")
DPORT=$(cat "$T/durable.rport")

RPORT=$(free_port)
redis-server --bind 127.0.0.1 --port "$RPORT" --save '' --appendonly no --daemonize no \
    --dir "$T" --logfile "$T/redis.log" &
PIDS+=($!)
wait_ping "$RPORT" "$!" || { cat "$T/redis.log" >&2; exit 1; }

# the durable anchors: every write appended to the file before the reply,
# which is fsynced once a second (everysec) or before the reply (always)
start_redis_aof() { # NAME FSYNC: sets AOF_PORT
    local port
    port=$(free_port)
    mkdir -p "$T/$1"
    redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly yes --appendfsync "$2" \
        --daemonize no --dir "$T/$1" --logfile "$T/redis-$1.log" &
    PIDS+=($!)
    wait_ping "$port" "$!" || { cat "$T/redis-$1.log" >&2; exit 1; }
    AOF_PORT=$port
}
start_redis_aof everysec everysec
EPORT=$AOF_PORT
start_redis_aof always always
FPORT=$AOF_PORT

# bench PORT SIZE N KEYS PIPE [TESTS] -> "set_rps get_rps" (SET first fills the keys GET
# reads; TESTS set,get by default, set alone gives get_rps 0)
bench() {
    local out
    # the disk takes no other run's writes meanwhile: an everysec or kcached run
    # leaves up to a second of writes for the kernel to flush, which slowed
    # the next run's fsyncs (`always`, `--durable`) by 10-20%
    sync
    out=$(redis-benchmark -h 127.0.0.1 -p "$1" -t "${6:-set,get}" -d "$2" -n "$3" -r "$4" -P "$5" \
        -c "$CONNS" --csv 2>/dev/null)
    local s g
    s=$(awk -F'","' '/^"SET"/ {print $2}' <<<"$out")
    g=$(awk -F'","' '/^"GET"/ {print $2}' <<<"$out")
    echo "${s:-0} ${g:-0}"
}

# the mixed pipeline: "SET k v; GET k" pairs (4 KiB) on one connection
python3 - "$NMIX" "$KEYS4K" >"$T/mixed.resp" <<'PY'
import sys
n, keys = int(sys.argv[1]), int(sys.argv[2])
out = sys.stdout.buffer
val = b"x" * 4096
def cmd(*args):
    out.write(b"*%d\r\n" % len(args))
    for a in args:
        out.write(b"$%d\r\n%s\r\n" % (len(a), a))
for i in range(n):
    k = b"mix:%d" % (i % keys)
    cmd(b"SET", k, val)
    cmd(b"GET", k)
PY
# piped PORT FILE REPLIES UNITS -> UNITS per second of sending FILE through
# `redis-cli --pipe` on one connection (0 unless all REPLIES came back without error)
piped() {
    local t0 t1 out
    t0=$(date +%s.%N)
    out=$(redis-cli -p "$1" --pipe <"$2" 2>&1)
    t1=$(date +%s.%N)
    grep -q "errors: 0, replies: $3" <<<"$out" || { echo "$2 on port $1: $out" >&2; echo 0; return; }
    python3 -c "import sys; print(int(sys.argv[1]) / (float(sys.argv[3]) - float(sys.argv[2])))" "$4" "$t0" "$t1"
}
# mixed PORT -> pairs/s of the mixed pipeline
mixed() { piped "$1" "$T/mixed.resp" $((2 * NMIX)) "$NMIX"; }

# NDIST SETs of 4 KiB, each value new: redis-benchmark sends one value over and
# over, which the store keeps once; real caches write values it has not seen,
# which it compresses (in the batch that stores them) before they are stored
python3 - "$NDIST" "$KEYS4K" >"$T/distinct.resp" <<'PY'
import random, sys
n, keys = int(sys.argv[1]), int(sys.argv[2])
out = sys.stdout.buffer
words = [b"def", b"kernel", b"tl.load", b"tl.store", b"tl.arange", b"xoffset", b"xmask",
         b"tmp0", b"=", b"+", b"(", b")", b"\n    "]
for i in range(n):
    r = random.Random(i)
    v = b" ".join(r.choice(words) for _ in range(900))[:4096]
    k = b"dist:%d" % (i % keys)
    out.write(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(k), k, len(v), v))
PY

# median "X1 X2 ..." -> the median; per_round "A1 A2 ..." "B1 B2 ..." -> the ratios Ai/Bi,
# in round order; mratio "A..." "B..." -> their median, as "1.23x"
median() { python3 -c "import statistics, sys; print(statistics.median(map(float, sys.argv[1].split())))" "$1"; }
per_round() {
    python3 -c "import sys; print(' '.join(f'{a / b:.2f}' if b else '-' for a, b in zip(map(float, sys.argv[1].split()), map(float, sys.argv[2].split()))))" "$1" "$2"
}
mratio() {
    python3 -c "import statistics, sys; r = [a / b for a, b in zip(map(float, sys.argv[1].split()), map(float, sys.argv[2].split())) if b]; print(f'{statistics.median(r):.2f}x' if r else '-')" "$1" "$2"
}

echo "| benchmark | kcached | redis-server | ratio | goal |"
echo "|---|---:|---:|---:|---|"
ROUND_LINES=()
for size in 4096 1048576; do
    if [[ $size = 4096 ]]; then n=$N4K keys=$KEYS4K label="4 KiB"; else n=$N1M keys=$KEYS1M label="1 MiB"; fi
    for p in 1 "$PIPE"; do
        pl=$([[ $p = 1 ]] && echo "no pipelining" || echo "-P $p")
        if [[ $size != 4096 ]]; then
            read -r ks kg < <(bench "$KPORT" "$size" "$n" "$keys" "$p")
            read -r rs rg < <(bench "$RPORT" "$size" "$n" "$keys" "$p")
            printf '| GET %s, ops/s (%s) | %.0f | %.0f | %s | - |\n' "$label" "$pl" "$kg" "$rg" "$(ratio "$kg" "$rg")"
            printf '| SET %s, ops/s (%s) | %.0f | %.0f | %s | - |\n' "$label" "$pl" "$ks" "$rs" "$(ratio "$ks" "$rs")"
            continue
        fi
        # KS: kcached's SETs, KG its GETs, RS/RG the in-memory redis-server's, FS `always`,
        # ES `everysec`, DS `kcached --durable`: one figure a round each
        KS="" KG="" RS="" RG="" FS="" ES="" DS=""
        for ((round = 0; round < ROUNDS; round++)); do
            order="K R F E D"
            ((round % 2)) && order="D E F R K"
            for who in $order; do
                case $who in
                K) read -r s g < <(bench "$KPORT" "$size" "$n" "$keys" "$p") && KS+=" $s" KG+=" $g" ;;
                R) read -r s g < <(bench "$RPORT" "$size" "$n" "$keys" "$p") && RS+=" $s" RG+=" $g" ;;
                F) read -r s _ < <(bench "$FPORT" "$size" "$n" "$keys" "$p" set) && FS+=" $s" ;;
                E) read -r s _ < <(bench "$EPORT" "$size" "$n" "$keys" "$p" set) && ES+=" $s" ;;
                D) read -r s _ < <(bench "$DPORT" "$size" "$n" "$keys" "$p" set) && DS+=" $s" ;;
                esac
            done
        done
        sgoal=$([[ $p = 1 ]] && echo ">= 0.5" || echo ">= 0.3")
        printf '| GET %s, ops/s (%s) | %.0f | %.0f | %s | >= 0.5 |\n' "$label" "$pl" \
            "$(median "$KG")" "$(median "$RG")" "$(mratio "$KG" "$RG")"
        printf '| SET %s, ops/s (%s) | %.0f | %.0f | %s | %s |\n' "$label" "$pl" \
            "$(median "$KS")" "$(median "$RS")" "$(mratio "$KS" "$RS")" "$sgoal"
        # the goal's own row, then the two of the same durability
        printf '| SET %s, ops/s (%s), anchor redis-server appendfsync always | %.0f | %.0f | %s | >= 1.0 |\n' \
            "$label" "$pl" "$(median "$KS")" "$(median "$FS")" "$(mratio "$KS" "$FS")"
        printf '| SET %s, ops/s (%s), anchor redis-server appendfsync everysec | %.0f | %.0f | %s | - |\n' \
            "$label" "$pl" "$(median "$KS")" "$(median "$ES")" "$(mratio "$KS" "$ES")"
        printf '| SET %s, ops/s (%s), kcached --durable, anchor redis-server appendfsync always | %.0f | %.0f | %s | >= 1.0 |\n' \
            "$label" "$pl" "$(median "$DS")" "$(median "$FS")" "$(mratio "$DS" "$FS")"
        ROUND_LINES+=("SET $label ($pl), ratio by round: kcached/redis-server $(per_round "$KS" "$RS"); kcached/always $(per_round "$KS" "$FS"); kcached/everysec $(per_round "$KS" "$ES"); kcached --durable/always $(per_round "$DS" "$FS")")
    done
done
# kcached's group commits for the mixed pipeline: a figure the machine's load does not move
commits() { curl -s "http://127.0.0.1:$(cat "$T/kcached.kport")/metrics" | awk '$1 == "kcached_redis_write_commits_total" {print $2}'; }
c0=$(commits)
km=$(mixed "$KPORT")
c1=$(commits)
rm_=$(mixed "$RPORT")
printf '| SET k + GET k pairs of 4 KiB, one connection (redis-cli --pipe), pairs/s | %.0f | %.0f | %s | >= 0.33 |\n' \
    "$km" "$rm_" "$(ratio "$km" "$rm_")"
kd=$(piped "$KPORT" "$T/distinct.resp" "$NDIST" "$NDIST")
rd=$(piped "$RPORT" "$T/distinct.resp" "$NDIST" "$NDIST")
printf '| SET 4 KiB, a new value each time, one connection (redis-cli --pipe), SET/s | %.0f | %.0f | %s | - |\n' \
    "$kd" "$rd" "$(ratio "$kd" "$rd")"
echo
printf '%s.\n' "${ROUND_LINES[@]}"
echo "redis-benchmark -c $CONNS, -r keys (4 KiB: $KEYS4K, 1 MiB: $KEYS1M), requests (4 KiB: $N4K in each of $ROUNDS rounds, medians above; 1 MiB: $N1M, one run); kcached --threads $THREADS, redis-server single-threaded; mixed pipeline: $NMIX pairs, $((c1 - c0)) kcached commits for its $NMIX SETs; load average $(cut -d' ' -f1-3 /proc/loadavg); $(redis-server --version | cut -d' ' -f1-3)."
