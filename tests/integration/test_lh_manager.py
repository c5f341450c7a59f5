"""ManagerServer + ManagerClient over real gRPC on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from functools import partial
from typing import Any

import pytest

from lighthouse import (
    FailureNotice,
    LighthouseServer,
    LighthouseUnavailableError,
    ManagerClient,
    ManagerServer,
    QuorumRejectedError,
)
from tests.integration.lh_fixtures import lighthouse, quorum_request

pytestmark = pytest.mark.timeout(60)
T = timedelta(seconds=10)


@contextmanager
def managers(
    lh: LighthouseServer, n: int, world_size: int, **kw: Any
) -> Iterator[list[ManagerServer]]:
    with ExitStack() as stack:
        servers = []
        for i in range(n):
            ms = ManagerServer(
                f"rep{i}",
                lh.address(),
                bind="127.0.0.1:0",
                store_addr=f"127.0.0.1:{4000 + i}",
                world_size=world_size,
                **kw,
            )
            stack.callback(ms.shutdown)
            servers.append(ms)
        yield servers


def in_threads(fns: Sequence[Callable[[], Any]]) -> list[Any]:
    """Run each fn on its own thread; results (or raised exceptions) in order."""
    out: list[Any] = [None] * len(fns)

    def run(i: int) -> None:
        try:
            out[i] = fns[i]()
        except BaseException as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return out


def test_local_ranks_gathered_into_one_lighthouse_call_each_gets_its_result() -> None:
    with lighthouse(min_replicas=2) as lh, managers(lh, 2, world_size=2) as ms:
        calls = [
            partial(ManagerClient(ms[i].address()).quorum, quorum_request(g, 5 * i, f"meta{i}{g}"))
            for i in range(2)
            for g in range(2)
        ]
        r00, r01, r10, _r11 = in_threads(calls)
        assert lh.status()["quorums_issued"] == 1  # one lighthouse request per group
        assert (r00.replica_rank, r10.replica_rank, r00.replica_world_size) == (0, 1, 2)
        assert r00.heal and r01.heal and not r10.heal
        assert r00.recover_src_manager_address == ms[1].address()
        # the source's metadata for each healer's group rank came with the quorum
        assert (r00.recover_src_checkpoint_metadata, r01.recover_src_checkpoint_metadata) == (
            "meta10",
            "meta11",
        )
        assert r10.recover_dst_replica_ranks == [0]
        assert r00.store_address == "127.0.0.1:4001" == r01.store_address
        assert r00.epoch == lh.epoch and r00.replica_ids == ["rep0", "rep1"]
        client = ManagerClient(ms[1].address())
        assert client.checkpoint_metadata(1, T) == "meta11"
        with pytest.raises(QuorumRejectedError, match="no metadata for group rank 7"):
            client.checkpoint_metadata(7, T)


def test_local_ranks_that_disagree_on_the_step_are_all_rejected() -> None:
    with lighthouse() as lh, managers(lh, 1, world_size=2) as (ms,):
        c = ManagerClient(ms.address())
        out = in_threads(
            [lambda: c.quorum(quorum_request(0, 1)), lambda: c.quorum(quorum_request(1, 2))]
        )
        for exc in out:
            assert isinstance(exc, QuorumRejectedError)
            assert "reported different steps" in str(exc) and "{0: 1, 1: 2}" in str(exc)


def test_out_of_range_group_rank_is_refused() -> None:
    with (
        lighthouse() as lh,
        managers(lh, 1, world_size=2) as (ms,),
        pytest.raises(QuorumRejectedError, match=r"group_rank must be in \[0, 2\), got 5"),
    ):
        ManagerClient(ms.address()).quorum(quorum_request(5, 0))


def test_a_failed_lighthouse_call_reaches_every_waiting_rank_at_once() -> None:
    with (
        lighthouse() as lh,
        managers(lh, 1, world_size=2, connect_timeout=timedelta(milliseconds=500)) as (ms,),
    ):
        lh.shutdown()
        c = ManagerClient(ms.address())
        start = time.monotonic()
        out = in_threads(
            [
                partial(c.quorum, quorum_request(g, 0, timeout=timedelta(seconds=30)))
                for g in range(2)
            ]
        )
        assert time.monotonic() - start < 15  # far before the 30 s deadline
        for exc in out:
            assert isinstance(exc, LighthouseUnavailableError), exc
            assert lh.bare_address() in str(exc)


def test_commit_vote_is_the_and_of_local_votes_and_stale_votes_are_refused() -> None:
    with lighthouse() as lh, managers(lh, 1, world_size=2) as (ms,):
        c = ManagerClient(ms.address())
        assert in_threads(
            [lambda: c.should_commit(0, 0, True, T), lambda: c.should_commit(1, 0, False, T)]
        ) == [False, False]
        assert in_threads(
            [lambda: c.should_commit(0, 0, True, T), lambda: c.should_commit(1, 0, True, T)]
        ) == [True, True]
        in_threads([partial(c.quorum, quorum_request(g, 5)) for g in range(2)])
        with pytest.raises(QuorumRejectedError, match="stale vote: group rank 0 voted for step 3"):
            c.should_commit(0, 3, True, T)
        # A vote ahead of the quorum's step (a buggy or hostile member) is refused
        # and leaves the real vote for step 5 to decide as usual.
        with pytest.raises(QuorumRejectedError, match="vote ahead: group rank 1 voted for step 7"):
            c.should_commit(1, 7, True, T)
        assert in_threads(
            [lambda: c.should_commit(0, 5, True, T), lambda: c.should_commit(1, 5, True, T)]
        ) == [True, True]


def test_kill_runs_the_kill_hook() -> None:
    killed = threading.Event()
    with (
        lighthouse() as lh,
        managers(lh, 1, world_size=1, on_kill=lambda msg: killed.set()) as (ms,),
    ):
        ManagerClient(ms.address()).kill("from a test")
        assert killed.wait(5)


def test_survivors_subscribers_hear_of_a_dead_member_and_next_quorum_excludes_it() -> None:
    with lighthouse(min_replicas=2) as lh, managers(lh, 3, world_size=1) as ms:
        clients = [ManagerClient(m.address()) for m in ms]
        got: list[FailureNotice] = []
        heard = threading.Event()

        def on_notice(n: FailureNotice) -> None:
            got.append(n)
            heard.set()

        sub = clients[0].subscribe_failures(on_notice)
        try:
            assert sub.wait_ready(T)
            first = in_threads([partial(c.quorum, quorum_request(0, 1)) for c in clients])
            assert first[0].replica_world_size == 3
            ms[2].shutdown(leave=False)  # closes its stream as a crash would
            assert heard.wait(5)
            assert got[0].dead_replica_ids == ("rep2",)
            assert (got[0].epoch, got[0].quorum_id) == (lh.epoch, first[0].quorum_id)
            second = in_threads([partial(c.quorum, quorum_request(0, 2)) for c in clients[:2]])
            assert second[0].replica_ids == ["rep0", "rep1"]
            assert second[0].quorum_id == first[0].quorum_id + 1
        finally:
            sub.cancel()


def test_a_clean_shutdown_is_a_leave_not_a_death() -> None:
    # no leases: the rounds after the leave must reach the lighthouse (with a
    # lease, the first could be answered before the recall lands, see test_lh_lease)
    with (
        lighthouse(min_replicas=1, join_timeout_ms=30_000, quorum_lease=False) as lh,
        managers(lh, 3, world_size=1) as ms,
    ):
        clients = [ManagerClient(m.address()) for m in ms]
        first = in_threads([partial(c.quorum, quorum_request(0, 1)) for c in clients])
        assert first[0].replica_world_size == 3
        ms[2].shutdown()  # leave=True by default
        start = time.monotonic()
        second = in_threads([partial(c.quorum, quorum_request(0, 2)) for c in clients[:2]])
        assert second[0].replica_ids == ["rep0", "rep1"]
        assert time.monotonic() - start < 10  # it was forgotten, not waited for (join timeout 30 s)
        assert lh.status()["recent_deaths"] == []  # and nobody was told it died


def test_manager_server_survives_a_lighthouse_restart() -> None:
    lh1 = LighthouseServer(bind="127.0.0.1:0")
    bind = lh1.bare_address()
    with ExitStack() as stack:
        stack.callback(lh1.shutdown)
        ms = ManagerServer(
            "rep0", bind, bind="127.0.0.1:0", world_size=1, connect_timeout=timedelta(seconds=5)
        )
        stack.callback(ms.shutdown)
        c = ManagerClient(ms.address())
        r1 = c.quorum(quorum_request(0, 1))
        lh1.shutdown()
        lh2 = LighthouseServer(bind=bind)
        stack.callback(lh2.shutdown)
        # until its liveness stream reopens, the lease may still answer (the lighthouse
        # was away: a job commits on through that); then the new lighthouse does
        r2 = c.quorum(quorum_request(0, 2))
        assert r2.epoch in (lh1.epoch, lh2.epoch)
        assert ms.wait_liveness(T, epoch=lh2.epoch)  # the liveness stream reconnected too
        r3 = c.quorum(quorum_request(0, 3))
        assert (r1.epoch, r3.epoch) == (lh1.epoch, lh2.epoch)
        live = {r["replica_id"]: r for r in lh2.status()["live"]}
        assert live["rep0"]["liveness_streams"] == 1


def test_unreachable_lighthouse_fails_manager_server_construction() -> None:
    with lighthouse() as lh:
        addr = lh.address()
    with pytest.raises(LighthouseUnavailableError, match=lh.bare_address()):
        ManagerServer("rep0", addr, bind="127.0.0.1:0", connect_timeout=timedelta(milliseconds=300))
    with pytest.raises(ValueError, match="world_size must be >= 1, got 0"):
        ManagerServer("rep0", addr, world_size=0)


def test_fuzzed_manager_requests_never_stop_the_server() -> None:
    import random

    import grpc

    from lighthouse import services

    rng = random.Random(99)
    with lighthouse() as lh, managers(lh, 1, world_size=2) as (ms,):
        channel = grpc.insecure_channel(ms.address())
        names = ["Quorum", "CheckpointMetadata", "ShouldCommit"]
        methods = {n: channel.unary_unary(f"/{services.MANAGER_SERVICE}/{n}") for n in names}
        for _ in range(120):
            payload = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 48)))
            try:
                methods[rng.choice(names)](payload, timeout=0.05)
            except grpc.RpcError as exc:
                assert exc.code() in (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    grpc.StatusCode.NOT_FOUND,
                    grpc.StatusCode.FAILED_PRECONDITION,
                ), exc
        c = ManagerClient(ms.address())
        out = in_threads([partial(c.quorum, quorum_request(g, 1)) for g in range(2)])
        assert [r.replica_rank for r in out] == [0, 0], out
        assert in_threads([partial(c.should_commit, g, 1, True, T) for g in range(2)]) == [
            True,
            True,
        ]


def test_subscription_reports_when_its_manager_server_goes_away() -> None:
    errors: list[Exception] = []
    ended = threading.Event()
    with lighthouse() as lh, managers(lh, 1, world_size=1) as (ms,):

        def on_error(e: Exception) -> None:
            errors.append(e)
            ended.set()

        sub = ManagerClient(ms.address()).subscribe_failures(lambda n: None, on_error=on_error)
        assert sub.wait_ready(T)
        ms.shutdown()
        assert ended.wait(5)
        sub.cancel()
    assert "manager server" in str(errors[0]) or "broke" in str(errors[0])


def test_a_step_during_which_the_replica_was_silent_for_the_heartbeat_timeout_is_not_committed() -> (
    None
):
    # A frozen replica (here: its server's event loop blocked, so no ping goes
    # out) may have been declared dead meanwhile, and its peers abandoned the
    # step: it must vote no even though every local rank voted yes.
    with lighthouse(heartbeat_timeout_ms=1000) as lh, managers(lh, 1, world_size=1) as (ms,):
        c = ManagerClient(ms.address())
        c.quorum(quorum_request(0, 1))
        assert c.should_commit(0, 1, True, T) is True
        c.quorum(quorum_request(0, 2))
        unblocked = threading.Event()

        def freeze() -> None:
            time.sleep(1.2)  # past the 1 s heartbeat timeout: the freeze under test
            unblocked.set()

        ms.loop.call_soon_threadsafe(freeze)
        assert unblocked.wait(5)
        assert c.should_commit(0, 2, True, T) is False


def test_a_vote_whose_wait_runs_out_is_no_for_every_rank_and_a_late_vote_is_refused() -> None:
    """Group rank 1 is slow (e.g. a long heal) and votes after rank 0's vote timeout.
    Rank 0 hears "no" (not a timeout it cannot read), rank 1's late vote for the
    same attempt is refused, and the retried step, with a new quorum, commits."""
    with lighthouse() as lh, managers(lh, 1, world_size=2) as (ms,):
        c = ManagerClient(ms.address())
        in_threads([partial(c.quorum, quorum_request(g, 5)) for g in range(2)])
        start = time.monotonic()
        assert c.should_commit(0, 5, True, timedelta(seconds=1)) is False
        assert time.monotonic() - start < 1.0  # answered before its deadline
        with pytest.raises(QuorumRejectedError, match="late vote: group rank 1 voted for step 5"):
            c.should_commit(1, 5, True, T)
        in_threads([partial(c.quorum, quorum_request(g, 5)) for g in range(2)])
        assert in_threads(
            [lambda: c.should_commit(0, 5, True, T), lambda: c.should_commit(1, 5, True, T)]
        ) == [True, True]
