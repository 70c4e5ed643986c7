#!/usr/bin/env bash
# Checks, after a build, that every system header the build included and every
# library it linked comes from a Debian package that scripts/setup.sh installs
# (listed in PACKAGES, or a dependency of a listed package), so a fresh machine
# that runs setup.sh can build. A forgotten package (CL/cl.h without
# opencl-c-headers, issue 13) fails here, naming the package.
#
#   scripts/check-deps.sh [BUILD_DIR]            check a build (default build/)
#   scripts/check-deps.sh --without 'P Q' [DIR]  the same, with P and Q taken out of
#                                                PACKAGES (what-if: is P needed?)
#   scripts/check-deps.sh --self-test [DIR]      proves the check works: without
#                                                opencl-c-headers/ocl-icd-opencl-dev it
#                                                must fail naming opencl-c-headers, and
#                                                CMake's configure must name it too
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
without=""
self_test=0
while [ $# -gt 0 ]; do
  case "$1" in
    --without) without=$2; shift 2 ;;
    --self-test) self_test=1; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
build=${1:-build}
[ -d "$build" ] || { echo "check-deps: no build directory '$build' (run scripts/build.sh first)" >&2; exit 1; }
build=$(cd "$build" && pwd)

if [ "$self_test" = 1 ]; then
  # 1. the pre-fix package list must fail, naming the header's package
  out=$(bash "$0" --without 'opencl-c-headers ocl-icd-opencl-dev' "$build" 2>&1) && {
    echo "check-deps self-test: FAILED: the check passed without opencl-c-headers:"; echo "$out"
    exit 1; }
  echo "$out" | grep -q 'opencl-c-headers' || {
    echo "check-deps self-test: FAILED: the failure does not name opencl-c-headers:"; echo "$out"
    exit 1; }
  echo "check-deps self-test: without opencl-c-headers the check fails and names it"
  # 2. CMake's helper names the package when the header is missing (a find root
  #    with nothing in it plays the machine without the package)
  tmp=$(mktemp -d /tmp/kc-check-deps-XXXXXX)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/src" "$tmp/empty"
  cat > "$tmp/src/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.25)
project(kc_deps_probe LANGUAGES C)
include($root/cmake/kc_deps.cmake)
kc_require_header(KC_OPENCL_INCLUDE CL/cl.h opencl-c-headers)
EOF
  if out=$(cmake -S "$tmp/src" -B "$tmp/b" -DCMAKE_FIND_ROOT_PATH="$tmp/empty" \
           -DCMAKE_FIND_ROOT_PATH_MODE_INCLUDE=ONLY 2>&1); then
    echo "check-deps self-test: FAILED: configure passed without CL/cl.h"; exit 1
  fi
  echo "$out" | grep -q 'install the Debian package opencl-c-headers' || {
    echo "check-deps self-test: FAILED: configure did not name opencl-c-headers:"; echo "$out"
    exit 1; }
  echo "check-deps self-test: CMake's configure fails naming opencl-c-headers"
  exit 0
fi

# PACKAGES from setup.sh, without running it
eval "$(sed -n '/^PACKAGES=(/,/^)/p' scripts/setup.sh)"
packages=()
for p in "${PACKAGES[@]}"; do
  case " $without " in *" $p "*) ;; *) packages+=("$p") ;; esac
done

files=$(mktemp /tmp/kc-check-deps-files-XXXXXX)
trap 'rm -f "$files"' EXIT
# headers: the compiler's dependency files (CMake's *.o.d), outside the tree and the build
find "$build" -name '*.o.d' -print0 | xargs -0 -r cat | tr ' \\' '\n\n' |
  grep '^/' | grep -v -e "^$root/" -e "^$build/" >> "$files" || true
