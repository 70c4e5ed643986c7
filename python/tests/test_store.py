"""kcache.Store: round trips, the cache directory it shares with the kcache
tool, errors mapped to exceptions, listing and statistics, damage."""

import hashlib
import json
import os
import subprocess

import pytest

import kcache
from conftest import KCACHE


def cli(*args, env=None, check=True):
    """Runs the kcache tool; returns stdout (bytes)."""
    r = subprocess.run([KCACHE, *args], capture_output=True, env=env)
    if check and r.returncode != 0:
        raise AssertionError("kcache %s: %s" % (" ".join(args), r.stderr.decode()))
    return r.stdout


def test_store_round_trip_keeps_payload_kind_and_meta(store):
    key = store.put(b"hello kernels", kind="cpu-so", meta={"device": "cpu-x", "tag": "t1"})
    assert key == hashlib.sha256(b"hello kernels").hexdigest()
    assert store.get(key) == b"hello kernels"
    assert store.has(key) and key in store
    [e] = store.entries()
    assert (e["key"], e["kind"], e["device"], e["tag"], e["size"]) == (key, "cpu-so", "cpu-x",
                                                                       "t1", 13)
    assert e["origin"] == "local"
    # any buffer goes in; an explicit key is kept; a second put keeps the first entry
    k2 = store.put(memoryview(bytearray(b"abc")), key="ab" * 32)
    assert k2 == "ab" * 32 and store.get(k2) == b"abc"
    assert store.put(b"other", key="ab" * 32) == k2 and store.get(k2) == b"abc"


