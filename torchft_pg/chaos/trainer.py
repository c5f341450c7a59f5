"""The reference replica training loop used by the demo, the chaos tests and the benchmarks.

A small MLP trained with torchft_pg's DDP and OptimizerWrapper. Every step it
reports (replica, step, quorum, participants, loss, committed) to the
supervisor's queue, and applies the fault plan at its (replica, step) points.
Data depend only on (replica, step), so runs are reproducible.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
from torch._C._distributed_c10d import Work
from torch.distributed import TCPStore

from torchft_pg.chaos.plan import Fault, FaultPlan
from torchft_pg.checkpointing import PGTransport
from torchft_pg.ddp import DistributedDataParallel
from torchft_pg.manager import Manager
from torchft_pg.optim import OptimizerWrapper
from torchft_pg.process_group import (
    ProcessGroup,
    ProcessGroupBabyGloo,
    ProcessGroupGloo,
    ProcessGroupWrapper,
)
from torchft_pg.work import FailedWork

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


class FaultInjectingProcessGroup(ProcessGroupWrapper):
    """Wraps a group; once armed, the next allreduce runs but reports a failure."""

    def __init__(self, pg: ProcessGroup) -> None:
        super().__init__(pg=pg)
        self.armed = False

    def _run(self, op: str, outputs: Any, *args: Any) -> Work:
        work = super()._run(op, outputs, *args)
        if op == "allreduce" and self.armed:
            self.armed = False
            work.wait()  # the peers' collective completes; only ours is reported failed
            return FailedWork(RuntimeError("injected allreduce failure"))
        return work


GO_KEY = "torchft_pg/chaos/go"


def _finished(manager: Manager, config: TrainerConfig) -> bool:
    """Stop together: every replica took part in a commit at or past `steps`."""
    return (
        manager.current_step() >= config.steps
        and manager.num_participants() >= config.expected_replicas
    )


def state_checksum(*modules: Any) -> str:
    """sha256 over every tensor of the given state dicts, in key order."""
    h = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            h.update(
                value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            )
        elif isinstance(value, dict):
            for k in sorted(value, key=str):
                h.update(str(k).encode())
                feed(value[k])
        elif isinstance(value, (list, tuple)):
            for v in value:
                feed(v)
        else:
            h.update(repr(value).encode())

    for m in modules:
        feed(m)
    return h.hexdigest()[:16]


def run_trainer(config: TrainerConfig, events: Any) -> None:
    """Train until `config.steps` committed steps, reporting to `events` (a queue)."""
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(name)s %(message)s")
    started = time.time()
    events.put(
        ("start", config.replica, config.group_rank, config.incarnation, os.getpid(), started)
    )
    try:
        _train(config, events, started)
    except BaseException as e:
        events.put(
            (
                "error",
                config.replica,
                config.group_rank,
                config.incarnation,
                f"{type(e).__name__}: {e}\n{traceback.format_exc()}",
                time.time(),
            )
        )
        raise


def _train(config: TrainerConfig, events: Any, started: float) -> None:
    torch.manual_seed(config.seed)
    timeout = timedelta(seconds=config.timeout_s)
    inner: ProcessGroup = (
        ProcessGroupBabyGloo(timeout=timeout)
        if config.pg_kind == "baby"
        else ProcessGroupGloo(timeout=timeout)
    )
    pg = FaultInjectingProcessGroup(inner)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, config.hidden), torch.nn.ReLU(), torch.nn.Linear(config.hidden, 1)
    )
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    manager_start = time.time()
    transport: PGTransport[Any] | None = (
        PGTransport(pg, timeout=timeout, device=torch.device("cpu"))
        if config.transport == "pg"
        else None
    )
    manager = Manager(
        pg,
        checkpoint_transport=transport,
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
    ddp = DistributedDataParallel(manager, model)
    opt = OptimizerWrapper(manager, optim)
    events.put(
        (
            "ready",
            config.replica,
            config.group_rank,
            config.incarnation,
            time.time() - manager_start,
            time.time(),
        )
    )
    # The supervisor releases every first incarnation together, so no replica trains alone.
    TCPStore(
        "127.0.0.1",
        config.store_port,
        is_master=False,
        wait_for_workers=False,
        timeout=timedelta(seconds=120),
    ).wait([GO_KEY])
    fired = set(config.fired)
    joining = config.incarnation > 0  # a restart: report where its first commit's time went
    join_quorum_s = join_configure_s = join_heal_s = 0.0
    try:
        while not _finished(manager, config):
            step = manager.current_step()
            due = config.plan.due(config.replica, step, fired)
            fault = None
            if due is not None:
                planned, fault = due
                fired.add((config.replica, planned))
                events.put(("fault", config.replica, planned, fault.value, time.time()))
            if fault == Fault.DELAY:
                time.sleep(config.delay_s)  # the fault itself: a stalled replica
            if config.step_time_s:
                time.sleep(config.step_time_s)  # simulated compute, not synchronization
            opt.zero_grad()
            gen = torch.Generator().manual_seed(
                config.seed * 1_000_003 + config.replica * 10_007 + step
            )
            x = torch.randn(8, 16, generator=gen)
            y = x.sum(dim=1, keepdim=True)
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            if fault == Fault.KILL_REPLICA:
                os.kill(os.getpid(), signal.SIGKILL)
            if (
                fault == Fault.KILL_BABY_CHILD
                and isinstance(inner, ProcessGroupBabyGloo)
                and inner.child_pid
            ):
                os.kill(inner.child_pid, signal.SIGKILL)
            if fault == Fault.FAIL_ALLREDUCE:
                pg.armed = True
            loss.backward()
            before = (
                manager.current_step()
            )  # after the quorum and any heal: the step being voted on
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
                        (
                            "join",
                            config.replica,
                            config.group_rank,
                            config.incarnation,
                            join_quorum_s,
                            join_configure_s,
                            join_heal_s,
                            time.time(),
                        )
                    )
            epoch, quorum_id = manager.quorum_id()
            events.put(
                (
                    "step",
                    config.replica,
                    config.group_rank,
                    config.incarnation,
                    before,
                    committed,
                    f"{epoch}/{quorum_id}",
                    manager.num_participants(),
                    float(loss.item()),
                    time.time(),
                )
            )
        events.put(
            (
                "done",
                config.replica,
                config.group_rank,
                config.incarnation,
                manager.current_step(),
                state_checksum(model.state_dict(), optim.state_dict()),
                time.time(),
            )
        )
    finally:
        manager.shutdown(wait=False)
