"""A Python client of an echo server, run under vlink exec by
preload_test.go: blocking sockets, asyncio, multiprocessing with fork, and
the errors a program sees. Prints one JSON object.

usage: preload_client.py HOST ECHO_PORT CLOSED_PORT
"""

import asyncio
import json
import multiprocessing as mp
import socket
import sys

host, port, closed_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
res = {}


def echo(data, timeout=None):
    # timeout=None: a blocking socket, so a blocking connect(2).
    s = socket.create_connection((host, port), timeout=timeout)
    with s:
        peer = s.getpeername()[0]
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        buf = bytearray()
        while True:
            b = s.recv(1 << 16)
            if not b:
                break
            buf += b
    return bytes(buf) == data, peer


res["resolved"] = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
ok, res["peer"] = echo(b"blocking socket " * 20000)
res["blocking"] = ok
res["timeout_socket"] = echo(b"socket with a timeout " * 1000, timeout=30)[0]


def outcome(timeout):
    try:
        s = socket.create_connection((host, closed_port), timeout=timeout)
        s.sendall(b"x")
        s.recv(1)
        s.close()
        return "connected"
    except OSError as e:
        return type(e).__name__


# The far side's closed port: a blocking connect gets the refusal itself,
# and so does a non-blocking one (a timeout makes Python poll, then read
# SO_ERROR).
res["refused_blocking"] = outcome(None)
res["refused_nonblocking"] = outcome(10)


async def one(i):
    r, w = await asyncio.open_connection(host, port)
    msg = f"asyncio connection {i} ".encode() * 2000
    w.write(msg)
    await w.drain()
    w.write_eof()
    got = await r.read()
    w.close()
    await w.wait_closed()
    return got == msg


async def many(n):
    return await asyncio.gather(*(one(i) for i in range(n)))


res["asyncio"] = sum(asyncio.run(many(32)))


def work(i):
    return echo(f"forked worker {i} ".encode() * 2000)[0]


if __name__ == "__main__":
    # Workers forked after the parent used the network, without exec.
    with mp.get_context("fork").Pool(4) as pool:
        res["fork"] = sum(pool.map(work, range(8)))
    print(json.dumps(res))
