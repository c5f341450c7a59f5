"""Who reads a Baby child's replies: waiters, the background thread, or both at once.

A thread in ``wait()`` reads the child's socket itself when no other thread
is reading; futures and contended waits are served by the background thread
(see `torchft_pg.process_group.baby.parent`). These tests drive every hand-off
between the two in one process: members of one group are threads, and each
member's backend runs in its own child.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch

from tests.multiproc import store_server
from tests.threads import run_in_threads
from torchft_pg import ProcessGroupBabyGloo
from torchft_pg.errors import ProcessGroupAbortedError, ProcessGroupTimeoutError

TIMEOUT = timedelta(seconds=30)
JOIN_S = 60.0  # bound on any test's threads


@pytest.fixture(scope="module")
def store_addr() -> Iterator[str]:
    with store_server() as store:
        yield f"127.0.0.1:{store.port}"


def _solo_group(store_addr: str, prefix: str) -> ProcessGroupBabyGloo:
    """A one-member Baby group: every op completes in its child alone."""
    pg = ProcessGroupBabyGloo(timeout=TIMEOUT, warm_spare=False)
    pg.configure(f"{store_addr}/{prefix}", 0, 1)
    return pg


@pytest.fixture(scope="module")
def solo(store_addr: str) -> Iterator[ProcessGroupBabyGloo]:
    """One group shared by the tests that leave its child alive (a child starts in seconds)."""
    pg = _solo_group(store_addr, "solo")
    try:
        yield pg
    finally:
        pg.shutdown()


@pytest.fixture
def doomed(store_addr: str, request: pytest.FixtureRequest) -> Iterator[ProcessGroupBabyGloo]:
    """A group of the test's own, whose child the test kills."""
    pg = _solo_group(store_addr, request.node.name)
    try:
        yield pg
    finally:
        pg.shutdown()


def test_many_threads_waiting_at_once_all_get_their_own_results(
    solo: ProcessGroupBabyGloo,
) -> None:
    def worker(i: int) -> list[float]:
        got = []
        for k in range(40):
            t = torch.full((3,), float(i * 100 + k))
            solo.allreduce([t]).wait()
            got.append(t[0].item())
        return got

    results = run_in_threads([lambda i=i: worker(i) for i in range(4)])  # type: ignore[misc]
    for i, got in enumerate(results):
        assert got == [float(i * 100 + k) for k in range(40)]


def test_futures_complete_without_anyone_waiting_on_the_work(solo: ProcessGroupBabyGloo) -> None:
    tensors = [torch.full((2,), float(i)) for i in range(20)]
    futures = [solo.allreduce([t]).get_future() for t in tensors]
    doubled = [f.then(lambda f: [x * 2 for x in f.value()]) for f in futures]
    values = [f.wait()[0].tolist() for f in doubled]  # torch's own wait: nobody reads for us
    assert values == [[2.0 * i, 2.0 * i] for i in range(20)]


def test_a_future_asked_for_after_completion_is_already_done(solo: ProcessGroupBabyGloo) -> None:
    t = torch.ones(2)
    work = solo.allreduce([t])
    work.wait()
    future = work.get_future()
    assert future.done() and future.value()[0] is t


def test_is_completed_alone_makes_progress(solo: ProcessGroupBabyGloo) -> None:
    t = torch.full((4,), 5.0)
    work = solo.allreduce([t])
    deadline = time.monotonic() + TIMEOUT.total_seconds()
    while not work.is_completed():
        assert time.monotonic() < deadline, "is_completed() never saw the reply"
        time.sleep(0.001)
    assert t.tolist() == [5.0] * 4


def test_a_future_callback_may_wait_on_another_op_of_the_same_group(
    solo: ProcessGroupBabyGloo,
) -> None:
    inner = torch.full((2,), 3.0)
    seen: list[list[float]] = []
    finished = threading.Event()

    def callback(_: Any) -> None:  # runs on whichever thread read the reply
        solo.allreduce([inner]).wait()
        seen.append(inner.tolist())
        finished.set()

    first = solo.allreduce([torch.ones(1)])
    first.get_future().add_done_callback(callback)
    first.wait()
    assert finished.wait(TIMEOUT.total_seconds()), "the callback's own wait never finished"
    assert seen == [[3.0, 3.0]]


