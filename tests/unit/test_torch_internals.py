"""The private torch.distributed names `torchft_pg._torch_internals` reads still answer.

If a torch upgrade moves one, this fails naming it (the module says which
torch it was checked on)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist

from torchft_pg._torch_internals import c10d_groups, default_group_timeout


@pytest.fixture
def world() -> Iterator[None]:
    if dist.is_initialized():
        pytest.fail("a default process group is already initialized in this test process")
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=30))
    dist.init_process_group(
        "gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=77)
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_without_a_default_group_there_is_no_timeout_and_no_group() -> None:
    assert default_group_timeout() is None
    assert c10d_groups() == []


def test_the_default_groups_timeout_and_every_group_are_read(world: None) -> None:
    assert default_group_timeout() == timedelta(seconds=77)
    sub = dist.new_group([0])
    groups = c10d_groups()
    assert groups[0] is dist.group.WORLD and sub in groups
