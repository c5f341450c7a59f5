"""ConnectionPolicy: which connections a server closes, and when it says so (no sockets)."""

from __future__ import annotations

import pytest

from lighthouse.clock import FakeClock
from lighthouse.connection_policy import (
    EPISODE_QUIET_S,
    Connection,
    ConnectionLimits,
    ConnectionPolicy,
    Sweep,
)


def conns(peer: str, keys: range, authenticated: bool = False) -> list[Connection]:
    return [Connection(key=k, peer=peer, authenticated=authenticated) for k in keys]


def policy(
    max_connections: int = 100, per_peer: int = 4, timeout_s: float = 10.0
) -> ConnectionPolicy:
    limits = ConnectionLimits(
        max_connections=max_connections,
        max_unauthenticated_per_peer=per_peer,
        unauthenticated_timeout_s=timeout_s,
    )
    return ConnectionPolicy(limits, "the test server")


def test_limits_refuse_what_they_cannot_mean() -> None:
    with pytest.raises(ValueError, match="max_connections must be >= 1, got 0"):
        ConnectionLimits(max_connections=0)
    with pytest.raises(TypeError, match="max_unauthenticated_per_peer must be an int"):
        ConnectionLimits(max_connections=8, max_unauthenticated_per_peer=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"unauthenticated_timeout_s must be .* > 0, got 0"):
        ConnectionLimits(max_connections=8, unauthenticated_timeout_s=0)
    assert ConnectionLimits(max_connections=9).max_unauthenticated == 4
    assert ConnectionLimits(max_connections=1).max_unauthenticated == 1


def test_past_the_per_peer_cap_the_oldest_unauthenticated_go_and_others_are_kept() -> None:
    clock = FakeClock()
    p = policy(per_peer=4)
    old = conns("10.0.0.9", range(0, 6))
    assert p.sweep(old, clock.now()).close == (0, 1)  # 6 from one address: 2 over
    clock.advance(1)
    # 6 new ones from the same address, 4 old ones kept last time, the job's 20
    # authenticated ones from that address too, and 3 from another address
    now = (
        old[2:]
        + conns("10.0.0.9", range(10, 16))
        + conns("10.0.0.9", range(100, 120), authenticated=True)
        + conns("10.0.0.8", range(200, 203))
    )
    sweep = p.sweep(now, clock.now())
    assert sweep.close == (2, 3, 4, 5, 10, 11)  # oldest first; 4 newest kept
    assert p.closed_total == 8


def test_unauthenticated_connections_end_at_the_timeout_and_authenticated_ones_never() -> None:
    clock = FakeClock()
    p = policy(timeout_s=10.0)
    held = conns("10.0.0.9", range(2)) + conns("10.0.0.7", range(10, 12), authenticated=True)
    assert p.sweep(held, clock.now()).close == ()
    clock.advance(9.9)
    assert p.sweep(held, clock.now()).close == ()
    clock.advance(0.1)
    assert p.sweep(held, clock.now()).close == (0, 1)
    clock.advance(3600)
    assert p.sweep(held[2:], clock.now()).close == ()  # the job's are open an hour later


def test_unauthenticated_connections_keep_to_half_the_cap_so_the_job_has_the_rest() -> None:
    clock = FakeClock()
    p = policy(max_connections=20, per_peer=4)
    # 4 from each of 5 addresses: within the per-peer cap, but 20 > 10 (half the cap)
    floods = [c for i in range(5) for c in conns(f"10.0.1.{i}", range(10 * i, 10 * i + 4))]
    for i in range(len(floods)):  # first seen one sweep apart, in this order
        p.sweep(floods[: i + 1], clock.now())
        clock.advance(0.01)
    sweep = p.sweep(floods, clock.now())
    assert sweep.close == tuple(c.key for c in floods[:10])  # the 10 oldest


def test_a_flood_is_logged_when_it_starts_and_when_it_ends_never_per_sweep() -> None:
    clock = FakeClock()
    p = policy(max_connections=50, per_peer=4, timeout_s=100.0)
    kept = conns("10.0.0.9", range(60))
    first = p.sweep(kept, clock.now())
    assert first.warning is not None and first.info is None
    assert "connection flood: 60 connections open (cap 50, reached" in first.warning
    assert "56 over 4 per address" in first.warning and "from 10.0.0.9" in first.warning
    kept = [c for c in kept if c.key not in first.close]
    for i in range(10):  # it goes on, 10 more connections a sweep: counted, not logged
        clock.advance(0.5)
        held = kept + conns("10.0.0.9", range(100 + 10 * i, 110 + 10 * i))
        sweep = p.sweep(held, clock.now())
        assert len(sweep.close) == 10 and sweep.warning is None and sweep.info is None
        kept = [c for c in held if c.key not in sweep.close]
    assert [c.key for c in kept] == [196, 197, 198, 199]  # the newest four
    clock.advance(EPISODE_QUIET_S - 0.1)
    assert p.sweep(kept, clock.now()) == Sweep()  # not quiet for long enough yet
    clock.advance(0.1)
    end = p.sweep(kept, clock.now())
    assert end.info is not None and end.warning is None and end.close == ()
    assert "connection flood over after 5.0 s: closed 156" in end.info, end.info
    assert "10.0.0.9 (156)" in end.info and "at the cap in 1 sweep(s)" in end.info
    assert p.closed_total == 156


def test_timeouts_alone_are_no_flood() -> None:
    clock = FakeClock()
    p = policy(timeout_s=1.0)
    p.sweep(conns("10.0.0.9", range(2)), clock.now())  # a port scanner's probes
    clock.advance(1.0)
    sweep = p.sweep(conns("10.0.0.9", range(2)), clock.now())
    assert sweep.close == (0, 1) and sweep.warning is None and sweep.info is None
