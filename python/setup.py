"""pip install ./python: the kcache package, its C extension built by the
project's own CMake build from the source tree around this folder.

There is deliberately no pyproject.toml: with one, pip builds in an isolated
environment and downloads setuptools from PyPI, which an offline machine cannot
do. Without it, pip uses the setuptools and wheel installed with the interpreter
(Debian: python3-setuptools, python3-wheel), so `pip install ./python` works
offline. (pip 25.3 and later always isolate: there, use
`pip install --no-build-isolation ./python`.)

Environment:
  KCACHE_SOURCE_DIR       the kcache source tree (default: the folder above this one)
  KCACHE_CMAKE_BUILD_DIR  an already configured build tree to build the module in
                          (default: a fresh one under pip's build directory)
  KCACHE_CMAKE_ARGS       extra arguments for the CMake configure step
  KCACHE_BUILD_JOBS       parallel build jobs (default: the number of CPUs)
"""

import glob
import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.environ.get("KCACHE_SOURCE_DIR") or os.path.join(HERE, ".."))


def project_version():
    try:
        with open(os.path.join(SOURCE, "CMakeLists.txt")) as f:
            m = re.search(r"project\(kcache VERSION ([0-9.]+)", f.read())
    except OSError:
        m = None
    if not m:
        sys.exit("kcache: %s is not the kcache source tree (set KCACHE_SOURCE_DIR)" % SOURCE)
    return m.group(1)


class CMakeBuild(build_ext):
    """Builds kcache._kcache with CMake (target kcache_python) and copies it in."""

    def build_extension(self, ext):
        build = os.environ.get("KCACHE_CMAKE_BUILD_DIR")
        if not build:
            build = os.path.abspath(os.path.join(self.build_temp, "cmake"))
            args = ["cmake", "-S", SOURCE, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                    "-DKC_TESTS=OFF", "-DKC_WERROR=OFF", "-DPython3_EXECUTABLE=" + sys.executable]
            args += shlex.split(os.environ.get("KCACHE_CMAKE_ARGS", ""))
            subprocess.run(args, check=True)
        jobs = os.environ.get("KCACHE_BUILD_JOBS") or str(os.cpu_count() or 1)
        subprocess.run(["cmake", "--build", build, "--target", "kcache_python", "-j", jobs],
                       check=True)
        built = glob.glob(os.path.join(build, "python", "kcache", "_kcache*.so"))
        if len(built) != 1:
            sys.exit("kcache: expected one _kcache module in %s/python/kcache, found %s"
                     % (build, built or "none"))
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(built[0], dest)


setup(
    name="kcache",
    version=project_version(),
    description="kcache, the compilation cache for tensor kernels, from Python",
    packages=["kcache"],
    package_data={"kcache": ["*.pyi", "py.typed"]},
    ext_modules=[Extension("kcache._kcache", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
    zip_safe=False,
)
