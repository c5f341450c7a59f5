"""LocalManagerClient: rank 0 served in-process by its ManagerServer, next to
ranks on real gRPC, against a real lighthouse on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from functools import partial

import pytest

from lighthouse import (
    FailureNotice,
    LocalManagerClient,
    ManagerClient,
    ManagerServer,
    QuorumRejectedError,
    QuorumTimeoutError,
)
from tests.integration.lh_fixtures import lighthouse, quorum_request
from tests.integration.test_lh_manager import in_threads, managers

pytestmark = pytest.mark.timeout(60)
T = timedelta(seconds=10)


def test_local_and_remote_ranks_share_one_round_and_one_vote() -> None:
    with lighthouse(min_replicas=2) as lh, managers(lh, 2, world_size=2) as ms:
        local = LocalManagerClient(ms[0], ms[0].address())
        remote = [ManagerClient(ms[0].address()), ManagerClient(ms[1].address())]
        pending = local.quorum_async(quorum_request(0, 0, "meta00"))
        r01, r10, r11 = in_threads(
            [
                lambda: remote[0].quorum(quorum_request(1, 0, "meta01")),
                lambda: remote[1].quorum(quorum_request(0, 5, "meta10")),
                lambda: remote[1].quorum(quorum_request(1, 5, "meta11")),
            ]
        )
        r00 = pending.result(timeout=10)
        assert lh.status()["quorums_issued"] == 1
        assert (r00.replica_rank, r01.replica_rank, r10.replica_rank) == (0, 0, 1)
        assert r00.heal and r00.recover_src_manager_address == ms[1].address()
        assert r00.replica_ids == r11.replica_ids == [ms[0].replica_id, ms[1].replica_id]
        assert local.checkpoint_metadata(1, T) == "meta01"
        with pytest.raises(QuorumRejectedError, match="no metadata for group rank 7"):
            local.checkpoint_metadata(7, T)

        votes = in_threads(
            [
                lambda: local.should_commit(0, 0, True, T),
                lambda: remote[0].should_commit(1, 0, False, T),
            ]
        )
        assert votes == [False, False]  # the AND of one local and one remote vote


def test_local_errors_are_the_rpc_errors() -> None:
    with lighthouse() as lh, managers(lh, 1, world_size=2) as (ms,):
        local = LocalManagerClient(ms, ms.address())
        remote = ManagerClient(ms.address())
        out = in_threads(
            [
                lambda: local.quorum(quorum_request(0, 1)),
                lambda: remote.quorum(quorum_request(1, 2)),
            ]
        )
        for exc in out:
            assert isinstance(exc, QuorumRejectedError), exc
            assert "reported different steps" in str(exc) and "{0: 1, 1: 2}" in str(exc)
        with pytest.raises(QuorumRejectedError, match=r"group_rank must be in \[0, 2\), got 5"):
            local.quorum(quorum_request(5, 0))
        with pytest.raises(ValueError, match="step must be >= 0 and fit in an int64, got -1"):
            local.quorum(quorum_request(0, -1))


def test_a_local_rank_whose_peers_never_come_times_out_and_the_next_round_works() -> None:
    with lighthouse() as lh, managers(lh, 1, world_size=2) as (ms,):
        local = LocalManagerClient(ms, ms.address())
        start = time.monotonic()
        with pytest.raises(QuorumTimeoutError, match=r"no answer within 0\.300 s"):
            local.quorum(quorum_request(0, 0, timeout=timedelta(milliseconds=300)))
        assert time.monotonic() - start < 5
        # a vote whose wait runs out is decided no for the whole group, not a timeout
        assert local.should_commit(0, 0, True, timedelta(milliseconds=300)) is False
        # the expired request and vote left the round: a full round goes through
        remote = ManagerClient(ms.address())
        out = in_threads(
            [
                lambda: local.quorum(quorum_request(0, 0)),
                lambda: remote.quorum(quorum_request(1, 0)),
            ]
        )
        assert [r.replica_world_size for r in out] == [1, 1], out
        votes = in_threads(
            [
                lambda: local.should_commit(0, 0, True, T),
                lambda: remote.should_commit(1, 0, True, T),
            ]
        )
        assert votes == [True, True]


def test_local_failure_subscription_hears_a_peer_die() -> None:
    with lighthouse(min_replicas=2) as lh, managers(lh, 2, world_size=1) as ms:
        local = LocalManagerClient(ms[0], ms[0].address())
        got: list[FailureNotice] = []
        heard = threading.Event()

        def on_notice(notice: FailureNotice) -> None:
            got.append(notice)
            heard.set()

        sub = local.subscribe_failures(on_notice)
        try:
            assert sub.wait_ready(T)
            in_threads([partial(_quorum_now, m) for m in ms])
            ms[1].shutdown(leave=False)  # a crash, as the lighthouse sees it
            assert heard.wait(10)
            assert got[0].dead_replica_ids == (ms[1].replica_id,)
            assert got[0].epoch == lh.epoch
        finally:
            sub.cancel()


def _quorum_now(ms: ManagerServer) -> object:
    """Group rank 0 of ``ms``'s one-rank group asks in-process; waits up to 10 s."""
    local = LocalManagerClient(ms, ms.address())
    return local.quorum_async(quorum_request(0, 0, init_sync=False)).result(10)
