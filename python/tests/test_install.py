"""The package installs offline: `pip install ./python` into a virtual
environment (Debian's pip refuses system installs, PEP 668), and `cmake
--install` into a prefix; each installed copy is imported from outside the
source and build trees and does a round trip."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import SANITIZED

SRC = os.environ.get("KC_TEST_SOURCE_DIR", "")
BUILD = os.environ.get("KC_TEST_BINARY_DIR", "")
ROUND_TRIP = ("import kcache, sys\n"
              "s = kcache.Store(sys.argv[1])\n"
              "k = s.put(b'installed')\n"
              "assert s.get(k) == b'installed'\n"
              "print(kcache.__file__)\n")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "PIP_", "LD_PRELOAD", "ASAN_"))}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


def run(args, **kw):
    r = subprocess.run(args, capture_output=True, text=True, **kw)
    assert r.returncode == 0, "%s\n%s\n%s" % (" ".join(args), r.stdout[-3000:], r.stderr[-3000:])
    return r.stdout


@pytest.mark.skipif(SANITIZED, reason="the installed module is the ASan build's: a fresh "
                    "interpreter would need libasan preloaded, which the install does not do")
def test_pip_install_offline_into_a_venv(tmp_path):
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)])
    # a copy of python/ keeps pip's build files out of the source tree; the
    # module comes from this build tree (a from-scratch build is the same
    # CMake target, configured by setup.py)
    pkg = tmp_path / "src"
    shutil.copytree(os.path.join(SRC, "python"), pkg,
                    ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__"))
    env = clean_env(KCACHE_SOURCE_DIR=SRC, KCACHE_CMAKE_BUILD_DIR=BUILD)
    run([str(venv / "bin" / "pip"), "install", "--no-index", str(pkg)], env=env, cwd=tmp_path)
    where = run([str(venv / "bin" / "python"), "-c", ROUND_TRIP, str(tmp_path / "cache")],
                env=clean_env(), cwd=tmp_path)
    assert where.startswith(str(venv)), where
    run([str(venv / "bin" / "python"), "-c", "import kcache.triton, kcache.torch"],
        env=clean_env(), cwd=tmp_path)


@pytest.mark.skipif(SANITIZED, reason="as above: the ASan build's module needs libasan preloaded")
def test_cmake_install_puts_an_importable_package_under_the_prefix(tmp_path):
    prefix = tmp_path / "prefix"
    run(["cmake", "--install", BUILD, "--component", "python", "--prefix", str(prefix)])
    [site] = list(prefix.glob("lib/python3*/dist-packages"))
    assert sorted(p.name for p in (site / "kcache").iterdir() if p.suffix != ".so") == sorted(
        n for n in os.listdir(os.path.join(SRC, "python", "kcache")) if n != "__pycache__")
    where = run([sys.executable, "-c", ROUND_TRIP, str(tmp_path / "cache")],
                env=clean_env(PYTHONPATH=str(site)), cwd=tmp_path)
    assert where.startswith(str(site)), where
