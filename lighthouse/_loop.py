"""One background asyncio loop per process, shared by every lighthouse-side server.

gRPC asyncio servers (the lighthouse, manager servers) live on this loop; the
blocking clients use the synchronous gRPC API from any thread. One loop per
process sidesteps grpc.aio's limits on several event loops in several threads.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


try:  # imported with the package, not by the first server (~4 ms of a restart)
    import uvloop
except ImportError:  # pragma: no cover - a dependency, but the loop works without it
    uvloop = None  # type: ignore[assignment]


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (fewer microseconds per gRPC call), else asyncio's."""
    if uvloop is not None and os.environ.get("LIGHTHOUSE_NO_UVLOOP") != "1":
        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def background_loop() -> asyncio.AbstractEventLoop:
    """The process-wide loop, started on first use in a daemon thread."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = _new_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            threading.Thread(target=run, name="lighthouse-loop", daemon=True).start()
            if not ready.wait(timeout=10.0):
                raise RuntimeError("the lighthouse event loop thread did not start within 10 s")
            _loop = loop
        return _loop


def run_sync(coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
    """Run ``coro`` on the background loop and wait up to ``timeout_s`` seconds."""
    loop = background_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        raise RuntimeError(
            "run_sync called from the lighthouse loop thread itself (would deadlock)"
        )
    fut = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return fut.result(timeout=timeout_s)
    except TimeoutError:
        fut.cancel()
        raise
