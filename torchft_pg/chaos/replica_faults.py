"""One rank's share of a fault plan: fires the faults planned for its replica group at its steps.

Every rank of a job under chaos builds the same `FaultPlan` (from one seed:
the plan is data, so the ranks agree without talking) and a `ReplicaFaults`
for its own replica group. The rank routes its step through the fault
injection (`injection`): it wraps its process group here, builds its Manager
as a `FaultInjectingManager` on `injector` (which wraps its heal transport),
and each step

* calls `fire_due(step)` before the forward, with the Manager's step: the
  fault due there fires (a DELAY stalls right here, a FAIL_ALLREDUCE fails
  this step's allreduce, a phase fault is armed for its phase of the step);
* calls `after_forward()` between forward and backward: a KILL_REPLICA dies
  there, a KILL_BABY_CHILD kills the Baby group's backend child there.

A CORRUPT_STATE flips one bit of the state named by `watch_state` in
`fire_due` (`corruption.py`; the flip is kept in `last_flip`); a STRAGGLE
makes every following `fire_due` take `straggle_s` longer, as a replica with
a slow device would, until `straggle_steps` steps passed or the replica was
taken out of the quorum (its step jumps: it healed back in).

A fault fires once per rank. A replica restarted after a planned death would
fire it again from a fresh record, so with `record` the faults fired are kept
in a file that the restarted process reads back.
The lighthouse faults (RESTART_LIGHTHOUSE, FREEZE_LIGHTHOUSE, LIGHTHOUSE_OUTAGE)
are only reported (`on_fired`): the lighthouse belongs to whoever runs the
job, and stopping or restarting it is theirs to do.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import torch

from torchft_pg.chaos.corruption import BitFlip, apply_bit_flip, choose_bit_flip
from torchft_pg.chaos.injection import Action, FaultInjectingProcessGroup, Injector, Phase
from torchft_pg.chaos.plan import Fault, FaultPlan
from torchft_pg.process_group import ProcessGroup, ProcessGroupBaby

__all__ = ["ReplicaFaults"]

logger = logging.getLogger(__name__)

# The faults armed at a phase: (phase, action, whether this step's allreduce also
# fails, so that the next step brings a new quorum (configure) or a heal).
_ARMED: dict[Fault, tuple[Phase, Action, bool]] = {
    Fault.KILL_REPLICA: (Phase.FORWARD, Action.DIE, False),
    Fault.KILL_ALLREDUCE_BEFORE: (Phase.ALLREDUCE_BEFORE, Action.DIE, False),
    Fault.KILL_ALLREDUCE_AFTER: (Phase.ALLREDUCE_AFTER, Action.DIE, False),
    Fault.KILL_COMMIT_BEFORE: (Phase.COMMIT_BEFORE, Action.DIE, False),
    Fault.KILL_COMMIT_AFTER: (Phase.COMMIT_AFTER, Action.DIE, False),
    Fault.KILL_CONFIGURE: (Phase.CONFIGURE, Action.DIE, True),
    Fault.KILL_HEALER: (Phase.HEAL_RECV, Action.DIE, True),
    Fault.KILL_HEAL_SOURCE: (Phase.HEAL_SEND, Action.DIE, False),
    Fault.PARTIAL_KILL: (Phase.ALLREDUCE_AFTER, Action.DIE, False),
    Fault.FREEZE: (Phase.ALLREDUCE_BEFORE, Action.FREEZE, False),
}


class ReplicaFaults:
    """The faults `plan` holds for replica group `replica`, fired by this rank from its loop:
    `fire_due(step)` before each forward, `after_forward()` before each backward.

    `group_rank` of `group_world_size`: this rank's place in its group (a
    PARTIAL_KILL kills only the group's last rank). `delay_s`: how long a
    DELAY stalls the step, in seconds: past the lighthouse's join timeout
    (`--join-timeout-ms`, default 10 s) the replica misses a quorum.
    `freeze_s`: seconds a FREEZE keeps the rank stopped before a helper
    process sends it SIGCONT (past the lighthouse's heartbeat timeout, default
    5 s, plus the process group's timeout, the peers have dropped it and
    given up its collective); None when something else resumes it (a
    supervisor told by `announce`). `fired`: (replica, planned step) of
    faults already fired, which never fire again; `record`: a file that keeps
    them across restarts (read here, appended to as each fires; give each
    rank its own). `announce(action, phase)`: told before the rank dies or
    stops (default: a warning in the log); `on_fired(planned step, fault,
    step)`: told as a fault fires, before it acts. `straggle_s`: seconds a
    STRAGGLE adds to each step, for at most `straggle_steps` steps.
    """

    def __init__(
        self,
        plan: FaultPlan,
        replica: int,
        *,
        group_rank: int = 0,
        group_world_size: int = 1,
        delay_s: float = 12.0,
        freeze_s: float | None = 20.0,
        fired: Iterable[tuple[int, int]] = (),
        record: str | os.PathLike[str] | None = None,
        announce: Callable[[Action, Phase], None] | None = None,
        on_fired: Callable[[int, Fault, int], None] | None = None,
        straggle_s: float = 0.25,
        straggle_steps: int = 200,
    ) -> None:
        if not 0 <= group_rank < group_world_size:
            raise ValueError(f"group_rank {group_rank} is not in [0, {group_world_size})")
        if not straggle_s >= 0:
            raise ValueError(f"straggle_s must be >= 0 seconds, got {straggle_s!r}")
        if (
            isinstance(straggle_steps, bool)
            or not isinstance(straggle_steps, int)
            or (straggle_steps < 1)
        ):
            raise ValueError(f"straggle_steps must be an int >= 1, got {straggle_steps!r}")
        if freeze_s is not None and not freeze_s > 0:
            raise ValueError(f"freeze_s must be > 0 seconds or None, got {freeze_s!r}")
        self.plan = plan
        self.replica = replica
        self.group_rank = group_rank
        self.group_world_size = group_world_size
        self.delay_s = delay_s
        self.freeze_s = freeze_s
        self.record = Path(record) if record is not None else None
        self.fired: set[tuple[int, int]] = set(fired) | self._read_record()
        self._announce = announce or _log_announce
        self._on_fired = on_fired
        self.injector = Injector(self._before_action)
        self.pg: FaultInjectingProcessGroup | None = None
        self._inner: ProcessGroup | None = None  # the group wrapped, for KILL_BABY_CHILD
        self._baby_child_due = False
        self._resumer: subprocess.Popen[bytes] | None = None  # the last freeze's helper
        self.straggle_s = straggle_s
        self.straggle_steps = straggle_steps
        self._state: Callable[[], Iterable[tuple[str, torch.Tensor]]] | None = None
        self.last_flip: BitFlip | None = None  # the latest CORRUPT_STATE's flip
        self._straggle_left = 0  # steps this replica still straggles
        self.straggle_healed = False  # the last straggle ended by a heal (it was left out)
        self._last_step: int | None = None  # the step of the previous fire_due

    def watch_state(self, named_tensors: Callable[[], Iterable[tuple[str, torch.Tensor]]]) -> None:
        """Name the state a CORRUPT_STATE may flip a bit of: `named_tensors()` gives
        (name, tensor) pairs, e.g. the model's `named_parameters` and the
        optimizer's state tensors. The tensors are changed in place."""
        self._state = named_tensors

    @property
    def straggling(self) -> bool:
        """A STRAGGLE fired and this replica still works slowly."""
        return self._straggle_left > 0

    def wrap_process_group(
        self,
        pg: ProcessGroup,
        on_allreduce: Callable[[list[torch.Tensor]], None] | None = None,
    ) -> FaultInjectingProcessGroup:
        """`pg` with the allreduce and configure phases injected; hand it to the Manager.

        `on_allreduce(tensors)` is called inside each allreduce, before it is
        issued. A KILL_BABY_CHILD kills `pg`'s child when `pg` is a Baby group.
        """
        self._inner = pg
        self.pg = FaultInjectingProcessGroup(pg, self.injector, on_allreduce)
        return self.pg

    def fire_due(self, step: int, released: Mapping[int, int] | None = None) -> Fault | None:
        """Fire the fault due for this replica at `step` (the Manager's step), if any.

        The earliest unfired fault planned at or before `step` fires (a
        replica that healed past its planned step still gets it). `released`
        (planned step -> step to fire at), when given, holds a fault back until
        its group is released (`FaultPlan.due`). Returns the fault fired.
        """
        pg = self._wrapped_pg()
        self._baby_child_due = False  # a KILL_BABY_CHILD strikes in the step it fired in
        self._straggle(step)
        due = self.plan.due(self.replica, step, self.fired, released)
        if due is None:
            return None
        planned, fault = due
        if fault == Fault.CORRUPT_STATE and self._state is None:
            raise RuntimeError(
                "a CORRUPT_STATE fault is planned for this replica: name its state with "
                "watch_state() before firing faults"
            )
        self._remember((self.replica, planned))
        if self._on_fired is not None:
            self._on_fired(planned, fault, step)
        if fault == Fault.FAIL_ALLREDUCE:
            pg.fail_next = True
        elif fault == Fault.CORRUPT_STATE:
            assert self._state is not None
            key = f"{self.plan.seed}:{self.replica}:{planned}"
            self.last_flip = choose_bit_flip(key, self._state())
            apply_bit_flip(self.last_flip, self._state())
            logger.warning(
                "chaos: flipped bit %d of element %d of %s (replica %d, step %d)",
                self.last_flip.bit,
                self.last_flip.index,
                self.last_flip.tensor,
                self.replica,
                step,
            )
        elif fault == Fault.STRAGGLE:
            self._straggle_left = self.straggle_steps
            self.straggle_healed = False
            self._straggle(step)  # this step is slow already
        elif fault == Fault.KILL_BABY_CHILD:
            self._baby_child_due = True
        elif fault in _ARMED and not (
            fault == Fault.PARTIAL_KILL and self.group_rank != self.group_world_size - 1
        ):  # a partial kill: only the group's last rank dies
            phase, action, fail_step = _ARMED[fault]
            self.injector.arm(phase, action)
            if fail_step:
                pg.fail_next = True
        if fault == Fault.DELAY:
            time.sleep(self.delay_s)  # the fault itself: a stalled replica
        return fault

    def _straggle(self, step: int) -> None:
        """While straggling, this step takes `straggle_s` longer; a step that jumped
        ahead (a heal: the replica was left out of a quorum) ends the straggle."""
        previous, self._last_step = self._last_step, step
        if not self._straggle_left:
            return
        if previous is not None and step > previous + 1:
            logger.warning(
                "chaos: replica %d healed to step %d; it keeps pace again", self.replica, step
            )
            self._straggle_left = 0
            self.straggle_healed = True
            return
        self._straggle_left -= 1
        time.sleep(self.straggle_s)  # the fault itself: a replica that works slowly

    def after_forward(self) -> None:
        """Between forward and backward: a KILL_REPLICA fired this step dies here, and a
        KILL_BABY_CHILD SIGKILLs the Baby group's backend child (not this rank)."""
        self.injector.hit(Phase.FORWARD)
        if self._baby_child_due:
            self._baby_child_due = False
            inner = self._inner
            if isinstance(inner, ProcessGroupBaby) and inner.child_pid:
                os.kill(inner.child_pid, signal.SIGKILL)

    def _wrapped_pg(self) -> FaultInjectingProcessGroup:
        if self.pg is None:
            raise RuntimeError("wrap the process group (wrap_process_group) before firing faults")
        return self.pg

    def _before_action(self, action: Action, phase: Phase) -> None:
        """Announce; for a freeze, also start the helper process that resumes this one
        (stopped, it cannot resume itself) `freeze_s` seconds later."""
        self._announce(action, phase)
        if action == Action.FREEZE and self.freeze_s is not None:
            self._resumer = subprocess.Popen(
                [
                    "/bin/sh",
                    "-c",
                    'sleep "$0"; kill -CONT "$1"',
                    f"{self.freeze_s:.3f}",
                    str(os.getpid()),
                ]
            )

    def _read_record(self) -> set[tuple[int, int]]:
        if self.record is None or not self.record.exists():
            return set()
        fired = set()
        for line in self.record.read_text().splitlines():
            replica, planned = line.split()
            fired.add((int(replica), int(planned)))
        return fired

    def _remember(self, key: tuple[int, int]) -> None:
        """Count `key` fired, on disk first: the fault may kill this process next."""
        self.fired.add(key)
        if self.record is None:
            return
        with open(self.record, "a") as f:
            f.write(f"{key[0]} {key[1]}\n")
            f.flush()
            os.fsync(f.fileno())


def _log_announce(action: Action, phase: Phase) -> None:
    logger.warning("chaos: this rank %ss now, in the %s phase", action.value, phase.value)
