"""The lighthouse's status server stays answering under idle and slow clients."""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.request
from collections.abc import Iterator

import pytest

from lighthouse.coordinator.status import LighthouseMetrics, StatusHTTPServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def server() -> Iterator[StatusHTTPServer]:
    srv = StatusHTTPServer(
        ("127.0.0.1", 0),
        lambda: {"ok": True},
        LighthouseMetrics(),
        read_timeout_s=1.0,
        max_connections=8,
    )
    try:
        yield srv
    finally:
        srv.shutdown()


def _status(port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as resp:
        return dict(json.loads(resp.read()))


def test_connections_past_the_cap_are_closed_at_once_and_idle_ones_at_the_read_timeout(
    server: StatusHTTPServer,
) -> None:
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(50)]
    try:
        window_end = time.monotonic() + 0.5  # "at once": well inside the 1 s read timeout
        closed_at_once = 0
        for sock in idle:
            sock.settimeout(max(0.001, window_end - time.monotonic()))
            with contextlib.suppress(TimeoutError):
                closed_at_once += sock.recv(1) == b""
        assert closed_at_once >= 50 - 8, closed_at_once  # all but the 8 admitted
        # The admitted ones are closed once idle for the 1 s read timeout, and then
        # /status answers again.
        for sock in idle:
            sock.settimeout(3.0)
            assert sock.recv(1) == b""
        assert _status(server.port) == {"ok": True}
    finally:
        for sock in idle:
            sock.close()


def test_a_client_that_sends_half_a_request_is_cut_off(server: StatusHTTPServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n")  # never finishes the headers
        start = time.monotonic()
        sock.settimeout(5.0)
        while sock.recv(1024):  # bounded by the socket timeout; the server closes first
            pass
        assert time.monotonic() - start < 3.0  # the 1 s read timeout, not forever
