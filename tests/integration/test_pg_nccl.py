"""NCCL and BabyNCCL on real GPUs: one rank per device. Skipped without CUDA."""

from __future__ import annotations

import os
import signal
from datetime import timedelta

import pytest
import torch

from tests.multiproc import RankContext, run_ranks
from tests.pg_checks import check_collectives
from torchft_pg.errors import ProcessGroupAbortedError

pytestmark = pytest.mark.gpu

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
needs_gpu = pytest.mark.skipif(
    GPUS < 1, reason="needs a CUDA device (none here); run on a GPU machine"
)


def _nccl(ctx: RankContext) -> list[str]:
    from torchft_pg import ProcessGroupBabyNCCL, ProcessGroupNCCL

    torch.cuda.set_device(ctx.rank)
    device = torch.device("cuda", ctx.rank)
    cls = ProcessGroupBabyNCCL if ctx.args[0] == "baby" else ProcessGroupNCCL
    pg = cls(timeout=timedelta(seconds=30))
    names: list[str] = []
    for gen in range(2):  # a reconfiguration in between
        pg.configure(ctx.addr(f"nccl/{ctx.args[0]}/{gen}"), ctx.rank, ctx.world_size)
        names = check_collectives(pg, device)
    if ctx.args[0] == "baby":
        assert isinstance(pg, ProcessGroupBabyNCCL)
        pid = pg.child_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ProcessGroupAbortedError):
            pg.allreduce([torch.ones(1, device=device)]).wait()
        pg.configure(ctx.addr("nccl/baby/after-kill"), ctx.rank, ctx.world_size)
        t = torch.ones(1, device=device)
        pg.allreduce([t]).wait()
        assert t.item() == ctx.world_size
    else:
        pg.abort()
        assert pg.errored() is not None
    pg.shutdown()
    return names


@needs_gpu
@pytest.mark.parametrize("kind", ["nccl", "baby"])
def test_nccl_collectives_reconfigure_and_abort(kind: str) -> None:
    results = run_ranks(_nccl, GPUS, kind, timeout=240)
    assert "allreduce" in results[0] and "reduce_scatter" in results[0]


def _overstay(ctx: RankContext) -> dict[str, object]:
    from torchft_pg import ProcessGroupNCCL
    from torchft_pg.errors import ProcessGroupTimeoutError

    torch.cuda.set_device(ctx.rank)
    device = torch.device("cuda", ctx.rank)
    pg = ProcessGroupNCCL(timeout=timedelta(seconds=2))
    pg.configure(ctx.addr("nccl/overstay/0"), ctx.rank, ctx.world_size)
    t = torch.ones(1, device=device)
    pg.allreduce([t]).wait()
    torch.cuda.synchronize()
    # A stream busy for ~8 s: the allreduce queued behind it cannot complete in 2 s.
    torch.cuda._sleep(int(8 * torch.cuda.get_device_properties(device).clock_rate * 1000))
    work = pg.allreduce([t])
    failed = None
    try:
        work.get_future().wait()
    except Exception as e:  # our deadline aborted the communicator
        failed = type(e).__name__
    error = pg.errored()
    torch.cuda.synchronize()  # the process is alive: c10d's watchdog did not tear it down
    pg.configure(ctx.addr("nccl/overstay/1"), ctx.rank, ctx.world_size)
    t = torch.ones(1, device=device)
    pg.allreduce([t]).wait()
    torch.cuda.synchronize()
    pg.shutdown()
    return {
        "failed": failed,
        "timeout_error": isinstance(error, ProcessGroupTimeoutError),
        "after": t.item(),
    }


@needs_gpu
def test_an_operation_past_the_timeout_aborts_the_communicator_and_the_process_lives() -> None:
    results = run_ranks(_overstay, GPUS, timeout=240)
    for r in results:
        assert r["failed"] is not None and r["timeout_error"], r
        assert r["after"] == GPUS
