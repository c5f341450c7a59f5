"""A served checkpoint goes only to the healers its quorum named.

The source (an `HTTPTransport` told its quorum, as the Manager does) runs in
this process; every receiver, named or not, runs in a process of its own and
has the job secret: what keeps it out here is the quorum, not the secret.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
import torch

from tests.multiproc import RankContext, run_ranks
from torchft_pg.checkpointing import HTTPTransport
from torchft_pg.checkpointing.named_healers import NamedHealers

pytestmark = pytest.mark.timeout(60)
SECRET = "s3cret-for-this-job-only"
T = timedelta(seconds=5)


def _fetch_as(ctx: RankContext) -> str:
    """Receive step 3 from `metadata`, saying it is `replica_rank` of `quorum` (None: silent)."""
    metadata, quorum, replica_rank = ctx.args
    receiver: HTTPTransport[dict[str, Any]] = HTTPTransport(
        T, bind_host="127.0.0.1", job_secret=SECRET
    )
    try:
        if quorum is not None:
            receiver.set_quorum(quorum, replica_rank)
        state = receiver.recv_checkpoint(0, metadata, 3, T)
        return f"got {state['w'].tolist()}"
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    finally:
        receiver.shutdown()


def test_only_the_replica_ranks_the_quorum_named_may_fetch_the_state() -> None:
    source: HTTPTransport[dict[str, Any]] = HTTPTransport(
        T, bind_host="127.0.0.1", job_secret=SECRET
    )
    try:
        source.set_quorum("e1/7", 0)
        source.send_checkpoint([1, 2], 3, {"w": torch.arange(3.0)}, T)
        url = source.metadata()
        asks = [(url, "e1/7", 1), (url, "e1/7", 3), (url, "e1/6", 1), (url, None, 0)]
        named, other_rank, old_quorum, silent = (run_ranks(_fetch_as, 1, *ask)[0] for ask in asks)
        assert named == "got [0.0, 1.0, 2.0]"
        assert "403" in other_rank and "named replica ranks [1, 2]" in other_rank, other_rank
        assert "403" in old_quorum and "served in quorum e1/7" in old_quorum, old_quorum
        assert "403" in silent and "did not say which quorum" in silent, silent
        # Refusals changed nothing: the named healer still gets the state.
        assert run_ranks(_fetch_as, 1, url, "e1/7", 2)[0] == "got [0.0, 1.0, 2.0]"
        # The next quorum names other healers; the earlier one is now refused.
        source.set_quorum("e1/8", 0)
        source.send_checkpoint([3], 3, {"w": torch.arange(3.0)}, T)
        assert "403" in run_ranks(_fetch_as, 1, url, "e1/7", 1)[0]
        assert run_ranks(_fetch_as, 1, url, "e1/8", 3)[0] == "got [0.0, 1.0, 2.0]"
    finally:
        source.shutdown()


def test_a_transport_not_told_its_quorum_serves_as_before() -> None:
    """torchft's transports and direct users never call set_quorum: nothing changes for them."""
    source: HTTPTransport[dict[str, Any]] = HTTPTransport(
        T, bind_host="127.0.0.1", job_secret=SECRET
    )
    try:
        source.send_checkpoint([1], 3, {"w": torch.arange(3.0)}, T)
        assert run_ranks(_fetch_as, 1, source.metadata(), None, 0)[0] == "got [0.0, 1.0, 2.0]"
    finally:
        source.shutdown()


@pytest.mark.parametrize(
    ("quorum", "rank", "why"),
    [
        (None, "1", "did not say which quorum"),
        ("e/1", None, "did not say which quorum"),
        ("e/2", "1", "served in quorum e/1, not in quorum 'e/2'"),
        ("e/1", "0", "named replica ranks [1, 4] to heal from this replica, not '0'"),
        ("e/1", "-1", "not '-1'"),
        ("e/1", "²", "not '²'"),
        ("e/1", "1" * 40, "not '1111111111111111'"),
    ],
)
def test_refusals_name_what_the_quorum_named(
    quorum: str | None, rank: str | None, why: str
) -> None:
    healers = NamedHealers(quorum="e/1", replica_ranks=frozenset({1, 4}))
    refusal = healers.refusal(quorum, rank)
    assert refusal is not None and why in refusal, refusal
    assert healers.refusal("e/1", "4") is None


def test_set_quorum_checks_its_arguments() -> None:
    t: HTTPTransport[dict[str, Any]] = HTTPTransport(T, bind_host="127.0.0.1")
    try:
        with pytest.raises(ValueError, match="quorum must be a non-empty str"):
            t.set_quorum("", 0)
        with pytest.raises(ValueError, match="replica_rank must be an int >= 0, got -1"):
            t.set_quorum("e/1", -1)
    finally:
        t.shutdown()


def test_a_healer_asking_before_its_source_entered_the_quorum_waits_for_it() -> None:
    # The healer of quorum e1/8 asks while its source still serves the same step
    # in e1/7 (the source has not started the new quorum's step yet): it used to
    # be refused at once, and a source that stayed that much behind kept every
    # heal failing until it died with the only copy of the committed step.
    source: HTTPTransport[dict[str, Any]] = HTTPTransport(
        T, bind_host="127.0.0.1", job_secret=SECRET
    )
    receiver: HTTPTransport[dict[str, Any]] = HTTPTransport(
        T, bind_host="127.0.0.1", job_secret=SECRET
    )
    got: list[Any] = []
    try:
        source.set_quorum("e1/7", 0)
        source.send_checkpoint([1], 3, {"w": torch.arange(3.0)}, T)
        server = source._server
        assert "served in quorum e1/7" in (server.refusal("e1/8", "1", 0.0) or "")
        receiver.set_quorum("e1/8", 1)

        def fetch() -> None:
            try:
                got.append(receiver.recv_checkpoint(0, source.metadata(), 3, T)["w"].tolist())
            except Exception as e:
                got.append(e)

        thread = threading.Thread(target=fetch, daemon=True)
        thread.start()
        waiting = threading.Event()
        for _ in range(500):  # until the request waits on the source's quorum
            if server._healers_changed._waiters:  # type: ignore[attr-defined]
                break
            waiting.wait(0.01)
        assert server._healers_changed._waiters, "the request never waited"  # type: ignore[attr-defined]
        source.set_quorum("e1/8", 0)
        source.send_checkpoint([1], 3, {"w": torch.arange(3.0)}, T)
        thread.join(T.total_seconds())
        assert got == [[0.0, 1.0, 2.0]], got
    finally:
        receiver.shutdown()
        source.shutdown()


@pytest.mark.parametrize(
    ("asked", "may_come"),
    [("e1/8", True), ("e1/12", True), ("e1/6", False), ("e2/1", True), ("e1/x", False)],
)
def test_only_a_later_quorum_or_another_epoch_is_worth_waiting_for(
    asked: str, may_come: bool
) -> None:
    assert NamedHealers(quorum="e1/7", replica_ranks=frozenset({1})).may_come(asked) is may_come
