"""`torchft_pg.data.DistributedSampler`: shards over (replica group, group rank) pairs."""

from __future__ import annotations

import pytest
from torch.utils.data import Dataset

from torchft_pg.data import DistributedSampler


class Range(Dataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def shard(
    n: int, replica_rank: int, groups: int, group_rank: int, per_group: int, **kw: object
) -> list[int]:
    sampler = DistributedSampler(
        Range(n),
        replica_rank=replica_rank,
        num_replica_groups=groups,
        group_rank=group_rank,
        num_replicas=per_group,
        **kw,
    )
    return list(sampler)


def test_global_rank_and_world_size() -> None:
    sampler = DistributedSampler(
        Range(1000), replica_rank=1, num_replica_groups=2, group_rank=3, num_replicas=4
    )
    assert (sampler.global_rank, sampler.global_world_size) == (7, 8)
    assert (sampler.rank, sampler.num_replicas) == (7, 8)  # what torch's sampler uses
    assert next(iter(sampler)) == 500  # torch shuffles by default (seed 0)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize(("groups", "per_group", "n"), [(3, 2, 60), (2, 4, 1000), (4, 1, 7)])
def test_shards_are_disjoint_and_cover_the_dataset(
    groups: int, per_group: int, n: int, shuffle: bool
) -> None:
    shards = {
        (r, g): shard(n, r, groups, g, per_group, shuffle=shuffle, drop_last=True)
        for r in range(groups)
        for g in range(per_group)
    }
    per_shard = n // (groups * per_group)
    assert all(len(s) == per_shard for s in shards.values())
    seen = [i for s in shards.values() for i in s]
    assert len(seen) == len(set(seen))  # disjoint
    assert len(seen) == per_shard * groups * per_group  # all but the < world remainder
    # without drop_last torch pads by repeating the start: every index is read
    padded = {
        i
        for r in range(groups)
        for g in range(per_group)
        for i in shard(n, r, groups, g, per_group, shuffle=shuffle)
    }
    assert padded == set(range(n))


def test_shard_is_replica_rank_times_group_size_plus_group_rank() -> None:
    # unshuffled, shard k of W is indices k, k + W, k + 2W, ...
    assert shard(24, 2, 3, 1, 4, shuffle=False) == [9, 21]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"replica_rank": 2},
            r"replica_rank must be an int in \[0, num_replica_groups = 2\), got 2",
        ),
        ({"replica_rank": -1}, r"replica_rank .* got -1"),
        ({"group_rank": 4}, r"group_rank must be an int in \[0, num_replicas = 4\), got 4"),
        ({"num_replica_groups": 0}, "num_replica_groups must be an int >= 1, got 0"),
        ({"num_replicas": 0}, "num_replicas must be an int >= 1, got 0"),
        ({"replica_rank": 1.0}, r"replica_rank .* got 1.0"),
    ],
)
def test_bad_ranks_are_named(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {
        "replica_rank": 1,
        "num_replica_groups": 2,
        "group_rank": 3,
        "num_replicas": 4,
        **kwargs,
    }
    with pytest.raises(ValueError, match=match):
        DistributedSampler(Range(10), **args)  # type: ignore[arg-type]


def test_defaults_need_a_default_group_or_say_so() -> None:
    with pytest.raises(ValueError, match="group_rank was not given"):
        DistributedSampler(Range(10), replica_rank=0, num_replica_groups=1, num_replicas=1)
    with pytest.raises(ValueError, match="num_replicas was not given"):
        DistributedSampler(Range(10), replica_rank=0, num_replica_groups=1, group_rank=0)


def test_torchft_0_1s_keywords_name_the_same_shard() -> None:
    new = DistributedSampler(
        Range(12), replica_rank=1, num_replica_groups=2, group_rank=1, num_replicas=2
    )
    old = DistributedSampler(
        Range(12), replica_group=1, num_replica_groups=2, rank=1, num_replicas=2
    )
    assert (
        (old.global_rank, old.global_world_size)
        == (new.global_rank, new.global_world_size)
        == (3, 4)
    )
    assert list(old) == list(new)


def test_both_spellings_of_one_argument_are_refused_naming_them() -> None:
    with pytest.raises(
        TypeError, match=r"pass replica_rank or torchft 0\.1's replica_group, not both"
    ):
        DistributedSampler(
            Range(4),
            replica_rank=0,
            replica_group=0,
            num_replica_groups=1,
            group_rank=0,
            num_replicas=1,
        )
    with pytest.raises(TypeError, match="needs replica_rank"):
        DistributedSampler(Range(4), num_replica_groups=1, group_rank=0, num_replicas=1)
