"""The reaper tears retired objects down off-thread, and finishes before the interpreter exits."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from torchft_pg.process_group import _reaper


class _Slow:
    def __init__(self, done: threading.Event) -> None:
        self.done = done

    def __del__(self) -> None:
        self.done.set()


def test_retired_object_is_destroyed_on_the_reaper_thread() -> None:
    done = threading.Event()
    _reaper.retire([_Slow(done)])
    assert done.wait(5.0)


def test_a_reference_held_elsewhere_is_let_go_before_the_teardown_runs() -> None:
    """A thread that still holds the retired object (it was issuing an op on it) must
    not be the one whose release runs the slow teardown: the reaper waits for it."""
    done = threading.Event()
    torn_on: list[str] = []

    class Backend:
        def __del__(self) -> None:
            torn_on.append(threading.current_thread().name)
            done.set()

    fleeting = Backend()
    holder = [fleeting]
    _reaper.retire(holder)
    assert not done.wait(0.2)  # held here: not torn down yet
    del fleeting  # this thread lets go: the teardown runs on the reaper's thread
    assert done.wait(5.0)
    assert torn_on == ["torchft_pg-reaper"]


def test_exit_waits_for_a_teardown_in_progress(tmp_path: Path) -> None:
    marker = tmp_path / "torn_down"
    code = f"""
import time
from torchft_pg.process_group import _reaper

class Backend:
    def __del__(self):
        time.sleep(0.3)  # a slow teardown, like a Gloo backend joining its threads
        open({str(marker)!r}, "w").write("ok")

_reaper.retire([Backend()])
"""  # the interpreter exits right after retire()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert marker.read_text() == "ok"


class _Blocking:
    """Its teardown waits for `release`: a backend joining threads on a loaded machine."""

    def __init__(self, release: threading.Event, torn: list[int]) -> None:
        self.release = release
        self.torn = torn

    def __del__(self) -> None:
        self.release.wait(10.0)
        self.torn.append(1)


def test_a_retire_storm_waits_for_the_reaper_instead_of_piling_up() -> None:
    release = threading.Event()
    torn: list[int] = []
    retired = threading.Event()

    def storm() -> None:
        for _ in range(_reaper.MAX_BACKLOG + 3):
            _reaper.retire([_Blocking(release, torn)])
        retired.set()

    t = threading.Thread(target=storm, daemon=True)
    t.start()
    # The reaper is stuck in the first teardown: the storm must block at the bound.
    assert not retired.wait(0.5)
    release.set()
    assert retired.wait(10.0)
    t.join(10.0)
    assert _reaper.wait_idle(10.0) and len(torn) == _reaper.MAX_BACKLOG + 3


class _WaitsFor:
    """Torn down only once `peer` is: a Gloo backend whose op waits for the peer
    backend to close (two replica groups in one process)."""

    def __init__(self, peer: threading.Event, torn: threading.Event) -> None:
        self.peer = peer
        self.torn = torn

    def __del__(self) -> None:
        self.peer.wait(30.0)
        self.torn.set()


def test_teardowns_that_wait_on_each_other_do_not_wait_in_turn() -> None:
    """The first retired waits for the second's teardown: on one reaper thread it
    waited its whole 30 s; each on its own, both end at once."""
    first_torn, second_torn = threading.Event(), threading.Event()
    _reaper.retire([_WaitsFor(second_torn, first_torn)])
    _reaper.retire([_Slow(second_torn)])
    assert second_torn.wait(5.0), "the second teardown waited behind the first"
    assert first_torn.wait(5.0)
    assert _reaper.wait_idle(5.0)


class _Gated:
    """Torn down only once `gate` opens."""

    def __init__(self, gate: threading.Event, done: threading.Event) -> None:
        self.gate = gate
        self.done = done

    def __del__(self) -> None:
        self.gate.wait(10.0)
        self.done.set()


def test_wait_idle_returns_once_every_retired_object_is_torn_down() -> None:
    gate, done = threading.Event(), threading.Event()
    _reaper.retire([_Gated(gate, done)])
    assert not _reaper.wait_idle(0.05)  # the teardown is still blocked
    gate.set()
    assert _reaper.wait_idle(5.0)
    assert done.is_set()
    assert _reaper.wait_idle(0.0)  # idle: at once, and every slot is given back


class _Unstartable(threading.Thread):
    def start(self) -> None:
        raise RuntimeError("can't start new thread")


class _Marker:
    def __init__(self, torn_down_on: list[str]) -> None:
        self.torn_down_on = torn_down_on

    def __del__(self) -> None:
        self.torn_down_on.append(threading.current_thread().name)


def test_a_teardown_without_a_thread_runs_on_the_caller_and_frees_its_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A process at its thread limit: the teardown is paid by the caller instead of
    # leaking a backlog slot and leaving an unstarted thread for the exit to join.
    monkeypatch.setattr(_reaper.threading, "Thread", _Unstartable)
    torn_down_on: list[str] = []
    for _ in range(_reaper.MAX_BACKLOG + 1):  # more than the backlog holds
        _reaper.retire([_Marker(torn_down_on)])
    assert torn_down_on == [threading.current_thread().name] * (_reaper.MAX_BACKLOG + 1)
    with _reaper._lock:
        assert not any(isinstance(t, _Unstartable) for t in _reaper._threads)
    monkeypatch.undo()
    assert _reaper.wait_idle(5.0)
