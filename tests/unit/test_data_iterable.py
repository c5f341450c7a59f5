"""`ExactlyOnceIterableDataset`: each step's samples themselves, from a
random-access source or a stream opened at an offset; every sample once over the
committed steps, whatever the membership does (counters faked, no processes)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest
import torch
from torch.utils.data import default_collate

from tests.unit.data_fakes import FakeJob, through_torch_save
from torchft_pg.data import ExactlyOnceIterableDataset
from torchft_pg.data_plan import BatchMode, DataPlan


class GroupView:
    """One replica group's view of the job's shared counters: it takes part in
    the step when it is in `job.live` (its rank there), else it heals into it."""

    def __init__(self, job: FakeJob, group: int, live: list[int]) -> None:
        self.job, self.group, self.live = job, group, live

    def current_step(self) -> int:
        return self.job.current_step()

    def batches_committed(self) -> int:
        return self.job.batches_committed()

    def num_participants(self) -> int:
        return len(self.live)

    def participating_rank(self) -> int | None:
        return self.live.index(self.group) if self.group in self.live else None


class Stream:
    """A dataset read in order from an offset (sample i is ``1000 + i``), counting
    how often it is opened; `length` shorter than the plan's dataset ends early."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.opened: list[int] = []

    def __call__(self, offset: int) -> Iterator[int]:
        self.opened.append(offset)
        return iter(range(1000 + offset, 1000 + self.length))


@pytest.mark.parametrize("source", ["samples", "open_at"])
@pytest.mark.parametrize("mode", [BatchMode.GROUP, BatchMode.GLOBAL])
def test_every_sample_once_while_groups_come_and_go_and_steps_fail(
    source: str, mode: BatchMode
) -> None:
    rng = random.Random(3)
    size, groups, per_group = 89, 3, 2
    plan = DataPlan(
        dataset_size=size,
        group_world_size=per_group,
        mode=mode,
        batch_size=3 if mode is BatchMode.GROUP else None,
        global_batch_size=10 if mode is BatchMode.GLOBAL else None,
        shuffle=source == "samples",
        seed=1,
    )
    job, live = FakeJob(), [0]
    data = [1000 + i for i in range(size)]
    streams = {(r, g): Stream(size) for r in range(groups) for g in range(per_group)}
    ranks = {
        (r, g): ExactlyOnceIterableDataset(
            plan,
            GroupView(job, r, live),
            group_rank=g,
            **({"samples": data} if source == "samples" else {"open_at": streams[r, g]}),
        )
        for r, g in streams
    }
    used: list[int] = []
    for _ in range(150):
        live[:] = sorted(rng.sample(range(groups), rng.randint(1, groups)))
        job.participants = len(live)
        step = {}
        for key, rank in ranks.items():
            opened = len(streams[key].opened)
            step[key] = samples = rank.step_samples()
            wraps = sum(1 for a, b in pairwise(samples) if b < a)
            # a rank's part of a step is one contiguous read: at most one open,
            # and one more where it runs past the epoch's end
            assert len(streams[key].opened) - opened <= 1 + wraps, (key, samples)
        # a group not in the step reads the first participant's samples as a stand-in
        assert all(step[(r, g)] == step[(live[0], g)] for r, g in step if r not in live)
        if rng.random() < 0.25:
            continue  # failed: the next step reads these samples again
        used.extend(s for r in live for g in range(per_group) for s in step[(r, g)])
        job.commit()
    epochs = len(used) // size
    assert epochs >= 3, epochs
    for e in range(epochs):
        assert Counter(used[e * size : (e + 1) * size]) == Counter(data), e
    if source == "open_at":
        assert used[: epochs * size] == data * epochs  # the stream's order, epoch after epoch


def test_a_lone_rank_reads_its_stream_on_without_opening_it_again() -> None:
    plan = DataPlan(dataset_size=10, group_world_size=1, batch_size=4, shuffle=False)
    job, stream = FakeJob(), Stream(10)
    dataset = ExactlyOnceIterableDataset(plan, job, group_rank=0, open_at=stream)
    read = []
    for committed in (True, False, True, True):
        read.append(dataset.step_samples())
        if committed:
            job.commit()
    assert read == [
        [1000, 1001, 1002, 1003],
        [1004, 1005, 1006, 1007],  # failed
        [1004, 1005, 1006, 1007],
        [1008, 1009, 1000, 1001],
    ]
    # at the start, again for the failed step's samples, again at the epoch's end
    assert stream.opened == [0, 4, 0]


