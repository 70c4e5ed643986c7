"""kcache.torch (PyTorch's Mega Cache in a slot).

Against the real framework: Debian's torch (1.13), which has no Mega Cache, must
give a clear error naming its version. Replayed: torch >= 2.7 cannot be
installed here, so its two calls are replayed as pytorch/pytorch
torch/compiler/__init__.py (commit 00b38ce20cc165137aae47d4d67430d353f04be2)
defines them: save_cache_artifacts() -> Optional[tuple[bytes, CacheInfo]] (None
when nothing was compiled) and load_cache_artifacts(serialized_artifacts: bytes)
-> Optional[CacheInfo].
"""

import subprocess
import sys
import types

import pytest

import kcache


def test_import_adapters_without_importing_the_frameworks():
    r = subprocess.run(
        [sys.executable, "-c",
         "import sys, kcache.torch, kcache.triton\n"
         "assert 'torch' not in sys.modules and 'triton' not in sys.modules, sys.modules.keys()\n"
         "print('ok')"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def check_missing_api_is_named(torch, tmp_path):
    import kcache.torch
    with pytest.raises(kcache.UnsupportedError) as e:
        kcache.torch.save("model", version_key="v1", store=tmp_path / "c")
    assert "torch %s" % torch.__version__ in str(e.value)
    assert "save_cache_artifacts" in str(e.value)
    with pytest.raises(kcache.UnsupportedError, match="load_cache_artifacts"):
        kcache.torch.load("model", version_key="v1", store=tmp_path / "c")
    with kcache.Store(tmp_path / "c") as s:
        assert len(s) == 0


def test_torch_without_mega_cache_raises_naming_its_version(tmp_path, monkeypatch):
    # replayed: a torch older than 2.7 (no torch.compiler.save_cache_artifacts)
    old = types.ModuleType("torch")
    old.__version__ = "2.1.0"
    old.compiler = types.SimpleNamespace()
    monkeypatch.setitem(sys.modules, "torch", old)
    check_missing_api_is_named(old, tmp_path)


def test_debians_torch_without_mega_cache_raises_naming_its_version(tmp_path):
    # the real framework where it is installed: Debian's python3-torch 1.13 is a
    # benchmark dependency, never one of the tests'
    torch = pytest.importorskip("torch")
    assert not hasattr(getattr(torch, "compiler", None), "save_cache_artifacts")
    check_missing_api_is_named(torch, tmp_path)


class FakeMegaCache:
    """torch 2.7's torch.compiler.save_cache_artifacts / load_cache_artifacts."""

    def __init__(self, version="2.7.0"):
        self.artifacts = None  # what torch.compile produced in this process
        self.loaded = []
        self.module = types.ModuleType("torch")
        self.module.__version__ = version
        self.module.__file__ = "/replayed/torch/__init__.py"
        self.module.compiler = types.SimpleNamespace(
            save_cache_artifacts=self.save_cache_artifacts,
            load_cache_artifacts=self.load_cache_artifacts)
        self.module.cuda = types.SimpleNamespace(is_available=lambda: False)

    def save_cache_artifacts(self):
        if self.artifacts is None:
            return None
        return self.artifacts, {"inductor_artifacts": ["fx-graph"]}

    def load_cache_artifacts(self, serialized_artifacts):
        assert isinstance(serialized_artifacts, bytes)
        self.loaded.append(serialized_artifacts)
        return {"inductor_artifacts": ["fx-graph"]}


def test_mega_cache_replay_saves_on_a_build_host_and_loads_on_a_fresh_one(
        kcached, tmp_path, monkeypatch):
    import kcache.torch
    srv = kcached(tokens=True)
    fake = FakeMegaCache()
    monkeypatch.setitem(sys.modules, "torch", fake.module)
    monkeypatch.setenv("KCACHE_REMOTE", srv.url)
    monkeypatch.setenv("KCACHE_TOKEN", srv.tokens["rw"])
    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "host"))
    assert kcache.torch.save("resnet", version_key="v1") is None  # nothing compiled yet
    fake.artifacts = b"first artifacts " * 1000
    k1 = kcache.torch.save("resnet", version_key="v1")
    fake.artifacts = b"second artifacts " * 1000
    k2 = kcache.torch.save("resnet", version_key="v1")
    assert k1 != k2

    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "ci"))
    monkeypatch.setenv("KCACHE_TOKEN", srv.tokens["read"])
    assert kcache.torch.load("resnet", version_key="v1") == {"inductor_artifacts": ["fx-graph"]}
    assert fake.loaded == [b"second artifacts " * 1000]  # the newest save of the slot
    # another slot: other version key, device, torch version or name
    for kwargs in ({"version_key": "v2"}, {"version_key": "v1", "device": "cuda:H100"}):
        with pytest.raises(kcache.NotFound, match="resnet"):
            kcache.torch.load("resnet", **kwargs)
    with pytest.raises(kcache.NotFound):
        kcache.torch.load("bert", version_key="v1")
    fake.module.__version__ = "2.8.0"
    with pytest.raises(kcache.NotFound, match="2.8.0"):
        kcache.torch.load("resnet", version_key="v1")
    assert len(fake.loaded) == 1


def test_mega_cache_replay_without_a_server_uses_the_local_store(tmp_path, monkeypatch):
    import kcache.torch
    fake = FakeMegaCache()
    monkeypatch.setitem(sys.modules, "torch", fake.module)
    fake.artifacts = b"local"
    key = kcache.torch.save("m", version_key="v", store=tmp_path / "s")
    with kcache.Store(tmp_path / "s") as s:
        [e] = s.entries(kind="megacache")
        assert e["key"] == key and e["device"].startswith("megacache-")
    kcache.torch.load("m", version_key="v", store=tmp_path / "s")
    assert fake.loaded == [b"local"]
    with pytest.raises(kcache.InvalidError):
        kcache.torch.save("", version_key="v", store=tmp_path / "s")
