"""`IssueOrder`: a group's collectives issued in the order they were requested.

Gloo (and NCCL) match the members' collectives by the order each member
issues them: the k-th op of one member meets the k-th op of every other. An
allreduce issued at once keeps that order by itself. A quantized sum over
the reduce-scatter issues its second collective only once its first one has
completed, at a moment that differs from member to member, so without care
one member would issue ``sum1.alltoall, sum2.alltoall, sum1.allgather`` (the
caller was quick with its next op) and another ``sum1.alltoall,
sum1.allgather, sum2.alltoall``, and the ops would meet the wrong partners.

Every collective of the gradient sync therefore takes a `Turn`: turns start
in the order they were taken, and a turn holds the group until it is
released, so an op with two stages releases its turn only once it has issued
its second one (or gave up on it). An op requested meanwhile waits, and is
started by whichever thread releases the turn before it. Nothing waits while
no turn is held: the next op starts at once, on its caller's thread.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

__all__ = ["IssueOrder", "Turn"]

logger = logging.getLogger(__name__)


class Turn:
    """One op's place in an `IssueOrder`.

    Its `start` runs once every earlier turn was released (or cancelled), and
    must issue the op's first collective and, once it has issued its last
    one, `release` the turn (also when it gives up). `inline` tells `start`
    whether it runs on the thread that took the turn, before `take` returned.
    """

    def __init__(self, order: IssueOrder, start: Callable[[Turn], None]) -> None:
        self._order = order
        # dropped once started or cancelled: an op refers to its turn, and its
        # buffers should go with it, not wait for the cycle collector
        self._start: Callable[[Turn], None] | None = start
        self._taker = threading.get_ident()
        self._taking = True  # `take` has not returned yet
        self.started = False
        self.released = False
        self.inline = False

    def release(self) -> None:
        """The op has issued all its collectives (or issues no more): let the next
        start. Idempotent; on a turn not started yet, the same as `cancel`."""
        self._order._release(self)

    def cancel(self) -> bool:
        """Never start this turn, if it has not started: True then (its op
        issued nothing and never will), else False (and nothing changes)."""
        return self._order._cancel(self)


class IssueOrder:
    """Starts the `Turn`s taken from it one after another, in the order taken.

    Exactly one thread at a time starts turns (the drainer), with no lock
    held, so a `start` may take the next turn itself, or release its own.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: deque[Turn] = deque()
        self._holder: Turn | None = None  # started and not yet released
        self._draining = False

    def take(self, start: Callable[[Turn], None]) -> Turn:
        """A new turn for an op whose first collective `start` issues; it starts
        now, on this thread, if no earlier turn is held or waiting."""
        turn = Turn(self, start)
        with self._lock:
            self._waiting.append(turn)
        try:
            self._drain()
        finally:
            turn._taking = False
        return turn

    def claim(self) -> bool:
        """Whether an op may be issued now, on this thread, without a turn: no turn
        is held or waiting. True holds off every turn until `unclaim` (call it
        next, once the op is issued); False: take a turn instead. The cheap
        path of a plain allreduce, which nothing is ahead of almost always."""
        with self._lock:
            if self._holder is not None or self._waiting or self._draining:
                return False
            self._draining = True  # turns taken meanwhile wait, and start in `unclaim`
            return True

    def unclaim(self) -> None:
        """End a successful `claim`: start the turns taken meanwhile."""
        with self._lock:
            self._draining = False
        self._drain()

    def idle(self) -> bool:
        """No turn is held or waiting (a snapshot, for tests and checks)."""
        with self._lock:
            return self._holder is None and not self._waiting and not self._draining

    def _release(self, turn: Turn) -> None:
        with self._lock:
            if turn.released:
                return
            turn.released = True
            if self._holder is turn:
                self._holder = None
            elif not turn.started:
                self._waiting.remove(turn)
                turn._start = None
                return  # nothing was held by it: nothing new may start
        self._drain()

    def _cancel(self, turn: Turn) -> bool:
        with self._lock:
            if turn.started:
                return False
            if not turn.released:
                turn.released = True
                self._waiting.remove(turn)
                turn._start = None
            return True

    def _drain(self) -> None:
        """Start waiting turns, in order, while none is held; on one thread at a time."""
        with self._lock:
            if self._draining:
                return  # the thread draining starts what was added, in order
            self._draining = True
        while True:
            with self._lock:
                if self._holder is not None or not self._waiting:
                    self._draining = False
                    return
                turn = self._waiting.popleft()
                turn.started = True
                turn.inline = turn._taking and turn._taker == threading.get_ident()
                self._holder = turn
                start, turn._start = turn._start, None
            try:
                assert start is not None  # a waiting turn was neither started nor cancelled
                start(turn)
            except Exception:  # a start reports its own errors; never stall the order
                logger.exception("a collective's start failed unreported")
                turn.release()
