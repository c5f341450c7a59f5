"""ProcessGroupBabyGloo: the backend in a child process, across real processes."""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta

import pytest
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


def _abort_idle(ctx: RankContext) -> list[str]:
    pg = ProcessGroupBabyGloo(timeout=timedelta(seconds=20), warm_spare=False)
    pg.configure(ctx.addr("a/0"), ctx.rank, ctx.world_size)
    pg.allreduce([torch.ones(1)]).wait()
    pid = pg.child_pid
    pg.abort()
    pg.abort()
    seen = [type(pg.errored()).__name__]
    try:
        pg.allreduce([torch.ones(1)])
    except ProcessGroupAbortedError as e:
        seen.append("aborted" if "configure()" in str(e) else str(e))
    # Nothing was in flight: the child is kept, and the next configure is one
    # message to it rather than a new interpreter importing torch.
    assert pid is not None and _pid_alive(pid)
    pg.configure(ctx.addr("a/1"), ctx.rank, ctx.world_size)
    seen.append("same child" if pg.child_pid == pid else f"new child {pg.child_pid}")
    t = torch.ones(1)
    pg.allreduce([t]).wait()
    seen.append(str(t.item()))
    pg.shutdown()
    return seen


def test_abort_of_an_idle_child_keeps_it_for_the_next_configure() -> None:
    for r in run_ranks(_abort_idle, 2, timeout=120):
        assert r == ["ProcessGroupAbortedError", "aborted", "same child", "2.0"]


def _in_flight(ctx: RankContext) -> dict[str, object]:
    """Rank 0 has an allreduce in flight that rank 1 never joins; the PG timeout is
    60 s. `how` ends it: abort(), or a configure for the next group without one."""
    (how,) = ctx.args
    pg = ProcessGroupBabyGloo(timeout=timedelta(seconds=60), warm_spare=False)
    pg.configure(ctx.addr(f"{how}/0"), ctx.rank, ctx.world_size)
    pg.allreduce([torch.ones(1)]).wait()
    out: dict[str, object] = {}
    failed = threading.Event()
    old_pid = pg.child_pid
    assert old_pid is not None
    if ctx.rank == 0:
        work = pg.allreduce([torch.ones(1)])

        def waiter() -> None:
            try:
                work.wait()
                out["pending"] = "completed"
            except Exception as e:
                out["pending"] = f"{type(e).__name__}: {e}"
            failed.set()

        thread = threading.Thread(target=waiter, daemon=True)
        thread.start()
        if how == "abort":
            pg.abort()  # fails it at once: the child is killed (nothing else stops a Gloo op)
            out["failed_in_time"] = failed.wait(20)
    ctx.barrier("ended")
    t = torch.tensor([float(ctx.rank + 1)])
    pg.configure(ctx.addr(f"{how}/1"), ctx.rank, ctx.world_size)
    if ctx.rank == 0:
        if how == "configure":
            out["failed_in_time"] = failed.wait(20)
        out["old_child_gone"] = not _pid_alive(old_pid)
        out["new_child"] = pg.child_pid != old_pid
        thread.join(10)
    pg.allreduce([t]).wait()
    out["sum"] = t.item()
    pg.shutdown()
    return out


@pytest.mark.parametrize("how", ["abort", "configure"])
def test_an_op_in_flight_fails_at_once_and_the_next_group_gets_a_fresh_child(how: str) -> None:
    r0, r1 = run_ranks(_in_flight, 2, how, timeout=150)
    assert r0["failed_in_time"], r0  # not after the 60 s PG timeout
    assert str(r0["pending"]).startswith("ProcessGroupAbortedError"), r0
    assert "killed" in str(r0["pending"]) or "exited" in str(r0["pending"]), r0
    assert r0["old_child_gone"] and r0["new_child"]
    assert r0["sum"] == r1["sum"] == 3.0
