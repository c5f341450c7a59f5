"""Run test functions as threads of this process (ranks as threads, many waiters)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["run_in_threads"]


def run_in_threads(fns: list[Callable[[], Any]], timeout_s: float = 60.0) -> list[Any]:
    """Run each function on its own thread; return their results in order,
    re-raising the first error. Each thread is joined within `timeout_s` seconds."""
    results: list[Any] = [None] * len(fns)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = fns[i]()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    assert not any(t.is_alive() for t in threads), "a thread is still running"
    if errors:
        raise errors[0]
    return results
