"""The readers/writer gate that guards what the HTTP checkpoint server may serve."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from torchft_pg.checkpointing.gate import (
    GateClosedError,
    NotAllowedError,
    ServingGate,
    WrongStepError,
)


def test_read_waits_until_allowed() -> None:
    gate: ServingGate[str] = ServingGate()

    def reader() -> str:
        with gate.read(4, wait_s=10) as payload:
            return payload

    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(reader)
        assert gate.wait_for_waiting(1, timeout_s=10)
        assert not fut.done()
        gate.allow(4, "sd")
        assert fut.result(timeout=10) == "sd"


def test_wrong_step_names_both_steps() -> None:
    gate: ServingGate[str] = ServingGate()
    gate.allow(5, "sd")
    expected = "requested step 4, but this replica serves step 5"
    with pytest.raises(WrongStepError, match=expected), gate.read(4, wait_s=1):
        pass


def test_not_allowed_within_wait() -> None:
    gate: ServingGate[str] = ServingGate()
    with pytest.raises(NotAllowedError, match=r"within 0\.010 s"), gate.read(1, wait_s=0.01):
        pass


def test_disallow_waits_for_readers_and_blocks_new_ones() -> None:
    gate: ServingGate[str] = ServingGate()
    gate.allow(1, "sd")
    inside, release = threading.Event(), threading.Event()

    def long_reader() -> bool:
        with gate.read(1, wait_s=1) as payload:
            inside.set()
            release.wait(10)
            return gate.is_current(payload)

    with ThreadPoolExecutor(2) as pool:
        fut = pool.submit(long_reader)
        assert inside.wait(10)
        assert gate.disallow(drain_s=0.01) is False, "a reader still holds the gate"
        with pytest.raises(NotAllowedError), gate.read(1, wait_s=0.01):
            pass
        drained = pool.submit(gate.disallow, 10)
        release.set()
        assert fut.result(timeout=10) is False, "the reader sees it was disallowed"
        assert drained.result(timeout=10) is True
    assert gate.readers == 0


def test_shutdown_wakes_waiting_readers() -> None:
    gate: ServingGate[str] = ServingGate()

    def reader() -> None:
        with gate.read(1, wait_s=30):
            pass

    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(reader)
        assert gate.wait_for_waiting(1, timeout_s=10)
        gate.shutdown()
        with pytest.raises(GateClosedError):
            fut.result(timeout=10)
