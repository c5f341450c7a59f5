"""A full restart resumes the data at the same sample: the Manager's restored
counters give the position, the saved data plan is checked against the new one
(plain values, through JSON and ``torch.load(weights_only=True)``)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from tests.unit.data_fakes import FakeJob, through_torch_save
from torchft_pg.data import ExactlyOnceBatchSampler
from torchft_pg.data_plan import BatchMode, DataPlan


def plan(**changes: Any) -> DataPlan:
    settings: dict[str, Any] = dict(
        dataset_size=101, group_world_size=2, batch_size=4, seed=5, dataset_version="v1"
    )
    settings.update(changes)
    return DataPlan(**settings)


@pytest.mark.parametrize(
    "saved",
    [
        plan(),
        plan(shuffle=False, dataset_version=""),
        plan(mode=BatchMode.GLOBAL, batch_size=None, global_batch_size=12),
    ],
    ids=["group", "no-shuffle", "global"],
)
def test_the_plan_state_round_trips_through_json_and_torch_save(saved: DataPlan) -> None:
    state = saved.to_state()
    assert all(isinstance(v, int | str | bool | type(None)) for v in state.values()), state
    assert DataPlan.from_state(json.loads(json.dumps(state))) == saved
    assert DataPlan.from_state(through_torch_save(state)) == saved


@pytest.mark.parametrize(
    ("changed", "message"),
    [
        (plan(dataset_size=102), "dataset_size changed: the checkpoint's is 101, now 102"),
        (plan(dataset_version="v2"), "dataset_version changed: the checkpoint's is 'v1', now 'v2'"),
        (plan(seed=6), "seed changed: the checkpoint's is 5, now 6"),
        (plan(shuffle=False), "shuffle changed: the checkpoint's is True, now False"),
        (
            plan(batch_size=3),
            "batch_size * group_world_size (samples per committed group batch) changed: "
            "the checkpoint's is 4 x 2 = 8, now 3 x 2 = 6",
        ),
        (
            plan(mode=BatchMode.GLOBAL, batch_size=None, global_batch_size=8),
            "mode changed: the checkpoint's is 'group', now 'global'",
        ),
    ],
)
def test_a_plan_that_moves_the_samples_is_a_conflict_naming_the_field(
    changed: DataPlan, message: str
) -> None:
    conflicts = changed.resume_conflicts(plan())
    assert len(conflicts) == 1 and conflicts[0] == message, conflicts


def test_changes_that_keep_every_sample_in_place_resume() -> None:
    # the same samples per committed group batch, split between more ranks
    assert plan(batch_size=2, group_world_size=4).resume_conflicts(plan()) == []
    # without shuffling the seed draws nothing
    assert plan(shuffle=False, seed=9).resume_conflicts(plan(shuffle=False)) == []
    # GLOBAL counts steps of global_batch_size: the group's ranks do not enter it
    global_plan = plan(mode=BatchMode.GLOBAL, batch_size=None, global_batch_size=12)
    assert (
        plan(
            mode=BatchMode.GLOBAL, batch_size=None, global_batch_size=12, group_world_size=3
        ).resume_conflicts(global_plan)
        == []
    )
    assert plan(mode=BatchMode.GLOBAL, batch_size=None, global_batch_size=10).resume_conflicts(
        global_plan
    ) == ["global_batch_size changed: the checkpoint's is 12, now 10"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"format": 2}, "data plan state has format 2; this version reads format 1"),
        ({"seed": None}, "data plan state: 'seed' must be int, got None"),
        ({"dataset_size": True}, "data plan state: 'dataset_size' must be int, got True"),
        ({"batch_size": "4"}, "data plan state: 'batch_size' must be int or None, got '4'"),
        (
            {"mode": "both"},
            "data plan state: 'mode' must be one of ['global', 'group'], got 'both'",
        ),
        ({"dataset_size": 0}, "dataset_size must be an int >= 1, got 0"),
    ],
)
def test_a_corrupt_state_is_refused_naming_the_key(edit: dict[str, Any], message: str) -> None:
    state = {**plan().to_state(), **edit}
    with pytest.raises(ValueError) as info:
        DataPlan.from_state(state)
    assert message in str(info.value)


def test_a_state_without_a_key_names_it() -> None:
    state = plan().to_state()
    del state["seed"]
    with pytest.raises(ValueError, match="data plan state has no 'seed'"):
        DataPlan.from_state(state)
    with pytest.raises(ValueError, match="must be a mapping"):
        DataPlan.from_state([1, 2])  # type: ignore[arg-type]


def run(
    sampler: ExactlyOnceBatchSampler, job: FakeJob, schedule: list[tuple[int, int, bool]]
) -> list[list[int]]:
    """The indices of each step of `schedule` (participants, this group's rank,
    committed), as this rank reads them."""
    out = []
    for participants, rank, committed in schedule:
        job.participants, job.rank = participants, rank
        out.append(sampler.step_indices())
        if committed:
            job.commit()
    return out


@pytest.mark.parametrize("mode", [BatchMode.GROUP, BatchMode.GLOBAL])
def test_a_full_restart_resumes_at_the_same_sample(mode: BatchMode) -> None:
    """Two jobs from one checkpoint: the one that kept running and the one restarted
    from the checkpoint (Manager counters restored, sampler state loaded, new
    objects) read the same samples at every later step, failed steps included."""
    rng = random.Random(11)
    the_plan = plan(
        mode=mode,
        batch_size=4 if mode is BatchMode.GROUP else None,
        global_batch_size=13 if mode is BatchMode.GLOBAL else None,
    )
    schedule = []
    for _ in range(60):
        participants = rng.randint(1, 3)
        schedule.append((participants, rng.randrange(participants), rng.random() > 0.2))
    job = FakeJob()
    sampler = ExactlyOnceBatchSampler(the_plan, job, group_rank=1)
    run(sampler, job, schedule[:30])
    checkpoint = through_torch_save(
        {"manager": job.manager_state(), "data": json.loads(json.dumps(sampler.state_dict()))}
    )
    kept_running = run(sampler, job, schedule[30:])

    restored = FakeJob(checkpoint["manager"]["step"], checkpoint["manager"]["batches_committed"])
    resumed = ExactlyOnceBatchSampler(plan(**vars(the_plan)), restored, group_rank=1)
    resumed.load_state_dict(checkpoint["data"])
    assert run(resumed, restored, schedule[30:]) == kept_running
    assert resumed.epoch() == sampler.epoch() >= 1  # the runs crossed an epoch end


def test_loading_a_checkpoint_of_another_plan_names_what_changed() -> None:
    saved = ExactlyOnceBatchSampler(plan(), FakeJob(), group_rank=0).state_dict()
    other = ExactlyOnceBatchSampler(plan(dataset_size=90, batch_size=8), FakeJob(), group_rank=0)
    with pytest.raises(ValueError) as info:
        other.load_state_dict(saved)
    text = str(info.value)
    assert "dataset_size changed: the checkpoint's is 101, now 90" in text
    assert "the checkpoint's is 4 x 2 = 8, now 8 x 2 = 16" in text


def test_the_samplers_state_is_the_plan_and_the_counters_when_saved() -> None:
    job = FakeJob(step=7, batches=12)
    state = ExactlyOnceBatchSampler(plan(), job, group_rank=0).state_dict()
    assert state == {"plan": plan().to_state(), "step": 7, "batches_committed": 12}


def test_a_manager_left_unrestored_is_refused_at_the_first_step_it_takes_part_in() -> None:
    saved = ExactlyOnceBatchSampler(plan(), FakeJob(step=7, batches=12), 0).state_dict()
    job = FakeJob()  # a restart that loaded the data state but not the Manager's
    sampler = ExactlyOnceBatchSampler(plan(), job, group_rank=0)
    sampler.load_state_dict(saved)
    job.rank = None  # healing into the step: the heal brings the counters, no check yet
    assert len(sampler.step_indices()) == 4  # a stand-in batch, not counted
    job.rank = 0
    with pytest.raises(RuntimeError) as info:
        sampler.step_indices()
    assert "saved at step 7 (batches_committed 12), but the Manager is at step 0" in str(info.value)
    job.step, job.batches = 7, 12  # restored after the data state: that order works too
    assert len(sampler.step_indices()) == 4
    job.step = job.batches = 0  # checked once, at the first step after the load
    assert len(sampler.step_indices()) == 4


def test_a_state_saved_before_any_commit_resumes_at_step_zero() -> None:
    saved = ExactlyOnceBatchSampler(plan(), FakeJob(), 0).state_dict()
    sampler = ExactlyOnceBatchSampler(plan(), FakeJob(), group_rank=0)
    sampler.load_state_dict(json.loads(json.dumps(saved)))
    assert len(sampler.step_indices()) == 4


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"step": 1}, "must be a mapping with a 'plan'"),
        ({"plan": {}, "step": -1, "batches_committed": 0}, "'step' must be an int >= 0, got -1"),
        ({"plan": {}, "step": 1}, "'batches_committed' must be an int >= 0, got None"),
        ({"plan": {}, "step": 1, "batches_committed": 2}, "data plan state has no 'format'"),
    ],
)
def test_a_corrupt_sampler_state_names_the_key(state: dict[str, Any], message: str) -> None:
    sampler = ExactlyOnceBatchSampler(plan(), FakeJob(), group_rank=0)
    with pytest.raises(ValueError) as info:
        sampler.load_state_dict(state)
    assert message in str(info.value)
