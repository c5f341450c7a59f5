"""A lighthouse process SIGKILLed and restarted on the same address (a new epoch) while
manager servers hold a quorum lease: nobody is left waiting for a peer that moved on."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from functools import partial

import pytest

from lighthouse import FailureNotice, ManagerClient, ManagerServer
from tests.integration.lh_fixtures import Proc, quorum_request
from tests.integration.test_lh_manager import in_threads

pytestmark = pytest.mark.timeout(90)
T = timedelta(seconds=10)
JOIN_TIMEOUT_MS = 60_000  # far beyond every bound below: waiting for it fails the test
LONG = timedelta(seconds=60)  # quorum requests outlive every bound below too


@contextmanager
def lighthouse_process(bind: str) -> Iterator[tuple[Proc, str, str]]:
    """A lighthouse CLI process on `bind`: (process, host:port, epoch); SIGKILLed on exit."""
    proc = Proc(
        [
            "-m",
            "lighthouse",
            "--bind",
            bind,
            "--http-bind",
            "none",
            "--state-file",
            "none",
            "--min-replicas",
            "2",
            "--join-timeout-ms",
            str(JOIN_TIMEOUT_MS),
        ]
    )
    try:
        line = proc.next_line(60)
        m = re.match(r"lighthouse listening on http://(\S+) \(epoch (\w+)\)", line)
        assert m, line
        yield proc, m.group(1), m.group(2)
    finally:
        proc.stop()


def _servers(stack: ExitStack, addr: str, n: int) -> list[ManagerServer]:
    servers = []
    for i in range(n):
        ms = ManagerServer(f"rep{i}", addr, bind="127.0.0.1:0", world_size=1, connect_timeout=LONG)
        stack.callback(ms.shutdown)
        assert ms.wait_liveness(T)
        servers.append(ms)
    return servers


def test_a_leased_step_still_running_when_the_lighthouse_restarts_is_failed() -> None:
    got: list[FailureNotice] = []
    heard = threading.Event()

    def on_notice(n: FailureNotice) -> None:
        if n.dead_replica_ids:
            got.append(n)
            heard.set()

    with ExitStack() as stack:
        lh1, addr, epoch1 = stack.enter_context(lighthouse_process("127.0.0.1:0"))
        ms = _servers(stack, addr, 2)
        clients = [ManagerClient(m.address()) for m in ms]
        sub = clients[0].subscribe_failures(on_notice)
        stack.callback(sub.cancel)
        assert sub.wait_ready(T)
        first = in_threads([partial(c.quorum, quorum_request(0, 5)) for c in clients])
        assert all(m.lease_id > 0 for m in ms)
        # rep0 enters leased step 6: its collectives now wait for rep1
        assert clients[0].quorum(quorum_request(0, 6)).quorum_id == first[0].quorum_id
        lh1.stop()  # SIGKILL: no recall, no notice; the new lighthouse knows no lease
        _, _, epoch2 = stack.enter_context(lighthouse_process(addr))
        assert ms[1].wait_liveness(T, epoch=epoch2)  # rep1's lease is void: it asks
        with ThreadPoolExecutor(1) as pool:
            back = pool.submit(clients[1].quorum, quorum_request(0, 6, timeout=LONG))
            # rep0 is live at the new lighthouse but would not ask before its step
            # ends; the new lighthouse would wait its join timeout for it. Instead
            # its leased step is failed as soon as its liveness stream reopens.
            assert heard.wait(20), "the leased step was left to run into its timeout"
            notice = got[-1]
            assert (notice.epoch, notice.quorum_id) == (epoch1, first[0].quorum_id)
            assert notice.step == 6 and notice.dead_replica_ids == ("rep1",)
            assert ms[0].lease_id == 0
            # rep0 votes no on step 6 and asks again: both are in the new epoch's quorum
            again = clients[0].quorum(quorum_request(0, 6, commit_failures=1, timeout=LONG))
            joined = back.result(timeout=20)
        assert again.epoch == joined.epoch == epoch2
        assert again.quorum_id == joined.quorum_id
        assert again.replica_ids == ["rep0", "rep1"]


def test_a_decided_leased_step_is_not_failed_by_the_restart() -> None:
    got: list[FailureNotice] = []

    with ExitStack() as stack:
        lh1, addr, _ = stack.enter_context(lighthouse_process("127.0.0.1:0"))
        ms = _servers(stack, addr, 2)
        clients = [ManagerClient(m.address()) for m in ms]
        sub = clients[0].subscribe_failures(lambda n: got.append(n) if n.dead_replica_ids else None)
        stack.callback(sub.cancel)
        assert sub.wait_ready(T)
        in_threads([partial(c.quorum, quorum_request(0, 5)) for c in clients])
        in_threads([partial(c.quorum, quorum_request(0, 6)) for c in clients])  # leased
        assert clients[0].should_commit(0, 6, True, T)  # rep0's step 6 is decided
        lh1.stop()
        _, _, epoch2 = stack.enter_context(lighthouse_process(addr))
        assert ms[0].wait_liveness(T, epoch=epoch2)
        both = in_threads([partial(c.quorum, quorum_request(0, 7, timeout=LONG)) for c in clients])
        assert [r.epoch for r in both] == [epoch2, epoch2]
    assert got == []  # nothing was in progress at the reopen: no step was failed
