"""The integrity check: every few committed steps, the replica groups compare
fingerprints of their state, and a group whose state differs is voted out.

Groups that committed the same steps hold bit-identical state, so a
difference is silent data corruption. `IntegrityCheck.run` is called by the
commit vote at every step the quorum's max step is a multiple of `every`
(after the step's collectives and heal, before the vote): each rank of the
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
failed collective (the step votes no).
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
)
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
    (`notices`); failures and findings are reported to `state`.
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
    ) -> None:
        self._state = state
        self._pg = pg
        self._notices = notices
        self._healer = healer
        self.every = every  # steps between checks (None: never); the Manager may change it
        self._timeout = timeout
        self.last_verdict: StateVerdict | None = None  # the latest check's finding
        self.divergences = 0  # checks that found this rank's state (or source) corrupt

    def due(self) -> bool:
        """This step is checked: the quorum's max step (the same on every member,
        healers included) is a positive multiple of `every`."""
        every, step = self.every, self._state.max_step
        return every is not None and step > 0 and step % every == 0

    def run(self) -> None:
        """Run this step's check if it is due (see the module docstring). Never
        raises: a failure or a finding is reported, and the step votes no."""
        if not self.due() or self._pg.errored() is not None:
            return  # a broken group cannot exchange; its error already fails the step
        fingerprint: Fingerprint | None = None
        try:
            # A healer's state is not yet the quorum's, state the user has closed to
            # reads (`disallow_state_dict_read`) is mid-update, and a step that failed
            # may have left it half-done: none takes part, but each still joins the
            # exchange, so that its peers do not wait for it until their timeout.
            failed = self._state.errored() is not None
            if not failed and not self._state.healing and self._healer.reads.allowed:
                fingerprint = fingerprint_state(self._healer.states.user_state())
            mine = absent_vector() if fingerprint is None else fingerprint.vector()
            gathered = [torch.empty_like(mine) for _ in range(self._pg.size())]
            work = self._pg.allgather([gathered], [mine], AllgatherOptions())
            proxy: ProxyFuture[bool] = ProxyFuture(
                work.get_future(), False, self._state.report_error, self._timeout, lambda _: True
            )
            self._notices.track(proxy)
            if not proxy.future.wait():
                return  # the exchange failed or was aborted: reported, the step votes no
            verdict = judge([v.tolist() for v in gathered])
        except Exception as e:
            self._state.report_error(e)
            return
        if failed:
            return
        self.last_verdict = verdict
        self._act(verdict, fingerprint)

    def _act(self, verdict: StateVerdict, fingerprint: Fingerprint | None) -> None:
        state = self._state
        step, me = state.max_step, state.replica_rank
        ids = state.replica_ids

        def who(rank: int) -> str:
            name = ids[rank] if rank < len(ids) else "?"
            return f"replica {name} (replica rank {rank}) group rank {state.group_rank}"

        if verdict.kind == VerdictKind.AGREE:
            logger.debug("%s state fingerprints agree over %s", state.tag(), verdict.checked)
            return
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
            own = verdict.divergence_of(me)
            slots = (
                own.slots
                if own is not None
                else tuple(sorted({s for d in verdict.diverged for s in d.slots}))
            )
            self._report(IntegrityKind.NO_MAJORITY, step, _reported_names(fingerprint, slots))
            state.report_error(StateDivergedError(line))
            return
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
        elif state.heal_source is not None and not verdict.trusted(state.heal_source):
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

    def _report(self, kind: IntegrityKind, step: int, tensors: tuple[str, ...]) -> None:
        """Leave this finding for the lighthouse: the quorum round sends it once,
        with this rank's next request (a later finding replaces an unsent one)."""
        self._state.integrity_report = IntegrityReport(step=step, kind=kind, tensors=tensors)
