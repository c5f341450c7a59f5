"""One lighthouse per job state file: the lock beside it, and a standby waiting for it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from lighthouse import LighthouseServer
from lighthouse.coordinator.state_lock import StateFileLock, StateFileLockedError

HOLD = """
import sys
from lighthouse.coordinator.state_lock import StateFileLock
lock = StateFileLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
sys.stdin.read()  # until the test kills us
"""


def test_a_second_holder_is_refused_naming_the_first(tmp_path: Path) -> None:
    state = tmp_path / "job.state.json"
    first, second = StateFileLock(state), StateFileLock(state)
    first.acquire()
    with pytest.raises(StateFileLockedError) as info:
        second.acquire()
    message = str(info.value)
    assert f"pid {os.getpid()}" in message and str(state) in message
    assert "--standby" in message
    first.release()
    second.acquire()  # free again once the first lets go
    assert second.held
    second.release()


def test_a_standby_takes_the_lock_once_the_holder_releases_it(tmp_path: Path) -> None:
    state = tmp_path / "job.state.json"
    active, standby = StateFileLock(state), StateFileLock(state)
    active.acquire()
    stop, took = threading.Event(), threading.Event()

    def wait() -> None:
        if standby.wait(stop):
            took.set()

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    assert not took.wait(0.3)  # the active one still holds it
    active.release()
    assert took.wait(10.0)
    waiter.join(5.0)
    assert standby.held
    standby.release()


def test_a_standby_told_to_stop_gives_up(tmp_path: Path) -> None:
    state = tmp_path / "job.state.json"
    active, standby = StateFileLock(state), StateFileLock(state)
    active.acquire()
    stop = threading.Event()
    stop.set()
    assert standby.wait(stop) is False
    assert not standby.held
    active.release()


def test_the_lock_of_a_killed_lighthouse_is_free(tmp_path: Path) -> None:
    state = tmp_path / "job.state.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(state)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(StateFileLockedError, match=f"pid {proc.pid}"):
            StateFileLock(state).acquire()
        proc.kill()  # SIGKILL: no cleanup runs; the kernel drops the lock with the process
        proc.wait(timeout=10)
        lock = StateFileLock(state)
        lock.acquire()
        lock.release()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_two_lighthouses_never_serve_one_state_file(tmp_path: Path) -> None:
    state = tmp_path / "job.state.json"
    first = LighthouseServer(bind="127.0.0.1:0", state_file=state, min_replicas=1)
    try:
        with pytest.raises(StateFileLockedError, match="one lighthouse per job"):
            LighthouseServer(bind="127.0.0.1:0", state_file=state, min_replicas=1)
    finally:
        first.shutdown()
    second = LighthouseServer(bind="127.0.0.1:0", state_file=state, min_replicas=1)
    second.shutdown()  # after the first stopped, the file is free
