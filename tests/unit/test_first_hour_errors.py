"""A new user's mistakes fail at once, with a clear type, naming the culprit."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import torch

from tests.unit.manager_fakes import make, result
from torchft_pg.manager.config import ManagerConfig

ENV = {"MASTER_PORT": "29500"}


def manager_with(**kwargs: Any) -> Callable[[], None]:
    def build() -> None:
        make([result()], **kwargs)[0].shutdown()

    return build


def allreduce_of(value: Any) -> Callable[[], None]:
    def call() -> None:
        manager, *_ = make([result()])
        try:
            manager.start_quorum()
            manager.allreduce(value)
        finally:
            manager.shutdown()

    return call


def config_with(env: dict[str, str], **kwargs: Any) -> Callable[[], None]:
    def build() -> None:
        ManagerConfig.from_env({**ENV, **env}, **kwargs)

    return build


@pytest.mark.parametrize(
    ("call", "kind", "match"),
    [
        (
            manager_with(connect_timeout=timedelta(seconds=-1)),
            ValueError,
            r"Manager\(connect_timeout=\.\.\.\) must be positive",
        ),
        (
            manager_with(quorum_timeout=0),
            ValueError,
            r"Manager\(quorum_timeout=\.\.\.\) must be a positive number of seconds, got 0",
        ),
        (
            manager_with(timeout="5"),
            TypeError,
            r"Manager\(timeout=\.\.\.\) must be a timedelta or a number of seconds",
        ),
        (
            allreduce_of([1.0]),
            TypeError,
            r"Manager.allreduce reduces one torch.Tensor in place, got list",
        ),
        (
            config_with({"TORCHFT_LIGHTHOUSE": "127.0.0.1"}),
            ValueError,
            r"TORCHFT_LIGHTHOUSE must be the lighthouse's host:port .* got '127.0.0.1'",
        ),
        (
            config_with({}, lighthouse_addr="http://lh"),
            ValueError,
            r"lighthouse_addr must be the lighthouse's host:port .* got 'http://lh'",
        ),
        (config_with({"TORCHFT_LIGHTHOUSE": "http://lh:29510"}), None, None),
    ],
    ids=[
        "negative-connect",
        "zero-quorum",
        "string-timeout",
        "list-allreduce",
        "lighthouse-no-port",
        "lighthouse-arg-no-port",
        "unused-here",
    ],
)
def test_a_mistake_fails_at_once_naming_it(
    call: Callable[[], None], kind: type[Exception] | None, match: str | None
) -> None:
    start = time.monotonic()
    if kind is None:
        call()  # a valid address is taken
        return
    with pytest.raises(kind, match=match):
        call()
    assert time.monotonic() - start < 10.0


def test_seconds_are_taken_wherever_a_timeout_is() -> None:
    manager, *_ = make([result()], timeout=5, quorum_timeout=2.5, connect_timeout=1)
    try:
        manager.start_quorum()
        manager.allreduce(torch.ones(1)).wait()
        assert manager.should_commit()
    finally:
        manager.shutdown()
