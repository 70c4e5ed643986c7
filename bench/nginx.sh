# bench/nginx.sh - the anchor of the server benchmarks, sourced by
# bench/server.sh and bench/crowd.sh: nginx serving $T/www as static files
# with sendfile, $THREADS workers, on a free loopback port.
#   start_nginx  -> sets NPORT and NGPID, adds NGPID to PIDS; exits on failure
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start_nginx() {
    NPORT=$(free_port)
    mkdir -p "$T/nginx/tmp"
    cat >"$T/nginx/nginx.conf" <<CONF
worker_processes $THREADS;
daemon off;
pid $T/nginx/nginx.pid;
error_log $T/nginx/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000000;
    client_body_temp_path $T/nginx/tmp;
    proxy_temp_path $T/nginx/tmp;
    fastcgi_temp_path $T/nginx/tmp;
    default_type application/octet-stream;
    server {
        listen 127.0.0.1:$NPORT;
        root $T/www;
        location / { }
    }
}
CONF
    "$NGINX" -p "$T/nginx" -e "$T/nginx/error.log" -c "$T/nginx/nginx.conf" &
    NGPID=$!
    PIDS+=("$NGPID")
    for _ in $(seq 1 500); do
        curl -s -o /dev/null "http://127.0.0.1:$NPORT/" 2>/dev/null && return 0
        sleep 0.01
    done
    cat "$T/nginx/error.log" >&2
    exit 1
}
