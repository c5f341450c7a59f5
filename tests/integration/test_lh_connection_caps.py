"""Connection caps on real gRPC servers: connections that never authenticate are cut
past the per-address cap and at the timeout; the job's own connections stay."""

from __future__ import annotations

import queue
import selectors
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import grpc
import pytest

from lighthouse import LighthouseServer, ManagerServer, auth, services, wire
from lighthouse._net import CHANNEL_OPTIONS
from tests.integration.lh_fixtures import lighthouse
from tests.security.flooder import open_conn

pytestmark = pytest.mark.timeout(60)
SECRET = "s3cret-for-this-job-only"


def open_raw(port: int, count: int) -> list[socket.socket]:
    """``count`` connections from 127.0.0.2 that send the HTTP/2 preface and no call."""
    conns = [open_conn(port, "127.0.0.2", http2=True) for _ in range(count)]
    assert all(c is not None for c in conns)
    return [c.sock for c in conns if c is not None]


def wait_closed(socks: list[socket.socket], count: int, timeout_s: float) -> list[socket.socket]:
    """Read every socket until ``count`` of them were closed by the server (bounded by
    ``timeout_s`` seconds); return those still open."""
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    open_ = set(socks)
    deadline = time.monotonic() + timeout_s
    while len(socks) - len(open_) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"only {len(socks) - len(open_)} of {count} closed in {timeout_s} s"
        for key, _ in sel.select(left):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(65536)
            except ConnectionError:
                data = b""
            if not data:
                sel.unregister(sock)
                open_.discard(sock)
    sel.close()
    return [s for s in socks if s in open_]


@contextmanager
def linked(lh: LighthouseServer, secret: str | None) -> Iterator[ManagerServer]:
    """A manager server whose liveness stream to ``lh`` is open (an authenticated connection)."""
    ms = ManagerServer(
        f"rep:{uuid.uuid4().hex[:8]}", lh.address(), bind="127.0.0.1:0", job_secret=secret
    )
    try:
        assert ms.wait_liveness(timedelta(seconds=10))
        yield ms
    finally:
        ms.shutdown()


@pytest.mark.parametrize("secret", [SECRET, None], ids=["secret", "no-secret"])
def test_unauthenticated_connections_are_cut_and_the_jobs_stay(secret: str | None) -> None:
    with (
        lighthouse(
            job_secret=secret, unauthenticated_timeout_ms=1500, max_unauthenticated_per_peer=4
        ) as lh,
        linked(lh, secret) as ms,
    ):
        raw = open_raw(lh.port, 10)
        # A client with the wrong secret (or, with none set, one whose only call is to a
        # method no server serves) calls and is refused: it never authenticates.
        stranger = grpc.insecure_channel(lh.bare_address(), CHANNEL_OPTIONS)
        states: queue.Queue[grpc.ChannelConnectivity] = queue.Queue()
        stranger.subscribe(states.put)
        with pytest.raises(grpc.RpcError) as info:
            method = services.LIGHTHOUSE_HEARTBEAT.path if secret else "/torchft_pg.X/Nope"
            stranger.unary_unary(method)(
                wire.encode_heartbeat_request("x"),
                timeout=5,
                metadata=auth.call_metadata("not-the-secret-at-all"),
            )
        expected = grpc.StatusCode.UNAUTHENTICATED if secret else grpc.StatusCode.UNIMPLEMENTED
        assert info.value.code() == expected
        # past 4 per address the oldest go at the next scan, well before the 1.5 s timeout
        left = wait_closed(raw, 6, timeout_s=1.4)
        assert len(left) == 4
        # the rest, and the stranger's connection, at the timeout
        assert wait_closed(left, 4, timeout_s=5) == []
        seen = [states.get(timeout=5)]  # every wait bounded by get()'s timeout
        while seen[-1] != grpc.ChannelConnectivity.READY:
            seen.append(states.get(timeout=5))
        seen.append(states.get(timeout=5))  # the server hung up: READY no more
        assert seen[-1] in (
            grpc.ChannelConnectivity.IDLE,
            grpc.ChannelConnectivity.TRANSIENT_FAILURE,
        )
        stranger.close()
        # the job's connection (its liveness stream) was never cut: no death, one stream
        status = lh.status()
        assert status["recent_deaths"] == [], status["recent_deaths"]
        assert [(r["replica_id"], r["liveness_streams"]) for r in status["live"]] == [
            (ms.replica_id, 1)
        ]
