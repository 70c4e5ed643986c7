"""Replays the Redis traffic of PyTorch's remote caches against kcached with
redis-py, the client they use, unchanged. Run by tests/test_redis.c:

    clients.py PORT SCENARIO [PASSWORD [USERNAME]]

SCENARIO inductor: Inductor's FX-graph / AOTAutograd / autotune remote caches
(RedisRemoteCacheBackend: GET, then SET of JSON on a miss, keys
"pt2:<cache-id>::<sha256>:c1", optionally with EX). triton: Triton's
RedisRemoteCacheBackend (MGET of "triton:{key}:{filename}", then SET of each
file). auth: a connection with a password (and user name). transactions:
pipeline() as MULTI/EXEC, against a client writing the same key. keyspace:
KEYS and SCAN. Exits non-zero with
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


def transactions(r):
    """redis-py's default pipeline() is MULTI ... EXEC; another client writing
    the same key all along never lands between the transaction's commands."""
    p = r.pipeline()
    p.set("tx:a", "1").get("tx:a").set("tx:a", "2").get("tx:a").delete("tx:nope")
    check(p.execute() == [True, b"1", True, b"2", 0], "a pipeline() transaction")
    other = redis.Redis(host="127.0.0.1", port=r.connection_pool.connection_kwargs["port"],
                        password=r.connection_pool.connection_kwargs.get("password"),
                        username=r.connection_pool.connection_kwargs.get("username"))
    import threading
    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            other.set("tx:k", "intruder")
    t = threading.Thread(target=hammer)
    t.start()
    try:
        for i in range(100):
            p = r.pipeline()
            for j in range(5):
                p.set("tx:k", "%d-%d" % (i, j)).get("tx:k")
            res = p.execute()
            for j in range(5):
                check(res[2 * j + 1] == ("%d-%d" % (i, j)).encode(),
                      "another client's SET ran inside a transaction: %r" % res)
    finally:
        stop.set()
        t.join()
    # DISCARD drops what was queued; an unknown command aborts the whole
    r.execute_command("MULTI")
    r.execute_command("SET", "tx:d", "x")  # +QUEUED (redis-py's SET callback reads it as False)
    check(r.execute_command("DISCARD") in (True, b"OK", "OK"), "DISCARD")
    check(r.get("tx:d") is None, "a discarded SET did not run")
    p = r.pipeline()
    p.set("tx:e", "x").execute_command("NOSUCHCMD")
    try:
        p.execute()
        fail("EXEC after an unknown command must abort")
    except redis.exceptions.ResponseError as e:
        check("EXECABORT" in str(e) or "unknown command" in str(e), "abort: %s" % e)
    check(r.get("tx:e") is None, "an aborted transaction ran nothing")


def keyspace(r):
    """KEYS and SCAN (MATCH, COUNT, TYPE) as redis-py iterates them."""
    names = [b"ks:%03d" % i for i in range(250)] + [b"other:1", b"ks:bin\x00\xff"]
    for n in names:
        check(r.set(n, b"v") is True, "SET %r" % n)
    r.set("ks:gone", b"v", px=1)
    import time
    time.sleep(0.05)
    want = set(names)
    check(set(r.keys("*")) == want, "KEYS *")
    check(set(r.keys("ks:00?")) == {("ks:00%d" % i).encode() for i in range(10)}, "KEYS ?")
    check(set(r.keys("ks:0[0-1]5")) == {b"ks:005", b"ks:015"}, "KEYS [0-1]")
    check(r.keys("ks:[^0-9]*") == [b"ks:bin\x00\xff"], "KEYS [^0-9]")
    seen = list(r.scan_iter(count=7))
    check(set(seen) == want, "SCAN walks every key: %d of %d" % (len(set(seen)), len(want)))
    check(set(r.scan_iter(match="other:*", count=100)) == {b"other:1"}, "SCAN MATCH")
    check(list(r.scan_iter(_type="hash")) == [], "SCAN TYPE hash")
    check(set(r.scan_iter(_type="string", count=1000)) == want, "SCAN TYPE string")
    cursor, page = r.scan(0, count=5)
    check(cursor != 0 and len(page) <= 5, "one SCAN call looks at COUNT entries: %r" % page)


def main():
    port = int(sys.argv[1])
    scenario = sys.argv[2]
    password = sys.argv[3] if len(sys.argv) > 3 else None
    username = sys.argv[4] if len(sys.argv) > 4 else None
    r = redis.Redis(host="127.0.0.1", port=port, password=password, username=username,
                    socket_timeout=30)
    {"inductor": inductor, "triton": triton, "auth": auth, "transactions": transactions,
     "keyspace": keyspace}[scenario](r)
    print("OK " + scenario)


main()
