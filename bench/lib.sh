# bench/lib.sh - shared by bench/redis.sh and bench/ccache-upload.sh: a temp
# directory $T removed at exit (kept with KEEP=1), the processes in PIDS
# stopped at exit, tool checks, a free loopback port, a ratio of two figures.
# Source it; it sets T and PIDS.

bench_need() { # TOOL... : exits 1 naming the first missing tool
    for t in "$@"; do
        command -v "$t" >/dev/null || { echo "$t not installed" >&2; exit 1; }
    done
}

T=$(mktemp -d /tmp/kcbench-"$(basename "$0" .sh)".XXXXXX)
PIDS=()
bench_cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    [[ -n ${KEEP:-} ]] || rm -rf "$T"
}
trap bench_cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# ratio A B -> "A/B" as "0.00x", or "-" when B is 0
ratio() { python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(f'{a/b:.2f}x' if b else '-')" "$1" "$2"; }
