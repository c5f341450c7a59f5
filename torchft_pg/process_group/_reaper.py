"""Tear old backends down off the caller's thread.

Dropping a Gloo backend takes ~20 ms (its I/O threads are joined) but does
not hold the GIL, so `configure` hands the old backend here instead of paying
that inside the reconfiguration. Each retired backend is torn down on a
short-lived thread of its own: a backend whose op still waits for a peer
finishes only once the peer's backend closes, and with two replica groups in
one process that peer may be the next backend retired (one teardown thread
in turn waited out the op's whole timeout, and an exit meanwhile aborted the
process from Gloo's I/O thread). At interpreter exit the teardowns in progress
are waited for (at most `EXIT_DRAIN_S` seconds together), so no backend is
half torn down on a daemon thread while the interpreter finalizes.

A thread may still hold a fleeting reference when a backend is retired (one
that took the group's backend to issue an op just as a failure notice aborted
it): had the teardown dropped its own reference first, the destruction, which
waits out the backend's pending ops (the op timeout, 30 s and more), would run
on that thread when it let go, stalling its step. So the teardown waits, at
most `HANDOFF_S` seconds, until it holds the only reference.

The backlog is bounded (``MAX_BACKLOG`` backends): a caller that reconfigures
faster than old backends can be torn down (a loaded machine, a reconfigure
storm) waits for the reaper instead of piling up every old backend's I/O
threads (seen: thousands of threads in one process).
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
from typing import Any

_threads: set[threading.Thread] = set()  # teardowns in progress
_lock = threading.Lock()
EXIT_DRAIN_S = 10.0
MAX_BACKLOG = 8
HANDOFF_S = 5.0  # how long a teardown waits for other holders to let go (s)
_HANDOFF_POLL_S = 0.001
_exiting = threading.Event()  # set at interpreter exit: teardowns stop waiting for holders
_backlog = threading.BoundedSemaphore(MAX_BACKLOG)


def _tear_down(holder: list[Any]) -> None:
    try:
        item = holder.pop()
        del holder
        deadline = time.monotonic() + HANDOFF_S
        # 2: this local and getrefcount's own argument; any more is another holder
        while sys.getrefcount(item) > 2 and time.monotonic() < deadline and not _exiting.is_set():
            time.sleep(_HANDOFF_POLL_S)
        del item  # the last reference, here, unless a holder kept it past HANDOFF_S
    finally:
        with _lock:
            _threads.discard(threading.current_thread())
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
    _exiting.set()  # at exit nobody is issuing ops: tear down now, not after a hand-off wait
    deadline = time.monotonic() + EXIT_DRAIN_S
    with _lock:
        running = list(_threads)
    for thread in running:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))


def retire(holder: list[Any]) -> None:
    """Destroy the object in the one-element list `holder` off the caller's thread.

    The caller must keep no other reference: passing it inside a list lets the
    teardown take the last reference, so it cannot land on the caller's thread
    by a race.
    """
    _backlog.acquire()  # at most MAX_BACKLOG teardowns at once: back-pressure, not a pile-up
    thread = threading.Thread(
        target=_tear_down, args=(holder,), name="torchft_pg-reaper", daemon=True
    )
    with _lock:
        _threads.add(thread)
    try:
        thread.start()
    except RuntimeError:  # no thread to be had (the process is at its limit): pay it here
        with _lock:
            _threads.discard(thread)
        _backlog.release()
        holder.pop()