def test_iterating_gives_one_epoch_or_every_step_when_infinite() -> None:
    plan = DataPlan(dataset_size=10, group_world_size=1, batch_size=4, shuffle=False)
    for infinite, expected in ((False, 3), (True, 7)):
        job = FakeJob()
        dataset = ExactlyOnceIterableDataset(
            plan, job, group_rank=0, samples=list(range(10)), infinite=infinite
        )
        steps = 0
        for _ in dataset:
            job.commit()
            steps += 1
            if steps == 7:
                break
        assert steps == expected
        assert dataset.epoch() == (1 if not infinite else 2)


def test_bad_sources_are_refused_naming_what_is_wrong() -> None:
    plan = DataPlan(dataset_size=10, group_world_size=1, batch_size=4, shuffle=False)
    job = FakeJob()
    with pytest.raises(TypeError, match="exactly one source"):
        ExactlyOnceIterableDataset(plan, job, 0)
    with pytest.raises(TypeError, match="exactly one source"):
        ExactlyOnceIterableDataset(plan, job, 0, samples=list(range(10)), open_at=Stream(10))
    with pytest.raises(ValueError, match=r"len\(samples\) must be plan.dataset_size = 10, got 9"):
        ExactlyOnceIterableDataset(plan, job, 0, samples=list(range(9)))
    shuffled = DataPlan(dataset_size=10, group_world_size=1, batch_size=4)
    with pytest.raises(ValueError, match="the plan must not shuffle"):
        ExactlyOnceIterableDataset(shuffled, job, 0, open_at=Stream(10))
    short = ExactlyOnceIterableDataset(plan, job, 0, open_at=Stream(6))
    short.step_samples()
    job.commit()
    with pytest.raises(
        ValueError,
        match=r"open_at\(0\) ended after 6 samples, before offset 6; the plan's dataset has 10",
    ):
        short.step_samples()


def test_a_worker_process_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = DataPlan(dataset_size=10, group_world_size=1, batch_size=4)
    dataset = ExactlyOnceIterableDataset(plan, FakeJob(), 0, samples=list(range(10)))
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    with pytest.raises(RuntimeError, match="use num_workers=0"):
        next(iter(dataset))


class TokenWindows:
    """A torchtitan-style source: sequence i of a packed token stream, as the
    model's (input, label) pair, by random access."""

    def __init__(self, tokens: torch.Tensor, seq_len: int) -> None:
        self.tokens, self.seq_len = tokens, seq_len

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.tokens[index * self.seq_len : (index + 1) * self.seq_len + 1]
        return window[:-1], window[1:]


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")  # torchdata 0.11's
def test_a_stateful_loader_over_token_windows_restarts_at_the_same_sequence() -> None:
    stateful_dataloader = pytest.importorskip("torchdata.stateful_dataloader")
    windows = TokenWindows(torch.arange(161), seq_len=8)  # 20 sequences
    plan = DataPlan(dataset_size=len(windows), group_world_size=1, batch_size=3, seed=2)

    def loader(job: FakeJob) -> Any:
        dataset = ExactlyOnceIterableDataset(plan, job, 0, samples=windows, infinite=True)
        return stateful_dataloader.StatefulDataLoader(
            dataset, batch_size=None, collate_fn=default_collate
        )

    def steps(batches: Iterator[Any], job: FakeJob, n: int) -> list[list[int]]:
        out = []
        for _ in range(n):
            inputs, labels = next(batches)
            assert inputs.shape == labels.shape == (3, 8)
            assert torch.equal(inputs[:, 1:], labels[:, :-1])
            out.append((inputs[:, 0] // 8).tolist())  # which sequences
            job.commit()
        return out

    job = FakeJob()
    first = loader(job)
    batches = iter(first)
    steps(batches, job, 4)
    checkpoint = through_torch_save({"manager": job.manager_state(), "loader": first.state_dict()})
    kept_running = steps(batches, job, 5)  # crosses into the second epoch

    restored = FakeJob(checkpoint["manager"]["step"], checkpoint["manager"]["batches_committed"])
    resumed = loader(restored)
    resumed.load_state_dict(checkpoint["loader"])
    assert steps(iter(resumed), restored, 5) == kept_running
    assert restored.rank_queries == 5  # resumed from the counters, not by replaying batches
