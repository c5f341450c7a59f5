"""The reference replica training loop used by the demo, the chaos tests and the benchmarks.

A small MLP (`workload.Workload`) trained with torchft_pg's DDP and
OptimizerWrapper. Every step it reports to the supervisor (`events`): its
contribution as it issues the allreduce, then the step's outcome with a digest
of the state after a commit. It applies the fault plan at its (replica, step)
points, once the supervisor has released them (`commands`), arming the
phase faults in `injection`. Data depend only on (replica, step) and the seed,
so runs are reproducible and the oracle can replay them.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

import torch
from torch.distributed import TCPStore

from torchft_pg.chaos.events import (
    Contribution,
    Done,
    Dying,
    Error,
    Event,
    FaultFired,
    Finish,
    Frozen,
    Joined,
    Ready,
    Release,
    Started,
    StepEnded,
)
from torchft_pg.chaos.injection import (
    Action,
    FaultInjectingManager,
    FaultInjectingProcessGroup,
    FaultInjectingTransport,
    Injector,
    Phase,
)
from torchft_pg.chaos.plan import Fault, FaultPlan
from torchft_pg.chaos.workload import REDUCE_DTYPE, Workload, flat_state, state_checksum
from torchft_pg.checkpointing import CheckpointTransport, HTTPTransport, PGTransport
from torchft_pg.ddp import DistributedDataParallel
from torchft_pg.manager import Manager
from torchft_pg.optim import OptimizerWrapper
from torchft_pg.process_group import ProcessGroup, ProcessGroupBabyGloo, ProcessGroupGloo

__all__ = ["TrainerConfig", "run_trainer", "state_checksum"]


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
    step_time_s: float = 0.0  # simulated compute per step
    log_level: int = logging.WARNING
    # (planned step, step to fire at) of the fault groups released so far
    released: tuple[tuple[int, int], ...] = ()
    finish_at: int | None = None  # the supervisor's `Finish`, if it was already sent


class Events(Protocol):
    def put(self, event: Event) -> None: ...


class Commands(Protocol):
    """The supervisor's messages to this rank (a `multiprocessing` connection)."""

    def poll(self) -> bool: ...

    def recv(self) -> Any: ...


GO_KEY = "torchft_pg/chaos/go"


def _finished(manager: Manager, config: TrainerConfig, committed: bool, at_least: int) -> bool:
    """Stop together: this step was a commit at or past `at_least` that every replica took part in.

    Only a commit counts: a discarded step's quorum may count a replica that
    then failed, and the others stopping there would leave it training alone.
    """
    return (
        committed
        and manager.current_step() >= at_least
        and manager.num_participants() >= config.expected_replicas
    )


