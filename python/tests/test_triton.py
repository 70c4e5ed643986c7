"""kcache.triton, tested by replaying Triton's calls as Triton makes them (Triton
cannot be installed here). What is replayed, from triton-lang/triton:

- python/triton/runtime/cache.py at commit 10852d2ef21250fd4ac56e44ff65f82fe88a45fa
  (the 3.x line): get_cache_manager(key) splits $TRITON_CACHE_MANAGER at ':',
  imports the module, takes the class and builds it with the base32 form of the
  kernel hash (get_override_manager / get_dump_manager add override=True /
  dump=True); RemoteCacheManager builds the $TRITON_REMOTE_CACHE_BACKEND class
  with the same key and calls backend.get([names]) -> {name: bytes} and
  backend.put(name, bytes), keeping groups as {"child_paths": sorted names}.
- python/triton/knobs.py at commit 00c7dbd4070eb07192dd047bc88f19ba310f9dfd:
  newer Triton accepts a hook class only when a class named CacheManager (or
  RemoteCacheBackend) is among its bases (cls.mro()).
- compile() in python/triton/compiler/compiler.py (3.x): get_group(NAME.json);
  on a miss put(module, NAME.EXT) for each stage (text IR as str, the binary as
  bytes), put(json.dumps(metadata), NAME.json, binary=False), then
  put_group(NAME.json, {file: path}); CompiledKernel opens the group's paths
  (read_bytes for the binary, read_text for the rest).
"""

import base64
import hashlib
import importlib
import json
import os

import pytest

import kcache

HASH = hashlib.sha256(b"add_kernel source + options").hexdigest()
STAGES = {"ttir": "module { tt.func @add_kernel() }", "ttgir": "#blocked = ...",
          "llir": "define void @add_kernel()", "ptx": ".visible .entry add_kernel(",
          "cubin": os.urandom(5000)}
METADATA = {"name": "add_kernel", "num_warps": 4, "shared": 0, "hash": HASH}


def triton_key(h):
    """cache.py's _base32: the key Triton hands to the manager."""
    return base64.b32encode(bytes.fromhex(h)).decode().rstrip("=")


def hook_class(var):
    """get_cache_manager / RemoteCacheManager / knobs.env_class: MODULE:CLASS from
    the environment, with knobs.py's check of the class names in its bases."""
    module, name = os.environ[var].split(":")
    cls = getattr(importlib.import_module(module), name)
    wanted = "CacheManager" if var == "TRITON_CACHE_MANAGER" else "RemoteCacheBackend"
    assert any(c.__name__ == wanted for c in cls.mro())
    return cls


def replay_compile_miss(mgr, name="add_kernel"):
    """compile() on a miss: every stage's file, the metadata, then the group."""
    meta_file = name + ".json"
    assert mgr.get_group(meta_file) is None
    group = {}
    for ext, module in STAGES.items():
        group["%s.%s" % (name, ext)] = mgr.put(module, "%s.%s" % (name, ext))
    group[meta_file] = mgr.put(json.dumps(METADATA), meta_file, binary=False)
    mgr.put_group(meta_file, group)
    return group


def replay_compiled_kernel(group):
    """CompiledKernel(src, metadata_group, hash): what it reads from the paths."""
    meta_path = next(p for c, p in group.items() if c.endswith(".json"))
    with open(meta_path) as f:
        metadata = json.load(f)
    asm = {}
    for c, p in group.items():
        if not c.endswith(".json"):
            ext = c.rsplit(".", 1)[1]
            with open(p, "rb" if ext == "cubin" else "r") as f:
                asm[ext] = f.read()
    return metadata, asm


def test_triton_cache_manager_replay_builds_then_hits_on_a_fresh_machine(
        kcached, tmp_path, monkeypatch):
    srv = kcached(tokens=True)
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "kcache.triton:CacheManager")
    monkeypatch.setenv("KCACHE_REMOTE", srv.url)
    monkeypatch.setenv("KCACHE_TOKEN", srv.tokens["rw"])
    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "build-host"))
    cls = hook_class("TRITON_CACHE_MANAGER")
    group = replay_compile_miss(cls(triton_key(HASH)))
    assert replay_compiled_kernel(group) == (METADATA, STAGES)
    # the same process, later: a hit from the group
    again = cls(triton_key(HASH)).get_group("add_kernel.json")
    assert again == group

    # a CI machine: empty cache directory, read-only token, same server
    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "ci"))
    monkeypatch.setenv("KCACHE_TOKEN", srv.tokens["read"])
    mgr = hook_class("TRITON_CACHE_MANAGER")(triton_key(HASH))
    hit = mgr.get_group("add_kernel.json")
    assert hit is not None and set(hit) == set(group)
    assert all(p.startswith(str(tmp_path / "ci")) for p in hit.values())
    assert replay_compiled_kernel(hit) == (METADATA, STAGES)
    with kcache.Store(tmp_path / "ci") as ci:  # the files came into the local store
        assert {e["kind"] for e in ci.entries()} == {"triton"} and len(ci) == len(group) + 1
    # another kernel on the CI machine: a miss, compiled there; its upload is
    # refused (read token) with a warning, the local copy serves the next hit
    other = hashlib.sha256(b"another kernel").hexdigest()
    replay_compile_miss(mgr.__class__(triton_key(other)), "mul_kernel")
    assert mgr.__class__(triton_key(other)).get_group("mul_kernel.json") is not None


