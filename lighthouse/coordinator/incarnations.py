"""Which incarnation owns each replica id: the lighthouse's per-incarnation tokens.

A replica id (``name:uuid``) is fresh for every incarnation of a replica
group, but anyone who learns it (from the status page, a quorum, a log) could
otherwise ask quorums, ping or announce a clean leave under it: replace the
owner's pending request, keep a dead replica looking alive, or make its peers
miss its death. So each incarnation of a manager server draws a random token
at start (``lighthouse.auth.new_incarnation``) and sends it as call metadata
(``lighthouse.auth.INCARNATION_KEY``) with every lighthouse call it makes.

``Incarnations`` is the lighthouse's side, trust on first use: the first token
seen under an id binds the id to it; while the lighthouse remembers the id,
calls under it with another token, or with none, are refused (the server
answers PERMISSION_DENIED before the call changes anything). The owner is the
first to use its freshly generated id, so the first token is the owner's.
Once the lighthouse forgets the id (dead, left cleanly, pruned) the binding
goes too, so a replica restarted with a new id, or the same id with a new
token after it was forgotten, is let in. A lighthouse restart forgets every
binding; the owners bind their ids again with their first call.

Limits, by design: an id never used with a token is unprotected (clients that
send none, like torchft's, keep working exactly as before, and anyone may bind
such an id by sending a token first); tokens travel in clear text without TLS,
like the job secret; and this keeps members of the job apart from each other
and from strangers who got past the job secret, it does not replace it.

The class is pure (no clock, no sockets, no asyncio): the server passes in
whether the core still knows an id, and calls ``retain`` from its tick.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from lighthouse.auth import check_incarnation

__all__ = ["Incarnations"]


class Incarnations:
    """replica id -> the token of the incarnation that owns it (trust on first use)."""

    def __init__(self) -> None:
        self._owners: dict[str, str] = {}

    def __len__(self) -> int:
        """How many ids are bound to a token."""
        return len(self._owners)

    def is_bound(self, replica_id: str) -> bool:
        """Whether ``replica_id`` is bound to a token now."""
        return replica_id in self._owners

    def admit(self, replica_id: str, token: str | None, known: bool) -> str | None:
        """May a call under ``replica_id`` carrying ``token`` (None: no token) go on?

        ``known``: whether the lighthouse still remembers ``replica_id`` (live, or
        with a pending request); if not, a binding left from before is dropped
        first. Returns None to admit the call (binding the id to ``token`` if it
        is unbound and a token came), else the reason to refuse it, which names
        the id but never a token. ``ValueError`` for a malformed ``token``.
        """
        if token is not None:
            check_incarnation(token)
        if not known:
            self._owners.pop(replica_id, None)
        owner = self._owners.get(replica_id)
        if owner is None:
            if token is not None:
                self._owners[replica_id] = token
            return None
        if token is not None and hmac.compare_digest(owner.encode(), token.encode()):
            return None
        return (
            f"replica id {replica_id!r} belongs to another incarnation of the job (a live "
            "replica uses it with its own incarnation token, and this call "
            + ("carries another" if token is not None else "carries none")
            + "); a restarted replica must use a new id"
        )

    def forget(self, replica_id: str) -> bool:
        """Drop ``replica_id``'s binding (the lighthouse forgot it). True if there was one."""
        return self._owners.pop(replica_id, None) is not None

    def retain(self, known: Callable[[str], bool]) -> list[str]:
        """Drop the bindings of every id ``known`` says the lighthouse forgot; returns
        those ids. O(bound ids): the server calls it from its periodic tick, so the
        bindings stay as many as the live replicas."""
        gone = [rid for rid in self._owners if not known(rid)]
        for rid in gone:
            del self._owners[rid]
        return gone