# libraries: every absolute path and -lNAME on the link lines...
find "$build" -name link.txt -print0 | xargs -0 -r cat | tr ' ' '\n' > "$files.link"
grep -E '^/.*\.(so|a)(\.[0-9.]+)?$' "$files.link" | grep -v "^$build/" >> "$files" || true
for l in $(grep -E '^-l[A-Za-z0-9_+.-]+$' "$files.link" | sort -u | sed 's/^-l//'); do
  f=$(cc -print-file-name="lib$l.so")
  [ "${f#/}" != "$f" ] || f=$(cc -print-file-name="lib$l.a")
  [ "${f#/}" != "$f" ] && echo "$f" >> "$files"
done
rm -f "$files.link"
# ...and what the built programs, tests and shared objects load at run time
while IFS= read -r -d '' f; do
  head -c 4 "$f" 2>/dev/null | grep -q 'ELF' || continue
  ldd "$f" 2>/dev/null | awk '/=> \// {print $3} /^\t\// {print $1}' >> "$files" || true
done < <(find "$build" -type f \( -perm -u+x -o -name '*.so' \) -print0)

KC_PACKAGES="${packages[*]}" python3 - "$files" <<'PY'
import os, re, subprocess, sys

paths = sorted({os.path.normpath(l.strip()) for l in open(sys.argv[1]) if l.strip()})
listed = os.environ["KC_PACKAGES"].split()

# path -> package, through dpkg -S (the path as given, then its real path and
# the merged-/usr twin, since dpkg records whichever the package shipped)
def candidates(p):
    out = [p, os.path.realpath(p)]
    for c in list(out):
        out.append(c[4:] if c.startswith("/usr/") else "/usr" + c)
    return list(dict.fromkeys(out))

owner = {}
todo = {}
for p in paths:
    for c in candidates(p):
        todo.setdefault(c, []).append(p)
res = subprocess.run(["dpkg", "-S", *todo], capture_output=True, text=True)
for line in res.stdout.splitlines():
    if ": " not in line:
        continue
    pkgs, path = line.split(": ", 1)
    if path in todo and "diversion" not in pkgs:
        for p in todo[path]:
            owner.setdefault(p, pkgs.split(",")[0].strip().split(":")[0])
unowned = [p for p in paths if p not in owner]

# the closure of the listed packages (and the Essential ones) over
# Depends/Pre-Depends, virtual packages through Provides, from dpkg's database
q = subprocess.run(["dpkg-query", "-W", "-f=${Package}\t${Depends}, ${Pre-Depends}\t${Provides}\t${Essential}\n"],
                   capture_output=True, text=True, check=True).stdout
deps, provides, essential = {}, {}, set()
for line in q.splitlines():
    name, dep, prov, ess = (line.split("\t") + ["", "", ""])[:4]
    # of "a | b" apt installs a on a fresh machine, so only a counts
    deps[name] = [re.sub(r"[ :(].*", "", d.split("|")[0].strip()) for d in dep.split(",")
                  if d.strip()]
    for pv in prov.split(","):
        pv = re.sub(r"[ (].*", "", pv.strip())
        if pv:
            provides.setdefault(pv, []).append(name)
    if ess == "yes":
        essential.add(name)
covered, stack = set(), list(listed) + sorted(essential)
while stack:
    p = stack.pop()
    if p in covered:
        continue
    covered.add(p)
    for d in deps.get(p, []) + provides.get(p, []):
        if d not in covered:
            stack.append(d)

missing = {}
for path, pkg in owner.items():
    if pkg not in covered:
        missing.setdefault(pkg, []).append(path)
print(f"check-deps: {len(paths)} system files used by the build, from "
      f"{len(set(owner.values()))} packages; {len(listed)} listed in scripts/setup.sh")
for p in unowned:
    print(f"check-deps: note: {p} belongs to no Debian package (installed by hand?)")
if missing:
    for pkg in sorted(missing):
        ex = ", ".join(sorted(missing[pkg])[:3])
        print(f"check-deps: MISSING package {pkg}: the build uses {ex}"
              f"{' …' if len(missing[pkg]) > 3 else ''}; add it to PACKAGES in scripts/setup.sh")
    sys.exit(1)
print("check-deps: every package the build used is installed by scripts/setup.sh")
PY
