"""torchft's timeout variables, their precedence, and timeouts in the wrong order."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from torchft_pg.manager.config import ManagerTimeouts, timeout_order_warnings, unsupported_variables

S = timedelta(seconds=1)
ARGS: dict[str, Any] = {
    "timeout": 60 * S,
    "quorum_timeout": 60 * S,
    "connect_timeout": 60 * S,
    "quorum_retries": 0,
}


def test_arguments_stand_without_the_variables_and_numbers_are_seconds() -> None:
    t = ManagerTimeouts.resolve(**{**ARGS, "timeout": 5, "quorum_timeout": 2.5}, env={})
    assert (t.timeout, t.quorum_timeout, t.connect_timeout) == (5 * S, 2.5 * S, 60 * S)
    assert t.quorum_retries == 0


def test_torchfts_variables_override_the_arguments() -> None:
    env = {
        "TORCHFT_TIMEOUT_SEC": "7",
        "TORCHFT_QUORUM_TIMEOUT_SEC": "11",
        "TORCHFT_CONNECT_TIMEOUT_SEC": "0.5",
        "TORCHFT_QUORUM_RETRIES": "3",
    }
    t = ManagerTimeouts.resolve(**ARGS, env=env)
    assert (t.timeout, t.quorum_timeout, t.connect_timeout) == (7 * S, 11 * S, 0.5 * S)
    assert t.quorum_retries == 3


@pytest.mark.parametrize(
    ("change", "env", "match"),
    [
        (
            {"timeout": -1},
            {},
            r"Manager\(timeout=\.\.\.\) must be a positive number of seconds, got -1",
        ),
        ({"quorum_timeout": 0}, {}, r"Manager\(quorum_timeout=\.\.\.\) must be a positive"),
        (
            {"connect_timeout": timedelta(seconds=-1)},
            {},
            r"Manager\(connect_timeout=\.\.\.\) must be positive",
        ),
        ({"timeout": float("nan")}, {}, r"Manager\(timeout=\.\.\.\) must be a positive number"),
        (
            {"quorum_retries": -2},
            {},
            r"Manager\(quorum_retries=\.\.\.\) must be an integer >= 0, got -2",
        ),
        (
            {},
            {"TORCHFT_TIMEOUT_SEC": "ten"},
            r"TORCHFT_TIMEOUT_SEC must be a number of seconds, got 'ten'",
        ),
        ({}, {"TORCHFT_QUORUM_TIMEOUT_SEC": "0"}, r"TORCHFT_QUORUM_TIMEOUT_SEC must be a positive"),
        (
            {},
            {"TORCHFT_QUORUM_RETRIES": "1.5"},
            r"TORCHFT_QUORUM_RETRIES must be an integer >= 0, got '1.5'",
        ),
    ],
)
def test_bad_values_are_refused_naming_the_argument_or_variable(
    change: dict[str, Any], env: dict[str, str], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        ManagerTimeouts.resolve(**{**ARGS, **change}, env=env)


def test_a_timeout_of_the_wrong_type_is_a_type_error() -> None:
    with pytest.raises(
        TypeError, match=r"Manager\(timeout=\.\.\.\) must be a timedelta or a number"
    ):
        ManagerTimeouts.resolve(**{**ARGS, "timeout": "60"}, env={})


def test_well_ordered_timeouts_warn_of_nothing() -> None:
    # torchtitan's: a 10 s fault-tolerant group, torchft's 60 s Manager timeouts,
    # a 300 s default group while it initializes
    assert not timeout_order_warnings(
        timeout=60 * S, quorum_timeout=60 * S, pg_timeout=10 * S, group_timeout=300 * S
    )
    assert not timeout_order_warnings(
        timeout=60 * S, quorum_timeout=60 * S, pg_timeout=None, group_timeout=None
    )


def test_a_process_group_slower_than_the_manager_is_named_with_both_values() -> None:
    (line,) = timeout_order_warnings(
        timeout=30 * S, quorum_timeout=60 * S, pg_timeout=90 * S, group_timeout=None
    )
    assert "op timeout (90 s) exceeds the Manager's timeout (30 s)" in line


def test_a_default_group_that_would_time_out_first_is_named_with_the_bound() -> None:
    (line,) = timeout_order_warnings(
        timeout=60 * S, quorum_timeout=60 * S, pg_timeout=10 * S, group_timeout=30 * S
    )
    assert "times out after 30 s, within the 10 s" in line and "60 s a quorum" in line
    assert "more than 70 s" in line


def test_torchft_variables_without_a_counterpart_are_named() -> None:
    assert unsupported_variables({}) == []
    lines = unsupported_variables({"TORCHFT_USE_OTEL": "1", "TORCHFT_WATCHDOG_TIMEOUT_SEC": "5"})
    assert [line.split()[0] for line in lines] == [
        "TORCHFT_USE_OTEL",
        "TORCHFT_WATCHDOG_TIMEOUT_SEC",
    ]


def test_the_manager_takes_seconds_and_torchfts_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.unit.manager_fakes import make, result

    monkeypatch.setenv("TORCHFT_QUORUM_TIMEOUT_SEC", "9")
    manager, *_ = make([result()], timeout=5, quorum_timeout=timedelta(seconds=3))
    try:
        assert (manager.timeouts.timeout, manager.timeouts.quorum_timeout) == (5 * S, 9 * S)
    finally:
        manager.shutdown()


def test_the_manager_refuses_a_bad_timeout_before_anything_starts() -> None:
    from tests.unit.manager_fakes import make, result

    with pytest.raises(ValueError, match=r"Manager\(connect_timeout=\.\.\.\) must be positive"):
        make([result()], connect_timeout=timedelta(seconds=-1))


def test_a_wrapper_reports_the_timeout_of_the_group_it_wraps() -> None:
    from torchft_pg.process_group import ProcessGroupGloo, ProcessGroupWrapper

    inner = ProcessGroupGloo(timeout=5)
    assert ProcessGroupWrapper(inner).timeout == 5 * S
    assert ProcessGroupWrapper(timeout=7).timeout == 7 * S
