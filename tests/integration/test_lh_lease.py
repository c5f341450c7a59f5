"""Quorum leases over real gRPC on 127.0.0.1: granted, used, recalled, stranded steps failed."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from functools import partial

import pytest

from lighthouse import FailureNotice, ManagerClient, ManagerServer
from tests.integration.lh_fixtures import lighthouse, quorum_request
from tests.integration.test_lh_manager import in_threads, managers

pytestmark = pytest.mark.timeout(60)
T = timedelta(seconds=10)


def _ready(ms: list[ManagerServer]) -> list[ManagerClient]:
    for m in ms:
        assert m.wait_liveness(T)  # a lease is only taken over an open liveness stream
    return [ManagerClient(m.address()) for m in ms]


def test_steps_after_a_leased_quorum_skip_the_lighthouse() -> None:
    with lighthouse(min_replicas=2, join_timeout_ms=30_000) as lh, managers(lh, 2, 1) as ms:
        clients = _ready(ms)
        first = in_threads([partial(c.quorum, quorum_request(0, 5)) for c in clients])
        assert all(m.lease_id > 0 for m in ms)
        issued = lh.status()["quorums_issued"]
        for step in (6, 7, 8):  # each follows a committed step: answered from the lease
            got = in_threads([partial(c.quorum, quorum_request(0, step)) for c in clients])
            assert [r.quorum_id for r in got] == [first[0].quorum_id] * 2
            assert [r.replica_rank for r in got] == [0, 1] and got[0].max_step == step
            assert not any(r.heal for r in got)
        assert lh.status()["quorums_issued"] == issued  # the lighthouse saw none of them
        assert [m.leased_rounds for m in ms] == [3, 3]
        # a step that did not advance (a discarded step) asks the lighthouse again
        in_threads([partial(c.quorum, quorum_request(0, 8)) for c in clients])
        assert lh.status()["quorums_issued"] == issued + 1


def test_a_joiner_recalls_the_lease_and_is_admitted_once_the_holders_finish_the_next_round() -> (
    None
):
    """Either holder may already run round 6 on the lease when the joiner asks (its
    report still on the way): both finish it on the lease, so neither waits in its
    collectives for one that went to ask, and the joiner is admitted at step 7."""
    # rep2 is live but silent at first: the first quorum forms at the join timeout
    with lighthouse(min_replicas=2, join_timeout_ms=2000) as lh, managers(lh, 3, 1) as ms:
        clients = _ready(ms)
        first = in_threads([partial(c.quorum, quorum_request(0, 5)) for c in clients[:2]])
        assert ms[0].lease_id > 0
        with ThreadPoolExecutor(1) as pool:
            joiner = pool.submit(clients[2].quorum, quorum_request(0, 0))
            assert ms[0].wait_lease_recalled(T) and ms[1].wait_lease_recalled(T)
            leased = in_threads([partial(c.quorum, quorum_request(0, 6)) for c in clients[:2]])
            assert [r.quorum_id for r in leased] == [first[0].quorum_id] * 2
            assert not joiner.done()
            got = in_threads([partial(c.quorum, quorum_request(0, 7)) for c in clients[:2]])
            joined = joiner.result(timeout=10)
        assert got[0].replica_ids == ["rep0", "rep1", "rep2"] == joined.replica_ids
        assert joined.heal and joined.max_step == 7
        assert [m.leased_rounds for m in ms] == [1, 1, 0]


def test_a_member_leaving_the_lease_fails_the_leased_step_its_peer_is_in() -> None:
    with lighthouse(min_replicas=2, join_timeout_ms=30_000) as lh, managers(lh, 2, 1) as ms:
        clients = _ready(ms)
        got: list[FailureNotice] = []
        heard = threading.Event()

        def on_notice(n: FailureNotice) -> None:
            got.append(n)
            heard.set()

        sub = clients[0].subscribe_failures(on_notice)
        try:
            assert sub.wait_ready(T)
            first = in_threads([partial(c.quorum, quorum_request(0, 5)) for c in clients])
            # rep0 enters leased step 6; rep1's step 5 failed (commit_failures=1), so
            # it asks the lighthouse at step 5 and will run no collective of step 6
            assert clients[0].quorum(quorum_request(0, 6)).quorum_id == first[0].quorum_id
            with ThreadPoolExecutor(1) as pool:
                back = pool.submit(clients[1].quorum, quorum_request(0, 5, commit_failures=1))
                assert heard.wait(10)
                assert got[-1].step == 6 and got[-1].dead_replica_ids == ("rep1",)
                assert (got[-1].epoch, got[-1].quorum_id) == (lh.epoch, first[0].quorum_id)
                assert ms[0].lease_id == 0
                # rep0 votes no on step 6 and asks again at 6; rep1 heals to it
                again = clients[0].quorum(quorum_request(0, 6, commit_failures=1))
                assert back.result(timeout=10).quorum_id == again.quorum_id > first[0].quorum_id
        finally:
            sub.cancel()


def test_a_lighthouse_without_leases_answers_every_step() -> None:
    with (
        lighthouse(min_replicas=2, join_timeout_ms=30_000, quorum_lease=False) as lh,
        managers(lh, 2, 1) as ms,
    ):
        clients = _ready(ms)
        for step in (1, 2, 3):
            in_threads([partial(c.quorum, quorum_request(0, step)) for c in clients])
        assert lh.status()["quorums_issued"] == 3
        assert [m.lease_id for m in ms] == [0, 0] and [m.leased_rounds for m in ms] == [0, 0]
