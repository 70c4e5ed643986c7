"""The GIL is released for every call that does I/O: threads sharing one
Remote fetch in parallel, and a Store call that waits on a lock lets the rest
of the program run. Both are shown by a wait that only ends if another
Python thread runs meanwhile, not by timing."""

import os
import subprocess
import sys
import threading
import time

import kcache

HERE = os.path.dirname(os.path.abspath(__file__))


def test_threads_fetch_in_parallel_through_one_remote(kcached):
    srv = kcached()
    direct = kcache.Remote(srv.url)
    n = 4
    payloads = [os.urandom(100_000) for _ in range(n)]
    keys = [direct.put(p) for p in payloads]
    # The proxy forwards no request until n are waiting at once; each thread's
    # get blocks in the C client meanwhile, so the others must be able to run.
    proxy = subprocess.Popen([sys.executable, os.path.join(HERE, "barrier_proxy.py"),
                              str(srv.port), str(n)], stdout=subprocess.PIPE)
    try:
        port = int(proxy.stdout.readline())
        shared = kcache.Remote("http://127.0.0.1:%d" % port, connect_timeout_ms=40000,
                               timeout_ms=60000)
        results, errors = [None] * n, []

        def fetch(i):
            try:
                results[i] = bytes(shared.get(keys[i]))
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=fetch, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        assert not errors, errors
        assert results == payloads
    finally:
        proxy.kill()
        proxy.wait()


def syscall_of(thread):
    """The system call a thread of this process is blocked in (its number), or None."""
    try:
        with open("/proc/self/task/%d/syscall" % thread.native_id) as f:
            first = f.read().split()[0]
    except (OSError, IndexError):
        return None
    return int(first) if first.lstrip("-").isdigit() else None


def test_store_put_waiting_on_a_lock_lets_other_threads_run(tmp_path):
    path = tmp_path / "locked"
    with kcache.Store(path) as store:
        store.put(b"first")  # the database exists
        # another process holds the write lock until told to let go
        holder = subprocess.Popen(
            [sys.executable, "-c",
             "import sqlite3, sys\n"
             "db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)\n"
             "db.execute('BEGIN EXCLUSIVE')\n"
             "print('locked', flush=True)\n"
             "sys.stdin.readline()\n"
             "db.execute('COMMIT')\n", str(path / "kcache.db")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "locked"
            done = []
            t = threading.Thread(target=lambda: done.append(store.put(b"second")))
            t.start()
            # SQLite's busy handler sleeps between tries: seeing the putting thread
            # asleep in (clock_)nanosleep from here means this thread runs while
            # the other is inside put, which it could not if put held the GIL.
            deadline = time.monotonic() + 30
            while syscall_of(t) not in (35, 230):  # nanosleep, clock_nanosleep (x86-64)
                assert time.monotonic() < deadline, "put never waited on the lock"
                assert not done, "put finished although the database was locked"
                time.sleep(0.001)
            holder.stdin.write("go\n")
            holder.stdin.flush()
            t.join(30)
            assert done and store.get(done[0]) == b"second"
        finally:
            holder.kill()
            holder.wait()
