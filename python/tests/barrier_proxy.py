"""A TCP proxy in front of kcached that answers nothing until N requests are in
flight at once: each connection's first request waits at a barrier of N
before it is forwarded. A client that holds Python's GIL during a request
never gets a second request out, so the barrier times out and the proxy closes
the connections unanswered.

    barrier_proxy.py UPSTREAM_PORT N    (prints its own port, then serves)
"""

import socket
import sys
import threading

upstream_port, n = int(sys.argv[1]), int(sys.argv[2])
barrier = threading.Barrier(n, timeout=30)


def pump(src, dst):
    try:
        while True:
            data = src.recv(1 << 16)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(client):
    head = b""
    try:
        while b"\r\n\r\n" not in head:
            data = client.recv(1 << 16)
            if not data:
                return client.close()
            head += data
        barrier.wait()  # threading.BrokenBarrierError after the timeout
    except (OSError, threading.BrokenBarrierError):
        return client.close()
    up = socket.create_connection(("127.0.0.1", upstream_port))
    up.sendall(head)
    threading.Thread(target=pump, args=(up, client), daemon=True).start()
    pump(client, up)


listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(64)
print(listener.getsockname()[1], flush=True)
while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
