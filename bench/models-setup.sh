#!/usr/bin/env bash
# bench/models-setup.sh - installs what bench/models.sh needs besides kcache's own
# packages: Debian's PyTorch 1.13 (python3-torch, python3-torchvision) and OpenBLAS
# (libopenblas0-pthread). Benchmark dependencies only: no test and no part of
# scripts/setup.sh needs them.
#
# Debian's libtorch links the generic libblas.so.3, which update-alternatives points
# at one implementation (`update-alternatives --display libblas.so.3-x86_64-linux-gnu`).
# With only the reference BLAS (libblas3) installed torch's GEMMs are several times
# slower (mobilenet_v2: ~100 ms against ~14 ms), so that is no anchor to compare with.
# Installing libopenblas0-pthread makes OpenBLAS the automatic choice (its alternative
# has the higher priority); bench/models.sh does not rely on that system-wide setting:
# it puts OpenBLAS's directory first in torch's LD_LIBRARY_PATH and checks which
# libblas each torch process actually mapped.
set -euo pipefail
PACKAGES=(python3-torch python3-torchvision libopenblas0-pthread python3-onnx python3-numpy)
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    echo "models-setup: installing ${missing[*]}"
    SUDO=""
    [[ $(id -u) -eq 0 ]] || SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
    echo "models-setup: all ${#PACKAGES[@]} packages present"
fi
OPENBLAS_DIR=/usr/lib/x86_64-linux-gnu/openblas-pthread
[[ -e $OPENBLAS_DIR/libblas.so.3 ]] || { echo "models-setup: $OPENBLAS_DIR/libblas.so.3 missing after the install" >&2; exit 1; }
echo "models-setup: system libblas.so.3 -> $(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3)"
echo "models-setup: bench/models.sh runs torch with LD_LIBRARY_PATH=$OPENBLAS_DIR"
