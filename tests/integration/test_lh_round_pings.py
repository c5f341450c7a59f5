"""A round reports its step to the lighthouse once: in its quorum request when it asks
the lighthouse, in a liveness ping when a quorum lease answers it (lease holders wait
for each other's reports). A ping beside every asked round only doubled the
lighthouse's work per round (real lighthouse, real manager server, one Manager)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from lighthouse import LighthouseServer
from torchft_pg import ProcessGroupDummy
from torchft_pg.manager import Manager

pytestmark = pytest.mark.timeout(120)
STEPS = 30
HEARTBEAT = timedelta(seconds=30)  # no periodic ping lands inside the test


@contextmanager
def _counting_pings(lh: LighthouseServer) -> Iterator[list[int]]:
    """Count the liveness pings that report progress (the lighthouse's `progress`)."""
    count = [0]
    lock = threading.Lock()
    real = lh.core.progress

    def progress(*args: object, **kwargs: object) -> None:
        with lock:
            count[0] += 1
        real(*args, **kwargs)  # type: ignore[arg-type]

    lh.core.progress = progress  # type: ignore[method-assign]
    try:
        yield count
    finally:
        lh.core.progress = real  # type: ignore[method-assign]


def _run_steps(lh: LighthouseServer) -> int:
    """STEPS committed steps of one replica group; the pings the lighthouse got meanwhile."""
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        ProcessGroupDummy(),
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=lh.address(),
        replica_id="solo",
        min_replica_size=1,
        init_sync=False,
        heartbeat_interval=HEARTBEAT,
        quorum_timeout=timedelta(seconds=20),
    )
    try:
        manager.start_quorum()  # the first round: the stream's opening ping is not counted
        assert manager.should_commit()
        with _counting_pings(lh) as pings:
            for _ in range(STEPS):
                manager.start_quorum()
                assert manager.should_commit()
        return pings[0]
    finally:
        manager.shutdown()


def test_rounds_that_ask_the_lighthouse_send_no_ping_beside_the_request() -> None:
    with LighthouseServer(
        bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=1000, quorum_lease=False
    ) as lh:
        issued_before = lh.status()["quorums_issued"]
        pings = _run_steps(lh)
        issued = lh.status()["quorums_issued"] - issued_before
    assert issued >= STEPS  # every round asked the lighthouse
    assert pings == 0, f"{pings} pings beside {STEPS} quorum requests"


def test_leased_rounds_report_their_step_in_a_ping() -> None:
    with LighthouseServer(
        bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=1000, quorum_lease=True
    ) as lh:
        issued_before = lh.status()["quorums_issued"]
        pings = _run_steps(lh)
        issued = lh.status()["quorums_issued"] - issued_before
    leased = STEPS - issued
    assert leased > STEPS // 2, f"only {leased} of {STEPS} rounds were leased"
    # every leased round's report reaches the lighthouse (its floor rises with them)
    assert pings >= leased, f"{pings} pings for {leased} leased rounds"
