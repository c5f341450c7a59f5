"""The readers/writer gate that guards what the HTTP checkpoint server may serve."""

from __future__ import annotations

import gc
import threading
import weakref
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


class Snapshot:
    """A payload the test can watch being freed (weakref)."""


def test_disallow_returns_at_once_blocks_new_readers_and_lets_readers_in_drain() -> None:
    gate: ServingGate[Snapshot] = ServingGate()
    snap = Snapshot()
    gate.allow(1, snap)
    inside, release = threading.Event(), threading.Event()

    def long_reader() -> bool:
        with gate.read(1, wait_s=1) as payload:
            inside.set()
            assert release.wait(10)
            return gate.may_continue(payload)

    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(long_reader)
        assert inside.wait(10)
        gate.disallow()  # does not wait for the reader: it reads a snapshot
        assert gate.serving_step is None and gate.readers == 1
        with pytest.raises(NotAllowedError), gate.read(1, wait_s=0.01):
            pass
        assert gate.may_continue(snap), "a reader already in goes on"
        release.set()
        assert fut.result(timeout=10) is True
    assert gate.wait_idle(timeout_s=10) and gate.readers == 0
    assert not gate.may_continue(snap), "nobody read it any more: the gate let it go"


def test_a_newer_payload_stops_readers_of_older_ones() -> None:
    gate: ServingGate[Snapshot] = ServingGate()
    first, second, third = Snapshot(), Snapshot(), Snapshot()
    gate.allow(1, first)
    with gate.read(1, wait_s=1) as a:
        gate.allow(2, second)  # replaced without a disallow in between
        assert not gate.may_continue(a)
        with gate.read(2, wait_s=1) as b:
            gate.disallow()
            assert gate.may_continue(b), "draining"
            gate.allow(3, third)  # the next heal window opens
            assert not gate.may_continue(b) and gate.may_continue(third)
            assert gate.readers == 2
    assert gate.readers == 0
    gate.shutdown()
    assert not gate.may_continue(third)


def test_the_gate_keeps_no_closed_payload_alive() -> None:
    gate: ServingGate[Snapshot] = ServingGate()
    unread, read = Snapshot(), Snapshot()
    unread_ref, read_ref = weakref.ref(unread), weakref.ref(read)
    gate.allow(1, unread)
    gate.disallow()
    del unread
    gc.collect()
    assert unread_ref() is None, "closed with no reader: freed at once"
    gate.allow(2, read)
    del read
    with gate.read(2, wait_s=1):
        gate.disallow()
        gc.collect()
        assert read_ref() is not None, "its reader still streams it"
    gc.collect()
    assert read_ref() is None, "freed when its last reader was done"


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
