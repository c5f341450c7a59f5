"""The integrity check: every few committed steps, the replica groups compare
fingerprints of their state, and a group whose state differs is voted out.

Groups that committed the same steps hold bit-identical state, so a
difference is silent data corruption. `IntegrityCheck.run` is called by the
commit vote at every step the quorum's max step is a multiple of `every`, and
at every step some member heals (after the step's collectives and heal,
before the vote). The second is what keeps a corruption from spreading: a
group corrupted since the last check may be the one a joiner heals from, and
only a check at that very step can tell the joiner to drop what it received.
Heals are rare, so this costs little. Each rank of the
cross-replica group fingerprints its registered state
(`fingerprint.fingerprint_state`; each rank its own shard, which the same rank
of every other group holds too) and allgathers the fingerprint with its peers;
a member that heals this step sends an absent one. `state_verdict.judge`
(pure) then says what follows:

* all agree: nothing;
* a strict majority agrees: each member outside it reports the step failed
  (`StateDivergedError`), so its group votes no; the majority's groups
  commit, the corrupt group is one step behind at the next quorum and heals
  from an up-to-date member, which passed this check. A healer whose heal
  source is outside the majority reports the step failed too and drops what
  it received: a corrupt state is never the one a joiner keeps;
* no strict majority: every member reports the step failed, so no group
  commits; the check runs again at the step's retry, so the job stops
  committing (until `max_retries` raises) rather than guessing which state
  is right.

Each finding is logged at WARNING with the replica, rank, step and the first
differing tensors. A finding against this rank's own group (its state, its
heal source's, or no majority) is also left in `StepState.integrity_report`
(an `IntegrityReport`), which the quorum round sends once with its next
request: the lighthouse records it (timeline, `/status`, `/metrics`) and
quarantines a group that keeps diverging. A failure of the exchange itself is reported like a
failed collective (the step votes no). A member whose step failed still
joins the exchange, with an absent fingerprint, so that nobody waits for it;
unless the failure made it skip an allreduce its peers issued
(`StepState.skipped_collectives`): its exchange would meet their allreduce
and hang both, so it votes no at once instead.

Averaged gradients (`Manager(integrity_check_gradients=True)`, off by
default): at the same steps each member also fingerprints every allreduce
result of the step, in call order (`gradient_digests`), and `judge`
compares those too. They travel in the same allgather, as a second
fixed-length vector after the state's: one collective's latency, not two,
and a member with the option off sends an absent second half, so groups
configured differently still meet in one collective of one size (never a
second allgather some members skip, which would hang the others until the
timeout). Healers and spares take part, since they received the same
average; a member whose step failed sends both halves absent. A group whose
averaged gradient differs from the majority's votes no like a state
divergence (its state is not in question: it never applies that gradient,
and heals to the majority's step at the next quorum) and reports
`IntegrityKind.GRADIENT_DIVERGED`; with no majority nobody commits (the
retry recomputes the gradients). A state finding of the same check comes
first: it is the one reported to the lighthouse.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import torch

from lighthouse.types import IntegrityKind, IntegrityReport
from lighthouse.validate import MAX_INTEGRITY_TENSORS, MAX_TENSOR_NAME_CHARS
from torchft_pg._torch_internals import AllgatherOptions
from torchft_pg.errors import StateDivergedError
from torchft_pg.futures import ProxyFuture
from torchft_pg.manager.fingerprint import (
    Fingerprint,
    absent_vector,
    fingerprint_state,
    names_in_slots,
    vector_length,
)
from torchft_pg.manager.gradient_digests import GradientDigests
from torchft_pg.manager.heal import Healer
from torchft_pg.manager.notices import NoticeRouter
from torchft_pg.manager.state_verdict import StateVerdict, VerdictKind, judge
from torchft_pg.manager.step_state import StepState
from torchft_pg.process_group.base import ProcessGroup

__all__ = ["DEFAULT_CHECK_EVERY", "IntegrityCheck", "check_every"]

logger = logging.getLogger(__name__)

# Committed steps between checks by default: a corruption is caught within 100
# steps, and one fingerprint every 100 steps costs well under 1% of a step.
DEFAULT_CHECK_EVERY = 100
NAMES_SHOWN = 5  # differing tensors named in a log line


def check_every(value: int | None) -> int | None:
    """`value` checked as `Manager(integrity_check_every=...)`: steps between checks,
    or None (also 0) for no checks. Raises ValueError naming a bad value."""
    if value is None or (not isinstance(value, bool) and isinstance(value, int) and value == 0):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"integrity_check_every must be an int >= 0 (steps between checks; 0 or None: "
            f"off), got {value!r}"
        )
    return value


def _names(fingerprint: Fingerprint | None, slots: tuple[int, ...]) -> str:
    if fingerprint is None:
        return f"{len(slots)} digest slots"
    names = names_in_slots(fingerprint.names, slots)
    shown = ", ".join(names[:NAMES_SHOWN])
    more = len(names) - NAMES_SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def _slots_against(verdict: StateVerdict, me: int) -> tuple[int, ...]:
    """The digest slots to name for member `me`: where its own value differs, or, when
    it is not among the diverged, every slot any member differs in."""
    own = verdict.divergence_of(me)
    if own is not None:
        return own.slots
    return tuple(sorted({s for d in verdict.diverged for s in d.slots}))


def _reported_names(fingerprint: Fingerprint | None, slots: tuple[int, ...]) -> tuple[str, ...]:
    """The first differing tensors' names as an `IntegrityReport` carries them:
    at most `MAX_INTEGRITY_TENSORS`, each cut to `MAX_TENSOR_NAME_CHARS`
    characters, unprintable characters escaped; () without a fingerprint."""
    if fingerprint is None:
        return ()
    out = []
    for name in names_in_slots(fingerprint.names, slots)[:MAX_INTEGRITY_TENSORS]:
        printable = name if name.isprintable() else ascii(name)[1:-1]
        if printable:
            out.append(printable[:MAX_TENSOR_NAME_CHARS])
    return tuple(out)


class IntegrityCheck:
    """Compares this rank's state with the same rank of the other groups every
    `every` committed steps (None: never), over the cross-replica group `pg`.

    The state is what `healer`'s registered functions return; the exchange
    waits at most `timeout` and is completed at once by a failure notice
    (`notices`); failures and findings are reported to `state`. With
    `gradients` the step's allreduce results (`gradient_digests`, which
    `GradientSync` fills) are compared too.
    """

    def __init__(
        self,
        *,
        state: StepState,
        pg: ProcessGroup,
        notices: NoticeRouter,
        healer: Healer,
        every: int | None,
        timeout: timedelta,
        gradients: bool = False,
    ) -> None:
        self._state = state
        self._pg = pg
        self._notices = notices
        self._healer = healer
        self.every = every  # steps between checks (None: never); the Manager may change it
        self._timeout = timeout
        self.last_verdict: StateVerdict | None = None  # the latest check's finding
        self.divergences = 0  # checks that found this rank's state (or source) corrupt
        # the step's allreduce results, digested while `gradient_digests.enabled`
        # (the Manager's option) and this check is due
        self.gradient_digests = GradientDigests(due=self.due, enabled=gradients)
        self.last_gradient_verdict: StateVerdict | None = None  # None: not compared
        self.gradient_divergences = 0  # checks that found this rank's averaged gradient corrupt

    def due(self) -> bool:
        """This step is checked: checks are on (`every` is not None), the quorum's
        max step is positive, and it is a multiple of `every` or some member heals
        at it. Both are the same on every member, healers included, so all of them
        join the exchange or none does."""
        every, step = self.every, self._state.max_step
        if every is None or step <= 0:
            return False
        return step % every == 0 or self._state.quorum_heals

    def run(self) -> None:
        """Run this step's check if it is due (see the module docstring). Never
        raises: a failure or a finding is reported, and the step votes no."""
        if not self.due():
            return
        if self._state.refuse_collective():
            return  # a notice fenced the step: the exchange would run with a member declared gone
        if self._pg.errored() is not None:
            return  # a broken group cannot exchange; its error already fails the step
        if self._state.skipped_collectives:
            # This failed step left out an allreduce its peers issued: the exchange
            # would meet theirs in its place and hang both. It votes no instead,
            # and its next request (the lease recall) aborts their step.
            return
        fingerprint: Fingerprint | None = None
        gradients: Fingerprint | None = None
        try:
            # A healer's state is not yet the quorum's, state the user has closed to
            # reads (`disallow_state_dict_read`) is mid-update, and a step that failed
            # may have left it half-done: none takes part, but each still joins the
            # exchange, so that its peers do not wait for it until their timeout.
            failed = self._state.errored() is not None
            if not failed and not self._state.healing and self._healer.reads.allowed:
                fingerprint = fingerprint_state(self._healer.states.user_state())
            # A healer's and a spare's averaged gradients are the same as everyone's.
            taken = self.gradient_digests.take()  # None: the option was off this step
            gradients = None if failed else taken
            mine = torch.cat(
                [
                    absent_vector() if fingerprint is None else fingerprint.vector(),
                    absent_vector() if gradients is None else gradients.vector(),
                ]
            )
            gathered = [torch.empty_like(mine) for _ in range(self._pg.size())]
            work = self._pg.allgather([gathered], [mine], AllgatherOptions())
            proxy: ProxyFuture[bool] = ProxyFuture(
                work.get_future(), False, self._state.report_error, self._timeout, lambda _: True
            )
            self._notices.track(proxy)
            if not proxy.future.wait():
                return  # the exchange failed or was aborted: reported, the step votes no
            n = vector_length()
            vectors = [v.tolist() for v in gathered]
            verdict = judge([v[:n] for v in vectors])
            gradient_verdict = judge([v[n:] for v in vectors])
        except Exception as e:
            self._state.report_error(e)
            return
        if failed:
            return
        self.last_verdict = verdict
        reported = self._act(verdict, fingerprint)
        if gradients is not None:
            self.last_gradient_verdict = gradient_verdict
            self._act_on_gradients(gradient_verdict, gradients, report=not reported)

    def _who(self, rank: int) -> str:
        """Member `rank` of the cross-replica group, as a log line names it."""
        ids = self._state.replica_ids
        name = ids[rank] if rank < len(ids) else "?"
        return f"replica {name} (replica rank {rank}) group rank {self._state.group_rank}"

    def _act(self, verdict: StateVerdict, fingerprint: Fingerprint | None) -> bool:
        """Log and report the state `verdict`; True if it left a report (a finding
        against this rank's group or its heal source)."""
        state = self._state
        step, me = state.max_step, state.replica_rank
        ids = state.replica_ids
        who = self._who

        if verdict.kind == VerdictKind.AGREE:
            logger.debug("%s state fingerprints agree over %s", state.tag(), verdict.checked)
            return False
        if verdict.kind == VerdictKind.NO_MAJORITY:
            differing = "; ".join(
                f"{who(d.rank)} differs in {_names(fingerprint, d.slots)}" for d in verdict.diverged
            )
            line = (
                f"the replica groups' states disagree at step {step} and no majority holds "
                f"one state ({len(verdict.checked)} compared; against {who(verdict.checked[0])}: "
                f"{differing}), so the job stops committing rather than guessing which is right: "
                "restart the job from a checkpoint known to be good, or add replica groups "
                "restored from it so that a majority exists"
            )
            logger.warning("%s %s", state.tag(), line)
            self.divergences += 1
            slots = _slots_against(verdict, me)
            self._report(IntegrityKind.NO_MAJORITY, step, _reported_names(fingerprint, slots))
            state.report_error(StateDivergedError(line))
            return True
        for d in verdict.diverged:
            logger.warning(
                "%s silent data corruption: %s differs from the majority %s at step %d in %s%s",
                state.tag(),
                who(d.rank),
                [ids[r] if r < len(ids) else r for r in verdict.majority],
                step,
                _names(fingerprint, d.slots),
                " (it holds a different number of tensors)" if d.count_differs else "",
            )
        mine = verdict.divergence_of(me)
        if mine is not None:
            self.divergences += 1
            self._report(IntegrityKind.DIVERGED, step, _reported_names(fingerprint, mine.slots))
            state.report_error(
                StateDivergedError(
                    f"this replica's state differs from the majority's at step {step} in "
                    f"{_names(fingerprint, mine.slots)}: it votes no and heals at the next quorum"
                )
            )
            return True
        if state.heal_source is not None and not verdict.trusted(state.heal_source):
            self.divergences += 1
            # A healer holds no fingerprint of its own, so no names to map the digest
            # slots to: the report names none (the source's own report names them).
            self._report(IntegrityKind.HEAL_SOURCE_DIVERGED, step, ())
            state.report_error(
                StateDivergedError(
                    f"this step's heal source, {who(state.heal_source)}, holds a state that "
                    f"differs from the majority's at step {step}: the healed state is dropped"
                )
            )
            return True
        return False

    def _act_on_gradients(
        self, verdict: StateVerdict, gradients: Fingerprint, *, report: bool
    ) -> None:
        """Log the averaged gradients' `verdict`; a finding against this rank's group
        fails its step, and is reported to the lighthouse if `report` (no state
        finding of the same check was)."""
        state = self._state
        step, me = state.max_step, state.replica_rank
        ids = state.replica_ids
        if verdict.kind == VerdictKind.AGREE:
            logger.debug("%s averaged gradients agree over %s", state.tag(), verdict.checked)
            return
        if verdict.kind == VerdictKind.NO_MAJORITY:
            differing = "; ".join(
                f"{self._who(d.rank)} differs in {_names(gradients, d.slots)}"
                for d in verdict.diverged
            )
            line = (
                f"the replica groups' averaged gradients (allreduce results) disagree at step "
                f"{step} and no majority holds one ({len(verdict.checked)} compared; against "
                f"{self._who(verdict.checked[0])}: {differing}), so no group commits this "
                "step; its retry reduces the gradients again, and a reduction that keeps "
                "disagreeing stops the job from committing"
            )
            logger.warning("%s %s", state.tag(), line)
            self.gradient_divergences += 1
            slots = _slots_against(verdict, me)
            if report:
                self._report(IntegrityKind.NO_MAJORITY, step, _reported_names(gradients, slots))
            state.report_error(StateDivergedError(line))
            return
        for d in verdict.diverged:
            logger.warning(
                "%s corrupt gradient reduction: %s received an averaged gradient that differs "
                "from the majority %s at step %d in %s%s (its state was not changed by it: "
                "it votes no and heals)",
                state.tag(),
                self._who(d.rank),
                [ids[r] if r < len(ids) else r for r in verdict.majority],
                step,
                _names(gradients, d.slots),
                " (it reduced a different number of tensors)" if d.count_differs else "",
            )
        mine = verdict.divergence_of(me)
        if mine is None:
            return
        self.gradient_divergences += 1
        if report:
            self._report(
                IntegrityKind.GRADIENT_DIVERGED, step, _reported_names(gradients, mine.slots)
            )
        state.report_error(
            StateDivergedError(
                f"this replica's averaged gradient differs from the majority's at step {step} "
                f"in {_names(gradients, mine.slots)} (a corrupt reduction): it votes no and "
                "heals at the next quorum"
            )
        )

    def _report(self, kind: IntegrityKind, step: int, tensors: tuple[str, ...]) -> None:
        """Leave this finding for the lighthouse: the quorum round sends it once,
        with this rank's next request (a later finding replaces an unsent one)."""
        self._state.integrity_report = IntegrityReport(step=step, kind=kind, tensors=tensors)
