"""Replays the Redis traffic of PyTorch's remote caches against kcached with
redis-py, the client they use, unchanged. Run by tests/test_redis.c:

    clients.py PORT SCENARIO [PASSWORD [USERNAME]]

SCENARIO inductor: Inductor's FX-graph / AOTAutograd / autotune remote caches
(RedisRemoteCacheBackend: GET, then SET of JSON on a miss, keys
"pt2:<cache-id>::<sha256>:c1", optionally with EX). triton: Triton's
RedisRemoteCacheBackend (MGET of "triton:{key}:{filename}", then SET of each
file). auth: a connection with a password (and user name). Exits non-zero with
a message on any difference from what Redis would answer."""
import hashlib
import json
import sys

import redis


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def inductor(r):
    for cache_id in ("fx-graph-v1", "aot-autograd-v1", "autotune-best-config-v2"):
        key = "pt2:%s::%s:c1" % (cache_id, hashlib.sha256(cache_id.encode()).hexdigest())
        check(r.get(key) is None, "%s: a fresh key must miss" % key)
        value = json.dumps({"data": "x" * 5000, "time_taken_ms": 1234}).encode()
        check(r.set(key, value) is True, "SET %s" % key)
        got = r.get(key)
        check(got == value, "GET %s returned %r" % (key, got[:40] if got else got))
        check(json.loads(got)["time_taken_ms"] == 1234, "JSON round trip")
    # the same with a TTL, as deployments that expire entries set it
    key = "pt2:fx-graph-v1::%s:c1" % hashlib.sha256(b"ttl").hexdigest()
    check(r.set(key, b"graph", ex=3600) is True, "SET EX")
    ttl = r.ttl(key)
    check(3590 <= ttl <= 3600, "TTL %r" % ttl)
    check(r.exists(key) == 1, "EXISTS")
    # binary values with CR, LF and NUL bytes come back exactly
    blob = bytes(range(256)) * 64 + b"\r\n\x00\r\n"
    check(r.set("pt2:bin", blob) is True and r.get("pt2:bin") == blob, "binary value")
    # a pipeline of many commands in one write
    p = r.pipeline(transaction=False)
    for i in range(200):
        p.set("pt2:pipe:%d" % i, str(i))
    for i in range(200):
        p.get("pt2:pipe:%d" % i)
    res = p.execute()
    check(res[:200] == [True] * 200, "pipelined SETs")
    check(res[200:] == [str(i).encode() for i in range(200)], "pipelined GETs")
    check(r.delete("pt2:bin", "pt2:nope") == 1, "DEL counts what existed")
    info = r.info("stats")
    check(info["keyspace_hits"] > 0 and info["keyspace_misses"] > 0, "INFO stats %r" % info)


def triton(r):
    key = hashlib.sha256(b"triton kernel").hexdigest()
    files = ["triton_.cubin", "triton_.json", "triton_.ptx", "__grp__triton_.json"]
    keys = ["triton:%s:%s" % (key, f) for f in files]
    check(r.mget(keys) == [None] * len(files), "cold MGET")
    contents = [("%s contents " % f).encode() * 300 for f in files]
    for k, c in zip(keys, contents):
        check(r.set(k, c) is True, "SET %s" % k)
    check(r.mget(keys) == contents, "warm MGET")
    check(r.mget(keys[:1] + ["triton:%s:missing" % key]) == [contents[0], None], "mixed MGET")


def auth(r):
    check(r.ping() is True, "PING")
    check(r.set("auth:k", b"v") is True and r.get("auth:k") == b"v", "SET/GET after AUTH")


def main():
    port = int(sys.argv[1])
    scenario = sys.argv[2]
    password = sys.argv[3] if len(sys.argv) > 3 else None
    username = sys.argv[4] if len(sys.argv) > 4 else None
    r = redis.Redis(host="127.0.0.1", port=port, password=password, username=username,
                    socket_timeout=30)
    {"inductor": inductor, "triton": triton, "auth": auth}[scenario](r)
    print("OK " + scenario)


main()
