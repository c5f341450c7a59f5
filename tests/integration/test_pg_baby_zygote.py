"""A Baby group's zygote: a killed child is replaced by a fork of an interpreter that
imported torch once (milliseconds), not by a new interpreter (seconds)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch

from tests.multiproc import store_server
from torchft_pg import ProcessGroupBabyGloo
from torchft_pg.process_group.baby.zygote import ForkedProcess

pytestmark = pytest.mark.timeout(240)
START = timedelta(seconds=120)  # a cold interpreter start on a loaded machine


@pytest.fixture
def store_addr() -> Iterator[str]:
    with store_server() as store:
        yield f"127.0.0.1:{store.port}"


def _parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_a_killed_child_is_replaced_by_a_fork_of_the_zygote(store_addr: str) -> None:
    pg = ProcessGroupBabyGloo(timeout=timedelta(seconds=60))
    try:
        pg.configure(f"{store_addr}/z/0", 0, 1)
        zygote = pg._children.zygote
        assert zygote is not None  # started once the first child served
        zygote.wait_ready(START)
        first = pg._child
        assert first is not None
        os.kill(first.pid, signal.SIGKILL)
        assert first.proc.wait(timeout=30) == -signal.SIGKILL
        pg.configure(f"{store_addr}/z/1", 0, 1)
        child = pg._child
        assert child is not None and child is not first
        assert isinstance(child.proc, ForkedProcess)
        assert _parent_pid(child.pid) == zygote.proc.pid
        t = torch.ones(3)
        pg.allreduce([t]).wait()
        assert t.tolist() == [1.0, 1.0, 1.0]
        # the zygote reaps its children and reports their exit codes
        os.kill(child.pid, signal.SIGKILL)
        assert child.proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        pg.shutdown()
    assert zygote.proc.wait(timeout=30) is not None  # stopped with the group
