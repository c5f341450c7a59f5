"""Fault injection inside a step: the trainer's wrapped process group, transport and Manager.

A planned fault arms an action (die or freeze) at a `Phase`; the wrapper that
owns that phase calls `Injector.hit(phase)` each time it passes it, and the
first pass after arming performs the action. The action announces itself
first (`Injector`'s `announce`: a log line, or a message to whoever watches
the job), so an expected death is never mistaken for a crash, and a death
that never came is visible too. `replica_faults.ReplicaFaults` arms them from
a fault plan.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from datetime import timedelta
from enum import Enum
from typing import Any

import torch
from torch.distributed import Work

from torchft_pg.checkpointing import CheckpointTransport
from torchft_pg.manager import Manager
from torchft_pg.process_group import ProcessGroup, ProcessGroupWrapper
from torchft_pg.work import FailedWork

__all__ = [
    "Action",
    "FaultInjectingManager",
    "FaultInjectingProcessGroup",
    "FaultInjectingTransport",
    "Injector",
    "Phase",
]


class Phase(str, Enum):
    """Where in a step an armed fault lands."""

    FORWARD = "forward"  # between forward and backward (the trainer's own loop)
    ALLREDUCE_BEFORE = "allreduce_before"  # in the PG's allreduce, before issuing it
    ALLREDUCE_AFTER = "allreduce_after"  # right after issuing it, the collective in flight
    COMMIT_BEFORE = "commit_before"  # entering should_commit (the allreduce finished)
    COMMIT_AFTER = "commit_after"  # the vote decided; the optimizer has not stepped
    CONFIGURE = "configure"  # entering the PG's configure for a new quorum
    HEAL_RECV = "heal_recv"  # the healer, entering recv_checkpoint
    HEAL_SEND = "heal_send"  # the source, once send_checkpoint returned (serving)


class Action(str, Enum):
    DIE = "die"  # SIGKILL this process
    FREEZE = "freeze"  # SIGSTOP this process; another process sends SIGCONT


class Injector:
    """One rank's armed faults. `announce(action, phase)` tells whoever watches the job
    (and returns once the message is written), then the action is taken."""

    def __init__(self, announce: Callable[[Action, Phase], None]) -> None:
        self._announce = announce
        self._armed: dict[Phase, Action] = {}
        self._lock = threading.Lock()  # phases are passed on the training and quorum threads

    def arm(self, phase: Phase, action: Action) -> None:
        with self._lock:
            self._armed[phase] = action

    def hit(self, phase: Phase) -> None:
        """Perform the action armed at `phase`, once."""
        with self._lock:
            action = self._armed.pop(phase, None)
        if action is None:
            return
        self._announce(action, phase)
        os.kill(os.getpid(), signal.SIGKILL if action == Action.DIE else signal.SIGSTOP)


class FaultInjectingProcessGroup(ProcessGroupWrapper):
    """Wraps a group: reports each allreduce (and its tensors) to `on_allreduce`, when
    given, before issuing it, passes the allreduce and configure phases to
    `injector`, and, once `fail_next` is set, lets the next allreduce run but
    reports it failed."""

    def __init__(
        self,
        pg: ProcessGroup,
        injector: Injector,
        on_allreduce: Callable[[list[torch.Tensor]], None] | None = None,
    ) -> None:
        super().__init__(pg=pg)
        self.injector = injector
        self.on_allreduce = on_allreduce
        self.fail_next = False

    def configure(self, *args: Any, **kwargs: Any) -> None:
        self.injector.hit(Phase.CONFIGURE)
        super().configure(*args, **kwargs)

    def _run(self, op: str, outputs: Any, *args: Any) -> Work:
        if op != "allreduce":
            return super()._run(op, outputs, *args)
        if self.on_allreduce is not None:
            self.on_allreduce(args[0])  # the tensors, as they are about to be sent
        self.injector.hit(Phase.ALLREDUCE_BEFORE)
        work = super()._run(op, outputs, *args)
        self.injector.hit(Phase.ALLREDUCE_AFTER)
        if self.fail_next:
            self.fail_next = False
            work.wait()  # the peers' collective completes; only ours is reported failed
            return FailedWork(RuntimeError("injected allreduce failure"))
        return work


class FaultInjectingTransport(CheckpointTransport[Any]):
    """Delegates to `inner`, passing the heal phases to `injector`."""

    def __init__(self, inner: CheckpointTransport[Any], injector: Injector) -> None:
        self.inner = inner
        self.injector = injector

    def metadata(self) -> str:
        return self.inner.metadata()

    def address(self) -> str:
        return self.inner.address()

    def set_quorum(self, quorum: str, replica_rank: int) -> None:
        self.inner.set_quorum(quorum, replica_rank)

    def send_checkpoint(
        self, dst_ranks: list[int], step: int, state_dict: Any, timeout: timedelta
    ) -> None:
        self.inner.send_checkpoint(dst_ranks, step, state_dict, timeout)
        self.injector.hit(Phase.HEAL_SEND)

    def disallow_checkpoint(self) -> None:
        self.inner.disallow_checkpoint()

    def allow_checkpoint(self, step: int) -> None:
        self.inner.allow_checkpoint(step)

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
        self.injector.hit(Phase.HEAL_RECV)
        return self.inner.recv_checkpoint(src_rank, metadata, step, timeout)

    def received_bytes(self) -> int | None:
        return self.inner.received_bytes()

    def shutdown(self, wait: bool = True) -> None:
        self.inner.shutdown(wait)


class FaultInjectingManager(Manager):
    """A Manager whose commit vote passes the commit phases to `injector`, and whose heal
    transport passes the heal phases: the `checkpoint_transport` given, or the one the
    Manager builds without it, wrapped in a `FaultInjectingTransport` unless it is one."""

    def __init__(self, *args: Any, injector: Injector, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.injector = injector
        healer = self._healer
        if not isinstance(healer.transport, FaultInjectingTransport):
            healer.transport = FaultInjectingTransport(healer.transport, injector)

    def should_commit(self, timeout: timedelta | None = None) -> bool:
        self.injector.hit(Phase.COMMIT_BEFORE)
        decision = super().should_commit(timeout)
        self.injector.hit(Phase.COMMIT_AFTER)
        return decision
