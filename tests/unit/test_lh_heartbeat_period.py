"""The default period of a manager server's liveness pings: a tenth of the
lighthouse's heartbeat timeout, never below torchft's 100 ms."""

from __future__ import annotations

from datetime import timedelta

import pytest

from lighthouse import ManagerServer
from lighthouse.replica.link import default_heartbeat_s


def test_the_default_period_is_a_tenth_of_the_lighthouse_timeout() -> None:
    assert default_heartbeat_s(5.0) == pytest.approx(0.5)  # the lighthouse's default timeout
    assert default_heartbeat_s(2.0) == pytest.approx(0.2)


def test_the_default_period_is_never_below_100_ms() -> None:
    assert default_heartbeat_s(None) == pytest.approx(0.1)  # before the lighthouse said
    assert default_heartbeat_s(0.3) == pytest.approx(0.1)


def test_an_explicit_period_must_be_positive() -> None:
    with pytest.raises(ValueError, match="heartbeat_interval"):
        ManagerServer(
            replica_id="r",
            lighthouse_addr="127.0.0.1:1",
            heartbeat_interval=timedelta(0),
        )
