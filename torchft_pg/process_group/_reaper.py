"""Tear old backends down off the caller's thread.

Dropping a Gloo backend takes ~20 ms (its I/O threads are joined) but does
not hold the GIL, so `configure` hands the old backend here instead of paying
that inside the reconfiguration. At interpreter exit the queue is drained
first (at most `EXIT_DRAIN_S` seconds), so no backend is half torn down on a
daemon thread while the interpreter finalizes.

The backlog is bounded (``MAX_BACKLOG`` backends): a caller that reconfigures
faster than old backends can be torn down (a loaded machine, a reconfigure
storm) waits for the reaper instead of piling up every old backend's I/O
threads (seen: thousands of threads in one process).
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
from typing import Any

_queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
_thread: threading.Thread | None = None
_lock = threading.Lock()
EXIT_DRAIN_S = 10.0
MAX_BACKLOG = 8
_backlog = threading.BoundedSemaphore(MAX_BACKLOG)


def _run() -> None:
    while True:
        holder = _queue.get()
        if holder is None:  # drain sentinel: everything before it is gone
            return
        item = holder.pop()  # now the only reference is this local
        del item, holder
        _backlog.release()


def wait_idle(timeout_s: float) -> bool:
    """Wait up to `timeout_s` seconds until every retired backend is torn down.

    True if the reaper is idle. Meanwhile a `retire` in another thread waits
    too. For benchmarks and tests that must time a `configure` without the
    teardowns an earlier one queued (a job reconfigures seconds apart).
    """
    deadline = time.monotonic() + timeout_s
    taken = 0
    try:
        while taken < MAX_BACKLOG:
            if not _backlog.acquire(timeout=max(0.0, deadline - time.monotonic())):
                return False
            taken += 1
        return True
    finally:
        for _ in range(taken):
            _backlog.release()


@atexit.register
def _drain() -> None:
    thread = _thread
    if thread is not None and thread.is_alive():
        _queue.put(None)
        thread.join(timeout=EXIT_DRAIN_S)


def retire(holder: list[Any]) -> None:
    """Destroy the object in the one-element list `holder` on the reaper thread.

    The caller must keep no other reference: passing it inside a list lets the
    reaper take the last reference, so the teardown cannot land on the caller's
    thread by a race.
    """
    global _thread
    _backlog.acquire()  # at most MAX_BACKLOG backends waiting: back-pressure, not a pile-up
    with _lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_run, name="torchft_pg-reaper", daemon=True)
            _thread.start()
    _queue.put(holder)
