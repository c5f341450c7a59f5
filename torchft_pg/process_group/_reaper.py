"""Tear old backends down off the caller's thread.

Dropping a Gloo backend takes ~20 ms (its I/O threads are joined) but does
not hold the GIL, so `configure` hands the old backend here instead of paying
that inside the reconfiguration.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

_queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
_thread: threading.Thread | None = None
_lock = threading.Lock()


def _run() -> None:
    while True:
        item = _queue.get()
        del item  # the last reference goes here, on this thread


def retire(backend: Any) -> None:
    """Destroy `backend` on the reaper thread once nothing else references it."""
    global _thread
    with _lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_run, name="torchft_pg-reaper", daemon=True)
            _thread.start()
    _queue.put(backend)
