"""Tear old backends down off the caller's thread.

Dropping a Gloo backend takes ~20 ms (its I/O threads are joined) but does
not hold the GIL, so `configure` hands the old backend here instead of paying
that inside the reconfiguration. At interpreter exit the queue is drained
first (at most `EXIT_DRAIN_S` seconds), so no backend is half torn down on a
daemon thread while the interpreter finalizes.
"""

from __future__ import annotations

import atexit
import queue
import threading
from typing import Any

_queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
_thread: threading.Thread | None = None
_lock = threading.Lock()
EXIT_DRAIN_S = 10.0


def _run() -> None:
    while True:
        holder = _queue.get()
        if holder is None:  # drain sentinel: everything before it is gone
            return
        item = holder.pop()  # now the only reference is this local
        del item, holder


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
    with _lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_run, name="torchft_pg-reaper", daemon=True)
            _thread.start()
    _queue.put(holder)
