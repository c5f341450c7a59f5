"""A job that cannot commit says what it waits for, at WARNING, within seconds.

`Manager(min_replica_size=3)` with two live groups used to discard every step
with nothing above INFO; a quorum the lighthouse does not form said nothing
until its timeout.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from lighthouse import LighthouseServer
from tests.managers import solo_manager
from tests.threads import run_in_threads


def test_too_few_replica_groups_for_min_replica_size_is_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lighthouse = LighthouseServer(
        bind="127.0.0.1:0", min_replicas=2, join_timeout_ms=100, http_bind=None
    )

    def group(name: str) -> list[bool]:
        with solo_manager(lighthouse.address(), name, min_replica_size=3) as manager:
            decisions = []
            for _ in range(3):
                manager.start_quorum()
                decisions.append(manager.should_commit())
            return decisions

    try:
        with caplog.at_level(logging.WARNING, logger="torchft_pg.manager"):
            results = run_in_threads([lambda: group("a"), lambda: group("b")], timeout_s=120)
    finally:
        lighthouse.shutdown()
    assert results == [[False] * 3, [False] * 3]
    said = [
        r.getMessage() for r in caplog.records if "waiting for replica groups" in r.getMessage()
    ]
    assert said, [r.getMessage() for r in caplog.records]
    assert "this step had 2, min_replica_size is 3" in said[0]


def test_a_quorum_that_does_not_form_is_reported_while_it_is_awaited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # min_replicas=2 and one group: no quorum forms; the wait says so before its timeout
    lighthouse = LighthouseServer(
        bind="127.0.0.1:0", min_replicas=2, join_timeout_ms=100, http_bind=None
    )
    try:
        with (
            caplog.at_level(logging.WARNING, logger="torchft_pg.manager"),
            solo_manager(
                lighthouse.address(), "alone", quorum_timeout=timedelta(seconds=7)
            ) as manager,
        ):
            manager.start_quorum()
            with pytest.raises(TimeoutError):
                manager.wait_quorum()
    finally:
        lighthouse.shutdown()
    said = [r.getMessage() for r in caplog.records if "waiting for a quorum" in r.getMessage()]
    assert said and "for step 0" in said[0] and "asked" in said[0], said
    # the lighthouse's own reason, pushed to the waiting group: what it has, what it needs
    assert "the lighthouse says: not ready: 1 replica(s) asked, need min_replicas=2" in said[0]
