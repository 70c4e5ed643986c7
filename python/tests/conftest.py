"""Fixtures of the kcache Python tests: a private environment (no KCACHE_*
setting of the developer's leaks in), a real kcached on 127.0.0.1 with an
ephemeral port (readiness through --port-file, as tests/util/kc_testserver.c
does), and its tokens. ctest runs this suite with PYTHONPATH at the build's
copy of the package and KC_TEST_KCACHED / KC_TEST_KCACHE naming the binaries.
"""

import os
import secrets
import signal
import subprocess
import time

import pytest

KCACHED = os.environ.get("KC_TEST_KCACHED", "")
KCACHE = os.environ.get("KC_TEST_KCACHE", "")
SANITIZED = os.environ.get("KC_TEST_SANITIZED") == "1"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """No KCACHE_* or framework cache variable from outside; the default cache
    directory is a fresh one under tmp_path."""
    for name in list(os.environ):
        if name.startswith(("KCACHE_", "KCACHED_", "TRITON_", "TORCHINDUCTOR_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "default-cache"))


class Server:
    """A running kcached: url, data directory, and the tokens it was given."""

    def __init__(self, root, args, tokens):
        self.root = root
        self.data = root / "data"
        self.tokens = tokens
        self.port_file = root / "port"
        self.log = open(root / "kcached.log", "ab")
        self.proc = subprocess.Popen(
            [KCACHED, "--listen", "127.0.0.1:0", "--data", str(self.data),
             "--port-file", str(self.port_file), "--log-level", "warn", *args],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
            env={k: v for k, v in os.environ.items() if not k.startswith("KCACHED_")})
        deadline = time.monotonic() + 30
        while True:
            if self.port_file.exists() and self.port_file.read_text().strip():
                self.port = int(self.port_file.read_text())
                break
            if self.proc.poll() is not None:
                raise RuntimeError("kcached exited: " + (root / "kcached.log").read_text())
            if time.monotonic() > deadline:
                raise RuntimeError("kcached did not start in 30 s")
            time.sleep(0.01)
        self.url = "http://127.0.0.1:%d" % self.port

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def kcached(tmp_path):
    """Starts kcached servers: kcached(tokens=True, args=[...]) -> Server.
    With tokens, server.tokens maps 'rw', 'read' and 'admin' to tokens of those
    scopes."""
    if not KCACHED:
        pytest.fail("KC_TEST_KCACHED is not set (ctest sets it)")
    servers = []

    def start(tokens=False, args=()):
        root = tmp_path / ("kcached-%d" % len(servers))
        root.mkdir()
        args = list(args)
        toks = {}
        if tokens:
            toks = {"rw": secrets.token_hex(20), "read": secrets.token_hex(20),
                    "admin": secrets.token_hex(20)}
            path = root / "tokens"
            path.write_text("%s read,write build-host\n%s read ci\n%s admin ops\n"
                            % (toks["rw"], toks["read"], toks["admin"]))
            path.chmod(0o600)
            args += ["--tokens", str(path)]
        s = Server(root, args, toks)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


@pytest.fixture
def store(tmp_path):
    import kcache
    with kcache.Store(tmp_path / "cache") as s:
        yield s


def rss_bytes(field):
    """VmRSS, VmHWM, ... of this process in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)
