"""The one object the Manager's parts share about the current step.

The quorum round, the commit vote, the gradient sync, the notice router and
the server connection each read or write part of what a rank knows about its
step: which quorum the group is configured for and who is in it, this rank's
participation, whether it heals, the step's first failure, its counters. They
all hold the same `StepState` instead of calling back into the Manager, so
what each part may touch is visible in one place:

* the quorum round writes `epoch`, `quorum_id`, `participants` (under
  `pg_lock`, together with the process group they describe), `participation`,
  `healing`, `step_time_ms`, `busy_ms` and what the integrity check reads of the
  quorum (`max_step`, `replica_rank`, `replica_ids`, `heal_source`,
  `quorum_heals`);
* the gradient sync writes `peer_wait_ms` and `collectives_done` as each
  allreduce completes (the quorum round reads the first, and clears it, when
  the next step starts, and sends the second with every request), and
  `skipped_collectives` when it issues an op of a failed step nowhere;
* any part reports a failure (`report_error`); the quorum round clears it,
  `skipped_collectives` and `fence` when a new step starts (`begin_step`),
  once it holds failure notices;
* the notice router sets `fence` when a notice about the step's quorum comes:
  a collective the step issues after that fails it (`refuse_collective`),
  while those it ran before are left to complete;
* the integrity check writes `integrity_report` when it finds this group's
  state (or its heal source's, or its averaged gradient) corrupt, and the quorum round sends it once,
  with its next request, and clears it;
* the server connection writes `replica_id` once it has its incarnation;
* the counters (`StepCounters`) are moved by the round and the vote.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from lighthouse.types import CollectivesDone, IntegrityReport
from torchft_pg.errors import ExceptionWithTraceback
from torchft_pg.manager.participation import NOT_STARTED, Participation
from torchft_pg.manager.step_counters import StepCounters

__all__ = ["StepState", "StepView"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class StepView:
    """What a failure notice is compared with: the rank's quorum, its members
    and its step (read under `StepState.pg_lock`)."""

    epoch: str
    quorum_id: int
    participants: frozenset[str]
    step: int


@dataclass(eq=False, kw_only=True)
class StepState:
    """What one rank knows about its current step; see the module docstring for
    which part writes what.

    `group_rank` is this rank in its replica group; `replica_id` the group's
    name (with its incarnation suffix once connected). `pg_lock` is held while
    the process group and the quorum it is configured for change together.
    """

    group_rank: int
    replica_id: str
    counters: StepCounters = field(default_factory=StepCounters)
    pg_lock: threading.Lock = field(default_factory=threading.Lock)
    epoch: str = ""
    quorum_id: int = -1
    participants: frozenset[str] = frozenset()
    participation: Participation = NOT_STARTED
    healing: bool = False
    # Milliseconds between the starts of the last two quorum rounds (sent with the
    # request, for the lighthouse's dashboard).
    step_time_ms: float = 0.0
    # How long the latest completed allreduce of this step took from its submit to
    # its completion, in milliseconds: the last one of a step completes only once
    # every other replica group contributed, so it is the time this rank waited for
    # its slowest peer (plus the transfer itself). 0.0: none completed yet.
    peer_wait_ms: float = 0.0
    # The last step's own work in milliseconds: `step_time_ms` less `peer_wait_ms`
    # (0 = unknown). In a synchronous job every group's step time is the same (all
    # wait for the slowest); what differs is how much of it each waited for peers,
    # so this, not the step time, tells a straggler (the lighthouse's detector).
    busy_ms: float = 0.0
    # The step's quorum as the integrity check reads it: the quorum's max step, this
    # group's rank among its members (its rank in the cross-replica group), the
    # members' ids in that order, the member this rank heals from (None: none), and
    # whether any member heals this step (the same on every member: the quorum
    # names fewer up-to-date members than members).
    max_step: int = 0
    replica_rank: int = 0
    replica_ids: tuple[str, ...] = ()
    heal_source: int | None = None
    quorum_heals: bool = False
    # The integrity check's latest finding against this group (or its heal source),
    # for the lighthouse: sent once, with the next quorum request (None: none).
    integrity_report: IntegrityReport | None = None
    # The latest step at which a cross-replica allreduce of this rank completed, and
    # on which quorum: every group of that quorum had begun that step, so a leased
    # round may follow it without the lighthouse (None: none yet).
    collectives_done: CollectivesDone | None = None
    # This step left out a collective its peers may have issued (the gradient sync
    # skips every allreduce of a failed step): a later collective of this step
    # would meet theirs out of order, so the integrity check does not join its
    # exchange then.
    skipped_collectives: bool = False
    # A failure notice about this step's quorum came: a collective the step issues
    # from now on fails it with this error, but those it issued before are left to
    # complete, and if they do the step is still voted on (a member cut off from the
    # lighthouse but not from us may commit it too, and failing it here would fork
    # the job's history). None: no such notice.
    fence: Exception | None = None
    _error: ExceptionWithTraceback | None = field(default=None, repr=False)

    # -- the step's failure --------------------------------------------------------
    def begin_step(self) -> None:
        """A new step starts: nothing has failed in it yet."""
        self._error = None
        self.skipped_collectives = False
        self.fence = None

    def refuse_collective(self) -> bool:
        """True (and the step fails with the notice's error) when a failure notice
        fenced this step's quorum: a collective issued now would run with a member
        the lighthouse has declared gone, so it is not issued."""
        fence = self.fence
        if fence is None:
            return False
        self.report_error(fence)
        return True

    def report_error(self, e: Exception) -> None:
        """Mark this step failed (only its first failure is kept): later
        allreduces are skipped and its vote is no."""
        if self._error is None:
            self._error = e if isinstance(e, ExceptionWithTraceback) else ExceptionWithTraceback(e)
            logger.warning("%s step failed: %s: %s", self.tag(), type(e).__name__, e)

    def errored(self) -> ExceptionWithTraceback | None:
        """This step's first failure (the error is its `original_exception`), or None."""
        return self._error

    # -- what others read ------------------------------------------------------------
    def tag(self) -> str:
        """Replica, rank, step and quorum, the prefix of every Manager log line."""
        return (
            f"[replica {self.replica_id} rank {self.group_rank} step {self.counters.step} "
            f"quorum {self.epoch}/{self.quorum_id}]"
        )

    def step_view(self) -> StepView:
        """What failure notices are compared with (read it under `pg_lock`)."""
        return StepView(
            epoch=self.epoch,
            quorum_id=self.quorum_id,
            participants=self.participants,
            step=self.counters.current_step(),
        )
