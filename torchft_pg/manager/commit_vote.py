"""The per-step commit vote: every rank of every participating group says yes, or
the step is discarded everywhere.

`CommitVote.should_commit` is `Manager.should_commit`: it waits for the
step's quorum and its in-flight collectives, runs a heal an asynchronous
quorum left for the vote (`QuorumRound.heal_at_vote`), on a check step
compares the state with the other groups' (`IntegrityCheck.run`), casts this rank's vote
(`participation.local_vote`), lets the manager server combine the group's
votes, settles a heal received this step (`QuorumRound.settle_heal`) and
moves the counters (`StepCounters.settle`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta

from lighthouse import QuorumRejectedError
from torchft_pg.errors import CommitFailedError
from torchft_pg.manager.integrity_check import IntegrityCheck
from torchft_pg.manager.notices import NoticeRouter
from torchft_pg.manager.participation import local_vote
from torchft_pg.manager.quorum_round import QuorumRound
from torchft_pg.manager.server_connection import ServerConnection
from torchft_pg.manager.step_state import StepState
from torchft_pg.manager.waiting import WaitReport
from torchft_pg.process_group.base import ProcessGroup

__all__ = ["CommitVote"]

logger = logging.getLogger(__name__)


class CommitVote:
    """One rank's vote on each step.

    `timeout` bounds the wait for in-flight collectives and (unless the call
    passes its own) the vote; `max_retries` failed commits in a row are
    allowed (None: any number). The vote goes through `connection`'s client;
    the step's failure is read from (and reported to) `state`.
    """

    def __init__(
        self,
        *,
        state: StepState,
        pg: ProcessGroup,
        notices: NoticeRouter,
        round: QuorumRound,
        integrity: IntegrityCheck,
        connection: ServerConnection,
        min_replica_size: int,
        max_retries: int | None,
        timeout: timedelta,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._state = state
        self._pg = pg
        self._notices = notices
        self._round = round
        self._integrity = integrity
        self._connection = connection
        self._counters = state.counters
        self._min_replica_size = min_replica_size
        self._max_retries = max_retries
        self._timeout = timeout
        self._short = WaitReport(clock)  # steps with too few replica groups present

    def should_commit(self, timeout: timedelta | None) -> bool:
        """See `Manager.should_commit`."""
        try:
            self._round.wait()
        except Exception as e:
            self._state.report_error(e)
        # the step's collectives nobody waited on (e.g. per-parameter hooks) end first
        self._notices.wait_inflight(self._timeout.total_seconds())
        self._round.heal_at_vote()  # asynchronous quorum: after the collectives, before the vote
        pg_error = self._pg.errored()
        if pg_error is not None and self._state.fence is None:
            # (A notice's fence aborts the group itself once the step's collectives
            # completed: that abort alone does not fail the step.)
            self._state.report_error(pg_error)
        self._integrity.run()  # on a check step: a corrupt state votes no
        failed = self._state.errored() is not None
        participation = self._state.participation
        participants = 0 if failed else participation.world_size
        vote = local_vote(
            failed=failed, present=participation.present, min_replica_size=self._min_replica_size
        )
        client = self._connection.client()
        try:
            decision = client.should_commit(
                self._state.group_rank, self._counters.quorum_step, vote, timeout or self._timeout
            )
        except QuorumRejectedError as e:
            # The server refused this vote (late, stale or abandoned): the group
            # decided this attempt without it, and a decision needs every rank's
            # yes, so it was no. A timeout, by contrast, leaves the decision
            # unknown to this rank and is raised.
            self._state.report_error(e)
            decision = False
        healed = self._round.settle_heal(decision)
        self._counters.settle(decision, participants, healed)
        if not failed and participation.present < self._min_replica_size:
            line = self._short.waiting(
                f"replica groups: this step had {participation.present}, min_replica_size is "
                f"{self._min_replica_size}, so no step commits until more join"
            )
            if line is not None:
                logger.warning("%s %s", self._state.tag(), line)
        elif decision:
            line = self._short.resolved()
            if line is not None:
                logger.warning("%s %s", self._state.tag(), line)
        if logger.isEnabledFor(logging.INFO):  # the tag is built only for a line written
            logger.info(
                "%s %s (vote %s, %d participants, last step %.1f ms, error: %s)",
                self._state.tag(),
                "committed" if decision else "discarded",
                vote,
                participants,
                self._state.step_time_ms,
                self._state.errored(),
            )
        failures = self._counters.commit_failures
        if not decision and self._max_retries is not None and failures > self._max_retries:
            raise CommitFailedError(
                f"{failures} commits failed in a row (max_retries={self._max_retries})"
            )
        return decision
