"""Route the lighthouse's failure notices to the step they concern.

A notice says that members of a quorum died, or (with a step) that a
recalled quorum lease stranded that step. Only a step running collectives on
that quorum is affected: its in-flight collectives complete at once (tensors
left as they were), the step's vote becomes no and the process group is
aborted, so the next quorum (with a new id) rebuilds it. A notice about a
quorum being configured interrupts the rendezvous instead of letting it run
to its timeout. A notice arriving while the step's quorum is being formed is
held until the quorum is taken: a step answered from a lease keeps the quorum
id, so the notice may concern it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from lighthouse import FailureNotice
from torchft_pg.errors import ProcessGroupError
from torchft_pg.futures import ProxyFuture
from torchft_pg.manager.step_state import StepState
from torchft_pg.process_group.base import ProcessGroup

__all__ = ["NoticeRouter"]


class NoticeRouter:
    """Fails the collectives of the step a notice concerns; holds early ones.

    A notice is compared with `state`'s view of the step, read under its
    `pg_lock` (the lock under which the group and the quorum it is configured
    for change together); a notice that concerns the step fails it there.
    """

    def __init__(self, pg: ProcessGroup, state: StepState) -> None:
        self._pg = pg
        self._state = state
        self._inflight: set[ProxyFuture[Any]] = set()
        self._inflight_lock = threading.Lock()
        self._held: list[FailureNotice] = []  # arrived while a quorum was forming
        self._quorum_taken = True
        self._configuring: tuple[str, int, frozenset[str]] | None = None

    # -- what the Manager tells the router ------------------------------------------
    def track(self, proxy: ProxyFuture[Any]) -> None:
        """Abort `proxy` if a notice fails this step; forgotten once it completes."""
        with self._inflight_lock:
            self._inflight.add(proxy)
        proxy.future.add_done_callback(lambda _: self._forget(proxy))

    def wait_inflight(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s`` seconds in all) until every tracked collective
        has completed or failed: a vote must see the step's last allreduce, also
        one nobody waited on (a per-parameter gradient hook). Failures are
        reported by the proxies themselves, never raised here."""
        with self._inflight_lock:
            waiting = list(self._inflight)
        deadline = time.monotonic() + timeout_s
        for proxy in waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            done = threading.Event()
            proxy.future.add_done_callback(lambda _, done=done: done.set())  # type: ignore[misc]
            done.wait(left)

    def _forget(self, proxy: ProxyFuture[Any]) -> None:
        with self._inflight_lock:
            self._inflight.discard(proxy)

    def quorum_requested(self) -> None:
        """A new quorum is being formed: hold notices until `quorum_taken_locked`."""
        with self._state.pg_lock:
            self._held = []  # left over only from a round that failed
            self._quorum_taken = False

    def quorum_taken_locked(self) -> None:
        """The step's quorum is taken: apply the held notices (caller holds the state's `pg_lock`)."""
        self._quorum_taken = True
        held, self._held = self._held, []
        for notice in held:
            self._apply_locked(notice)

    def quorum_failed(self) -> None:
        """The quorum failed: later notices apply at once; the held ones are dropped
        at the next `quorum_requested`."""
        with self._state.pg_lock:
            self._quorum_taken = True

    @contextlib.contextmanager
    def configuring(self, epoch: str, quorum_id: int, members: frozenset[str]) -> Iterator[None]:
        """While the group is configured for this quorum, a notice about a member interrupts it."""
        self._configuring = (epoch, quorum_id, members)
        try:
            yield
        finally:
            self._configuring = None

    # -- notices ------------------------------------------------------------------
    def on_notice(self, notice: FailureNotice) -> None:
        """Handle one notice from the lighthouse (on the notice stream's thread)."""
        configuring = self._configuring
        if configuring is not None and (notice.epoch, notice.quorum_id) == configuring[:2]:
            dead_members = set(notice.dead_replica_ids) & configuring[2]
            if dead_members:  # fail the rendezvous now instead of at its timeout
                self._pg.interrupt_configure(
                    f"replica(s) {sorted(dead_members)} died: {notice.reason}"
                )
                return
        with self._state.pg_lock:
            if self._quorum_taken:
                self._apply_locked(notice)
            else:
                self._held.append(notice)

    def _apply_locked(self, notice: FailureNotice) -> None:
        view = self._state.step_view()
        if (notice.epoch, notice.quorum_id) != (view.epoch, view.quorum_id):
            return
        if notice.step is not None and notice.step != view.step:
            return  # about a step this rank already finished (or has not begun)
        dead = set(notice.dead_replica_ids) & view.participants
        if not dead:
            return
        what = "died" if notice.step is None else f"left the lease at step {notice.step}"
        error = ProcessGroupError(
            f"replica(s) {sorted(dead)} of quorum {notice.quorum_id} {what}: {notice.reason}"
        )
        self._state.report_error(error)
        with self._inflight_lock:
            inflight = list(self._inflight)
        for proxy in inflight:
            proxy.abort(error)
        self._pg.abort()  # the next quorum has a new id, so configure rebuilds it
