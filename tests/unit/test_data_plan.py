"""The data plan: every sample exactly once over committed steps, whatever the
membership does (a pure function, simulated here without processes)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from torchft_pg.data import ExactlyOnceBatchSampler
from torchft_pg.data_plan import BatchMode, DataPlan


def _step_indices(plan: DataPlan, consumed: int, participants: int) -> list[list[int]]:
    """Every rank's indices in one step: [participant][group rank] flattened in order."""
    out = []
    for p in range(participants):
        for g in range(plan.group_world_size):
            part = plan.slice(
                consumed=consumed, participants=participants, participant_rank=p, group_rank=g
            )
            out.append(plan.indices(part))
    return out


@pytest.mark.parametrize("mode", [BatchMode.GROUP, BatchMode.GLOBAL])
@pytest.mark.parametrize("shuffle", [True, False])
def test_every_sample_once_per_epoch_under_membership_change_and_failed_steps(
    mode: BatchMode, shuffle: bool
) -> None:
    """Groups come and go, a quarter of the steps fail; the samples of the committed
    steps, taken in order, are each epoch's permutation exactly once."""
    rng = random.Random(7)
    size = 997  # prime: no batch divides it, so steps straddle epoch ends
    plan = DataPlan(
        dataset_size=size,
        group_world_size=3,
        mode=mode,
        batch_size=5 if mode is BatchMode.GROUP else None,
        global_batch_size=47 if mode is BatchMode.GLOBAL else None,
        shuffle=shuffle,
        seed=3,
    )
    batches_committed = committed_steps = 0
    used: list[int] = []
    for _ in range(400):
        participants = rng.randint(1, 4)
        consumed = plan.consumed(
            batches_committed=batches_committed, committed_steps=committed_steps
        )
        assert consumed == len(used)  # what the counters say is what was used
        step = _step_indices(plan, consumed, participants)
        flat = [i for rank in step for i in rank]
        assert len(flat) == plan.step_size(participants)
        if rng.random() < 0.25:
            continue  # failed: nothing counted, the next step draws these positions again
        used.extend(flat)
        batches_committed += participants
        committed_steps += 1
    epochs = len(used) // size
    assert epochs >= 3, epochs
    for e in range(epochs):
        assert Counter(used[e * size : (e + 1) * size]) == Counter(range(size)), e
    if shuffle:
        assert used[:size] != list(range(size)) and used[:size] != used[size : 2 * size]


def test_a_step_is_fixed_by_the_agreed_counters_alone() -> None:
    """9 group-steps committed of 2 ranks x 4 samples: 72 used. In a 3-group step,
    group 1's rank 0 takes positions 80..83, whichever process computes it (a
    group that healed has the same counters as one that never stopped)."""
    plan = DataPlan(dataset_size=100, group_world_size=2, batch_size=4, shuffle=False)
    consumed = plan.consumed(batches_committed=9, committed_steps=5)
    part = plan.slice(consumed=consumed, participants=3, participant_rank=1, group_rank=0)
    assert (part.start, part.stop, part.step_start, part.step_stop) == (80, 84, 72, 96)
    assert plan.indices(part) == [80, 81, 82, 83]


def test_the_global_mode_keeps_the_step_and_splits_it_between_live_groups() -> None:
    plan = DataPlan(
        dataset_size=1000, group_world_size=2, mode=BatchMode.GLOBAL, global_batch_size=10
    )
    for participants, sizes in ((1, [5, 5]), (2, [3, 2, 3, 2]), (3, [2, 2, 2, 1, 2, 1])):
        step = _step_indices(plan, consumed=0, participants=participants)
        assert [len(rank) for rank in step] == sizes
        assert sorted(i for rank in step for i in rank) == sorted(
            plan.indices(plan.slice(consumed=0, participants=1, participant_rank=0, group_rank=0))
            + plan.indices(plan.slice(consumed=0, participants=1, participant_rank=0, group_rank=1))
        )
    assert plan.consumed(batches_committed=7, committed_steps=3) == 30


