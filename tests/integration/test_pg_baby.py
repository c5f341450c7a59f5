"""ProcessGroupBabyGloo: the backend in a child process, across real processes."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import torch

from tests.multiproc import RankContext, run_ranks
from tests.pg_checks import check_collectives
from torchft_pg import ProcessGroupBabyGloo
from torchft_pg.errors import ProcessGroupAbortedError

CPU = torch.device("cpu")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _collectives_and_reuse(ctx: RankContext) -> dict[str, object]:
    pg = ProcessGroupBabyGloo(timeout=timedelta(seconds=20), warm_spare=False)
    pg.configure(ctx.addr("b/0"), ctx.rank, ctx.world_size)
    first_pid = pg.child_pid
    names = check_collectives(pg, CPU)
    # Large tensors go through shared memory; a non-contiguous one through a staged copy.
    big = torch.full((300_000,), float(ctx.rank + 1))
    pg.allreduce([big]).wait()
    strided = torch.full((600, 1000), float(ctx.rank + 1)).t()[:, ::2]
    pg.allreduce([strided]).wait()
    fut_value = pg.allreduce([torch.ones(3)]).get_future().wait()
    # A reconfigure reuses the same child and is fast.
    start = time.perf_counter()
    pg.configure(ctx.addr("b/1"), ctx.rank, ctx.world_size)
    reconfigure_s = time.perf_counter() - start
    again = torch.ones(2)
    pg.allreduce([again]).wait()
    out = {
        "names": names,
        "big_ok": bool(torch.all(big == 3.0)) and big.is_shared(),
        "strided_ok": bool(torch.all(strided == 3.0)),
        "future_value": [t.tolist() for t in fut_value],
        "same_child": pg.child_pid == first_pid,
        "reconfigure_s": reconfigure_s,
        "again": again.tolist(),
    }
    child = pg.child_pid
    pg.shutdown()
    pg.shutdown()  # idempotent
    assert child is not None
    out["child_gone"] = not _pid_alive(child)
    return out


def test_baby_collectives_shared_memory_and_child_reuse() -> None:
    for r in run_ranks(_collectives_and_reuse, 2, timeout=120):
        assert "allreduce" in r["names"] and "send_recv" in r["names"]
        assert r["big_ok"] and r["strided_ok"]
        assert r["future_value"] == [[2.0, 2.0, 2.0]]  # the future yields the tensors
        assert r["same_child"]
        assert r["reconfigure_s"] < 2.0  # no interpreter start (torchft: 3.6-7 s)
        assert r["again"] == [2.0, 2.0]
        assert r["child_gone"]


def _kill_child(ctx: RankContext) -> dict[str, object]:
    pg = ProcessGroupBabyGloo(timeout=timedelta(seconds=30), warm_spare=True)
    pg.configure(ctx.addr("k/0"), ctx.rank, ctx.world_size)
    pg.allreduce([torch.ones(1)]).wait()
    out: dict[str, object] = {}
    if ctx.rank == 0:
        # Rank 1 does not join this allreduce, so it stays pending in our child.
        work = pg.allreduce([torch.ones(1)])
        old_pid = pg.child_pid
        assert old_pid is not None
        os.kill(old_pid, signal.SIGKILL)
        start = time.monotonic()
        try:
            work.wait()
            out["pending"] = "no error"
        except ProcessGroupAbortedError as e:
            out["pending"] = str(e)
        out["pending_failed_after"] = time.monotonic() - start
        try:
            pg.allreduce([torch.ones(1)])
            out["later"] = "no error"
        except ProcessGroupAbortedError as e:
            out["later"] = str(e)
        out["errored"] = repr(pg.errored())
        out["old_pid"] = old_pid
    ctx.barrier("killed")
    start = time.monotonic()
    pg.configure(ctx.addr("k/1"), ctx.rank, ctx.world_size)
    out["configure_after_kill_s"] = time.monotonic() - start
    t = torch.tensor([float(ctx.rank + 1)])
    pg.allreduce([t]).wait()
    out["sum"] = t.item()
    out["new_pid"] = pg.child_pid
    pg.shutdown()
    return out


def test_killing_the_child_fails_work_and_configure_recovers() -> None:
    r0, r1 = run_ranks(_kill_child, 2, timeout=120)
    assert "exited with code" in str(r0["pending"]) or "killed" in str(r0["pending"])
    assert r0["pending_failed_after"] < 5.0  # at once, not after the 30 s PG timeout
    assert "configure()" in str(r0["later"])
    assert "ProcessGroupAbortedError" in str(r0["errored"])
    assert r0["new_pid"] != r0["old_pid"]
    assert r0["sum"] == r1["sum"] == 3.0


def _abort(ctx: RankContext) -> list[str]:
    pg = ProcessGroupBabyGloo(timeout=timedelta(seconds=20), warm_spare=False)
    pg.configure(ctx.addr("a/0"), ctx.rank, ctx.world_size)
    pid = pg.child_pid
    pg.abort()
    pg.abort()
    assert pid is not None and not _pid_alive(pid)
    seen = [type(pg.errored()).__name__]
    pg.configure(ctx.addr("a/1"), ctx.rank, ctx.world_size)
    t = torch.ones(1)
    pg.allreduce([t]).wait()
    seen.append(str(t.item()))
    pg.shutdown()
    return seen


def test_abort_kills_the_child_and_configure_starts_another() -> None:
    for r in run_ranks(_abort, 2, timeout=120):
        assert r == ["ProcessGroupAbortedError", "2.0"]
