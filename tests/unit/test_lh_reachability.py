"""The manager server's probe of its previous quorum's peers (real sockets on loopback)."""

from __future__ import annotations

import asyncio
import socket
import time

from lighthouse.replica.reachability import unreachable


def test_a_listening_peer_is_reachable_and_a_closed_port_is_not() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    closed = socket.create_server(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()  # nothing listens there now: the connect is refused at once
    try:
        peers = {
            "up": f"127.0.0.1:{listener.getsockname()[1]}",
            "down": f"127.0.0.1:{closed_port}",
            "garbled": "no-port-here",
            "bare": "",  # a bare client advertises no server: never probed
        }
        start = time.monotonic()
        assert asyncio.run(unreachable(peers, timeout_s=5.0)) == ("down", "garbled")
        assert time.monotonic() - start < 5.0  # refused, not timed out
    finally:
        listener.close()


def test_a_silent_address_costs_at_most_the_timeout() -> None:
    """An address whose SYNs go unanswered (TEST-NET-1, never routed) is reported
    after the timeout, not after the kernel's minutes of retries."""
    start = time.monotonic()
    assert asyncio.run(unreachable({"dark": "192.0.2.1:9"}, timeout_s=0.3)) == ("dark",)
    assert time.monotonic() - start < 3.0
