#!/usr/bin/env python3
# make_seeds.py - writes the seed corpus in tests/fuzz/corpus/<target>/ from
# the wire formats documented in cachecore/kc_envelope.h and kc_bundle.h, so
# the fuzzers start from valid envelopes and bundles. Rerun after a format
# change. Files named by a SHA-1 beside these are inputs merged in from long
# runs (`TARGET -merge=1 tests/fuzz/corpus/TARGET build-fuzz/fuzz-corpus/TARGET`);
# crash inputs are added the same way, named crash-*. The bundles written here
# are version 1 (whole envelopes); fuzz_bundle/v2-*.kcb are version 2 bundles
# (compressed-artifact records) written by `kcache export`, since Python's
# standard library has no zstd.
import hashlib
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")


def sha(b):
    return hashlib.sha256(b).digest()


def key_of(text):
    return hashlib.sha256(text.encode()).hexdigest()


def envelope(key, kind, meta, payload):
    kind_b = kind.encode()
    meta_b = meta.encode()
    head = b"KCAE" + struct.pack("<HHIQ", 1, len(kind_b), len(meta_b), len(payload))
    head += sha(payload) + key.encode() + kind_b + meta_b
    return head + sha(head) + payload


def bundle(envelopes, header=None):
    hdr = json.dumps(header or {"created": 1700000000, "producer": "kcache 0.1.0",
                                "devices": ["cpu-x86_64-v3-gcc12"]}).encode()
    out = b"KCBUNDLE" + struct.pack("<HHI", 1, 0, len(hdr)) + hdr
    for env in envelopes:
        out += struct.pack("<BQ", 1, len(env)) + env
    body = struct.pack("<Q", len(envelopes)) + sha(out)
    return out + struct.pack("<BQ", 0xFF, len(body)) + body


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def main():
    meta = json.dumps({"device": "cpu-x86_64-v3-gcc12", "tag": "ci", "created": 1700000000,
                       "graph_fp": key_of("g"), "compile_ms": 1234})
    envs = [
        envelope(key_of("a"), "cpu-so", meta, b"\x7fELF" + bytes(range(256)) * 4),
        envelope(key_of("b"), "graph", "{}", b'{"kernels":[]}'),
        envelope(key_of("c"), "blob", "{}", b""),
        envelope(key_of("d"), "spirv", '{"device":"xpu-8086-56a0"}', b"\x03\x02\x23\x07" * 64),
        envelope(key_of("e"), "autotune", '{"tag":"t"}', b'{"tile":[64,64]}'),
    ]
    for i, e in enumerate(envs):
        write("fuzz_envelope", "valid-%d.kcae" % i, e)
    write("fuzz_envelope", "truncated.kcae", envs[0][:200])
    write("fuzz_envelope", "trailing.kcae", envs[1] + b"x")
    bad = bytearray(envs[1])
    bad[-1] ^= 1
    write("fuzz_envelope", "payload-flip.kcae", bytes(bad))
    write("fuzz_envelope", "bad-version.kcae", envs[2][:4] + b"\x02" + envs[2][5:])

    write("fuzz_bundle", "empty.kcb", bundle([]))
    write("fuzz_bundle", "one.kcb", bundle(envs[:1]))
    write("fuzz_bundle", "five.kcb", bundle(envs))
    write("fuzz_bundle", "dup.kcb", bundle([envs[1], envs[1]]))
    full = bundle(envs[1:3])
    write("fuzz_bundle", "truncated.kcb", full[: len(full) - 20])
    flip = bytearray(full)
    flip[len(full) // 2] ^= 0x40
    write("fuzz_bundle", "flipped.kcb", bytes(flip))

    for i, text in enumerate([key_of("k"), key_of("k").upper(), key_of("k")[:63], "../etc/passwd",
                              "00" * 40, "512M", "10GiB", "4096", "1T", "18446744073709551615",
                              "7kB", ""]):
        write("fuzz_key", "seed-%02d.txt" % i, text)
    write("fuzz_config", "config.conf", "# kcached settings\nlisten = 127.0.0.1:7070\n"
          "data = /var/lib/kcached\nmax-size = 10G\nmax_blob = 512M\nanonymous-read = true\n"
          "threads = 4\ntimeout = 30\nlog-level = debug\ntokens = \"/etc/kcached/tokens\"\n")
    write("fuzz_config", "tokens.txt", "# token scopes name\nsecret1-0123456789ab read ci\n"
          "secret2-0123456789ab read,write builder\nsecret3-0123456789ab admin ops\n"
          "Bearer secret2-0123456789ab\nBasic c2VjcmV0MS0wMTIzNDU2Nzg5YWI6\nBasic OnNlY3JldDEtMDEyMzQ1Njc4OWFi\n")
    write("fuzz_config", "listen-v6.txt", "[::1]:7070\n")
    # a 1100-byte tokens line whose tail is a working admin token (once split
    # in two), and Basic credentials naming another token's user
    write("fuzz_config", "tokens-long-line-admin-tail.txt", "good-token-0123456789 read ok\n" + "a" * 1100 +
          " read reader admin-tail-0123456789 admin x\nBearer admin-tail-0123456789\n")
    write("fuzz_config", "tokens-basic-other-user.txt",
          "secret1-0123456789ab read ci\nsecret2-0123456789ab read,write builder\n"
          "Basic YnVpbGRlcjpzZWNyZXQxLTAxMjM0NTY3ODlhYg==\n"
          "Basic Y2k6c2VjcmV0Mi0wMTIzNDU2Nzg5YWI=\n")
    write("fuzz_config", "listen-port.txt", ":0\n")
    write("fuzz_config", "argv.bin", b"--listen\x00127.0.0.1:0\x00--data\x00/tmp/d\x00"
          b"--max-size=1G\x00\x00KCACHED_THREADS=2\x00KCACHED_LOG_LEVEL=warn\x00")

    def req(name, method, path, headers=(), body=b""):
        text = "%s\n%s\n" % (method, path) + "".join(h + "\n" for h in headers) + "\n"
        write("fuzz_server", name, text.encode() + body)

    adm = "Authorization: Bearer tok-admin-fuzz-0001"
    wr = "Authorization: Bearer tok-write-fuzz-0001"
    rd = "Authorization: Bearer tok-read-fuzz-0001"
    k0 = key_of("a")
    req("healthz", "GET", "/healthz")
    req("metrics", "GET", "/metrics", [rd])
    req("stats", "GET", "/v1/stats", [rd])
    req("put", "PUT", "/v1/artifacts/" + k0, [wr, "Content-Length: %d" % len(envs[0])], envs[0])
    req("put-noauth", "PUT", "/v1/artifacts/" + key_of("b"), [], envs[1])
    req("get", "GET", "/v1/artifacts/" + k0, [rd])
    req("get-zstd", "GET", "/v1/artifacts/" + k0, [rd, "Accept-Encoding: zstd"])
    req("head", "HEAD", "/v1/artifacts/" + k0, [rd])
    req("delete", "DELETE", "/v1/artifacts/" + k0, [adm])
    req("badkey", "GET", "/v1/artifacts/../../etc/passwd", [rd])
    req("missing", "POST", "/v1/artifacts/missing", [wr, "Content-Type: application/json"],
        json.dumps({"keys": [k0, key_of("zz")]}).encode())
    req("bundle-get", "GET", "/v1/bundle?device=cpu-x86_64-v3-gcc12&kind=cpu-so&since=0", [rd])
    req("bundle-post", "POST", "/v1/bundle", [wr], bundle(envs))
    req("ccache-put", "PUT", "/ccache/ab/cdef0123456789", [wr], b"ccache result bytes")
    req("ccache-get", "GET", "/ccache/ab/cdef0123456789", [rd])
    req("ccache-bad", "GET", "/ccache/a/../b", [rd])
    req("basic", "GET", "/healthz", ["Authorization: Basic dXNlcjp0b2stcmVhZA=="])
    # issue 14's attacks: two Content-Length headers, a bundle record that
    # declares 4 GiB, Basic credentials naming another token's user
    req("dup-content-length", "PUT", "/v1/artifacts/" + k0,
        [wr, "Content-Length: %d" % len(envs[0]), "Content-Length: 5"], envs[0])
    big_record = (b"KCBUNDLE" + struct.pack("<HHI", 2, 0, 2) + b"{}" +
                  struct.pack("<BQ", 2, 4 << 30) + b"\x28\xb5\x2f\xfd" + b"\0" * 60)
    req("bundle-record-4gib", "POST", "/v1/bundle", [wr], big_record)
    write("fuzz_bundle", "record-4gib.kcb", big_record)
    b64 = __import__("base64").b64encode
    req("basic-other-user", "GET", "/v1/stats",
        ["Authorization: Basic " + b64(b"writer:tok-read-fuzz-0001").decode()])
    req("basic-other-user-put", "PUT", "/ccache/ab/cdef0123456789",
        ["Authorization: Basic " + b64(b"reader:tok-write-fuzz-0001").decode()], b"x")

    # fuzz_resp: 8 bytes of limits (bulk, args), then the stream, then chunk sizes
    lim = b"\x00\x10\x00\x00\x00\x08\x00\x00"
    write("fuzz_resp", "seed-00.bin", lim + b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n" + b"\x05" * 40)
    write("fuzz_resp", "seed-01.bin",
          lim + b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\nPING\r\n" + b"\x03" * 60)
    write("fuzz_resp", "seed-02.bin", b"\x00\x01\x00\x00\x00\x02\x00\x00*1000000\r\n")
    write("fuzz_resp", "seed-03.bin", lim + b"GET a b\r\n\r\nECHO x\n" + b"\x01" * 30)
    write("fuzz_resp", "seed-04.bin", lim + b"*2\r\n$3\r\nGET\r\n:5\r\n*1\r\n$4\r\nPINGxx")
    # the bad input tests/test_redis.c sends, under the limits kcached uses
    # before AUTH (16 KiB bulks, 10 arguments) and after (here 1 MiB, 1M)
    unauth = struct.pack("<II", 16384, 10)
    authed = struct.pack("<II", 1 << 20, 1 << 20)
    for i, (l, text) in enumerate([
            (authed, b"*3\r\n$3\r\nSET\r\n$4\r\nkeep\r\n$2000000\r\n"),
            (unauth, b"*3\r\n$3\r\nSET\r\n$4\r\nkeep\r\n$20000\r\n"),
            (unauth, b"*11\r\n"),
            (authed, b"*1000000\r\n"),
            (authed, b"*x\r\n"),
            (authed, b"*1\r\n$-5\r\n"),
            (authed, b"*1\r\n$4\r\nPINGxx"),
            (authed, b"*2\r\n$3\r\nGET\r\n:5\r\n"),
            (authed, b"GET " + b"a" * 70000),
            (authed, b"SET k \"unterminated\r\nPING\r\n"),
            (authed, b"*2\r\n$4\r\nAUTH\r\n$99999999999999999999\r\n")]):
        write("fuzz_resp", "bad-%02d.bin" % i, l + text + b"\x07" * 16)

    graph = {"format": "kcache-graph/1", "name": "mlp",
             "inputs": [{"name": "x", "dtype": "f32", "shape": [4, 16]}],
             "params": [{"name": "w", "dtype": "f32", "shape": [16, 8]},
                        {"name": "b", "dtype": "f32", "shape": [8]}],
             "nodes": [{"op": "matmul", "inputs": ["x", "w"], "output": "h"},
                       {"op": "add", "inputs": ["h", "b"], "output": "h2"},
                       {"op": "relu", "inputs": ["h2"], "output": "y"},
                       {"op": "softmax", "inputs": ["y"], "output": "z"}],
             "outputs": ["z"]}
    write("fuzz_graph", "mlp.json", json.dumps(graph, indent=1))
    write("fuzz_graph", "bad.json", '{"format": "kcache-graph/1", "nodes": [')
    zoo = os.path.join(HERE, "..", "..", "examples")
    for root, _, files in os.walk(zoo):
        for f in sorted(files):
            if f.endswith(".json") and os.path.getsize(os.path.join(root, f)) < 65536:
                with open(os.path.join(root, f), "rb") as src:
                    write("fuzz_graph", "zoo-" + f, src.read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
