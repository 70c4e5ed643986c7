#!/usr/bin/env bash
# bench/ccache-upload.sh - what one ccache upload costs, measured by ccache
# itself (the "Stored ... (N ms)" lines of its debug log): kcached's /ccache
# against two anchors, a minimal reference server (Python's http.server
# with a PUT that writes a file, one connection per request as ccache's own
# test server does) and nginx's WebDAV PUT (kept-alive connections), and
# kcached's Redis protocol against redis-server; same sources, same run. Every compile
# is a cold miss, so each uploads a result and a manifest. Prints a Markdown
# table; no assertions.
#
#   bench/ccache-upload.sh [BUILD_DIR]       (default: build)
#   env: SOURCES (40)
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$SRC/build}
KCACHED=$BUILD/server/kcached
SOURCES=${SOURCES:-40}
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[[ -x $KCACHED ]] || { echo "missing $KCACHED (build it first)" >&2; exit 1; }
# shellcheck source=bench/lib.sh
. "$SRC/bench/lib.sh"
bench_need ccache gcc redis-server redis-cli curl

"$KCACHED" --listen 127.0.0.1:0 --data "$T/kcached" --port-file "$T/kport" \
    --redis-listen 127.0.0.1:0 --redis-port-file "$T/rport" --log-level warn \
    >"$T/kcached.out" 2>"$T/kcached.err" &
PIDS+=($!)
for _ in $(seq 1 3000); do [[ -s $T/kport ]] && break; sleep 0.01; done
[[ -s $T/kport ]] || { cat "$T/kcached.err" >&2; exit 1; }
KPORT=$(cat "$T/kport") KRPORT=$(cat "$T/rport")

NPORT=$(free_port)
mkdir -p "$T/nginx/tmp" "$T/www/ccache"
# as root nginx would run its worker as nobody, which cannot write into $T
NGINX_USER=$([[ $(id -u) = 0 ]] && echo "user root;" || true)
cat >"$T/nginx/nginx.conf" <<CONF
$NGINX_USER
worker_processes 1;
daemon off;
pid $T/nginx/nginx.pid;
error_log $T/nginx/error.log warn;
events { worker_connections 256; }
http {
    access_log off;
    client_body_temp_path $T/nginx/tmp;
    proxy_temp_path $T/nginx/tmp;
    fastcgi_temp_path $T/nginx/tmp;
    server {
        listen 127.0.0.1:$NPORT;
        root $T/www;
        client_max_body_size 64m;
        location /ccache/ { dav_methods PUT DELETE; create_full_put_path on; }
    }
}
CONF
"$NGINX" -p "$T/nginx" -e "$T/nginx/error.log" -c "$T/nginx/nginx.conf" &
PIDS+=($!)
for _ in $(seq 1 500); do curl -s -o /dev/null "http://127.0.0.1:$NPORT/" && break; sleep 0.01; done

RPORT=$(free_port)
redis-server --bind 127.0.0.1 --port "$RPORT" --save '' --appendonly no --dir "$T" \
    --logfile "$T/redis.log" &
PIDS+=($!)
for _ in $(seq 1 500); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.01; done

# the minimal reference: HTTP/1.0, a connection per request, files under www/
PPORT=$(free_port)
mkdir -p "$T/ref"
cat >"$T/ref.py" <<'PY'
import http.server, os, sys
root = sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def path_of(self):
        p = os.path.normpath(self.path.lstrip("/"))
        return None if p.startswith("..") else os.path.join(root, p)
    def do_GET(self):
        p = self.path_of()
        if not p or not os.path.isfile(p):
            self.send_error(404)
            return
        data = open(p, "rb").read()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_PUT(self):
        p = self.path_of()
        n = int(self.headers.get("Content-Length", 0))
        data = self.rfile.read(n)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p + ".tmp", "wb") as f:
            f.write(data)
        os.replace(p + ".tmp", p)
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
python3 "$T/ref.py" "$PPORT" "$T/ref" &
PIDS+=($!)
for _ in $(seq 1 500); do curl -s -o /dev/null "http://127.0.0.1:$PPORT/" && break; sleep 0.01; done

mkdir -p "$T/src"
for i in $(seq 1 "$SOURCES"); do
    printf '#include <stdio.h>\nint f%d(int x) { return x * %d + printf("%%d", x); }\n' "$i" "$i" >"$T/src/s$i.c"
done

# upload_ms NAME REMOTE -> "median mean count" of ccache's per-upload times
upload_ms() {
    local dir=$T/cc-$1 log=$T/$1.log
    for i in $(seq 1 "$SOURCES"); do
        CCACHE_DIR=$dir CCACHE_CONFIGPATH=/dev/null CCACHE_REMOTE_STORAGE=$2 CCACHE_DEBUG=1 \
            CCACHE_LOGFILE=$log ccache gcc -O2 -c "$T/src/s$i.c" -o "$T/src/s$i-$1.o"
    done
    grep -o 'Stored [^ ]* in [^ ]* ([0-9.]* ms)' "$log" | sed 's/.*(\([0-9.]*\) ms)/\1/' |
        python3 -c 'import sys, statistics as s; v=[float(x) for x in sys.stdin]; print(f"{s.median(v):.2f} {s.mean(v):.2f} {len(v)}" if v else "0 0 0")'
}

read -r k_med k_mean k_n < <(upload_ms kcached-http "http://127.0.0.1:$KPORT/ccache")
read -r p_med p_mean p_n < <(upload_ms reference "http://127.0.0.1:$PPORT/ccache")
read -r n_med n_mean n_n < <(upload_ms nginx "http://127.0.0.1:$NPORT/ccache")
read -r kr_med kr_mean kr_n < <(upload_ms kcached-redis "redis://127.0.0.1:$KRPORT")
read -r r_med r_mean r_n < <(upload_ms redis "redis://127.0.0.1:$RPORT")

echo "| benchmark | kcached | anchor | ratio | goal |"
echo "|---|---:|---:|---:|---|"
echo "| ccache upload over HTTP, ms (median of $k_n; anchor: minimal reference server, $p_n) | $k_med | $p_med | $(ratio "$k_med" "$p_med") | <= 2 |"
echo "| ccache upload over HTTP, ms (mean; anchor: minimal reference server) | $k_mean | $p_mean | $(ratio "$k_mean" "$p_mean") | - |"
echo "| ccache upload over HTTP, ms (median; anchor: nginx WebDAV PUT, $n_n) | $k_med | $n_med | $(ratio "$k_med" "$n_med") | - |"
echo "| ccache upload over redis://, ms (median of $kr_n; anchor redis-server, $r_n) | $kr_med | $r_med | $(ratio "$kr_med" "$r_med") | - |"
echo "| ccache upload over redis://, ms (mean) | $kr_mean | $r_mean | $(ratio "$kr_mean" "$r_mean") | - |"
echo
echo "$SOURCES cold compiles per remote, each uploading a result and a manifest; times are ccache's own ('Stored ... (N ms)' in its debug log); $(ccache --version | head -1), $("$NGINX" -v 2>&1 | cut -d' ' -f3), $(redis-server --version | cut -d' ' -f1-3)."
