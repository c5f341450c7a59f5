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

A checkpoint needs nothing of the plan to find its place again (the Manager's
restored counters are the place), but resuming at the same sample needs the
same plan: ``DataPlan.to_state`` saves what fixes the sample at each stream
position and how the counters map to positions, ``DataPlan.from_state`` reads
it back, and ``DataPlan.resume_conflicts`` says what a new plan changed.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

__all__ = ["BatchMode", "DataPlan", "StepSlice"]

# Bumped when `DataPlan.to_state`'s keys change meaning, so an old checkpoint is refused by name.
_PLAN_STATE_FORMAT = 1


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
    ``global_batch_size``: samples per step over the whole job (``GLOBAL`` mode);
    ``dataset_version``: any name for the dataset's contents (a revision, a
    hash); it changes no sample, but a checkpoint saved with one version is
    refused by a plan with another (`resume_conflicts`).
    """

    dataset_size: int
    group_world_size: int
    mode: BatchMode = BatchMode.GROUP
    batch_size: int | None = None
    global_batch_size: int | None = None
    shuffle: bool = True
    seed: int = 0
    dataset_version: str = ""

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
        if not isinstance(self.shuffle, bool):
            raise ValueError(f"shuffle must be a bool, got {self.shuffle!r}")
        if not isinstance(self.dataset_version, str):
            raise ValueError(f"dataset_version must be a str, got {self.dataset_version!r}")

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

    def to_state(self) -> dict[str, int | str | bool | None]:
        """The plan as plain values, for a checkpoint: what a restart needs to
        check that it reads the same sample at each stream position. No
        tensors: it round-trips through ``json`` and through
        ``torch.load(..., weights_only=True)``."""
        return {
            "format": _PLAN_STATE_FORMAT,
            "dataset_size": self.dataset_size,
            "dataset_version": self.dataset_version,
            "group_world_size": self.group_world_size,
            "mode": self.mode.value,
            "batch_size": self.batch_size,
            "global_batch_size": self.global_batch_size,
            "shuffle": self.shuffle,
            "seed": self.seed,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, object]) -> DataPlan:
        """The plan `to_state` saved; a ValueError names a missing or ill-typed
        key, or a format this version does not read."""
        if not isinstance(state, Mapping):
            raise ValueError(f"a data plan state must be a mapping, got {state!r}")
        found = _state_value(state, "format", int)
        if found != _PLAN_STATE_FORMAT:
            raise ValueError(
                f"data plan state has format {found!r}; this version reads format "
                f"{_PLAN_STATE_FORMAT}"
            )
        mode = _state_value(state, "mode", str)
        modes = {m.value: m for m in BatchMode}
        if mode not in modes:
            raise ValueError(
                f"data plan state: 'mode' must be one of {sorted(modes)}, got {mode!r}"
            )
        return cls(
            dataset_size=_state_value(state, "dataset_size", int),
            dataset_version=_state_value(state, "dataset_version", str),
            group_world_size=_state_value(state, "group_world_size", int),
            mode=modes[mode],
            batch_size=_state_value(state, "batch_size", int, optional=True),
            global_batch_size=_state_value(state, "global_batch_size", int, optional=True),
            shuffle=_state_value(state, "shuffle", bool),
            seed=_state_value(state, "seed", int),
        )

    def resume_conflicts(self, saved: DataPlan) -> list[str]:
        """Why this plan would not resume `saved`'s stream at the same sample,
        one line per field (empty: it would).

        The Manager's restored counters give the position; the sample there is
        the same only if the dataset, its order (shuffle, and the seed when
        shuffling) and the samples each counted unit stands for are: with
        ``GROUP``, ``batch_size * group_world_size`` per committed group batch
        (8 x 2 may become 4 x 4); with ``GLOBAL``, ``global_batch_size`` per
        committed step (there ``group_world_size`` may change freely)."""
        conflicts: list[str] = []

        def differ(name: str, before: object, now: object) -> None:
            if before != now:
                conflicts.append(f"{name} changed: the checkpoint's is {before!r}, now {now!r}")

        differ("dataset_size", saved.dataset_size, self.dataset_size)
        differ("dataset_version", saved.dataset_version, self.dataset_version)
        differ("mode", saved.mode.value, self.mode.value)
        differ("shuffle", saved.shuffle, self.shuffle)
        if saved.shuffle and self.shuffle:
            differ("seed", saved.seed, self.seed)
        if saved.mode is self.mode is BatchMode.GROUP:
            assert saved.batch_size is not None and self.batch_size is not None
            before = saved.batch_size * saved.group_world_size
            now = self.batch_size * self.group_world_size
            if before != now:
                conflicts.append(
                    "batch_size * group_world_size (samples per committed group batch) "
                    f"changed: the checkpoint's is {saved.batch_size} x "
                    f"{saved.group_world_size} = {before}, now {self.batch_size} x "
                    f"{self.group_world_size} = {now}"
                )
        elif saved.mode is self.mode is BatchMode.GLOBAL:
            differ("global_batch_size", saved.global_batch_size, self.global_batch_size)
        return conflicts


def _state_value(
    state: Mapping[str, object], key: str, kind: type, *, optional: bool = False
) -> Any:
    """``state[key]``, checked to be a `kind` (or None when `optional`); a
    ValueError names the key and what it holds."""
    if key not in state:
        raise ValueError(f"data plan state has no {key!r}; it has {sorted(state)}")
    value = state[key]
    if value is None and optional:
        return None
    # bool is an int to isinstance; a count that is True is a corrupt state, not 1
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        expected = f"{kind.__name__} or None" if optional else kind.__name__
        raise ValueError(f"data plan state: {key!r} must be {expected}, got {value!r}")
    return value
