#!/usr/bin/env bash
# docs/check-guide.sh - replays the recipes of docs/GUIDE.md against the built
# binaries (kcached on 127.0.0.1 with ephemeral ports, temp cache dirs), so the
# guide can be re-checked after code changes. Prints one line per check.
#
#   docs/check-guide.sh [BUILD_DIR]      (default: build)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
[[ $BUILD = /* ]] || BUILD=$ROOT/$BUILD
export PATH=$BUILD/client:$BUILD/server:$PATH
for b in kcache kcached; do command -v $b >/dev/null || { echo "missing $b in $BUILD" >&2; exit 1; }; done
T=$(mktemp -d /tmp/kc-guide.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    rm -rf "$T"
}
trap cleanup EXIT
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
check() { # DESCRIPTION COMMAND... : passes when the command exits 0
    local d=$1
    shift
    if "$@" >"$T/last.out" 2>&1; then ok "$d"; else bad "$d (exit $?): $(tail -3 "$T/last.out")"; fi
}
start() { # NAME ARGS... -> sets PORT
    local name=$1
    shift
    kcached --listen 127.0.0.1:0 --port-file "$T/$name.port" --log-level warn "$@" >/dev/null 2>"$T/$name.err" &
    PIDS+=($!)
    for _ in $(seq 1 500); do [[ -s $T/$name.port ]] && break; sleep 0.01; done
    PORT=$(cat "$T/$name.port")
}

# A two-graph manifest (the recipes use examples/manifest.json; same format).
mkdir -p "$T/zoo"
ln -s "$ROOT/examples/mlp.json" "$ROOT/examples/attention.json" "$T/zoo/"
printf '{"format": "kcache-manifest/1", "graphs": ["mlp.json", "attention.json"],\n "targets": [{"device": "cpu", "target": "native"}, {"device": "cpu", "target": "x86-64-v3"}]}\n' >"$T/zoo/manifest.json"

# Tokens (section 5.3).
W=$(openssl rand -hex 32) R=$(openssl rand -hex 32) A=$(openssl rand -hex 32)
(umask 077; printf '%s read,write build-host\n%s read       ci\n%s admin      ops\n' "$W" "$R" "$A" >"$T/tokens")
check "kcached --check-config with tokens" kcached --data "$T/srv" --max-size 100G --tokens "$T/tokens" --anonymous-read --check-config
start srv --data "$T/srv" --tokens "$T/tokens"
URL=http://127.0.0.1:$PORT

# Journey 1: build host.
check "2.1 prewarm --push" env KCACHE_REMOTE="$URL" KCACHE_TOKEN="$W" kcache --cache-dir "$T/host" prewarm "$T/zoo/manifest.json" --push
check "2.1 push (nothing left)" kcache --cache-dir "$T/host" --remote "$URL" --token "$W" push
# Journey 2: CI machine.
check "2.2 pull without a token fails (401)" bash -c "! kcache --cache-dir '$T/ci0' --remote '$URL' pull"
check "2.2 pull" env KCACHE_REMOTE="$URL" KCACHE_TOKEN="$R" kcache --cache-dir "$T/ci" pull
check "2.2 compile --require-hit" kcache --cache-dir "$T/ci" compile "$ROOT/examples/mlp.json" --require-hit
check "2.2 run --check" kcache --cache-dir "$T/ci" run "$ROOT/examples/mlp.json" --check
check "2.2 pull --tag/--since/--kind" kcache --cache-dir "$T/ci" --remote "$URL" --token "$R" pull --since 7d --kind graph
# Journey 3: benchmark run from a bundle.
dev=$(kcache fingerprint | head -1)
check "2.3 export --device $dev" kcache --cache-dir "$T/host" export "$T/zoo.kcb" --device "$dev"
check "2.3 import" kcache --cache-dir "$T/bench" import "$T/zoo.kcb"
check "2.3 compile --offline --require-hit (hit)" kcache --cache-dir "$T/bench" compile "$ROOT/examples/attention.json" --offline --require-hit
check "2.3 compile --offline --require-hit (miss exits 1)" bash -c "kcache --cache-dir '$T/bench' compile '$ROOT/examples/convnet.json' --offline --require-hit; [ \$? = 1 ]"

# Section 3: local store commands.
echo hello >"$T/hello.txt"
K=$(kcache --cache-dir "$T/s" put "$T/hello.txt" --kind blob)
check "3.1 get" bash -c "[ \"\$(kcache --cache-dir '$T/s' get $K)\" = hello ]"
check "3.1 has/rm" bash -c "kcache --cache-dir '$T/s' has $K && kcache --cache-dir '$T/s' rm $K && ! kcache --cache-dir '$T/s' has $K"
check "1 open kinds: put --kind triton.cubin, ls --kind" bash -c "kcache --cache-dir '$T/s' put '$T/hello.txt' --kind triton.cubin && kcache --cache-dir '$T/s' ls --kind triton.cubin | grep -q triton.cubin"
check "1 an invalid kind exits 2" bash -c "kcache --cache-dir '$T/s' put '$T/hello.txt' --kind Triton 2>/dev/null; [ \$? = 2 ]"
check "3.1 stats/gc/verify/ls" bash -c "kcache --cache-dir '$T/ci' stats && kcache --cache-dir '$T/ci' gc --max-size 100K && kcache --cache-dir '$T/ci' verify && kcache --cache-dir '$T/ci' ls --kind graph"

# Section 4: HTTP API.
code() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
check "4 401 without token" test "$(code "$URL/v1/stats")" = 401
check "4 200 with read token" test "$(code -H "Authorization: Bearer $R" "$URL/v1/stats")" = 200
check "4 healthz without token" test "$(code "$URL/healthz")" = 200
check "4 403 read token PUT" test "$(code -X PUT --data-binary x -H "Authorization: Bearer $R" "$URL/ccache/a/b")" = 403
check "4 201 write token PUT" test "$(code -X PUT --data-binary x -H "Authorization: Bearer $W" "$URL/ccache/a/b")" = 201
check "4 200 PUT again (replaces)" test "$(code -X PUT --data-binary y -H "Authorization: Bearer $W" "$URL/ccache/a/b")" = 200
check "4 PUT replaced the body" test "$(curl -s -H "Authorization: Bearer $R" "$URL/ccache/a/b")" = y
check "4 Basic auth (token as password, its name as user)" test "$(code -u "ci:$R" "$URL/ccache/a/b")" = 200
check "4 Basic auth (token as password, empty user)" test "$(code -u ":$R" "$URL/ccache/a/b")" = 200
check "4 Basic auth under another name is refused" test "$(code -u "any:$R" "$URL/ccache/a/b")" = 401
check "4 Basic auth (token as user)" test "$(code -u "$R:" "$URL/ccache/a/b")" = 200
check "4 400 bad key" test "$(code -H "Authorization: Bearer $R" "$URL/v1/artifacts/xyz")" = 400
check "4 405 wrong method" test "$(code -X POST "$URL/healthz")" = 405
check "4 DELETE needs admin" test "$(code -X DELETE -H "Authorization: Bearer $W" "$URL/v1/artifacts/$(printf 'f%.0s' {1..64})")" = 403
check "4 missing" bash -c "curl -sf -H 'Authorization: Bearer $R' -d '{\"keys\": [\"$(printf 'e%.0s' {1..64})\"]}' '$URL/v1/artifacts/missing' | grep -q missing"
check "4 metrics" bash -c "curl -sf -H 'Authorization: Bearer $R' '$URL/metrics' | grep -q kcached_store_entries"

# Section 5.2: eviction and 507.
start small --data "$T/small" --max-size 1M
S=http://127.0.0.1:$PORT
for i in 1 2 3 4 5 6; do head -c 300000 /dev/urandom >"$T/r$i"; curl -s -o /dev/null -X PUT --data-binary @"$T/r$i" "$S/ccache/y/$i"; done
check "5.2 LRU evicted the oldest" bash -c "[ \$(curl -s -o /dev/null -w '%{http_code}' '$S/ccache/y/1') = 404 ] && [ \$(curl -s -o /dev/null -w '%{http_code}' '$S/ccache/y/6') = 200 ]"
head -c 3000000 /dev/urandom >"$T/big"
check "5.2 507 when it cannot fit" test "$(code -X PUT --data-binary @"$T/big" "$S/ccache/big")" = 507

# Section 5.4: TLS.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$T/key.pem" -out "$T/cert.pem" \
    -days 365 -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 2>/dev/null
start tls --data "$T/tls" --tls-cert "$T/cert.pem" --tls-key "$T/key.pem"
check "5.4 curl --cacert https" curl -sf --cacert "$T/cert.pem" "https://127.0.0.1:$PORT/healthz"
check "5.4 pull --ca-file" kcache --cache-dir "$T/t1" --remote "https://127.0.0.1:$PORT" pull --ca-file "$T/cert.pem"
check "5.4 push with KCACHE_CA_FILE" env KCACHE_CA_FILE="$T/cert.pem" kcache --cache-dir "$T/host" --remote "https://127.0.0.1:$PORT" push

# Section 5.6: signed artifacts.
check "5.6 openssl genpkey ed25519" openssl genpkey -algorithm ed25519 -out "$T/sign.pem"
check "5.6 openssl pkey -pubout" openssl pkey -in "$T/sign.pem" -pubout -out "$T/trusted.pem"
start signed --data "$T/signed-srv" --trusted-keys "$T/trusted.pem"
SURL=http://127.0.0.1:$PORT
check "5.6 unsigned push is refused (422)" bash -c "! kcache --cache-dir '$T/host' --remote '$SURL' push 2>'$T/unsigned.err' && grep -q 'HTTP 422' '$T/unsigned.err'"
check "5.6 push --sign-key" kcache --sign-key "$T/sign.pem" --cache-dir "$T/host" --remote "$SURL" push
check "5.6 pull --trusted-keys" kcache --trusted-keys "$T/trusted.pem" --cache-dir "$T/signed-ci" --remote "$SURL" pull
check "5.6 compile --require-hit from signed artifacts" kcache --cache-dir "$T/signed-ci" compile "$ROOT/examples/mlp.json" --require-hit
check "5.6 unsigned bundle: import refuses, exit 1" bash -c "! kcache --trusted-keys '$T/trusted.pem' --cache-dir '$T/signed-ci2' import '$T/zoo.kcb' 2>'$T/refused.err' && grep -q 'refused' '$T/refused.err'"
check "5.6 verify --trusted-keys: every pulled entry signed" kcache --trusted-keys "$T/trusted.pem" --cache-dir "$T/signed-ci" verify
check "5.6 unsigned write-backs are listed by verify --trusted-keys" bash -c "kcache --cache-dir '$T/wb' --remote '$URL' --token '$R' compile '$ROOT/examples/mlp.json' 2>/dev/null && ! kcache --trusted-keys '$T/trusted.pem' --cache-dir '$T/wb' verify >'$T/wb.out' && grep -q 'origin=remote' '$T/wb.out'"

# Section 5.8: backups.
mkdir -p "$T/backup"
check "5.8 sqlite3 .backup" sqlite3 "$T/srv/kcache.db" ".backup $T/backup/kcache.db"
check "5.8 copy the packs after it" bash -c "[ ! -d '$T/srv/packs' ] || cp -r '$T/srv/packs' '$T/backup/'"
check "5.8 verify the copy" bash -c "kcache --cache-dir '$T/backup' verify | grep -q ': 0 corrupt'"
check "5.8 bundle backup" curl -sf -H "Authorization: Bearer $R" -o "$T/all.kcb" "$URL/v1/bundle"
check "5.8 bundle restore (POST, idempotent)" bash -c "curl -sf -X POST --data-binary @'$T/all.kcb' -H 'Authorization: Bearer $W' '$URL/v1/bundle' | grep -q '\"imported\":0'"

# Section 6: ccache.
if command -v ccache >/dev/null && command -v gcc >/dev/null; then
    n=0
    for rs in "$URL/ccache|bearer-token=$W" "http://build-host:$W@127.0.0.1:${URL##*:}/ccache"; do
        n=$((n + 1))
        printf 'int guide_f%d(int x) { return x * %d; }\n' "$n" "$n" >"$T/c$n.c"
        export CCACHE_DIR=$T/ccache$n CCACHE_REMOTE_STORAGE=$rs
        (cd "$T" && ccache gcc -c "c$n.c" -o "c$n.o")
        rm -rf "$CCACHE_DIR"
        (cd "$T" && ccache gcc -c "c$n.c" -o "c$n.o")
        hits=$(ccache -s -v | awk '/^Remote storage/ {r = 1} r && /Hits/ {print $2; exit}')
        if [[ $hits = 1 ]]; then ok "6 ccache remote hit (variant $n)"; else bad "6 ccache remote hit (variant $n): $hits"; fi
    done
    unset CCACHE_DIR CCACHE_REMOTE_STORAGE
else
    echo "skip 6 (ccache or gcc not installed)"
fi

# Section 7: explain.
check "7 explain names the differing target" bash -c "kcache --cache-dir '$T/bench' explain '$ROOT/examples/mlp.json' --target x86-64-v2 | grep -q 'device field target'"
sed 's/"gelu"/"relu"/' "$ROOT/examples/mlp.json" >"$T/mlp_relu.json"
check "7 explain: the graph itself differs" bash -c "kcache --cache-dir '$T/bench' explain '$T/mlp_relu.json' | grep -q 'the graph itself differs'"
check "7 explain names the first differing node" bash -c "kcache --cache-dir '$T/bench' explain '$T/mlp_relu.json' | grep -q \"first differing node: #2 't3' (relu)\""

# Section 10: ONNX models.
D=/usr/share/libonnx-testdata/data/pytorch-converted/test_Conv2d
if [[ -d $D ]]; then
    check "10 compile an ONNX model" kcache --cache-dir "$T/onnx" compile "$D/model.onnx"
    check "10 run --data matches the ONNX test data" kcache --cache-dir "$T/onnx" run "$D/model.onnx" --data "$D/test_data_set_0"
else
    echo "skip 10 (libonnx-testdata not installed)"
fi

# Section 8: the Redis protocol.
if command -v redis-cli >/dev/null; then
    kcached --listen 127.0.0.1:0 --port-file "$T/redis-http.port" --log-level warn --data "$T/rsrv" \
        --tokens "$T/tokens" --redis-listen 127.0.0.1:0 --redis-port-file "$T/redis.port" >/dev/null 2>"$T/redis.err" &
    PIDS+=($!)
    for _ in $(seq 1 500); do [[ -s $T/redis-http.port ]] && break; sleep 0.01; done
    RP=$(cat "$T/redis.port")
    rc() { redis-cli -p "$RP" --no-auth-warning "$@"; }
    check "8 NOAUTH before AUTH" test "$(rc GET pt2:x)" = "NOAUTH Authentication required."
    check "8 NOPERM for a read token's SET" test "$(rc -a "$R" SET k v)" = "NOPERM User ci has no permissions to run the 'set' command"
    check "8 SET with EX under the token's name" test "$(rc --user build-host -a "$W" SET pt2:fx-graph-v1::abc:c1 hello EX 86400)" = OK
    check "8 TTL" test "$(rc -a "$W" TTL pt2:fx-graph-v1::abc:c1)" = 86400
    check "8 INFO keyspace" bash -c "redis-cli -p $RP --no-auth-warning -a '$W' INFO keyspace | grep -q 'db0:keys=1'"
    if command -v ccache >/dev/null && command -v gcc >/dev/null; then
        printf 'int guide_redis(int x) { return x * 9; }\n' >"$T/cr.c"
        export CCACHE_DIR=$T/ccache-redis CCACHE_REMOTE_STORAGE="redis://build-host:$W@127.0.0.1:$RP"
        (cd "$T" && ccache gcc -c cr.c -o cr.o)
        rm -rf "$CCACHE_DIR"
        (cd "$T" && ccache gcc -c cr.c -o cr.o)
        hits=$(ccache -s -v | awk '/^Remote storage/ {r = 1} r && /Hits/ {print $2; exit}')
        if [[ $hits = 1 ]]; then ok "8.3 ccache redis:// remote hit"; else bad "8.3 ccache redis:// remote hit: $hits"; fi
        unset CCACHE_DIR CCACHE_REMOTE_STORAGE
    fi
else
    echo "skip 8 (redis-cli not installed)"
fi

# Section 5.9: a damaged store database.
mkdir -p "$T/damaged" && head -c 65536 /dev/urandom >"$T/damaged/kcache.db"
check "5.9 kcached refuses a damaged store and names the recovery command" bash -c "out=\$(kcached --listen 127.0.0.1:0 --data '$T/damaged' 2>&1); [[ \$? = 1 ]] && grep -q 'kcache --cache-dir $T/damaged verify' <<<\"\$out\" && ! ls '$T/damaged' | grep -q corrupt"
check "5.9 kcache moves a damaged store aside and works" bash -c "kcache --cache-dir '$T/damaged' verify 2>&1 | grep -q 'moved it aside' && ls '$T/damaged' | grep -q '^kcache.db.corrupt-'"
# Section 9: directory snapshots (a Triton-shaped tree through the preset).
mkdir -p "$T/triton/ABC/tmp.pid_1_2" "$T/triton/DEF"
printf cubin >"$T/triton/ABC/k.cubin"
printf json >"$T/triton/DEF/k.json"
printf part >"$T/triton/ABC/tmp.pid_1_2/k.cubin"
start dirsrv --data "$T/dirsrv"
DURL=http://127.0.0.1:$PORT
check "9 dir push --preset triton" env TRITON_CACHE_DIR="$T/triton" kcache --cache-dir "$T/dA" --remote "$DURL" dir push --preset triton --version-key triton=3.3.0 --device-key h100
check "9 dir pull --preset triton" env TRITON_CACHE_DIR="$T/triton-ci" kcache --cache-dir "$T/dB" --remote "$DURL" dir pull triton --preset triton --version-key triton=3.3.0 --device-key h100
check "9 dir pull --verify --exact" env TRITON_CACHE_DIR="$T/triton-ci" kcache --cache-dir "$T/dB" --remote "$DURL" dir pull triton --preset triton --version-key triton=3.3.0 --device-key h100 --verify --exact
check "9 the temp dir was left out" test ! -e "$T/triton-ci/ABC/tmp.pid_1_2"
check "9 dir status" kcache --cache-dir "$T/dB" dir status triton "$T/triton-ci" --version-key triton=3.3.0 --device-key h100
check "9 a miss names the differing part" bash -c "kcache --cache-dir '$T/dC' --remote '$DURL' dir pull triton '$T/x' --version-key triton=3.4.0 --device-key h100 2>&1 | grep -q 'differs: version'"

# Section 12: the Python package, as the build leaves it in $BUILD/python.
start pysrv --data "$T/pysrv"
PYENV=(env PYTHONPATH="$BUILD/python" KCACHE_DIR="$T/py" KCACHE_REMOTE=http://127.0.0.1:$PORT)
check "12.1 Store, Remote, compile" "${PYENV[@]}" /usr/bin/python3 -c "
import kcache
with kcache.Store() as store:
    key = store.put(b'compiled bytes', kind='blob', meta={'tag': 'demo'})
    assert store.get(key) == b'compiled bytes' and store.stats()['entries'] == 1
assert kcache.Remote().push()['uploaded'] == 1
s = kcache.compile('$ROOT/examples/mlp.json', device='cpu')
assert s['kernels'] == 4 and s['backend'] == 'cpu'
try:
    kcache.Remote().get('0' * 64)
    raise SystemExit('no NotFound')
except kcache.NotFound as e:
    assert e.code == 'not-found'"
check "12.3 kcache.torch names a torch without Mega Cache" "${PYENV[@]}" /usr/bin/python3 -c "
import kcache, kcache.torch
try:
    kcache.torch.save('m', version_key='v')
    raise SystemExit('no error')
except kcache.UnsupportedError as e:
    assert 'save_cache_artifacts' in str(e) and 'torch 1.' in str(e), e"

echo "$fails failure(s)"
[[ $fails = 0 ]]
