#!/usr/bin/env bash
# Installs every Debian bookworm package that kcache's build, tests and
# benchmarks need, skipping the work when all are present. Run as root (or
# with sudo available).
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git ca-certificates curl
  libsqlite3-dev sqlite3 libzstd-dev zstd libssl-dev openssl nettle-dev libjansson-dev libxxhash-dev
  libmicrohttpd-dev libgnutls28-dev libcurl4-openssl-dev libcriterion-dev
  libdnnl-dev libze-dev libze1
  clang-14 llvm-spirv-14 spirv-tools libclang-rt-14-dev clang-format pocl-opencl-icd
  opencl-c-headers ocl-icd-opencl-dev
  ccache nginx-light wrk procps iproute2 python3 time zsh
  libonnx-dev libonnx-testdata libprotobuf-c-dev protobuf-c-compiler
  python3-onnx python3-numpy python3-redis redis-server redis-tools
  # the Python package: its build, its tests, an offline `pip install ./python`
  python3-dev python3-pytest python3-setuptools python3-wheel python3-venv python3-pip
  chromium prometheus
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# s3rver (tests of the S3 tier) needs Node.js; the machine image usually has
# it outside Debian's packages, so only fall back to Debian's when absent.
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
