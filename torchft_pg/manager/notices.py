"""Route the lighthouse's failure notices to the step they concern.

A notice says that members of a quorum died, or (with a step) that a
recalled quorum lease stranded that step. Only a step on that quorum is
affected, and what happens depends on its collectives:

* none running (all it issued so far completed, or none issued yet): every
  member, the one named included, took part in what completed, so the step
  is still voted on. A member the lighthouse declared dead may be alive and
  merely cut off from it; it commits such a step on its lease, and if we
  failed it the next quorum would run that step again without it and the
  job's history would fork. The process group is aborted and the step fenced
  (`StepState.fence`): a collective it issues from now on fails it, and then
  fails for that member too, since we never take part in it;
* some running: they get `INFLIGHT_GRACE_S` to complete (they do at once if
  the member is alive); those still running then are aborted (tensors left
  as they were), the step's vote becomes no and the group is aborted.

The next quorum has a new id, so configure rebuilds the group. A notice
about a quorum being configured interrupts the rendezvous instead of
letting it run to its timeout. A notice arriving while the step's quorum is
being formed is held until the quorum is taken: a step answered from a
lease keeps the quorum id, so the notice may concern it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from lighthouse import FailureNotice
from torchft_pg.errors import ProcessGroupError
from torchft_pg.futures import ProxyFuture
from torchft_pg.manager.step_state import StepState, StepView
from torchft_pg.process_group.base import ProcessGroup

__all__ = ["INFLIGHT_GRACE_S", "NoticeRouter"]

logger = logging.getLogger(__name__)

# Seconds a collective running when a notice comes gets to complete before it is
# aborted: one whose members are all alive completes within a transfer's time, and
# aborting it could leave a member cut off only from the lighthouse holding its
# result (and committing the step) while we fail it. One that waits for a member
# that really is gone is aborted this much after the notice.
INFLIGHT_GRACE_S = 0.2


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
        """Abort `proxy` if a notice fails this step; forgotten once it completes.

        A collective tracked once its step is fenced was issued while the notice
        came (the fence was not there yet when it was issued): it gets the same
        grace as one running at the notice."""
        with self._inflight_lock:
            self._inflight.add(proxy)
        proxy.future.add_done_callback(lambda _: self._forget(proxy))
        fence = self._state.fence
        if fence is not None and not proxy.done:
            self._start_grace(self._state.step_view(), [proxy], fence, abort_pg=False)

    def wait_inflight(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s`` seconds in all) until every tracked collective
        has completed or failed: a vote must see the step's last allreduce, also
        one nobody waited on (a per-parameter gradient hook). Failures are
        reported by the proxies themselves, never raised here."""
        with self._inflight_lock:
            waiting = list(self._inflight)
        _wait_all(waiting, timeout_s)

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
        self._state.fence = error
        with self._inflight_lock:
            running = [proxy for proxy in self._inflight if not proxy.done]
        if running:
            self._start_grace(view, running, error, abort_pg=True)
            return
        logger.info(
            "%s %s; no collective of this step is running, so it is still voted on, "
            "and any collective it issues from now on fails it",
            self._state.tag(),
            error,
        )
        self._pg.abort()  # the next quorum has a new id, so configure rebuilds it

    def _start_grace(
        self,
        view: StepView,
        running: list[ProxyFuture[Any]],
        error: Exception,
        *,
        abort_pg: bool,
    ) -> None:
        threading.Thread(
            target=self._abort_after_grace,
            args=(view, running, error, abort_pg),
            name="torchft_pg-notice-grace",
            daemon=True,
        ).start()

    def _abort_after_grace(
        self,
        view: StepView,
        running: list[ProxyFuture[Any]],
        error: Exception,
        abort_pg: bool,
    ) -> None:
        """Give the collectives `running` at the notice `INFLIGHT_GRACE_S` seconds
        to complete; then fail the step if any still runs, and, with `abort_pg`,
        abort the group (unless it was configured for another quorum meanwhile).
        Without it the notice's own handling aborts the group."""
        _wait_all(running, INFLIGHT_GRACE_S)
        with self._state.pg_lock:
            now = self._state.step_view()
            if (now.epoch, now.quorum_id) != (view.epoch, view.quorum_id):
                return  # reconfigured: the group now serves another quorum
            still = [proxy for proxy in running if not proxy.done]
            failing = bool(still) and now.step == view.step
            if failing:
                self._state.report_error(error)
            if abort_pg:
                self._pg.abort()
            if failing:
                for proxy in still:
                    proxy.abort(error)


def _wait_all(proxies: list[ProxyFuture[Any]], timeout_s: float) -> None:
    """Wait until every one of `proxies` has completed, at most `timeout_s` seconds in all."""
    deadline = time.monotonic() + timeout_s
    for proxy in proxies:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        done = threading.Event()
        proxy.future.add_done_callback(lambda _, done=done: done.set())  # type: ignore[misc]
        done.wait(left)