def test_triton_group_with_a_missing_file_is_a_miss(tmp_path, monkeypatch):
    from kcache.triton import CacheManager
    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "c"))
    mgr = CacheManager(triton_key(HASH))
    path = mgr.put("ir", "k.ttir")
    mgr.put_group("k.json", {"k.ttir": path, "k.cubin": "/never/written"})
    assert CacheManager(triton_key(HASH)).get_group("k.json") is None
    assert mgr.get_file("k.cubin") is None
    with pytest.raises(kcache.InvalidError, match="plain file name"):
        mgr.put(b"x", "../escape")
    with pytest.raises(kcache.InvalidError):
        CacheManager("../up")


def test_triton_override_and_dump_managers_are_plain_directories(tmp_path, monkeypatch):
    from kcache.triton import CacheManager
    monkeypatch.setenv("TRITON_OVERRIDE_DIR", str(tmp_path / "override"))
    monkeypatch.setenv("TRITON_DUMP_DIR", str(tmp_path / "dump"))
    key = triton_key(HASH)
    assert CacheManager(key, override=True).get_file("add_kernel.ttgir") is None
    (tmp_path / "override" / key).mkdir(parents=True)
    (tmp_path / "override" / key / "add_kernel.ttgir").write_text("patched")
    assert CacheManager(key, override=True).get_file("add_kernel.ttgir") == str(
        tmp_path / "override" / key / "add_kernel.ttgir")
    dumped = CacheManager(key, dump=True).put("ir text", "add_kernel.ttir")
    assert open(dumped).read() == "ir text" and dumped.startswith(str(tmp_path / "dump"))
    with kcache.Store() as s:  # neither touched the store
        assert len(s) == 0


def test_triton_remote_backend_replay_through_remote_cache_manager(kcached, tmp_path,
                                                                  monkeypatch):
    srv = kcached()
    monkeypatch.setenv("TRITON_REMOTE_CACHE_BACKEND", "kcache.triton:RemoteCacheBackend")
    monkeypatch.setenv("KCACHE_REMOTE", srv.url)
    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "host"))
    key = triton_key(HASH)
    backend = hook_class("TRITON_REMOTE_CACHE_BACKEND")(key)
    # RemoteCacheManager.get_group on a miss: the group file is absent
    assert backend.get(["__grp__add_kernel.json"]) == {}
    # RemoteCacheManager.put: str data is encoded; then put_group
    files = {"add_kernel.%s" % e: (m if isinstance(m, bytes) else m.encode())
             for e, m in STAGES.items()}
    files["add_kernel.json"] = json.dumps(METADATA).encode()
    for name, data in files.items():
        backend.put(name, data)
    backend.put("__grp__add_kernel.json", json.dumps({"child_paths": sorted(files)}).encode())

    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "fresh"))
    backend = hook_class("TRITON_REMOTE_CACHE_BACKEND")(key)
    grp = backend.get(["__grp__add_kernel.json"])
    children = json.loads(grp["__grp__add_kernel.json"])["child_paths"]
    got = backend.get(children)
    assert got == files and all(isinstance(v, bytes) for v in got.values())
    assert backend.get(["add_kernel.nothing"]) == {}


def test_triton_backend_with_server_down_is_a_logged_miss(tmp_path, monkeypatch, caplog):
    from kcache.triton import RemoteCacheBackend
    monkeypatch.setenv("KCACHE_REMOTE", "http://127.0.0.1:1")
    with caplog.at_level("WARNING", logger="kcache"):
        backend = RemoteCacheBackend(triton_key(HASH))
        assert backend.get(["add_kernel.json"]) == {}
        backend.put("add_kernel.json", b"{}")  # kept locally, upload warned about
        assert backend.get(["add_kernel.json"]) == {"add_kernel.json": b"{}"}
    assert any("127.0.0.1:1" in r.getMessage() for r in caplog.records)
