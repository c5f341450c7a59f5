"""Which of a server's connections to close, so strangers cannot hold its descriptors.

Pure: a function of the connections a server holds now, which of them have
authenticated, when each was first seen and a clock reading. The process's
connection scanner (``lighthouse._conn_guard``) feeds it and closes what it
says.

A connection *authenticates* once a call on it passes the server's job check
(``auth.guard``: the job secret and job id when set; any call when neither
is). Authenticated connections are the job's own and are never closed here.
The others, which never made such a call, are closed:

1. once open for ``unauthenticated_timeout_s`` seconds (the job's own
   connections make their first call within milliseconds of connecting);
2. beyond ``max_unauthenticated_per_peer`` from one peer address, oldest
   first (a fresh connection is likelier to be a replica about to call);
3. beyond ``max_unauthenticated`` (half of ``max_connections``) in all,
   oldest first, so the other half stays free for the job's connections.

``max_connections`` itself, the server's hard cap, is gRPC's
(``grpc.max_allowed_incoming_connections``): a connection past it is closed
on arrival. A flood (rules 2 and 3 firing, or the server at its cap) is an
*episode*: logged once when it starts and once when it ends, counted between.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_MAX_UNAUTHENTICATED_PER_PEER",
    "DEFAULT_UNAUTHENTICATED_TIMEOUT_S",
    "EPISODE_QUIET_S",
    "Connection",
    "ConnectionLimits",
    "ConnectionPolicy",
    "Sweep",
]

#: Connections one peer address may hold that never authenticated. A job's
#: connections authenticate on their first call, so this does not grow with the job.
DEFAULT_MAX_UNAUTHENTICATED_PER_PEER = 16
#: Seconds a connection may stay open without authenticating.
DEFAULT_UNAUTHENTICATED_TIMEOUT_S = 10.0
#: Seconds without a flood's closings after which its episode ends.
EPISODE_QUIET_S = 5.0


@dataclass(frozen=True, kw_only=True)
class ConnectionLimits:
    """A server's connection caps.

    ``max_connections``: connections at once, from all peers (an int >= 1).
    ``max_unauthenticated_per_peer``: connections one peer address may hold
    that never authenticated (an int >= 1). ``unauthenticated_timeout_s``:
    seconds (> 0) such a connection may stay open.
    """

    max_connections: int
    max_unauthenticated_per_peer: int = DEFAULT_MAX_UNAUTHENTICATED_PER_PEER
    unauthenticated_timeout_s: float = DEFAULT_UNAUTHENTICATED_TIMEOUT_S

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_unauthenticated_per_peer"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        timeout = self.unauthenticated_timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(
                f"unauthenticated_timeout_s must be a number of seconds > 0, got {timeout!r}"
            )

    @property
    def max_unauthenticated(self) -> int:
        """Connections that never authenticated, from all peers: half the cap
        (at least 1), so the other half is the job's reserve."""
        return max(1, self.max_connections // 2)


@dataclass(frozen=True, kw_only=True)
class Connection:
    """One connection a server holds: ``key`` identifies it while it is open (the
    scanner uses the socket's inode), ``peer`` is the remote address without its
    port, ``authenticated`` whether a call on it passed the job check."""

    key: int
    peer: str
    authenticated: bool


@dataclass(frozen=True, kw_only=True)
class Sweep:
    """What one sweep decided: the ``close`` keys (oldest first) and the lines to
    log, ``warning`` when a flood starts and ``info`` when it ends (or None)."""

    close: tuple[int, ...] = ()
    warning: str | None = None
    info: str | None = None


@dataclass
class _Episode:
    started: float
    last_active: float
    closed: Counter[str] = field(default_factory=Counter)  # reason -> count
    peers: Counter[str] = field(default_factory=Counter)  # peer -> closed from it
    at_cap: int = 0  # sweeps that found the server at its cap


class ConnectionPolicy:
    """Decides, sweep by sweep, which connections of one server to close (see the
    module docstring). ``what`` names the server in log lines. Not thread-safe:
    one scanner thread calls it."""

    def __init__(self, limits: ConnectionLimits, what: str) -> None:
        self.limits = limits
        self.what = what
        self._first_seen: dict[int, float] = {}
        self._episode: _Episode | None = None
        self.closed_total = 0  # connections this policy closed, all reasons

    def sweep(self, connections: Iterable[Connection], now: float) -> Sweep:
        """The connections to close now, given every connection the server holds
        and ``now`` (monotonic seconds)."""
        conns = list(connections)
        first_seen = {c.key: self._first_seen.get(c.key, now) for c in conns}
        self._first_seen = first_seen  # forgets connections that ended
        limits = self.limits
        pending = sorted(
            (c for c in conns if not c.authenticated), key=lambda c: (first_seen[c.key], c.key)
        )
        reasons: dict[int, str] = {}
        for c in pending:  # rule 1
            if now - first_seen[c.key] >= limits.unauthenticated_timeout_s:
                reasons[c.key] = "timeout"
        per_peer: dict[str, list[Connection]] = {}
        for c in pending:
            if c.key not in reasons:
                per_peer.setdefault(c.peer, []).append(c)
        for group in per_peer.values():  # rule 2: oldest first
            for c in group[: max(0, len(group) - limits.max_unauthenticated_per_peer)]:
                reasons[c.key] = "per_peer"
        left = [c for c in pending if c.key not in reasons]
        for c in left[: max(0, len(left) - limits.max_unauthenticated)]:  # rule 3
            reasons[c.key] = "budget"
        close = tuple(c.key for c in pending if c.key in reasons)
        self.closed_total += len(close)
        at_cap = len(conns) >= limits.max_connections
        peers = {c.key: c.peer for c in pending}
        return self._log(now, reasons, peers, at_cap, len(conns), close)

    def _log(
        self,
        now: float,
        reasons: dict[int, str],
        peers: dict[int, str],
        at_cap: bool,
        open_now: int,
        close: tuple[int, ...],
    ) -> Sweep:
        """Count this sweep into the current episode; say when one starts or ends."""
        flood = at_cap or any(r != "timeout" for r in reasons.values())
        episode = self._episode
        if episode is None and not flood:
            return Sweep(close=close)
        warning = None
        if episode is None:
            episode = self._episode = _Episode(started=now, last_active=now)
            by_reason = Counter(reasons.values())
            top = Counter(peers[k] for k in close).most_common(1)
            warning = (
                f"{self.what}: connection flood: {open_now} connections open (cap "
                f"{self.limits.max_connections}{', reached: new ones are refused' if at_cap else ''}"
                f"); closing {len(close)} that never authenticated "
                f"({_reasons(by_reason, self.limits)})"
                + (f", {top[0][1]} of them from {top[0][0]}" if top else "")
                + "; the job's authenticated connections are kept. Logged again when it ends"
            )
        for key, reason in reasons.items():
            episode.closed[reason] += 1
            episode.peers[peers[key]] += 1
        episode.at_cap += at_cap
        if flood or reasons:
            episode.last_active = now
            return Sweep(close=close, warning=warning)
        if now - episode.last_active < EPISODE_QUIET_S:
            return Sweep(close=close, warning=warning)
        self._episode = None
        top_peers = ", ".join(f"{p} ({n})" for p, n in episode.peers.most_common(3))
        info = (
            f"{self.what}: connection flood over after {episode.last_active - episode.started:.1f} s: "
            f"closed {sum(episode.closed.values())} connections that never authenticated "
            f"({_reasons(episode.closed, self.limits)}) from {len(episode.peers)} address(es)"
            + (f", most from {top_peers}" if top_peers else "")
            + (f"; at the cap in {episode.at_cap} sweep(s)" if episode.at_cap else "")
        )
        return Sweep(close=close, info=info)


def _reasons(counts: Counter[str], limits: ConnectionLimits) -> str:
    """``counts`` by rule, in words."""
    words = {
        "per_peer": f"over {limits.max_unauthenticated_per_peer} per address",
        "budget": f"over {limits.max_unauthenticated} in all",
        "timeout": f"open {limits.unauthenticated_timeout_s:g} s",
    }
    return ", ".join(f"{n} {words[r]}" for r, n in counts.most_common()) or "none"
