#!/usr/bin/env bash
# bench/onnx.sh - cold vs warm compile of imported ONNX models (DESIGN §7):
# a GPT-2-small-shaped decoder and a ResNet-18-shaped conv net written by
# examples/gen_onnx_models.py (random weights), and the 117 pytorch-* models
# of libonnx-testdata compiled in one process. Each figure is the wall time
# of one `kcache compile` process (ONNX import included); cold = empty cache
# (the anchor), warm = the same command again. Prints one table.
#
#   bench/onnx.sh [BUILD]      MODELS=DIR (default /tmp/kc-onnx-models, generated
#                              once), LAYERS=12, VOCAB=50257
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
KCACHE=$BUILD/client/kcache
MODELS=${MODELS:-/tmp/kc-onnx-models}
LAYERS=${LAYERS:-12}
VOCAB=${VOCAB:-50257}
DATA=/usr/share/libonnx-testdata/data
[[ -x $KCACHE ]] || { echo "onnx.sh: $KCACHE missing (scripts/build.sh)" >&2; exit 2; }
# (re)generated when absent or written with other sizes
if [[ $(cat "$MODELS/.sizes" 2>/dev/null) != "$LAYERS $VOCAB" ]]; then
    mkdir -p "$MODELS"
    /usr/bin/python3 "$ROOT/examples/gen_onnx_models.py" "$MODELS" --layers "$LAYERS" --vocab "$VOCAB" >&2
    echo "$LAYERS $VOCAB" >"$MODELS/.sizes"
fi
WORK=$(mktemp -d /tmp/kc-onnx-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# secs CMD...: wall seconds of one command (its output to WORK/last.out)
secs() {
    local t0 t1
    t0=$(date +%s.%N)
    "$@" >"$WORK/last.out" 2>&1 || { cat "$WORK/last.out" >&2; return 1; }
    t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc -l
}

printf '%-44s %10s %10s %10s %8s\n' "model" "cold s" "warm s" "speed-up" "kernels"
row() { # NAME ARGS...: cold then warm compile in a fresh cache
    local name=$1
    shift
    local cache=$WORK/cache-$RANDOM
    local c w k
    c=$(secs "$KCACHE" --cache-dir "$cache" --json compile "$@")
    w=$(secs "$KCACHE" --cache-dir "$cache" --json compile "$@")
    k=$(python3 -c 'import json,sys; print(sum(json.loads(l)["kernels"] for l in open(sys.argv[1]) if l.strip()))' "$WORK/last.out")
    printf '%-44s %10.2f %10.3f %9.0fx %8s\n' "$name" "$c" "$w" "$(echo "$c / $w" | bc -l)" "$k"
}
row "gpt2_small ($LAYERS layers, d=768, seq 128)" "$MODELS/gpt2_small.onnx"
row "resnet18 (1x3x224x224)" "$MODELS/resnet18.onnx"
mapfile -t corpus < <(ls -d "$DATA"/pytorch-converted/*/model.onnx "$DATA"/pytorch-operator/*/model.onnx)
row "conformance corpus (${#corpus[@]} pytorch-* models)" "${corpus[@]}"
echo
echo "cold = empty cache (lowering + C compiler); warm = graph-record hits, ONNX import included"
