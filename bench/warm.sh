#!/usr/bin/env bash
# bench/warm.sh - what a user waits for on a warm cache, one fresh process per
# command (issue 29, items 6 and 7): `kcache --version`, `kcache fingerprint`,
# a warm hit of examples/mlp.json, and warm compiles of large ONNX models (the
# ~495 MB GPT-2-small-shaped model of examples/gen_onnx_models.py and, where
# Debian's python3-torch is installed, a ~346 MB ViT-B/16 exported by PyTorch's
# own exporter, bench/gen_vit.py). Anchors from the same run: a process that does
# nothing (/bin/true) and ccache's direct-mode hit of a small C file. Each row is
# REPS runs: wall median, wall minimum, CPU (user + system) median, and how many
# times the C compiler ran (a logging $CC wrapper: a warm start asks nothing).
# Prints a Markdown table; no assertions.
#
#   bench/warm.sh [BUILD]    env: REPS (21), MODELS (/tmp/kc-onnx-models),
#                            LAYERS (12), VOCAB (50257), VIT (1; 0 skips it)
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$SRC/build}
KCACHE=$BUILD/client/kcache
REPS=${REPS:-21}
MODELS=${MODELS:-/tmp/kc-onnx-models}
LAYERS=${LAYERS:-12}
VOCAB=${VOCAB:-50257}
VIT=${VIT:-1}
[[ -x $KCACHE ]] || { echo "warm.sh: $KCACHE missing (scripts/build.sh)" >&2; exit 2; }
# shellcheck source=bench/lib.sh
. "$SRC/bench/lib.sh"
bench_need ccache cc /usr/bin/python3

# the models, generated once (bench/onnx.sh shares the directory)
if [[ $(cat "$MODELS/.sizes" 2>/dev/null) != "$LAYERS $VOCAB" ]]; then
    mkdir -p "$MODELS"
    /usr/bin/python3 "$SRC/examples/gen_onnx_models.py" "$MODELS" --layers "$LAYERS" --vocab "$VOCAB" >&2
    echo "$LAYERS $VOCAB" >"$MODELS/.sizes"
fi
vit="" vit_note=""
if [[ $VIT = 1 ]]; then
    if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
        [[ -s $MODELS/vit_b16.onnx ]] ||
            /usr/bin/python3 "$SRC/bench/gen_vit.py" "$MODELS/vit_b16.onnx" >&2
        vit=$MODELS/vit_b16.onnx
    else
        vit_note="ViT-B/16 row skipped: Debian's python3-torch is not installed (apt-get install python3-torch)"
    fi
fi

# a C compiler that logs its runs, old enough for kcache to remember it
# (a program changed less than 2 s ago is probed every time: docs/DESIGN.md §3)
cat >"$T/cc" <<EOF
#!/bin/sh
echo "\$*" >>"$T/cc.log"
exec cc "\$@"
EOF
chmod 755 "$T/cc"
touch -d '-1 hour' "$T/cc"
export CC=$T/cc
sleep 2.1

# warm every cache once (cold compiles are bench/onnx.sh's and bench_compile's)
CACHE=$T/cache
"$KCACHE" --cache-dir "$CACHE" compile "$SRC/examples/mlp.json" >/dev/null
"$KCACHE" --cache-dir "$CACHE" compile "$MODELS/gpt2_small.onnx" >/dev/null
[[ -z $vit ]] || "$KCACHE" --cache-dir "$CACHE" compile "$vit" >/dev/null
"$KCACHE" --cache-dir "$CACHE" fingerprint >/dev/null
printf 'int add(int a, int b) { return a + b; }\n' >"$T/small.c"
export CCACHE_DIR=$T/ccache
ccache cc -c "$T/small.c" -o "$T/small.o" # cold: fills the cache
: >"$T/cc.log"

# row NAME GOAL CMD...: REPS runs of CMD (output discarded)
rows=$T/rows.tsv
: >"$rows"
row() {
    local name=$1 goal=$2
    shift 2
    : >"$T/cc.log"
    /usr/bin/python3 - "$REPS" "$@" >"$T/row" <<'PY'
import os, resource, statistics, subprocess, sys, time
reps, cmd = int(sys.argv[1]), sys.argv[2:]
walls, cpus = [], []
for _ in range(reps):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    walls.append(time.perf_counter() - t0)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
print(f"{statistics.median(walls) * 1e3:.2f}\t{min(walls) * 1e3:.2f}\t{statistics.median(cpus) * 1e3:.2f}")
PY
    printf '%s\t%s\t%s\t%s\n' "$name" "$(cat "$T/row")" "$(wc -l <"$T/cc.log")" "$goal" >>"$rows"
}
K=("$KCACHE" --cache-dir "$CACHE")
row "anchor: /bin/true (a process that does nothing)" "-" /bin/true
row "anchor: ccache cc -c small.c (direct-mode hit)" "-" ccache cc -c "$T/small.c" -o "$T/small.o"
row "kcache --version" "< 5 ms" "${K[@]}" --version
row "kcache fingerprint (4 CPU targets)" "0 cc runs" "${K[@]}" fingerprint
row "kcache compile examples/mlp.json (4 kernels, all hits)" "< 10 ms" \
    "${K[@]}" compile "$SRC/examples/mlp.json" --offline --require-hit
gpt_mb=$(($(stat -c %s "$MODELS/gpt2_small.onnx") / 1000000))
row "kcache compile gpt2_small.onnx ($gpt_mb MB, all hits)" "< 50 ms" \
    "${K[@]}" compile "$MODELS/gpt2_small.onnx" --offline --require-hit
if [[ -n $vit ]]; then
    vit_mb=$(($(stat -c %s "$vit") / 1000000))
    row "kcache compile vit_b16.onnx ($vit_mb MB, all hits)" "< 50 ms" \
        "${K[@]}" compile "$vit" --offline --require-hit
fi

ccache_ms=$(awk -F'\t' 'NR == 2 {print $4}' "$rows")
echo "| what | wall median ms | wall min ms | CPU median ms | cc runs | CPU / ccache hit | goal |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
while IFS=$'\t' read -r name wmed wmin cpu runs goal; do
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$name" "$wmed" "$wmin" "$cpu" "$runs" \
        "$(ratio "$cpu" "$ccache_ms")" "$goal"
done <"$rows"
echo
echo "$REPS fresh processes per row, warm caches; load average $(cut -d' ' -f1-3 /proc/loadavg)."
echo "Goals are wall-clock figures for a quiet machine; on a loaded one the minimum is the closer estimate."
[[ -z $vit_note ]] || echo "$vit_note"
