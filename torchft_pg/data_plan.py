"""Which samples each rank reads in a step, so every sample is used exactly once.

A pure function of what every replica group of the job already agrees on in a
committed step: how many samples the job has consumed in committed steps, the
step's participants and this rank's place among them. No state of its own, so
a group that heals continues from the healed count, a failed (uncommitted) step
is drawn again by the next step, and a change of participants neither skips nor
repeats a sample.

The job reads one endless stream: epoch ``e`` is a permutation of the dataset
(seeded by ``seed`` and ``e``, or the identity without shuffling), the epochs
one after the other. A step takes the next samples of the stream, in one of two
modes (``BatchMode``):

- ``GROUP``: every participating group takes ``batch_size`` samples per group
  rank, so the step's global batch grows and shrinks with the job;
- ``GLOBAL``: the step takes ``global_batch_size`` samples, split as evenly as
  possible between the participating groups (each live group takes more when
  one is down), so the optimizer's effective batch stays the same.

Inside a group, the group's share is split between its ranks as evenly as
possible (the first ranks take one more when it does not divide).

``consumed`` is the number of stream samples used by committed steps before
this one: with ``GROUP``, ``Manager.batches_committed() * batch_size *
group_world_size``; with ``GLOBAL``, ``committed steps * global_batch_size``.
``DataPlan.consumed`` computes it from those counters.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import lru_cache

import torch

__all__ = ["BatchMode", "DataPlan", "StepSlice"]


class BatchMode(enum.Enum):
    """What stays fixed when the number of participating groups changes."""

    GROUP = "group"  # each group's batch: the global batch follows the job's size
    GLOBAL = "global"  # the global batch: each live group takes a larger share


@dataclass(frozen=True, kw_only=True)
class StepSlice:
    """One rank's part of a step: stream positions ``[start, stop)``, the step's
    whole span ``[step_start, step_stop)`` and the epoch the slice starts in."""

    start: int
    stop: int
    step_start: int
    step_stop: int
    epoch: int


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def _non_negative(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value


def _share(total: int, parts: int, index: int) -> tuple[int, int]:
    """``[start, stop)`` of part ``index`` when ``total`` is split into ``parts``
    parts as evenly as possible (the first ``total % parts`` take one more)."""
    base, extra = divmod(total, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


@lru_cache(maxsize=4)
def _permutation(size: int, seed: int, epoch: int) -> torch.Tensor:
    generator = torch.Generator()
    generator.manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(size, generator=generator)


@dataclass(frozen=True, kw_only=True)
class DataPlan:
    """The job's data plan: ``dataset_size`` samples, ``mode``, the batch sizes,
    ``group_world_size`` ranks per replica group, shuffling with ``seed``.

    ``batch_size``: samples per rank per step (``GROUP`` mode);
    ``global_batch_size``: samples per step over the whole job (``GLOBAL`` mode).
    """

    dataset_size: int
    group_world_size: int
    mode: BatchMode = BatchMode.GROUP
    batch_size: int | None = None
    global_batch_size: int | None = None
    shuffle: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        _positive("dataset_size", self.dataset_size)
        _positive("group_world_size", self.group_world_size)
        if not isinstance(self.mode, BatchMode):
            raise TypeError(f"mode must be a BatchMode, got {self.mode!r}")
        if self.mode is BatchMode.GROUP:
            _positive("batch_size (BatchMode.GROUP)", self.batch_size)
            if self.global_batch_size is not None:
                raise ValueError("global_batch_size is for BatchMode.GLOBAL; give batch_size")
        else:
            _positive("global_batch_size (BatchMode.GLOBAL)", self.global_batch_size)
            if self.batch_size is not None:
                raise ValueError("batch_size is for BatchMode.GROUP; give global_batch_size")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int, got {self.seed!r}")

    def consumed(self, *, batches_committed: int, committed_steps: int) -> int:
        """Stream samples used by the committed steps: from the Manager's
        ``batches_committed()`` (``GROUP``) or ``current_step()`` (``GLOBAL``)."""
        _non_negative("batches_committed", batches_committed)
        _non_negative("committed_steps", committed_steps)
        if self.mode is BatchMode.GROUP:
            assert self.batch_size is not None
            return batches_committed * self.batch_size * self.group_world_size
        assert self.global_batch_size is not None
        return committed_steps * self.global_batch_size

    def step_size(self, participants: int) -> int:
        """Samples the whole job takes in a step with ``participants`` groups."""
        _positive("participants", participants)
        if self.mode is BatchMode.GROUP:
            assert self.batch_size is not None
            return participants * self.group_world_size * self.batch_size
        assert self.global_batch_size is not None
        return self.global_batch_size

    def slice(
        self, *, consumed: int, participants: int, participant_rank: int, group_rank: int
    ) -> StepSlice:
        """This rank's stream positions in the step after ``consumed`` samples, when
        ``participants`` groups take part and this group is ``participant_rank``
        among them (the Manager's ``participating_rank()``)."""
        _non_negative("consumed", consumed)
        _positive("participants", participants)
        if not 0 <= participant_rank < participants:
            raise ValueError(
                f"participant_rank must be in [0, participants = {participants}), "
                f"got {participant_rank!r}"
            )
        if not 0 <= group_rank < self.group_world_size:
            raise ValueError(
                f"group_rank must be in [0, group_world_size = {self.group_world_size}), "
                f"got {group_rank!r}"
            )
        total = self.step_size(participants)
        group_start, group_stop = _share(total, participants, participant_rank)
        rank_start, rank_stop = _share(group_stop - group_start, self.group_world_size, group_rank)
        start = consumed + group_start + rank_start
        return StepSlice(
            start=start,
            stop=consumed + group_start + rank_stop,
            step_start=consumed,
            step_stop=consumed + total,
            epoch=start // self.dataset_size,
        )

    def indices(self, part: StepSlice) -> list[int]:
        """The dataset indices at stream positions ``[part.start, part.stop)``."""
        out: list[int] = []
        position = part.start
        while position < part.stop:
            epoch, offset = divmod(position, self.dataset_size)
            take = min(part.stop - position, self.dataset_size - offset)
            if self.shuffle:
                order = _permutation(self.dataset_size, self.seed, epoch)
                out.extend(order[offset : offset + take].tolist())
            else:
                out.extend(range(offset, offset + take))
            position += take
        return out

    def epoch_of(self, consumed: int) -> int:
        """The epoch the next step starts in, after ``consumed`` stream samples."""
        return _non_negative("consumed", consumed) // self.dataset_size
