"""FakeProcessGroupWrapper (torchft's fault injector) around a real ProcessGroupGloo.

Two members are threads of this process. Member 1 is told to fail its next
allreduce: the collective still runs (member 0 gets the right sum and is not
left waiting), only member 1's Work reports the injected error.
"""

from __future__ import annotations

import functools
from datetime import timedelta

import pytest
import torch

from tests.multiproc import store_server
from tests.threads import run_in_threads
from torchft_pg import ProcessGroupGloo
from torchft_pg.process_group import FakeProcessGroupWrapper

TIMEOUT = timedelta(seconds=20)


def test_injected_error_fails_one_members_allreduce_without_stalling_its_peer() -> None:
    with store_server() as store:
        pgs = [FakeProcessGroupWrapper(ProcessGroupGloo(timeout=TIMEOUT)) for _ in range(2)]
        addr = f"127.0.0.1:{store.port}/fake"
        injected = RuntimeError("injected allreduce error")

        def member(rank: int) -> dict[str, object]:
            pg = pgs[rank]
            pg.configure(addr, "replica", rank, 2)  # torchft's argument order
            out: dict[str, object] = {}
            if rank == 1:
                pg.report_future_error(injected)
            t = torch.full((3,), float(rank + 1))
            try:
                pg.allreduce([t]).wait()
                out["first"] = "ok"
            except RuntimeError as e:
                out["first"] = e
            out["first_sum"] = t.tolist()
            t = torch.full((3,), float(rank + 1))
            out["second"] = pg.allreduce([t]).get_future().wait()[0].tolist()
            return out

        try:
            zero, one = run_in_threads([functools.partial(member, r) for r in range(2)])
        finally:
            for pg in pgs:
                pg.shutdown()

    assert zero["first"] == "ok"
    assert one["first"] is injected
    assert zero["first_sum"] == one["first_sum"] == [3.0, 3.0, 3.0]  # the collective ran
    assert zero["second"] == one["second"] == [3.0, 3.0, 3.0]  # and the group still works


def test_repr_and_backend_name_are_the_inner_groups() -> None:
    pg = FakeProcessGroupWrapper(ProcessGroupGloo(timeout=TIMEOUT))
    assert repr(pg).startswith("FakeProcessGroupWrapper(pg=ProcessGroupGloo(")
    assert pg.getBackendName() == "torchft-gloo"
    with pytest.raises(ValueError, match="store address must be"):
        pg.configure("addr", "0", 0, 1)  # the Gloo group uses the address: it checks it
