#!/usr/bin/env bash
# bench/models.sh - run time of real models against PyTorch eager, same run, same
# machine: resnet18 and mobilenet_v2 (torchvision), a transformer encoder and a
# GPT-style decoder (bench/models_torch.py says their sizes), exported by torch's
# own ONNX exporter with random weights. For each model and thread count it times
#   kcache default      `kcache run --iters N --threads T` on a cache compiled without tuning
#   kcache --autotune   the same on a cache compiled with --autotune
#   torch eager         torch 1.13 (Debian) with OpenBLAS as its BLAS, T threads
# in interleaved rounds (every configuration once per round, ROUNDS rounds), and
# reports the median of the rounds' medians with their range; plus the cold compile
# time (empty cache) with and without tuning. Every kcache run also checks its
# output against torch's (`--data`, ONNX's rtol 1e-3 / atol 1e-5) and the benchmark
# fails on a mismatch. Prints Markdown tables; no assertions on speed.
#
#   bench/models-setup.sh          once: python3-torch, torchvision, OpenBLAS
#   bench/models.sh [BUILD]        env: MODELS=DIR (exported once, default
#                                  /tmp/kc-bench-models), ITERS=20, ROUNDS=3,
#                                  THREADS="1 2"
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
KCACHE=$BUILD/client/kcache
MODELS=${MODELS:-/tmp/kc-bench-models}
OPENBLAS_DIR=/usr/lib/x86_64-linux-gnu/openblas-pthread
[[ -x $KCACHE ]] || { echo "models.sh: $KCACHE missing (scripts/build.sh)" >&2; exit 2; }
/usr/bin/python3 -c 'import torch, torchvision' 2>/dev/null && [[ -e $OPENBLAS_DIR/libblas.so.3 ]] ||
    { echo "models.sh: PyTorch or OpenBLAS missing: run bench/models-setup.sh first" >&2; exit 2; }
# exported again when the exporting script changed
stamp=$(sha256sum "$ROOT/bench/models_torch.py" | cut -c1-16)
if [[ $(cat "$MODELS/.stamp" 2>/dev/null) != "$stamp" ]]; then
    mkdir -p "$MODELS"
    /usr/bin/python3 "$ROOT/bench/models_torch.py" export "$MODELS" 2>"$MODELS/export.log" ||
        { tail -20 "$MODELS/export.log" >&2; exit 1; }
    echo "$stamp" >"$MODELS/.stamp"