# Phase faults: (phase armed, action, whether this step's allreduce also fails so that
# the next step brings a new quorum (configure) or a heal).
_ARMED: dict[Fault, tuple[Phase, Action, bool]] = {
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


@dataclass
class _Batch:
    """The batch of the step in progress, as the allreduce hook reports it."""

    data_step: int = 0
    loss: float = 0.0


def run_trainer(config: TrainerConfig, events: Events, commands: Commands | None = None) -> None:
    """Train until `config.steps` committed steps, reporting to `events`.

    Without `commands` every planned fault fires at its planned step; with
    them, only once the supervisor released its group (`events.Release`), and
    training goes on past `steps` until the supervisor says where to stop
    (`events.Finish`: every fault fired and the job recovered).
    """
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(name)s %(message)s")
    started = time.time()
    who = {
        "replica": config.replica,
        "group_rank": config.group_rank,
        "incarnation": config.incarnation,
    }
    events.put(Started(**who, at=started, pid=os.getpid()))
    try:
        _train(config, events, commands, who)
    except BaseException as e:
        events.put(
            Error(
                **who, at=time.time(), message=f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
            )
        )
        raise


def _train(
    config: TrainerConfig, events: Events, commands: Commands | None, who: dict[str, int]
) -> None:
    workload = Workload(seed=config.seed, hidden=config.hidden)
    timeout = timedelta(seconds=config.timeout_s)
    batch = _Batch()
    manager: FaultInjectingManager | None = None

    def announce(action: Action, phase: Phase) -> None:
        step = manager.current_step() if manager is not None else 0
        if action == Action.DIE:
            events.put(Dying(**who, at=time.time(), phase=phase.value, step=step))
        else:
            events.put(Frozen(**who, at=time.time(), phase=phase.value, step=step, pid=os.getpid()))

    def on_allreduce(tensors: list[torch.Tensor]) -> None:
        # Inside Manager.allreduce, after its quorum wait: participation is settled.
        assert manager is not None
        epoch, quorum_id = manager.quorum_id()
        events.put(
            Contribution(
                **who,
                at=time.time(),
                quorum=f"{epoch}/{quorum_id}",
                step=manager.current_step(),
                participating=manager.is_participating(),
                divisor=manager.num_participants(),
                data_step=batch.data_step,
                loss=batch.loss,
                sent_norm=float(torch.cat([t.reshape(-1) for t in tensors]).norm().item()),
            )
        )

    injector = Injector(announce)
    inner: ProcessGroup = (
        ProcessGroupBabyGloo(timeout=timeout)
        if config.pg_kind == "baby"
        else ProcessGroupGloo(timeout=timeout)
    )
    pg = FaultInjectingProcessGroup(inner, injector, on_allreduce)
    model, optim = workload.build()
    manager_start = time.time()
    transport: CheckpointTransport[Any] = (
        PGTransport(pg, timeout=timeout, device=torch.device("cpu"))
        if config.transport == "pg"
        else HTTPTransport(timeout)
    )
    manager = FaultInjectingManager(
        pg,
        injector=injector,
        checkpoint_transport=FaultInjectingTransport(transport, injector),
        min_replica_size=config.min_replica_size,
        rank=config.group_rank,
        world_size=config.group_world_size,
        store_addr="127.0.0.1",
        store_port=config.store_port,
        lighthouse_addr=config.lighthouse_addr,
        replica_id=f"replica{config.replica}",
        timeout=timeout,
        quorum_timeout=timedelta(seconds=config.quorum_timeout_s),
        connect_timeout=timedelta(seconds=30),
    )
    manager.register_state_dict_fn("model", model.load_state_dict, model.state_dict)
    manager.register_state_dict_fn("optim", optim.load_state_dict, optim.state_dict)
    ddp = DistributedDataParallel(manager, model, reduce_dtype=REDUCE_DTYPE)
    opt = OptimizerWrapper(manager, optim)
    # Ready only once the group can meet its peers (a Baby child serving), so every
    # first incarnation is live at the lighthouse before the supervisor says go.
    pg.wait_started(timedelta(seconds=120))
    events.put(Ready(**who, at=time.time(), manager_s=time.time() - manager_start))
    # The supervisor releases every first incarnation together, so no replica trains alone.
    TCPStore(
        "127.0.0.1",
        config.store_port,
        is_master=False,
        wait_for_workers=False,
        timeout=timedelta(seconds=120),
    ).wait([GO_KEY])
    fired = set(config.fired)
    released = dict(config.released)
    finish_at = config.finish_at if commands is not None else 0
    joining = config.incarnation > 0  # a restart: report where its first commit's time went
    join_quorum_s = join_configure_s = join_heal_s = 0.0
    committed = False
    try:
        while True:
            while commands is not None and commands.poll():
                message = commands.recv()
                if isinstance(message, Release):
                    released[message.planned_step] = message.fire_at
                elif isinstance(message, Finish):
                    finish_at = message.at_step
            if finish_at is not None and _finished(
                manager, config, committed, max(config.steps, finish_at)
            ):
                break
            step = manager.current_step()
            due = config.plan.due(
                config.replica, step, fired, released if commands is not None else None
            )
            fault = None
            if due is not None:
                planned, fault = due
                fired.add((config.replica, planned))
                events.put(
                    FaultFired(
                        **who, at=time.time(), planned_step=planned, fault=fault.value, step=step
                    )
                )
                _arm(fault, config, injector, pg)
            if fault == Fault.DELAY:
                time.sleep(config.delay_s)  # the fault itself: a stalled replica
            if config.step_time_s:
                time.sleep(config.step_time_s)  # simulated compute, not synchronization
            opt.zero_grad()
            x, y = workload.batch(config.replica, step)
            loss = workload.loss(ddp(x), y)
            batch.data_step, batch.loss = step, float(loss.item())
            if fault == Fault.KILL_REPLICA:
                injector.arm(Phase.FORWARD, Action.DIE)
                injector.hit(Phase.FORWARD)
            if (
                fault == Fault.KILL_BABY_CHILD
                and isinstance(inner, ProcessGroupBabyGloo)
                and inner.child_pid
            ):
                os.kill(inner.child_pid, 9)  # SIGKILL the backend child, not this rank
            loss.backward()
            # After the quorum and any heal: the step being voted on.
            before = manager.current_step()
            opt.step()
            committed = manager.current_step() > before
            timings = manager.last_quorum_timings()
            if joining and timings is not None:
                join_quorum_s += timings.quorum_s
                join_configure_s += timings.configure_s
                join_heal_s += timings.heal_s
                if committed:
                    joining = False
                    events.put(
                        Joined(
                            **who,
                            at=time.time(),
                            quorum_s=join_quorum_s,
                            configure_s=join_configure_s,
                            heal_s=join_heal_s,
                        )
                    )
            epoch, quorum_id = manager.quorum_id()
            events.put(
                StepEnded(
                    **who,
                    at=time.time(),
                    step=before,
                    committed=committed,
                    quorum=f"{epoch}/{quorum_id}",
                    participants=manager.num_participants(),
                    loss=batch.loss,
                    digest=state_checksum(model.state_dict(), optim.state_dict())
                    if committed
                    else None,
                    grad_norm=_grad_norm(model) if committed else None,
                )
            )
        events.put(
            Done(
                **who,
                at=time.time(),
                step=manager.current_step(),
                checksum=state_checksum(model.state_dict(), optim.state_dict()),
                state=flat_state(model, optim),
            )
        )
    finally:
        manager.shutdown(wait=False)


def _grad_norm(model: torch.nn.Module) -> float:
    """The L2 norm of the gradient the optimizer just applied (DDP's averaged one)."""
    grads = [p.grad.detach().reshape(-1) for p in model.parameters() if p.grad is not None]
    return float(torch.cat(grads).norm().item()) if grads else 0.0


def _arm(
    fault: Fault, config: TrainerConfig, injector: Injector, pg: FaultInjectingProcessGroup
) -> None:
    """Arm a phase fault (and fail this step's allreduce where the fault needs it)."""
    if fault == Fault.FAIL_ALLREDUCE:
        pg.fail_next = True
    if fault not in _ARMED:
        return
    if fault == Fault.PARTIAL_KILL and config.group_rank != config.group_world_size - 1:
        return  # only the group's last rank dies
    phase, action, fail_step = _ARMED[fault]
    injector.arm(phase, action)
    if fail_step:
        pg.fail_next = True
