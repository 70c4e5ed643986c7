#!/usr/bin/env bash
# bench/dir.sh - directory snapshots (`kcache dir push/pull`) on a synthetic
# Triton-shaped cache tree, against the anchor measured in the same run: the
# tree as `tar -c | zstd` served by nginx and fetched with
# `curl | zstd -d | tar -x`. Steps: push, pull into an empty directory, pull
# again unchanged, pull after 5% of the files changed. Prints a Markdown
# table; no assertions.
#
#   bench/dir.sh [BUILD_DIR]        (default: build)
#   env: FILES (10000), TOTAL_MB (500), DIRS (FILES/5: one dir per kernel,
#        five files each, as Triton writes .cubin/.ptx/.ttir/.ttgir/.json)
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$SRC/build}
KCACHED=$BUILD/server/kcached
KCACHE=$BUILD/client/kcache
FILES=${FILES:-10000}
TOTAL_MB=${TOTAL_MB:-500}
for b in "$KCACHED" "$KCACHE"; do [[ -x $b ]] || { echo "missing $b (build it first)" >&2; exit 1; }; done
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

T=$(mktemp -d /tmp/kcbench-dir.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    rm -rf "$T"
}
trap cleanup EXIT
chmod 755 "$T" # nginx workers may run as another user

# ---- the tree: 93% of files 1-64 KiB, 7% 64 KiB-2 MiB (log-uniform), scaled
# to TOTAL_MB; half of each file random, half repeated text (PTX-like), so
# it compresses about 2:1 as real kernel caches do.
python3 - "$T/tree" "$FILES" "$TOTAL_MB" <<'PY'
import math, os, random, sys
root, n, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) << 20
rng = random.Random(42)
def draw():
    lo, hi = (1 << 10, 64 << 10) if rng.random() < 0.93 else (64 << 10, 2 << 20)
    return int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
sizes = [draw() for _ in range(n)]
scale = total / sum(sizes)
sizes = [max(1 << 10, min(2 << 20, int(s * scale))) for s in sizes]
text = b"ld.global.v4.f32 {%f1, %f2, %f3, %f4}, [%rd7+16]; fma.rn.f32 %f5, %f1, %f2, %f5;\n"
exts = [".cubin", ".ptx", ".ttir", ".ttgir", ".json"]
for i, s in enumerate(sizes):
    d = os.path.join(root, "%064x" % rng.getrandbits(256) if i % 5 == 0 else last)
    if i % 5 == 0:
        os.makedirs(d)
        last = d
    half = s // 2
    body = os.urandom(half) + (text * (s // len(text) + 1))[: s - half]
    with open(os.path.join(d, "kernel" + exts[i % 5]), "wb") as f:
        f.write(body)
PY
TREE_BYTES=$(du -sb --apparent-size "$T/tree" | cut -f1)
NFILES=$(find "$T/tree" -type f | wc -l)

# ---- kcached and nginx on loopback
"$KCACHED" --listen 127.0.0.1:0 --data "$T/srv" --port-file "$T/kport" --log-level warn \
    --max-blob 64M >"$T/kcached.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 3000); do [[ -s $T/kport ]] && break; sleep 0.01; done
URL=http://127.0.0.1:$(cat "$T/kport")
NPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$T/nginx/tmp" "$T/www"
cat >"$T/nginx/nginx.conf" <<CONF
worker_processes 2;
daemon off;
pid $T/nginx/nginx.pid;
error_log $T/nginx/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    sendfile on;
    client_body_temp_path $T/nginx/tmp;
    proxy_temp_path $T/nginx/tmp;
    fastcgi_temp_path $T/nginx/tmp;
    default_type application/octet-stream;
    server { listen 127.0.0.1:$NPORT; root $T/www; location / { } }
}
CONF
"$NGINX" -p "$T/nginx" -e "$T/nginx/error.log" -c "$T/nginx/nginx.conf" &
PIDS+=($!)
for _ in $(seq 1 500); do curl -s -o /dev/null "http://127.0.0.1:$NPORT/" && break; sleep 0.01; done

now() { date +%s.%N; }
jget() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read())[sys.argv[1]])' "$1"; }
KC() { local cache=$1; shift; "$KCACHE" --cache-dir "$T/$cache" --remote "$URL" -q --json "$@"; }
# push names the snapshot with --name; pull takes the name as its first argument
ARGS=(--version-key "triton=3.3.0 torch=2.7.0" --device-key bench-gpu)

t0=$(now); KC hostA dir push "$T/tree" --name triton "${ARGS[@]}" >"$T/push1.json"; t1=$(now)
push_s=$(echo "$t1 - $t0" | bc -l)
push_sent=$(jget bytes_sent <"$T/push1.json")

load=$(cut -d' ' -f1 /proc/loadavg)
# CPU seconds (user + sys, all threads) beside the wall time: on a shared
# machine the wall time mostly measures the wait for a CPU
cpu() { local out=$1; shift; /usr/bin/time -f '%U %S' -o "$out" "$@"; }
cpus() { awk '{printf "%.2f", $1 + $2}' "$1"; }
t0=$(now); cpu "$T/pull1.cpu" "$KCACHE" --cache-dir "$T/hostB" --remote "$URL" -q --json dir pull \
    triton "$T/dst" "${ARGS[@]}" >"$T/pull1.json"; t1=$(now)
