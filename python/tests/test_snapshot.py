"""kcache.snapshot: a directory pushed to a real kcached and pulled into another
cache directory, status and explain, the trust rules of the library (a directory
others can write raises TrustError before anything is sent), and the GIL released
while a call waits on the server."""

import os
import socket
import threading
import time

import pytest

import kcache
import kcache.snapshot as snap

from test_threads import syscall_of


def tree(root, files):
    for rel, (data, mode) in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        p.chmod(mode)


FILES = {"ABC/kernel.cubin": (os.urandom(70_000), 0o644),
         "ABC/kernel.json": (b'{"name": "k"}', 0o644),
         "run.sh": (b"#!/bin/sh\n", 0o755),
         "x.lock": (b"", 0o644)}


def test_push_pull_status_explain_round_trip(kcached, tmp_path):
    srv = kcached()
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir(mode=0o755)
    tree(src, FILES)
    pushed = snap.push(str(src), "triton", "triton=3.3.0", device_key="h100",
                       remote=srv.url, store=tmp_path / "host")
    assert pushed["files"] == 3 and pushed["excluded"] == 1  # the preset's *.lock
    assert pushed["files_sent"] == 3 and pushed["manifest_sent"] is True
    assert pushed["unchanged"] is False
    again = snap.push(src, "triton", "triton=3.3.0", device_key="h100", remote=srv.url,
                      store=tmp_path / "host")
    assert again["unchanged"] is True and again["manifest"] == pushed["manifest"]
    assert again["files_sent"] == 0

    remote = kcache.Remote(srv.url)
    with kcache.Store(tmp_path / "client") as store:
        got = snap.pull("triton", dst, "triton=3.3.0", device_key="h100", remote=remote,
                        store=store, verify=True)
        assert got["manifest"] == pushed["manifest"]
        assert got["written"] == 3 and got["files_received"] == 3 and got["missing"] == 0
        for rel, (data, mode) in FILES.items():
            if rel.endswith(".lock"):
                assert not (dst / rel).exists()
                continue
            assert (dst / rel).read_bytes() == data
            assert (dst / rel).stat().st_mode & 0o777 == mode & ~0o022
        assert snap.status("triton", dst, "triton=3.3.0", device_key="h100",
                           store=store)["ok"] is True
        (dst / "ABC/kernel.json").write_bytes(b"changed")
        st = snap.status("triton", dst, "triton=3.3.0", device_key="h100", store=store)
        assert st["ok"] is False and st["missing"] == 1

        found = snap.explain("triton", "triton=3.3.0", device_key="h100", remote=remote,
                             store=store)
        assert found["found"] is True and found["files"] == 3
        miss = snap.explain("triton", "triton=3.4.0", device_key="h100", remote=remote,
                            store=store)
        assert miss["found"] is False
        assert {"device_key": "h100", "version_key": "triton=3.3.0",
                "differs": "version"} in miss["nearest"]
        with pytest.raises(kcache.NotFound, match="no snapshot 'triton'"):
            snap.pull("triton", tmp_path / "dst2", "triton=3.4.0", device_key="h100",
                      remote=remote, store=store)


def test_a_preset_name_takes_the_frameworks_directory(kcached, tmp_path, monkeypatch):
    srv = kcached()
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    tree(src, {"ABC/k.cubin": (b"cubin", 0o644)})
    monkeypatch.setenv("TRITON_CACHE_DIR", str(src))
    r = snap.push(None, "triton", "t=3", device_key="g", remote=srv.url, store=tmp_path / "a")
    assert r["dir"] == str(src)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(dst))
    r = snap.pull("triton", None, "t=3", device_key="g", remote=srv.url, store=tmp_path / "b")
    assert r["dir"] == str(dst) and (dst / "ABC/k.cubin").read_bytes() == b"cubin"
    with pytest.raises(kcache.InvalidError, match="unknown preset"):
        snap.pull("x", None, "t=3", preset="torch", device_key="g", store=tmp_path / "b")
    # without a device key: this machine's CPU fingerprint id, as `kcache dir` has it
    r = snap.push(src, "mine", "t=3", store=tmp_path / "a")
    assert r["device_key"].startswith("cpu-"), r


def test_a_directory_others_can_write_raises_trust_error(kcached, tmp_path):
    srv = kcached()
    shared = tmp_path / "shared"
    shared.mkdir()
    tree(shared, {"evil/__init__.py": (b"import os", 0o644)})
    shared.chmod(0o777)  # any user could have put files in it
    with pytest.raises(kcache.TrustError, match="lets every user write into it"):
        snap.push(shared, "inductor", "torch=2.7", device_key="g", remote=srv.url,
                  store=tmp_path / "host")
    # nothing reached the server
    assert snap.explain("inductor", "torch=2.7", device_key="g", remote=srv.url,
                        store=tmp_path / "other")["found"] is False
    # another user's directory (as root can make one here)
    if os.geteuid() == 0:
        shared.chmod(0o755)
        os.chown(shared, 65534, 65534)
        with pytest.raises(kcache.TrustError, match="belongs to uid 65534"):
            snap.push(shared, "inductor", "torch=2.7", device_key="g", remote=srv.url,
                      store=tmp_path / "host")
        r = snap.push(shared, "inductor", "torch=2.7", device_key="g", remote=srv.url,
                      store=tmp_path / "host", trust_shared_dir=True)
        assert r["files"] == 1


def test_a_snapshot_call_waiting_on_the_server_lets_other_threads_run(tmp_path):
    # a server that takes the connection and never answers
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(4)
    url = "http://127.0.0.1:%d" % lst.getsockname()[1]
    remote = kcache.Remote(url, timeout_ms=60000, connect_timeout_ms=60000)
    done, errors = [], []

    def pull():
        try:
            snap.pull("triton", tmp_path / "dst", "t=3", device_key="g", remote=remote,
                      store=tmp_path / "c")
        except kcache.Error as e:
            errors.append(e)
        done.append(True)

    t = threading.Thread(target=pull)
    t.start()
    try:
        # seeing the pulling thread wait in poll from here means this thread runs
        # while the other is inside the C call, which it could not with the GIL held
        deadline = time.monotonic() + 30
        while syscall_of(t) not in (7, 232, 271, 281, 441):  # poll, epoll_wait, ppoll, ...
            assert time.monotonic() < deadline, "the pull never waited on the server"
            assert not done, "the pull returned although the server never answered"
            time.sleep(0.001)
    finally:
        lst.close()
    t.join(90)
    assert done and errors  # the server went away: an error, not a hang
