"""torchdata's ``StatefulDataLoader`` over `ExactlyOnceBatchSampler`: the loader's
state carries the sampler's (the data plan), and a loader restarted from it with
the Manager's counters restored yields the batches the first one would have.

torchdata is a test-only package (``make install-test-extras``); without it
these tests skip.
"""

from __future__ import annotations

from typing import Any

import pytest
from torch.utils.data import Dataset

from tests.unit.data_fakes import FakeJob, through_torch_save
from torchft_pg.data import ExactlyOnceBatchSampler
from torchft_pg.data_plan import DataPlan

stateful_dataloader = pytest.importorskip("torchdata.stateful_dataloader")
StatefulDataLoader = stateful_dataloader.StatefulDataLoader

# torchdata 0.11 calls a torch function that torch 2.13 deprecates; not ours to fix
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


class Squares(Dataset[int]):
    def __len__(self) -> int:
        return 23

    def __getitem__(self, index: int) -> int:
        return index * index


PLAN = DataPlan(dataset_size=23, group_world_size=2, batch_size=3, seed=4)
SCHEDULE = [(1, 0), (2, 1), (2, 0), (3, 2), (1, 0), (2, 1), (2, 1), (1, 0)]  # (groups, rank)


def loader_for(job: FakeJob, plan: DataPlan = PLAN) -> Any:
    sampler = ExactlyOnceBatchSampler(plan, job, group_rank=1)
    return StatefulDataLoader(Squares(), batch_sampler=sampler)


def take(batches: Any, job: FakeJob, schedule: list[tuple[int, int]]) -> list[list[int]]:
    """The batches of `schedule`'s steps, each committed (an epoch's iterator ends
    when the committed steps reach the next epoch: then a new one is started)."""
    out = []
    iterator = iter(batches)
    for participants, rank in schedule:
        job.participants, job.rank = participants, rank
        try:
            batch = next(iterator)
        except StopIteration:
            iterator = iter(batches)
            batch = next(iterator)
        out.append(batch.tolist())
        job.commit()
    return out


def test_the_loaders_state_holds_the_samplers_and_a_restart_resumes_there() -> None:
    job = FakeJob()
    loader = loader_for(job)
    take(loader, job, SCHEDULE[:3])
    state = loader.state_dict()
    # the batch sampler's state_dict, as it is
    assert {"plan": PLAN.to_state(), "step": 3, "batches_committed": 5} in state.values()
    checkpoint = through_torch_save({"manager": job.manager_state(), "loader": state})
    kept_running = take(loader, job, SCHEDULE[3:])

    restored = FakeJob(checkpoint["manager"]["step"], checkpoint["manager"]["batches_committed"])
    resumed = loader_for(restored)
    resumed.load_state_dict(checkpoint["loader"])
    assert take(resumed, restored, SCHEDULE[3:]) == kept_running
    # the loader asked the sampler once per step: a stateful batch sampler is
    # not fast-forwarded by replaying the checkpoint's batches (each a quorum)
    assert restored.rank_queries == len(SCHEDULE[3:])


def test_a_checkpoint_of_another_plan_is_refused_when_the_loader_starts() -> None:
    job = FakeJob()
    loader = loader_for(job)
    take(loader, job, SCHEDULE[:2])
    state = through_torch_save(loader.state_dict())
    other = loader_for(FakeJob(), DataPlan(dataset_size=23, group_world_size=2, batch_size=3))
    other.load_state_dict(state)  # kept for the next iter()
    with pytest.raises(ValueError, match="seed changed: the checkpoint's is 4, now 0"):
        iter(other)
