"""Samplers over replica groups: `ExactlyOnceBatchSampler` (with its iterable
form, `ExactlyOnceIterableDataset`) and torchft's `DistributedSampler`.

`ExactlyOnceBatchSampler` gives each rank, every step, its part of the samples
that follow those the job's committed steps used (`torchft_pg.data_plan`): a
failed step's samples are drawn again, a group that heals continues where the
job is, and while groups come and go no sample is skipped or repeated. The
Manager's counters are the data position, so checkpointing the Manager
(`manager.state_dict()`) checkpoints the data position too; the sampler's own
`state_dict()` holds the data plan, which a restart checks (same dataset, same
order, same samples per counted batch) before resuming at the same sample.

`ExactlyOnceIterableDataset` is the same plan for loaders built on an
iterable dataset: it yields each step's samples themselves, read from a
random-access source or from a stream that can be opened at an offset.

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

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, Protocol, TypeVar

import torch.distributed as dist
from torch.utils import data

from torchft_pg.data_plan import DataPlan

__all__ = [
    "CommittedCounters",
    "DistributedSampler",
    "ExactlyOnceBatchSampler",
    "ExactlyOnceIterableDataset",
    "SampleSequence",
]

T = TypeVar("T")
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


def _saved_counter(state: Mapping[str, Any], key: str) -> int:
    value = state.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"an ExactlyOnceBatchSampler state's {key!r} must be an int >= 0, got {value!r}"
        )
    return value


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
    whose group does not take part in the step (it heals into it, or is a spare)
    gets the batch of the same group rank of the step's first participant: it
    still runs forward and backward (its group's collectives need it), the
    allreduce replaces its gradients with zeros, so those samples count once,
    for the participant that owns them. Only a step with no participant at all
    gives ``[]``.

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
        # The Manager's (step, batches_committed) in the state last loaded, until
        # a step this group takes part in has checked the Manager was restored.
        self._loaded_at: tuple[int, int] | None = None

    def step_indices(self) -> list[int]:
        """This rank's indices for the step whose quorum was started last."""
        rank = self.manager.participating_rank()  # waits for the step's quorum
        participants = self.manager.num_participants()
        if rank is None:
            if participants < 1:
                return []
            # A stand-in batch (see the class docstring); a healing group's counters
            # are not the job's yet, so nothing is checked against them.
            rank = 0
        else:
            self._check_manager_restored()
        part = self.plan.slice(
            consumed=self._consumed(),
            participants=participants,
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
        """For a checkpoint: the data plan as plain values (`DataPlan.to_state`)
        under ``"plan"``, and the Manager's ``"step"`` and ``"batches_committed"``
        when saved.

        The position is not restored from it: that is the Manager's counters,
        saved and restored with the Manager's state. The counters here only
        let the first step after a load refuse a Manager that was not restored.
        ``torchdata``'s ``StatefulDataLoader`` saves this with its own state (a
        batch sampler with ``state_dict`` is not fast-forwarded by replaying
        batches on load)."""
        return {
            "plan": self.plan.to_state(),
            "step": self.manager.current_step(),
            "batches_committed": self.manager.batches_committed(),
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Check that `state_dict` (this sampler's `state_dict()` before a restart)
        resumes at the same sample with this sampler's plan; a ValueError names
        each field that changed (`DataPlan.resume_conflicts`) or a key that is
        missing or ill-typed.

        Nothing is restored here: restore the Manager (its step and
        ``batches_committed``), in either order, and the next step reads the
        samples that follow the checkpoint's committed steps. If the first step
        this group takes part in after the load finds the Manager at step 0
        while the checkpoint was saved later, it raises a RuntimeError rather
        than start the data again from its first sample."""
        if not isinstance(state_dict, Mapping) or "plan" not in state_dict:
            raise ValueError(
                "an ExactlyOnceBatchSampler state must be a mapping with a 'plan' (its "
                f"state_dict()), got {state_dict!r}"
            )
        saved_at = (
            _saved_counter(state_dict, "step"),
            _saved_counter(state_dict, "batches_committed"),
        )
        saved = DataPlan.from_state(state_dict["plan"])
        conflicts = self.plan.resume_conflicts(saved)
        if conflicts:
            raise ValueError(
                "the checkpoint's data plan does not resume at the same sample with this "
                f"plan: {'; '.join(conflicts)}. Make the plan as the checkpoint did, or "
                "do not load this state to accept another order of samples"
            )
        self._loaded_at = saved_at if saved_at != (0, 0) else None

    def _check_manager_restored(self) -> None:
        """After a load, at the first step this group takes part in: a Manager
        still at step 0 when the checkpoint was saved later was not restored."""
        if self._loaded_at is None:
            return
        step, batches = self._loaded_at
        if self.manager.current_step() == 0 and self.manager.batches_committed() == 0:
            raise RuntimeError(
                "the data state was loaded from a checkpoint saved at step "
                f"{step} (batches_committed {batches}), but the Manager is at step 0: "
                "restore it too (manager.load_state_dict(state saved from "
                "manager.state_dict())), or the data would start again from its first "
                "sample"
            )
        self._loaded_at = None

    def __iter__(self) -> Iterator[list[int]]:
        """One epoch: a step's indices per item, until the job's committed steps have
        used the epoch's last sample (its last step may run into the next epoch)."""
        start = self.epoch()
        while self.epoch() == start:
            yield self.step_indices()


class SampleSequence(Protocol[T_co]):
    """A random-access source of samples: ``len()`` of them, sample ``i`` by
    ``source[i]`` (a map-style dataset, a list, a memory-mapped token array's
    windows)."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: int, /) -> T_co: ...


class ExactlyOnceIterableDataset(data.IterableDataset[list[T]], Generic[T]):
    """This rank's samples for each step, as an iterable dataset: one item per
    step, the list of samples `ExactlyOnceBatchSampler` picks (a stand-in batch,
    counted for its owner, when this group does not take part in the step).

    For loaders built on an ``IterableDataset`` (torchtitan's are), where a batch
    sampler has no place. Give exactly one source:

    - ``samples``: random access (`SampleSequence`), ``len(samples)`` equal to
      ``plan.dataset_size``; any plan, shuffled or not;
    - ``open_at``: ``open_at(offset)`` returns the dataset's samples from
      ``offset`` on, in the dataset's order (a reader that seeks: a file at a
      byte offset, a tokenized shard at a sequence number). The plan must not
      shuffle, since the stream's order is the order; shuffle the stream itself
      the same way on every run instead. A step's samples are contiguous, so a
      rank opens the stream about once per step (each rank's part of a step
      lies elsewhere in the stream than its previous part) and reads on while
      its next sample is the stream's next; ``open_at`` must be a seek, not a
      replay from the start.

    Iterating gives steps until the job's committed steps reach the next epoch,
    or forever with ``infinite=True``. Each item waits for the step's quorum, so
    take one per step after ``manager.start_quorum()``; with a ``DataLoader``
    use ``batch_size=None`` (an item is already the batch), a ``collate_fn``
    such as ``default_collate``, and ``num_workers=0`` (a worker process cannot
    read this step's quorum; one is refused).

    `state_dict()` / `load_state_dict()` are the batch sampler's: the data plan,
    checked on load; the position comes from the restored Manager.
    """

    def __init__(
        self,
        plan: DataPlan,
        manager: CommittedCounters,
        group_rank: int,
        *,
        samples: SampleSequence[T] | None = None,
        open_at: Callable[[int], Iterable[T]] | None = None,
        infinite: bool = False,
    ) -> None:
        self.batch_sampler = ExactlyOnceBatchSampler(plan, manager, group_rank)
        if (samples is None) == (open_at is None):
            raise TypeError(
                "ExactlyOnceIterableDataset needs exactly one source: samples (random access) "
                "or open_at (a stream opened at an offset)"
            )
        if samples is not None and len(samples) != plan.dataset_size:
            raise ValueError(
                f"len(samples) must be plan.dataset_size = {plan.dataset_size}, got {len(samples)}"
            )
        if open_at is not None and plan.shuffle:
            raise ValueError(
                "open_at reads the dataset in its own order, so the plan must not shuffle: "
                "make it with shuffle=False (and shuffle the stream itself, the same way "
                "on every run), or give samples for random access"
            )
        if not isinstance(infinite, bool):
            raise ValueError(f"infinite must be a bool, got {infinite!r}")
        self.samples = samples
        self.open_at = open_at
        self.infinite = infinite
        self._stream: Iterator[T] | None = None
        self._stream_opened_at = 0  # the offset `open_at` was last called with
        self._stream_offset = 0  # the offset of the sample `_stream` yields next

    @property
    def plan(self) -> DataPlan:
        return self.batch_sampler.plan

    def step_samples(self) -> list[T]:
        """This rank's samples for the step whose quorum was started last."""
        offsets = self.batch_sampler.step_indices()
        if self.samples is not None:
            return [self.samples[i] for i in offsets]
        return [self._read_at(offset) for offset in offsets]

    def epoch(self) -> int:
        """The epoch the job's data stream is in (after the committed steps)."""
        return self.batch_sampler.epoch()

    def _read_at(self, offset: int) -> T:
        """Sample `offset` of the stream: the open stream's next one when it is
        there, else from a stream opened at `offset`."""
        assert self.open_at is not None
        if self._stream is None or self._stream_offset != offset:
            self._stream = iter(self.open_at(offset))
            self._stream_opened_at = self._stream_offset = offset
        try:
            sample = next(self._stream)
        except StopIteration:
            self._stream = None
            raise ValueError(
                f"open_at({self._stream_opened_at}) ended after "
                f"{offset - self._stream_opened_at} samples, before offset {offset}; "
                f"the plan's dataset has {self.plan.dataset_size}"
            ) from None
        self._stream_offset = offset + 1
        return sample

    def state_dict(self) -> dict[str, Any]:
        """The plan and the Manager's counters (`ExactlyOnceBatchSampler.state_dict`)."""
        return self.batch_sampler.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Check the checkpoint's plan against this one
        (`ExactlyOnceBatchSampler.load_state_dict`); the open stream is dropped,
        so the next step opens it where the restored counters say."""
        self.batch_sampler.load_state_dict(state_dict)
        self._stream = None

    def __iter__(self) -> Iterator[list[T]]:
        """A step's samples per item: one epoch (see `ExactlyOnceBatchSampler`), or
        every step with ``infinite``."""
        if data.get_worker_info() is not None:
            raise RuntimeError(
                "ExactlyOnceIterableDataset reads each step's quorum from the Manager, "
                "which a DataLoader worker process does not have: use num_workers=0"
            )
        start = self.epoch()
        while self.infinite or self.epoch() == start:
            yield self.step_samples()
