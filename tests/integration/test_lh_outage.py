"""A job outlives its lighthouse: while membership does not change, replica groups
commit on from their quorum lease through a lighthouse that is stopped (SIGSTOP:
sockets open, nothing answers) for longer than its heartbeat timeout, and
through one that is killed; the stopped one, resumed, declares nobody dead and
hands out no new quorum; after the killed one restarts (a new epoch) the groups
meet in its first quorum.

Real processes: the lighthouse CLI (stopped and killed by its pid), two
single-rank replica groups (Manager, Gloo, a TCPStore each) that publish each
commit to a coordination store the test reads.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from torch.distributed import TCPStore

from tests.integration.lh_fixtures import Proc
from tests.multiproc import RankContext, run_ranks

pytestmark = pytest.mark.timeout(180)
HEARTBEAT_TIMEOUT_MS = 2000
AWAY_S = 3.0  # each outage: longer than the heartbeat timeout
STEP_S = 0.01  # simulated compute per step
MAX_STEPS = 100_000  # bounds each replica's loop; the test says stop long before
STOP = "stop"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _lighthouse(port: int, state: Path) -> Iterator[tuple[Proc, str]]:
    """The lighthouse CLI on 127.0.0.1:`port`: (process, epoch); SIGKILLed on exit."""
    proc = Proc(
        [
            "-m",
            "lighthouse",
            "--bind",
            f"127.0.0.1:{port}",
            "--http-bind",
            "none",
            "--state-file",
            str(state),
            "--min-replicas",
            "2",
            "--heartbeat-timeout-ms",
            str(HEARTBEAT_TIMEOUT_MS),
        ]
    )
    try:
        line = proc.next_line(60)
        m = re.match(r"lighthouse listening on http://\S+ \(epoch (\w+)\)", line)
        assert m, line
        yield proc, m.group(1)
    finally:
        if proc.popen.poll() is None:
            os.kill(proc.popen.pid, signal.SIGCONT)  # a stopped one cannot die of SIGTERM
        proc.stop()


def _replica(ctx: RankContext) -> list[str]:
    """Train until told to stop; publish each commit's count and quorum."""
    import torch

    from torchft_pg import ProcessGroupGloo
    from torchft_pg.manager import Manager

    lighthouse, coord_port = ctx.args
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    coord = TCPStore("127.0.0.1", coord_port, is_master=False, timeout=timedelta(seconds=30))
    manager = Manager(
        ProcessGroupGloo(timeout=timedelta(seconds=10)),
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=lighthouse,
        replica_id=f"outage{ctx.rank}",
        timeout=timedelta(seconds=10),
        quorum_timeout=timedelta(seconds=60),
        init_sync=False,
    )
    quorums: list[str] = []  # the quorum of each commit, in order
    try:
        for _ in range(MAX_STEPS):
            if coord.check([STOP]):
                break
            time.sleep(STEP_S)  # simulated compute, not synchronization
            manager.start_quorum()
            manager.allreduce(torch.ones(4)).wait()
            if manager.should_commit():
                epoch, quorum_id = manager.quorum_id()
                quorums.append(f"{epoch}/{quorum_id}")
                coord.set(f"commits{ctx.rank}", str(len(quorums)))
                coord.set(f"quorum{ctx.rank}", quorums[-1])
    finally:
        manager.shutdown(wait=False)
    return quorums


def _commits(coord: TCPStore) -> list[int]:
    return [int(coord.get(f"commits{r}")) if coord.check([f"commits{r}"]) else 0 for r in range(2)]


def _wait_for(what: str, done: Callable[[], bool], limit_s: float, failed: threading.Event) -> None:
    """Poll `done` until true; fail after `limit_s` s (a bound far above a healthy run)."""
    deadline = time.monotonic() + limit_s
    while not done():
        assert not failed.is_set(), f"a replica failed while waiting for {what}"
        assert time.monotonic() < deadline, f"no {what} within {limit_s:g} s"
        time.sleep(0.05)  # polling the coordination store, not synchronization


def _each_gains(coord: TCPStore, since: list[int], steps: int) -> Callable[[], bool]:
    return lambda: all(n >= s + steps for n, s in zip(_commits(coord), since, strict=True))


def test_groups_commit_through_a_stopped_and_a_killed_lighthouse(tmp_path: Path) -> None:
    port = _free_port()
    state = tmp_path / "lighthouse.state.json"
    coord = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    results: list[Any] = []
    failed = threading.Event()

    def train(addr: str) -> None:
        try:
            results.extend(run_ranks(_replica, 2, addr, coord.port, timeout=150))
        except BaseException as e:
            results.append(e)
            failed.set()

    with _lighthouse(port, state) as (lh, epoch1):
        trainer = threading.Thread(target=train, args=(f"127.0.0.1:{port}",), daemon=True)
        trainer.start()
        try:
            _wait_for("commits by both groups", _each_gains(coord, [0, 0], 10), 90, failed)

            # Stopped for longer than its heartbeat timeout: both commit on, from the lease.
            at_stop = _commits(coord)
            os.kill(lh.popen.pid, signal.SIGSTOP)
            resume_at = time.monotonic() + AWAY_S  # the outage itself, not a wait for an event
            _wait_for(
                "commits while the lighthouse is stopped",
                lambda: time.monotonic() >= resume_at and _each_gains(coord, at_stop, 20)(),
                60,
                failed,
            )
            at_resume = _commits(coord)
            os.kill(lh.popen.pid, signal.SIGCONT)
            _wait_for("commits after it resumed", _each_gains(coord, at_resume, 20), 60, failed)
            after_resume = _commits(coord)

            # Killed: both commit on, from the lease.
            lh.popen.kill()
            lh.popen.wait(10)
            restart_at = time.monotonic() + AWAY_S
            _wait_for(
                "commits while the lighthouse is down",
                lambda: time.monotonic() >= restart_at and _each_gains(coord, after_resume, 20)(),
                60,
                failed,
            )
            at_restart = _commits(coord)
        except BaseException:
            coord.set(STOP, "1")
            trainer.join(60)
            raise
    with _lighthouse(port, state) as (_, epoch2):
        assert epoch2 != epoch1
        _wait_for(
            "both groups committing in the restarted lighthouse's quorum",
            lambda: all(
                coord.check([f"quorum{r}"]) and coord.get(f"quorum{r}").decode().startswith(epoch2)
                for r in range(2)
            ),
            60,
            failed,
        )
        coord.set(STOP, "1")
        trainer.join(60)
    assert not failed.is_set(), results
    quorums = results
    for rank, mine in enumerate(quorums):
        before = mine[at_stop[rank] - 1]
        # no new quorum across the stop: the resumed lighthouse declared nobody dead
        assert set(mine[at_stop[rank] - 1 : after_resume[rank]]) == {before}, rank
        # through the kill the lease held: the same quorum until the new epoch's
        assert set(mine[after_resume[rank] - 1 : at_restart[rank]]) == {before}, rank
        assert mine[-1].startswith(epoch2)
