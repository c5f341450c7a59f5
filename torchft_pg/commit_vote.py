"""The per-step commit vote: every rank of every participating group says yes, or
the step is discarded everywhere.

`CommitVote.should_commit` is `Manager.should_commit`: it waits for the
step's quorum and its in-flight collectives, runs a heal an asynchronous
quorum left for the vote (`QuorumRound.heal_at_vote`), casts this rank's vote
(`participation.local_vote`), lets the manager server combine the group's
votes, settles a heal received this step (`QuorumRound.settle_heal`) and
moves the counters (`StepCounters.settle`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta

from lighthouse import ManagerClientProtocol, QuorumRejectedError
from torchft_pg.errors import CommitFailedError, ExceptionWithTraceback
from torchft_pg.notices import NoticeRouter
from torchft_pg.participation import local_vote
from torchft_pg.process_group.base import ProcessGroup
from torchft_pg.quorum_round import QuorumRound
from torchft_pg.step_counters import StepCounters
from torchft_pg.waiting import WaitReport

__all__ = ["CommitVote"]

# The Manager's logger: the vote's lines are the Manager's, as they always were.
logger = logging.getLogger("torchft_pg.manager")


class CommitVote:
    """One rank's vote on each step.

    `timeout` bounds the wait for in-flight collectives and (unless the call
    passes its own) the vote; `max_retries` failed commits in a row are
    allowed (None: any number); `connect` returns the manager server's client;
    `errored`/`report_error` read and set the step's failure; `tag` names
    replica, rank, step and quorum for log lines.
    """

    def __init__(
        self,
        *,
        pg: ProcessGroup,
        notices: NoticeRouter,
        round: QuorumRound,
        counters: StepCounters,
        group_rank: int,
        min_replica_size: int,
        max_retries: int | None,
        timeout: timedelta,
        connect: Callable[[], ManagerClientProtocol],
        errored: Callable[[], ExceptionWithTraceback | None],
        report_error: Callable[[Exception], None],
        tag: Callable[[], str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pg = pg
        self._notices = notices
        self._round = round
        self._counters = counters
        self._group_rank = group_rank
        self._min_replica_size = min_replica_size
        self._max_retries = max_retries
        self._timeout = timeout
        self._connect = connect
        self._errored = errored
        self._report_error = report_error
        self._tag = tag
        self._short = WaitReport(clock)  # steps with too few replica groups present

    def should_commit(self, timeout: timedelta | None) -> bool:
        """See `Manager.should_commit`."""
        try:
            self._round.wait()
        except Exception as e:
            self._report_error(e)
        # the step's collectives nobody waited on (e.g. per-parameter hooks) end first
        self._notices.wait_inflight(self._timeout.total_seconds())
        self._round.heal_at_vote()  # asynchronous quorum: after the collectives, before the vote
        pg_error = self._pg.errored()
        if pg_error is not None:
            self._report_error(pg_error)
        failed = self._errored() is not None
        participation = self._round.participation
        participants = 0 if failed else participation.world_size
        vote = local_vote(
            failed=failed, present=participation.present, min_replica_size=self._min_replica_size
        )
        client = self._connect()
        try:
            decision = client.should_commit(
                self._group_rank, self._counters.quorum_step, vote, timeout or self._timeout
            )
        except QuorumRejectedError as e:
            # The server refused this vote (late, stale or abandoned): the group
            # decided this attempt without it, and a decision needs every rank's
            # yes, so it was no. A timeout, by contrast, leaves the decision
            # unknown to this rank and is raised.
            self._report_error(e)
            decision = False
        healed = self._round.settle_heal(decision)
        self._counters.settle(decision, participants, healed)
        if not failed and participation.present < self._min_replica_size:
            line = self._short.waiting(
                f"replica groups: this step had {participation.present}, min_replica_size is "
                f"{self._min_replica_size}, so no step commits until more join"
            )
            if line is not None:
                logger.warning("%s %s", self._tag(), line)
        elif decision:
            line = self._short.resolved()
            if line is not None:
                logger.warning("%s %s", self._tag(), line)
        if logger.isEnabledFor(logging.INFO):  # the tag is built only for a line written
            logger.info(
                "%s %s (vote %s, %d participants, last step %.1f ms, error: %s)",
                self._tag(),
                "committed" if decision else "discarded",
                vote,
                participants,
                self._round.step_time_ms,
                self._errored(),
            )
        failures = self._counters.commit_failures
        if not decision and self._max_retries is not None and failures > self._max_retries:
            raise CommitFailedError(
                f"{failures} commits failed in a row (max_retries={self._max_retries})"
            )
        return decision
