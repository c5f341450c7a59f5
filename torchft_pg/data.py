"""Samplers over replica groups: `ExactlyOnceBatchSampler` and torchft's `DistributedSampler`.

`ExactlyOnceBatchSampler` gives each rank, every step, its part of the samples
that follow those the job's committed steps used (`torchft_pg.data_plan`): a
failed step's samples are drawn again, a group that heals continues where the
job is, and while groups come and go no sample is skipped or repeated. The
Manager's counters are the data position, so checkpointing the Manager
(`manager.state_dict()`) checkpoints the data position too; the sampler's own
`state_dict()` holds the data plan, which a restart checks (same dataset, same
order, same samples per counted batch) before resuming at the same sample.

`DistributedSampler` (torchft's, lossy by design):

The dataset is split into ``num_replica_groups * num_replicas`` shards, and
group rank `group_rank` of replica group `replica_rank` reads shard
``replica_rank * num_replicas + group_rank``. `num_replica_groups` is the most
replica groups the job will ever have (the lighthouse decides at run time
how many are live), so while a group is down its shard is not read; a group
that heals resumes its own shard. Use a stateful data loader to checkpoint
each group's position if skipping or repeating batches matters.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol, TypeVar

import torch.distributed as dist
from torch.utils import data

from torchft_pg.data_plan import DataPlan

__all__ = ["CommittedCounters", "DistributedSampler", "ExactlyOnceBatchSampler"]

T_co = TypeVar("T_co", covariant=True)


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def _index(name: str, value: object, size_name: str, size: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
        raise ValueError(f"{name} must be an int in [0, {size_name} = {size}), got {value!r}")
    return value


def _one_of(name: str, value: int | None, old: str, kwargs: dict[str, Any]) -> int | None:
    """`value`, or torchft 0.1's keyword `old` for it from `kwargs` (removed there);
    both given is a TypeError naming them."""
    if old not in kwargs:
        return value
    if value is not None:
        raise TypeError(f"pass {name} or torchft 0.1's {old}, not both")
    result: int | None = kwargs.pop(old)
    return result


class DistributedSampler(data.distributed.DistributedSampler[T_co]):
    """torch's DistributedSampler over the shards of all replica groups.

    Args:
        dataset: the dataset to sample from.
        replica_rank: this replica group's index, in [0, num_replica_groups).
        num_replica_groups: the most replica groups the job will have.
        group_rank: this rank inside its replica group; default: the rank in
            the default process group (``torch.distributed.get_rank()``).
        num_replicas: the ranks per replica group; default: the default
            process group's world size.
        **kwargs: passed on to torch's sampler (``shuffle``, ``seed``, ``drop_last``).
            torchft 0.1's names are accepted too: ``replica_group`` for
            `replica_rank` and ``rank`` for `group_rank` (torch's own ``rank``
            cannot be passed: the global rank is this sampler's to compute).

    `global_rank` and `global_world_size` are this rank's shard and the
    number of shards. Every rank of every group must use the same
    `num_replica_groups`, `num_replicas`, seed and epoch (``set_epoch``).
    """

    def __init__(
        self,
        dataset: data.Dataset[T_co],
        replica_rank: int | None = None,
        num_replica_groups: int | None = None,
        group_rank: int | None = None,
        num_replicas: int | None = None,
        **kwargs: Any,
    ) -> None:
        replica_rank = _one_of("replica_rank", replica_rank, "replica_group", kwargs)
        group_rank = _one_of("group_rank", group_rank, "rank", kwargs)
        if replica_rank is None or num_replica_groups is None:
            raise TypeError(
                "DistributedSampler needs replica_rank (torchft 0.1: replica_group) and "
                "num_replica_groups"
            )
        if group_rank is None or num_replicas is None:
            if not (dist.is_available() and dist.is_initialized()):
                missing = "group_rank" if group_rank is None else "num_replicas"
                raise ValueError(
                    f"{missing} was not given and torch.distributed has no default process "
                    "group to take it from; pass group_rank and num_replicas"
                )
            if group_rank is None:
                group_rank = dist.get_rank()
            if num_replicas is None:
                num_replicas = dist.get_world_size()
        groups = _count("num_replica_groups", num_replica_groups)
        per_group = _count("num_replicas", num_replicas)
        replica_rank = _index("replica_rank", replica_rank, "num_replica_groups", groups)
        group_rank = _index("group_rank", group_rank, "num_replicas", per_group)
        self.global_rank: int = replica_rank * per_group + group_rank
        self.global_world_size: int = groups * per_group
        super().__init__(
            dataset, num_replicas=self.global_world_size, rank=self.global_rank, **kwargs
        )


class CommittedCounters(Protocol):
    """What `ExactlyOnceBatchSampler` reads of the Manager (``torchft_pg.Manager``
    implements it): the agreed counters and this step's participation."""

    def current_step(self) -> int: ...
    def batches_committed(self) -> int: ...
    def num_participants(self) -> int: ...
    def participating_rank(self) -> int | None: ...


class ExactlyOnceBatchSampler(data.Sampler[list[int]]):
    """This rank's dataset indices for the current step, from `plan` and the
    counters of `manager`; every sample is used once over the committed steps.

    Call `step_indices()` (or take the next item; iterating gives one epoch) after the step's
    ``manager.start_quorum()`` (``optimizer.zero_grad()`` with `OptimizerWrapper`):
    it waits for the step's quorum, since who takes part decides the split. A rank
    that does not take part in the step (its group heals into it) gets ``[]``.

    With ``DataLoader(dataset, batch_sampler=sampler)`` keep ``num_workers=0``:
    worker processes fetch indices steps ahead, before the quorum that decides
    them exists.
    """

    def __init__(self, plan: DataPlan, manager: CommittedCounters, group_rank: int) -> None:
        if not isinstance(plan, DataPlan):
            raise TypeError(f"plan must be a torchft_pg.data_plan.DataPlan, got {plan!r}")
        self.plan = plan
        self.manager = manager
        self.group_rank = _index(
            "group_rank", group_rank, "plan.group_world_size", plan.group_world_size
        )

    def step_indices(self) -> list[int]:
        """This rank's indices for the step whose quorum was started last."""
        rank = self.manager.participating_rank()  # waits for the step's quorum
        if rank is None:
            return []
        part = self.plan.slice(
            consumed=self._consumed(),
            participants=self.manager.num_participants(),
            participant_rank=rank,
            group_rank=self.group_rank,
        )
        return self.plan.indices(part)

    def epoch(self) -> int:
        """The epoch the job's data stream is in (after the committed steps)."""
        return self.plan.epoch_of(self._consumed())

    def _consumed(self) -> int:
        """Stream samples the job's committed steps used, from the Manager's counters."""
        return self.plan.consumed(
            batches_committed=self.manager.batches_committed(),
            committed_steps=self.manager.current_step(),
        )

    def state_dict(self) -> dict[str, Any]:
        """The data plan as plain values (`DataPlan.to_state`), for a checkpoint.

        Not the position: that is the Manager's counters, saved and restored
        with the Manager's state. ``torchdata``'s ``StatefulDataLoader`` saves
        this with its own state (a batch sampler with ``state_dict`` is not
        fast-forwarded by replaying batches on load)."""
        return self.plan.to_state()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Check that `state_dict` (this sampler's `state_dict()` before a restart)
        resumes at the same sample with this sampler's plan; a ValueError names
        each field that changed (`DataPlan.resume_conflicts`).

        Nothing is restored here: restore the Manager (its step and
        ``batches_committed``) and the next step reads the samples that follow
        the checkpoint's committed steps."""
        saved = DataPlan.from_state(state_dict)
        conflicts = self.plan.resume_conflicts(saved)
        if conflicts:
            raise ValueError(
                "the checkpoint's data plan does not resume at the same sample with this "
                f"plan: {'; '.join(conflicts)}. Make the plan as the checkpoint did, or "
                "do not load this state to accept another order of samples"
            )

    def __iter__(self) -> Iterator[list[int]]:
        """One epoch: a step's indices per item, until the job's committed steps have
        used the epoch's last sample (its last step may run into the next epoch)."""
        start = self.epoch()
        while self.epoch() == start:
            yield self.step_indices()
