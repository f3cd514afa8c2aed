#!/usr/bin/env python3
"""A sink and a pusher for the end-to-end benchmarks.

  sinkpush.py sink HOST PORT    serve forever: read each connection to EOF,
                                then answer "COUNT SHA256\n" and close
  sinkpush.py push HOST PORT FILE
                                send FILE, half-close, wait for the answer;
                                check the count and SHA-256; print the
                                seconds it took (exit 1 on a mismatch)
  sinkpush.py gen text|random SIZE FILE
                                write SIZE bytes of deterministic log text
                                (lines and JSON records) or random bytes
"""
import hashlib
import json
import random
import socket
import sys
import threading
import time


def sink(host, port):
    srv = socket.create_server((host, port), reuse_port=False)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    while True:
        c, _ = srv.accept()
        threading.Thread(target=drain, args=(c,), daemon=True).start()


def drain(c):
    h, n = hashlib.sha256(), 0
    buf = bytearray(1 << 20)
    with c:
        while True:
            k = c.recv_into(buf)
            if k == 0:
                break
            h.update(memoryview(buf)[:k])
            n += k
        c.sendall(f"{n} {h.hexdigest()}\n".encode())


def push(host, port, path):
    data = open(path, "rb").read()
    want = f"{len(data)} {hashlib.sha256(data).hexdigest()}"
    start = time.monotonic()
    with socket.create_connection((host, port), timeout=600) as c:
        c.sendall(data)
        c.shutdown(socket.SHUT_WR)
        got = b""
        while not got.endswith(b"\n"):
            k = c.recv(256)
            if not k:
                break
            got += k
    took = time.monotonic() - start
    if got.decode().strip() != want:
        sys.exit(f"push: the sink got {got.decode().strip()!r}, sent {want!r}")
    print(f"{took:.6f}")


def gen(kind, size, path):
    r = random.Random(7)
    with open(path, "wb") as f:
        if kind == "random":
            f.write(r.randbytes(size))
            return
        users = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]
        paths = ["/api/v1/users", "/api/v1/orders", "/static/app.js", "/healthz", "/api/v2/search", "/login"]
        levels = ["INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR"]
        out, n, t = [], 0, 1714564800.0
        while n < size:
            t += r.randrange(5000) / 1e6
            ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1e6) % 1000000:06d}Z"
            if r.randrange(3) == 0:
                line = json.dumps({"ts": ts, "user": r.choice(users), "id": r.randrange(10**6),
                                   "order": {"items": r.randrange(20), "total": r.randrange(100000) / 100, "currency": "EUR"},
                                   "tags": [r.choice(users), r.choice(paths)], "ok": r.randrange(10) != 0}, separators=(",", ":"))
            else:
                line = (f"{ts} {r.choice(levels):<5} [worker-{r.randrange(16)}] {r.choice(['GET', 'GET', 'POST', 'PUT'])} "
                        f"{r.choice(paths)}/{r.randrange(10000)} status={r.choice([200, 200, 200, 201, 204, 304, 404, 500])} "
                        f"dur={r.randrange(300)}.{r.randrange(10)}ms bytes={r.randrange(100000)} req={r.getrandbits(64):016x}")
            b = (line + "\n").encode()
            out.append(b)
            n += len(b)
        f.write(b"".join(out)[:size])


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "sink":
        sink(sys.argv[2], int(sys.argv[3]))
    elif cmd == "push":
        push(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif cmd == "gen":
        gen(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        sys.exit(__doc__)
