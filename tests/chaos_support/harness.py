"""What every chaos trainer rank has around its training loop, whatever the algorithm.

`RankHarness` builds the rank's fault-injecting process group, heal
transport and Manager (the shipped `torchft_pg.chaos.ReplicaFaults`), tells
the supervisor it is ready and waits for its go, reads the supervisor's
messages (`events.Release`, `events.Finish`) and fires the fault plan at the
rank's (replica, step) points once the supervisor released them. The loops themselves are in `trainer.py`
(DDP) and `diloco_trainer.py` (DiLoCo).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

import torch
from torch.distributed import TCPStore

from lighthouse import auth
from tests.chaos_support.diloco_workload import Algorithm, DiLoCoSettings
from tests.chaos_support.events import (
    Corrupted,
    Dying,
    Event,
    FaultFired,
    Finish,
    Frozen,
    Ready,
    Release,
    StraggleEnded,
)
from tests.chaos_support.exact_sum import ExactSumProcessGroup
from torchft_pg.chaos import (
    LIGHTHOUSE_FAULTS,
    Action,
    Fault,
    FaultInjectingManager,
    FaultPlan,
    Phase,
    ReplicaFaults,
)
from torchft_pg.checkpointing import CheckpointTransport, HTTPTransport, PGTransport
from torchft_pg.manager.integrity_check import DEFAULT_CHECK_EVERY
from torchft_pg.process_group import ProcessGroup, ProcessGroupBabyGloo, ProcessGroupGloo

__all__ = ["GO_KEY", "Commands", "Events", "RankHarness", "TrainerConfig"]


@dataclass(frozen=True)
class TrainerConfig:
    """One rank of one replica group. Timeouts in seconds."""

    replica: int
    lighthouse_addr: str
    store_port: int  # this replica group's TCPStore (one per incarnation)
    steps: int
    plan: FaultPlan = field(default_factory=FaultPlan)
    fired: frozenset[tuple[int, int]] = frozenset()  # faults already fired by earlier incarnations
    incarnation: int = 0
    group_rank: int = 0
    group_world_size: int = 1
    pg_kind: str = "gloo"  # or "baby"
    transport: str = "http"  # heal over HTTP, or "pg": over the reconfigured process group
    hidden: int = 64
    seed: int = 0
    timeout_s: float = 5.0
    quorum_timeout_s: float = 60.0
    min_replica_size: int = 1
    delay_s: float = 0.5
    expected_replicas: int = 1  # stop only once a commit at >= `steps` has all of them
    step_time_s: float = 0.0  # simulated compute per (inner) step
    log_level: int = logging.WARNING
    # (planned step, step to fire at) of the fault groups released so far
    released: tuple[tuple[int, int], ...] = ()
    finish_at: int | None = None  # the supervisor's `Finish`, if it was already sent
    algorithm: Algorithm = Algorithm.DDP  # DILOCO: steps are DiLoCo's outer syncs
    diloco: DiLoCoSettings = field(default_factory=DiLoCoSettings)
    job_secret: str | None = None  # exported as TORCHFT_JOB_SECRET, as a launcher would
    # The Manager's integrity check: committed steps between checks (None: off).
    integrity_check_every: int | None = DEFAULT_CHECK_EVERY
    straggle_s: float = 0.25  # STRAGGLE: seconds added to each step ...
    straggle_steps: int = 200  # ... for at most this many steps
    # The data-plan oracle: the dataset an ExactlyOnceBatchSampler draws from (samples)
    # and each rank's batch of it per step.
    data_size: int = 97
    data_batch: int = 3


class Events(Protocol):
    def put(self, event: Event) -> None: ...


class Commands(Protocol):
    """The supervisor's messages to this rank (a `multiprocessing` connection)."""

    def poll(self) -> bool: ...

    def recv(self) -> Any: ...


GO_KEY = "torchft_pg/chaos/go"


