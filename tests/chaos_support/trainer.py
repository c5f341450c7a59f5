"""The reference replica training loop used by the demo, the chaos tests and the benchmarks.

A small MLP (`workload.Workload`) trained with torchft_pg's DDP and
OptimizerWrapper, or, with ``TrainerConfig.algorithm = Algorithm.DILOCO``,
with DiLoCo (`diloco_trainer`). Every step it reports to the supervisor
(`events`): its contribution as it issues the allreduce, then the step's
outcome with a digest of the state after a commit. It applies the fault plan
at its (replica, step) points, once the supervisor has released them
(`commands`), arming the phase faults in `injection` (`harness`). Data
depend only on (replica, step) and the seed, so runs are reproducible and
the oracle can replay them.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from dataclasses import dataclass

import torch

from tests.chaos_support.diloco_trainer import train_diloco
from tests.chaos_support.diloco_workload import Algorithm
from tests.chaos_support.events import Contribution, Done, Error, Joined, Started, StepEnded
from tests.chaos_support.harness import GO_KEY, Commands, Events, RankHarness, TrainerConfig
from tests.chaos_support.workload import (
    REDUCE_DTYPE,
    Workload,
    flat_state,
    state_checksum,
    state_tensors,
)
from torchft_pg.data import ExactlyOnceBatchSampler
from torchft_pg.data_plan import DataPlan
from torchft_pg.ddp import DistributedDataParallel
from torchft_pg.optim import OptimizerWrapper

__all__ = ["GO_KEY", "TrainerConfig", "run_trainer", "state_checksum"]


@dataclass
class _Batch:
    """The batch of the step in progress, as the allreduce hook reports it."""

    data_step: int = 0
    loss: float = 0.0
    state_digest: str = ""  # of the state the gradient is taken at
    # the data-plan oracle's indices for the step (and the step and quorum they are for)
    indices: tuple[int, ...] = ()
    indices_step: int = -1
    indices_quorum: int = -1


def run_trainer(config: TrainerConfig, events: Events, commands: Commands | None = None) -> None:
    """Train until `config.steps` committed steps, reporting to `events`.

    Without `commands` every planned fault fires at its planned step; with
    them, only once the supervisor released its group (`events.Release`), and
    training goes on past `steps` until the supervisor says where to stop
    (`events.Finish`: every fault fired and the job recovered).
    """
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(name)s %(message)s")
    who = {
        "replica": config.replica,
        "group_rank": config.group_rank,
        "incarnation": config.incarnation,
    }
    events.put(Started(**who, at=time.time(), pid=os.getpid()))
    try:
        if config.algorithm == Algorithm.DILOCO:
            train_diloco(config, events, commands)
        else:
            _train(config, events, commands)
    except BaseException as e:
        events.put(
            Error(
                **who, at=time.time(), message=f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
            )
        )
        raise


def _train(config: TrainerConfig, events: Events, commands: Commands | None) -> None:
    workload = Workload(seed=config.seed, hidden=config.hidden)
    batch = _Batch()
    harness: RankHarness | None = None

    def on_allreduce(tensors: list[torch.Tensor]) -> None:
        # Inside Manager.allreduce, after its quorum wait: participation is settled.
        assert harness is not None
        manager = harness.m
        epoch, quorum_id = manager.quorum_id()
        if batch.indices_step != manager.current_step() or batch.indices_quorum != quorum_id:
            assert sampler is not None
            batch.indices = tuple(sampler.step_indices())  # the quorum is in: no wait
            batch.indices_step, batch.indices_quorum = manager.current_step(), quorum_id
        events.put(
            Contribution(
                **harness.who,
                at=time.time(),
                quorum=f"{epoch}/{quorum_id}",
                step=manager.current_step(),
                participating=manager.is_participating(),
                divisor=manager.num_participants(),
                data_step=batch.data_step,
                loss=batch.loss,
                sent_norm=float(torch.cat([t.reshape(-1) for t in tensors]).norm().item()),
                state_digest=batch.state_digest,
                participant_rank=manager.participating_rank(),
                indices=batch.indices,
            )
        )

    model, optim = workload.build()
    sampler: ExactlyOnceBatchSampler | None = None
    harness = RankHarness(config, events, commands, on_allreduce)
    manager = harness.m
    sampler = ExactlyOnceBatchSampler(
        DataPlan(
            dataset_size=config.data_size,
            group_world_size=config.group_world_size,
            batch_size=config.data_batch,
            seed=config.seed,
        ),
        manager,
        group_rank=config.group_rank,
    )
    who = harness.who
    manager.register_state_dict_fn("model", model.load_state_dict, model.state_dict)
    manager.register_state_dict_fn("optim", optim.load_state_dict, optim.state_dict)
    ddp = DistributedDataParallel(manager, model, reduce_dtype=REDUCE_DTYPE)
    opt = OptimizerWrapper(manager, optim)
    harness.faults.watch_state(lambda: state_tensors(model, optim))
    harness.start()
    joining = config.incarnation > 0  # a restart: report where its first commit's time went
    join_quorum_s = join_configure_s = join_heal_s = 0.0
    committed = False
    try:
        while True:
            harness.poll()
            if harness.finished(committed):
                break
            step = manager.current_step()
            harness.fire_due(step)  # a DELAY stalls in there
            if config.step_time_s:
                time.sleep(config.step_time_s)  # simulated compute, not synchronization
            opt.zero_grad()
            batch.state_digest = state_checksum(model.state_dict(), optim.state_dict())
            x, y = workload.batch(config.replica, step)
            loss = workload.loss(ddp(x), y)
            batch.data_step, batch.loss = step, float(loss.item())
            harness.faults.after_forward()  # KILL_REPLICA dies here; KILL_BABY_CHILD strikes
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
        harness.shutdown()


def _grad_norm(model: torch.nn.Module) -> float:
    """The L2 norm of the gradient the optimizer just applied (DDP's averaged one)."""
    grads = [p.grad.detach().reshape(-1) for p in model.parameters() if p.grad is not None]
    return float(torch.cat(grads).norm().item()) if grads else 0.0
