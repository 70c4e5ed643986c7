"""kcache.Remote against a real kcached: round trips, the kcache tool's
environment defaults, tokens and scopes as exceptions, pull and push through a
Store, signatures and trusted keys."""

import hashlib
import os
import socket
import subprocess

import pytest

import kcache


def test_remote_round_trip_put_get_has_missing(kcached):
    srv = kcached()
    with kcache.Remote(srv.url) as r:
        key = r.put(b"kernel bytes", kind="cpu-so", meta={"device": "d1"})
        assert key == hashlib.sha256(b"kernel bytes").hexdigest()
        assert r.get(key) == b"kernel bytes"
        assert r.has(key) and not r.has("0" * 64)
        assert r.missing([key, "0" * 64, "1" * 64]) == ["0" * 64, "1" * 64]
        assert r.missing([]) == []
        with pytest.raises(kcache.NotFound) as e:
            r.get("0" * 64)
        assert e.value.code == "not-found"
        big = os.urandom(5 << 20)
        kb = r.put(big)
        got = r.get(kb)
        assert isinstance(got, memoryview) and got == big
        assert r.url == srv.url


def test_remote_defaults_come_from_the_cli_environment(kcached, monkeypatch, tmp_path):
    srv = kcached(tokens=True)
    with pytest.raises(kcache.InvalidError, match="KCACHE_REMOTE"):
        kcache.Remote()
    monkeypatch.setenv("KCACHE_REMOTE", srv.url)
    tf = tmp_path / "token"
    tf.write_text("  %s  \n" % srv.tokens["rw"])
    tf.chmod(0o600)
    monkeypatch.setenv("KCACHE_TOKEN_FILE", str(tf))
    key = kcache.Remote().put(b"env")
    # $KCACHE_TOKEN comes before $KCACHE_TOKEN_FILE; an explicit token before both
    monkeypatch.setenv("KCACHE_TOKEN", srv.tokens["read"])
    with pytest.raises(kcache.AuthError):
        kcache.Remote().put(b"read token cannot write")
    assert kcache.Remote(token=srv.tokens["rw"]).put(b"explicit") is not None
    assert kcache.Remote(token_file=str(tf)).put(b"file") is not None
    assert kcache.Remote().get(key) == b"env"
    tf.write_text("\n")
    monkeypatch.delenv("KCACHE_TOKEN")
    with pytest.raises(kcache.InvalidError, match="empty"):
        kcache.Remote()
    with pytest.raises(kcache.InvalidError):
        kcache.Remote("ftp://example.invalid/")


def test_tokens_and_scopes_map_to_auth_and_not_found(kcached):
    srv = kcached(tokens=True)
    key = kcache.Remote(srv.url, token=srv.tokens["rw"]).put(b"secret kernel")
    # no token: 401
    with pytest.raises(kcache.AuthError, match="401") as e:
        kcache.Remote(srv.url).get(key)
    assert e.value.code == "auth"
    # a token the server does not know: 401
    with pytest.raises(kcache.AuthError, match="401"):
        kcache.Remote(srv.url, token="x" * 40).get(key)
    reader = kcache.Remote(srv.url, token=srv.tokens["read"])
    assert reader.get(key) == b"secret kernel"
    with pytest.raises(kcache.NotFound):
        reader.get("0" * 64)
    # a read token that writes: 403
    with pytest.raises(kcache.AuthError, match="403"):
        reader.put(b"not allowed")
    # the refused call did not spoil the object: reads still work
    assert reader.get(key) == b"secret kernel"


def test_unreachable_server_is_server_error_naming_the_url_and_is_retried():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = "http://127.0.0.1:%d" % port
    r = kcache.Remote(url, connect_timeout_ms=500)
    for _ in range(2):  # a handle that gave up is not kept: each call tries again
        with pytest.raises(kcache.ServerError, match="127.0.0.1:%d" % port):
            r.get("0" * 64)


def test_pull_and_push_move_artifacts_between_stores(kcached, tmp_path):
    srv = kcached()
    r = kcache.Remote(srv.url)
    with kcache.Store(tmp_path / "host") as host:
        keys = [host.put(b"k%d" % i, kind="cpu-so", meta={"device": "dev-%d" % (i % 2)})
                for i in range(10)]
        st = r.push(store=host, device="dev-0")
        assert (st["considered"], st["uploaded"], st["skipped"]) == (5, 5, 0)
        st = r.push(store=host)
        assert (st["considered"], st["uploaded"], st["skipped"]) == (10, 5, 5)
    st = r.pull(["dev-1"], store=str(tmp_path / "ci"))
    assert (st["artifacts"], st["imported"], st["devices"]) == (5, 5, ["dev-1"])
    with kcache.Store(tmp_path / "ci") as ci:
        assert sorted(ci) == sorted(keys[1::2])
        assert {e["origin"] for e in ci.entries()} == {"import"}
    st = r.pull("all", store=tmp_path / "ci")
    assert (st["imported"], st["present"]) == (5, 5)
    # devices=None is this machine's fingerprint ids, as `kcache pull`
    st = r.pull(store=tmp_path / "auto")
    assert st["devices"] and all(d.startswith(("cpu-", "xpu-")) for d in st["devices"])


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def test_trusted_keys_refuse_unsigned_and_accept_signed(kcached, tmp_path):
    srv = kcached()
    openssl("genpkey", "-algorithm", "ed25519", "-out", str(tmp_path / "sign.pem"))
    openssl("pkey", "-in", str(tmp_path / "sign.pem"), "-pubout", "-out",
            str(tmp_path / "trusted.pem"))
    plain = kcache.Remote(srv.url)
    unsigned = plain.put(b"unsigned", meta={"device": "d"})
    signer = kcache.Remote(srv.url, sign_key=str(tmp_path / "sign.pem"))
    signed = signer.put(b"signed", meta={"device": "d"})
    careful = kcache.Remote(srv.url, trusted_keys=str(tmp_path / "trusted.pem"))
    assert careful.get(signed) == b"signed"
    with pytest.raises(kcache.TrustError):
        careful.get(unsigned)
    with kcache.Store(tmp_path / "ci", trusted_keys=tmp_path / "trusted.pem") as ci:
        with pytest.raises(kcache.TrustError, match="refused 1") as e:
            plain.pull("all", store=ci)
        assert e.value.stats["imported"] == 1 and e.value.stats["refused"] == 1
        assert ci.get(signed) == b"signed" and unsigned not in ci
    with pytest.raises(kcache.NotFound, match="sign.pem.missing"):
        kcache.Remote(srv.url, trusted_keys=str(tmp_path / "sign.pem.missing"))


def test_remote_failures_reach_logging_not_the_terminal(tmp_path, capfd, caplog):
    r = kcache.Remote("http://127.0.0.1:1", connect_timeout_ms=300)
    with caplog.at_level("WARNING", logger="kcache"):
        with pytest.raises(kcache.ServerError):
            r.get("0" * 64)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert any(rec.name == "kcache" and "unusable" in rec.getMessage() for rec in caplog.records)
