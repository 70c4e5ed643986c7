"""kcache.compile: the summary `kcache compile --json` prints, through the same
cache tiers (local store, then kcached), and its errors."""

import json
import os
import subprocess

import pytest

import kcache
from conftest import KCACHE

SRC = os.environ.get("KC_TEST_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
MLP = os.path.join(SRC, "examples", "mlp.json")


def cli_compile(cache, *args):
    r = subprocess.run([KCACHE, "--cache-dir", str(cache), "--json", "compile", *args],
                       capture_output=True, check=True)
    return json.loads(r.stdout)


def test_compile_summary_matches_the_cli_json(tmp_path):
    cache = tmp_path / "cache"
    got = kcache.compile(MLP, store=cache, offline=True)
    want = cli_compile(cache, MLP, "--offline")
    assert set(got) == set(want)
    for k in ("graph", "graph_fp", "graph_key", "device", "backend", "kernels"):
        assert got[k] == want[k], k
    assert got["misses"] > 0 and got["compiled"] > 0 and not got["graph_hit"]
    # the tool found what Python compiled, and the other way round
    assert want["graph_hit"] and want["misses"] == 0
    again = kcache.compile(MLP, store=kcache.Store(cache), offline=True, require_hit=True)
    assert again["graph_hit"] and again["hits"] == again["kernels"] and again["compiled"] == 0


def test_compile_require_hit_on_empty_cache_raises_miss_error(tmp_path):
    with pytest.raises(kcache.MissError) as e:
        kcache.compile(MLP, store=tmp_path / "empty", offline=True, require_hit=True)
    assert e.value.code == "miss"


def test_compile_through_kcached_pushes_then_hits_remotely(kcached, tmp_path):
    srv = kcached(tokens=True)
    host = kcache.compile(MLP, store=tmp_path / "host",
                          remote=kcache.Remote(srv.url, token=srv.tokens["rw"]))
    assert host["compiled"] > 0
    ci = kcache.compile(MLP, store=tmp_path / "ci",
                        remote=kcache.Remote(srv.url, token=srv.tokens["read"]))
    assert ci["compiled"] == 0 and ci["remote_hits"] > 0 and ci["graph_key"] == host["graph_key"]


def test_compile_bad_input_raises_naming_what_was_wrong(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "kcache-graph/1", "nodes": [}')
    with pytest.raises(kcache.InvalidError, match="bad.json"):
        kcache.compile(bad, store=tmp_path / "c", offline=True)
    with pytest.raises(kcache.Error, match="nope.json"):
        kcache.compile(tmp_path / "nope.json", store=tmp_path / "c", offline=True)
    with pytest.raises(kcache.InvalidError, match="wrapper"):
        kcache.compile(MLP, store=tmp_path / "c", offline=True, cflags="-wrapper /bin/sh")
    with pytest.raises(kcache.InvalidError, match="device"):
        kcache.compile(MLP, store=tmp_path / "c", offline=True, device="gpu9000")
    with pytest.raises(kcache.InvalidError, match="shape"):
        kcache.compile(MLP, store=tmp_path / "c", offline=True, shape=["no-equals-sign"])
