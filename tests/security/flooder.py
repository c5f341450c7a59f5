"""A connection flood from a process of its own (the flood tests start it).

``python -m tests.security.flooder --port P [--http-port Q] [--count N]
[--half-requests M] [--source 127.0.0.2] --seconds S`` tries to hold ``N``
connections to the gRPC server on 127.0.0.1:P for ``S`` seconds, as a stranger
would: each sends the HTTP/2 preface and settings, then answers the server's
settings and keepalive pings (so keepalive never ends it) and never makes a
call. It also holds ``M`` half-sent HTTP requests on the status port Q. Once a
second it reports what it still holds, then opens again whatever the servers
closed. Nothing here imports grpc or torch.

The reports are JSON lines, ``{"t": s, "held": n, "half": m, "opened": total,
"closed": total, "done": bool}``: the connections and half-sent requests that
lasted since the last report, and the connections opened and seen closed so
far; the last has ``"done": true``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import selectors
import socket
import struct
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS, PING = 4, 6
ACK = 1
HALF_REQUEST = b"GET /status HTTP/1.1\r\nHost: x\r\n"  # the headers never end


def frame(kind: int, flags: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame on stream 0."""
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + b"\0\0\0\0" + payload


class Conn:
    """One held connection: its socket, what it has read, and its kind."""

    def __init__(self, sock: socket.socket, http2: bool) -> None:
        self.sock = sock
        self.http2 = http2
        self.buf = b""

    def on_readable(self) -> bool:
        """Read what came; answer settings and pings. False once the server closed it."""
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not data:
            return False
        if not self.http2:
            return True  # the status server answers nothing to half a request
        self.buf += data
        replies = b""
        while len(self.buf) >= 9:
            length = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + length:
                break
            kind, flags, payload = self.buf[3], self.buf[4], self.buf[9 : 9 + length]
            self.buf = self.buf[9 + length :]
            if kind == SETTINGS and not flags & ACK:
                replies += frame(SETTINGS, ACK)
            elif kind == PING and not flags & ACK:
                replies += frame(PING, ACK, payload)
        if replies:
            with contextlib.suppress(OSError):
                self.sock.sendall(replies)
        return True


def open_conn(port: int, source: str, http2: bool) -> Conn | None:
    """Connect from ``source`` to 127.0.0.1:``port`` and send the opening bytes."""
    sock = socket.socket()
    try:
        sock.bind((source, 0))
        sock.settimeout(1.0)
        sock.connect(("127.0.0.1", port))
        sock.sendall(PREFACE + frame(SETTINGS, 0) if http2 else HALF_REQUEST)
        sock.setblocking(False)
    except OSError:
        sock.close()
        return None
    return Conn(sock, http2)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.security.flooder")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--http-port", type=int, default=0)
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--half-requests", type=int, default=8)
    p.add_argument("--source", default="127.0.0.2")
    p.add_argument("--seconds", type=float, required=True)
    a = p.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sel = selectors.DefaultSelector()
    held: set[Conn] = set()
    opened = closed = 0
    start = time.monotonic()
    end = start + a.seconds
    tick = start  # once a second: report what survived, then open again up to the counts
    first = True
    while True:
        now = time.monotonic()
        if now >= tick:
            if not first:
                n_h2 = sum(1 for c in held if c.http2)
                done = now >= end
                report = {"t": round(now - start, 2), "held": n_h2, "half": len(held) - n_h2}
                report.update(opened=opened, closed=closed, done=done)
                print(json.dumps(report), flush=True)
                if done:
                    break
            first = False
            for http2, want, port in (
                (True, a.count, a.port),
                (False, a.half_requests if a.http_port else 0, a.http_port),
            ):
                have = sum(1 for c in held if c.http2 == http2)
                for _ in range(want - have):
                    conn = open_conn(port, a.source, http2)
                    if conn is None:
                        break
                    opened += 1
                    held.add(conn)
                    sel.register(conn.sock, selectors.EVENT_READ, conn)
            tick = min(tick + 1.0, end) if tick < end else end
        for key, _ in sel.select(max(0.0, tick - time.monotonic())):
            conn = key.data
            if not conn.on_readable():
                sel.unregister(conn.sock)
                conn.sock.close()
                held.discard(conn)
                closed += 1
    for conn in held:
        conn.sock.close()


if __name__ == "__main__":
    main()