fi
WORK=$(mktemp -d /tmp/kc-models-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export KCACHE MODELS WORK OPENBLAS_DIR ROOT
exec /usr/bin/python3 - <<'PY'
import json, os, statistics, subprocess, sys, time

KCACHE, MODELS, WORK, ROOT = (os.environ[v] for v in ("KCACHE", "MODELS", "WORK", "ROOT"))
ITERS = int(os.environ.get("ITERS", "20"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
THREADS = [int(t) for t in os.environ.get("THREADS", "1 2").split()]
NAMES = ["resnet18", "mobilenet_v2", "encoder", "decoder"]
CACHES = {"default": os.path.join(WORK, "cache-default"), "autotune": os.path.join(WORK, "cache-autotune")}
TORCH_ENV = dict(os.environ, LD_LIBRARY_PATH=os.environ["OPENBLAS_DIR"])


def load():
    return open("/proc/loadavg").read().split()[:3]


def kcache(mode, *args):
    """One kcache process on mode's cache; its JSON summary."""
    cmd = [KCACHE, "--cache-dir", CACHES[mode], "--json", *args]
    if mode == "autotune":
        cmd.append("--autotune")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("models.sh: %s failed (exit %d):\n%s%s" % (" ".join(cmd), r.returncode, r.stdout, r.stderr[-2000:]))
    return json.loads(r.stdout)


def model(name):
    return os.path.join(MODELS, name + ".onnx")


def torch_times(threads):
    """Median ms of each model under torch eager with `threads` threads, one process."""
    env = dict(TORCH_ENV, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    r = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "bench", "models_torch.py"), "time",
                        MODELS, str(threads), str(ITERS), *NAMES], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit("models.sh: torch timing failed:\n%s" % r.stderr[-2000:])
    out = {}
    for line in r.stdout.strip().splitlines():
        j = json.loads(line)
        if "openblas" not in j["blas"]:
            sys.exit("models.sh: torch mapped %s, not OpenBLAS" % j["blas"])
        out[j["model"]] = j
    return out


load_start = load()
print("# models: kcache against PyTorch eager\n")
print("kcache: %s; torch: %s; ITERS=%d ROUNDS=%d THREADS=%s; load average at start %s" % (
    KCACHE, subprocess.run(["/usr/bin/python3", "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True).stdout.strip(), ITERS, ROUNDS,
    " ".join(map(str, THREADS)), " ".join(load_start)))

# cold compiles (empty caches), then the check of every output against torch's
cold = {}
for name in NAMES:
    for mode in CACHES:
        t0 = time.monotonic()
        j = kcache(mode, "compile", model(name))
        cold[name, mode] = (time.monotonic() - t0, j["kernels"], j["compiled"])
for name in NAMES:
    for mode in CACHES:
        j = kcache(mode, "run", model(name), "--data", os.path.join(MODELS, name + ".data"), "--offline",
                   "--require-hit")
        if not j["ok"]:
            sys.exit("models.sh: kcache (%s) output of %s differs from torch's: %s" % (mode, name, j["outputs"]))

# interleaved rounds: every configuration once per round
runs = {}
blas = "?"
for rnd in range(ROUNDS):
    for t in THREADS:
        for mode in CACHES:
            for name in NAMES:
                j = kcache(mode, "run", model(name), "--data", os.path.join(MODELS, name + ".data"),
                           "--iters", str(ITERS), "--threads", str(t), "--offline", "--require-hit")
                if not j["ok"]:
                    sys.exit("models.sh: kcache (%s, %d threads) output of %s differs from torch's" % (mode, t, name))
                runs.setdefault((name, t, mode), []).append(j["median_ms"])
        for name, j in torch_times(t).items():
            runs.setdefault((name, t, "torch"), []).append(j["median_ms"])
            blas = j["blas"]
load_end = load()


def med(key):
    return statistics.median(runs[key])


def rng(key):
    v = runs[key]
    return "%.1f–%.1f" % (min(v), max(v)) if len(v) > 1 else "-"


print("\nPer-iteration time, ms: median over %d rounds of each round's median of %d calls after a warm-up "
      "(range of the round medians); torch with %s\n" % (ROUNDS, ITERS, blas))
print("| model | threads | kcache default | kcache --autotune | torch eager | default / autotune | "
      "default / torch | autotune / torch |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for name in NAMES:
    for t in THREADS:
        d, a, p = med((name, t, "default")), med((name, t, "autotune")), med((name, t, "torch"))
        print("| %s | %d | %.2f (%s) | %.2f (%s) | %.2f (%s) | %.2fx | %.2fx | %.2fx |" % (
            name, t, d, rng((name, t, "default")), a, rng((name, t, "autotune")), p, rng((name, t, "torch")),
            d / a, d / p, a / p))

print("\nCold compile (empty cache, one process, ONNX import included), s\n")
print("| model | kernels | default | --autotune | compiler runs (default / --autotune) |")
print("|---|---:|---:|---:|---:|")
for name in NAMES:
    (cd, kd, nd), (ca, _, na) = cold[name, "default"], cold[name, "autotune"]
    print("| %s | %d | %.1f | %.1f | %d / %d |" % (name, kd, cd, ca, nd, na))

# the summary bench/run-all reads: | what | kcache | anchor | ratio | goal |
print("\n| benchmark | kcache | anchor | ratio | goal |")
print("|---|---|---|---|---|")
for name in NAMES:
    for t in THREADS:
        d, a, p = med((name, t, "default")), med((name, t, "autotune")), med((name, t, "torch"))
        print("| %s, %d thread%s: default vs --autotune, ms | %.2f | %.2f | %.2fx | <= 1.2 |" % (
            name, t, "" if t == 1 else "s", d, a, d / a))
        cnn = name in ("resnet18", "mobilenet_v2")
        goal = "<= 1.0" if (not cnn or t == 2) else "-"
        print("| %s, %d thread%s: default vs torch eager (OpenBLAS), ms | %.2f | %.2f | %.2fx | %s |" % (
            name, t, "" if t == 1 else "s", d, p, d / p, goal))
print("\nload average at end %s" % " ".join(load_end))
PY
