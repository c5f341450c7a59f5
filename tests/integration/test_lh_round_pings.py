"""A round reports its step to the lighthouse once: in its quorum request when it asks
the lighthouse, in a liveness ping when a quorum lease answers it (lease holders wait
for each other's reports). A ping beside every asked round only doubled the
lighthouse's work per round (real lighthouse, real manager server, one Manager)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from lighthouse import LighthouseServer
from tests.managers import solo_manager

pytestmark = pytest.mark.timeout(120)
STEPS = 30
HEARTBEAT = timedelta(seconds=30)  # no periodic ping lands inside the test


def _rounds(quorum_lease: bool) -> tuple[int, int]:
    """STEPS committed steps of one replica group after its first: how many quorums the
    lighthouse issued meanwhile, and how many progress pings it received."""
    with (
        LighthouseServer(
            bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=1000, quorum_lease=quorum_lease
        ) as lh,
        solo_manager(lh.address(), "solo", heartbeat_interval=HEARTBEAT) as manager,
    ):
        manager.start_quorum()  # the first round: the stream's opening ping is not counted
        assert manager.should_commit()
        pings = [0]  # counted on the lighthouse's loop thread, read once it has stopped
        real = lh.core.progress

        def progress(*args: object, **kwargs: object) -> None:
            pings[0] += 1
            real(*args, **kwargs)  # type: ignore[arg-type]

        lh.core.progress = progress  # type: ignore[method-assign]
        issued_before = lh.status()["quorums_issued"]
        for _ in range(STEPS):
            manager.start_quorum()
            assert manager.should_commit()
        issued = lh.status()["quorums_issued"] - issued_before
    return issued, pings[0]


def test_rounds_that_ask_the_lighthouse_send_no_ping_beside_the_request() -> None:
    issued, pings = _rounds(quorum_lease=False)
    assert issued >= STEPS  # every round asked the lighthouse
    assert pings == 0, f"{pings} pings beside {STEPS} quorum requests"


def test_leased_rounds_report_their_step_in_a_ping() -> None:
    issued, pings = _rounds(quorum_lease=True)
    leased = STEPS - issued
    assert leased > STEPS // 2, f"only {leased} of {STEPS} rounds were leased"
    # every leased round's report reaches the lighthouse (its floor rises with them)
    assert pings >= leased, f"{pings} pings for {leased} leased rounds"