class RankHarness:
    """One rank's process group, Manager and link to the supervisor (module docstring).

    `on_allreduce(tensors)` is called inside each allreduce, after the step's
    quorum, with the tensors about to be sent. With `exact_sum`, float32
    allreduces are summed in float64 (`exact_sum`); with `use_async_quorum`
    False the Manager's quorum (and heal) is synchronous, as DiLoCo needs.
    """

    def __init__(
        self,
        config: TrainerConfig,
        events: Events,
        commands: Commands | None,
        on_allreduce: Callable[[list[torch.Tensor]], None],
        *,
        use_async_quorum: bool = True,
        exact_sum: bool = False,
    ) -> None:
        self.config = config
        self.events = events
        self.commands = commands
        self.who = {
            "replica": config.replica,
            "group_rank": config.group_rank,
            "incarnation": config.incarnation,
        }
        timeout = timedelta(seconds=config.timeout_s)
        if config.job_secret is not None:  # every server and client below reads it
            os.environ[auth.SECRET_ENV] = config.job_secret
        self.manager: FaultInjectingManager | None = None
        # The supervisor restarts the lighthouse, resumes a frozen rank and keeps the
        # faults fired by earlier incarnations; the rank tells it what fires and dies.
        self.faults = ReplicaFaults(
            config.plan,
            config.replica,
            group_rank=config.group_rank,
            group_world_size=config.group_world_size,
            delay_s=config.delay_s,
            freeze_s=None,
            fired=config.fired,
            announce=self._announce,
            on_fired=self._fired,
            straggle_s=config.straggle_s,
            straggle_steps=config.straggle_steps,
        )
        self.inner_pg: ProcessGroup = (
            ProcessGroupBabyGloo(timeout=timeout)
            if config.pg_kind == "baby"
            else ProcessGroupGloo(timeout=timeout)
        )
        reducing = ExactSumProcessGroup(self.inner_pg) if exact_sum else self.inner_pg
        self.pg = self.faults.wrap_process_group(reducing, on_allreduce)
        self._manager_start = time.time()
        transport: CheckpointTransport[Any] = (
            PGTransport(self.pg, timeout=timeout, device=torch.device("cpu"))
            if config.transport == "pg"
            # placed where the Manager would place its own (TORCHFT_BIND_HOST, else
            # every interface with a job secret and loopback without)
            else HTTPTransport(timeout, bind_host=os.environ.get("TORCHFT_BIND_HOST") or None)
        )
        self.manager = FaultInjectingManager(
            self.pg,
            injector=self.faults.injector,
            checkpoint_transport=transport,  # the heal phases: wrapped by the Manager
            min_replica_size=config.min_replica_size,
            use_async_quorum=use_async_quorum,
            rank=config.group_rank,
            world_size=config.group_world_size,
            store_addr="127.0.0.1",
            store_port=config.store_port,
            lighthouse_addr=config.lighthouse_addr,
            replica_id=f"replica{config.replica}",
            timeout=timeout,
            quorum_timeout=timedelta(seconds=config.quorum_timeout_s),
            connect_timeout=timedelta(seconds=30),
            integrity_check_every=config.integrity_check_every,
        )
        self.released = dict(config.released)
        self.finish_at = config.finish_at if commands is not None else 0

    @property
    def m(self) -> FaultInjectingManager:
        """The Manager (built in the constructor)."""
        assert self.manager is not None
        return self.manager

    def _announce(self, action: Action, phase: Phase) -> None:
        step = self.manager.current_step() if self.manager is not None else 0
        if action == Action.DIE:
            self.events.put(Dying(**self.who, at=time.time(), phase=phase.value, step=step))
        else:
            self.events.put(
                Frozen(**self.who, at=time.time(), phase=phase.value, step=step, pid=os.getpid())
            )

    def start(self) -> None:
        """Report Ready once the group can meet its peers, then wait for the supervisor's go.

        Ready only once a Baby child serves, so every first incarnation is live
        at the lighthouse before the supervisor says go, and the supervisor
        releases every first incarnation together, so no replica trains alone.
        """
        self.pg.wait_started(timedelta(seconds=120))
        now = time.time()
        self.events.put(Ready(**self.who, at=now, manager_s=now - self._manager_start))
        TCPStore(
            "127.0.0.1",
            self.config.store_port,
            is_master=False,
            wait_for_workers=False,
            timeout=timedelta(seconds=120),
        ).wait([GO_KEY])

    def poll(self) -> None:
        """Take the supervisor's messages sent so far."""
        while self.commands is not None and self.commands.poll():
            message = self.commands.recv()
            if isinstance(message, Release):
                mine = self.config.plan.faults.get((self.config.replica, message.planned_step))
                later = message.others_after if mine not in LIGHTHOUSE_FAULTS else 0
                self.released[message.planned_step] = message.fire_at + later
            elif isinstance(message, Finish):
                self.finish_at = message.at_step

    def finished(self, committed: bool) -> bool:
        """Stop together: this step was a commit at or past the run's end that every
        replica took part in.

        Only a commit counts: a discarded step's quorum may count a replica that
        then failed, and the others stopping there would leave it training alone.
        """
        if self.finish_at is None:
            return False
        return (
            committed
            and self.m.current_step() >= max(self.config.steps, self.finish_at)
            and self.m.num_participants() >= self.config.expected_replicas
        )

    def fire_due(self, step: int) -> Fault | None:
        """Fire the fault planned (and released) for this rank at `step`, if any
        (`ReplicaFaults.fire_due`). Returns it, for the loop to act on the others."""
        released = self.released if self.commands is not None else None
        straggling = self.faults.straggling
        fault = self.faults.fire_due(step, released)
        if straggling and not self.faults.straggling:
            self.events.put(
                StraggleEnded(
                    **self.who, at=time.time(), step=step, healed=self.faults.straggle_healed
                )
            )
        flip = self.faults.last_flip
        if fault == Fault.CORRUPT_STATE and flip is not None:
            self.events.put(
                Corrupted(
                    **self.who,
                    at=time.time(),
                    step=step,
                    tensor=flip.tensor,
                    index=flip.index,
                    bit=flip.bit,
                )
            )
        return fault

    def _fired(self, planned_step: int, fault: Fault, step: int) -> None:
        self.events.put(
            FaultFired(
                **self.who, at=time.time(), planned_step=planned_step, fault=fault.value, step=step
            )
        )

    def shutdown(self) -> None:
        self.m.shutdown(wait=False)
