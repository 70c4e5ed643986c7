#!/usr/bin/env bash
# Checks which folder of compiler_stub/ calls which, from the symbols of the built
# library: every function an object uses from another folder must come from a folder
# the table below allows. Contracts live apart from their implementations (the kernel
# type in kernel/, the backend interface's own functions in driver/), so a backend
# that reaches into lowering, or lowering into a backend, fails here.
# Usage: scripts/check-layers.sh LIBKCCOMPILER.a   (ctest runs it as compiler_layers)
set -euo pipefail
cd "$(dirname "$0")/.."
lib=${1:?usage: check-layers.sh path/to/libkccompiler.a}
[ -f "$lib" ] || { echo "check-layers: no library $lib (build first)" >&2; exit 1; }
T=$(mktemp -d /tmp/kc-layers.XXXXXX)
trap 'rm -rf "$T"' EXIT
if ! nm -A -g --defined-only "$lib" >"$T/defined" 2>"$T/nm.err" ||
   ! nm -A -u "$lib" >"$T/undefined" 2>>"$T/nm.err"; then
  cat "$T/nm.err" >&2
  echo "check-layers: nm failed on $lib" >&2
  exit 1
fi

# folder: the folders (or folder/file for one file of it) its objects may call.
# A new folder, or a new kind of call, is added here on purpose.
rules='
graph:
toolchain:
kernel: graph cpu/kc_cpu_ops
lowering: graph kernel
cpu: graph kernel toolchain
xpu: graph kernel toolchain cpu/kc_cpu_ops
driver: graph kernel lowering toolchain cpu xpu
'

# object file name -> folder/file (sources are found by name: kc_x.c -> kc_x.c.o)
declare -A unit
while read -r src; do
  rel=${src#compiler_stub/}
  obj=$(basename "$src").o
  [ -z "${unit[$obj]:-}" ] || { echo "check-layers: two sources named ${obj%.o}" >&2; exit 1; }
  unit[$obj]=${rel%.c}
done < <(find compiler_stub -name '*.c' -not -path 'compiler_stub/onnx/*')

# The generated trampolines of cmake/kc_lazy.cmake (kc_lazy_dnnl.c, kc_lazy_ze.c) stand
# for oneDNN and Level Zero themselves: calls into them are calls to another library.
declare -A defined_in
while read -r obj sym; do
  case $obj in kc_lazy_*.c.o) continue ;; esac
  defined_in[$sym]=$obj
done < <(awk '$(NF-1) ~ /^[TDRBV]$/ {n = split($1, p, ":"); print p[n-1], $NF}' "$T/defined")

bad=0
edges=0
while read -r obj sym; do
  from=${unit[$obj]:-}
  to_obj=${defined_in[$sym]:-}
  [ -n "$to_obj" ] || continue # from another library or the system
  to=${unit[$to_obj]:-}
  if [ -z "$from" ] || [ -z "$to" ]; then
    echo "check-layers: $obj or $to_obj has no source under compiler_stub/" >&2
    bad=1
    continue
  fi
  [ "${from%%/*}" != "${to%%/*}" ] || continue
  edges=$((edges + 1))
  allowed=$(sed -n "s|^${from%%/*}:||p" <<<"$rules")
  if ! grep -q . <<<"$(sed -n "/^${from%%/*}:/p" <<<"$rules")"; then
    echo "check-layers: folder ${from%%/*}/ is not in the table of scripts/check-layers.sh" >&2
    bad=1
    continue
  fi
  ok=0
  for a in $allowed; do
    if [ "$a" = "${to%%/*}" ] || [ "$a" = "$to" ]; then ok=1; fi
  done
  if [ $ok = 0 ]; then
    echo "check-layers: $from.c calls $sym from $to.c: ${from%%/*}/ may use only: ${allowed:- nothing}" >&2
    bad=1
  fi
done < <(awk '{n = split($1, p, ":"); print p[n-1], $NF}' "$T/undefined")

[ $bad = 0 ] || exit 1
echo "check-layers: $edges calls across compiler_stub/ folders, all allowed"
