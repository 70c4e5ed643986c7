#!/usr/bin/env bash
# Builds kcache the two ways packagers do, with warnings as errors, so that
# neither breaks unnoticed: the Release build deploy/README.md documents (-O3,
# where gcc's value-range warnings such as format-truncation appear), and
# Debian's way (build type None with dpkg-buildflags' CFLAGS, CPPFLAGS and
# LDFLAGS, hardening=+all: _FORTIFY_SOURCE, stack protector, format-security,
# relro/now). Build only, no tests; each in a directory of its own.
# Usage: scripts/build-packagers.sh [DIR_PREFIX]   (default build-pkg: build-pkg-release/,
# build-pkg-debian/). Extra cmake arguments come from KC_PKG_CMAKE_ARGS.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:-build-pkg}
# shellcheck disable=SC2206
extra=(${KC_PKG_CMAKE_ARGS:-})

build() { # DIR LABEL CMAKE_ARGS...
  local dir=$1 label=$2
  shift 2
  local start=$SECONDS
  mkdir -p "$dir"
  cmake -S . -B "$dir" -DKC_WERROR=ON "$@" "${extra[@]}" >"$dir/configure.log" 2>&1 ||
    { cat "$dir/configure.log"; echo "build-packagers: $label: configure failed" >&2; exit 1; }
  cmake --build "$dir" -j"$(nproc)" >"$dir/build.log" 2>&1 ||
    { grep -E -B2 -A6 'error|warning' "$dir/build.log" | head -n 80
      echo "build-packagers: $label build failed (log: $dir/build.log)" >&2; exit 1; }
  echo "build-packagers: $label build clean with -Werror ($((SECONDS - start)) s)"
}

build "$prefix-release" "Release" -DCMAKE_BUILD_TYPE=Release

export DEB_BUILD_MAINT_OPTIONS=hardening=+all
# CMake reads CFLAGS and LDFLAGS but not CPPFLAGS: debhelper appends them to CFLAGS too
CFLAGS="$(dpkg-buildflags --get CFLAGS) $(dpkg-buildflags --get CPPFLAGS)" \
  LDFLAGS="$(dpkg-buildflags --get LDFLAGS)" \
  build "$prefix-debian" "Debian (dpkg-buildflags, hardening=+all)" -DCMAKE_BUILD_TYPE=None