def test_store_default_is_the_cli_cache_dir(monkeypatch, tmp_path):
    """Store() opens what `kcache` uses without --cache-dir, in the same order:
    $KCACHE_DIR, $XDG_CACHE_HOME/kcache, ~/.cache/kcache; entries put by one
    side are read by the other."""
    assert kcache.default_dir() == os.environ["KCACHE_DIR"]
    monkeypatch.delenv("KCACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert kcache.default_dir() == str(tmp_path / "xdg" / "kcache")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert kcache.default_dir() == str(tmp_path / "home" / ".cache" / "kcache")
    with kcache.Store() as s:
        assert s.path == str(tmp_path / "home" / ".cache" / "kcache")
        key = s.put(b"from python", kind="blob")
    assert cli("get", key, env=dict(os.environ)) == b"from python"
    payload = tmp_path / "payload"
    payload.write_bytes(b"from the tool")
    key2 = cli("put", str(payload), "--kind", "blob", env=dict(os.environ)).decode().strip()
    with kcache.Store() as s:
        assert s.get(key2) == b"from the tool"


def test_store_errors_are_kcache_exceptions_with_messages(store):
    missing = "0" * 64
    with pytest.raises(kcache.NotFound) as e:
        store.get(missing)
    assert missing in str(e.value) and e.value.code == "not-found"
    assert isinstance(e.value, kcache.Error) and isinstance(e.value, LookupError)
    assert not store.has(missing)
    with pytest.raises(kcache.NotFound):
        store.delete(missing)
    with pytest.raises(kcache.InvalidError) as e:
        store.put(b"x", kind="Not A Kind")
    assert "kind" in str(e.value) and isinstance(e.value, ValueError)
    with pytest.raises(kcache.InvalidError, match="not a JSON object"):
        store.put(b"x", meta="[1, 2]")
    with pytest.raises(kcache.InvalidError, match="invalid key"):
        store.put(b"x", key="xyz")
    with pytest.raises(TypeError):
        store.get(b"bytes-key")
    with pytest.raises(TypeError):
        store.put("a str is not a payload")


def test_store_lists_filters_and_counts(store):
    keys = {store.put(b"a%d" % i, kind="graph" if i % 2 else "blob",
                      meta={"device": "dev%d" % (i % 3)}) for i in range(6)}
    assert set(store) == keys and len(store) == 6
    assert sorted(store.keys()) == store.keys()
    assert len(store.keys(kind="graph")) == 3
    assert len(store.keys(device="dev0,dev1")) == 4
    assert store.keys(tag="nothing") == []
    k = sorted(keys)[0]
    store.get(k)
    with pytest.raises(kcache.NotFound):
        store.get("f" * 64)
    store.flush()
    st = store.stats()
    assert st["entries"] == 6 and st["hits"] >= 1 and st["misses"] >= 1
    assert set(st) == {"entries", "blobs", "logical_bytes", "stored_bytes", "file_bytes", "hits",
                       "misses", "evictions", "corrupt", "quarantined", "untrusted"}
    store.delete(k)
    assert k not in store and len(store) == 5


def test_store_size_limit_from_environment_refuses_with_full_error(monkeypatch, tmp_path):
    monkeypatch.setenv("KCACHE_MAX_SIZE", "4K")
    with kcache.Store(tmp_path / "small") as s:
        with pytest.raises(kcache.FullError):
            s.put(os.urandom(64 << 10))
        assert len(s) == 0
    monkeypatch.setenv("KCACHE_MAX_SIZE", "lots")
    with pytest.raises(kcache.InvalidError, match="KCACHE_MAX_SIZE"):
        kcache.Store(tmp_path / "bad")


def test_store_damaged_payload_raises_corrupt_error_then_misses(store):
    data = os.urandom(64 << 10)  # incompressible: stored raw in a pack file
    key = store.put(data)
    store.close()
    [pack] = list((__import__("pathlib").Path(store.path) / "packs").glob("pack-*"))
    raw = bytearray(pack.read_bytes())
    i = raw.find(data[:64])
    assert i > 0
    raw[i + 1000] ^= 0xFF
    pack.write_bytes(bytes(raw))
    with kcache.Store(store.path) as s:
        with pytest.raises(kcache.CorruptError, match="quarantined"):
            s.get(key)
        with pytest.raises(kcache.NotFound):
            s.get(key)
        assert s.stats()["quarantined"] == 1


def test_store_large_payload_is_a_memoryview(store):
    data = os.urandom(3 << 20)
    key = store.put(bytearray(data))
    got = store.get(key)
    assert isinstance(got, memoryview) and got.readonly and got == data
    small = store.get(store.put(b"s" * 1000))
    assert isinstance(small, bytes)


def test_store_closed_raises_and_context_manager_closes(tmp_path):
    with kcache.Store(tmp_path / "c") as s:
        key = s.put(b"x")
    with pytest.raises(kcache.InvalidError, match="closed"):
        s.get(key)
    assert "kcache.Store(" in repr(s)


def test_store_nothing_prints(tmp_path, capfd):
    with kcache.Store(tmp_path / "q") as s:
        key = s.put(b"quiet")
        s.get(key)
        with pytest.raises(kcache.NotFound):
            s.get("1" * 64)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_store_put_json_meta_text_and_entries_match_ls_json(store, tmp_path):
    key = store.put(b"m", meta=json.dumps({"tag": "abc"}))
    [e] = store.entries(tag="abc")
    ls = json.loads(cli("--cache-dir", store.path, "--json", "ls"))
    assert ls == [e] and e["key"] == key


def test_store_moves_a_damaged_database_aside_as_the_tool_does(tmp_path):
    d = tmp_path / "damaged"
    d.mkdir()
    (d / "kcache.db").write_bytes(os.urandom(65536))
    with kcache.Store(d) as s:
        moved, why = s.recovered
        assert os.path.basename(moved).startswith("kcache.db.corrupt-") and why
        assert s.get(s.put(b"fresh start")) == b"fresh start"
    with kcache.Store(d) as s:
        assert s.recovered is None
    with pytest.raises(kcache.CorruptError):  # read-only: nothing is moved
        (d / "kcache.db").write_bytes(os.urandom(65536))
        kcache.Store(d, read_only=True)
