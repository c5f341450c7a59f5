"""The store meeting a torchft_pg group holds at its prefix before building its backend.

Why meet first: a backend's own rendezvous (Gloo's connectFullMesh) blocks in
C++ and cannot be interrupted, so a member that died after the quorum formed
would cost everyone the whole timeout. Polling the store between checks of an
interrupt flag lets a known death fail configure at once.

Who has arrived. Every torchft_pg group (ProcessGroupGloo, the parent of a
Baby group, NCCL) sets ``torchft_pg/present/{rank}``, holding its
default-group rank. A plain torch Gloo group given the same prefix
(``ProcessGroupGloo(PrefixStore(prefix, store), rank, world, timeout)``) sets
no such key: the first thing its constructor does is publish its addresses
under Gloo's own key ``0/{rank}`` (device 0's sub-prefix, then the rank), lazy
init or not, and then wait for every other member's. Waiting for presence keys
alone would leave us and such a peer each waiting for the other until the
timeout, so member *r* has arrived when either key exists. (A member of ours
sets its presence key before it builds Gloo, so one that wrote Gloo's key is
always visible as present too.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta

from torch.distributed import Store

from torchft_pg.errors import ProcessGroupAbortedError, ProcessGroupTimeoutError
from torchft_pg.process_group.base import own_global_rank, resolve_global_ranks

__all__ = ["meet", "present_key"]

_FIRST_POLL_S = 0.0001  # peers usually arrive within a millisecond ...
_MAX_POLL_S = 0.01  # ... so poll from 0.1 ms, doubling to 10 ms
# Members looked at one by one per poll (2 round trips each), so that a world
# of many members waiting for a late one does not flood the store server.
_PROBES_PER_POLL = 4


def present_key(rank: int) -> str:
    """The key a torchft_pg member of group rank `rank` sets when it reaches configure."""
    return f"torchft_pg/present/{rank}"


def _gloo_key(rank: int) -> str:
    """The key torch's Gloo sets first at construction: member `rank`'s addresses."""
    return f"0/{rank}"


def meet(
    store: Store,
    rank: int,
    world_size: int,
    timeout: timedelta,
    interrupted: threading.Event,
    reason: Callable[[], str],
) -> tuple[int, ...]:
    """Wait until every member reached `store`'s prefix; return their global ranks.

    Raises ProcessGroupAbortedError (with `reason()`) as soon as `interrupted`
    is set, and ProcessGroupTimeoutError naming the missing members after
    `timeout`. Global ranks are as `resolve_global_ranks` says; a plain torch
    Gloo member reports none (-1).
    """
    store.set(present_key(rank), str(own_global_rank()))
    waiting = [r for r in range(world_size) if r != rank]
    unconfirmed: list[int] = []  # arrived, but perhaps without a presence key
    deadline = time.monotonic() + timeout.total_seconds()
    poll_s = _FIRST_POLL_S
    while waiting:
        # Every member left is one of ours and here: one round trip, the common case.
        if store.check([present_key(r) for r in waiting]):
            break
        # Someone is late, or is a plain Gloo member that never sets a presence key.
        waiting = _probe(store, waiting, unconfirmed)
        if not waiting:
            break
        if interrupted.wait(poll_s):
            raise ProcessGroupAbortedError(f"configure interrupted: {reason()}")
        if time.monotonic() > deadline:
            missing = [r for r in waiting if not _arrived(store, r)]
            if not missing:
                unconfirmed += waiting
                break
            seconds = timeout.total_seconds()
            raise ProcessGroupTimeoutError(
                f"configure timed out after {seconds:g} seconds (timeout after "
                f"{seconds * 1000:g}ms): members {missing} did not arrive (neither a "
                f"torchft_pg presence key nor a Gloo address key at rank {missing[0]})"
            )
        poll_s = min(poll_s * 2, _MAX_POLL_S)
    return resolve_global_ranks(_reported_ranks(store, world_size, unconfirmed))


def _arrived(store: Store, rank: int) -> bool:
    return store.check([present_key(rank)]) or store.check([_gloo_key(rank)])


def _probe(store: Store, waiting: list[int], unconfirmed: list[int]) -> list[int]:
    """`waiting` less those of its first few members that arrived.

    One that arrived without a presence key (so far) is added to
    `unconfirmed`. The members still waiting among those looked at go to the
    back, so the next poll looks at others.
    """
    head, rest = waiting[:_PROBES_PER_POLL], waiting[_PROBES_PER_POLL:]
    late: list[int] = []
    for r in head:
        if store.check([present_key(r)]):
            continue
        (unconfirmed if store.check([_gloo_key(r)]) else late).append(r)
    return rest + late


def _reported_ranks(store: Store, world_size: int, unconfirmed: list[int]) -> list[int]:
    """Each member's default-group rank as it reported it; -1 for a plain Gloo member.

    Every member but those `unconfirmed` is known to have set its presence key.
    """
    plain = {r for r in unconfirmed if not store.check([present_key(r)])}
    ours = [r for r in range(world_size) if r not in plain]
    values = dict(zip(ours, store.multi_get([present_key(r) for r in ours]), strict=True))
    return [_parse_rank(values[r]) if r in values else -1 for r in range(world_size)]


def _parse_rank(value: bytes) -> int:
    try:
        return int(value)
    except ValueError:
        return -1  # a member of an older version wrote a bare marker
