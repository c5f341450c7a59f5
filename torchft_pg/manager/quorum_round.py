"""One rank's quorum round: request, result, configure, heal.

(Its request goes to the group's manager server, whose
``lighthouse.replica.group_rounds.GroupRounds`` gathers every rank of the
group into one lighthouse call.)

`Manager.start_quorum` hands each step's round to `QuorumRound.start`: it
builds this rank's `ManagerQuorumRequest` and sends it to the group's manager
server; where the `QuorumResult` arrives, `plan_quorum` (pure, in
`quorum_plan`) says what it asks of this rank. A steady round (same quorum,
nothing to heal) finishes right there; otherwise the blocking part runs on
the Manager's quorum thread: reconfigure the process group on a new quorum,
then heal (serve the state, or receive it). The received state is loaded
only when the step commits (`settle_heal`), or at once with a synchronous
quorum (`apply_pending_state`). `QuorumTimings` says where a round's time went.

Where the heal runs depends on the quorum. With a synchronous quorum the
training thread waits in `start_quorum` while the quorum thread heals, so
the user's state is read (or loaded) while nothing else uses it. With an
asynchronous quorum the training thread runs the step's forward and
backward meanwhile, and reading a model's state then is unsafe: FSDP2's
``state_dict()`` reshards the parameters a forward has just unsharded, and
that forward fails. So the heal waits for the vote (`heal_at_vote`, on the
training thread, after the step's collectives, before the vote): outside
forward and backward, and in the same place on both sides, so a transport
that moves the state over the process group (`PGTransport`) orders its
transfer after the step's allreduces on sender and healer alike. A healer
contributes zeros to those allreduces, so nothing waits for its heal. A
source's snapshot served at one vote stays served until its next vote, so a
healer fetching at its own vote never finds it closed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future as ThreadFuture
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from datetime import timedelta

from lighthouse import ManagerQuorumRequest, QuorumResult
from lighthouse.types import HealReport
from torchft_pg.errors import RecoveryError
from torchft_pg.manager.heal import Healer
from torchft_pg.manager.notices import NoticeRouter
from torchft_pg.manager.participation import WorldSizeMode
from torchft_pg.manager.quorum_plan import QuorumPlan, plan_quorum
from torchft_pg.manager.server_connection import ServerConnection
from torchft_pg.manager.step_counters import checked_counters
from torchft_pg.manager.step_state import StepState
from torchft_pg.manager.waiting import WaitReport
from torchft_pg.process_group.base import ProcessGroup

__all__ = ["QuorumRound", "QuorumTimings"]

logger = logging.getLogger(__name__)

WAIT_WARNING_S = 5.0  # a quorum awaited longer than this is logged at WARNING (s)


@dataclass(frozen=True)
class QuorumTimings:
    """Where one `start_quorum` went, in seconds.

    `quorum_s`: from the request to the result (includes waiting for the
    other replicas to reach their step boundary); `configure_s`: rebuilding
    the process group (0 when the quorum did not change); `heal_s`: sending
    or receiving the state (0 when nobody healed).
    """

    quorum_s: float
    configure_s: float = 0.0
    heal_s: float = 0.0


class QuorumRound:
    """Runs each step's quorum round for one rank.

    What a round decides it writes to `state` (`epoch`, `quorum_id` and
    `participants` under its `pg_lock`, where the group changes with them;
    `participation`, `healing`, `step_time_ms`), and a failure it meets it
    reports there (the step's vote becomes no). It keeps its own `timings`.

    `connection` is the group's manager server (the request goes through its
    client; while a round waits, what the lighthouse said about it is read
    there); `executor` is the Manager's single quorum thread (blocking work of
    a round runs there); `clock` (seconds) measures `step_time_ms`.
    """

    def __init__(
        self,
        *,
        state: StepState,
        pg: ProcessGroup,
        notices: NoticeRouter,
        healer: Healer,
        connection: ServerConnection,
        executor: ThreadPoolExecutor,
        use_async_quorum: bool,
        world_size_mode: WorldSizeMode,
        min_replica_size: int,
        init_sync: bool,
        clock: Callable[[], float],
    ) -> None:
        self._state = state
        self._pg = pg
        self._notices = notices
        self._healer = healer
        self._connection = connection
        self._executor = executor
        self._counters = state.counters
        self._use_async_quorum = use_async_quorum
        self._world_size_mode = world_size_mode
        self._min_replica_size = min_replica_size
        self._init_sync = init_sync
        self._clock = clock
        self.timings: QuorumTimings | None = None
        self._last_start: float | None = None  # clock seconds of the last round's start
        self._requested = 0.0  # perf_counter seconds when this round's request went out
        self._future: ThreadFuture[None] | None = None  # done once this round is taken
        # What this rank's latest heal moved, for the lighthouse: sent once, with
        # the next quorum request (None: nothing to report).
        self._heal_report: HealReport | None = None
        # Asynchronous quorum: this step's heal, run by `heal_at_vote` (None: none).
        self._deferred_heal: tuple[QuorumResult, QuorumPlan, timedelta] | None = None
        # A snapshot served at this step's vote, kept served until the next vote.
        self._served_at_vote = False

    # -- the caller's side ---------------------------------------------------------
    @property
    def started(self) -> bool:
        """A round was started (its result may still be pending)."""
        return self._future is not None

    def wait(self) -> None:
        """Block until the latest round is taken; raise its failure. A wait longer
        than `WAIT_WARNING_S` seconds is logged at WARNING, then every 10 s."""
        future = self._future
        assert future is not None, "call start_quorum() first"
        if future.done():  # the steady state: nothing to wait for, nothing to report
            future.result()
            return
        report = WaitReport(time.monotonic)
        period = WAIT_WARNING_S
        while not wait_futures([future], timeout=period).done:
            said = self._connection.lighthouse_wait()
            line = report.waiting(
                f"a quorum for step {self._counters.step}: "
                + (
                    f"the lighthouse says: {said}"
                    if said is not None
                    else "group rank 0's log, the lighthouse's log and its /status page "
                    "say whom it waits for (replicas to join, the join timeout)"
                )
            )
            if line is not None:
                logger.warning(
                    "%s %s (asked %.0f s ago)",
                    self._state.tag(),
                    line,
                    time.perf_counter() - self._requested,
                )
            period = 10.0
        future.result()

    def wait_previous(self) -> None:
        """Before a new round: raise the previous round's failure, if any."""
        if self._future is not None:
            self._future.result()

    def start(self, allow_heal: bool, shrink_only: bool, timeout: timedelta) -> None:
        """Send this step's request (waiting up to `timeout` for the quorum) through
        the manager server's client; the round finishes in the background."""
        now = self._clock()
        if self._last_start is not None:
            step_ms = (now - self._last_start) * 1000.0
            self._state.step_time_ms = step_ms
            self._state.busy_ms = max(0.0, step_ms - self._state.peer_wait_ms)
        self._state.peer_wait_ms = 0.0  # the next step's allreduces measure it afresh
        self._last_start = now
        self._state.healing = False
        self._deferred_heal = None
        self._counters.begin_quorum()
        # Notices are held from here until the quorum is taken, and only then is the
        # new step's failure cleared: a late notice about the step just voted on
        # (a retry has the same step number, and the quorum view is still the old
        # one until the new quorum is taken) must not fail the new attempt.
        self._notices.quorum_requested()
        self._state.begin_step()
        client = self._connection.client()
        self._requested = time.perf_counter()
        done: ThreadFuture[None] = ThreadFuture()
        self._future = done
        request = self._request(shrink_only, timeout)
        try:
            pending = client.quorum_async(request)
        except Exception as e:
            done.set_exception(e)
        else:
            pending.add_done_callback(lambda f: self._on_result(f, done, allow_heal, timeout))

    def _request(self, shrink_only: bool, timeout: timedelta) -> ManagerQuorumRequest:
        """This rank's request for this step's quorum, waiting up to `timeout`.
        It carries the latest heal's report and the integrity check's latest
        finding, which are then cleared (each sent once)."""
        heal, self._heal_report = self._heal_report, None
        integrity, self._state.integrity_report = self._state.integrity_report, None
        return ManagerQuorumRequest(
            group_rank=self._state.group_rank,
            step=self._counters.step,
            checkpoint_metadata=self._healer.transport.metadata(),
            timeout=timeout,
            shrink_only=shrink_only,
            init_sync=self._init_sync,
            commit_failures=self._counters.commit_failures,
            step_time_ms=self._state.step_time_ms,
            heal=heal,
            integrity=integrity,
            busy_ms=min(self._state.busy_ms, self._state.step_time_ms),
            collectives_done=self._state.collectives_done,
        )

    # -- the result ----------------------------------------------------------------
    def _on_result(
        self,
        pending: ThreadFuture[QuorumResult],
        done: ThreadFuture[None],
        allow_heal: bool,
        timeout: timedelta,
    ) -> None:
        """Runs where the result arrives: the manager server's loop for rank 0's
        in-process client, else the remote client's worker thread. In the
        steady state (same quorum, nothing to heal) the step's quorum is
        finished right there; a reconfiguration or heal, which block, go to the
        quorum thread."""
        try:
            result = pending.result()
        except BaseException as e:
            self._notices.quorum_failed()
            done.set_exception(e)
            return
        plan = plan_quorum(
            result,
            configured=(self._state.epoch, self._state.quorum_id),
            group_rank=self._state.group_rank,
            allow_heal=allow_heal,
            heals_in_background=self._use_async_quorum or not allow_heal,
            mode=self._world_size_mode,
            min_replica_size=self._min_replica_size,
        )

        def finish() -> None:
            try:
                self._finish(result, plan, timeout)
            except BaseException as e:
                self._notices.quorum_failed()
                done.set_exception(e)
            else:
                # Held notices take effect before the quorum is seen as taken, so a
                # caller of wait_quorum() never sees a step the notice should fail.
                # Under the lock: a notice arriving meanwhile is held, then applied.
                with self._state.pg_lock:
                    self._notices.quorum_taken_locked()
                    done.set_result(None)

        if plan.steady:
            finish()
            return
        try:
            self._executor.submit(finish)
        except RuntimeError as e:  # shut down meanwhile
            done.set_exception(e)

    def _finish(self, result: QuorumResult, plan: QuorumPlan, timeout: timedelta) -> None:
        """Take this step's ranks from `plan`; reconfigure the PG on a new quorum
        and heal (send or receive the state) if the plan says so."""
        quorum_s = time.perf_counter() - self._requested
        configure_s = self._take(result, plan)
        heal_s = 0.0
        if configure_s is not None and plan.heals:
            if self._use_async_quorum:  # the training thread heals at the vote
                self._deferred_heal = (result, plan, timeout)
                self._state.healing = plan.receive_heal
                if plan.receive_heal:
                    self._counters.healing_to = plan.heal_step
            else:
                start = time.perf_counter()
                self._heal(result, plan, timeout)
                heal_s = time.perf_counter() - start
        self.timings = QuorumTimings(quorum_s, configure_s or 0.0, heal_s)

    def _take(self, result: QuorumResult, plan: QuorumPlan) -> float | None:
        """This step's ranks from `plan`; on a new quorum, reconfigure the PG.
        Returns the seconds spent reconfiguring (0.0 for the same quorum), None
        if it failed (reported: this step votes no)."""
        self._state.participation = plan.participation
        self._state.max_step = result.max_step
        self._state.replica_rank = result.replica_rank
        self._state.replica_ids = tuple(result.replica_ids)
        self._state.heal_source = plan.heal_source if plan.receive_heal else None
        self._state.quorum_heals = result.max_world_size < result.replica_world_size
        if plan.configure_at is None:
            return 0.0
        logger.info(
            "%s new quorum %s/%s: %d replicas %s, reconfiguring at %s",
            self._state.tag(),
            result.epoch,
            result.quorum_id,
            result.replica_world_size,
            result.replica_ids,
            plan.configure_at,
        )
        members = frozenset(result.replica_ids)
        start = time.perf_counter()
        try:
            with (
                self._notices.configuring(result.epoch, result.quorum_id, members),
                self._state.pg_lock,
            ):
                self._pg.configure(
                    plan.configure_at, result.replica_rank, result.replica_world_size
                )
                self._state.epoch, self._state.quorum_id = result.epoch, result.quorum_id
                self._state.participants = members
        except Exception as e:
            self._state.report_error(e)
            return None
        return time.perf_counter() - start

    # -- heal ------------------------------------------------------------------------
    def _heal(self, result: QuorumResult, plan: QuorumPlan, timeout: timedelta) -> None:
        try:
            if plan.send_heal:
                self._healer.send(result, self._counters.state_dict())
            if plan.receive_heal:
                self._state.healing = True
                start = time.perf_counter()
                self._counters.healed = checked_counters(self._healer.receive(result))
                self._heal_report = self._healer.last_received
                logger.info(
                    "%s healed to step %d from replica rank %s in %.3f s (%s bytes)",
                    self._state.tag(),
                    self._counters.current_step(),
                    plan.heal_source,
                    time.perf_counter() - start,
                    None if self._heal_report is None else self._heal_report.bytes_received,
                )
        except Exception as e:
            self._state.report_error(RecoveryError(f"healing at step {plan.heal_step} failed: {e}"))

    def heal_at_vote(self) -> None:
        """Asynchronous quorum: serve or receive this step's heal now, on the
        training thread, before the vote (see the module docstring). A failure
        is reported: the step votes no."""
        deferred, self._deferred_heal = self._deferred_heal, None
        if deferred is None:
            return
        result, plan, timeout = deferred
        start = time.perf_counter()
        self._heal(result, plan, timeout)
        self._served_at_vote = plan.send_heal
        if self.timings is not None:
            self.timings = dataclasses.replace(self.timings, heal_s=time.perf_counter() - start)

    def apply_pending_state(self) -> None:
        """Synchronous quorum: load a received state now, before the step runs."""
        if self._healer.has_pending():
            try:
                self._healer.apply_pending()
            except Exception as e:
                self._state.report_error(RecoveryError(f"applying the healed state failed: {e}"))
            self._state.healing = False

    def settle_heal(self, committed: bool) -> dict[str, int] | None:
        """At the vote: stop serving heals; load a received state only if the group
        `committed` the step. Returns the heal's counters for the vote to apply.

        A healed state is loaded only once the group has committed: in a
        multi-rank group another rank's heal may have failed, and a rank that
        loaded the source's state while its step stays put would train the next
        step on a state its group never committed to. Raises RecoveryError if
        the group committed but loading failed here: this rank cannot follow.
        """
        if self._served_at_vote:  # healers fetch at their own vote: keep it until the next
            self._served_at_vote = False
        else:
            self._healer.transport.disallow_checkpoint()
        healed = self._counters.take_healed()
        if committed and self._healer.has_pending():
            try:
                self._healer.apply_pending()
            except Exception as e:
                raise RecoveryError(
                    f"{self._state.tag()} the group committed a healed step but loading the "
                    f"healed state here failed: {e}"
                ) from e
        self._healer.drop_pending()
        self._state.healing = False
        return healed