pull1_s=$(echo "$t1 - $t0" | bc -l)
pull1_b=$(jget bytes_received <"$T/pull1.json")
diff -r "$T/tree" "$T/dst" >/dev/null || { echo "dir.sh: pulled tree differs" >&2; exit 1; }

t0=$(now); KC hostB dir pull triton "$T/dst" "${ARGS[@]}" >"$T/pull2.json"; t1=$(now)
pull2_s=$(echo "$t1 - $t0" | bc -l)
pull2_b=$(jget bytes_received <"$T/pull2.json")

# 5% of the files get new content of the same shape and size (a recompiled
# kernel), then the build host pushes again
python3 - "$T/tree" <<'PY'
import os, random, sys
files = sorted(os.path.join(d, f) for d, _, fs in os.walk(sys.argv[1]) for f in fs)
rng = random.Random(7)
text = b"ld.global.v4.f32 {%f1, %f2, %f3, %f4}, [%rd7+16]; fma.rn.f32 %f5, %f1, %f2, %f5;\n"
for p in rng.sample(files, len(files) // 20):
    s = os.path.getsize(p)
    half = s // 2
    with open(p, "wb") as f:
        f.write(os.urandom(half) + (text * (s // len(text) + 1))[: s - half])
PY
t0=$(now); KC hostA dir push "$T/tree" --name triton "${ARGS[@]}" >"$T/push2.json"; t1=$(now)
push2_s=$(echo "$t1 - $t0" | bc -l)
push2_sent=$(jget bytes_sent <"$T/push2.json")
t0=$(now); KC hostB dir pull triton "$T/dst" "${ARGS[@]}" >"$T/pull3.json"; t1=$(now)
pull3_s=$(echo "$t1 - $t0" | bc -l)
pull3_b=$(jget bytes_received <"$T/pull3.json")
pull3_w=$(jget written <"$T/pull3.json")
diff -r "$T/tree" "$T/dst" >/dev/null || { echo "dir.sh: re-pulled tree differs" >&2; exit 1; }

# ---- anchor: tar | zstd served by nginx, curl | zstd -d | tar -x
t0=$(now); tar -C "$T/tree" -cf - . | zstd -q -3 -T0 -o "$T/www/tree.tar.zst"; t1=$(now)
pack_s=$(echo "$t1 - $t0" | bc -l)
chmod -R a+rX "$T/www"
anchor_b=$(stat -c %s "$T/www/tree.tar.zst")
mkdir -p "$T/anchor"
t0=$(now)
cpu "$T/anchor.cpu" bash -c "curl -sf http://127.0.0.1:$NPORT/tree.tar.zst | zstd -q -d | \
    tar -C '$T/anchor' -xf -"
t1=$(now)
anchor_s=$(echo "$t1 - $t0" | bc -l)

mib() { echo "$TREE_BYTES / 1048576 / $1" | bc -l | xargs printf '%.1f'; }
pct() { echo "100 * $1 / $pull1_b" | bc -l | xargs printf '%.2f'; }
echo "Tree: $NFILES files in $((FILES / 5)) directories, $(echo "$TREE_BYTES / 1048576" | bc) MiB" \
    "(1 KiB - 2 MiB each; half random, half text). 2 CPUs, loopback, warm page cache."
echo
echo "| step | seconds | tree MiB/s | bytes on the wire | % of the first pull's bytes |"
echo "|---|---:|---:|---:|---:|"
printf '| kcache dir push (build host) | %.2f | %s | %s | |\n' "$push_s" "$(mib "$push_s")" "$push_sent"
printf '| kcache dir pull, empty dir | %.2f | %s | %s | 100 |\n' "$pull1_s" "$(mib "$pull1_s")" "$pull1_b"
printf '| kcache dir pull, unchanged | %.2f | | %s | %s |\n' "$pull2_s" "$pull2_b" "$(pct "$pull2_b")"
printf '| kcache dir push after 5%% changed | %.2f | | %s | |\n' "$push2_s" "$push2_sent"
printf '| kcache dir pull after 5%% changed (%s files written) | %.2f | | %s | %s |\n' "$pull3_w" \
    "$pull3_s" "$pull3_b" "$(pct "$pull3_b")"
printf '| anchor: tar -c \\| zstd -3 (publish) | %.2f | %s | | |\n' "$pack_s" "$(mib "$pack_s")"
printf '| anchor: curl \\| zstd -d \\| tar -x, empty dir | %.2f | %s | %s | |\n' "$anchor_s" \
    "$(mib "$anchor_s")" "$anchor_b"
echo
ratio=$(echo "$anchor_s / $pull1_s" | bc -l | xargs printf '%.2f')
echo "first pull speed / anchor speed: ${ratio}x (goal >= 0.7)"
echo "first pull CPU seconds (user+sys): $(cpus "$T/pull1.cpu"); anchor's: $(cpus "$T/anchor.cpu")" \
    "(load average before the pull: $load)"
echo "unchanged pull: $(pct "$pull2_b")% of the first pull's bytes (goal < 1%)"
echo "pull after 5% changed: $(pct "$pull3_b")% of the first pull's bytes (goal < 10%)"