def test_waiters_mixed_with_future_users_on_two_members(store_addr: str) -> None:
    pgs = [ProcessGroupBabyGloo(timeout=TIMEOUT, warm_spare=False) for _ in range(2)]

    def member(rank: int) -> list[float]:
        pg = pgs[rank]
        pg.configure(f"{store_addr}/mixed", rank, 2)  # one prefix per test: module store
        sums = []
        for k in range(30):
            t = torch.full((4,), float(rank + k))
            work = pg.allreduce([t])
            if k % 3 == 0:
                work.get_future().wait()
            else:
                work.wait()
            sums.append(t[0].item())
        return sums

    try:
        results = run_in_threads([lambda r=r: member(r) for r in range(2)])  # type: ignore[misc]
    finally:
        for pg in pgs:
            pg.shutdown()
    expected = [float(2 * k + 1) for k in range(30)]
    assert results == [expected, expected]


def test_a_stuck_op_times_out_while_later_ops_complete(store_addr: str) -> None:
    pgs = [ProcessGroupBabyGloo(timeout=TIMEOUT, warm_spare=False) for _ in range(2)]

    def member(rank: int) -> dict[str, Any]:
        pg = pgs[rank]
        pg.configure(f"{store_addr}/stuck", rank, 2)
        out: dict[str, Any] = {}
        if rank == 0:
            stuck = pg.recv([torch.zeros(1)], 1, tag=7)  # member 1 never sends
            start = time.monotonic()
            try:
                stuck.wait(timedelta(seconds=0.3))
                out["stuck"] = "completed"
            except ProcessGroupTimeoutError:
                out["stuck"] = "timed out"
            out["stuck_s"] = time.monotonic() - start
        t = torch.full((2,), float(rank + 1))
        pg.allreduce([t]).wait()  # read past the stuck op's missing reply
        out["sum"] = t.tolist()
        return out

    try:
        r0, r1 = run_in_threads([lambda r=r: member(r) for r in range(2)])  # type: ignore[misc]
    finally:
        for pg in pgs:
            pg.shutdown()
    assert r0["stuck"] == "timed out" and r0["stuck_s"] < 5.0
    assert r0["sum"] == r1["sum"] == [3.0, 3.0]


def test_a_child_that_dies_with_nothing_in_flight_is_noticed(
    doomed: ProcessGroupBabyGloo,
) -> None:
    solo = doomed
    solo.allreduce([torch.ones(1)]).wait()
    pid = solo.child_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while solo.errored() is None:
        assert time.monotonic() < deadline, "the child's death went unnoticed"
        time.sleep(0.01)
    assert isinstance(solo.errored(), ProcessGroupAbortedError)
    with pytest.raises(ProcessGroupAbortedError, match="configure"):
        solo.allreduce([torch.ones(1)])


def test_waiters_blocked_behind_another_reader_are_served_by_the_background_thread(
    doomed: ProcessGroupBabyGloo,
) -> None:
    solo = doomed
    child = solo._pg
    outcomes: list[str] = []

    def wait(work: Any) -> None:
        try:
            work.wait()
            outcomes.append("ok")
        except ProcessGroupAbortedError as e:
            outcomes.append(str(e))

    with child._token:  # another reader: the waiters below must block and hand off
        works = [solo.allreduce([torch.ones(1)]) for _ in range(3)]
        threads = [threading.Thread(target=wait, args=(w,), daemon=True) for w in works]
        for t in threads:
            t.start()
        time.sleep(0.2)
        assert outcomes == []
    for t in threads:
        t.join(JOIN_S)
    assert outcomes == ["ok"] * 3

    with child._token:  # and when the child dies meanwhile, they fail instead of hanging
        works = [solo.allreduce([torch.ones(1)]) for _ in range(3)]
        threads = [threading.Thread(target=wait, args=(w,), daemon=True) for w in works]
        for t in threads:
            t.start()
        pid = solo.child_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        child.proc.wait(timeout=JOIN_S)  # dead before the waiters get the reader role
    for t in threads:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in threads)
    assert len(outcomes) == 6
    assert all(o == "ok" or "Baby PG child" in o for o in outcomes[3:])
