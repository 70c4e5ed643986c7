#!/usr/bin/env bash
# bench/store-ir.sh - instructions per store operation on 4 KiB payloads,
# counted by callgrind: exact, and unmoved by other load on the machine
# (bench_store has the timings against its anchor). Runs bench_store_ir
# (2,000 each of put, get, get_zstd, check; kc_store_flush called every 64
# reads) and prints the inclusive instruction count per call of each, and
# of kc_store_flush, which writes the reads' bookkeeping.
#
#   bench/store-ir.sh [BUILD]     (default build/; needs valgrind)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
BIN=$BUILD/bench/bench_store_ir
command -v valgrind >/dev/null || { echo "store-ir: valgrind is not installed" >&2; exit 2; }
[[ -x $BIN ]] || { echo "store-ir: $BIN missing (build first)" >&2; exit 2; }
WORK=$(mktemp -d /tmp/kc-store-ir.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.out" "$BIN" "$WORK/store" \
    >"$WORK/out.txt" 2>"$WORK/vg.txt" || { cat "$WORK/vg.txt" >&2; exit 1; }
callgrind_annotate --inclusive=yes --threshold=100 "$WORK/cg.out" >"$WORK/ann.txt"
# a line of callgrind_annotate: "1,234,567 (12.3%)  file:function [object]"
ir_of() {
    awk -v fn="$1" '{ for (i = 1; i <= NF; i++) if ($i ~ ":" fn "$") { gsub(",", "", $1); print $1; exit } }' "$WORK/ann.txt"
}
printf '%-20s %8s %12s\n' "function (4 KiB)" calls "Ir per call"
for row in "kc_store_put 2000" "kc_store_get 2000" "kc_store_get_zstd 2000" "kc_store_check 2000" \
    "kc_store_flush 94"; do
    set -- $row
    ir=$(ir_of "$1")
    [[ -n $ir ]] || { echo "store-ir: no count for $1" >&2; exit 1; }
    printf '%-20s %8d %12d\n' "$1" "$2" $((ir / $2))
done