def test_the_epoch_is_where_the_stream_is() -> None:
    plan = DataPlan(dataset_size=10, group_world_size=1, batch_size=4, shuffle=False)
    part = plan.slice(consumed=8, participants=1, participant_rank=0, group_rank=0)
    assert (part.epoch, plan.indices(part)) == (0, [8, 9, 0, 1])  # straddles the epoch end
    assert plan.epoch_of(8) == 0 and plan.epoch_of(10) == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            dict(dataset_size=0, group_world_size=1, batch_size=1),
            "dataset_size must be an int >= 1, got 0",
        ),
        (
            dict(dataset_size=5, group_world_size=1),
            "batch_size (BatchMode.GROUP) must be an int >= 1, got None",
        ),
        (
            dict(dataset_size=5, group_world_size=1, mode=BatchMode.GLOBAL, batch_size=2),
            "global_batch_size (BatchMode.GLOBAL) must be an int >= 1, got None",
        ),
        (
            dict(dataset_size=5, group_world_size=1, batch_size=2, global_batch_size=4),
            "global_batch_size is for",
        ),
        (
            dict(dataset_size=5, group_world_size=True, batch_size=2),
            "group_world_size must be an int >= 1, got True",
        ),
    ],
)
def test_bad_settings_are_refused_naming_the_value(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as info:
        DataPlan(**kwargs)  # type: ignore[arg-type]
    assert message in str(info.value)


def test_a_rank_outside_the_step_is_refused_naming_it() -> None:
    plan = DataPlan(dataset_size=5, group_world_size=2, batch_size=1)
    with pytest.raises(
        ValueError, match=r"participant_rank must be in \[0, participants = 2\), got 2"
    ):
        plan.slice(consumed=0, participants=2, participant_rank=2, group_rank=0)
    with pytest.raises(
        ValueError, match=r"group_rank must be in \[0, group_world_size = 2\), got -1"
    ):
        plan.slice(consumed=0, participants=2, participant_rank=0, group_rank=-1)
    with pytest.raises(TypeError, match="mode must be a BatchMode"):
        DataPlan(dataset_size=5, group_world_size=1, mode="group", batch_size=1)  # type: ignore[arg-type]


class _Job:
    """The counters a Manager agrees on, stepped by hand: `participants` groups
    take part, this group is `rank` among them (None: it heals into the step)."""

    def __init__(self) -> None:
        self.step = self.batches = 0
        self.participants = 1
        self.rank: int | None = 0

    def current_step(self) -> int:
        return self.step

    def batches_committed(self) -> int:
        return self.batches

    def num_participants(self) -> int:
        return self.participants

    def participating_rank(self) -> int | None:
        return self.rank

    def commit(self) -> None:
        self.step += 1
        self.batches += self.participants


def test_the_batch_sampler_reads_the_managers_counters_and_iterates_one_epoch() -> None:
    plan = DataPlan(dataset_size=20, group_world_size=2, batch_size=2, shuffle=False)
    job = _Job()
    ranks = [ExactlyOnceBatchSampler(plan, job, group_rank=g) for g in (0, 1)]
    assert [r.step_indices() for r in ranks] == [[0, 1], [2, 3]]
    job.commit()
    job.participants, job.rank = 2, 1  # a second group joined; this one is second
    assert [r.step_indices() for r in ranks] == [[8, 9], [10, 11]]
    job.rank = None  # healing into the step: the first participant's batch, as a stand-in
    assert [r.step_indices() for r in ranks] == [[4, 5], [6, 7]]
    job.participants = 0  # no participant at all: nothing
    assert ranks[0].step_indices() == []
    job.participants = 2
    job.rank = 0
    epoch = []
    for batch in ranks[0]:  # one epoch: stops once the committed steps used sample 19
        epoch.append(batch)
        job.commit()
        assert len(epoch) < 10
    assert epoch == [[4, 5], [12, 13]]  # steps of 8 from sample 4: the second ends at 20
    assert ranks[0].epoch() == 1
    with pytest.raises(
        ValueError, match=r"group_rank must be an int in \[0, plan.group_world_size = 2\), got 2"
    ):
        ExactlyOnceBatchSampler(plan, job, group_rank=2)
