#!/usr/bin/python3
"""Fails when a library exports a function that nothing in the tree uses.

Lists the global functions of each static library given (nm), then looks for
each name in every tracked C source and header (libraries, programs, tests,
bench, fuzz targets), comments left out, other than where it is declared or
defined (a line that starts in column 0 and whose first call-shaped name is
it). A function only the tests call still counts as used; one nothing calls
is dead weight in the API and goes. Generated protobuf-c code is skipped.

Usage: scripts/check-callers.py LIB.a...   (ctest runs it as exported_functions_have_callers)
"""
import os
import re
import subprocess
import sys

GENERATED = {"onnx.pb-c.c.o"}
IDENT = re.compile(r"[A-Za-z_]\w*")
DECLARED = re.compile(r"([A-Za-z_]\w*)\s*\(")
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def exported(lib):
    out = subprocess.run(["nm", "-A", "-g", "--defined-only", lib], check=True,
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == "T":
            obj = parts[0].split(":")[-2]
            # generated: protobuf-c's code, and cmake/kc_lazy.cmake's trampolines (which
            # stand for every function of oneDNN / Level Zero / libcurl) with the
            # resolver in kc_lazy.c that only they call
            if obj not in GENERATED and not obj.startswith("kc_lazy"):
                yield parts[2], obj


def sources(root):
    git = subprocess.run(["git", "-C", root, "ls-files", "*.c", "*.h"], capture_output=True,
                         text=True)
    if git.returncode == 0:
        return git.stdout.split()
    return [os.path.relpath(os.path.join(d, f), root)  # not a git checkout (a tarball)
            for top in ("cachecore", "client", "compiler_stub", "server", "tests", "bench", "python")
            for d, _, names in os.walk(os.path.join(root, top))
            for f in names if f.endswith((".c", ".h"))]


def uses(root):
    files = sources(root)
    count = {}
    for name in files:
        with open(os.path.join(root, name), errors="replace") as f:
            text = COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), f.read())
        for line in text.splitlines():
            declared = None
            if line[:1].isalpha() or line[:1] == "_":
                m = DECLARED.search(line)
                if m and not line.startswith(("return", "if ", "while ")):
                    declared = m.group(1)
            for ident in IDENT.findall(line):
                if ident != declared:
                    count[ident] = count.get(ident, 0) + 1
    return count


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    count = uses(root)
    dead = []
    total = 0
    for lib in sys.argv[1:]:
        for sym, obj in exported(lib):
            total += 1
            if count.get(sym, 0) == 0:
                dead.append(f"{os.path.basename(lib)}: {sym} ({obj[:-2]}) is called nowhere")
    for d in dead:
        print("check-callers:", d, file=sys.stderr)
    if dead:
        sys.exit(f"check-callers: {len(dead)} exported functions nothing uses: remove them")
    print(f"check-callers: {total} exported functions, each used somewhere in the tree")


if __name__ == "__main__":
    main()
